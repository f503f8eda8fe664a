"""LoRA fine-tuning of kbert models with Keras' own `Dense.enable_lora`.

LoRA (Hu et al., 2021, "LoRA: Low-Rank Adaptation of Large Language Models", arXiv:2106.09685)
keeps every pretrained weight frozen and learns, next to a kernel `W` of shape `(d_in, d_out)`,
two small matrices `A (d_in, r)` and `B (r, d_out)`; the layer computes
`x @ (W + alpha / r * A @ B)`. Keras implements this in `Dense.enable_lora(rank, lora_alpha)`;
this module picks BERT's layers for it, freezes the rest of the backbone, and saves, loads and
merges the adapter.

Which layers: in every transformer block the attention projections `query`, `key`, `value`
and `attention_output` (the original paper's choice for the attention weights) and, with
`feedforward=True`, also `intermediate_dense` and `output_dense`. Everything else in the
backbone (embeddings, LayerNorms, biases, the pooler) is frozen; the task head stays trainable.

How LoRA meets saving: Keras' `Dense` stores the MERGED kernel (`W + alpha / r * A @ B`) and
no LoRA variables whenever weights are saved (`save_weights`, `.keras` files, and so kbert's
`save_to_preset`), and the saved config carries no LoRA setting. A LoRA model saved that way
therefore loads as an ordinary model with the adapter merged in: the predictions are kept, and
the adapter's optimizer state is not (the loaded model has other trainable variables). To keep
the adapter apart - e.g. one base model and many small adapters - use `save_lora_weights` /
`load_lora_weights`, which write and read only the `A`/`B` matrices.
"""

from pathlib import Path

import keras
import numpy as np

from kbert.checkpoints.atomic import atomic_file

ATTENTION_TARGETS = ("query", "key", "value", "attention_output")
FEEDFORWARD_TARGETS = ("intermediate_dense", "output_dense")
_FORMAT = "kbert-lora"


def _target_layers(backbone, feedforward):
    """`{name: Dense}` of the layers LoRA applies to, named `transformer_layer_i/<layer>`."""
    layers = {}
    for index, block in enumerate(backbone.transformer_layers):
        attention = block.self_attention
        for name, dense in zip(
            ATTENTION_TARGETS,
            (
                attention.query_dense,
                attention.key_dense,
                attention.value_dense,
                attention.output_dense,
            ),
        ):
            layers[f"transformer_layer_{index}/self_attention/{name}"] = dense
        if feedforward:
            layers[f"transformer_layer_{index}/intermediate_dense"] = block.intermediate_dense
            layers[f"transformer_layer_{index}/output_dense"] = block.output_dense
    return layers


def lora_layers(backbone):
    """`{name: Dense}` of the backbone's layers that have LoRA enabled (empty when none)."""
    return {
        name: dense
        for name, dense in _target_layers(backbone, feedforward=True).items()
        if dense.lora_enabled
    }


def enable_lora(backbone, rank, alpha=None, feedforward=False):
    """Enables LoRA of rank `rank` on `backbone` and freezes its other weights.

    See `BertBackbone.enable_lora`.
    """
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 1:
        raise ValueError(f"LoRA `rank` must be a positive integer. Received: rank={rank!r}")
    if alpha is not None and (
        isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha <= 0
    ):
        raise ValueError(
            f"LoRA `alpha` must be a positive number or None. Received: alpha={alpha!r}"
        )
    if lora_layers(backbone):
        raise ValueError(
            "LoRA is already enabled on this model (layers "
            f"{sorted(lora_layers(backbone))[:2]}...). It can be enabled once; to start a new "
            "adapter, merge the current one with `merge_lora()` and enable LoRA on the result."
        )
    targets = _target_layers(backbone, feedforward)
    for name, dense in targets.items():
        d_in, d_out = dense.kernel.shape
        if rank > min(d_in, d_out):
            raise ValueError(
                "LoRA `rank` must not exceed the dimensions of the layers it adapts: layer "
                f"{name!r} has a kernel of shape ({d_in}, {d_out}), so rank <= {min(d_in, d_out)}. "
                f"Received: rank={rank}"
            )
    rank = int(rank)
    for dense in targets.values():
        dense.enable_lora(rank, lora_alpha=alpha)
    lora_variables = {
        id(v) for dense in targets.values() for v in (dense.lora_kernel_a, dense.lora_kernel_b)
    }
    for variable in backbone.weights:
        if id(variable) not in lora_variables:
            variable.trainable = False


def lora_weights(backbone):
    """`{name: variable}` of every LoRA matrix, named `<layer>/lora_kernel_a|b`."""
    weights = {}
    for name, dense in lora_layers(backbone).items():
        weights[f"{name}/lora_kernel_a"] = dense.lora_kernel_a
        weights[f"{name}/lora_kernel_b"] = dense.lora_kernel_b
    return weights


def _require_lora(backbone, what):
    layers = lora_layers(backbone)
    if not layers:
        raise ValueError(
            f"{what} needs a model with LoRA enabled; this one has none. Call "
            "`model.enable_lora(rank)` first."
        )
    return layers


def save_lora_weights(backbone, path):
    """Writes the LoRA matrices alone to the safetensors file `path` (atomically)."""
    layers = _require_lora(backbone, "save_lora_weights")
    from safetensors.numpy import save_file

    path = Path(path)
    if path.suffix != ".safetensors":
        raise ValueError(
            f"LoRA weights are written as a `.safetensors` file. Received: path={str(path)!r}"
        )
    tensors = {
        name: np.ascontiguousarray(keras.ops.convert_to_numpy(variable))
        for name, variable in lora_weights(backbone).items()
    }
    first = next(iter(layers.values()))
    metadata = {
        "format": _FORMAT,
        "rank": str(first.lora_rank),
        "alpha": repr(float(first.lora_alpha)),
        "feedforward": str(any(not name.split("/")[-2] == "self_attention" for name in layers)),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as temporary:
        save_file(tensors, str(temporary), metadata=metadata)


def load_lora_weights(backbone, path):
    """Reads LoRA matrices written by `save_lora_weights` into `backbone` (LoRA enabled)."""
    from kbert.checkpoints.safetensors_io import read_safetensors, safetensors_metadata

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No LoRA weights file at {str(path)!r}")
    metadata = safetensors_metadata(path)
    if metadata.get("format") != _FORMAT:
        raise ValueError(
            f"{str(path)!r} is not a kbert LoRA weights file (written by `save_lora_weights`): its "
            f"metadata has format={metadata.get('format')!r}, expected {_FORMAT!r}"
        )
    if not lora_layers(backbone):
        raise ValueError(
            f"Cannot load LoRA weights from {str(path)!r}: the model has no LoRA enabled. Call "
            f"`model.enable_lora(rank={metadata.get('rank')}, alpha={metadata.get('alpha')}, "
            f"feedforward={metadata.get('feedforward')})` first."
        )
    tensors = read_safetensors(path)
    variables = lora_weights(backbone)
    missing = sorted(set(variables) - set(tensors))
    unexpected = sorted(set(tensors) - set(variables))
    if missing or unexpected:
        raise ValueError(
            f"The LoRA weights in {str(path)!r} do not match the model's LoRA layers: the file "
            "lacks "
            f"{missing[:4]}{'...' if len(missing) > 4 else ''} and has tensors the model does not "
            f"have {unexpected[:4]}{'...' if len(unexpected) > 4 else ''}. (File: rank "
            f"{metadata.get('rank')}, feedforward={metadata.get('feedforward')}.)"
        )
    for name, variable in variables.items():
        if tuple(tensors[name].shape) != tuple(variable.shape):
            raise ValueError(
                f"LoRA tensor {name!r} in {str(path)!r} has shape {tuple(tensors[name].shape)}, "
                "but "
                f"the model's has shape {tuple(variable.shape)} (file rank {metadata.get('rank')}, "
                f"model rank {next(iter(lora_layers(backbone).values())).lora_rank})."
            )
    alpha = float(metadata.get("alpha", "nan"))
    model_alpha = float(next(iter(lora_layers(backbone).values())).lora_alpha)
    if not np.isclose(alpha, model_alpha):
        raise ValueError(
            f"The LoRA weights in {str(path)!r} were trained with alpha={alpha}, but the model's "
            f"LoRA has alpha={model_alpha}. Enable LoRA with `alpha={alpha}`."
        )
    for name, variable in variables.items():
        variable.assign(tensors[name])


def merge_lora(model):
    """A new model of the same class with every LoRA adapter merged into its kernels.

    See `BertBackbone.merge_lora`.
    """
    backbone = getattr(model, "backbone", model)
    layers = _require_lora(backbone, "merge_lora")
    values = {}
    for variable in model.weights:
        if variable.path not in values:
            values[variable.path] = keras.ops.convert_to_numpy(variable)
    for dense in layers.values():
        # With LoRA enabled, `Dense.kernel` is the merged kernel `W + alpha / r * A @ B`.
        (kernel,) = [v for v in dense.weights if v.name == "kernel"]
        values[kernel.path] = keras.ops.convert_to_numpy(keras.ops.cast(dense.kernel, kernel.dtype))
    config = model.get_config()
    preprocessor = getattr(model, "preprocessor", None)
    if preprocessor is not None:
        config = dict(config, preprocessor=None)
    merged = type(model).from_config(config)  # The config records no LoRA.
    missing = [v.path for v in merged.weights if v.path not in values]
    if missing:
        raise ValueError(f"merge_lora could not match the rebuilt model's weights {missing[:4]}")
    for variable in merged.weights:
        variable.assign(values[variable.path])
    if preprocessor is not None:
        merged.preprocessor = preprocessor
    return merged


def refresh_optimizer(model):
    """After LoRA changed which variables train: a fresh default optimizer for a model that
    already built one (a built optimizer tracks the old trainable variables)."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or not optimizer.built:
        return  # Built on the first `fit`, from the variables that train then.
    if getattr(model, "compiled_with_defaults", False):
        # The task's default compile again (same recipe settings), for the variables that train now.
        model.compile(**(model.recipe or {}))
    else:
        import warnings

        warnings.warn(
            f"{type(model).__name__}'s optimizer was already built for the weights that trained "
            "before LoRA was enabled. Call `compile(...)` again before `fit`.",
            stacklevel=3,
        )
