"""Graph-mode BERT "basic tokenization" with exact character offsets.

Private module. It reproduces, in TensorFlow ops, the first half of the
reference tokenizer (google-research/bert `BasicTokenizer`): text cleaning,
CJK isolation, lower-casing (with Python's final-sigma rule), NFD accent
stripping and punctuation splitting. The output is a flat list of normalised
words, each remembering which characters of the input produced it, ready for
the WordPiece engine.

How it works: the input is decoded to code points. Every code point is looked
up in tables computed from Python's `unicodedata` (see `_unicode.py`): it is
deleted, becomes a word break, stays as it is, or is replaced by a short
expansion (its lower-cased, NFD-decomposed, accent-stripped form). Because each
output code point is produced by exactly one input code point, the character
offset of every word (and later every word piece) into the original string is
known exactly, whatever the normalisation did to the lengths.
"""

import collections

from kbert.backend import tensorflow
from kbert.text import _unicode

tf = tensorflow.tensorflow("The tokenizer inside a tf.data graph")

PreTokenized = collections.namedtuple(
    "PreTokenized",
    [
        "num_rows",  # scalar int32: number of input strings.
        "row_splits",  # [B + 1] int32: character row splits of the input.
        "word_code_points",  # RaggedTensor [W, None] int32.
        "word_row",  # [W] int32: input string of each word.
        "word_start",  # [W] int32: first character (index into all characters).
        "word_end",  # [W] int32: one past the last character.
        "word_length",  # [W] int32: number of normalised code points.
        "word_special",  # [W] int32: special-token index, or -1.
        "word_first_byte",  # [W] int32: start of the word in all words' UTF-8 bytes.
        "byte_starts",  # [K] int32: UTF-8 start of each kept code point.
        "code_point_char",  # [K] int32: input character of each kept code point.
    ],
)


def _shift_right(values, fill):
    """`values` moved one step to the right, `fill` entering on the left."""
    return tf.concat([tf.fill([1], fill), values[:-1]], axis=0)


class PreTokenizer:
    """Splits strings into normalised words, in graph-compatible TF ops.

    Args:
        lowercase: bool. Lower-case the text.
        strip_accents: bool. NFD-decompose and drop non-spacing marks (Mn).
        special_tokens: list of str. Strings matched verbatim in the raw text
            and emitted as single special words (empty list disables this).
    """

    def __init__(self, lowercase, strip_accents, special_tokens=()):
        self.lowercase = bool(lowercase)
        self.strip_accents = bool(strip_accents)
        self.special_tokens = list(special_tokens)
        tables = _unicode.char_tables(self.lowercase, self.strip_accents)
        self._kind = tf.constant(tables.kind)
        self._expansion_splits = tf.constant(tables.expansion_splits)
        self._expansion_code_points = tf.constant(tables.expansion_code_points)
        self._expansion_types = tf.constant(tables.expansion_types)
        if tables.mapped_keys.size:
            self._mapped = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(
                    tf.constant(tables.mapped_keys), tf.constant(tables.mapped_ids)
                ),
                default_value=-1,
            )
        else:
            self._mapped = None
        self._special_code_points = [[ord(c) for c in token] for token in self.special_tokens]

    def _match_special_tokens(self, chars, row_end):
        """Index of the special token starting at each character (or -1), and
        whether each character lies inside a special-token match."""
        n = tf.size(chars)
        positions = tf.range(n)
        longest = max(len(cps) for cps in self._special_code_points)
        padded = tf.concat([chars, tf.fill([longest], -1)], axis=0)
        match = tf.fill([n], -1)
        for index, cps in enumerate(self._special_code_points):
            found = positions + len(cps) <= row_end
            for k, code_point in enumerate(cps):
                found &= tf.gather(padded, positions + k) == code_point
            match = tf.where(found, index, match)
        covered = tf.zeros([n], tf.bool)
        for index, cps in enumerate(self._special_code_points):
            starts = match == index
            for k in range(len(cps)):
                shifted = tf.concat([tf.zeros([k], tf.bool), starts], axis=0)[:n]
                covered |= shifted
        return match, covered

    def _final_sigma(self, chars, info, kind, covered, row_start, row_end):
        """Where `str.lower()` turns a capital sigma into a final sigma.

        Python lower-cases U+03A3 to U+03C2 when it follows a cased character
        and is not followed by one, skipping case-ignorable characters. Deleted
        characters are skipped too (the reference deletes them first), and
        special tokens act as hard boundaries (they are separate segments).
        """
        n = tf.size(chars)
        deleted = kind == _unicode.DELETE
        ignorable = (info & _unicode.CASE_IGNORABLE) != 0
        cased = ((info & _unicode.CASED) != 0) & ~deleted & ~covered
        anchor = (~ignorable & ~deleted) | covered
        anchors = tf.cast(tf.where(anchor)[:, 0], tf.int32)
        num_anchors = tf.size(anchors)
        anchors = tf.concat([anchors, [n]], axis=0)  # Sentinel: "no anchor".
        cased = tf.concat([cased, [False]], axis=0)
        before = tf.cumsum(tf.cast(anchor, tf.int32), exclusive=True)
        previous = tf.gather(anchors, tf.maximum(before - 1, 0))
        previous_cased = (before > 0) & (previous >= row_start) & tf.gather(cased, previous)
        following = tf.gather(anchors, tf.minimum(before + 1, num_anchors))
        following_cased = (following < row_end) & tf.gather(cased, following)
        is_sigma = (chars == _unicode.CAPITAL_SIGMA) & ~covered
        return is_sigma & previous_cased & ~following_cased

    def __call__(self, texts):
        """Pre-tokenizes a 1-D string tensor. Returns a `PreTokenized`."""
        texts = tf.convert_to_tensor(texts, dtype=tf.string)
        decoded = tf.strings.unicode_decode(
            texts, "UTF-8", errors="replace", replacement_char=0xFFFD
        )
        chars = decoded.flat_values  # [N] int32 code points.
        row_splits = tf.cast(decoded.row_splits, tf.int32)
        char_row = tf.cast(decoded.value_rowids(), tf.int32)
        n = tf.size(chars)
        row_start = tf.gather(row_splits, char_row)
        row_end = tf.gather(row_splits, char_row + 1)

        info = tf.cast(tf.gather(self._kind, chars), tf.int32)
        kind = info & _unicode.KIND_MASK

        if self._special_code_points:
            special, covered = self._match_special_tokens(chars, row_end)
            special_start = special >= 0
        else:
            special = None
            covered = tf.zeros([n], tf.bool)
            special_start = covered

        if self.lowercase:
            final = self._final_sigma(chars, info, kind, covered, row_start, row_end)
            chars = tf.where(final, _unicode.FINAL_SIGMA, chars)
            kind = tf.where(final, _unicode.WORD, kind)

        normalized = self._expand(chars, kind, covered, special, special_start, char_row)
        return self._words(texts, row_splits, special, *normalized)

    def _expand(self, chars, kind, covered, special, special_start, char_row):
        """Expansion of every character into normalised code points: their values and types,
        and the character and row each comes from."""
        n = tf.size(chars)
        positions = tf.range(n)
        is_mapped = (kind == _unicode.MAPPED) & ~covered
        if self._mapped is not None:
            expansion = tf.maximum(self._mapped.lookup(chars), 0)
            expansion_start = tf.gather(self._expansion_splits, expansion)
            expansion_length = tf.gather(self._expansion_splits, expansion + 1) - expansion_start
        else:  # Nothing is mapped (cased, no accent stripping).
            expansion_start = expansion_length = tf.zeros([n], tf.int32)
        out_length = tf.where(kind == _unicode.DELETE, 0, tf.where(is_mapped, expansion_length, 1))
        base_type = tf.where(
            kind == _unicode.SPACE,
            _unicode.TYPE_SPACE,
            tf.where(kind == _unicode.SINGLE, _unicode.TYPE_SINGLE, _unicode.TYPE_WORD),
        )
        base_value = chars
        if special is not None:
            out_length = tf.where(covered, tf.cast(special_start, tf.int32), out_length)
            base_type = tf.where(special_start, _unicode.TYPE_SPECIAL, base_type)
            base_value = tf.where(special_start, special, chars)
        num_expanded = tf.size(self._expansion_code_points)
        source_start = tf.where(is_mapped, expansion_start, num_expanded + positions)
        sources = tf.ragged.range(source_start, source_start + out_length)
        pool_values = tf.concat([self._expansion_code_points, base_value], axis=0)
        pool_types = tf.concat([self._expansion_types, base_type], axis=0)
        norm_values = tf.gather(pool_values, sources.flat_values)
        norm_types = tf.gather(pool_types, sources.flat_values)
        norm_char = tf.cast(sources.value_rowids(), tf.int32)
        norm_row = tf.gather(char_row, norm_char)
        return norm_values, norm_types, norm_char, norm_row

    def _words(self, texts, row_splits, special, norm_values, norm_types, norm_char, norm_row):
        """Words: runs of word characters; punctuation, CJK and special tokens alone;
        whitespace separates. Returns the `PreTokenized`."""
        is_word = norm_types == _unicode.TYPE_WORD
        previous_type = _shift_right(norm_types, _unicode.TYPE_SPACE)
        previous_row = _shift_right(norm_row, -1)
        starts_word = (
            (norm_types == _unicode.TYPE_SINGLE)
            | (norm_types == _unicode.TYPE_SPECIAL)
            | (is_word & ((previous_type != _unicode.TYPE_WORD) | (previous_row != norm_row)))
        )
        kept = tf.where(norm_types != _unicode.TYPE_SPACE)[:, 0]
        kept_values = tf.gather(norm_values, kept)
        kept_types = tf.gather(norm_types, kept)
        kept_char = tf.gather(norm_char, kept)
        kept_row = tf.gather(norm_row, kept)
        kept_starts = tf.gather(starts_word, kept)
        num_kept = tf.size(kept_values)
        first = tf.cast(tf.where(kept_starts)[:, 0], tf.int32)  # [W]
        word_splits = tf.concat([first, tf.reshape(num_kept, [1])], axis=0)
        last = word_splits[1:] - 1
        word_code_points = tf.RaggedTensor.from_row_splits(kept_values, word_splits, validate=False)
        word_special = tf.where(
            tf.gather(kept_types, first) == _unicode.TYPE_SPECIAL,
            tf.gather(kept_values, first),
            -1,
        )
        byte_length = (
            1
            + tf.cast(kept_values >= 0x80, tf.int32)
            + tf.cast(kept_values >= 0x800, tf.int32)
            + tf.cast(kept_values >= 0x10000, tf.int32)
        )
        byte_starts = tf.cumsum(byte_length, exclusive=True)
        word_start = tf.gather(kept_char, first)
        word_end = tf.gather(kept_char, last) + 1
        if special is not None:  # A special word spans its whole match.
            lengths = tf.constant([len(cps) for cps in self._special_code_points])
            special_end = word_start + tf.gather(lengths, tf.maximum(word_special, 0))
            word_end = tf.where(word_special >= 0, special_end, word_end)
        return PreTokenized(
            num_rows=tf.size(texts),
            row_splits=row_splits,
            word_code_points=word_code_points,
            word_row=tf.gather(kept_row, first),
            word_start=word_start,
            word_end=word_end,
            word_length=last - first + 1,
            word_special=word_special,
            word_first_byte=tf.gather(byte_starts, first),
            byte_starts=byte_starts,
            code_point_char=kept_char,
        )

    def split_words(self, texts):
        """Normalised words of each string: RaggedTensor `[B, None]` of str."""
        result = self(texts)
        words = tf.strings.unicode_encode(result.word_code_points, "UTF-8")
        row_splits = tf.ragged.segment_ids_to_row_splits(
            result.word_row, num_segments=result.num_rows
        )
        return tf.RaggedTensor.from_row_splits(words, row_splits, validate=False)
