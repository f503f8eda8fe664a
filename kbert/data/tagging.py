"""Word-level tagging data for BERT: align word labels to WordPieces, and map predictions back.

BERT tags sub-word pieces, while datasets such as CoNLL-2003 label words. The convention of the
BERT paper (section 4.3) is used: each word is tokenized on its own, its FIRST piece carries
the word's label, and its other pieces, `[CLS]`, `[SEP]` and padding get weight 0 (they are
neither trained on nor scored). Predictions are mapped back to words through the first piece.

Sentences whose pieces do not fit in `sequence_length - 2` are split, at word boundaries, into
several consecutive features, so no word is dropped from training or prediction. A single word
with more pieces than a window holds keeps its first `sequence_length - 2` pieces. A word that
produces no piece at all (only characters the tokenizer deletes, e.g. a zero-width space) has no
place to carry a label: it is not trained on, and `words_from_token_predictions` reports
`fill_value` for it.
"""

import dataclasses

import numpy as np


@dataclasses.dataclass
class TaggingFeatures:
    """Packed tagging features (NumPy), one row per window of a sentence.

    Attributes:
        inputs: dict of int32 arrays `(num_features, sequence_length)`: `token_ids`,
            `segment_ids` (zeros), `padding_mask`.
        labels: int32 `(num_features, sequence_length)`: the word's label id at each word's
            first piece, 0 elsewhere; `None` when no labels were given.
        sample_weight: float32 `(num_features, sequence_length)`: 1 at the first piece of each
            word, 0 at other pieces, special tokens and padding.
        word_ids: int32 `(num_features, sequence_length)`: index of the word (within its
            sentence) each piece belongs to, -1 for special tokens and padding.
        sentence_ids: int32 `(num_features,)`: index of the sentence each feature comes from.
        num_words: int32 `(num_sentences,)`: number of words of each sentence.
        num_unplaced_words: int. Words that produced no piece (not trained on).
    """

    inputs: dict
    labels: object
    sample_weight: np.ndarray
    word_ids: np.ndarray
    sentence_ids: np.ndarray
    num_words: np.ndarray
    num_unplaced_words: int = 0


def _as_sentences(sentences):
    """A batch of sentences as lists of word strings (a str is split on whitespace)."""
    if isinstance(sentences, np.ndarray):
        sentences = sentences.tolist()
    if isinstance(sentences, str) or not isinstance(sentences, (list, tuple)):
        raise ValueError(
            "`sentences` must be a list of sentences, each a list of words or a string. "
            f"Received: {type(sentences).__name__}"
        )
    result = []
    for index, sentence in enumerate(sentences):
        if isinstance(sentence, bytes):
            sentence = sentence.decode("utf-8", errors="replace")
        if isinstance(sentence, str):
            words = sentence.split()
        elif isinstance(sentence, (list, tuple, np.ndarray)):
            words = [
                w.decode("utf-8", errors="replace") if isinstance(w, bytes) else w for w in sentence
            ]
            bad = [w for w in words if not isinstance(w, str)]
            if bad:
                raise ValueError(
                    f"Sentence {index} holds a word that is not a string: {bad[0]!r} "
                    f"(type {type(bad[0]).__name__}). Expected a list of str."
                )
        else:
            raise ValueError(
                f"Sentence {index} must be a list of words or a string. "
                f"Received: {type(sentence).__name__}"
            )
        result.append(list(words))
    return result


def label_ids(word_labels, num_words, label_to_id=None, num_classes=None):
    """Word labels (names or ids) as lists of int ids, with every error reported at once.

    Args:
        word_labels: list (one per sentence) of lists of labels: strings (names, mapped with
            `label_to_id`) or integer ids in `[0, num_classes)`.
        num_words: list of int. Number of words of each sentence (labels must match).
        label_to_id: dict `name -> id` or `None`.
        num_classes: int or `None`. Range check for integer labels.

    Returns:
        list of lists of int.

    Raises:
        ValueError: a sentence whose label count differs from its word count, label names
            not in `label_to_id` (all of them named), or ids outside `[0, num_classes)`.
    """
    if isinstance(word_labels, np.ndarray) and word_labels.dtype != object:
        word_labels = word_labels.tolist()
    if len(word_labels) != len(num_words):
        raise ValueError(
            f"Expected one label list per sentence: {len(num_words)} sentences. "
            f"Received {len(word_labels)} label lists."
        )
    unknown, out_of_range, result = set(), set(), []
    for index, (labels, count) in enumerate(zip(word_labels, num_words)):
        labels = list(labels.tolist() if isinstance(labels, np.ndarray) else labels)
        if len(labels) != count:
            raise ValueError(
                f"Sentence {index} has {count} words but {len(labels)} labels. "
                "Expected one label per word."
            )
        ids = []
        for label in labels:
            if isinstance(label, bytes):
                label = label.decode("utf-8")
            if isinstance(label, str):
                if label_to_id is None:
                    raise ValueError(
                        f"Received label names (e.g. {label!r}) but no label set to map them to "
                        "ids. Give the tagger `labels=[...]` (its label names), or integer labels."
                    )
                if label not in label_to_id:
                    unknown.add(label)
                    ids.append(0)
                    continue
                ids.append(label_to_id[label])
                continue
            if isinstance(label, (bool, np.bool_)) or not isinstance(label, (int, np.integer)):
                if isinstance(label, (float, np.floating)) and float(label).is_integer():
                    label = int(label)
                else:
                    raise ValueError(
                        f"Labels must be strings or integer ids. Received {label!r} "
                        f"(type {type(label).__name__}) in sentence {index}."
                    )
            label = int(label)
            if num_classes is not None and not 0 <= label < num_classes:
                out_of_range.add(label)
            ids.append(label)
        result.append(ids)
    if unknown:
        raise ValueError(
            f"The label set does not cover the data: unknown labels {sorted(unknown)}. "
            f"Known labels: {sorted(label_to_id)}"
        )
    if out_of_range:
        raise ValueError(
            f"Label ids must lie in [0, num_classes) = [0, {num_classes}). "
            f"Received out-of-range ids {sorted(out_of_range)}"
        )
    return result


def _tokenize_words(sentences, tokenizer):
    """Pieces of every word, each word tokenized on its own (as the reference's NER recipe)."""
    flat = [word for sentence in sentences for word in sentence]
    pieces = tokenizer.tokenize(flat) if flat else []
    if hasattr(pieces, "to_list"):
        pieces = pieces.to_list()
    out, start = [], 0
    for sentence in sentences:
        out.append([list(p) for p in pieces[start : start + len(sentence)]])
        start += len(sentence)
    return out


def encode_tagging(
    sentences,
    tokenizer,
    sequence_length=128,
    word_labels=None,
    label_to_id=None,
    num_classes=None,
):
    """Tokenizes word-split sentences and aligns word labels to their first pieces.

    Args:
        sentences: list of sentences, each a list of words (or a string, split on whitespace).
        tokenizer: `kbert.text.BertTokenizer` (anything with `tokenize(list[str])` and the
            `cls_token_id`, `sep_token_id`, `pad_token_id` properties).
        sequence_length: int. Length of each packed row, `[CLS]` and `[SEP]` included.
            Defaults to `128`.
        word_labels: optional list (per sentence) of word labels: names or integer ids.
        label_to_id: dict `name -> id` for label names. Defaults to `None`.
        num_classes: int. Range of integer labels. Defaults to `None` (no range check).

    Returns:
        `TaggingFeatures`.

    Example:
    >>> tokenizer = kbert.text.BertTokenizer(
    ...     ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "eu", "rejects", "german", "call"])
    >>> features = encode_tagging([["EU", "rejects", "German", "call"]], tokenizer,
    ...                           sequence_length=16, word_labels=[["B-ORG", "O", "B-MISC", "O"]],
    ...                           label_to_id={"O": 0, "B-ORG": 1, "B-MISC": 2})
    >>> features.labels[0, :6], features.sample_weight[0, :6]  # [CLS] and [SEP] weigh 0
    (array([0, 1, 0, 2, 0, 0], dtype=int32), array([0., 1., 1., 1., 1., 0.], dtype=float32))
    """
    if not isinstance(sequence_length, (int, np.integer)) or sequence_length < 3:
        raise ValueError(
            "`sequence_length` must be an integer >= 3 ([CLS], one piece, [SEP]). "
            f"Received: sequence_length={sequence_length!r}"
        )
    sentences = _as_sentences(sentences)
    num_words = [len(s) for s in sentences]
    ids = None
    if word_labels is not None:
        ids = label_ids(word_labels, num_words, label_to_id, num_classes)
    pieces = _tokenize_words(sentences, tokenizer)
    capacity = sequence_length - 2

    rows_tokens, rows_words, rows_first, rows_labels, rows_sentence = [], [], [], [], []
    unplaced = 0

    def flush(tokens, words, first, labels, index):
        rows_tokens.append(tokens)
        rows_words.append(words)
        rows_first.append(first)
        rows_labels.append(labels)
        rows_sentence.append(index)

    for index, word_pieces in enumerate(pieces):
        tokens, words, first, labels = [], [], [], []
        for w, word in enumerate(word_pieces):
            if not word:
                unplaced += 1
                continue
            word = word[:capacity]
            if len(tokens) + len(word) > capacity:
                flush(tokens, words, first, labels, index)
                tokens, words, first, labels = [], [], [], []
            label = ids[index][w] if ids is not None else 0
            tokens.extend(word)
            words.extend([w] * len(word))
            first.extend([1.0] + [0.0] * (len(word) - 1))
            labels.extend([label] + [0] * (len(word) - 1))
        flush(tokens, words, first, labels, index)

    n = len(rows_tokens)
    token_ids = np.full((n, sequence_length), tokenizer.pad_token_id, dtype="int32")
    padding_mask = np.zeros((n, sequence_length), dtype="int32")
    word_ids = np.full((n, sequence_length), -1, dtype="int32")
    weights = np.zeros((n, sequence_length), dtype="float32")
    label_array = np.zeros((n, sequence_length), dtype="int32")
    for row, tokens in enumerate(rows_tokens):
        length = len(tokens) + 2
        token_ids[row, 0] = tokenizer.cls_token_id
        token_ids[row, 1 : length - 1] = tokens
        token_ids[row, length - 1] = tokenizer.sep_token_id
        padding_mask[row, :length] = 1
        word_ids[row, 1 : length - 1] = rows_words[row]
        weights[row, 1 : length - 1] = rows_first[row]
        label_array[row, 1 : length - 1] = rows_labels[row]
    return TaggingFeatures(
        inputs={
            "token_ids": token_ids,
            "segment_ids": np.zeros((n, sequence_length), dtype="int32"),
            "padding_mask": padding_mask,
        },
        labels=label_array if ids is not None else None,
        sample_weight=weights,
        word_ids=word_ids,
        sentence_ids=np.asarray(rows_sentence, dtype="int32"),
        num_words=np.asarray(num_words, dtype="int32"),
        num_unplaced_words=unplaced,
    )


def words_from_token_predictions(token_predictions, features, fill_value=-1):
    """Maps per-piece predictions back to words: each word takes its first piece's prediction.

    Args:
        token_predictions: array `(num_features, sequence_length)` of predicted ids (or
            `(num_features, sequence_length, num_classes)` logits, reduced with argmax).
        features: the `TaggingFeatures` the predictions were made on.
        fill_value: value for words that produced no piece. Defaults to `-1`.

    Returns:
        list (one per sentence) of lists of int, one per word.
    """
    predictions = np.asarray(token_predictions)
    if predictions.ndim == 3:
        predictions = predictions.argmax(axis=-1)
    if predictions.shape != features.word_ids.shape:
        raise ValueError(
            "`token_predictions` must have the shape of the features "
            f"{features.word_ids.shape} (or that plus a class axis). Received "
            f"{np.asarray(token_predictions).shape}"
        )
    result = [[fill_value] * int(n) for n in features.num_words]
    first = features.sample_weight > 0
    rows, cols = np.nonzero(first)
    for row, col in zip(rows, cols):
        result[features.sentence_ids[row]][features.word_ids[row, col]] = int(predictions[row, col])
    return result
