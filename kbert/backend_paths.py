"""Backend-specific speed paths of kbert, in one place.

kbert's layers and optimizer are written in `keras.ops`; where one backend has a faster way to
compute the same thing, the layer asks this module, which answers with the backend's result
or `None` (meaning: use the portable `keras.ops` form). Every path here computes the same
function as the portable form (same law for random masks) and is covered by the tests of the
layer that calls it:

- dropout masks: a counter-based hash on JAX and TensorFlow (`HashDropout`), torch's global
  generator on torch (`native_dropout`), so `torch.utils.checkpoint` replays masks;
- attention with dropout on the probabilities: torch's fused `scaled_dot_product_attention`
  with `dropout_p` on GPU (`attention_with_dropout`);
- when the fused attention op cannot run (`fused_attention_unsupported`,
  `flash_unavailable_reason`);
- dense embedding gradients on TensorFlow (`needs_dense_embedding_gradient`);
- the AdamW update of `BertAdamW` for all variables at once on torch (`adamw_update`).
"""

import functools

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


def attention_with_dropout(query, key, value, mask, rate):
    """Softmax attention with probability dropout by the backend, or `None` (explicit path).

    Inputs and output are `(batch, seq, heads, head_dim)`; `mask` is boolean and broadcasts to
    `(batch, heads, seq, seq)`.
    """
    if keras.config.backend() != "torch":
        return None
    return _torch_attention_with_dropout(query, key, value, mask, rate)


def needs_dense_embedding_gradient():
    """True on TensorFlow, whose gather gradient is an `IndexedSlices` (see `DenseGradientEmbedding`)."""
    return keras.config.backend() == "tensorflow"


def adamw_update(optimizer, grads, variables, learning_rate):
    """Applies `BertAdamW`'s update to all `variables` at once where the backend has a fused
    kernel (torch); returns False where the caller should use Keras' per-variable path."""
    if keras.config.backend() != "torch":
        return False
    _torch_adamw_update(optimizer, grads, variables, learning_rate)
    return True


@functools.lru_cache(maxsize=None)
def fused_attention_unsupported(compute_dtype):
    """XLA on CPU has no float16 x float16 -> float32 dot, which the fused JAX path asks for."""
    if compute_dtype != "float16" or keras.backend.backend() != "jax":
        return False
    return keras.distribution.list_devices()[0].lower().startswith("cpu")


@functools.lru_cache(maxsize=None)
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
    in-place comparison makes the whole dropout ~2x faster (it took 14 % of a BERT
    fine-tuning step on CPU). The
    mask has the same law (each element kept with probability `1 - rate`, kept values scaled
    by `1 / (1 - rate)`) and comes from torch's global generator, which
    `keras.utils.set_random_seed` seeds and `torch.utils.checkpoint` restores. On GPU the
    native fused dropout is used.
    """
    import torch

    if inputs.device.type != "cpu":
        return torch.nn.functional.dropout(inputs, p=rate, training=True)
    # In place on the uniform draws: 0 or 1 / (1 - rate), with no boolean tensor to convert.
    scale = torch.rand(inputs.shape, device=inputs.device).ge_(rate).mul_(1.0 / (1.0 - rate))
    return inputs * scale.to(inputs.dtype)


def _torch_attention_with_dropout(query, key, value, mask, rate):
    """Softmax attention with dropout on the probabilities, in torch ops.

    On GPU: `torch.nn.functional.scaled_dot_product_attention(..., dropout_p=rate)`, whose
    fused kernels draw the dropout themselves. On CPU that op has no fused dropout and falls
    back to softmax + `bernoulli_` internally; the same arithmetic written out with
    `_torch_dropout`'s cheaper mask is ~25 % faster forward + backward. Either way: scale
    1/sqrt(head_dim), boolean key mask, probabilities dropped with `rate` and scaled by
    1/(1-rate), masks from torch's generator (so `torch.utils.checkpoint` replays them).
    Inputs and output are `(batch, seq, heads, head_dim)`.
    """
    import torch

    query, key, value = (t.transpose(1, 2) for t in (query, key, value))  # (batch, heads, seq, dim)
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


def _torch_adamw_update(optimizer, grads, variables, learning_rate):
    """`BertAdamW.update_step` for all `variables` at once with torch's fused AdamW kernel.

    `torch._fused_adamw_` (torch >= 2.4, CPU and CUDA) computes the update of
    `torch.optim.AdamW(fused=True)` in one pass over each tensor: with weight decay 0 (Keras
    applies the decoupled decay before this call, to the variables that take it), exactly
    the update `BertAdamW.update_step` writes. Where the kernel is missing (older torch,
    other devices), the same arithmetic runs as `torch._foreach_*` operations.
    """
    import torch

    with torch.no_grad():
        indices = [optimizer._get_variable_index(variable) for variable in variables]
        params = [variable.value for variable in variables]
        moments = [optimizer._momentums[i].value for i in indices]
        velocities = [optimizer._velocities[i].value for i in indices]
        grads = [g if g.dtype == p.dtype else g.to(p.dtype) for g, p in zip(grads, params)]
        step = ops.cast(optimizer.iterations + 1, "float32")
        lr = torch.as_tensor(learning_rate, dtype=torch.float32)
        fused = getattr(torch, "_fused_adamw_", None)
        fused_dtypes = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
        groups = {}
        for position, param in enumerate(params):
            groups.setdefault((param.device, param.dtype), []).append(position)
        for (device, dtype), positions in groups.items():
            group = [[items[i] for i in positions] for items in (params, grads, moments, velocities)]
            if fused is not None and device.type in ("cpu", "cuda") and dtype in fused_dtypes:
                fused(
                    *group,
                    [],
                    [step.to(device)] * len(positions),
                    lr=lr.to(device),
                    beta1=float(optimizer.beta_1),
                    beta2=float(optimizer.beta_2),
                    weight_decay=0.0,
                    eps=float(optimizer.epsilon),
                    amsgrad=False,
                    maximize=False,
                )
            else:
                _torch_foreach_adamw(optimizer, *group, step.to(device), lr.to(device))


def _torch_foreach_adamw(optimizer, params, grads, moments, velocities, step, lr):
    import torch

    beta_1, beta_2 = float(optimizer.beta_1), float(optimizer.beta_2)
    torch._foreach_lerp_(moments, grads, 1 - beta_1)
    torch._foreach_mul_(velocities, beta_2)
    torch._foreach_addcmul_(velocities, grads, grads, value=1 - beta_2)
    correction_1 = 1 - torch.pow(beta_1, step)
    correction_2 = torch.sqrt(1 - torch.pow(beta_2, step))
    denominators = torch._foreach_sqrt(velocities)
    torch._foreach_div_(denominators, correction_2)
    torch._foreach_add_(denominators, float(optimizer.epsilon))
    updates = torch._foreach_div(moments, denominators)
    torch._foreach_mul_(updates, -(lr / correction_1).to(params[0].dtype))
    torch._foreach_add_(params, updates)
