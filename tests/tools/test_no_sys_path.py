"""No script in applications/ or tools/ edits `sys.path`: they import the installed kbert, and a
sibling module only the way Python finds it by itself (the script's own folder comes first on
`sys.path` when it runs; `applications.<name>` when the tests import it)."""

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.backend_independent

REPO = Path(__file__).resolve().parents[2]
SCRIPT_FOLDERS = ("applications", "tools")


def sys_path_edits(source, filename="<source>"):
    """`(line, code)` of every place `source` changes the module search path: any use of
    `sys.path` other than reading it (a method call such as `insert`/`append`, an assignment,
    `+=`, `del`, item assignment), `from sys import path`, `site.addsitedir`, or setting
    `PYTHONPATH` in `os.environ` of the running process."""
    tree = ast.parse(source, filename)
    lines = source.splitlines()
    found = []

    def is_sys_path(node):
        return (
            isinstance(node, ast.Attribute)
            and node.attr == "path"
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
        )

    for node in ast.walk(tree):
        edit = False
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if is_sys_path(node.func.value) and node.func.attr not in ("index", "count", "copy"):
                edit = True  # sys.path.insert / append / extend / remove / clear / ...
            if node.func.attr == "addsitedir":
                edit = True
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                inner = target.value if isinstance(target, ast.Subscript) else target
                if is_sys_path(inner):
                    edit = True
                if (
                    isinstance(target, ast.Subscript)
                    and isinstance(target.slice, ast.Constant)
                    and target.slice.value == "PYTHONPATH"
                    and isinstance(target.value, ast.Attribute)
                    and target.value.attr == "environ"
                ):
                    edit = True
        elif isinstance(node, ast.ImportFrom) and node.module == "sys":
            edit = any(alias.name == "path" for alias in node.names)
        if edit:
            found.append((node.lineno, lines[node.lineno - 1].strip()))
    return sorted(found)


def script_files():
    return sorted(p for folder in SCRIPT_FOLDERS for p in (REPO / folder).rglob("*.py"))


def test_the_checker_finds_every_kind_of_edit():
    source = "\n".join(
        [
            "import os, site, sys",
            "sys.path.insert(0, 'x')",
            "sys.path.append('x')",
            "sys.path += ['x']",
            "sys.path = ['x'] + sys.path",
            "sys.path[:0] = ['x']",
            "del sys.path[0]",
            "from sys import path",
            "site.addsitedir('x')",
            "os.environ['PYTHONPATH'] = 'x'",
            "print(sys.path, sys.path.index('x'))",  # Reading it is fine.
            "env = dict(os.environ, PYTHONPATH='x')",  # A child's environment is fine.
        ]
    )
    assert [line for line, _ in sys_path_edits(source)] == list(range(2, 11))


def test_the_scripts_are_found():
    names = {p.relative_to(REPO).as_posix() for p in script_files()}
    assert {
        "applications/glue.py",
        "applications/common.py",
        "tools/benchmarks/benchmark.py",
        "tools/benchmarks/benchmark_lora.py",
        "tools/benchmarks/bench/harness.py",
        "tools/convert_checkpoint.py",
    } <= names


@pytest.mark.parametrize("path", script_files(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_no_script_edits_sys_path(path):
    edits = sys_path_edits(path.read_text(encoding="utf-8"), str(path))
    assert not edits, (
        f"{path.relative_to(REPO)} edits the module search path at "
        + ", ".join(f"line {line}: {code}" for line, code in edits)
        + ". Import the installed kbert, and a sibling module as applications/glue.py "
        "imports applications/common.py."
    )
