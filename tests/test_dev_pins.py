"""The `dev` extra (what `make test` installs) pins what the tests need (issue #45 item 8).

The export and serving tests run ONNX graphs: `onnx`, `onnxscript` and `onnxruntime` carry
version ranges in `dev`, and the installed versions lie in them; the SPLADE tests need SciPy
sparse matrices: `dev` includes the `sparse` extra (tests/models/test_sparse_encoder.py imports
SciPy without a skip). The no-TensorFlow environment (`notf-test`, issue #45 item 7) serves an
ONNX export and encodes SPLADE vectors too: it carries the same ranges and SciPy.
"""

import importlib.metadata

import pytest
from packaging.requirements import Requirement  # a dependency of pytest

from tests.test_case import REPO_ROOT

pytestmark = pytest.mark.backend_independent
tomllib = pytest.importorskip("tomllib", reason="Python 3.11+ reads pyproject.toml")


def _extras():
    with open(REPO_ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["optional-dependencies"]


def _requirements(extra, extras):
    """Requirements of `extra`, the `kbert[...]` extras it names followed."""
    found = {}
    for line in extras[extra]:
        requirement = Requirement(line)
        if requirement.name == "kbert":
            for other in requirement.extras:
                found.update(_requirements(other, extras))
        else:
            found[requirement.name] = requirement
    return found


def test_dev_pins_the_onnx_packages_and_includes_sparse():
    dev = _requirements("dev", _extras())
    for name in ("onnx", "onnxscript", "onnxruntime", "scipy"):
        assert name in dev, name
        specifier = dev[name].specifier
        assert any(s.operator in (">=", "==", "~=") for s in specifier), (name, str(specifier))
        if name != "scipy":  # an upper bound: a new release cannot change the graphs' runtime
            assert any(s.operator in ("<", "<=", "==", "~=") for s in specifier), name
        version = importlib.metadata.version(name)
        assert specifier.contains(version, prereleases=True), (name, version, str(specifier))


def test_notf_test_carries_the_dev_onnx_ranges_and_scipy():
    extras = _extras()
    dev, notf = _requirements("dev", extras), _requirements("notf-test", extras)
    assert "tensorflow" not in notf and "tensorflow-text" not in notf
    for name in ("onnx", "onnxscript", "onnxruntime", "scipy"):
        assert name in notf, name
        assert notf[name].specifier == dev[name].specifier, (name, str(notf[name].specifier))
    for name in ("jax", "torch", "transformers"):  # the dev pins, without TensorFlow
        assert notf[name].specifier == dev[name].specifier, name
