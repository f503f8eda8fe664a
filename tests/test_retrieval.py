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
    with pytest.raises(ValueError, match="same length"):
        retrieval.spearman([1, 2, 3], [1, 2])
