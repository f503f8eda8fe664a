"""`call_sublayer`: `layer.call` directly on eager torch where Keras' `__call__` adds nothing,
`__call__` everywhere else, with the same results."""

import keras
import numpy as np
import pytest

from kbert.backend import call_sublayer
from kbert.layers.dense import Dense


def _dense(dtype=None):
    layer = Dense(5, dtype=dtype)
    layer.build((None, 6))
    rng = np.random.default_rng(0)
    for variable in layer.weights:
        variable.assign(rng.normal(0.0, 1.0, variable.shape).astype("float32"))
    return layer


@pytest.mark.backends(
    "torch",
    reason="the direct path exists on torch only; elsewhere call_sublayer is Keras' __call__ "
    "(see test_other_backends_go_through_keras_call)",
)
def test_direct_call_equals_keras_call():
    layer = _dense()
    x = np.random.default_rng(1).normal(size=(3, 6)).astype("float32")
    x = keras.ops.convert_to_tensor(x)
    expected = keras.ops.convert_to_numpy(layer(x))
    assert np.abs(expected).max() > 0.5
    np.testing.assert_allclose(keras.ops.convert_to_numpy(call_sublayer(layer, x)), expected)


@pytest.mark.backends(
    "jax",
    "tensorflow",
    reason="torch: see test_torch_skips_keras_call_only_where_it_changes_nothing",
)
def test_other_backends_go_through_keras_call():
    """On JAX and TensorFlow `call_sublayer` is Keras' `__call__`: under mixed precision it
    casts the float32 input and kernel to bfloat16 (`layer.call` alone would compute in
    float32)."""
    layer = _dense(dtype="mixed_bfloat16")
    x = keras.ops.convert_to_tensor(np.random.default_rng(1).normal(size=(3, 6)), "float32")
    out = call_sublayer(layer, x)
    assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"
    direct = layer.call(x)
    assert keras.backend.standardize_dtype(direct.dtype) == "float32"  # what it would skip
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(keras.ops.cast(out, "float32")),
        keras.ops.convert_to_numpy(direct),
        rtol=2e-2,
        atol=2e-2,
    )


@pytest.mark.backends("torch", reason="the direct path exists on the torch backend only")
def test_torch_skips_keras_call_only_where_it_changes_nothing():
    import torch

    x = torch.tensor(np.random.default_rng(1).normal(size=(3, 6)).astype("float32"))
    hooks = []
    plain = _dense()
    plain.register_forward_hook(lambda *args: hooks.append("plain"))
    call_sublayer(plain, x)
    assert hooks == []  # torch's module call (Keras' __call__ path) did not run
    plain(x)
    assert hooks == ["plain"]

    # Mixed precision: Keras' __call__ casts the float32 kernel to bfloat16; it must run.
    mixed = _dense(dtype="mixed_bfloat16")
    mixed.register_forward_hook(lambda *args: hooks.append("mixed"))
    out = call_sublayer(mixed, x)
    assert hooks[-1] == "mixed" and out.dtype == torch.bfloat16
    # A float input of another dtype is cast by __call__ too.
    hooks.clear()
    call_sublayer(plain, x.double())
    assert hooks == ["plain"]
    # Integer inputs (an embedding lookup) need no cast: direct.
    embedding = keras.layers.Embedding(10, 4)
    embedding.build((None, 3))
    embedding.register_forward_hook(lambda *args: hooks.append("embedding"))
    ids = torch.tensor([[1, 2, 3]], dtype=torch.int32)
    np.testing.assert_allclose(
        call_sublayer(embedding, ids).detach().numpy(), embedding(ids).detach().numpy()
    )
    assert hooks == ["plain", "embedding"]  # only the explicit embedding(ids) call
