"""BertTextEmbedder: sentence embeddings (pooling + normalisation), as sentence-transformers.

A `BertTextEmbedder` is the backbone's `sequence_output` pooled over the real (unpadded)
positions - `mean`, `cls`, `max` or `mean_sqrt_len` - and optionally L2-normalised. On a
sentence-transformers directory (`modules.json`: Transformer, Pooling, Normalize) its
`encode` returns the embeddings sentence-transformers' `encode` returns. It trains with
`fit` on raw string pairs/triples and the contrastive losses of `kbert.losses`.
"""

import keras
import numpy as np
from keras import ops

from kbert import processes
from kbert.backend.tensorflow import is_dataset
from kbert.data import batching
from kbert.layers.heads import EmbeddingPooling, canonical_pooling
from kbert.models import process_inference
from kbert.models.backbone import BACKBONE_INPUTS
from kbert.models.input_checks import check_model_inputs
from kbert.models.pipeline import text_parts
from kbert.models.task import BertTask

SIMILARITY_FUNCTIONS = ("cosine", "dot")
PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")


def quantize_embeddings(embeddings, precision):
    """Quantises float embeddings as sentence-transformers' `quantize_embeddings` does.

    `int8`/`uint8`: each dimension's range `[min, max]` over the given embeddings is cut
    into 255 steps (`floor((x - min) / step)`, clipped to [0, 255]; `int8` subtracts 128);
    `binary`/`ubinary`: bits `x > 0` packed 8 per byte (`binary` subtracts 128 as int8).

    Args:
        embeddings: float array `(num_rows, dim)`.
        precision: `"float32"`, `"int8"`, `"uint8"`, `"binary"` or `"ubinary"`.

    Returns:
        NumPy array: float32 / int8 / uint8 `(num_rows, dim)`, or int8 / uint8
        `(num_rows, ceil(dim / 8))` for the binary precisions.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"Unknown `precision` {precision!r}. Expected one of {list(PRECISIONS)}")
    embeddings = np.asarray(embeddings)
    if embeddings.dtype.kind != "f":
        raise ValueError(
            f"Embeddings to quantise must be floats. Received dtype {embeddings.dtype}"
        )
    if precision == "float32":
        return embeddings.astype(np.float32)
    if precision in ("int8", "uint8"):
        if embeddings.ndim != 2 or embeddings.shape[0] < 2:
            raise ValueError(
                f"{precision} quantisation takes each dimension's range from the embeddings "
                f"themselves and needs at least 2 rows. Received shape {embeddings.shape}"
            )
        starts = embeddings.min(axis=0).astype(np.float32)
        steps = (embeddings.max(axis=0).astype(np.float32) - starts) / 255
        steps = np.where(steps == 0, 1, steps)
        values = np.clip(np.floor((embeddings - starts) / steps), 0, 255)
        return (values - 128).astype(np.int8) if precision == "int8" else values.astype(np.uint8)
    bits = np.packbits(embeddings > 0, axis=-1)
    return (bits - 128).astype(np.int8) if precision == "binary" else bits


def _l2_normalize(x):
    norm = np.sqrt(np.sum(np.square(x, dtype=np.float64), axis=-1, keepdims=True))
    return (x / np.maximum(norm, 1e-12)).astype(np.float32)


class TextEncoding:
    """Text handling of the encoders (`BertTextEmbedder`, `BertSparseEncoder`): the same
    tokenization (prompt, casing, truncation), packing and prompt choice of `encode_query` /
    `encode_document`. The class has `preprocessor`, `prompts`, `default_prompt_name`,
    `lowercase_input`, `bucket_lengths` and `encode(texts, prompt=, prompt_name=, ...)`."""

    @staticmethod
    def check_text_settings(prompts, default_prompt_name, similarity_function):
        """Checks an encoder's prompts, default prompt name and similarity function; returns
        the prompts as a new dict."""
        prompts = dict(prompts or {})
        bad = {k: v for k, v in prompts.items() if not (isinstance(k, str) and isinstance(v, str))}
        if bad:
            raise ValueError(f"`prompts` must map names (str) to texts (str). Received: {bad!r}")
        if default_prompt_name is not None and default_prompt_name not in prompts:
            raise ValueError(
                f"`default_prompt_name` {default_prompt_name!r} is not among the prompts "
                f"{sorted(prompts)}"
            )
        if similarity_function not in SIMILARITY_FUNCTIONS:
            raise ValueError(
                f"`similarity_function` must be one of {list(SIMILARITY_FUNCTIONS)}. "
                f"Received: {similarity_function!r}"
            )
        return prompts

    def _require_tokenizer(self):
        if self.preprocessor is None:
            raise ValueError(
                f"{type(self).__name__} needs a preprocessor (a kbert.text.BertPreprocessor) "
                "to take raw strings. Build it with `from_preset` on a source that has a "
                "vocabulary, or pass `preprocessor=`."
            )
        return self.preprocessor.tokenizer, self.preprocessor.sequence_length

    def resolve_prompt(self, prompt=None, prompt_name=None):
        """The text `encode` prepends: `prompt`, else `prompts[prompt_name]`, else the default
        prompt (`default_prompt_name`), else `""`."""
        if prompt is not None:
            if not isinstance(prompt, str):
                raise ValueError(f"`prompt` must be a string. Received: {prompt!r}")
            return prompt
        if prompt_name is not None:
            if prompt_name not in self.prompts:
                raise ValueError(
                    f"Unknown prompt name {prompt_name!r}. This model's prompts are "
                    f"{sorted(self.prompts)}"
                )
            return self.prompts[prompt_name]
        if self.default_prompt_name is not None:
            return self.prompts[self.default_prompt_name]
        return ""

    def tokenize_texts(self, texts, prompt=""):
        """Token ids of each text (prompt prepended, lower-cased if `lowercase_input`),
        cut to `sequence_length - 2` so that `[CLS]` and `[SEP]` fit. A list of lists."""
        tokenizer, sequence_length = self._require_tokenizer()
        if prompt:
            texts = [prompt + text for text in texts]
        if self.lowercase_input:
            texts = [text.lower() for text in texts]
        budget = sequence_length - 2
        return [ids[:budget] for ids in tokenizer.tokenize(texts)]

    def pack_token_ids(self, rows, length=None, training=False):
        """Packs lists of token ids (from `tokenize_texts`) with the preprocessor's
        `kbert.text.BertPacker` into `token_ids`, `segment_ids`, `padding_mask` int32 arrays
        `(len(rows), length)`; `length` defaults to the smallest bucket (see
        `bucket_lengths`; `training=True`: `fit`'s buckets) that holds the longest row with
        `[CLS]` and `[SEP]`."""
        _, sequence_length = self._require_tokenizer()
        if length is None:
            longest = max(len(ids) for ids in rows) + 2
            buckets = self.bucket_lengths(sequence_length, training=training)
            length = int(batching.bucket_for([longest], buckets)[0])
        return self.preprocessor.packer(list(rows), sequence_length=int(length))

    def call_columns(self, call, inputs, training=None, mask=None):
        """The model's output for inputs `(batch, seq)`, by `call` (the functional model's
        call); for `(batch, columns, seq)` (a query and its documents in `fit`) each column's
        output, stacked: `(batch, columns, embedding_dim)`.

        The columns of a batch share one padded length (that of its longest text, often a
        passage). Eager torch runs each column on its own, cut to that column's longest row,
        so short queries are not computed at a passage's length; JAX and TensorFlow (and
        torch with `jit_compile=True`), which compile per shape, run all columns at once.
        """
        token_ids = inputs["token_ids"] if isinstance(inputs, dict) else None
        if token_ids is None or len(token_ids.shape) != 3:
            return call(inputs, training=training, mask=mask)
        columns, length = token_ids.shape[1], token_ids.shape[2]
        if not batching.compiles_per_shape(self):
            outputs = []
            for column in range(columns):
                part = {k: inputs[k][:, column] for k in BACKBONE_INPUTS}
                real = ops.convert_to_numpy(part["padding_mask"])
                cut = int(batching.row_lengths(real).max()) or length
                part = {k: v[:, :cut] for k, v in part.items()}
                outputs.append(call(part, training=training))
            return ops.stack(outputs, axis=1)
        flat = {k: ops.reshape(inputs[k], (-1, length)) for k in BACKBONE_INPUTS}
        out = call(flat, training=training)  # (batch * columns, embedding_dim)
        return ops.reshape(out, (-1, columns, self.embedding_dim))

    def encode_query(self, texts, prompt=None, prompt_name=None, **kwargs):
        """`encode` for search queries, as sentence-transformers' `encode_query`.

        Without `prompt` or `prompt_name` it applies the model's `"query"` prompt, and `""`
        when the model has none: never the default prompt (sentence-transformers' models
        always hold a `"query"` prompt, empty unless the checkpoint sets it). Other arguments
        as `encode`.
        """
        if prompt is None and prompt_name is None:
            prompt = self.prompts.get("query", "")
        return self.encode(texts, prompt=prompt, prompt_name=prompt_name, **kwargs)

    def encode_document(self, texts, prompt=None, prompt_name=None, **kwargs):
        """`encode` for the documents searched, as sentence-transformers' `encode_document`.

        Without `prompt` or `prompt_name` it applies the first of the `"document"`,
        `"passage"` and `"corpus"` prompts that exists, where, as in every
        sentence-transformers model, a `"document"` prompt always exists (empty unless the
        checkpoint sets one): a model with only a `"passage"` prompt encodes documents
        without it, as sentence-transformers does (pass `prompt_name="passage"` to use it).
        Never the default prompt. Other arguments as `encode`.
        """
        if prompt is None and prompt_name is None:
            prompts = {"document": "", **self.prompts}
            name = next(n for n in ("document", "passage", "corpus") if n in prompts)
            prompt = prompts[name]
        return self.encode(texts, prompt=prompt, prompt_name=prompt_name, **kwargs)


@keras.saving.register_keras_serializable(package="kbert")
class BertTextEmbedder(TextEncoding, BertTask):
    """BERT sentence embeddings: backbone -> pooling over real tokens -> optional L2 norm.

    The model maps the backbone's input dict to one float32 vector per row. `encode` takes
    raw strings and returns NumPy embeddings; `similarity` compares two sets of them; `fit`
    trains on raw string columns (pairs, triples or a dict of columns) with a contrastive
    loss (see `kbert.losses`).

    **Checkpoints.** `from_preset` on a sentence-transformers directory reads its pooling
    (`1_Pooling/config.json`), `Normalize` module, `max_seq_length`, `do_lower_case`,
    `prompts`, `default_prompt_name` and `similarity_fn_name` (see
    `kbert.checkpoints.sentence_transformers`); on any other source kbert reads (a kbert
    preset saved from another task, Hugging Face, Google or keras-hub BERT) it uses mean
    pooling without normalisation unless `pooling` / `normalize` say otherwise.
    `save_to_preset` keeps all of these settings; `kbert.checkpoints.
    export_to_sentence_transformers` writes a directory sentence-transformers loads.

    **Batching.** `encode` (and `predict` on strings) tokenizes in Python, packs with the
    preprocessor's `kbert.text.BertPacker`, and runs the task pipeline's length-ordered
    `predict` (`kbert.models.pipeline`): each batch padded only to the smallest bucket length
    that holds its longest row, rows returned in the caller's order.

    **Training.** The default `compile()` uses BERT's recipe (AdamW, 10 % warm-up, linear
    decay) with `kbert.losses.MultipleNegativesRankingLoss` (scale 20). For scored pairs
    compile with `kbert.losses.CoSENTLoss()`. During `fit` the model returns `(batch,
    columns, dim)`: one embedding per text column.

    Args:
        backbone: `kbert.models.BertBackbone`.
        pooling: str or list of str. `"mean"`, `"cls"`, `"max"`, `"mean_sqrt_len"` (or a list,
            concatenated). Defaults to `"mean"`.
        normalize: bool. L2-normalise the pooled vector inside the model (a
            sentence-transformers `Normalize` module). Defaults to `False`.
        preprocessor: `kbert.text.BertPreprocessor` or `None`. Its tokenizer and
            `sequence_length` (the maximum tokens per text, `[CLS]`/`[SEP]` included) serve
            `encode`. Defaults to `None`.
        prompts: dict of name -> text prepended to every input by `encode(prompt_name=...)`.
            Defaults to `None` (no prompts).
        default_prompt_name: str or `None`. The prompt `encode` applies when given none.
            Defaults to `None`.
        similarity_function: `"cosine"` or `"dot"`. What `similarity` computes. Defaults to
            `"cosine"`.
        truncate_dim: int or `None`. Default `truncate_dim` of `encode` (Matryoshka models).
            Defaults to `None`.
        lowercase_input: bool. Lower-case texts before tokenization (sentence-transformers'
            `do_lower_case`). Defaults to `False`.

    Example:
    >>> tokenizer = kbert.text.BertTokenizer(
    ...     ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "man", "eats", "food", "."])
    >>> backbone = kbert.models.BertBackbone(vocabulary_size=10, num_layers=1, num_heads=2,
    ...                                      hidden_dim=16, intermediate_dim=32)
    >>> backbone.save_to_preset("my_embedder", tokenizer=tokenizer)
    >>> embedder = BertTextEmbedder.from_preset("my_embedder")
    >>> vectors = embedder.encode(["A man eats food.", "A man eats.", "A man eats food."])
    >>> vectors.shape
    (3, 16)
    >>> similarity = embedder.similarity(vectors[:1], vectors[1:])  # cosine
    >>> similarity.shape, round(float(similarity[0, 1]), 4)  # the same text: 1
    ((1, 2), 1.0)

    Reference: Reimers and Gurevych, 2019, "Sentence-BERT" (arXiv 1908.10084).
    """

    def __init__(
        self,
        backbone,
        pooling="mean",
        normalize=False,
        preprocessor=None,
        prompts=None,
        default_prompt_name=None,
        similarity_function="cosine",
        truncate_dim=None,
        lowercase_input=False,
        **kwargs,
    ):
        self._check_backbone(backbone, "BertTextEmbedder")
        pooling = list(canonical_pooling(pooling))
        if not isinstance(normalize, bool):
            raise ValueError(
                f"`normalize` must be True or False. Received: normalize={normalize!r}"
            )
        prompts = self.check_text_settings(prompts, default_prompt_name, similarity_function)
        dimension = backbone.hidden_dim * len(pooling)
        if truncate_dim is not None:
            _check_truncate_dim(truncate_dim, dimension)

        # The [CLS] pooler plays no part in the embedding: frozen, it gets no (missing)
        # gradient in `fit` and no optimizer slots.
        backbone.pooler.trainable = False

        # === Layers ===
        pooler = EmbeddingPooling(
            pooling, normalize=normalize, dtype=backbone.dtype_policy, name="embedding_pooling"
        )

        # === Functional model ===
        inputs = dict(backbone.input)
        # [CLS] pooling alone reads one row: the last block computes only that row.
        first_token_only = pooling == ["cls"]
        # (batch, seq, hidden); (batch, 1, hidden) with first_token_only
        sequence = backbone(inputs, first_token_only=first_token_only)["sequence_output"]
        embeddings = pooler(sequence, inputs["padding_mask"])  # (batch, dim)
        super().__init__(
            inputs=inputs,
            outputs=embeddings,
            backbone=backbone,
            preprocessor=preprocessor,
            **kwargs,
        )
        self.pooler = pooler
        self._first_token_only = first_token_only

        # === Config ===
        self.pooling = pooling
        self.normalize = normalize
        self.prompts = prompts
        self.default_prompt_name = default_prompt_name
        self.similarity_function = similarity_function
        self.truncate_dim = truncate_dim
        self.lowercase_input = bool(lowercase_input)
        self.embedding_dim = dimension

        # === Default compile ===
        self.compile()

    # Name of the output in an exported SavedModel (see `kbert.export`).
    export_output_name = "embeddings"

    # ----------------------------------------------------------------- calling
    def call(self, inputs, training=None, mask=None):
        """`(batch, dim)` for inputs `(batch, seq)`; `(batch, columns, dim)` for
        `(batch, columns, seq)` (several texts per example, as in contrastive training; see
        `TextEncoding.call_columns`)."""
        return self.call_columns(super().call, inputs, training, mask)

    def _lean_head_layers(self):
        return (self.pooler,)

    def _lean_head(self, calls, inputs, training):
        """The graph's computation on eager torch (`kbert.backend.lean_task_outputs`)."""
        features = calls.backbone(self, inputs, training, first_token_only=self._first_token_only)
        return calls.weightless(self.pooler, features["sequence_output"], inputs["padding_mask"])

    def compute_output_spec(self, inputs, training=None, mask=None):
        shape = inputs["token_ids"].shape
        if len(shape) == 3:
            return keras.KerasTensor((shape[0], shape[1], self.embedding_dim), "float32")
        return keras.KerasTensor((shape[0], self.embedding_dim), "float32")

    # --------------------------------------------------------------- compiling
    def _default_loss(self):
        from kbert.losses import MultipleNegativesRankingLoss

        return MultipleNegativesRankingLoss()

    # ---------------------------------------------------------------- encoding
    def encode(
        self,
        texts,
        batch_size=32,
        normalize=None,
        truncate_dim=None,
        prompt=None,
        prompt_name=None,
        precision="float32",
        verbose=False,
        output_dir=None,
        shard_rows=process_inference.DEFAULT_SHARD_ROWS,
    ):
        """Embeds raw strings; returns NumPy, in the order given.

        Equal to sentence-transformers' `encode(texts, batch_size, normalize_embeddings,
        truncate_dim, prompt, prompt_name, precision)` on the same checkpoint: the prompt is
        prepended to each text, the model pools (and normalises, when the preset has a
        `Normalize` module), the vectors are truncated to `truncate_dim`, then
        normalised again when `normalize=True`, then quantised to `precision`.

        Args:
            texts: str or list / NumPy array of str. One string returns one vector.
            batch_size: int. Rows per forward pass. Defaults to `32`.
            normalize: `None`, `True` or `False`. `True` L2-normalises the returned
                (truncated) vectors; `None`/`False` return the model's own output (unit
                vectors when the model normalises, as sentence-transformers). Defaults to
                `None`.
            truncate_dim: int or `None`. Keep the first `truncate_dim` dimensions
                (Matryoshka). Defaults to the model's `truncate_dim`.
            prompt: str or `None`. Text prepended to every input (overrides `prompt_name`).
            prompt_name: str or `None`. A key of the model's `prompts`.
            precision: `"float32"`, `"int8"`, `"uint8"`, `"binary"` or `"ubinary"` (see
                `quantize_embeddings`). Defaults to `"float32"`.
            verbose: bool. Show a progress bar. Defaults to `False`.
            output_dir: str, path or `None`. Write the embeddings as ordered `.npy` shards of
                `shard_rows` rows into this directory (with an `embeddings.json` listing
                them; `kbert.models.process_inference.load_shards` reads them back) instead
                of returning them: for corpora that do not fit in memory. Each shard is
                written whole (temporary sibling, one rename); the same call again after an
                interruption writes only the missing shards. Not with `precision="int8"` /
                `"uint8"`, whose ranges are calibrated on all rows at once.
            shard_rows: int. Rows per shard with `output_dir`. Defaults to 10,000.

        Over several processes (`kbert.distribution.initialize`) each process embeds its
        share of the texts and every process returns all of them, in order; with
        `output_dir` each writes its own shards (see `kbert.models.process_inference`).

        Returns:
            NumPy array `(len(texts), dim)` (or `(dim,)` for one string); binary precisions
            pack 8 dimensions per byte. With `output_dir`: the list of shard paths, in row
            order.
        """
        single = isinstance(texts, (str, bytes))
        if not single and not isinstance(texts, (list, tuple, np.ndarray)):
            raise ValueError(
                "`encode` takes a string or a list of strings. Received "
                f"{type(texts).__name__}: {texts!r:.80}"
            )
        if isinstance(texts, (list, tuple, np.ndarray)) and len(texts) == 0:
            raise ValueError(
                "`encode` received an empty list of texts. Expected at least one string."
            )
        texts = text_parts(texts)
        if len(texts) != 1:
            raise ValueError("`encode` takes a batch of strings, not sentence pairs.")
        texts = texts[0]
        if (
            not isinstance(batch_size, (int, np.integer))
            or isinstance(batch_size, bool)
            or batch_size < 1
        ):
            raise ValueError(f"`batch_size` must be a positive integer. Received: {batch_size!r}")
        if normalize not in (None, True, False):
            raise ValueError(f"`normalize` must be None, True or False. Received: {normalize!r}")
        if precision not in PRECISIONS:
            raise ValueError(
                f"Unknown `precision` {precision!r}. Expected one of {list(PRECISIONS)}"
            )
        truncate_dim = self.truncate_dim if truncate_dim is None else truncate_dim
        if truncate_dim is not None:
            _check_truncate_dim(truncate_dim, self.embedding_dim)
        prompt = self.resolve_prompt(prompt, prompt_name)
        show = bool(verbose) and processes.is_writer()

        def embed(part):  # This process' texts -> float32 vectors, truncated, normalised.
            x = self.pack_token_ids(
                self.tokenize_texts(part, prompt), self.preprocessor.sequence_length
            )
            check_model_inputs(x, self.backbone)  # once, whole
            embeddings = process_inference.compute_here(
                self, lambda model: model._predict_by_length(x, int(batch_size), int(show))
            )
            if truncate_dim is not None:
                embeddings = embeddings[:, :truncate_dim]
            return _l2_normalize(embeddings) if normalize else embeddings

        if output_dir is not None:
            return self._encode_to_shards(
                texts,
                output_dir,
                shard_rows,
                embed,
                single,
                precision,
                show,
                dict(prompt=prompt, truncate_dim=truncate_dim, normalize=bool(normalize)),
            )
        if process_inference.sharing_processes() and len(texts) >= processes.process_count():
            rows = process_inference.row_share([len(t) for t in texts])
            embeddings = process_inference.gather_rows(
                embed([texts[i] for i in rows]), rows, len(texts), "encode"
            )
        else:
            embeddings = embed(texts)
        if precision != "float32":
            embeddings = quantize_embeddings(embeddings, precision)
        return embeddings[0] if single else embeddings

    def _encode_to_shards(
        self, texts, output_dir, shard_rows, embed, single, precision, verbose, settings
    ):
        if single:
            raise ValueError(
                "`encode(..., output_dir=...)` writes a corpus: pass a list of strings, not "
                "one string."
            )
        if precision in ("int8", "uint8"):
            raise ValueError(
                f"`precision={precision!r}` calibrates its ranges on all rows at once, which "
                "shards written one by one cannot do. With `output_dir` use 'float32', "
                "'binary' or 'ubinary' (and `quantize_embeddings` with your own ranges)."
            )

        def finish(part):
            embeddings = embed(part)
            if precision != "float32":
                embeddings = quantize_embeddings(embeddings, precision)
            return embeddings

        settings = dict(settings, precision=precision)
        return process_inference.write_shards(
            list(texts), output_dir, shard_rows, settings, finish, verbose=verbose
        )

    def similarity(self, a, b):
        """Pairwise similarity `(len(a), len(b))` of two embedding matrices (NumPy): cosine
        or dot product, as the preset's `similarity_function`."""
        a, b = np.atleast_2d(np.asarray(a, "float32")), np.atleast_2d(np.asarray(b, "float32"))
        if a.shape[-1] != b.shape[-1]:
            raise ValueError(
                f"Embeddings to compare must have the same size. Received {a.shape} and {b.shape}"
            )
        if self.similarity_function == "cosine":
            a, b = _l2_normalize(a), _l2_normalize(b)
        return a @ b.T

    def predict(self, x, batch_size=None, **kwargs):
        """Embeddings of raw strings (as `encode` with its defaults) or of packed inputs."""
        if isinstance(x, (str, bytes)) or (
            isinstance(x, (list, np.ndarray)) and len(x) > 0 and isinstance(x[0], (str, bytes))
        ):
            verbose = kwargs.get("verbose", "auto")
            return self.encode(x, batch_size=batch_size or 32, verbose=verbose not in (0, False))
        return super().predict(x, batch_size=batch_size, **kwargs)

    # ---------------------------------------------------------------- training
    def preprocess_samples(self, x, y=None, sample_weight=None, mode="fit", batch_size=None):
        """Text columns (`fit`, `evaluate`, validation data) -> `TextColumnBatches` of
        `batch_size` (32 when `None`) rows; anything else as `BertTask` takes it."""
        if mode != "predict" and not is_dataset(x) and is_text_columns(x):
            batches = TextColumnBatches(
                self, text_columns(x), y, sample_weight, batch_size or 32, shuffle=mode == "fit"
            )
            return batches, None, None
        return super().preprocess_samples(x, y, sample_weight, mode, batch_size)

    def fit(self, x=None, y=None, batch_size=None, epochs=1, sample_weight=None, **kwargs):
        """`BertTask.fit` that also takes text columns for contrastive training.

        `x` may be a tuple/list of equally long lists of strings (`(anchors, positives)`,
        `(anchors, positives, negatives)`), a list of such tuples, or a dict of columns
        (used in insertion order). `y` holds the scores of scored pairs (for
        `kbert.losses.CoSENTLoss`) or is left out. Rows are shuffled each epoch and each
        batch is padded to its own longest text. See `kbert.losses` for the losses.
        """
        if not is_dataset(x) and is_text_columns(x):
            kwargs.pop("shuffle", None)  # The batches draw a new random order every epoch.
        elif isinstance(x, (tuple, list)) and len(x) == 1 and _is_string_list(x[0]):
            raise ValueError(
                "Contrastive training takes at least two text columns: (anchors, positives) "
                "or (anchors, positives, negatives), with `y` for scored pairs. Received one "
                f"column of {len(x[0])} texts. For an unsupervised objective, pass each text "
                "twice: (texts, texts)."
            )
        return super().fit(
            x, y, batch_size=batch_size, epochs=epochs, sample_weight=sample_weight, **kwargs
        )

    # ------------------------------------------------------------------ config
    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "pooling": list(self.pooling),
                "normalize": self.normalize,
                "prompts": dict(self.prompts),
                "default_prompt_name": self.default_prompt_name,
                "similarity_function": self.similarity_function,
                "truncate_dim": self.truncate_dim,
                "lowercase_input": self.lowercase_input,
            }
        )
        return config

    @classmethod
    def from_preset(cls, source, load_weights=True, preprocessor="auto", **kwargs):
        """Builds the embedder from a preset name or a checkpoint directory.

        On a sentence-transformers directory (one with `modules.json`) the pooling, the
        `Normalize` module, `max_seq_length` (the preprocessor's `sequence_length`),
        `do_lower_case`, `prompts`, `default_prompt_name` and `similarity_fn_name` come from
        its files; a module kbert does not implement is a ValueError naming it. On every
        other source (kbert preset of another task, Hugging Face, Google, keras-hub) the
        embedder uses mean pooling without normalisation unless `pooling=` / `normalize=`
        say otherwise. Arguments given here override what the directory says.

        Args:
            source: str or path. A preset name, an `hf://<owner>/<name>[@revision]` handle
                (see `kbert.hub`) or a checkpoint directory.
            load_weights: bool. Defaults to `True`.
            preprocessor: `"auto"`, `None` or a preprocessor (see `BertTask.from_preset`).
            **kwargs: constructor arguments (`pooling`, `normalize`, `prompts`, ...),
                `sequence_length` of the automatic preprocessor, backbone overrides.
        """
        from pathlib import Path

        from kbert import hub
        from kbert.checkpoints import sentence_transformers

        if hub.is_hub_handle(source):  # Downloaded first: its module files are read below.
            source = hub.resolve_preset_source(source, load_weights=load_weights)
        settings = {}
        path = Path(source) if isinstance(source, str) or hasattr(source, "__fspath__") else None
        if path is not None and sentence_transformers.is_sentence_transformers_dir(path):
            settings = sentence_transformers.read_settings(path)
            source = sentence_transformers.transformer_directory(path)
        sequence_length = settings.pop("max_seq_length", None)
        for key, value in settings.items():
            kwargs.setdefault(key, value)
        if sequence_length is not None:
            kwargs.setdefault("sequence_length", sequence_length)
        return super().from_preset(
            source, load_weights=load_weights, preprocessor=preprocessor, **kwargs
        )


def _check_truncate_dim(truncate_dim, dimension):
    if (
        not isinstance(truncate_dim, (int, np.integer))
        or isinstance(truncate_dim, bool)
        or not 1 <= truncate_dim <= dimension
    ):
        raise ValueError(
            f"`truncate_dim` must be an integer in [1, {dimension}] (the embedding size). "
            f"Received: truncate_dim={truncate_dim!r}"
        )


def _is_string_list(value):
    return (
        isinstance(value, (list, tuple, np.ndarray))
        and len(value) > 0
        and isinstance(value[0], (str, bytes))
    )


def is_text_columns(x):
    """True for text columns: a dict of string lists, a tuple/list of >= 2 string lists, or a
    list of (str, str[, str]) tuples."""
    if isinstance(x, dict):
        return len(x) > 0 and all(_is_string_list(v) for v in x.values())
    if isinstance(x, (tuple, list)) and len(x) >= 2 and all(_is_string_list(v) for v in x):
        return True
    return (
        isinstance(x, list)
        and len(x) > 0
        and isinstance(x[0], tuple)
        and len(x[0]) >= 2
        and all(isinstance(v, (str, bytes)) for v in x[0])
    )


def text_columns(x):
    """Text columns (see `is_text_columns`) as a list of equally long lists of `str`."""
    if isinstance(x, dict):
        columns = list(x.values())
    elif isinstance(x, list) and isinstance(x[0], tuple):
        width = len(x[0])
        bad = [i for i, row in enumerate(x) if not isinstance(row, tuple) or len(row) != width]
        if bad:
            raise ValueError(
                f"Every training example must be a tuple of {width} strings. Item {bad[0]} is "
                f"{x[bad[0]]!r}"
            )
        columns = [[row[j] for row in x] for j in range(width)]
    else:
        columns = list(x)
    columns = [text_parts(list(c) if isinstance(c, tuple) else c)[0] for c in columns]
    lengths = [len(c) for c in columns]
    if len(set(lengths)) != 1:
        raise ValueError(
            f"Text columns must have the same number of rows. Received lengths {lengths}"
        )
    return columns


class TextColumnBatches(batching.ShuffledRows):
    """Batches of tokenized text columns `(batch, columns, seq)`, in a new random order each
    epoch (in-batch negatives stay random, as in sentence-transformers), each padded to the
    smallest bucket that holds its longest text (see `kbert.data.batching`)."""

    def __init__(self, embedder, columns, y, sample_weight, batch_size, shuffle=True, seed=None):
        super().__init__(len(columns[0]), batch_size, shuffle, seed)
        self.embedder = embedder
        self.rows = [embedder.tokenize_texts(column) for column in columns]
        self.y = None if y is None else np.asarray(y, dtype="float32")
        if self.y is not None and len(self.y) != self.num_rows:
            raise ValueError(
                f"`y` has {len(self.y)} rows but the text columns have {self.num_rows}"
            )
        self.sample_weight = None if sample_weight is None else np.asarray(sample_weight, "float32")

    def __getitem__(self, index):
        indices = self.batch_rows(index)
        rows = [column[i] for i in indices for column in self.rows]  # row-major (batch, columns)
        packed = self.embedder.pack_token_ids(rows, training=True)
        x = {k: v.reshape(len(indices), len(self.rows), -1) for k, v in packed.items()}
        y = np.zeros(len(indices), "float32") if self.y is None else self.y[indices]
        if self.sample_weight is not None:
            return x, y, self.sample_weight[indices]
        return x, y
