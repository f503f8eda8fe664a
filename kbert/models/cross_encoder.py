"""BertCrossEncoder: a reranker scoring (query, document) pairs, as sentence-transformers'.

A cross-encoder reads a query and a document together (`[CLS] query [SEP] document [SEP]`)
and scores the pair with the classifier head of Hugging Face's
sequence-classification model (pooled `[CLS]` -> dropout -> dense), which is what
sentence-transformers' `CrossEncoder` loads. `predict` returns sentence-transformers'
`CrossEncoder.predict` scores and `rank` its `rank` results on the same directory; `fit`
trains on raw pairs with labels (binary cross-entropy), on text columns with in-batch
negatives, or on (query, documents, labels) lists with LambdaLoss (see `kbert.losses`).
"""

import keras
import numpy as np
from keras import ops

from kbert.backend.tensorflow import is_dataset
from kbert.data import batching
from kbert.models.backbone import BACKBONE_INPUTS
from kbert.models.classifier import BertClassifier
from kbert.models.pipeline import check_class_ids
from kbert.models.text_embedder import text_columns

ACTIVATIONS = ("sigmoid", "identity", "tanh")


def truncated_pair_lengths(first, second, budget):
    """Lengths kept of token-id segment pairs so that each pair fits in `budget` tokens, by
    Hugging Face tokenizers' `"longest_first"` rule (what sentence-transformers' cross-encoder
    tokenizer applies): a segment no longer than half the budget is kept whole and the other
    cut to the rest; otherwise both are cut to half the budget, the odd token going to the
    longer segment (to the second on a tie).

    Args:
        first, second: int arrays of segment lengths.
        budget: int. Tokens available to both segments (`sequence_length - 3`).

    Returns:
        `(first_kept, second_kept)` int arrays.

    Example:
    >>> truncated_pair_lengths(np.array([10, 3, 12]), np.array([10, 20, 10]), 9)
    (array([4, 3, 5]), array([5, 6, 4]))
    """
    first, second = np.asarray(first, np.int64), np.asarray(second, np.int64)
    fits = first + second <= budget
    shorter = np.minimum(first, second)
    half, odd = budget // 2, budget % 2
    short_whole = shorter <= budget - shorter
    new_short = np.where(short_whole, shorter, half)
    new_long = np.where(short_whole, budget - shorter, half + odd)
    first_longer = first > second
    new_first = np.where(first_longer, new_long, new_short)
    new_second = np.where(first_longer, new_short, new_long)
    return np.where(fits, first, new_first), np.where(fits, second, new_second)


def _is_string(value):
    return isinstance(value, (str, bytes))


def _text(value):
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value


def read_pairs(x):
    """(query, document) pairs in any form `predict` and `fit` take -> `(firsts, seconds,
    single)`: two equally long lists of `str` and whether `x` was one pair.

    Forms: one pair (a tuple or list of two strings); a list (tuple, NumPy array) of pairs;
    a tuple of two equally long columns of strings. Anything else is a ValueError naming the
    first item that is not a pair of strings.
    """
    if isinstance(x, np.ndarray):
        x = x.tolist()
    if isinstance(x, (tuple, list)) and len(x) == 2 and all(_is_string(v) for v in x):
        return [_text(x[0])], [_text(x[1])], True
    if (
        isinstance(x, tuple)
        and len(x) == 2
        and all(isinstance(c, (list, tuple, np.ndarray)) for c in x)
        and all(len(c) == 0 or _is_string(c[0]) for c in x)
    ):
        firsts, seconds = list(x[0]), list(x[1])
        if len(firsts) != len(seconds):
            raise ValueError(
                "The query and document columns must have the same number of rows. "
                f"Received: {len(firsts)} and {len(seconds)}"
            )
        pairs = list(zip(firsts, seconds))
    elif isinstance(x, (list, tuple)):
        pairs = [p.tolist() if isinstance(p, np.ndarray) else p for p in x]
    else:
        raise ValueError(
            "A cross-encoder takes (query, document) pairs: a list of pairs of strings or a "
            f"tuple of two columns of strings. Received {type(x).__name__}: {x!r:.80}"
        )
    if not pairs:
        raise ValueError("Received an empty list of pairs. Expected at least one pair.")
    for index, pair in enumerate(pairs):
        if not (
            isinstance(pair, (tuple, list)) and len(pair) == 2 and all(_is_string(v) for v in pair)
        ):
            raise ValueError(
                "Expected every item to be a (query, document) pair of two strings. Item "
                f"{index} is {type(pair).__name__}: {pair!r:.80}"
            )
    return [_text(p[0]) for p in pairs], [_text(p[1]) for p in pairs], False


def _looks_like_pairs(x):
    """True for input `read_pairs` reads (or should reject with its message): raw Python
    text in a list or tuple, not a dict of packed arrays or a dataset."""
    if isinstance(x, np.ndarray):
        return x.dtype.kind in "USO"
    return isinstance(x, (list, tuple))


def check_activation(activation, name="activation"):
    if activation not in ACTIVATIONS:
        raise ValueError(
            f"`{name}` must be one of {list(ACTIVATIONS)}. Received: {name}={activation!r}"
        )
    return activation


def apply_activation(logits, activation):
    """NumPy float32 logits through `"sigmoid"`, `"identity"`, `"tanh"` or a callable."""
    logits = np.asarray(logits, np.float32)
    if callable(activation):
        return np.asarray(activation(logits), np.float32)
    check_activation(activation)
    if activation == "sigmoid":
        return (1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
    if activation == "tanh":
        return np.tanh(logits).astype(np.float32)
    return logits


def tokenize_pairs(tokenizer, sequence_length, firsts, seconds):
    """Token ids of each (first, second) text pair, cut to fit `sequence_length` with `[CLS]`
    and two `[SEP]` by Hugging Face's `"longest_first"` rule (`truncated_pair_lengths`), as
    `BertCrossEncoder.predict` and its served exports (`kbert.serving`) cut them.

    Args:
        tokenizer: `kbert.text.BertTokenizer`.
        sequence_length: int. Packed length, `[CLS]` and both `[SEP]` included.
        firsts, seconds: equally long lists of str.

    Returns:
        `(first_ids, second_ids)`: two lists of lists of int.
    """
    first_ids, second_ids = tokenizer.tokenize(firsts), tokenizer.tokenize(seconds)
    keep_first, keep_second = truncated_pair_lengths(
        [len(ids) for ids in first_ids], [len(ids) for ids in second_ids], sequence_length - 3
    )
    first_ids = [ids[:n] for ids, n in zip(first_ids, keep_first.tolist())]
    second_ids = [ids[:n] for ids, n in zip(second_ids, keep_second.tolist())]
    return first_ids, second_ids


def scores_from_logits(logits, activation, num_labels, apply_softmax=False):
    """sentence-transformers' `CrossEncoder.predict` scores of logits `(n, num_labels)`:
    `activation` (`"sigmoid"`, `"identity"`, `"tanh"` or a callable), then `(n,)` for one
    label, then a softmax over the labels if `apply_softmax`. float32 NumPy."""
    scores = apply_activation(logits, activation)
    if num_labels == 1 and scores.ndim > 1:
        scores = scores[..., 0]
    if apply_softmax and scores.ndim > 1:
        shifted = np.exp(scores - scores.max(axis=-1, keepdims=True))
        scores = (shifted / shifted.sum(axis=-1, keepdims=True)).astype(np.float32)
    return scores


def check_rank_arguments(query, documents, top_k, num_labels):
    """Checks `rank`'s arguments; returns `(query, documents)` as `str` and a list of `str`."""
    if num_labels != 1:
        raise ValueError(
            f"`rank` needs a one-label cross-encoder; this one has {num_labels} labels. "
            "Use `predict` on the pairs instead."
        )
    if not _is_string(query):
        raise ValueError(
            f"`query` must be a string. Received {type(query).__name__}: {query!r:.80}"
        )
    if isinstance(documents, np.ndarray):
        documents = documents.tolist()
    if _is_string(documents) or not isinstance(documents, (list, tuple)):
        raise ValueError(
            "`documents` must be a list of strings. Received "
            f"{type(documents).__name__}: {documents!r:.80}"
        )
    if not documents:
        raise ValueError(
            "`rank` received no documents for the query. Expected a non-empty list of strings."
        )
    for index, document in enumerate(documents):
        if not _is_string(document):
            raise ValueError(
                "`documents` must be strings. The document at index "
                f"{index} is {type(document).__name__}: {document!r:.80}"
            )
    if top_k is not None and (
        isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1
    ):
        raise ValueError(f"`top_k` must be a positive integer or None. Received: {top_k!r}")
    return _text(query), [_text(d) for d in documents]


def ranked(scores, documents, top_k=None, return_documents=False):
    """`CrossEncoder.rank`'s results of one query's document `scores` `(n,)`: a list of
    `{"corpus_id", "score"(, "text")}` dicts, highest score first (ties keep the documents'
    order), the first `top_k` (all when `None`)."""
    results = []
    for index, score in enumerate(np.asarray(scores).tolist()):
        result = {"corpus_id": index, "score": score}
        if return_documents:
            result["text"] = documents[index]
        results.append(result)
    results.sort(key=lambda result: result["score"], reverse=True)
    return results[:top_k]


@keras.saving.register_keras_serializable(package="kbert")
class BertCrossEncoder(BertClassifier):
    """BERT reranker: `[CLS] query [SEP] document [SEP]` -> pooled `[CLS]` -> dropout -> dense.

    The model scores (query, document) pairs with one logit per label (`num_labels`,
    usually 1), as a Hugging Face sequence classifier, which is what
    sentence-transformers' `CrossEncoder` loads. On the same directory:

    - `predict(pairs)` returns `CrossEncoder.predict(pairs)`: the logits through the
      model's `activation` (sigmoid for one label, none otherwise, unless the directory
      stores another), shape `(n,)` for one label and `(n, num_labels)` otherwise (a single
      pair: a scalar / one row); `apply_softmax=True` normalises several labels;
    - `rank(query, documents)` returns `CrossEncoder.rank`: `{"corpus_id", "score"
      (, "text")}` dicts, best first.

    Pairs are tokenized with the preprocessor's tokenizer and cut to its `sequence_length`
    as Hugging Face's tokenizer cuts them (`truncated_pair_lengths`), then length-batched
    through the task pipeline like every kbert task (`kbert.models.pipeline`).

    **Training.** `fit(pairs, labels)` uses binary cross-entropy for one label
    (`kbert.losses.BinaryCrossEntropyLoss`; labels in [0, 1]) and softmax cross-entropy for
    several (class ids), as sentence-transformers' defaults. Compiled with
    `kbert.losses.RerankingMultipleNegativesLoss`, `fit` takes text columns `(queries,
    positives[, hard negatives...])` and scores each query against its positive and
    in-batch negatives; compiled with `kbert.losses.LambdaLoss`, it takes `(queries,
    document lists)` with `y` the lists' relevance labels. The model returns `(batch,
    documents)` logits for such groups.

    **Checkpoints.** `from_preset` reads sentence-transformers cross-encoder directories,
    Hugging Face sequence-classification directories and `hf://` handles (labels,
    activation, maximum length, the vocabulary of `vocab.txt` or else `tokenizer.json`:
    `kbert.checkpoints.cross_encoder`); another head (a
    pretraining or token-classification checkpoint) is a ValueError unless
    `fresh_heads=True`. `export_to_sentence_transformers` writes a directory
    sentence-transformers loads with the same scores.

    Args:
        backbone: `kbert.models.BertBackbone`.
        num_labels: int. Scores per pair. Defaults to `1`.
        dropout: float. Dropout before the dense layer. Defaults to `0.1`.
        activation: `"sigmoid"`, `"identity"`, `"tanh"` or `None`: what `predict` applies to
            the logits; `None` is sigmoid for one label and identity otherwise. Defaults to
            `None`.
        labels: list of str or `None`. Names of the labels (`id2label`). Defaults to `None`.
        preprocessor: `kbert.text.BertPreprocessor` or `None`. Defaults to `None`.

    Example:
    >>> tokenizer = kbert.text.BertTokenizer(
    ...     ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "who", "wrote", "it", "she", "did"])
    >>> backbone = kbert.models.BertBackbone(vocabulary_size=10, num_layers=1, num_heads=2,
    ...                                      hidden_dim=16, intermediate_dim=32)
    >>> backbone.save_to_preset("my_bert", tokenizer=tokenizer)
    >>> reranker = BertCrossEncoder.from_preset("my_bert", fresh_heads=True)
    >>> reranker.predict([("who wrote it", "she did"), ("who wrote it", "it")]).shape
    (2,)
    >>> [hit["corpus_id"] for hit in reranker.rank("who wrote it", ["she did", "it"])][0] in (0, 1)
    True

    Reference: Nogueira and Cho, 2019, "Passage Re-ranking with BERT" (arXiv 1901.04085).
    """

    def __init__(
        self,
        backbone,
        num_labels=1,
        dropout=0.1,
        activation=None,
        labels=None,
        preprocessor=None,
        **kwargs,
    ):
        if (
            not isinstance(num_labels, (int, np.integer))
            or isinstance(num_labels, bool)
            or num_labels < 1
        ):
            raise ValueError(
                f"`num_labels` must be a positive integer. Received: num_labels={num_labels!r}"
            )
        num_labels = int(num_labels)
        if activation is None:
            activation = "sigmoid" if num_labels == 1 else "identity"
        check_activation(activation)
        if labels is not None:
            labels = list(labels)
            if len(labels) != num_labels or not all(isinstance(n, str) for n in labels):
                raise ValueError(
                    f"`labels` must be {num_labels} label names (one per label). "
                    f"Received: labels={labels!r}"
                )
        super().__init__(
            backbone, num_classes=num_labels, dropout=dropout, preprocessor=preprocessor, **kwargs
        )
        self.num_labels = num_labels
        self.activation = activation
        self.labels = labels

    # ----------------------------------------------------------------- calling
    def call(self, inputs, training=None, mask=None):
        """`(batch, num_labels)` logits for inputs `(batch, seq)`; `(batch, documents)` for
        groups of pairs `(batch, documents, seq)` (one label)."""
        token_ids = inputs["token_ids"] if isinstance(inputs, dict) else None
        if token_ids is None or len(token_ids.shape) != 3:
            return super().call(inputs, training=training, mask=mask)
        documents, length = token_ids.shape[1], token_ids.shape[2]
        flat = {k: ops.reshape(inputs[k], (-1, length)) for k in BACKBONE_INPUTS}
        logits = super().call(flat, training=training, mask=mask)  # (batch * docs, 1)
        return ops.reshape(logits, (-1, documents))

    def compute_output_spec(self, inputs, training=None, mask=None):
        shape = inputs["token_ids"].shape
        if len(shape) == 3:
            return keras.KerasTensor((shape[0], shape[1]), "float32")
        return keras.KerasTensor((shape[0], self.num_classes), "float32")

    # --------------------------------------------------------------- compiling
    def _default_loss(self):
        if self.num_classes == 1:
            from kbert.losses import BinaryCrossEntropyLoss

            return BinaryCrossEntropyLoss()
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True, name="cross_entropy")

    def compile(self, optimizer="auto", loss="auto", metrics="auto", **kwargs):
        """`BertTask.compile`; with a ranking loss (`kbert.losses.RerankingMultipleNegativesLoss`,
        `kbert.losses.LambdaLoss`) the default metrics are none (accuracy needs labels)."""
        if isinstance(metrics, str) and metrics == "auto" and _group_mode(loss) is not None:
            metrics = None
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, **kwargs)

    def _default_metrics(self):
        if self.num_classes == 1:
            return [keras.metrics.BinaryAccuracy(threshold=0.0, name="accuracy")]
        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]

    def _check_labels(self, y):
        """One label: targets in [0, 1] (float32); several: class ids (int32)."""
        labels = np.asarray(y)
        if self.num_classes > 1:
            check_class_ids(labels, self.num_classes, "labels")
            return labels.astype("int32")
        if labels.dtype.kind not in "biuf":
            raise ValueError(
                f"Labels of a one-label cross-encoder must be numbers in [0, 1]. Received dtype "
                f"{labels.dtype}"
            )
        labels = labels.astype("float32")
        bad = ~(np.isfinite(labels) & (labels >= 0) & (labels <= 1))
        if bad.any():
            raise ValueError(
                "Labels of a one-label cross-encoder (binary cross-entropy) must lie in [0, 1]. "
                f"Received {labels[bad][:5].tolist()} at rows "
                f"{np.argwhere(bad)[:5].ravel().tolist()}"
            )
        return labels

    # ----------------------------------------------------------------- packing
    def _require_tokenizer(self):
        if self.preprocessor is None:
            raise ValueError(
                "BertCrossEncoder needs a preprocessor (a kbert.text.BertPreprocessor) to take "
                "raw (query, document) pairs. Build it with `from_preset` on a source that has "
                "a vocabulary, or pass `preprocessor=`."
            )
        return self.preprocessor.tokenizer, self.preprocessor.sequence_length

    def tokenize_pairs(self, firsts, seconds):
        """Token ids of each pair's two texts, cut to fit `sequence_length` with `[CLS]` and
        two `[SEP]` (see `truncated_pair_lengths`). Two lists of lists."""
        tokenizer, sequence_length = self._require_tokenizer()
        return tokenize_pairs(tokenizer, sequence_length, firsts, seconds)

    def pack_pairs(self, first_ids, second_ids, length=None, training=False):
        """Packs token-id pairs (from `tokenize_pairs`) into the model's int32 input arrays
        `(len(first_ids), length)`; `length` defaults to the preprocessor's `sequence_length`
        (`training=True`: the smallest of `fit`'s buckets holding the longest pair)."""
        _, sequence_length = self._require_tokenizer()
        if length is None and training:
            longest = max(len(a) + len(b) for a, b in zip(first_ids, second_ids)) + 3
            buckets = self.bucket_lengths(sequence_length, training=True)
            length = int(batching.bucket_for([longest], buckets)[0])
        return self.preprocessor.packer(
            (list(first_ids), list(second_ids)), sequence_length=int(length or sequence_length)
        )

    def preprocess_samples(self, x, y=None, sample_weight=None, mode="fit", batch_size=None):
        """Raw pairs -> packed arrays (cut as sentence-transformers cuts them); text columns
        or document lists -> groups of pairs when compiled with a ranking loss (see the class
        docstring); anything else as `BertTask` takes it."""
        if is_dataset(x) or isinstance(x, dict) and set(x) >= set(BACKBONE_INPUTS):
            return super().preprocess_samples(x, y, sample_weight, mode, batch_size)
        group_mode = _group_mode(self.loss) if mode != "predict" else None
        if group_mode is not None:
            batches = _PairGroupBatches(
                self, x, y, sample_weight, batch_size or 32, group_mode, shuffle=mode == "fit"
            )
            return batches, None, None
        if _looks_like_pairs(x):
            firsts, seconds, _ = read_pairs(x)
            x = self.pack_pairs(*self.tokenize_pairs(firsts, seconds))
            if y is not None and not is_dataset(y):
                y = self._check_labels(y)
            return x, y, sample_weight
        return super().preprocess_samples(x, y, sample_weight, mode, batch_size)

    def fit(self, x=None, y=None, batch_size=None, epochs=1, sample_weight=None, **kwargs):
        """`BertTask.fit`; with a ranking loss compiled, on text columns or document lists
        (see the class docstring), in a new random order each epoch."""
        if _group_mode(self.loss) is not None:
            kwargs.pop("shuffle", None)  # The groups draw a new random order every epoch.
        return super().fit(
            x, y, batch_size=batch_size, epochs=epochs, sample_weight=sample_weight, **kwargs
        )

    # ----------------------------------------------------------------- scoring
    def scores_from_logits(self, logits, activation=None, apply_softmax=False):
        """sentence-transformers' scores of logits `(n, num_labels)`: `activation` (default
        the model's), then `(n,)` for one label, then a softmax over labels if asked."""
        activation = self.activation if activation is None else activation
        return scores_from_logits(logits, activation, self.num_classes, apply_softmax)

    def predict(self, x, batch_size=32, activation=None, apply_softmax=False, verbose=0, **kwargs):
        """Scores of (query, document) pairs, as sentence-transformers' `CrossEncoder.predict`.

        Args:
            x: one pair `(query, document)`, a list of pairs, a tuple of two columns of
                strings, or packed inputs (a dict of `token_ids`, `segment_ids`,
                `padding_mask`).
            batch_size: int. Pairs per forward pass. Defaults to `32`.
            activation: `None` (the model's `activation`), `"sigmoid"`, `"identity"`,
                `"tanh"` or a callable on NumPy arrays. Defaults to `None`.
            apply_softmax: bool. Softmax over the labels of a several-label model.
                Defaults to `False`.
            verbose: Keras' progress-bar setting. Defaults to `0`.
            **kwargs: other arguments of `keras.Model.predict`.

        Returns:
            float32 NumPy array `(n,)` for one label, `(n, num_labels)` otherwise; for one
            pair a scalar (one label) or one row.
        """
        if (
            isinstance(batch_size, bool)
            or not isinstance(batch_size, (int, np.integer))
            or batch_size < 1
        ):
            raise ValueError(f"`batch_size` must be a positive integer. Received: {batch_size!r}")
        if activation is not None and not callable(activation):
            check_activation(activation)
        single = False
        if not (is_dataset(x) or isinstance(x, dict)):
            firsts, seconds, single = read_pairs(x)
            x = self.pack_pairs(*self.tokenize_pairs(firsts, seconds))
        logits = super().predict(x, batch_size=int(batch_size), verbose=verbose, **kwargs)
        scores = self.scores_from_logits(logits, activation, apply_softmax)
        return scores[0] if single else scores

    def rank(self, query, documents, top_k=None, return_documents=False, batch_size=32):
        """Documents ranked by their score for `query`, as sentence-transformers'
        `CrossEncoder.rank` (one-label models only).

        Args:
            query: str.
            documents: non-empty list of str.
            top_k: int >= 1 or `None` (all). Defaults to `None`.
            return_documents: bool. Add each document's `"text"`. Defaults to `False`.
            batch_size: int. Pairs per forward pass. Defaults to `32`.

        Returns:
            A list of dicts `{"corpus_id": int, "score": float(, "text": str)}`, highest
            score first (ties keep the documents' order).
        """
        query, documents = check_rank_arguments(query, documents, top_k, self.num_classes)
        scores = self.predict([(query, d) for d in documents], batch_size=batch_size)
        return ranked(scores, documents, top_k, return_documents)

    def evaluate_reranking(self, samples, at_k=10, always_rerank_positives=True, batch_size=64):
        """MAP, MRR@k and nDCG@k of candidate lists reranked by this model, as
        sentence-transformers' `CrossEncoderRerankingEvaluator` reports them.

        Each sample is a dict with `"query"`, `"positive"` (a list of relevant documents, or
        one) and either `"negative"` (irrelevant documents) or `"documents"` (a first-stage
        ranked list, best first). With `"documents"` the metrics of the list's own order
        come too (`base_map`, `base_mrr@k`, `base_ndcg@k`; positives missing from the list
        count as ranked after it), and the reranked candidates are the positives and the
        list's other documents (`always_rerank_positives=True`) or the list alone.
        See `kbert.retrieval.reranking_metrics`.

        Returns:
            dict of float: `map`, `mrr@{at_k}`, `ndcg@{at_k}` (and the `base_` ones).
        """
        from kbert.retrieval import reranking_metrics

        base_scores, base_relevance, relevance, pairs, sizes = [], [], [], [], []
        for index, sample in enumerate(samples):
            if not isinstance(sample, dict) or "query" not in sample or "positive" not in sample:
                raise ValueError(
                    f'Sample {index} must be a dict with "query" and "positive". '
                    f"Received: {sample!r:.120}"
                )
            if ("negative" in sample) == ("documents" in sample):
                raise ValueError(
                    f'Sample {index} must have exactly one of "negative" and "documents".'
                )
            positives = sample["positive"]
            positives = [positives] if isinstance(positives, str) else list(positives)
            documents = sample.get("documents")
            if documents:
                found = [int(document in positives) for document in documents]
                if any(found):  # Else the list's own order scores 0, as in the evaluator.
                    found += [1] * (len(positives) - sum(found))
                base_scores.append(np.arange(len(found), 0, -1))
                base_relevance.append(found)
                if always_rerank_positives:
                    candidates = positives + [d for d in documents if d not in positives]
                    labels = [1] * len(positives) + [0] * (len(candidates) - len(positives))
                else:
                    candidates = list(documents)
                    labels = [int(d in positives) for d in documents]
            else:
                candidates = positives + list(sample["negative"])
                labels = [1] * len(positives) + [0] * len(sample["negative"])
            if not any(labels):
                candidates, labels = [], []
            relevance.append(labels)
            sizes.append(len(candidates))
            pairs.extend((sample["query"], document) for document in candidates)
        scores = self.predict(pairs, batch_size=batch_size) if pairs else np.zeros(0)
        offsets = np.cumsum([0] + sizes)
        per_query = [scores[a:b] for a, b in zip(offsets[:-1], offsets[1:])]
        # Queries with nothing relevant to rerank score 0, as in the evaluator.
        kept = [i for i, labels in enumerate(relevance) if labels]
        metrics = (
            reranking_metrics([per_query[i] for i in kept], [relevance[i] for i in kept], at_k)
            if kept
            else {"map": 0.0, f"mrr@{at_k}": 0.0, f"ndcg@{at_k}": 0.0}
        )
        metrics = {name: value * len(kept) / len(relevance) for name, value in metrics.items()}
        if base_scores:
            base = reranking_metrics(base_scores, base_relevance, at_k)
            metrics.update({f"base_{name}": value for name, value in base.items()})
        return metrics

    # --------------------------------------------------------------- checkpoints
    def export_to_sentence_transformers(self, path):
        """Writes the model as a sentence-transformers cross-encoder directory
        (`kbert.checkpoints.cross_encoder.export_cross_encoder`): `CrossEncoder(path)`
        predicts the scores this model predicts. Returns the directory as a `Path`."""
        from kbert.checkpoints.cross_encoder import export_cross_encoder

        return export_cross_encoder(self, path)

    @classmethod
    def from_preset(cls, source, load_weights=True, preprocessor="auto", **kwargs):
        """Builds the cross-encoder from a preset name, an `hf://` handle or a directory.

        On a sentence-transformers cross-encoder or a Hugging Face
        sequence-classification directory the label count and names, the activation
        and the maximum length (the preprocessor's `sequence_length`) come from its files
        (`kbert.checkpoints.cross_encoder.read_settings`); a Hugging Face directory of
        another head is a ValueError unless `fresh_heads=True` (a new, random scoring head on
        its encoder). Arguments given here override what the directory says.

        Args:
            source: str or path. A preset name, `hf://<owner>/<name>[@revision]` or a
                directory.
            load_weights: bool. Defaults to `True`.
            preprocessor: `"auto"`, `None` or a preprocessor (see `BertTask.from_preset`).
            **kwargs: constructor arguments (`num_labels`, `activation`, ...),
                `sequence_length`, `fresh_heads`, backbone overrides.
        """
        from pathlib import Path

        from kbert import hub
        from kbert.checkpoints import cross_encoder, detect_format

        if hub.is_hub_handle(source):  # Downloaded first: its settings files are read below.
            source = hub.resolve_preset_source(source, load_weights=load_weights)
        path = Path(source) if isinstance(source, str) or hasattr(source, "__fspath__") else None
        if path is not None and path.is_dir():
            fresh = kwargs.get("fresh_heads") is True
            model_dir = cross_encoder.transformer_directory(path, allow_embedder=fresh)
            if detect_format(model_dir) == "huggingface":
                settings = cross_encoder.read_settings(path, check_head=not fresh)
                if settings["activation"] is not None:
                    kwargs.setdefault("activation", settings["activation"])
                kwargs.setdefault("sequence_length", settings["max_seq_length"])
                source = model_dir
        return super().from_preset(
            source, load_weights=load_weights, preprocessor=preprocessor, **kwargs
        )

    # ------------------------------------------------------------------ config
    def get_config(self):
        config = super().get_config()
        for name in ("num_classes", "multi_label"):
            config.pop(name, None)
        config.update(
            {"num_labels": self.num_labels, "activation": self.activation, "labels": self.labels}
        )
        return config


def _group_mode(loss):
    """`"in_batch"` or `"listwise"` for the ranking losses that score groups of pairs."""
    from kbert.losses import LambdaLoss, RerankingMultipleNegativesLoss

    if isinstance(loss, RerankingMultipleNegativesLoss):
        return "in_batch"
    if isinstance(loss, LambdaLoss):
        return "listwise"
    return None


def _document_lists(x, y):
    """`(queries, document lists, label lists)` of listwise training input: `(queries,
    lists)` columns or a list of `(query, [documents])` rows, `y` one label list per row."""
    if isinstance(x, list) and x and isinstance(x[0], tuple):
        x = ([row[0] for row in x], [row[1] for row in x])
    if not (isinstance(x, (tuple, list)) and len(x) == 2):
        raise ValueError(
            "LambdaLoss training takes (queries, document lists) or a list of (query, "
            f"[documents]) rows, with `y` the documents' labels. Received {type(x).__name__}"
        )
    queries, lists = list(x[0]), list(x[1])
    if y is None:
        raise ValueError("LambdaLoss training needs `y`: one list of relevance labels per query.")
    labels = [list(np.asarray(row, "float32").ravel()) for row in y]
    if not (len(queries) == len(lists) == len(labels)):
        raise ValueError(
            f"Queries, document lists and label lists must have one entry per row. Received "
            f"{len(queries)}, {len(lists)} and {len(labels)}"
        )
    for index, (query, documents, row_labels) in enumerate(zip(queries, lists, labels)):
        if not _is_string(query):
            raise ValueError(f"Query {index} is not a string: {query!r:.80}")
        if (
            not isinstance(documents, (list, tuple))
            or not documents
            or not all(_is_string(d) for d in documents)
        ):
            raise ValueError(
                f"Row {index}: the documents must be a non-empty list of strings. Received "
                f"{documents!r:.80}"
            )
        if len(row_labels) != len(documents):
            raise ValueError(
                f"Row {index} has {len(documents)} documents but {len(row_labels)} labels."
            )
        if not np.all(np.isfinite(row_labels)):
            raise ValueError(f"Row {index}: labels must be finite numbers. Received {row_labels}")
    return [_text(q) for q in queries], [[_text(d) for d in ds] for ds in lists], labels


class _PairGroupBatches(batching.ShuffledRows):
    """Batches of groups of (query, document) pairs `(batch, documents, seq)` for the ranking
    losses, in a new random order each epoch (`shuffle`).

    `"in_batch"`: text columns `(queries, positives[, hard negatives...])`; each query's
    group is its positive, `num_negatives` candidates (positives and hard negatives) of the
    other rows drawn without replacement (all of them, in order, when `num_negatives` is
    `None` or too large) and its own hard negatives, as sentence-transformers' cross-encoder
    `MultipleNegativesRankingLoss` builds them; `y` is zeros. `"listwise"`: each query with
    its documents, rows of fewer documents padded with empty documents whose label is
    `-inf`; `y` holds the labels.
    """

    def __init__(self, model, x, y, sample_weight, batch_size, mode, shuffle=True, seed=None):
        if model.num_classes != 1:
            raise ValueError(
                f"Ranking losses train one-label cross-encoders. This one has "
                f"{model.num_classes} labels."
            )
        if sample_weight is not None:
            raise ValueError("Ranking losses take no `sample_weight`.")
        self.model = model
        self.mode = mode
        if mode == "in_batch":
            columns = text_columns(x)
            if len(columns) < 2:
                raise ValueError(
                    "In-batch negatives need (queries, positives[, negatives...]) columns. "
                    f"Received {len(columns)} column."
                )
            self.queries, self.candidates = columns[0], columns[1:]
            self.labels = None
            self.num_negatives = model.loss.num_negatives
        else:
            self.queries, self.documents, self.labels = _document_lists(x, y)
        super().__init__(len(self.queries), batch_size, shuffle, seed)

    def groups(self, indices):
        """`(queries, documents per query, labels or None)` of the rows `indices`."""
        queries = [self.queries[i] for i in indices]
        if self.mode == "listwise":
            return queries, [self.documents[i] for i in indices], [self.labels[i] for i in indices]
        size, columns = len(indices), len(self.candidates)
        # Candidates flattened column by column: flat index c * size + j (row j of column c).
        flat = [self.candidates[c][i] for c in range(columns) for i in indices]
        valid = columns * size - columns
        groups = []
        for row in range(size):
            others = [f for f in range(columns * size) if f % size != row]
            if self.num_negatives is not None and self.num_negatives < valid:
                others = self.random.choice(others, self.num_negatives, replace=False).tolist()
            hard = [self.candidates[c][indices[row]] for c in range(1, columns)]
            groups.append([self.candidates[0][indices[row]]] + [flat[f] for f in others] + hard)
        return queries, groups, None

    def __getitem__(self, index):
        indices = self.batch_rows(index).tolist()
        queries, groups, labels = self.groups(indices)
        width = max(len(g) for g in groups)
        firsts, seconds = [], []
        for query, group in zip(queries, groups):
            padded = list(group) + [""] * (width - len(group))
            firsts.extend([query] * width)
            seconds.extend(padded)
        packed = self.model.pack_pairs(*self.model.tokenize_pairs(firsts, seconds), training=True)
        x = {k: v.reshape(len(indices), width, -1) for k, v in packed.items()}
        if labels is None:
            return x, np.zeros(len(indices), "float32")
        y = np.full((len(indices), width), -np.inf, "float32")
        for row, row_labels in enumerate(labels):
            y[row, : len(row_labels)] = row_labels
        return x, y
