"""BERT WordPiece tokenizer: identical ids to the reference, in Python and in tf.data graphs."""

import os
import re

import keras
import numpy as np

from kbert.backend import tensorflow
from kbert.checkpoints.vocabulary import (
    read_tokenizer_files,
    read_vocabulary,
    vocabulary_is_uncased,
    write_tokenizer_files,
)
from kbert.text._python_engine import PythonEngine, SpecialToken

_SURROGATES = re.compile("[\ud800-\udfff]")

# Strings of printable ASCII, tab, newline and carriage return (an RE2 pattern). On them the
# reference's normalisation reduces to lower-casing (no accents, CJK, control or format
# characters; every ASCII symbol is punctuation for both), so tensorflow-text's fused
# `FastBertTokenizer` gives the reference's ids: tests/text/test_tokenizer.py checks this on
# adversarial strings (all symbols, written special tokens, words at the length limit).
_PLAIN_ASCII = r"[\t\n\r -~]*"


def _check_vocabulary(vocabulary, required):
    if not vocabulary:
        raise ValueError("`vocabulary` is empty. Expected a non-empty list of tokens.")
    bad = [(i, t) for i, t in enumerate(vocabulary) if not isinstance(t, str) or not t]
    if bad:
        shown = ", ".join(f"index {i}: {t!r}" for i, t in bad[:5])
        raise ValueError(
            f"Every vocabulary token must be a non-empty string. Received "
            f"{len(bad)} invalid entries ({shown})."
        )
    seen, duplicates = set(), []
    for token in vocabulary:
        if token in seen:
            duplicates.append(token)
        seen.add(token)
    if duplicates:
        shown = ", ".join(repr(t) for t in duplicates[:10])
        raise ValueError(
            f"`vocabulary` contains duplicate tokens: {shown}"
            f"{' ...' if len(duplicates) > 10 else ''} ({len(duplicates)} in all). "
            f"Expected each token exactly once."
        )
    missing = [t for t in required if t not in seen]
    if missing:
        raise ValueError(
            f"`vocabulary` is missing the special tokens {missing}. A BERT "
            f"vocabulary must contain all of {list(required)}."
        )


def _check_specials_do_not_overlap(tokens):
    """The graph matches special tokens in parallel; two matches must never overlap, so no
    token may contain another, nor end with a prefix of one."""
    for a in tokens:
        for b in tokens:
            if a != b and b in a:
                raise ValueError(
                    f"The in-graph tokenizer (string tensors, tf.data) cannot honour special "
                    f"tokens that contain one another. Received {a!r} containing {b!r}. "
                    f"Tokenize Python strings instead, or pass special_tokens_in_strings=False."
                )
            for k in range(1, min(len(a), len(b))):
                if a[-k:] == b[:k]:
                    raise ValueError(
                        f"The in-graph tokenizer (string tensors, tf.data) cannot honour special "
                        f"tokens that can overlap in text. Received {a!r} and {b!r}. Tokenize "
                        f"Python strings instead, or pass special_tokens_in_strings=False."
                    )


_SPECIAL_TOKEN_FLAGS = ("lstrip", "rstrip", "normalized", "single_word")


def _check_special_tokens(special_tokens, token_to_id):
    """`special_tokens` as a list of dicts with `content` and every flag (None stays None)."""
    if special_tokens is None:
        return None
    if not isinstance(special_tokens, (list, tuple)):
        raise ValueError(
            f"`special_tokens` must be None or a list of str or dicts. Received an object of "
            f"type {type(special_tokens).__name__}."
        )
    result = []
    for position, token in enumerate(special_tokens):
        if isinstance(token, str):
            token = {"content": token}
        if not isinstance(token, dict) or not isinstance(token.get("content"), str):
            raise ValueError(
                f"Each entry of `special_tokens` must be a str or a dict with a str `content` "
                f"(and optional bool {', '.join(_SPECIAL_TOKEN_FLAGS)}). Received at index "
                f"{position}: {token!r}."
            )
        unknown = sorted(set(token) - {"content", *_SPECIAL_TOKEN_FLAGS})
        bad = [f for f in _SPECIAL_TOKEN_FLAGS if not isinstance(token.get(f, False), bool)]
        if unknown or bad:
            raise ValueError(
                f"`special_tokens[{position}]` may only have the keys content, "
                f"{', '.join(_SPECIAL_TOKEN_FLAGS)} (flags bool). Received: {token!r}."
            )
        if token["content"] not in token_to_id:
            raise ValueError(
                f"Special token {token['content']!r} (`special_tokens[{position}]`) is not in "
                f"the vocabulary. Expected every special token to be a vocabulary token."
            )
        result.append(
            {"content": token["content"], **{f: token.get(f, False) for f in _SPECIAL_TOKEN_FLAGS}}
        )
    return result


def _as_python_text(value, name):
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            value = _SURROGATES.sub("\ufffd", value)
        return value
    raise ValueError(
        f"`{name}` must be a string, a list of strings, or a string tensor. "
        f"Received an element of type {type(value).__name__}: {value!r}."
    )


def _classify_text_input(inputs, name="inputs"):
    """Returns ("scalar" | "list", list of str/bytes), ("array", numpy array of object) for
    a numpy array when TensorFlow is absent, or ("tensor", string tensor)."""
    if isinstance(inputs, (str, bytes)):
        return "scalar", [_as_python_text(inputs, name)]
    if isinstance(inputs, (list, tuple)):
        return "list", [_as_python_text(x, name) for x in inputs]
    if isinstance(inputs, np.ndarray):
        if inputs.dtype.kind not in "USO":
            raise ValueError(
                f"`{name}` must hold strings. Received a numpy array of dtype {inputs.dtype}."
            )
        inputs = np.vectorize(lambda x: _as_python_text(x, name), otypes=[object])(inputs)
        if not tensorflow.available():
            return "array", inputs
        return "tensor", tensorflow.tensorflow().constant(inputs.astype(object))
    if tensorflow.is_tensor(inputs):
        tf = tensorflow.tensorflow()
        if inputs.dtype != tf.string:
            raise ValueError(
                f"`{name}` must be a string tensor. Received a tensor of dtype {inputs.dtype.name}."
            )
        return "tensor", inputs
    raise ValueError(
        f"`{name}` must be a string, a list of strings, or a string tensor. "
        f"Received an object of type {type(inputs).__name__}."
    )


def _python_text(value):
    """A str (bytes decoded as UTF-8, invalid sequences as U+FFFD, deleted later)."""
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value


def _map_over_array(fn, array, num_outputs):
    """Applies `fn` (str -> tuple of lists) to every string of a numpy array: nested lists
    shaped like the array, one per output."""
    if not isinstance(array, np.ndarray) or array.ndim == 0:
        value = array.item() if isinstance(array, np.ndarray) else array
        return fn(_python_text(value))[:num_outputs]
    parts = [_map_over_array(fn, row, num_outputs) for row in array]
    return tuple([part[k] for part in parts] for k in range(num_outputs))


def _map_over_strings(fn, inputs, num_outputs):
    """Applies `fn` (1-D strings -> tuple of RaggedTensor [B, None]) to a
    string tensor of any rank, keeping the outer shape."""
    tf = tensorflow.tensorflow()
    if isinstance(inputs, tf.RaggedTensor):
        outputs = _map_over_strings(fn, inputs.flat_values, num_outputs)
        return tuple(inputs.with_flat_values(o) for o in outputs)
    rank = inputs.shape.rank
    if rank == 1:
        return fn(inputs)
    if rank == 0:
        return tuple(o[0] for o in fn(tf.reshape(inputs, [1])))
    if rank is None:
        raise ValueError("String tensors of unknown rank are not supported.")
    outputs = fn(tf.reshape(inputs, [-1]))
    shape = tf.shape(inputs, out_type=tf.int64)
    results = []
    for output in outputs:
        for axis in range(rank - 1, 0, -1):
            output = tf.RaggedTensor.from_uniform_row_length(output, shape[axis])
        results.append(output)
    return tuple(results)


@keras.saving.register_keras_serializable(package="kbert")
class BertTokenizer:
    """BERT WordPiece tokenizer, identical to the original and graph-capable.

    Produces exactly the ids of the reference BERT tokenizer
    (google-research/bert `tokenization.FullTokenizer`): the text is cleaned
    (NUL, U+FFFD and Unicode Cc/Cf control/format characters are deleted; tab,
    newline, CR and category Zs become spaces), CJK ideographs are isolated,
    then (with `lowercase`) each word is lower-cased with Python's rules,
    NFD-decomposed and stripped of non-spacing marks, split at punctuation
    (ASCII symbols and Unicode P*) and cut into WordPieces greedily
    (longest match first); a word with no complete segmentation, or longer
    than `max_chars_per_word` characters, becomes `[UNK]`.

    Python strings are tokenized in plain Python, so the tokenizer works
    without TensorFlow. String tensors (and anything inside `tf.data` /
    `tf.function`) go through a TensorFlow graph: the normalisation as table
    look-ups, the WordPiece step as tensorflow-text's
    `FastWordpieceTokenizer` (needs `pip install "kbert[tensorflow]"`). Both
    are built from the same per-character decisions, taken with Python's
    `unicodedata` (the functions the reference calls), and give identical
    ids, offsets and word ids. When only ids are asked for (`tokenize` on
    tensors, as in the pretraining pipeline), strings of plain ASCII go
    through tensorflow-text's fused `FastBertTokenizer` instead, whose ids
    equal the reference's on such text; other strings keep the exact graph.

    Input and output types:
    - a Python `str` gives a `list[int]`; a list of `str` gives a
      `list[list[int]]`;
    - a `tf.string` tensor (or numpy array of strings) of shape `[...]` gives
      int32 tensors of shape `[..., None]` (a dense 1-D tensor for a scalar,
      a `tf.RaggedTensor` otherwise).

    Offsets (`tokenize_with_offsets`) are character (code point) offsets into
    the original string, i.e. Python `str` indices: `text[start:end]` is the
    text a piece came from. Bytes that are not valid UTF-8 are decoded as
    U+FFFD (one per invalid sequence, as `tf.strings.unicode_decode` does) and
    then deleted like in the reference; offsets then count those U+FFFD.
    Lone surrogates in Python strings are treated the same way.

    Special tokens written in text (`"a [MASK] b"`): with
    `special_tokens_in_strings=False` (the default, and what a Google
    checkpoint or a kbert preset without other settings gives) they are plain
    text, as in the original (`[`, `mask`, `]`). With `True` each becomes its
    single id, as Hugging Face's tokenizers do: also inside words and next to
    punctuation (`"a[MASK]b"` is `a`, `[MASK]`, `b`), its offsets covering
    the string as written. `from_preset` of a Hugging Face or
    sentence-transformers directory turns this on unless its
    `tokenizer_config.json` says `split_special_tokens: true`, and takes the
    special tokens its files declare (`tokenizer.json`'s `added_tokens` with
    `special: true`, else `tokenizer_config.json` / `special_tokens_map.json`)
    with their `AddedToken` settings: `normalized` tokens are found in the
    lower-cased, accent-stripped text (`[mask]` matches), the others
    verbatim (case-sensitive); `lstrip` / `rstrip` take the whitespace on
    their left / right into the token, `single_word` ones only stand between
    non-word characters. String tensors (tf.data, SavedModel) honour
    verbatim tokens without these settings and raise a `ValueError` for the
    others. `save_to_preset` records the choice (`split_special_tokens` in
    `tokenizer_config.json`), so Hugging Face and kbert read it back alike.

    Where Hugging Face departs from the original, kbert follows the original:
    Python's `str.lower()` turns a word-final capital sigma into `ς` (the
    `tokenizers` library lower-cases character by character), private-use
    and unassigned characters are kept (Hugging Face deletes every category
    C* character, the original only Cc and Cf), character classes come from
    the running Python's `unicodedata` (like the original), and no NFC
    normalisation is applied (Hugging Face's Python tokenizer adds one).
    Pair truncation in `BertPacker` also follows the original.

    Args:
        vocabulary: list of str, or str path of a `vocab.txt` (one token per
            line; the line index is the id) or of a Hugging Face
            `tokenizer.json` (its WordPiece vocabulary; `from_preset` also
            reads its settings). Must contain `[CLS]`, `[SEP]`,
            `[MASK]`, `[PAD]` and `unknown_token`, each exactly once.
        lowercase: bool. Lower-case the input (uncased models). Defaults to
            `True`.
        strip_accents: bool or None. NFD-decompose and drop non-spacing marks.
            `None` means "strip iff `lowercase`", as the original. Defaults to
            `None`.
        special_tokens_in_strings: bool. Honour special tokens written in the
            text as single tokens. Defaults to `False`.
        max_chars_per_word: int. Words longer than this many characters (after
            normalisation) become the unknown token. Defaults to `100` (the
            value of Hugging Face's tokenizers; the 2018 reference used 200).
        unknown_token: str. The unknown token. Defaults to `"[UNK]"`.
        special_tokens: list or None. The special tokens honoured in text with
            `special_tokens_in_strings`: each a str, or a dict with `content`
            and the optional bools `lstrip`, `rstrip`, `normalized` and
            `single_word` (Hugging Face's `AddedToken` settings, all `False`
            by default). Each must be in the vocabulary. `None` means `[CLS]`,
            `[SEP]`, `[MASK]`, `[PAD]` and `unknown_token`. Defaults to `None`.

    Example:

    >>> tokenizer = kbert.text.BertTokenizer(
    ...     ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "qu", "##ick",
    ...      "fox", "."]
    ... )
    >>> tokenizer("The quick fox.")
    [5, 6, 7, 8, 9]
    >>> tokenizer.detokenize([5, 6, 7, 8, 9])
    'the quick fox .'
    >>> import tensorflow as tf
    >>> ds = tf.data.Dataset.from_tensor_slices(["The quick fox."]).map(tokenizer)
    >>> list(ds.as_numpy_iterator())
    [array([5, 6, 7, 8, 9], dtype=int32)]

    Reference:
        [Devlin et al., 2018](https://arxiv.org/abs/1810.04805);
        google-research/bert `tokenization.py`.
    """

    def __init__(
        self,
        vocabulary,
        lowercase=True,
        strip_accents=None,
        special_tokens_in_strings=False,
        max_chars_per_word=100,
        unknown_token="[UNK]",
        special_tokens=None,
    ):
        if isinstance(vocabulary, (str, os.PathLike)):
            tokens = read_vocabulary(vocabulary)
        elif isinstance(vocabulary, (list, tuple)):
            tokens = list(vocabulary)
        elif isinstance(vocabulary, np.ndarray):
            tokens = [t.decode("utf-8") if isinstance(t, bytes) else t for t in vocabulary.tolist()]
        else:
            raise ValueError(
                f"`vocabulary` must be a list of str or the path of a vocab.txt "
                f"file. Received an object of type {type(vocabulary).__name__}."
            )
        if not isinstance(unknown_token, str) or not unknown_token:
            raise ValueError(
                f"`unknown_token` must be a non-empty string. Received: "
                f"unknown_token={unknown_token!r}"
            )
        if not isinstance(max_chars_per_word, int) or max_chars_per_word < 1:
            raise ValueError(
                f"`max_chars_per_word` must be a positive integer. Received: "
                f"max_chars_per_word={max_chars_per_word!r}"
            )
        if strip_accents not in (None, True, False):
            raise ValueError(
                f"`strip_accents` must be None, True or False. Received: "
                f"strip_accents={strip_accents!r}"
            )
        _check_vocabulary(tokens, ("[CLS]", "[SEP]", "[MASK]", unknown_token, "[PAD]"))
        self._vocabulary = tokens
        self._token_to_id = {t: i for i, t in enumerate(tokens)}
        self.lowercase = bool(lowercase)
        self.strip_accents = strip_accents
        self.special_tokens_in_strings = bool(special_tokens_in_strings)
        self.max_chars_per_word = max_chars_per_word
        self.unknown_token = unknown_token

        self.special_tokens = _check_special_tokens(special_tokens, self._token_to_id)
        specs = []
        if self.special_tokens_in_strings:
            specs = self.special_tokens
            if specs is None:
                specs = [{"content": t} for t in ("[CLS]", "[SEP]", "[MASK]", "[PAD]")]
                specs.append({"content": unknown_token})
            specs = [
                SpecialToken(t["content"], *(t.get(f, False) for f in _SPECIAL_TOKEN_FLAGS))
                for t in specs
            ]
        self._special_specs = specs
        self._special_tokens = [t.content for t in specs]
        self._strip = self.lowercase if strip_accents is None else bool(strip_accents)
        self._python_engine = PythonEngine(
            self._token_to_id,
            lowercase=self.lowercase,
            strip_accents=self._strip,
            special_tokens=specs,
            special_ids=[self._token_to_id[t] for t in self._special_tokens],
            unknown_id=self._token_to_id[unknown_token],
            max_chars_per_word=max_chars_per_word,
        )
        self._graph = None  # TensorFlow objects, built on first use with tensors.

    def _graph_state(self):
        """The TensorFlow side (tables, tensorflow-text engine, traced functions), built on
        the first tensor input; needs TensorFlow and tensorflow-text."""
        if self._graph is not None:
            return self._graph
        what = "BertTokenizer on TensorFlow tensors (tf.data / tf.function)"
        tf = tensorflow.tensorflow(what)
        tensorflow.tensorflow_text(what)
        # Tables and traced functions live outside any graph being traced (first use is
        # often inside `Dataset.map`): build them eagerly.
        with tf.init_scope():
            return self._build_graph_state(tf)

    def graph_resources(self):
        """The TensorFlow objects the in-graph tokenizer uses (the tensorflow-text WordPiece
        engine, lookup tables): what a `tf.Module` must track to save it in a SavedModel.
        Needs TensorFlow and tensorflow-text."""
        graph = self._graph_state()
        resources = [graph["engine"], graph["plain_engine"]]
        table = getattr(graph["pretokenizer"], "_mapped", None)
        if table is not None:
            resources.append(table)
        return resources

    def _build_graph_state(self, tf):
        tf_text = tensorflow.tensorflow_text()
        from kbert.text._pretokenizer import PreTokenizer

        for token in self._special_specs:
            flags = [f for f in _SPECIAL_TOKEN_FLAGS if getattr(token, f)]
            if flags:
                raise ValueError(
                    f"The in-graph tokenizer (string tensors, tf.data, SavedModel) finds "
                    f"special tokens written verbatim only. Received the special token "
                    f"{token.content!r} with {', '.join(f + '=True' for f in flags)}. Tokenize "
                    f"Python strings instead (the Python engine honours these settings), or "
                    f"pass special_tokens_in_strings=False."
                )
        _check_specials_do_not_overlap(self._special_tokens)

        graph = {}
        graph["special_ids"] = tf.constant(
            [self._token_to_id[t] for t in self._special_tokens] or [0], dtype=tf.int32
        )
        graph["special_tokens"] = tf.constant(self._special_tokens or [""], dtype=tf.string)
        graph["pretokenizer"] = PreTokenizer(self.lowercase, self._strip, self._special_tokens)
        # Words longer than this many bytes are certainly longer than
        # `max_chars_per_word` characters; the engine gives them [UNK].
        max_bytes = 4 * self.max_chars_per_word + 4
        graph["engine"] = tf_text.FastWordpieceTokenizer(
            vocab=self._vocabulary,
            suffix_indicator="##",
            max_bytes_per_word=max_bytes,
            token_out_type=tf.int32,
            unknown_token=self.unknown_token,
            no_pretokenization=True,
        )
        # Ids of plain-ASCII strings in one fused op (see `_PLAIN_ASCII`); with special tokens
        # honoured in text, only for strings that contain none of them.
        graph["plain_engine"] = tf_text.FastBertTokenizer(
            vocab=self._vocabulary,
            suffix_indicator="##",
            max_bytes_per_word=self.max_chars_per_word,
            token_out_type=tf.int32,
            unknown_token=self.unknown_token,
            lower_case_nfd_strip_accents=self.lowercase,
        )
        graph["has_special"] = None
        if self._special_tokens:
            alternatives = "|".join(
                "".join(c if c.isascii() and c.isalnum() else f"\\x{{{ord(c):x}}}" for c in t)
                for t in self._special_tokens
            )
            graph["has_special"] = f"(?s).*(?:{alternatives}).*"
        graph["vocabulary"] = tf.constant(self._vocabulary, dtype=tf.string)
        graph["too_long_word"] = tf.constant("a" * (max_bytes + 1))
        self._graph = graph
        graph["tokenize"] = tf.function(
            self._tokenize_graph,
            input_signature=[tf.TensorSpec([None], tf.string)],
            autograph=False,
        )
        graph["ids"] = tf.function(
            self._ids_graph,
            input_signature=[tf.TensorSpec([None], tf.string)],
            autograph=False,
        )
        graph["split"] = tf.function(
            self._split_graph,
            input_signature=[tf.TensorSpec([None], tf.string)],
            autograph=False,
        )
        graph["detokenize"] = tf.function(
            self._detokenize_graph,
            input_signature=[tf.RaggedTensorSpec([None, None], tf.int32, ragged_rank=1)],
            autograph=False,
        )
        return graph

    # ------------------------------------------------------------------ #
    # Vocabulary.
    # ------------------------------------------------------------------ #
    @property
    def vocabulary(self):
        """The vocabulary as a list of str (index = id)."""
        return list(self._vocabulary)

    def vocabulary_size(self):
        """Number of tokens in the vocabulary."""
        return len(self._vocabulary)

    def get_vocabulary(self):
        """The vocabulary as a list of str (keras-hub spelling)."""
        return self.vocabulary

    def id_to_token(self, id):
        """The token string of an integer id."""
        if isinstance(id, np.integer) or tensorflow.is_tensor(id):
            id = int(id)
        if not isinstance(id, int) or isinstance(id, bool):
            raise ValueError(f"`id` must be an integer. Received: id={id!r}")
        if not 0 <= id < len(self._vocabulary):
            raise ValueError(f"`id` must be in [0, {len(self._vocabulary)}). Received: id={id}")
        return self._vocabulary[id]

    def token_to_id(self, token):
        """The integer id of a token string."""
        if token not in self._token_to_id:
            raise ValueError(
                f"Token {token!r} is not in the vocabulary of {len(self._vocabulary)} tokens."
            )
        return self._token_to_id[token]

    @property
    def cls_token_id(self):
        return self._token_to_id["[CLS]"]

    @property
    def sep_token_id(self):
        return self._token_to_id["[SEP]"]

    @property
    def pad_token_id(self):
        return self._token_to_id["[PAD]"]

    @property
    def mask_token_id(self):
        return self._token_to_id["[MASK]"]

    @property
    def unk_token_id(self):
        return self._token_to_id[self.unknown_token]

    # ------------------------------------------------------------------ #
    # Graph functions.
    # ------------------------------------------------------------------ #
    def _tokenize_graph(self, texts):
        """1-D strings -> (ids, starts, ends, word_ids), RaggedTensor [B, None]."""
        tf = tensorflow.tensorflow()
        graph = self._graph
        pre = graph["pretokenizer"](texts)
        words = tf.strings.unicode_encode(pre.word_code_points, "UTF-8")
        special = pre.word_special >= 0
        too_long = (pre.word_length > self.max_chars_per_word) & ~special
        words = tf.where(too_long, graph["too_long_word"], words)
        words = tf.where(special, "", words)
        ids, byte_start, byte_end = graph["engine"].tokenize_with_offsets(words)
        if self.special_tokens_in_strings:
            special_ids = tf.gather(graph["special_ids"], tf.maximum(pre.word_special, 0))
            special_rows = tf.RaggedTensor.from_row_lengths(
                tf.boolean_mask(special_ids, special),
                tf.cast(special, tf.int64),
            )
            zeros = tf.zeros_like(special_rows, dtype=byte_start.dtype)
            ids = tf.concat([ids, special_rows], axis=1)
            byte_start = tf.concat([byte_start, zeros], axis=1)
            byte_end = tf.concat([byte_end, zeros + 1], axis=1)
        piece_ids = ids.flat_values
        piece_word = tf.cast(ids.value_rowids(), tf.int32)
        # UTF-8 byte offsets inside each word -> code points -> input chars.
        base = tf.gather(pre.word_first_byte, piece_word)
        first_byte = base + tf.cast(byte_start.flat_values, tf.int32)
        last_byte = base + tf.cast(byte_end.flat_values, tf.int32) - 1
        first_cp = tf.searchsorted(pre.byte_starts, first_byte, side="right", out_type=tf.int32) - 1
        last_cp = tf.searchsorted(pre.byte_starts, last_byte, side="right", out_type=tf.int32) - 1
        num_cps = tf.size(pre.code_point_char)
        safe_char = tf.concat([pre.code_point_char, [0]], axis=0)
        start = tf.gather(safe_char, tf.clip_by_value(first_cp, 0, num_cps))
        end = tf.gather(safe_char, tf.clip_by_value(last_cp, 0, num_cps)) + 1
        # [UNK] and special tokens cover their whole word.
        whole_word = (piece_ids == self.unk_token_id) | tf.gather(special, piece_word)
        start = tf.where(whole_word, tf.gather(pre.word_start, piece_word), start)
        end = tf.where(whole_word, tf.gather(pre.word_end, piece_word), end)
        # Regroup by input string; offsets relative to each string.
        piece_row = tf.gather(pre.word_row, piece_word)
        row_offset = tf.gather(pre.row_splits, piece_row)
        word_splits = tf.ragged.segment_ids_to_row_splits(
            pre.word_row, num_segments=pre.num_rows, out_type=tf.int32
        )
        word_ids = piece_word - tf.gather(word_splits, piece_row)
        piece_splits = tf.ragged.segment_ids_to_row_splits(
            piece_row, num_segments=pre.num_rows, out_type=tf.int64
        )

        def rows(values):
            return tf.RaggedTensor.from_row_splits(values, piece_splits, validate=False)

        return (
            rows(piece_ids),
            rows(start - row_offset),
            rows(end - row_offset),
            rows(word_ids),
        )

    def _ids_graph(self, texts):
        """1-D strings -> (ids,), RaggedTensor [B, None]: `_tokenize_graph`'s ids without the
        offsets. Plain-ASCII rows go through the fused engine, the others through the exact
        graph; rows come back in input order."""
        tf = tensorflow.tensorflow()
        plain_engine = self._graph["plain_engine"]
        plain = tf.strings.regex_full_match(texts, _PLAIN_ASCII)
        if self._graph["has_special"] is not None:
            plain &= ~tf.strings.regex_full_match(texts, self._graph["has_special"])
        plain_rows = tf.reshape(tf.where(plain), [-1])
        other_rows = tf.reshape(tf.where(~plain), [-1])
        fast = plain_engine.tokenize(tf.gather(texts, plain_rows))  # [P, None]
        exact = self._tokenize_graph(tf.gather(texts, other_rows))[0]  # [B - P, None]
        ids = tf.concat(
            [fast.with_row_splits_dtype(tf.int64), exact.with_row_splits_dtype(tf.int64)], axis=0
        )
        order = tf.math.invert_permutation(tf.concat([plain_rows, other_rows], axis=0))
        return (tf.gather(ids, order),)

    def _split_graph(self, texts):
        """1-D strings -> RaggedTensor [B, None] of the normalised words; special tokens
        as written (the pre-tokenizer codes them as their index)."""
        tf = tensorflow.tensorflow()
        graph = self._graph
        pre = graph["pretokenizer"](texts)
        words = tf.strings.unicode_encode(pre.word_code_points, "UTF-8")
        special = pre.word_special >= 0
        words = tf.where(
            special, tf.gather(graph["special_tokens"], tf.maximum(pre.word_special, 0)), words
        )
        row_splits = tf.ragged.segment_ids_to_row_splits(pre.word_row, num_segments=pre.num_rows)
        return tf.RaggedTensor.from_row_splits(words, row_splits, validate=False)

    def _detokenize_graph(self, ids):
        tf = tensorflow.tensorflow()
        size = len(self._vocabulary)
        checks = [
            tf.debugging.assert_non_negative(
                ids.flat_values, message="detokenize: token ids must be >= 0."
            ),
            tf.debugging.assert_less(
                ids.flat_values,
                size,
                message=f"detokenize: token ids must be < vocabulary size {size}.",
            ),
        ]
        with tf.control_dependencies(checks):
            tokens = tf.gather(self._graph["vocabulary"], ids)
        text = tf.strings.reduce_join(tokens, axis=-1, separator=" ")
        text = tf.strings.regex_replace(text, " ##", "")
        return tf.strings.strip(text)

    # ------------------------------------------------------------------ #
    # Public API.
    # ------------------------------------------------------------------ #
    def _run(self, inputs, num_outputs):
        kind, values = _classify_text_input(inputs)
        if kind == "tensor":
            graph = self._graph_state()
            if num_outputs == 1:  # Ids alone: no offsets to compute.
                return _map_over_strings(graph["ids"], values, 1)
            return _map_over_strings(graph["tokenize"], values, 4)[:num_outputs]
        engine = self._python_engine
        if num_outputs == 1:  # Ids alone: the engine's fast path for plain text.

            def tokenize(text):
                return (engine.token_ids(text),)

        else:
            tokenize = engine.tokenize
        if kind == "array":
            return _map_over_array(lambda t: tokenize(t), values, num_outputs)
        rows = [tokenize(_python_text(text)) for text in values]
        outputs = tuple([row[k] for row in rows] for k in range(num_outputs))
        if kind == "scalar":
            outputs = tuple(o[0] for o in outputs)
        return outputs

    @tensorflow.do_not_convert
    def tokenize(self, inputs):
        """Token ids of a string or a batch of strings.

        Python strings are tokenized in Python (no TensorFlow needed); string tensors by the
        TensorFlow graph (tensorflow-text), also inside `tf.data`. Both give identical results.

        Args:
            inputs: str, list of str, numpy array of str or `tf.string`
                tensor of any shape `[...]`.

        Returns:
            `list[int]` for a str, `list[list[int]]` for a list, else int32
            tensors of shape `[..., None]` (dense 1-D for a scalar tensor,
            `tf.RaggedTensor` otherwise). Without TensorFlow installed a numpy
            array gives nested lists shaped like the array.
        """
        return self._run(inputs, 1)[0]

    @tensorflow.do_not_convert
    def __call__(self, inputs):
        return self.tokenize(inputs)

    @tensorflow.do_not_convert
    def tokenize_with_offsets(self, inputs):
        """Token ids with character offsets and word indices.

        Args:
            inputs: as for `tokenize`.

        Returns:
            A tuple `(token_ids, start_offsets, end_offsets, word_ids)`, each
            shaped like `tokenize`'s output (int32). `text[start:end]` is the
            part of the original string a piece was made from (for a piece cut
            from inside one character's expansion, e.g. one of the jamo of an
            NFD-decomposed Hangul syllable, the whole character). `word_ids`
            is the index, within its string, of the whitespace / punctuation /
            CJK word the piece belongs to.
        """
        return self._run(inputs, 4)

    @tensorflow.do_not_convert
    def split_words(self, inputs):
        """The normalised words of the reference's basic tokenizer (no
        WordPiece): str -> list[str], list -> list[list[str]], string tensor ->
        RaggedTensor of strings. Special tokens (with
        `special_tokens_in_strings=True`) are words of their own, as written."""
        kind, values = _classify_text_input(inputs)
        if kind == "tensor":
            graph = self._graph_state()
            return _map_over_strings(lambda t: (graph["split"](t),), values, 1)[0]
        split = self._python_engine.split_words
        if kind == "array":
            return _map_over_array(lambda t: (split(t),), values, 1)[0]
        words = [split(_python_text(text)) for text in values]
        return words[0] if kind == "scalar" else words

    @tensorflow.do_not_convert
    def detokenize(self, ids):
        """Text of token ids: pieces joined by spaces, `##` pieces merged.

        This is the reference's `convert_tokens_to_string`
        (`" ".join(tokens).replace(" ##", "").strip()`); special tokens are
        kept.

        Args:
            ids: list of int (-> str), list of lists of int (-> list of str),
                or an int tensor `[..., None]` (-> `tf.string` `[...]`).

        Raises:
            ValueError: for an id outside `[0, vocabulary_size)` (inside a
                `tf.function` / `tf.data` graph, where values are not known
                in Python, an `InvalidArgumentError` at run time instead).
        """
        if tensorflow.is_tensor(ids):
            if not ids.dtype.is_integer:
                raise ValueError(
                    f"`ids` must be integers. Received a tensor of dtype {ids.dtype.name}."
                )
            tf = tensorflow.tensorflow()
            if tf.executing_eagerly():
                flat = ids.flat_values if isinstance(ids, tf.RaggedTensor) else ids
                self._check_ids(np.asarray(flat).reshape(-1))
            return self._detokenize_tensor(tf.cast(ids, tf.int32))
        if isinstance(ids, np.ndarray):
            if ids.dtype.kind not in "iu" and not (ids.dtype.kind == "O"):
                raise ValueError(
                    f"`ids` must be integers. Received a numpy array of dtype {ids.dtype}."
                )
            ids = ids.tolist()
        if not isinstance(ids, (list, tuple)):
            raise ValueError(
                f"`ids` must be a list of int, a list of lists of int or an int "
                f"tensor. Received an object of type {type(ids).__name__}."
            )
        if all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in ids):
            return self._detokenize_python(ids)
        return [self.detokenize(row) for row in ids]

    def _check_ids(self, ids):
        size = len(self._vocabulary)
        bad = ids[(ids < 0) | (ids >= size)]
        if bad.size:
            raise ValueError(
                f"`ids` must be token ids in [0, {size}) (the vocabulary size). Received "
                f"{bad.size} id(s) out of range, e.g. {int(bad[0])}."
            )

    def _detokenize_tensor(self, ids):
        tf = tensorflow.tensorflow()
        detokenize = self._graph_state()["detokenize"]
        if isinstance(ids, tf.RaggedTensor):
            if ids.ragged_rank == 1:
                return detokenize(ids)
            return ids.with_values(self._detokenize_tensor(ids.values))
        if ids.shape.rank == 1:
            return detokenize(tf.RaggedTensor.from_tensor(ids[tf.newaxis]))[0]
        shape = tf.shape(ids)
        flat = tf.RaggedTensor.from_tensor(tf.reshape(ids, [-1, shape[-1]]))
        return tf.reshape(detokenize(flat), shape[:-1])

    def _detokenize_python(self, ids):
        size = len(self._vocabulary)
        for i in ids:
            if not 0 <= int(i) < size:
                raise ValueError(
                    f"`ids` must be token ids in [0, {size}) (the vocabulary size). "
                    f"Received: {int(i)}."
                )
        tokens = [self._vocabulary[int(i)] for i in ids]
        return " ".join(tokens).replace(" ##", "").strip()

    # ------------------------------------------------------------------ #
    # Serialization.
    # ------------------------------------------------------------------ #
    def get_config(self):
        return {
            "vocabulary": list(self._vocabulary),
            "lowercase": self.lowercase,
            "strip_accents": self.strip_accents,
            "special_tokens_in_strings": self.special_tokens_in_strings,
            "max_chars_per_word": self.max_chars_per_word,
            "unknown_token": self.unknown_token,
            "special_tokens": self.special_tokens,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    @classmethod
    def from_preset(cls, preset, **kwargs):
        """Builds the tokenizer of a preset directory or a vocabulary file.

        `preset` is either a `vocab.txt` file, a Hugging Face `tokenizer.json`
        (read with its directory's settings), or a directory holding
        `vocab.txt` (a Hugging Face / kbert preset),
        `assets/tokenizer/vocabulary.txt` (a keras-hub preset) or, without
        either, a Hugging Face `tokenizer.json` with a WordPiece model (what
        `transformers` 5 saves; see `kbert.checkpoints.vocabulary`), or an
        `hf://<owner>/<name>[@revision]` handle or a built-in preset name,
        whose tokenizer files (no weights) are downloaded into
        huggingface_hub's cache (see `kbert.hub`). Casing comes
        from `tokenizer_config.json` (`do_lower_case`, `strip_accents`), else
        from `tokenizer.json` (keras-hub config or Hugging Face normalizer),
        when present, else from the vocabulary itself (`vocabulary_is_uncased`:
        a cased vocabulary holds upper-case pieces); keyword arguments override it.

        Args:
            preset: str or path. A directory, a vocabulary file, a handle or a
                preset name.
            **kwargs: constructor arguments that override the preset's.

        Example:
        >>> tokenizer = BertTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "fox"])
        >>> tokenizer.save_to_preset("my_bert")
        >>> BertTokenizer.from_preset("my_bert")("Fox")
        [5]
        >>> BertTokenizer.from_preset("my_bert/vocab.txt")("Fox")
        [5]
        """
        from kbert.hub import resolve_preset_source

        preset = os.fspath(resolve_preset_source(preset, load_weights=False))
        if os.path.isfile(preset) and not preset.endswith(".json"):
            kwargs.setdefault("lowercase", vocabulary_is_uncased(preset))
            return cls(vocabulary=preset, **kwargs)
        vocabulary, config = read_tokenizer_files(preset)
        config.update(kwargs)
        return cls(vocabulary=os.fspath(vocabulary), **config)

    def save_to_preset(self, preset_dir):
        """Writes `vocab.txt` and a `tokenizer_config.json` (Hugging Face
        keys: casing, `split_special_tokens` and the special tokens) into
        `preset_dir`, readable by `from_preset` and Hugging Face's
        `AutoTokenizer` alike."""
        write_tokenizer_files(
            preset_dir,
            self._vocabulary,
            lowercase=self.lowercase,
            strip_accents=self.strip_accents,
            unknown_token=self.unknown_token,
            special_tokens_in_strings=self.special_tokens_in_strings,
            special_tokens=self.special_tokens,
        )
