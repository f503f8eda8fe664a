"""Every `>>>` example in kbert's docstrings runs and prints what it shows.

The modules are found by walking the `kbert` package on disk, so a module that moves or is
added is tested without a change here. Each module that holds an example is one test case
(named by the module); its examples run with the standard library's `doctest`, ELLIPSIS and
NORMALIZE_WHITESPACE on, in a fresh copy of the module's globals. Every example of the source
file (as doctest's parser reads the whole file) must be one that doctest collects: one in a
string it does not collect, e.g. a nested function's docstring, would never run. Besides the
module's own names, the examples see `kbert`, `keras` and `np` (NumPy), as a reader's session
would have them imported; they run in a fresh temporary directory, so files they write go
there. A module that needs an optional package that is not installed to import is skipped, and
so is a docstring whose examples need one (TensorFlow: `MissingTensorFlowError`; any other:
`ModuleNotFoundError`), after the module's other docstrings passed.
"""

import doctest
import importlib
import importlib.util
from pathlib import Path

import keras
import numpy as np
import pytest

import kbert

pytestmark = pytest.mark.backend_independent

PACKAGE = Path(importlib.util.find_spec("kbert").origin).parent
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
EXTRA_GLOBALS = {"kbert": kbert, "keras": keras, "np": np}


def module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_examples(path):
    """How many examples (`>>>` lines other than comments) the file's source holds anywhere."""
    return len(doctest.DocTestParser().get_examples(path.read_text(encoding="utf-8")))


MODULES = sorted(
    (module_name(path), path) for path in PACKAGE.rglob("*.py") if source_examples(path) > 0
)


def needs_missing_package(error):
    """Whether an example failed only because an optional package is not installed."""
    if type(error).__name__ == "MissingTensorFlowError":
        return True
    return isinstance(error, ModuleNotFoundError) and not (error.name or "kbert").startswith(
        "kbert"
    )


class _Runner(doctest.DocTestRunner):
    """Keeps the exceptions examples raise unexpectedly, to tell a missing package apart."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.exceptions = []

    def report_unexpected_exception(self, out, test, example, exc_info):
        self.exceptions.append(exc_info[1])
        super().report_unexpected_exception(out, test, example, exc_info)


def test_the_walk_finds_the_modules_with_examples():
    names = [name for name, _ in MODULES]
    assert "kbert.models.backbone" in names
    assert "kbert.text.tokenizer" in names
    assert sum(source_examples(path) for _, path in MODULES) >= 100


@pytest.mark.parametrize("name, path", MODULES, ids=[name for name, _ in MODULES])
def test_docstring_examples_run(name, path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    try:
        module = importlib.import_module(name)
    except ImportError as error:  # e.g. kbert.data.documents imports TensorFlow
        if needs_missing_package(error):
            pytest.skip(f"{name} needs a package that is not installed: {error}")
        raise
    finder = doctest.DocTestFinder(exclude_empty=True)
    tests = finder.find(module, name, extraglobs=EXTRA_GLOBALS)
    found = sum(len(test.examples) for test in tests if test.filename == module.__file__)
    assert found == source_examples(path), (
        f"{name}: doctest collects {found} examples but the source has {source_examples(path)} "
        "examples; an example outside a docstring doctest finds never runs"
    )
    runner = _Runner(optionflags=FLAGS)
    failures, missing = [], []
    for test in tests:
        report, raised = [], len(runner.exceptions)
        failed, _ = runner.run(test, out=report.append)
        if not failed:
            continue
        needs = [e for e in runner.exceptions[raised:] if needs_missing_package(e)]
        if needs:  # the later failures of that docstring follow from the first
            missing.append(f"{test.name} ({type(needs[0]).__name__}: {needs[0]})")
        else:
            failures.append("".join(report))
    assert not failures, f"{len(failures)} docstrings of {name} failed:\n" + "".join(failures)
    if missing:
        pytest.skip("examples need a package that is not installed: " + "; ".join(missing))
    assert runner.summarize(verbose=False).attempted == found
