"""Contrastive losses for sentence embeddings, as Keras losses (every backend).

They take `y_pred` of shape `(batch_size, columns, dim)`: the embeddings of each example's
texts, as `kbert.models.BertTextEmbedder` returns them during `fit` on text columns
(`(anchor, positive[, negative...])`, or the two texts of a scored pair). The formulas are
those of sentence-transformers' losses of the same names:

- `MultipleNegativesRankingLoss`: in-batch negatives (InfoNCE) on cosine similarity x scale;
- `CoSENTLoss`: ranking of scored pairs by cosine similarity;
- `MatryoshkaLoss`: a loss summed over prefixes of the embedding (Matryoshka dimensions).

The reranking losses at the end of the module (`BinaryCrossEntropyLoss`,
`RerankingMultipleNegativesLoss`, `LambdaLoss`) take a `kbert.models.BertCrossEncoder`'s
logits instead, as sentence-transformers' cross-encoder losses of the same names.

Each returns one scalar per batch (the mean over anchors, where the loss has one term per
anchor). `y_true` is unused by the ranking loss (Keras needs a target: the embedder passes
zeros) and holds the scores of `CoSENTLoss`.
"""

import math

import keras
from keras import ops


def _l2_normalize(x):
    return x / ops.maximum(ops.sqrt(ops.sum(ops.square(x), axis=-1, keepdims=True)), 1e-12)


def _check_columns(y_pred, minimum, name):
    if len(y_pred.shape) != 3 or (y_pred.shape[1] is not None and y_pred.shape[1] < minimum):
        raise ValueError(
            f"{name} expects embeddings (batch_size, columns >= {minimum}, dim): one vector per "
            f"text column. Received shape {tuple(y_pred.shape)}"
        )


def _check_scale(scale):
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise ValueError(f"`scale` must be a positive number. Received: scale={scale!r}")
    return float(scale)


@keras.saving.register_keras_serializable(package="kbert")
class MultipleNegativesRankingLoss(keras.losses.Loss):
    """In-batch negatives ranking loss (sentence-transformers' MultipleNegativesRankingLoss).

    For anchors `a_i` and candidates - every positive `p_j` of the batch, then every hard
    negative `n_jk` - the logits are `scale * cos(a_i, candidate)` and the loss is the cross
    entropy of picking `p_i`, averaged over anchors. With `symmetric=True` it is
    `mean_i[(logsumexp_j s(a_i, c_j) + logsumexp_j s(a_j, p_i)) / 2 - s(a_i, p_i)]`, the
    "per direction" average of the anchor->candidate and positive->anchor directions
    (sentence-transformers' MultipleNegativesSymmetricRankingLoss).

    Args:
        scale: float. Inverse temperature. Defaults to `20.0`.
        symmetric: bool. Add the positive -> anchor direction. Defaults to `False`.
        similarity: `"cosine"` or `"dot"`. Defaults to `"cosine"`.

    Call arguments:
        y_true: ignored (any array with one row per example).
        y_pred: `(batch_size, columns, dim)`: anchor, positive, then hard negatives.

    Example:
    >>> loss = MultipleNegativesRankingLoss()
    >>> pairs = np.array([[[1.0, 0.0], [1.0, 0.0]], [[0.0, 1.0], [0.0, 1.0]]])
    >>> round(float(loss(np.zeros(2), pairs)), 4)  # each anchor is nearest its own positive
    0.0
    >>> swapped = np.array([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [1.0, 0.0]]])
    >>> round(float(loss(np.zeros(2), swapped)), 4)  # nearest the other positive: about `scale`
    20.0

    Reference: Henderson et al., 2017, "Efficient Natural Language Response Suggestion for
    Smart Reply" (arXiv 1705.00652).
    """

    def __init__(self, scale=20.0, symmetric=False, similarity="cosine", name="mnrl", **kwargs):
        super().__init__(name=name, **kwargs)
        self.scale = _check_scale(scale)
        self.symmetric = bool(symmetric)
        if similarity not in ("cosine", "dot"):
            raise ValueError(f"`similarity` must be 'cosine' or 'dot'. Received: {similarity!r}")
        self.similarity = similarity

    def call(self, y_true, y_pred):
        _check_columns(y_pred, 2, type(self).__name__)
        y_pred = ops.cast(y_pred, "float32")
        if self.similarity == "cosine":
            y_pred = _l2_normalize(y_pred)
        anchors = y_pred[:, 0, :]  # (batch, dim)
        batch = ops.shape(anchors)[0]
        # Candidates: all positives, then each column of hard negatives.
        candidates = ops.reshape(
            ops.transpose(y_pred[:, 1:, :], (1, 0, 2)), (-1, ops.shape(y_pred)[-1])
        )  # ((columns - 1) * batch, dim)
        scores = self.scale * ops.matmul(anchors, ops.transpose(candidates))  # (batch, cands)
        positive = self.scale * ops.sum(anchors * y_pred[:, 1, :], axis=-1)  # (batch,)
        forward = ops.logsumexp(scores, axis=1)
        if not self.symmetric:
            return forward - positive
        backward_scores = scores[:, :batch]  # s(a_i, p_j); column j: positive j vs anchors
        backward = ops.logsumexp(backward_scores, axis=0)
        return (forward + backward) / 2 - positive

    def get_config(self):
        config = super().get_config()
        config.update(
            {"scale": self.scale, "symmetric": self.symmetric, "similarity": self.similarity}
        )
        return config


@keras.saving.register_keras_serializable(package="kbert")
class CoSENTLoss(keras.losses.Loss):
    """CoSENT ranking loss for scored pairs (sentence-transformers' CoSENTLoss).

    With `s_i = scale * cos(u_i, v_i)` for pairs of texts `(u_i, v_i)` with scores `y_i`:
    `log(1 + sum over (i, j) with y_i < y_j of exp(s_i - s_j))`: every pair ranked below
    another by its score should have a lower similarity.

    Args:
        scale: float. Defaults to `20.0`.

    Call arguments:
        y_true: `(batch_size,)` scores (any scale: only their order matters).
        y_pred: `(batch_size, 2, dim)`: the two texts of each pair.

    Reference: Su Jianlin, 2022, "CoSENT" (https://kexue.fm/archives/8847).
    """

    def __init__(self, scale=20.0, name="cosent", **kwargs):
        super().__init__(name=name, **kwargs)
        self.scale = _check_scale(scale)

    def call(self, y_true, y_pred):
        _check_columns(y_pred, 2, type(self).__name__)
        y_pred = _l2_normalize(ops.cast(y_pred, "float32"))
        scores = self.scale * ops.sum(y_pred[:, 0, :] * y_pred[:, 1, :], axis=-1)  # (batch,)
        labels = ops.reshape(ops.cast(y_true, "float32"), (-1,))
        differences = scores[:, None] - scores[None, :]  # s_i - s_j
        ranked = labels[:, None] < labels[None, :]  # y_i < y_j
        differences = ops.where(ranked, differences, -1e12)
        flat = ops.concatenate([ops.zeros((1,), "float32"), ops.reshape(differences, (-1,))], 0)
        return ops.logsumexp(flat)

    def get_config(self):
        config = super().get_config()
        config["scale"] = self.scale
        return config


@keras.saving.register_keras_serializable(package="kbert")
class MatryoshkaLoss(keras.losses.Loss):
    """A loss applied to prefixes of the embedding and summed (Matryoshka representations).

    `sum_k weight_k * loss(y_true, normalize(y_pred[..., :dim_k]))`, as sentence-transformers'
    MatryoshkaLoss: each prefix is L2-normalised before the inner loss sees it.

    Args:
        loss: a kbert loss (`MultipleNegativesRankingLoss`, `CoSENTLoss`) or its config.
        dimensions: list of int. Embedding prefixes to train, e.g. `[384, 256, 128, 64]`.
        weights: list of float or `None` (all 1). Defaults to `None`.

    Reference: Kusupati et al., 2022, "Matryoshka Representation Learning"
    (arXiv 2205.13147).
    """

    def __init__(self, loss, dimensions, weights=None, name="matryoshka", **kwargs):
        super().__init__(name=name, **kwargs)
        if isinstance(loss, dict):
            loss = keras.losses.deserialize(loss)
        if not isinstance(loss, keras.losses.Loss):
            raise ValueError(f"`loss` must be a Keras loss. Received: {loss!r}")
        dimensions = list(dimensions or [])
        if not dimensions or any(
            isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in dimensions
        ):
            raise ValueError(
                "`dimensions` must be a non-empty list of positive integers. "
                f"Received: {dimensions!r}"
            )
        weights = [1.0] * len(dimensions) if weights is None else [float(w) for w in weights]
        if len(weights) != len(dimensions):
            raise ValueError(
                f"`weights` must have one entry per dimension ({len(dimensions)}). "
                f"Received: {weights!r}"
            )
        self.loss = loss
        self.dimensions = dimensions
        self.weights = weights

    def call(self, y_true, y_pred):
        size = y_pred.shape[-1]
        too_large = [d for d in self.dimensions if size is not None and d > size]
        if too_large:
            raise ValueError(f"Matryoshka dimensions {too_large} exceed the embedding size {size}.")
        y_pred = ops.cast(y_pred, "float32")
        total = 0.0
        for dimension, weight in zip(self.dimensions, self.weights):
            prefix = _l2_normalize(y_pred[..., :dimension])
            total = total + weight * ops.mean(self.loss.call(y_true, prefix))
        return total

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "loss": keras.losses.serialize(self.loss),
                "dimensions": list(self.dimensions),
                "weights": list(self.weights),
            }
        )
        return config


# ------------------------------------------------------------------ reranking (cross-encoder)
# The losses below train `kbert.models.BertCrossEncoder` and take its logits, not embeddings:
# `(batch_size,)` / `(batch_size, 1)` for scored pairs, `(batch_size, candidates)` for groups
# of documents per query. Their values equal those of sentence-transformers' cross-encoder
# losses of the same names on the same logits.

_RERANKING_ACTIVATIONS = ("sigmoid", "identity", "tanh")


def _check_activation(activation):
    if activation is None:
        return "identity"
    if activation not in _RERANKING_ACTIVATIONS:
        raise ValueError(
            f"`activation` must be one of {list(_RERANKING_ACTIVATIONS)} or None. "
            f"Received: activation={activation!r}"
        )
    return activation


def _activate(x, activation):
    if activation == "sigmoid":
        return ops.sigmoid(x)
    if activation == "tanh":
        return ops.tanh(x)
    return x


def _check_positive(value, name, allow_none=False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"`{name}` must be a positive number. Received: {name}={value!r}")
    return float(value)


@keras.saving.register_keras_serializable(package="kbert")
class BinaryCrossEntropyLoss(keras.losses.Loss):
    """Binary cross-entropy on a reranker's logits (sentence-transformers' cross-encoder
    `BinaryCrossEntropyLoss`, i.e. `torch.nn.BCEWithLogitsLoss(pos_weight=...)`).

    Per pair with logit `x` and target `y` in [0, 1]:
    `pos_weight * y * softplus(-x) + (1 - y) * softplus(x)`, averaged over the batch.

    Args:
        pos_weight: float or `None`. Weight of the positive term (e.g. the ratio of negative
            to positive pairs). Defaults to `None` (1).

    Call arguments:
        y_true: `(batch_size,)` targets in [0, 1].
        y_pred: `(batch_size,)` or `(batch_size, 1)` logits.

    Example:
    >>> loss = BinaryCrossEntropyLoss(pos_weight=4.0)
    >>> round(float(loss(np.array([1.0, 0.0]), np.array([[0.0], [0.0]]))), 4)  # (4 + 1) ln 2 / 2
    1.7329
    """

    def __init__(self, pos_weight=None, name="binary_cross_entropy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.pos_weight = _check_positive(pos_weight, "pos_weight", allow_none=True)

    def call(self, y_true, y_pred):
        logits = ops.reshape(ops.cast(y_pred, "float32"), (-1,))
        targets = ops.reshape(ops.cast(y_true, "float32"), (-1,))
        weight = 1.0 if self.pos_weight is None else self.pos_weight
        return weight * targets * ops.softplus(-logits) + (1.0 - targets) * ops.softplus(logits)

    def get_config(self):
        config = super().get_config()
        config["pos_weight"] = self.pos_weight
        return config


@keras.saving.register_keras_serializable(package="kbert")
class RerankingMultipleNegativesLoss(keras.losses.Loss):
    """In-batch negatives for rerankers (sentence-transformers' cross-encoder
    `MultipleNegativesRankingLoss`).

    Each query is scored with its positive (column 0), `num_negatives` documents drawn from
    the other rows of the batch (their positives and hard negatives) and its own hard
    negatives; the loss is the cross entropy of picking the positive among
    `scale * activation(logits)`. `BertCrossEncoder.fit` on text columns `(queries,
    positives[, negatives...])` reads `num_negatives` from this loss and builds those groups.

    Args:
        num_negatives: int or `None`. In-batch negatives per query, drawn at random without
            replacement; `None` (or more than there are) takes all of them. Defaults to `4`.
        scale: float or `None`. Multiplies the activated logits (`None`: 1). Defaults to `10.0`.
        activation: `"sigmoid"`, `"identity"`, `"tanh"` or `None` (identity). Defaults to
            `"sigmoid"`.

    Call arguments:
        y_true: ignored (one row per query).
        y_pred: `(batch_size, candidates)` logits, the positive first.

    Example:
    >>> loss = RerankingMultipleNegativesLoss(activation=None, scale=1.0)
    >>> round(float(loss(np.zeros(1), np.array([[0.0, 0.0]]))), 4)  # ln 2
    0.6931

    Reference: Henderson et al., 2017, section 4.4 (arXiv 1705.00652).
    """

    def __init__(
        self,
        num_negatives=4,
        scale=10.0,
        activation="sigmoid",
        name="reranking_mnrl",
        **kwargs,
    ):
        super().__init__(name=name, **kwargs)
        if num_negatives is not None and (
            isinstance(num_negatives, bool)
            or not isinstance(num_negatives, int)
            or num_negatives < 1
        ):
            raise ValueError(
                "`num_negatives` must be a positive integer or None. "
                f"Received: num_negatives={num_negatives!r}"
            )
        self.num_negatives = num_negatives
        self.scale = None if not scale else _check_positive(scale, "scale")
        self.activation = _check_activation(activation)

    def call(self, y_true, y_pred):
        if len(y_pred.shape) != 2:
            raise ValueError(
                f"{type(self).__name__} expects logits (batch_size, candidates), the positive "
                f"first. Received shape {tuple(y_pred.shape)}"
            )
        logits = _activate(ops.cast(y_pred, "float32"), self.activation)
        if self.scale is not None:
            logits = logits * self.scale
        return ops.logsumexp(logits, axis=1) - logits[:, 0]

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_negatives": self.num_negatives,
                "scale": self.scale,
                "activation": self.activation,
            }
        )
        return config


@keras.saving.register_keras_serializable(package="kbert")
class LambdaLoss(keras.losses.Loss):
    """Listwise LambdaLoss with the NDCG-Loss2++ weighting (sentence-transformers'
    cross-encoder `LambdaLoss` with `NDCGLoss2PPScheme`).

    For each query the documents are sorted by logit; every pair `(i, j)` of sorted
    positions with `label_i > label_j` (and one of them in the top `k`) adds
    `-w_ij * log2(sigmoid(sigma * (s_i - s_j)))`, where `w_ij = mu * w2_ij + wL_ij`:
    NDCG-Loss2's `|1/D(|i-j|) - 1/D(|i-j|+1)| * |G_i - G_j|` plus LambdaRank's
    `|1/D(i) - 1/D(j)| * |G_i - G_j|`, with `D(r) = log2(1 + r)` and gains
    `G = (2^label - 1) / maxDCG@k`. The loss is the mean over all such pairs of the batch.
    Padded documents (label `-inf`, as `BertCrossEncoder.fit` pads rows of fewer documents)
    take no part.

    Args:
        k: int or `None`. NDCG cut-off (`None`: all documents). Defaults to `None`.
        sigma: float. Score-difference scale in the sigmoid. Defaults to `1.0`.
        mu: float. Weight of the NDCG-Loss2 term. Defaults to `10.0`.
        eps: float. Lower bound of maxDCG. Defaults to `1e-10`.
        reduction_log: `"binary"` (log2) or `"natural"`. Defaults to `"binary"`.
        activation: `"sigmoid"`, `"identity"`, `"tanh"` or `None`. Defaults to `None`.

    Call arguments:
        y_true: `(batch_size, documents)` relevance labels, `-inf` on padding.
        y_pred: `(batch_size, documents)` logits.

    Example:
    >>> loss = LambdaLoss()
    >>> labels = np.array([[1.0, 0.0]])
    >>> bool(loss(labels, np.array([[2.0, -2.0]])) < loss(labels, np.array([[-2.0, 2.0]])))
    True

    Reference: Wang et al., 2018, "The LambdaLoss Framework for Ranking Metric
    Optimization" (CIKM 2018).
    """

    def __init__(
        self,
        k=None,
        sigma=1.0,
        mu=10.0,
        eps=1e-10,
        reduction_log="binary",
        activation=None,
        name="lambda_loss",
        **kwargs,
    ):
        super().__init__(name=name, **kwargs)
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"`k` must be a positive integer or None. Received: k={k!r}")
        if reduction_log not in ("binary", "natural"):
            raise ValueError(
                f"`reduction_log` must be 'binary' or 'natural'. Received: {reduction_log!r}"
            )
        self.k = k
        self.sigma = _check_positive(sigma, "sigma")
        self.mu = float(mu)
        self.eps = _check_positive(eps, "eps")
        self.reduction_log = reduction_log
        self.activation = _check_activation(activation)

    def call(self, y_true, y_pred):
        if len(y_pred.shape) != 2:
            raise ValueError(
                f"{type(self).__name__} expects logits (batch_size, documents). Received shape "
                f"{tuple(y_pred.shape)}"
            )
        labels = ops.cast(y_true, "float32")  # (batch, docs), -inf on padding
        valid = ops.isfinite(labels)
        logits = _activate(ops.cast(y_pred, "float32"), self.activation)
        logits = ops.where(valid, logits, -1e16)
        documents = ops.shape(logits)[1]
        order = ops.argsort(-logits, axis=-1)
        logits_sorted = ops.take_along_axis(logits, order, axis=-1)
        labels_sorted = ops.flip(ops.sort(labels, axis=-1), axis=-1)  # best first
        true_by_pred = ops.take_along_axis(labels, order, axis=-1)
        # Pairs (i, j) of sorted positions, both real, i more relevant than j.
        finite_pred = ops.isfinite(true_by_pred)
        both = ops.logical_and(finite_pred[:, :, None], finite_pred[:, None, :])
        safe_true = ops.where(finite_pred, true_by_pred, 0.0)
        pairs = ops.logical_and(both, safe_true[:, :, None] - safe_true[:, None, :] > 0)
        positions = ops.arange(documents)
        # The top k positions (all when k is None), as a mask: no slice of unknown length.
        in_top = positions >= 0 if self.k is None else positions < self.k
        pairs = ops.logical_and(pairs, ops.logical_or(in_top[:, None], in_top[None, :])[None])
        # Gains and discounts.
        safe_true = ops.maximum(safe_true, 0.0)
        ideal = ops.maximum(ops.where(ops.isfinite(labels_sorted), labels_sorted, 0.0), 0.0)
        discount = ops.log2(1.0 + ops.cast(positions + 1, "float32"))  # (docs,)
        ideal_gains = (ops.power(2.0, ideal) - 1.0) / discount  # (batch, docs)
        ideal_dcg = ops.sum(ops.where(in_top[None, :], ideal_gains, 0.0), axis=-1)
        gain = (ops.power(2.0, safe_true) - 1.0) / ops.maximum(ideal_dcg, self.eps)[:, None]
        gain_gap = ops.abs(gain[:, :, None] - gain[:, None, :])  # (batch, docs, docs)
        inverse = 1.0 / discount
        # NDCG-Loss2: |1/D(|i-j|) - 1/D(|i-j|+1)| (0 on the diagonal), with D(0) unused.
        gap = ops.abs(positions[:, None] - positions[None, :])
        near = ops.take(inverse, ops.maximum(gap - 1, 0))
        far = ops.take(inverse, gap)
        ndcg2 = ops.where(gap > 0, ops.abs(near - far), 0.0)
        lambda_rank = ops.abs(inverse[:, None] - inverse[None, :])
        weights = (self.mu * ndcg2 + lambda_rank)[None] * gain_gap
        differences = ops.clip(logits_sorted[:, :, None] - logits_sorted[:, None, :], -1e8, 1e8)
        losses = weights * ops.log_sigmoid(self.sigma * differences)
        if self.reduction_log == "binary":
            losses = losses / math.log(2.0)
        mask = ops.cast(pairs, "float32")
        count = ops.maximum(ops.sum(mask), 1.0)
        return -ops.sum(losses * mask) / count

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "k": self.k,
                "sigma": self.sigma,
                "mu": self.mu,
                "eps": self.eps,
                "reduction_log": self.reduction_log,
                "activation": self.activation,
            }
        )
        return config
