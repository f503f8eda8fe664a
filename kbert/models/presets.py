"""BERT presets as data, and the `from_preset` / `save_to_preset` entry points shared by all models.

`from_preset` resolves a preset name here and hands checkpoint directories to
`kbert.checkpoints.load_checkpoint`, passing the model class and `BertBackbone` in: models
depend on checkpoints, never the reverse.
"""

import inspect
import json
import os
from pathlib import Path

from kbert import checkpoints, hub, processes
from kbert.checkpoints.atomic import recover

_UNCASED_VOCABULARY_SIZE = 30522
_CASED_VOCABULARY_SIZE = 28996


def _config(vocabulary_size, num_layers, hidden_dim, num_heads):
    return {
        "vocabulary_size": vocabulary_size,
        "num_layers": num_layers,
        "num_heads": num_heads,
        "hidden_dim": hidden_dim,
        "intermediate_dim": 4 * hidden_dim,
        "max_sequence_length": 512,
        "num_segments": 2,
        "dropout": 0.1,
        "attention_dropout": 0.1,
        "activation": "gelu",
        "layer_norm_epsilon": 1e-12,
    }


def _preset(description, params, lowercase, config):
    return {
        "description": description,
        "params": params,
        "lowercase": lowercase,
        "config": config,
    }


# Parameter counts include the pooler and equal HF `BertModel` with the same configuration.
BACKBONE_PRESETS = {
    "bert_tiny_en_uncased": _preset(
        "2-layer BERT, hidden 128, 2 heads (Turc et al., 2019), lower-cased English.",
        4_385_920,
        True,
        _config(_UNCASED_VOCABULARY_SIZE, 2, 128, 2),
    ),
    "bert_mini_en_uncased": _preset(
        "4-layer BERT, hidden 256, 4 heads (Turc et al., 2019), lower-cased English.",
        11_170_560,
        True,
        _config(_UNCASED_VOCABULARY_SIZE, 4, 256, 4),
    ),
    "bert_small_en_uncased": _preset(
        "4-layer BERT, hidden 512, 8 heads (Turc et al., 2019), lower-cased English.",
        28_763_648,
        True,
        _config(_UNCASED_VOCABULARY_SIZE, 4, 512, 8),
    ),
    "bert_medium_en_uncased": _preset(
        "8-layer BERT, hidden 512, 8 heads (Turc et al., 2019), lower-cased English.",
        41_373_184,
        True,
        _config(_UNCASED_VOCABULARY_SIZE, 8, 512, 8),
    ),
    "bert_base_en_uncased": _preset(
        "12-layer BERT-Base, hidden 768, 12 heads (Devlin et al., 2018), lower-cased English.",
        109_482_240,
        True,
        _config(_UNCASED_VOCABULARY_SIZE, 12, 768, 12),
    ),
    "bert_base_en_cased": _preset(
        "12-layer BERT-Base, hidden 768, 12 heads (Devlin et al., 2018), cased English.",
        108_310_272,
        False,
        _config(_CASED_VOCABULARY_SIZE, 12, 768, 12),
    ),
    "bert_large_en_uncased": _preset(
        "24-layer BERT-Large, hidden 1024, 16 heads (Devlin et al., 2018), lower-cased English.",
        335_141_888,
        True,
        _config(_UNCASED_VOCABULARY_SIZE, 24, 1024, 16),
    ),
    "bert_large_en_cased": _preset(
        "24-layer BERT-Large, hidden 1024, 16 heads (Devlin et al., 2018), cased English.",
        333_579_264,
        False,
        _config(_CASED_VOCABULARY_SIZE, 24, 1024, 16),
    ),
}


class PresetMixin:
    """`from_preset`, `save_to_preset` and `presets` for kbert models.

    A `source` is a preset name (`bert_base_en_uncased`...), a Hugging Face Hub handle
    (`hf://<owner>/<name>[@revision]`, downloaded into huggingface_hub's cache, see `kbert.hub`)
    or a directory: a kbert preset, a Hugging Face BERT directory, an original Google BERT
    checkpoint directory or a keras-hub BERT preset. See `kbert.checkpoints.load_model`.

    A class using it names its backbone class in `backbone_cls` (as keras-hub's tasks do):
    `BertBackbone` itself, or the backbone a task wraps.
    """

    backbone_cls = None

    @classmethod
    def presets(cls):
        """The built-in preset names mapped to their description, parameter count and the
        `hf://` handle of the Hugging Face repository their weights come from."""
        return {
            name: {
                "description": p["description"],
                "params": p["params"],
                "handle": hub.PRESET_HANDLES[name],
            }
            for name, p in BACKBONE_PRESETS.items()
        }

    @classmethod
    def from_preset(cls, source, load_weights=True, **kwargs):
        """Builds the model from a preset name or a checkpoint directory.

        Args:
            source: str or path. A built-in preset name (the installed preset directory
                `$KBERT_PRESETS_DIR/<name>` if there is one, else its Hugging Face
                repository, see `presets()`), an `hf://<owner>/<name>[@revision]` handle
                (downloaded once into huggingface_hub's cache; `HF_HUB_OFFLINE=1` loads it
                from there without a request, see `kbert.hub`) or a directory.
            load_weights: bool. Load the weights; `False` builds the architecture with
                freshly initialised weights (a preset name then downloads nothing).
                Defaults to `True`.
            **kwargs: the model's constructor arguments (e.g. `num_classes`, a task's head
                `dropout`), `BertBackbone` arguments that override the stored configuration
                (e.g. `dtype`, `flash_attention`; a backbone's `dropout`), and `fresh_heads`
                (see `kbert.checkpoints.formats`). A name that is both a model and a backbone
                argument goes to the model. Any other name is a ValueError.

        Example:
        >>> fresh = kbert.models.BertBackbone.from_preset("bert_tiny_en_uncased",
        ...                                             load_weights=False)  # no download
        >>> fresh.num_layers, fresh.hidden_dim
        (2, 128)
        >>> fresh.save_to_preset("my_bert")
        >>> kbert.models.BertBackbone.from_preset("my_bert", dropout=0.0).num_layers
        2
        """
        backbone_cls = cls.backbone_cls
        fresh_heads = kwargs.pop("fresh_heads", None)
        backbone_arguments, model_arguments = cls._split_preset_arguments(kwargs)
        path = _preset_directory(source, load_weights)
        if path is None:  # A built-in name without installed weights, load_weights=False.
            config = {**BACKBONE_PRESETS[os.fspath(source)]["config"], **backbone_arguments}
            return cls.from_backbone(backbone_cls(**config), **model_arguments)
        model = checkpoints.load_checkpoint(
            cls,
            path,
            backbone_cls,
            load_weights=load_weights,
            fresh_heads=fresh_heads,
            backbone_arguments=backbone_arguments,
            model_arguments=model_arguments,
        )
        if load_weights:  # The model card's `base_model` (kbert.checkpoints.model_card).
            model.base_model = _base_model(source, path)
        return model

    @classmethod
    def _split_preset_arguments(cls, kwargs):
        """`(backbone_arguments, model_arguments)`: `from_preset`'s kwargs split by signature.

        A name in this class's constructor goes to the model (so a task's `dropout` is its
        head's); a name in `BertBackbone`'s constructor overrides the backbone config; any
        other name is a ValueError listing both.
        """
        backbone_names = _explicit_parameters(cls.backbone_cls.__init__)
        if issubclass(cls, cls.backbone_cls):
            backbone_names.add("name")
            model_names = set()
        else:  # `name` names the model being built.
            model_names = (_explicit_parameters(cls.__init__) - {"backbone"}) | {"name"}
        unknown = sorted(set(kwargs) - model_names - backbone_names)
        if unknown:
            raise ValueError(
                f"Unexpected arguments for {cls.__name__}.from_preset: {unknown}. Expected "
                + (f"{cls.__name__} arguments {sorted(model_names)}, " if model_names else "")
                + f"BertBackbone arguments {sorted(backbone_names)} or fresh_heads."
            )
        model_arguments = {k: v for k, v in kwargs.items() if k in model_names}
        backbone_arguments = {k: v for k, v in kwargs.items() if k not in model_names}
        return backbone_arguments, model_arguments

    def save_to_preset(self, path, tokenizer=None, include_optimizer=False):
        """Writes the model as a kbert preset directory that `from_preset` loads as it was.

        Writes `config.json`, the weights and, when the model has a tokenizer (its
        preprocessor's, the vocabulary of the preset it came from, or `tokenizer`),
        `vocab.txt`, `tokenizer_config.json` and `preprocessor.json` (tokenizer settings and
        the preprocessor's `sequence_length`). The save is atomic: a kill at any instant
        leaves the previous or the new complete preset. See `kbert.checkpoints.save_preset`.

        Args:
            path: str or path. The preset directory (created or replaced).
            tokenizer: optional `kbert.text.BertTokenizer` to store with the model, e.g.
                for a `BertPretrainer` or a backbone, which have no preprocessor.
            include_optimizer: bool. Also store the optimizer state. Defaults to `False`.

        Example:
        >>> tokenizer = kbert.text.BertTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
        >>> backbone = kbert.models.BertBackbone(vocabulary_size=5, num_layers=1, num_heads=2,
        ...                                      hidden_dim=16, intermediate_dim=32)
        >>> pretrainer = kbert.models.BertPretrainer(backbone)
        >>> pretrainer.save_to_preset("my_bert", tokenizer=tokenizer)
        >>> classifier = kbert.models.BertClassifier.from_preset("my_bert", num_classes=2)
        >>> classifier.backbone.hidden_dim, classifier.preprocessor is not None
        (16, True)
        """
        checkpoints.save_preset(
            self, path, tokenizer=tokenizer, include_optimizer=include_optimizer
        )

    def push_to_hub(
        self,
        handle,
        tokenizer=None,
        private=None,
        revision=None,
        commit_message=None,
        token=None,
    ):
        """Uploads the model to a Hugging Face Hub repository, in one commit.

        The repository serves kbert, `transformers` and `sentence-transformers`: kbert's
        preset (what `save_to_preset` writes) goes into its `kbert/` folder, which
        `from_preset("hf://<owner>/<name>")` reads; its top holds the files the other
        libraries load where a format exists (a Hugging Face BERT directory for the backbone,
        the pretrainer and the task heads; a sentence-transformers directory for a text
        embedder, a cross-encoder or a sparse encoder) and the model card `README.md`. See
        `kbert.checkpoints.hub_repository` and `kbert.hub.upload_preset`.

        Args:
            handle: str. `hf://<owner>/<name>[@revision]`.
            tokenizer: optional `kbert.text.BertTokenizer` to store with the model when it
                has none (a backbone or a pretrainer).
            private: optional bool. Visibility of a repository this call creates.
            revision: optional str. The branch to commit to (created from `main` if
                needed). Defaults to the handle's `@revision`, else `main`.
            commit_message: optional str. Defaults to "Upload <name> with kbert".
            token: optional str. A Hub token with write access. Defaults to
                huggingface_hub's (`HF_TOKEN`, then the saved login).

        Returns:
            The new commit's hash (str); None on a process other than process 0 of a
            multi-process run (`kbert.distribution.initialize`), which uploads nothing.

        Raises:
            ValueError: a malformed handle or two different revisions.
            PermissionError: the token may not write to the repository.
            ConnectionError: the upload failed; the repository is as it was.
        """
        import tempfile

        from kbert.checkpoints.hub_repository import write_repository

        if not isinstance(handle, str) or not hub.is_hub_handle(handle):
            raise ValueError(
                f"`handle` must be an hf://<owner>/<name> handle. Received: {handle!r}"
            )
        repo_id, _ = hub.parse_handle(handle)
        if not processes.is_writer():  # Several processes: process 0 uploads.
            return None
        with tempfile.TemporaryDirectory(prefix="kbert-push-") as scratch:
            directory = write_repository(
                self,
                Path(scratch) / repo_id.rsplit("/", 1)[-1],
                f"{hub.HANDLE_PREFIX}{repo_id}",
                tokenizer=tokenizer,
            )
            return hub.upload_preset(
                handle,
                directory,
                private=private,
                revision=revision,
                commit_message=commit_message,
                token=token,
            )

    @classmethod
    def from_backbone(cls, backbone, **kwargs):
        """Wraps a backbone into this model class (the backbone itself for `BertBackbone`)."""
        if kwargs:
            raise ValueError(f"Unexpected arguments for {cls.__name__}: {sorted(kwargs)}")
        return backbone


def _explicit_parameters(function):
    """The named parameters of a constructor, without `self`, `*args` and `**kwargs`."""
    return {
        name
        for name, parameter in inspect.signature(function).parameters.items()
        if name != "self"
        and parameter.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    }


def _base_model(source, path):
    """The Hub repository a model loaded from `source` (read at `path`) started from, or None:
    the handle's repository, a preset name's, or what a kbert preset's config records."""
    name = os.fspath(source) if isinstance(source, (str, os.PathLike)) else ""
    if hub.is_hub_handle(name):
        return hub.parse_handle(name)[0]
    if name in hub.PRESET_HANDLES and not Path(name).exists():
        return hub.parse_handle(hub.PRESET_HANDLES[name])[0]
    config = Path(path) / "config.json"
    try:
        recorded = json.loads(config.read_text()).get("base_model") if config.is_file() else None
    except (OSError, ValueError, AttributeError):
        return None
    return recorded if isinstance(recorded, str) else None


def _preset_directory(source, load_weights):
    """The checkpoint directory `from_preset` reads for `source`, or None for a built-in preset
    name to build with fresh weights (`load_weights=False` and no installed weights).

    Local paths and installed presets first complete an interrupted atomic save; `hf://`
    handles and names without an installed preset go through `kbert.hub`."""
    if not isinstance(load_weights, bool):
        raise ValueError(
            f"`load_weights` must be True or False. Received: load_weights={load_weights!r}"
        )
    name = source
    if isinstance(source, (str, os.PathLike)) and not hub.is_hub_handle(os.fspath(source)):
        name = os.fspath(source)
        if name:
            path = recover(name)  # Completes a save that was interrupted.
            if path.exists():
                return path
        if name in BACKBONE_PRESETS:
            installed = recover(checkpoints.installed_presets_dir() / name)
            if installed.is_dir():
                return installed
            if not load_weights:
                return None  # The architecture alone: nothing to download.
    return hub.resolve_preset_source(name, load_weights=load_weights)
