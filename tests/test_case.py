"""The one shared test helper: the checks every kbert model must pass, on every backend.

`run_model_checks(...)` covers: config round-trip, `.keras` save/load with equal outputs,
variable sequence lengths, mixed precision (`mixed_bfloat16`, `mixed_float16`) with finite
outputs and float32 LayerNorms, and one `fit` step. Per-model test files then stay short.
"""

import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = Path(os.environ.get("KBERT_DATA_DIR", REPO_ROOT.parent / "shared" / "data"))
BACKENDS = ("tensorflow", "jax", "torch")


def to_numpy(tree):
    """Converts a (nested dict of) backend tensor(s) to NumPy."""
    if isinstance(tree, dict):
        return {k: to_numpy(v) for k, v in tree.items()}
    return keras.ops.convert_to_numpy(tree)


def assert_all_close(actual, expected, atol=1e-5, rtol=1e-5, mask=None):
    """Compares (dicts of) arrays; `mask` (batch, seq) restricts sequence outputs to real positions."""
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
    segment_ids = ((np.arange(sequence_length)[None, :] >= lengths[:, None] // 2) * padding_mask).astype(
        "int32"
    )
    token_ids = token_ids * padding_mask
    return {"token_ids": token_ids, "segment_ids": segment_ids, "padding_mask": padding_mask}


def run_model_checks(model_fn, inputs, fit_data=None, tmp_path=None, sequence_lengths=(5, 9)):
    """Runs the shared checks on the model that `model_fn()` builds.

    Args:
        model_fn: callable returning a fresh model (called again under other dtype policies).
        inputs: dict of NumPy inputs.
        fit_data: `(x, y)` or `(x, y, sample_weight)` for one `fit` step, or None.
        tmp_path: pytest tmp dir for the `.keras` file.
        sequence_lengths: other lengths the model must accept (inputs truncated to them).
    """
    model = model_fn()
    reference = to_numpy(model(inputs))

    # Config round-trip builds an identical architecture.
    config = model.get_config()
    clone = type(model).from_config(config)
    assert clone.get_config() == config
    clone.set_weights(model.get_weights())
    assert_all_close(clone(inputs), reference, atol=1e-6, rtol=1e-6)

    # .keras save/load gives identical outputs.
    if tmp_path is not None:
        path = Path(tmp_path) / "model.keras"
        model.save(path)
        restored = keras.saving.load_model(path)
        assert_all_close(restored(inputs), reference, atol=1e-6, rtol=1e-6)

    # Variable sequence lengths.
    for length in sequence_lengths:
        shorter = {k: (v[:, :length] if v.ndim == 2 and k != "mask_positions" else v) for k, v in inputs.items()}
        if "mask_positions" in shorter:
            shorter["mask_positions"] = np.minimum(shorter["mask_positions"], length - 1)
        outputs = to_numpy(model(shorter))
        for value in outputs.values():
            assert np.isfinite(value).all()

    # Mixed precision: finite outputs, float32 LayerNorm variables and outputs in the compute dtype.
    for policy in ("mixed_bfloat16", "mixed_float16"):
        keras.config.set_dtype_policy(policy)
        try:
            mixed = model_fn()
            outputs = mixed(inputs)
            for value in to_numpy(outputs).values():
                assert np.isfinite(np.asarray(value, "float32")).all(), policy
            for layer in mixed._flatten_layers(include_self=False, recursive=True):
                if isinstance(layer, keras.layers.LayerNormalization):
                    assert layer.compute_dtype == "float32", (policy, layer.name)
            if fit_data is not None:
                mixed.compile(optimizer=keras.optimizers.Adam(1e-3))
                history = _fit(mixed, fit_data)
                assert np.isfinite(history.history["loss"][-1]), policy
        finally:
            keras.config.set_dtype_policy("float32")

    # One fit step in float32 changes the weights and gives a finite loss.
    if fit_data is not None:
        before = [np.array(w) for w in model.get_weights()]
        model.compile(optimizer=keras.optimizers.Adam(1e-3))
        history = _fit(model, fit_data)
        assert np.isfinite(history.history["loss"][-1])
        after = model.get_weights()
        assert any(not np.allclose(a, b) for a, b in zip(before, after))
    return model


def _fit(model, fit_data):
    x, y, *weights = fit_data
    sample_weight = weights[0] if weights else None
    return model.fit(x, y, sample_weight=sample_weight, epochs=1, verbose=0)


def run_in_backend(backend, code, timeout=300):
    """Runs Python `code` in a fresh interpreter with KERAS_BACKEND=backend; returns stdout."""
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise AssertionError(f"Subprocess under {backend} failed:\n{result.stderr[-4000:]}")
    return result.stdout
