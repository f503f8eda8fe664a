"""Contrastive losses for sentence embeddings, as Keras losses (every backend).

They take `y_pred` of shape `(batch_size, columns, dim)`: the embeddings of each example's
texts, as `kbert.models.BertTextEmbedder` returns them during `fit` on text columns
(`(anchor, positive[, negative...])`, or the two texts of a scored pair). The formulas are
those of sentence-transformers' losses of the same names:

- `MultipleNegativesRankingLoss`: in-batch negatives (InfoNCE) on cosine similarity x scale;
- `CoSENTLoss`: ranking of scored pairs by cosine similarity;
- `MatryoshkaLoss`: a loss summed over prefixes of the embedding (Matryoshka dimensions).

Each returns one scalar per batch (the mean over anchors, where the loss has one term per
anchor). `y_true` is unused by the ranking loss (Keras needs a target: the embedder passes
zeros) and holds the scores of `CoSENTLoss`.
"""

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
