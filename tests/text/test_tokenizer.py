"""BertTokenizer: parity with the reference tokenizers, offsets, tf.data, errors."""

import unicodedata

import keras
import numpy as np
import pytest
import tensorflow as tf

from kbert.text import BertTokenizer
from tests.text import reference
from tests.text.hard_strings import HARD_STRINGS

pytestmark = pytest.mark.backend_independent

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def hf_ids(hf, texts, **kwargs):
    kwargs.setdefault("split_special_tokens", True)
    return hf(texts, add_special_tokens=False, **kwargs)["input_ids"]


def hf_fast(vocab_path, **kwargs):
    transformers = pytest.importorskip("transformers")
    return transformers.BertTokenizer(vocab=vocab_path, **kwargs)


def make_cased_vocabulary(vocabulary):
    """The uncased vocabulary plus capitalised words and accented pieces."""
    extra = []
    present = set(vocabulary)
    for token in vocabulary[1996:4000]:
        if token.isalpha() and token.isascii():
            for variant in (token.capitalize(), token.upper(), "##" + token.upper()):
                if variant not in present:
                    present.add(variant)
                    extra.append(variant)
    for token in ["É", "##É", "Ö", "##Ö", "Ñ", "e\u0301", "##e\u0301", "Straße", "İ", "Σ", "##Σ"]:
        if token not in present:
            present.add(token)
            extra.append(token)
    return vocabulary + extra


# --------------------------------------------------------------------------- #
# Parity.
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("lowercase", [True, False])
def test_ids_and_offsets_match_hugging_face_on_hard_strings(
    vocab_path, vocabulary, lowercase, tokenizer
):
    if not lowercase:
        tokenizer = BertTokenizer(vocab_path, lowercase=False)
    hf = hf_fast(vocab_path, do_lower_case=lowercase)
    oracle = reference.ReferenceTokenizer(vocabulary, lowercase=lowercase)
    ids, starts, ends, _ = tokenizer.tokenize_with_offsets(HARD_STRINGS)
    encoded = hf(
        HARD_STRINGS,
        add_special_tokens=False,
        return_offsets_mapping=True,
        split_special_tokens=True,
    )
    for i, text in enumerate(HARD_STRINGS):
        assert ids[i] == encoded["input_ids"][i], text
        assert ids[i] == oracle.tokenize(text), text
        expected = [tuple(o) for o in encoded["offset_mapping"][i]]
        assert list(zip(starts[i], ends[i])) == expected, text


def test_cased_vocabulary_matches_hugging_face(tmp_path, vocabulary):
    cased = make_cased_vocabulary(vocabulary)
    path = tmp_path / "vocab.txt"
    path.write_text("".join(t + "\n" for t in cased), encoding="utf-8")
    texts = HARD_STRINGS + [
        "The Quick BROWN Fox, Über Straße É e\u0301 Ñandú İ",
        "ΣΟΦΙΑ Σ ΑΣ",
    ]
    tokenizer = BertTokenizer(str(path), lowercase=False)
    hf = hf_fast(str(path), do_lower_case=False)
    oracle = reference.ReferenceTokenizer(cased, lowercase=False)
    ids = tokenizer(texts)
    unk = tokenizer.unk_token_id
    for text, got, expected in zip(texts, ids, hf_ids(hf, texts)):
        assert got == expected, text
        assert got == oracle.tokenize(text), text
    # The cased vocabulary really is used: capitals map to their own pieces.
    assert tokenizer("The Quick")[0] == cased.index("The")
    assert tokenizer("e\u0301") == [cased.index("e\u0301")]  # No NFC in the original.
    assert unk not in tokenizer("Straße É Ñ")


@pytest.mark.parametrize(
    "lowercase, strip_accents", [(True, False), (False, True), (True, True), (False, False)]
)
def test_strip_accents_options_match_hugging_face(vocab_path, vocabulary, lowercase, strip_accents):
    tokenizer = BertTokenizer(vocab_path, lowercase=lowercase, strip_accents=strip_accents)
    hf = hf_fast(vocab_path, do_lower_case=lowercase, strip_accents=strip_accents)
    oracle = reference.ReferenceTokenizer(vocabulary, lowercase, strip_accents)
    ids = tokenizer(HARD_STRINGS)
    for text, got, expected in zip(HARD_STRINGS, ids, hf_ids(hf, HARD_STRINGS)):
        assert got == expected, text
        assert got == oracle.tokenize(text), text


def test_known_hugging_face_deviations_follow_the_original(tokenizer, vocabulary, hf_tokenizer):
    """Where `tokenizers` departs from google-research/bert, we follow the
    original: Python's `str.lower()` gives a final sigma (U+03C2) at the end
    of a word; private-use and unassigned characters are kept, not deleted."""
    oracle = reference.ReferenceTokenizer(vocabulary)
    texts = ["ΟΔΟΣ ΑΣ.", "ΣΑΣ Σ", "a\ue000b", "x\U000f0000"]
    ids = tokenizer(texts)
    for text, got in zip(texts, ids):
        assert got == oracle.tokenize(text), text
    tokens = [tokenizer.id_to_token(i) for i in ids[0]]
    assert tokens[:3] == ["ο", "##δ", "##ος"]
    # Hugging Face's fast tokenizer lower-cases character by character...
    assert hf_ids(hf_tokenizer, ["ΟΔΟΣ"])[0] != ids[0][:3]
    # ...and deletes private-use characters: "a\ue000b" -> "ab" there.
    assert hf_ids(hf_tokenizer, ["a\ue000b"])[0] == tokenizer("ab")
    assert ids[2] == [tokenizer.unk_token_id]


def test_python_lowercase_context_sensitive_sigma_against_legacy(
    vocab_path, tokenizer, hf_legacy_tokenizer
):
    # The Python port in transformers applies `str.lower()` like the original.
    texts = ["ΟΔΟΣ", "ΑΣ ΣΑΣ", "Σ", "ΑΣ\u0301", "ΑΣ\u200bΑ", "ΑΣ\u0301Α"]
    for text in texts:
        expected = hf_legacy_tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer(text) == expected, text


@pytest.mark.parametrize("lowercase", [True, False])
def test_unicode_sweep_matches_original_algorithm(vocabulary, vocab_path, lowercase):
    """Every code point below U+3400 and a stride over the rest, in context."""
    tokenizer = BertTokenizer(vocab_path, lowercase=lowercase)
    oracle = reference.ReferenceTokenizer(vocabulary, lowercase=lowercase)
    points = list(range(0x3400)) + list(range(0x3400, 0x110000, 61))
    texts = [f"xA{chr(p)}b Σ{chr(p)}Σ {chr(p)}ΑΣ" for p in points if not 0xD800 <= p <= 0xDFFF]
    python = tokenizer.tokenize_with_offsets(texts)
    for text, got in zip(texts, python[0]):
        assert got == oracle.tokenize(text), repr(text)
    # The TensorFlow graph (tables + tensorflow-text) gives the same ids, offsets, word ids.
    graph = tokenizer.tokenize_with_offsets(tf.constant(texts))
    for got, expected in zip(graph, python):
        assert got.to_list() == expected


def test_split_words_is_the_basic_tokenizer(tokenizer):
    expected = [reference.basic_tokenize(text) for text in HARD_STRINGS]
    assert tokenizer.split_words(HARD_STRINGS) == expected
    assert tokenizer.split_words(HARD_STRINGS[3]) == expected[3]
    words = tokenizer.split_words(tf.constant(HARD_STRINGS[:2]))
    assert words.to_list() == [[w.encode("utf-8") for w in row] for row in expected[:2]]


# --------------------------------------------------------------------------- #
# Offsets.
# --------------------------------------------------------------------------- #
def _fold_sigma(text):
    return text.replace("\u03c2", "\u03c3")


def test_offsets_point_into_the_original_string(tokenizer):
    """Property: each piece's source text, normalised, is the piece."""
    texts = HARD_STRINGS + ["ΟΔΟΣ ΑΣ", "한국어 텍스트", "İİ ǅ ﬁﬁ", "Ａ\u0301Ｂ"]
    ids, starts, ends, word_ids = tokenizer.tokenize_with_offsets(texts)
    for i, text in enumerate(texts):
        pieces = [tokenizer.id_to_token(t) for t in ids[i]]
        assert word_ids[i] == sorted(word_ids[i])
        if word_ids[i]:
            assert word_ids[i][0] == 0
            assert set(np.diff(word_ids[i])) <= {0, 1}
        spans = list(zip(starts[i], ends[i]))
        for _k, (piece, (start, end)) in enumerate(zip(pieces, spans)):
            assert 0 <= start < end <= len(text)
            source = _fold_sigma("".join(reference.basic_tokenize(text[start:end])))
            if piece == "[UNK]":
                assert len(reference.basic_tokenize(text[start:end])) == 1
                continue
            piece = _fold_sigma(piece[2:] if piece.startswith("##") else piece)
            shares_span = spans.count((start, end)) > 1
            if shares_span:  # Pieces cut inside one character's expansion.
                assert piece in source, (text, piece, source)
            else:
                assert source == piece, (text, piece, source)
        # Word by word, the pieces rebuild the normalised word.
        for word in sorted(set(word_ids[i])):
            members = [k for k in range(len(pieces)) if word_ids[i][k] == word]
            if any(pieces[k] == "[UNK]" for k in members):
                continue
            start, end = spans[members[0]][0], spans[members[-1]][1]
            joined = "".join(pieces[k][2:] if k != members[0] else pieces[k] for k in members)
            assert _fold_sigma("".join(reference.basic_tokenize(text[start:end]))) == _fold_sigma(
                joined
            )


def test_offsets_example(tokenizer, hf_tokenizer):
    text = "Héllo, NAÏVE\u200b中文 ΟΔΟΣ"
    ids, starts, ends, word_ids = tokenizer.tokenize_with_offsets(text)
    assert [text[s:e] for s, e in zip(starts, ends)] == [
        "Héllo",
        ",",
        "NAÏVE",
        "中",
        "文",
        "Ο",
        "Δ",
        "ΟΣ",
    ]
    assert word_ids == [0, 1, 2, 3, 4, 5, 5, 5]
    tokens = [tokenizer.id_to_token(i) for i in ids]
    assert tokens[:5] == hf_tokenizer.convert_ids_to_tokens(hf_ids(hf_tokenizer, [text])[0])[:5]
    assert tokens[5:] == ["ο", "##δ", "##ος"]


# --------------------------------------------------------------------------- #
# Special tokens, long words, empty input.
# --------------------------------------------------------------------------- #
def test_special_tokens_in_text(vocab_path, hf_tokenizer):
    texts = ["hello [MASK] world", "[CLS]a[SEP]b[SEP]", "[mask] [UNK][PAD]", "[[MASK]]"]
    plain = BertTokenizer(vocab_path)
    honoured = BertTokenizer(vocab_path, special_tokens_in_strings=True)
    assert plain(texts) == hf_ids(hf_tokenizer, texts, split_special_tokens=True)
    assert honoured(texts) == hf_ids(hf_tokenizer, texts, split_special_tokens=False)
    ids, starts, ends, word_ids = honoured.tokenize_with_offsets(texts[0])
    encoded = hf_tokenizer(texts[0], add_special_tokens=False, return_offsets_mapping=True)
    assert list(zip(starts, ends)) == [tuple(o) for o in encoded["offset_mapping"]]
    assert ids[1] == honoured.mask_token_id and word_ids == [0, 1, 2]
    # The graph path agrees, offsets and word ids included.
    graph = honoured.tokenize_with_offsets(tf.constant(texts))
    assert [g.to_list() for g in graph] == list(honoured.tokenize_with_offsets(texts))
    config = honoured.get_config()
    assert config["special_tokens_in_strings"] is True
    assert BertTokenizer.from_config(config).get_config() == config


def test_split_words_keeps_special_tokens_as_written(vocab_path, hf_tokenizer):
    honoured = BertTokenizer(vocab_path, special_tokens_in_strings=True)
    text = "Hi [CLS]a[SEP] [MASK][PAD] [UNK]!"
    expected = ["hi", "[CLS]", "a", "[SEP]", "[MASK]", "[PAD]", "[UNK]", "!"]
    assert honoured.split_words(text) == expected
    assert hf_tokenizer.tokenize(text) == expected  # Special tokens kept by the reference too.
    words = honoured.split_words(tf.constant([text, "[UNK]"]))
    assert words.to_list() == [[w.encode() for w in expected], [b"[UNK]"]]
    # Without `special_tokens_in_strings` they are plain text.
    assert BertTokenizer(vocab_path).split_words("[UNK]") == ["[", "unk", "]"]


def test_words_longer_than_the_limit_are_unknown(vocab_path, hf_tokenizer):
    tokenizer = BertTokenizer(vocab_path)
    unk = tokenizer.unk_token_id
    assert tokenizer("a" * 100) != [unk]
    assert tokenizer("a" * 101) == [unk]
    assert tokenizer("ж" * 101 + " ok") == [unk, tokenizer.token_to_id("ok")]
    # Counted after normalisation: 150 stripped accents leave one character.
    assert tokenizer("x" + "\u0301" * 150) == [tokenizer.token_to_id("x")]
    short = BertTokenizer(vocab_path, max_chars_per_word=5)
    assert short("hello helloo") == [tokenizer.token_to_id("hello"), unk]
    ids, starts, ends, _ = tokenizer.tokenize_with_offsets("b" * 120 + " x")
    assert (ids[0], starts[0], ends[0]) == (unk, 0, 120)


def _adversarial_ascii_strings(vocabulary, count, seed):
    """Printable-ASCII strings (with tabs and line breaks) built to find any difference
    between the fused engine and the reference: vocabulary words in random case, every ASCII
    symbol, special tokens and `##` written in the text, words of 99 to 102 and 150 letters."""
    import random
    import string

    rng = random.Random(seed)
    words = [w for w in vocabulary if w.isascii()]
    symbols = string.punctuation
    texts = []
    while len(texts) < count:
        parts = []
        for _ in range(rng.randint(0, 25)):
            kind = rng.random()
            if kind < 0.4:
                word = rng.choice(words).replace("##", "")
                parts.append("".join(c.upper() if rng.random() < 0.3 else c for c in word))
            elif kind < 0.65:
                length = rng.randint(1, 8)
                parts.append("".join(rng.choice(string.printable[:95]) for _ in range(length)))
            elif kind < 0.72:
                length = rng.choice([99, 100, 101, 102, 150])  # Around the 100-character limit.
                parts.append("".join(rng.choice(string.ascii_letters) for _ in range(length)))
            elif kind < 0.8:
                parts.append("##" + rng.choice(words))
            else:
                parts.append(rng.choice(SPECIALS + ["U.S.A.", "1,000.50", "don't", "...", symbols]))
            parts.append(rng.choice([" ", "  ", "", "\t", " \n ", "\r"]))
        texts.append("".join(parts))
    return texts


@pytest.mark.parametrize("lowercase", [True, False])
def test_plain_ascii_fast_path_gives_the_reference_ids_in_input_order(
    tmp_path, vocabulary, lowercase
):
    # `tokenize` on string tensors sends plain-ASCII rows through tensorflow-text's fused
    # engine and the other rows through the exact graph: the ids must be the original
    # algorithm's, row by row, in a batch where both kinds are interleaved.
    words = make_cased_vocabulary(vocabulary) if not lowercase else vocabulary
    path = tmp_path / "vocab.txt"
    path.write_text("".join(t + "\n" for t in words), encoding="utf-8")
    tokenizer = BertTokenizer(str(path), lowercase=lowercase)
    oracle = reference.ReferenceTokenizer(words, lowercase=lowercase)
    plain = _adversarial_ascii_strings(words, 600, seed=int(lowercase))
    other = [t for t in HARD_STRINGS if not t.isascii()]
    assert other
    mixed = []
    for k, text in enumerate(plain):
        mixed.append(text)
        if k % 5 == 0:
            mixed.append(other[(k // 5) % len(other)])
    got = tokenizer.tokenize(tf.constant(mixed)).to_list()
    assert len(got) == len(mixed)
    for text, ids in zip(mixed, got):
        assert ids == oracle.tokenize(text), repr(text)
    # The same ids as the offsets path (the exact graph alone) and the Python engine.
    assert got == tokenizer.tokenize_with_offsets(tf.constant(mixed))[0].to_list()
    assert got == tokenizer.tokenize(mixed)
    # Batches of one kind only, and an empty batch.
    assert tokenizer.tokenize(tf.constant(plain[:50])).to_list() == [
        oracle.tokenize(t) for t in plain[:50]
    ]
    assert tokenizer.tokenize(tf.constant(other)).to_list() == [oracle.tokenize(t) for t in other]
    assert tokenizer.tokenize(tf.constant([], tf.string)).to_list() == []


@pytest.mark.parametrize(
    "settings",
    [
        {"lowercase": True},
        {"lowercase": False},
        {"special_tokens_in_strings": True},
        {
            "special_tokens_in_strings": True,
            "special_tokens": [
                {"content": "[MASK]", "normalized": True, "lstrip": True},
                {"content": "[SEP]", "single_word": True},
                "[CLS]",
            ],
        },
    ],
    ids=["uncased", "cased", "specials", "normalized-specials"],
)
def test_python_fast_path_gives_the_exact_ids(vocabulary, vocab_path, settings):
    # Python strings with no special token written and no character that depends on its
    # neighbours skip `split` (two `str.translate` calls and remembered word pieces): the
    # ids must be those of the exact per-character route, on every ASCII character, fuzzed
    # code points of every plane, the hard strings, special tokens and word limits.
    import random

    lowercase = settings.get("lowercase", True)
    tokenizer = BertTokenizer(vocab_path, **settings)
    engine = tokenizer._python_engine
    oracle = reference.ReferenceTokenizer(vocabulary, lowercase=lowercase)
    rng = random.Random(7)
    texts = _adversarial_ascii_strings(vocabulary, 300, seed=3)
    texts += [
        "".join(chr(rng.randrange(128)) for _ in range(rng.randrange(40))) for _ in range(300)
    ]
    limits = (0x250, 0x3100, 0x110000)  # Latin, most scripts and CJK, everything
    texts += [
        "".join(chr(rng.randrange(rng.choice(limits))) for _ in range(rng.randrange(30)))
        .encode("utf-8", "replace")
        .decode("utf-8")
        for _ in range(2000)
    ]
    texts += ["", " ", "\x00\x1c\x1f\x7f", "a\x1cb", "[mask] x", "x[SEP]y", "the [SEP] end"]
    texts += HARD_STRINGS + ["ΟΔΟΣ ΣΟΦΟΣ Σ", "\u00bd", "ﬁnance"]
    exact = [engine.tokenize(t)[0] for t in texts]
    calls = []
    split = engine.split
    engine.split = lambda text: calls.append(text) or split(text)
    try:
        got = tokenizer.tokenize(texts)
    finally:
        del engine.split
    assert got == exact
    assert tokenizer.tokenize(texts) == got  # again, from the remembered pieces
    if not settings.get("special_tokens_in_strings"):
        assert got == [oracle.tokenize(t) for t in texts]
    # The exact route ran only for texts where a special token is written or whose words
    # depend on context (a capital sigma when lower-casing), a small part of them.
    written = [t for t in texts if any(s.lower() in t.lower() for s in SPECIALS)]
    contextual = [t for t in texts if set(t) & engine._contextual]
    assert set(calls) <= set(written + contextual)
    assert ("ΟΔΟΣ ΣΟΦΟΣ Σ" in calls) == lowercase
    assert len(calls) < len(texts) // 10
    if settings.get("special_tokens_in_strings"):
        assert len(set(calls) & set(written)) > 10


def test_python_fast_path_tables_stay_bounded(vocab_path, monkeypatch):
    # However many distinct characters the texts hold, the fast path's tables stop growing at
    # their bound; texts with a character past it take the exact route, with the same ids.
    from kbert.text import _python_engine

    monkeypatch.setattr(_python_engine, "_MAX_TABLED_CHARACTERS", 300)
    tokenizer = BertTokenizer(vocab_path)
    engine = tokenizer._python_engine
    texts = [f"{chr(0x4E00 + i)} word {chr(0x0400 + i % 200)}" for i in range(1000)]
    assert tokenizer.tokenize(texts + ["plain words"]) == [
        engine.tokenize(t)[0] for t in texts + ["plain words"]
    ]
    assert len(engine._spaced_table) == len(engine._normalized_table) == 300


def test_empty_and_whitespace_inputs(tokenizer):
    assert tokenizer("") == []
    assert tokenizer(["", " \t\n", "\u200b\x00"]) == [[], [], []]
    assert tokenizer([]) == []
    assert tokenizer.tokenize_with_offsets("") == ([], [], [], [])
    out = tokenizer(tf.constant([""]))
    assert out.shape.as_list() == [1, None] and out.flat_values.shape[0] == 0


# --------------------------------------------------------------------------- #
# Input / output types, tf.data.
# --------------------------------------------------------------------------- #
def test_input_types(tokenizer):
    expected = tokenizer(["Hello world", "a"])
    assert tokenizer("Hello world") == expected[0]
    assert tokenizer(("Hello world", "a")) == expected
    assert tokenizer([b"Hello world", b"a"]) == expected
    assert tokenizer(np.array(["Hello world", "a"])).to_list() == expected
    assert tokenizer(np.array(["Hello world", "a"], dtype=object)).to_list() == expected
    scalar = tokenizer(tf.constant("Hello world"))
    assert isinstance(scalar, tf.Tensor) and scalar.dtype == tf.int32
    assert scalar.numpy().tolist() == expected[0]
    matrix = tokenizer(tf.constant([["Hello world", "a"], ["a", "Hello world"]]))
    assert matrix.to_list() == [expected, expected[::-1]]
    ragged = tokenizer(tf.ragged.constant([["Hello world"], ["a", "a"]]))
    assert ragged.to_list() == [[expected[0]], [expected[1], expected[1]]]


def test_tf_data_graph_equals_eager(tokenizer):
    eager = tokenizer.tokenize_with_offsets(HARD_STRINGS)
    ds = tf.data.Dataset.from_tensor_slices(HARD_STRINGS)
    for i, element in enumerate(ds.map(tokenizer.tokenize_with_offsets)):
        for got, expected in zip(element, eager):
            assert got.numpy().tolist() == expected[i]
    rows = []
    for batch in ds.batch(7).map(tokenizer.tokenize_with_offsets):
        rows.extend(zip(*(t.to_list() for t in batch)))
    assert rows == list(zip(*eager))

    @tf.function
    def graph(texts):
        return tokenizer(texts)

    assert graph(tf.constant(HARD_STRINGS)).to_list() == eager[0]


def test_first_use_inside_tf_data_map(vocab_path):
    """The TensorFlow side is built lazily; built first inside `Dataset.map`, it must still
    live outside the traced graph."""
    fresh = BertTokenizer(vocab_path)
    ds = tf.data.Dataset.from_tensor_slices(HARD_STRINGS[:3]).batch(3).map(fresh)
    assert next(iter(ds)).to_list() == fresh(HARD_STRINGS[:3])
    assert next(iter(ds)).to_list() == fresh(HARD_STRINGS[:3])


def test_invalid_utf8_in_tf_data_is_replaced_not_fatal(tokenizer, vocabulary):
    """Invalid UTF-8 bytes decode to U+FFFD, which the original deletes (it
    decodes bytes with errors="ignore"): same ids, no crash in a worker."""
    raw = [b"ab\xffcd efg", b"caf\xc3", b"\xe2\x82\xac100 \xed\xa0\x80x", b"\xc0\xafslash\x80"]
    oracle = reference.ReferenceTokenizer(vocabulary)
    ds = tf.data.Dataset.from_tensor_slices(raw).map(tokenizer.tokenize, num_parallel_calls=2)
    got = [t.numpy().tolist() for t in ds]
    assert got == [oracle.tokenize(r.decode("utf-8", "ignore")) for r in raw]
    assert tokenizer(raw) == got
    # Offsets count one U+FFFD per invalid sequence: "ab\ufffdcd efg".
    _, starts, ends, word_ids = tokenizer.tokenize_with_offsets(raw[0])
    spans = {}
    for start, end, word in zip(starts, ends, word_ids):
        spans[word] = (spans.get(word, (start,))[0], end)
    assert spans == {0: (0, 5), 1: (6, 9)}


def test_lone_surrogates_do_not_crash(tokenizer):
    assert tokenizer("a\ud800b") == tokenizer("ab")


# --------------------------------------------------------------------------- #
# Vocabulary API, detokenize, serialization.
# --------------------------------------------------------------------------- #
def test_vocabulary_api(tokenizer, vocabulary, hf_tokenizer):
    assert tokenizer.vocabulary == vocabulary
    assert tokenizer.vocabulary_size() == len(vocabulary) == 30522
    for name in ["cls", "sep", "pad", "mask", "unk"]:
        assert getattr(tokenizer, f"{name}_token_id") == getattr(hf_tokenizer, f"{name}_token_id")
    assert tokenizer.id_to_token(7592) == "hello"
    assert tokenizer.token_to_id("hello") == 7592
    assert tokenizer.id_to_token(np.int64(101)) == "[CLS]"
    with pytest.raises(ValueError, match="not in the vocabulary"):
        tokenizer.token_to_id("not-a-token")
    with pytest.raises(ValueError, match=r"must be in \[0, 30522\)"):
        tokenizer.id_to_token(30522)


def test_detokenize_matches_reference(tokenizer, hf_legacy_tokenizer):
    ids = tokenizer(HARD_STRINGS)
    expected = [
        hf_legacy_tokenizer.convert_tokens_to_string(hf_legacy_tokenizer.convert_ids_to_tokens(i))
        for i in ids
    ]
    assert tokenizer.detokenize(ids) == expected
    assert tokenizer.detokenize(ids[0]) == expected[0] == "hello , world !"
    tensor = tokenizer.detokenize(tokenizer(tf.constant(HARD_STRINGS)))
    assert [t.decode("utf-8") for t in tensor.numpy()] == expected
    dense = tokenizer.detokenize(tf.constant([[7592, 2088], [101, 102]]))
    assert dense.numpy().tolist() == [b"hello world", b"[CLS] [SEP]"]
    assert tokenizer.detokenize(tf.constant([7592, 2088])).numpy() == b"hello world"
    assert tokenizer.detokenize(tokenizer("unaffable")) == "unaffable"
    with pytest.raises(ValueError, match=r"in \[0, 30522\).*99999"):
        tokenizer.detokenize([1, 99999])
    with pytest.raises(ValueError, match=r"in \[0, 30522\).*-1"):
        tokenizer.detokenize(np.array([[1, -1]]))
    # An eager tensor gets kbert's error directly, not a failed graph assertion.
    with pytest.raises(ValueError, match=r"in \[0, 30522\).*99999"):
        tokenizer.detokenize(tf.constant([[1, 99999]]))
    with pytest.raises(ValueError, match=r"in \[0, 30522\).*30522"):
        tokenizer.detokenize(tf.ragged.constant([[1], [30522, 2]]))
    # Inside a graph the values are unknown when it is traced: checked when it runs.
    with pytest.raises(tf.errors.InvalidArgumentError, match="vocabulary size 30522"):
        tf.function(tokenizer.detokenize)(tf.constant([[1, 99999]]))


def test_detokenize_every_input_form_and_its_errors():
    """Ragged and dense tensors of any rank give strings shaped like their rows; pieces are
    joined as the reference does (spaces, `##` merged, the ends stripped); ids that are not
    integers or out of range are refused eagerly, and negative ids fail the graph's check."""
    vocabulary = [*SPECIALS, "the", "qu", "##ick", "fox", " pad "]
    tokenizer = BertTokenizer(vocabulary)

    def reference_text(ids):
        return " ".join(vocabulary[i] for i in ids).replace(" ##", "").strip()

    rows = [[5, 6, 7], [8], [9, 5], [6, 7, 8]]
    assert tokenizer.detokenize(rows) == [reference_text(r) for r in rows]
    assert tokenizer.detokenize([9]) == "pad"  # the stripped ends
    ragged = tf.ragged.constant([[rows[0], rows[1]], [rows[2]], [rows[3], rows[0], rows[1]]])
    assert tokenizer.detokenize(ragged).to_list() == [
        [reference_text(rows[0]).encode(), reference_text(rows[1]).encode()],
        [reference_text(rows[2]).encode()],
        [reference_text(r).encode() for r in (rows[3], rows[0], rows[1])],
    ]
    dense = np.array([[[5, 6, 7], [8, 5, 8]], [[9, 9, 5], [6, 7, 5]]])
    expected = [[reference_text(row).encode() for row in pair] for pair in dense.tolist()]
    assert tokenizer.detokenize(tf.constant(dense)).numpy().tolist() == expected
    with pytest.raises(
        ValueError, match="must be integers. Received a numpy array of dtype float64"
    ):
        tokenizer.detokenize(np.array([5.0, 6.0]))
    with pytest.raises(ValueError, match="Received an object of type bool"):
        tokenizer.detokenize([True, 5])
    with pytest.raises(ValueError, match=r"in \[0, 10\).*-1"):
        tokenizer.detokenize(tf.constant([5, -1]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="token ids must be >= 0"):
        tf.function(tokenizer.detokenize)(tf.constant([[5, -1]]))


def test_constructor_arguments_and_vocabulary_lookups():
    """A custom unknown token is the one used; an empty one, booleans and negative ids are
    refused; a numpy array of bytes is a vocabulary like the list of its strings."""
    vocabulary = [*SPECIALS, "<unk>", "the", "fox"]
    tokenizer = BertTokenizer(vocabulary, unknown_token="<unk>")
    assert tokenizer.unk_token_id == 5 != vocabulary.index("[UNK]")
    assert tokenizer("the zebra fox") == [6, 5, 7]
    with pytest.raises(ValueError, match="`unknown_token` must be a non-empty string. Received"):
        BertTokenizer(vocabulary, unknown_token="")
    for bad in (True, 2.0):
        with pytest.raises(ValueError, match=f"`id` must be an integer. Received: id={bad}"):
            tokenizer.id_to_token(bad)
    with pytest.raises(ValueError, match=r"`id` must be in \[0, 8\). Received: id=-1"):
        tokenizer.id_to_token(-1)
    from_bytes = BertTokenizer(
        np.array([t.encode("utf-8") for t in vocabulary]), unknown_token="<unk>"
    )
    assert from_bytes.vocabulary == vocabulary
    assert from_bytes("the zebra fox") == [6, 5, 7]


def test_preset_keeps_accents_of_a_lower_casing_tokenizer(tmp_path):
    """`strip_accents=False` with `lowercase=True` (lower-case, keep accents) survives a
    preset; the default would strip them."""
    vocabulary = [*SPECIALS, "café", "cafe"]
    tokenizer = BertTokenizer(vocabulary, strip_accents=False)
    assert tokenizer("Café") == [5] and BertTokenizer(vocabulary)("Café") == [6]
    tokenizer.save_to_preset(tmp_path / "preset")
    restored = BertTokenizer.from_preset(tmp_path / "preset")
    assert (restored.lowercase, restored.strip_accents) == (True, False)
    assert restored("Café") == [5]


def test_config_round_trip(vocab_path):
    tokenizer = BertTokenizer(
        vocab_path, lowercase=False, strip_accents=True, max_chars_per_word=20
    )
    config = tokenizer.get_config()
    assert set(config) == {
        "vocabulary",
        "lowercase",
        "strip_accents",
        "special_tokens_in_strings",
        "max_chars_per_word",
        "unknown_token",
        "special_tokens",
    }
    restored = BertTokenizer.from_config(config)
    assert restored.get_config() == config
    assert restored(HARD_STRINGS) == tokenizer(HARD_STRINGS)
    serialized = keras.saving.serialize_keras_object(tokenizer)
    again = keras.saving.deserialize_keras_object(serialized)
    assert isinstance(again, BertTokenizer) and again.get_config() == config


def test_from_preset(tmp_path, minilm_dir, vocab_path, tokenizer):
    expected = tokenizer.get_config()
    # A Hugging Face directory honours special tokens written in text, as its tokenizer does
    # (tests/text/test_special_tokens.py); a bare vocabulary file keeps them plain text.
    from_hf = dict(expected, special_tokens_in_strings=True)
    assert BertTokenizer.from_preset(minilm_dir).get_config() == from_hf
    assert BertTokenizer.from_preset(vocab_path).get_config() == expected
    tokenizer.save_to_preset(tmp_path / "uncased")
    assert BertTokenizer.from_preset(tmp_path / "uncased").get_config() == expected
    cased = BertTokenizer(vocab_path, lowercase=False)
    cased.save_to_preset(str(tmp_path / "cased"))
    loaded = BertTokenizer.from_preset(str(tmp_path / "cased"))
    assert loaded.get_config() == cased.get_config() and loaded.lowercase is False
    assert loaded("Hello") == [tokenizer.unk_token_id] != tokenizer("Hello")
    assert BertTokenizer.from_preset(str(tmp_path / "cased"), lowercase=True).lowercase
    keras_hub_dir = tmp_path / "keras_hub" / "assets" / "tokenizer"
    keras_hub_dir.mkdir(parents=True)
    (keras_hub_dir / "vocabulary.txt").write_text("\n".join(tokenizer.vocabulary) + "\n", "utf-8")
    (tmp_path / "keras_hub" / "tokenizer.json").write_text('{"config": {"lowercase": false}}')
    loaded = BertTokenizer.from_preset(tmp_path / "keras_hub")
    assert loaded.lowercase is False and loaded.vocabulary == tokenizer.vocabulary
    hf_fast_dir = tmp_path / "hf_fast"
    hf_fast_dir.mkdir()
    (hf_fast_dir / "vocab.txt").write_text("\n".join(tokenizer.vocabulary) + "\n", "utf-8")
    (hf_fast_dir / "tokenizer.json").write_text(
        '{"normalizer": {"type": "BertNormalizer", "lowercase": false, "strip_accents": true}}'
    )
    loaded = BertTokenizer.from_preset(hf_fast_dir)
    assert (loaded.lowercase, loaded.strip_accents) == (False, True)
    with pytest.raises(ValueError, match="does not exist"):
        BertTokenizer.from_preset(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="No vocabulary found"):
        BertTokenizer.from_preset(str(tmp_path / "empty"))


def test_casing_comes_from_the_vocabulary_when_the_preset_does_not_say(tmp_path, vocabulary):
    """A directory with only vocab.txt (Google checkpoints, bare HF directories): the uncased
    bert-base vocabulary (which holds the case-less capital `ℝ`) lower-cases, a cased one does
    not."""
    from kbert.text.tokenizer import vocabulary_is_uncased

    assert "ℝ" in vocabulary and vocabulary_is_uncased(vocabulary)
    cased_vocabulary = make_cased_vocabulary(vocabulary)
    assert not vocabulary_is_uncased(cased_vocabulary)
    for name, tokens, lowercase in (
        ("uncased", vocabulary, True),
        ("cased", cased_vocabulary, False),
    ):
        directory = tmp_path / name
        directory.mkdir()
        (directory / "vocab.txt").write_text("\n".join(tokens) + "\n", "utf-8")
        assert BertTokenizer.from_preset(directory).lowercase is lowercase
        assert BertTokenizer.from_preset(directory / "vocab.txt").lowercase is lowercase
    uncased = BertTokenizer.from_preset(tmp_path / "uncased")
    assert uncased(["Amoco in Yemen"]) == uncased(["amoco in yemen"])
    assert uncased.unk_token_id not in uncased(["Amoco in Yemen"])[0]


def test_vocabulary_file_reading(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_bytes("\r\n".join(SPECIALS + ["hello", "##s"]).encode("utf-8") + b"\r\n")
    tokenizer = BertTokenizer(str(path))
    assert tokenizer.vocabulary == SPECIALS + ["hello", "##s"]
    assert tokenizer("Hellos") == [5, 6]


# --------------------------------------------------------------------------- #
# Errors.
# --------------------------------------------------------------------------- #
def test_vocabulary_errors(tmp_path):
    with pytest.raises(ValueError, match=r"missing the special tokens \['\[MASK\]', '\[PAD\]'\]"):
        BertTokenizer(["[CLS]", "[SEP]", "[UNK]", "a"])
    with pytest.raises(ValueError, match=r"missing the special tokens \['<unk>'\]"):
        BertTokenizer(SPECIALS, unknown_token="<unk>")
    with pytest.raises(ValueError, match="duplicate tokens: 'a', 'b'"):
        BertTokenizer(SPECIALS + ["a", "b", "a", "b"])
    with pytest.raises(ValueError, match="is empty"):
        BertTokenizer([])
    with pytest.raises(ValueError, match="non-empty string"):
        BertTokenizer(SPECIALS + [""])
    with pytest.raises(ValueError, match="not a file"):
        BertTokenizer(str(tmp_path / "nope.txt"))
    with pytest.raises(ValueError, match="list of str or the path"):
        BertTokenizer({"a": 1})
    with pytest.raises(ValueError, match="max_chars_per_word"):
        BertTokenizer(SPECIALS, max_chars_per_word=0)
    with pytest.raises(ValueError, match="strip_accents"):
        BertTokenizer(SPECIALS, strip_accents="yes")


def test_input_type_errors(tokenizer):
    for bad in [3, None, 2.5, {"a": 1}]:
        with pytest.raises(ValueError, match="must be a string"):
            tokenizer(bad)
    with pytest.raises(ValueError, match="Received an element of type int"):
        tokenizer(["ok", 3])
    with pytest.raises(ValueError, match="must be a string tensor"):
        tokenizer(tf.constant([1, 2]))
    with pytest.raises(ValueError, match="must hold strings"):
        tokenizer(np.array([1, 2]))
    with pytest.raises(ValueError, match="must be integers"):
        tokenizer.detokenize(tf.constant([1.0]))
    with pytest.raises(ValueError, match="list of int"):
        tokenizer.detokenize("hello")


def test_normalisation_tables_follow_unicodedata():
    """Spot checks of the table semantics against `unicodedata` directly."""
    from kbert.text import _unicode

    tables = _unicode.char_tables(True, True)
    kind = tables.kind & _unicode.KIND_MASK
    assert kind[0x200B] == _unicode.DELETE  # ZERO WIDTH SPACE is Cf.
    assert kind[0x0C] == _unicode.DELETE  # FORM FEED is Cc.
    assert kind[0xA0] == kind[0x3000] == kind[0x09] == kind[0x2028] == _unicode.SPACE
    assert kind[ord("中")] == kind[ord(",")] == kind[ord("$")] == _unicode.SINGLE
    assert kind[0xE000] == _unicode.WORD  # Private use is kept, as in the original.
    keys = tables.mapped_keys.tolist()
    for char in "ÉßİǅΣ\u0301한":
        expected = unicodedata.normalize("NFD", char.lower())
        expected = "".join(c for c in expected if unicodedata.category(c) != "Mn")
        if expected == char:
            assert ord(char) not in keys
            continue
        k = keys.index(ord(char))
        lo, hi = tables.expansion_splits[k], tables.expansion_splits[k + 1]
        assert "".join(map(chr, tables.expansion_code_points[lo:hi])) == expected
