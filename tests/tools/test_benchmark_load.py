"""tools/benchmarks/benchmark_load.py run as a user runs it, from another folder: it writes a
Hugging Face directory of a tiny shape, loads it in one worker per way (kbert's `from_preset`,
kbert's draw-then-load, `transformers`' `from_pretrained`) and writes its table, JSON and chart.
Its workers pick their backends (`--backends`), so it runs once, not once per backend."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.backend_independent

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tools" / "benchmarks" / "benchmark_load.py"


def _run(tmp_path, *arguments):
    env = dict(os.environ, PYTHONPATH=str(REPO))  # This checkout's kbert; nothing for tools/.
    return subprocess.run(
        [sys.executable, str(SCRIPT), *arguments],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600,
    )  # fmt: skip


@pytest.mark.large  # Three fresh processes importing torch (two of them kbert and Keras).
def test_load_benchmark_times_every_way_against_transformers(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("matplotlib")
    output, chart = tmp_path / "out" / "load.json", tmp_path / "load.png"
    result = _run(
        tmp_path, "--shape", "L2-H32-A2-V64", "--backends", "torch", "--repeats", "1",
        "--json", str(output), "--chart", str(chart),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    payload = json.loads(output.read_text())
    assert payload["settings"]["num_layers"] == 2 and payload["settings"]["hidden_dim"] == 32
    rows = {row["system"]: row for row in payload["results"]}
    assert list(rows) == ["kbert-torch", "kbert-torch-draw-then-load", "hf"]
    assert all(0 < row["seconds"] < 60 and row["first_seconds"] > 0 for row in rows.values())
    assert "kbert-torch-draw-then-load" in result.stdout and "vs HF" in result.stdout
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_load_benchmark_refuses_an_unknown_backend_before_any_work(tmp_path):
    result = _run(tmp_path, "--backends", "torch,mxnet", "--json", str(tmp_path / "r.json"))
    assert result.returncode != 0 and "--backends takes jax,tensorflow,torch" in result.stderr
    assert "['mxnet']" in result.stderr and not (tmp_path / "r.json").exists()
