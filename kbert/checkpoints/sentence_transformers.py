"""sentence-transformers directories: read their embedding settings, write them back.

A sentence-transformers model directory is a Hugging Face BERT directory (the `Transformer`
module, at the root or in a subdirectory) plus:

- `modules.json`: the module pipeline, `Transformer` -> `Pooling` [-> `Normalize`];
- `<pooling path>/config.json`: the pooling mode(s) (`pooling_mode`, or the older
  `pooling_mode_mean_tokens`-style booleans) and `include_prompt`;
- `sentence_bert_config.json`: `max_seq_length` and `do_lower_case` of the Transformer;
- `config_sentence_transformers.json`: `prompts`, `default_prompt_name`,
  `similarity_fn_name` (and `truncate_dim`, when set).

`read_settings` turns these into `kbert.models.BertTextEmbedder` arguments; a module kbert
does not implement (a `Dense` projection, `weightedmean` pooling, ...) is a ValueError naming
it. `export_to_sentence_transformers` writes a directory that sentence-transformers loads
with the same embeddings. This module reads JSON only and never imports
sentence-transformers.
"""

import json
import os
from pathlib import Path

from kbert.checkpoints._config import read_json
from kbert.checkpoints.model_card import CARD_FILE, model_card

MODULES_FILE = "modules.json"
SENTENCE_BERT_CONFIG_FILE = "sentence_bert_config.json"
SENTENCE_TRANSFORMERS_CONFIG_FILE = "config_sentence_transformers.json"
POOLING_DIRECTORY = "1_Pooling"
NORMALIZE_DIRECTORY = "2_Normalize"

# sentence-transformers' pooling names -> kbert's.
_POOLING_NAMES = {
    "mean": "mean",
    "cls": "cls",
    "max": "max",
    "mean_sqrt_len_tokens": "mean_sqrt_len",
}
# Older configs: one boolean per mode, concatenated in this order.
_LEGACY_POOLING_KEYS = (
    ("pooling_mode_cls_token", "cls"),
    ("pooling_mode_max_tokens", "max"),
    ("pooling_mode_mean_tokens", "mean"),
    ("pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len_tokens"),
    ("pooling_mode_weightedmean_tokens", "weightedmean"),
    ("pooling_mode_lasttoken", "lasttoken"),
)
_SIMILARITY_NAMES = {"cosine": "cosine", "dot": "dot", "dot_product": "dot"}
_SUPPORTED_MODULES = ("Transformer", "Pooling", "Normalize")


def is_sentence_transformers_dir(path):
    """True for a directory with a sentence-transformers `modules.json`."""
    return (Path(path) / MODULES_FILE).is_file()


def _module_kind(entry, file):
    if not isinstance(entry, dict) or not isinstance(entry.get("type"), str):
        raise ValueError(f'{file} must list modules as objects with a "type". Received: {entry!r}')
    kind = entry["type"].rsplit(".", 1)[-1]
    if kind not in _SUPPORTED_MODULES:
        hint = ""
        if kind in ("MLMTransformer", "SpladePooling"):
            hint = " A SparseEncoder (SPLADE) directory loads as kbert.models.BertSparseEncoder."
        raise ValueError(
            f"{file} names the module {entry['type']!r}, which kbert does not implement. "
            f"kbert reads sentence-transformers models made of {list(_SUPPORTED_MODULES)}." + hint
        )
    return kind


def read_modules(path):
    """`[(kind, subdirectory path)]` of `modules.json`; kinds Transformer/Pooling/Normalize.

    Raises a ValueError naming any module kbert does not implement, and for a pipeline that
    is not Transformer -> Pooling [-> Normalize].
    """
    path = Path(path)
    file = path / MODULES_FILE
    entries = read_json(file)
    if not isinstance(entries, list) or not entries:
        raise ValueError(
            f"{file} must hold a non-empty JSON list of modules. Received: {entries!r}"
        )
    modules = [(_module_kind(e, file), path / (e.get("path") or "")) for e in entries]
    kinds = [kind for kind, _ in modules]
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        raise ValueError(
            f"{file} describes the pipeline {kinds}. kbert reads Transformer -> Pooling, "
            "optionally followed by Normalize."
        )
    return modules


def transformer_directory(path):
    """The directory holding the Transformer module's weights (`config.json`, ...)."""
    return read_modules(path)[0][1]


def read_pooling(pooling_dir):
    """kbert's pooling mode list from a Pooling module's `config.json`."""
    file = Path(pooling_dir) / "config.json"
    config = read_json(file)
    if not isinstance(config, dict):
        raise ValueError(f"{file} must hold a JSON object. Received: {config!r}")
    if "pooling_mode" in config:
        modes = config["pooling_mode"]
        modes = [modes] if isinstance(modes, str) else list(modes or [])
    else:
        modes = [mode for key, mode in _LEGACY_POOLING_KEYS if config.get(key)]
        modes = modes or ["mean"]
    unknown = [mode for mode in modes if mode not in _POOLING_NAMES]
    if unknown:
        raise ValueError(
            f"{file} asks for pooling {unknown}, which kbert does not implement. "
            f"kbert pools with {sorted(_POOLING_NAMES)}."
        )
    if config.get("include_prompt", True) is False:
        raise ValueError(
            f"{file} sets include_prompt=false (prompt tokens left out of the pooling), which "
            "kbert does not implement."
        )
    return [_POOLING_NAMES[mode] for mode in modes]


def _optional_json(file):
    return read_json(file) if Path(file).is_file() else {}


def read_transformer_settings(transformer_dir):
    """`max_seq_length` (when known) and `lowercase_input` of a Transformer module directory.

    `max_seq_length` comes from `sentence_bert_config.json`, else from the tokenizer's
    `model_max_length` when that is at most the model's `max_position_embeddings`, else from
    `max_position_embeddings`; `lowercase_input` is `sentence_bert_config.json`'s
    `do_lower_case`.
    """
    transformer_dir = Path(transformer_dir)
    settings = {}
    sbert_file = transformer_dir / SENTENCE_BERT_CONFIG_FILE
    sbert = _optional_json(sbert_file)
    if not isinstance(sbert, dict):
        raise ValueError(f"{sbert_file} must hold a JSON object. Received: {sbert!r}")
    max_length = sbert.get("max_seq_length")
    if max_length is None:
        tokenizer_config = _optional_json(transformer_dir / "tokenizer_config.json")
        model_config = _optional_json(transformer_dir / "config.json")
        model_config = model_config if isinstance(model_config, dict) else {}
        tokenizer_config = tokenizer_config if isinstance(tokenizer_config, dict) else {}
        limit = model_config.get("max_position_embeddings")
        candidate = tokenizer_config.get("model_max_length")
        if isinstance(candidate, int) and (limit is None or candidate <= limit):
            max_length = candidate
        elif isinstance(limit, int):
            max_length = limit
    if max_length is not None:
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 3:
            raise ValueError(
                f"{sbert_file}: max_seq_length must be an integer >= 3. Received: {max_length!r}"
            )
        settings["max_seq_length"] = max_length
    settings["lowercase_input"] = bool(sbert.get("do_lower_case", False))
    return settings


def read_settings(path):
    """`BertTextEmbedder` arguments stored in a sentence-transformers directory.

    Returns a dict with `pooling`, `normalize`, `prompts`, `default_prompt_name`,
    `similarity_function`, `lowercase_input`, `max_seq_length` and, when set, `truncate_dim`.
    `max_seq_length` comes from `sentence_bert_config.json`, else from the tokenizer's
    `model_max_length` when that is at most the model's `max_position_embeddings`.
    """
    path = Path(path)
    modules = read_modules(path)
    transformer_dir = modules[0][1]
    settings = {
        "pooling": read_pooling(modules[1][1]),
        "normalize": len(modules) == 3,
    }
    settings.update(read_transformer_settings(transformer_dir))
    st_file = path / SENTENCE_TRANSFORMERS_CONFIG_FILE
    st_config = _optional_json(st_file)
    if not isinstance(st_config, dict):
        raise ValueError(f"{st_file} must hold a JSON object. Received: {st_config!r}")
    prompts = st_config.get("prompts") or {}
    if not isinstance(prompts, dict):
        raise ValueError(f"{st_file}: prompts must be an object. Received: {prompts!r}")
    settings["prompts"] = prompts
    settings["default_prompt_name"] = st_config.get("default_prompt_name")
    similarity = st_config.get("similarity_fn_name") or "cosine"
    if similarity not in _SIMILARITY_NAMES:
        raise ValueError(
            f"{st_file}: similarity_fn_name {similarity!r} is not implemented by kbert. "
            f"Expected one of {sorted(_SIMILARITY_NAMES)}."
        )
    settings["similarity_function"] = _SIMILARITY_NAMES[similarity]
    if st_config.get("truncate_dim") is not None:
        settings["truncate_dim"] = st_config["truncate_dim"]
    return settings


def write_settings(embedder, directory, version=None):
    """Writes the sentence-transformers files of `embedder` into `directory` (no weights)."""
    directory = Path(directory)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": POOLING_DIRECTORY,
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    if embedder.normalize:
        modules.append(
            {
                "idx": 2,
                "name": "2",
                "path": NORMALIZE_DIRECTORY,
                "type": "sentence_transformers.models.Normalize",
            }
        )
        (directory / NORMALIZE_DIRECTORY).mkdir(exist_ok=True)
        (directory / NORMALIZE_DIRECTORY / "config.json").write_text("{}\n")
    (directory / MODULES_FILE).write_text(json.dumps(modules, indent=2) + "\n")
    names = {kbert: st for st, kbert in _POOLING_NAMES.items()}
    pooling = [names[mode] for mode in embedder.pooling]
    (directory / POOLING_DIRECTORY).mkdir(exist_ok=True)
    pooling_config = {
        "word_embedding_dimension": embedder.backbone.hidden_dim,
        "pooling_mode": pooling[0] if len(pooling) == 1 else pooling,
        "include_prompt": True,
    }
    (directory / POOLING_DIRECTORY / "config.json").write_text(
        json.dumps(pooling_config, indent=2) + "\n"
    )
    sequence_length = getattr(embedder.preprocessor, "sequence_length", None)
    sbert = {"do_lower_case": embedder.lowercase_input}
    if sequence_length is not None:
        sbert["max_seq_length"] = int(sequence_length)
    (directory / SENTENCE_BERT_CONFIG_FILE).write_text(json.dumps(sbert, indent=2) + "\n")
    st_config = {
        "prompts": dict(embedder.prompts),
        "default_prompt_name": embedder.default_prompt_name,
        "similarity_fn_name": embedder.similarity_function,
        "model_type": "SentenceTransformer",
    }
    if embedder.truncate_dim is not None:
        st_config["truncate_dim"] = int(embedder.truncate_dim)
    (directory / SENTENCE_TRANSFORMERS_CONFIG_FILE).write_text(
        json.dumps(st_config, indent=2) + "\n"
    )


# sentence-transformers' ONNX backend: its folder and files (float32; int8 as its own
# `export_dynamic_quantized_onnx_model(..., "avx512_vnni")` names it).
ONNX_DIRECTORY = "onnx"
ONNX_FILES = {"model.onnx": None, "model_qint8_avx512_vnni.onnx": "int8"}


def export_to_sentence_transformers(embedder, path, onnx=False):
    """Writes a `kbert.models.BertTextEmbedder` as a sentence-transformers directory.

    The directory holds the Hugging Face BERT files (`config.json`, `model.safetensors`,
    `vocab.txt`, `tokenizer_config.json`, see `kbert.checkpoints.export_to_huggingface`)
    and `modules.json`, `1_Pooling/config.json`, `2_Normalize/` (when the embedder
    normalises), `sentence_bert_config.json`, `config_sentence_transformers.json` and the
    model card `README.md` (`kbert.checkpoints.model_card`).
    `sentence_transformers.SentenceTransformer(path)` then encodes as the embedder does.
    The write is atomic: a kill leaves the old or the new complete directory.

    `onnx=True` adds the files of sentence-transformers' ONNX backend
    (`SentenceTransformer(path, backend="onnx")`, which needs `optimum-onnx`):
    `onnx/model.onnx` (float32) and `onnx/model_qint8_avx512_vnni.onnx` (int8 weights, the
    name sentence-transformers gives its own int8 export; load it with
    `model_kwargs={"file_name": "onnx/model_qint8_avx512_vnni.onnx"}`), both the backbone
    under Hugging Face's input and output names (see `kbert.export.export_onnx` with
    `interface="huggingface"`), traced on PyTorch (needs torch, `onnx`, `onnxscript` and
    `onnxruntime`).

    Args:
        embedder: a `kbert.models.BertTextEmbedder` (with a vocabulary: a preprocessor or
            the preset it was loaded from).
        path: str or path. Output directory (created or replaced).
        onnx: bool. Also write the ONNX files. Defaults to `False`.

    Returns:
        The output directory as a `Path`.

    Example:
    >>> tokenizer = kbert.text.BertTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"])
    >>> backbone = kbert.models.BertBackbone(vocabulary_size=6, num_layers=1, num_heads=2,
    ...                                      hidden_dim=16, intermediate_dim=32)
    >>> backbone.save_to_preset("my_bert", tokenizer=tokenizer)
    >>> embedder = kbert.models.BertTextEmbedder.from_preset("my_bert")
    >>> path = export_to_sentence_transformers(embedder, "my_st_model")
    >>> sorted(file.name for file in path.iterdir())  # no 2_Normalize: it does not normalise
    ['1_Pooling', 'README.md', 'config.json', 'config_sentence_transformers.json',
     'model.safetensors', 'modules.json', 'sentence_bert_config.json', 'tokenizer_config.json',
     'vocab.txt']
    >>> import sentence_transformers
    >>> vectors = sentence_transformers.SentenceTransformer(str(path)).encode(["a a"])
    >>> np.allclose(vectors, embedder.encode(["a a"]), atol=1e-5)
    True
    """
    import shutil

    from kbert.checkpoints.atomic import atomic_directory, fix_file_modes
    from kbert.checkpoints.huggingface import export_to_huggingface

    for attribute in ("pooling", "normalize", "prompts", "backbone"):
        if not hasattr(embedder, attribute):
            raise ValueError(
                "export_to_sentence_transformers needs a kbert BertTextEmbedder. "
                f"Received: {type(embedder).__name__}"
            )
    from kbert.checkpoints.quantized import check_not_quantized

    check_not_quantized(embedder, "export_to_sentence_transformers")
    path = Path(path)
    owned = (
        CARD_FILE,
        MODULES_FILE,
        SENTENCE_BERT_CONFIG_FILE,
        SENTENCE_TRANSFORMERS_CONFIG_FILE,
        POOLING_DIRECTORY,
        NORMALIZE_DIRECTORY,
        "config.json",
        "model.safetensors",
        "vocab.txt",
        "tokenizer_config.json",
        "tokenizer.json",
        ONNX_DIRECTORY,
    )
    if not isinstance(onnx, bool):
        raise ValueError(f"`onnx` must be True or False. Received: onnx={onnx!r}")
    tokenizer = getattr(embedder.preprocessor, "tokenizer", None)
    lowercase = getattr(tokenizer, "lowercase", None)
    vocabulary = None
    if embedder.preprocessor is None:
        vocabulary = getattr(embedder, "preset_vocabulary_path", None)
    with atomic_directory(path, owned_files=owned) as staging:
        model_dir = staging / "_transformer"
        export_to_huggingface(
            embedder.backbone,
            model_dir,
            vocabulary=vocabulary or _tokens(embedder),
            lowercase=lowercase,
            tokenizer=tokenizer,
        )
        for item in model_dir.iterdir():
            shutil.move(str(item), str(staging / item.name))
        model_dir.rmdir()
        if not (staging / "vocab.txt").is_file():
            raise ValueError(
                "The embedder has no vocabulary (no preprocessor and no preset vocabulary); "
                "a sentence-transformers directory needs one."
            )
        write_settings(embedder, staging)
        if onnx:
            # Through the model's own `export` (kbert.export): checkpoints import no exporter.
            for name, quantize in ONNX_FILES.items():
                embedder.export(
                    staging / ONNX_DIRECTORY / name,
                    format="onnx",
                    quantize=quantize,
                    interface="huggingface",
                    # The file named for VNNI CPUs: 8-bit weights, as sentence-transformers'
                    # own export for "avx512_vnni" writes them, whatever CPU exports it.
                    reduce_range=False,
                )
        # The model card (kbert.checkpoints.model_card), replacing any a nested export wrote.
        (staging / CARD_FILE).write_text(
            model_card(embedder, os.fspath(path), formats=("sentence-transformers",)),
            encoding="utf-8",
        )
        fix_file_modes(staging)
    return path


def _tokens(embedder):
    tokenizer = getattr(embedder.preprocessor, "tokenizer", None)
    return list(tokenizer.vocabulary) if tokenizer is not None else None
