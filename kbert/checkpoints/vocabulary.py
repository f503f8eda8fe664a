"""Tokenizer files: the one place kbert reads and writes `vocab.txt` and the tokenizer settings.

Used by `kbert.text.BertTokenizer` (`from_preset`, `save_to_preset`), every checkpoint reader
(`find_vocabulary`), the kbert preset writer (`save_preset`) and the exporters
(`export_to_huggingface`, and through it the sentence-transformers exporters).

- `vocab.txt` (Hugging Face, Google, kbert) or `assets/tokenizer/vocabulary.txt` (keras-hub):
  one token per line, the line number is the id. Only `\\n` separates tokens (a trailing `\\r`
  is dropped), so tokens such as U+2028 stay whole.
- Else a Hugging Face `tokenizer.json` (what `transformers` 5 and sentence-transformers save,
  without `vocab.txt`): its WordPiece `model` section's `vocab` (token -> id, the ids
  0..n-1), `unk_token`, `max_input_chars_per_word` and `continuing_subword_prefix` (`##`, the
  only one kbert's WordPiece knows). A directory with both files reads `vocab.txt`: where the
  two disagree, `vocab.txt` wins. `find_vocabulary` is the one place a directory's vocabulary
  is looked up.
- `tokenizer_config.json` (Hugging Face keys): `do_lower_case`, `strip_accents`, `unk_token`;
  or, without it, `tokenizer.json` (a keras-hub tokenizer config, or a Hugging Face fast
  tokenizer's `BertNormalizer`). With the vocabulary read from `tokenizer.json`, its
  `BertNormalizer` and `model` section set what `tokenizer_config.json` leaves unset.
- Special tokens written in text: a Hugging Face directory (`tokenizer_config.json` or a Hugging
  Face `tokenizer.json`) honours them unless `split_special_tokens` is true, with the special
  tokens and `AddedToken` settings of `tokenizer.json`'s `added_tokens`, else of
  `tokenizer_config.json`'s `added_tokens_decoder`, else the named tokens of
  `tokenizer_config.json` / `special_tokens_map.json`. A Google directory (`vocab.txt` alone), a
  keras-hub preset (its `special_tokens_in_strings`) and a kbert preset written before kbert
  recorded `split_special_tokens` keep them plain text.

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
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
# BERT's special tokens, as Hugging Face's BertTokenizer names them in tokenizer_config.json.
_SPECIAL_TOKENS = {
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "mask_token": "[MASK]",
}
_SPECIAL_TOKEN_NAMES = ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_ADDED_TOKEN_FLAGS = ("lstrip", "rstrip", "normalized", "single_word")


class NotWordPieceError(ValueError):
    """A `tokenizer.json` whose model is not WordPiece (BPE, Unigram, ...): no BERT
    vocabulary. A model loaded from its directory gets no tokenizer (a warning says so)."""


def read_vocabulary(path):
    """The tokens of a vocabulary file, in id order.

    A text file (`vocab.txt`) holds one token per line (only `\\n` separates tokens; a trailing
    `\\r` is stripped): splitting on `\\n` alone keeps tokens such as U+2028 or a lone `\\r`
    inside a token intact, which `str.splitlines` or universal newlines would break apart. A
    `.json` file is a Hugging Face `tokenizer.json`, read with `read_tokenizer_json`.

    Raises:
        ValueError: `path` is not a file, or not a WordPiece `tokenizer.json`.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(
            f"`vocabulary` must be a list of tokens or the path of an existing vocabulary "
            f"file. Received: vocabulary={path!r}, which is not a file."
        )
    if path.endswith(".json"):
        return read_tokenizer_json(path)[0]
    with open(path, encoding="utf-8", newline="") as file:
        lines = file.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # The newline that ends the last line.
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def write_vocabulary(tokens, path):
    """Writes `tokens` as a vocabulary file (one per line, `\\n` endings), atomically."""
    return atomic_write_text(path, "".join(f"{token}\n" for token in tokens))


def read_tokenizer_json(path):
    """The WordPiece vocabulary and settings of a Hugging Face `tokenizer.json`.

    Reads the `model` section (`type` "WordPiece", `vocab` token -> id, `unk_token`,
    `continuing_subword_prefix`, `max_input_chars_per_word`) and, when the normalizer is a
    `BertNormalizer`, its `lowercase` and `strip_accents`; a `BertNormalizer` that turns off
    what kbert's tokenizer always does (`clean_text`, `handle_chinese_chars`) is refused.

    Args:
        path: str or path of the `tokenizer.json`.

    Returns:
        `(tokens, settings)`: the tokens in id order and a dict of `BertTokenizer` arguments
        (`unknown_token`, `max_chars_per_word`, `lowercase`, `strip_accents`, each when the
        file has it).

    Raises:
        NotWordPieceError: its model is not WordPiece (BPE, Unigram, ...).
        ValueError: the file is not JSON, has no `model` section, its continuing-subword
            prefix is not `##`, or its ids are not 0..n-1 (the error names the first missing
            id).
    """
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as file:
            data = json.load(file)
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not a JSON tokenizer file: {error}") from None
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, dict):
        raise ValueError(
            f"{path} has no `model` section. Expected a Hugging Face tokenizers file "
            '(tokenizer.json) with a WordPiece model: {"model": {"type": "WordPiece", '
            '"vocab": {token: id}, ...}}.'
        )
    kind = model.get("type")
    if kind != "WordPiece":
        raise NotWordPieceError(
            f"BERT needs a WordPiece vocabulary, but {path} holds a {kind!r} model "
            "(model.type). Expected model.type='WordPiece', as BertTokenizerFast writes it; "
            "BPE and Unigram tokenizers belong to other architectures."
        )
    prefix = model.get("continuing_subword_prefix", "##")
    if prefix != "##":
        raise ValueError(
            f"{path}: kbert's WordPiece marks word-continuing pieces with '##', as BERT does. "
            f"Received: model.continuing_subword_prefix={prefix!r}"
        )
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        raise ValueError(
            f"{path}: model.vocab must be a non-empty object mapping each token to its id. "
            f"Received: {type(vocab).__name__}{'' if vocab else ' (empty)'}"
        )
    tokens = {}
    for token, index in vocab.items():
        if isinstance(index, bool) or not isinstance(index, int):
            raise ValueError(
                f"{path}: model.vocab must map tokens to integer ids. Received: "
                f"{token!r}: {index!r}"
            )
        if index in tokens:
            raise ValueError(
                f"{path}: model.vocab gives the id {index} to both {tokens[index]!r} and "
                f"{token!r}. Each id must name one token."
            )
        tokens[index] = token
    if len(tokens) - 1 != max(tokens) or min(tokens) != 0:
        gap = next(i for i in range(len(tokens)) if i not in tokens)
        raise ValueError(
            f"{path}: the ids of model.vocab must be 0..{len(tokens) - 1}, one per token (the "
            f"rows of the embedding table), without gaps. Id {gap} is missing (the ids run "
            f"from {min(tokens)} to {max(tokens)})."
        )
    settings = {}
    if model.get("unk_token") is not None:
        if not isinstance(model["unk_token"], str) or model["unk_token"] not in vocab:
            raise ValueError(
                f"{path}: model.unk_token must be a token of model.vocab. Received: "
                f"unk_token={model['unk_token']!r}"
            )
        settings["unknown_token"] = model["unk_token"]
    longest = model.get("max_input_chars_per_word")
    if longest is not None:
        if isinstance(longest, bool) or not isinstance(longest, int) or longest < 1:
            raise ValueError(
                f"{path}: model.max_input_chars_per_word must be a positive integer. "
                f"Received: {longest!r}"
            )
        settings["max_chars_per_word"] = longest
    normalizer = data.get("normalizer")
    if isinstance(normalizer, dict) and normalizer.get("type") == "BertNormalizer":
        settings["lowercase"] = bool(normalizer.get("lowercase", True))
        if normalizer.get("strip_accents") is not None:
            settings["strip_accents"] = bool(normalizer["strip_accents"])
        for name, does in (
            ("clean_text", "drops control characters and turns whitespace into spaces"),
            ("handle_chinese_chars", "makes each CJK ideograph a word"),
        ):
            if normalizer.get(name, True) is False:
                raise ValueError(
                    f"{path}: the normalizer sets {name}=false, which kbert's tokenizer does "
                    f"not implement: it always {does}, as the original BERT does."
                )
    return [tokens[i] for i in range(len(tokens))], settings


def find_vocabulary(directory):
    """The vocabulary file of a checkpoint directory, or None.

    The one place a directory's vocabulary is looked up: `vocab.txt`, else keras-hub's
    `assets/tokenizer/vocabulary.txt`, else a Hugging Face `tokenizer.json` (not keras-hub's
    file of that name), which `transformers` 5 saves without `vocab.txt`. When a directory
    holds both `vocab.txt` and `tokenizer.json`, `vocab.txt` is the vocabulary, even where the
    two disagree. A `tokenizer.json` is returned unchecked: reading it (`read_vocabulary`)
    says what is wrong with it.
    """
    for name in (VOCABULARY_FILE, KERAS_HUB_VOCABULARY_FILE):
        path = Path(directory) / name
        if path.is_file():
            return path
    path = Path(directory) / TOKENIZER_JSON_FILE
    if path.is_file() and not _is_keras_hub_tokenizer_json(path):
        return path
    return None


def _is_keras_hub_tokenizer_json(path):
    try:
        data = _read_json_object(path)
    except (ValueError, UnicodeDecodeError):
        return False  # Returned as a vocabulary, whose reader names the broken file.
    return isinstance(data.get("config"), dict)


def vocabulary_directory(path):
    """The checkpoint directory whose settings files belong to the vocabulary file `path`
    (`vocab.txt` or `tokenizer.json`: its folder; keras-hub's vocabulary: the preset), or
    None for a vocabulary file of another name."""
    path = Path(path)
    if path.name in (VOCABULARY_FILE, TOKENIZER_JSON_FILE):
        return path.parent
    if path.parts[-3:] == tuple(KERAS_HUB_VOCABULARY_FILE.split("/")):
        return path.parents[2]
    return None


def vocabulary_is_uncased(vocabulary):
    """Whether a WordPiece vocabulary belongs to an uncased (lower-casing) model.

    Used when a checkpoint says nothing about casing (a Google BERT directory, a Hugging Face
    directory without `tokenizer_config.json`). An uncased vocabulary was built from
    lower-cased text, so no piece other than the bracketed special tokens changes under
    lower-casing; a cased one holds `The`, `John`, ... Characters that are upper-case but have
    no lower-case form (`ℝ` in bert-base-uncased) do not count.

    Args:
        vocabulary: list of tokens or the path of a vocabulary file (`read_vocabulary`).

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
        preset: str or path. A directory with a vocabulary (`find_vocabulary`: `vocab.txt`,
            keras-hub's `assets/tokenizer/vocabulary.txt` or a Hugging Face `tokenizer.json`),
            or a vocabulary file (its directory's settings files are read when it is one of
            those three).

    Returns:
        `(vocabulary_path, settings)`: `settings` as `read_tokenizer_settings`, with
        `lowercase` always set (from the vocabulary itself, `vocabulary_is_uncased`, when no
        file says); a vocabulary read from `tokenizer.json` adds its settings
        (`read_tokenizer_json`: `unknown_token`, `max_chars_per_word`, casing) where
        `tokenizer_config.json` does not set them.

    Raises:
        ValueError: no such file or directory, a directory without a vocabulary, or a
            `tokenizer.json` kbert cannot read (see `read_tokenizer_json`).
    """
    path = Path(preset)
    if path.is_file():
        vocabulary, directory = path, vocabulary_directory(path)
    elif path.is_dir():
        vocabulary, directory = find_vocabulary(path), path
        if vocabulary is None:
            raise ValueError(
                f"No vocabulary found in preset directory {os.fspath(preset)!r}. Expected "
                f"one of: {VOCABULARY_FILE}, {KERAS_HUB_VOCABULARY_FILE}, "
                f"{TOKENIZER_JSON_FILE} (a Hugging Face WordPiece tokenizer)."
            )
    else:
        raise ValueError(
            f"`preset` must be a directory or a vocabulary file. Received: "
            f"preset={os.fspath(preset)!r}, which does not exist."
        )
    settings = read_tokenizer_settings(directory) if directory is not None else {}
    if vocabulary.suffix == ".json":
        for name, value in read_tokenizer_json(vocabulary)[1].items():
            settings.setdefault(name, value)
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
    `lowercase`, `strip_accents`, `unknown_token`, `special_tokens_in_strings` and
    `special_tokens` (empty when no file says anything).

    Read from `tokenizer_config.json` (`do_lower_case`, `strip_accents`, `unk_token`), else
    from `tokenizer.json` (keras-hub's `{"config": {"lowercase": ...}}` or a Hugging Face fast
    tokenizer's `{"normalizer": {"type": "BertNormalizer", ...}}`). Special tokens: see the
    module's docstring.
    """
    directory = Path(directory)
    settings = {}
    config = tokenizer_json = None
    if (directory / TOKENIZER_CONFIG_FILE).is_file():
        config = data = _read_json_object(directory / TOKENIZER_CONFIG_FILE)
        if "do_lower_case" in data:
            settings["lowercase"] = bool(data["do_lower_case"])
        if data.get("strip_accents") is not None:
            settings["strip_accents"] = bool(data["strip_accents"])
        if isinstance(data.get("unk_token"), str):
            settings["unknown_token"] = data["unk_token"]
    if (directory / TOKENIZER_JSON_FILE).is_file():
        tokenizer_json = _read_json_object(directory / TOKENIZER_JSON_FILE)
    if config is None and tokenizer_json is not None:
        data = tokenizer_json
        inner = data.get("config") or {}
        normalizer = data.get("normalizer") or {}
        if "lowercase" in inner:
            settings["lowercase"] = bool(inner["lowercase"])
        elif normalizer.get("type") == "BertNormalizer":
            settings["lowercase"] = bool(normalizer.get("lowercase", True))
            if normalizer.get("strip_accents") is not None:
                settings["strip_accents"] = bool(normalizer["strip_accents"])
        if "special_tokens_in_strings" in inner:  # keras-hub's own setting.
            settings["special_tokens_in_strings"] = bool(inner["special_tokens_in_strings"])
            return settings
    if tokenizer_json is not None and not isinstance(tokenizer_json.get("config"), dict):
        tokenizer_json_is_hf = True
    else:
        tokenizer_json, tokenizer_json_is_hf = None, False
    if config is None and not tokenizer_json_is_hf:
        return settings  # A Google or keras-hub directory: special tokens are plain text.
    split = (config or {}).get("split_special_tokens")
    if split is None:
        # Hugging Face's default is to honour them; kbert presets written before kbert
        # recorded `split_special_tokens` kept them plain text.
        split = _is_kbert_preset(directory)
    settings["special_tokens_in_strings"] = not bool(split)
    if not split:
        unknown = settings.get("unknown_token", "[UNK]")
        special = _declared_special_tokens(directory, config or {}, tokenizer_json)
        default = {(t, False, False, False, False) for t in ("[CLS]", "[SEP]", "[MASK]", "[PAD]")}
        default.add((unknown, False, False, False, False))
        if (
            special is not None
            and {(t["content"], *(t[f] for f in _ADDED_TOKEN_FLAGS)) for t in special} != default
        ):
            settings["special_tokens"] = special
    return settings


def _is_kbert_preset(directory):
    path = Path(directory) / "config.json"
    if not path.is_file():
        return False
    try:
        return _read_json_object(path).get("format") == "kbert"
    except (ValueError, UnicodeDecodeError):
        return False


def _added_token(value):
    """A special token of a Hugging Face file (a str, or an `AddedToken` dict) as a dict with
    `content` and every flag, or None."""
    if isinstance(value, str):
        return {"content": value, **{f: False for f in _ADDED_TOKEN_FLAGS}}
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return {"content": value["content"], **{f: bool(value.get(f)) for f in _ADDED_TOKEN_FLAGS}}
    return None


def _declared_special_tokens(directory, config, tokenizer_json):
    """The special tokens a Hugging Face directory declares, as `_added_token` dicts in a list
    (None when no file lists any)."""
    if tokenizer_json is not None and isinstance(tokenizer_json.get("added_tokens"), list):
        return [
            _added_token(entry)
            for entry in tokenizer_json["added_tokens"]
            if isinstance(entry, dict) and entry.get("special") and _added_token(entry)
        ]
    decoder = config.get("added_tokens_decoder")
    if isinstance(decoder, dict) and decoder:
        return [
            _added_token(entry)
            for entry in decoder.values()
            if isinstance(entry, dict) and entry.get("special") and _added_token(entry)
        ]
    sources = [config]
    if (Path(directory) / SPECIAL_TOKENS_MAP_FILE).is_file():
        sources.insert(0, _read_json_object(Path(directory) / SPECIAL_TOKENS_MAP_FILE))
    found = {}
    for source in sources:  # tokenizer_config.json's entries win.
        for name in _SPECIAL_TOKEN_NAMES:
            token = _added_token(source.get(name))
            if token is not None:
                found[name] = token
        extra = source.get("additional_special_tokens") or source.get("extra_special_tokens")
        if isinstance(extra, list):
            for value in extra:
                token = _added_token(value)
                if token is not None:
                    found[f"additional_{token['content']}"] = token
    if not found:
        return None
    for name, content in (("unk_token", "[UNK]"), *_SPECIAL_TOKENS.items()):
        found.setdefault(name, _added_token(content))  # BertTokenizer's defaults.
    unique = {}
    for token in found.values():
        unique.setdefault(token["content"], token)
    return list(unique.values())


def tokenizer_file_settings(tokenizer):
    """The settings of `tokenizer` (a tokenizer, or a dict of its arguments) that
    `tokenizer_config.json` records: `lowercase`, `strip_accents`, `unknown_token`,
    `special_tokens_in_strings` and `special_tokens`, each when the tokenizer has it."""
    settings = {}
    for name, kind in (
        ("lowercase", bool),
        ("strip_accents", bool),
        ("unknown_token", str),
        ("special_tokens_in_strings", bool),
        ("special_tokens", list),
    ):
        if isinstance(tokenizer, dict):
            value = tokenizer.get(name)
        else:
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
    special_tokens_in_strings=None,
    special_tokens=None,
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
        special_tokens_in_strings: bool or None. Written as `split_special_tokens` (its
            negation).
        special_tokens: list of dicts or None (`BertTokenizer`'s). Written as
            `added_tokens_decoder` (with their `AddedToken` settings) and, beyond BERT's
            five, `additional_special_tokens`.
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
    if special_tokens_in_strings is not None:
        config["split_special_tokens"] = not special_tokens_in_strings
    if special_tokens is not None:
        ids = {token: i for i, token in enumerate(tokens)}
        named = {config.get("unk_token", "[UNK]"), *_SPECIAL_TOKENS.values()}
        entries = [_added_token(t) for t in special_tokens]
        config["added_tokens_decoder"] = {
            str(ids[t["content"]]): {**t, "special": True} for t in entries
        }
        extra = [t["content"] for t in entries if t["content"] not in named]
        if extra:
            config["additional_special_tokens"] = extra
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
