"""A saved, growable embedding index: exact NumPy search by default, FAISS as an option.

`EmbeddingIndex` holds a corpus of embeddings (float32, int8 or binary), the user's ids of
its rows and the identity of the embedder that wrote them. It searches exactly with NumPy
(nothing to install) or, with `backend="faiss"` (`pip install "kbert[retrieval]"`), on a
FAISS flat or HNSW (approximate) index. Quantized indexes search in two stages, as
sentence-transformers' `semantic_search_faiss` / `semantic_search_usearch` do: the query,
quantized like the corpus, finds `top_k * rescore_multiplier` candidates (Hamming distance
for binary, integer dot product for int8); the float query then rescores them against the
candidates' stored values (bits 0/1, or int8 values mapped back to their ranges) and the
best `top_k` are kept. With `rescore_vectors="float32"` the index also keeps each row's float
vector for that second stage, on disk once saved (`load` maps the file, and a search reads the
candidates' rows only): the quantized codes stay the memory the search holds, and rescoring
orders the candidates as exact float search would.

`save(path)` writes a directory (`index.json`, the vectors as `.npy` or FAISS's own index
file, the ids as `.npy`) through a temporary sibling and renames, so a kill never leaves a
half-written index; `load(path)` checks each file's size and SHA-256 against `index.json`
before reading it and never unpickles (`allow_pickle=False`; FAISS reads its own format).

`embedder_fingerprint(embedder)` hashes an embedder's configuration and weights; an index
built with `embedder=` (or `identity=`) refuses queries from another one.
"""

import hashlib
import json
import math
from pathlib import Path

import numpy as np

# The manifest `BertTextEmbedder.encode(..., output_dir=...)` writes beside its shards
# (`kbert.models.process_inference.MANIFEST`; the name is repeated here so that the retrieval
# modules import nothing of `kbert.models`, which imports them; `from_shards`' example writes
# shards with the encoder's own writer and reads them back).
SHARDS_MANIFEST = "embeddings.json"

FORMAT_VERSION = 1
PRECISIONS = ("float32", "int8", "binary")
SIMILARITIES = ("cosine", "dot")
BACKENDS = ("numpy", "faiss")
APPROXIMATE = (None, "hnsw")
RESCORE_VECTORS = ("stored", "float32")
MANIFEST = "index.json"
_FILES = ("vectors.npy", "faiss.index", "ids.npy", "rescore.npy")


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
    return int(value)


def _float_matrix(x, name):
    if hasattr(x, "numpy") and not isinstance(x, np.ndarray):
        x = x.numpy()
    x = np.asarray(x)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2 or x.shape[0] == 0 or x.dtype.kind != "f":
        raise ValueError(
            f"`{name}` must be a non-empty (rows, dim) matrix of float embeddings. "
            f"Received shape {x.shape} and dtype {x.dtype}"
        )
    return x


def _import_faiss():
    try:
        import faiss
    except ImportError as error:
        raise ImportError(
            'backend="faiss" and approximate search need FAISS: pip install "kbert[retrieval]" '
            "(faiss-cpu)"
        ) from error
    return faiss


def embedder_fingerprint(embedder):
    """A SHA-256 hex digest of an embedder's configuration and weights.

    Two embedders with the same configuration (layer names aside) and the same weight values
    have the same fingerprint; any changed weight changes it. Hashing reads every weight once
    (about 0.1 s for a 22M-parameter model).

    Args:
        embedder: a Keras model, e.g. `kbert.models.BertTextEmbedder`.

    Returns:
        str: 64 hex digits.

    Example:
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    >>> fingerprint = embedder_fingerprint(model)
    >>> len(fingerprint), fingerprint == embedder_fingerprint(model)
    (64, True)
    """
    from keras import ops

    def without_names(value):
        if isinstance(value, dict):
            return {k: without_names(v) for k, v in value.items() if k != "name"}
        if isinstance(value, (list, tuple)):
            return [without_names(v) for v in value]
        return value

    digest = hashlib.sha256()
    config = without_names(embedder.get_config())
    digest.update(json.dumps(config, sort_keys=True, default=repr).encode())
    for weight in embedder.weights:
        value = np.ascontiguousarray(ops.convert_to_numpy(weight))
        digest.update(f"{value.dtype}{value.shape}".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()


def _identity(embedder, identity):
    if embedder is not None and identity is not None:
        raise ValueError("Pass `embedder` or `identity`, not both.")
    if embedder is not None:
        return embedder_fingerprint(embedder)
    if identity is not None and not isinstance(identity, str):
        raise ValueError(f"`identity` must be a string. Received: {identity!r}")
    return identity


def quantize(embeddings, precision, ranges=None):
    """Float embeddings quantized as sentence-transformers' `quantize_embeddings` does.

    Args:
        embeddings: float array `(rows, dim)`.
        precision: `"float32"`, `"int8"` (each dimension's `ranges` cut into 255 steps,
            `floor((x - min) / step)` clipped to [0, 255], minus 128) or `"binary"` (bits
            `x > 0` packed 8 per byte, as uint8: sentence-transformers' `"ubinary"`).
        ranges: float32 `(2, dim)`: each dimension's minimum and maximum (int8 only).

    Returns:
        NumPy array: float32 / int8 `(rows, dim)` or uint8 `(rows, ceil(dim / 8))`.

    Example:
    >>> quantize(np.array([[0.5, -1.0, 2.0]]), "binary")
    array([[160]], dtype=uint8)
    """
    embeddings = np.asarray(embeddings)
    if precision == "float32":
        return embeddings.astype(np.float32, copy=False)
    if precision == "binary":
        return np.packbits(embeddings > 0, axis=-1)
    if precision == "int8":
        starts, steps = _steps(ranges)
        values = np.clip(np.floor((embeddings - starts) / steps), 0, 255)
        return (values - 128).astype(np.int8)
    raise ValueError(f"`precision` must be one of {list(PRECISIONS)}. Received: {precision!r}")


def _steps(ranges):
    ranges = np.asarray(ranges, np.float32)
    steps = (ranges[1] - ranges[0]) / 255
    return ranges[0], np.where(steps == 0, 1, steps)


def _dequantize(values, ranges):
    """int8 values back in the float coordinates (float64), as sentence-transformers'
    rescoring maps its candidates."""
    starts, steps = _steps(ranges)
    return (values.astype(np.float64) + 128) * steps + starts


def _merge_top_k(best_scores, best_rows, scores, start, top_k):
    """Running top-k after a chunk of scores for rows `start, start + 1, ...`: by score
    descending, then row ascending."""
    rows = np.broadcast_to(np.arange(start, start + scores.shape[1]), scores.shape)
    if scores.shape[1] > top_k:
        # Keep each query's entries scoring at least its k-th best (ties included) before the
        # sort: a partition and a stable boolean sort instead of sorting the whole chunk.
        kth = -np.partition(-scores, top_k - 1, axis=1)[:, top_k - 1 : top_k]
        keep = scores >= kth
        width = int(keep.sum(axis=1).max())
        columns = np.argsort(~keep, axis=1, kind="stable")[:, :width]
        kept = np.take_along_axis(keep, columns, axis=1)
        scores = np.where(kept, np.take_along_axis(scores, columns, axis=1), -np.inf)
        rows = np.take_along_axis(rows, columns, axis=1)
    scores = np.concatenate([best_scores, scores], axis=1)
    rows = np.concatenate([best_rows, rows], axis=1)
    order = np.lexsort((rows, -scores), axis=1)[:, :top_k]
    return np.take_along_axis(scores, order, axis=1), np.take_along_axis(rows, order, axis=1)


class EmbeddingIndex:
    """A corpus of embeddings to search: built once, grown with `add`, saved and loaded.

    Rows are stored at `precision`: `"float32"` (4 bytes a dimension), `"int8"` (1 byte; each
    dimension's range is taken from the first rows added, or given as `ranges`) or
    `"binary"` (1 bit). With `similarity="cosine"` embeddings and queries are L2-normalised
    first (before any quantization); `"dot"` uses them as given.

    `backend="numpy"` (the default for flat indexes) scores every row exactly, in chunks;
    `backend="faiss"` keeps a FAISS index (`IndexFlatIP`, `IndexScalarQuantizer` with int8
    codes, `IndexBinaryFlat`, or with `approximate="hnsw"` their HNSW forms: `IndexHNSWFlat`,
    `IndexHNSWSQ`, `IndexBinaryHNSW`). Approximate search needs FAISS.

    Args:
        dim: int. Embedding dimension.
        precision: `"float32"`, `"int8"` or `"binary"`. Defaults to `"float32"`.
        similarity: `"cosine"` or `"dot"`. Defaults to `"cosine"`.
        backend: `"numpy"`, `"faiss"` or `None` (numpy, or faiss when `approximate`).
        approximate: `None` (exact) or `"hnsw"`. Defaults to `None`.
        hnsw_m: int. HNSW neighbours per node. Defaults to `32`.
        ef_construction: int. HNSW build beam width. Defaults to `200`.
        ef_search: int. HNSW search beam width (at least the candidates asked for is used).
            Defaults to `128`.
        ranges: optional float `(2, dim)` minimum and maximum per dimension (int8).
        rescore_vectors: what quantized candidates are rescored against: `"stored"` (their
            codes, as sentence-transformers does) or `"float32"` (each row's float vector,
            kept beside the codes: in memory while building, in `rescore.npy` once saved,
            memory-mapped by `load`). Defaults to `"stored"`.
        embedder: optional embedder whose `embedder_fingerprint` the index records.
        identity: optional string naming the embedder instead (e.g. a model name + version).

    Example:
    >>> rng = np.random.default_rng(0)
    >>> corpus = rng.normal(size=(100, 16)).astype("float32")
    >>> index = EmbeddingIndex.from_embeddings(corpus, ids=[f"doc{i}" for i in range(100)])
    >>> scores, ids = index.search(corpus[[7]], top_k=2)
    >>> print(ids[0, 0])
    doc7
    """

    def __init__(
        self,
        dim,
        precision="float32",
        similarity="cosine",
        backend=None,
        approximate=None,
        hnsw_m=32,
        ef_construction=200,
        ef_search=128,
        ranges=None,
        rescore_vectors="stored",
        embedder=None,
        identity=None,
    ):
        self.dim = _positive_int("dim", dim)
        if precision not in PRECISIONS:
            raise ValueError(
                f"`precision` must be one of {list(PRECISIONS)}. Received: {precision!r}"
            )
        if similarity not in SIMILARITIES:
            raise ValueError(
                f"`similarity` must be one of {list(SIMILARITIES)}. Received: {similarity!r}"
            )
        if approximate not in APPROXIMATE:
            raise ValueError(
                f"`approximate` must be one of {list(APPROXIMATE)}. Received: {approximate!r}"
            )
        if rescore_vectors not in RESCORE_VECTORS:
            raise ValueError(
                f"`rescore_vectors` must be one of {list(RESCORE_VECTORS)}. "
                f"Received: {rescore_vectors!r}"
            )
        if rescore_vectors == "float32" and precision == "float32":
            raise ValueError(
                'rescore_vectors="float32" keeps float vectors to rescore a quantized index\'s '
                'candidates. Received precision="float32", which searches the float vectors '
                'themselves; use precision="int8" or "binary".'
            )
        if backend is None:
            backend = "numpy" if approximate is None else "faiss"
        if backend not in BACKENDS:
            raise ValueError(f"`backend` must be one of {list(BACKENDS)}. Received: {backend!r}")
        if approximate is not None and backend != "faiss":
            raise ValueError(
                f"approximate={approximate!r} search runs on FAISS. Received backend={backend!r}; "
                'expected backend="faiss" (pip install "kbert[retrieval]")'
            )
        self.precision, self.similarity = precision, similarity
        self.backend, self.approximate = backend, approximate
        self.hnsw_m = _positive_int("hnsw_m", hnsw_m)
        self.ef_construction = _positive_int("ef_construction", ef_construction)
        self.ef_search = _positive_int("ef_search", ef_search)
        self.identity = _identity(embedder, identity)
        self.ranges = None
        if ranges is not None:
            self.ranges = self._check_ranges(ranges)
        self._ids = None  # NumPy array of the rows' ids (int64 or str)
        self.rescore_vectors = rescore_vectors
        self._chunks = []  # numpy backend: stored rows, concatenated lazily
        self._float_chunks = []  # rescore_vectors="float32": the rows' float vectors
        self._faiss = None
        if backend == "faiss":
            self._faiss = self._new_faiss_index()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_embeddings(cls, embeddings, ids=None, **kwargs):
        """An index holding `embeddings` (float, `(rows, dim)`) with their `ids`.

        Args:
            embeddings: float array or tensor `(rows, dim)`.
            ids: optional sequence of unique ints or strings, one per row. Defaults to the
                row numbers `0, 1, ...`.
            **kwargs: `EmbeddingIndex` arguments (precision, similarity, backend, ...).

        Returns:
            `EmbeddingIndex`.

        Example:
        >>> index = EmbeddingIndex.from_embeddings(np.eye(4, dtype="float32"), precision="binary")
        >>> len(index), index.nbytes
        (4, 4)
        """
        embeddings = _float_matrix(embeddings, "embeddings")
        index = cls(embeddings.shape[1], **kwargs)
        index.add(embeddings, ids)
        return index

    @classmethod
    def from_shards(cls, output_dir, ids=None, **kwargs):
        """An index of the embeddings `BertTextEmbedder.encode(texts, output_dir=...)` wrote.

        Shards are read one at a time (memory-mapped) and added in row order; an int8 index
        first takes each dimension's range over every shard.

        Args:
            output_dir: the directory holding `embeddings.json` and the float32 `.npy` shards.
            ids: optional ids, one per row of the whole corpus. Defaults to row numbers.
            **kwargs: `EmbeddingIndex` arguments.

        Returns:
            `EmbeddingIndex`.

        Example:
        >>> from kbert.models.process_inference import write_shards
        >>> vectors = {"a": [1.0, 0.0], "b": [0.0, 1.0], "c": [0.6, 0.8]}
        >>> _ = write_shards(list("abc"), "shards", 2, {}, lambda t: [vectors[x] for x in t])
        >>> index = EmbeddingIndex.from_shards("shards")  # or embedder.encode(..., output_dir=)
        >>> len(index), index.search(np.array([[0.0, 1.0]]), top_k=2)[1]
        (3, array([[1, 2]]))
        """
        output_dir = Path(output_dir)
        manifest_path = output_dir / SHARDS_MANIFEST
        if not manifest_path.is_file():
            raise ValueError(
                f"No {SHARDS_MANIFEST} in {str(output_dir)!r}: expected the directory of a "
                "finished `encode(..., output_dir=...)` run."
            )
        manifest = json.loads(manifest_path.read_text())
        shape, dtype = manifest["shape"], manifest["dtype"]
        if len(shape) != 2 or not dtype.startswith("float"):
            raise ValueError(
                f"{str(output_dir)!r} holds {dtype} embeddings of shape {shape}; expected float "
                "(rows, dim) shards (encode with precision='float32' and quantize in the index)."
            )
        if ids is not None and len(ids) != shape[0]:
            raise ValueError(
                f"`ids` must have one entry per row of {str(output_dir)!r} ({shape[0]}). "
                f"Received {len(ids)}"
            )
        paths = [output_dir / name for name in manifest["shards"]]
        if kwargs.get("precision") == "int8" and kwargs.get("ranges") is None:
            shards = [np.load(p, mmap_mode="r", allow_pickle=False) for p in paths]
            if kwargs.get("similarity", "cosine") == "cosine":
                shards = [_normalize(np.asarray(s)) for s in shards]
            kwargs["ranges"] = np.stack(
                [np.min([s.min(0) for s in shards], 0), np.max([s.max(0) for s in shards], 0)]
            )
        index = cls(shape[1], **kwargs)
        start = 0
        for path in paths:
            shard = np.load(path, mmap_mode="r", allow_pickle=False)
            rows = None if ids is None else ids[start : start + len(shard)]
            index.add(np.asarray(shard), rows)
            start += len(shard)
        if start != shape[0]:
            raise ValueError(
                f"The shards of {str(output_dir)!r} hold {start} rows; its {SHARDS_MANIFEST} "
                f"says {shape[0]}."
            )
        return index

    # ------------------------------------------------------------------ storage
    def __len__(self):
        return 0 if self._ids is None else len(self._ids)

    @property
    def ids(self):
        """The ids of the rows, in the order they were added (a NumPy array)."""
        return np.array([], np.int64) if self._ids is None else self._ids

    @property
    def nbytes(self):
        """Bytes of the stored vectors (FAISS: its codes; HNSW graphs not included); the float
        vectors of `rescore_vectors="float32"` are not counted (see `rescore_nbytes`)."""
        per_row = {"float32": 4 * self.dim, "int8": self.dim, "binary": math.ceil(self.dim / 8)}
        return len(self) * per_row[self.precision]

    @property
    def rescore_nbytes(self):
        """Bytes of the float vectors kept for rescoring (`rescore_vectors="float32"`; on disk
        once saved and loaded), else 0."""
        return 4 * self.dim * len(self) if self.rescore_vectors == "float32" else 0

    def _check_ranges(self, ranges):
        ranges = np.asarray(ranges, np.float32)
        if ranges.shape != (2, self.dim) or not np.all(np.isfinite(ranges)):
            raise ValueError(
                f"`ranges` must be finite (2, dim) = (2, {self.dim}) minima and maxima. "
                f"Received shape {ranges.shape}"
            )
        return ranges

    def _new_faiss_index(self):
        faiss = _import_faiss()
        ip = faiss.METRIC_INNER_PRODUCT
        if self.precision == "binary":
            bits = 8 * math.ceil(self.dim / 8)
            if self.approximate == "hnsw":
                index = faiss.IndexBinaryHNSW(bits, self.hnsw_m)
            else:
                return faiss.IndexBinaryFlat(bits)
        elif self.precision == "int8":
            qtype = faiss.ScalarQuantizer.QT_8bit_direct_signed
            if self.approximate == "hnsw":
                index = faiss.IndexHNSWSQ(self.dim, qtype, self.hnsw_m, ip)
            else:
                return faiss.IndexScalarQuantizer(self.dim, qtype, ip)
        elif self.approximate == "hnsw":
            index = faiss.IndexHNSWFlat(self.dim, self.hnsw_m, ip)
        else:
            return faiss.IndexFlatIP(self.dim)
        index.hnsw.efConstruction = self.ef_construction
        index.hnsw.efSearch = self.ef_search
        return index

    def _prepare(self, embeddings, name):
        """Float rows as stored: normalised (cosine) and quantized."""
        embeddings = _float_matrix(embeddings, name)
        if embeddings.shape[1] != self.dim:
            raise ValueError(
                f"`{name}` have dimension {embeddings.shape[1]}; this index holds "
                f"{self.dim}-dimensional embeddings."
            )
        embeddings = embeddings.astype(np.float32, copy=False)
        if self.similarity == "cosine":
            embeddings = _normalize(embeddings)
        return embeddings

    def _check_ids(self, ids, count):
        if ids is None:
            start = len(self)
            if self._ids is not None and self._ids.dtype.kind != "i":
                raise ValueError(
                    "This index has string ids: pass `ids` for the new rows. Received ids=None"
                )
            return np.arange(start, start + count, dtype=np.int64)
        if isinstance(ids, (str, bytes)) or len(ids) != count:
            received = repr(ids) if isinstance(ids, (str, bytes)) else f"{len(ids)} ids"
            raise ValueError(
                f"`ids` must have one entry per embedding ({count}). Received {received}"
            )
        values = list(ids)
        if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
            array = np.asarray(values, np.int64)
        elif all(isinstance(v, str) for v in values):
            array = np.asarray(values, str)
        else:
            raise ValueError(
                f"`ids` must be all ints or all strings. Received types "
                f"{sorted({type(v).__name__ for v in values})}"
            )
        if self._ids is not None and array.dtype.kind != self._ids.dtype.kind:
            raise ValueError(
                f"This index has {'int' if self._ids.dtype.kind == 'i' else 'string'} ids. "
                f"Received {'int' if array.dtype.kind == 'i' else 'string'} ids"
            )
        known = array if self._ids is None else np.concatenate([self._ids, array])
        unique, counts = np.unique(known, return_counts=True)
        if (counts > 1).any():
            raise ValueError(
                f"`ids` must be unique. Received {unique[counts > 1][0].item()!r} twice"
            )
        return array

    def add(self, embeddings, ids=None):
        """Adds float embeddings (and their ids) to the index, without rebuilding it.

        Args:
            embeddings: float array or tensor `(rows, dim)`.
            ids: optional unique ints or strings, one per row (not already in the index).
                Defaults to the next row numbers.

        Returns:
            The index itself.

        Example:
        >>> index = EmbeddingIndex(dim=2)
        >>> len(index.add(np.array([[1.0, 0.0]])).add(np.array([[0.0, 1.0]]), ids=[9]))
        2
        """
        given = embeddings
        embeddings = self._prepare(embeddings, "embeddings")
        ids = self._check_ids(ids, len(embeddings))
        if self.precision == "int8" and self.ranges is None:
            if len(embeddings) < 2:
                raise ValueError(
                    "An int8 index takes each dimension's range from the first embeddings added "
                    f"and needs at least 2 rows (or `ranges`). Received {len(embeddings)}"
                )
            self.ranges = np.stack([embeddings.min(0), embeddings.max(0)]).astype(np.float32)
        codes = quantize(embeddings, self.precision, self.ranges)
        if self.rescore_vectors == "float32":
            shared = isinstance(given, np.ndarray) and np.may_share_memory(embeddings, given)
            self._float_chunks.append(embeddings.copy() if shared else embeddings)
        if self._faiss is not None:
            self._faiss.add(codes.astype(np.float32) if self.precision == "int8" else codes)
        else:  # a copy of its own, never a view of the caller's array or a memory-mapped shard
            own = isinstance(given, np.ndarray) and np.may_share_memory(codes, given)
            self._chunks.append(codes.copy() if own else codes)
        self._ids = ids if self._ids is None else np.concatenate([self._ids, ids])
        return self

    def _vectors(self):
        if len(self._chunks) > 1:
            self._chunks = [np.concatenate(self._chunks)]
        return self._chunks[0]

    def _float_vectors(self):
        if len(self._float_chunks) > 1:
            self._float_chunks = [np.concatenate(self._float_chunks)]
        return self._float_chunks[0]

    def _rescore_values(self, rows):
        """`(queries, candidates, dim)` values the float query rescores the candidates with."""
        if self.rescore_vectors == "float32":
            vectors = self._float_vectors()
            flat = rows.reshape(-1)
            unique, inverse = np.unique(flat, return_inverse=True)  # sorted reads of a mapping
            return np.asarray(vectors[unique])[inverse].reshape(*rows.shape, self.dim)
        candidates = self._rows(rows)
        if self.precision == "binary":
            return np.unpackbits(candidates, axis=-1)[..., : self.dim].astype(np.int64)
        return _dequantize(candidates, self.ranges)

    def _rows(self, rows):
        """Stored codes of the given rows `(..., width)`."""
        if self._faiss is None:
            return self._vectors()[rows]
        flat = rows.reshape(-1)
        if self.precision == "binary":  # FAISS's binary indexes reconstruct one row at a time
            codes = np.stack([self._faiss.reconstruct(int(row)) for row in flat])
        else:
            codes = self._faiss.reconstruct_batch(flat)
        if self.precision == "int8":
            codes = np.rint(codes).astype(np.int8)
        return codes.reshape(*rows.shape, -1)

    # ------------------------------------------------------------------ search
    def check_embedder(self, embedder=None, identity=None):
        """Raises `ValueError` unless `embedder` (or `identity`) is the index's embedder.

        An index built without `embedder=` or `identity=` records no identity and accepts
        any embedder.

        Args:
            embedder: a model whose `embedder_fingerprint` is compared.
            identity: a string compared instead.

        Example:
        >>> index = EmbeddingIndex(dim=2, identity="minilm-v1")
        >>> index.check_embedder(identity="minilm-v1")
        """
        if self.identity is None:
            return  # built without `embedder=` / `identity=`: nothing to compare
        given = _identity(embedder, identity)
        if given is None:
            return
        if given != self.identity:
            what = "embedder fingerprint" if embedder is not None else "identity"
            raise ValueError(
                f"The query {what} {given!r} is not the index's: the index was built by "
                f"{self.identity!r}. Encode queries with the embedder that wrote the index."
            )

    def search(
        self,
        queries,
        top_k=10,
        rescore=True,
        rescore_multiplier=2,
        embedder=None,
        identity=None,
        chunk_size=65536,
    ):
        """The `top_k` best rows for each query: `(scores, ids)`, best first.

        Float32 indexes score by inner product (cosine after normalisation). Quantized
        indexes first find `top_k * rescore_multiplier` candidates with the quantized query
        (`rescore=True`) or `top_k` (`rescore=False`), as sentence-transformers'
        `semantic_search_faiss` / `semantic_search_usearch`: binary by Hamming distance, int8
        by integer dot product; with `rescore` the float query's dot product with each
        candidate's stored values (bits as 0/1; int8 mapped back into its range) orders them,
        or with its float vector when the index keeps them (`rescore_vectors="float32"`).

        Args:
            queries: float array or tensor `(num_queries, dim)` (or `(dim,)`), or a list of
                strings with `embedder` (encoded by `embedder.encode_query`).
            top_k: int. Results per query; at most the number of rows.
            rescore: bool. Rescore quantized candidates with the float query. Defaults to
                `True`.
            rescore_multiplier: int. Candidates per result when rescoring. Defaults to `2`.
            embedder: optional query embedder: checked against the index's identity, and
                used to encode string queries.
            identity: optional string checked against the index's identity instead.
            chunk_size: int. Rows scored at once by the NumPy backend. Defaults to 65,536.

        Returns:
            `(scores, ids)`: float arrays and the rows' ids, `(num_queries, top_k)`. Scores
            are inner products (float32 index, or after rescoring), integer dot products
            (int8 without rescoring) or negated Hamming distances (binary without
            rescoring). Ties go to the row added first (NumPy backend).

        Example:
        >>> index = EmbeddingIndex.from_embeddings(np.eye(3, dtype="float32"), ids=[10, 20, 30])
        >>> index.search(np.array([[0.1, 0.9, 0.0]]), top_k=2)[1]
        array([[20, 10]])
        """
        self.check_embedder(embedder, identity)
        if isinstance(queries, str) or (
            isinstance(queries, (list, tuple)) and queries and isinstance(queries[0], str)
        ):
            if embedder is None:
                raise ValueError(
                    "String queries need `embedder` to encode them. Received queries "
                    f"{queries[:1]!r}... and embedder=None"
                )
            queries = embedder.encode_query(queries)
        queries = self._prepare(queries, "queries")
        top_k = _positive_int("top_k", top_k)
        rescore_multiplier = _positive_int("rescore_multiplier", rescore_multiplier)
        chunk_size = _positive_int("chunk_size", chunk_size)
        if not len(self):
            raise ValueError("The index is empty: add embeddings before searching.")
        if top_k > len(self):
            raise ValueError(
                f"`top_k` must be at most the number of indexed rows ({len(self)}). "
                f"Received top_k={top_k}"
            )
        rescoring = rescore and self.precision != "float32"
        count = min(top_k * rescore_multiplier, len(self)) if rescoring else top_k
        codes = quantize(queries, self.precision, self.ranges)
        if self._faiss is not None:
            scores, rows = self._faiss_search(codes, count)
        else:
            scores, rows = self._numpy_search(codes, count, chunk_size)
        if rescoring:
            values = self._rescore_values(rows)
            rescored = np.einsum("ij,ikj->ik", queries, values).astype(np.float64, copy=False)
            order = np.argsort(-rescored, axis=1, kind="stable")[:, :top_k]
            scores = np.take_along_axis(rescored, order, axis=1)
            rows = np.take_along_axis(rows, order, axis=1)
        return scores, self._ids[rows]

    def _faiss_search(self, codes, count):
        if self.approximate == "hnsw":
            self._faiss.hnsw.efSearch = max(self.ef_search, count)
        if self.precision == "int8":
            codes = codes.astype(np.float32)
        distances, rows = self._faiss.search(codes, count)
        if (rows < 0).any():
            raise ValueError(
                f"FAISS returned fewer than {count} results for a query (approximate search "
                "found too few rows): raise `ef_search` or lower `top_k`."
            )
        if self.precision == "binary":
            return -distances.astype(np.float32), rows
        return distances, rows

    def _numpy_search(self, codes, count, chunk_size):
        vectors = self._vectors()
        if self.precision == "binary":
            # Hamming distance through a +-1 dot product (exact in float32): d = (bits - dot) / 2.
            bits = 8 * vectors.shape[1]
            queries = np.unpackbits(codes, axis=-1).astype(np.float32) * 2 - 1
        elif self.precision == "int8":
            queries = codes.astype(np.float64)  # exact integer sums
        else:
            queries = codes
        best_scores = np.full((len(codes), 0), -np.inf, np.float64)
        best_rows = np.zeros((len(codes), 0), np.int64)
        for start in range(0, len(vectors), chunk_size):
            chunk = vectors[start : start + chunk_size]
            if self.precision == "binary":
                signs = np.unpackbits(chunk, axis=-1).astype(np.float32) * 2 - 1
                scores = -((bits - queries @ signs.T) / 2)
            elif self.precision == "int8":
                scores = queries @ chunk.astype(np.float64).T
            else:
                scores = queries @ chunk.T
            best_scores, best_rows = _merge_top_k(best_scores, best_rows, scores, start, count)
        return best_scores.astype(np.float32 if self.precision != "int8" else np.float64), best_rows

    # ------------------------------------------------------------------ save / load
    def _settings(self):
        return {
            "dim": self.dim,
            "precision": self.precision,
            "similarity": self.similarity,
            "backend": self.backend,
            "approximate": self.approximate,
            "hnsw_m": self.hnsw_m,
            "ef_construction": self.ef_construction,
            "ef_search": self.ef_search,
            "rescore_vectors": self.rescore_vectors,
        }

    def save(self, path):
        """Writes the index to the directory `path`, atomically.

        The directory is written beside `path` and renamed into place: an interrupted save
        leaves the previous index (or none), never a mix. `index.json` records the settings,
        the embedder identity, the int8 ranges and each file's size and SHA-256.

        Args:
            path: str or path of the directory.

        Example:
        >>> index = EmbeddingIndex.from_embeddings(np.eye(3), ids=["x", "y", "z"])
        >>> index.save("my_index")
        >>> sorted(p.name for p in Path("my_index").iterdir())
        ['ids.npy', 'index.json', 'vectors.npy']
        """
        from kbert.checkpoints.atomic import atomic_directory

        if not len(self):
            raise ValueError("The index is empty: there is nothing to save.")
        with atomic_directory(path, owned_files=(MANIFEST, *_FILES)) as staging:
            files = {}
            if self._faiss is not None:
                faiss = _import_faiss()
                writer = faiss.write_index_binary if self.precision == "binary" else None
                (writer or faiss.write_index)(self._faiss, str(staging / "faiss.index"))
                files["vectors"] = "faiss.index"
            else:
                np.save(staging / "vectors.npy", self._vectors(), allow_pickle=False)
                files["vectors"] = "vectors.npy"
            np.save(staging / "ids.npy", self._ids, allow_pickle=False)
            files["ids"] = "ids.npy"
            if self.rescore_vectors == "float32":
                np.save(staging / "rescore.npy", self._float_vectors(), allow_pickle=False)
                files["rescore"] = "rescore.npy"
            manifest = {
                "format": "kbert.retrieval.EmbeddingIndex",
                "version": FORMAT_VERSION,
                **self._settings(),
                "rows": len(self),
                "identity": self.identity,
                "ranges": None if self.ranges is None else self.ranges.tolist(),
                "files": {
                    role: {"name": name, **_file_record(staging / name)}
                    for role, name in files.items()
                },
            }
            (staging / MANIFEST).write_text(json.dumps(manifest, indent=1))

    @classmethod
    def load(cls, path, embedder=None, identity=None):
        """Reads an index `save` wrote, checking every file first.

        Args:
            path: str or path of the directory.
            embedder: optional embedder that must be the one the index records.
            identity: optional string that must be the index's identity.

        Returns:
            `EmbeddingIndex`.

        Example:
        >>> EmbeddingIndex.from_embeddings(np.eye(3), identity="toy").save("my_index")
        >>> EmbeddingIndex.load("my_index", identity="toy").search(np.eye(3)[2:], top_k=1)[1]
        array([[2]])
        """
        from kbert.checkpoints.atomic import recover

        path = recover(Path(path).absolute())
        manifest_path = path / MANIFEST
        if not manifest_path.is_file():
            raise ValueError(f"No {MANIFEST} in {str(path)!r}: not a saved EmbeddingIndex.")
        try:
            manifest = json.loads(manifest_path.read_text())
        except (ValueError, UnicodeDecodeError) as error:
            raise ValueError(f"{manifest_path} is not valid JSON ({error}).") from error
        if manifest.get("format") != "kbert.retrieval.EmbeddingIndex":
            raise ValueError(f"{manifest_path} does not describe a kbert EmbeddingIndex.")
        if manifest.get("version") != FORMAT_VERSION:
            raise ValueError(
                f"{manifest_path} has format version {manifest.get('version')!r}; this kbert "
                f"reads version {FORMAT_VERSION}."
            )
        for role, record in manifest["files"].items():
            file = path / record["name"]
            if record["name"] not in _FILES or not file.is_file():
                raise ValueError(f"{str(path)!r} lacks its {role} file {record['name']!r}.")
            found = _file_record(file)
            if found != {"bytes": record["bytes"], "sha256": record["sha256"]}:
                raise ValueError(
                    f"{file} is truncated or corrupt: {found['bytes']} bytes with SHA-256 "
                    f"{found['sha256'][:12]}..., expected {record['bytes']} bytes with "
                    f"{record['sha256'][:12]}... as {MANIFEST} records."
                )
        settings = {k: manifest[k] for k in cls(1)._settings() if k in manifest}
        index = cls(**settings, identity=manifest["identity"], ranges=manifest["ranges"])
        ids = np.load(path / manifest["files"]["ids"]["name"], allow_pickle=False)
        vectors_file = path / manifest["files"]["vectors"]["name"]
        if index.backend == "faiss":
            faiss = _import_faiss()
            reader = faiss.read_index_binary if index.precision == "binary" else faiss.read_index
            index._faiss = reader(str(vectors_file))
            if index.approximate == "hnsw":
                index._faiss.hnsw.efSearch = index.ef_search
            stored = index._faiss.ntotal
        else:
            vectors = np.load(vectors_file, allow_pickle=False)
            index._chunks = [vectors]
            stored = len(vectors)
        if index.rescore_vectors == "float32":
            record = manifest["files"].get("rescore")
            if record is None:
                raise ValueError(
                    f"{str(path)!r} keeps float vectors for rescoring ({MANIFEST}) but lists "
                    "no rescore file."
                )
            floats = np.load(path / record["name"], mmap_mode="r", allow_pickle=False)
            if floats.shape != (len(ids), index.dim) or floats.dtype != np.float32:
                raise ValueError(
                    f"{path / record['name']} holds {floats.dtype} vectors of shape "
                    f"{floats.shape}; expected float32 ({len(ids)}, {index.dim})."
                )
            index._float_chunks = [floats]
        if stored != len(ids) or len(ids) != manifest["rows"]:
            raise ValueError(
                f"{str(path)!r} holds {stored} vectors and {len(ids)} ids; {MANIFEST} says "
                f"{manifest['rows']} rows."
            )
        index._ids = ids
        index.check_embedder(embedder, identity)
        return index


def _normalize(x):
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return (x / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)


def _file_record(path):
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 22), b""):
            digest.update(block)
    return {"bytes": Path(path).stat().st_size, "sha256": digest.hexdigest()}
