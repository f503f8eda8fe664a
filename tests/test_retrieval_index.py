"""kbert.retrieval.EmbeddingIndex and retrieve-then-rerank.

References: NumPy brute force (`kbert.retrieval.search`, itself tested against NumPy),
sentence-transformers' `semantic_search_faiss` / `semantic_search_usearch` on the same
embeddings and settings, and direct formulas (reciprocal rank fusion). The index is NumPy /
FAISS code (marked `backend_independent`); the tests that run a Keras embedder or
cross-encoder (fingerprints, `encode(output_dir=...)` shards, retrieve-then-rerank) run on
every backend.
"""

import logging

import numpy as np
import pytest

from kbert import retrieval
from kbert.retrieval import EmbeddingIndex

independent = pytest.mark.backend_independent
HAS_FAISS = pytest.importorskip("importlib").util.find_spec("faiss") is not None
BACKENDS = ["numpy", pytest.param("faiss", marks=pytest.mark.skipif(not HAS_FAISS, reason="faiss"))]


def _data(rows=300, dim=32, queries=20, seed=0):
    rng = np.random.default_rng(seed)
    corpus = rng.normal(size=(rows, dim)).astype("float32")
    return corpus, rng.normal(size=(queries, dim)).astype("float32")


def _normalized(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _st_arrays(results):
    scores = np.array([[hit["score"] for hit in row] for row in results])
    return scores, np.array([[hit["corpus_id"] for hit in row] for row in results])


def _sentence_transformers_quantization():
    pytest.importorskip("sentence_transformers")
    logging.getLogger("sentence_transformers").setLevel(logging.ERROR)
    from sentence_transformers.util import quantization

    return quantization


@independent
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("similarity", ["cosine", "dot"])
def test_float_index_equals_exact_search(backend, similarity):
    corpus, queries = _data()
    ids = np.arange(1000, 1300)[::-1]  # user ids, not row numbers
    index = EmbeddingIndex.from_embeddings(
        corpus, ids=list(ids), similarity=similarity, backend=backend
    )
    scores, found = index.search(queries, top_k=7)
    expected_scores, rows = retrieval.search(queries, corpus, top_k=7, similarity=similarity)
    np.testing.assert_array_equal(found, ids[rows])
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-5, atol=1e-6)


@independent
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rescore", [True, False])
@pytest.mark.parametrize("precision", ["float32", "binary"])
def test_equals_semantic_search_faiss(backend, rescore, precision):
    """Binary candidates by Hamming distance, rescored by the float query against the bits,
    as sentence-transformers' FAISS search (float32: its inner-product flat index)."""
    pytest.importorskip("faiss")
    quantization = _sentence_transformers_quantization()
    corpus, queries = _data()
    index = EmbeddingIndex.from_embeddings(corpus, precision=precision, backend=backend)
    scores, ids = index.search(queries, top_k=5, rescore=rescore, rescore_multiplier=3)
    st_corpus = _normalized(corpus)
    if precision == "binary":
        st_corpus = quantization.quantize_embeddings(st_corpus, "ubinary")
    results, _ = quantization.semantic_search_faiss(
        _normalized(queries),
        corpus_embeddings=st_corpus,
        corpus_precision="ubinary" if precision == "binary" else "float32",
        top_k=5,
        rescore=rescore,
        rescore_multiplier=3,
    )
    expected_scores, expected_ids = _st_arrays(results)
    np.testing.assert_array_equal(ids, expected_ids)
    if precision == "binary" and not rescore:
        expected_scores = -expected_scores  # Hamming distances; the index returns -distance
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-6, atol=1e-6)


@independent
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("precision", ["int8", "binary"])
def test_equals_semantic_search_usearch(backend, precision):
    """int8 (integer dot product, rescored against the values mapped back into their ranges)
    and binary equal sentence-transformers' USearch search with the index's ranges. USearch
    orders equal distances its own way, so the candidates are compared as multisets of
    distances, and the rescored results with candidates covering the corpus."""
    pytest.importorskip("usearch")
    quantization = _sentence_transformers_quantization()
    corpus, queries = _data()
    index = EmbeddingIndex.from_embeddings(corpus, precision=precision, backend=backend)
    st_precision = "ubinary" if precision == "binary" else "int8"
    st_corpus = quantization.quantize_embeddings(
        _normalized(corpus), st_precision, ranges=index.ranges
    )

    def st_search(**kwargs):
        results, _ = quantization.semantic_search_usearch(
            _normalized(queries),
            corpus_embeddings=st_corpus,
            corpus_precision=st_precision,
            ranges=index.ranges,
            **kwargs,
        )
        return _st_arrays(results)

    scores, ids = index.search(queries, top_k=5, rescore_multiplier=60)  # 300 candidates
    expected_scores, expected_ids = st_search(top_k=5, rescore_multiplier=60)
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-9, atol=1e-9)
    scores, _ = index.search(queries, top_k=9, rescore=False)
    expected_scores, _ = st_search(top_k=9, rescore=False)
    # USearch's distances: Hamming; 1 - dot product for int8 ("ip").
    offset = 1 if precision == "int8" else 0
    np.testing.assert_array_equal(scores, offset - expected_scores)


@independent
@pytest.mark.parametrize("precision", ["int8", "binary"])
def test_numpy_candidates_equal_brute_force_with_ties(precision):
    """Chunked NumPy candidate search equals sorting every row by (score descending, row
    ascending): binary Hamming distances over 16 bits and int8 in 1 dimension tie often."""
    corpus, queries = _data(rows=500, dim=16 if precision == "binary" else 1)
    index = EmbeddingIndex.from_embeddings(corpus, precision=precision, similarity="dot")
    scores, ids = index.search(queries, top_k=25, rescore=False, chunk_size=60)
    np.testing.assert_array_equal(
        ids, index.search(queries, top_k=25, rescore=False, chunk_size=1000)[1]
    )
    codes = retrieval.quantize(queries, precision, index.ranges)
    stored = index._vectors()
    if precision == "binary":
        full = -np.unpackbits(codes[:, None, :] ^ stored[None], axis=-1).sum(-1, dtype=np.int64)
    else:
        full = codes.astype(np.int64) @ stored.astype(np.int64).T
    assert len(np.unique(full[0])) <= 256  # many ties among 500 rows
    rows = np.arange(500)
    expected = np.stack([np.lexsort((rows, -row))[:25] for row in full])
    np.testing.assert_array_equal(ids, expected)
    np.testing.assert_array_equal(scores, np.take_along_axis(full, expected, axis=1))


@independent
def test_quantized_rows_and_ranges():
    """int8 rows use the first rows' per-dimension ranges (as sentence-transformers'
    `quantize_embeddings` with those ranges); binary rows pack 8 dimensions per byte."""
    quantization = _sentence_transformers_quantization()
    corpus, queries = _data(dim=20)
    index = EmbeddingIndex.from_embeddings(corpus, precision="int8", similarity="dot")
    np.testing.assert_array_equal(index.ranges, [corpus.min(0), corpus.max(0)])
    np.testing.assert_array_equal(
        index._vectors(), quantization.quantize_embeddings(corpus, "int8", ranges=index.ranges)
    )
    index = EmbeddingIndex.from_embeddings(corpus, precision="binary", similarity="dot")
    np.testing.assert_array_equal(index._vectors(), np.packbits(corpus > 0, axis=1))
    assert index.nbytes == 300 * 3


@independent
@pytest.mark.parametrize("precision", ["float32", "int8", "binary"])
def test_hnsw_recall_against_exact(precision):
    """HNSW finds what exact search finds (recall@10 >= 0.95 on 2,000 random rows)."""
    pytest.importorskip("faiss")
    corpus, queries = _data(rows=2000, dim=24, queries=50)
    exact = EmbeddingIndex.from_embeddings(corpus, precision=precision)
    approx = EmbeddingIndex.from_embeddings(
        corpus, precision=precision, approximate="hnsw", hnsw_m=16, ef_search=64
    )
    # Tie-aware recall@10 of the candidate stage: the share of the approximate results that
    # score at least the exact 10th best (binary Hamming distances tie often).
    exact_scores, exact_ids = exact.search(queries, top_k=2000, rescore=False)
    found = approx.search(queries, top_k=10, rescore=False)[1]
    overlap = np.mean(
        [
            np.mean([scores[list(ids).index(i)] >= scores[9] for i in row])
            for row, scores, ids in zip(found, exact_scores, exact_ids)
        ]
    )
    assert overlap >= 0.95, overlap


@independent
@pytest.mark.parametrize(
    "backend, approximate",
    [
        ("numpy", None),
        pytest.param("faiss", "hnsw", marks=pytest.mark.skipif(not HAS_FAISS, reason="faiss")),
    ],
)
@pytest.mark.parametrize("precision", ["float32", "int8", "binary"])
def test_add_save_load(backend, approximate, precision, tmp_path):
    """Rows added later are found like rows built at once; a saved index loads with the same
    ids, settings and results, and another save replaces it whole."""
    corpus, queries = _data()
    ids = [f"doc-{i}" for i in range(300)]
    whole = EmbeddingIndex.from_embeddings(
        corpus,
        ids=ids,
        precision=precision,
        backend=backend,
        approximate=approximate,
        identity="toy-embedder",
        ef_search=300,
    )
    grown = EmbeddingIndex.from_embeddings(
        corpus[:200],
        ids=ids[:200],
        precision=precision,
        backend=backend,
        approximate=approximate,
        identity="toy-embedder",
        ranges=whole.ranges,
        ef_search=300,
    ).add(corpus[200:], ids=ids[200:])
    # Candidates covering the corpus (and HNSW's beam too): the same results, whatever order
    # equal Hamming distances come in.
    expected = whole.search(queries, top_k=10, rescore_multiplier=30)
    result = grown.search(queries, top_k=10, rescore_multiplier=30)
    np.testing.assert_array_equal(result[1], expected[1])
    np.testing.assert_allclose(result[0], expected[0], rtol=1e-6)
    grown.save(tmp_path / "index")
    loaded = EmbeddingIndex.load(tmp_path / "index", identity="toy-embedder")
    assert (loaded.precision, loaded.backend, loaded.approximate, len(loaded)) == (
        precision,
        backend,
        approximate,
        300,
    )
    np.testing.assert_array_equal(loaded.ids, ids)
    np.testing.assert_array_equal(
        loaded.search(queries, top_k=10, rescore_multiplier=30)[1], expected[1]
    )
    loaded.add(corpus[:1] * 2, ids=["extra"]).save(tmp_path / "index")
    again = EmbeddingIndex.load(tmp_path / "index")
    assert len(again) == 301 and again.search(corpus[:1], top_k=1)[1][0, 0] in ("extra", "doc-0")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index"]  # no staging leftovers


@independent
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("precision", ["int8", "binary"])
def test_float_rescore_vectors_order_candidates_as_exact_search_and_stay_on_disk(
    backend, precision, tmp_path
):
    """`rescore_vectors="float32"`: candidates covering the corpus are ordered exactly as float
    search orders them (the stored codes order them otherwise); saved, the float vectors load
    memory-mapped, with the same results, and the codes stay the index's memory."""
    corpus, queries = _data()
    kwargs = dict(precision=precision, backend=backend)
    exact = retrieval.search(queries, corpus, top_k=10)
    stored = EmbeddingIndex.from_embeddings(corpus, **kwargs)
    floats = EmbeddingIndex.from_embeddings(corpus, rescore_vectors="float32", **kwargs)
    everything = {"top_k": 10, "rescore_multiplier": 30}  # 300 candidates: the corpus
    scores, rows = floats.search(queries, **everything)
    np.testing.assert_array_equal(rows, exact[1])
    np.testing.assert_allclose(scores, exact[0], rtol=1e-5, atol=1e-6)
    # Against its codes the same candidates come out in another order.
    assert (stored.search(queries, **everything)[1] != exact[1]).any()
    assert floats.nbytes == stored.nbytes and floats.rescore_nbytes == corpus.nbytes

    floats.save(tmp_path / "index")
    loaded = EmbeddingIndex.load(tmp_path / "index")
    assert isinstance(loaded._float_chunks[0], np.memmap)
    for multiplier in (4, 30):
        np.testing.assert_array_equal(
            loaded.search(queries, top_k=10, rescore_multiplier=multiplier)[1],
            floats.search(queries, top_k=10, rescore_multiplier=multiplier)[1],
        )
    # Rows added after loading are rescored with their float vectors too.
    loaded.add(queries[:2] * 3, ids=[1000, 1001])
    assert list(loaded.search(queries[:2], top_k=1, rescore_multiplier=50)[1][:, 0]) == [1000, 1001]
    with pytest.raises(ValueError, match="rescore_vectors"):
        EmbeddingIndex(8, rescore_vectors="float16")
    with pytest.raises(ValueError, match='precision="float32"'):
        EmbeddingIndex(8, rescore_vectors="float32")
    with open(tmp_path / "index" / "rescore.npy", "r+b") as file:
        file.truncate(1000)
    with pytest.raises(ValueError, match="truncated or corrupt"):
        EmbeddingIndex.load(tmp_path / "index")


@independent
def test_bad_inputs(tmp_path):
    corpus, queries = _data(rows=30, dim=8)
    with pytest.raises(ValueError, match="index is empty"):
        EmbeddingIndex(dim=8).search(queries, top_k=1)
    with pytest.raises(ValueError, match="non-empty"):
        EmbeddingIndex.from_embeddings(np.zeros((0, 8), "float32"))
    index = EmbeddingIndex.from_embeddings(corpus, identity="a")
    with pytest.raises(ValueError, match="dimension 9; this index holds 8-dimensional"):
        index.search(np.ones((1, 9), "float32"))
    with pytest.raises(ValueError, match="dimension 9"):
        index.add(np.ones((1, 9), "float32"))
    with pytest.raises(ValueError, match=r"at most the number of indexed rows \(30\). .*top_k=31"):
        index.search(queries, top_k=31)
    with pytest.raises(ValueError, match="'b' is not the index's: the index was built by 'a'"):
        index.search(queries, identity="b")
    with pytest.raises(ValueError, match="unique. Received 3 twice"):
        index.add(corpus[:1], ids=[3])
    with pytest.raises(ValueError, match="one entry per embedding"):
        index.add(corpus[:2], ids=[100])
    with pytest.raises(ValueError, match="precision"):
        EmbeddingIndex(dim=8, precision="float16")
    with pytest.raises(ValueError, match='expected backend="faiss"'):
        EmbeddingIndex(dim=8, approximate="hnsw", backend="numpy")
    with pytest.raises(ValueError, match="String queries need `embedder`"):
        index.search(["a query"])
    with pytest.raises(ValueError, match="empty: there is nothing to save"):
        EmbeddingIndex(dim=8).save(tmp_path / "empty")
    assert not (tmp_path / "empty").exists()

    # A truncated or altered file is refused before it is read; a failing save leaves the
    # previous index whole.
    index.save(tmp_path / "index")
    vectors = tmp_path / "index" / "vectors.npy"
    good = vectors.read_bytes()
    vectors.write_bytes(good[:-16])
    with pytest.raises(ValueError, match=r"vectors.npy is truncated or corrupt: \d+ bytes"):
        EmbeddingIndex.load(tmp_path / "index")
    vectors.write_bytes(good)
    with pytest.raises(ValueError, match="the index was built by 'a'"):
        EmbeddingIndex.load(tmp_path / "index", identity="b")
    bigger = EmbeddingIndex.from_embeddings(np.ones((40, 8), "float32"), identity="a")
    original = np.save

    def failing_save(file, array, **kwargs):
        if str(file).endswith("ids.npy"):
            raise OSError("disk full")
        return original(file, array, **kwargs)

    np.save = failing_save
    try:
        with pytest.raises(OSError, match="disk full"):
            bigger.save(tmp_path / "index")
    finally:
        np.save = original
    assert len(EmbeddingIndex.load(tmp_path / "index")) == 30
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index"]
    manifest = tmp_path / "index" / "index.json"
    manifest.write_text(manifest.read_text()[:40])
    with pytest.raises(ValueError, match="not valid JSON"):
        EmbeddingIndex.load(tmp_path / "index")


@independent
def test_rows_ids_and_saved_files_are_checked(tmp_path):
    """What the index stores is its own; ids of one kind, never booleans; an int8 range
    from at least two rows; ties after rescoring in the order rows were added; zero vectors
    and constant dimensions give finite scores; a saved index is refused when any file or
    the manifest's record of it does not match, or the manifest names a file of its own."""
    import hashlib
    import json
    import warnings

    corpus, queries = _data(rows=40, dim=8)
    given = corpus.copy()
    index = EmbeddingIndex.from_embeddings(given, similarity="dot")
    rescoring = EmbeddingIndex.from_embeddings(
        given, precision="int8", similarity="dot", rescore_vectors="float32"
    )
    before = [i.search(queries, top_k=5) for i in (index, rescoring)]
    given[:] = 0.0  # the caller reuses its buffer
    for i, (scores, _) in zip((index, rescoring), before):
        np.testing.assert_array_equal(i.search(queries, top_k=5)[0], scores)

    strings = EmbeddingIndex.from_embeddings(corpus[:2], ids=["a", "b"])
    with pytest.raises(ValueError, match="string ids: pass `ids`"):
        strings.add(corpus[2:3])
    with pytest.raises(ValueError, match="This index has string ids. Received int ids"):
        strings.add(corpus[2:3], ids=[7])
    with pytest.raises(ValueError, match=r"all ints or all strings. Received types \['bool'\]"):
        EmbeddingIndex.from_embeddings(corpus[:2], ids=[True, False])
    with pytest.raises(ValueError, match="at least 2 rows"):
        EmbeddingIndex.from_embeddings(corpus[:1], precision="int8")

    # Ties after rescoring keep the order of addition: rows alternate a vector and 0.9 of it
    # (the same bits, so the candidates come in row order), rescored by their floats.
    alternating = np.stack([corpus[0] * (1.0 if i % 2 == 0 else 0.9) for i in range(40)])
    tied = EmbeddingIndex.from_embeddings(
        alternating, precision="binary", similarity="dot", rescore_vectors="float32"
    )
    _, ids = tied.search(corpus[:1], top_k=20, rescore_multiplier=2)
    assert ids[0].tolist() == list(range(0, 40, 2))

    # Shards (not unit vectors) give a cosine int8 index the ranges of the normalised rows,
    # as the same rows added at once do.
    from kbert.models.process_inference import write_shards

    rows = {str(i): (3.0 * corpus[i]).tolist() for i in range(40)}
    write_shards(list(rows), tmp_path / "shards", 16, {}, lambda t: [rows[x] for x in t])
    from_shards = EmbeddingIndex.from_shards(tmp_path / "shards", precision="int8")
    at_once = EmbeddingIndex.from_embeddings(3.0 * corpus, precision="int8")
    np.testing.assert_allclose(from_shards.ranges, at_once.ranges, rtol=1e-6)
    named = EmbeddingIndex.from_shards(tmp_path / "shards", ids=[f"d{i}" for i in range(40)])
    assert named.search(corpus[20:21], top_k=1)[1].tolist() == [["d20"]]  # third shard
    manifest = tmp_path / "shards" / "embeddings.json"
    recorded = json.loads(manifest.read_text())
    recorded["shape"][0] = 41
    manifest.write_text(json.dumps(recorded))
    with pytest.raises(ValueError, match="hold 40 rows; its embeddings.json says 41"):
        EmbeddingIndex.from_shards(tmp_path / "shards")

    # Bits are `x > 0`, as sentence-transformers' "ubinary": a zero is a 0 bit.
    binary = EmbeddingIndex.from_embeddings(np.array([[0.0, 1.0, -1.0, 0.0]]), precision="binary")
    np.testing.assert_array_equal(binary._vectors(), [[0b01000000]])

    # A zero vector (cosine) and a constant dimension (int8): finite scores, no warning.
    flat = corpus.copy()
    flat[:, 3] = 0.5
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        zero = EmbeddingIndex.from_embeddings(np.concatenate([corpus, 0 * corpus[:1]]))
        scores, _ = zero.search(np.zeros((1, 8), "float32"), top_k=3)
        np.testing.assert_array_equal(scores, 0.0)
        constant = EmbeddingIndex.from_embeddings(flat, precision="int8", similarity="dot")
        assert (constant._vectors()[:, 3] == -128).all()
        scores, ids = constant.search(queries, top_k=5)
    expected = retrieval.search(queries, flat, top_k=5, similarity="dot")[1]
    assert np.isfinite(scores).all() and (ids[:, 0] == expected[:, 0]).mean() >= 0.9

    saved = tmp_path / "saved"
    EmbeddingIndex.from_embeddings(
        corpus, precision="int8", rescore_vectors="float32", identity="a"
    ).save(saved)
    manifest_path = saved / "index.json"
    original = manifest_path.read_text()

    def edited(change):
        manifest = json.loads(original)
        change(manifest)
        manifest_path.write_text(json.dumps(manifest))

    vectors = saved / "vectors.npy"
    good = vectors.read_bytes()
    vectors.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))  # same size, one bit changed
    with pytest.raises(ValueError, match="vectors.npy is truncated or corrupt"):
        EmbeddingIndex.load(saved)
    vectors.write_bytes(good)
    edited(lambda m: m.update(version=2))
    with pytest.raises(ValueError, match="format version 2"):
        EmbeddingIndex.load(saved)
    edited(lambda m: m.update(rows=41))
    with pytest.raises(ValueError, match="40 vectors and 40 ids; index.json says 41 rows"):
        EmbeddingIndex.load(saved)
    (tmp_path / "elsewhere.npy").write_bytes(good)
    edited(lambda m: m["files"]["vectors"].update(name="../elsewhere.npy"))
    with pytest.raises(ValueError, match="lacks its vectors file '../elsewhere.npy'"):
        EmbeddingIndex.load(saved)
    # float64 rescore vectors with a manifest that records them: refused by dtype.
    rescore = saved / "rescore.npy"
    np.save(rescore, np.load(rescore).astype("float64"))
    data = rescore.read_bytes()
    record = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    edited(lambda m: m["files"]["rescore"].update(record))
    with pytest.raises(
        ValueError, match="holds float64 vectors of shape \\(40, 8\\); expected float32"
    ):
        EmbeddingIndex.load(saved)


@independent
def test_reciprocal_rank_fusion_direct_formula():
    dense = np.array([[3, 1, 2, 7], [0, 1, 2, 3]])
    sparse = np.array([[1, 5, 3, 8], [4, 0, 9, 1]])
    scores, ids = retrieval.reciprocal_rank_fusion([dense, sparse], k=10, top_k=4)
    for q in range(2):
        fused = {}
        for ranking in (dense[q], sparse[q]):
            for rank, doc in enumerate(ranking, 1):
                fused[doc] = fused.get(doc, 0) + 1 / (10 + rank)
        best = sorted(fused.items(), key=lambda item: -item[1])[:4]
        np.testing.assert_array_equal(ids[q], [doc for doc, _ in best])
        np.testing.assert_allclose(scores[q], [score for _, score in best])
    with pytest.raises(ValueError, match="at most the longest ranking's length"):
        retrieval.reciprocal_rank_fusion([dense], top_k=5)


class _Stub:
    """A stand-in encoder / reranker for the retrieval plumbing (the models are tested
    elsewhere): queries and documents embed as fixed vectors; the reranker scores pairs by
    word overlap."""

    def __init__(self, vectors):
        self.vectors = vectors

    def encode_query(self, texts):
        import scipy.sparse

        return scipy.sparse.csr_matrix(np.stack([self.vectors[t] for t in texts]))

    def predict(self, pairs, batch_size=32):
        return [len(set(q.split()) & set(d.split())) + 0.01 * len(d) for q, d in pairs]


@independent
def test_hybrid_retrieve_then_rerank_equals_its_stages():
    """Sparse + dense candidates fused by reciprocal rank, then reranked: equal to running
    `sparse_search`, `EmbeddingIndex.search`, `reciprocal_rank_fusion` and the reranker's
    scores by hand."""
    pytest.importorskip("scipy")
    rng = np.random.default_rng(3)
    documents = {f"d{i}": " ".join(rng.choice(list("abcdefgh"), 4)) for i in range(40)}
    doc_ids = list(documents)
    queries = ["a b c", "d e f"]
    dense_corpus = rng.normal(size=(40, 6)).astype("float32")
    sparse_corpus = np.maximum(rng.normal(size=(40, 12)), 0).astype("float32")
    dense = _Stub({q: rng.normal(size=6).astype("float32") for q in queries})
    dense.encode_query = lambda texts: np.stack([dense.vectors[t] for t in texts])
    sparse = _Stub({q: np.maximum(rng.normal(size=12), 0) for q in queries})
    index = EmbeddingIndex.from_embeddings(dense_corpus, ids=doc_ids)
    import scipy.sparse

    sparse_matrix = scipy.sparse.csr_matrix(sparse_corpus)
    # The index records no embedder identity: the stub embedder is not checked.
    scores, ids = retrieval.retrieve_then_rerank(
        queries,
        documents,
        sparse,
        index=index,
        embedder=dense,
        sparse_encoder=sparse,
        sparse_corpus=sparse_matrix,
        sparse_ids=doc_ids,
        candidates=8,
        top_k=5,
        fusion_k=5,
    )
    dense_ids = index.search(dense.encode_query(queries), top_k=8)[1]
    sparse_rows = retrieval.sparse_search(sparse.encode_query(queries), sparse_matrix, top_k=8)[1]
    fused = retrieval.reciprocal_rank_fusion(
        [dense_ids, np.array(doc_ids)[sparse_rows]], k=5, top_k=8
    )[1]
    for q, query in enumerate(queries):
        pair_scores = np.array(sparse.predict([(query, documents[d]) for d in fused[q]]))
        order = np.argsort(-pair_scores, kind="stable")[:5]
        np.testing.assert_array_equal(ids[q], fused[q][order])
        np.testing.assert_allclose(scores[q], pair_scores[order], rtol=1e-6)
    with pytest.raises(ValueError, match="needs both `index` and `embedder`"):
        retrieval.retrieve_then_rerank(queries, documents, sparse, index=index)
    with pytest.raises(ValueError, match=r"at most `candidates` \(8\)"):
        retrieval.retrieve_then_rerank(
            queries,
            documents,
            sparse,
            sparse_encoder=sparse,
            sparse_corpus=sparse_matrix,
            candidates=8,
            top_k=9,
        )


# ---------------------------------------------------------------- with Keras models
@pytest.fixture(scope="module")
def tiny_models():
    from kbert.models import BertCrossEncoder, BertTextEmbedder
    from tests.models.test_classifier import toy_backbone, toy_preprocessor

    embedder = BertTextEmbedder(toy_backbone(), normalize=True, preprocessor=toy_preprocessor())
    other = BertTextEmbedder(toy_backbone(), normalize=True, preprocessor=toy_preprocessor())
    reranker = BertCrossEncoder(toy_backbone(), preprocessor=toy_preprocessor())
    return embedder, other, reranker


TEXTS = [
    "the cat sat",
    "a dog ran",
    "the film was good",
    "who wrote it",
    "a bad plot",
    "the dog sat",
    "it was good",
]


def test_shards_identity_and_retrieve_then_rerank(tiny_models, tmp_path):
    """An index straight from `encode(output_dir=...)` shards equals one from `encode`'s
    array; it refuses another embedder's queries (same config, other weights) at search and
    load; retrieve-then-rerank equals search followed by the cross-encoder's `predict`."""
    embedder, other, reranker = tiny_models
    assert retrieval.embedder_fingerprint(embedder) == retrieval.embedder_fingerprint(embedder)
    assert retrieval.embedder_fingerprint(embedder) != retrieval.embedder_fingerprint(other)
    embedder.encode_document(TEXTS, output_dir=tmp_path / "shards", shard_rows=4)
    from_shards = EmbeddingIndex.from_shards(tmp_path / "shards", embedder=embedder)
    from_array = EmbeddingIndex.from_embeddings(embedder.encode_document(TEXTS), embedder=embedder)
    queries = embedder.encode_query(["the cat", "good film"])
    np.testing.assert_array_equal(
        from_shards.search(queries, top_k=4)[1], from_array.search(queries, top_k=4)[1]
    )
    np.testing.assert_allclose(
        from_shards.search(queries, top_k=4)[0],
        from_array.search(queries, top_k=4)[0],
        rtol=1e-6,
    )
    with pytest.raises(ValueError, match="query embedder fingerprint .* is not the index's"):
        from_shards.search(["the cat"], top_k=2, embedder=other)
    from_shards.save(tmp_path / "index")
    with pytest.raises(ValueError, match="is not the index's"):
        EmbeddingIndex.load(tmp_path / "index", embedder=other)
    loaded = EmbeddingIndex.load(tmp_path / "index", embedder=embedder)

    scores, ids = retrieval.retrieve_then_rerank(
        ["the cat", "good film"],
        TEXTS,
        reranker,
        index=loaded,
        embedder=embedder,
        candidates=4,
        top_k=3,
    )
    candidates = loaded.search(["the cat", "good film"], top_k=4, embedder=embedder)[1]
    pairs = [(q, TEXTS[i]) for q, row in zip(["the cat", "good film"], candidates) for i in row]
    pair_scores = np.asarray(reranker.predict(pairs)).reshape(candidates.shape)
    order = np.argsort(-pair_scores, axis=1, kind="stable")[:, :3]
    np.testing.assert_array_equal(ids, np.take_along_axis(candidates, order, axis=1))
    np.testing.assert_allclose(
        scores, np.take_along_axis(pair_scores, order, axis=1), rtol=1e-5, atol=1e-6
    )
