"""Tokenizer files: the one place kbert reads and writes `vocab.txt` and the tokenizer settings.

Used by `kbert.text.BertTokenizer` (`from_preset`, `save_to_preset`), the kbert preset writer
(`save_preset`) and the exporters (`export_to_huggingface`, and through it the
sentence-transformers exporter).

- `vocab.txt` (Hugging Face, Google, kbert) or `assets/tokenizer/vocabulary.txt` (keras-hub):
  one token per line, the line number is the id. Only `\\n` separates tokens (a trailing `\\r`
  is dropped), so tokens such as U+2028 stay whole.
- `tokenizer_config.json` (Hugging Face keys): `do_lower_case`, `strip_accents`, `unk_token`;
  or, without it, `tokenizer.json` (a keras-hub tokenizer config, or a Hugging Face fast
  tokenizer's `BertNormalizer`).

Every file is written atomically (`kbert.checkpoints.atomic`).
"""

import json
import os
from pathlib import Path

from kbert.checkpoints.atomic import atomic_write_text

VOCABULARY_FILE = "vocab.txt"
KERAS_HUB_VOCABULARY_FILE = "assets/tokenizer/vocabulary.txt"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
TOKENIZER_JSON_FILE = "tokenizer.json"
# BERT's special tokens, as Hugging Face's BertTokenizer names them in tokenizer_config.json.
_SPECIAL_TOKENS = {
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "mask_token": "[MASK]",
}


def read_vocabulary(path):
    """The tokens of a vocabulary file, one per line (only `\\n` separates tokens; a trailing
    `\\r` is stripped).

    Splitting on `\\n` alone keeps tokens such as U+2028 or a lone `\\r` inside a token intact,
    which `str.splitlines` or universal newlines would break apart.

    Raises:
        ValueError: `path` is not a file.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(
            f"`vocabulary` must be a list of tokens or the path of an existing vocabulary "
            f"file. Received: vocabulary={path!r}, which is not a file."
        )
    with open(path, encoding="utf-8", newline="") as file:
        lines = file.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # The newline that ends the last line.
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def write_vocabulary(tokens, path):
    """Writes `tokens` as a vocabulary file (one per line, `\\n` endings), atomically."""
    return atomic_write_text(path, "".join(f"{token}\n" for token in tokens))


def find_vocabulary(directory):
    """The vocabulary file of a checkpoint directory (`vocab.txt`, else keras-hub's
    `assets/tokenizer/vocabulary.txt`), or None."""
    for name in (VOCABULARY_FILE, KERAS_HUB_VOCABULARY_FILE):
        path = Path(directory) / name
        if path.is_file():
            return path
    return None


def vocabulary_is_uncased(vocabulary):
    """Whether a WordPiece vocabulary belongs to an uncased (lower-casing) model.

    Used when a checkpoint says nothing about casing (a Google BERT directory, a Hugging Face
    directory without `tokenizer_config.json`). An uncased vocabulary was built from
    lower-cased text, so no piece other than the bracketed special tokens changes under
    lower-casing; a cased one holds `The`, `John`, ... Characters that are upper-case but have
    no lower-case form (`ℝ` in bert-base-uncased) do not count.

    Args:
        vocabulary: list of tokens or the path of a `vocab.txt`.

    Returns:
        bool.
    """
    if not isinstance(vocabulary, (list, tuple)):
        vocabulary = read_vocabulary(vocabulary)
    return not any(
        token != token.lower()
        for token in vocabulary
        if not (token.startswith("[") and token.endswith("]"))
    )


def read_tokenizer_files(preset):
    """The vocabulary file and tokenizer settings of a checkpoint directory or vocabulary file.

    Args:
        preset: str or path. A directory holding `vocab.txt` or keras-hub's
            `assets/tokenizer/vocabulary.txt`, or a vocabulary file (its directory's settings
            files are read when it is one of those two).

    Returns:
        `(vocabulary_path, settings)`: `settings` as `read_tokenizer_settings`, with
        `lowercase` always set (from the vocabulary itself, `vocabulary_is_uncased`, when no
        file says).

    Raises:
        ValueError: no such file or directory, or a directory without a vocabulary.
    """
    path = Path(preset)
    if path.is_file():
        vocabulary, directory = path, None
        if path.name == VOCABULARY_FILE:
            directory = path.parent
        elif path.parts[-3:] == tuple(KERAS_HUB_VOCABULARY_FILE.split("/")):
            directory = path.parents[2]
    elif path.is_dir():
        vocabulary, directory = find_vocabulary(path), path
        if vocabulary is None:
            raise ValueError(
                f"No vocabulary found in preset directory {os.fspath(preset)!r}. Expected "
                f"one of: {VOCABULARY_FILE}, {KERAS_HUB_VOCABULARY_FILE}."
            )
    else:
        raise ValueError(
            f"`preset` must be a directory or a vocab.txt file. Received: "
            f"preset={os.fspath(preset)!r}, which does not exist."
        )
    settings = read_tokenizer_settings(directory) if directory is not None else {}
    if "lowercase" not in settings:
        settings["lowercase"] = vocabulary_is_uncased(vocabulary)
    return vocabulary, settings


def check_vocabulary_size(path, vocabulary_size, source=None):
    """Raises a ValueError when the vocabulary file's size differs from the model's
    `vocabulary_size`."""
    if path is None:
        return
    count = len(read_vocabulary(path))
    if count != vocabulary_size:
        raise ValueError(
            f"The vocabulary {path} has {count} tokens but "
            f"{source or 'the model config'} says vocabulary_size={vocabulary_size}. "
            "A vocabulary and its embedding table must have the same size."
        )


def _read_json_object(path):
    with open(path, encoding="utf-8") as file:
        data = json.load(file)
    return data if isinstance(data, dict) else {}


def read_tokenizer_settings(directory):
    """The tokenizer arguments a checkpoint directory's files set: a dict with any of
    `lowercase`, `strip_accents` and `unknown_token` (empty when no file says anything).

    Read from `tokenizer_config.json` (`do_lower_case`, `strip_accents`, `unk_token`), else
    from `tokenizer.json` (keras-hub's `{"config": {"lowercase": ...}}` or a Hugging Face fast
    tokenizer's `{"normalizer": {"type": "BertNormalizer", ...}}`).
    """
    directory = Path(directory)
    settings = {}
    if (directory / TOKENIZER_CONFIG_FILE).is_file():
        data = _read_json_object(directory / TOKENIZER_CONFIG_FILE)
        if "do_lower_case" in data:
            settings["lowercase"] = bool(data["do_lower_case"])
        if data.get("strip_accents") is not None:
            settings["strip_accents"] = bool(data["strip_accents"])
        if isinstance(data.get("unk_token"), str):
            settings["unknown_token"] = data["unk_token"]
    elif (directory / TOKENIZER_JSON_FILE).is_file():
        data = _read_json_object(directory / TOKENIZER_JSON_FILE)
        inner = data.get("config") or {}
        normalizer = data.get("normalizer") or {}
        if "lowercase" in inner:
            settings["lowercase"] = bool(inner["lowercase"])
        elif normalizer.get("type") == "BertNormalizer":
            settings["lowercase"] = bool(normalizer.get("lowercase", True))
            if normalizer.get("strip_accents") is not None:
                settings["strip_accents"] = bool(normalizer["strip_accents"])
    return settings


def tokenizer_file_settings(tokenizer):
    """The settings of `tokenizer` that `tokenizer_config.json` records: `lowercase`,
    `strip_accents` and `unknown_token`, each when the tokenizer has it (bools, a str)."""
    settings = {}
    for name, kind in (("lowercase", bool), ("strip_accents", bool), ("unknown_token", str)):
        value = getattr(tokenizer, name, None)
        if isinstance(value, kind):
            settings[name] = value
    return settings


def write_tokenizer_files(
    directory,
    tokens,
    lowercase=None,
    strip_accents=None,
    unknown_token=None,
    model_max_length=None,
):
    """Writes `vocab.txt` and `tokenizer_config.json` (Hugging Face keys) into `directory`.

    Both `kbert.text.BertTokenizer.from_preset` and Hugging Face's `AutoTokenizer` read them.
    Settings left `None` are not written (the reader's default applies).

    Args:
        directory: str or path. Created if missing.
        tokens: list of str. The vocabulary, in id order.
        lowercase: bool or None. Written as `do_lower_case`.
        strip_accents: bool or None.
        unknown_token: str or None. Written as `unk_token`.
        model_max_length: int or None. The longest input the model takes.
    """
    directory = Path(directory)
    config = {"tokenizer_class": "BertTokenizer"}
    if lowercase is not None:
        config["do_lower_case"] = bool(lowercase)
    if strip_accents is not None:
        config["strip_accents"] = bool(strip_accents)
    if unknown_token is not None:
        config["unk_token"] = str(unknown_token)
    config.update(_SPECIAL_TOKENS)
    if model_max_length is not None:
        config["model_max_length"] = int(model_max_length)
    write_vocabulary(tokens, directory / VOCABULARY_FILE)
    atomic_write_text(directory / TOKENIZER_CONFIG_FILE, json.dumps(config, indent=2) + "\n")


def model_tokenizer(model):
    """The tokenizer attached to a model (through its preprocessor), if any."""
    preprocessor = getattr(model, "preprocessor", None)
    tokenizer = getattr(preprocessor, "tokenizer", None) or getattr(model, "tokenizer", None)
    if tokenizer is not None and getattr(tokenizer, "vocabulary", None) is not None:
        return tokenizer
    return None


def vocabulary_source(model):
    """The vocabulary (token list) or vocabulary file attached to a model, if any."""
    tokenizer = model_tokenizer(model)
    if tokenizer is not None:
        return list(tokenizer.vocabulary)
    return getattr(model, "preset_vocabulary_path", None)


def resolve_vocabulary(model, vocabulary, vocabulary_size):
    """The tokens to export for `model`: `vocabulary` (list or path), else the model's own,
    else None."""
    if vocabulary is None:
        vocabulary = vocabulary_source(model)
    if vocabulary is None:
        return None
    if isinstance(vocabulary, (list, tuple)):
        tokens = [str(t) for t in vocabulary]
    else:
        tokens = read_vocabulary(vocabulary)
    if len(tokens) != vocabulary_size:
        raise ValueError(
            f"The vocabulary has {len(tokens)} tokens but the model's vocabulary_size is "
            f"{vocabulary_size}."
        )
    return tokens
