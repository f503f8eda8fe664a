"""The BERT tokenizer in plain Python, for Python strings and machines without TensorFlow.

Private module. It is the same algorithm as the TensorFlow graph of `_pretokenizer.py` +
tensorflow-text's `FastWordpieceTokenizer`, fed from the same per-character decisions
(`_unicode.classify`): text cleaning, CJK isolation, lower-casing with Python's final-sigma
rule, NFD accent stripping, punctuation splitting, then greedy longest-match-first WordPiece.
Every normalised code point remembers the input character it came from, so the character
offsets are exact, as in the graph.
"""

import collections
import re

from kbert.text import _unicode

# A special token as Hugging Face's `AddedToken` describes it (see `BertTokenizer`).
SpecialToken = collections.namedtuple(
    "SpecialToken", ["content", "lstrip", "rstrip", "normalized", "single_word"]
)


def _is_space(char):
    """Rust's `char::is_whitespace` (the White_Space property), which Hugging Face's
    `lstrip` / `rstrip` use; Python's `isspace` also counts U+001C..U+001F."""
    return char.isspace() and not "\x1c" <= char <= "\x1f"


def _is_word_char(char):
    """A character that joins a `single_word` token to a word (letters, digits, `_`)."""
    return char.isalnum() or char == "_"


def _pattern(contents):
    """Leftmost match first and, at one position, the longest (Python tries alternatives in
    order)."""
    if not contents:
        return None
    ordered = sorted(set(contents), key=lambda c: (-len(c), c))
    return re.compile("|".join(re.escape(c) for c in ordered))


# Words whose pieces `PythonEngine.token_ids` keeps (the memo is emptied when full).
_MAX_REMEMBERED_WORDS = 200_000
# Characters `token_ids` tables at most (a text holding one more takes the exact route):
# bounds the tables' memory however many distinct code points the texts hold.
_MAX_TABLED_CHARACTERS = 50_000

_WORD = _unicode.TYPE_WORD
_SINGLE = _unicode.TYPE_SINGLE
_SIGMA = chr(_unicode.CAPITAL_SIGMA)
_FINAL_SIGMA = _unicode.FINAL_SIGMA


class PythonEngine:
    """Pre-tokenizer + WordPiece on one Python `str` at a time.

    Args:
        token_to_id: dict str -> int, the vocabulary.
        lowercase: bool.
        strip_accents: bool.
        special_tokens: list of `SpecialToken`s found in the text (empty: none), as Hugging
            Face's added tokens are: the verbatim ones first, in the raw text, then the
            `normalized` ones in the normalised rest; leftmost match first, the longest at a
            position; `single_word` ones only between non-word characters; `lstrip` / `rstrip`
            ones take the whitespace on their left / right into their span.
        special_ids: list of int, the id of each special token.
        unknown_id: int.
        max_chars_per_word: int.
    """

    def __init__(
        self,
        token_to_id,
        lowercase,
        strip_accents,
        special_tokens,
        special_ids,
        unknown_id,
        max_chars_per_word,
    ):
        self.token_to_id = token_to_id
        self.lowercase = bool(lowercase)
        self.special_tokens = [SpecialToken(*t) for t in special_tokens]
        self.special_ids = list(special_ids)
        self.unknown_id = unknown_id
        self.max_chars_per_word = max_chars_per_word
        self.max_token_length = max(len(t) for t in token_to_id)
        self._chars = _unicode.char_classifier(lowercase, strip_accents)
        verbatim = [t.content for t in self.special_tokens if not t.normalized]
        # Normalised tokens are looked for in normalised text, in their normalised form.
        normalized = [self._normalize(t.content)[0] for t in self.special_tokens if t.normalized]
        self._special_index = {
            t.content: i for i, t in enumerate(self.special_tokens) if not t.normalized
        }
        self._normalized_index = {
            self._normalize(t.content)[0]: i
            for i, t in enumerate(self.special_tokens)
            if t.normalized
        }
        self._verbatim_pattern = _pattern(verbatim)
        self._normalized_pattern = _pattern([c for c in normalized if c])
        # `token_ids`' fast path: `str.translate` tables (code point -> replacement) of the
        # characters met so far whose treatment needs no context, and those that do.
        self._normalized_table, self._spaced_table, self._contextual = {}, {}, set()
        for code in range(128):
            self._learn(chr(code))
        self._pieces = {}  # word -> its WordPiece ids (None: [UNK]), for `token_ids`

    def _learn(self, char):
        """Adds `char` to `token_ids`' tables: what the normalised text holds in its place,
        and the same with a one-character word between spaces; or, where `split` looks at
        its neighbours or its expansion holds anything but word characters, to the
        characters that send a text the exact route. Returns whether it was tabled."""
        info, expansion = self._chars[char]
        kind, code = info & _unicode.KIND_MASK, ord(char)
        if kind == _unicode.DELETE:
            normalized = spaced = ""
        elif kind == _unicode.SPACE:
            normalized = spaced = " "
        elif kind == _unicode.SINGLE:
            spaced = f" {char} "
            normalized = spaced if _unicode.is_cjk(code) else char
        elif kind == _unicode.MAPPED and all(t == _WORD for _, t in expansion):
            normalized = spaced = "".join(chr(cp) for cp, _ in expansion)
        elif kind == _unicode.WORD:
            normalized = spaced = char
        else:
            normalized = None
        if (
            normalized is None
            or " " in normalized.strip(" ")
            or (self.lowercase and char == _SIGMA)
        ):
            self._contextual.add(char)
            return False
        self._normalized_table[code] = normalized
        self._spaced_table[code] = spaced
        return True

    def _normalize(self, text, start=0, end=None):
        """`text[start:end]` as Hugging Face's normaliser writes it before it looks for
        `normalized` special tokens (cleaned, CJK ideographs between spaces, lower-cased,
        accents stripped, whitespace as spaces): the string and the input character each of
        its code points comes from."""
        chars, sources = [], []
        for i in range(start, len(text) if end is None else end):
            info, expansion = self._chars[text[i]]
            kind = info & _unicode.KIND_MASK
            if kind == _unicode.DELETE:
                continue
            if kind == _unicode.SPACE:
                values = " "
            elif kind == _unicode.MAPPED:
                values = "".join(chr(cp) for cp, _ in expansion)
            elif kind == _unicode.SINGLE and _unicode.is_cjk(ord(text[i])):
                values = f" {text[i]} "
            else:
                values = text[i]
            chars.append(values)
            sources.extend([i] * len(values))
        return "".join(chars), sources

    def _matches(self, pattern, index, string, sources):
        """Special-token matches of `pattern` in `string`, whose code points come from the
        input characters `sources`: a list of `(start, end, token index, first, last)`.
        `[start, end)` are the input characters of the match, the whitespace a token strips
        included (its offsets); `[first, last)` those it consumes: not a character whose
        normalised form is only partly inside (a CJK ideograph whose padding space it
        stripped)."""
        found, previous_end = [], 0
        for match in pattern.finditer(string):
            token_index = index[match.group()]
            token = self.special_tokens[token_index]
            start, end = match.start(), match.end()
            if start < previous_end:
                continue  # Inside the whitespace the previous token took.
            if token.single_word and (
                (start > 0 and _is_word_char(string[start - 1]))
                or (end < len(string) and _is_word_char(string[end]))
            ):
                continue
            if token.lstrip:
                while start > previous_end and _is_space(string[start - 1]):
                    start -= 1
            if token.rstrip:
                while end < len(string) and _is_space(string[end]):
                    end += 1
            first, last = sources[start], sources[end - 1] + 1
            consumed_first = first + (start > 0 and sources[start - 1] == first)
            consumed_last = last - (end < len(string) and sources[end] == last - 1)
            found.append((first, last, token_index, consumed_first, consumed_last))
            previous_end = end
        return found

    def _special_spans(self, text):
        """The special tokens written in `text`: `_matches`' tuples, in order.
        Verbatim tokens are found in the raw text; `normalized` ones in the normalised text
        between them (as Hugging Face's added vocabulary does)."""
        spans = []
        if self._verbatim_pattern is not None:
            spans = self._matches(
                self._verbatim_pattern, self._special_index, text, range(len(text))
            )
        if self._normalized_pattern is None:
            return spans
        found, low = [], 0
        for span in spans + [(len(text), len(text), -1, len(text), len(text))]:
            string, sources = self._normalize(text, low, span[0])
            if string:
                found.extend(
                    self._matches(self._normalized_pattern, self._normalized_index, string, sources)
                )
            if span[2] >= 0:
                found.append(span)
            low = span[1]
        return found

    # ------------------------------------------------------------------ #
    def _final_sigmas(self, text, infos, covered):
        """Positions where `str.lower()` turns a capital sigma into a final sigma.

        A capital sigma preceded by a cased character and not followed by one, skipping
        case-ignorable and deleted characters; special tokens are hard boundaries.
        """
        result = set()
        n = len(text)

        def anchor(j):
            if j in covered:
                return True
            info = infos[j]
            return (info & _unicode.KIND_MASK) != _unicode.DELETE and not (
                info & _unicode.CASE_IGNORABLE
            )

        def cased(j):
            info = infos[j]
            return (
                j not in covered
                and (info & _unicode.KIND_MASK) != _unicode.DELETE
                and bool(info & _unicode.CASED)
            )

        start = text.find(_SIGMA)
        while start >= 0:
            i = start
            if i not in covered:
                j = i - 1
                while j >= 0 and not anchor(j):
                    j -= 1
                k = i + 1
                while k < n and not anchor(k):
                    k += 1
                if j >= 0 and cased(j) and not (k < n and cased(k)):
                    result.add(i)
            start = text.find(_SIGMA, start + 1)
        return result

    def split(self, text):
        """Normalised words of `text`: a list of `(chars, sources, special, start, end)`.

        `chars` is the word's normalised text (one entry per code point), `sources[k]` the
        input character index code point `k` came from, `special` the special-token index or
        -1, `[start, end)` the characters of the input the word spans.
        """
        classifier = self._chars
        infos_and_expansions = [classifier[c] for c in text]
        infos = [pair[0] for pair in infos_and_expansions]
        specials = {}
        covered = set()
        if self.special_tokens:
            for start, end, token_index, first, last in self._special_spans(text):
                specials[first] = (token_index, start, end)
                covered.update(range(first, last))
        finals = (
            self._final_sigmas(text, infos, covered) if self.lowercase and _SIGMA in text else ()
        )
        words = []
        in_word = False  # The previous normalised code point is a word character.
        current = None
        for i, char in enumerate(text):
            if covered and i in covered:
                if i in specials:
                    index, start, end = specials[i]
                    token = self.special_tokens[index].content
                    words.append(([token], [i], index, start, end))
                    in_word = False
                continue
            info, expansion = infos_and_expansions[i]
            kind = info & _unicode.KIND_MASK
            if kind == _unicode.WORD and i not in finals:
                elements = ((char, _WORD),)
            elif kind == _unicode.DELETE:
                continue
            elif kind == _unicode.SPACE:
                in_word = False
                continue
            elif i in finals:
                elements = ((chr(_FINAL_SIGMA), _WORD),)
            elif kind == _unicode.SINGLE:
                elements = ((char, _SINGLE),)
            else:  # MAPPED
                elements = [(chr(cp), t) for cp, t in expansion]
            for value, value_type in elements:
                if value_type == _SINGLE:
                    words.append(([value], [i], -1, i, i + 1))
                    in_word = False
                elif in_word:
                    current[0].append(value)
                    current[1].append(i)
                else:
                    current = ([value], [i], -1, i, i + 1)
                    words.append(current)
                    in_word = True
        return [
            (chars, sources, special, start, end if special >= 0 else sources[-1] + 1)
            for chars, sources, special, start, end in words
        ]

    def split_words(self, text):
        """The normalised words as strings (special tokens as written)."""
        return ["".join(chars) for chars, _, _, _, _ in self.split(text)]

    def _wordpiece(self, word):
        """Greedy longest-match-first pieces of a word: list of (id, first, last + 1), or
        None when the word has no complete segmentation."""
        token_to_id = self.token_to_id
        length = len(word)
        pieces = []
        start = 0
        while start < length:
            end = min(length, start + self.max_token_length)
            found = None
            while end > start:
                piece = word[start:end]
                if start > 0:
                    piece = "##" + piece
                found = token_to_id.get(piece)
                if found is not None:
                    break
                end -= 1
            if found is None:
                return None
            pieces.append((found, start, end))
            start = end
        return pieces

    def token_ids(self, text):
        """The ids of `tokenize(text)` alone. A text in which no special token is written
        and every character is treated alone (all but a capital sigma when lower-casing,
        and characters that expand to punctuation) is split by two `str.translate` calls
        and its words' pieces are remembered (the same ids, several times faster); any
        other text takes `tokenize`."""
        table = self._spaced_table
        for char in set(text):
            if ord(char) not in table and (
                char in self._contextual
                or len(table) >= _MAX_TABLED_CHARACTERS
                or not self._learn(char)
            ):
                return self.tokenize(text)[0]
        if self._verbatim_pattern is not None and self._verbatim_pattern.search(text):
            return self.tokenize(text)[0]
        if self._normalized_pattern is not None and self._normalized_pattern.search(
            text.translate(self._normalized_table)
        ):
            return self.tokenize(text)[0]
        ids, pieces = [], self._pieces
        for word in text.translate(table).split(" "):
            if not word:
                continue
            known = pieces.get(word, False)
            if known is False:
                found = None
                if len(word) <= self.max_chars_per_word:
                    found = self._wordpiece(word)
                known = None if found is None else [piece for piece, _, _ in found]
                if len(pieces) >= _MAX_REMEMBERED_WORDS:
                    pieces.clear()
                pieces[word] = known
            if known is None:
                ids.append(self.unknown_id)
            else:
                ids.extend(known)
        return ids

    def tokenize(self, text):
        """`(ids, starts, ends, word_ids)` of one string, as lists of int."""
        ids, starts, ends, word_ids = [], [], [], []
        for word_index, (chars, sources, special, start, end) in enumerate(self.split(text)):
            if special >= 0:
                pieces = None
                ids.append(self.special_ids[special])
                starts.append(start)
                ends.append(end)
                word_ids.append(word_index)
                continue
            pieces = None
            if len(chars) <= self.max_chars_per_word:
                pieces = self._wordpiece("".join(chars))
            if pieces is None:
                ids.append(self.unknown_id)
                starts.append(start)
                ends.append(end)
                word_ids.append(word_index)
                continue
            for piece_id, first, last in pieces:
                ids.append(piece_id)
                if piece_id == self.unknown_id:
                    starts.append(start)
                    ends.append(end)
                else:
                    starts.append(sources[first])
                    ends.append(sources[last - 1] + 1)
                word_ids.append(word_index)
        return ids, starts, ends, word_ids
