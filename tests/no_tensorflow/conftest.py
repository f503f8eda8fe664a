"""The no-TensorFlow suite.

`make test` runs it (target `test-notf`) in `.venv-notf`, an environment with Keras, JAX,
PyTorch, transformers, SciPy, ONNX (onnx, onnxscript, onnxruntime) and pytest but no
TensorFlow (the `notf-test` extra), under KERAS_BACKEND=jax and torch. Where
TensorFlow is installed these files are not collected: the main suite covers the same code
there, and these tests exist to prove that nothing needs TensorFlow.
"""

import importlib.util

import pytest

if importlib.util.find_spec("tensorflow") is not None:
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(autouse=True)
def _tensorflow_stays_absent():
    import sys

    yield
    assert "tensorflow" not in sys.modules and "tensorflow_text" not in sys.modules
