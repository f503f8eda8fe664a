"""BERT's pooler and pretraining heads (masked LM and next-sentence prediction)."""

import keras
from keras import ops

from kbert.layers.dense import Dense
from kbert.layers.utils import check_index_range, clone_initializer, float32_policy, get_activation


def _default_initializer(initializer):
    return keras.initializers.get(initializer or keras.initializers.TruncatedNormal(stddev=0.02))


@keras.saving.register_keras_serializable(package="kbert")
class BertPooler(keras.layers.Layer):
    """Dense + tanh on the first ([CLS]) position: BERT's `pooled_output`.

    Args:
        hidden_dim: int. Output width (the encoder width).
        kernel_initializer: Defaults to `TruncatedNormal(stddev=0.02)`.

    Call arguments:
        sequence_output: float tensor `(batch_size, sequence_length, hidden_dim)`.

    Example:
    >>> tuple(BertPooler(8)(np.ones((2, 5, 8))).shape)
    (2, 8)
    """

    def __init__(self, hidden_dim, kernel_initializer=None, **kwargs):
        super().__init__(**kwargs)
        self.hidden_dim = hidden_dim
        self.kernel_initializer = _default_initializer(kernel_initializer)
        self.dense = Dense(
            hidden_dim,
            activation="tanh",
            kernel_initializer=clone_initializer(self.kernel_initializer),
            dtype=self.dtype_policy,
            name="pooler_dense",
        )

    def build(self, input_shape):
        self.dense.build((input_shape[0], input_shape[-1]))
        self.built = True

    def call(self, sequence_output):
        return self.dense(sequence_output[:, 0, :])  # (batch, hidden)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.hidden_dim)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "hidden_dim": self.hidden_dim,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config


@keras.saving.register_keras_serializable(package="kbert")
class MaskedLMHead(keras.layers.Layer):
    """The masked-LM head: gather at `mask_positions`, dense + activation + LayerNorm, tied decoder.

    Logits are computed only at the masked positions, as in the original, which saves the
    `(batch, sequence_length, vocabulary_size)` product. The decoder reuses the token
    embedding table (transposed) and adds its own output bias.

    Args:
        token_embedding: `ReversibleEmbedding`. The backbone's token embedding, whose table
            is the decoder.
        activation: str or callable. Activation of the transform. Defaults to `"gelu"`.
        layer_norm_epsilon: float. Defaults to `1e-12`.
        kernel_initializer: Defaults to `TruncatedNormal(stddev=0.02)`.

    Call arguments:
        sequence_output: float tensor `(batch_size, sequence_length, hidden_dim)`.
        mask_positions: int tensor `(batch_size, num_predictions)`.

    Returns:
        Logits `(batch_size, num_predictions, vocabulary_size)`.

    Reference: google-research/bert `run_pretraining.py`, `get_masked_lm_output`.
    """

    def __init__(
        self,
        token_embedding,
        activation="gelu",
        layer_norm_epsilon=1e-12,
        kernel_initializer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.token_embedding = token_embedding
        self.vocabulary_size = token_embedding.input_dim
        self.activation = activation
        self.activation_fn = get_activation(activation)
        self.layer_norm_epsilon = layer_norm_epsilon
        self.kernel_initializer = _default_initializer(kernel_initializer)

    def build(self, sequence_output_shape, mask_positions_shape=None):
        hidden_dim = sequence_output_shape[-1]
        self.transform_dense = Dense(
            hidden_dim,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            dtype=self.dtype_policy,
            name="mlm_transform_dense",
        )
        self.transform_dense.build((None, None, hidden_dim))
        self.layer_norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon,
            dtype=float32_policy(self.dtype_policy),
            name="mlm_layer_norm",
        )
        self.layer_norm.build((None, None, hidden_dim))
        self.output_bias = self.add_weight(
            name="output_bias", shape=(self.vocabulary_size,), initializer="zeros"
        )
        self.built = True

    def call(self, sequence_output, mask_positions):
        check_index_range(
            mask_positions, sequence_output.shape[1] or 2**31, "mask_positions", "sequence_length"
        )
        positions = ops.cast(mask_positions, "int32")[:, :, None]  # (batch, predictions, 1)
        x = ops.take_along_axis(sequence_output, positions, axis=1)  # (batch, predictions, hidden)
        x = self.activation_fn(self.transform_dense(x))
        x = ops.cast(self.layer_norm(x), self.compute_dtype)
        logits = self.token_embedding(x, reverse=True)  # (batch, predictions, vocabulary)
        return logits + ops.cast(self.output_bias, self.compute_dtype)

    def compute_output_shape(self, sequence_output_shape, mask_positions_shape):
        return tuple(mask_positions_shape) + (self.vocabulary_size,)

    def get_config(self):
        # The token embedding is shared with the backbone; the owning model passes it again.
        config = super().get_config()
        config.update(
            {
                "activation": self.activation,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config


@keras.saving.register_keras_serializable(package="kbert")
class NextSentenceHead(keras.layers.Dense):
    """Two-way next-sentence classifier on the pooled output (0 = IsNext, 1 = NotNext).

    Args:
        kernel_initializer: Defaults to `TruncatedNormal(stddev=0.02)`.
        **kwargs: passed to `keras.layers.Dense`.

    Example:
    >>> tuple(NextSentenceHead()(np.ones((2, 8))).shape)
    (2, 2)
    """

    def __init__(self, units=2, kernel_initializer=None, **kwargs):
        super().__init__(
            units=units, kernel_initializer=_default_initializer(kernel_initializer), **kwargs
        )
