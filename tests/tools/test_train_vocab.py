"""tools/train_vocab.py: a vocabulary trained on a small corpus tokenizes that corpus without
[UNK]."""

import importlib
from pathlib import Path

import keras
import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools"

WORDS = "the cat sat on a mat while the dog ran under trees near rivers and houses".split()

pytestmark = pytest.mark.backend_independent


def test_trained_vocabulary_starts_with_specials_and_covers_the_corpus(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(TOOLS))
    train_vocab = importlib.import_module("train_vocab")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))) * 3)
    output = tmp_path / "vocab.txt"
    code = train_vocab.main(
        [str(corpus), "--output", str(output), "--vocab-size", "80", "--reserved", "2", "--quiet"]
    )
    assert code == 0
    tokens = output.read_text(encoding="utf-8").split("\n")
    assert tokens[:7] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]", "[unused1]"]

    from kbert.text import BertTokenizer

    tokenizer = BertTokenizer(str(output))
    ids = keras.ops.convert_to_numpy(tokenizer(" ".join(WORDS).upper())).tolist()
    assert ids and 1 not in ids  # Lower-cased (uncased default), every word covered.
