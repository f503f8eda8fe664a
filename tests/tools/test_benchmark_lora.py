"""tools/benchmarks/benchmark_lora.py run as a user runs it (`python
tools/benchmarks/benchmark_lora.py`, from another folder): it finds its `bench` package (the
quality recipes, the harness) by itself, spawns one worker per mode and writes its JSON, table
and chart. One tiny LoRA run on a tiny preset and SST-2-shaped data
written here; it picks its own backend (`--backend`), so it runs once, not once per backend."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kbert.models import BertBackbone
from kbert.text import BertTokenizer
from tests.test_case import tiny_backbone_kwargs

pytestmark = pytest.mark.backend_independent

REPO = Path(__file__).resolve().parents[2]
WORDS = "a good great fine bad awful dull film movie plot".split()


@pytest.mark.large  # Two fresh processes importing kbert and TensorFlow.
def test_lora_benchmark_runs_from_another_folder(tmp_path):
    pytest.importorskip("matplotlib")
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
    preset = tmp_path / "preset"
    BertBackbone(
        **tiny_backbone_kwargs(
            vocabulary_size=len(vocabulary), num_layers=1, max_sequence_length=64
        )
    ).save_to_preset(preset)
    BertTokenizer(vocabulary).save_to_preset(preset)
    folder = tmp_path / "data" / "glue" / "SST-2"
    folder.mkdir(parents=True)
    rows = [("a good film", 1), ("a great movie", 1), ("a bad plot", 0), ("an awful film", 0)]
    (folder / "train.tsv").write_text(
        "sentence\tlabel\n" + "".join(f"{s}\t{label}\n" for s, label in rows * 3)
    )
    (folder / "dev.tsv").write_text(
        "sentence\tlabel\n" + "".join(f"{s}\t{label}\n" for s, label in rows)
    )
    output = tmp_path / "out" / "lora.json"
    env = dict(os.environ, PYTHONPATH=str(REPO))  # This checkout's kbert; nothing for tools/.
    result = subprocess.run(
        [sys.executable, str(REPO / "tools" / "benchmarks" / "benchmark_lora.py"),
         "--backend", "jax", "--modes", "lora", "--rank", "2", "--train-examples", "8",
         "--preset", str(preset),
         "--data-dir", str(tmp_path / "data"), "--output", str(output)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    (row,) = json.loads(output.read_text())
    assert (row["mode"], row["backend"], row["rank"]) == ("lora", "jax", 2)
    # LoRA rank 2 on the block's query, key, value and output (32 -> 32 each: 2 * 32 * 2
    # weights) and the fresh head (32 * 2 + 2); the rest frozen.
    assert row["trainable_parameters"] == 4 * (2 * 32 * 2) + (32 * 2 + 2)
    assert row["total_parameters"] == row["trainable_parameters"] + sum(
        int(np.prod(w.shape)) for w in BertBackbone.from_preset(preset).weights
    )
    assert row["dev_accuracy"] * 4 in (0, 1, 2, 3, 4)  # a fraction of the 4 dev rows
    assert "| lora r=2 | jax |" in result.stdout
    assert output.with_suffix(".png").read_bytes().startswith(b"\x89PNG")
