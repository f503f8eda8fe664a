"""Exact embedding search and the retrieval / similarity metrics of sentence embeddings.

- `search(queries, corpus, top_k)`: exact top-k by cosine or dot product. The corpus is
  scored in chunks and a running top-k is kept, so no `(num_queries, corpus_size)` matrix is
  ever held for a large corpus (memory: `query_chunk_size x corpus_chunk_size` scores).
- `sparse_search(queries, corpus, top_k)`: the same for sparse (SPLADE) vectors, by dot
  product on SciPy sparse matrices.
- `recall_at_k`, `mrr_at_k`, `ndcg_at_k`: retrieval metrics of ranked results, with one or
  several relevant documents per query (binary relevance), as sentence-transformers'
  `InformationRetrievalEvaluator` computes them.
- `average_precision` and `reranking_metrics`: MAP, MRR@k and nDCG@k of scored candidate
  lists (a reranker's), as sentence-transformers' `CrossEncoderRerankingEvaluator`.
- `spearman_cosine`: Spearman correlation between the cosine similarity of embedding pairs
  and gold scores (STS benchmarks), ties ranked by their average rank.

NumPy only (and SciPy for `sparse_search`); inputs may be NumPy arrays or backend tensors.
"""

import numpy as np


def _as_matrix(x, name):
    if hasattr(x, "numpy") and not isinstance(x, np.ndarray):
        x = x.numpy()
    x = np.asarray(x)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2 or x.shape[0] == 0 or x.dtype.kind not in "fiu":
        raise ValueError(
            f"`{name}` must be a non-empty (rows, dim) matrix of numbers. "
            f"Received shape {x.shape} and dtype {x.dtype}"
        )
    return x.astype(np.float32, copy=False)


def _normalize(x):
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def search(
    queries,
    corpus,
    top_k=10,
    similarity="cosine",
    query_chunk_size=1024,
    corpus_chunk_size=16384,
):
    """Exact top-k search of `queries` in `corpus`.

    Args:
        queries: `(num_queries, dim)` embeddings.
        corpus: `(corpus_size, dim)` embeddings.
        top_k: int. Results per query (at most `corpus_size`). Defaults to `10`.
        similarity: `"cosine"` or `"dot"`. Defaults to `"cosine"`.
        query_chunk_size: int. Queries scored at once. Defaults to `1024`.
        corpus_chunk_size: int. Corpus rows scored at once. Defaults to `16384`.

    Returns:
        `(scores, indices)`: float32 and int64 arrays `(num_queries, top_k)`, best first;
        ties go to the lower corpus index.

    Example:
    >>> passages = np.array([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]])
    >>> scores, indices = search(np.array([[0.0, 2.0], [1.0, 0.1]]), passages, top_k=2)
    >>> indices
    array([[2, 1],
           [0, 1]])
    >>> scores.round(3)
    array([[1.   , 0.8  ],
           [0.995, 0.677]], dtype=float32)
    """
    queries, corpus = _as_matrix(queries, "queries"), _as_matrix(corpus, "corpus")
    if queries.shape[1] != corpus.shape[1]:
        raise ValueError(
            f"Queries and corpus must have the same dimension. Received {queries.shape[1]} "
            f"and {corpus.shape[1]}"
        )
    if similarity not in ("cosine", "dot"):
        raise ValueError(f"`similarity` must be 'cosine' or 'dot'. Received: {similarity!r}")
    for name, value in (
        ("top_k", top_k),
        ("query_chunk_size", query_chunk_size),
        ("corpus_chunk_size", corpus_chunk_size),
    ):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
    if similarity == "cosine":
        queries, corpus = _normalize(queries), _normalize(corpus)
    top_k = min(int(top_k), corpus.shape[0])
    all_scores = np.empty((queries.shape[0], top_k), np.float32)
    all_indices = np.empty((queries.shape[0], top_k), np.int64)
    for q_start in range(0, queries.shape[0], query_chunk_size):
        block = queries[q_start : q_start + query_chunk_size]
        best_scores = np.full((len(block), 0), -np.inf, np.float32)
        best_indices = np.zeros((len(block), 0), np.int64)
        for c_start in range(0, corpus.shape[0], corpus_chunk_size):
            chunk_scores = block @ corpus[c_start : c_start + corpus_chunk_size].T
            best_scores, best_indices = _merge_top_k(
                best_scores, best_indices, chunk_scores, c_start, top_k
            )
        all_scores[q_start : q_start + len(block)] = best_scores
        all_indices[q_start : q_start + len(block)] = best_indices
    return all_scores, all_indices


def _merge_top_k(best_scores, best_indices, chunk_scores, start, top_k):
    """The running top-k `(scores, indices)` after a chunk of scores for corpus rows
    `start, start + 1, ...`: by score descending, then index ascending."""
    chunk_indices = np.broadcast_to(
        np.arange(start, start + chunk_scores.shape[1]), chunk_scores.shape
    )
    scores = np.concatenate([best_scores, chunk_scores], axis=1)
    indices = np.concatenate([best_indices, chunk_indices], axis=1)
    order = np.lexsort((indices, -scores), axis=1)[:, :top_k]
    return np.take_along_axis(scores, order, axis=1), np.take_along_axis(indices, order, axis=1)


def _as_sparse_rows(x, name):
    """`x` (SciPy sparse, NumPy or a tensor; one vector or rows) as a float32 CSR matrix."""
    import scipy.sparse

    if scipy.sparse.issparse(x):
        x = scipy.sparse.csr_matrix(x)
        if x.ndim != 2 or x.shape[0] == 0 or x.dtype.kind not in "fiu":
            raise ValueError(
                f"`{name}` must be a non-empty (rows, dim) matrix of numbers. "
                f"Received shape {x.shape} and dtype {x.dtype}"
            )
        return x.astype(np.float32)
    return scipy.sparse.csr_matrix(_as_matrix(x, name))


def sparse_search(queries, corpus, top_k=10, query_chunk_size=1024, corpus_chunk_size=65536):
    """Exact top-k search of sparse vectors by dot product (SPLADE retrieval).

    Scores are sparse dot products (`queries @ corpus.T` on SciPy CSR matrices: only the
    vocabulary entries active in both texts cost anything), taken a block of queries and a
    chunk of the corpus at a time; a running top-k is kept, as `search` does.

    Args:
        queries: `(num_queries, vocabulary_size)` SciPy sparse matrix (what
            `kbert.models.BertSparseEncoder.encode` returns) or dense array.
        corpus: `(corpus_size, vocabulary_size)` SciPy sparse matrix or dense array.
        top_k: int. Results per query (at most `corpus_size`). Defaults to `10`.
        query_chunk_size: int. Queries scored at once. Defaults to `1024`.
        corpus_chunk_size: int. Corpus rows scored at once. Defaults to `65536`.

    Returns:
        `(scores, indices)`: float32 and int64 arrays `(num_queries, top_k)`, best first;
        ties go to the lower corpus index.

    Example:
    >>> import scipy.sparse
    >>> corpus = scipy.sparse.csr_matrix([[0.0, 2.0, 0.0, 1.0], [1.5, 0.0, 0.0, 0.0],
    ...                                   [0.0, 0.5, 3.0, 0.0]])
    >>> scores, indices = sparse_search(scipy.sparse.csr_matrix([[0.0, 1.0, 1.0, 0.0]]),
    ...                                 corpus, top_k=2)
    >>> indices, scores  # row 2: 0.5 + 3.0; row 0: 2.0
    (array([[2, 0]]), array([[3.5, 2. ]], dtype=float32))
    """
    queries, corpus = _as_sparse_rows(queries, "queries"), _as_sparse_rows(corpus, "corpus")
    if queries.shape[1] != corpus.shape[1]:
        raise ValueError(
            f"Queries and corpus must have the same dimension. Received {queries.shape[1]} "
            f"and {corpus.shape[1]}"
        )
    for name, value in (
        ("top_k", top_k),
        ("query_chunk_size", query_chunk_size),
        ("corpus_chunk_size", corpus_chunk_size),
    ):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
    top_k = min(int(top_k), corpus.shape[0])
    corpus_t = corpus.T.tocsc()  # (dim, corpus): column slices are cheap
    all_scores = np.empty((queries.shape[0], top_k), np.float32)
    all_indices = np.empty((queries.shape[0], top_k), np.int64)
    for q_start in range(0, queries.shape[0], query_chunk_size):
        block = queries[q_start : q_start + query_chunk_size]
        best_scores = np.full((block.shape[0], 0), -np.inf, np.float32)
        best_indices = np.zeros((block.shape[0], 0), np.int64)
        for c_start in range(0, corpus.shape[0], corpus_chunk_size):
            chunk = corpus_t[:, c_start : c_start + corpus_chunk_size]
            chunk_scores = np.asarray((block @ chunk).toarray(), np.float32)
            best_scores, best_indices = _merge_top_k(
                best_scores, best_indices, chunk_scores, c_start, top_k
            )
        all_scores[q_start : q_start + block.shape[0]] = best_scores
        all_indices[q_start : q_start + block.shape[0]] = best_indices
    return all_scores, all_indices


def _relevant_sets(relevant, num_queries):
    if len(relevant) != num_queries:
        raise ValueError(
            f"`relevant` must have one entry per query ({num_queries}). Received {len(relevant)}"
        )
    sets = []
    for i, value in enumerate(relevant):
        if isinstance(value, (int, np.integer)):
            value = {int(value)}
        else:
            value = {int(v) for v in value}
        if not value:
            raise ValueError(f"Query {i} has no relevant document.")
        sets.append(value)
    return sets


def _hits(ranked, relevant, k):
    ranked = np.asarray(ranked)
    if ranked.ndim != 2:
        raise ValueError(
            f"`ranked` must be (num_queries, n) indices. Received shape {ranked.shape}"
        )
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"`k` must be a positive integer. Received: k={k!r}")
    sets = _relevant_sets(relevant, ranked.shape[0])
    hits = np.array([[int(d) in s for d in row[:k]] for row, s in zip(ranked, sets)], bool)
    return hits.reshape(ranked.shape[0], -1), sets


def recall_at_k(ranked, relevant, k=10):
    """Mean over queries of the share of their relevant documents found in the top `k`.

    Args:
        ranked: `(num_queries, n)` corpus indices, best first (e.g. from `search`).
        relevant: per query, one relevant index or a collection of them.
        k: int. Defaults to `10`.
    """
    hits, sets = _hits(ranked, relevant, k)
    return float(np.mean([h.sum() / len(s) for h, s in zip(hits, sets)]))


def mrr_at_k(ranked, relevant, k=10):
    """Mean reciprocal rank of the first relevant document within the top `k` (0 if none)."""
    hits, _ = _hits(ranked, relevant, k)
    first = np.argmax(hits, axis=1)
    return float(np.mean(np.where(hits.any(axis=1), 1.0 / (first + 1), 0.0)))


def ndcg_at_k(ranked, relevant, k=10):
    """Normalised discounted cumulative gain at `k` with binary relevance."""
    hits, sets = _hits(ranked, relevant, k)
    discounts = 1.0 / np.log2(np.arange(2, hits.shape[1] + 2))
    dcg = (hits * discounts).sum(axis=1)
    ideal = np.array([discounts[: min(len(s), hits.shape[1])].sum() for s in sets])
    return float(np.mean(dcg / ideal))


def _average_ranks(x):
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x), np.float64)
    ranks[order] = np.arange(1, len(x) + 1)
    values, inverse = np.unique(x, return_inverse=True)
    totals = np.bincount(inverse, weights=ranks)
    counts = np.bincount(inverse)
    return (totals / counts)[inverse]


def spearman(x, y):
    """Spearman rank correlation of two equally long vectors (ties: average ranks)."""
    x, y = np.asarray(x, np.float64).ravel(), np.asarray(y, np.float64).ravel()
    if len(x) != len(y) or len(x) < 2:
        raise ValueError(
            f"Spearman needs two vectors of the same length >= 2. Received {len(x)} and {len(y)}"
        )
    rx, ry = _average_ranks(x), _average_ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    return float((rx * ry).sum() / np.sqrt((rx**2).sum() * (ry**2).sum()))


def spearman_cosine(first, second, scores):
    """Spearman correlation between `cos(first_i, second_i)` and the gold `scores`."""
    first, second = _as_matrix(first, "first"), _as_matrix(second, "second")
    if first.shape != second.shape:
        raise ValueError(
            f"`first` and `second` must have the same shape. Received {first.shape} and "
            f"{second.shape}"
        )
    cosine = np.sum(_normalize(first) * _normalize(second), axis=-1)
    return spearman(cosine, scores)


def average_precision(ranked, relevant):
    """Mean over queries of the average precision of their ranked lists: the precision at
    the rank of each relevant document, averaged over all the query's relevant documents
    (one missing from the list counts 0)."""
    hits, sets = _hits(ranked, relevant, np.asarray(ranked).shape[1] or 1)
    ranks = np.arange(1, hits.shape[1] + 1)
    precision = np.cumsum(hits, axis=1) / ranks
    return float(np.mean([(p * h).sum() / len(s) for p, h, s in zip(precision, hits, sets)]))


def reranking_metrics(scores, relevance, k=10):
    """MAP, MRR@k and nDCG@k of candidate lists ordered by their scores, as
    sentence-transformers' `CrossEncoderRerankingEvaluator` computes them.

    Each query's candidates are sorted by score, highest first (ties: the later candidate
    first, as the evaluator's reversed `argsort`); `average_precision`, `mrr_at_k` and
    `ndcg_at_k` are then computed per query and averaged; a query without any relevant
    candidate scores 0 on every metric.

    Args:
        scores: per query, a sequence of candidate scores.
        relevance: per query, a sequence of 0/1 (or bool) of the same length: whether each
            candidate is relevant.
        k: int. Cut-off of MRR and nDCG. Defaults to `10`.

    Returns:
        A dict `{"map": float, "mrr@k": float, "ndcg@k": float}` (with `k` written out).

    Example:
    >>> metrics = reranking_metrics([[0.9, 0.1, 0.5], [0.2, 0.8]], [[0, 0, 1], [1, 0]], k=10)
    >>> {name: round(value, 4) for name, value in metrics.items()}
    {'map': 0.5, 'mrr@10': 0.5, 'ndcg@10': 0.6309}
    """
    if len(scores) != len(relevance):
        raise ValueError(
            f"`scores` and `relevance` must have one entry per query. Received {len(scores)} "
            f"and {len(relevance)}"
        )
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"`k` must be a positive integer. Received: k={k!r}")
    totals = np.zeros(3)
    for index, (query_scores, query_relevance) in enumerate(zip(scores, relevance)):
        query_scores = np.asarray(query_scores, np.float64).ravel()
        query_relevance = np.asarray(query_relevance).ravel()
        if query_scores.shape != query_relevance.shape or not query_scores.size:
            raise ValueError(
                f"Query {index}: scores and relevance must be equally long and non-empty. "
                f"Received {query_scores.size} scores and {query_relevance.size} labels"
            )
        relevant = {int(i) for i in np.flatnonzero(query_relevance)}
        if not relevant:
            continue
        ranked = np.argsort(query_scores, kind="stable")[::-1][None, :]
        totals += (
            average_precision(ranked, [relevant]),
            mrr_at_k(ranked, [relevant], k),
            ndcg_at_k(ranked, [relevant], k),
        )
    means = totals / max(len(scores), 1)
    return {"map": float(means[0]), f"mrr@{k}": float(means[1]), f"ndcg@{k}": float(means[2])}
