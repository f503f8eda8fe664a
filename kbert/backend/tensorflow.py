"""TensorFlow as an optional dependency: the one place kbert imports it from.

TensorFlow (with tensorflow-text) is needed only for the `tf.data` pipelines, the tokenizer
inside a `tf.data` / `tf.function` graph and Google TF1 checkpoints. Everything else in kbert
runs with Keras on JAX or PyTorch alone. Code that needs TensorFlow calls `tensorflow(what)` /
`tensorflow_text(what)` at the point of use; without it installed the user gets one clear
error that names the extra to install. Nothing here imports TensorFlow before a feature that
needs it is used: `import kbert` and the models never do.

When TensorFlow only feeds data (the Keras backend is JAX or PyTorch), kbert hides the
accelerators from it as it imports it (`tf.config.set_visible_devices([], "GPU")`), so that it
does not claim the GPU memory the backend computes on. A process that imported and initialised
TensorFlow itself before keeps the devices it chose.
"""

import importlib
import os
import sys

INSTALL_HINT = 'pip install "kbert[tensorflow]"'

_modules = {}


class MissingTensorFlowError(ImportError):
    """Raised when a kbert feature that needs TensorFlow is used without it installed."""


def _keras_backend():
    """The Keras backend, without importing Keras when it is not imported yet."""
    keras = sys.modules.get("keras")
    if keras is not None and hasattr(keras, "backend"):
        return keras.backend.backend()
    return os.environ.get("KERAS_BACKEND", "tensorflow")


def _hide_accelerators(tf):
    """Hides the GPUs from TensorFlow when it only feeds data to another backend."""
    if _keras_backend() == "tensorflow":
        return
    try:
        tf.config.set_visible_devices([], "GPU")
    except RuntimeError:  # TensorFlow's devices were initialised before: left as they are.
        pass


def _import(name, package, what):
    if name not in _modules:
        try:
            _modules[name] = importlib.import_module(name)
        except Exception as error:  # ImportError, or a broken install raising anything else.
            _modules[name] = error
        else:
            if name == "tensorflow":
                _hide_accelerators(_modules[name])
    module = _modules[name]
    if isinstance(module, Exception):
        raise MissingTensorFlowError(
            f"{what} needs {package}, which could not be imported "
            f"({type(module).__name__}: {module}). TensorFlow is needed only for tf.data "
            f"pipelines, the tokenizer inside a tf.data graph and Google TF checkpoints; "
            f"install it with: {INSTALL_HINT}"
        ) from module
    return module


def tensorflow(what="This kbert feature"):
    """The `tensorflow` module, or a `MissingTensorFlowError` saying `what` needs it."""
    return _import("tensorflow", "TensorFlow", what)


def tensorflow_text(what="This kbert feature"):
    """The `tensorflow_text` module, or a `MissingTensorFlowError` saying `what` needs it."""
    tensorflow(what)
    return _import("tensorflow_text", "tensorflow-text", what)


def available():
    """Whether TensorFlow can be imported (imports it when it can)."""
    try:
        tensorflow()
    except MissingTensorFlowError:
        return False
    return True


def is_tensor(value):
    """`tf.is_tensor(value)`, False without importing TensorFlow when it was never imported
    (a TensorFlow tensor cannot exist before TensorFlow is imported)."""
    tf = sys.modules.get("tensorflow")
    return tf is not None and hasattr(tf, "is_tensor") and bool(tf.is_tensor(value))


def is_dataset(value):
    """Whether `value` is a `tf.data.Dataset`: kbert's one dataset predicate.

    `isinstance(value, tf.data.Dataset)` without importing TensorFlow: False when TensorFlow
    was never imported (a dataset cannot exist before it is).
    """
    tf = sys.modules.get("tensorflow")
    data = getattr(tf, "data", None)
    dataset = getattr(data, "Dataset", None)
    return isinstance(dataset, type) and isinstance(value, dataset)


def do_not_convert(function):
    """`function` for AutoGraph to call as it is, without importing TensorFlow to say so.

    kbert's text classes branch on Python types; AutoGraph must call them as they are when
    they are mapped over a `tf.data.Dataset`. The returned function calls
    `tf.autograph.experimental.do_not_convert(function)` when TensorFlow is imported (the only
    case where AutoGraph can be converting its caller), and `function` itself otherwise.
    """
    unconverted = []

    def call(*args, **kwargs):
        tf = sys.modules.get("tensorflow")
        if tf is None or not hasattr(tf, "autograph"):
            return function(*args, **kwargs)
        if not unconverted:
            unconverted.append(tf.autograph.experimental.do_not_convert(function))
        return unconverted[0](*args, **kwargs)

    # Not functools.wraps: AutoGraph would follow `__wrapped__` to the original's source.
    for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(call, attribute, getattr(function, attribute, None))
    return call
