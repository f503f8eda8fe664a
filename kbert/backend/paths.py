"""The hooks through which kbert's layers, optimizer and tasks take a backend's faster route.

Each hook decides by `keras.config.backend()` and answers with the backend's result, or `None`
(or `False`) meaning: use the portable `keras.ops` form, which computes the same function
(same law for random masks). The torch calls themselves live in `kbert.backend.torch`,
imported only on the torch backend. Every hook is covered by the tests of the layer that calls
it, against the plain `keras.ops` route.
"""

import functools

import keras
from keras import ops


# ------------------------------------------------------------------------------ layer calls
def call_sublayer(layer, inputs, **kwargs):
    """`layer(inputs, **kwargs)`; on eager torch, `layer.call(inputs, **kwargs)` when Keras'
    `__call__` would change nothing.

    On the torch backend every Keras layer call runs Python bookkeeping (argument binding,
    name scopes, autocast and mask handling, attribute tracking) that costs about as much as
    the matrix product of a small layer on short texts. Inside kbert's own blocks a built
    sublayer whose compute dtype equals its variable dtype, called on a backend tensor of
    integers or of its compute dtype (no autocast to apply), gets exactly what `__call__` would
    give it, so `call` is used directly. Symbolic inputs (functional model construction), other
    backends, mixed precision and unbuilt layers go through `__call__` as usual.
    """
    if (
        keras.backend.backend() == "torch"
        and layer.built
        and layer.compute_dtype == layer.variable_dtype
        and ops.is_tensor(inputs)
        and not isinstance(inputs, keras.KerasTensor)
    ):
        dtype = keras.backend.standardize_dtype(inputs.dtype)
        if "float" not in dtype or dtype == layer.compute_dtype:
            # A quantized layer computes with its `quantized_call`, as `__call__` would.
            call = layer.quantized_call if layer.quantization_mode else layer.call
            return call(inputs, **kwargs)
    return layer(inputs, **kwargs)


# Whether `BertBackbone.call` takes the lean path on eager torch (tests turn it off to compare
# it with the functional graph).
LEAN_TORCH_BACKBONE = True


def lean_backbone_outputs(backbone, inputs, training=None, first_token_only=False):
    """`backbone`'s outputs dict computed by `kbert.backend.torch_encoder`, or `None` where the
    functional graph runs.

    On eager torch (backend tensors, not symbolic ones), `BertBackbone.call` computes its
    outputs with one torch call per kernel instead of one Keras layer call per sublayer (see
    `kbert.backend.torch_encoder`, which also lists what it leaves to the graph). Same
    function, same weights, same dropout draws; under a mixed policy each weight is cast
    once per call. Elsewhere `None`.
    """
    if keras.backend.backend() != "torch" or not LEAN_TORCH_BACKBONE:
        return None
    token_ids = inputs["token_ids"]
    if not ops.is_tensor(token_ids) or isinstance(token_ids, keras.KerasTensor):
        return None
    from kbert.backend import torch_encoder

    ids = [_int32(inputs[name]) for name in ("token_ids", "segment_ids", "padding_mask")]
    return torch_encoder.backbone_outputs(backbone, *ids, training, first_token_only)


def lean_task_outputs(task, inputs, training=None):
    """`task`'s outputs computed by `kbert.backend.torch_heads` (its backbone through torch's
    `Module.__call__`, its head as one torch call per layer), or `None` where its functional
    graph runs.

    On eager torch (backend tensors, not symbolic ones), for a task that describes its head
    (`_lean_head_layers`, `_lean_head`) and whose backbone the lean path covers: the same
    function as the graph, from the same variables, with the same dropout draws, without a
    Keras `__call__` per layer. Elsewhere `None`.
    """
    if keras.backend.backend() != "torch" or not LEAN_TORCH_BACKBONE:
        return None
    if not hasattr(task, "_lean_head") or not isinstance(inputs, dict):
        return None
    token_ids = inputs.get("token_ids")
    if not ops.is_tensor(token_ids) or isinstance(token_ids, keras.KerasTensor):
        return None
    from kbert.backend import torch_heads

    return torch_heads.task_outputs(task, inputs, training)


def lean_loss_spec(loss):
    """What `lean_task_loss` computes `loss` (a task's compiled loss) with on torch: the
    reduction of the sparse cross-entropy it is, or `None` where Keras' `compute_loss` always
    runs.

    Covered: Keras' `SparseCategoricalCrossentropy(from_logits=True)` in float32, without
    `ignore_class`, on the last axis, reduced by `"sum_over_batch_size"`, `"mean"` or
    `"mean_with_sample_weight"` - the default loss of kbert's classifier, tagger,
    multiple-choice model and multi-class cross-encoder. Decided once, when the task compiles.
    """
    if keras.backend.backend() != "torch":
        return None
    if type(loss) is not keras.losses.SparseCategoricalCrossentropy or loss.dtype != "float32":
        return None
    config = loss.get_config()
    if (
        config.get("from_logits") is not True
        or config.get("ignore_class") is not None
        or config.get("axis", -1) != -1
        or config.get("reduction") not in ("sum_over_batch_size", "mean", "mean_with_sample_weight")
    ):
        return None
    return config["reduction"]


def lean_task_loss(spec, y, y_pred, sample_weight=None):
    """The loss `compute_loss` returns for a task compiled with the loss `spec` describes
    (`lean_loss_spec`) and nothing else adding to it, as torch calls
    (`kbert.backend.torch_heads.sparse_cross_entropy`: the same arithmetic as Keras' path,
    in the same order), or `None` where Keras computes it (inputs it would first reshape,
    its symbolic build)."""
    from kbert.backend import torch_heads

    if not torch_heads.LEAN_TORCH_TASKS:
        return None
    return torch_heads.sparse_cross_entropy(spec, y, y_pred, sample_weight)


def prepare_lean_backbone(backbone):
    """Gathers what `lean_backbone_outputs` reads from `backbone` (on torch), so that a call
    traced by `torch.compile` finds it; called when a backbone is made."""
    if keras.backend.backend() == "torch" and LEAN_TORCH_BACKBONE:
        from kbert.backend import torch_encoder

        torch_encoder.prepare(backbone)


def _int32(x):
    x = ops.convert_to_tensor(x)
    return x if keras.backend.standardize_dtype(x.dtype) == "int32" else ops.cast(x, "int32")


def fused_dense(layer, inputs):
    """The output of `layer` (a `keras.layers.Dense`) with the bias added inside the matrix
    product, or `None` where Keras' own `Dense.call` is used.

    On torch a biased, unquantised layer computes `torch.nn.functional.linear` (one BLAS call;
    see `kbert.backend.torch.linear`) and then its activation. The kernel is read through the
    layer's `kernel` property, so LoRA and autocast apply as in Keras' `Dense`. Elsewhere, and
    for layers without a bias or quantised ones, `None`.
    """
    if keras.backend.backend() != "torch" or layer.bias is None or layer.quantization_mode:
        return None
    from kbert.backend import torch as torch_paths

    kernel = ops.convert_to_tensor(layer.kernel)  # LoRA added; autocast applied
    bias = ops.convert_to_tensor(layer.bias)
    x = torch_paths.linear(inputs, kernel, bias)
    if layer.activation is not None:
        x = layer.activation(x)
    return x


def int8_dense(layer, inputs, training=None):
    """The output of the int8-quantized `layer` (a `keras.layers.Dense`) from the backend's own
    int8 kernel, or `None` where Keras' int8 path is used.

    On torch, at inference (no `training`, no gradient needed), for a layer without LoRA whose
    inputs are quantised too (Keras' default int8 config), `kbert.backend.torch.int8_linears`
    runs torch's dynamic int8 linear (fbgemm / oneDNN). Keras' own int8 `Dense` multiplies the
    int8 tensors with a generic integer matmul, slower than float32 on the CPU on every
    backend; JAX and TensorFlow have no int8 CPU kernel reachable from a public API (figures in
    BENCHMARKS.md, "int8 on the CPU"), so there Keras' path is kept.
    """
    outputs = int8_dense_group((layer,), inputs, training)
    return None if outputs is None else outputs[0]


def int8_dense_group(layers, inputs, training=None):
    """The outputs of several int8 `Dense` layers on the same `inputs` (the attention's query,
    key and value) from one int8 product, or `None` where each layer runs by itself.

    On torch, where `int8_dense` would run every layer: their int8 kernels side by side in one
    packed weight (`kbert.backend.torch.int8_linears`), so the inputs are quantised once and
    multiplied once. The inputs' quantisation is per tensor, hence the same for every layer:
    the outputs are the layers' own `int8_dense` outputs.
    """
    if keras.backend.backend() != "torch" or not all(
        _int8_dense_ready(layer, inputs, training) for layer in layers
    ):
        return None
    import torch

    if torch.is_grad_enabled() and inputs.requires_grad:
        return None
    from kbert.backend import torch as torch_paths

    return torch_paths.int8_linears(layers, inputs)


def _int8_dense_ready(layer, inputs, training):
    return not (
        layer.quantization_mode != "int8"
        or training
        or layer.lora_enabled
        or getattr(layer, "inputs_quantizer", None) is None
        or not ops.is_tensor(inputs)
        or isinstance(inputs, keras.KerasTensor)
    )


def needs_dense_embedding_gradient():
    """True on TensorFlow, whose gather gradient is an `IndexedSlices` (see
    `DenseGradientEmbedding`)."""
    return keras.config.backend() == "tensorflow"


# ------------------------------------------------------------------------------ dropout
def hash_dropout_backend():
    """True where dropout masks come from kbert's counter-based hash (JAX, TensorFlow)."""
    return keras.config.backend() in ("jax", "tensorflow")


def native_dropout(inputs, rate):
    """Inverted dropout by the backend itself, or `None` where kbert's hash mask is used.

    On torch the mask comes from torch's global generator, so `torch.utils.checkpoint` replays
    it (`kbert.backend.torch.dropout`); over several processes each takes its rows of the
    global batch's mask (see `batch_slice`).
    """
    if keras.config.backend() != "torch":
        return None
    from kbert.backend import torch as torch_paths

    return torch_paths.dropout(inputs, rate, batch_slice())


def batch_slice():
    """`(index, count)`: this replica's slice of the global batch, when `count > 1` equal,
    contiguous slices of it run in separate replicas (else `(0, 1)`).

    A dropout mask drawn per slice must be the slice of the mask one replica would draw for
    the whole batch, or training over several replicas is not training on one. JAX computes
    on global arrays (one program over every device and process): `(0, 1)`. TensorFlow, in
    the replica context of a `tf.distribute` strategy (each worker or device runs its slice):
    the replica id (a tensor) and `num_replicas_in_sync`. Torch, over several processes
    (`kbert.distribution.initialize`): the process index and count.
    """
    backend = keras.config.backend()
    if backend == "tensorflow":
        from kbert.backend.tensorflow import tensorflow

        tf = tensorflow("Several TensorFlow replicas")
        if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
            return 0, 1
        context = tf.distribute.get_replica_context()
        if context.num_replicas_in_sync < 2:
            return 0, 1
        return context.replica_id_in_sync_group, context.num_replicas_in_sync
    if backend == "torch":
        from kbert.backend import torch as torch_paths

        return torch_paths.process_slice()
    return 0, 1


# ------------------------------------------------------------------------------ attention
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


def torch_attention(query, key, value, mask, rate=0.0):
    """Softmax attention by torch's `scaled_dot_product_attention`, for the `"torch"` path of
    `attention_path` (see `kbert.backend.torch.attention`).

    Inputs and output are `(batch, seq, heads, head_dim)`; `mask` is boolean (true where a key
    may be attended) and broadcasts to `(batch, heads, seq, seq)`; `rate` is the dropout rate
    of the probabilities.
    """
    from kbert.backend import torch as torch_paths

    return torch_paths.attention(query, key, value, mask, rate)


def attention_with_dropout(query, key, value, mask, rate):
    """Softmax attention with probability dropout by the backend, or `None` (explicit path).

    Inputs and output are `(batch, seq, heads, head_dim)`; `mask` is boolean and broadcasts to
    `(batch, heads, seq, seq)`.
    """
    if keras.config.backend() != "torch":
        return None
    return torch_attention(query, key, value, mask, rate)


@functools.cache
def _first_device_is_cpu():
    """True when Keras' first device (JAX, TensorFlow) is a CPU."""
    return keras.distribution.list_devices()[0].lower().startswith("cpu")


def fused_attention_unsupported(compute_dtype):
    """XLA on CPU has no float16 x float16 -> float32 dot, which the fused JAX path asks for."""
    if compute_dtype != "float16" or keras.backend.backend() != "jax":
        return False
    return _first_device_is_cpu()


def key_mask_as_bias(compute_dtype):
    """True where `BertSelfAttention` passes its key padding mask to
    `keras.ops.dot_product_attention` as an added bias (0 for real keys, -1e9 for padding)
    rather than a boolean mask: float32 on JAX on CPU. There `jax.nn.dot_product_attention`
    applies a boolean mask as a separate select over the `(batch, heads, query, key)` scores,
    while an added bias fuses into the softmax; the probabilities are the same (a padded
    key's `exp(-1e9 - max)` is 0 in float32, as is the select's). GPUs keep the boolean mask,
    the form the fused kernels take; TensorFlow's attention measured no faster either way."""
    if compute_dtype != "float32" or keras.backend.backend() != "jax":
        return False
    return _first_device_is_cpu()


def one_row_attention_by_products():
    """True where `BertSelfAttention` attends from a one-row query (`query_length=1`, the
    [CLS] row of `BertBackbone(first_token_only=True)`) by broadcast products and sums instead
    of einsums: TensorFlow on CPU. There, outside XLA (Keras trains TensorFlow models on a CPU
    without it), `tf.einsum` runs oneDNN's kernels, and training through the einsums of a
    one-row query (a matrix-vector product forward, inner dimension 1 in their gradients)
    corrupted the heap in about one fresh process in twenty (segmentation faults and "corrupted
    double-linked list" aborts in `MklEinsum`, reproduced with `tf.einsum` alone; not seen with
    queries of 2 or more rows). A one-row product is a matrix-vector product either way: the
    sums measured as fast in `predict`."""
    if keras.backend.backend() != "tensorflow":
        return False
    return _first_device_is_cpu()


@functools.cache
def flash_unavailable_reason():
    """Why `flash_attention=True` cannot be honoured on this backend and device, or `None`."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        return "the tensorflow backend has no flash attention kernel"
    if backend == "torch":
        from kbert.backend import torch as torch_paths

        on_cpu = not torch_paths.cuda_available()
    else:
        on_cpu = _first_device_is_cpu()
    if on_cpu:
        return f"the {backend} backend has no flash attention kernel on CPU"
    return None


# ------------------------------------------------------------------------------ optimizer
def has_multi_tensor_adamw():
    """True where `adamw_update` updates all variables at once (torch)."""
    return keras.config.backend() == "torch"


def adamw_update(optimizer, grads, variables, learning_rate, clip_norm=None, decays=None):
    """`BertAdamW.update_step` for all `variables` at once, where `has_multi_tensor_adamw()`;
    with `clip_norm` and `decays`, the whole update of one step.

    On torch: `torch.optim.AdamW`'s fused kernel, whose state is the Keras optimizer's moment
    variables (`kbert.backend.torch.adamw_update`).

    Args:
        optimizer: the `BertAdamW` (its hyperparameters, `iterations` and `moments(variable)`).
        grads: list of gradients, one per variable.
        variables: list of the `keras.Variable`s to update.
        learning_rate: the rate of this update (a scalar tensor).
        clip_norm: float or None. Clip `grads` to this global norm first, as
            `clip_by_global_norm` does (a step's own `.grad` tensors in place); `None`: they
            are clipped already.
        decays: list of bools or None, one per variable: whether the variable takes the
            optimizer's decoupled `weight_decay` (`variable *= 1 - learning_rate *
            weight_decay` before the update). `None`: the decay is applied already.
    """
    if not has_multi_tensor_adamw():
        raise ValueError(
            f"kbert has no multi-tensor AdamW update on the {keras.config.backend()} backend; "
            "check `has_multi_tensor_adamw()` first."
        )
    from kbert.backend import torch as torch_paths

    torch_paths.adamw_update(optimizer, grads, variables, learning_rate, clip_norm, decays)


def clip_by_global_norm(grads, clip_norm, variables=None):
    """Keras' `clip_by_global_norm` of `grads` (`None` kept) where `has_multi_tensor_adamw()`:
    the same scale, `clip_norm * min(1 / norm, 1 / clip_norm)` (a non-finite norm gives
    non-finite gradients, as in Keras), with the norm computed by torch's multi-tensor
    `get_total_norm` (a few kernels on a GPU instead of two per variable).

    `variables` (optional, one per gradient): a gradient that is its variable's own `.grad`
    is scaled in place (a train step's gradients, which the update releases), without a new
    tensor per variable; other gradients are not changed."""
    if not has_multi_tensor_adamw():
        raise ValueError(
            f"kbert has no multi-tensor gradient clipping on the {keras.config.backend()} "
            "backend; check `has_multi_tensor_adamw()` first."
        )
    from kbert.backend import torch as torch_paths

    return torch_paths.clip_by_global_norm(grads, clip_norm, variables)


# ------------------------------------------------------------------------------ replicas
def replicas_gradient_sum(grads):
    """`(summed, replicas)`: the gradients summed over a TensorFlow strategy's replicas, when
    called in a replica context of more than one (else `(None, 1)`).

    Keras' TensorFlow optimizer clips each replica's own gradients (`clipnorm`,
    `global_clipnorm`, `clipvalue`) and sums them over the replicas afterwards, so a clipped
    step over several workers is not the one-worker step of the same global batch. With the
    sum first, an optimizer clips the global gradient itself (see `BertAdamW.apply`).
    """
    if keras.backend.backend() != "tensorflow":
        return None, 1
    from kbert.backend.tensorflow import tensorflow

    tf = tensorflow("Several TensorFlow replicas")
    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        return None, 1
    context = tf.distribute.get_replica_context()
    replicas = context.num_replicas_in_sync
    if replicas < 2:
        return None, 1
    present = [g for g in grads if g is not None]
    summed = iter(context.all_reduce(tf.distribute.ReduceOp.SUM, present))
    return [None if g is None else next(summed) for g in grads], replicas


def strategy_build_inputs(inputs):
    """TensorFlow: a dict of model inputs with float tensors cast to int32 while Keras builds
    the model symbolically in a `tf.distribute` strategy's scope; anything else as given.

    Keras' TensorFlow trainer builds a model in a strategy's scope from its first batch
    averaged over the replicas (`strategy.reduce("MEAN", ...)`), which turns integer token
    ids into floats; only their shapes are used there. In the replica context of a real step,
    and eagerly, inputs are left as they are, so the task's dtype check still refuses floats.
    """
    if keras.backend.backend() != "tensorflow" or not isinstance(inputs, dict):
        return inputs
    from kbert.backend.tensorflow import tensorflow

    tf = tensorflow("A tf.distribute strategy")
    if (
        tf.executing_eagerly()
        or not tf.distribute.has_strategy()
        or not tf.distribute.in_cross_replica_context()
    ):
        return inputs
    return {
        key: tf.cast(value, "int32") if tf.is_tensor(value) and value.dtype.is_floating else value
        for key, value in inputs.items()
    }


# ------------------------------------------------------------------------------ predict
def xla_predict_function(model, make_predict_function, force=False, allowed=True):
    """`model`'s predict function; on TensorFlow compiled with XLA where `allowed`.

    `make_predict_function(force)` is Keras' `Model.make_predict_function` of `model` (its
    `super()` method, for a subclass that overrides it). Keras' `jit_compile="auto"` turns XLA
    off for TensorFlow on machines without an accelerator. For a BERT forward pass XLA is the
    faster choice there too (fused element-wise work around the matrix products; see
    BENCHMARKS.md, "Sentence embeddings"), so on TensorFlow, when `allowed` (the caller's
    `compile` left `jit_compile` to `"auto"`, without `run_eagerly`), outside a multi-replica
    `tf.distribute` strategy, the predict function is built with `model.jit_compile` set to
    True for the build only: `fit` and `evaluate` keep Keras' choice. Elsewhere it is Keras'
    own predict function.
    """
    if (
        keras.backend.backend() != "tensorflow"
        or not allowed
        or model.jit_compile  # Already XLA everywhere.
        or model.distribute_strategy.num_replicas_in_sync > 1
    ):
        return make_predict_function(force)
    if model.predict_function is not None and not force:
        return model.predict_function
    model.jit_compile = True  # Read by Keras' make_predict_function only; restored below.
    try:
        return make_predict_function(force)
    finally:
        model.jit_compile = False


# --------------------------------------------------------------- TensorFlow train step
def build_optimizer_before_tracing(model):
    """Builds `model`'s optimizer before TensorFlow traces its train step (TensorFlow only).

    Without a `tf.distribute` strategy Keras leaves the optimizer unbuilt until the first
    trace of the train step, which then creates the optimizer's variables; a `tf.function`
    whose first trace creates variables is traced a second time, so every `fit` traced its
    whole train step (forward, backward, optimizer update) twice. Under a strategy, and on
    JAX and torch, Keras builds the optimizer first, with `optimizer.build(model.
    trainable_variables)`; this does the same on TensorFlow: one trace, the same variables
    in the same order, the same updates. Nothing happens elsewhere, for a model that is not
    built or has no optimizer, or when the optimizer is built already.
    """
    if keras.backend.backend() != "tensorflow":
        return
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or optimizer.built or not model.built:
        return
    with model.distribute_strategy.scope():
        optimizer.build(model.trainable_variables)


# ------------------------------------------------------------------------ compiled steps
def _overrides_step(model, kind):
    """Whether `model`'s class defines its own `{kind}_step` (Keras' step is not its, nor
    kbert's form of Keras' step, marked `kbert_step`)."""
    name = f"{kind}_step"
    step = getattr(type(model), name)
    return step is not getattr(keras.Model, name) and not getattr(step, "kbert_step", False)


def eager_train_step(model, data):
    """`model.train_step(data)` as kbert runs Keras' step on eager torch
    (`kbert.backend.torch_steps.train_step`: the trainable weights walked once, only their
    gradients cleared), or `None` where Keras' own step runs (other backends)."""
    if keras.backend.backend() != "torch":
        return None
    from kbert.backend import torch_steps

    return torch_steps.train_step(model, data)


def torch_step_function(model, kind, force=False):
    """`model`'s `kind` function (`"train"`, `"test"` or `"predict"`) as kbert compiles it on
    torch, or `None` where Keras' own is used.

    On torch with `compile(jit_compile=True)`, the step is `kbert.backend.torch_steps`': the
    forward pass (and loss) compiled with static shapes, one program per input shape, the
    backward through the graph compiled with it, the optimizer update as one call after it.
    Keras' own `jit_compile=True` on torch compiles its whole step with one bare
    `torch.compile`, which breaks at `loss.backward()`, turns shapes dynamic and falls back to
    eager past 8 shapes. Elsewhere (other backends, `jit_compile=False`, or a model class that
    overrides the step, `train_step` for `"train"`, whose own step Keras then runs) `None`.
    """
    if keras.backend.backend() != "torch" or not getattr(model, "jit_compile", False):
        return None
    if _overrides_step(model, kind):
        return None
    attribute = f"{kind}_function"
    existing = getattr(model, attribute, None)
    if existing is not None and not force:
        return existing
    from kbert.backend import torch_steps

    function = getattr(torch_steps, attribute)(model)
    setattr(model, attribute, function)
    return function
