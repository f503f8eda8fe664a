"""Multi-head self-attention that takes the backend's fused path whenever it can."""

import math
import warnings

import keras
from keras import ops

from kbert import backend_paths
from kbert.layers.utils import clone_initializer

_INT32_MIN = -(2**31)


def _as_int32(value):
    """An unsigned 32-bit constant as the int32 with the same bits (for wrapping arithmetic)."""
    return value - 2**32 if value >= 2**31 else value


def _logical_right_shift(x, bits):
    """`x >> bits` on the 32 bits of an int32, filling with zeros (as for uint32)."""
    return ops.bitwise_and(ops.right_shift(x, bits), (1 << (32 - bits)) - 1)


def _mix32(x):
    """MurmurHash3's 32-bit finaliser: a bijection that makes every output bit depend on every input bit.

    Written on int32 with wrapping multiplication, which every backend provides (uint32
    arithmetic is not available on torch).
    """
    x = ops.bitwise_xor(x, _logical_right_shift(x, 16))
    x = ops.multiply(x, ops.cast(_as_int32(0x85EBCA6B), "int32"))
    x = ops.bitwise_xor(x, _logical_right_shift(x, 13))
    x = ops.multiply(x, ops.cast(_as_int32(0xC2B2AE35), "int32"))
    return ops.bitwise_xor(x, _logical_right_shift(x, 16))


@keras.saving.register_keras_serializable(package="kbert")
class HashDropout(keras.layers.Dropout):
    """`keras.layers.Dropout` whose mask comes from a counter-based hash on JAX and TensorFlow.

    Same semantics as `keras.layers.Dropout`: in training, each element is zeroed with
    probability `rate` and the others are scaled by `1 / (1 - rate)`; at inference it is the
    identity. Only the source of randomness differs. JAX's default generator (Threefry,
    20 rounds per 64 bits) and TensorFlow's stateless generator under XLA cost far more
    than the matmuls around them on CPU (a `(32, 12, 128, 128)` attention mask took longer
    than the attention itself). Here every element's bits are a MurmurHash3-finalised hash of
    its (row, column) index and a per-call key drawn from the layer's
    `keras.random.SeedGenerator`: a few integer operations per element, fused by XLA into
    the surrounding computation. The hash is keyed afresh at every call, so masks differ
    between steps and are reproducible under `keras.utils.set_random_seed`. On torch the
    mask comes from torch's global generator (see `kbert.backend_paths.native_dropout`), so
    `torch.utils.checkpoint` replays it.

    Args:
        rate: float in [0, 1]. Fraction of the elements to drop.
        seed: int or None. Seed of the layer's seed generator.

    Call arguments:
        inputs: tensor of any rank.
        training: bool. Dropout applies only when true.
        seed: optional int tensor `(2,)`, the key to use instead of drawing one from the
            layer's seed generator (see `next_seed`): a block that is recomputed in the
            backward pass (`remat`) passes the same key to both passes.

    Example:
    >>> dropout = HashDropout(0.1)
    >>> y = dropout(np.ones((4, 1000)), training=True)
    >>> float(np.mean(y == 0))  # close to 0.1
    """

    def __init__(self, rate, seed=None, **kwargs):
        kwargs.pop("noise_shape", None)
        super().__init__(rate, seed=seed, **kwargs)

    @property
    def uses_hash(self):
        """Whether masks come from the hash (JAX, TensorFlow) rather than the backend's dropout."""
        return 0 < self.rate < 1 and backend_paths.hash_dropout_backend()

    def next_seed(self):
        """Draws the key of the next call from the seed generator (`None` when none is used)."""
        return self.seed_generator.next() if self.uses_hash else None

    def call(self, inputs, training=False, seed=None):
        if not training or self.rate == 0:
            return inputs
        if self.rate >= 1:
            return ops.zeros_like(inputs)
        dropped = backend_paths.native_dropout(inputs, self.rate)
        if dropped is not None:
            return dropped
        if not self.uses_hash:
            return super().call(inputs, training=training)
        if seed is None:
            seed = self.seed_generator.next()
        seed = ops.cast(seed, "int32")  # (2,)
        key_row = _mix32(seed[0] + ops.cast(_as_int32(0x9E3779B9), "int32"))
        key_column = _mix32(ops.bitwise_xor(seed[1], key_row))
        shape = ops.shape(inputs)
        rows = 1
        for dim in shape[:-1]:
            rows = rows * dim
        row_ids = ops.reshape(ops.arange(rows, dtype="int32"), tuple(shape[:-1]) + (1,))
        column_ids = ops.arange(shape[-1], dtype="int32")
        row_hash = _mix32(ops.bitwise_xor(row_ids, key_row))  # (..., 1)
        column_hash = column_ids * ops.cast(_as_int32(0x9E3779B1), "int32") + key_column  # (d,)
        bits = _mix32(ops.bitwise_xor(row_hash, column_hash))  # (..., d), uniform on 32 bits
        # Keep iff the unsigned bits >= rate * 2**32; shifting by 2**31 turns that into an
        # int32 comparison.
        threshold = min(int(round(self.rate * 2**32)), 2**32 - 1) + _INT32_MIN
        keep = ops.greater_equal(
            ops.bitwise_xor(bits, ops.cast(_INT32_MIN, "int32")),
            ops.cast(threshold, "int32"),
        )
        scale = ops.cast(1.0 / (1.0 - self.rate), inputs.dtype)
        return ops.where(keep, inputs * scale, ops.zeros_like(inputs))

    def get_config(self):
        config = super().get_config()
        config.pop("noise_shape", None)
        return config


@keras.saving.register_keras_serializable(package="kbert")
class BertSelfAttention(keras.layers.Layer):
    """Multi-head self-attention with query/key/value/output projections, as in BERT.

    The attention itself is `keras.ops.dot_product_attention`, which maps to the backend's
    fused kernel (cuDNN/flash on JAX GPU, `scaled_dot_product_attention` on torch). That path
    is taken at inference and in training whenever `dropout` is 0. Attention-probability
    dropout in training needs the probabilities, so it runs the explicit
    softmax-dropout-matmul form, with the softmax in float32 (so does float16 on JAX-CPU,
    where XLA lacks the float16 x float16 -> float32 product the fused path asks for).

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
            `keras.ops.dot_product_attention`. Where `True` cannot be honoured (TensorFlow;
            CPUs; GPUs or shapes the backend's flash kernel does not support; training with
            attention dropout, which the fused op does not implement) the layer falls back to
            the standard computation, with the same numbers, and says so in one warning.
            Defaults to `None`.

    Call arguments:
        inputs: float tensor `(batch_size, sequence_length, hidden_dim)`.
        padding_mask: bool/int tensor `(batch_size, sequence_length)`, true for real tokens,
            or `(batch_size, sequence_length, sequence_length)`, true where a query may attend
            to a key (packed rows).
        training: bool.
        dropout_seed: optional int tensor `(2,)`: the key of the attention-dropout mask
            (see `HashDropout`); drawn from the layer's seed generator when omitted.

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
        self.probability_dropout = HashDropout(
            dropout, dtype=self.dtype_policy, name="attention_probability_dropout"
        )

    def build(self, inputs_shape, padding_mask_shape=None):
        for dense in (self.query_dense, self.key_dense, self.value_dense, self.output_dense):
            dense.build(inputs_shape)
        self.built = True

    def _split_heads(self, x):
        batch, length = ops.shape(x)[0], ops.shape(x)[1]
        return ops.reshape(x, (batch, length, self.num_heads, self.head_dim))

    # Reasons already warned about, so that a fallback is reported once per process.
    _flash_fallback_warned = set()

    def call(self, inputs, padding_mask=None, training=None, dropout_seed=None):
        x = inputs
        query = self._split_heads(self.query_dense(x))  # (batch, seq, heads, head_dim)
        key = self._split_heads(self.key_dense(x))
        value = self._split_heads(self.value_dense(x))

        mask = None
        if padding_mask is not None and len(padding_mask.shape) == 3:
            # A pairwise (batch, query, key) mask, e.g. one document per block of a packed
            # row (see `kbert.layers.embeddings.PackedDocumentMasks`). Same (batch, 1, seq,
            # seq) boolean form as below, which cuDNN (JAX) and torch SDPA accept.
            pairs = ops.cast(padding_mask, "bool")
            empty = ops.logical_not(ops.any(pairs, axis=-1, keepdims=True))  # (batch, q, 1)
            mask = ops.logical_or(pairs, empty)[:, None, :, :]
        elif padding_mask is not None:
            keys = ops.cast(padding_mask, "bool")  # (batch, seq)
            # Rows with no real key at all would softmax over nothing: let them see everything.
            empty = ops.logical_not(ops.any(keys, axis=-1, keepdims=True))  # (batch, 1)
            keys = ops.logical_or(keys, empty)
            # A full (batch, 1, seq, seq) mask, broadcast over heads only: cuDNN's fused
            # attention (JAX) refuses a (batch, 1, 1, seq) mask ("Bias must have same seq
            # length as QKV"), and torch's fused SDPA kernels take this form.
            length = ops.shape(keys)[1]
            mask = ops.broadcast_to(
                keys[:, None, None, :], (ops.shape(keys)[0], 1, length, length)
            )

        dropout_active = training and self.dropout > 0
        # torch's fused attention takes the dropout itself (and picks flash where it can).
        context = (
            backend_paths.attention_with_dropout(query, key, value, mask, self.dropout)
            if dropout_active
            else None
        )
        if context is not None:
            pass  # (batch, seq, heads, head_dim), from the backend's fused kernel.
        elif dropout_active:
            if self.flash_attention:
                self._warn_flash_fallback(
                    "the fused attention op has no attention dropout; training with "
                    f"attention dropout {self.dropout} uses the explicit softmax path"
                )
            context = self._explicit_attention(query, key, value, mask, training, dropout_seed)
        elif backend_paths.fused_attention_unsupported(self.compute_dtype):
            context = self._explicit_attention(query, key, value, mask, training, dropout_seed)
        else:
            context = self._fused_attention(query, key, value, mask)
        batch, length = ops.shape(x)[0], ops.shape(x)[1]
        context = ops.reshape(context, (batch, length, self.hidden_dim))
        return self.output_dense(context)

    def _fused_attention(self, query, key, value, mask):
        """`keras.ops.dot_product_attention`, falling back from a flash kernel the backend lacks."""
        if self.flash_attention and not getattr(self, "_flash_unavailable", False):
            reason = backend_paths.flash_unavailable_reason()
            if reason is not None:
                # Known before trying: no attempt, so no backend error or logged traceback.
                self._flash_unavailable = True
                self._warn_flash_fallback(reason)
        if self.flash_attention and not getattr(self, "_flash_unavailable", False):
            try:
                return ops.dot_product_attention(
                    query, key, value, mask=mask, flash_attention=True
                )
            except (RuntimeError, ValueError, ImportError, NotImplementedError) as error:
                # The backend refused before computing anything; the same attention
                # without the flash kernel gives the same numbers.
                self._flash_unavailable = True
                reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
                self._warn_flash_fallback(
                    f"the {keras.config.backend()} backend cannot run flash attention here "
                    f"({type(error).__name__}: {reason[:200]})"
                )
        flash = False if self.flash_attention else self.flash_attention
        return ops.dot_product_attention(query, key, value, mask=mask, flash_attention=flash)

    def _warn_flash_fallback(self, reason):
        key = reason.split("(")[0]
        if key in BertSelfAttention._flash_fallback_warned:
            return
        BertSelfAttention._flash_fallback_warned.add(key)
        warnings.warn(
            f"`flash_attention=True` was requested but {reason}. Falling back to the "
            "standard attention computation (same results, no flash kernel). Pass "
            "`flash_attention=None` to let the backend choose and silence this warning.",
            UserWarning,
            stacklevel=3,
        )

    def _explicit_attention(self, query, key, value, mask, training, dropout_seed=None):
        scale = 1.0 / math.sqrt(self.head_dim)
        scores = ops.einsum("bqhd,bkhd->bhqk", query * ops.cast(scale, query.dtype), key)
        scores = ops.cast(scores, "float32")  # (batch, heads, seq, seq), softmax in float32
        if mask is not None:
            scores = ops.where(mask, scores, ops.cast(-1e9, "float32"))
        probabilities = ops.cast(ops.softmax(scores, axis=-1), self.compute_dtype)
        probabilities = self.probability_dropout(
            probabilities, training=training, seed=dropout_seed
        )
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
