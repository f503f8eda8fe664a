"""Pretraining documents: text files read as streams of documents made of sentences.

The first stage of the pretraining pipeline (`kbert.data.pretraining_dataset`,
`kbert.data.packed_pretraining_dataset`, `kbert.data.write_pretraining_shards`). Text files
are read line by line and parsed into documents (BERT's one sentence per line with blank lines
between documents, or WikiText raw); a `DocumentSource` splits the files (or pre-tokenized
shards, `kbert.data.shard_records`) between processes and tokenizes the sentences in chunks, in
worker threads, yielding each document as one flat array of ids with its sentence offsets.
"""

import codecs
import collections
import concurrent.futures
import os
import re
import warnings

import numpy as np

from kbert.backend import tensorflow
from kbert.data.checks import check_positive_int
from kbert.data.shard_records import SHARD_SUFFIX, check_shards, read_shard_flat_documents

tf = tensorflow.tensorflow("kbert's pretraining pipeline")

# A WikiText article title: " = Title = ". Section headings (" = = Section = = ") do not match.
_WIKITEXT_TITLE = re.compile(r"^ = [^=].* = $")
# Sentence boundary used for WikiText paragraphs: whitespace after ".", "?" or "!".
_SENTENCE_BOUNDARY = re.compile(r"(?<=[.!?])\s+(?=\S)")
TEXT_FORMATS = ("auto", "lines", "wikitext")
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


def expand_files(files):
    if isinstance(files, (str, bytes, os.PathLike)):
        files = [files]
    try:
        files = list(files)
    except TypeError:
        raise ValueError(
            f"`files` must be a path, a glob pattern or a list of them. Received: files={files!r}"
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
    if text_format not in TEXT_FORMATS:
        raise ValueError(
            f"`text_format` must be one of {TEXT_FORMATS}. Received: text_format={text_format!r}"
        )
    documents = []
    for path in expand_files(files):
        with tf.io.gfile.GFile(path, "rb") as f:
            text = f.read().decode("utf-8", errors="replace")
        documents.extend(_parse_text(text, text_format))
    return documents


def check_tokenizer(tokenizer):
    missing = [name for name in _TOKENIZER_ATTRIBUTES if not hasattr(tokenizer, name)]
    if missing:
        raise ValueError(
            "`tokenizer` must provide `tokenize`, `vocabulary` and the special token ids "
            f"(like `kbert.text.BertTokenizer`). Missing: {missing}. "
            f"Received: tokenizer={type(tokenizer).__name__}"
        )


# ------------------------------------------------------------------------------ streaming
_PROBE_BYTES = 1 << 16
_AUTO_PROBE_LINES = 20000


def check_text_file(path):
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


def iter_text_documents(path, text_format):
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


class DocumentSource:
    """The tokenized documents of one pass of one process, read as a stream.

    Files are split across processes (file `i` goes to process `i % num_processes`) when there
    are at least as many files as processes, else documents are (document `k` of the stream goes
    to process `k % num_processes`). Each pass reads this process's files in a seeded random
    order (with `shuffle`), `cycle_length` files at a time, one document from each in turn
    (text files in groups of `cycle_length`; shards by a `tf.data` interleave that replaces a
    finished file by the next one). Text is tokenized in chunks of sentences by worker threads,
    one per CPU core (at least 2).
    """

    def __init__(
        self,
        paths,
        kind,
        tokenizer,
        text_format,
        num_processes,
        process_index,
        shuffle,
        cycle_length=4,
        chunk_size=2048,
        num_threads=None,
    ):
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
            iterators = [iter_text_documents(p, self.text_format) for p in group]
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
                parts.append(
                    (
                        int(document_ids[first]),
                        flat[offsets[first] : offsets[stop]],
                        lengths[first:stop],
                    )
                )
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


def process_split(num_processes, process_index):
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
    check_positive_int("num_processes", num_processes)
    check_positive_int("process_index", process_index, minimum=0)
    if process_index >= num_processes:
        raise ValueError(
            f"`process_index` must be smaller than `num_processes` (processes are numbered "
            f"0 to {num_processes - 1}). Received: process_index={process_index}, "
            f"num_processes={num_processes}"
        )
    return int(num_processes), int(process_index)


def open_documents(
    files, tokenizer, text_format, num_processes, process_index, shuffle, min_documents=1
):
    """Checks `files` (one kind: shards or text) and opens this process's document stream.

    Shards must carry `tokenizer`'s vocabulary; text files must hold at least `min_documents`
    documents (next sentence prediction needs two). Returns
    `(source, paths, kind, num_processes, process_index)`.
    """
    if text_format not in TEXT_FORMATS:
        raise ValueError(
            f"`text_format` must be one of {TEXT_FORMATS}. Received: text_format={text_format!r}"
        )
    num_processes, process_index = process_split(num_processes, process_index)
    paths = expand_files(files)
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
            check_text_file(path)
        found = 0
        for path in paths:
            for _ in iter_text_documents(path, text_format):
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
    source = DocumentSource(
        paths, kind, tokenizer, text_format, num_processes, process_index, shuffle
    )
    return source, paths, kind, num_processes, process_index
