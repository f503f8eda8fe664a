"""Classification metrics: accuracy, F1 and Matthews correlation.

Two forms of each metric:

- plain functions (`accuracy`, `f1_score`, `matthews_corrcoef`) that take
  arrays and return a Python float, for scoring a whole prediction file;
- stateful Keras metrics (`Accuracy`, `F1Score`, `MatthewsCorrelation`) for
  `model.compile(metrics=[...])`. They accumulate a confusion matrix over
  batches, so the value after many batches is the value on the whole data (not
  a mean of per-batch values), on the TensorFlow, JAX and PyTorch backends.

The formulas follow scikit-learn's definitions (scikit-learn is not required).
"""

import keras
import numpy as np
from keras import ops

_F1_AVERAGES = ("binary", "macro")


# ---------------------------------------------------------------------------
# Plain functions (numpy in, float out).
# ---------------------------------------------------------------------------


def _as_label_arrays(y_true, y_pred, name):
    """Returns 1-D label arrays; 2-D float `y_pred` scores are arg-maxed."""
    y_true = np.asarray(y_true)
    y_pred = np.asarray(y_pred)
    if (
        y_pred.ndim == y_true.ndim + 1
        and y_pred.ndim >= 2
        and np.issubdtype(y_pred.dtype, np.floating)
    ):
        y_pred = np.argmax(y_pred, axis=-1)
    if y_true.shape != y_pred.shape:
        raise ValueError(
            f"`{name}` needs `y_true` and `y_pred` of the same shape (or "
            "`y_pred` with one extra trailing axis of class scores). Received: "
            f"y_true.shape={y_true.shape}, y_pred.shape={y_pred.shape}"
        )
    if y_true.size == 0:
        raise ValueError(f"`{name}` needs at least one example. Received 0.")
    return y_true.reshape(-1), y_pred.reshape(-1)


def _confusion(y_true, y_pred):
    """Confusion matrix (rows: true, columns: predicted) over all labels."""
    labels, codes = np.unique(np.concatenate([y_true, y_pred]), return_inverse=True)
    true_codes, pred_codes = codes[: len(y_true)], codes[len(y_true) :]
    matrix = np.zeros((len(labels), len(labels)), dtype=np.float64)
    np.add.at(matrix, (true_codes, pred_codes), 1.0)
    return matrix


def accuracy(y_true, y_pred):
    """Fraction of examples whose predicted label equals the true label.

    Args:
        y_true: array-like of labels, any shape.
        y_pred: array-like of predicted labels with the shape of `y_true`, or
            float class scores with one extra trailing axis (arg-maxed).

    Returns:
        float in [0, 1].

    Example:

    >>> accuracy([0, 1, 1, 0], [0, 1, 0, 0])
    0.75
    >>> accuracy([1, 0], [[0.2, 0.8], [0.9, 0.1]])
    1.0
    """
    y_true, y_pred = _as_label_arrays(y_true, y_pred, "accuracy")
    return float(np.mean(y_true == y_pred))


def f1_score(y_true, y_pred, average="binary", pos_label=1, labels=None):
    """F1 score: binary (of the positive class) or macro (mean over classes).

    Matches `sklearn.metrics.f1_score` (with `zero_division=0`): per class,
    `F1 = 2 * TP / (2 * TP + FP + FN)`, and 0 where that is 0 / 0.

    Args:
        y_true: array-like of true labels.
        y_pred: array-like of predicted labels with the shape of `y_true`, or
            float class scores with one extra trailing axis (arg-maxed).
        average: str. `"binary"`: F1 of the class `pos_label` (the data may
            hold at most two distinct labels, as in GLUE's MRPC and QQP).
            `"macro"`: unweighted mean of the per-class F1 over `labels`.
            Defaults to `"binary"`.
        pos_label: the positive class for `average="binary"`. Defaults to 1.
        labels: optional list of the classes to average over for
            `average="macro"`. Defaults to the sorted union of the labels
            found in `y_true` and `y_pred`.

    Returns:
        float in [0, 1].

    Example:

    >>> round(f1_score([0, 1, 1, 0, 1], [0, 1, 0, 1, 1]), 4)
    0.6667
    >>> round(f1_score([0, 1, 2, 2], [0, 2, 2, 1], average="macro"), 4)
    0.5
    """
    if average not in _F1_AVERAGES:
        raise ValueError(f"`average` must be one of {_F1_AVERAGES}. Received: average={average!r}")
    y_true, y_pred = _as_label_arrays(y_true, y_pred, "f1_score")
    if average == "binary":
        present = np.unique(np.concatenate([y_true, y_pred]))
        if len(present) > 2:
            raise ValueError(
                "`average='binary'` needs at most two distinct labels; use "
                f"`average='macro'` for more. Received labels: {present.tolist()}"
            )
        tp = float(np.sum((y_true == pos_label) & (y_pred == pos_label)))
        fp = float(np.sum((y_true != pos_label) & (y_pred == pos_label)))
        fn = float(np.sum((y_true == pos_label) & (y_pred != pos_label)))
        denominator = 2.0 * tp + fp + fn
        return 2.0 * tp / denominator if denominator > 0 else 0.0
    if labels is None:
        labels = np.unique(np.concatenate([y_true, y_pred]))
    if len(labels) == 0:
        raise ValueError(f"`labels` must not be empty. Received: labels={labels}")
    per_class = []
    for label in labels:
        tp = float(np.sum((y_true == label) & (y_pred == label)))
        denominator = float(np.sum(y_true == label) + np.sum(y_pred == label))
        per_class.append(2.0 * tp / denominator if denominator > 0 else 0.0)
    return float(np.mean(per_class))


def _mcc_from_confusion(matrix):
    """Multi-class MCC (Gorodkin's R_K) from a confusion matrix, in numpy."""
    total = matrix.sum()
    if total == 0:
        return 0.0
    p = matrix / total  # normalised: all terms stay <= 1
    true_marginal = p.sum(axis=1)
    pred_marginal = p.sum(axis=0)
    cov_true_pred = np.trace(p) - np.dot(true_marginal, pred_marginal)
    cov_true_true = 1.0 - np.dot(true_marginal, true_marginal)
    cov_pred_pred = 1.0 - np.dot(pred_marginal, pred_marginal)
    denominator = cov_true_true * cov_pred_pred
    if denominator <= 0:
        return 0.0
    return float(cov_true_pred / np.sqrt(denominator))


def matthews_corrcoef(y_true, y_pred):
    """Matthews correlation coefficient (GLUE's CoLA metric).

    For two classes this is
    `(TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN))`; for more classes
    it is the multi-class generalisation used by scikit-learn. Returns 0 when
    the coefficient is undefined (all true or all predicted labels equal).

    Args:
        y_true: array-like of true labels.
        y_pred: array-like of predicted labels with the shape of `y_true`, or
            float class scores with one extra trailing axis (arg-maxed).

    Returns:
        float in [-1, 1].

    Example:

    >>> round(matthews_corrcoef([1, 1, 0, 0, 1], [1, 0, 0, 0, 1]), 4)
    0.6667
    """
    y_true, y_pred = _as_label_arrays(y_true, y_pred, "matthews_corrcoef")
    return _mcc_from_confusion(_confusion(y_true, y_pred))


# ---------------------------------------------------------------------------
# Keras metrics (keras.ops only).
# ---------------------------------------------------------------------------


def _is_integer_dtype(x):
    dtype = keras.backend.standardize_dtype(x.dtype)
    return dtype == "bool" or "int" in dtype


class _ConfusionMatrixMetric(keras.metrics.Metric):
    """Accumulates a `(num_classes, num_classes + 1)` confusion matrix.

    Rows are true classes, columns predicted ones; the last column counts integer predictions
    outside `[0, num_classes)`, which are wrong whatever the label (as the plain functions
    read them: a class of their own). Subclasses compute their value from
    `self.confusion_matrix` in `result()`.
    """

    def __init__(self, num_classes=2, threshold=0.5, name=None, dtype=None):
        super().__init__(name=name, dtype=dtype)
        if not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(
                f"`num_classes` must be an integer >= 2. Received: num_classes={num_classes!r}"
            )
        self.num_classes = num_classes
        self.threshold = threshold
        self.confusion_matrix = self.add_variable(
            shape=(num_classes, num_classes + 1),
            initializer="zeros",
            dtype=self.dtype,
            aggregation="sum",
            name="confusion_matrix",
        )

    def _predicted_labels(self, y_pred):
        """Class ids from `y_pred` (ids, scores, or one binary score)."""
        y_pred = ops.convert_to_tensor(y_pred)
        if _is_integer_dtype(y_pred):
            return ops.cast(y_pred, "int32")
        shape = tuple(y_pred.shape)
        if len(shape) >= 2 and shape[-1] == self.num_classes:
            return ops.cast(ops.argmax(y_pred, axis=-1), "int32")
        if len(shape) >= 2 and shape[-1] == 1:
            y_pred = ops.squeeze(y_pred, axis=-1)
        elif len(shape) >= 2 or self.num_classes != 2:
            raise ValueError(
                f"`{type(self).__name__}` needs float `y_pred` with a last axis "
                f"of num_classes={self.num_classes} class scores, or (for "
                "num_classes=2) one score per example. Received: "
                f"y_pred.shape={shape}"
            )
        return ops.cast(y_pred > self.threshold, "int32")

    def update_state(self, y_true, y_pred, sample_weight=None):
        """Adds a batch to the confusion matrix.

        Args:
            y_true: integer class ids, shape `(batch_size,)`,
                `(batch_size, 1)` or `(batch_size, sequence_length)`. Ids
                outside `[0, num_classes)` (e.g. -100 padding) are skipped.
            y_pred: class scores (logits or probabilities) with a last axis of
                size `num_classes` (arg-maxed); or integer class ids with the
                shape of `y_true`; or, for `num_classes=2`, one float score per
                example, thresholded at `threshold`.
            sample_weight: optional weights broadcastable to `y_true`.
        """
        y_true = ops.convert_to_tensor(y_true)
        predicted = ops.reshape(self._predicted_labels(y_pred), (-1,))
        true = ops.reshape(ops.cast(y_true, "int32"), (-1,))
        valid = ops.cast(ops.logical_and(true >= 0, true < self.num_classes), self.dtype)
        if sample_weight is not None:
            weight = ops.cast(ops.convert_to_tensor(sample_weight), self.dtype)
            true_shape = ops.shape(y_true)
            while len(weight.shape) > len(true_shape) and weight.shape[-1] == 1:
                weight = ops.squeeze(weight, axis=-1)
            while len(weight.shape) < len(true_shape):
                weight = ops.expand_dims(weight, axis=-1)
            weight = ops.reshape(ops.broadcast_to(weight, true_shape), (-1,))
            valid = valid * weight
        true_one_hot = ops.one_hot(
            ops.where(valid != 0, true, 0), self.num_classes, dtype=self.dtype
        )  # (n, num_classes)
        # Out-of-range predicted ids go to the extra last column (torch's one_hot would raise
        # on them as they are).
        in_range = ops.logical_and(predicted >= 0, predicted < self.num_classes)
        predicted = ops.where(in_range, predicted, self.num_classes)
        pred_one_hot = ops.one_hot(predicted, self.num_classes + 1, dtype=self.dtype)
        batch_matrix = ops.matmul(
            ops.transpose(true_one_hot * ops.expand_dims(valid, -1)), pred_one_hot
        )  # (num_classes, num_classes + 1): rows true, columns predicted
        self.confusion_matrix.assign_add(batch_matrix)

    def get_config(self):
        config = super().get_config()
        config.update({"num_classes": self.num_classes, "threshold": self.threshold})
        return config


@keras.saving.register_keras_serializable(package="kbert")
class Accuracy(_ConfusionMatrixMetric):
    """Classification accuracy from class scores or a single binary score.

    Unlike `keras.metrics.Accuracy` (which compares `y_pred` with `y_true`
    element-wise), this takes logits or probabilities and arg-maxes them, or
    thresholds one score per example when `num_classes=2`. Labels outside
    `[0, num_classes)` are skipped, so token-level accuracy with -100 padding
    works; an integer prediction outside `[0, num_classes)` counts as wrong.

    Args:
        num_classes: int. Number of classes (>= 2). Defaults to 2.
        threshold: float. For `num_classes=2` with one score per example, the
            score above which the prediction is class 1; use 0.0 for logits.
            Defaults to 0.5.
        name: str. Metric name. Defaults to `"accuracy"`.
        dtype: dtype of the metric state. Defaults to float32.

    Example:

    >>> metric = Accuracy(num_classes=3)
    >>> metric.update_state([0, 2], [[2.0, 0.1, 0.3], [0.1, 0.2, 0.0]])
    >>> float(metric.result())
    0.5
    """

    def __init__(self, num_classes=2, threshold=0.5, name="accuracy", dtype=None):
        super().__init__(num_classes=num_classes, threshold=threshold, name=name, dtype=dtype)

    def result(self):
        matrix = ops.convert_to_tensor(self.confusion_matrix)
        return ops.divide_no_nan(ops.sum(ops.diagonal(matrix)), ops.sum(matrix))


@keras.saving.register_keras_serializable(package="kbert")
class F1Score(_ConfusionMatrixMetric):
    """F1 score accumulated over batches (binary or macro average).

    Equals `kbert.metrics.f1_score` on all the examples seen since the last
    `reset_state()`. For `average="macro"`, classes that appear neither in the
    labels nor in the predictions are left out of the mean, as in
    scikit-learn.

    Unlike `keras.metrics.F1Score`, this takes integer labels (not one-hot)
    and logits or probabilities (arg-maxed, no threshold tuning).

    Args:
        num_classes: int. Number of classes (>= 2). Defaults to 2.
        average: str. `"binary"` (F1 of class `pos_label`) or `"macro"`.
            Defaults to `"binary"`.
        pos_label: int. Positive class for `average="binary"`. Defaults to 1.
        threshold: float. As in `kbert.metrics.Accuracy`. Defaults to 0.5.
        name: str. Metric name. Defaults to `"f1"`.
        dtype: dtype of the metric state. Defaults to float32.

    Example:

    >>> metric = F1Score()
    >>> metric.update_state([1, 1, 0], [[0.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    >>> round(float(metric.result()), 4)
    0.6667
    """

    def __init__(
        self,
        num_classes=2,
        average="binary",
        pos_label=1,
        threshold=0.5,
        name="f1",
        dtype=None,
    ):
        if average not in _F1_AVERAGES:
            raise ValueError(
                f"`average` must be one of {_F1_AVERAGES}. Received: average={average!r}"
            )
        if not isinstance(pos_label, int) or not 0 <= pos_label < num_classes:
            raise ValueError(
                f"`pos_label` must be a class id in [0, {num_classes}). "
                f"Received: pos_label={pos_label!r}"
            )
        super().__init__(num_classes=num_classes, threshold=threshold, name=name, dtype=dtype)
        self.average = average
        self.pos_label = pos_label

    def result(self):
        matrix = ops.convert_to_tensor(self.confusion_matrix)
        true_positives = ops.diagonal(matrix)
        # Predicted (the class columns) plus true counts of each class.
        denominator = ops.sum(matrix, axis=0)[: self.num_classes] + ops.sum(matrix, axis=1)
        per_class = ops.divide_no_nan(2.0 * true_positives, denominator)
        if self.average == "binary":
            return per_class[self.pos_label]
        present = ops.cast(denominator > 0, self.dtype)
        # Out-of-range predictions are one more class, with F1 0, in the mean.
        out_of_range = ops.cast(ops.sum(matrix[:, self.num_classes]) > 0, self.dtype)
        return ops.divide_no_nan(ops.sum(per_class * present), ops.sum(present) + out_of_range)

    def get_config(self):
        config = super().get_config()
        config.update({"average": self.average, "pos_label": self.pos_label})
        return config


@keras.saving.register_keras_serializable(package="kbert")
class MatthewsCorrelation(_ConfusionMatrixMetric):
    """Matthews correlation coefficient accumulated over batches (CoLA).

    Equals `kbert.metrics.matthews_corrcoef` on all the examples seen since
    the last `reset_state()` (0 when undefined).

    Args:
        num_classes: int. Number of classes (>= 2). Defaults to 2.
        threshold: float. As in `kbert.metrics.Accuracy`. Defaults to 0.5.
        name: str. Metric name. Defaults to `"matthews_correlation"`.
        dtype: dtype of the metric state. Defaults to float32.

    Example:

    >>> metric = MatthewsCorrelation()
    >>> metric.update_state([1, 1, 0, 0, 1], [1, 0, 0, 0, 1])
    >>> round(float(metric.result()), 4)
    0.6667
    """

    def __init__(self, num_classes=2, threshold=0.5, name="matthews_correlation", dtype=None):
        super().__init__(num_classes=num_classes, threshold=threshold, name=name, dtype=dtype)

    def result(self):
        matrix = ops.convert_to_tensor(self.confusion_matrix)
        p = ops.divide_no_nan(matrix, ops.sum(matrix))  # normalised, terms <= 1
        true_marginal = ops.sum(p, axis=1)
        pred_marginal = ops.sum(p, axis=0)  # The last class is never a true one.
        total = ops.sum(p)  # 1, or 0 before any update
        cov_true_pred = ops.sum(ops.diagonal(p)) * total - ops.sum(
            true_marginal * pred_marginal[: self.num_classes]
        )
        cov_true_true = total * total - ops.sum(true_marginal * true_marginal)
        cov_pred_pred = total * total - ops.sum(pred_marginal * pred_marginal)
        denominator = ops.sqrt(ops.maximum(cov_true_true * cov_pred_pred, 0.0))
        return ops.divide_no_nan(cov_true_pred, denominator)
