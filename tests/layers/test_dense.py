"""kbert's `Dense` (one fused matmul + bias kernel on torch) equals `keras.layers.Dense`."""

import keras
import numpy as np
import pytest

from kbert.layers.dense import Dense


def _pair(units, activation=None, dtype=None, use_bias=True):
    ours = Dense(units, activation=activation, dtype=dtype, use_bias=use_bias)
    reference = keras.layers.Dense(units, activation=activation, dtype=dtype, use_bias=use_bias)
    ours.build((None, None, 6))
    reference.build((None, None, 6))
    rng = np.random.default_rng(0)
    for variable in ours.weights:
        variable.assign(rng.normal(0.0, 1.0, variable.shape).astype("float32"))
    reference.set_weights(ours.get_weights())
    return ours, reference


@pytest.mark.parametrize("activation, use_bias", [(None, True), ("tanh", True), (None, False)])
def test_outputs_equal_keras_dense(activation, use_bias):
    ours, reference = _pair(5, activation, use_bias=use_bias)
    x = np.random.default_rng(1).normal(size=(3, 4, 6)).astype("float32")
    expected = keras.ops.convert_to_numpy(reference(x))
    assert np.abs(expected).max() > 0.5  # Not a comparison of near-zeros.
    np.testing.assert_allclose(keras.ops.convert_to_numpy(ours(x)), expected, atol=1e-5)
    assert [w.path.split("/")[-1] for w in ours.weights] == [
        w.path.split("/")[-1] for w in reference.weights
    ]


@pytest.mark.backends(
    "torch",
    reason="the fused matmul + bias kernel is torch's (elsewhere the layer is Keras' own "
    "computation); its gradients come from torch's autograd",
)
@pytest.mark.parametrize("activation, use_bias", [(None, True), ("tanh", True), (None, False)])
def test_gradients_equal_keras_dense_on_torch(activation, use_bias):
    """The gradients of the fused kernel, for the input and every weight, equal those of
    `keras.layers.Dense`."""
    import torch

    ours, reference = _pair(5, activation, use_bias=use_bias)
    x = np.random.default_rng(1).normal(size=(3, 4, 6)).astype("float32")
    inputs = torch.tensor(x, requires_grad=True)
    ours(inputs).square().sum().backward()
    ours_grads = [inputs.grad.numpy()] + [w.value.grad.numpy() for w in ours.weights]
    inputs = torch.tensor(x, requires_grad=True)
    reference(inputs).square().sum().backward()
    reference_grads = [inputs.grad.numpy()] + [w.value.grad.numpy() for w in reference.weights]
    for got, want in zip(ours_grads, reference_grads, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_lora_and_mixed_precision_follow_keras_dense():
    ours, reference = _pair(5)
    for layer in (ours, reference):
        layer.enable_lora(2)
    rng = np.random.default_rng(2)
    b = rng.normal(0.0, 1.0, ours.lora_kernel_b.shape).astype("float32")
    ours.lora_kernel_b.assign(b)
    reference.lora_kernel_b.assign(b)
    reference.lora_kernel_a.assign(keras.ops.convert_to_numpy(ours.lora_kernel_a))
    x = rng.normal(size=(2, 3, 6)).astype("float32")
    without_lora = keras.ops.convert_to_numpy(ours(x)) - keras.ops.convert_to_numpy(ours.bias)
    assert np.abs(without_lora - x @ keras.ops.convert_to_numpy(ours._kernel)).max() > 1e-2
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(ours(x)), keras.ops.convert_to_numpy(reference(x)), atol=1e-5
    )
    mixed, mixed_reference = _pair(5, dtype="mixed_bfloat16")
    got = mixed(x)
    assert keras.backend.standardize_dtype(got.dtype) == "bfloat16"
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(keras.ops.cast(got, "float32")),
        keras.ops.convert_to_numpy(keras.ops.cast(mixed_reference(x), "float32")),
        atol=0.1,
        rtol=0.02,
    )
