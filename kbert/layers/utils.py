"""Small helpers shared by kbert's layers (keras.ops only)."""

import keras
import numpy as np

# Activation names kbert accepts, mapped to callables. The converters translate checkpoint
# spellings (HF `gelu_new`, Google's `gelu`) into these.
_ACTIVATIONS = {
    "gelu": lambda x: keras.activations.gelu(x, approximate=False),
    "gelu_approximate": lambda x: keras.activations.gelu(x, approximate=True),
    "relu": keras.activations.relu,
    "tanh": keras.activations.tanh,
}


def get_activation(activation):
    """Returns the callable for an activation name (or passes a callable through).

    `"gelu"` is the exact erf form, `"gelu_approximate"` the tanh form of the original
    TensorFlow BERT, `"relu"` and `"tanh"` as usual.
    """
    if callable(activation):
        return activation
    if activation not in _ACTIVATIONS:
        raise ValueError(
            "Unknown `activation`. Expected one of "
            f"{sorted(_ACTIVATIONS)} or a callable. Received: activation={activation!r}"
        )
    return _ACTIVATIONS[activation]


def clone_initializer(initializer):
    """A fresh copy of an initializer, so no two weights share one seed generator."""
    if isinstance(initializer, keras.initializers.Initializer):
        return initializer.__class__.from_config(initializer.get_config())
    return initializer


def float32_policy(dtype_policy):
    """The policy for numerically sensitive sublayers (LayerNorm): float32 compute under mixed precision."""
    if keras.dtype_policies.get(dtype_policy).compute_dtype in ("float16", "bfloat16"):
        return keras.dtype_policies.DTypePolicy("float32")
    return dtype_policy


def concrete_value(x):
    """`x` as a NumPy array when it holds concrete values, `None` for symbolic or traced tensors.

    Inside `jax.jit`, a `tf.function` graph or a Keras functional build the values are not
    known yet; range checks are then skipped (out-of-range ids in compiled graphs are
    clipped by the gather on JAX and CPU-TensorFlow, and raise on torch).
    """
    if isinstance(x, keras.KerasTensor):
        return None
    if isinstance(x, np.ndarray):
        return x
    try:
        return keras.ops.convert_to_numpy(x)
    except Exception:  # Traced (jit) or graph tensors have no value yet.
        return None


def check_index_range(ids, upper, ids_name, upper_name):
    """Raises a ValueError when concrete integer ids fall outside `[0, upper)`."""
    values = concrete_value(ids)
    if values is None or values.size == 0:
        return
    low, high = int(values.min()), int(values.max())
    if low < 0 or high >= upper:
        raise ValueError(
            f"`{ids_name}` must lie in [0, {upper_name}) = [0, {upper}). "
            f"Received values in [{low}, {high}]."
        )
