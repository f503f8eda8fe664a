"""Training a WordPiece vocabulary from raw text."""

import collections
import heapq
import os

import keras

from kbert.backend import tensorflow

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def _sources(files_or_texts):
    """Splits the input into a list of ("file", path) / ("texts", iterable)."""
    if isinstance(files_or_texts, (str, os.PathLike)):
        if not os.path.isfile(files_or_texts):
            raise ValueError(
                f"Training file not found: {os.fspath(files_or_texts)!r}. (To train "
                f"on a text, pass a list of strings.)"
            )
        files_or_texts = [files_or_texts]
    if tensorflow.is_dataset(files_or_texts):
        return [("dataset", files_or_texts)]
    if not isinstance(files_or_texts, (list, tuple)):
        try:
            files_or_texts = list(files_or_texts)
        except TypeError:
            raise ValueError(
                f"`files_or_texts` must be a file path, a list of file paths or "
                f"texts, or a tf.data.Dataset of strings. Received an object of "
                f"type {type(files_or_texts).__name__}."
            ) from None
    sources, texts = [], []
    for item in files_or_texts:
        if isinstance(item, os.PathLike) or (isinstance(item, str) and os.path.isfile(item)):
            path = os.fspath(item)
            if not os.path.isfile(path):
                raise ValueError(f"Training file not found: {path!r}.")
            sources.append(("file", path))
        elif isinstance(item, (str, bytes)):
            texts.append(item)
        else:
            raise ValueError(
                f"`files_or_texts` items must be file paths or strings. Received "
                f"an item of type {type(item).__name__}: {item!r}."
            )
    if texts:
        sources.append(("texts", texts))
    if not sources:
        raise ValueError("`files_or_texts` is empty: nothing to train on.")
    return sources


def _batches(sources, batch_size, progress):
    """Yields lists of raw lines, updating `progress` (bytes or lines)."""
    done = 0
    for kind, source in sources:
        if kind == "file":
            with open(source, "rb") as f:
                batch = []
                for line in f:
                    batch.append(line)
                    done += len(line)
                    if len(batch) == batch_size:
                        yield batch
                        batch = []
                        progress(done)
                if batch:
                    yield batch
                    progress(done)
        elif kind == "texts":
            for start in range(0, len(source), batch_size):
                yield list(source[start : start + batch_size])
                done += len(source[start : start + batch_size])
                progress(done)
        else:
            for batch in source.batch(batch_size):
                yield list(batch.numpy())
                done += int(batch.shape[0])
                progress(done)


def _learn_wordpiece(word_counts, vocabulary_size, min_frequency, limit_alphabet, head, verbose):
    """Deterministic WordPiece vocabulary learning (count-based merges, as HF's trainer).

    Words start as characters (`##`-prefixed inside a word); the most frequent adjacent pair is
    merged until the vocabulary is full or the best pair occurs fewer than `min_frequency`
    times. Ties are broken by the pair's strings (smallest first) and the alphabet is ranked
    by count then character, so the result is a pure function of the text (Hugging Face's
    `WordPieceTrainer` breaks ties by hash-map order: two trainings differ).
    """
    char_counts = collections.Counter()
    for word, count in word_counts.items():
        for char in word:
            char_counts[char] += count
    chars = sorted(char_counts, key=lambda ch: (-char_counts[ch], ch))
    if limit_alphabet is not None:
        chars = chars[:limit_alphabet]
    alphabet = set(chars)
    vocabulary, seen = list(head), set(head)

    def add(token):
        if token not in seen:
            seen.add(token)
            vocabulary.append(token)

    words, counts = [], []
    for word, count in sorted(word_counts.items()):
        symbols = []
        for char in word:
            if char in alphabet:
                symbols.append("##" + char if symbols else char)
        if symbols:
            words.append(symbols)
            counts.append(count)
    for token in sorted(
        {s for symbols in words for s in symbols}, key=lambda t: (t.startswith("##"), t)
    ):
        add(token)
    pair_counts = collections.defaultdict(int)
    where = collections.defaultdict(set)
    for i, (symbols, count) in enumerate(zip(words, counts)):
        for pair in zip(symbols, symbols[1:]):
            pair_counts[pair] += count
            where[pair].add(i)
    heap = [(-count, a, b) for (a, b), count in pair_counts.items()]
    heapq.heapify(heap)
    progbar = keras.utils.Progbar(vocabulary_size, unit_name="token", verbose=1 if verbose else 0)
    while len(vocabulary) < vocabulary_size and heap:
        negative, a, b = heapq.heappop(heap)
        count = pair_counts.get((a, b), 0)
        if count != -negative:
            continue  # Stale entry: the current count was pushed when it changed.
        if count < min_frequency:
            break
        new = a + b[2:]
        add(new)
        changed = set()
        for i in sorted(where.pop((a, b), ())):
            symbols, word_count = words[i], counts[i]
            old_pairs = list(zip(symbols, symbols[1:]))
            merged, j = [], 0
            while j < len(symbols):
                if j + 1 < len(symbols) and symbols[j] == a and symbols[j + 1] == b:
                    merged.append(new)
                    j += 2
                else:
                    merged.append(symbols[j])
                    j += 1
            if len(merged) == len(symbols):
                continue
            words[i] = merged
            new_pairs = list(zip(merged, merged[1:]))
            for pair in old_pairs:
                pair_counts[pair] -= word_count
            for pair in new_pairs:
                pair_counts[pair] += word_count
                where[pair].add(i)
            changed.update(old_pairs)
            changed.update(new_pairs)
        pair_counts.pop((a, b), None)
        for pair in sorted(changed):
            count = pair_counts.get(pair, 0)
            if count > 0 and pair != (a, b):
                heapq.heappush(heap, (-count, pair[0], pair[1]))
        progbar.update(len(vocabulary))
    return vocabulary


def train_wordpiece_vocabulary(
    files_or_texts,
    vocabulary_size,
    lowercase=True,
    strip_accents=None,
    min_frequency=2,
    limit_alphabet=1000,
    reserved_tokens=(),
    output_path=None,
    batch_size=1024,
    verbose=True,
):
    """Learns a WordPiece vocabulary for `kbert.text.BertTokenizer`.

    The text is first normalised and split into words exactly as
    `BertTokenizer` will do it (same `lowercase` / `strip_accents`), then the
    sub-words are learned as Hugging Face `tokenizers`' `WordPieceTrainer`
    does (start from characters, `##` marking word-internal pieces, merge the
    most frequent adjacent pair until the vocabulary is full), but
    deterministically: ties are broken by the pieces' text, so the same text
    and arguments always give the same vocabulary (HF's trainer breaks ties by
    hash-map order and differs from one training to the next).

    The vocabulary starts with `[PAD] [UNK] [CLS] [SEP] [MASK]` (ids 0 to 4),
    then `reserved_tokens` (e.g. `[unused0]`...), then the learned tokens:
    single characters (the alphabet, capped at `limit_alphabet` most frequent
    characters, then their `##` forms, each sorted) first, then merged pieces
    in the order they were learned. (The original
    English BERT vocabularies put `[PAD]` at 0, `[unused*]` slots, then
    `[UNK]`=100 `[CLS]`=101 `[SEP]`=102 `[MASK]`=103; kbert looks special
    tokens up by name, so either order works.) A small corpus can give fewer
    tokens than `vocabulary_size`.

    Args:
        files_or_texts: the path of a UTF-8 text file; or a list whose items
            are file paths (`os.PathLike`, or a `str` naming an existing
            file) or texts (any other `str`); or a `tf.data.Dataset` of
            scalar strings. Files are read line by line.
        vocabulary_size: int. Target size, special tokens included.
        lowercase: bool. Train an uncased vocabulary. Defaults to `True`.
        strip_accents: bool or None. As in `BertTokenizer`: `None` strips
            accents iff `lowercase`. Defaults to `None`.
        min_frequency: int. Minimum count of a pair to be merged. Defaults to
            `2`.
        limit_alphabet: int or None. Maximum number of distinct characters
            kept. Defaults to `1000`.
        reserved_tokens: list of str. Extra tokens placed right after the
            special tokens. Defaults to `()`.
        output_path: str or None. Where to write `vocab.txt` (a directory
            gets a `vocab.txt` inside). Defaults to `None` (no file).
        batch_size: int. Lines normalised per TensorFlow call. Defaults to
            `1024`.
        verbose: bool. Show progress bars. Defaults to `True`.

    Returns:
        The vocabulary, a list of str (index = id).

    Example:

    >>> texts = ["the quick brown fox", "the lazy dog", "the quick dog"] * 10
    >>> vocab = kbert.text.train_wordpiece_vocabulary(
    ...     texts, vocabulary_size=40, output_path="my_bert/", verbose=False
    ... )
    >>> len(vocab), vocab[:5]
    (40, ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'])
    >>> tokenizer = kbert.text.BertTokenizer("my_bert/vocab.txt")
    >>> [vocab[i] for i in tokenizer("The lazy fox")]
    ['the', 'l', '##azy', 'f', '##ox']
    """
    if not isinstance(vocabulary_size, int) or vocabulary_size <= len(SPECIAL_TOKENS):
        raise ValueError(
            f"`vocabulary_size` must be an integer larger than the "
            f"{len(SPECIAL_TOKENS)} special tokens. Received: "
            f"vocabulary_size={vocabulary_size!r}"
        )
    reserved_tokens = list(reserved_tokens)
    clash = [t for t in reserved_tokens if t in SPECIAL_TOKENS]
    if clash or len(set(reserved_tokens)) != len(reserved_tokens):
        raise ValueError(
            f"`reserved_tokens` must be distinct and must not repeat the special "
            f"tokens {list(SPECIAL_TOKENS)}. Received: {reserved_tokens}"
        )
    sources = _sources(files_or_texts)
    do_strip = lowercase if strip_accents is None else bool(strip_accents)
    tf = tensorflow.tensorflow("train_wordpiece_vocabulary")
    from kbert.text._pretokenizer import PreTokenizer

    pretokenizer = PreTokenizer(lowercase, do_strip)
    split = tf.function(
        lambda texts: pretokenizer.split_words(texts),
        input_signature=[tf.TensorSpec([None], tf.string)],
    )

    total = None
    if all(kind == "file" for kind, _ in sources):
        total = sum(os.path.getsize(path) for _, path in sources)
    elif all(kind == "texts" for kind, _ in sources):
        total = sum(len(texts) for _, texts in sources)
    bar = keras.utils.Progbar(
        total,
        unit_name="B" if total and sources[0][0] == "file" else "line",
        verbose=1 if verbose else 0,
    )
    if verbose:
        print("Normalising and splitting the text into words:")

    word_counts = collections.Counter()
    for batch in _batches(sources, batch_size, lambda done: bar.update(done)):
        words = split(tf.constant(batch, dtype=tf.string, shape=[len(batch)]))
        for row in words.to_list():
            word_counts.update(w.decode("utf-8") for w in row)
    if verbose:
        print("Learning the sub-words:")
    head = list(SPECIAL_TOKENS) + reserved_tokens
    vocabulary = _learn_wordpiece(
        word_counts, vocabulary_size, min_frequency, limit_alphabet, head, verbose
    )

    if output_path is not None:
        output_path = os.fspath(output_path)
        if os.path.isdir(output_path) or output_path.endswith(os.sep):
            os.makedirs(output_path, exist_ok=True)
            output_path = os.path.join(output_path, "vocab.txt")
        with open(output_path, "w", encoding="utf-8", newline="\n") as f:
            for token in vocabulary:
                f.write(token + "\n")
        if verbose:
            print(f"Wrote {len(vocabulary)} tokens to {output_path}")
    return vocabulary
