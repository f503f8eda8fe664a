"""From a checkpoint directory of any format to a kbert model: `detect_format`, `load_checkpoint`.

The model classes (`kbert.models`) call `load_checkpoint` from their `from_preset`, passing
themselves and their backbone class in: this package imports nothing from `kbert.models`.
"""

from pathlib import Path

from kbert.checkpoints import formats
from kbert.checkpoints._config import read_json
from kbert.checkpoints.kbert_preset import is_kbert_preset, load_kbert_preset
from kbert.hub import installed_presets_dir  # noqa: F401 (re-exported by kbert.checkpoints)


def detect_format(path):
    """The checkpoint format of a directory: "kbert", "huggingface", "google" or "keras_hub"."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"No checkpoint directory at {path}")
    if not path.is_dir():
        raise ValueError(
            f"A checkpoint source must be a directory or a preset name. Received file: {path}"
        )
    if is_kbert_preset(path):
        return "kbert"
    detected = formats.detect(path)
    config_file = path / "config.json"
    if detected in (None, "huggingface") and config_file.is_file():
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


def load_checkpoint(
    cls,
    path,
    backbone_class,
    load_weights=True,
    fresh_heads=None,
    backbone_arguments=None,
    model_arguments=None,
):
    """Builds `cls` (a kbert model class) from a checkpoint directory of any known format.

    Args:
        cls: the kbert model class; `cls.from_backbone(backbone, **arguments)` builds it.
        path: str or path. A kbert preset, Hugging Face, Google or keras-hub directory.
        backbone_class: the backbone's class (`kbert.models.BertBackbone`); it must offer
            `validate_config(config, source)`, which is called before anything is built.
        load_weights: bool. Whether to load the weights (else fresh ones).
        fresh_heads: `None`, `True` or `False`; see `kbert.checkpoints.formats`.
        backbone_arguments: dict of backbone arguments overriding the checkpoint's config.
        model_arguments: dict of `cls` constructor arguments (`num_classes`, ...).
    """
    path = Path(path)
    fmt = detect_format(path)
    arguments = {
        "load_weights": load_weights,
        "fresh_heads": fresh_heads,
        "backbone_arguments": backbone_arguments,
        "model_arguments": model_arguments,
    }
    if fmt == "kbert":
        return load_kbert_preset(cls, path, backbone_class, **arguments)
    return formats.load(cls, path, fmt, backbone_class, **arguments)


def load_model(cls, source, load_weights=True, **kwargs):
    """Builds `cls` from a preset name or a checkpoint directory: `cls.from_preset(source, ...)`.

    Args:
        cls: a kbert model class (`kbert.models.BertBackbone`, `BertClassifier`, ...).
        source: str or path. A preset name, an `hf://<owner>/<name>[@revision]` handle
            (see `kbert.hub`) or a checkpoint directory.
        load_weights: bool. Whether to load the weights. Defaults to `True`.
        **kwargs: arguments of `cls.from_preset`.
    """
    from_preset = getattr(cls, "from_preset", None)
    if not callable(from_preset):
        raise ValueError(
            f"`cls` must be a kbert model class (with `from_preset`). Received: {cls!r}"
        )
    return from_preset(source, load_weights=load_weights, **kwargs)
