"""Next-sentence-prediction pairs: BERT's segments built from a stream of documents.

The second stage of `kbert.data.pretraining_dataset`: documents from a
`kbert.data.documents.DocumentSource` go through a seeded buffer and become sentence pairs
(target length, random `A` end, 50 % random next sentence from another buffered document,
longest-first truncation from random ends) as views into their id arrays, are shuffled in a
bounded buffer and packed batch by batch into `[CLS] A [SEP] B [SEP]` rows with one NumPy
scatter. The recipe is google-research/bert's `create_pretraining_data.py`.
"""

import bisect
import collections
import random

import numpy as np

_WARM_UP_DOCUMENTS = 64
_WARM_UP_EXAMPLES = 1024


def truncated_lengths(length_a, length_b, max_num_tokens):
    """The lengths longest-first truncation leaves: `(a, b)` with `a + b <= max_num_tokens`.

    Longest-first removes one token at a time from the longer segment (from B on a tie) until
    the pair fits. The outcome depends on the lengths only: the longer one shrinks first; once
    both are cut, A keeps `ceil(max / 2)` and B `floor(max / 2)`.
    """
    if length_a + length_b <= max_num_tokens:
        return length_a, length_b
    kept_a = min(length_a, max(-(-max_num_tokens // 2), max_num_tokens - length_b))
    return kept_a, max_num_tokens - kept_a


def front_cut(removed, rng):
    """How many of `removed` cut tokens come from the front, each front or back at random.

    Each removed token is taken from the front or the back of its segment with probability 1/2,
    independently, so the count is Binomial(removed, 1/2): the popcount of `removed` random bits.
    """
    return rng.getrandbits(removed).bit_count() if removed > 0 else 0


def _below(rng, n):
    """A random int in `[0, n)` (one float draw; faster than `randrange` per instance)."""
    return int(rng.random() * n)


class PairGenerator:
    """Builds and packs the (optionally paired) segments of one pass; one call = one pass.

    Documents stream from a `DocumentSource` through a seeded buffer of `document_buffer`
    documents: with `shuffle`, the document turned into examples next is drawn at random from the
    buffer (else the oldest), and the "random other document" of a NotNext pair is drawn
    uniformly from the rest of the buffer and the `document_buffer` documents used last. The
    examples then go through a seeded shuffle buffer of `example_buffer` examples. The object
    counts the passes it has started, so every new iteration of the dataset (every epoch of
    `fit`) gets new pairs and new masks while staying a pure function of the seed.
    """

    def __init__(
        self,
        source,
        sequence_length,
        nsp,
        short_seq_prob,
        dupe_factor,
        shuffle,
        repeat,
        batch_size,
        drop_remainder,
        seed,
        cls_id,
        sep_id,
        pad_id,
        document_buffer,
        example_buffer,
    ):
        self.source = source
        self.sequence_length = sequence_length
        self.nsp = nsp
        self.max_num_tokens = sequence_length - (3 if nsp else 2)
        self.short_seq_prob = short_seq_prob
        self.dupe_factor = dupe_factor
        self.shuffle = shuffle
        self.repeat = repeat
        self.batch_size = batch_size
        self.drop_remainder = drop_remainder
        self.seed = seed
        self.cls_id, self.sep_id, self.pad_id = cls_id, sep_id, pad_id
        self.document_buffer = document_buffer
        self.example_buffer = example_buffer
        self.passes_started = 0

    def _document_instances(self, document, others, rng, out):
        """Appends the instances of one document to `out`: `(a, b, label)` tuples of views.

        `a` and `b` are int32 array views into the documents' id arrays (no copies; `b` is None
        without NSP). Chunks are found by bisection on the sentence offsets, truncation by its
        closed form (`truncated_lengths`, `front_cut`), so the cost is a few operations per
        instance whatever the sentence and document lengths.
        """
        ids, bounds = document
        num_sentences = len(bounds) - 1
        max_num_tokens = self.max_num_tokens
        target_length = max_num_tokens
        if rng.random() < self.short_seq_prob:
            target_length = rng.randint(2, max_num_tokens)
        i = 0
        while i < num_sentences:
            # The chunk is sentences i..last: the first ones reaching `target_length` tokens,
            # or the rest of the document.
            last = (
                min(bisect.bisect_left(bounds, bounds[i] + target_length, i + 1), num_sentences) - 1
            )
            if not self.nsp:
                begin, end = bounds[i], bounds[last + 1]
                removed = end - begin - max_num_tokens
                if removed > 0:
                    begin += front_cut(removed, rng)
                    end = begin + max_num_tokens
                out.append((ids[begin:end], None, 0))
                i = last + 1
                continue
            num_chunk = last - i + 1
            a_stop = i + (1 + _below(rng, num_chunk - 1) if num_chunk >= 2 else 1)
            a_begin, a_end = bounds[i], bounds[a_stop]
            if num_chunk == 1 or rng.random() < 0.5:
                is_random_next = 1
                target_b_length = target_length - (a_end - a_begin)
                other_ids, other_bounds = others(rng)
                start = _below(rng, len(other_bounds) - 1)
                stop = min(
                    bisect.bisect_left(
                        other_bounds, other_bounds[start] + target_b_length, start + 1
                    ),
                    len(other_bounds) - 1,
                )
                b_ids, b_begin, b_end = other_ids, other_bounds[start], other_bounds[stop]
                # The sentences not used for A go back to be read again.
                i = a_stop
            else:
                is_random_next = 0
                b_ids, b_begin, b_end = ids, a_end, bounds[last + 1]
                i = last + 1
            length_a, length_b = a_end - a_begin, b_end - b_begin
            kept_a, kept_b = truncated_lengths(length_a, length_b, max_num_tokens)
            if kept_a < length_a:
                a_begin += front_cut(length_a - kept_a, rng)
            if kept_b < length_b:
                b_begin += front_cut(length_b - kept_b, rng)
            out.append(
                (
                    ids[a_begin : a_begin + kept_a],
                    b_ids[b_begin : b_begin + kept_b],
                    is_random_next,
                )
            )

    def pass_instances(self, pass_index):
        """Yields the instances of one pass in output order (a pure function of seed and pass)."""
        rng = random.Random(f"kbert-pretraining:{self.seed}:{pass_index}")
        buffer = []
        recent = collections.deque(maxlen=self.document_buffer)
        current = [None]

        def others(rng):
            # Uniform over the buffer (the current document is not in it) and the documents
            # used last; a copy of the current document (dupe_factor > 1) is drawn again, up to
            # 10 times, as the reference retries.
            count = len(buffer) + len(recent)
            if count == 0:
                raise ValueError(
                    "Next sentence prediction needs at least two documents (the random next "
                    "sentence comes from another document), but the files hold one. Separate "
                    "documents with blank lines (or WikiText ` = Title = ` lines), or pass "
                    "nsp=False."
                )
            for _ in range(10):
                k = _below(rng, count)
                key, other = buffer[k] if k < len(buffer) else recent[k - len(buffer)]
                if key != current[0]:
                    break
            return other

        pool = []
        arrivals = [0, 0]  # documents, examples
        shuffle, example_buffer = self.shuffle, self.example_buffer

        def emit(item):
            current[0], document = item
            made = []
            self._document_instances(document, others, rng, made)
            recent.append(item)
            if not shuffle:
                yield from made
                return
            for instance in made:
                arrivals[1] += 1
                # The pool fills to `example_buffer`; past _WARM_UP_EXAMPLES it already
                # hands out one example for every two new ones, so the first batch comes early.
                if len(pool) < example_buffer and (
                    len(pool) < _WARM_UP_EXAMPLES or arrivals[1] % 2
                ):
                    pool.append(instance)
                    continue
                k = _below(rng, len(pool))
                pool[k], instance = instance, pool[k]
                yield instance

        def take():
            if shuffle:
                k = _below(rng, len(buffer))
                buffer[k], buffer[-1] = buffer[-1], buffer[k]
                return buffer.pop()
            return buffer.pop(0)

        for dupe in range(self.dupe_factor):
            order_rng = random.Random(f"kbert-pretraining-files:{self.seed}:{pass_index}:{dupe}")
            for document in self.source.flat_documents(order_rng):
                ids, bounds = document
                key = (len(ids), len(bounds), ids[:8].tobytes(), ids[-8:].tobytes())
                buffer.append((hash(key), document))
                arrivals[0] += 1
                # As the example pool: full buffer, or past the warm-up one in two arrivals.
                if len(buffer) > self.document_buffer or (
                    len(buffer) > _WARM_UP_DOCUMENTS and arrivals[0] % 2 == 0
                ):
                    yield from emit(take())
        while buffer:
            yield from emit(take())
        if shuffle:
            rng.shuffle(pool)
        yield from pool

    def pack(self, instances):
        """Packs instances into `[CLS] A [SEP] B [SEP]` rows, with one scatter for the batch."""
        n, length = len(instances), self.sequence_length
        token_ids = np.full((n, length), self.pad_id, np.int32)
        tokens_a, tokens_b, labels = zip(*instances)
        length_a = np.fromiter(map(len, tokens_a), np.int64, n)
        columns = np.arange(length)[None, :]  # (1, seq)
        rows = np.arange(n) * length  # Offset of each row in the flat array.
        if self.nsp:
            length_b = np.fromiter(map(len, tokens_b), np.int64, n)
            pieces = [t for pair in zip(tokens_a, tokens_b) for t in pair]
            piece_lengths = np.stack([length_a, length_b], axis=1).reshape(-1)  # a0 b0 a1 ..
            piece_starts = np.stack([rows + 1, rows + 2 + length_a], axis=1).reshape(-1)
            lengths = 3 + length_a + length_b
            separators = np.concatenate([rows + 1 + length_a, rows + lengths - 1])
            segment_ids = (
                (columns >= 2 + length_a[:, None]) & (columns < lengths[:, None])
            ).astype(np.int32)
        else:
            pieces, piece_lengths, piece_starts = tokens_a, length_a, rows + 1
            lengths = 2 + length_a
            separators = rows + lengths - 1
            segment_ids = np.zeros((n, length), np.int32)
        # Destination of every token: its piece's start plus its index inside the piece.
        piece_offsets = np.cumsum(piece_lengths) - piece_lengths
        destination = np.repeat(piece_starts - piece_offsets, piece_lengths) + np.arange(
            piece_lengths.sum()
        )
        flat = token_ids.reshape(-1)
        flat[destination] = np.concatenate(pieces)
        flat[separators] = self.sep_id
        token_ids[:, 0] = self.cls_id
        return (
            token_ids,
            segment_ids,
            lengths.astype(np.int32),
            np.asarray(labels, np.int32),
        )

    def __call__(self):
        while True:
            pass_index = self.passes_started
            self.passes_started += 1
            batch, batch_index = [], 0
            for instance in self.pass_instances(pass_index):
                batch.append(instance)
                if len(batch) == self.batch_size:
                    mask_seed = np.array([self.seed, (pass_index << 32) + batch_index], np.int64)
                    yield self.pack(batch) + (mask_seed,)
                    batch, batch_index = [], batch_index + 1
            if batch and not self.drop_remainder:
                mask_seed = np.array([self.seed, (pass_index << 32) + batch_index], np.int64)
                yield self.pack(batch) + (mask_seed,)
                batch_index += 1
            if batch_index == 0 and not self.repeat:
                return
            if batch_index == 0:
                raise ValueError(
                    "A pass over the files gives no batch: they hold fewer sequences than "
                    f"batch_size={self.batch_size} (with drop_remainder=True)."
                )
            if not self.repeat:
                return
