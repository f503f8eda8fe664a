"""The post-LayerNorm transformer encoder block of BERT."""

import keras
from keras import ops

from kbert import backend
from kbert.layers.attention import BertSelfAttention
from kbert.layers.dense import Dense
from kbert.layers.dropout import HashDropout
from kbert.layers.utils import (
    clone_initializer,
    float32_policy,
    get_activation,
)


@keras.saving.register_keras_serializable(package="kbert")
class TransformerEncoder(keras.layers.Layer):
    """One BERT encoder block (post-LayerNorm).

    `x -> attention -> dropout -> + x -> LayerNorm -> dense(intermediate_dim) -> activation
    -> dense(hidden_dim) -> dropout -> + -> LayerNorm`. LayerNorms compute in float32 under
    mixed precision.

    Args:
        num_heads: int. Number of attention heads.
        intermediate_dim: int. Width of the feed-forward layer.
        activation: str or callable. `"gelu"` (exact), `"gelu_approximate"` (tanh form, the
            original TensorFlow BERT) or `"relu"`. Defaults to `"gelu"`.
        dropout: float. Dropout after the attention and feed-forward outputs. Defaults to `0.1`.
        attention_dropout: float. Dropout on attention probabilities. Defaults to `0.1`.
        layer_norm_epsilon: float. Defaults to `1e-12`.
        kernel_initializer: initializer for all kernels. Defaults to
            `TruncatedNormal(stddev=0.02)`.
        flash_attention: `None`, `True` or `False`; see `BertSelfAttention`.
        attention_implementation: `"auto"`, `"plain"`, `"fused"` or `"torch_sdpa"`; see
            `BertSelfAttention`. Defaults to `"auto"`.
        remat: bool. Recompute the block in the backward pass instead of storing its
            activations (`keras.remat`: `jax.checkpoint`, `tf.recompute_grad`,
            `torch.utils.checkpoint`). The dropout keys are drawn before the block and
            passed in, so both passes use the same masks and gradients equal those without
            remat. Only training calls are rematerialised. Defaults to `False`.

    Call arguments:
        inputs: float tensor `(batch_size, sequence_length, hidden_dim)`.
        padding_mask: bool/int tensor `(batch_size, sequence_length)`.
        training: bool.
        return_attention_scores: bool. Also return the block's attention probabilities
            `(batch_size, num_heads, sequence_length, sequence_length)`; the attention then
            takes its explicit softmax route (see `BertSelfAttention`). Defaults to `False`.
        query_length: int or `None`. Compute the first `query_length` positions' outputs
            only (their attention still reads every position): the rows a head on [CLS]
            needs from the last block, for a fraction of the block's work. `None`: every
            position. Defaults to `None`.

    Returns:
        The block's output `(batch_size, sequence_length, hidden_dim)` (`query_length`
        rows when given), or the pair `(output, attention_probabilities)` with
        `return_attention_scores=True`.

    Example:
    >>> block = TransformerEncoder(num_heads=2, intermediate_dim=32)
    >>> tuple(block(np.ones((1, 4, 8)), padding_mask=np.ones((1, 4))).shape)
    (1, 4, 8)

    Reference: Devlin et al., 2018; Vaswani et al., 2017, section 3.1.
    """

    def __init__(
        self,
        num_heads,
        intermediate_dim,
        activation="gelu",
        dropout=0.1,
        attention_dropout=0.1,
        layer_norm_epsilon=1e-12,
        kernel_initializer=None,
        flash_attention=None,
        remat=False,
        attention_implementation="auto",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.activation = activation
        self.activation_fn = get_activation(activation)
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.layer_norm_epsilon = layer_norm_epsilon
        self.flash_attention = flash_attention
        self.attention_implementation = attention_implementation
        self.remat = remat
        self.kernel_initializer = keras.initializers.get(
            kernel_initializer or keras.initializers.TruncatedNormal(stddev=0.02)
        )

    def build(self, inputs_shape, padding_mask_shape=None):
        input_shape = inputs_shape
        hidden_dim = input_shape[-1]
        self.self_attention = BertSelfAttention(
            num_heads=self.num_heads,
            hidden_dim=hidden_dim,
            dropout=self.attention_dropout,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            flash_attention=self.flash_attention,
            attention_implementation=self.attention_implementation,
            dtype=self.dtype_policy,
            name="self_attention",
        )
        self.self_attention.build(input_shape)
        self.attention_dropout_layer = HashDropout(
            self.dropout, dtype=self.dtype_policy, name="self_attention_dropout"
        )
        self.attention_layer_norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon,
            dtype=float32_policy(self.dtype_policy),
            name="self_attention_layer_norm",
        )
        self.attention_layer_norm.build(input_shape)
        self.intermediate_dense = Dense(
            self.intermediate_dim,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            dtype=self.dtype_policy,
            name="intermediate_dense",
        )
        self.intermediate_dense.build(input_shape)
        self.output_dense = Dense(
            hidden_dim,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            dtype=self.dtype_policy,
            name="output_dense",
        )
        self.output_dense.build(tuple(input_shape[:-1]) + (self.intermediate_dim,))
        self.output_dropout_layer = HashDropout(
            self.dropout, dtype=self.dtype_policy, name="output_dropout"
        )
        self.output_layer_norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon,
            dtype=float32_policy(self.dtype_policy),
            name="output_layer_norm",
        )
        self.output_layer_norm.build(input_shape)
        self.built = True

    def call(
        self,
        inputs,
        padding_mask=None,
        training=None,
        return_attention_scores=False,
        query_length=None,
    ):
        scores = bool(return_attention_scores)
        if not (self.remat and training):
            return self._block(
                inputs,
                padding_mask,
                training,
                return_attention_scores=scores,
                query_length=query_length,
            )
        # Keys drawn here, outside the recomputed function, so that its two runs agree.
        dropouts = (
            self.self_attention.probability_dropout,
            self.attention_dropout_layer,
            self.output_dropout_layer,
        )
        seeds = [layer.next_seed() for layer in dropouts]
        used = [seed is not None for seed in seeds]
        has_mask = padding_mask is not None

        def block(x, *tensors):
            tensors = list(tensors)
            mask = tensors.pop(0) if has_mask else None
            block_seeds = [tensors.pop(0) if use else None for use in used]
            return self._block(
                x,
                mask,
                True,
                block_seeds,
                return_attention_scores=scores,
                query_length=query_length,
            )

        tensors = ([padding_mask] if has_mask else []) + [s for s in seeds if s is not None]
        return keras.remat(block)(inputs, *tensors)

    def _block(
        self,
        inputs,
        padding_mask,
        training,
        seeds=(None, None, None),
        return_attention_scores=False,
        query_length=None,
    ):
        x = inputs
        attended = backend.call_sublayer(
            self.self_attention,
            x,
            padding_mask=padding_mask,
            training=training,
            dropout_seed=seeds[0],
            return_attention_scores=return_attention_scores,
            query_length=query_length,
        )
        if query_length is not None:
            x = x[:, :query_length]  # The residual of the rows computed.
        probabilities = None  # (batch, heads, seq, seq) when asked for
        if return_attention_scores:
            attended, probabilities = attended
        if training:  # Dropout is the identity at inference: no call at all.
            attended = self.attention_dropout_layer(attended, training=training, seed=seeds[1])
        x = ops.cast(
            backend.call_sublayer(self.attention_layer_norm, x + attended), self.compute_dtype
        )

        hidden = backend.call_sublayer(self.intermediate_dense, x)  # (batch, seq, intermediate)
        # (batch, seq, hidden)
        hidden = backend.call_sublayer(self.output_dense, self.activation_fn(hidden))
        if training:
            hidden = self.output_dropout_layer(hidden, training=training, seed=seeds[2])
        outputs = ops.cast(
            backend.call_sublayer(self.output_layer_norm, x + hidden), self.compute_dtype
        )
        return (outputs, probabilities) if return_attention_scores else outputs

    def compute_output_shape(self, inputs_shape, *args, query_length=None, **kwargs):
        if query_length is None or inputs_shape[1] is not None and inputs_shape[1] <= query_length:
            return inputs_shape
        return (inputs_shape[0], int(query_length), *inputs_shape[2:])

    def compute_output_spec(
        self, inputs, *args, return_attention_scores=False, query_length=None, **kwargs
    ):
        # The block's output has the attention's shape: the same specs.
        return self.self_attention.compute_output_spec(
            inputs, return_attention_scores=return_attention_scores, query_length=query_length
        )

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "intermediate_dim": self.intermediate_dim,
                "activation": self.activation,
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "flash_attention": self.flash_attention,
                "attention_implementation": self.attention_implementation,
                "remat": self.remat,
            }
        )
        return config
