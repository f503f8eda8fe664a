"""sentence-transformers SparseEncoder (SPLADE) directories: read their settings, write them.

A SparseEncoder directory is a Hugging Face `BertForMaskedLM` directory (the masked-LM
Transformer module, at the root or in a subdirectory) plus:

- `modules.json`: `MLMTransformer` (or, in newer saves, a `Transformer` whose
  `sentence_bert_config.json` says `"transformer_task": "fill-mask"`) -> `SpladePooling`;
- `<pooling path>/config.json`: `pooling_strategy` (`max` / `sum`) and `activation_function`
  (`relu` / `log1p_relu`);
- `sentence_bert_config.json`: `max_seq_length` and `do_lower_case` of the Transformer;
- `config_sentence_transformers.json`: `prompts`, `default_prompt_name`,
  `similarity_fn_name` (`dot` when unset) and `max_active_dims` (when set).

`read_settings` turns these into `kbert.models.BertSparseEncoder` arguments;
`export_to_sparse_encoder` writes a directory that `sentence_transformers.SparseEncoder`
loads with the same vectors. This module reads JSON only and never imports
sentence-transformers.
"""

import json
import os
import shutil
from pathlib import Path

from kbert.checkpoints._config import read_json
from kbert.checkpoints.model_card import CARD_FILE, model_card
from kbert.checkpoints.sentence_transformers import (
    MODULES_FILE,
    SENTENCE_BERT_CONFIG_FILE,
    SENTENCE_TRANSFORMERS_CONFIG_FILE,
    read_transformer_settings,
)

POOLING_DIRECTORY = "1_SpladePooling"
_TRANSFORMER_KINDS = ("MLMTransformer", "Transformer")
_POOLING_KIND = "SpladePooling"
_MASKED_LM_TASK = "fill-mask"
_SIMILARITY_NAMES = {None: "dot", "dot": "dot", "dot_product": "dot", "cosine": "cosine"}
# The module types sentence-transformers 6 writes for a SPLADE model.
_MODULE_TYPES = (
    "sentence_transformers.sparse_encoder.modules.mlm_transformer.MLMTransformer",
    "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling",
)


def _kind(entry):
    if isinstance(entry, dict) and isinstance(entry.get("type"), str):
        return entry["type"].rsplit(".", 1)[-1]
    return None


def is_sparse_encoder_dir(path):
    """True for a directory whose `modules.json` lists a `SpladePooling` module."""
    file = Path(path) / MODULES_FILE
    if not file.is_file():
        return False
    try:
        entries = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    return isinstance(entries, list) and any(_kind(e) == _POOLING_KIND for e in entries)


def read_modules(path):
    """`(transformer directory, pooling directory)` of a SparseEncoder's `modules.json`.

    Raises a ValueError for any other pipeline than a masked-LM Transformer followed by
    `SpladePooling` (a `SparseAutoEncoder`, `SparseStaticEmbedding`, a `Router`, ...).
    """
    path = Path(path)
    file = path / MODULES_FILE
    entries = read_json(file)
    kinds = [_kind(e) for e in entries] if isinstance(entries, list) else None
    if kinds is None or len(kinds) != 2 or kinds[0] not in _TRANSFORMER_KINDS:
        raise ValueError(
            f"{file} describes the pipeline {kinds or entries!r}. kbert reads SparseEncoder "
            f"models made of {list(_TRANSFORMER_KINDS)[0]} (or a fill-mask Transformer) -> "
            f"{_POOLING_KIND}."
        )
    if kinds[1] != _POOLING_KIND:
        raise ValueError(
            f"{file} describes the pipeline {kinds}. kbert reads SparseEncoder models whose "
            f"second module is {_POOLING_KIND}."
        )
    transformer_dir = path / (entries[0].get("path") or "")
    if kinds[0] == "Transformer":
        sbert_file = transformer_dir / SENTENCE_BERT_CONFIG_FILE
        sbert = read_json(sbert_file) if sbert_file.is_file() else {}
        task = sbert.get("transformer_task") if isinstance(sbert, dict) else None
        if task != _MASKED_LM_TASK:
            raise ValueError(
                f"{file} pools a Transformer module whose {sbert_file.name} says "
                f"transformer_task={task!r}. SPLADE pooling needs masked-LM logits: "
                f'"transformer_task": "{_MASKED_LM_TASK}".'
            )
    return transformer_dir, path / (entries[1].get("path") or "")


def transformer_directory(path):
    """The directory holding the masked-LM Transformer's weights (`config.json`, ...)."""
    return read_modules(path)[0]


def read_pooling(pooling_dir):
    """`{"pooling_strategy", "activation"}` of a `SpladePooling` module's `config.json`."""
    file = Path(pooling_dir) / "config.json"
    config = read_json(file) if file.is_file() else {}
    if not isinstance(config, dict):
        raise ValueError(f"{file} must hold a JSON object. Received: {config!r}")
    strategy = config.get("pooling_strategy", "max")
    activation = config.get("activation_function", "relu")
    if strategy not in ("max", "sum") or activation not in ("relu", "log1p_relu"):
        raise ValueError(
            f"{file} asks for pooling_strategy={strategy!r}, activation_function="
            f"{activation!r}. kbert implements pooling_strategy 'max' / 'sum' and "
            "activation_function 'relu' / 'log1p_relu'."
        )
    return {"pooling_strategy": strategy, "activation": activation}


def read_settings(path):
    """`BertSparseEncoder` arguments stored in a SparseEncoder directory.

    Returns a dict with `pooling_strategy`, `activation`, `prompts`, `default_prompt_name`,
    `similarity_function`, `max_active_dims`, `lowercase_input` and, when known,
    `max_seq_length` (see `kbert.checkpoints.sentence_transformers.read_transformer_settings`).
    """
    path = Path(path)
    transformer_dir, pooling_dir = read_modules(path)
    settings = read_pooling(pooling_dir)
    settings.update(read_transformer_settings(transformer_dir))
    file = path / SENTENCE_TRANSFORMERS_CONFIG_FILE
    config = read_json(file) if file.is_file() else {}
    if not isinstance(config, dict):
        raise ValueError(f"{file} must hold a JSON object. Received: {config!r}")
    prompts = config.get("prompts") or {}
    if not isinstance(prompts, dict):
        raise ValueError(f"{file}: prompts must be an object. Received: {prompts!r}")
    # sentence-transformers stores unset prompts (`"query": null`) as empty ones.
    settings["prompts"] = {name: text or "" for name, text in prompts.items()}
    settings["default_prompt_name"] = config.get("default_prompt_name")
    similarity = config.get("similarity_fn_name")
    if similarity not in _SIMILARITY_NAMES:
        raise ValueError(
            f"{file}: similarity_fn_name {similarity!r} is not implemented by kbert's sparse "
            f"encoder. Expected one of {sorted(k for k in _SIMILARITY_NAMES if k)}."
        )
    settings["similarity_function"] = _SIMILARITY_NAMES[similarity]
    settings["max_active_dims"] = config.get("max_active_dims")
    return settings


def write_settings(encoder, directory):
    """Writes the SparseEncoder files of `encoder` into `directory` (no weights)."""
    directory = Path(directory)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": _MODULE_TYPES[0]},
        {"idx": 1, "name": "1", "path": POOLING_DIRECTORY, "type": _MODULE_TYPES[1]},
    ]
    (directory / MODULES_FILE).write_text(json.dumps(modules, indent=2) + "\n")
    (directory / POOLING_DIRECTORY).mkdir(exist_ok=True)
    pooling = {
        "pooling_strategy": encoder.pooling_strategy,
        "activation_function": encoder.activation,
        "embedding_dimension": encoder.backbone.vocabulary_size,
    }
    (directory / POOLING_DIRECTORY / "config.json").write_text(json.dumps(pooling, indent=2) + "\n")
    sbert = {"transformer_task": _MASKED_LM_TASK, "do_lower_case": encoder.lowercase_input}
    sequence_length = getattr(encoder.preprocessor, "sequence_length", None)
    if sequence_length is not None:
        sbert["max_seq_length"] = int(sequence_length)
    (directory / SENTENCE_BERT_CONFIG_FILE).write_text(json.dumps(sbert, indent=2) + "\n")
    config = {
        "model_type": "SparseEncoder",
        "prompts": {"query": "", "document": "", **encoder.prompts},
        "default_prompt_name": encoder.default_prompt_name,
        "similarity_fn_name": encoder.similarity_function,
    }
    if encoder.max_active_dims is not None:
        config["max_active_dims"] = int(encoder.max_active_dims)
    (directory / SENTENCE_TRANSFORMERS_CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")


def export_to_sparse_encoder(encoder, path):
    """Writes a `kbert.models.BertSparseEncoder` as a sentence-transformers SparseEncoder
    directory.

    The directory holds the Hugging Face `BertForMaskedLM` files (`config.json`,
    `model.safetensors`, `vocab.txt`, `tokenizer_config.json`; see
    `kbert.checkpoints.export_to_huggingface`) and `modules.json` (`MLMTransformer` ->
    `SpladePooling`), `1_SpladePooling/config.json`, `sentence_bert_config.json`,
    `config_sentence_transformers.json` and the model card `README.md`.
    `sentence_transformers.SparseEncoder(path)` then encodes as the encoder does. The write
    is atomic: a kill leaves the old or the new complete directory.

    Args:
        encoder: a `kbert.models.BertSparseEncoder` with a vocabulary (a preprocessor or the
            preset it was loaded from).
        path: str or path. Output directory (created or replaced).

    Returns:
        The output directory as a `Path`.

    Example:
    >>> tokenizer = kbert.text.BertTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"])
    >>> backbone = kbert.models.BertBackbone(vocabulary_size=6, num_layers=1, num_heads=2,
    ...                                      hidden_dim=16, intermediate_dim=32)
    >>> backbone.save_to_preset("my_bert", tokenizer=tokenizer)
    >>> encoder = kbert.models.BertSparseEncoder.from_preset("my_bert", fresh_heads=True)
    >>> path = export_to_sparse_encoder(encoder, "my_splade")
    >>> sorted(file.name for file in path.iterdir())
    ['1_SpladePooling', 'README.md', 'config.json', 'config_sentence_transformers.json',
     'model.safetensors', 'modules.json', 'sentence_bert_config.json', 'tokenizer_config.json',
     'vocab.txt']
    """
    from kbert.checkpoints.atomic import atomic_directory, fix_file_modes
    from kbert.checkpoints.huggingface import export_to_huggingface

    for attribute in ("pooling_strategy", "activation", "masked_lm_head", "backbone"):
        if not hasattr(encoder, attribute):
            raise ValueError(
                "export_to_sparse_encoder needs a kbert BertSparseEncoder. "
                f"Received: {type(encoder).__name__}"
            )
    from kbert.checkpoints.quantized import check_not_quantized

    check_not_quantized(encoder, "export_to_sparse_encoder")
    path = Path(path)
    owned = (
        CARD_FILE,
        MODULES_FILE,
        SENTENCE_BERT_CONFIG_FILE,
        SENTENCE_TRANSFORMERS_CONFIG_FILE,
        POOLING_DIRECTORY,
        "config.json",
        "model.safetensors",
        "vocab.txt",
        "tokenizer_config.json",
        "tokenizer.json",
    )
    with atomic_directory(path, owned_files=owned) as staging:
        model_dir = staging / "_transformer"
        export_to_huggingface(encoder, model_dir)
        for item in model_dir.iterdir():
            shutil.move(str(item), str(staging / item.name))
        model_dir.rmdir()
        if not (staging / "vocab.txt").is_file():
            raise ValueError(
                "The sparse encoder has no vocabulary (no preprocessor and no preset "
                "vocabulary); a SparseEncoder directory needs one to decode its dimensions."
            )
        write_settings(encoder, staging)
        # The model card (kbert.checkpoints.model_card), replacing any a nested export wrote.
        (staging / CARD_FILE).write_text(
            model_card(encoder, os.fspath(path), formats=("sparse-encoder",)), encoding="utf-8"
        )
        fix_file_modes(staging)
    return path
