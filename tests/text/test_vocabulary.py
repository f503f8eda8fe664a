"""train_wordpiece_vocabulary and tools/train_vocab.py."""

import importlib.util
import os

import pytest
import tensorflow as tf

from kbert.text import BertTokenizer, train_wordpiece_vocabulary
from tests.text.conftest import REPO_ROOT
from tests.text.hard_strings import HARD_STRINGS

pytestmark = pytest.mark.backend_independent

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
CORPUS = REPO_ROOT / "LICENSE"  # Real English text that ships with the repository.
ACCENTED = [
    "Le café de la Place Saint-Michel était bondé à midi.",
    "Über den Wolken muß die Freiheit wohl grenzenlos sein.",
    "El niño comió piña y jalapeños en la mañana.",
] * 5


def unknown_rate(tokenizer, texts):
    ids = tokenizer(texts)
    total = sum(len(row) for row in ids)
    return sum(row.count(tokenizer.unk_token_id) for row in ids) / max(total, 1), total


def test_uncased_vocabulary_from_a_file(tmp_path):
    vocabulary = train_wordpiece_vocabulary(
        [CORPUS], vocabulary_size=600, output_path=tmp_path, verbose=False
    )
    assert vocabulary[:5] == SPECIALS
    assert len(vocabulary) == len(set(vocabulary)) and 100 < len(vocabulary) <= 600
    assert any(t.startswith("##") for t in vocabulary)
    assert all(t == t.lower() for t in vocabulary[5:])
    with open(tmp_path / "vocab.txt", encoding="utf-8") as f:
        assert f.read().split("\n")[:-1] == vocabulary
    tokenizer = BertTokenizer(str(tmp_path / "vocab.txt"))
    lines = CORPUS.read_text(encoding="utf-8").split("\n")
    rate, total = unknown_rate(tokenizer, lines)
    assert rate == 0.0
    words = sum(len(w) for w in tokenizer.split_words(lines))
    assert total < 1.8 * words  # Real sub-words, not characters.
    assert tokenizer.tokenize("License") == [tokenizer.token_to_id("license")]


def test_cased_vocabulary_from_texts():
    texts = ACCENTED + CORPUS.read_text(encoding="utf-8").split("\n")[:60]
    vocabulary = train_wordpiece_vocabulary(
        texts, vocabulary_size=500, lowercase=False, reserved_tokens=["[unused0]"], verbose=False
    )
    assert vocabulary[:6] == SPECIALS + ["[unused0]"]
    assert "É" in vocabulary or "é" in vocabulary
    assert any(t[:1].isupper() for t in vocabulary)
    tokenizer = BertTokenizer(vocabulary, lowercase=False)
    rate, _ = unknown_rate(tokenizer, texts)
    assert rate == 0.0
    # Words are split like the cased tokenizer does: accents kept.
    assert "ñ" in "".join(vocabulary) and "ß" in "".join(vocabulary)


def test_uncased_strips_accents_like_the_tokenizer():
    vocabulary = train_wordpiece_vocabulary(ACCENTED, vocabulary_size=200, verbose=False)
    joined = "".join(vocabulary)
    assert "é" not in joined and "ñ" not in joined and "ß" in joined
    tokenizer = BertTokenizer(vocabulary)
    assert unknown_rate(tokenizer, ACCENTED)[0] == 0.0


def test_dataset_input():
    ds = tf.data.Dataset.from_tensor_slices(ACCENTED + HARD_STRINGS[:5])
    vocabulary = train_wordpiece_vocabulary(ds, vocabulary_size=300, verbose=False)
    assert vocabulary[:5] == SPECIALS
    assert unknown_rate(BertTokenizer(vocabulary), ACCENTED)[0] == 0.0


def test_errors(tmp_path):
    with pytest.raises(ValueError, match="vocabulary_size"):
        train_wordpiece_vocabulary(ACCENTED, vocabulary_size=5)
    with pytest.raises(ValueError, match="is empty"):
        train_wordpiece_vocabulary([], vocabulary_size=100)
    with pytest.raises(ValueError, match="Training file not found"):
        train_wordpiece_vocabulary(str(tmp_path / "missing.txt"), vocabulary_size=100)
    with pytest.raises(ValueError, match="Training file not found"):
        train_wordpiece_vocabulary([tmp_path / "missing.txt"], vocabulary_size=100)
    with pytest.raises(ValueError, match="reserved_tokens"):
        train_wordpiece_vocabulary(ACCENTED, vocabulary_size=100, reserved_tokens=["[CLS]"])
    with pytest.raises(ValueError, match="file paths or strings"):
        train_wordpiece_vocabulary([3], vocabulary_size=100)


def test_command_line_tool(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location(
        "train_vocab", REPO_ROOT / "tools" / "train_vocab.py"
    )
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    output = tmp_path / "out" / "vocab.txt"
    os.makedirs(output.parent)
    code = tool.main(
        [
            str(CORPUS),
            "--output",
            str(output),
            "--vocab-size",
            "300",
            "--cased",
            "--reserved",
            "2",
            "--quiet",
        ]
    )
    assert code == 0
    vocabulary = output.read_text(encoding="utf-8").split("\n")[:-1]
    assert vocabulary[:7] == SPECIALS + ["[unused0]", "[unused1]"]
    assert "tokens (cased)" in capsys.readouterr().out
    tokenizer = BertTokenizer(str(output), lowercase=False)
    assert unknown_rate(tokenizer, CORPUS.read_text(encoding="utf-8").split("\n"))[0] == 0.0
    with pytest.raises(SystemExit):
        tool.main([str(CORPUS), "--output", str(output), "--cased", "--lowercase"])
