"""Tests of kbert.data.nsp.PairGenerator against the rules of BERT's pair recipe.

The generator reads documents from a stand-in source whose token ids name where they come
from (`document * 100_000 + sentence * 1000 + position + 10`), so every segment of every
instance can be traced back exactly. The sentences are 3 tokens long and the rows hold 12
tokens of text with NSP, so a chunk is exactly 4 sentences and no pair is ever truncated:
what a segment holds is then fixed by the recipe's choices alone (where A ends, where B
starts, which sentences are read again), which these tests check one by one.
"""

import itertools

import numpy as np
import pytest

from kbert.data.nsp import PairGenerator

pytestmark = pytest.mark.backend_independent

PAD, CLS, SEP = 0, 1, 2
SENTENCE = 3  # Tokens per sentence.
NSP_LENGTH = 15  # [CLS] A [SEP] B [SEP]: 12 tokens of text, 4 sentences.


def _document(index, num_sentences, sentence_length=SENTENCE):
    ids = np.array(
        [
            index * 100_000 + sentence * 1000 + position + 10
            for sentence in range(num_sentences)
            for position in range(sentence_length)
        ],
        np.int32,
    )
    return ids, list(range(0, len(ids) + 1, sentence_length))


class _Source:
    """The `flat_documents(rng)` of a `DocumentSource`; `shuffled` orders each read by `rng`
    (as a source shuffles its files). Counts the documents handed out."""

    def __init__(self, documents, shuffled=False):
        self.documents = documents
        self.shuffled = shuffled
        self.read = 0

    def flat_documents(self, rng):
        order = list(range(len(self.documents)))
        if self.shuffled:
            rng.shuffle(order)
        for index in order:
            self.read += 1
            yield self.documents[index]


def _generator(documents, shuffled_source=False, **settings):
    arguments = dict(
        sequence_length=NSP_LENGTH,
        nsp=True,
        short_seq_prob=0.0,
        dupe_factor=1,
        shuffle=False,
        repeat=False,
        batch_size=8,
        drop_remainder=False,
        seed=0,
        cls_id=CLS,
        sep_id=SEP,
        pad_id=PAD,
        document_buffer=8,
        example_buffer=64,
    )
    arguments.update(settings)
    return PairGenerator(_Source(documents, shuffled_source), **arguments)


def _where(ids):
    """`(document, sentence, position)` of each token id."""
    ids = np.asarray(ids) - 10
    return ids // 100_000, ids % 100_000 // 1000, ids % 1000


def _sentences(segment):
    """The `(document, sentence)` pairs a segment holds, checked to be whole sentences of one
    document, in order."""
    documents, sentences, positions = _where(segment)
    assert len(segment) % SENTENCE == 0, segment
    assert len(set(documents.tolist())) == 1, segment
    np.testing.assert_array_equal(positions, np.tile(np.arange(SENTENCE), len(segment) // 3))
    first = sentences[::SENTENCE]
    np.testing.assert_array_equal(first, first[0] + np.arange(len(first)))
    return [(int(documents[0]), int(s)) for s in first]


def _documents(count, num_sentences=16):
    return [_document(d, num_sentences) for d in range(count)]


@pytest.fixture(scope="module")
def pairs():
    documents = _documents(300)
    return documents, list(_generator(documents, seed=0).pass_instances(0))


def test_segments_are_whole_sentences_and_a_chunk_fills_the_row(pairs):
    # No truncation here: A is whole sentences of its document; an IsNext B the sentences
    # after A up to the chunk's end; a NotNext B as many sentences of another document as
    # the rest of the target takes (fewer only where that document ends).
    documents, instances = pairs
    for a, b, label in instances:
        a_sentences, b_sentences = _sentences(a), _sentences(b)
        own, other = a_sentences[0][0], b_sentences[0][0]
        if label == 0:
            assert other == own and b_sentences[0][1] == a_sentences[-1][1] + 1
            ends_document = b_sentences[-1][1] == len(documents[own][1]) - 2
            assert len(a) + len(b) == NSP_LENGTH - 3 or ends_document
        else:
            assert other != own
            ends_document = b_sentences[-1][1] == len(documents[other][1]) - 2
            assert len(a) + len(b) == NSP_LENGTH - 3 or ends_document


def test_each_sentence_is_read_once_from_its_own_document(pairs):
    # A NotNext pair uses only A from its document; the sentences after A go back and start
    # the next chunk, so with one dupe every sentence appears exactly once as A or IsNext B.
    documents, instances = pairs
    seen = []
    for a, b, label in instances:
        seen += _sentences(a)
        if label == 0:
            seen += _sentences(b)
    expected = [(d, s) for d in range(len(documents)) for s in range(len(documents[d][1]) - 1)]
    assert sorted(seen) == expected


def test_a_ends_after_a_uniform_number_of_the_chunks_sentences(pairs):
    # A chunk of 4 sentences: A takes 1, 2 or 3 of them with equal probability.
    _, instances = pairs
    full = [len(a) // SENTENCE for a, b, label in instances if label == 0 and len(a) + len(b) == 12]
    counts = np.bincount(full, minlength=4)[1:]
    assert counts.sum() > 300 and counts.min() > 0
    np.testing.assert_allclose(counts / counts.sum(), 1 / 3, atol=0.06)


def test_not_next_b_starts_anywhere_in_another_document_before_or_after(pairs):
    # B's document is drawn from the document buffer (documents still to come) and the ones
    # used last, never A's; its first sentence is uniform over that document's sentences.
    _, instances = pairs
    starts, earlier, later = [], 0, 0
    for a, b, label in instances:
        if label == 1:
            (own, _), (other, start) = _sentences(a)[0], _sentences(b)[0]
            starts.append(start)
            earlier += other < own
            later += other > own
    assert len(starts) > 300 and earlier > 50 and later > 50
    histogram = np.bincount(starts, minlength=16)
    assert histogram.min() > 0
    assert 6 < np.mean(starts) < 9  # Uniform over 0..15: 7.5.


def test_short_targets_are_uniform_between_2_and_the_row():
    # One-token sentences, no NSP: each document's chunks are exactly its target length,
    # drawn uniformly in [2, max_num_tokens] for a short document, so its first row tells it.
    documents = [_document(d, 80, sentence_length=1) for d in range(600)]
    instances = _generator(
        documents, nsp=False, sequence_length=34, short_seq_prob=1.0, seed=1
    ).pass_instances(0)
    targets = {}
    for a, _, _ in instances:
        targets.setdefault(int(_where(a[:1])[0][0]), len(a))
    lengths = np.array(list(targets.values()))
    assert len(lengths) == 600 and lengths.min() == 2 and lengths.max() == 32
    counts = np.bincount(lengths, minlength=33)[2:]
    np.testing.assert_allclose(counts / 600, 1 / 31, atol=0.03)
    assert 15 < lengths.mean() < 19  # Uniform over 2..32: 17.


def test_without_nsp_a_long_chunk_fills_the_row_and_loses_tokens_at_both_ends():
    # One 200-token sentence per document, rows of 32: 30 tokens kept of 200; each of the 170
    # cut tokens comes from the front or the back at random, so about 85 from the front.
    documents = [_document(d, 1, sentence_length=200) for d in range(200)]
    instances = list(_generator(documents, nsp=False, sequence_length=32).pass_instances(0))
    assert len(instances) == 200
    starts = []
    for a, b, _ in instances:
        assert b is None and len(a) == 30
        positions = _where(a)[2]
        np.testing.assert_array_equal(positions, positions[0] + np.arange(30))
        starts.append(positions[0])
    assert 80 < np.mean(starts) < 90 and np.std(starts) > 3
    # One token over: 31 of them, rows of 32 keep 30, the one cut from the front or the back.
    documents = [_document(d, 1, sentence_length=31) for d in range(200)]
    instances = list(_generator(documents, nsp=False, sequence_length=32).pass_instances(0))
    starts = [_where(a)[2][0] for a, _, _ in instances]
    assert [len(a) for a, _, _ in instances] == [30] * 200
    assert set(starts) == {0, 1} and 70 < sum(starts) < 130


def test_a_long_pair_is_cut_longest_first_at_random_ends():
    # 20-token sentences, 29 tokens of text: a chunk is 2 sentences, A one of them and B one
    # (the next, or one of another document). Longest-first leaves A ceil(29 / 2) = 15 tokens
    # and B 14, each cut token from the front or the back: Binomial(5, 1/2) and (6, 1/2) from
    # the front.
    documents = [_document(d, 10, sentence_length=20) for d in range(300)]
    instances = list(_generator(documents, sequence_length=32).pass_instances(0))
    fronts = {"a": [], "b": []}
    for a, b, _label in instances:
        assert (len(a), len(b)) == (15, 14)
        for name, segment in (("a", a), ("b", b)):
            documents_, sentences, positions = _where(segment)
            assert len(set(documents_.tolist())) == 1 and len(set(sentences.tolist())) == 1
            np.testing.assert_array_equal(positions, positions[0] + np.arange(len(segment)))
            fronts[name].append(positions[0])
    assert len(instances) > 1000 and {0, 5} <= set(fronts["a"]) and {0, 6} <= set(fronts["b"])
    assert 2.3 < np.mean(fronts["a"]) < 2.7 and 2.8 < np.mean(fronts["b"]) < 3.2


def test_a_random_next_sentence_never_comes_from_a_copy_of_its_own_document():
    # With dupe_factor 2 the buffer holds both copies of a document; the copy of A's own
    # document is drawn again (a 1 in 7 chance per draw here), never used.
    documents = _documents(4, num_sentences=64)
    instances = list(_generator(documents, dupe_factor=2, seed=2).pass_instances(0))
    not_next = [(a, b) for a, b, label in instances if label == 1]
    assert len(not_next) > 50  # A copy would be used about 1 in 7 times: (6 / 7)^50 < 1e-3.
    for a, b in not_next:
        assert _sentences(a)[0][0] != _sentences(b)[0][0]


def test_example_shuffle_scatters_the_instances_of_a_document():
    # With `shuffle` the instances of one document do not come out together, both when the
    # example pool hands them out as they arrive and when it is emptied at the end of a pass.
    for num_documents in (30, 600):  # 30: every instance fits the pool's warm-up.
        instances = list(
            _generator(_documents(num_documents), shuffle=True, example_buffer=4096).pass_instances(
                0
            )
        )
        owners = [int(_where(a[:1])[0][0]) for a, _, _ in instances]
        together = np.mean([x == y for x, y in zip(owners, owners[1:])])
        assert together < 0.1, (num_documents, together)


def test_shuffled_documents_are_drawn_from_a_buffer_of_the_given_size():
    # The document turned into instances next is drawn from the buffer: never more than
    # `document_buffer` documents ahead of the source's order, and out of order.
    buffer = 16
    documents = _documents(400, num_sentences=4)
    generator = _generator(documents, shuffle=True, document_buffer=buffer, example_buffer=1)
    owners = []
    for a, _, _ in generator.pass_instances(0):
        owner = int(_where(a[:1])[0][0])
        if owner not in owners:
            owners.append(owner)
    assert sorted(owners) == list(range(400))
    ahead = np.array(owners) - np.arange(400)
    assert ahead.max() <= buffer and ahead.max() >= buffer - 4
    assert np.mean(np.diff(owners) < 0) > 0.3


def test_the_first_instances_come_before_the_buffers_are_full():
    source_documents = _documents(1000)
    generator = _generator(source_documents, shuffle=True, example_buffer=100_000)
    next(iter(generator.pass_instances(0)))
    # The pool hands out examples once past its warm-up (1,024 examples, about 300 of these
    # documents), not only when `example_buffer` examples wait in it.
    assert generator.source.read < 500
    # So does the document buffer, past its own warm-up of 64 documents.
    generator = _generator(source_documents, document_buffer=100_000)
    next(iter(generator.pass_instances(0)))
    assert generator.source.read < 100


def test_each_pass_and_each_dupe_draws_its_own_pairs():
    documents = _documents(40)

    def summary(instances):
        return [(tuple(a[:1]), len(a), label) for a, _, label in instances]

    generator = _generator(documents, shuffled_source=True, dupe_factor=2)
    first, again, second = (summary(generator.pass_instances(p)) for p in (0, 0, 1))
    assert first == again  # A pure function of the seed and the pass.
    assert first != second
    # Each dupe reads the source in an order of its own; without `shuffle` the generator
    # keeps it, and a document's instances come out together.
    owners = [int(_where(key[0])[0]) for key, _, _ in first]
    runs = [owner for owner, _ in itertools.groupby(owners)]
    assert len(runs) == 80 and sorted(runs[:40]) == sorted(runs[40:]) == list(range(40))
    assert runs[:40] != runs[40:]
    labels = [label for _, _, label in first], [label for _, _, label in second]
    assert labels[0] != labels[1]


def _batches(generator, count):
    iterator = generator()
    return [next(iterator) for _ in range(count)]


def test_partial_batches_are_kept_or_dropped_as_asked():
    documents = _documents(10)
    instances = len(list(_generator(documents).pass_instances(0)))
    assert instances % 8
    kept = list(_generator(documents)())
    assert [len(b[0]) for b in kept] == [8] * (instances // 8) + [instances % 8]
    dropped = list(_generator(documents, drop_remainder=True)())
    assert [len(b[0]) for b in dropped] == [8] * (instances // 8)
    # Repeated passes of fewer instances than a batch: one partial batch per pass.
    few = _generator(documents[:2], batch_size=64, repeat=True)
    rows = [len(b[0]) for b in _batches(few, 3)]
    assert rows[0] < 64 and len(rows) == 3
    with pytest.raises(ValueError, match="batch_size=64"):
        _batches(_generator(documents[:2], batch_size=64, repeat=True, drop_remainder=True), 1)


def _reference_pack(instances, sequence_length, nsp):
    rows = []
    for tokens_a, tokens_b, label in instances:
        tokens = [CLS, *tokens_a, SEP]
        segments = [0] * len(tokens)
        if nsp:
            tokens += [*tokens_b, SEP]
            segments += [1] * (len(tokens_b) + 1)
        pad = sequence_length - len(tokens)
        rows.append((tokens + [PAD] * pad, segments + [0] * pad, len(tokens), label))
    return [np.array(column, np.int32) for column in zip(*rows)]


@pytest.mark.parametrize("nsp", [True, False])
def test_pack_equals_row_by_row_packing(nsp):
    length = 24
    generator = _generator([], sequence_length=length, nsp=nsp)
    rng = np.random.default_rng(0)
    budget = length - (3 if nsp else 2)
    instances = []
    for _ in range(50):
        length_a = int(rng.integers(1, budget))
        length_b = int(rng.integers(1, budget - length_a + 1)) if nsp else 0
        a = rng.integers(10, 1000, length_a).astype(np.int32)
        b = rng.integers(10, 1000, length_b).astype(np.int32) if nsp else None
        instances.append((a, b, int(rng.integers(0, 2)) if nsp else 0))
    packed = generator.pack(instances)
    for got, expected in zip(packed, _reference_pack(instances, length, nsp)):
        np.testing.assert_array_equal(got, expected)
