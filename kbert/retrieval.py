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

- `EmbeddingIndex` (from `kbert.retrieval_index`): a saved, growable index of float32, int8
  or binary embeddings with ids and the embedder's identity; exact NumPy search, or FAISS flat
  / HNSW; quantized search with float rescoring as sentence-transformers'
  `semantic_search_faiss` / `semantic_search_usearch`.
- `retrieve_then_rerank` and `reciprocal_rank_fusion`: dense and/or sparse first stage, then a
  cross-encoder, in one call.

NumPy only (and SciPy for `sparse_search`); inputs may be NumPy arrays or backend tensors.
"""

import numpy as np

from kbert.retrieval_index import EmbeddingIndex, embedder_fingerprint, quantize

__all__ = [
    "EmbeddingIndex",
    "average_precision",
    "embedder_fingerprint",
    "mrr_at_k",
    "ndcg_at_k",
    "quantize",
    "recall_at_k",
    "reciprocal_rank_fusion",
    "reranking_metrics",
    "retrieve_then_rerank",
    "search",
    "sparse_search",
    "spearman",
    "spearman_cosine",
]


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


def reciprocal_rank_fusion(rankings, k=60, top_k=None):
    """Fuses several rankings of the same documents by reciprocal rank.

    Each document's fused score is the sum over the rankings that hold it of
    `1 / (k + rank)` (rank 1 for the best); the fused ranking sorts by that score, ties
    keeping the order in which documents first appear (first ranking first, best first).

    Args:
        rankings: a list of `(num_queries, n_r)` arrays of document ids, best first (e.g. the
            ids of `EmbeddingIndex.search` and the indices of `sparse_search`).
        k: int. The rank offset (60 in Cormack et al., 2009). Defaults to `60`.
        top_k: int. Results per query. Defaults to the longest ranking's `n_r` (every query
            has at least that many distinct documents).

    Returns:
        `(scores, ids)`: float64 fused scores and the ids, `(num_queries, top_k)`.

    Example:
    >>> scores, ids = reciprocal_rank_fusion([np.array([[3, 1, 2]]), np.array([[1, 5, 3]])],
    ...                                      k=60, top_k=3)
    >>> ids  # 1: 1/62 + 1/61; 3: 1/61 + 1/63; 5: 1/62
    array([[1, 3, 5]])
    """
    if not rankings:
        raise ValueError("`rankings` must hold at least one ranking. Received none")
    rankings = [np.asarray(r) for r in rankings]
    if any(r.ndim != 2 or r.shape[0] != rankings[0].shape[0] for r in rankings):
        raise ValueError(
            "`rankings` must be (num_queries, n) arrays with the same number of queries. "
            f"Received shapes {[r.shape for r in rankings]}"
        )
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
        raise ValueError(f"`k` must be a non-negative integer. Received: k={k!r}")
    longest = max(r.shape[1] for r in rankings)
    top_k = longest if top_k is None else top_k
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1:
        raise ValueError(f"`top_k` must be a positive integer. Received: top_k={top_k!r}")
    if top_k > longest:
        raise ValueError(
            f"`top_k` must be at most the longest ranking's length ({longest}). "
            f"Received top_k={top_k}"
        )
    all_scores, all_ids = [], []
    for rows in zip(*rankings):
        fused = {}  # insertion order: first appearance
        for row in rows:
            for rank, doc in enumerate(row.tolist(), 1):
                fused[doc] = fused.get(doc, 0.0) + 1.0 / (k + rank)
        docs = list(fused)
        scores = np.array([fused[d] for d in docs])
        order = np.argsort(-scores, kind="stable")[:top_k]
        all_scores.append(scores[order])
        all_ids.append([docs[i] for i in order])
    return np.array(all_scores), np.array(all_ids)


def rerank(reranker, queries, documents, candidates, batch_size=32):
    """Scores each query's candidate documents with a cross-encoder and sorts them.

    Args:
        reranker: a model with `predict(pairs, batch_size=...)` returning one score per pair
            (`kbert.models.BertCrossEncoder`; sentence-transformers' `CrossEncoder` too).
        queries: list of query strings.
        documents: the texts by id: a sequence (ids are positions) or a mapping.
        candidates: `(num_queries, n)` document ids per query.
        batch_size: int. Pairs per `predict` batch. Defaults to `32`.

    Returns:
        `(scores, ids)`: the reranker's float32 scores and the ids, `(num_queries, n)`, highest
        score first; ties keep the candidates' order. All pairs are scored in one call.

    Example:
    >>> class Overlap:  # a stand-in reranker: shared words
    ...     def predict(self, pairs, batch_size=32):
    ...         return [len(set(q.split()) & set(d.split())) for q, d in pairs]
    >>> rerank(Overlap(), ["red cat"], ["a dog", "the red cat"], np.array([[0, 1]]))[1]
    array([[1, 0]])
    """
    candidates = np.asarray(candidates)
    if candidates.ndim != 2 or len(candidates) != len(queries):
        raise ValueError(
            f"`candidates` must be (num_queries, n) = ({len(queries)}, n) ids. Received shape "
            f"{candidates.shape}"
        )
    pairs = []
    for query, row in zip(queries, candidates):
        for doc in row.tolist():
            try:
                pairs.append((query, documents[doc]))
            except (KeyError, IndexError) as error:
                raise ValueError(
                    f"Candidate id {doc!r} is not in `documents` ({len(documents)} documents)."
                ) from error
    scores = np.asarray(reranker.predict(pairs, batch_size=batch_size), np.float32)
    scores = scores.reshape(candidates.shape)
    order = np.argsort(-scores, axis=1, kind="stable")
    return np.take_along_axis(scores, order, axis=1), np.take_along_axis(candidates, order, axis=1)


def retrieve_then_rerank(
    queries,
    documents,
    reranker,
    index=None,
    embedder=None,
    sparse_encoder=None,
    sparse_corpus=None,
    sparse_ids=None,
    candidates=20,
    top_k=10,
    fusion_k=60,
    rescore_multiplier=2,
    batch_size=32,
):
    """Retrieve candidates (dense, sparse or both fused), then rerank them, in one call.

    Dense: `embedder.encode_query(queries)` searches `index` (an `EmbeddingIndex`; the
    embedder is checked against the index's identity). Sparse:
    `sparse_encoder.encode_query(queries)` searches `sparse_corpus` (the documents'
    `encode_document` rows) by `sparse_search`. Given both, each retrieves `candidates` and
    the two rankings are fused by `reciprocal_rank_fusion(k=fusion_k)` into `candidates`.
    The reranker then scores every (query, candidate text) pair (`rerank`).

    Args:
        queries: a string or a list of strings.
        documents: the texts by id: a sequence (ids are positions) or a mapping.
        reranker: a model with `predict(pairs, batch_size=...)`, e.g. `BertCrossEncoder`.
        index: `EmbeddingIndex` of the documents (dense retrieval, with `embedder`).
        embedder: `BertTextEmbedder` that wrote the index.
        sparse_encoder: `BertSparseEncoder` (sparse retrieval, with `sparse_corpus`).
        sparse_corpus: SciPy sparse `(num_documents, vocabulary_size)` document vectors.
        sparse_ids: ids of `sparse_corpus`' rows. Defaults to row numbers.
        candidates: int. First-stage results per query. Defaults to `20`.
        top_k: int. Results returned per query (at most `candidates`). Defaults to `10`.
        fusion_k: int. Reciprocal rank fusion's offset. Defaults to `60`.
        rescore_multiplier: int. The index's rescoring factor. Defaults to `2`.
        batch_size: int. Pairs per reranker batch. Defaults to `32`.

    Returns:
        `(scores, ids)`: the reranker's scores and the document ids, `(num_queries, top_k)`,
        best first (one row for a single string query too).

    Example:
    >>> class Words:  # stand-ins: a bag-of-words embedder and a word-overlap reranker
    ...     def encode_query(self, texts):
    ...         return np.array([[w in t for w in ("cat", "dog", "mat")] for t in texts]) + 0.01
    ...     def predict(self, pairs, batch_size=32):
    ...         return [len(set(q.split()) & set(d.split())) for q, d in pairs]
    >>> docs = ["the cat on the mat", "a dog", "the cat"]
    >>> index = EmbeddingIndex.from_embeddings(Words().encode_query(docs))
    >>> scores, ids = retrieve_then_rerank(["where is the cat"], docs, Words(), index=index,
    ...                                    embedder=Words(), candidates=2, top_k=2)
    >>> ids, scores  # both share "the cat": the first stage's order is kept
    (array([[2, 0]]), array([[2., 2.]], dtype=float32))
    """
    if isinstance(queries, str):
        queries = [queries]
    if not queries or not all(isinstance(q, str) for q in queries):
        raise ValueError(f"`queries` must be a non-empty list of strings. Received: {queries!r}")
    dense = index is not None or embedder is not None
    sparse = sparse_encoder is not None or sparse_corpus is not None
    if dense and (index is None or embedder is None):
        raise ValueError("Dense retrieval needs both `index` and `embedder`.")
    if sparse and (sparse_encoder is None or sparse_corpus is None):
        raise ValueError("Sparse retrieval needs both `sparse_encoder` and `sparse_corpus`.")
    if not (dense or sparse):
        raise ValueError(
            "Pass `index` and `embedder` (dense), `sparse_encoder` and `sparse_corpus` "
            "(sparse), or both (fused by reciprocal rank)."
        )
    for name, value in (("candidates", candidates), ("top_k", top_k)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
    if top_k > candidates:
        raise ValueError(
            f"`top_k` must be at most `candidates` ({candidates}). Received top_k={top_k}"
        )
    rankings = []
    if dense:
        query_vectors = embedder.encode_query(list(queries))
        rankings.append(
            index.search(
                query_vectors,
                top_k=candidates,
                rescore_multiplier=rescore_multiplier,
                embedder=embedder,
            )[1]
        )
    if sparse:
        if candidates > sparse_corpus.shape[0]:
            raise ValueError(
                f"`candidates` must be at most the number of sparse documents "
                f"({sparse_corpus.shape[0]}). Received candidates={candidates}"
            )
        _, rows = sparse_search(
            sparse_encoder.encode_query(list(queries)), sparse_corpus, top_k=candidates
        )
        if sparse_ids is not None:
            if len(sparse_ids) != sparse_corpus.shape[0]:
                raise ValueError(
                    f"`sparse_ids` must have one id per row of `sparse_corpus` "
                    f"({sparse_corpus.shape[0]}). Received {len(sparse_ids)}"
                )
            rows = np.asarray(sparse_ids)[rows]
        rankings.append(rows)
    if len(rankings) == 1:
        first_stage = rankings[0]
    else:
        first_stage = reciprocal_rank_fusion(rankings, k=fusion_k, top_k=candidates)[1]
    scores, ids = rerank(reranker, list(queries), documents, first_stage, batch_size)
    return scores[:, :top_k], ids[:, :top_k]
