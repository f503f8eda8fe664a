"""tools/benchmark_streaming.py: measures a real pipeline and judges the issue's goals correctly."""

import importlib
import json
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools"

pytestmark = pytest.mark.backend_independent

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "."] + [
    c + v for c in "bdfgklmnprst" for v in "aeiou"
]


@pytest.fixture
def tool(monkeypatch):
    monkeypatch.syspath_prepend(str(TOOLS))
    return importlib.import_module("benchmark_streaming")


def test_goal_lines_pass_and_fail_at_the_bounds(tool):
    result = {"first_batch_s": 10.0, "steady_sequences_per_s": 20000, "peak_rss_gb": 1.5}
    assert tool.goal_lines(result) == [
        "goal first batch <= 10 s: PASS (10.0)",
        "goal steady >= 20,000 seq/s: PASS (20,000)",
        "goal peak RSS <= 1.5 GB: PASS (1.5)",
    ]
    result = {"first_batch_s": 10.01, "steady_sequences_per_s": 19999, "peak_rss_gb": 1.501}
    assert [line.split(":")[1].split()[0] for line in tool.goal_lines(result)] == ["FAIL"] * 3


def test_benchmark_runs_on_text_and_prints_the_goals(tool, tmp_path, capsys):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    words = VOCAB[6:]
    lines = []
    for document in range(30):
        for sentence in range(6):
            lines.append(
                " ".join(words[(document * 7 + sentence * 3 + k) % len(words)] for k in range(9))
                + " ."
            )
        lines.append("")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(lines), encoding="utf-8")
    result = tool.main(
        [
            str(corpus),
            "--vocab",
            str(vocab),
            "--seconds",
            "0.5",
            "--batch-size",
            "8",
            "--sequence-length",
            "32",
            "--max-predictions",
            "4",
        ]
    )
    out = capsys.readouterr().out.splitlines()
    assert json.loads(out[-1]) == result
    assert result["kind"] == "text" and result["files"] == 1
    assert result["corpus_mb"] == round(corpus.stat().st_size / 1e6, 1)
    assert result["first_batch_s"] > 0 and result["steady_sequences_per_s"] > 0
    assert 0.05 < result["peak_rss_gb"] < 64
    goals = [line for line in out if line.startswith("goal ")]
    assert goals == tool.goal_lines(result)
    with pytest.raises(SystemExit):
        tool.main([str(tmp_path / "*.nothing"), "--vocab", str(vocab)])
