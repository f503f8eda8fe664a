"""kbert.optimizers.lamb: LAMB updates and gradient accumulation against NumPy references."""

import math

import keras
import numpy as np
import pytest

from kbert.optimizers.lamb import Lamb, lamb_large_batch_settings

B1, B2, EPS, DECAY = 0.9, 0.999, 1e-6, 0.01


def _lamb_reference(weights, gradients_per_update, lr, excluded):
    """Algorithm 2 of You et al. (2019), in NumPy float64: `weights` dict, list of grad dicts."""
    w = {k: v.astype(np.float64).copy() for k, v in weights.items()}
    m = {k: np.zeros_like(v) for k, v in w.items()}
    v = {k: np.zeros_like(x) for k, x in w.items()}
    for t, grads in enumerate(gradients_per_update, start=1):
        for k in w:
            g = grads[k].astype(np.float64)
            m[k] = B1 * m[k] + (1 - B1) * g
            v[k] = B2 * v[k] + (1 - B2) * g * g
            r = (m[k] / (1 - B1**t)) / (np.sqrt(v[k] / (1 - B2**t)) + EPS)
            if k not in excluded:
                r = r + DECAY * w[k]
                w_norm, r_norm = np.linalg.norm(w[k]), np.linalg.norm(r)
                trust = w_norm / r_norm if w_norm > 0 and r_norm > 0 else 1.0
            else:
                trust = 1.0
            w[k] = w[k] - lr * trust * r
    return w


def test_lamb_update_equals_the_paper(tmp_path):
    rng = np.random.default_rng(0)
    initial = {
        "kernel": rng.normal(size=(4, 3)).astype("float32"),
        "zero_kernel": np.zeros((3,), "float32"),  # ||w|| = 0: trust ratio 1.
        "bias": rng.normal(size=(3,)).astype("float32"),  # No decay, no adaptation.
    }
    variables = [keras.Variable(value, name=name) for name, value in initial.items()]
    optimizer = Lamb(learning_rate=0.05, weight_decay=DECAY)
    steps = [
        {k: rng.normal(size=v.shape).astype("float32") for k, v in initial.items()}
        for _ in range(4)
    ]
    for grads in steps:
        optimizer.apply([grads[v.name] for v in variables], variables)
    expected = _lamb_reference(initial, steps, 0.05, excluded={"bias"})
    for variable in variables:
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(variable),
            expected[variable.name],
            rtol=2e-5,
            atol=1e-6,
            err_msg=variable.name,
        )
    # The check can fail: treating the kernel like a bias (no decay, no trust ratio) is far off.
    plain = _lamb_reference(initial, steps, 0.05, excluded={"bias", "kernel"})
    assert np.abs(plain["kernel"] - expected["kernel"]).max() > 1e-2
    # Round trip of the configuration.
    clone = Lamb.from_config(optimizer.get_config())
    assert clone.exclude_from_layer_adaptation == ["bias", "gamma", "beta"]
    assert clone.decay_rate == DECAY


def test_gradient_accumulation_in_fit_equals_the_reference():
    # A linear model with MSE: the gradient of each micro-batch is known in closed form.
    rng = np.random.default_rng(1)
    x = rng.normal(size=(16, 3)).astype("float32")
    y = rng.normal(size=(16, 2)).astype("float32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.layers[0].bias.assign(rng.normal(size=(2,)).astype("float32"))
    initial = {
        "kernel": keras.ops.convert_to_numpy(model.layers[0].kernel),
        "bias": keras.ops.convert_to_numpy(model.layers[0].bias),
    }
    model.compile(optimizer=Lamb(learning_rate=0.1, gradient_accumulation_steps=2), loss="mse")
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)  # 4 micro-batches.

    w = {k: v.astype(np.float64) for k, v in initial.items()}
    updates, accumulated = [], []
    for start in range(0, 16, 4):
        xb, yb = x[start : start + 4].astype(np.float64), y[start : start + 4].astype(np.float64)
        residual = xb @ w["kernel"] + w["bias"] - yb
        accumulated.append(
            {
                "kernel": 2 * xb.T @ residual / residual.size,
                "bias": 2 * residual.sum(axis=0) / residual.size,
            }
        )
        if len(accumulated) == 2:  # One update with the mean gradient of two micro-batches.
            updates.append({k: (accumulated[0][k] + accumulated[1][k]) / 2 for k in w})
            accumulated = []
            w = _lamb_reference(initial, updates, 0.1, excluded={"bias"})
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(model.layers[0].kernel), w["kernel"], rtol=2e-5, atol=1e-5
    )
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(model.layers[0].bias), w["bias"], rtol=2e-5, atol=1e-5
    )
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 2


def test_large_batch_settings_and_bad_arguments():
    settings = lamb_large_batch_settings(32768, total_steps=7038)
    assert settings["learning_rate"] == pytest.approx(1e-4 * math.sqrt(128))
    assert settings["warmup_steps"] == 71
    warmup = settings.pop("warmup_steps")
    assert warmup and Lamb(**settings).global_clipnorm == 1.0
    with pytest.raises(ValueError, match="batch_size"):
        lamb_large_batch_settings(0)
    with pytest.raises(ValueError, match="weight_decay"):
        Lamb(weight_decay=-1)
