"""BERT's pooler and heads: pretraining (masked LM, next-sentence prediction), the span logits
of question answering, the choice logits of multiple choice and the pooling of sentence
embeddings."""

import keras
from keras import ops

from kbert.layers.dense import Dense
from kbert.layers.utils import (
    KerasQuantization,
    check_index_range,
    clone_initializer,
    float32_policy,
    get_activation,
)


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
    `(batch, sequence_length, vocabulary_size)` product; with `mask_positions=None` they are
    computed at every position (SPLADE's sparse encoder, `kbert.models.BertSparseEncoder`).
    The decoder reuses the token embedding table (transposed) and adds its own output bias.

    Args:
        token_embedding: `ReversibleEmbedding`. The backbone's token embedding, whose table
            is the decoder.
        activation: str or callable. Activation of the transform. Defaults to `"gelu"`.
        layer_norm_epsilon: float. Defaults to `1e-12`.
        kernel_initializer: Defaults to `TruncatedNormal(stddev=0.02)`.

    Call arguments:
        sequence_output: float tensor `(batch_size, sequence_length, hidden_dim)`.
        mask_positions: int tensor `(batch_size, num_predictions)`, or `None` for every
            position. Defaults to `None`.

    Returns:
        Logits `(batch_size, num_predictions, vocabulary_size)`, or `(batch_size,
        sequence_length, vocabulary_size)` without `mask_positions`.

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

    def call(self, sequence_output, mask_positions=None):
        x = self.select(sequence_output, mask_positions)
        x = self.activation_fn(self.transform_dense(x))
        x = ops.cast(self.layer_norm(x), self.compute_dtype)
        logits = self.token_embedding(x, reverse=True)  # (batch, predictions, vocabulary)
        return logits + ops.cast(self.output_bias, self.compute_dtype)

    def select(self, sequence_output, mask_positions=None):
        """The rows of `sequence_output` the logits are computed at: those at `mask_positions`
        `(batch, predictions, hidden)` (checked), or every row without them."""
        if mask_positions is None:
            return sequence_output  # (batch, seq, hidden)
        check_index_range(
            mask_positions,
            sequence_output.shape[1] or 2**31,
            "mask_positions",
            "sequence_length",
        )
        positions = ops.cast(mask_positions, "int32")[:, :, None]  # (batch, predictions, 1)
        return ops.take_along_axis(sequence_output, positions, axis=1)  # (batch, preds, hidden)

    def compute_output_shape(self, sequence_output_shape, mask_positions_shape=None):
        if mask_positions_shape is None:
            return tuple(sequence_output_shape[:-1]) + (self.vocabulary_size,)
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
class NextSentenceHead(KerasQuantization, keras.layers.Dense):
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


# Logit given to positions outside the context: exp(-1e9 - max) is exactly 0 in float32.
MASKED_LOGIT = -1e9


@keras.saving.register_keras_serializable(package="kbert")
class ContextSpanLogits(keras.layers.Layer):
    """Splits `(batch, seq, 2)` span logits into start/end logits, masked to the context.

    A position can start or end an answer when it is a real (unpadded) segment-1 piece other
    than the final `[SEP]`, or when it is `[CLS]` (position 0, the "no answer" position of
    SQuAD 2.0 and of windows that do not hold the answer). Other positions get a logit of
    -1e9. Logits are returned in float32.

    Args:
        context_only: bool. Mask as above; `False` only splits and casts (the logits of
            Hugging Face's question-answering model). Defaults to `True`.

    Call arguments:
        logits: float tensor `(batch_size, sequence_length, 2)`.
        segment_ids: int tensor `(batch_size, sequence_length)`.
        padding_mask: int/bool tensor `(batch_size, sequence_length)`.

    Returns:
        Tuple `(start_logits, end_logits)`, each `(batch_size, sequence_length)`.

    Example:
    >>> layer = ContextSpanLogits()
    >>> start, end = layer(np.zeros((1, 5, 2)), np.array([[0, 0, 1, 1, 1]]), np.ones((1, 5)))
    >>> np.asarray(start)[0]  # [CLS], question, [SEP] masked except [CLS]; last [SEP] masked
    array([ 0.e+00, -1.e+09, ...
    """

    def __init__(self, context_only=True, **kwargs):
        super().__init__(**kwargs)
        self.context_only = bool(context_only)

    def call(self, logits, segment_ids, padding_mask):
        logits = ops.cast(logits, "float32")  # (batch, seq, 2)
        if not self.context_only:
            return logits[..., 0], logits[..., 1]
        real = ops.cast(padding_mask, "int32") > 0  # (batch, seq)
        positions = ops.expand_dims(ops.arange(ops.shape(logits)[1], dtype="int32"), 0)  # (1, seq)
        last = ops.sum(ops.cast(real, "int32"), axis=1, keepdims=True) - 1  # (batch, 1)
        context = real & (ops.cast(segment_ids, "int32") == 1) & (positions < last)
        allowed = context | (positions == 0)  # (batch, seq)
        masked = ops.where(ops.expand_dims(allowed, -1), logits, MASKED_LOGIT)
        return masked[..., 0], masked[..., 1]

    def compute_output_spec(self, logits, segment_ids, padding_mask):
        shape = tuple(logits.shape[:-1])
        return (
            keras.KerasTensor(shape, dtype="float32"),
            keras.KerasTensor(shape, dtype="float32"),
        )

    def get_config(self):
        config = super().get_config()
        config["context_only"] = self.context_only
        return config


_CHOICE_INPUTS = ("token_ids", "segment_ids", "padding_mask")


@keras.saving.register_keras_serializable(package="kbert")
class FlattenChoices(keras.layers.Layer):
    """Flattens multiple-choice inputs `(batch, choices, seq)` into one sequence per choice.

    Each of `token_ids`, `segment_ids` and `padding_mask` becomes `(batch * choices, seq)`,
    choice by choice within each row, so a backbone encodes every (context, choice) pair on
    its own. A padded choice (no real position) gets a real position 0 in the flattened mask,
    so its attention is never over an empty set of keys (whatever it computes is masked later
    by `ChoiceLogits`).

    Call arguments:
        inputs: dict of int tensors `(batch_size, num_choices, sequence_length)`.

    Returns:
        Dict of int32 tensors `(batch_size * num_choices, sequence_length)`.

    Example:
    >>> x = {k: np.ones((2, 3, 4), "int32") for k in ("token_ids", "segment_ids", "padding_mask")}
    >>> tuple(FlattenChoices()(x)["token_ids"].shape)
    (6, 4)
    """

    def call(self, inputs):
        length = ops.shape(inputs["token_ids"])[-1]
        flat = {
            key: ops.reshape(ops.cast(inputs[key], "int32"), (-1, length))  # (batch*choices, seq)
            for key in _CHOICE_INPUTS
        }
        mask = flat["padding_mask"]
        empty = ops.logical_not(ops.any(mask > 0, axis=1, keepdims=True))  # (batch*choices, 1)
        first = ops.expand_dims(ops.arange(length, dtype="int32"), 0) == 0  # (1, seq)
        flat["padding_mask"] = ops.where(ops.logical_and(empty, first), 1, mask)
        return flat

    def compute_output_spec(self, inputs):
        spec = inputs["token_ids"]
        choices = spec.shape[1]
        rows = None if spec.shape[0] is None or choices is None else spec.shape[0] * choices
        return {key: keras.KerasTensor((rows, spec.shape[-1]), "int32") for key in _CHOICE_INPUTS}


@keras.saving.register_keras_serializable(package="kbert")
class ChoiceLogits(keras.layers.Layer):
    """Reshapes one score per (context, choice) pair into `(batch, choices)` logits and masks
    padded choices.

    A choice whose `padding_mask` has no real position is padding: its logit is -1e9
    (`MASKED_LOGIT`), so a softmax gives it probability 0 (exactly, in float32) and argmax never
    picks it while a row has a real choice. Logits are returned in float32.

    Call arguments:
        scores: float tensor `(batch_size * num_choices, 1)`, one score per pair in the
            order of `FlattenChoices`.
        padding_mask: int/bool tensor `(batch_size, num_choices, sequence_length)`.

    Returns:
        float32 tensor `(batch_size, num_choices)`.

    Example:
    >>> mask = np.array([[[1, 1], [1, 0], [0, 0]]])  # the third choice is padding
    >>> np.asarray(ChoiceLogits()(np.array([[0.5], [2.0], [9.0]]), mask))
    array([[ 5.e-01,  2.e+00, -1.e+09]], dtype=float32)
    """

    def call(self, scores, padding_mask):
        real = ops.any(ops.cast(padding_mask, "int32") > 0, axis=-1)  # (batch, choices)
        logits = ops.reshape(ops.cast(scores, "float32"), ops.shape(real))  # (batch, choices)
        return ops.where(real, logits, MASKED_LOGIT)

    def compute_output_spec(self, scores, padding_mask):
        return keras.KerasTensor(tuple(padding_mask.shape[:2]), dtype="float32")


# kbert's pooling names; sentence-transformers spells the last one `mean_sqrt_len_tokens`.
POOLING_MODES = ("mean", "cls", "max", "mean_sqrt_len")
_POOLING_ALIASES = {"mean_sqrt_len_tokens": "mean_sqrt_len"}


def canonical_pooling(pooling):
    """`pooling` (a mode name or a list of them) as a tuple of kbert mode names, checked."""
    modes = (pooling,) if isinstance(pooling, str) else pooling
    if not isinstance(modes, (list, tuple)) or not modes:
        raise ValueError(
            f"`pooling` must be one of {list(POOLING_MODES)} or a non-empty list of them. "
            f"Received: pooling={pooling!r}"
        )
    out = []
    for mode in modes:
        mode = _POOLING_ALIASES.get(mode, mode)
        if mode not in POOLING_MODES:
            raise ValueError(
                f"Unknown pooling mode {mode!r}. Expected one of {list(POOLING_MODES)} "
                "(or a list of them, concatenated in that order)."
            )
        out.append(mode)
    return tuple(out)


@keras.saving.register_keras_serializable(package="kbert")
class EmbeddingPooling(keras.layers.Layer):
    """Pools token vectors into one vector per row, over the real positions only.

    Modes (several are concatenated in the given order, as sentence-transformers does):
    `mean` (sum of real vectors / their count), `cls` (the first position, `[CLS]`), `max`
    (element-wise maximum over real positions), `mean_sqrt_len` (sum / sqrt(count)). Computes
    in float32 whatever the input dtype; `normalize=True` divides each row by its L2 norm
    (floored at 1e-12, as `torch.nn.functional.normalize`).

    Args:
        pooling: str or list of str. The mode(s). Defaults to `"mean"`.
        normalize: bool. L2-normalise the pooled vector. Defaults to `False`.

    Call arguments:
        sequence_output: float tensor `(batch_size, sequence_length, hidden_dim)`.
        padding_mask: int/bool tensor `(batch_size, sequence_length)`, 1 at real positions.

    Returns:
        float32 tensor `(batch_size, len(pooling) * hidden_dim)`.

    Example:
    >>> layer = EmbeddingPooling("mean")
    >>> pooled = layer(np.array([[[1.0, 2.0], [3.0, 4.0], [9.0, 9.0]]]), np.array([[1, 1, 0]]))
    >>> keras.ops.convert_to_numpy(pooled)  # the mean of the two unmasked tokens
    array([[2., 3.]], dtype=float32)
    """

    def __init__(self, pooling="mean", normalize=False, **kwargs):
        super().__init__(**kwargs)
        self.pooling = list(canonical_pooling(pooling))
        self.normalize = bool(normalize)

    def call(self, sequence_output, padding_mask):
        x = ops.cast(sequence_output, "float32")  # (batch, seq, hidden)
        mask = ops.expand_dims(ops.cast(padding_mask, "float32"), -1)  # (batch, seq, 1)
        outputs = []
        for mode in self.pooling:
            if mode == "cls":
                outputs.append(x[:, 0, :])
            elif mode == "max":
                outputs.append(ops.max(ops.where(mask > 0, x, float("-inf")), axis=1))
            else:
                total = ops.sum(x * mask, axis=1)  # (batch, hidden)
                count = ops.maximum(ops.sum(mask, axis=1), 1e-9)  # (batch, 1)
                outputs.append(total / (count if mode == "mean" else ops.sqrt(count)))
        pooled = outputs[0] if len(outputs) == 1 else ops.concatenate(outputs, axis=-1)
        if self.normalize:
            norm = ops.sqrt(ops.sum(ops.square(pooled), axis=-1, keepdims=True))
            pooled = pooled / ops.maximum(norm, 1e-12)
        return pooled

    def compute_output_spec(self, sequence_output, padding_mask):
        shape = tuple(sequence_output.shape[:-1][:1]) + (
            None
            if sequence_output.shape[-1] is None
            else sequence_output.shape[-1] * len(self.pooling),
        )
        return keras.KerasTensor(shape, dtype="float32")

    def get_config(self):
        config = super().get_config()
        config.update({"pooling": list(self.pooling), "normalize": self.normalize})
        return config
