"""Small helpers shared by kbert's layers (keras.ops only)."""

import contextvars

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
    """The policy for numerically sensitive sublayers (LayerNorm): float32 compute under mixed
    precision."""
    if keras.dtype_policies.get(dtype_policy).compute_dtype in ("float16", "bfloat16"):
        return keras.dtype_policies.DTypePolicy("float32")
    return dtype_policy


def host_values(x):
    """`x` as a NumPy array when it already lives in host memory (NumPy, lists, scalars), else
    `None`.

    Backend tensors (also eager ones on CPU) are never converted: reading a device tensor's
    values is a device-to-host transfer that stalls an accelerator, so inside training and
    inference steps, and for traced or symbolic tensors, value checks are left to the model's
    input boundary (see `kbert.models.input_checks`).
    """
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, (list, tuple, int, np.integer)):
        try:
            return np.asarray(x)
        except ValueError:  # Ragged nested lists.
            return None
    return None


def check_integer_dtype(ids, ids_name):
    """Raises a ValueError when `ids` (array, tensor, traced or symbolic) has a non-integer dtype.

    A static check: it reads the dtype only, so it costs nothing inside compiled steps. Float
    ids would otherwise be truncated silently by the cast to int32.
    """
    dtype = getattr(ids, "dtype", None)
    if dtype is None:
        return
    name = keras.backend.standardize_dtype(dtype)
    if not (name.startswith("int") or name.startswith("uint")):
        raise ValueError(
            f"`{ids_name}` must be integer ids. Received an array of dtype {name}" + _example(ids)
        )


def _example(ids):
    values = host_values(ids)
    if values is None or values.size == 0:
        return "."
    return f" (first values {values.ravel()[:4].tolist()})."


def check_index_range(ids, upper, ids_name, upper_name):
    """Raises a ValueError when host-resident integer ids fall outside `[0, upper)`.

    Only NumPy arrays and Python lists are read (see `host_values`); the dtype check applies
    to every input.
    """
    check_integer_dtype(ids, ids_name)
    values = host_values(ids)
    if values is None or values.size == 0:
        return
    low, high = int(values.min()), int(values.max())
    if low < 0 or high >= upper:
        raise ValueError(index_range_message(ids_name, upper_name, upper, low, high))


def index_range_message(ids_name, upper_name, upper, low, high):
    return (
        f"`{ids_name}` must lie in [0, {upper_name}) = [0, {upper}). "
        f"Received values in [{low}, {high}]."
    )


class KerasQuantization:
    """Mixin for kbert's subclasses of Keras' `Dense` and `Embedding`: `quantize` as the base.

    Keras' `Dense.quantize` and `Embedding.quantize` refuse subclasses (a type check: a
    subclass may compute something else from the weights), so `model.quantize("int8")` would
    skip every such layer with a warning. kbert's subclasses compute their base's function
    (faster, or with another gradient form), so they take every mode their base takes, with
    the base's weights, variables and quantized call. Put it first among the bases.
    """

    def quantize(self, mode=None, type_check=True, config=None):
        del type_check  # The base's check is for subclasses that compute differently.
        return super().quantize(mode, type_check=False, config=config)


# The checkpoint load in progress in this context, if any (`weights_from_checkpoint`).
_CHECKPOINT_LOAD = contextvars.ContextVar("kbert_checkpoint_load", default=None)

# The initializer attribute of each weight of the layers that defer, by the weight's name.
_INITIALIZER_OF = {
    "kernel": "kernel_initializer",
    "bias": "bias_initializer",
    "embeddings": "embeddings_initializer",
}


def _zeros(shape, dtype=None):
    """Zeros, without a random draw: the backend's own (a NumPy array would be copied once
    more on its way in), from NumPy on JAX (no program compiled per shape)."""
    if keras.backend.backend() == "jax":
        try:
            return np.zeros(shape, dtype=keras.backend.standardize_dtype(dtype))
        except TypeError:  # A dtype NumPy does not know.
            pass
    return keras.ops.zeros(shape, dtype=dtype)


def weights_from_checkpoint(active=True):
    """A block that builds layers whose weights a checkpoint is about to overwrite, without
    drawing them.

    Inside `with weights_from_checkpoint() as load:`, kbert's `Dense` and embedding layers
    built in this context give their weights zeros instead of values drawn from their
    initializers (a BERT-Base backbone would draw 110M random values that the checkpoint then
    replaces). Each such weight and its initializer are recorded; once the
    checkpoint is loaded, `load.initialize(paths)` draws, from its own initializer, every
    recorded weight whose path is in `paths` (those the checkpoint did not hold, such as a
    pooler left fresh). Layers built outside the block, or after it, draw as usual.

    Args:
        active: bool. `False` makes the block do nothing (a model built without weights to
            load). Defaults to `True`.

    Returns:
        A `CheckpointLoad`, the context manager.
    """
    return CheckpointLoad(active)


class CheckpointLoad:
    """The block of `weights_from_checkpoint`: the weights built in it without a draw."""

    def __init__(self, active=True):
        self.active = active
        self.deferred = []  # (variable, initializer)
        self._token = None

    def __enter__(self):
        if self.active:
            self._token = _CHECKPOINT_LOAD.set(self)
        return self

    def __exit__(self, *exc_info):
        if self._token is not None:
            _CHECKPOINT_LOAD.reset(self._token)
            self._token = None

    def initialize(self, paths):
        """Draws the recorded weights whose variable path is in `paths` from their
        initializers."""
        paths = set(paths)
        for variable, initializer in self.deferred:
            if variable.path in paths:
                variable.assign(initializer(tuple(variable.shape), dtype=variable.dtype))


class BuiltFromCheckpoint:
    """Mixin for kbert's subclasses of Keras' `Dense` and `Embedding`: inside
    `weights_from_checkpoint`, `build` gives the weights zeros and records their initializers
    there. Put it first among the bases."""

    def build(self, *args, **kwargs):
        load = _CHECKPOINT_LOAD.get()
        if load is None:
            return super().build(*args, **kwargs)
        initializers = {
            attribute: getattr(self, attribute)
            for attribute in _INITIALIZER_OF.values()
            if getattr(self, attribute, None) is not None
        }
        for attribute in initializers:
            setattr(self, attribute, _zeros)
        try:
            super().build(*args, **kwargs)
        finally:
            for attribute, initializer in initializers.items():
                setattr(self, attribute, initializer)
        for weight in self.weights:
            attribute = _INITIALIZER_OF.get(weight.name)
            if attribute in initializers:
                load.deferred.append((weight, initializers[attribute]))
        return None
