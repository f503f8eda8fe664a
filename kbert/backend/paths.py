"""Backend-specific speed paths of kbert, in one place.

kbert's layers and optimizer are written in `keras.ops`; where one backend has a faster way to
compute the same thing, the layer asks this module, which answers with the backend's result
or `None` (meaning: use the portable `keras.ops` form). Every path here computes the same
function as the portable form (same law for random masks) and is covered by the tests of the
layer that calls it:

- dropout masks: a counter-based hash on JAX and TensorFlow (`HashDropout`), torch's global
  generator on torch (`native_dropout`), so `torch.utils.checkpoint` replays masks;
- attention on torch: `scaled_dot_product_attention` called directly, with `dropout_p` on GPU
  (`attention_path`, `torch_attention`, `attention_with_dropout`);
- when the fused attention op cannot run (`fused_attention_unsupported`,
  `flash_unavailable_reason`);
- dense embedding gradients on TensorFlow (`needs_dense_embedding_gradient`);
- the AdamW update of `BertAdamW` for all variables at once on torch (`has_multi_tensor_adamw`,
  `adamw_update`).
"""

import functools
import weakref

import keras
from keras import ops


def hash_dropout_backend():
    """True where dropout masks come from kbert's counter-based hash (JAX, TensorFlow)."""
    return keras.config.backend() in ("jax", "tensorflow")


def native_dropout(inputs, rate):
    """Inverted dropout by the backend itself, or `None` where kbert's hash mask is used."""
    if keras.config.backend() != "torch":
        return None
    return _torch_dropout(inputs, rate)


# The values of `BertSelfAttention(attention_implementation=...)`.
ATTENTION_IMPLEMENTATIONS = ("auto", "plain", "fused", "torch_sdpa")


def attention_path(compute_dtype, flash_attention, implementation="auto"):
    """How `BertSelfAttention` computes attention; decided once, when the layer is made.

    Returns `"torch"` (torch's `scaled_dot_product_attention` called directly, with a boolean
    key mask and the dropout inside: `torch_attention`), `"explicit"` (kbert's plain
    softmax-matmul in `keras.ops`) or `"keras"` (`keras.ops.dot_product_attention`, explicit
    form for attention dropout).

    `implementation` is the layer's `attention_implementation`: `"plain"` -> `"explicit"`,
    `"fused"` -> `"keras"`, `"torch_sdpa"` -> `"torch"` (torch backend only). `"auto"` picks:
    `"torch"` on torch (`flash_attention=True` keeps the Keras op, which honours or refuses
    it), `"explicit"` for JAX-CPU float16 (see `fused_attention_unsupported`), else `"keras"`.
    A choice that cannot run is a ValueError.

    On torch, `keras.ops.dot_product_attention` probes the flash kernel with a pybind
    object on every call and turns the mask into an additive float tensor: a graph break
    under `torch.compile` (`jit_compile=True`) and host work in every eager step. Calling
    `torch.nn.functional.scaled_dot_product_attention` directly computes the same function.
    """
    backend = keras.config.backend()
    if implementation not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(
            f"`attention_implementation` must be one of {list(ATTENTION_IMPLEMENTATIONS)}. "
            f"Received: attention_implementation={implementation!r}"
        )
    if flash_attention and implementation in ("plain", "torch_sdpa"):
        raise ValueError(
            f"`flash_attention=True` needs the fused Keras op, but attention_implementation="
            f'{implementation!r} does not use it. Use attention_implementation="auto" or '
            '"fused" with flash attention.'
        )
    if implementation == "plain":
        return "explicit"
    if implementation == "torch_sdpa":
        if backend != "torch":
            raise ValueError(
                'attention_implementation="torch_sdpa" needs the torch backend. Received '
                f'backend: {backend}. Use "auto", "plain" or "fused".'
            )
        return "torch"
    if implementation == "fused":
        if fused_attention_unsupported(compute_dtype):
            raise ValueError(
                'attention_implementation="fused" cannot run float16 on JAX on CPU (XLA has '
                'no float16 x float16 -> float32 product there). Use "auto" or "plain".'
            )
        return "keras"
    if backend == "torch" and flash_attention is not True:
        return "torch"
    if fused_attention_unsupported(compute_dtype):
        return "explicit"
    return "keras"


def attention_with_dropout(query, key, value, mask, rate):
    """Softmax attention with probability dropout by the backend, or `None` (explicit path).

    Inputs and output are `(batch, seq, heads, head_dim)`; `mask` is boolean and broadcasts to
    `(batch, heads, seq, seq)`.
    """
    if keras.config.backend() != "torch":
        return None
    return torch_attention(query, key, value, mask, rate)


def needs_dense_embedding_gradient():
    """True on TensorFlow, whose gather gradient is an `IndexedSlices` (see
    `DenseGradientEmbedding`)."""
    return keras.config.backend() == "tensorflow"


def has_multi_tensor_adamw():
    """True where `adamw_update` updates all variables at once (torch)."""
    return keras.config.backend() == "torch"


def adamw_update(optimizer, grads, variables, learning_rate):
    """`BertAdamW.update_step` for all `variables` at once, where `has_multi_tensor_adamw()`.

    Args:
        optimizer: the `BertAdamW` (its hyperparameters, `iterations` and `moments(variable)`).
        grads: list of gradients, clipped, one per variable.
        variables: list of the `keras.Variable`s to update (weight decay already applied).
        learning_rate: the rate of this update (a scalar tensor).
    """
    if not has_multi_tensor_adamw():
        raise ValueError(
            f"kbert has no multi-tensor AdamW update on the {keras.config.backend()} backend; "
            "check `has_multi_tensor_adamw()` first."
        )
    _eager_torch_adamw_update()(optimizer, grads, variables, learning_rate)


@functools.cache
def _eager_torch_adamw_update():
    """`_torch_adamw_update` kept out of `torch.compile` (`jit_compile=True`).

    The torch optimizer's `step()` runs its own fused kernel; traced inside a compiled train
    step it broke the graph several times and made each step far slower (figures in
    BENCHMARKS.md, "Host overhead on torch"). Excluded with
    `torch.compiler.disable`, it runs as one eager call between the compiled gradient and the
    next step.
    """
    import torch

    return torch.compiler.disable(_torch_adamw_update)


@functools.cache
def fused_attention_unsupported(compute_dtype):
    """XLA on CPU has no float16 x float16 -> float32 dot, which the fused JAX path asks for."""
    if compute_dtype != "float16" or keras.backend.backend() != "jax":
        return False
    return keras.distribution.list_devices()[0].lower().startswith("cpu")


@functools.cache
def flash_unavailable_reason():
    """Why `flash_attention=True` cannot be honoured on this backend and device, or `None`."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        return "the tensorflow backend has no flash attention kernel"
    if backend == "torch":
        import torch

        on_cpu = not torch.cuda.is_available()
    else:
        on_cpu = keras.distribution.list_devices()[0].lower().startswith("cpu")
    if on_cpu:
        return f"the {backend} backend has no flash attention kernel on CPU"
    return None


def _torch_dropout(inputs, rate):
    """Inverted dropout on torch, with the mask drawn as `torch.rand(...) >= rate` on CPU.

    `torch.nn.functional.dropout` draws its CPU mask with `bernoulli_`; `torch.rand` plus an
    in-place comparison is cheaper (see BENCHMARKS.md). The mask has the same law (each
    element kept with probability `1 - rate`, kept values scaled by `1 / (1 - rate)`) and
    comes from torch's global generator, which `keras.utils.set_random_seed` seeds and
    `torch.utils.checkpoint` restores. On GPU the native fused dropout is used.
    """
    import torch

    if inputs.device.type != "cpu":
        return torch.nn.functional.dropout(inputs, p=rate, training=True)
    # In place on the uniform draws: 0 or 1 / (1 - rate), with no boolean tensor to convert.
    scale = torch.rand(inputs.shape, device=inputs.device).ge_(rate).mul_(1.0 / (1.0 - rate))
    return inputs * scale.to(inputs.dtype)


def torch_attention(query, key, value, mask, rate=0.0):
    """Softmax attention (with dropout on the probabilities when `rate > 0`), in torch ops.

    Without dropout: `torch.nn.functional.scaled_dot_product_attention` with the boolean
    `mask` (true where a key may be attended; it broadcasts to `(batch, heads, seq, seq)`),
    on every device. With dropout, on GPU: `torch.nn.functional.scaled_dot_product_attention(...,
    dropout_p=rate)`, whose fused kernels draw the dropout themselves. On CPU that op
    has no fused dropout and falls
    back to softmax + `bernoulli_` internally; the same arithmetic written out with
    `_torch_dropout`'s cheaper mask is faster forward + backward. Either way: scale
    1/sqrt(head_dim), boolean key mask, probabilities dropped with `rate` and scaled by
    1/(1-rate), masks from torch's generator (so `torch.utils.checkpoint` replays them).
    Inputs and output are `(batch, seq, heads, head_dim)`.
    """
    import torch

    query, key, value = (t.transpose(1, 2) for t in (query, key, value))  # (batch, heads, seq, dim)
    if not rate:
        context = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=mask
        )
        return context.transpose(1, 2)
    if query.device.type != "cpu":
        context = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=rate
        )
        return context.transpose(1, 2)
    scores = torch.matmul(query * query.shape[-1] ** -0.5, key.transpose(-1, -2)).float()
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e9)
    probabilities = _torch_dropout(torch.softmax(scores, dim=-1).to(value.dtype), rate)
    return torch.matmul(probabilities, value).transpose(1, 2)


# The `torch.optim.AdamW` of each `BertAdamW`, with the parameters it was built for.
_TORCH_ADAMW = weakref.WeakKeyDictionary()


def torch_adamw(optimizer):
    """The `torch.optim.AdamW` that runs `optimizer`'s updates on torch, or `None` before any."""
    cached = _TORCH_ADAMW.get(optimizer)
    return None if cached is None else cached[1]


def _torch_adamw_update(optimizer, grads, variables, learning_rate):
    """`BertAdamW.update_step` for all `variables` at once with `torch.optim.AdamW`.

    A `torch.optim.AdamW(weight_decay=0)` (Keras applies the decoupled decay before this call,
    to the variables that take it) over the variables' tensors, whose state tensors are the
    Keras optimizer's own moment variables (`optimizer.moments(variable)`), so checkpoints and
    the per-variable `update_step` see the same moments. Its update is exactly the one
    `BertAdamW.update_step` writes. It runs the fused kernel (`fused=True`) where torch has one
    for every parameter (CPU and CUDA floats), its multi-tensor `foreach` form otherwise. The
    torch optimizer is built once per set of variables. Its step counts are views of one
    tensor set to `optimizer.iterations` before every update (one op, no host read), so they
    follow the Keras optimizer whatever restored or changed its state.
    """
    import torch

    params = [variable.value for variable in variables]
    key = tuple(id(p) for p in params)
    cached = _TORCH_ADAMW.get(optimizer)
    if cached is None or cached[0] != key:
        cached = (key, *_build_torch_adamw(optimizer, variables, params))
        _TORCH_ADAMW[optimizer] = cached
    _, torch_optimizer, steps = cached
    group = torch_optimizer.param_groups[0]
    learning_rate = ops.cast(learning_rate, "float32")  # a schedule's tensor or a Variable
    with torch.no_grad():
        steps.copy_(ops.cast(optimizer.iterations, "float32").detach().expand(steps.shape))
        for param, grad in zip(params, grads):
            param.grad = grad if grad.dtype == param.dtype else grad.to(param.dtype)
        if group["fused"]:
            group["lr"] = learning_rate.detach().to(params[0].device)
        else:
            group["lr"] = float(learning_rate)
        torch_optimizer.step()
        for param in params:
            param.grad = None


# Whether `adamw_update` may use torch's fused AdamW kernel (tests turn it off to check the
# multi-tensor form against it).
TORCH_FUSED_ADAMW = True


def _build_torch_adamw(optimizer, variables, params):
    """`(torch.optim.AdamW, steps)`: the torch optimizer and the tensor its step counts view."""
    import torch

    fused = TORCH_FUSED_ADAMW and all(
        p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params
    )
    fused = fused and len({p.device for p in params}) == 1
    torch_optimizer = torch.optim.AdamW(
        params,
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
