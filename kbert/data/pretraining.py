"""BERT pretraining data: next-sentence pairs and dynamic masked-LM masking.

The recipe follows google-research/bert `create_pretraining_data.py` (Devlin et al. 2018,
arXiv 1810.04805), with one deliberate change: masking is *dynamic*. Instead of baking one
mask per example into files, the masks are drawn in the `tf.data` pipeline for every pass over
the data (as RoBERTa does), with stateless random ops, so a given seed always reproduces the
same batches.

Pipeline (streaming; memory does not grow with the corpus):

1. The files (this process's share) are read line by line and parsed into documents made of
   sentences; pre-tokenized shards (`kbert.data.shards`) skip this step and the next (they are
   read and parsed by a parallel `tf.data` interleave, 64 records at a time).
2. Sentences are tokenized in chunks with the tokenizer, in worker threads.
3. A Python generator passes the documents (flat id arrays with sentence offsets) through a
   seeded buffer, builds the sentence pairs (target length, random `A` end, 50 % random next
   sentence from another buffered document, longest-first truncation from random ends) as
   views into those arrays - chunks found by bisection, truncation in closed form, a few
   operations per pair - shuffles them in a bounded buffer and packs each batch
   `[CLS] A [SEP] B [SEP]` with one NumPy scatter. This is what makes pre-tokenized shards fast
   (tens of thousands of sequences per second on one core); raw text is bound by tokenization
   (plain-ASCII sentences take tensorflow-text's fused tokenizer, the rest the exact graph).
4. A batched `Dataset.map` in TensorFlow ops chooses the masked positions and applies the
   80 % `[MASK]` / 10 % random token / 10 % unchanged replacement.
"""

import bisect
import codecs
import collections
import concurrent.futures
import os
import random
import re
import warnings

import numpy as np
import tensorflow as tf

from kbert.data.shards import SHARD_SUFFIX, check_shards, read_shard_flat_documents

# A WikiText article title: " = Title = ". Section headings (" = = Section = = ") do not match.
_WIKITEXT_TITLE = re.compile(r"^ = [^=].* = $")
# Sentence boundary used for WikiText paragraphs: whitespace after ".", "?" or "!".
_SENTENCE_BOUNDARY = re.compile(r"(?<=[.!?])\s+(?=\S)")
_TEXT_FORMATS = ("auto", "lines", "wikitext")
_TOKENIZER_ATTRIBUTES = (
    "tokenize",
    "vocabulary",
    "cls_token_id",
    "sep_token_id",
    "pad_token_id",
    "mask_token_id",
    "unk_token_id",
)


def split_sentences(paragraph):
    """Splits a paragraph into sentences with a simple punctuation rule.

    A sentence ends at ".", "?" or "!" followed by whitespace. This is deliberately simple:
    abbreviations such as "Mr. Smith" are split too. WikiText writes numbers as `1 @.@ 5`,
    which is never split.

    Args:
        paragraph: str. One paragraph of text.

    Returns:
        A list of non-empty, stripped sentence strings.

    Example:

    >>> split_sentences("It rained . The match was delayed ! Why ?")
    ['It rained .', 'The match was delayed !', 'Why ?']
    """
    paragraph = paragraph.strip()
    if not paragraph:
        return []
    return [s.strip() for s in _SENTENCE_BOUNDARY.split(paragraph) if s.strip()]


def _expand_files(files):
    if isinstance(files, (str, bytes, os.PathLike)):
        files = [files]
    try:
        files = list(files)
    except TypeError:
        raise ValueError(
            "`files` must be a path, a glob pattern or a list of them. "
            f"Received: files={files!r}"
        ) from None
    if not files:
        raise ValueError("`files` must name at least one file. Received: files=[]")
    paths = []
    for pattern in files:
        pattern = os.fsdecode(pattern)
        if any(c in pattern for c in "*?["):
            matches = sorted(tf.io.gfile.glob(pattern))
        else:
            matches = [pattern] if tf.io.gfile.exists(pattern) else []
        if not matches:
            raise ValueError(f"No file matches {pattern!r}. Received: files={files!r}")
        for path in matches:
            if tf.io.gfile.isdir(path):
                raise ValueError(f"Expected text files, received a directory: {path!r}")
        paths.extend(matches)
    return paths


def _parse_text(text, text_format):
    """Parses one decoded file into a list of documents (lists of sentences)."""
    lines = [line.rstrip("\r") for line in text.split("\n")]
    if text_format == "auto":
        wikitext = any(_WIKITEXT_TITLE.match(line) for line in lines)
        text_format = "wikitext" if wikitext else "lines"
    documents = [[]]
    for line in lines:
        stripped = line.strip()
        if text_format == "lines":
            if not stripped:
                documents.append([])
            else:
                documents[-1].append(stripped)
            continue
        # WikiText: an article title starts a document; section headings are dropped;
        # blank lines only separate paragraphs inside an article.
        if _WIKITEXT_TITLE.match(line):
            documents.append([])
        elif stripped.startswith("=") and stripped.endswith("="):
            continue
        elif stripped:
            documents[-1].extend(split_sentences(stripped))
    return [doc for doc in documents if doc]


def read_documents(files, text_format="auto"):
    """Reads pretraining text files into documents made of sentences.

    Two layouts are understood:

    - `"lines"`: the input format of BERT's `create_pretraining_data.py`. One sentence per line,
      documents separated by blank lines.
    - `"wikitext"`: WikiText raw files. A line ` = Title = ` (regex `^ = [^=].* = $`) starts a
      new document (an article); section headings such as ` = = Section = = ` are dropped;
      blank lines are paragraph breaks, not document breaks; each paragraph line is split
      into sentences with `split_sentences` (a regex on ". ", "? ", "! ").

    `"auto"` picks `"wikitext"` for a file that holds at least one article title line and
    `"lines"` otherwise. Each file starts a new document. Bytes that are not valid UTF-8 are
    decoded as U+FFFD (the replacement character) instead of raising, so one bad byte never
    stops a run. Files are opened with `tf.io.gfile`, so cloud paths (`gs://...`) and glob
    patterns work.

    Args:
        files: str, path-like, or list of them. Text files or glob patterns.
        text_format: str. One of `"auto"`, `"lines"`, `"wikitext"`. Defaults to `"auto"`.

    Returns:
        A list of documents; each document is a non-empty list of sentence strings.

    Example:

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "corpus.txt")
    >>> with open(path, "w") as f:
    ...     _ = f.write("First sentence.\\nSecond one.\\n\\nAnother document.\\n")
    >>> read_documents(path)
    [['First sentence.', 'Second one.'], ['Another document.']]
    """
    if text_format not in _TEXT_FORMATS:
        raise ValueError(
            f"`text_format` must be one of {_TEXT_FORMATS}. Received: text_format={text_format!r}"
        )
    documents = []
    for path in _expand_files(files):
        with tf.io.gfile.GFile(path, "rb") as f:
            text = f.read().decode("utf-8", errors="replace")
        documents.extend(_parse_text(text, text_format))
    return documents


def _check_tokenizer(tokenizer):
    missing = [name for name in _TOKENIZER_ATTRIBUTES if not hasattr(tokenizer, name)]
    if missing:
        raise ValueError(
            "`tokenizer` must provide `tokenize`, `vocabulary` and the special token ids "
            f"(like `kbert.text.BertTokenizer`). Missing: {missing}. "
            f"Received: tokenizer={type(tokenizer).__name__}"
        )


def _truncated_lengths(length_a, length_b, max_num_tokens):
    """The lengths longest-first truncation leaves: `(a, b)` with `a + b <= max_num_tokens`.

    Longest-first removes one token at a time from the longer segment (from B on a tie) until
    the pair fits. The outcome depends on the lengths only: the longer one shrinks first; once
    both are cut, A keeps `ceil(max / 2)` and B `floor(max / 2)`.
    """
    if length_a + length_b <= max_num_tokens:
        return length_a, length_b
    kept_a = min(length_a, max(-(-max_num_tokens // 2), max_num_tokens - length_b))
    return kept_a, max_num_tokens - kept_a


def _front_cut(removed, rng):
    """How many of `removed` cut tokens come from the front, each front or back at random.

    Each removed token is taken from the front or the back of its segment with probability 1/2,
    independently, so the count is Binomial(removed, 1/2): the popcount of `removed` random bits.
    """
    return rng.getrandbits(removed).bit_count() if removed > 0 else 0


def _below(rng, n):
    """A random int in `[0, n)` (one float draw; faster than `randrange` per instance)."""
    return int(rng.random() * n)


# ------------------------------------------------------------------------- streaming documents
_PROBE_BYTES = 1 << 16
_WARM_UP_DOCUMENTS = 64
_WARM_UP_EXAMPLES = 1024
_AUTO_PROBE_LINES = 20000


def _check_text_file(path):
    """Refuses empty and binary files before any training starts; warns about text that is not
    UTF-8 (checked on the file's first 64 KiB)."""
    with tf.io.gfile.GFile(path, "rb") as f:
        head = f.read(_PROBE_BYTES)
    if not head.strip():
        with tf.io.gfile.GFile(path, "rb") as f:
            has_text = any(line.strip() for line in f)
        if not has_text:
            raise ValueError(
                f"The file {path!r} is empty (it holds no text). Expected text files with one "
                "sentence per line (or WikiText raw files); remove it from `files`."
            )
    if b"\x00" in head:
        raise ValueError(
            f"The file {path!r} is binary (it holds NUL bytes), not text. Expected UTF-8 text "
            f"files or pretraining shards ({SHARD_SUFFIX} files written by "
            "tools/prepare_pretraining_data.py)."
        )
    try:
        # Incremental: a character cut by the end of the probe is not an error.
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError as error:
        warnings.warn(
            f"The file {path!r} is not valid UTF-8: byte 0x{head[error.start]:02x} at offset "
            f"{error.start} cannot be decoded. Undecodable bytes are dropped from the text (as "
            "google-research/bert's data script does), so a file in another encoding (Latin-1, "
            "cp1252) loses those characters: convert it to UTF-8 first (for example "
            "`iconv -f latin1 -t utf-8`).",
            stacklevel=4,  # The caller of pretraining_dataset / packed_pretraining_dataset.
        )


def _detect_format(path, text_format):
    if text_format != "auto":
        return text_format
    with tf.io.gfile.GFile(path, "rb") as f:
        for i, line in enumerate(f):
            if i >= _AUTO_PROBE_LINES:
                break
            if _WIKITEXT_TITLE.match(line.decode("utf-8", errors="replace").rstrip("\r\n")):
                return "wikitext"
    return "lines"


def _iter_text_documents(path, text_format):
    """Yields the documents (lists of sentence strings) of one text file, reading it as a stream."""
    text_format = _detect_format(path, text_format)
    document = []
    with tf.io.gfile.GFile(path, "rb") as f:
        for raw in f:
            line = raw.decode("utf-8", errors="replace").rstrip("\n").rstrip("\r")
            stripped = line.strip()
            if text_format == "lines":
                if stripped:
                    document.append(stripped)
                elif document:
                    yield document
                    document = []
                continue
            if _WIKITEXT_TITLE.match(line):
                if document:
                    yield document
                document = []
            elif stripped.startswith("=") and stripped.endswith("="):
                continue
            elif stripped:
                document.extend(split_sentences(stripped))
    if document:
        yield document


def _round_robin(iterators):
    """Interleaves iterators one item at a time, dropping each when it ends."""
    iterators = list(iterators)
    while iterators:
        alive = []
        for iterator in iterators:
            try:
                yield next(iterator)
            except StopIteration:
                continue
            alive.append(iterator)
        iterators = alive


class _DocumentSource:
    """The tokenized documents of one pass of one process, read as a stream.

    Files are split across processes (file `i` goes to process `i % num_processes`) when there
    are at least as many files as processes, else documents are (document `k` of the stream goes
    to process `k % num_processes`). Each pass reads this process's files in a seeded random
    order (with `shuffle`), `cycle_length` files at a time, one document from each in turn
    (text files in groups of `cycle_length`; shards by a `tf.data` interleave that replaces a
    finished file by the next one). Text is tokenized in chunks of sentences by worker threads,
    one per CPU core (at least 2).
    """

    def __init__(self, paths, kind, tokenizer, text_format, num_processes, process_index,
                 shuffle, cycle_length=4, chunk_size=2048, num_threads=None):
        self.kind = kind
        self.tokenizer = tokenizer
        self.text_format = text_format
        self.shuffle = shuffle
        self.cycle_length = cycle_length
        self.chunk_size = chunk_size
        # One tokenization thread per core (at least 2: reading overlaps tokenizing).
        self.num_threads = num_threads or max(2, os.cpu_count() or 1)
        if len(paths) >= num_processes:
            self.paths = paths[process_index::num_processes]
            self.document_stride, self.document_offset = 1, 0
        else:
            self.paths = list(paths)
            self.document_stride, self.document_offset = num_processes, process_index

    def _raw_documents(self, rng):
        paths = list(self.paths)
        if self.shuffle:
            rng.shuffle(paths)
        if self.kind == "shards":
            yield from read_shard_flat_documents(paths, self.cycle_length)
            return
        for start in range(0, len(paths), self.cycle_length):
            group = paths[start : start + self.cycle_length]
            iterators = [_iter_text_documents(p, self.text_format) for p in group]
            yield from _round_robin(iterators)

    def _my_documents(self, rng):
        for k, document in enumerate(self._raw_documents(rng)):
            if k % self.document_stride == self.document_offset:
                yield document

    def _sentence_chunks(self, rng):
        sentences, document_ids, document_id = [], [], 0
        for document in self._my_documents(rng):
            sentences.extend(document)
            document_ids.extend([document_id] * len(document))
            document_id += 1
            if len(sentences) >= self.chunk_size:
                yield sentences, document_ids
                sentences, document_ids = [], []
        if sentences:
            yield sentences, document_ids

    def documents(self, rng):
        """Yields the documents of one pass: lists of non-empty int32 arrays (the sentences)."""
        for ids, bounds in self.flat_documents(rng):
            yield np.split(ids, bounds[1:-1])

    def flat_documents(self, rng):
        """Yields the documents of one pass as `(ids, bounds)`.

        `ids` is an int32 array of all the document's token ids, sentence after sentence;
        `bounds` a list of ints, the offsets of the sentences in `ids` (`bounds[0] == 0`,
        `bounds[-1] == len(ids)`; sentence `k` is `ids[bounds[k]:bounds[k + 1]]`, never empty).
        Sentences that tokenize to nothing are dropped; so are documents left empty.
        """
        if self.kind == "shards":
            for ids, lengths in self._my_documents(rng):
                if len(ids):
                    yield ids, [0] + np.cumsum(lengths).tolist()
            return
        tokenize = self.tokenizer.tokenize

        def tokenized(chunk):
            sentences, document_ids = chunk
            ids = tokenize(tf.constant(sentences, tf.string))
            if not isinstance(ids, tf.RaggedTensor):
                raise ValueError(
                    "`tokenizer.tokenize` must return a tf.RaggedTensor for a batch of "
                    f"strings. Received: {type(ids).__name__}"
                )
            if ids.ragged_rank > 1:
                ids = ids.merge_dims(1, -1)
            lengths = ids.row_lengths().numpy()
            flat = ids.flat_values.numpy().astype(np.int32)
            document_ids = np.asarray(document_ids)
            # Sentence ranges of each document of the chunk (in order, contiguous).
            starts = np.flatnonzero(np.r_[True, document_ids[1:] != document_ids[:-1]])
            offsets = np.r_[0, np.cumsum(lengths)]
            parts = []
            for first, stop in zip(starts, np.r_[starts[1:], len(document_ids)]):
                parts.append((
                    int(document_ids[first]),
                    flat[offsets[first] : offsets[stop]],
                    lengths[first:stop],
                ))
            return parts

        # Eager tokenization in worker threads (TensorFlow ops run outside the GIL), a few
        # chunks ahead, in order. A document can span chunks: its parts are joined.
        current_id, id_parts, length_parts = None, [], []

        def finished():
            lengths = np.concatenate(length_parts)
            ids = np.concatenate(id_parts)
            lengths = lengths[lengths > 0]
            return ids, [0] + np.cumsum(lengths).tolist()

        with concurrent.futures.ThreadPoolExecutor(self.num_threads) as pool:
            pending = collections.deque()
            chunks = self._sentence_chunks(rng)
            while True:
                while len(pending) < 2 * self.num_threads:
                    chunk = next(chunks, None)
                    if chunk is None:
                        break
                    pending.append(pool.submit(tokenized, chunk))
                if not pending:
                    break
                for document_id, ids, lengths in pending.popleft().result():
                    if document_id != current_id:
                        if id_parts and sum(len(p) for p in id_parts):
                            yield finished()
                        current_id, id_parts, length_parts = document_id, [], []
                    id_parts.append(ids)
                    length_parts.append(lengths)
        if id_parts and sum(len(p) for p in id_parts):
            yield finished()


class _PairGenerator:
    """Builds and packs the (optionally paired) segments of one pass; one call = one pass.

    Documents stream from a `_DocumentSource` through a seeded buffer of `document_buffer`
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
        closed form (`_truncated_lengths`, `_front_cut`), so the cost is a few operations per
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
            last = min(bisect.bisect_left(bounds, bounds[i] + target_length, i + 1),
                       num_sentences) - 1
            if not self.nsp:
                begin, end = bounds[i], bounds[last + 1]
                removed = end - begin - max_num_tokens
                if removed > 0:
                    begin += _front_cut(removed, rng)
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
            kept_a, kept_b = _truncated_lengths(length_a, length_b, max_num_tokens)
            if kept_a < length_a:
                a_begin += _front_cut(length_a - kept_a, rng)
            if kept_b < length_b:
                b_begin += _front_cut(length_b - kept_b, rng)
            out.append((
                ids[a_begin : a_begin + kept_a],
                b_ids[b_begin : b_begin + kept_b],
                is_random_next,
            ))

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


class _DynamicMasker:
    """Chooses and replaces the masked-LM positions of a packed batch, in TensorFlow ops."""

    def __init__(
        self,
        tokenizer,
        max_predictions,
        mask_rate,
        whole_word_masking,
        random_token_rate,
        unchanged_rate,
        nsp,
    ):
        self.max_predictions = max_predictions
        self.mask_rate = mask_rate
        self.whole_word_masking = whole_word_masking
        self.mask_token_rate = 1.0 - random_token_rate - unchanged_rate
        self.random_token_rate = random_token_rate
        self.nsp = nsp
        self.cls_id = int(tokenizer.cls_token_id)
        self.sep_id = int(tokenizer.sep_token_id)
        self.pad_id = int(tokenizer.pad_token_id)
        self.mask_id = int(tokenizer.mask_token_id)
        vocabulary = list(tokenizer.vocabulary)
        specials = {self.cls_id, self.sep_id, self.pad_id, self.mask_id, int(tokenizer.unk_token_id)}
        # Random replacements are uniform over the vocabulary minus the five special tokens.
        self.random_ids = tf.constant(
            [i for i in range(len(vocabulary)) if i not in specials], tf.int32
        )
        self.is_continuation = tf.constant([t.startswith("##") for t in vocabulary], tf.bool)

    def _choose_tokens(self, candidate, num_to_predict, seed):
        # Every candidate token is its own unit: take the `num_to_predict` best random scores.
        length = tf.shape(candidate)[1]
        scores = tf.random.stateless_uniform(tf.shape(candidate), seed)  # (batch, seq)
        scores = tf.where(candidate, scores, -1.0)
        best = tf.math.top_k(scores, k=self.max_predictions).indices  # (batch, preds)
        keep = tf.range(self.max_predictions)[None, :] < num_to_predict[:, None]
        return tf.where(keep, best, length)  # (batch, preds) positions, `length` = unused

    def _choose_whole_words(self, token_ids, candidate, num_to_predict, seed):
        batch = tf.shape(token_ids)[0]
        length = tf.shape(token_ids)[1]
        previous_candidate = tf.pad(candidate[:, :-1], [[0, 0], [1, 0]])
        continuation = tf.gather(self.is_continuation, token_ids) & previous_candidate
        word_start = candidate & ~continuation
        word_index = tf.cumsum(tf.cast(word_start, tf.int32), axis=1) - 1  # (batch, seq)
        num_words = tf.reduce_sum(tf.cast(word_start, tf.int32), axis=1)  # (batch,)
        # Pieces per word; non-candidate positions go to one extra, discarded segment.
        rows = tf.range(batch)[:, None] * length
        segment = tf.where(candidate, rows + word_index, batch * length)
        word_length = tf.math.unsorted_segment_sum(
            tf.ones_like(token_ids), segment, batch * length + 1
        )[:-1]
        word_length = tf.reshape(word_length, [batch, length])  # (batch, words)
        # Visit the words in a random order; take a word when it still fits in the budget,
        # skip it otherwise (as the reference's whole-word loop does). Each loop step jumps
        # straight to the next word that fits, so the loop runs at most `max_predictions`
        # times (every taken word uses at least one prediction).
        scores = tf.random.stateless_uniform([batch, length], seed)
        scores = tf.where(tf.range(length)[None, :] < num_words[:, None], scores, -1.0)
        order = tf.argsort(scores, axis=1, direction="DESCENDING", stable=True)
        ordered_length = tf.gather(word_length, order, batch_dims=1)  # (batch, words)
        visit_index = tf.range(length)[None, :]

        def take_next_word(step, remaining, last_visited, taken_in_order):
            fits = (
                (ordered_length > 0)
                & (ordered_length <= remaining[:, None])
                & (visit_index > last_visited[:, None])
            )  # (batch, words)
            found = tf.reduce_any(fits, axis=1)
            first = tf.argmax(tf.cast(fits, tf.int32), axis=1, output_type=tf.int32)
            size = tf.where(found, tf.gather(ordered_length, first, batch_dims=1), 0)
            pick = tf.one_hot(first, length, on_value=True, off_value=False) & found[:, None]
            last_visited = tf.where(found, first, length)
            return step + 1, remaining - size, last_visited, taken_in_order | pick

        def still_searching(step, remaining, last_visited, taken_in_order):
            return tf.reduce_any(last_visited < length)

        _, _, _, taken_in_order = tf.while_loop(
            still_searching,
            take_next_word,
            (
                tf.constant(0),
                num_to_predict,
                tf.fill([batch], -1),
                tf.zeros([batch, length], tf.bool),
            ),
            maximum_iterations=self.max_predictions,
        )
        taken = tf.gather(taken_in_order, tf.argsort(order, axis=1, stable=True), batch_dims=1)
        in_chosen_word = tf.gather(taken, tf.maximum(word_index, 0), batch_dims=1)
        return candidate & in_chosen_word

    def __call__(self, token_ids, segment_ids, lengths, nsp_labels, seed):
        seq_length = tf.shape(token_ids)[1]
        positions_range = tf.range(seq_length)[None, :]
        padding_mask = positions_range < lengths[:, None]  # (batch, seq)
        candidate = (
            padding_mask
            & tf.not_equal(token_ids, self.cls_id)
            & tf.not_equal(token_ids, self.sep_id)
            & tf.not_equal(token_ids, self.pad_id)
        )
        num_candidates = tf.reduce_sum(tf.cast(candidate, tf.int32), axis=1)
        # float64 and round-half-to-even, as Python's round() in the reference.
        num_to_predict = tf.cast(
            tf.round(tf.cast(num_candidates, tf.float64) * self.mask_rate), tf.int32
        )
        num_to_predict = tf.minimum(self.max_predictions, tf.maximum(1, num_to_predict))
        num_to_predict = tf.minimum(num_to_predict, num_candidates)
        choose_seed, action_seed, token_seed = tf.unstack(
            tf.random.experimental.stateless_split(seed, num=3)
        )
        if self.whole_word_masking:
            chosen = self._choose_whole_words(token_ids, candidate, num_to_predict, choose_seed)
            key = tf.where(chosen, positions_range, seq_length)  # (batch, seq)
        else:
            key = self._choose_tokens(candidate, num_to_predict, choose_seed)  # (batch, preds)
        # Chosen positions in ascending order, padded with `seq_length`, then with 0.
        positions = -tf.math.top_k(-key, k=self.max_predictions).values  # (batch, preds)
        valid = positions < seq_length
        positions = tf.where(valid, positions, 0)
        labels = tf.gather(token_ids, positions, batch_dims=1)
        labels = tf.where(valid, labels, 0)

        shape = tf.shape(positions)
        action = tf.random.stateless_uniform(shape, action_seed)
        random_ids = tf.gather(
            self.random_ids,
            tf.random.stateless_uniform(
                shape, token_seed, minval=0, maxval=tf.size(self.random_ids), dtype=tf.int32
            ),
        )
        replacement = tf.where(
            action < self.mask_token_rate,
            self.mask_id,
            tf.where(action < self.mask_token_rate + self.random_token_rate, random_ids, labels),
        )
        # Padded slots point at [CLS] (position 0) and write it back unchanged.
        replacement = tf.where(valid, replacement, token_ids[:, :1])
        batch_index = tf.broadcast_to(tf.range(shape[0])[:, None], shape)
        masked_ids = tf.tensor_scatter_nd_update(
            token_ids, tf.stack([batch_index, positions], axis=-1), replacement
        )

        x = {
            "token_ids": masked_ids,
            "segment_ids": segment_ids,
            "padding_mask": tf.cast(padding_mask, tf.int32),
            "mask_positions": positions,
        }
        y = {"mlm": labels}
        sample_weight = {"mlm": tf.cast(valid, tf.float32)}
        if self.nsp:
            y["nsp"] = nsp_labels
            sample_weight["nsp"] = tf.ones_like(nsp_labels, tf.float32)
        return x, y, sample_weight


def _check_rate(name, value):
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value <= 1.0:
        raise ValueError(f"`{name}` must be a number in [0, 1]. Received: {name}={value!r}")


def _check_positive_int(name, value, minimum=1):
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}. Received: {name}={value!r}")


def _process_split(num_processes, process_index):
    """Resolves and checks `num_processes` / `process_index` (from JAX when both are None)."""
    if num_processes is None and process_index is None:
        num_processes, process_index = 1, 0
        import sys

        if "jax" in sys.modules:
            import jax

            num_processes, process_index = jax.process_count(), jax.process_index()
        return num_processes, process_index
    if num_processes is None or process_index is None:
        raise ValueError(
            "Pass both `num_processes` and `process_index`, or neither. Received: "
            f"num_processes={num_processes!r}, process_index={process_index!r}"
        )
    _check_positive_int("num_processes", num_processes)
    _check_positive_int("process_index", process_index, minimum=0)
    if process_index >= num_processes:
        raise ValueError(
            f"`process_index` must be smaller than `num_processes` (processes are numbered "
            f"0 to {num_processes - 1}). Received: process_index={process_index}, "
            f"num_processes={num_processes}"
        )
    return int(num_processes), int(process_index)


def pretraining_dataset(
    files,
    tokenizer,
    sequence_length=128,
    max_predictions=20,
    mask_rate=0.15,
    nsp=True,
    short_seq_prob=0.1,
    whole_word_masking=False,
    batch_size=32,
    seed=None,
    dupe_factor=1,
    shuffle=True,
    repeat=False,
    random_token_rate=0.1,
    unchanged_rate=0.1,
    text_format="auto",
    drop_remainder=False,
    verbose=False,
    num_processes=None,
    process_index=None,
    document_buffer=1000,
    example_buffer=10000,
):
    """Builds the BERT pretraining `tf.data.Dataset` (masked LM + next sentence prediction).

    The files are read as streams: text is parsed line by line and tokenized in chunks by
    worker threads while training runs (or read pre-tokenized from shards written by
    `tools/prepare_pretraining_data.py`), so memory is bounded by the buffers below, not by the
    corpus, and the first batch comes after a few thousand sentences. Each pass over the returned
    dataset builds new sentence pairs (google-research/bert's `create_pretraining_data.py`
    recipe) and draws new masks (dynamic masking), so every epoch of `fit` sees different
    examples. Pass `k` is a pure function of `(seed, k)` and the process split: two datasets
    built with the same arguments and seed yield identical batches, masks included.

    Streaming. Each pass reads this process's files in a seeded random order, up to 4 at a time,
    one document from each in turn. Raw text is limited by tokenization, shards are not: for
    long runs, tokenize once into shards (figures in BENCHMARKS.md). Documents go through a
    buffer of `document_buffer` documents; the next document made into examples is drawn from it
    at random (the oldest with `shuffle=False`). Examples go through a shuffle buffer of
    `example_buffer` examples. Both buffers start handing out items before they are full (one
    for every two new ones), so the first batch comes early. Deviation from the in-memory
    reference: the "random other document" of a NotNext pair is drawn uniformly from the
    document buffer and the `document_buffer` documents used last, not from the whole corpus;
    the NotNext rate (about 50 %) and the fact that B comes from another document are unchanged.
    With a corpus smaller than the buffer, the whole corpus is the pool, as in the reference.

    Several processes (hosts). With `num_processes > 1`, each process reads a disjoint part:
    file `i` goes to process `i % num_processes` when there are at least as many files as
    processes (write enough shards), else document `k` of the stream goes to process
    `k % num_processes` (each process then reads, but skips, the others' text). By default
    (`None`) the split comes from `jax.process_count()` / `jax.process_index()` when JAX is
    loaded, else one process.

    Pairs. For each document, a target length of `sequence_length - 3` tokens (uniform in
    `[2, sequence_length - 3]` with probability `short_seq_prob`) is filled with whole
    sentences; the first `a_end` of them (random) form segment A. With probability 0.5, or
    always when only one sentence was gathered, B is read from a random start in another
    document (label 1, NotNext) and the unused sentences are read again for the next example;
    otherwise B is the rest of the gathered sentences (label 0, IsNext). The pair is truncated
    longest-first, one token at a time from the front or the back at random (computed in closed
    form: the kept lengths, then a Binomial(cut, 1/2) number of cuts at the front, which is the
    same distribution). The other document
    is drawn uniformly among all other documents (the reference retries up to 10 times and may
    fall back to the same document). With `nsp=False`, the gathered sentences form one segment
    of at most `sequence_length - 2` tokens, `segment_ids` are all 0 and the NSP entries are
    absent.

    Masking. Candidates are all tokens except `[CLS]`, `[SEP]` and `[PAD]`. The number of
    predictions is `min(max_predictions, max(1, round(num_candidates * mask_rate)))` (Python
    rounding, half to even). Each chosen token becomes `[MASK]` with probability
    `1 - random_token_rate - unchanged_rate`, a random token with probability
    `random_token_rate` (uniform over the vocabulary except `[PAD]`, `[UNK]`, `[CLS]`, `[SEP]`
    and `[MASK]`), and stays unchanged otherwise. With `whole_word_masking=True`, words
    (a piece followed by its "##" pieces, never across `[SEP]`) are visited in a random order
    and taken whole when they still fit in the prediction budget, so an example can get fewer
    predictions than the formula when no remaining word fits; each piece of a chosen word is
    still replaced independently (80/10/10), as in the reference. Masks are drawn by stateless
    random ops keyed by `(seed, pass, batch index)`.

    Args:
        files: str, path-like, or list of them. Text files or glob patterns; see
            `read_documents` for the formats (BERT's one sentence per line with blank lines
            between documents, or WikiText raw). Invalid UTF-8 is decoded as U+FFFD. `"auto"`
            looks for a WikiText title line in the first 20,000 lines of each file. Or shards
            (`*.tfrecord`) written by `tools/prepare_pretraining_data.py` with this
            tokenizer's vocabulary (shards of another vocabulary are refused). Empty and binary
            files are refused.
        tokenizer: a `kbert.text.BertTokenizer` or an object with the same interface:
            `tokenize(tf.string batch) -> tf.RaggedTensor` of ids, `vocabulary` (list of str)
            and `cls_token_id`, `sep_token_id`, `pad_token_id`, `mask_token_id`,
            `unk_token_id`.
        sequence_length: int. Length of every packed example. At least 8. Defaults to 128.
        max_predictions: int. Masked positions per example (the width of `mask_positions`).
            At most `sequence_length - 3` (`- 2` without NSP). Defaults to 20.
        mask_rate: float in [0, 1]. Fraction of the candidate tokens to predict.
            Defaults to 0.15.
        nsp: bool. Build sentence pairs with NSP labels. Needs at least two documents.
            Defaults to `True`.
        short_seq_prob: float in [0, 1]. Probability of a shorter target length.
            Defaults to 0.1.
        whole_word_masking: bool. Mask whole words instead of single pieces.
            Defaults to `False`.
        batch_size: int. Examples per batch. Defaults to 32.
        seed: int or `None`. Seed of the pairing and masking. `None` draws one at random.
            Defaults to `None`.
        dupe_factor: int. How many times each pass goes over every document (each time with
            different pairs). Defaults to 1.
        shuffle: bool. Shuffle the documents and the examples of each pass. With `False`,
            examples come in document order. Defaults to `True`.
        repeat: bool. Repeat forever; every repetition is a new pass with new pairs and
            masks. Defaults to `False`.
        random_token_rate: float in [0, 1]. Fraction of the chosen tokens replaced by a
            random token. Defaults to 0.1.
        unchanged_rate: float in [0, 1]. Fraction of the chosen tokens left unchanged.
            `random_token_rate + unchanged_rate` must be at most 1. Defaults to 0.1.
        text_format: str. `"auto"`, `"lines"` or `"wikitext"`; see `read_documents`.
            Defaults to `"auto"`.
        drop_remainder: bool. Drop the last, smaller batch of each pass. Defaults to `False`.
        verbose: bool. Print one line describing the input. Defaults to `False`.
        num_processes: int or `None`. Number of processes reading the data (see above).
            Pass it together with `process_index`. Defaults to `None`.
        process_index: int or `None`. This process's index, in `[0, num_processes)`.
            Defaults to `None`.
        document_buffer: int. Documents held for choosing the next document and the random
            next sentence. Defaults to 1000.
        example_buffer: int. Examples held for shuffling. Defaults to 10000.

    Returns:
        A `tf.data.Dataset` of `(x, y, sample_weight)`, the input of `BertPretrainer.fit`:
        `x` = `{"token_ids", "segment_ids", "padding_mask"}` int32 `(batch_size,
        sequence_length)` (`padding_mask` is 1 for real tokens, 0 for padding) and
        `"mask_positions"` int32 `(batch_size, max_predictions)`, ascending, padded with 0;
        `y` = `{"mlm"}` int32 `(batch_size, max_predictions)`, the original ids at
        `mask_positions` (0 in padded slots), and `"nsp"` int32 `(batch_size,)`, 0 = IsNext,
        1 = NotNext; `sample_weight` = `{"mlm"}` float32, 1 for a real prediction and 0 for a
        padded slot, and `"nsp"` float32 ones. Without NSP, the `"nsp"` keys are absent.

    Example:

    ```python
    tokenizer = kbert.text.BertTokenizer("vocab.txt")
    ds = kbert.data.pretraining_dataset(
        "wiki.valid.raw", tokenizer, sequence_length=128, batch_size=32, seed=0
    )
    x, y, sample_weight = next(iter(ds))
    pretrainer.fit(ds, epochs=3)  # new pairs and new masks every epoch
    ```

    Reference:
        Devlin et al., "BERT: Pre-training of Deep Bidirectional Transformers for Language
        Understanding", 2018 (arXiv 1810.04805); google-research/bert
        `create_pretraining_data.py`.
    """
    _check_tokenizer(tokenizer)
    _check_positive_int("sequence_length", sequence_length, minimum=8)
    _check_positive_int("max_predictions", max_predictions)
    max_maskable = sequence_length - (3 if nsp else 2)
    if max_predictions > max_maskable:
        raise ValueError(
            "`max_predictions` cannot exceed the number of maskable positions, "
            f"sequence_length - {3 if nsp else 2} = {max_maskable}. "
            f"Received: max_predictions={max_predictions}, sequence_length={sequence_length}"
        )
    _check_positive_int("batch_size", batch_size)
    _check_positive_int("dupe_factor", dupe_factor)
    _check_rate("short_seq_prob", short_seq_prob)
    _check_masking_rates(mask_rate, random_token_rate, unchanged_rate)
    seed = _checked_seed(seed)
    _check_positive_int("document_buffer", document_buffer)
    _check_positive_int("example_buffer", example_buffer)
    source, paths, kind, num_processes, process_index = _open_documents(
        files, tokenizer, text_format, num_processes, process_index, shuffle,
        min_documents=2 if nsp else 1,
    )
    if verbose:
        print(f"Pretraining data: {len(paths)} {kind} file(s), streamed; process "
              f"{process_index} of {num_processes}.")

    generator = _PairGenerator(
        source,
        sequence_length=sequence_length,
        nsp=nsp,
        short_seq_prob=short_seq_prob,
        dupe_factor=dupe_factor,
        shuffle=shuffle,
        repeat=repeat,
        batch_size=batch_size,
        drop_remainder=drop_remainder,
        seed=seed,
        cls_id=int(tokenizer.cls_token_id),
        sep_id=int(tokenizer.sep_token_id),
        pad_id=int(tokenizer.pad_token_id),
        document_buffer=document_buffer,
        example_buffer=example_buffer,
    )
    masker = _DynamicMasker(
        tokenizer,
        max_predictions=max_predictions,
        mask_rate=float(mask_rate),
        whole_word_masking=whole_word_masking,
        random_token_rate=float(random_token_rate),
        unchanged_rate=float(unchanged_rate),
        nsp=nsp,
    )
    rows = batch_size if drop_remainder else None
    dataset = tf.data.Dataset.from_generator(
        generator,
        output_signature=(
            tf.TensorSpec((rows, sequence_length), tf.int32),
            tf.TensorSpec((rows, sequence_length), tf.int32),
            tf.TensorSpec((rows,), tf.int32),
            tf.TensorSpec((rows,), tf.int32),
            tf.TensorSpec((2,), tf.int64),
        ),
    )
    # The masker is plain TensorFlow ops (its loop is an explicit `tf.while_loop`): no AutoGraph
    # conversion, which would cost seconds before the first batch.
    dataset = dataset.map(
        tf.autograph.experimental.do_not_convert(masker),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    return dataset.prefetch(tf.data.AUTOTUNE)


def _check_masking_rates(mask_rate, random_token_rate, unchanged_rate):
    """Checks the 80/10/10 rates: each in [0, 1], random + unchanged at most 1."""
    for name, value in (
        ("mask_rate", mask_rate),
        ("random_token_rate", random_token_rate),
        ("unchanged_rate", unchanged_rate),
    ):
        _check_rate(name, value)
    if random_token_rate + unchanged_rate > 1.0:
        raise ValueError(
            "`random_token_rate + unchanged_rate` must be at most 1 (the rest is the [MASK] "
            f"rate). Received: random_token_rate={random_token_rate}, "
            f"unchanged_rate={unchanged_rate}"
        )


def _checked_seed(seed):
    """`seed` as a non-negative int below 2**63 (a fresh random one for `None`), or a clear error."""
    if seed is None:
        seed = random.SystemRandom().randrange(2**31)
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"`seed` must be a non-negative integer or None. Received: seed={seed!r}")
    return int(seed) % (2**63)


def _open_documents(
    files, tokenizer, text_format, num_processes, process_index, shuffle, min_documents=1
):
    """Checks `files` (one kind: shards or text) and opens this process's document stream.

    Shards must carry `tokenizer`'s vocabulary; text files must hold at least `min_documents`
    documents (next sentence prediction needs two). Returns
    `(source, paths, kind, num_processes, process_index)`.
    """
    if text_format not in _TEXT_FORMATS:
        raise ValueError(
            f"`text_format` must be one of {_TEXT_FORMATS}. Received: text_format={text_format!r}"
        )
    num_processes, process_index = _process_split(num_processes, process_index)
    paths = _expand_files(files)
    shards = [p for p in paths if p.endswith(SHARD_SUFFIX)]
    if shards and len(shards) != len(paths):
        raise ValueError(
            f"`files` mixes pretraining shards ({SHARD_SUFFIX}) and text files; pass one kind. "
            f"Received: {len(shards)} shard(s) and {len(paths) - len(shards)} text file(s)"
        )
    kind = "shards" if shards else "text"
    if kind == "shards":
        check_shards(paths, tokenizer)
    else:
        for path in paths:
            _check_text_file(path)
        found = 0
        for path in paths:
            for _ in _iter_text_documents(path, text_format):
                found += 1
                if found >= min_documents:
                    break
            if found >= min_documents:
                break
        if not found:
            raise ValueError(f"No text found: the files hold no text. Received: files={files!r}")
        if found < min_documents:
            raise ValueError(
                "Next sentence prediction needs at least two documents (the random next "
                "sentence comes from another document), but the files hold one. Separate "
                "documents with blank lines (or WikiText ` = Title = ` lines), or pass nsp=False. "
                f"Received: files={files!r}"
            )
    source = _DocumentSource(
        paths, kind, tokenizer, text_format, num_processes, process_index, shuffle
    )
    return source, paths, kind, num_processes, process_index
