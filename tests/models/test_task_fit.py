"""`BertTask.fit`: one compile per model, a schedule planned from what `fit` receives, no
spurious Keras warnings. Runs on every backend."""

import warnings

import keras
import numpy as np
import pytest

from kbert.models import (
    BertBackbone,
    BertClassifier,
    BertPretrainer,
    WarmupLinearDecay,
    bert_optimizer,
)
from kbert.optimizers.optimization import planned_schedule
from tests.test_case import TestCase, random_backbone_inputs, tiny_backbone_kwargs

VOCABULARY_SIZE = 40


def _classifier(**recipe):
    backbone = BertBackbone(
        **tiny_backbone_kwargs(
            vocabulary_size=VOCABULARY_SIZE,
            num_layers=1,
            hidden_dim=16,
            intermediate_dim=24,
            max_sequence_length=16,
        )
    )
    model = BertClassifier(backbone, num_classes=2, dropout=0.0)
    if recipe:
        model.compile(**recipe)
    return model


def _expected_rate(step, peak, total, warmup):
    """BERT's schedule written out: linear warm-up to `peak`, then linear decay to 0 at `total`."""
    if step < warmup:
        return peak * step / warmup
    return peak * max(0.0, 1.0 - (step - warmup) / (total - warmup))


class _RateAtEpochEnd(keras.callbacks.Callback):
    """The learning rate of the next step, read once per epoch (the JAX trainer syncs its
    state into the model's variables at epoch ends)."""

    def __init__(self):
        super().__init__()
        self.rates = []
        self.iterations = []

    def on_epoch_end(self, epoch, logs=None):
        self.iterations.append(int(keras.ops.convert_to_numpy(self.model.optimizer.iterations)))
        self.rates.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))


class TestTaskFit(TestCase):
    def test_fit_never_compiles_and_plans_the_rate_of_every_step(self, monkeypatch):
        model = _classifier(learning_rate=1e-3, warmup_ratio=0.2)
        compiles = []
        original = keras.Model.compile

        def counting_compile(self, *args, **kwargs):
            compiles.append(type(self).__name__)
            return original(self, *args, **kwargs)

        monkeypatch.setattr(keras.Model, "compile", counting_compile)
        x = random_backbone_inputs(4, 8, vocabulary_size=VOCABULARY_SIZE)
        y = np.array([0, 1, 1, 0])
        record = _RateAtEpochEnd()
        # One batch per epoch, 10 epochs: a 10-step schedule warming up for 2.
        model.fit(x, y, batch_size=4, epochs=10, verbose=0, callbacks=[record])
        assert record.iterations == list(range(1, 11))
        expected = [_expected_rate(k, 1e-3, total=10, warmup=2) for k in record.iterations]
        np.testing.assert_allclose(record.rates, expected, rtol=1e-5, atol=1e-12)
        # A second fit plans its own 5 steps (2 batches x 5 epochs... here 1 x 5), from step 10 on.
        record = _RateAtEpochEnd()
        model.fit(x, y, batch_size=4, epochs=5, verbose=0, callbacks=[record])
        assert record.iterations == list(range(11, 16))
        expected = [_expected_rate(k - 10, 1e-3, total=5, warmup=1) for k in record.iterations]
        np.testing.assert_allclose(record.rates, expected, rtol=1e-5, atol=1e-12)
        # Batches of 3 over 4 rows: 2 steps per epoch, 3 epochs -> 6 steps.
        model.fit(x, y, batch_size=3, epochs=3, verbose=0)
        assert planned_schedule(model.optimizer).planned_length() == (6, 1)
        assert compiles == []

    def test_a_callback_given_alone_runs_as_in_a_list(self):
        """`callbacks=callback` (not in a list) runs its batch hooks in the calling thread,
        after each step, as a list does; Keras would run them in a background thread."""
        import threading

        class Threads(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.seen = []

            def on_train_batch_end(self, batch, logs=None):
                self.seen.append(("train", threading.current_thread() is threading.main_thread()))

            def on_test_batch_end(self, batch, logs=None):
                self.seen.append(("test", threading.current_thread() is threading.main_thread()))

            def on_predict_batch_end(self, batch, logs=None):
                self.seen.append(("predict", threading.current_thread() is threading.main_thread()))

        model = _classifier()
        x = random_backbone_inputs(4, 8, vocabulary_size=VOCABULARY_SIZE)
        y = np.array([0, 1, 1, 0])
        callback = Threads()
        model.fit(x, y, batch_size=2, epochs=2, verbose=0, callbacks=callback)
        model.evaluate(x, y, batch_size=2, verbose=0, callbacks=callback)
        model.predict(x, batch_size=2, verbose=0, callbacks=callback)
        kinds = [kind for kind, _ in callback.seen]
        assert kinds == ["train"] * 4 + ["test"] * 2 + ["predict"] * 2
        assert all(main for _, main in callback.seen)

    def test_fixed_and_user_schedules_are_left_alone(self):
        x = random_backbone_inputs(4, 8, vocabulary_size=VOCABULARY_SIZE)
        y = np.array([0, 1, 1, 0])
        fixed = _classifier(learning_rate=1e-3, total_steps=100, warmup_ratio=0.1)
        assert planned_schedule(fixed.optimizer) is None
        fixed.fit(x, y, batch_size=4, epochs=2, verbose=0)
        assert float(keras.ops.convert_to_numpy(fixed.optimizer.learning_rate)) == pytest.approx(
            _expected_rate(2, 1e-3, total=100, warmup=10)
        )
        own = _classifier()
        own.compile(optimizer=keras.optimizers.SGD(0.1))
        own.fit(x, y, batch_size=4, epochs=1, verbose=0)
        assert float(keras.ops.convert_to_numpy(own.optimizer.learning_rate)) == pytest.approx(0.1)

    def test_planned_schedule_values_and_errors(self):
        optimizer = bert_optimizer(2e-4, warmup_ratio=0.1, gradient_accumulation_steps=2)
        schedule = planned_schedule(optimizer)
        # Before planning: the peak rate, constant.
        assert float(keras.ops.convert_to_numpy(schedule(123))) == pytest.approx(2e-4)
        schedule.plan(40, start_step=6)  # 40 micro-batches = 20 updates, 2 of them warming up
        assert schedule.planned_length() == (20, 2)
        for micro_batch in (6, 8, 10, 30, 45):
            update = (micro_batch - 6) // 2
            assert float(keras.ops.convert_to_numpy(schedule(micro_batch))) == pytest.approx(
                _expected_rate(update, 2e-4, total=20, warmup=2), rel=1e-5, abs=1e-12
            )
        with pytest.raises(ValueError, match="num_steps"):
            schedule.plan(0)
        with pytest.raises(ValueError, match="fixed length"):
            WarmupLinearDecay(1e-4, total_steps=10, warmup_steps=1).plan(5)
        with pytest.raises(ValueError, match="track"):
            WarmupLinearDecay(1e-4, warmup_ratio=0.1).plan(5)
        with pytest.raises(ValueError, match="warmup_ratio"):
            WarmupLinearDecay(1e-4, warmup_ratio=1.5)

    def test_dataset_of_unknown_size_is_counted_without_keras_warnings(self):
        tf = pytest.importorskip("tensorflow")
        x = random_backbone_inputs(12, 8, vocabulary_size=VOCABULARY_SIZE)
        y = np.arange(12) % 2
        # `filter` hides the size from tf.data (cardinality -2): 12 rows in batches of 4 = 3 steps.
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda *_: True).batch(4)
        assert int(dataset.cardinality()) == -2
        model = _classifier(learning_rate=1e-3, warmup_ratio=0.0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            history = model.fit(dataset, epochs=2, verbose=0)
        messages = [str(w.message) for w in caught]
        assert not [m for m in messages if "ran out of data" in m or "shuffle" in m], messages
        assert len(history.history["loss"]) == 2
        assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 6
        assert planned_schedule(model.optimizer).planned_length() == (6, 0)
        assert float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)) == pytest.approx(
            0.0, abs=1e-12
        )

    def test_pretrainer_is_a_task_with_a_planned_schedule(self):
        from kbert.models.task import BertTask

        backbone = BertBackbone(
            **tiny_backbone_kwargs(vocabulary_size=VOCABULARY_SIZE, num_layers=1)
        )
        pretrainer = BertPretrainer(backbone)
        pretrainer.compile(learning_rate=1e-3, warmup_steps=1)
        assert isinstance(pretrainer, BertTask)
        x = random_backbone_inputs(4, 8, vocabulary_size=VOCABULARY_SIZE)
        x["mask_positions"] = np.array([[1, 2]] * 4, "int32")
        y = {"mlm": np.array([[5, 6]] * 4, "int32"), "nsp": np.array([0, 1, 0, 1])}
        pretrainer.fit(x, y, batch_size=2, epochs=2, verbose=0)
        assert planned_schedule(pretrainer.optimizer).planned_length() == (4, 1)
        assert int(keras.ops.convert_to_numpy(pretrainer.optimizer.iterations)) == 4
        with pytest.raises(ValueError, match="lamb"):
            pretrainer.compile(update_rule="sgd")


@pytest.mark.backends(
    "tensorflow", reason="a tf.function whose first trace creates variables is traced again"
)
def test_fit_traces_the_train_step_once_on_tensorflow():
    """Keras builds the optimizer inside the first trace of the train step on TensorFlow
    (without a strategy), which made TensorFlow trace the whole step a second time; kbert
    builds it first, so `fit`, `evaluate` and `predict` each trace their step once. The
    optimizer's variables are those of `optimizer.build(model.trainable_variables)`."""
    model = _classifier(learning_rate=1e-3)
    traces = {}
    for name in ("train_step", "test_step", "predict_step"):
        step = getattr(model, name)

        def counted(*args, _step=step, _name=name, **kwargs):
            traces[_name] = traces.get(_name, 0) + 1
            return _step(*args, **kwargs)

        object.__setattr__(model, name, counted)
    x = random_backbone_inputs(4, 8, vocabulary_size=VOCABULARY_SIZE)
    y = np.array([0, 1, 1, 0])
    model.fit(x, y, batch_size=4, epochs=2, verbose=0)
    model.evaluate(x, y, batch_size=4, verbose=0)
    model.predict(x, batch_size=4, verbose=0)
    assert traces == {"train_step": 1, "test_step": 1, "predict_step": 1}, traces
    slots = [v for v in model.optimizer.variables if "momentum" in v.path]
    assert len(slots) == len(model.trainable_variables)
