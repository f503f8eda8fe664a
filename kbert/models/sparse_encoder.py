"""BertSparseEncoder: SPLADE sparse lexical vectors, as sentence-transformers' SparseEncoder.

A `BertSparseEncoder` runs the backbone and BERT's masked-LM head (tied to the token
embedding, with its own bias) at every real token, then `log(1 + relu(logits))` and a max
(or sum) over the tokens: one non-negative weight per vocabulary entry, most of them 0. On a
sentence-transformers SparseEncoder directory (`MLMTransformer` -> `SpladePooling`) `encode`
returns the vectors sentence-transformers' `encode` returns; it also starts from any BERT
checkpoint with a masked-LM head (a Hugging Face masked-LM or pretraining model,
Google BERT, a kbert `BertPretrainer` preset). It trains with `fit` on (query, document)
columns and `kbert.losses_sparse.SpladeLoss`.
"""

import keras
import numpy as np
from keras import ops

from kbert import processes
from kbert.data import batching
from kbert.layers import MaskedLMHead, SpladePooling
from kbert.layers.sparse import check_splade_settings
from kbert.models import process_inference
from kbert.models.input_checks import check_model_inputs
from kbert.models.pipeline import text_parts
from kbert.models.task import BertTask
from kbert.models.text_embedder import TextColumnBatches, TextEncoding, is_text_columns

SIMILARITY_FUNCTIONS = ("dot", "cosine")
# Rows sent through the model and into one sparse block at a time by `encode`: the dense
# `(rows, vocabulary_size)` output of a block is all that is ever held at once.
ENCODE_BLOCK_ROWS = 1024


def require_scipy():
    try:
        import scipy.sparse
    except ImportError:  # pragma: no cover - scipy comes with JAX and TensorFlow
        raise ImportError(
            "Sparse output needs SciPy (`pip install kbert[sparse]` or `pip install scipy`). "
            "Pass `convert_to_sparse=False` for dense NumPy arrays instead."
        ) from None
    return scipy.sparse


def check_max_active_dims(value):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(
            "`max_active_dims` must be a positive integer (the non-zero weights kept per "
            f"text) or None. Received: max_active_dims={value!r}"
        )
    return int(value)


def keep_top_dims(embeddings, max_active_dims):
    """A copy of `embeddings` `(rows, dim)` with all but each row's `max_active_dims` largest
    absolute values set to 0 (sentence-transformers' `select_max_active_dims`)."""
    embeddings = np.asarray(embeddings)
    if max_active_dims is None or max_active_dims >= embeddings.shape[-1]:
        return embeddings.copy()
    keep = np.argpartition(-np.abs(embeddings), max_active_dims - 1, axis=-1)
    keep = keep[..., :max_active_dims]
    out = np.zeros_like(embeddings)
    np.put_along_axis(out, keep, np.take_along_axis(embeddings, keep, axis=-1), axis=-1)
    return out


def _rows(embeddings):
    """`(dense rows or CSR matrix, was one vector)` of sparse or dense embeddings."""
    if hasattr(embeddings, "tocsr"):
        matrix = embeddings.tocsr()
        return matrix, False
    if hasattr(embeddings, "numpy") and not isinstance(embeddings, np.ndarray):
        embeddings = embeddings.numpy()
    array = np.asarray(embeddings)
    if array.ndim not in (1, 2) or array.dtype.kind not in "fiu":
        raise ValueError(
            "Expected sparse embeddings: a SciPy sparse matrix or a NumPy array (rows, "
            f"vocabulary_size) or (vocabulary_size,). Received shape {array.shape} and dtype "
            f"{array.dtype}"
        )
    return (array[None, :], True) if array.ndim == 1 else (array, False)


def active_dimensions(embeddings):
    """Non-zero weights of each row of sparse embeddings (what `encode` returns).

    Args:
        embeddings: SciPy sparse matrix or NumPy array `(rows, vocabulary_size)`, or one
            vector `(vocabulary_size,)`.

    Returns:
        int64 NumPy array `(rows,)`.

    Example:
    >>> active_dimensions(np.array([[0.0, 1.5, 0.2], [0.0, 0.0, 0.0]]))
    array([2, 0])
    """
    rows, _ = _rows(embeddings)
    if hasattr(rows, "indptr"):  # stored entries that are not 0, without touching `rows`
        return np.asarray((rows != 0).sum(axis=1)).ravel().astype(np.int64)
    return np.count_nonzero(rows, axis=-1).astype(np.int64)


@keras.saving.register_keras_serializable(package="kbert")
class BertSparseEncoder(TextEncoding, BertTask):
    """SPLADE sparse encoder: backbone -> masked-LM logits per token -> log1p(relu) -> max.

    The model maps the backbone's input dict to one float32 weight per vocabulary entry and
    row, `(batch, vocabulary_size)`: `max_t log(1 + relu(logits[t]))` over the real tokens
    `t` (padding excluded). `encode` takes raw strings and returns a SciPy CSR matrix;
    `decode` names the weighted tokens; `kbert.retrieval.sparse_search` searches with the
    vectors; `fit` trains on (query, document[, negative...]) string columns with
    `kbert.losses_sparse.SpladeLoss`.

    **Checkpoints.** `from_preset` reads a sentence-transformers SparseEncoder directory
    (`modules.json` with `MLMTransformer` -> `SpladePooling`: its pooling strategy and
    activation, `max_seq_length`, `do_lower_case`, `prompts`, `default_prompt_name`,
    `similarity_fn_name`, `max_active_dims`; see `kbert.checkpoints.sparse_encoder`), and
    any checkpoint with BERT's masked-LM head: a Hugging Face masked-LM or pretraining
    directory, an original Google BERT checkpoint, a kbert preset of a
    `BertPretrainer` or of a `BertSparseEncoder`. A checkpoint without the head is an error
    (`fresh_heads=True` starts from a fresh head instead). `save_to_preset` keeps every
    setting; `kbert.checkpoints.export_to_sparse_encoder` writes a directory
    sentence-transformers' `SparseEncoder` loads.

    **Output format.** `encode` returns a `scipy.sparse.csr_matrix` of float32, shape
    `(len(texts), vocabulary_size)`: row `i` is text `i`, column `v` the weight of
    vocabulary entry `v` (`tokenizer.id_to_token(v)`); only non-zero weights are stored
    (`matrix.indptr` / `indices` / `data`; `active_dimensions` counts them per row).
    `convert_to_sparse=False` returns the dense NumPy array instead.

    **Batching.** As `kbert.models.BertTextEmbedder`: texts are tokenized in Python, packed
    with the preprocessor's `kbert.text.BertPacker` and run through the task pipeline's
    length-ordered `predict` (`kbert.models.pipeline`), each batch padded only to the
    smallest bucket holding its longest row; at most 1,024 dense rows are held at a time
    before they become sparse.

    Args:
        backbone: `kbert.models.BertBackbone`.
        pooling_strategy: `"max"` (SPLADE v2 and later) or `"sum"`. Defaults to `"max"`.
        activation: `"relu"` or `"log1p_relu"` (`log1p` applied twice, OpenSearch's
            models). Defaults to `"relu"`.
        max_active_dims: int or `None`. Keep only the largest `max_active_dims` weights of
            each vector in `encode` (the training output is never cut). Defaults to `None`.
        preprocessor: `kbert.text.BertPreprocessor` or `None`. Its tokenizer and
            `sequence_length` (the maximum tokens per text, `[CLS]`/`[SEP]` included) serve
            `encode`. Defaults to `None`.
        prompts: dict of name -> text prepended by `encode(prompt_name=...)`,
            `encode_query` (`"query"`) and `encode_document` (`"document"`, `"passage"`,
            `"corpus"`). Defaults to `None` (no prompts).
        default_prompt_name: str or `None`. The prompt `encode` applies when given none.
            Defaults to `None`.
        similarity_function: `"dot"` or `"cosine"`. What `similarity` computes. Defaults to
            `"dot"`.
        lowercase_input: bool. Lower-case texts before tokenization (sentence-transformers'
            `do_lower_case`). Defaults to `False`.

    Example:
    >>> tokenizer = kbert.text.BertTokenizer(
    ...     ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "man", "eats", "food", "."])
    >>> backbone = kbert.models.BertBackbone(vocabulary_size=10, num_layers=1, num_heads=2,
    ...                                      hidden_dim=16, intermediate_dim=32)
    >>> kbert.models.BertPretrainer(backbone).save_to_preset("my_mlm", tokenizer=tokenizer)
    >>> encoder = BertSparseEncoder.from_preset("my_mlm", max_active_dims=4)
    >>> vectors = encoder.encode(["A man eats food.", "A man eats."])
    >>> vectors.shape, int(vectors.getnnz(axis=1).max()) <= 4
    ((2, 10), True)
    >>> words = encoder.decode(vectors, top_k=2)[0]  # [(token, weight), ...], largest first
    >>> len(words), words[0][1] >= words[1][1]
    (2, True)

    Reference: Formal et al., 2021, "SPLADE v2" (arXiv 2109.10086).
    """

    def __init__(
        self,
        backbone,
        pooling_strategy="max",
        activation="relu",
        max_active_dims=None,
        preprocessor=None,
        prompts=None,
        default_prompt_name=None,
        similarity_function="dot",
        lowercase_input=False,
        **kwargs,
    ):
        self._check_backbone(backbone, "BertSparseEncoder")
        check_splade_settings(pooling_strategy, activation)
        max_active_dims = check_max_active_dims(max_active_dims)
        prompts = self.check_text_settings(prompts, default_prompt_name, similarity_function)
        # The [CLS] pooler plays no part in the vectors: frozen, it gets no (missing)
        # gradient in `fit` and no optimizer slots.
        backbone.pooler.trainable = False

        # === Layers ===
        masked_lm_head = MaskedLMHead(
            backbone.token_embedding,
            activation=backbone.activation,
            layer_norm_epsilon=backbone.layer_norm_epsilon,
            dtype=backbone.dtype_policy,
            name="mlm_head",
        )
        splade_pooling = SpladePooling(
            pooling_strategy, activation, dtype=backbone.dtype_policy, name="splade_pooling"
        )

        # === Functional model ===
        inputs = dict(backbone.input)
        sequence = backbone(inputs)["sequence_output"]  # (batch, seq, hidden)
        logits = masked_lm_head(sequence)  # (batch, seq, vocabulary)
        weights = splade_pooling(logits, inputs["padding_mask"])  # (batch, vocabulary)
        super().__init__(
            inputs=inputs,
            outputs=weights,
            backbone=backbone,
            preprocessor=preprocessor,
            **kwargs,
        )
        self.masked_lm_head = masked_lm_head
        self.splade_pooling = splade_pooling

        # === Config ===
        self.pooling_strategy = pooling_strategy
        self.activation = activation
        self.max_active_dims = max_active_dims
        self.prompts = prompts
        self.default_prompt_name = default_prompt_name
        self.similarity_function = similarity_function
        self.lowercase_input = bool(lowercase_input)
        self.embedding_dim = backbone.vocabulary_size

        # === Default compile ===
        self.compile()

    # Name of the output in an exported SavedModel (see `kbert.export`).
    export_output_name = "embeddings"

    # ----------------------------------------------------------------- calling
    def call(self, inputs, training=None, mask=None):
        """`(batch, vocabulary_size)` for inputs `(batch, seq)`; `(batch, columns,
        vocabulary_size)` for `(batch, columns, seq)` (a query and its documents, in `fit`;
        see `TextEncoding.call_columns`)."""
        return self.call_columns(super().call, inputs, training, mask)

    def _lean_head_layers(self):
        return (self.masked_lm_head, self.splade_pooling)

    def _lean_head(self, calls, inputs, training):
        """The graph's computation on eager torch (`kbert.backend.lean_task_outputs`)."""
        sequence = calls.backbone(self, inputs, training)["sequence_output"]
        logits = calls.masked_lm(self.masked_lm_head, sequence)  # (batch, seq, vocabulary)
        return calls.weightless(self.splade_pooling, logits, inputs["padding_mask"])

    def compute_output_spec(self, inputs, training=None, mask=None):
        shape = inputs["token_ids"].shape
        if len(shape) == 3:
            return keras.KerasTensor((shape[0], shape[1], self.embedding_dim), "float32")
        return keras.KerasTensor((shape[0], self.embedding_dim), "float32")

    # --------------------------------------------------------------- compiling
    def _default_loss(self):
        from kbert.losses_sparse import SpladeLoss

        return SpladeLoss()

    def _default_metrics(self):
        from kbert.losses_sparse import ActiveDimensions

        return [
            ActiveDimensions(columns="query", name="query_active_dims"),
            ActiveDimensions(columns="document", name="document_active_dims"),
        ]

    # ---------------------------------------------------------------- encoding
    def encode(
        self,
        texts,
        batch_size=32,
        convert_to_sparse=True,
        max_active_dims=None,
        prompt=None,
        prompt_name=None,
        verbose=False,
    ):
        """Sparse vectors of raw strings, in the order given.

        Equal to sentence-transformers' `SparseEncoder.encode(texts, batch_size, prompt,
        prompt_name, max_active_dims)` on the same checkpoint: the prompt is prepended to
        each text, the model pools the masked-LM logits, and each vector keeps its
        `max_active_dims` largest weights when that is set.

        Args:
            texts: str or list / NumPy array of str.
            batch_size: int. Rows per forward pass. Defaults to `32`.
            convert_to_sparse: bool. Return a `scipy.sparse.csr_matrix` `(len(texts),
                vocabulary_size)` (one string: a `(1, vocabulary_size)` matrix); `False`
                returns a dense float32 NumPy array (one string: a vector). Defaults to
                `True`.
            max_active_dims: int or `None`. Non-zero weights kept per vector. Defaults to
                the model's `max_active_dims` (`None`: all).
            prompt: str or `None`. Text prepended to every input (overrides `prompt_name`).
            prompt_name: str or `None`. A key of the model's `prompts`.
            verbose: bool. Show a progress bar. Defaults to `False`.

        Returns:
            float32 `scipy.sparse.csr_matrix` (see "Output format" in the class docstring)
            or NumPy array.
        """
        single, texts = encode_texts(texts, convert_to_sparse)
        if (
            not isinstance(batch_size, (int, np.integer))
            or isinstance(batch_size, bool)
            or batch_size < 1
        ):
            raise ValueError(f"`batch_size` must be a positive integer. Received: {batch_size!r}")
        max_active_dims = check_max_active_dims(
            self.max_active_dims if max_active_dims is None else max_active_dims
        )
        sparse = require_scipy() if convert_to_sparse else None
        prompt = self.resolve_prompt(prompt, prompt_name)
        x = self.pack_token_ids(
            self.tokenize_texts(texts, prompt), self.preprocessor.sequence_length
        )
        check_model_inputs(x, self.backbone)  # once, whole
        # Blocks of rows of similar length (longest first), so each block's batches are
        # padded as little as a whole-input length sort would pad them. Over several
        # processes (`kbert.models.process_inference`) the rows of each block are dealt in
        # turn (the rows of `row_share`); each block's rows are gathered whole on every
        # process before the next, so no process holds more than one dense block.
        order = np.argsort(-batching.row_lengths(x["padding_mask"]), kind="stable")
        sharing = process_inference.sharing_processes() and len(order) >= processes.process_count()
        index, count = (processes.process_index(), processes.process_count()) if sharing else (0, 1)
        show = 1 if verbose and processes.is_writer() else 0

        def run(rows):
            if len(rows) == 0:
                return np.zeros((0, self.embedding_dim), np.float32)
            part = {k: v[rows] for k, v in x.items()}
            block = process_inference.compute_here(
                self, lambda model: model._predict_by_length(part, int(batch_size), verbose=show)
            )
            block = np.asarray(block, np.float32)
            return keep_top_dims(block, max_active_dims) if max_active_dims is not None else block

        blocks = []
        for start in range(0, len(order), ENCODE_BLOCK_ROWS):
            rows = order[start : start + ENCODE_BLOCK_ROWS]
            mine = np.flatnonzero((start + np.arange(len(rows))) % count == index)
            block = run(rows[mine])
            if sharing:
                block = process_inference.gather_rows(block, mine, len(rows), "encode")
            blocks.append(sparse.csr_matrix(block) if sparse is not None else block)
        return rows_in_caller_order(blocks, order, sparse, single)

    def decode(self, embeddings, top_k=None):
        """The weighted tokens of sparse vectors, largest weight first.

        As sentence-transformers' `SparseEncoder.decode`: a list of `(token, weight)` per
        row, over its non-zero weights (at most `top_k` of them).

        Args:
            embeddings: what `encode` returns (SciPy sparse matrix or NumPy array), or one
                row / vector of it.
            top_k: int or `None`. Tokens kept per row. Defaults to `None` (all non-zero).

        Returns:
            A list of `(str, float)` for one vector (a 1-D array), else a list of such lists,
            one per row (a one-row matrix included).
        """
        if top_k is not None and (
            isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1
        ):
            raise ValueError(f"`top_k` must be a positive integer or None. Received: {top_k!r}")
        tokenizer, _ = self._require_tokenizer()
        rows, one = _rows(embeddings)
        if rows.shape[-1] != self.embedding_dim:
            raise ValueError(
                f"Sparse vectors of this model have {self.embedding_dim} dimensions (its "
                f"vocabulary). Received shape {rows.shape}"
            )
        vocabulary = tokenizer.vocabulary
        results = []
        for i in range(rows.shape[0]):
            if hasattr(rows, "indptr"):
                start, end = rows.indptr[i], rows.indptr[i + 1]
                ids, values = rows.indices[start:end], rows.data[start:end]
            else:
                ids = np.flatnonzero(rows[i])
                values = rows[i][ids]
            keep = values != 0
            ids, values = ids[keep], values[keep]
            best = np.lexsort((ids, -values))[: top_k or len(ids)]
            results.append(
                [(vocabulary[int(t)], float(v)) for t, v in zip(ids[best], values[best])]
            )
        return results[0] if one else results

    def similarity(self, a, b):
        """Pairwise similarity `(len(a), len(b))` of two sets of sparse vectors (SciPy sparse
        or NumPy): dot product or cosine, as the model's `similarity_function`. Dense NumPy
        float32."""
        a, _ = _rows(a)
        b, _ = _rows(b)
        if a.shape[-1] != b.shape[-1]:
            raise ValueError(
                f"Vectors to compare must have the same size. Received {a.shape} and {b.shape}"
            )
        if self.similarity_function == "cosine":
            a, b = _l2_normalize_rows(a), _l2_normalize_rows(b)
        scores = a @ b.T
        scores = scores.toarray() if hasattr(scores, "toarray") else scores
        return np.asarray(scores, np.float32)

    @staticmethod
    def sparsity(embeddings):
        """`{"active_dims": mean non-zero weights per row, "sparsity_ratio": mean share of
        zero weights}` (sentence-transformers' `SparseEncoder.sparsity`)."""
        counts = active_dimensions(embeddings)
        rows, _ = _rows(embeddings)
        return {
            "active_dims": float(counts.mean()),
            "sparsity_ratio": float(1.0 - counts.mean() / rows.shape[-1]),
        }

    # ---------------------------------------------------------------- training
    def preprocess_samples(self, x, y=None, sample_weight=None, mode="fit", batch_size=None):
        """Text columns (`fit`, `evaluate`) -> batches of `batch_size` (32 when `None`)
        examples `(batch, columns, seq)`; anything else as `BertTask` takes it."""
        from kbert.backend.tensorflow import is_dataset
        from kbert.models.text_embedder import text_columns

        if mode != "predict" and not is_dataset(x) and is_text_columns(x):
            batches = TextColumnBatches(
                self, text_columns(x), y, sample_weight, batch_size or 32, shuffle=mode == "fit"
            )
            return batches, None, None
        return super().preprocess_samples(x, y, sample_weight, mode, batch_size)

    def fit(self, x=None, y=None, batch_size=None, epochs=1, sample_weight=None, **kwargs):
        """`BertTask.fit` that also takes text columns: `(queries, documents[, negatives
        ...])` as equally long lists of strings, a list of such tuples, or a dict of columns
        (queries first). Rows are shuffled each epoch; the other documents of a batch are
        each query's negatives (see `kbert.losses_sparse.SpladeLoss`)."""
        from kbert.backend.tensorflow import is_dataset

        if not is_dataset(x) and is_text_columns(x):
            kwargs.pop("shuffle", None)  # The batches draw a new random order every epoch.
        return super().fit(
            x, y, batch_size=batch_size, epochs=epochs, sample_weight=sample_weight, **kwargs
        )

    # ------------------------------------------------------------------ config
    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "pooling_strategy": self.pooling_strategy,
                "activation": self.activation,
                "max_active_dims": self.max_active_dims,
                "prompts": dict(self.prompts),
                "default_prompt_name": self.default_prompt_name,
                "similarity_function": self.similarity_function,
                "lowercase_input": self.lowercase_input,
            }
        )
        return config

    @classmethod
    def from_preset(cls, source, load_weights=True, preprocessor="auto", **kwargs):
        """Builds the sparse encoder from a preset name or a checkpoint directory.

        On a sentence-transformers SparseEncoder directory the pooling, `max_seq_length`
        (the preprocessor's `sequence_length`), `do_lower_case`, `prompts`,
        `default_prompt_name`, `similarity_fn_name` and `max_active_dims` come from its
        files. On other sources the masked-LM head comes from the checkpoint: a Hugging Face
        masked-LM / pretraining or Google BERT directory, a kbert preset
        saved from a `BertPretrainer` or a `BertSparseEncoder`. A source without that head
        is a ValueError unless `fresh_heads=True` (a fresh head, e.g. to train from a plain
        `BertModel`). Arguments given here override what the directory says.

        Args:
            source: str or path. A preset name, an `hf://<owner>/<name>[@revision]` handle
                (see `kbert.hub`) or a checkpoint directory.
            load_weights: bool. Defaults to `True`.
            preprocessor: `"auto"`, `None` or a preprocessor (see `BertTask.from_preset`).
            **kwargs: constructor arguments (`max_active_dims`, `prompts`, ...),
                `sequence_length` of the automatic preprocessor, `fresh_heads`, backbone
                overrides.
        """
        from pathlib import Path

        from kbert import hub
        from kbert.checkpoints import sparse_encoder
        from kbert.checkpoints.kbert_preset import is_kbert_preset, read_config

        if hub.is_hub_handle(source):  # Downloaded first: its module files are read below.
            source = hub.resolve_preset_source(source, load_weights=load_weights)
        path = Path(source) if isinstance(source, str) or hasattr(source, "__fspath__") else None
        if path is not None and sparse_encoder.is_sparse_encoder_dir(path):
            settings = sparse_encoder.read_settings(path)
            source = sparse_encoder.transformer_directory(path)
            sequence_length = settings.pop("max_seq_length", None)
            for key, value in settings.items():
                kwargs.setdefault(key, value)
            if sequence_length is not None:
                kwargs.setdefault("sequence_length", sequence_length)
        fresh_heads = kwargs.pop("fresh_heads", False)
        # A kbert preset of another task keeps only its backbone for other classes: the
        # head of a saved BertPretrainer is copied in below.
        other_preset = (
            path is not None
            and load_weights
            and not fresh_heads
            and is_kbert_preset(path)
            and read_config(path).get("class_name") != cls.__name__
        )
        try:
            model = super().from_preset(
                source,
                load_weights=load_weights,
                preprocessor=preprocessor,
                fresh_heads=True if other_preset else fresh_heads,
                **kwargs,
            )
        except ValueError as error:
            if fresh_heads is False and "missing head weights" in str(error):
                raise ValueError(
                    f"{source} has no masked-LM head, and a sparse encoder needs one (SPLADE "
                    "weighs the vocabulary with it). Expected a Hugging Face masked-LM or "
                    "pretraining checkpoint, a SparseEncoder directory or a kbert "
                    "BertPretrainer preset. Pass fresh_heads=True to start from a fresh head. "
                    f"({error})"
                ) from None
            raise
        if other_preset:
            cls._from_pretrainer_preset(path, model)
        return model

    @classmethod
    def _from_pretrainer_preset(cls, path, model):
        """Copies the masked-LM head of the `BertPretrainer` saved in the kbert preset `path`
        into `model` (built from the same preset's backbone)."""
        from kbert.checkpoints.kbert_preset import read_config
        from kbert.models.pretrainer import BertPretrainer

        saved = read_config(path).get("class_name")
        if saved != "BertPretrainer":
            raise ValueError(
                f"{path} holds a kbert {saved}, which has no masked-LM head, and a sparse "
                "encoder needs one (SPLADE weighs the vocabulary with it). Expected a kbert "
                "BertPretrainer or BertSparseEncoder preset, a Hugging Face masked-LM or "
                "pretraining checkpoint or a SparseEncoder directory. Pass "
                "fresh_heads=True to start from a fresh head."
            )
        pretrainer = BertPretrainer.from_preset(path)
        # A quantized pretrainer's head: quantize this head's layers as the record says
        # (the backbone's are quantized already), so that the variables correspond.
        head_layers = {layer.path for layer in model.masked_lm_head._flatten_layers()}
        record = [
            dict(entry, layers=[p for p in entry["layers"] if p in head_layers])
            for entry in pretrainer.quantization_record or []
        ]
        record = [entry for entry in record if entry["layers"]]
        if record:
            model.apply_quantization_record(record)
        # Copied by variable path, every one of them (the token embedding is tied).
        sources = {v.path: v for v in pretrainer.masked_lm_head.weights}
        targets = {v.path: v for v in model.masked_lm_head.weights}
        if sorted(sources) != sorted(targets) or any(
            tuple(sources[p].shape) != tuple(targets[p].shape) for p in targets
        ):
            raise ValueError(
                f"The masked-LM head of the BertPretrainer in {path} does not match this "
                f"sparse encoder's: variables {sorted(sources)} against {sorted(targets)}."
            )
        for name, target in targets.items():
            target.assign(ops.cast(sources[name], target.dtype))
        return model


def _l2_normalize_rows(x):
    if hasattr(x, "multiply"):
        norms = np.sqrt(np.asarray(x.multiply(x).sum(axis=1))).ravel()
        scale = 1.0 / np.maximum(norms, 1e-12)
        return x.multiply(scale[:, None]).tocsr()
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def encode_texts(texts, convert_to_sparse):
    """`(single, texts)`: the strings `encode` received (one string: `single`), checked, with
    `convert_to_sparse`; a ValueError names what was received. Shared with the served
    sparse encoder (`kbert.serving`)."""
    single = isinstance(texts, (str, bytes))
    if not single and not isinstance(texts, (list, tuple, np.ndarray)):
        raise ValueError(
            "`encode` takes a string or a list of strings. Received "
            f"{type(texts).__name__}: {texts!r:.80}"
        )
    if not single and len(texts) == 0:
        raise ValueError("`encode` received an empty list of texts. Expected at least one string.")
    parts = text_parts(texts)
    if len(parts) != 1:
        raise ValueError("`encode` takes a batch of strings, not sentence pairs.")
    if not isinstance(convert_to_sparse, bool):
        raise ValueError(
            f"`convert_to_sparse` must be True or False. Received: {convert_to_sparse!r}"
        )
    return single, parts[0]


def rows_in_caller_order(blocks, order, sparse, single):
    """The encoded `blocks` (rows in `order`, longest first) back in the caller's order: a
    `scipy.sparse` CSR matrix when `sparse` (the SciPy module) is given, else a dense array
    (one vector for a `single` string)."""
    inverse = np.argsort(order)
    if sparse is not None:
        return sparse.vstack(blocks, format="csr")[inverse]
    dense = np.concatenate(blocks, axis=0)[inverse]
    return dense[0] if single else dense
