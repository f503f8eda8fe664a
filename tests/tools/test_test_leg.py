"""tools/test_leg.sh, the script behind each leg of `make test`: what each of its two pytest
runs is asked for. A stand-in Python records its arguments instead of running pytest."""

import os
import stat
import subprocess

import pytest

from tests.test_case import REPO_ROOT

pytestmark = pytest.mark.backend_independent

LEG = REPO_ROOT / "tools" / "test_leg.sh"


def _calls(tmp_path, *args, codes=(0, 0), leg_args="-n 2"):
    """The argument lists the leg passed to Python, one per run, and the leg's exit code."""
    log = tmp_path / "calls"
    log.unlink(missing_ok=True)
    script = tmp_path / "python"
    script.write_text(
        "#!/usr/bin/env bash\n"
        f'printf "%s\\n" "$@" "--end--" >> {log}\n'
        f"n=$(grep -c -- --end-- {log})\n"
        f"codes=({' '.join(map(str, codes))})\n"
        'exit "${codes[$((n - 1))]}"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    env = dict(os.environ, LEG_ARGS=leg_args)
    result = subprocess.run(
        ["bash", str(LEG), str(script), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    calls = log.read_text().split("--end--\n")[:-1] if log.exists() else []
    return [call.splitlines() for call in calls], result.returncode


@pytest.fixture
def tree(tmp_path):
    """A test tree: two files hold `processes` tests, two do not."""
    root = tmp_path / "tests"
    (root / "apps").mkdir(parents=True)
    (root / "test_a.py").write_text("def test_a():\n    pass\n")
    (root / "test_many.py").write_text(
        "import pytest\npytestmark = pytest.mark.processes\n\ndef test_b():\n    pass\n"
    )
    (root / "apps" / "test_c.py").write_text(
        "import pytest\n\n@pytest.mark.processes\ndef test_c():\n    pass\n"
    )
    (root / "apps" / "helper_processes.py").write_text("# mark.processes, not a test file\n")
    return root


def test_the_processes_run_collects_only_the_files_that_hold_them(tmp_path, tree):
    calls, code = _calls(tmp_path, "not backend_independent", "-x", "tests")
    assert code == 0
    first, second = calls
    assert first == [
        "-m",
        "pytest",
        "-q",
        "-n",
        "2",
        "-x",
        "tests",
        "-m",
        "(not backend_independent) and not processes",
    ]
    # Options kept, the folder replaced by its two files that name the marker, in order.
    assert second == [
        "-m",
        "pytest",
        "-q",
        "-x",
        "tests/apps/test_c.py",
        "tests/test_many.py",
        "-m",
        "(not backend_independent) and processes",
    ]


def test_file_and_test_ids_are_kept_or_dropped_by_their_file(tmp_path, tree):
    calls, _ = _calls(
        tmp_path, "backend_independent", "tests/test_a.py", "tests/test_many.py::test_b"
    )
    assert calls[1][3:] == [
        "tests/test_many.py::test_b",
        "-m",
        "(backend_independent) and processes",
    ]
    # Paths without any `processes` test: the second run is not started at all.
    calls, code = _calls(tmp_path, "backend_independent", "tests/test_a.py")
    assert len(calls) == 1 and code == 0
    # No path among the arguments: pytest's own default paths, not narrowed.
    calls, _ = _calls(tmp_path, "backend_independent", "-x")
    assert calls[1][3:] == ["-x", "-m", "(backend_independent) and processes"]


def test_empty_marks_select_every_test(tmp_path, tree):
    # The leg that also runs the backend-independent tests (the Makefile's ONCE_BACKEND).
    calls, code = _calls(tmp_path, "", "tests")
    assert code == 0
    assert calls[0][-3:] == ["tests", "-m", "not processes"]
    assert calls[1][-2:] == ["-m", "processes"]


@pytest.mark.parametrize(
    "codes, expected", [((0, 5), 0), ((5, 0), 0), ((1, 0), 1), ((0, 2), 1), ((5, 5), 0)]
)
def test_exit_code_fails_when_either_run_fails(tmp_path, tree, codes, expected):
    calls, code = _calls(tmp_path, "m", "tests", codes=codes)
    assert len(calls) == 2 and code == expected
