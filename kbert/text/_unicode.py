"""Per-code-point tables that reproduce the original BERT text normalisation.

The reference tokenizer (google-research/bert `tokenization.py`) decides what
to do with each character through Python's `unicodedata` and `str.lower()`:
control and format characters are deleted, whitespace becomes a space, CJK
ideographs and punctuation become words of their own, and (when lower-casing)
each word is lower-cased, NFD-decomposed and stripped of non-spacing marks.

Everything except the Greek final-sigma rule of `str.lower()` is a function of
a single code point, so we evaluate those functions once, with the very same
Python calls as the reference, for every code point, and hand the result to
TensorFlow as lookup tables. (The final sigma is handled in the graph from the
Cased / Case_Ignorable flags stored here. One theoretical gap remains: NFD
also reorders adjacent combining characters by combining class; per-character
NFD cannot, which only matters for two adjacent non-Mn combining characters
in non-canonical order, e.g. U+1D16D U+1D165, musical symbols: the marks the
reference drops (Mn) do not count, and no BERT vocabulary is affected.) The graph then only does
table look-ups, which keeps the character offsets exact (every output character knows the input
character it came from) and keeps the behaviour identical to the reference,
independent of the Unicode version of ICU or RE2 inside TensorFlow.

This module is private: `kbert.text.BertTokenizer` is the public entry point.
"""

import functools
import unicodedata

import numpy as np

MAX_CODE_POINT = 0x110000

# Character kinds (low 3 bits of the `kind` table).
WORD = 0  # Kept unchanged, part of a word.
SINGLE = 1  # Kept unchanged, a word on its own (punctuation or CJK).
SPACE = 2  # Whitespace: ends the current word.
DELETE = 3  # Removed before anything else (NUL, U+FFFD, Cc/Cf controls).
MAPPED = 4  # Replaced by an expansion (lower-casing, NFD, accent stripping).
KIND_MASK = 7
# Flags used by the final-sigma rule of `str.lower()`.
CASED = 8
CASE_IGNORABLE = 16

# Types of the characters after normalisation.
TYPE_WORD = 0
TYPE_SINGLE = 1
TYPE_SPACE = 2
TYPE_SPECIAL = 3

CAPITAL_SIGMA = 0x03A3
FINAL_SIGMA = 0x03C2

# The "CJK Unified Ideographs" ranges of the reference `_is_chinese_char`.
CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)


def is_cjk(code_point):
    return any(low <= code_point <= high for low, high in CJK_RANGES)


def is_punctuation(char):
    """The reference `_is_punctuation`: ASCII symbols or category P*."""
    code_point = ord(char)
    if (
        33 <= code_point <= 47
        or 58 <= code_point <= 64
        or 91 <= code_point <= 96
        or 123 <= code_point <= 126
    ):
        return True
    return unicodedata.category(char).startswith("P")


def normalize_char(char, lowercase, strip_accents):
    """The per-character normalisation of the reference (no final sigma)."""
    if lowercase:
        char = char.lower()
    if strip_accents:
        char = "".join(
            c for c in unicodedata.normalize("NFD", char) if unicodedata.category(c) != "Mn"
        )
    return char


# Unicode defines Case_Ignorable as Mn | Me | Cf | Lm | Sk plus the word-break
# classes MidLetter, MidNumLet and Single_Quote, all of which are Po/Pi/Pf.
_MAYBE_CASE_IGNORABLE = ("Mn", "Me", "Cf", "Lm", "Sk", "Po", "Pi", "Pf")


def _case_flags(char, category):
    """Python's Cased / Case_Ignorable properties (as used by `str.lower()`)."""
    flags = 0
    if char.islower() or char.isupper() or char.istitle():
        flags |= CASED
    if category in _MAYBE_CASE_IGNORABLE:
        # `str.lower()` skips case-ignorable characters when it looks at the
        # context of a capital sigma; probing it both ways reveals the property.
        after = ("a\u03a3" + char).lower()[1]
        before = ("a" + char + "\u03a3").lower()[-1]
        if after == before == "\u03c2":
            flags |= CASE_IGNORABLE
    return flags


def classify(code_point, lowercase, strip_accents, category=None):
    """What the reference does with one code point, out of context.

    Returns `(info, expansion)`: `info` is the kind (WORD, SINGLE, SPACE, DELETE or MAPPED)
    with the CASED / CASE_IGNORABLE flags; for MAPPED, `expansion` is a tuple of
    `(code_point, TYPE_WORD | TYPE_SINGLE)` pairs (possibly empty), else None. The TensorFlow
    tables (`CharTables`) and the pure-Python tokenizer are both built from this function.
    """
    char = chr(code_point)
    if category is None:
        category = unicodedata.category(char)
    base = SINGLE if is_cjk(code_point) else WORD
    # Unassigned (Cn), private-use (Co) and surrogate (Cs) code points are
    # plain word characters.
    if category in ("Cn", "Co", "Cs"):
        return base, None
    if (category in ("Cc", "Cf") and char not in "\t\n\r") or code_point == 0xFFFD:
        return DELETE, None
    if category == "Zs" or char.isspace():
        return SPACE, None
    flags = _case_flags(char, category) if lowercase else 0
    normalized = char
    if lowercase:
        normalized = char.lower()
    if strip_accents and (
        not unicodedata.is_normalized("NFD", normalized)
        or any(unicodedata.category(c) == "Mn" for c in normalized)
    ):
        normalized = normalize_char(normalized, False, True)
    if normalized == char:
        if category[0] == "P" or (code_point < 128 and is_punctuation(char)):
            return SINGLE | flags, None
        return base | flags, None
    if is_cjk(code_point) and len(normalized) != 1:
        raise RuntimeError(f"Unexpected multi-character normalisation of CJK U+{code_point:04X}.")
    expansion = tuple(
        (ord(out), TYPE_SINGLE if is_cjk(code_point) or is_punctuation(out) else TYPE_WORD)
        for out in normalized
    )
    return MAPPED | flags, expansion


class CharTables:
    """Numpy tables for one (lowercase, strip_accents) setting.

    Attributes:
        kind: int8 array `[0x110000]`: kind bits | CASED | CASE_IGNORABLE.
        mapped_keys: int32 array of the code points whose kind is MAPPED.
        mapped_ids: int32 array, expansion index of each `mapped_keys` entry.
        expansion_splits: int32 array `[num_expansions + 1]`.
        expansion_code_points: int32 array, concatenated expansions.
        expansion_types: int32 array, TYPE_WORD or TYPE_SINGLE per element.
    """

    def __init__(self, lowercase, strip_accents):
        kind = np.zeros(MAX_CODE_POINT, dtype=np.int8)
        for low, high in CJK_RANGES:
            kind[low : high + 1] = SINGLE
        keys, splits, values, types = [], [0], [], []
        categories = list(map(unicodedata.category, map(chr, range(MAX_CODE_POINT))))
        # Only the assigned code points need a closer look (see `classify`).
        assigned = [
            code_point
            for code_point, category in enumerate(categories)
            if category not in ("Cn", "Co", "Cs")
        ]
        for code_point in assigned:
            info, expansion = classify(code_point, lowercase, strip_accents, categories[code_point])
            kind[code_point] = info
            if expansion is not None:
                keys.append(code_point)
                for value, value_type in expansion:
                    values.append(value)
                    types.append(value_type)
                splits.append(len(values))
        self.kind = kind
        self.mapped_keys = np.asarray(keys, dtype=np.int32)
        self.mapped_ids = np.arange(len(keys), dtype=np.int32)
        self.expansion_splits = np.asarray(splits, dtype=np.int32)
        self.expansion_code_points = np.asarray(values, dtype=np.int32)
        self.expansion_types = np.asarray(types, dtype=np.int32)


class CharClassifier(dict):
    """`classify` for one setting, computed once per distinct character (pure Python).

    `classifier[char]` is `(info, expansion)` as returned by `classify`.
    """

    def __init__(self, lowercase, strip_accents):
        super().__init__()
        self.lowercase = bool(lowercase)
        self.strip_accents = bool(strip_accents)

    def __missing__(self, char):
        value = classify(ord(char), self.lowercase, self.strip_accents)
        self[char] = value
        return value


@functools.cache
def char_classifier(lowercase, strip_accents):
    """The shared (per process and setting) `CharClassifier`."""
    return CharClassifier(bool(lowercase), bool(strip_accents))


@functools.cache
def char_tables(lowercase, strip_accents):
    """Builds (once per process and setting) the tables; about a second."""
    return CharTables(bool(lowercase), bool(strip_accents))
