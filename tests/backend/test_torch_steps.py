"""kbert's form of Keras' train step on eager torch (`kbert.backend.torch_steps.train_step`).

A task's `train_step` on torch walks its trainable weights once and clears only their
gradients, where Keras' walks them three times and clears every module's. It must train
exactly as Keras' own step does: the same weights, optimizer state and logs, whatever the
optimizer leaves in `.grad`, with layers frozen mid-`fit`, after a new `compile`.
"""

import types

import keras
import numpy as np
import pytest

from kbert.models import BertBackbone, BertClassifier
from tests.test_case import random_backbone_inputs, tiny_backbone_kwargs

pytestmark = pytest.mark.backends("torch", reason="kbert's eager train step is the torch backend's")


# The metrics of each task's first compile (its constructor's), kept alive: a step that
# still counted its loss there would go unnoticed if they were collected.
FIRST_METRICS = []


def _twins(compile_kwargs=None):
    """Two classifiers with the same weights: one on kbert's step, one on Keras' own."""
    keras.utils.set_random_seed(0)
    backbone = BertBackbone(**tiny_backbone_kwargs(dropout=0.2, attention_dropout=0.2))
    kbert_step = BertClassifier(backbone, num_classes=3, dropout=0.2)
    keras_step = BertClassifier.from_config(kbert_step.get_config())
    keras_step.set_weights(kbert_step.get_weights())
    keras_step.train_step = types.MethodType(keras.Model.train_step, keras_step)
    for task in (kbert_step, keras_step):
        FIRST_METRICS.append(list(task.metrics))
        task.compile(**(compile_kwargs or {}))
    return kbert_step, keras_step


def _train_both(twins, steps, x, y):
    """Each twin's logs of `steps` `train_on_batch` calls, each call from the same seed."""
    import torch

    logs = []
    for task in twins:
        logs.append([])
        for step in range(steps):
            torch.manual_seed(step)
            logs[-1].append(task.train_on_batch(x, y, return_dict=True))
    return logs


def _assert_same_state(a, b):
    """The same weights and optimizer variables, to float32 rounding: on the CPU a matrix
    product's last bits may depend on where its operands lie in memory."""
    for left, right in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_allclose(left, right, rtol=1e-5, atol=1e-6)
    for left, right in zip(a.optimizer.variables, b.optimizer.variables):
        np.testing.assert_allclose(np.asarray(left), np.asarray(right), rtol=1e-5, atol=1e-6)


def _assert_same_logs(a, b):
    assert len(a) == len(b)
    for left, right in zip(a, b):
        assert left.keys() == right.keys()
        np.testing.assert_allclose(
            np.array(list(left.values()), float), np.array(list(right.values()), float), rtol=1e-5
        )


@pytest.mark.parametrize(
    "compile_kwargs",
    [None, {"optimizer": "sgd"}],
    ids=["bert_recipe", "sgd_keeps_grads"],
)
def test_kbert_step_trains_as_keras_step(compile_kwargs):
    """Three seeded steps with dropout give the same weights, optimizer variables and logs as
    Keras' step: with BERT's recipe (whose update releases each `.grad`) and with SGD, which
    leaves them in place, so a gradient left uncleared would add to the next step's."""
    twins = _twins(compile_kwargs)
    x = random_backbone_inputs(4, 12)
    y = np.array([0, 2, 1, 2])
    kbert_logs, keras_logs = _train_both(twins, 3, x, y)
    _assert_same_logs(kbert_logs, keras_logs)
    assert kbert_logs[0]["loss"] != kbert_logs[-1]["loss"]
    _assert_same_state(*twins)


def test_a_new_compile_and_layers_unfrozen_mid_fit_train_as_keras_step():
    """After a second `compile` the step's loss goes to the new loss metric, and a backbone
    frozen when `fit` starts stays as it was through the first batch, then trains once a
    callback unfreezes it: the same weights and history as Keras' step. (SGD: Adam's first
    updates turn float32 rounding in gradients near 0 into steps of the learning rate.)"""
    import torch

    twins = _twins()
    for task in twins:
        task.compile(optimizer=keras.optimizers.SGD(0.1))
        task.optimizer.build(task.trainable_variables)
        task.backbone.trainable = False

    class UnfreezeBackbone(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 0:
                self.first = [np.array(w) for w in self.model.backbone.get_weights()]
                self.model.backbone.trainable = True

    x = random_backbone_inputs(8, 12)
    y = np.array([0, 2, 1, 2, 1, 0, 0, 1])
    histories, callbacks = [], []
    start = [np.array(w) for w in twins[0].backbone.get_weights()]
    for task in twins:
        callbacks.append(UnfreezeBackbone())
        torch.manual_seed(0)
        histories.append(
            task.fit(
                x, y, batch_size=2, epochs=1, shuffle=False, callbacks=[callbacks[-1]], verbose=0
            )
        )
    _assert_same_logs([histories[0].history], [histories[1].history])
    assert np.isfinite(histories[0].history["loss"]).all()
    for initial, first in zip(start, callbacks[0].first):
        np.testing.assert_array_equal(initial, first)
    moved = [np.abs(a - b).max() for a, b in zip(start, twins[0].backbone.get_weights())]
    assert max(moved) > 1e-3
    _assert_same_state(*twins)


def test_a_task_without_trainable_weights_warns_and_reports_its_metrics():
    kbert_step, _ = _twins()
    kbert_step.trainable = False
    before = [np.array(w) for w in kbert_step.get_weights()]
    with pytest.warns(UserWarning, match="does not have any trainable weights"):
        logs = kbert_step.train_on_batch(
            random_backbone_inputs(2, 12), np.array([0, 1]), return_dict=True
        )
    assert set(logs) == {"loss", "accuracy"} and logs["loss"] > 0
    for old, new in zip(before, kbert_step.get_weights()):
        np.testing.assert_array_equal(old, new)
