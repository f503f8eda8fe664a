"""Losses and metrics of sparse (SPLADE) retrieval training, as Keras objects (every backend).

They take `y_pred` of shape `(batch_size, columns, vocabulary_size)`: the sparse vectors of
each example's texts, query first, as `kbert.models.BertSparseEncoder` returns them during
`fit` on `(queries, documents[, negatives...])` columns. The formulas are
sentence-transformers' (`sparse_encoder.losses`):

- `flops`: the FLOPS regulariser, `sum_v (mean over rows of w_v)^2`: small when few
  vocabulary entries are active across the batch (a sparse inverted index);
- `SpladeLoss`: a ranking loss (by default in-batch negatives on dot-product scores,
  sentence-transformers' `SparseMultipleNegativesRankingLoss`) plus FLOPS on the documents
  and on the queries, each with its own weight (`SpladeLoss(SparseMultipleNegativesRanking
  Loss, query_regularizer_weight, document_regularizer_weight)`);
- `ActiveDimensions`: the mean number of non-zero weights per query or per document.
"""

import keras
from keras import ops

from kbert.losses import MultipleNegativesRankingLoss


def _check_columns(y_pred, name):
    if len(y_pred.shape) != 3 or (y_pred.shape[1] is not None and y_pred.shape[1] < 2):
        raise ValueError(
            f"{name} expects sparse vectors (batch_size, columns >= 2, vocabulary_size): a "
            f"query and its documents. Received shape {tuple(y_pred.shape)}"
        )


def _check_weight(name, value, optional=False):
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(
            f"`{name}` must be a number >= 0{' or None' if optional else ''}. "
            f"Received: {name}={value!r}"
        )
    return float(value)


def _check_threshold(name, value):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"`{name}` must be a number >= 0 or None. Received: {name}={value!r}")
    return value


def flops(embeddings, threshold=None):
    """The FLOPS regulariser: `sum_v (mean_i embeddings[i, v])^2`.

    Args:
        embeddings: float tensor `(rows, vocabulary_size)`.
        threshold: number or `None`. Rows with at most `threshold` non-zero weights count as
            zero vectors (FLOPS with l0 masking). Defaults to `None`.

    Returns:
        float32 scalar.

    Example:
    >>> float(flops(np.array([[1.0, 0.0], [3.0, 0.0]])))  # mean (2, 0): 2^2
    4.0

    Reference: Paria et al., 2020, "Minimizing FLOPs to Learn Efficient Sparse
    Representations" (arXiv 2004.05665).
    """
    embeddings = ops.cast(embeddings, "float32")
    if threshold is not None:
        active = ops.sum(ops.cast(embeddings != 0, "float32"), axis=-1, keepdims=True)
        embeddings = embeddings * ops.cast(active > threshold, "float32")
    return ops.sum(ops.square(ops.mean(embeddings, axis=0)))


@keras.saving.register_keras_serializable(package="kbert")
class SpladeLoss(keras.losses.Loss):
    """SPLADE's training loss: a ranking loss plus FLOPS regularisers on documents and queries.

    `loss(y_true, y_pred) + document_regularizer_weight * flops(documents) +
    query_regularizer_weight * flops(queries)`, where the queries are column 0 of `y_pred`
    and the documents all the other columns of the batch, as sentence-transformers'
    `SpladeLoss` computes it (its `base_loss`, `document_regularizer_loss` and
    `query_regularizer_loss` summed). The regularisers are per batch: Keras averages the
    returned per-query values, so the batch's value is the mean ranking loss plus the
    regularisers (with `sample_weight`, the regularisers are weighted alike).

    Args:
        loss: a Keras loss on `(batch, columns, dim)` or its config. Defaults to
            `kbert.losses.MultipleNegativesRankingLoss(scale=1.0, similarity="dot")`:
            sentence-transformers' `SparseMultipleNegativesRankingLoss` (in-batch negatives on
            dot products, no scaling).
        document_regularizer_weight: float >= 0. Defaults to `3e-5`.
        query_regularizer_weight: float >= 0 or `None` (no query regulariser, e.g. for an
            inference-free query side). Defaults to `5e-5`.
        document_regularizer_threshold: number or `None`. See `flops`. Defaults to `None`.
        query_regularizer_threshold: number or `None`. See `flops`. Defaults to `None`.
        use_document_regularizer_only: bool. Treat every column as documents (symmetric
            data): one FLOPS term over all of them, no query term. Defaults to `False`.

    Call arguments:
        y_true: ignored by the default ranking loss (any array with one row per example).
        y_pred: `(batch_size, columns, vocabulary_size)`: query, document, then negatives.

    Example:
    >>> loss = SpladeLoss(document_regularizer_weight=0.1, query_regularizer_weight=0.0)
    >>> vectors = np.array([[[1.0, 0.0], [2.0, 0.0]], [[0.0, 1.0], [0.0, 2.0]]])
    >>> round(float(loss(np.zeros(2), vectors)), 4)  # ranking ~0.1269 + 0.1 * (1^2 + 1^2)
    0.3269

    Reference: Formal et al., 2022, "From Distillation to Hard Negative Sampling: Making
    Sparse Neural IR Models More Effective" (arXiv 2205.04733).
    """

    def __init__(
        self,
        loss=None,
        document_regularizer_weight=3e-5,
        query_regularizer_weight=5e-5,
        document_regularizer_threshold=None,
        query_regularizer_threshold=None,
        use_document_regularizer_only=False,
        name="splade",
        **kwargs,
    ):
        super().__init__(name=name, **kwargs)
        if loss is None:
            loss = MultipleNegativesRankingLoss(scale=1.0, similarity="dot")
        elif isinstance(loss, dict):
            loss = keras.losses.deserialize(loss)
        if not isinstance(loss, keras.losses.Loss):
            raise ValueError(f"`loss` must be a Keras loss. Received: {loss!r}")
        self.loss = loss
        self.document_regularizer_weight = _check_weight(
            "document_regularizer_weight", document_regularizer_weight
        )
        self.query_regularizer_weight = _check_weight(
            "query_regularizer_weight", query_regularizer_weight, optional=True
        )
        self.document_regularizer_threshold = _check_threshold(
            "document_regularizer_threshold", document_regularizer_threshold
        )
        self.query_regularizer_threshold = _check_threshold(
            "query_regularizer_threshold", query_regularizer_threshold
        )
        self.use_document_regularizer_only = bool(use_document_regularizer_only)

    def regularizers(self, y_pred):
        """`(document term, query term)`: the weighted FLOPS regularisers of a batch (the
        query term is 0 without a query weight or with `use_document_regularizer_only`)."""
        _check_columns(y_pred, type(self).__name__)
        y_pred = ops.cast(y_pred, "float32")
        dim = ops.shape(y_pred)[-1]
        first = 0 if self.use_document_regularizer_only else 1
        documents = ops.reshape(y_pred[:, first:, :], (-1, dim))  # (batch * docs, vocab)
        document_term = self.document_regularizer_weight * flops(
            documents, self.document_regularizer_threshold
        )
        query_term = ops.zeros((), "float32")
        if self.query_regularizer_weight is not None and not self.use_document_regularizer_only:
            query_term = self.query_regularizer_weight * flops(
                y_pred[:, 0, :], self.query_regularizer_threshold
            )
        return document_term, query_term

    def call(self, y_true, y_pred):
        document_term, query_term = self.regularizers(y_pred)
        ranking = ops.cast(self.loss.call(y_true, y_pred), "float32")  # (batch,) or scalar
        return ranking + document_term + query_term

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "loss": keras.losses.serialize(self.loss),
                "document_regularizer_weight": self.document_regularizer_weight,
                "query_regularizer_weight": self.query_regularizer_weight,
                "document_regularizer_threshold": self.document_regularizer_threshold,
                "query_regularizer_threshold": self.query_regularizer_threshold,
                "use_document_regularizer_only": self.use_document_regularizer_only,
            }
        )
        return config


@keras.saving.register_keras_serializable(package="kbert")
class ActiveDimensions(keras.metrics.Metric):
    """Mean number of non-zero weights per text: of the queries, the documents, or all.

    Args:
        columns: `"query"` (column 0), `"document"` (the other columns) or `"all"`. On
            `(batch, vocabulary_size)` predictions every row counts. Defaults to `"all"`.
        name: str. Defaults to `"active_dims"`.

    Example:
    >>> metric = ActiveDimensions(columns="document")
    >>> metric.update_state(None, np.array([[[1.0, 0.0, 0.0], [1.0, 2.0, 0.0]]]))
    >>> float(metric.result())  # the one document has two active dimensions
    2.0
    """

    _COLUMNS = ("query", "document", "all")

    def __init__(self, columns="all", name="active_dims", **kwargs):
        super().__init__(name=name, **kwargs)
        if columns not in self._COLUMNS:
            raise ValueError(
                f"`columns` must be one of {list(self._COLUMNS)}. Received: columns={columns!r}"
            )
        self.columns = columns
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_pred = ops.convert_to_tensor(y_pred)
        if len(y_pred.shape) == 3:
            if self.columns == "query":
                y_pred = y_pred[:, :1, :]
            elif self.columns == "document":
                y_pred = y_pred[:, 1:, :]
        active = ops.sum(ops.cast(y_pred != 0, "float32"), axis=-1)  # (batch[, columns])
        self.total.assign_add(ops.sum(active))
        self.count.assign_add(ops.cast(ops.size(active), "float32"))

    def result(self):
        return ops.divide_no_nan(self.total, self.count)

    def reset_state(self):
        self.total.assign(0.0)
        self.count.assign(0.0)

    def get_config(self):
        config = super().get_config()
        config["columns"] = self.columns
        return config
