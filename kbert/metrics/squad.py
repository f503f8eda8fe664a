"""SQuAD exact match and F1, as the official v1.1 and v2.0 evaluation scripts.

Answers are compared after `normalize_answer` (lower case, punctuation
removed, the articles a/an/the removed, whitespace collapsed); a question's
score is the best over its gold answers. Scores are percentages (0-100), as
the official scripts print them.

Version differences kept from the official scripts:

- v1.1: F1 of an answer whose normalized text is empty is 0 (even against an
  empty gold answer); every gold answer is used.
- v2.0: gold answers that normalize to empty are dropped, an unanswerable
  question has the single gold answer `""`, and F1 is 1 when prediction and
  gold are both empty (0 when only one is). With `na_probs`, predictions whose
  no-answer probability exceeds `na_prob_thresh` are read as "no answer", and
  the best thresholds for EM and F1 are searched as the official script does.

One deliberate difference: a question without a prediction scores 0 and stays
in every total, in both versions (the official v1.1 script does the same; the
official v2.0 script drops it from the totals or fails). The number of such
questions is returned as `missing` and reported with a warning.
"""

import collections
import re
import string
import warnings

_VERSIONS = ("1.1", "2.0")
_DROP_PUNCTUATION = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text):
    """Lower-cases, drops punctuation and articles, and collapses whitespace.

    Args:
        text: str. An answer.

    Returns:
        str, the normalized answer (as in both official SQuAD scripts).

    Example:

    >>> normalize_answer("The  Eiffel-Tower, in Paris!")
    'eiffeltower in paris'
    """
    text = text.lower()
    text = text.translate(_DROP_PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _f1(gold_tokens, pred_tokens, version):
    """Token-overlap F1 of two normalized, split answers."""
    if version == "2.0" and (not gold_tokens or not pred_tokens):
        return float(gold_tokens == pred_tokens)
    common = collections.Counter(gold_tokens) & collections.Counter(pred_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _questions(dataset):
    """Yields (qid, answer texts, has_answer) in file order."""
    if isinstance(dataset, dict):
        if "data" not in dataset:
            raise ValueError(
                "`dataset` must be the SQuAD JSON dict (with a 'data' key) or its "
                f"'data' list. Received a dict with keys {sorted(dataset)[:5]}"
            )
        dataset = dataset["data"]
    if not isinstance(dataset, (list, tuple)):
        raise ValueError(
            "`dataset` must be the SQuAD JSON dict or its 'data' list. Received: "
            f"{type(dataset).__name__}"
        )
    for article_index, article in enumerate(dataset):
        try:
            paragraphs = article["paragraphs"]
        except (KeyError, TypeError):
            raise ValueError(
                f"Article {article_index} of `dataset` has no 'paragraphs' list; "
                "expected SQuAD's {'title', 'paragraphs': [...]} layout."
            ) from None
        for paragraph in paragraphs:
            for qa in paragraph["qas"]:
                texts = [answer["text"] for answer in qa.get("answers", [])]
                yield qa["id"], texts, bool(texts)


def _best_threshold(pred_no_answer, scores, na_probs, has_answer, total):
    """The official v2.0 `find_best_thresh`, over questions with predictions.

    Questions are taken in increasing `na_probs` order (ties in the order of
    `na_probs`, as the official script's stable sort); answering the first k
    and abstaining on the rest is scored for every k.
    """
    score = float(sum(1 for q in scores if not has_answer[q]))
    best_score, best_threshold = score, 0.0
    for qid in sorted(na_probs, key=lambda q: na_probs[q]):
        if qid not in scores:
            continue
        if has_answer[qid]:
            score += scores[qid]
        elif not pred_no_answer[qid]:
            score -= 1.0
        if score > best_score:
            best_score, best_threshold = score, na_probs[qid]
    return 100.0 * best_score / total, best_threshold


def squad_scores(predictions, dataset, version="1.1", na_probs=None, na_prob_thresh=1.0):
    """Exact match and F1 of predictions on SQuAD, as the official scripts.

    Args:
        predictions: dict {question id: predicted answer text}. For v2.0 an
            empty string means "no answer".
        dataset: the SQuAD JSON as a dict (with `data`) or its `data` list.
            Pass a slice of the articles to score only those.
        version: str. `"1.1"` or `"2.0"`: which official script to follow.
            Defaults to `"1.1"`.
        na_probs: optional dict {question id: probability of no answer}
            (v2.0 only); needs a value for every predicted question.
        na_prob_thresh: float. With `na_probs`, a prediction whose
            probability is above this is read as "no answer". Defaults to 1.0
            (never), as the official script.

    Returns:
        dict with `exact_match`, `f1` (percentages), `total` (questions),
        `missing` (questions without a prediction, scored 0). For v2.0 also
        `HasAns_exact_match`, `HasAns_f1`, `HasAns_total` and the `NoAns_`
        ones for the questions with / without a gold answer (where there are
        any), and with `na_probs`: `best_exact_match`, `best_exact_match_thresh`,
        `best_f1`, `best_f1_thresh`. (The official v2.0 script calls
        `exact_match` "exact".)

    Example:

    >>> data = [{"title": "t", "paragraphs": [{"context": "The cat sat.", "qas": [
    ...     {"id": "q1", "question": "Who sat?",
    ...      "answers": [{"text": "The cat", "answer_start": 0}]}]}]}]
    >>> squad_scores({"q1": "cat"}, data)
    {'exact_match': 100.0, 'f1': 100.0, 'total': 1, 'missing': 0}
    """
    if version not in _VERSIONS:
        raise ValueError(f"`version` must be one of {_VERSIONS}. Received: {version!r}")
    if not isinstance(predictions, dict):
        raise ValueError(
            "`predictions` must be a dict {question id: answer text}. Received: "
            f"{type(predictions).__name__}"
        )
    if na_probs is not None and version != "2.0":
        raise ValueError("`na_probs` is only used with version='2.0'.")

    exact, f1, has_answer = {}, {}, {}
    missing = 0
    for qid, gold_texts, answerable in _questions(dataset):
        if qid in has_answer:
            raise ValueError(f"Question id {qid!r} appears twice in `dataset`.")
        has_answer[qid] = answerable
        golds = [normalize_answer(text) for text in gold_texts]
        if version == "2.0":
            golds = [gold for gold in golds if gold] or [""]
        elif not golds:
            raise ValueError(
                f"Question {qid!r} has no gold answer; SQuAD v1.1 questions all "
                "have one (use version='2.0' for unanswerable questions)."
            )
        if qid not in predictions:
            missing += 1
            continue
        prediction = predictions[qid]
        if not isinstance(prediction, str):
            raise ValueError(
                f"The prediction for {qid!r} must be a string. Received: "
                f"{type(prediction).__name__}"
            )
        prediction = normalize_answer(prediction)
        pred_tokens = prediction.split()
        exact[qid] = max(float(gold == prediction) for gold in golds)
        f1[qid] = max(_f1(gold.split(), pred_tokens, version) for gold in golds)

    total = len(has_answer)
    if total == 0:
        raise ValueError("`dataset` holds no questions.")
    if missing:
        warnings.warn(
            f"{missing} of {total} questions have no prediction; they score 0.",
            stacklevel=2,
        )

    raw_exact, raw_f1 = exact, f1
    if na_probs is not None:
        absent = [qid for qid in exact if qid not in na_probs]
        if absent:
            raise ValueError(
                f"`na_probs` has no value for {len(absent)} predicted questions "
                f"(first: {absent[0]!r}); expected one for each."
            )
        exact, f1 = dict(exact), dict(f1)
        for qid in exact:
            if na_probs[qid] > na_prob_thresh:
                exact[qid] = f1[qid] = float(not has_answer[qid])

    def summary(qids, prefix=""):
        count = len(qids)
        return {
            f"{prefix}exact_match": 100.0 * sum(exact.get(q, 0.0) for q in qids) / count,
            f"{prefix}f1": 100.0 * sum(f1.get(q, 0.0) for q in qids) / count,
            f"{prefix}total": count,
        }

    result = summary(list(has_answer))
    result["missing"] = missing
    if version == "2.0":
        with_answer = [q for q, answerable in has_answer.items() if answerable]
        without_answer = [q for q, answerable in has_answer.items() if not answerable]
        if with_answer:
            result.update(summary(with_answer, "HasAns_"))
        if without_answer:
            result.update(summary(without_answer, "NoAns_"))
        if na_probs is not None:
            pred_no_answer = {q: not predictions[q] for q in raw_exact}
            best_exact, exact_thresh = _best_threshold(
                pred_no_answer, raw_exact, na_probs, has_answer, total
            )
            best_f1, f1_thresh = _best_threshold(
                pred_no_answer, raw_f1, na_probs, has_answer, total
            )
            result.update(
                {
                    "best_exact_match": best_exact,
                    "best_exact_match_thresh": float(exact_thresh),
                    "best_f1": best_f1,
                    "best_f1_thresh": float(f1_thresh),
                }
            )
    return result
