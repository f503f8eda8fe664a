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

from kbert.text import _unicode


def clean_text(text):
    out = []
    for char in text:
        if _unicode.is_deleted(char):
            continue
        is_space = char in " \t\n\r" or unicodedata.category(char) == "Zs"
        out.append(" " if is_space else char)
    return "".join(out)


def basic_tokenize(text, lowercase=True, strip_accents=None):
    if strip_accents is None:
        strip_accents = lowercase
    text = clean_text(text)
    text = "".join(f" {c} " if _unicode.is_cjk(ord(c)) else c for c in text)
    words = []
    for token in text.split():
        if lowercase:
            token = token.lower()
        if strip_accents:
            token = unicodedata.normalize("NFD", token)
            token = "".join(c for c in token if unicodedata.category(c) != "Mn")
        current = None
        for char in token:
            if _unicode.is_punctuation(char):
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
