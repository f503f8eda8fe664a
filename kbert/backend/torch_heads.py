"""kbert's task models on eager torch without Keras' layer calls: the lean path of a task.

A task's call runs its functional graph: the backbone, then each head layer, every one
through Keras' `Layer.__call__` (input conversion, call context, autocast scope, name scope,
the clearing of losses, the input spec checked against one rebuilt at every call). On torch
that bookkeeping costs about as much as the head's arithmetic and a fifth of a small
backbone's forward pass (figures in BENCHMARKS.md, "Host cost on torch"). `task_outputs`
computes what the graph computes, from the same variables, with the same dropout draws:

- the backbone through torch's `Module.__call__` (torch's forward hooks and pre-hooks run;
  Keras' `__call__` would change nothing there: the backbone's lean path, which must cover
  the call, converts its inputs and casts its own weights);
- each `Dense` of the head as one `addmm` on its kernel (LoRA's update added) cast to the
  layer's compute dtype, its inputs cast as `__call__` casts them, then its activation;
- each kbert dropout layer (`HashDropout`) through the backbone's dropout
  (`kbert.backend.torch.dropout`, the layer's own route on torch: the same masks);
- kbert's masked-LM head (`MaskedLMHead`: the pretrainer's, the sparse encoder's) as its own
  row selection at the masked positions, its transform `Dense` as above, its activation, its
  float32 LayerNorm and the tied decoder (the token table read as the kernel, no copy) with
  the output bias in one `addmm`;
- each weightless kbert layer of the head (`FlattenChoices`, `ChoiceLogits`,
  `ContextSpanLogits`, `EmbeddingPooling`, `SpladePooling`) through its `call`, its
  floating inputs cast as `__call__` casts them.

A task describes its head with `_lean_head_layers` (the layers, checked once) and
`_lean_head(calls, inputs, training)`: the graph's computation in the calls of `HEAD_CALLS`
(`backbone`, `dense`, `dropout`, `masked_lm`, `weightless`), so the task itself imports no
torch. `task_outputs` answers `None`, and the graph runs, where the backbone's lean path does
not cover the call, a head layer is of another kind (a quantized or bias-free `Dense`, Keras'
own `Dropout`, a masked-LM head on a quantized table), the head's layers are not the graph's,
or while `torch.compile` traces the call (kbert's compiled steps trace the graph, whose layer
calls cost nothing once compiled).
"""

import types
import weakref

import keras
import numpy as np
import torch

from kbert.backend import torch_encoder

# Whether kbert's tasks take the lean path on eager torch (tests turn it off to compare it
# with the functional graph).
LEAN_TORCH_TASKS = True

# The `torch_encoder.Linear` of each head `Dense` (the torch kernel and bias it computes with).
_LINEARS = weakref.WeakKeyDictionary()
# The `_MaskedLM` of each masked-LM head (its weights, read once).
_MASKED_LMS = weakref.WeakKeyDictionary()
# The head layers each task was checked with (their identity: the graph's layers).
_CHECKED = weakref.WeakKeyDictionary()


def _torch_dtype(name):
    return torch_encoder.TORCH_DTYPES[keras.backend.standardize_dtype(name)]


def _covered_layer(layer):
    """Whether the lean head computes `layer` as `__call__` would."""
    if isinstance(layer, keras.layers.Dense):
        return (
            layer.built
            and layer.dtype_policy.quantization_mode is None
            and layer.use_bias
            and keras.backend.standardize_dtype(layer.compute_dtype) in torch_encoder.TORCH_DTYPES
            # Reads its weights now: a kernel or bias that is not a torch parameter of the
            # variable's dtype raises a ValueError, which `task_outputs` takes for "not covered".
            and _linear(layer) is not None
        )
    if _is_masked_lm(layer):
        return (
            layer.built and _masked_lm(layer) is not None and _covered_layer(layer.transform_dense)
        )
    if isinstance(layer, keras.layers.Dropout):
        # kbert's dropout (`HashDropout`, which says whether it `uses_hash`) draws its torch
        # masks from torch's generator, as `dropout` does; Keras' own from its seed generator.
        return getattr(layer, "uses_hash", None) is False
    return layer.built and not layer.weights


def _read(cache, layer, make):
    """`cache[layer]`: what `make(layer)` read from the layer's weights (outside any autocast
    scope, so the torch parameters themselves), read again once it is no longer `current()`
    (another dtype policy, quantization, LoRA switched)."""
    read = cache.get(layer)
    if read is None or not read.current():
        read = torch_encoder.without_autocast(lambda: make(layer))
        cache[layer] = read
    return read


def _linear(layer):
    """The `torch_encoder.Linear` of a head `Dense`."""
    return _read(_LINEARS, layer, torch_encoder.Linear)


def _is_masked_lm(layer):
    """Whether `layer` is kbert's `MaskedLMHead` (its transform, LayerNorm and tied decoder)."""
    return isinstance(getattr(layer, "token_embedding", None), keras.layers.Embedding) and hasattr(
        layer, "select"
    )


class _MaskedLM:
    """A masked-LM head's LayerNorm, tied decoder table and output bias, and its activation;
    a ValueError for a head computed otherwise (a quantized or LoRA-enabled table, another
    LayerNorm)."""

    __slots__ = ("layer", "policies", "norm", "table", "bias", "activation")

    def __init__(self, layer):
        embedding = layer.token_embedding
        if embedding.dtype_policy.quantization_mode is not None or embedding.lora_enabled:
            raise ValueError("The decoder table is quantized or has LoRA")
        self.layer = layer
        self.policies = (layer.dtype_policy, embedding.dtype_policy)
        self.norm = torch_encoder.norm_weights(layer.layer_norm)
        self.table = torch_encoder.parameter(embedding, embedding.embeddings)
        self.bias = torch_encoder.parameter(layer, layer.output_bias)
        activation = layer.activation
        self.activation = (
            torch_encoder.ACTIVATIONS[activation]
            if isinstance(activation, str)
            else layer.activation_fn
        )

    def current(self):
        """Whether the head still computes from what was read (no new dtype policy, no
        quantization or LoRA on the table)."""
        embedding = self.layer.token_embedding
        return (
            self.layer.dtype_policy is self.policies[0]
            and embedding.dtype_policy is self.policies[1]
            and not embedding.lora_enabled
        )


def _masked_lm(layer):
    """The `_MaskedLM` of a masked-LM head."""
    return _read(_MASKED_LMS, layer, _MaskedLM)


def _head_ready(task):
    """Whether every head layer of `task` is one the lean head computes, checked once per set
    of layers (a quantized `Dense` is checked again at each call: its policy changes)."""
    layers = tuple(task._lean_head_layers())
    checked = _CHECKED.get(task)
    if (
        checked is None
        or len(checked) != len(layers)
        or any(a is not b for a, b in zip(checked, layers))
    ):
        graph = {id(layer) for layer in task.layers}
        if not all(id(layer) in graph for layer in layers):
            return False
        _CHECKED[task] = layers
    return all(_covered_layer(layer) for layer in layers)


def task_outputs(task, inputs, training):
    """`task`'s outputs on backend tensors `inputs` (its input dict), or `None` where the
    functional graph runs (see the module docstring)."""
    if not LEAN_TORCH_TASKS or torch.compiler.is_compiling():
        return None
    backbone = task.backbone
    if inputs["token_ids"].device.type == "meta":  # (a tensor: `lean_task_outputs` checked)
        return None
    if not torch_encoder.covers(backbone, training):
        return None
    try:
        ready = _head_ready(task)
    except (ValueError, AttributeError, KeyError, TypeError):
        ready = False
    if not ready:
        return None
    return task._lean_head(HEAD_CALLS, inputs, bool(training))


def backbone(task, inputs, training, first_token_only=False):
    """The backbone's outputs dict, through torch's `Module.__call__` (its hooks run)."""
    return torch.nn.Module.__call__(
        task.backbone, inputs, training=training, first_token_only=first_token_only
    )


def dense(layer, x):
    """`layer(x)` for a Keras `Dense` with a bias: one product on its (LoRA-updated) kernel in
    the layer's compute dtype, then its activation."""
    dtype = _torch_dtype(layer.compute_dtype)
    if layer.autocast and x.is_floating_point():
        x = torch_encoder.cast(x, dtype)
    y = torch_encoder.linear(x, _linear(layer), dtype)
    activation = layer.activation
    if activation is not keras.activations.linear:
        y = activation(y)
    return y


def dropout(layer, x, training):
    """`layer(x, training=training)` for kbert's `HashDropout`: its rate, the mask from
    torch's generator (the layer's own route on torch, so the same draws)."""
    return torch_encoder.dropout(x, layer.rate, training)


def masked_lm(layer, sequence_output, mask_positions=None):
    """`layer(sequence_output, mask_positions)` for kbert's `MaskedLMHead`: the rows at the
    positions (the layer's own `select`, which checks them), its transform `Dense`, activation
    and float32 LayerNorm, then the tied decoder and the output bias in one `addmm`."""
    plan = _masked_lm(layer)
    dtype = _torch_dtype(layer.compute_dtype)
    x = layer.select(torch_encoder.cast(sequence_output, dtype), mask_positions)
    x = plan.activation(dense(layer.transform_dense, x))
    x = torch_encoder.layer_norm(x, plan.norm, dtype)
    # The table `(vocabulary, hidden)` read as the `(hidden, vocabulary)` kernel, no copy.
    return torch_encoder.project(x, torch_encoder.cast(plan.table, dtype).t(), plan.bias, dtype)


def weightless(layer, *args):
    """`layer(*args)` for a built layer without weights: its `call`, floating tensors cast to
    its compute dtype first as `__call__` does."""
    if layer.autocast:
        dtype = _torch_dtype(layer.compute_dtype)
        args = tuple(
            torch_encoder.cast(a, dtype)
            if isinstance(a, torch.Tensor) and a.is_floating_point()
            else a
            for a in args
        )
    return layer.call(*args)


# What a task's `_lean_head(calls, inputs, training)` computes its head with.
HEAD_CALLS = types.SimpleNamespace(
    backbone=backbone, dense=dense, dropout=dropout, masked_lm=masked_lm, weightless=weightless
)


# ------------------------------------------------------------------------------ the loss
def sparse_cross_entropy(reduction, y, y_pred, sample_weight):
    """What a task compiled with Keras' `SparseCategoricalCrossentropy(from_logits=True)`
    (float32, reduction `reduction`) as its one loss, and nothing else adding to it, gets
    from `compute_loss`, in torch calls; `None` where Keras computes it.

    Keras' path (`CompileLoss`, `Loss.__call__`, the loss function, `reduce_weighted_values`)
    casts the logits and labels to float32, takes torch's `cross_entropy` of each row
    (class axis moved to 1), multiplies by the float32 sample weights, sums, and divides by
    the number of losses (by the sum of the weights for `"mean_with_sample_weight"` with
    weights, 0 where that sum is 0), in some twenty calls with their conversions; this is
    the same arithmetic, in the same order. kbert's layers set no Keras masks, so the loss
    has none to apply. Labels or weights whose shape Keras would first squeeze or broadcast
    (or reject), an empty batch and the `meta` tensors of Keras' symbolic build (which builds
    `CompileLoss`) take Keras' path.
    """
    if not isinstance(y_pred, torch.Tensor) or y_pred.ndim < 2 or y_pred.device.type == "meta":
        return None
    if not isinstance(y, (torch.Tensor, np.ndarray)) or y_pred.shape[-1] < 2:
        return None
    labels = torch.as_tensor(y, device=y_pred.device)
    if labels.shape != y_pred.shape[:-1] or not labels.numel():
        return None
    logits = y_pred.to(torch.float32)
    if logits.ndim > 2:
        logits = logits.movedim(-1, 1)
    values = torch.nn.functional.cross_entropy(logits, labels.to(torch.long), reduction="none")
    weights = None
    if sample_weight is not None:
        if not isinstance(sample_weight, (torch.Tensor, np.ndarray)):
            return None
        weights = torch.as_tensor(sample_weight, device=y_pred.device).to(torch.float32)
        if weights.shape != values.shape:
            return None
        values = values * weights
    total = values.sum()
    if reduction == "mean_with_sample_weight" and weights is not None:
        divisor = weights.sum()
        return torch.where(divisor == 0, 0, total / divisor)
    return total / values.numel()
