"""Correlation metrics for regression tasks (GLUE's STS-B).

- `pearson_corr`, `spearman_corr`: plain functions, numpy in, float out
  (same values as `scipy.stats.pearsonr` / `spearmanr`, except that an
  undefined correlation - one input constant - is returned as 0.0 where scipy
  returns nan).
- `PearsonCorrelation`: a Keras metric that keeps running weighted means and
  co-moments (merged batch by batch with Chan et al.'s pairwise update), so its
  value over many batches equals the correlation over all examples, not the
  mean of per-batch correlations (which is what `keras.metrics.
  PearsonCorrelation` reports).
- `SpearmanCorrelation`: a Keras metric that stores the examples themselves
  in a fixed-size buffer (`capacity`) and ranks them in `result()`, because
  rank correlation has no small sufficient statistics.
"""

import keras
import numpy as np
from keras import ops


def _as_pair(x, y, name):
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    if x.shape != y.shape:
        raise ValueError(
            f"`{name}` needs two inputs with the same number of values. "
            f"Received: {x.size} and {y.size} values"
        )
    if x.size < 2:
        raise ValueError(f"`{name}` needs at least 2 values per input. Received: {x.size}")
    if np.isnan(x).any() or np.isnan(y).any():
        raise ValueError(f"`{name}` received NaN values; expected finite numbers.")
    return x, y


def _pearson_float64(x, y):
    dx = x - x.mean()
    dy = y - y.mean()
    denominator = np.sqrt(np.dot(dx, dx) * np.dot(dy, dy))
    if denominator == 0:
        return 0.0
    return float(np.clip(np.dot(dx, dy) / denominator, -1.0, 1.0))


def average_ranks(x):
    """1-based ranks of `x`, ties sharing the mean of their ranks.

    The same as `scipy.stats.rankdata(x, method="average")` for 1-D input.

    Args:
        x: 1-D array-like of numbers.

    Returns:
        float64 numpy array of the shape of `x`.

    Example:

    >>> average_ranks([10, 30, 20, 20]).tolist()
    [1.0, 4.0, 2.5, 2.5]
    """
    x = np.asarray(x).reshape(-1)
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    ranks_before = np.cumsum(counts) - counts  # values strictly smaller
    return (ranks_before + (counts + 1) / 2.0)[inverse].astype(np.float64)


def pearson_corr(x, y):
    """Pearson correlation coefficient of two equally long arrays.

    Args:
        x: array-like of numbers (e.g. STS-B gold scores).
        y: array-like of numbers with as many values as `x` (predictions).

    Returns:
        float in [-1, 1]; 0.0 when one input is constant.

    Example:

    >>> round(pearson_corr([1.0, 2.0, 3.0, 4.0], [1.0, 2.5, 2.9, 4.2]), 4)
    0.9796
    """
    x, y = _as_pair(x, y, "pearson_corr")
    return _pearson_float64(x, y)


def spearman_corr(x, y):
    """Spearman rank correlation: Pearson correlation of the average ranks.

    Args:
        x: array-like of numbers.
        y: array-like of numbers with as many values as `x`.

    Returns:
        float in [-1, 1]; 0.0 when one input is constant.

    Example:

    >>> spearman_corr([1.0, 2.0, 3.0, 4.0], [1.0, 20.0, 300.0, 4000.0])
    1.0
    """
    x, y = _as_pair(x, y, "spearman_corr")
    return _pearson_float64(average_ranks(x), average_ranks(y))


def _flat_pair(y_true, y_pred, dtype, name):
    y_true = ops.reshape(ops.cast(ops.convert_to_tensor(y_true), dtype), (-1,))
    y_pred = ops.reshape(ops.cast(ops.convert_to_tensor(y_pred), dtype), (-1,))
    if (
        y_true.shape[0] is not None
        and y_pred.shape[0] is not None
        and y_true.shape[0] != y_pred.shape[0]
    ):
        raise ValueError(
            f"`{name}` needs one prediction per label. Received "
            f"{y_true.shape[0]} labels and {y_pred.shape[0]} predictions"
        )
    return y_true, y_pred


@keras.saving.register_keras_serializable(package="kbert")
class PearsonCorrelation(keras.metrics.Metric):
    """Pearson correlation between labels and predictions, over all batches.

    The state is the total weight, the two weighted means and the centred
    second moments, merged batch by batch (Chan, Golub and LeVeque, 1979), so
    the result equals `kbert.metrics.pearson_corr` on every example seen since
    `reset_state()` and stays accurate when values have a large offset.
    The state is not a sum, so it must not be summed across tf.distribute
    replicas; under JAX's `keras.distribution` the global batch is reduced
    in one program and the value is correct.

    Args:
        name: str. Metric name. Defaults to `"pearson_correlation"`.
        dtype: dtype of the metric state. Defaults to float32.

    Example:

    >>> metric = PearsonCorrelation()
    >>> metric.update_state([1.0, 2.0], [1.0, 2.5])
    >>> metric.update_state([3.0, 4.0], [2.9, 4.2])
    >>> round(float(metric.result()), 4)
    0.9796
    """

    def __init__(self, name="pearson_correlation", dtype=None):
        super().__init__(name=name, dtype=dtype)
        self.total_weight = self.add_variable(
            shape=(), initializer="zeros", dtype=self.dtype, name="total_weight"
        )
        self.mean_true = self.add_variable(
            shape=(), initializer="zeros", dtype=self.dtype, name="mean_true"
        )
        self.mean_pred = self.add_variable(
            shape=(), initializer="zeros", dtype=self.dtype, name="mean_pred"
        )
        self.m2_true = self.add_variable(
            shape=(), initializer="zeros", dtype=self.dtype, name="m2_true"
        )
        self.m2_pred = self.add_variable(
            shape=(), initializer="zeros", dtype=self.dtype, name="m2_pred"
        )
        self.comoment = self.add_variable(
            shape=(), initializer="zeros", dtype=self.dtype, name="comoment"
        )

    def update_state(self, y_true, y_pred, sample_weight=None):
        """Adds a batch.

        Args:
            y_true: labels, shape `(batch_size,)` or `(batch_size, 1)`.
            y_pred: predictions with as many values as `y_true`.
            sample_weight: optional weights with as many values as `y_true`.
        """
        y_true, y_pred = _flat_pair(y_true, y_pred, self.dtype, self.name)
        if sample_weight is None:
            weight = ops.ones_like(y_true)
        else:
            weight = ops.reshape(ops.cast(ops.convert_to_tensor(sample_weight), self.dtype), (-1,))
            weight = ops.broadcast_to(weight, ops.shape(y_true))
        batch_weight = ops.sum(weight)
        batch_mean_true = ops.divide_no_nan(ops.sum(weight * y_true), batch_weight)
        batch_mean_pred = ops.divide_no_nan(ops.sum(weight * y_pred), batch_weight)
        centred_true = y_true - batch_mean_true  # (batch,)
        centred_pred = y_pred - batch_mean_pred  # (batch,)
        batch_m2_true = ops.sum(weight * centred_true * centred_true)
        batch_m2_pred = ops.sum(weight * centred_pred * centred_pred)
        batch_comoment = ops.sum(weight * centred_true * centred_pred)

        old_weight = self.total_weight
        new_weight = old_weight + batch_weight
        batch_fraction = ops.divide_no_nan(batch_weight, new_weight)
        delta_true = batch_mean_true - self.mean_true
        delta_pred = batch_mean_pred - self.mean_pred
        cross = old_weight * batch_fraction  # = old * batch / new
        self.m2_true.assign(self.m2_true + batch_m2_true + delta_true**2 * cross)
        self.m2_pred.assign(self.m2_pred + batch_m2_pred + delta_pred**2 * cross)
        self.comoment.assign(self.comoment + batch_comoment + delta_true * delta_pred * cross)
        self.mean_true.assign(self.mean_true + delta_true * batch_fraction)
        self.mean_pred.assign(self.mean_pred + delta_pred * batch_fraction)
        self.total_weight.assign(new_weight)

    def result(self):
        denominator = ops.sqrt(self.m2_true * self.m2_pred)
        return ops.clip(ops.divide_no_nan(self.comoment, denominator), -1.0, 1.0)


@keras.saving.register_keras_serializable(package="kbert")
class SpearmanCorrelation(keras.metrics.Metric):
    """Spearman rank correlation over all batches, from stored predictions.

    Rank correlation needs every value, so this metric keeps the labels and
    predictions of up to `capacity` examples in two buffers (`2 * capacity`
    floats) and ranks them in `result()` (ties get their average rank, as in
    `scipy.stats.spearmanr`). If more than `capacity` examples arrive before
    `reset_state()`, `result()` returns nan rather than a wrong number:
    raise `capacity` (or score with `kbert.metrics.spearman_corr`).
    `sample_weight` is not supported. Ranks are exact in float32 up to
    `capacity` = 2**24. The buffers must not be summed across tf.distribute
    replicas.

    Args:
        capacity: int. Most examples kept between resets. Defaults to 32768.
        name: str. Metric name. Defaults to `"spearman_correlation"`.
        dtype: dtype of the metric state. Defaults to float32.

    Example:

    >>> metric = SpearmanCorrelation(capacity=16)
    >>> metric.update_state([1.0, 2.0], [1.0, 20.0])
    >>> metric.update_state([3.0, 4.0], [300.0, 4000.0])
    >>> float(metric.result())
    1.0
    """

    def __init__(self, capacity=32768, name="spearman_correlation", dtype=None):
        super().__init__(name=name, dtype=dtype)
        if not isinstance(capacity, int) or not 2 <= capacity <= 2**24:
            raise ValueError(
                f"`capacity` must be an integer in [2, 2**24]. Received: capacity={capacity!r}"
            )
        self.capacity = capacity
        self.count = self.add_variable(
            shape=(), initializer="zeros", dtype=self.dtype, name="count"
        )
        self.true_values = self.add_variable(
            shape=(capacity,), initializer="zeros", dtype=self.dtype, name="true_values"
        )
        self.pred_values = self.add_variable(
            shape=(capacity,), initializer="zeros", dtype=self.dtype, name="pred_values"
        )

    def update_state(self, y_true, y_pred, sample_weight=None):
        """Appends a batch to the buffers.

        Args:
            y_true: labels, shape `(batch_size,)` or `(batch_size, 1)`.
            y_pred: predictions with as many values as `y_true`.
            sample_weight: must be None.
        """
        if sample_weight is not None:
            raise ValueError(
                "`SpearmanCorrelation` does not support `sample_weight`. "
                "Received a sample_weight; expected None."
            )
        y_true, y_pred = _flat_pair(y_true, y_pred, self.dtype, self.name)
        batch_size = ops.shape(y_true)[0]
        start = ops.cast(self.count, "int32")
        # Past `capacity` the positions are clipped (overwriting the last slot);
        # `count` still grows, and `result()` then reports nan.
        positions = ops.minimum(start + ops.arange(batch_size, dtype="int32"), self.capacity - 1)
        positions = ops.expand_dims(positions, axis=-1)  # (batch, 1)
        true_values = ops.convert_to_tensor(self.true_values)
        pred_values = ops.convert_to_tensor(self.pred_values)
        self.true_values.assign(ops.scatter_update(true_values, positions, y_true))
        self.pred_values.assign(ops.scatter_update(pred_values, positions, y_pred))
        self.count.assign(self.count + ops.cast(batch_size, self.dtype))

    def _ranks(self, values, valid):
        """Average 1-based ranks of the valid entries (others: garbage)."""
        large = ops.cast(np.finfo(np.float32).max, self.dtype)
        padded = ops.where(valid, ops.convert_to_tensor(values), large)
        ordered = ops.sort(padded)
        left = ops.searchsorted(ordered, padded, side="left")
        right = ops.searchsorted(ordered, padded, side="right")
        return ops.cast(left + right + 1, self.dtype) / 2.0

    def result(self):
        count = ops.convert_to_tensor(self.count)
        valid = ops.cast(ops.arange(self.capacity), self.dtype) < count
        valid_float = ops.cast(valid, self.dtype)
        mean_rank = (count + 1.0) / 2.0  # exact, ties included
        rank_true = (self._ranks(self.true_values, valid) - mean_rank) * valid_float
        rank_pred = (self._ranks(self.pred_values, valid) - mean_rank) * valid_float
        denominator = ops.sqrt(ops.sum(rank_true**2) * ops.sum(rank_pred**2))
        correlation = ops.clip(
            ops.divide_no_nan(ops.sum(rank_true * rank_pred), denominator), -1.0, 1.0
        )
        overflow = count > self.capacity
        return ops.where(overflow, ops.cast(float("nan"), self.dtype), correlation)

    def get_config(self):
        config = super().get_config()
        config.update({"capacity": self.capacity})
        return config
