"""Models by name: `hf://` handles and the built-in preset names, resolved to local directories.

Every `from_preset` in kbert (`BertBackbone`, the task models, `BertTokenizer`,
`BertPreprocessor`) passes its `source` through `resolve_preset_source`, which returns a local
directory (or file) that the checkpoint readers then load as any other:

- `hf://<repo_id>[@revision]` (a Hugging Face Hub model repository; `revision` is a branch, a
  tag or a commit hash, `main` by default) is downloaded with `huggingface_hub` (the optional
  extra `kbert[hf]`) into huggingface_hub's own cache (`$HF_HUB_CACHE`, else `$HF_HOME/hub`,
  else `~/.cache/huggingface/hub`), shared with `transformers` and `sentence-transformers`: a
  model one of them downloaded is not downloaded again. Only the files a format needs are
  fetched (see `select_files`): the config, the weights (safetensors whenever the repository
  has them, never `pytorch_model.bin` then), the vocabulary and tokenizer files and the
  sentence-transformers module files; a tokenizer or `load_weights=False` fetches no weights.
- A built-in preset name (`bert_base_en_uncased`, ...; `PRESET_HANDLES`) is the directory
  `$KBERT_PRESETS_DIR/<name>` when one is installed there, else its canonical repository's
  handle.
- Anything else is a local path, returned as it is.

The environment is read at call time, not at import: `HF_ENDPOINT` (another Hub endpoint or a
mirror), `HF_HUB_CACHE` / `HF_HOME`, `HF_HUB_OFFLINE=1` (load from the cache without any
request), `HF_TOKEN` (gated or private repositories, read by huggingface_hub) and
`HF_HUB_ETAG_TIMEOUT` (seconds to wait for the Hub's answer to a metadata request; 10 by
default). Without network, or when the Hub answers with a server error, a model already in
the cache loads from it.

Downloads are huggingface_hub's: each file is written to a temporary file and renamed into
the cache once complete, so an interrupted download leaves nothing a later load would read; a
dropped connection is resumed (HTTP range request) up to five times. A stalled transfer fails
after `HF_HUB_DOWNLOAD_TIMEOUT` seconds without data (10 by default, read by huggingface_hub
when it is imported) on each of those attempts.

`upload_preset` sends a directory to a Hub repository in one commit (`create_repo`,
`create_commit` of huggingface_hub; the token from huggingface_hub's usual places:
`token=`, `HF_TOKEN`, `huggingface-cli login`). A repository written by a model's
`push_to_hub` holds kbert's preset in its `kbert/` folder and, at its top, the files
`transformers` or `sentence-transformers` load; `from_preset` on such a repository reads
the `kbert/` folder.

This module imports nothing from kbert: `kbert.text` and `kbert.checkpoints` both use it.
"""

import glob
import os
import re
from pathlib import Path

__all__ = [
    "DEFAULT_TIMEOUT",
    "HANDLE_PREFIX",
    "KBERT_FOLDER",
    "PRESET_HANDLES",
    "download",
    "hub_cache_dir",
    "installed_presets_dir",
    "is_hub_handle",
    "parse_handle",
    "resolve_preset_source",
    "select_files",
    "upload_preset",
]

HANDLE_PREFIX = "hf://"
# The folder of a repository written by `push_to_hub` that holds kbert's own preset.
KBERT_FOLDER = "kbert"

# The canonical Hugging Face repository of each built-in preset name: Google's own uploads of
# the original BERT checkpoints (Devlin et al., 2018) and of the small English BERTs of Turc et
# al. (2019, "Well-Read Students Learn Better").
PRESET_HANDLES = {
    "bert_tiny_en_uncased": "hf://google/bert_uncased_L-2_H-128_A-2",
    "bert_mini_en_uncased": "hf://google/bert_uncased_L-4_H-256_A-4",
    "bert_small_en_uncased": "hf://google/bert_uncased_L-4_H-512_A-8",
    "bert_medium_en_uncased": "hf://google/bert_uncased_L-8_H-512_A-8",
    "bert_base_en_uncased": "hf://google-bert/bert-base-uncased",
    "bert_base_en_cased": "hf://google-bert/bert-base-cased",
    "bert_large_en_uncased": "hf://google-bert/bert-large-uncased",
    "bert_large_en_cased": "hf://google-bert/bert-large-cased",
}

DEFAULT_TIMEOUT = 10.0  # seconds; metadata requests (repository listing, per-file HEAD).

_EXTRA_HINT = "Install it with `pip install kbert[hf]` (or `pip install huggingface_hub`)."
_TRUE = {"1", "ON", "YES", "TRUE"}

# Files the readers use, by role. Config and tokenizer files are small; weights are selected
# separately (one format per directory, safetensors first).
_CONFIG_FILES = ("config.json", "bert_config.json")
_SMALL_FILES = frozenset(
    {
        "config.json",  # Hugging Face, kbert and keras-hub presets
        "bert_config.json",  # original Google BERT
        "vocab.txt",
        "tokenizer_config.json",
        "tokenizer.json",
        "special_tokens_map.json",
        "preprocessor.json",  # kbert and keras-hub presets
        "metadata.json",  # keras-hub presets
        "task.json",  # keras-hub presets
        "assets/tokenizer/vocabulary.txt",  # keras-hub presets
        "modules.json",  # sentence-transformers
        "sentence_bert_config.json",
        "config_sentence_transformers.json",
    }
)
_KERAS_WEIGHTS = ("model.weights.h5", "task.weights.h5")  # kbert and keras-hub presets
_GOOGLE_WEIGHTS = re.compile(r"bert_model\.ckpt\.(index|data-\d+-of-\d+)")
# sentence-transformers modules live in numbered folders: 1_Pooling/config.json, 2_Dense/...
_MODULE_FILE = re.compile(r"\d+_[^/]+/[^/]+")


def is_hub_handle(source):
    """Whether `source` is an `hf://` handle."""
    return isinstance(source, str) and source.startswith(HANDLE_PREFIX)


def parse_handle(handle):
    """`(repo_id, revision)` of `hf://<repo_id>[@revision]`; `revision` is None for `main`.

    Example:
    >>> parse_handle("hf://sentence-transformers/all-MiniLM-L6-v2@main")
    ('sentence-transformers/all-MiniLM-L6-v2', 'main')
    """
    body = handle[len(HANDLE_PREFIX) :]
    repo_id, _, revision = body.partition("@")
    parts = repo_id.split("/")
    valid = len(parts) in (1, 2) and all(re.fullmatch(r"[A-Za-z0-9][\w.\-]*", p) for p in parts)
    if not valid or (revision == "" and "@" in body):
        raise ValueError(
            "A Hugging Face handle must look like `hf://<owner>/<name>` or "
            f"`hf://<owner>/<name>@<revision>`. Received: {handle!r}"
        )
    return repo_id, revision or None


def installed_presets_dir():
    """Where named presets are looked up first: `$KBERT_PRESETS_DIR` or `~/.cache/kbert/presets`."""
    default = Path.home() / ".cache" / "kbert" / "presets"
    return Path(os.environ.get("KBERT_PRESETS_DIR", default))


def hub_cache_dir():
    """huggingface_hub's cache, from the environment at call time (as huggingface_hub reads it)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.path.expandvars(os.environ["HF_HUB_CACHE"])).expanduser()
    if os.environ.get("HUGGINGFACE_HUB_CACHE"):
        return Path(os.path.expandvars(os.environ["HUGGINGFACE_HUB_CACHE"])).expanduser()
    if os.environ.get("HF_HOME"):
        home = Path(os.path.expandvars(os.environ["HF_HOME"])).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        home = Path(xdg).expanduser() / "huggingface"
    return home / "hub"


def _offline():
    flags = (os.environ.get("HF_HUB_OFFLINE"), os.environ.get("TRANSFORMERS_OFFLINE"))
    return any((flag or "").upper() in _TRUE for flag in flags)


def _timeout():
    value = os.environ.get("HF_HUB_ETAG_TIMEOUT")
    try:
        return float(value) if value else DEFAULT_TIMEOUT
    except ValueError:
        raise ValueError(
            f"HF_HUB_ETAG_TIMEOUT must be a number of seconds. Received: {value!r}"
        ) from None


def resolve_preset_source(source, load_weights=True):
    """The local directory (or file) a `from_preset(source)` reads.

    Args:
        source: str or path. An `hf://<repo_id>[@revision]` handle, a built-in preset name
            (`PRESET_HANDLES`) or a local path.
        load_weights: bool. Whether the weights are needed: `False` downloads only the
            config, vocabulary and tokenizer files. Defaults to `True`.

    Returns:
        A `pathlib.Path`: a local path as given, the installed preset directory
        `$KBERT_PRESETS_DIR/<name>`, or the downloaded snapshot in huggingface_hub's cache.

    Raises:
        ValueError: `source` is not a str or path, an empty string, an unknown preset name
            or a malformed handle.
        ImportError: a download is needed and huggingface_hub is not installed.
        FileNotFoundError: the repository, revision or a needed file does not exist, or
            (offline) the cache does not hold the model.
        PermissionError: the repository is gated or private and the token (`HF_TOKEN`)
            gives no access.
        ConnectionError: the Hub could not be reached and the cache does not hold the model.

    Example:
    >>> os.makedirs("my_bert")
    >>> resolve_preset_source("my_bert")  # a local path is used as it is
    PosixPath('my_bert')
    """
    if not isinstance(source, (str, os.PathLike)):
        raise ValueError(
            "`source` must be a preset name, an hf:// handle or a checkpoint directory (str or "
            f"path). Received: {type(source).__name__} {source!r}"
        )
    if not isinstance(load_weights, bool):
        raise ValueError(
            f"`load_weights` must be True or False. Received: load_weights={load_weights!r}"
        )
    name = os.fspath(source)
    if not name:
        raise ValueError(
            "`source` is empty. Expected a preset name, an hf:// handle or a checkpoint directory."
        )
    if is_hub_handle(name):
        return download(name, load_weights=load_weights)
    path = Path(name)
    if path.exists() or "/" in name or "\\" in name:
        return path
    if name not in PRESET_HANDLES:
        raise ValueError(
            f"Unknown preset {name!r}. Known presets: {sorted(PRESET_HANDLES)}; or pass an "
            "hf://<owner>/<name> handle or a checkpoint directory."
        )
    installed = installed_presets_dir() / name
    if installed.is_dir():
        return installed
    try:
        return download(PRESET_HANDLES[name], load_weights=load_weights)
    except (FileNotFoundError, PermissionError, ConnectionError) as error:
        raise type(error)(
            f"Preset {name!r}: {error} Alternatively install a kbert preset at {installed} "
            "(`python tools/convert_checkpoint.py --source <checkpoint> --output "
            f"{installed}`), or pass load_weights=False for the architecture with freshly "
            "initialised weights."
        ) from error.__cause__


def select_files(files, load_weights=True):
    """The files of a repository listing that kbert's readers need, sorted.

    Config, vocabulary, tokenizer and sentence-transformers module files, and with
    `load_weights` one set of weights per folder: safetensors (`model.safetensors`, or the
    index and its shards) when there are any, else `pytorch_model.bin` (or its index and
    shards); kbert / keras-hub `*.weights.h5`; Google's `bert_model.ckpt.*`. Other formats
    (TensorFlow `.h5`, Flax, ONNX, OpenVINO, Rust) and documentation are left out.
    """
    files = set(files)
    selected = set()
    folders = {""} | {f.split("/", 1)[0] + "/" for f in files if _MODULE_FILE.fullmatch(f)}
    for folder in folders:
        names = {f[len(folder) :] for f in files if f.startswith(folder)}
        names = {n for n in names if "/" not in n}
        small = {n for n in names if n in _SMALL_FILES or (folder and n.endswith(".json"))}
        selected |= {folder + n for n in small}
        if load_weights:
            selected |= {folder + n for n in _weights(names)}
    if "assets/tokenizer/vocabulary.txt" in files:
        selected.add("assets/tokenizer/vocabulary.txt")
    return sorted(selected)


def _weights(names):
    safetensors = {
        n
        for n in names
        if n in ("model.safetensors", "model.safetensors.index.json")
        or re.fullmatch(r"model-\d+-of-\d+\.safetensors", n)
    }
    torch = {
        n
        for n in names
        if n in ("pytorch_model.bin", "pytorch_model.bin.index.json")
        or re.fullmatch(r"pytorch_model-\d+-of-\d+\.bin", n)
    }
    keras = {n for n in names if n in _KERAS_WEIGHTS}
    google = {n for n in names if _GOOGLE_WEIGHTS.fullmatch(n)}
    return (safetensors or torch) | keras | google


def _import_huggingface_hub(handle):
    try:
        import huggingface_hub
    except ImportError as error:
        raise ImportError(
            f"Loading {handle} downloads it from the Hugging Face Hub, which needs the "
            f"`huggingface_hub` package. {_EXTRA_HINT} Or pass a local checkpoint directory."
        ) from error
    return huggingface_hub


def download(handle, load_weights=True):
    """Downloads (or finds in the cache) the files of `handle` a kbert reader needs.

    Args:
        handle: str. `hf://<repo_id>[@revision]`.
        load_weights: bool. Also fetch the weights. Defaults to `True`.

    Returns:
        The `pathlib.Path` of the snapshot folder in huggingface_hub's cache.

    See `resolve_preset_source` for the errors and the environment variables.
    """
    hub = _import_huggingface_hub(handle)
    from huggingface_hub import errors

    repo_id, revision = parse_handle(handle)
    endpoint = (os.environ.get("HF_ENDPOINT") or "").rstrip("/") or None
    timeout = _timeout()
    where = f"the Hub at {endpoint or 'https://huggingface.co'}"
    files = None
    reach_error = None
    if not _offline():
        try:
            api = hub.HfApi(endpoint=endpoint)
            info = api.model_info(repo_id, revision=revision, timeout=timeout)
            files = [sibling.rfilename for sibling in info.siblings or ()]
        except (errors.RepositoryNotFoundError, errors.RevisionNotFoundError) as error:
            raise _hub_error(handle, error, where) from error
        except errors.HfHubHTTPError as error:
            if error.response is not None and error.response.status_code < 500:
                raise _hub_error(handle, error, where) from error
            reach_error = error  # A server error: the cache may hold the model.
        except ValueError as error:  # huggingface_hub's repository-id validation
            raise ValueError(f"{handle} is not a valid Hugging Face repository: {error}") from None
        except Exception as error:  # The network: connection refused, timeout, offline mode.
            reach_error = error
    if files is not None:
        return _download_listed(hub, errors, handle, files, load_weights, endpoint, where)
    return _load_cached(hub, errors, handle, load_weights, reach_error, where)


def _selection(files, load_weights):
    """`(selected, subfolder)`: the files to read, relative to `subfolder`, which is
    `KBERT_FOLDER` in a repository written by `push_to_hub` (kbert's own preset is read, not
    the other libraries' files beside it) and "" otherwise."""
    prefix = f"{KBERT_FOLDER}/"
    if f"{prefix}config.json" in files:
        inner = [f[len(prefix) :] for f in files if f.startswith(prefix)]
        return select_files(inner, load_weights), KBERT_FOLDER
    return select_files(files, load_weights), ""


def _patterns(selected):
    return [glob.escape(name) for name in selected]


def _download_listed(hub, errors, handle, files, load_weights, endpoint, where):
    repo_id, revision = parse_handle(handle)
    selected, subfolder = _selection(files, load_weights)
    if load_weights and not any(name in selected for name in _CONFIG_FILES):
        raise FileNotFoundError(
            f"{handle} holds no BERT checkpoint kbert can read: expected config.json (Hugging "
            "Face, kbert, keras-hub, sentence-transformers) or bert_config.json (Google). "
            f"Found: {sorted(files)[:20]}"
        )
    try:
        folder = hub.snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=hub_cache_dir(),
            endpoint=endpoint,
            allow_patterns=_patterns([f"{subfolder}/{f}" if subfolder else f for f in selected]),
            etag_timeout=_timeout(),
        )
    except (
        errors.RepositoryNotFoundError,
        errors.RevisionNotFoundError,
        errors.RemoteEntryNotFoundError,
    ) as error:
        raise _hub_error(handle, error, where) from error
    except errors.HfHubHTTPError as error:
        if error.response is not None and error.response.status_code in (401, 403):
            raise _hub_error(handle, error, where) from error
        raise ConnectionError(
            f"Downloading {handle} from {where} failed: {_first_line(error)}. Nothing "
            "incomplete was kept; load it again to resume."
        ) from error
    except errors.IncompleteSnapshotError as error:
        raise ConnectionError(
            f"Downloading {handle} from {where} was interrupted and the cache holds only part "
            f"of it ({_first_line(error)}). Load it again with network access to finish."
        ) from error
    except Exception as error:  # The network failed during the transfer.
        raise ConnectionError(
            f"Downloading {handle} from {where} failed: {type(error).__name__}: "
            f"{_first_line(error)}. Files that were complete stay in {hub_cache_dir()}; load it "
            "again to download the rest."
        ) from error
    return Path(folder) / subfolder if subfolder else Path(folder)


def _load_cached(hub, errors, handle, load_weights, reach_error, where):
    repo_id, revision = parse_handle(handle)
    cache_dir = hub_cache_dir()
    if reach_error is None:
        why = "HF_HUB_OFFLINE is set"
        todo = (
            "Unset HF_HUB_OFFLINE and load it once with network access, or pass a local directory."
        )
    else:
        why = (
            f"{where} could not be reached within {_timeout():g} s ({type(reach_error).__name__}: "
            f"{_first_line(reach_error)})"
        )
        todo = (
            "Check the network (and HF_ENDPOINT), or pass a local directory; with the model in "
            "the cache it loads without network."
        )
    try:
        tree = hub.get_cached_repo_tree(repo_id, revision=revision, cache_dir=cache_dir)
    except errors.CachedRepoTreeNotFoundError:
        raise (ConnectionError if reach_error is not None else FileNotFoundError)(
            f"Cannot load {handle}: {why}, and huggingface_hub's cache ({cache_dir}) does not "
            f"hold it. {todo}"
        ) from reach_error
    selected, subfolder = _selection([entry.path for entry in tree], load_weights)
    try:
        folder = hub.snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=cache_dir,
            local_files_only=True,
            allow_patterns=_patterns([f"{subfolder}/{f}" if subfolder else f for f in selected]),
        )
    except errors.LocalEntryNotFoundError as error:
        raise (ConnectionError if reach_error is not None else FileNotFoundError)(
            f"Cannot load {handle}: {why}, and huggingface_hub's cache ({cache_dir}) holds only "
            f"part of it ({_first_line(error)}). {todo}"
        ) from reach_error
    return Path(folder) / subfolder if subfolder else Path(folder)


def _first_line(error):
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _hub_error(handle, error, where):
    """One clear error for a Hub refusal: what is missing or refused, and what to do."""
    from huggingface_hub import errors

    repo_id, revision = parse_handle(handle)
    if isinstance(error, errors.GatedRepoError) or (
        isinstance(error, errors.HfHubHTTPError)
        and error.response is not None
        and error.response.status_code in (401, 403)
        and not isinstance(error, errors.RepositoryNotFoundError)
    ):
        return PermissionError(
            f"{handle} is gated or private on {where}: access was refused "
            f"({_first_line(error)}). Accept its conditions on the repository's page and "
            "authenticate: set HF_TOKEN to an access token (or run `hf auth login`)."
        )
    if isinstance(error, errors.RepositoryNotFoundError):
        return FileNotFoundError(
            f"{handle}: no repository {repo_id!r} on {where} (or it is private and "
            "HF_TOKEN gives no access). Check the name (hf://<owner>/<name>)."
        )
    if isinstance(error, errors.RevisionNotFoundError):
        return FileNotFoundError(
            f"{handle}: repository {repo_id!r} has no revision {revision!r} on {where}. "
            "Use a branch, tag or commit hash that exists, or drop `@revision` for main."
        )
    if isinstance(error, errors.RemoteEntryNotFoundError):
        return FileNotFoundError(
            f"{handle}: a file the repository lists is missing on {where} "
            f"({_first_line(error)}). The repository may be changing; try again later or pin "
            "`@<commit>`."
        )
    return FileNotFoundError(f"{handle}: {where} refused the request ({_first_line(error)}).")


def upload_preset(handle, directory, private=None, revision=None, commit_message=None, token=None):
    """Uploads a preset directory to a Hugging Face Hub model repository, in one commit.

    Creates the repository when it does not exist (`private` then sets its visibility) and
    the branch `revision` when it is not `main`, then commits every file of `directory`
    (subfolders included, hidden files left out) at once: the repository shows the old or
    the new version, never part of the upload. Files of the repository that `directory` does
    not hold stay as they were. Weights go through the Hub's large-file storage, as
    huggingface_hub sends them.

    Args:
        handle: str. `hf://<owner>/<name>[@revision]`.
        directory: str or path. A preset directory (`save_to_preset`) or the directory
            `push_to_hub` writes: it must hold `config.json` or `kbert/config.json`.
        private: optional bool. Visibility of a repository this call creates (an existing
            repository keeps its own). Defaults to the Hub's default (public).
        revision: optional str. The branch to commit to, created from `main` if needed.
            Defaults to the handle's `@revision`, else `main`.
        commit_message: optional str. Defaults to "Upload <directory name> with kbert".
        token: optional str. A Hub token with write access. Defaults to huggingface_hub's
            (`HF_TOKEN`, then the token saved by `hf auth login`).

    Returns:
        The new commit's hash (str).

    Raises:
        ValueError: a malformed handle, two different revisions, or a directory that holds
            no preset.
        ImportError: huggingface_hub is not installed.
        PermissionError: the token may not write to the repository.
        ConnectionError: the upload failed; the repository is as it was.

    Example:
    >>> upload_preset("my-models/bert", "my_bert")  # a handle starts with hf://
    Traceback (most recent call last):
    ...
    ValueError: `handle` must be an hf://<owner>/<name> handle. Received: 'my-models/bert'
    """
    if not isinstance(handle, str) or not is_hub_handle(handle):
        raise ValueError(f"`handle` must be an hf://<owner>/<name> handle. Received: {handle!r}")
    repo_id, handle_revision = parse_handle(handle)
    if revision is not None and handle_revision is not None and revision != handle_revision:
        raise ValueError(
            f"Two revisions: {handle!r} names {handle_revision!r} and revision={revision!r}. "
            "Give one of them."
        )
    revision = revision or handle_revision or "main"
    folder = Path(directory) if isinstance(directory, (str, os.PathLike)) else None
    if folder is None or not (
        (folder / "config.json").is_file() or (folder / KBERT_FOLDER / "config.json").is_file()
    ):
        raise ValueError(
            "`directory` must be a preset directory holding config.json or "
            f"{KBERT_FOLDER}/config.json. Received: {directory!r}"
        )
    hub = _import_huggingface_hub(handle)
    from huggingface_hub import errors

    files = sorted(
        path
        for path in folder.rglob("*")
        if path.is_file()
        and not any(part.startswith(".") for part in path.relative_to(folder).parts)
    )
    endpoint = (os.environ.get("HF_ENDPOINT") or "").rstrip("/") or None
    where = f"the Hub at {endpoint or 'https://huggingface.co'}"
    api = hub.HfApi(endpoint=endpoint, token=token)
    operations = [
        hub.CommitOperationAdd(
            path_in_repo=path.relative_to(folder).as_posix(), path_or_fileobj=str(path)
        )
        for path in files
    ]
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        if revision != "main":
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        info = api.create_commit(
            repo_id,
            operations,
            commit_message=commit_message or f"Upload {folder.name} with kbert",
            revision=revision,
        )
    except ValueError as error:  # huggingface_hub's repository-id validation
        raise ValueError(f"{handle} is not a valid Hugging Face repository: {error}") from None
    except errors.HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else None
        if status in (401, 403) and "lfs" not in str(error.response.url):
            raise PermissionError(
                f"Uploading to {handle} on {where} was refused ({status}): "
                f"{_first_line(error)}. Give a token with write access (token=, HF_TOKEN or "
                "`hf auth login`)."
            ) from error
        raise ConnectionError(
            f"Uploading {folder} to {handle} on {where} failed: {_first_line(error)}. The "
            "repository is as it was (an upload is one commit); upload again."
        ) from error
    except Exception as error:  # The network failed.
        raise ConnectionError(
            f"Uploading {folder} to {handle} on {where} failed: {type(error).__name__}: "
            f"{_first_line(error)}. The repository is as it was (an upload is one commit); "
            "upload again."
        ) from error
    return info.oid
