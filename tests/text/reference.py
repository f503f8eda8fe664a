"""Test oracle: the original BERT tokenization algorithm, in plain Python.

A direct, unoptimised restatement of google-research/bert `tokenization.py`
(`BasicTokenizer` + `WordpieceTokenizer`), used where both Hugging Face
implementations knowingly deviate from the original:
- `tokenizers` (BertTokenizer in transformers 5) lower-cases character by
  character (no Greek final sigma), deletes every category C* character
  (the original deletes only Cc and Cf) and uses newer Unicode tables;
- `BertTokenizerLegacy` NFC-normalises the text first and also deletes C*.
"""

import unicodedata

# The CJK Unified Ideographs blocks of the original `_is_chinese_char`.
_CJK = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)


def is_cjk(char):
    return any(low <= ord(char) <= high for low, high in _CJK)


def is_whitespace(char):
    return char in " \t\n\r" or unicodedata.category(char) == "Zs"


def is_control(char):
    return char not in "\t\n\r" and unicodedata.category(char) in ("Cc", "Cf")


def is_punctuation(char):
    code = ord(char)
    if 33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def clean_text(text):
    out = []
    for char in text:
        if ord(char) in (0, 0xFFFD) or is_control(char):
            continue
        out.append(" " if is_whitespace(char) else char)
    return "".join(out)


def basic_tokenize(text, lowercase=True, strip_accents=None):
    if strip_accents is None:
        strip_accents = lowercase
    text = clean_text(text)
    text = "".join(f" {c} " if is_cjk(c) else c for c in text)
    words = []
    for token in text.split():
        if lowercase:
            token = token.lower()
        if strip_accents:
            token = unicodedata.normalize("NFD", token)
            token = "".join(c for c in token if unicodedata.category(c) != "Mn")
        current = None
        for char in token:
            if is_punctuation(char):
                words.append(char)
                current = None
            else:
                if current is None:
                    words.append("")
                    current = len(words) - 1
                words[current] += char
    return " ".join(words).split()


def wordpiece(word, vocab, unk="[UNK]", max_chars=100):
    if len(word) > max_chars:
        return [unk]
    pieces, start = [], 0
    while start < len(word):
        end = len(word)
        found = None
        while start < end:
            piece = word[start:end] if start == 0 else "##" + word[start:end]
            if piece in vocab:
                found = piece
                break
            end -= 1
        if found is None:
            return [unk]
        pieces.append(found)
        start = end
    return pieces


class ReferenceTokenizer:
    """`tokenize(text) -> list[int]` with the original algorithm."""

    def __init__(self, vocabulary, lowercase=True, strip_accents=None, max_chars=100):
        self.vocab = {t: i for i, t in enumerate(vocabulary)}
        self.lowercase = lowercase
        self.strip_accents = strip_accents
        self.max_chars = max_chars

    def tokens(self, text):
        out = []
        for word in basic_tokenize(text, self.lowercase, self.strip_accents):
            out.extend(wordpiece(word, self.vocab, max_chars=self.max_chars))
        return out

    def tokenize(self, text):
        return [self.vocab[t] for t in self.tokens(text)]
