"""kbert.retrieval: chunked exact search and metrics against NumPy brute force / SciPy."""

import numpy as np
import pytest

from kbert import retrieval

pytestmark = pytest.mark.backend_independent


def _data(seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(23, 8)).astype("float32"), rng.normal(size=(57, 8)).astype("float32")


@pytest.mark.parametrize("similarity", ["cosine", "dot"])
def test_search_equals_brute_force(similarity):
    queries, corpus = _data()
    q, c = queries, corpus
    if similarity == "cosine":
        q = q / np.linalg.norm(q, axis=1, keepdims=True)
        c = c / np.linalg.norm(c, axis=1, keepdims=True)
    full = q @ c.T
    expected = np.argsort(-full, axis=1, kind="stable")[:, :7]
    scores, indices = retrieval.search(
        queries, corpus, top_k=7, similarity=similarity, query_chunk_size=5, corpus_chunk_size=10
    )
    np.testing.assert_array_equal(indices, expected)
    np.testing.assert_allclose(scores, np.take_along_axis(full, expected, axis=1), rtol=1e-5)
    # Chunking changes nothing; top_k larger than the corpus returns the whole ranking.
    whole = retrieval.search(queries, corpus, top_k=100, similarity=similarity)[1]
    assert whole.shape == (23, 57)
    np.testing.assert_array_equal(whole[:, :7], expected)
    # Ties go to the lower corpus index, across chunks: rows alternate a vector and its
    # opposite, so half of them tie for first.
    alternating = np.stack([corpus[0] * (1 if i % 2 == 0 else -1) for i in range(40)])
    for chunk in (7, 40):
        _, indices = retrieval.search(
            corpus[:1], alternating, top_k=20, similarity=similarity, corpus_chunk_size=chunk
        )
        assert indices[0].tolist() == list(range(0, 40, 2))


def test_metrics_against_direct_formulas():
    ranked = np.array([[3, 1, 2, 0], [0, 1, 2, 3], [2, 3, 0, 1]])
    relevant = [1, {2, 3}, 9]
    # Query 0: hit at rank 2; query 1: hits at ranks 3, 4; query 2: none.
    assert retrieval.recall_at_k(ranked, relevant, k=1) == 0.0
    np.testing.assert_allclose(retrieval.recall_at_k(ranked, relevant, k=3), (1 + 0.5 + 0) / 3)
    np.testing.assert_allclose(retrieval.mrr_at_k(ranked, relevant, k=10), (1 / 2 + 1 / 3) / 3)
    dcg1 = 1 / np.log2(3)
    dcg2 = 1 / np.log2(4) + 1 / np.log2(5)
    ideal2 = 1 + 1 / np.log2(3)
    np.testing.assert_allclose(
        retrieval.ndcg_at_k(ranked, relevant, k=10), (dcg1 + dcg2 / ideal2 + 0) / 3
    )


def test_ties_and_missing_documents_follow_the_stated_rules():
    # Average precision: a relevant document missing from the list counts 0.
    np.testing.assert_allclose(retrieval.average_precision([[0, 1, 2]], [{1, 9}]), 0.5 / 2)
    # Reranking: equal scores rank the later candidate first (the evaluator's reversed
    # argsort), so the relevant first candidate is second here.
    metrics = retrieval.reranking_metrics([[0.5, 0.5]], [[1, 0]], k=10)
    np.testing.assert_allclose(metrics["mrr@10"], 0.5)
    # Fusion: two rankings of different documents tie rank by rank; ties keep the order of
    # first appearance (the first ranking's document first).
    first, second = np.arange(20)[None], np.arange(100, 120)[None]
    _, ids = retrieval.reciprocal_rank_fusion([first, second])
    assert ids[0].tolist() == [d for i in range(10) for d in (i, 100 + i)]


def test_spearman_cosine_equals_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(40, 6)), rng.normal(size=(40, 6))
    scores = np.round(rng.uniform(0, 5, 40), 0)  # many ties
    cosine = np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    expected = stats.spearmanr(cosine, scores).statistic
    np.testing.assert_allclose(retrieval.spearman_cosine(a, b, scores), expected, rtol=1e-9)


def test_bad_input():
    queries, corpus = _data()
    with pytest.raises(ValueError, match="same dimension"):
        retrieval.search(queries, corpus[:, :4])
    with pytest.raises(ValueError, match="top_k"):
        retrieval.search(queries, corpus, top_k=0)
    with pytest.raises(ValueError, match="one entry per query"):
        retrieval.recall_at_k(np.zeros((2, 3), int), [1])
    with pytest.raises(ValueError, match="Query 1 has no relevant document"):
        retrieval.mrr_at_k(np.zeros((2, 3), int), [1, set()])
    with pytest.raises(ValueError, match="same length"):
        retrieval.spearman([1, 2, 3], [1, 2])


@pytest.mark.backend_independent
def test_reranking_metrics_equal_sentence_transformers_evaluator():
    """kbert's MAP / MRR@k / nDCG@k of reranked lists and of the lists' own order against
    sentence-transformers' CrossEncoderRerankingEvaluator, given the same scores."""
    st_evaluation = pytest.importorskip("sentence_transformers.cross_encoder.evaluation")
    from kbert.retrieval import reranking_metrics

    rng = np.random.default_rng(0)
    documents = [f"d{i}" for i in range(14)]
    table = {}

    class Scores:
        """A stand-in model: fixed random scores per (query, document) pair."""

        class model_card_data:
            @staticmethod
            def set_evaluation_metrics(*args, **kwargs):
                pass

        def predict(self, pairs, **kwargs):
            return np.array([table.setdefault(tuple(p), rng.normal()) for p in pairs])

    samples = []
    for q in range(6):
        order = rng.permutation(documents)
        positives = list(rng.choice(documents, 1 + q % 3, replace=False))
        samples.append({"query": f"q{q}", "positive": positives, "documents": list(order[:12])})
    samples.append({"query": "q6", "positive": ["x"], "documents": documents[:5]})  # none found
    for at_k in (3, 10):
        for always in (True, False):
            evaluator = st_evaluation.CrossEncoderRerankingEvaluator(
                samples, at_k=at_k, always_rerank_positives=always, write_csv=False
            )
            expected = evaluator(Scores())
            scores, relevance, base_scores, base_relevance = [], [], [], []
            for sample in samples:
                positives, listed = sample["positive"], sample["documents"]
                found = [int(d in positives) for d in listed]
                if any(found):
                    found += [1] * (len(positives) - sum(found))
                base_scores.append(np.arange(len(found), 0, -1))
                base_relevance.append(found)
                docs = positives + [d for d in listed if d not in positives] if always else listed
                scores.append(
                    [table[(sample["query"], d)] for d in docs] if any(found) or always else [0.0]
                )
                relevance.append(
                    [int(d in positives) for d in docs] if any(found) or always else [0]
                )
            actual = reranking_metrics(scores, relevance, at_k)
            base = reranking_metrics(base_scores, base_relevance, at_k)
            for name in ("map", f"mrr@{at_k}", f"ndcg@{at_k}"):
                assert abs(actual[name] - expected[name]) < 1e-9, (name, actual, expected)
                assert abs(base[name] - expected["base_" + name]) < 1e-9, (name, base, expected)
            assert abs(actual["map"] - base["map"]) > 1e-3  # reranking changes the metrics
    with pytest.raises(ValueError, match="one entry per query"):
        reranking_metrics([[1.0]], [[1], [0]])
    with pytest.raises(ValueError, match="equally long"):
        reranking_metrics([[1.0, 2.0]], [[1]])
