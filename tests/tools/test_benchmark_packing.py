"""tools/benchmarks/benchmark_packing.py on a tiny preset and corpus: `inference` times the three
ways of batching and its packed outputs equal the bucketed ones; `training` measures the padding
of packed and unpacked rows and times their steps. Runs on the session's backend (the tool
computes in its own process)."""

import importlib
import random
from pathlib import Path

import pytest

from kbert.models import BertBackbone
from kbert.text import BertTokenizer
from tests.test_case import tiny_backbone_kwargs

BENCHMARKS = Path(__file__).resolve().parents[2] / "tools" / "benchmarks"
WORDS = "a good great fine bad awful dull film movie plot the was".split()


@pytest.fixture
def packing(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("benchmark_packing")


def _vocabulary():
    return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "."] + WORDS


# The benchmark's inference ways and their agreement; packed inference on each backend is
# tested in tests/models/test_packing.py: once.
@pytest.mark.backend_independent
def test_packed_inference_agrees_with_buckets_and_times_every_way(packing, tmp_path):
    vocabulary = _vocabulary()
    preset = tmp_path / "preset"
    BertBackbone(
        **tiny_backbone_kwargs(vocabulary_size=len(vocabulary), max_sequence_length=32)
    ).save_to_preset(preset)
    BertTokenizer(vocabulary).save_to_preset(preset)
    rng = random.Random(0)
    rows = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9))) for _ in range(14)]
    tsv = tmp_path / "dev.tsv"
    tsv.write_text("sentence\tlabel\n" + "".join(f"{r}\t1\n" for r in rows))
    result = packing.main(
        ["inference", "--preset", str(preset), "--tsv", str(tsv), "--sequence-length", "32",
         "--batch-size", "4", "--limit", "12", "--repeats", "2"]
    )  # fmt: skip
    assert set(result["texts_per_second"]) == {"fixed", "bucketed", "packed"}
    assert all(rate > 0 for rate in result["texts_per_second"].values())
    assert result["output_scale"] > 0.1
    assert result["max_abs_difference"] < 1e-4 * max(1.0, result["output_scale"])


# The benchmark's own bookkeeping (padding fractions, rounds); packed training on each backend
# is tested in tests/models/test_packing.py: once.
@pytest.mark.backend_independent
@pytest.mark.large
def test_packed_training_pads_less_than_unpacked_rows(packing, tmp_path):
    rng = random.Random(0)
    documents = [
        "\n".join(
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 10))) + " ."
            for _ in range(rng.randint(2, 5))
        )
        for _ in range(40)
    ]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(_vocabulary()) + "\n", encoding="utf-8")
    result = packing.main(
        ["training", str(corpus), "--vocab", str(vocab), "--sequence-length", "64",
         "--max-predictions", "8", "--batch-size", "4", "--batches", "3", "--steps", "1",
         "--rounds", "2"]
    )  # fmt: skip
    padding = result["padding_fraction"]
    assert 0 <= padding["packed"] < padding["pieces"] < 1
    assert padding["packed"] < padding["standard"] < 1
    assert all(rate > 0 for rate in result["real_tokens_per_s"].values())
    assert result["ratio_packed_to_pieces"] > 0 and result["sequence_length"] == 64
    # A machine without TensorFlow (the GPU one) trains on batches saved here: the same
    # batches, padding and settings come back, and it trains on them.
    saved = tmp_path / "batches.npz"
    common = ["training", str(corpus), "--vocab", str(vocab), "--sequence-length", "64",
              "--max-predictions", "8", "--batch-size", "4", "--batches", "3"]  # fmt: skip
    assert packing.main(common + ["--save-batches", str(saved)]) is None
    batches, saved_padding, settings = packing.load_batches(saved)
    assert saved_padding == pytest.approx(padding, abs=1e-4)  # the result rounds them
    assert (settings["sequence_length"], settings["batch_size"]) == (64, 4)
    assert settings["vocabulary_size"] == len(_vocabulary())
    assert {name: len(taken) for name, taken in batches.items()} == {
        "packed": 3,
        "pieces": 3,
        "standard": 3,
    }
    x, y, _ = batches["packed"][0]
    assert x["token_ids"].shape == (4, 64) and "document_ids" in x and "mlm" in y
    assert "document_ids" not in batches["pieces"][0][0]
    replayed = packing.main(
        ["training", "--batches-from", str(saved), "--steps", "1", "--rounds", "1",
         "--precision", "mixed_bfloat16", "--json", str(tmp_path / "r.json")]
    )  # fmt: skip
    assert replayed["padding_fraction"] == {k: round(v, 4) for k, v in padding.items()}
    assert replayed["precision"] == "mixed_bfloat16" and replayed["sequence_length"] == 64
    assert all(rate > 0 for rate in replayed["real_tokens_per_s"].values())
