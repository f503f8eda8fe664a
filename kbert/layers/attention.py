"""Multi-head self-attention that takes the backend's fused path whenever it can."""

import math

import keras
from keras import ops

from kbert.layers.utils import clone_initializer


@keras.saving.register_keras_serializable(package="kbert")
class BertSelfAttention(keras.layers.Layer):
    """Multi-head self-attention with query/key/value/output projections, as in BERT.

    The attention itself is `keras.ops.dot_product_attention`, which maps to the backend's
    fused kernel (cuDNN/flash on JAX GPU, `scaled_dot_product_attention` on torch). That path
    is taken at inference and in training whenever `dropout` is 0. Attention-probability
    dropout in training needs the probabilities, so it runs the explicit
    softmax-dropout-matmul form, with the softmax in float32.

    Keys are masked with `padding_mask`. A row whose keys are all padding (an all-padding
    example) attends to every position instead, so it stays finite; its outputs are padding
    and carry no meaning.

    Args:
        num_heads: int. Number of attention heads.
        hidden_dim: int. Model width; must be divisible by `num_heads`.
        dropout: float. Dropout on the attention probabilities. Defaults to `0.0`.
        kernel_initializer: initializer of the four projections. Defaults to
            `TruncatedNormal(stddev=0.02)`.
        flash_attention: `None` (let the backend decide), `True` or `False`; passed to
            `keras.ops.dot_product_attention`. Defaults to `None`.

    Call arguments:
        inputs: float tensor `(batch_size, sequence_length, hidden_dim)`.
        padding_mask: bool/int tensor `(batch_size, sequence_length)`, true for real tokens.
        training: bool.

    Example:
    >>> attention = BertSelfAttention(num_heads=2, hidden_dim=8)
    >>> attention(np.ones((1, 4, 8)), padding_mask=np.array([[1, 1, 1, 0]])).shape
    (1, 4, 8)

    Reference: Vaswani et al., 2017, "Attention Is All You Need", section 3.2.
    """

    def __init__(
        self,
        num_heads,
        hidden_dim,
        dropout=0.0,
        kernel_initializer=None,
        flash_attention=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if hidden_dim % num_heads != 0:
            raise ValueError(
                "`hidden_dim` must be divisible by `num_heads`. "
                f"Received: hidden_dim={hidden_dim}, num_heads={num_heads}"
            )
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.head_dim = hidden_dim // num_heads
        self.dropout = dropout
        self.flash_attention = flash_attention
        self.kernel_initializer = keras.initializers.get(
            kernel_initializer or keras.initializers.TruncatedNormal(stddev=0.02)
        )

        def projection(name):
            return keras.layers.Dense(
                hidden_dim,
                kernel_initializer=clone_initializer(self.kernel_initializer),
                dtype=self.dtype_policy,
                name=name,
            )

        self.query_dense = projection("query")
        self.key_dense = projection("key")
        self.value_dense = projection("value")
        self.output_dense = projection("attention_output")
        self.probability_dropout = keras.layers.Dropout(
            dropout, dtype=self.dtype_policy, name="attention_probability_dropout"
        )

    def build(self, inputs_shape, padding_mask_shape=None):
        for dense in (self.query_dense, self.key_dense, self.value_dense, self.output_dense):
            dense.build(inputs_shape)
        self.built = True

    def _split_heads(self, x):
        batch, length = ops.shape(x)[0], ops.shape(x)[1]
        return ops.reshape(x, (batch, length, self.num_heads, self.head_dim))

    def call(self, inputs, padding_mask=None, training=None):
        x = inputs
        query = self._split_heads(self.query_dense(x))  # (batch, seq, heads, head_dim)
        key = self._split_heads(self.key_dense(x))
        value = self._split_heads(self.value_dense(x))

        mask = None
        if padding_mask is not None:
            keys = ops.cast(padding_mask, "bool")  # (batch, seq)
            # Rows with no real key at all would softmax over nothing: let them see everything.
            empty = ops.logical_not(ops.any(keys, axis=-1, keepdims=True))  # (batch, 1)
            keys = ops.logical_or(keys, empty)
            mask = keys[:, None, None, :]  # (batch, 1, 1, seq) -> broadcast over heads, queries

        if training and self.dropout > 0:
            context = self._attention_with_dropout(query, key, value, mask, training)
        else:
            context = ops.dot_product_attention(
                query, key, value, mask=mask, flash_attention=self.flash_attention
            )  # (batch, seq, heads, head_dim)
        batch, length = ops.shape(x)[0], ops.shape(x)[1]
        context = ops.reshape(context, (batch, length, self.hidden_dim))
        return self.output_dense(context)

    def _attention_with_dropout(self, query, key, value, mask, training):
        scale = 1.0 / math.sqrt(self.head_dim)
        scores = ops.einsum("bqhd,bkhd->bhqk", query * ops.cast(scale, query.dtype), key)
        scores = ops.cast(scores, "float32")  # (batch, heads, seq, seq), softmax in float32
        if mask is not None:
            scores = ops.where(mask, scores, ops.cast(-1e9, "float32"))
        probabilities = ops.cast(ops.softmax(scores, axis=-1), self.compute_dtype)
        probabilities = self.probability_dropout(probabilities, training=training)
        return ops.einsum("bhqk,bkhd->bqhd", probabilities, value)  # (batch, seq, heads, head_dim)

    def compute_output_shape(self, inputs_shape, *args, **kwargs):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "hidden_dim": self.hidden_dim,
                "dropout": self.dropout,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "flash_attention": self.flash_attention,
            }
        )
        return config
