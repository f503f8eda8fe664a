"""The torch side of kbert's speed paths: torch calls that compute what a layer's `keras.ops`
form computes, with fewer kernels or less host work.

Imported by `kbert.backend.paths` only when the Keras backend is torch (it imports torch).
Each function is the torch answer to one hook there:

- `linear`: matmul and bias in one BLAS call (`fused_dense`);
- `dropout`: inverted dropout with a cheaper CPU mask (`native_dropout`);
- `attention`: `scaled_dot_product_attention` called directly (`torch_attention`,
  `attention_with_dropout`);
- `adamw_update`: `BertAdamW`'s update for all variables at once by `torch.optim.AdamW`'s fused
  kernel (`adamw_update`);
- `cuda_available`: whether a flash kernel can exist (`flash_unavailable_reason`);
- `int8_linears`: int8 `Dense` layers through torch's dynamic int8 linear kernel
  (fbgemm / oneDNN on x86, QNNPACK on ARM), several on the same inputs in one product
  (`int8_dense`, `int8_dense_group`).
"""

import functools
import weakref

import torch
from keras import ops

from kbert.backend.cpu import int8_products_saturate


def linear(inputs, kernel, bias):
    """`inputs @ kernel + bias` in one `torch.nn.functional.linear` call.

    Keras' `Dense` runs `matmul` and then `add` as two kernels; `linear` is one BLAS call that
    adds the bias as it writes the product (what `torch.nn.Linear` does). On the CPU the
    separate bias pass was about a tenth of an encoder's forward time (it reads and writes every
    activation once more). `kernel` is Keras' `(in, out)` layout.
    """
    return torch.nn.functional.linear(inputs, kernel.t(), bias)


def cuda_available():
    """Whether torch sees a CUDA device."""
    return torch.cuda.is_available()


def process_slice():
    """`(rank, world_size)` of the started `torch.distributed` process group (one process per
    slice of each global batch, `kbert.distribution.initialize`); `(0, 1)` without one."""
    distributed = torch.distributed
    if not (distributed.is_available() and distributed.is_initialized()):
        return 0, 1
    return distributed.get_rank(), distributed.get_world_size()


def dropout(inputs, rate, batch_slice=(0, 1)):
    """Inverted dropout on torch, with the mask drawn as `torch.rand(...) >= rate` on CPU.

    `torch.nn.functional.dropout` draws its CPU mask with `bernoulli_`; `torch.rand` plus an
    in-place comparison is cheaper (see BENCHMARKS.md). The mask has the same law (each
    element kept with probability `1 - rate`, kept values scaled by `1 / (1 - rate)`) and
    comes from torch's global generator, which `keras.utils.set_random_seed` seeds and
    `torch.utils.checkpoint` restores. On GPU the native fused dropout is used.

    `batch_slice=(index, count)` (`kbert.backend.batch_slice`): `inputs` are slice `index` of
    `count` equal slices of the global batch, one per process. On CPU the uniform draws are
    then made for the whole global batch (torch's CPU generator fills them in order) and
    this process keeps its rows, so its mask is the one a single process draws for the same
    batch: training over processes equals training in one. On GPU each process draws its own
    slice's mask (same law, not the single process' bits).
    """
    if inputs.device.type != "cpu":
        return torch.nn.functional.dropout(inputs, p=rate, training=True)
    index, count = batch_slice
    shape = tuple(inputs.shape)
    if count > 1 and shape:
        draws = torch.rand((shape[0] * count,) + shape[1:], device=inputs.device)
        draws = draws[index * shape[0] : (index + 1) * shape[0]]
    else:
        draws = torch.rand(shape, device=inputs.device)
    # In place on the uniform draws: 0 or 1 / (1 - rate), with no boolean tensor to convert.
    scale = draws.ge_(rate).mul_(1.0 / (1.0 - rate))
    return inputs * scale.to(inputs.dtype)


def attention(query, key, value, mask, rate=0.0):
    """Softmax attention (with dropout on the probabilities when `rate > 0`), in torch ops.

    Inputs and output are `(batch, seq, heads, head_dim)`; see `attention_heads`.
    """
    query, key, value = (t.transpose(1, 2) for t in (query, key, value))  # (batch, heads, seq, dim)
    return attention_heads(query, key, value, mask, rate).transpose(1, 2)


def attention_heads(query, key, value, mask, rate=0.0):
    """Softmax attention of `(batch, heads, seq, head_dim)` inputs, in that layout.

    Without dropout: `torch.nn.functional.scaled_dot_product_attention` with the boolean
    `mask` (true where a key may be attended; it broadcasts to `(batch, heads, seq, seq)`),
    on every device. With dropout, on GPU: `torch.nn.functional.scaled_dot_product_attention(...,
    dropout_p=rate)`, whose fused kernels draw the dropout themselves. On CPU that op
    has no fused dropout and falls
    back to softmax + `bernoulli_` internally; the same arithmetic written out with
    `dropout`'s cheaper mask is faster forward + backward. Either way: scale
    1/sqrt(head_dim), boolean key mask, probabilities dropped with `rate` and scaled by
    1/(1-rate), masks from torch's generator (so `torch.utils.checkpoint` replays them).
    """
    if not rate:
        return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask)
    if query.device.type != "cpu":
        return torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=rate
        )
    scores = torch.matmul(query * query.shape[-1] ** -0.5, key.transpose(-1, -2)).float()
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e9)
    probabilities = torch.softmax(scores, dim=-1).to(value.dtype)
    probabilities = dropout(probabilities, rate, process_slice())
    return torch.matmul(probabilities, value)


def adamw_update(optimizer, grads, variables, learning_rate, clip_norm=None, decays=None):
    """`BertAdamW.update_step` for all `variables` at once, kept out of `torch.compile`; with
    `clip_norm` and `decays`, the whole update: global-norm clipping (`clip_by_global_norm`),
    the decoupled weight decay of the variables whose `decays` entry is true (torch's AdamW
    applies `variable *= 1 - learning_rate * weight_decay` before the update, as Keras does)
    and the update, on one list of the variables' tensors.

    The torch optimizer's `step()` runs its own fused kernel; traced inside a compiled train
    step (`jit_compile=True`) it broke the graph several times and made each step far slower
    (figures in BENCHMARKS.md, "Host overhead on torch"). Excluded with
    `torch.compiler.disable`, it runs as one eager call between the compiled gradient and the
    next step. See `_torch_adamw_update` for the update itself.
    """
    _eager_torch_adamw_update()(optimizer, grads, variables, learning_rate, clip_norm, decays)


@functools.cache
def _eager_torch_adamw_update():
    """`_torch_adamw_update` under `torch.compiler.disable`, made once."""
    return torch.compiler.disable(_torch_adamw_update)


# The `torch.optim.AdamW` of each `BertAdamW`, with the parameters it was built for.
_TORCH_ADAMW = weakref.WeakKeyDictionary()


def torch_adamw(optimizer):
    """The `torch.optim.AdamW` that runs `optimizer`'s updates on torch, or `None` before any."""
    cached = _TORCH_ADAMW.get(optimizer)
    return None if cached is None else cached[1]


def _torch_adamw_update(optimizer, grads, variables, learning_rate, clip_norm=None, decays=None):
    """`BertAdamW.update_step` for all `variables` at once with `torch.optim.AdamW`.

    A `torch.optim.AdamW(weight_decay=0)` (Keras applies the decoupled decay before this call,
    to the variables that take it), or with `decays` one parameter group of the variables that
    take the optimizer's `weight_decay` and one of those that take none, over the variables'
    tensors, whose state tensors are the
    Keras optimizer's own moment variables (`optimizer.moments(variable)`), so checkpoints and
    the per-variable `update_step` see the same moments. Its update is exactly the one
    `BertAdamW.update_step` writes. It runs the fused kernel (`fused=True`) where torch has one
    for every parameter (CPU and CUDA floats), its multi-tensor `foreach` form otherwise. The
    torch optimizer is built once per set of variables. Its step counts are views of one
    tensor set to `optimizer.iterations` before every update (one op, no host read), so they
    follow the Keras optimizer whatever restored or changed its state.
    """
    params = [variable.value for variable in variables]
    decay = None if decays is None else float(optimizer.weight_decay or 0.0)
    key = (tuple(id(p) for p in params), decay, None if decays is None else tuple(decays))
    cached = _TORCH_ADAMW.get(optimizer)
    if cached is None or cached[0] != key:
        cached = (key, *_build_torch_adamw(optimizer, variables, params, decays, decay))
        _TORCH_ADAMW[optimizer] = cached
    _, torch_optimizer, steps = cached
    groups = torch_optimizer.param_groups
    learning_rate = ops.cast(learning_rate, "float32")  # a schedule's tensor or a Variable
    with torch.no_grad():
        if clip_norm:
            grads = _clipped(grads, clip_norm, [g is p.grad for g, p in zip(grads, params)])
        steps.copy_(ops.cast(optimizer.iterations, "float32").detach().expand(steps.shape))
        for param, grad in zip(params, grads):
            param.grad = grad if grad.dtype == param.dtype else grad.to(param.dtype)
        if groups[0]["fused"]:
            rate = learning_rate.detach().to(params[0].device)
        else:
            rate = float(learning_rate)
        for group in groups:
            group["lr"] = rate
        torch_optimizer.step()
        for param in params:
            param.grad = None


def clip_by_global_norm(grads, clip_norm, variables=None):
    """Keras' `clip_by_global_norm` (see `kbert.backend.paths.clip_by_global_norm`): the norm
    of all gradients by `torch.nn.utils.get_total_norm` (its multi-tensor form on a GPU), then
    Keras' scale, `clip_norm * min(1 / norm, 1 / clip_norm) + (norm - norm)`.

    A gradient that is its variable's own `.grad` (what a train step hands the optimizer, and
    what the update releases after it) is scaled in place, as `torch.nn.utils.clip_grad_norm_`
    does; every other gradient is left as it is and a scaled copy returned.
    """
    with torch.no_grad():
        return _clipped(grads, clip_norm, _own_grads(grads, variables))


def _clipped(grads, clip_norm, owned):
    """`grads` clipped to the global norm `clip_norm`: those whose `owned` entry is true scaled
    in place, the others as scaled copies (`None` kept)."""
    present = [g for g in grads if g is not None]
    if not present:
        return list(grads)
    norm = torch.nn.utils.get_total_norm(present, 2.0)
    scale = torch.clamp(1.0 / norm, max=1.0 / clip_norm) * clip_norm + (norm - norm)
    _scale_in_place([g for g, own in zip(grads, owned) if own], scale)
    return [g if g is None or own else g * scale.to(g.dtype) for g, own in zip(grads, owned)]


def _own_grads(grads, variables):
    """Whether each gradient is the `.grad` of its variable's tensor."""
    if variables is None:
        return [False] * len(grads)
    return [
        g is not None and getattr(getattr(v, "value", None), "grad", None) is g
        for g, v in zip(grads, variables)
    ]


def _scale_in_place(tensors, scale):
    """`tensor *= scale` for each tensor: one multi-tensor call where torch has the public
    `torch.foreach` (each tensor's own product otherwise), no new tensors."""
    if not tensors:
        return
    by_dtype = {}
    for tensor in tensors:
        by_dtype.setdefault(tensor.dtype, []).append(tensor)
    foreach = getattr(torch, "foreach", None)
    for dtype, group in by_dtype.items():
        factor = scale.to(dtype)
        if foreach is not None and hasattr(foreach, "mul_"):
            foreach.mul_(group, factor)
        else:
            for tensor in group:
                tensor.mul_(factor)


# Whether `adamw_update` may use torch's fused AdamW kernel (tests turn it off to check the
# multi-tensor form against it).
FUSED_ADAMW = True


def _build_torch_adamw(optimizer, variables, params, decays=None, decay=None):
    """`(torch.optim.AdamW, steps)`: the torch optimizer and the tensor its step counts view;
    with `decays`, a group of the parameters that take the weight decay `decay` and one of
    those that take none."""
    fused = FUSED_ADAMW and all(
        p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params
    )
    fused = fused and len({p.device for p in params}) == 1
    groups = [{"params": params}]
    if decays is not None:
        groups = [
            {"params": [p for p, d in zip(params, decays) if d == wanted], "weight_decay": rate}
            for wanted, rate in ((True, decay), (False, 0.0))
            if wanted in decays
        ]
    torch_optimizer = torch.optim.AdamW(
        groups,
        lr=0.0,  # Set before every step (a tensor with the fused kernel: no host read).
        betas=(float(optimizer.beta_1), float(optimizer.beta_2)),
        eps=float(optimizer.epsilon),
        weight_decay=0.0,
        fused=fused or None,
        foreach=None if fused else True,
    )
    # The fused kernel reads its step counts on the parameters' device, the foreach form on CPU.
    steps = torch.zeros(
        len(params), dtype=torch.float32, device=params[0].device if fused else "cpu"
    )
    for position, (variable, param) in enumerate(zip(variables, params)):
        m, v = optimizer.moments(variable)
        torch_optimizer.state[param] = {
            "step": steps[position],
            "exp_avg": m.value,
            "exp_avg_sq": v.value,
        }
    return torch_optimizer, steps


# ------------------------------------------------------------------------------ int8 linear
# The packed torch weight of each group of int8 `Dense` layers (`int8_linears`), by first layer.
_INT8_GROUPS = weakref.WeakKeyDictionary()


def int8_linears(layers, inputs):
    """The outputs of the int8 `Dense` `layers` (one or several on the same `inputs`, e.g. the
    attention's query, key and value) from torch's dynamic int8 linear kernel
    (`torch.ops.quantized.linear_dynamic`), in one product over their kernels side by side.

    Keras' int8 `Dense` keeps the kernel as int8 with one scale per output unit
    (`kernel_scale`: `kernel ~= int8 / scale`) and, at every call, quantises the inputs per
    row and runs an int8 matmul that no CPU backend turns into a VNNI kernel. This path hands
    the same int8 kernels and scales, with the biases, to torch's dynamic int8 linear operator
    (what `torch.ao.quantization.quantize_dynamic`'s layers call): the inputs are quantised to
    uint8 once per call with one scale per tensor (8 bits where the CPU has VNNI, 7 where its
    products saturate: `kbert.backend.cpu.int8_products_saturate`; on all-MiniLM-L6-v2 the
    eighth bit moves the int8 embeddings' mean cosine to float32 from 0.980 to 0.994), so each
    layer's output is what its own call would give, and the product
    runs on the quantized engine's int8 kernel (fbgemm / oneDNN with VNNI on x86), the bias
    and the de-scaling fused in. The weights are exactly the layers'; the outputs differ from
    Keras' int8 path only by the inputs' quantisation (per tensor instead of per row).

    The packed weight is built on the first call and again whenever a layer's scales or its
    variables change identity (`quantize`, `load_weights`, `set_weights` and preset loading
    assign the int8 kernel and its scales together). `None` when the quantized engine cannot
    take the layers (no engine, not float32): the caller then uses Keras' own int8 path.
    """
    engine = torch.backends.quantized.engine
    if engine == "none" or inputs.dtype != torch.float32 or inputs.device.type != "cpu":
        return None
    kernels = [ops.convert_to_tensor(layer.kernel) for layer in layers]
    scales = [ops.convert_to_tensor(layer.kernel_scale) for layer in layers]
    biases = [None if layer.bias is None else ops.convert_to_tensor(layer.bias) for layer in layers]
    cached = _INT8_GROUPS.get(layers[0])
    if (
        cached is None
        or len(cached[0]) != len(layers)
        or any(a is not b for a, b in zip(cached[0], kernels))
        or any(a is not b for a, b in zip(cached[2], biases))
        or not all(torch.equal(a, b) for a, b in zip(cached[1], scales))
    ):
        bias = None
        if any(b is not None for b in biases):
            bias = torch.cat(
                [torch.zeros_like(s) if b is None else b.detach() for b, s in zip(biases, scales)]
            )
        packed = _packed_int8_linear(torch.cat(kernels, dim=1), torch.cat(scales), bias)
        cached = (kernels, [s.clone() for s in scales], biases, packed)
        _INT8_GROUPS[layers[0]] = cached
    with torch.no_grad():
        outputs = torch.ops.quantized.linear_dynamic(
            inputs, cached[3], reduce_range=int8_products_saturate()
        )
    parts = torch.split(outputs, [int(s.shape[0]) for s in scales], dim=-1)
    return [
        part if layer.activation is None else layer.activation(part)
        for part, layer in zip(parts, layers)
    ]


def _packed_int8_linear(kernel, scale, bias):
    """torch's packed int8 weight (`torch.ops.quantized.linear_prepack`) of `kernel / scale`
    as per-channel qint8, with the bias.

    The int8 values are Keras' own: quantising the float kernel `kernel / scale` with the steps
    `1 / scale` per output channel gives them back exactly (each is an integer times its
    channel's step).
    """
    weight = kernel.detach().t().float()  # (out, in), integers
    steps = (1.0 / scale.detach().double()).float()
    quantized = torch.quantize_per_channel(
        weight * steps[:, None],
        steps.double(),
        torch.zeros(weight.shape[0], dtype=torch.int64),
        axis=0,
        dtype=torch.qint8,
    )
    return torch.ops.quantized.linear_prepack(
        quantized, None if bias is None else bias.detach().float()
    )
