"""Tests of kbert.data.packing: whole documents packed into rows, with per-row dynamic masking.

The corpus is generated from known token ids (the synthetic vocabulary of test_pretraining), so
every packed row can be traced back to the documents it came from without trusting the code
under test.
"""

import random
from pathlib import Path

import numpy as np
import pytest

from kbert.data import packed_pretraining_dataset
from kbert.data.packing import pack_pieces
from kbert.text import BertTokenizer
from tests.data.test_pretraining import (
    CLS,
    MASK,
    PAD,
    SEP,
    UNK,
    VOCAB,
    _collect,
    _make_corpus,
    _rebuild,
)

pytestmark = pytest.mark.backend_independent

SEQ_LEN = 64
MAX_PRED = 10


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    # Documents of 3 to 79 tokens (mean 37): most fit a row of 64, 9 need two.
    documents, text = _make_corpus(80, (1, 10), (2, 5), seed=5)
    path = tmp_path_factory.mktemp("packing") / "corpus.txt"
    path.write_text(text, encoding="utf-8")
    tokens = [[t for sentence in document for t in sentence] for document in documents]
    return {"path": str(path), "tokens": tokens}


def _dataset(files, tokenizer, **settings):
    """`packed_pretraining_dataset` with these tests' row length, predictions and batch."""
    settings = {
        "sequence_length": SEQ_LEN,
        "max_predictions": MAX_PRED,
        "batch_size": 8,
        **settings,
    }
    return packed_pretraining_dataset(files, tokenizer, **settings)


@pytest.fixture(scope="module")
def tokenizer():
    return BertTokenizer(VOCAB)


def _expected_pieces(tokens, sequence_length=SEQ_LEN):
    step = sequence_length - 2
    return [
        tuple(document[start : start + step])
        for document in tokens
        for start in range(0, len(document), step)
    ]


def _row_pieces(batch):
    """(pieces in emission order, per-row list of (start, stop) of each document run)."""
    original = _rebuild(batch)
    pieces, runs = [], []
    for row, documents in zip(original, batch["x/document_ids"]):
        row_runs = []
        k = int(documents.max())
        for d in range(1, k + 1):
            where = np.nonzero(documents == d)[0]
            start, stop = int(where[0]), int(where[-1]) + 1
            assert np.array_equal(where, np.arange(start, stop))  # contiguous
            assert row[start] == CLS and row[stop - 1] == SEP
            pieces.append(tuple(int(t) for t in row[start + 1 : stop - 1]))
            row_runs.append((start, stop))
        runs.append(row_runs)
    return pieces, runs


@pytest.fixture(scope="module")
def packed(corpus, tokenizer):
    dataset = _dataset(
        corpus["path"],
        tokenizer,
        seed=3,
        shuffle=False,
        packing_buffer=8,
    )
    return _collect(dataset)


def test_every_token_of_every_document_appears_once_in_order(packed, corpus):
    pieces, runs = _row_pieces(packed)
    expected = _expected_pieces(corpus["tokens"])
    assert sorted(pieces) == sorted(expected)  # every piece exactly once, tokens in order
    assert len(expected) > len(corpus["tokens"])  # some documents were split
    # Pieces of one document keep their order across rows (reading order, shuffle=False).
    emitted = {piece: i for i, piece in enumerate(pieces)}
    for document in corpus["tokens"]:
        order = [emitted[p] for p in _expected_pieces([document])]
        assert order == sorted(order)
    # Layout: documents numbered 1..k from the row start, padding after them.
    for row, row_runs, length, documents in zip(
        packed["x/token_ids"], runs, packed["x/padding_mask"].sum(1), packed["x/document_ids"]
    ):
        assert row_runs[0][0] == 0 and row_runs[-1][1] == length
        assert all(a[1] == b[0] for a, b in zip(row_runs, row_runs[1:]))
        assert (row[length:] == PAD).all() and (documents[length:] == 0).all()
    # Packing fills rows: several documents per row on average, little padding.
    assert np.mean([len(r) for r in runs]) > 1.5
    assert packed["x/padding_mask"].mean() > 0.85
    assert (packed["x/segment_ids"] == 0).all()


def test_unpacked_rows_hold_the_same_pieces_one_per_row(packed, corpus, tokenizer):
    unpacked = _collect(
        _dataset(
            corpus["path"],
            tokenizer,
            seed=3,
            shuffle=False,
            pack=False,
        )
    )
    pieces, runs = _row_pieces(unpacked)
    assert pieces == _expected_pieces(corpus["tokens"])
    assert all(len(r) == 1 for r in runs)
    assert unpacked["x/padding_mask"].sum() == packed["x/padding_mask"].sum()
    assert len(unpacked["x/token_ids"]) > 1.5 * len(packed["x/token_ids"])


def test_positions_restart_per_document(packed):
    from kbert.layers.embeddings import PackedDocumentMasks

    mask, positions = PackedDocumentMasks()(packed["x/document_ids"], packed["x/padding_mask"])
    mask, positions = np.asarray(mask), np.asarray(positions)
    _, runs = _row_pieces(packed)
    for r, row_runs in enumerate(runs):
        expected = np.zeros(SEQ_LEN, np.int64)
        allowed = np.zeros((SEQ_LEN, SEQ_LEN), bool)
        for start, stop in row_runs:
            expected[start:stop] = np.arange(stop - start)
            allowed[start:stop, start:stop] = True
        np.testing.assert_array_equal(positions[r], expected)
        np.testing.assert_array_equal(mask[r], allowed)


def test_prediction_counts_positions_and_untouched_tokens(packed):
    original = _rebuild(packed)
    real = packed["x/padding_mask"].astype(bool)
    candidates = real & ~np.isin(original, [CLS, SEP, PAD])
    counts = packed["sw/mlm"].sum(1)
    expected = [min(MAX_PRED, max(1, int(round(n * 0.15)))) for n in candidates.sum(1)]
    np.testing.assert_array_equal(counts, expected)
    rows, slots = np.nonzero(packed["sw/mlm"])
    positions = packed["x/mask_positions"][rows, slots]
    assert candidates[rows, positions].all()  # never [CLS], [SEP] or padding
    # Positions are distinct and ascending within a row.
    for r in range(len(counts)):
        chosen = packed["x/mask_positions"][r, : int(counts[r])]
        assert (np.diff(chosen) > 0).all()
    # Outside the masked positions, the rows are the documents' tokens unchanged.
    untouched = np.ones_like(real)
    untouched[rows, positions] = False
    np.testing.assert_array_equal(packed["x/token_ids"][untouched], original[untouched])


def test_whole_word_masking_never_crosses_a_document(corpus, tokenizer):
    from tests.data.test_pretraining import IS_CONTINUATION

    batch = _collect(
        _dataset(
            corpus["path"],
            tokenizer,
            seed=6,
            whole_word_masking=True,
        )
    )
    original = _rebuild(batch)
    real = batch["x/padding_mask"].astype(bool)
    candidates = real & ~np.isin(original, [CLS, SEP, PAD])
    chosen = np.zeros_like(real)
    rows, slots = np.nonzero(batch["sw/mlm"])
    chosen[rows, batch["x/mask_positions"][rows, slots]] = True
    assert candidates[chosen].all()
    counts = batch["sw/mlm"].sum(1)
    limits = [min(MAX_PRED, max(1, int(round(n * 0.15)))) for n in candidates.sum(1)]
    assert (counts <= limits).all() and counts.sum() > 0.8 * sum(limits)
    # Whole words: a chosen "##" piece has its word's previous piece chosen too. A word never
    # continues across [CLS]/[SEP], so never spans two documents (a "##" piece that opens a
    # document piece, where a long document was cut, starts a word of its own).
    previous_candidate = np.zeros_like(candidates)
    previous_candidate[:, 1:] = candidates[:, :-1]
    continuation = IS_CONTINUATION[original] & candidates & previous_candidate
    previous = np.zeros_like(chosen)
    previous[:, 1:] = chosen[:, :-1]
    assert (previous[chosen & continuation]).all()
    # And the continuation of a chosen piece is chosen.
    next_unchosen_continuation = np.zeros_like(chosen)
    next_unchosen_continuation[:, :-1] = continuation[:, 1:] & ~chosen[:, 1:]
    assert not (chosen & next_unchosen_continuation).any()


def test_replacement_rates_80_10_10(corpus, tokenizer):
    dataset = _dataset(
        corpus["path"],
        tokenizer,
        seed=4,
        repeat=True,
    )
    batch = _collect(dataset.take(40))  # about six passes
    rows, slots = np.nonzero(batch["sw/mlm"])
    positions = batch["x/mask_positions"][rows, slots]
    shown = batch["x/token_ids"][rows, positions]
    labels = batch["y/mlm"][rows, slots]
    assert len(shown) > 2000
    # Binomial standard deviations at n > 2000: below 0.009 (p = 0.8) and 0.007 (p = 0.1).
    assert abs(np.mean(shown == MASK) - 0.8) < 0.035
    assert abs(np.mean(shown == labels) - 0.1) < 0.03
    replaced = shown[(shown != MASK) & (shown != labels)]
    assert abs(len(replaced) / len(shown) - 0.1) < 0.03
    assert not np.isin(replaced, [PAD, UNK, CLS, SEP, MASK]).any()


def test_reproducible_given_the_seed_and_new_masks_each_pass(corpus, tokenizer):
    def build(seed):
        return _dataset(
            corpus["path"],
            tokenizer,
            seed=seed,
            repeat=True,
        )

    def take(dataset, n):
        batches = []
        for i, (x, y, _) in enumerate(dataset):
            if i == n:
                break
            batches.append({**{k: v.numpy() for k, v in x.items()}, "mlm": y["mlm"].numpy()})
        return batches

    first, again, other = take(build(1), 40), take(build(1), 40), take(build(2), 40)
    for a, b in zip(first, again):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    assert any(not np.array_equal(a["token_ids"], b["token_ids"]) for a, b in zip(first, other))
    # Two passes of one dataset: the same pieces (shuffle of files only; one file here),
    # different masks.
    rows_per_pass = len(
        _collect(
            _dataset(
                corpus["path"],
                tokenizer,
                seed=1,
            )
        )["x/token_ids"]
    )
    stream = np.concatenate([b["token_ids"] for b in first])
    assert len(stream) >= 2 * rows_per_pass
    pass0, pass1 = stream[:rows_per_pass], stream[rows_per_pass : 2 * rows_per_pass]
    # Every batch of the second pass has masks of its own (rows hold ~5 masked tokens each).
    for start in range(0, rows_per_pass, 8):
        assert (pass0[start : start + 8] != pass1[start : start + 8]).sum() > 8


def test_drop_remainder_leaves_out_each_pass_last_batch(corpus, tokenizer):
    def build(drop_remainder):
        return _dataset(
            corpus["path"],
            tokenizer,
            seed=1,
            shuffle=False,
            drop_remainder=drop_remainder,
        )

    every = [x["token_ids"].numpy() for x, _, _ in build(False)]
    full = [x["token_ids"].numpy() for x, _, _ in build(True)]
    assert len(every[-1]) < 8  # the corpus leaves a partial batch
    assert [len(b) for b in full] == [8] * (len(every) - 1)


def test_shards_give_the_same_pieces(corpus, tokenizer, tmp_path):
    from kbert.data.shards import write_pretraining_shards

    shards = write_pretraining_shards(
        corpus["path"], tokenizer, str(tmp_path), num_shards=3, verbose=False
    )
    batch = _collect(
        _dataset(
            shards,
            tokenizer,
            seed=0,
        )
    )
    pieces, _ = _row_pieces(batch)
    assert sorted(pieces) == sorted(_expected_pieces(corpus["tokens"]))


def test_each_pass_reads_the_files_in_a_new_order(corpus, tokenizer, tmp_path):
    # The corpus's documents over four files; one piece per row (pack=False) and one batch
    # per pass, so the rows of a pass follow the order the documents were read in.
    blocks = Path(corpus["path"]).read_text(encoding="utf-8").split("\n\n")
    files = []
    for index in range(4):
        path = tmp_path / f"part-{index}.txt"
        path.write_text("\n\n".join(blocks[index::4]), encoding="utf-8")
        files.append(str(path))
    expected = sorted(_expected_pieces(corpus["tokens"]))
    size = len(expected)
    dataset = _dataset(files, tokenizer, seed=4, pack=False, batch_size=size, repeat=True)
    pieces, _ = _row_pieces(_collect(dataset.take(3)))
    passes = [pieces[start : start + size] for start in range(0, 3 * size, size)]
    for one_pass in passes:
        assert sorted(one_pass) == expected  # every pass reads every document once
    assert passes[0] != passes[1] and passes[1] != passes[2]


def test_a_repeated_pass_without_a_full_batch_is_an_error(corpus, tokenizer):
    dataset = _dataset(
        corpus["path"], tokenizer, seed=0, batch_size=512, repeat=True, drop_remainder=True
    )
    # Raised in the generator (tf.data reports it as its own error, with this message)
    # instead of reading the files over and over for a batch that never comes.
    with pytest.raises(Exception, match=r"gives no batch.*batch_size=512"):
        next(iter(dataset))


def test_pack_pieces_first_fit_with_a_bounded_buffer():
    rng = random.Random(0)
    pieces = [np.arange(rng.randint(1, 30)) + 1000 * i for i in range(300)]
    for buffer in (1, 4, 64):
        rows = list(pack_pieces(iter(pieces), 32, buffer))
        flat = [p for row in rows for p in row]
        assert sorted(map(tuple, flat)) == sorted(map(tuple, pieces))
        assert all(sum(len(p) + 2 for p in row) <= 32 for row in rows)
    # A larger buffer packs at least as tightly; buffer 1 is next-fit.
    counts = [len(list(pack_pieces(iter(pieces), 32, b))) for b in (1, 4, 64)]
    assert counts[0] >= counts[1] >= counts[2]
    assert counts[2] <= 1.1 * sum(len(p) + 2 for p in pieces) / 32 + 1
    with pytest.raises(ValueError, match="does not fit a row of 8"):
        list(pack_pieces(iter([np.arange(7)]), 8, 4))


def _sized(*sizes):
    """Pieces that take `sizes` slots with [CLS] and [SEP], each a distinct token value."""
    return [np.full(size - 2, index) for index, size in enumerate(sizes)]


def _emitted(sizes, sequence_length, buffer):
    """The rows `pack_pieces` emits, in order, as lists of piece numbers."""
    rows = pack_pieces(iter(_sized(*sizes)), sequence_length, buffer)
    return [[int(piece[0]) for piece in row] for row in rows]


def test_pack_pieces_order_of_filling_and_emitting():
    """Worked by hand from `pack_pieces`' rule, rows of 10 slots."""
    # First fit, oldest row first: piece 2 fits rows 0 and 1 and goes into row 0.
    assert _emitted([6, 7, 3], 10, 8) == [[0, 2], [1]]
    # A row that becomes full leaves at once, before older ones; the rest leave at the
    # end, oldest first.
    assert _emitted([6, 5, 5], 10, 8) == [[1, 2], [0]]
    # A piece that fills a row alone leaves at once.
    assert _emitted([4, 10, 3], 10, 8) == [[1], [0, 2]]
    # Past `packing_buffer` open rows the fullest leaves; the oldest among equals.
    assert _emitted([7, 6, 8], 10, 2) == [[2], [0], [1]]
    assert _emitted([7, 7, 7], 10, 2) == [[0], [1], [2]]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_predictions": 63, "sequence_length": 64}, "sequence_length - 2 = 62"),
        ({"packing_buffer": 0}, "packing_buffer"),
        ({"sequence_length": 4}, "sequence_length"),
        ({"seed": -1}, "seed=-1"),
        ({"pack": "yes"}, "pack='yes'"),
        ({"mask_rate": 1.5}, "mask_rate=1.5"),
        ({"random_token_rate": 0.6, "unchanged_rate": 0.6}, "at most 1"),
        ({"process_index": 2, "num_processes": 2}, "process_index"),
        ({"text_format": "xml"}, "text_format"),
    ],
)
def test_bad_arguments(corpus, tokenizer, kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        packed_pretraining_dataset(corpus["path"], tokenizer, **kwargs)


def test_bad_files(tmp_path, tokenizer):
    with pytest.raises(ValueError):
        packed_pretraining_dataset(str(tmp_path / "missing-*.txt"), tokenizer)
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(ValueError, match="empty"):
        packed_pretraining_dataset(str(empty), tokenizer)
    blank = tmp_path / "blank.txt"
    blank.write_text("\n\n  \n")
    with pytest.raises(ValueError, match="blank.txt"):
        packed_pretraining_dataset(str(blank), tokenizer)
    with pytest.raises(ValueError, match="tokenizer"):
        packed_pretraining_dataset(str(empty), object())
