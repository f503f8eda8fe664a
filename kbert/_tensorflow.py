"""TensorFlow as an optional dependency: the one place kbert imports it from.

TensorFlow (with tensorflow-text) is needed only for the `tf.data` pipelines, the tokenizer
inside a `tf.data` / `tf.function` graph and Google TF1 checkpoints. Everything else in kbert
runs with Keras on JAX or PyTorch alone. Code that needs TensorFlow calls `tensorflow(what)` /
`tensorflow_text(what)` at the point of use; without it installed the user gets one clear
error that names the extra to install.
"""

import importlib
import sys

INSTALL_HINT = 'pip install "kbert[tensorflow]"'

_modules = {}


class MissingTensorFlowError(ImportError):
    """Raised when a kbert feature that needs TensorFlow is used without it installed."""


def _import(name, package, what):
    if name not in _modules:
        try:
            _modules[name] = importlib.import_module(name)
        except Exception as error:  # ImportError, or a broken install raising anything else.
            _modules[name] = error
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
    """`isinstance(value, tf.data.Dataset)`, False when TensorFlow was never imported."""
    tf = sys.modules.get("tensorflow")
    data = getattr(tf, "data", None)
    return data is not None and isinstance(value, data.Dataset)


def do_not_convert(function):
    """`tf.autograph.experimental.do_not_convert` when TensorFlow is installed, else `function`.

    kbert's text classes branch on Python types; AutoGraph must call them as they are when
    they are mapped over a `tf.data.Dataset`.
    """
    try:
        tf = tensorflow()
    except MissingTensorFlowError:
        return function
    return tf.autograph.experimental.do_not_convert(function)
