"""`load_model`: one entry point from a preset name or checkpoint directory to a kbert model."""

import os
from pathlib import Path

from kbert.checkpoints.kbert_preset import is_kbert_preset, load_kbert_preset


def installed_presets_dir():
    """Where named presets with weights are looked up: `$KBERT_PRESETS_DIR` or `~/.cache/kbert/presets`."""
    return Path(os.environ.get("KBERT_PRESETS_DIR", Path.home() / ".cache" / "kbert" / "presets"))


def detect_format(path):
    """The checkpoint format of a directory: "kbert", "huggingface", "google" or "keras_hub"."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"No checkpoint directory at {path}")
    if not path.is_dir():
        raise ValueError(f"A checkpoint source must be a directory or a preset name. Received file: {path}")
    if is_kbert_preset(path):
        return "kbert"
    from kbert.checkpoints import formats

    detected = formats.detect(path)
    config_file = path / "config.json"
    if detected in (None, "huggingface") and config_file.is_file():
        from kbert.checkpoints.huggingface import read_json

        read_json(config_file)  # A broken config.json is named as such, not as "unknown format".
    if detected is None:
        raise ValueError(
            f"{path} is not a known BERT checkpoint. Expected a kbert preset (config.json with "
            '"format": "kbert"), a Hugging Face directory (config.json + model.safetensors or '
            "pytorch_model.bin), an original Google BERT directory (bert_config.json + "
            "bert_model.ckpt.index) or a keras-hub preset (config.json + model.weights.h5). "
            f"Found: {sorted(p.name for p in path.iterdir())}"
        )
    return detected


def load_model(cls, source, load_weights=True, **kwargs):
    """Builds `cls` (a kbert model class) from a preset name or a checkpoint directory."""
    from kbert.models.presets import BACKBONE_PRESETS

    from kbert.checkpoints.atomic import recover

    fresh_heads = kwargs.pop("fresh_heads", None)  # See kbert.checkpoints.formats.
    if not isinstance(source, (str, os.PathLike)):
        raise ValueError(
            "`source` must be a preset name or a checkpoint directory (str or path). "
            f"Received: {type(source).__name__} {source!r}"
        )
    if not isinstance(load_weights, bool):
        raise ValueError(f"`load_weights` must be True or False. Received: load_weights={load_weights!r}")
    source_str = os.fspath(source)
    if not source_str:
        raise ValueError("`source` is empty. Expected a preset name or a checkpoint directory.")
    source_str = os.fspath(recover(source_str))  # Completes a save that was interrupted.
    if not Path(source_str).exists() and "/" not in source_str and "\\" not in source_str:
        if source_str not in BACKBONE_PRESETS:
            raise ValueError(
                f"Unknown preset {source_str!r}. Known presets: {sorted(BACKBONE_PRESETS)}; "
                "or pass a checkpoint directory."
            )
        installed = installed_presets_dir() / source_str
        if installed.is_dir():
            return load_model(
                cls, installed, load_weights=load_weights, fresh_heads=fresh_heads, **kwargs
            )
        return _fresh_from_name(cls, source_str, load_weights, **kwargs)

    path = Path(source_str)
    fmt = detect_format(path)
    if fmt == "kbert":
        return load_kbert_preset(
            cls, path, load_weights=load_weights, fresh_heads=fresh_heads, **kwargs
        )
    from kbert.checkpoints import formats

    return formats.load(cls, path, fmt, load_weights=load_weights, fresh_heads=fresh_heads, **kwargs)


def _fresh_from_name(cls, name, load_weights, **kwargs):
    from kbert.models.backbone import BertBackbone
    from kbert.models.presets import BACKBONE_PRESETS

    if load_weights:
        raise FileNotFoundError(
            f"No weights are installed for preset {name!r}: {installed_presets_dir() / name} does "
            "not exist. Convert a checkpoint into that directory with "
            f"`python tools/convert_checkpoint.py --source <Hugging Face or Google BERT directory> "
            f"--output {installed_presets_dir() / name}` (set $KBERT_PRESETS_DIR to keep presets "
            "elsewhere), pass a checkpoint directory instead of the name, or pass "
            "load_weights=False for the architecture with freshly initialised weights."
        )
    config = dict(BACKBONE_PRESETS[name]["config"])
    config.update({k: kwargs.pop(k) for k in list(kwargs) if k in config or k == "dtype"})
    return cls.from_backbone(BertBackbone(**config), **kwargs)
