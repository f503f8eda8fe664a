"""The layout of tools/: the benchmark scripts (tools/benchmarks/) share their code through the
`bench` package only, never by importing another script; the user tools (tools/*.py) import
nothing of the benchmarks."""

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.backend_independent

TOOLS = Path(__file__).resolve().parents[2] / "tools"
BENCHMARKS = TOOLS / "benchmarks"


def imported_modules(source):
    """The top-level names of every module `source` imports (at any depth of the code)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_checker_sees_every_import():
    source = (
        "import os\nfrom bench.harness import spawn\n\ndef f():\n    import benchmark_serving\n"
    )
    assert imported_modules(source) == {"os", "bench", "benchmark_serving"}


SCRIPTS = sorted(BENCHMARKS.glob("*.py"))


def test_the_scripts_and_the_package_are_found():
    assert {"benchmark.py", "benchmark_serving.py", "profile_torch_gpu.py"} <= {
        p.name for p in SCRIPTS
    }
    assert (BENCHMARKS / "bench" / "__init__.py").is_file()
    assert (BENCHMARKS / "bench" / "harness.py").is_file()


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_a_benchmark_script_imports_the_bench_package_and_no_other_script(path):
    names = imported_modules(path.read_text(encoding="utf-8"))
    others = {p.stem for p in SCRIPTS} - {path.stem}
    assert not names & others, f"{path.name} imports the script(s) {sorted(names & others)}"
    assert "bench" in names, f"{path.name} does not use the bench package"


@pytest.mark.parametrize("path", sorted(TOOLS.glob("*.py")), ids=lambda p: p.name)
def test_a_user_tool_imports_nothing_of_the_benchmarks(path):
    names = imported_modules(path.read_text(encoding="utf-8"))
    assert not names & ({"bench"} | {p.stem for p in SCRIPTS}), path.name
