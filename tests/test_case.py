"""The shared test base: `TestCase` and its per-part checks, plus small helpers.

Every model and layer test class derives from `TestCase` and calls the checks that apply to
what it tests:

- `run_layer_test`: a layer's numbers against a reference, output shape and dtype, weight
  counts, config and serialization round-trips, and (for sequence layers) that padded
  positions and extra padding change nothing at real positions.
- `run_backbone_test`: config round-trip, `.keras` save/load with equal outputs, variable
  sequence lengths, one `fit` step.
- `run_task_test`: predict on raw strings equals the model on preprocessed inputs; config and
  `.keras` round-trips keep the preprocessor and the outputs; `fit` on raw strings lowers the
  loss of a learnable toy problem; `fit` on preprocessed inputs trains too.
- `run_preset_test`: `save_to_preset` / `from_preset` keep config, weights and outputs exactly.
- `run_precision_test`: under `mixed_bfloat16` / `mixed_float16` every kernel-bearing layer
  computes in the low-precision dtype with float32 variables, every LayerNorm in float32, and
  the policy survives config and `.keras` round-trips.

The checks use public Keras and kbert APIs only, so they keep holding while library
internals change. Each returns what it built, for the caller's model-specific assertions.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np

from tests.per_backend import per_backend

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = Path(os.environ.get("KBERT_DATA_DIR", REPO_ROOT.parent / "shared" / "data"))
BACKENDS = ("tensorflow", "jax", "torch")
LOW_PRECISION = {"mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}


def to_numpy(tree):
    """Converts a (nested dict of) backend tensor(s) to NumPy."""
    if isinstance(tree, dict):
        return {k: to_numpy(v) for k, v in tree.items()}
    return keras.ops.convert_to_numpy(tree)


def assert_all_close(actual, expected, atol=1e-5, rtol=1e-5, mask=None):
    """Compares (dicts of) arrays; `mask` (batch, seq) restricts sequence outputs to real
    positions."""
    actual, expected = to_numpy(actual), to_numpy(expected)
    if isinstance(expected, dict):
        assert sorted(actual) == sorted(expected), (sorted(actual), sorted(expected))
        for key in expected:
            assert_all_close(actual[key], expected[key], atol, rtol, mask)
        return
    actual, expected = np.asarray(actual, "float64"), np.asarray(expected, "float64")
    if mask is not None and actual.ndim >= 2 and actual.shape[:2] == mask.shape:
        actual, expected = actual[mask.astype(bool)], expected[mask.astype(bool)]
    np.testing.assert_allclose(actual, expected, atol=atol, rtol=rtol)


def _keras_devices_on_cpu():
    return keras.distribution.list_devices()[0].lower().startswith("cpu")


def _torch_on_cpu():
    import torch

    return not torch.cuda.is_available()


def on_cpu():
    """True when the backend computes on a CPU (torch: Keras has no `keras.distribution` there,
    so torch's own CUDA check decides)."""
    return per_backend(
        tensorflow=_keras_devices_on_cpu, jax=_keras_devices_on_cpu, torch=_torch_on_cpu
    )()


def tiny_backbone_kwargs(**overrides):
    kwargs = dict(
        vocabulary_size=97,
        num_layers=2,
        num_heads=2,
        hidden_dim=32,
        intermediate_dim=48,
        max_sequence_length=24,
        dropout=0.0,
        attention_dropout=0.0,
    )
    kwargs.update(overrides)
    return kwargs


def random_backbone_inputs(batch_size=3, sequence_length=12, vocabulary_size=97, seed=0, pad=True):
    """Packed inputs with a different amount of trailing padding per row."""
    rng = np.random.default_rng(seed)
    token_ids = rng.integers(1, vocabulary_size, size=(batch_size, sequence_length)).astype("int32")
    lengths = np.full(batch_size, sequence_length)
    if pad:
        lengths = np.maximum(2, sequence_length - 3 * np.arange(batch_size))
    padding_mask = (np.arange(sequence_length)[None, :] < lengths[:, None]).astype("int32")
    segment_ids = (
        (np.arange(sequence_length)[None, :] >= lengths[:, None] // 2) * padding_mask
    ).astype("int32")
    token_ids = token_ids * padding_mask
    return {"token_ids": token_ids, "segment_ids": segment_ids, "padding_mask": padding_mask}


def values_by_path(model):
    """`{variable.path: NumPy copy}` of every variable of `model`."""
    return {v.path: np.array(keras.ops.convert_to_numpy(v)) for v in model.weights}


def dtype_name(x):
    return keras.backend.standardize_dtype(x.dtype)


def run_in_backend(backend, code, timeout=300):
    """Runs Python `code` in a fresh interpreter with KERAS_BACKEND=backend; returns stdout."""
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise AssertionError(f"Subprocess under {backend} failed:\n{result.stderr[-4000:]}")
    return result.stdout


class LayerCallRecorder:
    """Records every `keras.layers.Layer.__call__` (layer, output dtypes) while active.

    A forward pass through a model calls each of its sublayers through `__call__`, so the
    record lists the layers that actually run, with the dtypes they produced: public
    behaviour, without walking Keras' private layer tracking.
    """

    def __init__(self):
        self.calls = []
        self._original = None

    def __enter__(self):
        self._original = original = keras.layers.Layer.__call__
        calls = self.calls

        def recording_call(layer, *args, **kwargs):
            outputs = original(layer, *args, **kwargs)
            dtypes = [dtype_name(t) for t in keras.tree.flatten(outputs) if hasattr(t, "dtype")]
            calls.append((layer, dtypes))
            return outputs

        keras.layers.Layer.__call__ = recording_call
        return self

    def __exit__(self, *exc_info):
        keras.layers.Layer.__call__ = self._original

    def layers(self):
        """The distinct layers called, in call order, with all their output dtypes."""
        seen = {}
        for layer, dtypes in self.calls:
            seen.setdefault(id(layer), (layer, []))[1].extend(dtypes)
        return list(seen.values())


def own_variables(layer):
    """The variables a layer created itself (not those of its sublayers), by variable path."""
    return [v for v in layer.variables if v.path == f"{layer.path}/{v.name}"]


def _shorten(inputs, length):
    shorter = {}
    for key, value in inputs.items():
        shorter[key] = value[:, :length] if value.ndim == 2 and key != "mask_positions" else value
    if "mask_positions" in shorter:
        shorter["mask_positions"] = np.minimum(shorter["mask_positions"], length - 1)
    return shorter


def check_variable_lengths(model, inputs, reference, lengths):
    """`inputs` cropped to each length: outputs are finite, and rows whose real tokens (and
    mask positions) all fit give the reference outputs at their real positions (padding
    length changes nothing)."""
    real_lengths = inputs["padding_mask"].sum(axis=1)
    for length in lengths:
        outputs = to_numpy(model(_shorten(inputs, length)))
        outputs = outputs if isinstance(outputs, dict) else {"output": outputs}
        expected = reference if isinstance(reference, dict) else {"output": reference}
        fits = real_lengths <= length
        if "mask_positions" in inputs:
            fits &= (inputs["mask_positions"] < length).all(axis=1)
        assert fits.any(), f"no row of the inputs fits in {length} positions"
        mask = inputs["padding_mask"][fits, :length]
        for key, value in outputs.items():
            assert np.isfinite(np.asarray(value, "float32")).all(), (length, key)
            want, got = np.asarray(expected[key])[fits], np.asarray(value)[fits]
            if want.ndim >= 2 and want.shape[1] == inputs["padding_mask"].shape[1]:  # per position
                assert_all_close(got, want[:, :length], atol=1e-5, rtol=1e-5, mask=mask)
            else:
                assert_all_close(got, want, atol=1e-5, rtol=1e-5)


def _fit(model, fit_data, **kwargs):
    x, y, *weights = fit_data
    sample_weight = weights[0] if weights else None
    return model.fit(x, y, sample_weight=sample_weight, verbose=0, **kwargs)


class TestCase:
    """Base class of kbert's model and layer tests (pytest collects its `Test*` subclasses).

    The `run_*_test` methods hold the checks that every layer, backbone, task and preset must
    pass; a test class calls those that apply and adds its own reference comparisons.
    """

    # ------------------------------------------------------------------ layers
    def run_layer_test(
        self,
        cls,
        init_kwargs,
        input_data,
        call_kwargs=None,
        expected_output_shape=None,
        expected_output_dtype="float32",
        expected_num_trainable_weights=None,
        expected_num_non_trainable_weights=0,
        reference_fn=None,
        atol=1e-5,
        padding_mask_key=None,
    ):
        """Builds `cls(**init_kwargs)`, calls it on `input_data` and checks it.

        Args:
            cls: the layer class.
            init_kwargs: dict. Constructor arguments.
            input_data: NumPy array (or tuple of arrays, passed positionally).
            call_kwargs: dict of further call arguments (e.g. `padding_mask`).
            expected_output_shape: tuple or None.
            expected_output_dtype: str. Defaults to `"float32"`.
            expected_num_trainable_weights: int or None.
            expected_num_non_trainable_weights: int. Defaults to 0.
            reference_fn: `reference_fn(layer, input_data, call_kwargs) -> NumPy` with the
                layer's weights, or None. Outputs must match it within `atol`.
            atol: float. Tolerance of the reference comparison.
            padding_mask_key: name of the call argument holding a (batch, seq) padding mask
                for sequence layers. When given, values at padded positions and extra
                trailing padding must not change the outputs at real positions.

        Returns:
            The layer.
        """
        call_kwargs = dict(call_kwargs or {})
        args = input_data if isinstance(input_data, tuple) else (input_data,)
        layer = cls(**init_kwargs)
        result = layer(*args, **call_kwargs)
        assert dtype_name(result) == expected_output_dtype
        outputs = to_numpy(result)
        if expected_output_shape is not None:
            assert tuple(outputs.shape) == tuple(expected_output_shape), (
                outputs.shape,
                expected_output_shape,
            )
        assert np.isfinite(outputs).all()
        if expected_num_trainable_weights is not None:
            assert len(layer.trainable_weights) == expected_num_trainable_weights, [
                w.path for w in layer.trainable_weights
            ]
        assert len(layer.non_trainable_weights) == expected_num_non_trainable_weights
        if reference_fn is not None:
            assert_all_close(
                outputs, reference_fn(layer, input_data, call_kwargs), atol=atol, rtol=atol
            )

        # Config round-trip, directly and through Keras serialization; equal outputs with the
        # weights.
        config = layer.get_config()
        clone = cls.from_config(config)
        assert clone.get_config() == config
        serialized = keras.saving.serialize_keras_object(layer)
        revived = keras.saving.deserialize_keras_object(serialized)
        assert type(revived) is cls and revived.get_config() == config
        revived(*args, **call_kwargs)
        revived.set_weights(layer.get_weights())
        assert_all_close(revived(*args, **call_kwargs), outputs, atol=1e-6, rtol=1e-6)

        # Freezing moves every weight to the non-trainable list.
        count = len(layer.weights)
        layer.trainable = False
        assert not layer.trainable_weights and len(layer.non_trainable_weights) == count
        layer.trainable = True

        if padding_mask_key is not None:
            # Other values at padded positions and 3 more padded positions (variable length)
            # change nothing at real positions.
            mask = np.asarray(call_kwargs[padding_mask_key]).astype(bool)
            x = np.pad(np.array(args[0]), ((0, 0), (0, 3), (0, 0)))
            longer_mask = np.pad(mask, ((0, 0), (0, 3)))
            noise = np.random.default_rng(7).normal(size=x.shape).astype(x.dtype) * 10
            x = np.where(longer_mask[..., None], x, noise)
            longer_kwargs = dict(call_kwargs, **{padding_mask_key: longer_mask.astype("int32")})
            longer = to_numpy(layer(x, *args[1:], **longer_kwargs))
            assert_all_close(longer[:, : mask.shape[1]], outputs, atol=1e-5, rtol=1e-5, mask=mask)
        return layer

    # --------------------------------------------------------------- backbones
    def run_backbone_test(self, cls, init_kwargs, input_data, tmp_path, sequence_lengths=(9,)):
        """Config, `.keras`, variable-length and fit checks of a backbone.

        Args:
            cls: the backbone class.
            init_kwargs: dict. Constructor arguments.
            input_data: dict of NumPy inputs with `padding_mask`.
            tmp_path: folder for the `.keras` file.
            sequence_lengths: other lengths the backbone must accept (inputs cropped to
                them; see `check_variable_lengths`).

        Returns:
            The backbone.
        """
        backbone = cls(**init_kwargs)
        reference = to_numpy(backbone(input_data))
        self._check_config_and_keras_file(backbone, input_data, reference, tmp_path)

        check_variable_lengths(backbone, input_data, reference, sequence_lengths)

        # One fit step through the pooled output changes the weights and gives a finite loss.
        model = keras.Model(backbone.input, backbone.output["pooled_output"])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        # Built before the step, as on JAX and torch: TensorFlow would trace it twice otherwise.
        model.optimizer.build(model.trainable_variables)
        target = (
            np.random.default_rng(0).normal(size=reference["pooled_output"].shape).astype("float32")
        )
        before = values_by_path(backbone)
        loss = model.train_on_batch(input_data, target)
        assert np.isfinite(float(np.asarray(loss).reshape(-1)[0]))
        after = values_by_path(backbone)
        assert any(not np.array_equal(before[p], after[p]) for p in before)
        return backbone

    # ------------------------------------------------------------------- tasks
    def run_task_test(
        self,
        task,
        raw_x=None,
        raw_fit_data=None,
        input_data=None,
        tmp_path=None,
        fit_kwargs=None,
        max_loss_ratio=None,
        preprocessed_data=None,
        sequence_lengths=(),
        preprocess=None,
        atol=1e-6,
    ):
        """Raw-input and preprocessed paths of a task model, round-trips and learning.

        Args:
            task: a task model.
            raw_x: raw inputs (strings, pairs, word lists) its preprocessor, `predict` and
                `fit` accept, or None for a task without raw input.
            raw_fit_data: `(raw inputs, labels)` for `fit` on raw input, or None.
            input_data: packed inputs for the round-trips. Defaults to the preprocessor's
                output on `raw_x`.
            tmp_path: folder for the `.keras` file, or None to skip it.
            fit_kwargs: dict for the raw `fit` (epochs, batch_size).
            max_loss_ratio: float. The last epoch's loss must be below this fraction of
                the first's (the toy problem is learnable).
            preprocessed_data: `(x, y)` or `(x, y, sample_weight)` of packed inputs, for
                one epoch of `fit` (finite loss, weights move) before the raw `fit`, or None.
            sequence_lengths: other lengths the task must accept (`input_data` cropped to
                them; see `check_variable_lengths`).
            preprocess: callable turning `raw_x` into packed inputs, as `predict` does.
                Defaults to `task.preprocessor`.
            atol: float. Tolerance of the raw-vs-preprocessed comparison.

        Returns:
            The history of the raw `fit` (or None).
        """
        preprocess = preprocess or getattr(task, "preprocessor", None)
        if input_data is None:
            input_data = preprocess(raw_x)
        expected = to_numpy(task(input_data))
        if raw_x is not None:
            # `predict` on raw input is the model on the preprocessed input, at real positions
            # (length batching leaves per-token outputs past a batch's bucket at a fill value).
            packed = preprocess(raw_x)
            mask = to_numpy(packed["padding_mask"]) if isinstance(packed, dict) else None
            assert_all_close(
                task.predict(raw_x, verbose=0),
                to_numpy(task(packed)),
                atol=atol,
                rtol=atol,
                mask=mask,
            )
        restored = self._check_config_and_keras_file(task, input_data, expected, tmp_path)
        check_variable_lengths(task, input_data, expected, sequence_lengths)
        if restored is not None and getattr(task, "preprocessor", None) is not None:
            # The same tokenizer (a question answerer sets its preprocessor's length itself).
            assert (
                restored.preprocessor.tokenizer.get_config()
                == task.preprocessor.tokenizer.get_config()
            )
            if raw_x is not None:
                assert_all_close(
                    restored.predict(raw_x, verbose=0),
                    task.predict(raw_x, verbose=0),
                    atol=1e-6,
                    rtol=1e-6,
                )

        if preprocessed_data is not None:
            before = values_by_path(task)
            result = _fit(task, preprocessed_data, epochs=1)
            assert np.isfinite(result.history["loss"][-1])
            after = values_by_path(task)
            assert any(not np.array_equal(before[p], after[p]) for p in before)
        history = None
        if raw_fit_data is not None:
            history = task.fit(*raw_fit_data, verbose=0, **(fit_kwargs or {}))
            losses = history.history["loss"]
            assert np.isfinite(losses).all(), losses
            if max_loss_ratio is not None:
                assert losses[-1] < max_loss_ratio * losses[0], losses
        return history

    # ----------------------------------------------------------------- presets
    def run_preset_test(
        self,
        model,
        input_data,
        tmp_path,
        cls=None,
        same_weights=True,
        atol=0.0,
        **from_preset_kwargs,
    ):
        """`save_to_preset` then `from_preset` gives the same config, weights and outputs.

        Args:
            model: the model to save.
            input_data: packed inputs for the output comparison.
            tmp_path: parent folder of the preset directory.
            cls: class to load with. Defaults to `type(model)`.
            same_weights: bool. Whether config and weights must be the model's own (not for
                a model saved merged, as LoRA). Defaults to `True`.
            atol: float. Tolerance of the output comparison. Defaults to 0 (exact).
            **from_preset_kwargs: further `from_preset` arguments.

        Returns:
            The restored model.
        """
        cls = cls or type(model)
        path = Path(tmp_path) / "preset"
        expected = to_numpy(model(input_data))
        model.save_to_preset(path)
        assert not any(p.name.startswith(".tmp") for p in path.iterdir())
        restored = cls.from_preset(path, **from_preset_kwargs)
        if same_weights and not from_preset_kwargs and cls is type(model):
            # The same configuration (the object's unique name aside).
            unnamed = lambda config: {k: v for k, v in config.items() if k != "name"}  # noqa: E731
            assert unnamed(restored.get_config()) == unnamed(model.get_config())
            for a, b in zip(restored.get_weights(), model.get_weights()):
                np.testing.assert_array_equal(a, b)
        assert_all_close(restored(input_data), expected, atol=atol, rtol=atol)
        return restored

    # --------------------------------------------------------------- precision
    def run_precision_test(
        self,
        model_fn,
        input_data,
        policies=tuple(LOW_PRECISION),
        output_dtypes=None,
        min_kernel_layers=1,
        tmp_path=None,
        fit_data=None,
    ):
        """Mixed-precision checks of the model that `model_fn(policy)` builds.

        Every layer that runs in a forward pass and owns a `kernel` or `embeddings` variable
        computes in the low-precision dtype, keeps float32 variables and returns low-precision
        outputs; every LayerNormalization computes and returns float32; every variable of the
        model belongs to a layer that ran; outputs are finite. The policy survives the
        config round-trip and (with `tmp_path`) a `.keras` save/load with equal outputs.

        Args:
            model_fn: `model_fn(policy_name) -> model`.
            input_data: dict of NumPy inputs.
            policies: policy names to check.
            output_dtypes: dict `{output name: dtype}` (or one dtype) the outputs must have,
                or None to skip.
            min_kernel_layers: int. At least this many kernel-bearing layers must run.
            tmp_path: folder for the `.keras` file (saved under the first policy), or None
                to skip it.
            fit_data: `(x, y)` or `(x, y, sample_weight)` for one epoch of `fit` under
                `mixed_float16`, the policy whose training differs (Keras wraps the optimizer
                in loss scaling); the loss must be finite and the variables stay float32.
                `mixed_bfloat16` trains through the same code with another dtype: its forward
                checks above cover it.
        """
        for policy in policies:
            low = LOW_PRECISION[policy]
            model = model_fn(policy)
            assert model.dtype_policy.name == policy
            with LayerCallRecorder() as record:
                outputs = model(input_data)
            owned = set()
            kernel_layers, norms = [], []
            for layer, dtypes in record.layers():
                own = own_variables(layer)
                owned.update(v.path for v in own)
                if isinstance(layer, keras.layers.LayerNormalization):
                    norms.append((layer, dtypes))
                elif any(v.name in ("kernel", "embeddings") for v in own):
                    kernel_layers.append((layer, dtypes))
            assert len(kernel_layers) >= min_kernel_layers, [
                layer.path for layer, _ in kernel_layers
            ]
            for layer, dtypes in kernel_layers:
                where = f"{policy}: {layer.path}"
                assert layer.compute_dtype == low, where
                assert all(v.dtype == "float32" for v in layer.trainable_variables), where
                # Every output of the layer (the tied decoder's logits included) is low precision.
                assert set(dtypes) == {low}, (where, dtypes)
            assert norms, policy
            for layer, dtypes in norms:
                assert layer.compute_dtype == "float32", f"{policy}: {layer.path}"
                assert set(dtypes) == {"float32"}, f"{policy}: {layer.path}"
            missing = sorted(v.path for v in model.weights if v.path not in owned)
            assert not missing, (policy, missing)

            flat = outputs if isinstance(outputs, dict) else {"output": outputs}
            for key, value in flat.items():
                assert np.isfinite(np.asarray(to_numpy(value), "float32")).all(), (policy, key)
                if output_dtypes is not None:
                    wanted = output_dtypes if isinstance(output_dtypes, str) else output_dtypes[key]
                    assert dtype_name(value) == wanted.replace("low", low), (
                        policy,
                        key,
                        dtype_name(value),
                    )

            config = model.get_config()
            assert type(model).from_config(config).get_config() == config
            if fit_data is not None and policy == "mixed_float16":
                model.compile(optimizer=keras.optimizers.Adam(1e-3))
                history = _fit(model, fit_data, epochs=1)
                assert np.isfinite(history.history["loss"][-1]), policy
                assert all(v.dtype == "float32" for v in model.trainable_variables), policy
            if tmp_path is not None and policy == policies[0]:
                path = Path(tmp_path) / f"{policy}.keras"
                model.save(path)
                restored = keras.saving.load_model(path)
                assert restored.dtype_policy.name == policy
                np.testing.assert_array_equal(
                    np.asarray(to_numpy(keras.tree.flatten(restored(input_data))[0]), "float32"),
                    np.asarray(to_numpy(keras.tree.flatten(outputs)[0]), "float32"),
                )

    # ----------------------------------------------------------------- shared
    def _check_config_and_keras_file(self, model, inputs, reference, tmp_path):
        config = model.get_config()
        clone = type(model).from_config(config)
        assert clone.get_config() == config
        clone.set_weights(model.get_weights())
        assert_all_close(clone(inputs), reference, atol=1e-6, rtol=1e-6)
        if tmp_path is not None:
            path = Path(tmp_path) / "model.keras"
            model.save(path)
            restored = keras.saving.load_model(path)
            assert type(restored) is type(model)
            assert_all_close(restored(inputs), reference, atol=1e-6, rtol=1e-6)
            return restored
        return None


def record_answers(monkeypatch, module, name):
    """Replaces `module.name` by a wrapper that records, for each call, whether it answered
    (returned something other than None); returns that list. For the speed paths of
    `kbert.backend`, which answer None where the portable route runs."""
    answers = []
    original = getattr(module, name)

    def recorded(*args, **kwargs):
        result = original(*args, **kwargs)
        answers.append(result is not None)
        return result

    monkeypatch.setattr(module, name, recorded)
    return answers
