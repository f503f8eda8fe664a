"""Multi-head self-attention that takes the backend's fused path whenever it can."""

import math
import warnings

import keras
from keras import ops

from kbert import backend
from kbert.layers.dense import Dense
from kbert.layers.dropout import HashDropout
from kbert.layers.utils import clone_initializer


@keras.saving.register_keras_serializable(package="kbert")
class BertSelfAttention(keras.layers.Layer):
    """Multi-head self-attention with query/key/value/output projections, as in BERT.

    On JAX and TensorFlow the attention itself is `keras.ops.dot_product_attention`, which
    maps to the backend's fused kernel (cuDNN/flash on JAX GPU). That path is taken at
    inference and in training whenever `dropout` is 0. Attention-probability dropout in
    training needs the probabilities, so it runs the explicit softmax-dropout-matmul form,
    with the softmax in float32 (so does float16 on JAX-CPU, where XLA lacks the float16 x
    float16 -> float32 product the fused path asks for). On torch the layer calls
    `torch.nn.functional.scaled_dot_product_attention` itself, with the dropout inside on
    GPU (see `kbert.backend.torch_attention`): the same function without the Keras
    op's per-call checks, and traceable by `torch.compile` (`jit_compile=True`) without a
    graph break. `flash_attention=True` on torch goes through the Keras op.

    `attention_implementation="plain"` switches all of that off: the layer then computes
    `softmax(q k^T / sqrt(d) + mask) v` itself in `keras.ops` (einsum, softmax in float32,
    `HashDropout` on the probabilities), the same program on every backend and device. It is
    the reference the other routes are tested against, and the one to use to debug, to
    export to a runtime without a fused attention op, or to compare backends.

    Keys are masked with `padding_mask` (on JAX-CPU in float32 as an added bias of -1e9,
    which XLA fuses into the softmax; the same probabilities, see
    `kbert.backend.key_mask_as_bias`). A row whose keys are all padding (an all-padding
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
        attention_implementation: which computation the layer uses. `"auto"` (the
            backend's fused path, as described above), `"plain"` (kbert's softmax-matmul
            in `keras.ops` on every backend), `"fused"` (`keras.ops.dot_product_attention`
            on every backend) or `"torch_sdpa"` (torch's `scaled_dot_product_attention`,
            torch backend only). All give the same numbers up to float rounding. Defaults
            to `"auto"`.

    Call arguments:
        inputs: float tensor `(batch_size, sequence_length, hidden_dim)`.
        padding_mask: bool/int tensor `(batch_size, sequence_length)`, true for real tokens,
            or `(batch_size, sequence_length, sequence_length)`, true where a query may attend
            to a key (packed rows).
        training: bool.
        dropout_seed: optional int tensor `(2,)`: the key of the attention-dropout mask
            (see `HashDropout`); drawn from the layer's seed generator when omitted.
        return_attention_scores: bool. Also return the attention probabilities, a tensor
            `(batch_size, num_heads, sequence_length, sequence_length)` in the compute dtype
            (after attention dropout, as Hugging Face's eager attention returns them). The
            fused routes never form them, so such a call takes the explicit softmax route
            (`"plain"`), with the same outputs up to float rounding. Defaults to `False`.
        query_length: int or `None`. Attend from the first `query_length` positions only
            (keys and values still come from every position): the outputs are those
            positions' rows of the full call, for a head that reads only them (the [CLS]
            position of a classifier). `None`: every position. Defaults to `None`.

    Returns:
        The attended values `(batch_size, sequence_length, hidden_dim)` (`query_length`
        rows when given), or the pair `(values, probabilities)` with
        `return_attention_scores=True`.

    Example:
    >>> attention = BertSelfAttention(num_heads=2, hidden_dim=8)
    >>> tuple(attention(np.ones((1, 4, 8)), padding_mask=np.array([[1, 1, 1, 0]])).shape)
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
        attention_implementation="auto",
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
        self.attention_implementation = attention_implementation
        self.kernel_initializer = keras.initializers.get(
            kernel_initializer or keras.initializers.TruncatedNormal(stddev=0.02)
        )

        def projection(name):
            return Dense(
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
        # Backend decisions, made once here rather than in every (possibly compiled) call.
        self._attention_path = backend.attention_path(
            self.compute_dtype, flash_attention, attention_implementation
        )
        self._key_bias = backend.key_mask_as_bias(self.compute_dtype)
        self._one_row_products = backend.one_row_attention_by_products()
        self._flash_unavailable = False
        self._flash_unavailable_reason = (
            backend.flash_unavailable_reason() if flash_attention else None
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

    def call(
        self,
        inputs,
        padding_mask=None,
        training=None,
        dropout_seed=None,
        return_attention_scores=False,
        query_length=None,
    ):
        x = inputs
        # The projections of every position: the query's too unless `query_length` cuts it.
        projections = (self.key_dense, self.value_dense)
        if query_length is None:
            projections = (self.query_dense, *projections)
        else:
            query_length = _check_query_length(query_length)
        projected = backend.int8_dense_group(projections, x, training)  # int8 on torch: one
        if projected is None:
            projected = [backend.call_sublayer(dense, x) for dense in projections]
        if query_length is not None:
            query = backend.call_sublayer(self.query_dense, x[:, :query_length])
            projected = [query, *projected]
        # (batch, seq, heads, head_dim) each; the query (batch, query_length, ...) when given
        query, key, value = (self._split_heads(p) for p in projected)
        dropout_active = bool(training) and self.dropout > 0

        keys = None  # (batch, seq): which keys are real, or
        pairs = None  # (batch, 1, seq, seq): which keys each query may see
        if padding_mask is not None and len(padding_mask.shape) == 3:
            # A pairwise (batch, query, key) mask, e.g. one document per block of a packed
            # row (see `kbert.layers.embeddings.PackedDocumentMasks`). The (batch, 1, seq,
            # seq) boolean form, which cuDNN (JAX) and torch SDPA accept.
            pairs = ops.cast(padding_mask, "bool")
            if query_length is not None:
                pairs = pairs[:, :query_length, :]
            empty = ops.logical_not(ops.any(pairs, axis=-1, keepdims=True))  # (batch, q, 1)
            pairs = ops.logical_or(pairs, empty)[:, None, :, :]
        elif padding_mask is not None:
            keys = ops.cast(padding_mask, "bool")  # (batch, seq)
            # Rows with no real key at all would softmax over nothing: let them see everything.
            empty = ops.logical_not(ops.any(keys, axis=-1, keepdims=True))  # (batch, 1)
            keys = ops.logical_or(keys, empty)

        probabilities = None  # (batch, heads, seq, seq), formed by the explicit route only
        # TensorFlow on CPU: a one-row query by products and sums, not oneDNN's einsums (see
        # `kbert.backend.one_row_attention_by_products`).
        by_products = query_length == 1 and self._one_row_products
        explicit = return_attention_scores or self._attention_path == "explicit" or by_products
        if self._attention_path == "torch" and not return_attention_scores:
            # torch's SDPA kernels broadcast a (batch, 1, 1, seq) boolean mask themselves.
            mask = pairs if keys is None else keys[:, None, None, :]
            rate = self.dropout if dropout_active else 0.0
            context = backend.torch_attention(query, key, value, mask, rate)
        else:
            mask, bias = pairs, None
            if keys is not None and self._key_bias and not (dropout_active or explicit):
                # (batch, 1, 1, seq): 0 for real keys, -1e9 for padding (see
                # `kbert.backend.key_mask_as_bias`).
                bias = ops.where(keys, 0.0, -1e9)[:, None, None, :]
            elif keys is not None:
                # A full (batch, 1, seq, seq) mask, broadcast over heads only: cuDNN's fused
                # attention (JAX) refuses a (batch, 1, 1, seq) mask ("Bias must have same seq
                # length as QKV").
                length = ops.shape(keys)[1]
                queries = length if query_length is None else ops.shape(query)[1]
                mask = ops.broadcast_to(
                    keys[:, None, None, :], (ops.shape(keys)[0], 1, queries, length)
                )
            context = None  # (batch, seq, heads, head_dim) once computed
            if dropout_active and not explicit:
                # torch's fused attention takes the dropout itself (and picks flash where it can).
                context = backend.attention_with_dropout(query, key, value, mask, self.dropout)
                if context is None and self.flash_attention:
                    self._warn_flash_fallback(
                        "the fused attention op has no attention dropout; training with "
                        f"attention dropout {self.dropout} uses the explicit softmax path"
                    )
            if context is None and (dropout_active or explicit):
                context, probabilities = self._explicit_attention(
                    query, key, value, mask, training, dropout_seed, by_products
                )
            elif context is None:
                context = self._fused_attention(query, key, value, mask, bias)
        batch, length = ops.shape(query)[0], ops.shape(query)[1]
        context = ops.reshape(context, (batch, length, self.hidden_dim))
        outputs = backend.call_sublayer(self.output_dense, context)  # (batch, seq, hidden)
        return (outputs, probabilities) if return_attention_scores else outputs

    def _fused_attention(self, query, key, value, mask, bias=None):
        """`keras.ops.dot_product_attention`, falling back from a flash kernel the backend lacks."""
        if self.flash_attention and not self._flash_unavailable:
            reason = self._flash_unavailable_reason
            if reason is not None:
                # Known before trying: no attempt, so no backend error or logged traceback.
                self._flash_unavailable = True
                self._warn_flash_fallback(reason)
        if self.flash_attention and not self._flash_unavailable:
            try:
                return ops.dot_product_attention(
                    query, key, value, bias=bias, mask=mask, flash_attention=True
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
        return ops.dot_product_attention(
            query, key, value, bias=bias, mask=mask, flash_attention=flash
        )

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

    def _explicit_attention(
        self, query, key, value, mask, training, dropout_seed=None, by_products=False
    ):
        """`(context, probabilities)` of `softmax(q k^T / sqrt(d) + mask)` in `keras.ops`: by
        einsums, or (`by_products`) by broadcast products summed over the contracted axis."""
        scale = 1.0 / math.sqrt(self.head_dim)
        query = query * ops.cast(scale, query.dtype)
        if by_products:  # (batch, q, 1, heads, hd) x (batch, 1, k, heads, hd), summed over hd
            # in float32, as a matmul accumulates.
            products = ops.cast(query, "float32")[:, :, None] * ops.cast(key, "float32")[:, None]
            scores = ops.sum(products, axis=-1)
            scores = ops.transpose(scores, (0, 3, 1, 2))  # (batch, heads, q, k)
        else:
            scores = ops.einsum("bqhd,bkhd->bhqk", query, key)
        scores = ops.cast(scores, "float32")  # (batch, heads, seq, seq), softmax in float32
        if mask is not None:
            scores = ops.where(mask, scores, ops.cast(-1e9, "float32"))
        probabilities = ops.cast(ops.softmax(scores, axis=-1), self.compute_dtype)
        probabilities = self.probability_dropout(
            probabilities, training=training, seed=dropout_seed
        )
        if by_products:  # (batch, q, k, heads, 1) x (batch, 1, k, heads, hd), summed over k
            weights = ops.cast(ops.transpose(probabilities, (0, 2, 3, 1)), "float32")[..., None]
            context = ops.sum(weights * ops.cast(value, "float32")[:, None], axis=2)
            context = ops.cast(context, value.dtype)
        else:
            context = ops.einsum("bhqk,bkhd->bqhd", probabilities, value)
        return context, probabilities  # context: (batch, q, heads, hd)

    def compute_output_spec(
        self, inputs, *args, return_attention_scores=False, query_length=None, **kwargs
    ):
        batch, length = inputs.shape[0], inputs.shape[1]
        queries = length if query_length is None else _check_query_length(query_length)
        if query_length is not None and length is not None:
            queries = min(queries, length)
        outputs = keras.KerasTensor((batch, queries, *inputs.shape[2:]), dtype=self.compute_dtype)
        if not return_attention_scores:
            return outputs
        scores_shape = (batch, self.num_heads, queries, length)
        return outputs, keras.KerasTensor(scores_shape, dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "hidden_dim": self.hidden_dim,
                "dropout": self.dropout,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "flash_attention": self.flash_attention,
                "attention_implementation": self.attention_implementation,
            }
        )
        return config


def _check_query_length(query_length):
    """`query_length` as an int, or a ValueError saying what was received."""
    if isinstance(query_length, bool) or not hasattr(query_length, "__index__") or query_length < 1:
        raise ValueError(
            f"`query_length` must be a positive integer or None. Received: {query_length!r}"
        )
    return int(query_length)
