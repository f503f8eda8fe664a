"""Quiet start-up for the tools: the known TensorFlow/XLA notices on a CPU machine are dropped.

`kbert/startup.py` holds back what native code writes to stderr while Keras, the backend and
kbert start, and writes back every line that is not a known notice (oneDNN, cudart, cuInit
CUDA error 303), so real errors still show. It is loaded from the installed package's folder
by path: importing it as `kbert.startup` would run `kbert/__init__.py`, and with it TensorFlow,
before anything could be held back.
"""

import importlib.util
from pathlib import Path


def quiet_startup():
    """Imports Keras and kbert and wakes the backend with the known start-up notices hidden."""
    package = importlib.util.find_spec("kbert")  # Locates the package without running it.
    path = Path(next(iter(package.submodule_search_locations))) / "startup.py"
    spec = importlib.util.spec_from_file_location("_kbert_startup", path)
    startup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(startup)
    with startup.quiet_native_startup():
        import keras

        import kbert  # noqa: F401

        keras.ops.convert_to_numpy(keras.ops.zeros(()))  # Device discovery prints here.
