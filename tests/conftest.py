"""Shared pytest set-up: quiet TensorFlow, deterministic seeds, backend markers.

`@pytest.mark.backends("torch", reason=...)` (one or more of "tensorflow", "jax", "torch")
runs a test only under those KERAS_BACKEND values: on the other legs it is deselected (not
collected), instead of each test file gating on `keras.backend.backend()` by hand. What a test
expects differently per backend it states for every backend with `tests.per_backend`.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gc
import importlib.util
import re

import keras
import pytest

from tests.per_backend import per_backend

HAS_TENSORFLOW = importlib.util.find_spec("tensorflow") is not None
# Test files that import TensorFlow at module level (collected only where it is installed).
_TENSORFLOW_IMPORT = re.compile(r"^(import|from) tensorflow(_text)?\b", re.MULTILINE)
_not_collected = []


def _one_torch_thread():
    import torch

    # Tiny test models gain nothing from intra-op threads, and spinning OpenMP workers on a
    # shared 2-core machine make each small matmul orders of magnitude slower.
    torch.set_num_threads(1)


def _nothing_to_set():
    pass


per_backend(torch=_one_torch_thread, jax=_nothing_to_set, tensorflow=_nothing_to_set)()


BACKENDS = ("tensorflow", "jax", "torch")


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "backends(*names, reason=None): runs only under these KERAS_BACKEND values "
        "(tensorflow, jax, torch); deselected under the others",
    )


def pytest_collection_modifyitems(config, items):
    """Deselects tests whose `backends` marker leaves out the current backend, and runs the
    files that hold slow (`large`) tests first.

    With `-n 2` (`make test`) each worker starts on half of the tests in this order, and a
    worker that runs out takes pending tests from the other; a test of a minute collected
    last could still be running while the other worker has nothing left. Each file's tests
    stay together and in their order, so a module's fixtures are set up once.
    """
    backend = keras.backend.backend()
    kept, deselected = [], []
    for item in items:
        names = [name for marker in item.iter_markers("backends") for name in marker.args]
        unknown = sorted(set(names) - set(BACKENDS))
        if unknown or (item.get_closest_marker("backends") and not names):
            raise pytest.UsageError(
                f"{item.nodeid}: @pytest.mark.backends takes names among {BACKENDS}. "
                f"Received: {names}"
            )
        # Markers of the test, its class and its module must all allow the backend.
        allowed = all(backend in marker.args for marker in item.iter_markers("backends"))
        (kept if allowed else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
    slow_files = {item.path for item in kept if item.get_closest_marker("large")}
    items[:] = sorted(kept, key=lambda item: item.path not in slow_files)  # a stable sort


def pytest_report_header(config):
    return f"keras backend: {keras.backend.backend()}, keras {keras.__version__}"


@pytest.fixture(autouse=True)
def _seed_and_reset():
    keras.utils.set_random_seed(1337)
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")


# Data tests skip with reasons written in many files ("shared data folder not present", ...):
# say, in every such reason, which variable enables them.
_DATA_SKIP_WORDS = ("shared data", "datasets not available", "data folder")
_DATA_SKIP_HINT = (
    " - set KBERT_DATA_DIR to a folder holding glue/, conll2003/, squad/ (see README, "
    "'The two commands') to run it"
)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
        path, line, reason = report.longrepr
        if any(word in reason for word in _DATA_SKIP_WORDS) and "KBERT_DATA_DIR=" not in reason:
            report.longrepr = (path, line, reason + _DATA_SKIP_HINT)


def pytest_ignore_collect(collection_path, config):
    """Without TensorFlow, test files that import it are not collected (listed at the end)."""
    if (
        HAS_TENSORFLOW
        or collection_path.suffix != ".py"
        or not collection_path.name.startswith("test_")
    ):
        return None
    if _TENSORFLOW_IMPORT.search(collection_path.read_text(encoding="utf-8")):
        asked = [os.path.abspath(arg.split("::")[0]) for arg in config.args]
        path = os.path.abspath(collection_path)
        if any(path == a or path.startswith(a + os.sep) for a in asked):
            _not_collected.append(os.path.relpath(path))
        return True
    return None


def pytest_terminal_summary(terminalreporter):
    if _not_collected:
        terminalreporter.write_line(
            f"TensorFlow is not installed: {len(_not_collected)} test files that need it were not "
            f'collected (pip install "kbert[tensorflow]" to run them): '
            + ", ".join(sorted(_not_collected))
        )


@pytest.fixture(autouse=True, scope="module")
def _freeze_surviving_objects():
    """Keeps Python's cyclic garbage collector off the objects that outlive each test module.

    Keras runs a full `gc.collect()` for every variable a layer deletes (`model.quantize`
    deletes each kernel), and a full collection walks every object of the process: ~0.4 s
    after TensorFlow, JAX, torch and transformers are imported, so a tiny model's quantize
    took seconds. Frozen objects (the imported libraries, caches, earlier modules' survivors)
    are not walked again; the objects each module creates still are, so every test keeps the
    collector's behaviour towards its own objects. The cost: cycles among frozen objects that
    die later are not reclaimed in this test process.
    """
    gc.collect()
    gc.freeze()
    yield
