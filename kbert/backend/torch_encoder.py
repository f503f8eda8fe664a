"""`BertBackbone`'s forward pass as plain torch calls: the lean eager path on torch.

On eager torch every Keras layer call runs Python bookkeeping (argument binding, name scopes,
autocast, masks) and every weight read under a mixed-precision policy casts the weight again;
for a small model on short texts that host work costs more than the arithmetic (figures in
BENCHMARKS.md, "Host cost on torch"). `backbone_outputs` computes what the backbone's
functional graph computes, from the same Keras variables, with one torch call per kernel:

- each projection is one `addmm` (the bias added inside the product) on the kernel in Keras'
  `(in, out)` layout, no transpose; under mixed precision the query, key and value kernels
  are joined into one product (one `cat` and one cast of the joined kernel), in float32 they
  are read in place by three products (no copy);
- attention is `scaled_dot_product_attention` with the boolean key mask (with dropout:
  `kbert.backend.torch.attention_heads`, the same random draws as the layers' route);
- under a mixed policy each weight is cast to the compute dtype once per forward pass (what
  `torch.autocast` does), LayerNorms compute in float32 as the layers do, and the three
  embeddings are summed in float32 before their LayerNorm (the layers sum them in the
  compute dtype: the same value up to the compute dtype's rounding);
- dropout masks are drawn by `kbert.backend.torch.dropout` in the layers' order (embeddings,
  then per block: attention probabilities, attention output, feed-forward output), so a
  seeded training step draws the masks the layers draw.

Gradients reach the Keras variables themselves (their torch `Parameter`s), so `fit`, the
optimizer, checkpoints and LoRA see no difference. `backbone_outputs` answers `None` for what
it does not cover, and the caller runs the functional graph: packed rows, attention
probabilities as outputs, rematerialisation in training, quantized layers, embedding tables
with LoRA (Keras' `Embedding.enable_lora`), another attention implementation than the
default, meta-device (symbolic) tensors.
"""

import functools
import weakref

import keras
import torch
import torch.nn.functional as F

from kbert.backend import torch as torch_paths

ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_approximate": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "tanh": torch.tanh,
}

TORCH_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}


class Linear:
    """A Keras `Dense` (with bias) as its torch kernel `(in, out)` and bias; with LoRA enabled
    its kernel is Keras' `kernel` property (the update added), read at each call."""

    __slots__ = ("layer", "policy", "lora", "kernel", "bias")

    def __init__(self, layer):
        self.layer = layer
        self.policy = layer.dtype_policy
        self.lora = layer.lora_enabled
        # With LoRA, `layer.kernel` is the sum, not a variable: read at each call instead.
        self.kernel = None if self.lora else parameter(layer, layer.kernel)
        self.bias = parameter(layer, layer.bias)

    def current(self):
        """Whether the layer still computes from what was read at build (no quantization,
        no other dtype policy, LoRA enabled as it was)."""
        return self.layer.dtype_policy is self.policy and self.layer.lora_enabled == self.lora

    def weights(self):
        """`(kernel, bias)` as the layer computes with them: LoRA's update added."""
        if self.lora:
            return torch_kernel(self.layer), self.bias
        return self.kernel, self.bias


def torch_kernel(layer):
    """A LoRA-enabled `Dense`'s kernel with the update added (Keras' `kernel` property)."""
    return keras.ops.convert_to_tensor(layer.kernel)


def parameter(layer, variable):
    """The torch `Parameter` that holds `variable` (a variable of `layer`), or a ValueError.

    Read inside `_OwnValues`' call, where no autocast scope casts it.
    """
    parameter = variable.value
    dtype = TORCH_DTYPES.get(keras.backend.standardize_dtype(variable.dtype))
    if (
        not isinstance(parameter, torch.nn.Parameter)
        or parameter.dtype != dtype
        or tuple(parameter.shape) != tuple(variable.shape)
    ):
        raise ValueError(f"No torch parameter of the variable {variable.path}")
    return parameter


class _OwnValues(keras.layers.Layer):
    """Runs `function()` inside a Keras layer call that does not autocast.

    Under a mixed-precision policy a Keras variable read inside a layer's call is cast to the
    compute dtype (a new tensor); a layer made with `autocast=False` reads the variables'
    own values (the torch `Parameter`s that gradients must reach) even inside another
    layer's call.
    """

    def __init__(self, function):
        super().__init__(autocast=False, dtype="float32")
        self.function = function
        self.result = None

    def call(self, inputs):
        self.result = self.function()
        return inputs


def without_autocast(function):
    reader = _OwnValues(function)
    reader(torch.zeros(()))
    return reader.result


class _Block:
    """One `TransformerEncoder`'s weights and settings."""

    def __init__(self, layer):
        attention = layer.self_attention
        self.layer = layer
        self.query = Linear(attention.query_dense)
        self.key = Linear(attention.key_dense)
        self.value = Linear(attention.value_dense)
        self.attention_output = Linear(attention.output_dense)
        self.intermediate = Linear(layer.intermediate_dense)
        self.output = Linear(layer.output_dense)
        self.linears = (
            self.query,
            self.key,
            self.value,
            self.attention_output,
            self.intermediate,
            self.output,
        )
        self.attention_norm = norm_weights(layer.attention_layer_norm)
        self.output_norm = norm_weights(layer.output_layer_norm)
        self.num_heads = attention.num_heads
        self.head_dim = attention.head_dim
        # Dropout rates are read from these at each call, as the layers read them.
        self.attention = attention
        self.attention_dropout = layer.attention_dropout_layer
        self.output_dropout = layer.output_dropout_layer
        self.activation = ACTIVATIONS[layer.activation]


def norm_weights(layer):
    """`(gamma, beta, layer)` of a `keras.layers.LayerNormalization` (its `epsilon` read at
    each call, as the layer reads it)."""
    axis = list(layer.axis) if isinstance(layer.axis, (list, tuple)) else [layer.axis]
    if not (layer.center and layer.scale) or getattr(layer, "rms_scaling", False) or axis != [-1]:
        raise ValueError("Only a last-axis LayerNormalization with center and scale")
    return parameter(layer, layer.gamma), parameter(layer, layer.beta), layer


class _Plan:
    """Everything `backbone_outputs` reads from a backbone, gathered once."""

    def __init__(self, backbone):
        embeddings = backbone.embeddings
        self.tables = tuple(
            parameter(layer, layer.embeddings)
            for layer in (
                embeddings.token_embedding,
                embeddings.position_embedding,
                embeddings.segment_embedding,
            )
        )
        self.embedding_layers = (
            embeddings.token_embedding,
            embeddings.position_embedding,
            embeddings.segment_embedding,
        )
        self.embedding_policies = tuple(layer.dtype_policy for layer in self.embedding_layers)
        self.embedding_norm = norm_weights(embeddings.layer_norm)
        self.embedding_dropout = embeddings.dropout_layer  # its rate read at each call
        self.pad_token_id = embeddings.pad_token_id
        self.blocks = [_Block(layer) for layer in backbone.transformer_layers]
        self.pooler = Linear(backbone.pooler.dense)
        self.linears = [linear for block in self.blocks for linear in block.linears]
        self.linears.append(self.pooler)
        self.compute_dtype = TORCH_DTYPES[backbone.dtype_policy.compute_dtype]

    def current(self):
        """Whether every layer still computes from what was read: the projections (see
        `Linear.current`), and the embedding tables with their dtype policy and no LoRA (Keras'
        `Embedding.enable_lora` adds an update to a table; a plan is never built with one)."""
        return all(linear.current() for linear in self.linears) and all(
            layer.dtype_policy is policy and not layer.lora_enabled
            for layer, policy in zip(self.embedding_layers, self.embedding_policies)
        )


_PLANS = weakref.WeakKeyDictionary()


def _plan(backbone):
    """The backbone's `_Plan`, built on first use and again after a quantization; `None`
    where the lean path does not apply to its layers, and while `torch.compile` traces a
    call for which no plan was built eagerly (building one makes a Keras layer)."""
    plan = _PLANS.get(backbone)
    if plan is not None and plan.current():
        return plan
    if torch.compiler.is_compiling():
        return None
    return prepare(backbone, without_autocast)


def prepare(backbone, run=lambda function: function()):
    """Builds (or rebuilds) `backbone`'s plan, so that a later compiled call finds it."""
    try:
        plan = run(lambda: _Plan(backbone))
    except (ValueError, KeyError, AttributeError, TypeError):
        plan = None
    if plan is None or not plan.current():
        _PLANS.pop(backbone, None)
        return None
    _PLANS[backbone] = plan
    return plan


def covers(backbone, training):
    """Whether `backbone_outputs` computes this call of `backbone` (its plan built if needed)."""
    return supported(backbone, training) and _plan(backbone) is not None


def supported(backbone, training):
    """Whether `backbone_outputs` computes this backbone's call."""
    if backbone.packed or backbone.output_attentions or (backbone.remat and training):
        return False
    return all(
        layer.self_attention._attention_path == "torch" for layer in backbone.transformer_layers
    )


def backbone_outputs(backbone, token_ids, segment_ids, padding_mask, training, first_token_only):
    """The outputs dict of `backbone` on int32 torch tensors `(batch, seq)`, or `None`.

    `first_token_only`: the last block computes the first row only (see
    `BertBackbone.call`). Hidden states are returned when the backbone was built with
    `output_hidden_states`.
    """
    if token_ids.device.type == "meta" or not supported(backbone, training):
        return None
    plan = _plan(backbone)
    if plan is None:
        return None
    dtype = plan.compute_dtype
    training = bool(training)
    x = _embeddings(plan, token_ids, segment_ids, training)  # (batch, seq, hidden)
    keys = padding_mask.bool()
    # Rows with no real key at all would softmax over nothing: let them see everything.
    keys = keys | ~keys.any(dim=-1, keepdim=True)
    mask = keys[:, None, None, :]  # (batch, 1, 1, seq): torch's SDPA broadcasts it
    hidden_states = [x] if backbone.output_hidden_states else None
    last = len(plan.blocks) - 1
    cut = first_token_only and not backbone.output_hidden_states
    for index, block in enumerate(plan.blocks):
        x = _block(block, x, mask, training, dtype, 1 if cut and index == last else None)
        if hidden_states is not None:
            hidden_states.append(x)
    kernel, bias = plan.pooler.weights()
    pooled = torch.tanh(torch.addmm(cast(bias, dtype), x[:, 0], cast_kernel(kernel, dtype)))
    outputs = {"sequence_output": x, "pooled_output": pooled}
    if hidden_states is not None:
        outputs["hidden_states"] = tuple(hidden_states)
    return outputs


def cast(tensor, dtype):
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


def dropout(x, rate, training):
    """`x` through inverted dropout of `rate` in training (a dropout layer's call on torch)."""
    if not training or rate <= 0:
        return x
    if rate >= 1:
        return torch.zeros_like(x)
    return torch_paths.dropout(x, rate, torch_paths.process_slice())


def layer_norm(x, norm, dtype):
    """`x` through the LayerNorm `norm` (`norm_weights`) in float32, cast back to `dtype`."""
    gamma, beta, layer = norm
    y = F.layer_norm(cast(x, torch.float32), gamma.shape, gamma, beta, layer.epsilon)
    return cast(y, dtype)


def _embeddings(plan, token_ids, segment_ids, training):
    token_table, position_table, segment_table = plan.tables
    length = token_ids.shape[1]
    tokens = F.embedding(token_ids, token_table)  # (batch, seq, hidden)
    if plan.pad_token_id is not None and tokens.requires_grad:
        # The [PAD] row takes no gradient (Hugging Face's `padding_idx`).
        tokens = torch.where((token_ids == plan.pad_token_id)[..., None], tokens.detach(), tokens)
    x = tokens + position_table[:length] + F.embedding(segment_ids, segment_table)
    x = layer_norm(x, plan.embedding_norm, plan.compute_dtype)
    return dropout(x, plan.embedding_dropout.rate, training)


def transposed_casts(device):
    """Whether cast copies of kernels on `device` are laid out as `(out, in)` (see
    `cast_kernel`): on a CPU without AVX-512, where torch's bfloat16 product runs several
    times faster on that layout. With AVX-512 (oneDNN's bfloat16 kernels) the product runs
    as fast on either layout while a transposing cast costs several contiguous ones; a GPU's
    BLAS reads either layout too (figures: BENCHMARKS.md, "Host cost on torch")."""
    return device.type == "cpu" and not _cpu_has_avx512()


@functools.cache
def _cpu_has_avx512():
    return torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def cast_kernel(kernel, dtype):
    """`kernel` `(in, out)` in `dtype`: a contiguous cast, or where `transposed_casts` says so
    the transposed view of a contiguous `(out, in)` copy. In Keras' `(in, out)` layout the
    float32 gradient also reaches the variable in its own layout (autograd takes it as it
    is, no copy per kernel)."""
    if kernel.dtype == dtype:
        return kernel
    if not transposed_casts(kernel.device):
        return kernel.to(dtype)
    return kernel.t().to(dtype, memory_format=torch.contiguous_format).t()


def _joined_kernel(kernels, dtype):
    """The `(in, sum of outs)` kernel of several `(in, out)` kernels side by side, cast once
    (laid out as `(out, in)` rows where `transposed_casts` says so)."""
    if not transposed_casts(kernels[0].device):
        return cast(torch.cat(kernels, dim=1), dtype)
    return cast(torch.cat([kernel.t() for kernel in kernels]), dtype).t()


def project(x, kernel, bias, dtype):
    """`x @ kernel + bias` for `x` `(..., in)`, in one `addmm`; `kernel` already in `dtype`."""
    y = torch.addmm(cast(bias, dtype), x.reshape(-1, x.shape[-1]), kernel)
    return y.view(*x.shape[:-1], -1)


def linear(x, dense, dtype):
    """`x` `(..., in)` through the `Linear` `dense`, its kernel and bias cast to `dtype`."""
    kernel, bias = dense.weights()
    return project(x, cast_kernel(kernel, dtype), bias, dtype)


def _heads(x, weights, dtype, heads, head_dim):
    """Each `(kernel, bias)` of `weights` applied to `x` `(batch, seq, in)` and split into
    heads: a tuple of `(batch, heads, seq, head_dim)`. Kernels already in `dtype` are read in
    place, one product each (no copy; an exported graph keeps them constant, so int8
    quantization sees them); several kernels to cast are joined into one product (one `cat`
    and one cast)."""
    batch, length = x.shape[0], x.shape[1]
    kernels = [kernel for kernel, _ in weights]
    if len(weights) == 1 or kernels[0].dtype == dtype:
        return tuple(
            project(x, cast_kernel(kernel, dtype), bias, dtype)
            .view(batch, length, heads, head_dim)
            .transpose(1, 2)
            for kernel, bias in weights
        )
    joined = project(x, _joined_kernel(kernels, dtype), torch.cat([b for _, b in weights]), dtype)
    # (len(weights), batch, heads, seq, head_dim)
    joined = joined.view(batch, length, len(weights), heads, head_dim).permute(2, 0, 3, 1, 4)
    return joined.unbind(0)


def _block(block, x, mask, training, dtype, query_length):
    batch, _, hidden = x.shape
    heads, head_dim = block.num_heads, block.head_dim
    q, k, v = (p.weights() for p in (block.query, block.key, block.value))
    if query_length is None:
        query, key, value = _heads(x, (q, k, v), dtype, heads, head_dim)
        residual = x
    else:  # the first `query_length` rows only attend (to every key)
        key, value = _heads(x, (k, v), dtype, heads, head_dim)
        residual = x[:, :query_length]
        (query,) = _heads(residual, (q,), dtype, heads, head_dim)
    rate = block.attention.dropout if training else 0.0
    context = torch_paths.attention_heads(query, key, value, mask, rate)  # (b, h, q, d)
    context = context.transpose(1, 2).reshape(batch, -1, hidden)
    attended = linear(context, block.attention_output, dtype)
    attended = dropout(attended, block.attention_dropout.rate, training)
    x = layer_norm(residual + attended, block.attention_norm, dtype)
    intermediate = block.activation(linear(x, block.intermediate, dtype))
    output = linear(intermediate, block.output, dtype)
    output = dropout(output, block.output_dropout.rate, training)
    return layer_norm(x + output, block.output_norm, dtype)
