"""BERT's recipe lives in `BertTask.compile`: defaults, settings, errors, the deprecated
constructor arguments, configs and files written before, and the tasks' one input route."""

import json
import warnings

import keras
import numpy as np
import pytest

from kbert.models import BertBackbone, BertClassifier, BertPretrainer
from kbert.models.input_checks import HostInputChecks
from kbert.models.task import BertTask
from kbert.optimizers.lamb import Lamb
from kbert.optimizers.optimization import BertAdamW, planned_schedule
from tests.test_case import TestCase, random_backbone_inputs, tiny_backbone_kwargs, to_numpy

VOCABULARY_SIZE = 40


def _backbone():
    return BertBackbone(
        **tiny_backbone_kwargs(
            vocabulary_size=VOCABULARY_SIZE,
            num_layers=1,
            hidden_dim=16,
            intermediate_dim=24,
            max_sequence_length=16,
        )
    )


def _default_and_plain_classifiers():
    """Inputs, and two classifiers with the same weights: one compiled with `jit_compile` left
    to "auto", one with `compile(jit_compile=False)`."""
    x = random_backbone_inputs(4, 8, vocabulary_size=VOCABULARY_SIZE, seed=3)
    default = BertClassifier(_backbone(), num_classes=3)
    plain = BertClassifier(_backbone(), num_classes=3)
    plain.set_weights(default.get_weights())
    plain.compile(jit_compile=False)
    return x, default, plain


def _rate_at(optimizer, step):
    optimizer.iterations.assign(step)
    return float(to_numpy(optimizer.learning_rate))


def _expected_rate(step, peak, total, warmup):
    if step < warmup:
        return peak * step / warmup
    return peak * max(0.0, 1.0 - (step - warmup) / (total - warmup))


def _kbert_deprecations(caught):
    return [w for w in caught if "training settings" in str(w.message)]


class TestTaskCompile(TestCase):
    def test_compile_without_arguments_is_berts_recipe(self):
        model = BertClassifier(_backbone(), num_classes=2)
        optimizer = model.optimizer
        assert isinstance(optimizer, BertAdamW)
        assert optimizer.weight_decay == pytest.approx(0.01)
        assert optimizer.global_clipnorm == pytest.approx(1.0)
        assert sorted(optimizer.no_decay_names) == ["beta", "bias", "gamma"]
        schedule = planned_schedule(optimizer)
        assert (schedule.peak_learning_rate, schedule.warmup_ratio) == (5e-5, 0.1)
        assert model.compiled_with_defaults and model.recipe == {}
        pretrainer = BertPretrainer(_backbone())
        schedule = planned_schedule(pretrainer.optimizer)
        assert (schedule.peak_learning_rate, schedule.warmup_ratio) == (1e-4, 0.01)

    def test_compile_settings_shape_the_schedule_and_optimizer(self):
        model = BertClassifier(_backbone(), num_classes=2)
        model.compile(learning_rate=3e-3, weight_decay=0.05, total_steps=20, warmup_ratio=0.25)
        optimizer = model.optimizer
        assert optimizer.weight_decay == pytest.approx(0.05)
        assert planned_schedule(optimizer) is None  # a fixed length: nothing to plan in `fit`
        for step in (0, 2, 5, 12, 20, 30):
            assert _rate_at(optimizer, step) == pytest.approx(
                _expected_rate(step, 3e-3, total=20, warmup=5), rel=1e-5, abs=1e-12
            )
        model.compile(warmup_steps=3, total_steps=9, gradient_accumulation_steps=2)
        assert model.optimizer.gradient_accumulation_steps == 2
        config = model.optimizer.get_config()["learning_rate"]
        schedule = keras.optimizers.schedules.deserialize(config)
        assert (schedule.accumulation_steps, schedule.total_steps) == (2, 9)
        assert float(to_numpy(schedule(5))) == pytest.approx(_expected_rate(2, 5e-5, 9, 3))
        pretrainer = BertPretrainer(_backbone(), next_sentence=False)
        pretrainer.compile(update_rule="lamb", learning_rate=2e-3)
        assert isinstance(pretrainer.optimizer, Lamb)
        assert planned_schedule(pretrainer.optimizer).peak_learning_rate == 2e-3
        assert pretrainer.recipe == {"update_rule": "lamb", "learning_rate": 2e-3}

    def test_compile_refuses_bad_settings_and_settings_with_another_optimizer(self):
        model = BertClassifier(_backbone(), num_classes=2)
        with pytest.raises(ValueError, match=r"optimizer=\"auto\"` only.*SGD"):
            model.compile(optimizer=keras.optimizers.SGD(0.1), learning_rate=1e-3)
        bad = {
            "learning_rate": -1.0,
            "weight_decay": -0.1,
            "warmup_ratio": 1.5,
            "warmup_steps": -1,
            "total_steps": 0,
            "update_rule": "sgd",
        }
        for name, value in bad.items():
            with pytest.raises(ValueError, match=f"{name}={value!r}"):
                model.compile(**{name: value})
        # A refused compile leaves the previous one in place.
        assert isinstance(model.optimizer, BertAdamW) and model.compiled_with_defaults
        model.compile(optimizer=keras.optimizers.SGD(0.1))
        assert model.recipe is None and not model.compiled_with_defaults

    def test_constructor_training_arguments_warn_and_still_apply(self):
        expected = r"compile\(learning_rate=\.\.\., total_steps"
        with pytest.warns(DeprecationWarning, match=expected) as record:
            model = BertClassifier(_backbone(), num_classes=2, learning_rate=2e-3, total_steps=10)
        # Attributed to the caller's line, so Python's default filters show it in scripts.
        assert [w.filename for w in _kbert_deprecations(record)] == [__file__]
        assert model.recipe == {"learning_rate": 2e-3, "total_steps": 10}
        assert _rate_at(model.optimizer, 10) == pytest.approx(0.0, abs=1e-12)
        assert _rate_at(model.optimizer, 1) == pytest.approx(2e-3)  # warm-up round(1.0) = 1
        with pytest.warns(DeprecationWarning, match="optimizer='lamb'"):
            pretrainer = BertPretrainer(_backbone(), optimizer="lamb", warmup_steps=2)
        assert isinstance(pretrainer.optimizer, Lamb)
        with pytest.raises(ValueError, match="learning_rate=-1"):
            BertClassifier(_backbone(), num_classes=2, learning_rate=-1)
        # The settings are no longer part of the config.
        assert not {"learning_rate", "total_steps"} & set(model.get_config())
        assert not {"optimizer", "warmup_steps"} & set(pretrainer.get_config())

    def test_configs_and_presets_of_earlier_releases_load_with_their_settings(self, tmp_path):
        model = BertClassifier(_backbone(), num_classes=2)
        old = dict(
            model.get_config(),
            learning_rate=2e-3,
            weight_decay=0.05,
            warmup_ratio=0.0,
            total_steps=10,
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            restored = BertClassifier.from_config(old)
        assert not _kbert_deprecations(caught)
        assert restored.recipe == {
            "learning_rate": 2e-3,
            "weight_decay": 0.05,
            "warmup_ratio": 0.0,
            "total_steps": 10,
        }
        assert restored.optimizer.weight_decay == pytest.approx(0.05)
        pretrainer = BertPretrainer(_backbone(), next_sentence=False)
        old = dict(
            pretrainer.get_config(),
            optimizer="lamb",
            learning_rate=1e-4,
            total_steps=None,
            warmup_steps=None,
            warmup_ratio=0.01,
            weight_decay=0.01,
        )
        assert isinstance(BertPretrainer.from_config(old).optimizer, Lamb)
        # A kbert preset written by an earlier release: its task config has the settings.
        model.save_to_preset(tmp_path / "preset")
        config_path = tmp_path / "preset" / "config.json"
        config = json.loads(config_path.read_text())
        config["task"].update(
            learning_rate=4e-3, weight_decay=0.01, warmup_ratio=0.1, total_steps=None
        )
        config_path.write_text(json.dumps(config))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loaded = BertClassifier.from_preset(tmp_path / "preset", preprocessor=None)
        assert not _kbert_deprecations(caught)
        assert planned_schedule(loaded.optimizer).peak_learning_rate == 4e-3

    def test_keras_file_keeps_the_recipe_and_the_optimizer_state(self, tmp_path):
        model = BertClassifier(_backbone(), num_classes=2)
        model.compile(learning_rate=3e-3, total_steps=20, warmup_steps=5)
        # An optimizer state as after two steps (no training step: tracing one is slow).
        model.optimizer.build(model.trainable_variables)
        model.optimizer.iterations.assign(2)
        rng = np.random.default_rng(0)
        for variable in model.optimizer.variables:
            if "momentum" in variable.path or "velocity" in variable.path:
                variable.assign(rng.uniform(size=variable.shape).astype("float32"))
        model.save(tmp_path / "model.keras")
        loaded = keras.saving.load_model(tmp_path / "model.keras")
        assert loaded.recipe == {"learning_rate": 3e-3, "total_steps": 20, "warmup_steps": 5}
        assert int(to_numpy(loaded.optimizer.iterations)) == 2
        assert float(to_numpy(loaded.optimizer.learning_rate)) == pytest.approx(
            _expected_rate(2, 3e-3, total=20, warmup=5)
        )
        for name in ("momentum", "velocity"):
            before = [to_numpy(v) for v in model.optimizer.variables if name in v.path]
            after = [to_numpy(v) for v in loaded.optimizer.variables if name in v.path]
            assert len(before) == len(after) > 0
            for a, b in zip(before, after):
                np.testing.assert_array_equal(a, b)

    def test_lora_refresh_keeps_the_recipe(self):
        model = BertClassifier(_backbone(), num_classes=2)
        model.compile(learning_rate=2e-3, total_steps=8)
        model.optimizer.build(model.trainable_variables)  # as the first `fit` builds it
        before = model.optimizer
        model.enable_lora(2)
        assert model.optimizer is not before  # a fresh optimizer for the LoRA variables
        assert model.recipe == {"learning_rate": 2e-3, "total_steps": 8}
        schedule = model.optimizer.get_config()["learning_rate"]["config"]
        assert (schedule["peak_learning_rate"], schedule["total_steps"]) == (2e-3, 8)

    def test_one_input_route_for_fit_and_the_batch_methods(self):
        # The ids are checked in the task's own input route, not by a second `fit` override.
        assert HostInputChecks not in BertClassifier.__mro__ and BertTask in BertClassifier.__mro__
        model = BertClassifier(_backbone(), num_classes=2)
        x = random_backbone_inputs(2, 8, vocabulary_size=VOCABULARY_SIZE)
        too_large = np.where(x["token_ids"] > 0, VOCABULARY_SIZE + 3, 0).astype("int32")
        bad = dict(x, token_ids=too_large)
        for call in (
            lambda: model.fit(bad, np.array([0, 1]), verbose=0),
            lambda: model.train_on_batch(bad, np.array([0, 1])),
            lambda: model.test_on_batch(bad, np.array([0, 1])),
            lambda: model.predict_on_batch(bad),
        ):
            with pytest.raises(ValueError, match=r"token_ids.*vocabulary_size\) = \[0, 40\)"):
                call()
        with pytest.raises(ValueError, match=r"labels.*\[0, 2\)"):
            model.train_on_batch(x, np.array([0, 5]))

    def test_predict_gives_the_same_outputs_whatever_jit_compile(self):
        """`predict` with `jit_compile` left to "auto" gives the outputs of
        `compile(jit_compile=False)`."""
        x, default, plain = _default_and_plain_classifiers()
        expected = plain.predict(x, verbose=0)
        assert np.abs(expected).max() > 1e-3  # Not all-zero logits.
        np.testing.assert_allclose(default.predict(x, verbose=0), expected, atol=1e-5)

    @pytest.mark.backends("tensorflow", reason="TensorFlow's tf.function steps and their XLA flag")
    def test_tensorflow_predict_uses_xla_unless_compile_says_otherwise(self, monkeypatch):
        """On TensorFlow, `predict` compiles with XLA when `jit_compile` was left to "auto"
        (Keras' auto turns it off on CPU-only machines); `fit` keeps Keras' choice and
        `compile(jit_compile=False)` keeps XLA off. Outputs are the same either way."""
        import tensorflow as tf

        x, default, plain = _default_and_plain_classifiers()
        resolved = default.jit_compile
        expected = plain.predict(x, verbose=0)
        assert np.abs(expected).max() > 1e-3  # Not all-zero logits.
        jit_flags = []
        real_function = tf.function

        def recording_function(*args, **kwargs):
            jit_flags.append(kwargs.get("jit_compile"))
            return real_function(*args, **kwargs)

        monkeypatch.setattr(tf, "function", recording_function)
        np.testing.assert_allclose(default.predict(x, verbose=0), expected, atol=1e-5)
        assert True in jit_flags  # The step is compiled with XLA ...
        assert default.jit_compile == resolved  # ... and fit's setting is untouched.
        jit_flags.clear()
        plain.make_predict_function(force=True)
        assert True not in jit_flags


def _twin_classifiers(monkeypatch):
    """Two classifiers with the same weights (one to call as kbert does, one through Keras'
    own `*_on_batch`), and the list that records each call the repeated path answers."""
    ours = BertClassifier(_backbone(), num_classes=3, dropout=0.0)
    keras_own = BertClassifier(_backbone(), num_classes=3, dropout=0.0)
    keras_own.set_weights(ours.get_weights())
    repeated = []
    original = type(ours)._batch_logs
    monkeypatch.setattr(
        type(ours), "_batch_logs", lambda self, *a: repeated.append(1) or original(self, *a)
    )
    return ours, keras_own, repeated


@pytest.mark.backends("torch", reason="the repeated train_on_batch path is the torch backend's")
def test_repeated_train_on_batch_returns_and_trains_as_keras_own(monkeypatch):
    """A `train_on_batch` after one through Keras' own runs the train function directly on
    torch: the same logs (a list in the metrics' order, a sorted dict, one bare value), the
    same metrics reset per call and the same weights as Keras' `train_on_batch` at every call;
    `class_weight` and a new `compile` go through Keras' own again."""
    x = random_backbone_inputs(4, 8, vocabulary_size=VOCABULARY_SIZE, seed=5)
    y = np.array([0, 1, 2, 1])
    weights = np.array([1.0, 0.5, 2.0, 1.0], dtype="float32")
    ours, keras_own, repeated = _twin_classifiers(monkeypatch)

    def both(**kwargs):
        a = ours.train_on_batch(x, y, **kwargs)
        b = keras.Model.train_on_batch(keras_own, x, y, **kwargs)
        return a, b

    calls = [{}, {}, dict(return_dict=True), dict(sample_weight=weights), {}]
    calls += [dict(class_weight={0: 1.0, 1: 2.0, 2: 0.5}), dict(sample_weight=weights)]
    for kwargs in calls:
        a, b = both(**kwargs)
        assert type(a) is type(b), kwargs
        if isinstance(a, dict):
            assert list(a) == list(b) == ["accuracy", "loss"]
            a, b = list(a.values()), list(b.values())
        assert len(a) == 2
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=str(kwargs))
    assert len(repeated) == 5  # all but the first call and the one with class_weight
    for a, b in zip(ours.get_weights(), keras_own.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

    for model in (ours, keras_own):
        model.compile(metrics=[])
    for _ in range(3):
        a, b = both()
        assert isinstance(a, float) and a == pytest.approx(b, rel=1e-5)
    assert len(repeated) == 7  # the first call after `compile` is Keras' own


@pytest.mark.backends("torch", reason="the repeated test_on_batch path is the torch backend's")
def test_repeated_test_on_batch_returns_keras_own_logs(monkeypatch):
    """`test_on_batch` after one through Keras' own runs the test function directly on torch:
    the logs of Keras' `test_on_batch` at every call (metrics reset per call, list, dict,
    sample weights); a new `compile` goes through Keras' own again."""
    ours, keras_own, repeated = _twin_classifiers(monkeypatch)
    weights = np.array([1.0, 0.5, 2.0, 1.0], dtype="float32")
    calls = [{}, {}, dict(return_dict=True), dict(sample_weight=weights), {}]
    for seed, kwargs in enumerate(calls):
        x = random_backbone_inputs(4, 8, vocabulary_size=VOCABULARY_SIZE, seed=seed)
        y = np.array([seed % 3, 1, 2, 0])
        a = ours.test_on_batch(x, y, **kwargs)
        b = keras.Model.test_on_batch(keras_own, x, y, **kwargs)
        assert type(a) is type(b), kwargs
        if isinstance(a, dict):
            assert list(a) == list(b) == ["accuracy", "loss"]
            a, b = list(a.values()), list(b.values())
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=str(kwargs))
    assert len(repeated) == 4
    ours.compile(metrics=[])
    keras_own.compile(metrics=[])
    for _ in range(2):
        a, b = ours.test_on_batch(x, y), keras.Model.test_on_batch(keras_own, x, y)
        assert isinstance(a, float) and a == pytest.approx(b, rel=1e-5)
    assert len(repeated) == 5
