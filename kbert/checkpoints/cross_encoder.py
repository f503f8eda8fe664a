"""sentence-transformers cross-encoder directories: read their reranker settings, write them.

A sentence-transformers `CrossEncoder` directory is a Hugging Face
`BertForSequenceClassification` directory (`config.json` with `num_labels` and `id2label`,
the weights, the tokenizer files), optionally with:

- `config_sentence_transformers.json`: `"model_type": "CrossEncoder"` and `activation_fn`,
  the dotted path of the torch module applied to the logits by `predict` (version 5 and
  later; version 4 kept it in `config.json` under `sentence_transformers.activation_fn`,
  earlier ones under `sbert_ce_default_activation_function`);
- `modules.json` with one `Transformer` module (`sentence_bert_config.json`:
  `"transformer_task": "sequence-classification"`, optionally `max_seq_length`).

A plain Hugging Face `BertForSequenceClassification` directory is a cross-encoder too:
sentence-transformers loads it with sigmoid scores for one label and the logits otherwise.
`read_settings` turns these files into `kbert.models.BertCrossEncoder` arguments (and
rejects checkpoints whose head is not a sequence classifier; a directory with `tokenizer.json`
and no `vocab.txt`, as sentence-transformers saves under `transformers` 5, gets its vocabulary
from `kbert.checkpoints.vocabulary.find_vocabulary`); `export_cross_encoder`
writes a directory sentence-transformers' `CrossEncoder` loads with the same scores. This
module reads JSON only and never imports sentence-transformers or torch.
"""

import json
import os
import warnings
from pathlib import Path

from kbert.checkpoints._config import read_json
from kbert.checkpoints.model_card import CARD_FILE, model_card

MODULES_FILE = "modules.json"
SENTENCE_BERT_CONFIG_FILE = "sentence_bert_config.json"
SENTENCE_TRANSFORMERS_CONFIG_FILE = "config_sentence_transformers.json"
CLASSIFICATION_ARCHITECTURE = "BertForSequenceClassification"

# torch activation modules sentence-transformers stores -> kbert's names, and back.
ACTIVATIONS = {
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.Tanh": "tanh",
}
_ACTIVATION_PATHS = {name: path for path, name in ACTIVATIONS.items()}


def _optional_json(file):
    if not Path(file).is_file():
        return {}
    value = read_json(file)
    if not isinstance(value, dict):
        raise ValueError(f"{file} must hold a JSON object. Received: {value!r}")
    return value


def transformer_directory(path, allow_embedder=False):
    """The directory with the classifier's `config.json` and weights: the root, or the one
    `Transformer` module `modules.json` names. A pipeline of other modules is a ValueError,
    but with `allow_embedder` (a new head on a sentence-embedding model's encoder) one that
    starts with a `Transformer`."""
    path = Path(path)
    file = path / MODULES_FILE
    if not file.is_file():
        return path
    entries = read_json(file)
    kinds = [
        str(e.get("type", "")).rsplit(".", 1)[-1] if isinstance(e, dict) else repr(e)
        for e in (entries if isinstance(entries, list) else [entries])
    ]
    if kinds != ["Transformer"] and not (allow_embedder and kinds[:1] == ["Transformer"]):
        raise ValueError(
            f"{file} describes the modules {kinds}. A kbert BertCrossEncoder reads a "
            "cross-encoder made of one Transformer module (a sequence classifier); a "
            "sentence-embedding model (Transformer -> Pooling) loads as "
            "kbert.models.BertTextEmbedder (or, with `fresh_heads=True`, as a cross-encoder "
            "with a new head on its encoder)."
        )
    return path / (entries[0].get("path") or "")


def _activation_path(path, transformer_config):
    """The torch activation path a directory stores (newest place first), or `None`."""
    st_config = _optional_json(Path(path) / SENTENCE_TRANSFORMERS_CONFIG_FILE)
    if st_config.get("activation_fn") is not None:
        return st_config["activation_fn"], Path(path) / SENTENCE_TRANSFORMERS_CONFIG_FILE
    source = Path(path) / "config.json"
    nested = transformer_config.get("sentence_transformers")
    if isinstance(nested, dict) and nested.get("activation_fn") is not None:
        return nested["activation_fn"], source
    legacy = transformer_config.get("sbert_ce_default_activation_function")
    if legacy is not None:
        return legacy, source
    return None, None


def check_classifier_config(config, source):
    """Raises a ValueError unless a Hugging Face `config.json` dict is a sequence
    classifier's (`architectures` naming `BertForSequenceClassification`)."""
    architectures = config.get("architectures") or []
    if CLASSIFICATION_ARCHITECTURE not in architectures:
        raise ValueError(
            f"{source} holds a {architectures or 'bare BERT'} checkpoint, not a cross-encoder: "
            f"a reranker is a {CLASSIFICATION_ARCHITECTURE} (its `classifier` head scores "
            "each (query, document) pair). Pass `fresh_heads=True` to start a new scoring "
            "head on this checkpoint's encoder."
        )


def read_settings(path, check_head=True):
    """`BertCrossEncoder` arguments stored in a cross-encoder or Hugging Face directory.

    Returns a dict with `activation` (`None`: the default for the label count) and
    `max_seq_length` (as sentence-transformers computes it:
    `sentence_bert_config.json`'s `max_seq_length`, else the tokenizer's `model_max_length`
    capped by `max_position_embeddings`). The label count and names come with the weights
    (`kbert.checkpoints.huggingface.MODEL_ARGUMENTS`).

    Args:
        path: str or path. The directory (the root of a sentence-transformers model).
        check_head: bool. Raise a ValueError when `config.json` is not a sequence
            classifier's. Defaults to `True`.
    """
    path = Path(path)
    model_dir = transformer_directory(path, allow_embedder=not check_head)
    config_file = model_dir / "config.json"
    config = _optional_json(config_file)
    if check_head:
        check_classifier_config(config, config_file)
    settings = {"activation": None}
    activation_path, source = _activation_path(path, config)
    if activation_path is not None:
        if activation_path in ACTIVATIONS:
            settings["activation"] = ACTIVATIONS[activation_path]
        elif str(activation_path).startswith("torch."):
            raise ValueError(
                f"{source} names the activation {activation_path!r}, which kbert does not "
                f"implement. Expected one of {sorted(ACTIVATIONS)}."
            )
        else:  # sentence-transformers itself falls back to the default without trust_remote_code.
            warnings.warn(
                f"{source} names the custom activation {activation_path!r}; kbert never runs "
                "code from a checkpoint and uses the default activation (sigmoid for one "
                "label, none otherwise), as sentence-transformers does without "
                "trust_remote_code.",
                stacklevel=3,
            )
    sbert = _optional_json(model_dir / SENTENCE_BERT_CONFIG_FILE)
    max_length = sbert.get("max_seq_length")
    if max_length is None:
        tokenizer_config = _optional_json(model_dir / "tokenizer_config.json")
        limit = config.get("max_position_embeddings", 512)
        candidate = tokenizer_config.get("model_max_length")
        if isinstance(candidate, int) and not isinstance(candidate, bool):
            max_length = min(candidate, limit) if isinstance(limit, int) else candidate
        else:
            max_length = limit
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 3:
        raise ValueError(
            f"{model_dir}: the maximum sequence length must be an integer >= 3. "
            f"Received: {max_length!r}"
        )
    settings["max_seq_length"] = max_length
    return settings


def export_cross_encoder(model, path):
    """Writes a `kbert.models.BertCrossEncoder` as a sentence-transformers cross-encoder.

    The directory holds the Hugging Face `BertForSequenceClassification` files
    (`config.json` with `num_labels` and `id2label`, `model.safetensors`, `vocab.txt`,
    `tokenizer_config.json` with `model_max_length` = the preprocessor's
    `sequence_length`), `modules.json`, `sentence_bert_config.json` and
    `config_sentence_transformers.json` (the activation) and the model card `README.md`.
    `sentence_transformers.CrossEncoder(path)` then predicts the scores the model predicts.
    The write is atomic.

    Args:
        model: a `kbert.models.BertCrossEncoder` with a vocabulary (a preprocessor or the
            preset it was loaded from).
        path: str or path. Output directory (created or replaced).

    Returns:
        The output directory as a `Path`.
    """
    import shutil

    from kbert.checkpoints.atomic import atomic_directory, fix_file_modes
    from kbert.checkpoints.huggingface import export_to_huggingface

    if not hasattr(model, "activation") or not hasattr(model, "num_labels"):
        raise ValueError(
            f"export_cross_encoder needs a kbert BertCrossEncoder. Received: {type(model).__name__}"
        )
    from kbert.checkpoints.quantized import check_not_quantized

    check_not_quantized(model, "export_to_sentence_transformers (a cross-encoder)")
    path = Path(path)
    owned = (
        CARD_FILE,
        MODULES_FILE,
        SENTENCE_BERT_CONFIG_FILE,
        SENTENCE_TRANSFORMERS_CONFIG_FILE,
        "config.json",
        "model.safetensors",
        "vocab.txt",
        "tokenizer_config.json",
        "tokenizer.json",
    )
    tokenizer = getattr(model.preprocessor, "tokenizer", None)
    vocabulary = list(tokenizer.vocabulary) if tokenizer is not None else None
    if vocabulary is None:
        vocabulary = getattr(model, "preset_vocabulary_path", None)
    if vocabulary is None:
        raise ValueError(
            "The cross-encoder has no vocabulary (no preprocessor and no preset vocabulary); "
            "a sentence-transformers directory needs one."
        )
    max_length = getattr(model.preprocessor, "sequence_length", None)
    with atomic_directory(path, owned_files=owned) as staging:
        model_dir = staging / "_transformer"
        export_to_huggingface(
            model, model_dir, vocabulary=vocabulary, lowercase=getattr(tokenizer, "lowercase", None)
        )
        for item in model_dir.iterdir():
            shutil.move(str(item), str(staging / item.name))
        model_dir.rmdir()
        activation = _ACTIVATION_PATHS[model.activation]
        config = json.loads((staging / "config.json").read_text(encoding="utf-8"))
        config["sentence_transformers"] = {"activation_fn": activation}  # read by version 4
        (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n", "utf-8")
        if max_length is not None:
            tokenizer_file = staging / "tokenizer_config.json"
            tokenizer_config = json.loads(tokenizer_file.read_text(encoding="utf-8"))
            tokenizer_config["model_max_length"] = int(max_length)
            tokenizer_file.write_text(json.dumps(tokenizer_config, indent=2) + "\n", "utf-8")
        modules = [
            {
                "idx": 0,
                "name": "0",
                "path": "",
                "type": "sentence_transformers.base.modules.transformer.Transformer",
            }
        ]
        (staging / MODULES_FILE).write_text(json.dumps(modules, indent=2) + "\n", "utf-8")
        sbert = {
            "transformer_task": "sequence-classification",
            "modality_config": {
                "text": {"method": "forward", "method_output_name": "logits"},
            },
            "module_output_name": "scores",
        }
        (staging / SENTENCE_BERT_CONFIG_FILE).write_text(json.dumps(sbert, indent=2) + "\n")
        st_config = {
            "model_type": "CrossEncoder",
            "activation_fn": activation,
            "prompts": {},
            "default_prompt_name": None,
        }
        (staging / SENTENCE_TRANSFORMERS_CONFIG_FILE).write_text(
            json.dumps(st_config, indent=2) + "\n"
        )
        # The model card (kbert.checkpoints.model_card), replacing any a nested export wrote.
        (staging / CARD_FILE).write_text(
            model_card(model, os.fspath(path), formats=("cross-encoder",)), encoding="utf-8"
        )
        fix_file_modes(staging)
    return path
