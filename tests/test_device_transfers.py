"""No device-to-host transfer inside a training, evaluation or inference step, on any backend.

Every step method is wrapped so that, while it runs, reading a tensor back to the host
raises: `keras.ops.convert_to_numpy` on every backend; on torch also `Tensor.item`, `.numpy`,
`.tolist`, `.cpu` and `bool(tensor)` (each a device sync on a GPU); on JAX the steps run under
`jax.transfer_guard_device_to_host("disallow")` (effective on accelerators). On TensorFlow
the steps are graphs, where a host read can only come from a py_function; the spy still catches
kbert code that would try one at trace time.
"""

import contextlib

import keras
import numpy as np
import pytest

from kbert.models import BertBackbone, BertClassifier, BertPretrainer
from tests.per_backend import per_backend
from tests.test_case import random_backbone_inputs, tiny_backbone_kwargs


class HostTransfer(AssertionError):
    pass


def _torch_reads():
    """`(owner, name)` of the torch methods that read a tensor back to the host."""
    import torch

    return [(torch.Tensor, name) for name in ("item", "numpy", "tolist", "cpu", "__bool__")]


@pytest.fixture
def no_transfer_in_steps(monkeypatch):
    state = {"in_step": 0, "steps": 0}

    def guard(name, original):
        def guarded(*args, **kwargs):
            if state["in_step"]:
                raise HostTransfer(f"{name} called inside a step")
            return original(*args, **kwargs)

        return guarded

    monkeypatch.setattr(
        keras.ops, "convert_to_numpy", guard("convert_to_numpy", keras.ops.convert_to_numpy)
    )
    # The backend's own read-back methods, besides `convert_to_numpy`.
    for owner, method in per_backend(torch=_torch_reads, jax=list, tensorflow=list)():
        monkeypatch.setattr(
            owner, method, guard(f"{owner.__name__}.{method}", getattr(owner, method))
        )

    def watch(model):
        for name in ("train_step", "test_step", "predict_step"):
            step = getattr(model, name)

            def watched(*args, _step=step, **kwargs):
                state["in_step"] += 1
                state["steps"] += 1
                try:
                    return _step(*args, **kwargs)
                finally:
                    state["in_step"] -= 1

            object.__setattr__(model, name, watched)
        return model

    watch.state = state
    return watch


def _jax_transfer_guard():
    import jax

    return jax.transfer_guard_device_to_host("disallow")


def _guard():
    """JAX's own guard against device-to-host transfers; the other backends have none."""
    return per_backend(
        jax=_jax_transfer_guard,
        tensorflow=contextlib.nullcontext,
        torch=contextlib.nullcontext,
    )()


def _run_all(model, x, y, sample_weight=None):
    with _guard():
        model.fit(x, y, sample_weight=sample_weight, batch_size=2, epochs=2, verbose=0)
        model.evaluate(x, y, sample_weight=sample_weight, batch_size=2, verbose=0)
        model.predict(x, batch_size=2, verbose=0)
        model.train_on_batch(x, y, sample_weight=sample_weight)
        model.predict_on_batch(x)


def test_classifier_steps_do_not_read_back(no_transfer_in_steps):
    backbone = BertBackbone(**tiny_backbone_kwargs(dropout=0.1, attention_dropout=0.1))
    model = no_transfer_in_steps(BertClassifier(backbone, num_classes=2))
    x = random_backbone_inputs(4, 8)
    _run_all(model, x, np.array([0, 1, 1, 0], "int32"))
    assert no_transfer_in_steps.state["steps"] > 0


def test_pretrainer_steps_do_not_read_back(no_transfer_in_steps):
    backbone = BertBackbone(**tiny_backbone_kwargs(dropout=0.1, attention_dropout=0.1))
    model = no_transfer_in_steps(BertPretrainer(backbone))
    inputs = random_backbone_inputs(4, 8)
    positions = np.array([[1, 2], [1, 3], [2, 4], [1, 5]], "int32")
    x = dict(inputs, mask_positions=positions)
    y = {
        "mlm": np.take_along_axis(inputs["token_ids"], positions, 1),
        "nsp": np.array([0, 1, 0, 1]),
    }
    weights = {"mlm": np.ones((4, 2), "float32"), "nsp": np.ones(4, "float32")}
    _run_all(model, x, y, weights)
    assert no_transfer_in_steps.state["steps"] > 0


def _assert_the_spy_catches(no_transfer_in_steps, read_back, run_eagerly):
    """The check can fail: a layer that calls `read_back` on its input inside the step is
    caught."""

    class ReadsBack(keras.layers.Layer):
        def call(self, x):
            read_back(x)
            return x

        def compute_output_shape(self, shape):
            return shape

    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(1)(ReadsBack()(inputs)))
    model.compile(optimizer="sgd", loss="mse", run_eagerly=run_eagerly)
    no_transfer_in_steps(model)
    with pytest.raises(Exception, match="called inside a step"):
        model.fit(np.ones((4, 3)), np.ones((4, 1)), verbose=0)


@pytest.mark.backends(
    "torch", reason="a torch tensor's own read-back method (`Tensor.item`), in an eager step"
)
def test_the_spy_catches_a_read_back_on_torch(no_transfer_in_steps):
    _assert_the_spy_catches(no_transfer_in_steps, lambda x: x.max().item(), run_eagerly=True)


@pytest.mark.backends(
    "tensorflow",
    reason="TensorFlow traces the step into a graph, where the spy catches the attempt at trace "
    "time. On JAX, steps are traced: reading a traced value back already raises.",
)
def test_the_spy_catches_a_read_back_on_tensorflow(no_transfer_in_steps):
    _assert_the_spy_catches(no_transfer_in_steps, keras.ops.convert_to_numpy, run_eagerly=False)
