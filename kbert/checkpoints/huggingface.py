"""Hugging Face BERT directories: read (`config.json` + safetensors / `pytorch_model.bin`) and
write.

A Hugging Face BERT directory holds `config.json` (`"model_type": "bert"`), the weights as
`model.safetensors` (or shards listed in `model.safetensors.index.json`; or, legacy,
`pytorch_model.bin`) and usually `vocab.txt` (`transformers` 5 saves `tokenizer.json` alone:
its WordPiece vocabulary is read instead, see `kbert.checkpoints.vocabulary`). Weight names are
those of `transformers`' `BertModel` (`embeddings.word_embeddings.weight`,
`encoder.layer.0.attention.self.query.weight`, ...) with a `bert.` prefix in the task classes
(`BertForPreTraining`, ...). Torch `Linear` weights are stored `(out, in)` and are transposed
into Keras `(in, out)` kernels.

Safetensors files are read with NumPy alone (`kbert.checkpoints.safetensors_io`); a
`pytorch_model.bin` is read only when torch is installed, with `torch.load(weights_only=True)`
(no arbitrary unpickling). Nothing in a checkpoint directory is ever executed.
"""

import json
import os
from pathlib import Path

import keras
import numpy as np
from safetensors.numpy import save_file

from kbert.checkpoints import _weights
from kbert.checkpoints._config import config_float, config_int, read_json
from kbert.checkpoints.atomic import atomic_directory, fix_file_modes
from kbert.checkpoints.model_card import CARD_FILE, model_card
from kbert.checkpoints.safetensors_io import read_safetensors, read_safetensors_header
from kbert.checkpoints.vocabulary import (
    TOKENIZER_CONFIG_FILE,
    VOCABULARY_FILE,
    find_vocabulary,
    model_tokenizer,
    resolve_vocabulary,
    tokenizer_file_settings,
    write_tokenizer_files,
)

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX_FILE = "model.safetensors.index.json"
TORCH_FILE = "pytorch_model.bin"
TORCH_INDEX_FILE = "pytorch_model.bin.index.json"
PREFIX = "bert."

# `transformers.BertConfig` defaults, used for keys a config.json leaves out.
_CONFIG_DEFAULTS = {
    "vocab_size": 30522,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "layer_norm_eps": 1e-12,
    "pad_token_id": 0,
}
# HF `hidden_act` -> kbert activation. HF "gelu" is the exact erf form; the tanh forms differ
# from it by up to ~1e-3, which is why they must not be confused.
_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_python": "gelu",
    "gelu_new": "gelu_approximate",
    "gelu_pytorch_tanh": "gelu_approximate",
    "gelu_python_tanh": "gelu_approximate",
    "gelu_fast": "gelu_approximate",
    "relu": "relu",
    "tanh": "tanh",
}
_EXPORT_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_approximate": "gelu_new",
    "relu": "relu",
    "tanh": "tanh",
}
# Buffers some transformers versions save; they carry no weights.
_BUFFERS = {"bert.embeddings.position_ids", "bert.embeddings.token_type_ids"}
_TIED_DECODER = "cls.predictions.decoder.weight"
_MLM_BIAS = "cls.predictions.bias"
_MLM_BIAS_ALIAS = "cls.predictions.decoder.bias"
# `transformers`' label names when a config.json does not name its labels: LABEL_0, LABEL_1...
_DEFAULT_LABEL_PREFIX = "LABEL_"

# === The one table of BERT's Hugging Face names ===
# The backbone's names are in `backbone_entries`; the rows below name each kbert model's head.

# kbert class -> the `transformers` class written into config.json `architectures`.
ARCHITECTURES = {
    "BertBackbone": "BertModel",
    "BertPretrainer": "BertForPreTraining",
    "BertSparseEncoder": "BertForMaskedLM",
    "BertClassifier": "BertForSequenceClassification",
    "BertTagger": "BertForTokenClassification",
    "BertQuestionAnswerer": "BertForQuestionAnswering",
    "BertMultipleChoice": "BertForMultipleChoice",
}
# kbert class -> `(state-dict name, kbert variable's attribute path, transposed)` of every head
# variable. Torch `Linear` weights are stored (out, in), so they are transposed. The masked-LM
# decoder matrix is the token embedding (tied, as in HF): only its bias is a head tensor (alias
# `cls.predictions.decoder.bias`).
HEAD_WEIGHTS = {
    "BertBackbone": (),
    "BertPretrainer": (
        ("cls.predictions.transform.dense.weight", "masked_lm_head.transform_dense.kernel", True),
        ("cls.predictions.transform.dense.bias", "masked_lm_head.transform_dense.bias", False),
        ("cls.predictions.transform.LayerNorm.weight", "masked_lm_head.layer_norm.gamma", False),
        ("cls.predictions.transform.LayerNorm.bias", "masked_lm_head.layer_norm.beta", False),
        ("cls.predictions.bias", "masked_lm_head.output_bias", False),
        ("cls.seq_relationship.weight", "next_sentence_head.kernel", True),
        ("cls.seq_relationship.bias", "next_sentence_head.bias", False),
    ),
    # SPLADE: the masked-LM head alone (a `BertForMaskedLM`, or the MLM part of pretraining).
    "BertSparseEncoder": (
        ("cls.predictions.transform.dense.weight", "masked_lm_head.transform_dense.kernel", True),
        ("cls.predictions.transform.dense.bias", "masked_lm_head.transform_dense.bias", False),
        ("cls.predictions.transform.LayerNorm.weight", "masked_lm_head.layer_norm.gamma", False),
        ("cls.predictions.transform.LayerNorm.bias", "masked_lm_head.layer_norm.beta", False),
        ("cls.predictions.bias", "masked_lm_head.output_bias", False),
    ),
    "BertClassifier": (
        ("classifier.weight", "output_dense.kernel", True),
        ("classifier.bias", "output_dense.bias", False),
    ),
    "BertTagger": (
        ("classifier.weight", "output_dense.kernel", True),
        ("classifier.bias", "output_dense.bias", False),
    ),
    "BertQuestionAnswerer": (
        ("qa_outputs.weight", "span_dense.kernel", True),
        ("qa_outputs.bias", "span_dense.bias", False),
    ),
    # One score per (context, choice) pair: `classifier` is (1, hidden) in the checkpoint.
    "BertMultipleChoice": (
        ("classifier.weight", "output_dense.kernel", True),
        ("classifier.bias", "output_dense.bias", False),
    ),
}


def _classifier_config(model):
    if model.is_regression:
        problem_type = "regression"
    elif model.multi_label:
        problem_type = "multi_label_classification"
    else:
        problem_type = "single_label_classification"
    return {"num_labels": model.num_classes, "problem_type": problem_type}


def _tagger_config(model):
    names = model.labels or [f"{_DEFAULT_LABEL_PREFIX}{i}" for i in range(model.num_classes)]
    return {
        "num_labels": model.num_classes,
        "id2label": {str(i): name for i, name in enumerate(names)},
        "label2id": {name: i for i, name in enumerate(names)},
    }


def _cross_encoder_config(model):
    return _label_config(model.num_labels, model.labels)


def _label_config(num_labels, labels):
    names = labels or [f"{_DEFAULT_LABEL_PREFIX}{i}" for i in range(num_labels)]
    return {
        "num_labels": num_labels,
        "id2label": {str(i): name for i, name in enumerate(names)},
        "label2id": {name: i for i, name in enumerate(names)},
    }


# kbert class -> the config.json entries its head adds on export (label count and names).
EXPORT_CONFIG = {
    "BertCrossEncoder": _cross_encoder_config,
    "BertClassifier": _classifier_config,
    "BertTagger": _tagger_config,
    "BertQuestionAnswerer": lambda model: {"num_labels": 2},
}


def _classifier_arguments(config):
    id2label = config.get("id2label") or {}
    arguments = {"num_classes": int(config.get("num_labels", len(id2label) or 2))}
    if config.get("problem_type") == "multi_label_classification":
        arguments["multi_label"] = True
    return arguments


def _tagger_arguments(config):
    id2label = config.get("id2label") or {}
    if not id2label:
        return {"num_classes": int(config["num_labels"])} if "num_labels" in config else {}
    names = [id2label[key] for key in sorted(id2label, key=int)]
    if all(name == f"{_DEFAULT_LABEL_PREFIX}{i}" for i, name in enumerate(names)):
        return {"num_classes": len(names)}
    return {"num_classes": len(names), "labels": names}


def _cross_encoder_arguments(config):
    arguments = _tagger_arguments(config)
    return {("num_labels" if key == "num_classes" else key): v for key, v in arguments.items()}


# kbert class -> the constructor arguments its head reads from a config.json of its own
# `transformers` class (a `BertForSequenceClassification` config gives `num_classes`).
MODEL_ARGUMENTS = {
    "BertCrossEncoder": _cross_encoder_arguments,
    "BertClassifier": _classifier_arguments,
    "BertTagger": _tagger_arguments,
}


def model_arguments(cls, config):
    """Constructor arguments of kbert model class `cls` read from a Hugging Face `config.json` dict.

    Only a config written for `cls`'s own `transformers` class counts (a plain `BertModel`
    config says nothing about a classifier's labels); the caller's arguments override these.
    """
    read = _weights.table_row(MODEL_ARGUMENTS, cls)
    architecture = _weights.table_row(ARCHITECTURES, cls)
    if read is None or architecture not in (config.get("architectures") or []):
        return {}
    return read(config)


def looks_like_huggingface_config(config):
    """True for a `transformers` config.json (as opposed to keras-hub's or kbert's)."""
    return isinstance(config, dict) and ("model_type" in config or "architectures" in config)


def backbone_config_from_huggingface(config, source="config.json"):
    """Translates a Hugging Face BERT `config.json` dict into `BertBackbone` arguments.

    Raises:
        ValueError: when the config is not BERT (`model_type` other than `"bert"`) or uses
            features kbert's BERT does not have (relative positions, decoder, an unknown
            activation).
    """
    model_type = config.get("model_type")
    architectures = config.get("architectures") or []
    if model_type != "bert" and not (
        model_type is None
        and architectures
        and all(str(a).startswith("Bert") for a in architectures)
    ):
        raise ValueError(
            f"{source} is not a BERT checkpoint: model_type={model_type!r}, "
            f"architectures={architectures}. kbert loads model_type 'bert' only (RoBERTa, "
            "DistilBERT, ALBERT, ELECTRA... have other architectures or weight layouts)."
        )
    position_type = config.get("position_embedding_type", "absolute")
    if position_type != "absolute":
        raise ValueError(
            f"{source}: position_embedding_type={position_type!r} is not supported. "
            "Expected 'absolute' (learned absolute positions, as in BERT)."
        )
    for flag in ("is_decoder", "add_cross_attention"):
        if config.get(flag):
            raise ValueError(f"{source}: {flag}=true is not supported; kbert's BERT is an encoder.")
    merged = {**_CONFIG_DEFAULTS, **{k: v for k, v in config.items() if v is not None}}
    hidden_act = merged["hidden_act"]
    if hidden_act not in _ACTIVATIONS:
        raise ValueError(
            f"{source}: hidden_act={hidden_act!r} is not supported. Expected one of "
            f"{sorted(_ACTIVATIONS)}."
        )
    return {
        "vocabulary_size": config_int(merged, "vocab_size", source),
        "num_layers": config_int(merged, "num_hidden_layers", source),
        "num_heads": config_int(merged, "num_attention_heads", source),
        "hidden_dim": config_int(merged, "hidden_size", source),
        "intermediate_dim": config_int(merged, "intermediate_size", source),
        "max_sequence_length": config_int(merged, "max_position_embeddings", source),
        "num_segments": config_int(merged, "type_vocab_size", source),
        "dropout": config_float(merged, "hidden_dropout_prob", source),
        "attention_dropout": config_float(merged, "attention_probs_dropout_prob", source),
        "activation": _ACTIVATIONS[hidden_act],
        "layer_norm_epsilon": config_float(merged, "layer_norm_eps", source),
        "pad_token_id": config_int(merged, "pad_token_id", source),
    }


def read_config(path, require_weights=True):
    """Reads a Hugging Face directory's config: `(backbone_config, vocabulary_path, raw_config)`.

    Checks that the directory is BERT and, with `require_weights`, that a weights file exists,
    before any model is built.
    """
    path = Path(path)
    raw = read_json(path / CONFIG_FILE)
    if not isinstance(raw, dict):
        raise ValueError(
            f"{path / CONFIG_FILE} must hold a JSON object. Received: {type(raw).__name__}"
        )
    backbone_config = backbone_config_from_huggingface(raw, source=str(path / CONFIG_FILE))
    if require_weights:
        _weight_files(path)
    return backbone_config, find_vocabulary(path), raw


def _weight_files(path):
    """`(kind, [files])` of the weights in a directory; raises FileNotFoundError when there are
    none."""
    path = Path(path)
    if (path / SAFETENSORS_FILE).is_file():
        return "safetensors", [path / SAFETENSORS_FILE]
    if (path / SAFETENSORS_INDEX_FILE).is_file():
        return "safetensors", _shards(path, SAFETENSORS_INDEX_FILE)
    if (path / TORCH_FILE).is_file():
        return "torch", [path / TORCH_FILE]
    if (path / TORCH_INDEX_FILE).is_file():
        return "torch", _shards(path, TORCH_INDEX_FILE)
    raise FileNotFoundError(
        f"No Hugging Face weights in {path}. Expected {SAFETENSORS_FILE}, "
        f"{SAFETENSORS_INDEX_FILE} (shards), {TORCH_FILE} or {TORCH_INDEX_FILE}. "
        f"Found: {sorted(p.name for p in path.iterdir())}"
    )


def _shards(path, index_file):
    index = read_json(path / index_file)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{path / index_file} has no 'weight_map'")
    files = []
    for name in sorted(set(weight_map.values())):
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
            raise ValueError(f"{path / index_file} names a shard outside the directory: {name!r}")
        if not (path / name).is_file():
            raise FileNotFoundError(f"Shard {name} listed in {index_file} is missing from {path}")
        files.append(path / name)
    return files


def _read_torch_file(file):
    try:
        import torch
    except ImportError:
        raise ImportError(
            f"{file} is a PyTorch pickle; reading it needs torch, which is not installed. "
            "Install torch, or convert the checkpoint to model.safetensors."
        ) from None
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as error:  # UnpicklingError for anything but plain tensors, EOF for cut files.
        raise ValueError(
            f"Cannot read {file} safely with torch.load(weights_only=True): {error}"
        ) from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise ValueError(f"{file} does not hold a state dict of tensors")
    arrays = {}
    for name, tensor in state.items():
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"{file}: entry {name!r} is a {type(tensor).__name__}, not a tensor")
        tensor = tensor.detach().cpu()
        if tensor.is_floating_point():
            tensor = tensor.to(torch.float32)
        arrays[name] = tensor.numpy()
    return arrays


SIZE_TENSORS = {
    "word": PREFIX + "embeddings.word_embeddings.weight",
    "position": PREFIX + "embeddings.position_embeddings.weight",
    "segment": PREFIX + "embeddings.token_type_embeddings.weight",
    "intermediate": (PREFIX + "encoder.layer.0.intermediate.dense.weight", True),
    "layer": r"^bert\.encoder\.layer\.(\d+)\.",
}


def header_shapes(path):
    """`{canonical name: shape}` from the safetensors headers (no tensor data read), or `None`
    for `pytorch_model.bin` checkpoints, whose shapes are only known after unpickling."""
    kind, files = _weight_files(path)
    if kind != "safetensors":
        return None
    shapes = {}
    for file in files:
        header = read_safetensors_header(file)[0]
        for name, entry in header.items():
            if name != "__metadata__" and isinstance(entry, dict):
                shapes[_canonical_name(name)] = tuple(entry.get("shape") or ())
    return shapes


def _canonical_name(name):
    """The name with the `bert.` prefix on backbone tensors and LayerNorm weight/bias spelling."""
    if not name.startswith(PREFIX) and name.split(".", 1)[0] in ("embeddings", "encoder", "pooler"):
        name = PREFIX + name
    if ".LayerNorm." in name:  # Checkpoints converted from TF name LayerNorm gamma/beta.
        head, _, leaf = name.rpartition(".")
        name = head + "." + {"gamma": "weight", "beta": "bias"}.get(leaf, leaf)
    return name


def open_weights(path):
    """A `TensorSource` over a Hugging Face directory's weights, names in canonical form."""
    path = Path(path)
    kind, files = _weight_files(path)
    arrays = {}
    originals = {}
    for file in files:
        if kind == "safetensors":
            read_safetensors_header(file)  # Validates the whole file (truncation) up front.
            tensors = read_safetensors(file)
        else:
            tensors = _read_torch_file(file)
        for name, array in tensors.items():
            canonical = _canonical_name(name)
            if canonical in arrays:
                raise ValueError(
                    f"{path} holds the same weight twice: {originals[canonical]!r} and {name!r}"
                )
            arrays[canonical] = array
            originals[canonical] = name
    prefixed = any(name.startswith(PREFIX) for name in originals.values())

    def display(canonical):
        if canonical in originals:
            return originals[canonical]
        return (
            canonical if prefixed or not canonical.startswith(PREFIX) else canonical[len(PREFIX) :]
        )

    description = f"the Hugging Face checkpoint {path}"
    return _weights.TensorSource(description, arrays, arrays.__getitem__, display)


def backbone_entries(backbone):
    """`WeightEntry`s of a kbert `BertBackbone`, named as in `transformers`' BertModel (with
    `bert.`)."""
    variables = _weights.variables_by_path(backbone)

    def entry(hf_name, kbert_path, layout=_weights.IDENTITY, part=_weights.BACKBONE):
        return _weights.WeightEntry(
            PREFIX + hf_name, _weights.find_variable(variables, kbert_path), layout, part
        )

    T = _weights.TRANSPOSE
    entries = [
        entry("embeddings.word_embeddings.weight", "embeddings/token_embedding/embeddings"),
        entry("embeddings.position_embeddings.weight", "embeddings/position_embedding/embeddings"),
        entry("embeddings.token_type_embeddings.weight", "embeddings/segment_embedding/embeddings"),
        entry("embeddings.LayerNorm.weight", "embeddings/embeddings_layer_norm/gamma"),
        entry("embeddings.LayerNorm.bias", "embeddings/embeddings_layer_norm/beta"),
    ]
    for i in range(backbone.num_layers):
        hf, kb = f"encoder.layer.{i}.", f"transformer_layer_{i}/"
        for hf_dense, kb_dense in (
            ("attention.self.query", "self_attention/query"),
            ("attention.self.key", "self_attention/key"),
            ("attention.self.value", "self_attention/value"),
            ("attention.output.dense", "self_attention/attention_output"),
            ("intermediate.dense", "intermediate_dense"),
            ("output.dense", "output_dense"),
        ):
            entries.append(entry(f"{hf}{hf_dense}.weight", f"{kb}{kb_dense}/kernel", T))
            entries.append(entry(f"{hf}{hf_dense}.bias", f"{kb}{kb_dense}/bias"))
        for hf_norm, kb_norm in (
            ("attention.output.LayerNorm", "self_attention_layer_norm"),
            ("output.LayerNorm", "output_layer_norm"),
        ):
            entries.append(entry(f"{hf}{hf_norm}.weight", f"{kb}{kb_norm}/gamma"))
            entries.append(entry(f"{hf}{hf_norm}.bias", f"{kb}{kb_norm}/beta"))
    entries.append(entry("pooler.dense.weight", "pooler/pooler_dense/kernel", T, _weights.POOLER))
    entries.append(entry("pooler.dense.bias", "pooler/pooler_dense/bias", part=_weights.POOLER))
    return entries


def model_entries(model):
    """Backbone entries plus the model's head entries (from `HEAD_WEIGHTS`)."""
    backbone = getattr(model, "backbone", model)
    return backbone_entries(backbone) + _weights.head_entries(model, HEAD_WEIGHTS)


def load_weights(model, path, fresh_heads=None):
    """Loads a Hugging Face BERT directory's weights into an existing kbert model.

    All tensors are read and checked (names, shapes, tied decoder) before any variable is
    assigned: on error the model is left as it was.

    Args:
        model: a kbert model (`BertBackbone`, `BertPretrainer` or a task model; heads named
            in `HEAD_WEIGHTS`), with the checkpoint's architecture.
        path: str or path. The Hugging Face directory.
        fresh_heads: `None` (default: load the heads the checkpoint has; warn about absent
            ones), `False` (absent heads are an error) or `True` (do not load heads).

    Returns:
        A `LoadReport` (tensors loaded, variables left fresh, checkpoint tensors unused).

    Example:
    >>> config = dict(vocabulary_size=100, num_layers=1, num_heads=2, hidden_dim=16,
    ...               intermediate_dim=32)
    >>> path = kbert.checkpoints.export_to_huggingface(kbert.models.BertBackbone(**config), "hf")
    >>> backbone = kbert.models.BertBackbone(**config)
    >>> report = kbert.checkpoints.load_huggingface_weights(backbone, path)
    >>> len(report.loaded), report.fresh, report.unused  # every tensor found, none left over
    (23, [], [])
    """
    entries = model_entries(model)
    source = open_weights(path)
    names = {e.name for e in entries}
    consumed = []
    if _MLM_BIAS in names and _MLM_BIAS not in source.names and _MLM_BIAS_ALIAS in source.names:
        entries = [
            _weights.WeightEntry(_MLM_BIAS_ALIAS, e.variable, e.layout, e.part)
            if e.name == _MLM_BIAS
            else e
            for e in entries
        ]
    elif _MLM_BIAS_ALIAS in source.names:
        consumed.append(_MLM_BIAS_ALIAS)
    if _TIED_DECODER in source.names:
        consumed.append(_TIED_DECODER)
        if _MLM_BIAS in names and not fresh_heads:
            _check_tied_decoder(source)
    return _weights.assign_checked(
        type(model).__name__,
        entries,
        source,
        fresh_heads=fresh_heads,
        is_backbone_tensor=lambda name: name.startswith(PREFIX),
        ignorable=lambda name: name in _BUFFERS,
        consumed_extra=consumed,
    )


def _check_tied_decoder(source):
    decoder = source.read(_TIED_DECODER)
    embeddings_name = PREFIX + "embeddings.word_embeddings.weight"
    if embeddings_name not in source.names:
        return  # Reported as a missing weight.
    embeddings = source.read(embeddings_name)
    if decoder.shape != embeddings.shape or not np.array_equal(decoder, embeddings):
        raise ValueError(
            f"{source.description}: the masked-LM decoder ({_TIED_DECODER}) differs from the "
            "word embeddings. kbert ties the decoder to the token embedding, as BERT does; "
            "untied decoders are not supported (pass fresh_heads=True to load the backbone only)."
        )


def hidden_act_for(activation):
    if not isinstance(activation, str) or activation not in _EXPORT_ACTIVATIONS:
        raise ValueError(
            "Only these activations can be written to a Hugging Face config: "
            f"{sorted(_EXPORT_ACTIVATIONS)}. Received: activation={activation!r}"
        )
    return _EXPORT_ACTIVATIONS[activation]


def huggingface_config(model):
    """The `config.json` dict for `model` (its `transformers` class from `ARCHITECTURES`)."""
    backbone = getattr(model, "backbone", model)
    architecture = _weights.table_row(ARCHITECTURES, model)
    if not architecture:
        raise ValueError(
            f"{type(model).__name__} has no Hugging Face architecture: it cannot be exported "
            f"to Hugging Face. Expected a subclass of one of {sorted(ARCHITECTURES)} (see "
            "`ARCHITECTURES` in kbert.checkpoints.huggingface)."
        )
    config = {
        "architectures": [architecture],
        "model_type": "bert",
        "vocab_size": backbone.vocabulary_size,
        "hidden_size": backbone.hidden_dim,
        "num_hidden_layers": backbone.num_layers,
        "num_attention_heads": backbone.num_heads,
        "intermediate_size": backbone.intermediate_dim,
        "hidden_act": hidden_act_for(backbone.activation),
        "hidden_dropout_prob": backbone.dropout,
        "attention_probs_dropout_prob": backbone.attention_dropout,
        "max_position_embeddings": backbone.max_sequence_length,
        "type_vocab_size": backbone.num_segments,
        "initializer_range": 0.02,
        "layer_norm_eps": backbone.layer_norm_epsilon,
        "pad_token_id": 0 if backbone.pad_token_id is None else backbone.pad_token_id,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
    }
    extra = _weights.table_row(EXPORT_CONFIG, model)
    if extra is not None:
        config.update(extra(model))
    return config


def export_to_huggingface(model, path, vocabulary=None, lowercase=None, tokenizer=None):
    """Writes a kbert model as a Hugging Face BERT directory that `transformers` loads.

    Writes `config.json` (`model_type: bert`, `architectures` from the model's
    `transformers` class: `BertModel`, `BertForPreTraining` or a task class),
    `model.safetensors` (float32, written with NumPy; backbone names without prefix for
    `BertModel`, with `bert.` otherwise), the model card `README.md`
    (`kbert.checkpoints.model_card`) and, when a vocabulary is known, `vocab.txt` and
    `tokenizer_config.json`. The directory is replaced atomically (see
    `kbert.checkpoints.atomic`): a kill leaves the old or the new complete export.

    Args:
        model: a kbert model: `BertBackbone`, `BertPretrainer`, `BertClassifier`,
            `BertTagger`, `BertQuestionAnswerer` or `BertMultipleChoice` (or a subclass).
        path: str or path. Output directory (created if needed).
        vocabulary: optional list of tokens or path of a `vocab.txt`. Defaults to the model's
            tokenizer / preprocessor vocabulary or `preset_vocabulary_path`, if any.
        lowercase: optional bool written as `do_lower_case` into `tokenizer_config.json`.
            Defaults to the tokenizer's `lowercase` attribute when there is one.
        tokenizer: optional `kbert.text.BertTokenizer` whose settings (casing, special
            tokens written in text as `split_special_tokens`) `tokenizer_config.json`
            records. Defaults to the model's own, if any.

    Returns:
        The output directory as a `Path`.

    Example:
    >>> backbone = kbert.models.BertBackbone(vocabulary_size=100, num_layers=1, num_heads=2,
    ...                                      hidden_dim=16, intermediate_dim=32)
    >>> export_to_huggingface(kbert.models.BertPretrainer(backbone), "hf_out")
    PosixPath('hf_out')
    >>> import transformers
    >>> model = transformers.BertForPreTraining.from_pretrained("hf_out")
    >>> model.config.num_hidden_layers, model.config.hidden_size
    (1, 16)
    """
    from kbert.checkpoints.quantized import check_not_quantized

    check_not_quantized(model, "export_to_huggingface")
    path = Path(path)
    config = huggingface_config(model)
    entries = model_entries(model)
    covered = {id(e.variable) for e in entries}
    uncovered = [v.path for v in model.weights if id(v) not in covered]
    if uncovered:
        raise ValueError(
            f"{type(model).__name__} has variables with no Hugging Face name, which the export "
            f"would drop: {uncovered}. Name them in `HEAD_WEIGHTS` of "
            "kbert.checkpoints.huggingface."
        )
    strip = config["architectures"][0] == "BertModel"
    tensors = {}
    for entry in entries:
        value = np.asarray(keras.ops.convert_to_numpy(entry.variable), dtype=np.float32)
        name = entry.name[len(PREFIX) :] if strip and entry.name.startswith(PREFIX) else entry.name
        tensors[name] = _weights.from_variable_layout(value, entry)
    tokens = resolve_vocabulary(model, vocabulary, config["vocab_size"])

    owned = (CONFIG_FILE, SAFETENSORS_FILE, VOCABULARY_FILE, TOKENIZER_CONFIG_FILE, CARD_FILE)
    with atomic_directory(path, owned_files=owned) as staging:
        (staging / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        save_file(tensors, str(staging / SAFETENSORS_FILE), metadata={"format": "pt"})
        if tokens is not None:
            settings = tokenizer_file_settings(tokenizer or model_tokenizer(model))
            if lowercase is not None:
                settings["lowercase"] = bool(lowercase)
            write_tokenizer_files(
                staging, tokens, model_max_length=config["max_position_embeddings"], **settings
            )
        # The model card (kbert.checkpoints.model_card), replacing any a nested export wrote.
        (staging / CARD_FILE).write_text(
            model_card(model, os.fspath(path), formats=("transformers",)), encoding="utf-8"
        )
        fix_file_modes(staging)  # safetensors writes 0600; every file gets the usual mode.
    return path
