"""Tests of kbert.data.pretraining: NSP pairs and dynamic masking against the BERT recipe.

The corpus is generated here from known token ids and then written as text, so every packed
example can be traced back to the documents it came from without trusting the code under test.
"""

import os
import random
import warnings
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from kbert.data import pretraining_dataset, read_documents, split_sentences
from kbert.text import BertTokenizer

pytestmark = pytest.mark.backend_independent

DATA_DIR = Path(
    os.environ.get("KBERT_DATA_DIR", Path(__file__).resolve().parents[2] / ".." / "shared" / "data")
)

# ---------------------------------------------------------------------------------------------
# Synthetic corpus with known ids: 4-letter stems, optional "##" suffix pieces, "." ends.
# ---------------------------------------------------------------------------------------------
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PAD, UNK, CLS, SEP, MASK = range(5)
SUFFIXES = ["##s", "##ing", "##ed", "##er", "##ly"]


def _make_vocabulary():
    rng = random.Random(7)
    consonants, vowels = "bdfgklmnprstvz", "aeiou"
    stems = set()
    while len(stems) < 150:
        stems.add("".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(2)))
    return SPECIALS + ["."] + sorted(stems) + SUFFIXES


VOCAB = _make_vocabulary()
TOKEN_ID = {t: i for i, t in enumerate(VOCAB)}
STEM_IDS = [TOKEN_ID[t] for t in VOCAB[6:-5]]
SUFFIX_IDS = [TOKEN_ID[t] for t in SUFFIXES]
IS_CONTINUATION = np.array([t.startswith("##") for t in VOCAB])


def _make_corpus(num_documents, sentences_range, words_range, seed):
    """Returns (documents as lists of sentence id lists, text in the one-sentence-per-line
    format)."""
    rng = random.Random(seed)
    documents, lines = [], []
    for _ in range(num_documents):
        document = []
        for _ in range(rng.randint(*sentences_range)):
            ids, words = [], []
            for _ in range(rng.randint(*words_range)):
                pieces = [rng.choice(STEM_IDS)]
                if rng.random() < 0.35:
                    pieces.append(rng.choice(SUFFIX_IDS))
                    if rng.random() < 0.3:
                        pieces.append(TOKEN_ID["##s"])
                ids.extend(pieces)
                words.append(VOCAB[pieces[0]] + "".join(VOCAB[p][2:] for p in pieces[1:]))
            ids.append(TOKEN_ID["."])
            document.append(ids)
            lines.append(" ".join(words) + " .")
        documents.append(document)
        lines.append("")
    return documents, "\n".join(lines)


def _encode(ids):
    """Token ids as a string, one character per token, for exact substring search."""
    return "".join(chr(0x4E00 + int(i)) for i in ids)


SEQ_LEN = 64
MAX_PRED = 8
MASK_RATE = 0.15


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    documents, text = _make_corpus(50, (25, 45), (3, 9), seed=11)
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text(text, encoding="utf-8")
    streams = [_encode([t for sentence in doc for t in sentence]) for doc in documents]
    return {"path": str(path), "documents": documents, "streams": streams}


@pytest.fixture(scope="module")
def tokenizer():
    return BertTokenizer(VOCAB)


def _collect(dataset, max_batches=None):
    """Concatenates the batches of a dataset into numpy arrays."""
    parts = {}
    for i, (x, y, sw) in enumerate(dataset):
        if max_batches is not None and i >= max_batches:
            break
        for group, values in (("x", x), ("y", y), ("sw", sw)):
            for key, value in values.items():
                parts.setdefault(f"{group}/{key}", []).append(value.numpy())
    return {key: np.concatenate(value) for key, value in parts.items()}


def _rebuild(batch):
    """The unmasked sequences: mlm labels written back at the real mask positions."""
    original = batch["x/token_ids"].copy()
    rows, slots = np.nonzero(batch["sw/mlm"])
    original[rows, batch["x/mask_positions"][rows, slots]] = batch["y/mlm"][rows, slots]
    return original


def _expected_predictions(num_candidates, mask_rate=MASK_RATE, max_predictions=MAX_PRED):
    return min(max_predictions, max(1, int(round(num_candidates * mask_rate))))


@pytest.fixture(scope="module")
def nsp_batches(corpus, tokenizer):
    dataset = pretraining_dataset(
        corpus["path"],
        tokenizer,
        sequence_length=SEQ_LEN,
        max_predictions=MAX_PRED,
        mask_rate=MASK_RATE,
        batch_size=64,
        seed=3,
        dupe_factor=10,
    )
    return _collect(dataset)


# ---------------------------------------------------------------------------------------------
# Reading documents.
# ---------------------------------------------------------------------------------------------
WIKITEXT = (
    " \n = Alpha Article = \n \n Alpha is first . It has two sentences ! \n \n"
    " = = History = = \n \n Then a question ? Yes .\n \n = = = Deep = = = \n A 1 @.@ 5 m wall .\n"
    " \n = Beta = \n \n Beta text here . \n"
)


def test_read_documents_wikitext_titles_split_articles(tmp_path):
    path = tmp_path / "wiki.raw"
    path.write_text(WIKITEXT, encoding="utf-8")
    assert read_documents(str(path)) == [
        [
            "Alpha is first .",
            "It has two sentences !",
            "Then a question ?",
            "Yes .",
            "A 1 @.@ 5 m wall .",
        ],
        ["Beta text here ."],
    ]


def test_read_documents_lines_format_and_file_boundaries(tmp_path):
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_bytes(b"One. Two.\r\nThree\r\n\r\n\r\nFour\n")
    second.write_text("Five\n", encoding="utf-8")
    # One sentence per line (no splitting inside a line); blank lines and files end documents.
    assert read_documents([str(first), str(second)]) == [["One. Two.", "Three"], ["Four"], ["Five"]]
    assert read_documents(str(tmp_path / "*.txt")) == [["One. Two.", "Three"], ["Four"], ["Five"]]


def test_read_documents_invalid_utf8_becomes_replacement_character(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"caf\xe9 ok\n\nfine \xff\xfe end\n")
    assert read_documents(str(path)) == [["caf\ufffd ok"], ["fine \ufffd\ufffd end"]]


def test_split_sentences():
    assert split_sentences(" It rained . The match was delayed ! Why ? 3 @.@ 5 m .") == [
        "It rained .",
        "The match was delayed !",
        "Why ?",
        "3 @.@ 5 m .",
    ]
    assert split_sentences("   ") == []


@pytest.mark.skipif(not DATA_DIR.is_dir(), reason="shared data folder not present")
def test_read_documents_real_files():
    sample = read_documents(str(DATA_DIR / "bert_sample_text" / "sample_text.txt"))
    assert [len(doc) for doc in sample] == [3, 13, 15]  # 3 documents, 31 sentence lines
    wiki_path = DATA_DIR / "wikitext-2-raw" / "wiki.valid.raw"
    wiki = read_documents(str(wiki_path))
    assert len(wiki) == 60  # WikiText-2 valid holds 60 articles
    # Sentence splitting loses no text: the words of all non-heading lines are kept, in order.
    lines = wiki_path.read_text(encoding="utf-8").split("\n")
    body_words = [w for line in lines if not line.strip().startswith("=") for w in line.split()]
    assert [w for doc in wiki for s in doc for w in s.split()] == body_words


# ---------------------------------------------------------------------------------------------
# Structure, layout and pairing.
# ---------------------------------------------------------------------------------------------
def test_output_structure(nsp_batches):
    n = len(nsp_batches["y/nsp"])
    assert n > 2500
    expected = {
        "x/token_ids": ((n, SEQ_LEN), np.int32),
        "x/segment_ids": ((n, SEQ_LEN), np.int32),
        "x/padding_mask": ((n, SEQ_LEN), np.int32),
        "x/mask_positions": ((n, MAX_PRED), np.int32),
        "y/mlm": ((n, MAX_PRED), np.int32),
        "y/nsp": ((n,), np.int32),
        "sw/mlm": ((n, MAX_PRED), np.float32),
        "sw/nsp": ((n,), np.float32),
    }
    assert {k: (v.shape, v.dtype) for k, v in nsp_batches.items()} == expected
    np.testing.assert_array_equal(nsp_batches["sw/nsp"], 1.0)
    assert set(np.unique(nsp_batches["y/nsp"])) == {0, 1}


def test_segment_layout_and_pairs_come_from_the_documents(nsp_batches, corpus):
    _check_pairs(nsp_batches, corpus)


def _check_pairs(nsp_batches, corpus):
    original = _rebuild(nsp_batches)
    streams = corpus["streams"]
    for row in range(len(original)):
        tokens, segments = original[row], nsp_batches["x/segment_ids"][row]
        mask = nsp_batches["x/padding_mask"][row]
        length = int(mask.sum())
        np.testing.assert_array_equal(mask, np.arange(SEQ_LEN) < length)
        assert np.all(tokens[length:] == PAD)
        seps = np.flatnonzero(tokens[:length] == SEP)
        assert tokens[0] == CLS and len(seps) == 2 and seps[1] == length - 1
        a, b = tokens[1 : seps[0]], tokens[seps[0] + 1 : seps[1]]
        assert len(a) >= 1 and len(b) >= 1 and len(a) + len(b) <= SEQ_LEN - 3
        assert not np.isin(np.concatenate([a, b]), [PAD, CLS, SEP, MASK]).any()
        expected_segments = np.zeros(SEQ_LEN, np.int32)
        expected_segments[seps[0] + 1 : length] = 1
        np.testing.assert_array_equal(segments, expected_segments)
        # A and B are runs of real document text: B follows A in the same document for IsNext
        # (a gap only where truncation removed tokens), B comes from another document otherwise.
        a_text, b_text = _encode(a), _encode(b)
        docs_a = [d for d, s in enumerate(streams) if a_text in s]
        docs_b = [d for d, s in enumerate(streams) if b_text in s]
        assert docs_a and docs_b
        if nsp_batches["y/nsp"][row] == 0:
            follows = False
            for d in docs_a:
                start = streams[d].find(a_text)
                while start >= 0 and not follows:
                    b_start = streams[d].find(b_text, start + len(a))
                    follows = 0 <= b_start - (start + len(a)) <= 40
                    start = streams[d].find(a_text, start + 1)
            assert follows, f"IsNext example {row}: B does not follow A"
        else:
            assert any(da != db for da in docs_a for db in docs_b), f"NotNext example {row}"


def test_not_next_rate(corpus, tokenizer, nsp_batches):
    # Full-length targets: 50 % NotNext, plus the few chunks of a single sentence (at document
    # ends), which always take a random next sentence.
    full_length = _collect(
        _build(corpus, tokenizer, short_seq_prob=0.0, batch_size=128, dupe_factor=10)
    )
    assert len(full_length["y/nsp"]) > 2500
    assert abs(full_length["y/nsp"].mean() - 0.5) <= 0.06
    # The reference draws a short target once per document; in a short-target document most
    # chunks hold one sentence and are NotNext, so the default rate is a few points higher.
    assert 0.5 < nsp_batches["y/nsp"].mean() < 0.6


def test_short_sequences(corpus, tokenizer):
    def mean_length(short_seq_prob):
        batches = _collect(
            pretraining_dataset(
                corpus["path"],
                tokenizer,
                sequence_length=SEQ_LEN,
                max_predictions=MAX_PRED,
                short_seq_prob=short_seq_prob,
                batch_size=128,
                seed=0,
            )
        )
        return batches["x/padding_mask"].sum(axis=1).mean()

    full, short = mean_length(0.0), mean_length(1.0)
    # Targets uniform in [2, 61] average ~31 tokens (plus the overshoot of the last sentence).
    assert full > 52 and short < 0.8 * full


# ---------------------------------------------------------------------------------------------
# Masking statistics.
# ---------------------------------------------------------------------------------------------
def test_prediction_counts_positions_and_labels(nsp_batches):
    original = _rebuild(nsp_batches)
    positions, weights = nsp_batches["x/mask_positions"], nsp_batches["sw/mlm"]
    labels = nsp_batches["y/mlm"]
    assert set(np.unique(weights)) <= {0.0, 1.0}
    lengths = nsp_batches["x/padding_mask"].sum(axis=1)
    capped = 0
    for row in range(len(original)):
        count = int(weights[row].sum())
        num_candidates = int(lengths[row]) - 3  # all but [CLS] and two [SEP]
        assert count == _expected_predictions(num_candidates)
        capped += count == MAX_PRED and round(num_candidates * MASK_RATE) > MAX_PRED
        np.testing.assert_array_equal(weights[row], np.arange(MAX_PRED) < count)
        real = positions[row, :count]
        assert np.all(np.diff(real) > 0)  # ascending, no duplicates
        np.testing.assert_array_equal(positions[row, count:], 0)
        np.testing.assert_array_equal(labels[row, count:], 0)
        assert np.all(real < lengths[row])
        assert not np.isin(original[row, real], [CLS, SEP, PAD]).any()
    assert 0 < capped < len(original)  # both sides of the max_predictions cap are exercised


@pytest.mark.parametrize("whole_word_masking", [False, True], ids=["tokens", "whole_words"])
def test_rows_with_few_or_no_candidates_mask_one_or_none(tokenizer, whole_word_masking):
    """BERT's count, `min(max_predictions, max(1, round(0.15 * candidates)))`: a row of one to
    three maskable tokens (0.15 x 3 rounds to 0) still masks one; a row with none ([CLS] and
    its [SEP]s only) masks nothing and keeps its special tokens."""
    from kbert.data.masking import DynamicMasker

    masker = DynamicMasker(
        tokenizer,
        max_predictions=4,
        mask_rate=MASK_RATE,
        whole_word_masking=whole_word_masking,
        random_token_rate=0.1,
        unchanged_rate=0.1,
        nsp=False,
    )
    word = STEM_IDS[0]
    rows = [[CLS, SEP, SEP], [CLS, SEP], [CLS, word, SEP], [CLS, word, word, word, SEP, SEP]]
    length = 8
    token_ids = np.array([row + [PAD] * (length - len(row)) for row in rows], "int32")
    lengths = np.array([len(row) for row in rows], "int32")
    for seed in range(5):
        x, y, weights = masker(
            tf.constant(token_ids),
            tf.zeros_like(token_ids),
            tf.constant(lengths),
            tf.zeros(len(rows), tf.int32),
            tf.constant([seed, 0], tf.int64),
        )
        counts = weights["mlm"].numpy().sum(axis=1)
        np.testing.assert_array_equal(counts, [0, 0, 1, 1])
        masked = x["token_ids"].numpy()
        np.testing.assert_array_equal(masked[:2], token_ids[:2])  # nothing to mask: unchanged
        for row in (2, 3):
            position = int(x["mask_positions"].numpy()[row, 0])
            assert token_ids[row, position] == word  # a word, never a special token
            assert int(y["mlm"].numpy()[row, 0]) == word


def test_replacement_rates_80_10_10(nsp_batches):
    rows, slots = np.nonzero(nsp_batches["sw/mlm"])
    positions = nsp_batches["x/mask_positions"][rows, slots]
    shown = nsp_batches["x/token_ids"][rows, positions]
    labels = nsp_batches["y/mlm"][rows, slots]
    assert len(shown) > 20000
    masked = np.mean(shown == MASK)
    unchanged = np.mean(shown == labels)
    replaced = shown[(shown != MASK) & (shown != labels)]
    assert abs(masked - 0.8) <= 0.03
    assert abs(unchanged - 0.1) <= 0.03
    assert abs(len(replaced) / len(shown) - 0.1) <= 0.03
    # Random replacements: never a special token, spread over the whole vocabulary.
    assert not np.isin(replaced, [PAD, UNK, CLS, SEP, MASK]).any()
    assert len(np.unique(replaced)) > 0.9 * (len(VOCAB) - 5)


def test_masked_positions_are_spread_uniformly(nsp_batches):
    # Each candidate is equally likely to be chosen: the share of predictions landing in A
    # matches A's share of the candidates.
    original = _rebuild(nsp_batches)
    in_a = candidates_a = candidates = predictions = 0
    for row in range(len(original)):
        first_sep = int(np.flatnonzero(original[row] == SEP)[0])
        count = int(nsp_batches["sw/mlm"][row].sum())
        in_a += int(np.sum(nsp_batches["x/mask_positions"][row, :count] < first_sep))
        candidates_a += first_sep - 1
        candidates += int(nsp_batches["x/padding_mask"][row].sum()) - 3
        predictions += count
    assert abs(in_a / predictions - candidates_a / candidates) < 0.02


def test_custom_rates_and_no_nsp(corpus, tokenizer):
    batches = _collect(
        pretraining_dataset(
            corpus["path"],
            tokenizer,
            sequence_length=32,
            max_predictions=29,
            mask_rate=0.5,
            nsp=False,
            random_token_rate=0.0,
            unchanged_rate=0.3,
            batch_size=128,
            seed=5,
        )
    )
    assert "y/nsp" not in batches and "sw/nsp" not in batches
    np.testing.assert_array_equal(batches["x/segment_ids"], 0)
    original = _rebuild(batches)
    lengths = batches["x/padding_mask"].sum(axis=1)
    for row in range(len(original)):
        assert original[row, 0] == CLS and original[row, lengths[row] - 1] == SEP
        assert np.sum(original[row, : lengths[row]] == SEP) == 1
        text = original[row, 1 : lengths[row] - 1]
        assert any(_encode(text) in s for s in corpus["streams"])
        count = int(batches["sw/mlm"][row].sum())
        assert count == _expected_predictions(int(lengths[row]) - 2, 0.5, 29)
    rows, slots = np.nonzero(batches["sw/mlm"])
    shown = batches["x/token_ids"][rows, batches["x/mask_positions"][rows, slots]]
    labels = batches["y/mlm"][rows, slots]
    assert np.all((shown == MASK) | (shown == labels))  # no random replacement at rate 0
    assert abs(np.mean(shown == labels) - 0.3) <= 0.03


# ---------------------------------------------------------------------------------------------
# Whole-word masking.
# ---------------------------------------------------------------------------------------------
def _words(tokens, length):
    """Index lists of the words (a piece and its "##" pieces) of one unmasked sequence."""
    words = []
    for i in range(length):
        if tokens[i] in (CLS, SEP):
            continue
        if IS_CONTINUATION[tokens[i]] and words and words[-1][-1] == i - 1:
            words[-1].append(i)
        else:
            words.append([i])
    return words


def test_whole_word_masking(corpus, tokenizer):
    batches = _collect(
        pretraining_dataset(
            corpus["path"],
            tokenizer,
            sequence_length=SEQ_LEN,
            max_predictions=MAX_PRED,
            whole_word_masking=True,
            batch_size=128,
            seed=9,
            dupe_factor=3,
        )
    )
    original = _rebuild(batches)
    lengths = batches["x/padding_mask"].sum(axis=1)
    full = multi_piece_chosen = 0
    for row in range(len(original)):
        count = int(batches["sw/mlm"][row].sum())
        chosen = set(batches["x/mask_positions"][row, :count].tolist())
        budget = _expected_predictions(int(lengths[row]) - 3)
        assert 1 <= count <= budget
        full += count == budget
        for word in _words(original[row], int(lengths[row])):
            taken = [i in chosen for i in word]
            assert all(taken) or not any(taken), f"row {row}: word {word} partly masked"
            if not any(taken):
                # Greedy with skipping: a word is left out only when it does not fit.
                assert len(word) > budget - count
            elif len(word) > 1:
                multi_piece_chosen += 1
    assert full / len(original) > 0.9
    assert multi_piece_chosen > 200


# ---------------------------------------------------------------------------------------------
# Determinism and dynamic masking.
# ---------------------------------------------------------------------------------------------
def _build(corpus, tokenizer, **kwargs):
    args = dict(sequence_length=SEQ_LEN, max_predictions=MAX_PRED, batch_size=32, seed=1)
    args.update(kwargs)
    return pretraining_dataset(corpus["path"], tokenizer, **args)


def _assert_same(first, second):
    assert first.keys() == second.keys()
    for key in first:
        np.testing.assert_array_equal(first[key], second[key], err_msg=key)


@pytest.mark.parametrize("whole_word_masking", [False, True])
def test_same_seed_same_batches(corpus, tokenizer, whole_word_masking):
    first = _collect(_build(corpus, tokenizer, whole_word_masking=whole_word_masking))
    second = _collect(_build(corpus, tokenizer, whole_word_masking=whole_word_masking))
    _assert_same(first, second)
    other = _collect(_build(corpus, tokenizer, seed=2, whole_word_masking=whole_word_masking))
    assert not np.array_equal(first["x/token_ids"][:32], other["x/token_ids"][:32])


def test_each_pass_draws_new_masks_on_the_same_text(tmp_path, tokenizer):
    # Documents shorter than the target give one fixed, untruncated example each, so every pass
    # holds the same text and only the masks can change.
    documents, text = _make_corpus(40, (2, 3), (2, 4), seed=4)
    path = tmp_path / "short.txt"
    path.write_text(text, encoding="utf-8")
    per_pass = len(documents)

    def passes(dataset, count):
        batches = _collect(dataset, max_batches=count * per_pass // 8)
        return [
            {k: v[i * per_pass : (i + 1) * per_pass] for k, v in batches.items()}
            for i in range(count)
        ]

    kwargs = dict(
        sequence_length=SEQ_LEN,
        max_predictions=MAX_PRED,
        nsp=False,
        short_seq_prob=0.0,
        shuffle=False,
        batch_size=8,
        seed=0,
    )
    repeated = pretraining_dataset(str(path), tokenizer, repeat=True, **kwargs)
    first, second = passes(repeated, 2)
    rebuilt = _rebuild(first)
    np.testing.assert_array_equal(rebuilt, _rebuild(second))
    every_token = [t for doc in documents for sentence in doc for t in sentence]
    np.testing.assert_array_equal(rebuilt[rebuilt > MASK], every_token)
    changed = [
        not np.array_equal(a[w > 0], b[w > 0])
        for a, b, w in zip(first["x/mask_positions"], second["x/mask_positions"], first["sw/mlm"])
    ]
    assert np.mean(changed) > 0.6

    # Iterating a finite dataset again (the next epoch of fit) is the next pass, with the
    # same masks as the second pass of a repeated dataset built with the same seed.
    finite = pretraining_dataset(str(path), tokenizer, **kwargs)
    epoch_1, epoch_2 = passes(finite, 1)[0], passes(finite, 1)[0]
    _assert_same(epoch_1, first)
    _assert_same(epoch_2, second)


# ---------------------------------------------------------------------------------------------
# Bad input.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(sequence_length=7), "sequence_length"),
        (dict(sequence_length=32, max_predictions=30), "max_predictions"),
        (dict(max_predictions=0), "max_predictions"),
        (dict(mask_rate=1.5), "mask_rate"),
        (dict(mask_rate=-0.1), "mask_rate"),
        (dict(short_seq_prob=2.0), "short_seq_prob"),
        (dict(random_token_rate=0.6, unchanged_rate=0.5), "random_token_rate \\+ unchanged_rate"),
        (dict(unchanged_rate=-0.2), "unchanged_rate"),
        (dict(batch_size=0), "batch_size"),
        (dict(dupe_factor=0), "dupe_factor"),
        (dict(seed=-1), "seed"),
        (dict(text_format="html"), "text_format"),
    ],
)
def test_bad_arguments(corpus, tokenizer, kwargs, message):
    with pytest.raises(ValueError, match=message):
        pretraining_dataset(corpus["path"], tokenizer, **kwargs)


def test_max_predictions_limit_depends_on_nsp(corpus, tokenizer):
    # Without NSP a sequence has one [SEP] less, so one more maskable position.
    pretraining_dataset(
        corpus["path"], tokenizer, sequence_length=32, max_predictions=30, nsp=False
    )
    with pytest.raises(ValueError, match="sequence_length - 3 = 29"):
        pretraining_dataset(corpus["path"], tokenizer, sequence_length=32, max_predictions=30)


def test_bad_files(tmp_path, tokenizer):
    with pytest.raises(ValueError, match="No file matches"):
        pretraining_dataset(str(tmp_path / "missing.txt"), tokenizer)
    with pytest.raises(ValueError, match="No file matches"):
        pretraining_dataset(str(tmp_path / "*.nothing"), tokenizer)
    with pytest.raises(ValueError, match="at least one file"):
        pretraining_dataset([], tokenizer)
    with pytest.raises(ValueError, match="directory"):
        pretraining_dataset(str(tmp_path), tokenizer)
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n\t\n", encoding="utf-8")
    for files in (str(empty), [str(empty), str(blank)], str(blank)):
        with pytest.raises(ValueError, match="empty.txt' is empty|blank.txt' is empty"):
            pretraining_dataset(files, tokenizer)
    binary = tmp_path / "weights.bin"
    binary.write_bytes(b"\x89HDF\r\n\x1a\n\x00\x00\x00\x01" * 10)
    with pytest.raises(ValueError, match="weights.bin' is binary"):
        pretraining_dataset(str(binary), tokenizer)


def test_text_in_another_encoding_warns_and_utf8_does_not(tmp_path, tokenizer):
    stem = VOCAB[10]
    latin = tmp_path / "latin.txt"
    latin.write_bytes(f"{stem} caf\xe9 .\n\n{stem} na\xefve .\n".encode("latin-1"))
    with pytest.warns(
        UserWarning, match=r"latin.txt' is not valid UTF-8: byte 0xe9 at offset \d+.*iconv"
    ):
        pretraining_dataset(str(latin), tokenizer, sequence_length=16, max_predictions=3)
    # UTF-8 whose two-byte character straddles the end of the 64 KiB probe: no warning.
    line = (stem + " ") * 20 + ".\n\n"
    text = line * (65536 // len(line))
    text += "x" * (65535 - len(text.encode("utf-8"))) + "\u00e9 " + stem + " .\n"
    assert text.encode("utf-8")[65535:65537] == "\u00e9".encode("utf-8")
    clean = tmp_path / "clean.txt"
    clean.write_text(text, encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pretraining_dataset(str(clean), tokenizer, sequence_length=16, max_predictions=3)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_processes=2, process_index=2), "process_index=2, num_processes=2"),
        (dict(num_processes=2, process_index=-1), "process_index"),
        (dict(num_processes=0, process_index=0), "num_processes"),
        (dict(num_processes=2), "Pass both"),
    ],
)
def test_bad_process_split(corpus, tokenizer, kwargs, message):
    with pytest.raises(ValueError, match=message):
        pretraining_dataset(corpus["path"], tokenizer, **kwargs)


def test_bad_tokenizer(corpus):
    with pytest.raises(ValueError, match="Missing: .*mask_token_id"):
        pretraining_dataset(corpus["path"], object())


def test_single_document(tmp_path, tokenizer):
    documents, text = _make_corpus(1, (30, 30), (3, 8), seed=2)
    path = tmp_path / "one.txt"
    path.write_text(text.strip() + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="at least two documents"):
        pretraining_dataset(str(path), tokenizer)
    batches = _collect(
        pretraining_dataset(
            str(path),
            tokenizer,
            sequence_length=32,
            max_predictions=5,
            nsp=False,
            seed=0,
            dupe_factor=3,
        )
    )
    assert len(batches["y/mlm"]) >= 10
    stream = _encode(np.concatenate(documents[0]))
    for row, tokens in enumerate(_rebuild(batches)):
        length = int(batches["x/padding_mask"][row].sum())
        assert _encode(tokens[1 : length - 1]) in stream


def test_invalid_utf8_short_and_empty_documents(tmp_path, tokenizer):
    # A document of one short sentence, undecodable bytes, an empty file and a huge sentence:
    # nothing crashes and every example is well formed.
    stem = VOCAB[10]
    path = tmp_path / "odd.txt"
    path.write_bytes(
        f"{stem}\n\n{stem} \xff\xfe {stem} .\n\n".encode("latin-1")
        + ((stem + " ") * 200 + ".\n").encode("utf-8")
        + f"\n{stem} {stem} .\n".encode()
    )
    with pytest.warns(UserWarning, match=r"odd.txt' is not valid UTF-8: byte 0xff at offset"):
        dataset = pretraining_dataset(
            [str(path)],
            tokenizer,
            sequence_length=16,
            max_predictions=3,
            batch_size=4,
            seed=0,
            dupe_factor=5,
        )
    batches = _collect(dataset)
    original = _rebuild(batches)
    lengths = batches["x/padding_mask"].sum(axis=1)
    assert len(original) >= 10 and lengths.max() == 16
    for row, tokens in enumerate(original):
        assert tokens[0] == CLS and np.sum(tokens == SEP) == 2 and tokens[lengths[row] - 1] == SEP


# ---------------------------------------------------------------------------------------------
# Streaming: a bounded document buffer, shards, several processes.
# ---------------------------------------------------------------------------------------------
def test_nsp_statistics_hold_with_a_small_document_buffer(corpus, tokenizer):
    # The random next sentence comes from a buffer of 4 documents (plus the 4 used last) instead
    # of the whole corpus: still half IsNext, and NotNext segments come from another document.
    batches = _collect(
        _build(
            corpus,
            tokenizer,
            short_seq_prob=0.0,
            batch_size=128,
            dupe_factor=6,
            document_buffer=4,
            example_buffer=64,
        )
    )
    assert len(batches["y/nsp"]) > 1500
    assert abs(batches["y/nsp"].mean() - 0.5) <= 0.06
    _check_pairs(batches, corpus)
    # The "other" documents are spread over the corpus, not stuck on a few.
    original = _rebuild(batches)
    sources = set()
    for row in np.flatnonzero(batches["y/nsp"] == 1):
        tokens = original[row]
        seps = np.flatnonzero(tokens == SEP)
        b_text = _encode(tokens[seps[0] + 1 : seps[1]])
        sources.update(d for d, s in enumerate(corpus["streams"]) if b_text in s)
    assert len(sources) >= 45


def _whole_documents(dataset_kwargs, files, tokenizer):
    """Each document of the files as one row (nsp=False, long rows): the rows' token strings."""
    batches = _collect(
        pretraining_dataset(
            files,
            tokenizer,
            sequence_length=512,
            max_predictions=4,
            nsp=False,
            short_seq_prob=0.0,
            batch_size=16,
            seed=0,
            **dataset_kwargs,
        )
    )
    original = _rebuild(batches)
    lengths = batches["x/padding_mask"].sum(axis=1)
    return [_encode(row[1 : n - 1]) for row, n in zip(original, lengths)]


@pytest.fixture(scope="module")
def shards(corpus, tokenizer, tmp_path_factory):
    from kbert.data.shards import write_pretraining_shards

    folder = tmp_path_factory.mktemp("shards")
    return write_pretraining_shards(
        corpus["path"], tokenizer, str(folder), num_shards=5, verbose=False
    )


def test_shards_hold_the_tokenized_documents(corpus, tokenizer, shards, tmp_path):
    rows = _whole_documents({}, shards, tokenizer)
    assert sorted(rows) == sorted(corpus["streams"])
    # One shard gives the very batches of the text it was made from (same seed).
    from kbert.data.shards import write_pretraining_shards

    (single,) = write_pretraining_shards(
        corpus["path"], tokenizer, str(tmp_path), num_shards=1, verbose=False
    )
    _assert_same(
        _collect(_build(corpus, tokenizer)),
        _collect(
            pretraining_dataset(
                single,
                tokenizer,
                sequence_length=SEQ_LEN,
                max_predictions=MAX_PRED,
                batch_size=32,
                seed=1,
            )
        ),
    )


@pytest.mark.parametrize("kind", ["shards", "text"])
def test_two_processes_read_disjoint_parts_that_cover_the_corpus(corpus, tokenizer, shards, kind):
    files = shards if kind == "shards" else corpus["path"]  # One text file: split by documents.
    parts = [
        _whole_documents(dict(num_processes=2, process_index=i), files, tokenizer) for i in range(2)
    ]
    assert parts[0] and parts[1]
    assert not set(parts[0]) & set(parts[1])
    assert sorted(parts[0] + parts[1]) == sorted(corpus["streams"])


def test_shards_of_another_vocabulary_are_refused(shards, tmp_path):
    from kbert.data.shards import vocabulary_digest

    other = BertTokenizer(VOCAB[:-1] + ["##est"])
    with pytest.raises(
        ValueError,
        match=(f"digest {vocabulary_digest(VOCAB)}.*digest {vocabulary_digest(other.vocabulary)}"),
    ):
        pretraining_dataset(shards, other)
    text = tmp_path / "text.txt"
    text.write_text("a b .\n", encoding="utf-8")
    with pytest.raises(ValueError, match="mixes pretraining shards"):
        pretraining_dataset([shards[0], str(text)], BertTokenizer(VOCAB))
    bogus = tmp_path / "bogus.tfrecord"
    bogus.write_bytes(b"not a record")
    with pytest.raises(ValueError, match="bogus.tfrecord"):
        pretraining_dataset(str(bogus), BertTokenizer(VOCAB))


def test_prepare_pretraining_data_tool(corpus, tmp_path, capsys):
    import importlib.util

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    path = Path(__file__).resolve().parents[2] / "tools" / "prepare_pretraining_data.py"
    spec = importlib.util.spec_from_file_location("prepare_pretraining_data", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    written = tool.main(
        [
            "--vocab",
            str(vocab),
            "--output-dir",
            str(tmp_path / "out"),
            "--num-shards",
            "3",
            corpus["path"],
        ]
    )
    assert len(written) == 3 and "Wrote 50 documents" in capsys.readouterr().out
    rows = _whole_documents({}, written, BertTokenizer(VOCAB))
    assert sorted(rows) == sorted(corpus["streams"])
    with pytest.raises(SystemExit, match="No file matches"):
        tool.main(
            [
                "--vocab",
                str(vocab),
                "--output-dir",
                str(tmp_path / "x"),
                str(tmp_path / "*.nothing"),
            ]
        )


# ---------------------------------------------------------------------------------------------
# The vectorized pieces against the one-token-at-a-time reference.
# ---------------------------------------------------------------------------------------------
def _reference_truncated_lengths(length_a, length_b, max_num_tokens):
    # google-research/bert truncate_seq_pair: remove from the longer (B on a tie) until it fits.
    while length_a + length_b > max_num_tokens:
        if length_a > length_b:
            length_a -= 1
        else:
            length_b -= 1
    return length_a, length_b


def test_truncated_lengths_equal_longest_first_one_token_at_a_time():
    from kbert.data.nsp import truncated_lengths

    for max_num_tokens in (5, 6, 61, 62):
        for length_a in range(1, 90):
            for length_b in range(1, 90):
                assert truncated_lengths(length_a, length_b, max_num_tokens) == (
                    _reference_truncated_lengths(length_a, length_b, max_num_tokens)
                ), (length_a, length_b, max_num_tokens)


def test_front_cut_is_binomial_like_one_coin_per_removed_token():
    from math import comb

    from kbert.data.nsp import front_cut

    rng = random.Random(0)
    assert front_cut(0, rng) == 0
    draws = np.array([front_cut(10, rng) for _ in range(40000)])
    assert draws.min() >= 0 and draws.max() <= 10
    observed = np.bincount(draws, minlength=11) / len(draws)
    expected = np.array([comb(10, k) / 2**10 for k in range(11)])
    np.testing.assert_allclose(observed, expected, atol=0.008)


def test_truncation_cuts_both_ends_of_long_segments(tmp_path, tokenizer):
    # Sentences far longer than the sequence: every pair is truncated, and the kept part of a
    # segment starts anywhere (front cuts) and ends anywhere (back cuts) in its sentence.
    rng = random.Random(5)
    documents = [[[rng.choice(STEM_IDS) for _ in range(120)] for _ in range(3)] for _ in range(6)]
    path = tmp_path / "long.txt"
    path.write_text(
        "\n\n".join("\n".join(" ".join(VOCAB[t] for t in s) for s in d) for d in documents),
        encoding="utf-8",
    )
    batches = _collect(
        pretraining_dataset(
            str(path),
            tokenizer,
            sequence_length=32,
            max_predictions=4,
            batch_size=64,
            seed=2,
            dupe_factor=20,
            short_seq_prob=0.0,
        )
    )
    original = _rebuild(batches)
    sentences = [_encode(s) for d in documents for s in d]
    starts, ends = [], []
    for tokens in original:
        seps = np.flatnonzero(tokens == SEP)
        for piece in (tokens[1 : seps[0]], tokens[seps[0] + 1 : seps[1]]):
            text = _encode(piece)
            (sentence,) = [s for s in sentences if text in s]
            starts.append(sentence.index(text))
            ends.append(len(sentence) - sentence.index(text) - len(text))
    lengths = batches["x/padding_mask"].sum(axis=1)
    assert (lengths == 32).all()
    # About half the cut tokens come from each end.
    assert 0.4 < np.sum(starts) / (np.sum(starts) + np.sum(ends)) < 0.6


def test_corrupt_shard_record_is_refused(tmp_path, tokenizer):
    from kbert.data.shard_records import ShardWriter, read_shard_flat_documents

    path = str(tmp_path / "bad.tfrecord")
    writer = ShardWriter(path, tokenizer)
    writer.write_flat(np.array([7, 8, 9], np.int32), [2, 1])
    with pytest.raises(ValueError, match="add up to the number of ids"):
        writer.write_flat(np.array([7, 8, 9], np.int32), [2, 2])
    writer.close()
    assert [(list(i), list(n)) for i, n in read_shard_flat_documents(path)] == [([7, 8, 9], [2, 1])]
    metadata = next(iter(tf.data.TFRecordDataset(path))).numpy()
    # Lengths that miss the ids' count, or add up to it with a sentence of negative length.
    for lengths in ([5], [4, -1]):
        document = _example(
            token_ids=np.array([7, 8, 9], "<i4").tobytes(),
            sentence_lengths=np.array(lengths, "<i4").tobytes(),
        )
        corrupt = _write_records(tmp_path / "corrupt.tfrecord", metadata, document)
        with pytest.raises(ValueError, match="corrupt.tfrecord.*corrupt document record"):
            list(read_shard_flat_documents(corrupt))


def _example(**features):
    """A serialised `tf.train.Example` of bytes features (name -> bytes)."""
    feature = {
        name: tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
        for name, value in features.items()
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _write_records(path, *records):
    with tf.io.TFRecordWriter(str(path)) as raw:
        for record in records:
            raw.write(record)
    return str(path)


def test_shard_writer_skips_empty_parts_and_files_that_are_not_shards_are_named(
    tmp_path, tokenizer
):
    """Empty sentences, zero lengths and empty documents are not written; an empty, truncated
    or oversized first record, metadata that is not an object and another format are refused
    with what the file is."""
    import struct

    from kbert.data.shard_records import (
        SHARD_FORMAT,
        ShardWriter,
        read_shard_documents,
        read_shard_flat_documents,
        read_shard_metadata,
    )

    path = tmp_path / "good.tfrecord"
    writer = ShardWriter(path, tokenizer)
    writer.write([[5, 6], [], [7]])
    writer.write([[], []])
    writer.write_flat([8, 9, 10], [0, 2, 0, 1])
    writer.write_flat([], [0])
    writer.close()
    assert writer.num_documents == 2
    documents = [[s.tolist() for s in d] for d in read_shard_documents(str(path))]
    assert documents == [[[5, 6], [7]], [[8, 9], [10]]]
    assert list(read_shard_flat_documents([])) == []
    metadata = read_shard_metadata(str(path))
    assert (metadata["format"], metadata["vocabulary_size"]) == (
        SHARD_FORMAT,
        len(tokenizer.vocabulary),
    )
    good = path.read_bytes()
    bad = tmp_path / "bad.tfrecord"
    for data, message in (
        (b"", "bad.tfrecord' is empty"),
        (good[:5], r"not a readable TFRecord shard \(truncated record header\)"),
        (good[:20], r"not a readable TFRecord shard \(truncated record\)"),
        (struct.pack("<Q", 1 << 40) + good[8:], "larger than any shard metadata"),
    ):
        bad.write_bytes(data)
        with pytest.raises(ValueError, match=message):
            read_shard_metadata(str(bad))
    for value, message in (
        (b"[1]", "not a kbert pretraining shard"),
        (b'{"format": "v0"}', "has format 'v0'"),
    ):
        with pytest.raises(ValueError, match=message):
            read_shard_metadata(_write_records(bad, _example(kbert_shard=value)))
