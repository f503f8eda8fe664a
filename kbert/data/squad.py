"""SQuAD for BERT: sliding-window features with character-offset labels, and answer decoding.

This is the recipe of google-research/bert `run_squad.py`, written on character offsets:

- The question is tokenized and cut to `max_query_length` pieces. The context is tokenized
  with character offsets (`BertTokenizer.tokenize_with_offsets`) and covered by windows of at
  most `max_sequence_length - len(question) - 3` pieces, each starting `doc_stride` pieces after
  the previous one, so a context of any length is covered (never dropped). Every window is
  packed as `[CLS] question [SEP] context-window [SEP]` (segment 0, then segment 1).
- Training labels: the answer's character span `[answer_start, answer_start + len(text))` is
  mapped to the first and last pieces that overlap it. A window that does not contain the whole
  answer (and every window of an unanswerable SQuAD 2.0 question) is labelled `[CLS]` (index
  0) for both start and end. An answer whose `answer_start` does not point at its text in the
  context is counted and reported, and its example is left out of training.
- Each context piece of a window records its character span and whether this window is the
  piece's "max context" window (the one where it has the most context on both sides).
- Decoding takes the `n_best_size` best start and end logits of every window, keeps pairs that
  lie in the context, in order, at most `max_answer_length` pieces long, starting at a
  max-context piece, and answers with the best-scoring span's characters, cut from the
  original context: answers are always exact substrings of the context. For SQuAD 2.0 the
  `[CLS]` score `start[0] + end[0]` (the minimum over windows) is the null answer, chosen when
  it beats the best span by more than `null_score_diff_threshold`.
"""

import collections
import dataclasses
import warnings

import numpy as np


@dataclasses.dataclass
class SquadExample:
    """One question on one context.

    Attributes:
        id: str. The question id.
        question: str.
        context: str.
        answers: list of dicts `{"text": str, "answer_start": int}` (character offset into
            `context`); empty for unanswerable questions.
        is_impossible: bool. SQuAD 2.0 unanswerable question.
    """

    id: str
    question: str
    context: str
    answers: list = dataclasses.field(default_factory=list)
    is_impossible: bool = False


@dataclasses.dataclass
class SquadFeatures:
    """Packed windows (NumPy), one row per window.

    Attributes:
        inputs: dict of int32 `(num_features, max_sequence_length)`: `token_ids`,
            `segment_ids`, `padding_mask`.
        start_positions, end_positions: int32 `(num_features,)` answer piece indices (0 =
            `[CLS]` when the window does not hold the answer); `None` without labels.
        example_index: int32 `(num_features,)`: the example each window belongs to.
        offsets: int32 `(num_features, max_sequence_length, 2)`: character `[start, end)` in
            the context for context pieces, `-1` elsewhere.
        token_is_max_context: bool `(num_features, max_sequence_length)`.
        skipped: list of str. Ids of examples left out because an answer did not match the
            context at its `answer_start` (only when labels were requested).
    """

    inputs: dict
    start_positions: object
    end_positions: object
    example_index: np.ndarray
    offsets: np.ndarray
    token_is_max_context: np.ndarray
    skipped: list = dataclasses.field(default_factory=list)

    @property
    def labels(self):
        """`{"start_logits": start_positions, "end_logits": end_positions}` for `fit`."""
        if self.start_positions is None:
            return None
        return {"start_logits": self.start_positions, "end_logits": self.end_positions}

    def __len__(self):
        return len(self.example_index)


def _field(example, name, default=None):
    if isinstance(example, dict):
        return example.get(name, default)
    return getattr(example, name, default)


def as_squad_examples(examples):
    """Dicts (e.g. from `kbert.data.read_squad`) or `SquadExample`s -> list of `SquadExample`.

    Raises:
        ValueError: a missing question or context, or an empty (whitespace-only) question.
    """
    result = []
    for index, example in enumerate(examples):
        question = _field(example, "question")
        context = _field(example, "context")
        if not isinstance(question, str) or not isinstance(context, str):
            raise ValueError(
                f"Example {index} needs string `question` and `context` fields. "
                f"Received: question={question!r}, context of type {type(context).__name__}"
            )
        if not question.strip():
            raise ValueError(
                f"Example {index} (id {_field(example, 'id', index)!r}) has an empty question. "
                "Expected a non-empty question string."
            )
        answers = _field(example, "answers") or []
        if isinstance(
            answers, dict
        ):  # {"text": [...], "answer_start": [...]} (HF datasets layout).
            answers = [
                {"text": t, "answer_start": s}
                for t, s in zip(answers["text"], answers["answer_start"])
            ]
        answers = [{"text": a["text"], "answer_start": int(a["answer_start"])} for a in answers]
        impossible = bool(_field(example, "is_impossible", False))
        result.append(
            SquadExample(
                id=str(_field(example, "id", index)),
                question=question,
                context=context,
                answers=answers,
                is_impossible=impossible,
            )
        )
    return result


def answer_matches_context(context, answer):
    """True when `context[answer_start : answer_start + len(text)] == text`."""
    start = answer["answer_start"]
    text = answer["text"]
    return 0 <= start and context[start : start + len(text)] == text


def _window_spans(num_tokens, max_tokens, doc_stride):
    """`(start, length)` windows over `num_tokens` pieces (run_squad's loop; one window when
    empty)."""
    spans, start = [], 0
    while True:
        length = min(num_tokens - start, max_tokens)
        spans.append((start, length))
        if start + length >= num_tokens:
            return spans
        start += min(length, doc_stride)


def _max_context_windows(spans, num_tokens):
    """For each context piece, the index of the window where it has the most context."""
    best = np.full(num_tokens, -1, dtype=np.int64)
    best_score = np.full(num_tokens, -np.inf)
    for w, (start, length) in enumerate(spans):
        positions = np.arange(start, start + length)
        left = positions - start
        right = start + length - 1 - positions
        score = np.minimum(left, right) + 0.01 * length
        better = score > best_score[positions]  # Strict: the first window wins ties.
        best[positions[better]] = w
        best_score[positions[better]] = score[better]
    return best


def _as_lists(value):
    return value.to_list() if hasattr(value, "to_list") else value


def _check_window_settings(max_sequence_length, doc_stride, max_query_length):
    for name, value, minimum in (
        ("max_sequence_length", max_sequence_length, 4),
        ("doc_stride", doc_stride, 1),
        ("max_query_length", max_query_length, 1),
    ):
        if not isinstance(value, (int, np.integer)) or value < minimum:
            raise ValueError(
                f"`{name}` must be an integer >= {minimum}. Received: {name}={value!r}"
            )


def _tokenize_examples(examples, tokenizer):
    """The question pieces of every example, and each distinct context tokenized once
    (contexts repeat across questions: about five questions per SQuAD paragraph) with its
    pieces' character offsets: `(questions, context_index, ids, starts, ends)`."""
    questions = _as_lists(tokenizer.tokenize([e.question for e in examples])) if examples else []
    for example, question_ids in zip(examples, questions):
        if not question_ids:
            raise ValueError(
                f"Example {example.id!r} has a question with no tokens: {example.question!r}. "
                "Expected a non-empty question."
            )
    unique_contexts = list(dict.fromkeys(e.context for e in examples))
    context_index = {c: i for i, c in enumerate(unique_contexts)}
    tokenized = (
        [_as_lists(part) for part in tokenizer.tokenize_with_offsets(unique_contexts)]
        if unique_contexts
        else [[], [], [], []]
    )
    return questions, context_index, tokenized[0], tokenized[1], tokenized[2]


# `_answer_tokens` of an answer that does not match its context (the example is skipped).
_UNMATCHED = object()
# `_append_windows`' answer when no labels are computed.
_NO_LABELS = object()


def _answer_tokens(example, starts, ends):
    """`(first, last)` context piece of the first answer, `None` for no answer, or
    `_UNMATCHED` when the answer is not at `answer_start` or covers no piece."""
    if example.is_impossible or not example.answers:
        return None
    answer = example.answers[0]
    if not answer_matches_context(example.context, answer):
        return _UNMATCHED
    begin = answer["answer_start"]
    finish = begin + len(answer["text"])
    inside = np.nonzero((ends > begin) & (starts < finish))[0]
    if len(inside) == 0:  # The answer is whitespace or deleted characters only.
        return _UNMATCHED
    return (int(inside[0]), int(inside[-1]))


def _append_windows(
    rows, index, query, context, spans, special_ids, max_sequence_length, answer_tokens
):
    """Appends the packed windows `[CLS] query [SEP] context[span] [SEP]` of example `index`
    to `rows` (with start/end labels unless `answer_tokens` is `_NO_LABELS`)."""
    doc_ids, starts, ends = context
    cls_id, sep_id, pad_id = special_ids
    best_window = _max_context_windows(spans, len(doc_ids))
    offset = len(query) + 2
    for w, (start, length) in enumerate(spans):
        token_ids = np.full(max_sequence_length, pad_id, dtype=np.int32)
        segment_ids = np.zeros(max_sequence_length, dtype=np.int32)
        padding_mask = np.zeros(max_sequence_length, dtype=np.int32)
        offsets = np.full((max_sequence_length, 2), -1, dtype=np.int32)
        max_context = np.zeros(max_sequence_length, dtype=bool)
        total = offset + length + 1
        token_ids[0] = cls_id
        token_ids[1 : offset - 1] = query
        token_ids[offset - 1] = sep_id
        token_ids[offset : offset + length] = doc_ids[start : start + length]
        token_ids[offset + length] = sep_id
        segment_ids[offset:total] = 1
        padding_mask[:total] = 1
        offsets[offset : offset + length, 0] = starts[start : start + length]
        offsets[offset : offset + length, 1] = ends[start : start + length]
        max_context[offset : offset + length] = best_window[start : start + length] == w
        rows["token_ids"].append(token_ids)
        rows["segment_ids"].append(segment_ids)
        rows["padding_mask"].append(padding_mask)
        rows["offsets"].append(offsets)
        rows["max_context"].append(max_context)
        rows["example_index"].append(index)
        if answer_tokens is _NO_LABELS:
            continue
        first, last = 0, 0
        if answer_tokens is not None:
            a, b = answer_tokens
            if start <= a and b < start + length:
                first, last = a - start + offset, b - start + offset
        rows["start"].append(first)
        rows["end"].append(last)


def prepare_squad_features(
    examples,
    tokenizer,
    max_sequence_length=384,
    doc_stride=128,
    max_query_length=64,
    labels=False,
    verbose=False,
):
    """Windows SQuAD examples into packed BERT features.

    Args:
        examples: list of `SquadExample` or dicts with `id`, `question`, `context`, `answers`
            (`[{"text", "answer_start"}]`) and optionally `is_impossible`.
        tokenizer: `kbert.text.BertTokenizer` (needs `tokenize`, `tokenize_with_offsets` with
            character offsets, and the special token ids).
        max_sequence_length: int. Length of each packed window. Defaults to `384`.
        doc_stride: int. Pieces between the starts of consecutive windows. Defaults to `128`.
        max_query_length: int. Questions are cut to this many pieces. Defaults to `64`.
        labels: bool. Compute start/end labels from the first answer (training). Examples
            whose answer does not match the context are then skipped and reported. Defaults
            to `False`.
        verbose: bool. Print a progress bar. Defaults to `False`.

    Returns:
        `SquadFeatures`.

    Example:
    >>> tokenizer = kbert.text.BertTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
    ...     "who", "wrote", "it", "?", "was", "written", "by", "ann", "."])
    >>> features = prepare_squad_features(
    ...     [{"id": "q1", "question": "Who wrote it?", "context": "It was written by Ann.",
    ...       "answers": [{"text": "Ann", "answer_start": 18}]}],
    ...     tokenizer, max_sequence_length=32, labels=True)
    >>> features.start_positions, features.end_positions  # "ann", after [CLS] question [SEP]
    (array([10], dtype=int32), array([10], dtype=int32))
    """
    _check_window_settings(max_sequence_length, doc_stride, max_query_length)
    examples = as_squad_examples(examples)
    questions, context_index, context_ids, context_starts, context_ends = _tokenize_examples(
        examples, tokenizer
    )
    special_ids = (tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id)
    rows = collections.defaultdict(list)
    skipped = []
    progbar = None
    if verbose:
        import keras

        progbar = keras.utils.Progbar(len(examples), unit_name="example")
    for index, example in enumerate(examples):
        if progbar is not None and index % 256 == 0:
            progbar.update(index)
        query = questions[index][:max_query_length]
        c = context_index[example.context]
        doc_ids = context_ids[c]
        starts = np.asarray(context_starts[c], dtype=np.int64)
        ends = np.asarray(context_ends[c], dtype=np.int64)

        answer_tokens = None  # (first, last) context piece of the answer, or None.
        if labels:
            answer_tokens = _answer_tokens(example, starts, ends)
            if answer_tokens is _UNMATCHED:
                skipped.append(example.id)
                continue

        max_tokens = max_sequence_length - len(query) - 3
        if max_tokens < 1:
            raise ValueError(
                f"Example {example.id!r}: its question ({len(query)} pieces after the "
                f"max_query_length={max_query_length} cut) leaves no room for the context in "
                f"max_sequence_length={max_sequence_length}. Expected len(question) + 3 < "
                "max_sequence_length; lower max_query_length or raise max_sequence_length."
            )
        spans = _window_spans(len(doc_ids), max_tokens, doc_stride)
        _append_windows(
            rows,
            index,
            query,
            (doc_ids, starts, ends),
            spans,
            special_ids,
            max_sequence_length,
            answer_tokens if labels else _NO_LABELS,
        )
    if progbar is not None:
        progbar.update(len(examples), finalize=True)
    if skipped:
        warnings.warn(
            f"{len(skipped)} of {len(examples)} examples were left out of training: their answer "
            "text is not found in the context at `answer_start` (first ids: "
            f"{skipped[:5]}).",
            stacklevel=2,
        )

    def stack(key, shape, dtype):
        return np.stack(rows[key]).astype(dtype) if rows[key] else np.zeros(shape, dtype)

    empty = (0, max_sequence_length)
    return SquadFeatures(
        inputs={
            "token_ids": stack("token_ids", empty, "int32"),
            "segment_ids": stack("segment_ids", empty, "int32"),
            "padding_mask": stack("padding_mask", empty, "int32"),
        },
        start_positions=np.asarray(rows["start"], dtype="int32") if labels else None,
        end_positions=np.asarray(rows["end"], dtype="int32") if labels else None,
        example_index=np.asarray(rows["example_index"], dtype="int32"),
        offsets=stack("offsets", empty + (2,), "int32"),
        token_is_max_context=stack("max_context", empty, bool),
        skipped=skipped,
    )


def decode_squad_predictions(
    examples,
    features,
    start_logits,
    end_logits,
    n_best_size=20,
    max_answer_length=30,
    allow_no_answer=False,
    null_score_diff_threshold=0.0,
    return_details=False,
):
    """Turns per-window start/end logits into one answer string per example.

    Args:
        examples: the examples the features were built from (same order).
        features: `SquadFeatures` from `prepare_squad_features`.
        start_logits, end_logits: float arrays `(num_features, max_sequence_length)`.
        n_best_size: int. Start and end candidates per window, and answers kept. Defaults to `20`.
        max_answer_length: int. Longest answer, in pieces. Defaults to `30`.
        allow_no_answer: bool. SQuAD 2.0: answer `""` when the null (`[CLS]`) score beats the
            best span by more than `null_score_diff_threshold`. Defaults to `False`.
        null_score_diff_threshold: float. Defaults to `0.0`.
        return_details: bool. Also return the null-score differences and the n-best lists.

    Returns:
        `{id: answer}`; with `return_details`, `(answers, null_score_diffs, nbest)` where
        `null_score_diffs[id] = null score - best span score` (the `na_probs` of the official
        SQuAD 2.0 evaluation) and `nbest[id]` is a list of `{"text", "score", "start", "end"}`
        (character offsets into the context).
    """
    examples = as_squad_examples(examples)
    start_logits = np.asarray(start_logits, dtype=np.float64)
    end_logits = np.asarray(end_logits, dtype=np.float64)
    expected = features.inputs["token_ids"].shape
    if start_logits.shape != expected or end_logits.shape != expected:
        raise ValueError(
            f"`start_logits` and `end_logits` must have the features' shape {expected}. "
            f"Received {start_logits.shape} and {end_logits.shape}"
        )
    by_example = collections.defaultdict(list)
    for row, index in enumerate(features.example_index):
        by_example[int(index)].append(row)

    answers, null_diffs, nbest_lists = {}, {}, {}
    for index, example in enumerate(examples):
        candidates = []
        null_score = np.inf
        for row in by_example.get(index, []):
            starts, ends = start_logits[row], end_logits[row]
            offsets = features.offsets[row]
            max_context = features.token_is_max_context[row]
            null_score = min(null_score, starts[0] + ends[0])
            top_starts = np.argsort(-starts, kind="stable")[:n_best_size]
            top_ends = np.argsort(-ends, kind="stable")[:n_best_size]
            for s in top_starts:
                if offsets[s, 0] < 0 or not max_context[s]:
                    continue
                for e in top_ends:
                    if offsets[e, 0] < 0 or e < s or e - s + 1 > max_answer_length:
                        continue
                    candidates.append((starts[s] + ends[e], int(offsets[s, 0]), int(offsets[e, 1])))
        candidates.sort(key=lambda c: -c[0])
        nbest, seen = [], set()
        for score, char_start, char_end in candidates:
            text = example.context[char_start:char_end]
            if text in seen:
                continue
            seen.add(text)
            nbest.append(
                {"text": text, "score": float(score), "start": char_start, "end": char_end}
            )
            if len(nbest) >= n_best_size:
                break
        best = nbest[0] if nbest else None
        if not np.isfinite(null_score):
            null_score = 0.0
        diff = float(null_score - best["score"]) if best is not None else float("inf")
        null_diffs[example.id] = diff
        if best is None or (allow_no_answer and diff > null_score_diff_threshold):
            answers[example.id] = ""
        else:
            answers[example.id] = best["text"]
        nbest_lists[example.id] = nbest
    if return_details:
        return answers, null_diffs, nbest_lists
    return answers
