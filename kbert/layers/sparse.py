"""SPLADE's pooling: masked-LM logits -> one non-negative weight per vocabulary entry."""

import keras
from keras import ops

SPLADE_POOLING_STRATEGIES = ("max", "sum")
SPLADE_ACTIVATIONS = ("relu", "log1p_relu")


def check_splade_settings(pooling_strategy, activation):
    """Raises a ValueError unless `pooling_strategy` and `activation` are SPLADE's."""
    if pooling_strategy not in SPLADE_POOLING_STRATEGIES:
        raise ValueError(
            f"`pooling_strategy` must be one of {list(SPLADE_POOLING_STRATEGIES)}. "
            f"Received: pooling_strategy={pooling_strategy!r}"
        )
    if activation not in SPLADE_ACTIVATIONS:
        raise ValueError(
            f"`activation` must be one of {list(SPLADE_ACTIVATIONS)}. "
            f"Received: activation={activation!r}"
        )


@keras.saving.register_keras_serializable(package="kbert")
class SpladePooling(keras.layers.Layer):
    """`log(1 + relu(logits))` at each real token, pooled over the tokens (SPLADE).

    For masked-LM logits `(batch, sequence_length, vocabulary_size)` the weight of vocabulary
    entry `v` in row `b` is `max_t log(1 + relu(logits[b, t, v]))` over the real positions
    `t` (`pooling_strategy="max"`, SPLADE v2 and later) or their sum (`"sum"`, the first
    SPLADE). Padding positions count as 0, which never changes a maximum of non-negative
    values. `activation="log1p_relu"` applies `log1p` twice (OpenSearch's SPLADE models).
    Computes in float32 whatever the input dtype.

    Args:
        pooling_strategy: `"max"` or `"sum"`. Defaults to `"max"`.
        activation: `"relu"` or `"log1p_relu"`. Defaults to `"relu"`.

    Call arguments:
        logits: float tensor `(batch_size, sequence_length, vocabulary_size)`.
        padding_mask: int/bool tensor `(batch_size, sequence_length)`, 1 at real positions.

    Returns:
        float32 tensor `(batch_size, vocabulary_size)`, every entry >= 0.

    Example:
    >>> logits = np.array([[[1.0, -2.0, 0.5], [3.0, 1.0, -1.0], [9.0, 9.0, 9.0]]])
    >>> pooled = SpladePooling()(logits, np.array([[1, 1, 0]]))  # the last token is padding
    >>> np.round(keras.ops.convert_to_numpy(pooled), 4)  # log1p of the real maxima 3, 1, 0.5
    array([[1.3863, 0.6931, 0.4055]], dtype=float32)

    Reference: Formal et al., 2021, "SPLADE v2" (arXiv 2109.10086).
    """

    def __init__(self, pooling_strategy="max", activation="relu", **kwargs):
        super().__init__(**kwargs)
        check_splade_settings(pooling_strategy, activation)
        self.pooling_strategy = pooling_strategy
        self.activation = activation

    def call(self, logits, padding_mask):
        mask = ops.expand_dims(ops.cast(padding_mask, logits.dtype), -1)  # (batch, seq, 1)
        masked = logits * mask  # (batch, seq, vocab), 0 at padding
        if self.pooling_strategy == "max":
            # The activation never decreases, so the maximum of the activated logits is the
            # activation of their maximum: one pass over (batch, seq, vocab), the activation
            # on (batch, vocab) only. The same value, and the same gradient (at the position
            # of the maximum).
            return self._activate(ops.cast(ops.max(masked, axis=1), "float32"))
        return ops.sum(self._activate(ops.cast(masked, "float32")), axis=1)  # (batch, vocab)

    def _activate(self, x):
        x = ops.log1p(ops.relu(x))
        return ops.log1p(x) if self.activation == "log1p_relu" else x

    def compute_output_spec(self, logits, padding_mask):
        return keras.KerasTensor((logits.shape[0], logits.shape[-1]), dtype="float32")

    def get_config(self):
        config = super().get_config()
        config.update({"pooling_strategy": self.pooling_strategy, "activation": self.activation})
        return config
