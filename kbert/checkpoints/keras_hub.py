"""keras-hub BERT presets: `config.json` (a serialised `keras_hub.models.BertBackbone`) +
`model.weights.h5`.

The config is read from its whitelisted numeric fields (no deserialisation of arbitrary
objects, no download) and `model.weights.h5` is read with h5py alone, so neither keras-hub
nor TensorFlow is needed; the tensors are copied by keras-hub variable path into kbert's
backbone. keras-hub's BERT uses the tanh approximation of GELU and LayerNorm epsilon 1e-12
everywhere, so a kbert model loaded from it has `activation="gelu_approximate"`; its attention
kernels are per head (`(hidden, heads, head_dim)`) and are reshaped into kbert's
`(hidden, hidden)` kernels.

keras-hub presets hold a backbone only (task heads such as `BertMaskedLM`'s live in a separate
`task.weights.h5` that is not read): loading one into `BertPretrainer` or a task model leaves
the heads fresh (with a warning, or silently with `fresh_heads=True`).
"""

from pathlib import Path

import numpy as np

from kbert.checkpoints import _weights
from kbert.checkpoints._config import config_float, config_int, read_json
from kbert.checkpoints.vocabulary import find_vocabulary

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.weights.h5"
_BERT_NAMES = {"keras_hub>BertBackbone", "keras_nlp>BertBackbone"}
_CONFIG_KEYS = (
    "vocabulary_size",
    "num_layers",
    "num_heads",
    "hidden_dim",
    "intermediate_dim",
    "dropout",
    "max_sequence_length",
    "num_segments",
)
_IGNORED_KEYS = {"name", "trainable", "dtype"}


def is_keras_hub_config(config):
    """True for a config.json written by keras-hub (or its predecessor keras-nlp)."""
    if not isinstance(config, dict):
        return False
    registered = str(config.get("registered_name") or "")
    module = str(config.get("module") or "")
    return registered.startswith(("keras_hub>", "keras_nlp>")) or module.startswith(
        ("keras_hub.", "keras_nlp.")
    )


def backbone_fields(raw, source):
    registered = raw.get("registered_name") or f"{raw.get('module')}.{raw.get('class_name')}"
    if registered not in _BERT_NAMES and not (
        raw.get("class_name") == "BertBackbone"
        and str(raw.get("module", "")).endswith(".bert.bert_backbone")
    ):
        raise ValueError(
            f"{source} is not a BERT checkpoint: it holds the keras-hub model {registered!r}. "
            "Expected keras_hub>BertBackbone."
        )
    inner = raw.get("config")
    if not isinstance(inner, dict):
        raise ValueError(f"{source} has no 'config' object")
    missing = [k for k in _CONFIG_KEYS[:5] if k not in inner]
    unknown = sorted(set(inner) - set(_CONFIG_KEYS) - _IGNORED_KEYS)
    if missing or unknown:
        raise ValueError(
            f"{source}: unexpected keras-hub BertBackbone config (missing {missing}, unknown "
            f"{unknown}). Expected the keys {list(_CONFIG_KEYS)}."
        )
    return {k: inner[k] for k in _CONFIG_KEYS if k in inner}


def read_config(path, require_weights=True):
    """`(backbone_config, vocabulary_path, raw_config)` of a keras-hub BERT preset directory."""
    path = Path(path)
    raw = read_json(path / CONFIG_FILE)
    source = str(path / CONFIG_FILE)
    fields = backbone_fields(raw, source)
    if require_weights and not (path / WEIGHTS_FILE).is_file():
        raise FileNotFoundError(f"The keras-hub preset {path} has no {WEIGHTS_FILE}")
    dropout = config_float(fields, "dropout", source, 0.1)
    config = {
        "vocabulary_size": config_int(fields, "vocabulary_size", source),
        "num_layers": config_int(fields, "num_layers", source),
        "num_heads": config_int(fields, "num_heads", source),
        "hidden_dim": config_int(fields, "hidden_dim", source),
        "intermediate_dim": config_int(fields, "intermediate_dim", source),
        "max_sequence_length": config_int(fields, "max_sequence_length", source, 512),
        "num_segments": config_int(fields, "num_segments", source, 2),
        "dropout": dropout,
        "attention_dropout": dropout,  # keras-hub uses one rate for both.
        "activation": "gelu_approximate",
        "layer_norm_epsilon": 1e-12,
    }
    return config, find_vocabulary(path), raw


# The variables each keras-hub BERT layer (named as in the `name` attribute of its `vars` group)
# stores, in the order of its `vars/0`, `vars/1`, ... datasets.
_LAYER_VARIABLES = {
    "token_embedding": ("embeddings",),
    "position_embedding": ("embeddings",),
    "segment_embedding": ("embeddings",),
    "embeddings_layer_norm": ("gamma", "beta"),
    "self_attention_layer_norm": ("gamma", "beta"),
    "feedforward_layer_norm": ("gamma", "beta"),
    "query": ("kernel", "bias"),
    "key": ("kernel", "bias"),
    "value": ("kernel", "bias"),
    "attention_output": ("kernel", "bias"),
    "feedforward_intermediate_dense": ("kernel", "bias"),
    "feedforward_output_dense": ("kernel", "bias"),
    "pooled_dense": ("kernel", "bias"),
}


def read_weights_h5(weights_path):
    """`{keras-hub variable path: np.ndarray}` of a keras-hub BertBackbone's `model.weights.h5`.

    Reads the HDF5 file with h5py alone (neither keras-hub nor TensorFlow is needed, and
    nothing in the file is executed). Keras 3 stores each layer as a group whose `vars`
    subgroup holds the layer's variables as datasets `0`, `1`, ... and names the layer in
    its `name` attribute; a variable's path is the chain of those names below the model
    (`transformer_layer_0/self_attention_layer/query`) plus the variable's name.
    """
    import h5py

    weights_path = Path(weights_path)
    if not weights_path.is_file():
        raise FileNotFoundError(f"The keras-hub preset {weights_path.parent} has no {WEIGHTS_FILE}")
    arrays = {}

    def visit(group, prefix):
        for key, item in group.items():
            if not isinstance(item, h5py.Group) or key == "vars":
                continue
            variables = item.get("vars")
            name = variables.attrs.get("name") if isinstance(variables, h5py.Group) else None
            if isinstance(name, bytes):
                name = name.decode("utf-8")
            if not isinstance(name, str):
                raise ValueError(
                    f"{weights_path}: the group {item.name} has no vars group with a 'name' "
                    "attribute; expected a model.weights.h5 written by Keras 3 (keras-hub)."
                )
            path = f"{prefix}{name}"
            datasets = sorted(variables.keys(), key=lambda k: int(k) if k.isdigit() else -1)
            if datasets:
                names = _LAYER_VARIABLES.get(name)
                if (
                    names is None
                    or len(datasets) != len(names)
                    or datasets != [str(i) for i in range(len(names))]
                ):
                    raise ValueError(
                        f"{weights_path}: unexpected variables {datasets} in {variables.name} "
                        f"(layer {path!r}). Expected a keras-hub BertBackbone, whose layers "
                        f"store {_LAYER_VARIABLES}."
                    )
                for index, variable in enumerate(names):
                    dataset = variables[str(index)]
                    if not isinstance(dataset, h5py.Dataset):
                        raise ValueError(f"{weights_path}: {dataset.name} is not a dataset")
                    arrays[f"{path}/{variable}"] = np.asarray(dataset[()])
            visit(item, f"{path}/")

    try:
        with h5py.File(weights_path, "r") as file:
            layers = file.get("layers")
            if not isinstance(layers, h5py.Group):
                raise ValueError(
                    f"{weights_path} has no 'layers' group: it is not the model.weights.h5 of a "
                    "keras-hub BertBackbone."
                )
            visit(layers, "")
    except OSError as error:  # h5py's error for damaged, truncated and non-HDF5 files.
        raise ValueError(
            f"Cannot read the keras-hub weights file {weights_path}: it is damaged, truncated "
            f"or not an HDF5 file ({error})."
        ) from None
    return arrays


def open_weights(path):
    """A `TensorSource` over a keras-hub BERT preset: `{variable.path: value}` of its backbone.

    Read with h5py (see `read_weights_h5`): keras-hub and TensorFlow are not needed.
    """
    path = Path(path)
    arrays = read_weights_h5(path / WEIGHTS_FILE)
    return _weights.TensorSource(f"the keras-hub preset {path}", arrays, arrays.__getitem__)


def backbone_entries(backbone):
    """`WeightEntry`s of a kbert `BertBackbone` under keras-hub BertBackbone variable paths."""
    variables = _weights.variables_by_path(backbone)
    R = _weights.RESHAPE

    def entry(name, kbert_path, layout=_weights.IDENTITY, part=_weights.BACKBONE):
        return _weights.WeightEntry(
            name, _weights.find_variable(variables, kbert_path), layout, part
        )

    entries = [
        entry("token_embedding/embeddings", "embeddings/token_embedding/embeddings"),
        entry("position_embedding/embeddings", "embeddings/position_embedding/embeddings"),
        entry("segment_embedding/embeddings", "embeddings/segment_embedding/embeddings"),
        entry("embeddings_layer_norm/gamma", "embeddings/embeddings_layer_norm/gamma"),
        entry("embeddings_layer_norm/beta", "embeddings/embeddings_layer_norm/beta"),
    ]
    for i in range(backbone.num_layers):
        layer = f"transformer_layer_{i}/"
        for projection in ("query", "key", "value", "attention_output"):
            source = f"{layer}self_attention_layer/{projection}"
            target = f"{layer}self_attention/{projection}"
            entries.append(entry(f"{source}/kernel", f"{target}/kernel", R))
            entries.append(entry(f"{source}/bias", f"{target}/bias", R))
        for source, target in (
            ("self_attention_layer_norm", "self_attention_layer_norm"),
            ("feedforward_layer_norm", "output_layer_norm"),
        ):
            entries.append(entry(f"{layer}{source}/gamma", f"{layer}{target}/gamma"))
            entries.append(entry(f"{layer}{source}/beta", f"{layer}{target}/beta"))
        for source, target in (
            ("feedforward_intermediate_dense", "intermediate_dense"),
            ("feedforward_output_dense", "output_dense"),
        ):
            entries.append(entry(f"{layer}{source}/kernel", f"{layer}{target}/kernel"))
            entries.append(entry(f"{layer}{source}/bias", f"{layer}{target}/bias"))
    entries.append(entry("pooled_dense/kernel", "pooler/pooler_dense/kernel", part=_weights.POOLER))
    entries.append(entry("pooled_dense/bias", "pooler/pooler_dense/bias", part=_weights.POOLER))
    return entries


def load_weights(model, path, fresh_heads=None):
    """Loads a keras-hub BERT preset's backbone weights into an existing kbert model.

    Args:
        model: a kbert model whose backbone has the preset's architecture.
        path: str or path. The keras-hub preset directory.
        fresh_heads: `None`, `True` or `False`; see `kbert.checkpoints.formats`. keras-hub
            presets carry no heads kbert reads.

    Returns:
        A `LoadReport`.

    `from_preset` of a keras-hub preset directory calls it, e.g.
    `BertBackbone.from_preset("path/to/keras_hub_bert_preset")`.
    """
    backbone = getattr(model, "backbone", model)
    # keras-hub backbone presets hold no head kbert reads: an empty head table, so every head
    # variable of `model` is reported as absent (fresh) rather than looked up.
    entries = backbone_entries(backbone) + _weights.head_entries(model, {})
    return _weights.assign_checked(
        type(model).__name__, entries, open_weights(path), fresh_heads=fresh_heads
    )
