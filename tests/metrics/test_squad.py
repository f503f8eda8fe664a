"""SQuAD EM / F1 against hand-computed values and an independent
re-implementation of the official scripts' formulas in this file; on the real
dev-v1.1.json when the shared data folder is present."""

import json
import os
import random
import re
import string
from collections import Counter
from pathlib import Path

import pytest

from kbert.metrics import normalize_answer, squad_scores

pytestmark = pytest.mark.backend_independent

_DATA_DIR = Path(
    os.environ.get(
        "KBERT_DATA_DIR",
        Path(__file__).resolve().parents[2] / ".." / "shared" / "data",
    )
)
_SQUAD_DEV = _DATA_DIR / "squad" / "dev-v1.1.json"


# ----------------------- the official formulas, re-written for the test


_PUNCTUATION = set(string.punctuation)


def _reference_normalize(text):
    text = "".join(c for c in text.lower() if c not in _PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _reference_f1(prediction, gold, v2):
    p = _reference_normalize(prediction).split()
    g = _reference_normalize(gold).split()
    if v2 and (not p or not g):
        return float(p == g)
    same = sum((Counter(p) & Counter(g)).values())
    if not same:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def _reference_scores(predictions, articles, v2=False):
    em = f1 = total = 0.0
    for article in articles:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                total += 1
                if qa["id"] not in predictions:
                    continue
                golds = [a["text"] for a in qa["answers"]]
                if v2:
                    golds = [g for g in golds if _reference_normalize(g)] or [""]
                pred = predictions[qa["id"]]
                em += max(
                    float(_reference_normalize(pred) == _reference_normalize(g)) for g in golds
                )
                f1 += max(_reference_f1(pred, g, v2) for g in golds)
    return 100 * em / total, 100 * f1 / total


def _article(qas, context="ctx"):
    return {"title": "t", "paragraphs": [{"context": context, "qas": qas}]}


def _qa(qid, *answers):
    return {
        "id": qid,
        "question": "?",
        "answers": [{"text": a, "answer_start": 0} for a in answers],
    }


# ------------------------------------------------------------------ tests


def test_normalize_answer():
    assert normalize_answer("The  Eiffel-Tower, in Paris!") == "eiffeltower in paris"
    assert normalize_answer("An apple a day") == "apple day"
    assert normalize_answer("theater") == "theater"  # whole words only
    assert normalize_answer("  A  ") == ""


def test_v11_exact_and_f1_differ_by_hand():
    dataset = {
        "version": "1.1",
        "data": [
            _article(
                [
                    _qa("q1", "the Denver Broncos", "Broncos"),  # EM via 2nd answer
                    _qa("q2", "Super Bowl 50"),  # partial overlap
                    _qa("q3", "1990s"),  # wrong
                    _qa("q4", "Santa Clara, California"),  # punctuation/case
                ]
            )
        ],
    }
    predictions = {
        "q1": "Denver Broncos.",
        "q2": "Bowl 50 game",
        "q3": "2000",
        "q4": "santa clara california",
    }
    scores = squad_scores(predictions, dataset)
    # q1: EM 1, F1 1; q2: EM 0, F1 = 2*(2/3)(2/3)/(4/3) = 2/3; q3: 0; q4: 1.
    assert scores["exact_match"] == pytest.approx(100 * 2 / 4)
    assert scores["f1"] == pytest.approx(100 * (1 + 2 / 3 + 0 + 1) / 4)
    assert (scores["total"], scores["missing"]) == (4, 0)
    # The data list alone works the same.
    assert squad_scores(predictions, dataset["data"]) == scores


def test_missing_predictions_score_zero_and_are_reported():
    data = [_article([_qa("q1", "a cat"), _qa("q2", "dog"), _qa("q3", "fish")])]
    with pytest.warns(UserWarning, match="2 of 3 questions have no prediction"):
        scores = squad_scores({"q1": "cat"}, data)
    assert scores["exact_match"] == pytest.approx(100 / 3)
    assert scores["missing"] == 2


def test_v11_and_v20_differ_on_answers_that_normalize_to_empty():
    # Gold "The" normalizes to "": v1.1 F1 is 0 even for an exact match
    # (no tokens in common); v2.0 drops that gold answer.
    data = [_article([_qa("q1", "The", "the band")])]
    v1 = squad_scores({"q1": "the"}, data, version="1.1")
    assert (v1["exact_match"], v1["f1"]) == (100.0, 0.0)
    v2 = squad_scores({"q1": "the"}, data, version="2.0")
    assert (v2["exact_match"], v2["f1"]) == (0.0, 0.0)
    v2 = squad_scores({"q1": "a band"}, data, version="2.0")
    assert (v2["exact_match"], v2["f1"]) == (100.0, 100.0)


def _best_threshold_by_brute_force(na_probs, answerable, score_of, num_questions):
    """The official find_best_thresh, checked against every threshold t: answer the questions
    whose no-answer probability is at most t (each scoring `score_of(q)`), abstain on the rest
    (right when unanswerable), and keep the first t with the best total."""
    best, best_t = None, None
    for t in [0.0] + sorted(na_probs.values()):
        total = sum(
            score_of(q) if prob <= t else float(not answerable(q)) for q, prob in na_probs.items()
        )
        if best is None or total > best + 1e-12:
            best, best_t = total, t
    return 100 * best / num_questions, best_t


def test_v20_unanswerable_breakdown_and_thresholds():
    data = [
        _article(
            [
                _qa("h1", "Paris"),
                _qa("h2", "blue whale"),
                {"id": "n1", "question": "?", "answers": [], "is_impossible": True},
                {"id": "n2", "question": "?", "answers": [], "is_impossible": True},
            ]
        )
    ]
    predictions = {"h1": "Paris", "h2": "whale", "n1": "", "n2": "London"}
    scores = squad_scores(predictions, data, version="2.0")
    assert scores["HasAns_exact_match"] == pytest.approx(50.0)
    assert scores["HasAns_f1"] == pytest.approx(100 * (1 + 2 / 3) / 2)
    assert scores["NoAns_exact_match"] == scores["NoAns_f1"] == pytest.approx(50.0)
    assert (scores["HasAns_total"], scores["NoAns_total"]) == (2, 2)
    assert scores["exact_match"] == pytest.approx(50.0)

    na_probs = {"h1": 0.1, "h2": 0.7, "n1": 0.4, "n2": 0.9}
    # Threshold 0.8: n2 (0.9) is read as "no answer" -> correct.
    thresholded = squad_scores(
        predictions, data, version="2.0", na_probs=na_probs, na_prob_thresh=0.8
    )
    assert thresholded["NoAns_exact_match"] == pytest.approx(100.0)
    assert thresholded["exact_match"] == pytest.approx(75.0)
    # A probability equal to the threshold is not above it: n2 keeps its answer.
    at = squad_scores(predictions, data, version="2.0", na_probs=na_probs, na_prob_thresh=0.9)
    assert at["NoAns_exact_match"] == pytest.approx(50.0)

    # Best thresholds against a brute force over every threshold.
    def brute(score_of):
        return _best_threshold_by_brute_force(na_probs, lambda q: q.startswith("h"), score_of, 4)

    exact_of = {"h1": 1.0, "h2": 0.0, "n1": 1.0, "n2": 0.0}.__getitem__
    f1_of = {"h1": 1.0, "h2": 2 / 3, "n1": 1.0, "n2": 0.0}.__getitem__
    scores = squad_scores(predictions, data, version="2.0", na_probs=na_probs)
    assert (scores["best_exact_match"], scores["best_exact_match_thresh"]) == pytest.approx(
        brute(exact_of)
    )
    assert (scores["best_f1"], scores["best_f1_thresh"]) == pytest.approx(brute(f1_of))


def test_v20_best_thresholds_equal_a_brute_force_on_random_questions():
    # Unanswerable questions answered anywhere in the order, and questions without a
    # prediction (scoring 0 and staying in the total) whose na_probs are ignored.
    rng = random.Random(7)
    pool = ["Paris", "blue whale", "whale", "London", "red", ""]
    for trial in range(30):
        qas, predictions, na_probs, gold = [], {}, {}, {}
        for i in range(24):
            qid = f"{trial}-{i}"
            answer = rng.choice(pool[:5]) if rng.random() < 0.5 else None
            qas.append(
                _qa(qid, answer)
                if answer
                else {"id": qid, "question": "?", "answers": [], "is_impossible": True}
            )
            gold[qid] = answer or ""
            na_probs[qid] = rng.random()
            if i % 6:  # Every sixth question has no prediction.
                predictions[qid] = rng.choice(pool + [answer or ""])
        with pytest.warns(UserWarning, match="4 of 24 questions"):
            scores = squad_scores(predictions, [_article(qas)], version="2.0", na_probs=na_probs)
        assert scores["total"] == 24 and scores["missing"] == 4
        predicted_na_probs = {q: na_probs[q] for q in predictions}
        score_of = {
            "exact_match": {
                q: float(_reference_normalize(p) == _reference_normalize(gold[q]))
                for q, p in predictions.items()
            },
            "f1": {q: _reference_f1(p, gold[q], True) for q, p in predictions.items()},
        }
        for key, score in score_of.items():
            best, best_t = _best_threshold_by_brute_force(
                predicted_na_probs, gold.__getitem__, score.__getitem__, 24
            )
            assert scores[f"best_{key}"] == pytest.approx(best), (trial, key)
            assert scores[f"best_{key}_thresh"] == best_t, (trial, key)


def test_errors():
    data = [_article([_qa("q1", "x")])]
    with pytest.raises(ValueError, match="version"):
        squad_scores({}, data, version="3.0")
    with pytest.raises(ValueError, match="dict"):
        squad_scores([("q1", "x")], data)
    with pytest.raises(ValueError, match="'data' key"):
        squad_scores({}, {"articles": []})
    with pytest.raises(ValueError, match="no gold answer"):
        squad_scores({}, [_article([{"id": "q", "question": "?", "answers": []}])])
    with pytest.raises(ValueError, match="na_probs"):
        squad_scores({"q1": "x"}, data, version="2.0", na_probs={})
    with pytest.raises(ValueError, match="only used with version='2.0'"):
        squad_scores({"q1": "x"}, data, na_probs={"q1": 0.0})
    with pytest.raises(ValueError, match="must be a string"):
        squad_scores({"q1": None}, data)
    with pytest.raises(ValueError, match="'q1' appears twice"):
        squad_scores({"q1": "x"}, data + [_article([_qa("q1", "y")])])


@pytest.mark.skipif(not _SQUAD_DEV.exists(), reason="shared data folder not present")
def test_real_dev_v11():
    with open(_SQUAD_DEV, encoding="utf-8") as f:
        dataset = json.load(f)
    articles = dataset["data"]
    first = {
        qa["id"]: qa["answers"][0]["text"]
        for a in articles
        for p in a["paragraphs"]
        for qa in p["qas"]
    }
    scores = squad_scores(first, dataset)
    assert scores == {"exact_match": 100.0, "f1": 100.0, "total": 10570, "missing": 0}

    # Perturbed predictions on the first 12 articles (keeps the test fast).
    subset = articles[:12]
    subset_first = {
        qa["id"]: first[qa["id"]] for a in subset for p in a["paragraphs"] for qa in p["qas"]
    }
    answers = list(subset_first.values())
    rng = random.Random(0)
    perturbed = {}
    for qid, text in subset_first.items():
        words = text.split()
        choice = rng.randrange(5)
        if choice == 0 and len(words) > 1:
            text = " ".join(words[1:])  # drop a word: F1 < 100
        elif choice == 1:
            text = "The " + text + " ."  # article + punctuation: EM still 1
        elif choice == 2:
            text = text + " " + rng.choice(answers)  # extra words
        elif choice == 3:
            text = rng.choice(answers)  # another answer
        perturbed[qid] = text
    for qid in list(perturbed)[:100]:
        del perturbed[qid]  # missing -> 0
    with pytest.warns(UserWarning, match=f"100 of {len(subset_first)} "):
        scores = squad_scores(perturbed, subset)
    expected_em, expected_f1 = _reference_scores(perturbed, subset)
    assert scores["exact_match"] == pytest.approx(expected_em, abs=1e-9)
    assert scores["f1"] == pytest.approx(expected_f1, abs=1e-9)
    assert 10 < scores["exact_match"] < scores["f1"] < 90
    # Evaluation on articles 32-47 only (the project's QA evaluation split).
    part = squad_scores(first, articles[32:48])
    assert part["total"] == sum(len(p["qas"]) for a in articles[32:48] for p in a["paragraphs"])
    assert part["missing"] == 0 and part["exact_match"] == 100.0
    expected_em, expected_f1 = _reference_scores(perturbed, subset, v2=True)
    with pytest.warns(UserWarning):
        v2 = squad_scores(perturbed, {"version": "1.1", "data": subset}, version="2.0")
    assert v2["exact_match"] == pytest.approx(expected_em, abs=1e-9)
    assert v2["f1"] == pytest.approx(expected_f1, abs=1e-9)
