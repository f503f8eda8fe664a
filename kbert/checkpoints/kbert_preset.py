"""The kbert preset directory: `config.json`, `model.weights.h5` (+ `task.weights.h5`), `vocab.txt`.

`model.weights.h5` always holds the backbone's weights, so any model class can start from any
kbert preset; `task.weights.h5` holds the whole model when it is more than a backbone, and is
used when the same class is loaded again.
"""

import json
import os
import shutil
import tempfile
from pathlib import Path

import keras

CONFIG_FILE = "config.json"
BACKBONE_WEIGHTS_FILE = "model.weights.h5"
TASK_WEIGHTS_FILE = "task.weights.h5"
VOCABULARY_FILE = "vocab.txt"
FORMAT_NAME = "kbert"


def is_kbert_preset(path):
    config_path = Path(path) / CONFIG_FILE
    if not config_path.is_file():
        return False
    try:
        return json.loads(config_path.read_text()).get("format") == FORMAT_NAME
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return False


def _vocabulary_source(model):
    """The vocabulary file or token list attached to a model (through its preprocessor), if any."""
    preprocessor = getattr(model, "preprocessor", None)
    tokenizer = getattr(preprocessor, "tokenizer", None) or getattr(model, "tokenizer", None)
    if tokenizer is not None and getattr(tokenizer, "vocabulary", None) is not None:
        return list(tokenizer.vocabulary)
    return getattr(model, "preset_vocabulary_path", None)


def save_preset(model, path):
    """Writes `model` as a kbert preset directory at `path`.

    Files are first written to a temporary directory beside `path` and then moved into place
    one by one with an atomic rename, so an interrupted save never leaves a half-written file
    under a name a loader would trust.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    backbone = getattr(model, "backbone", model)
    config = {
        "format": FORMAT_NAME,
        "class_name": type(model).__name__,
        "backbone": backbone.get_config(),
        "task": None if backbone is model else model.get_config(),
    }
    if config["task"] is not None:
        config["task"] = dict(config["task"])
        config["task"].pop("backbone", None)
        config["task"].pop("preprocessor", None)
    with tempfile.TemporaryDirectory(dir=path, prefix=".tmp-") as staging:
        staging = Path(staging)
        (staging / CONFIG_FILE).write_text(json.dumps(config, indent=2, default=_json_default))
        backbone.save_weights(staging / BACKBONE_WEIGHTS_FILE)
        if backbone is not model:
            model.save_weights(staging / TASK_WEIGHTS_FILE)
        vocabulary = _vocabulary_source(model)
        if isinstance(vocabulary, (list, tuple)):
            (staging / VOCABULARY_FILE).write_text("\n".join(vocabulary) + "\n", encoding="utf-8")
        elif vocabulary is not None and Path(vocabulary).resolve() != (path / VOCABULARY_FILE).resolve():
            shutil.copyfile(vocabulary, staging / VOCABULARY_FILE)
        for file in staging.iterdir():
            os.replace(file, path / file.name)
        if backbone is model and (path / TASK_WEIGHTS_FILE).exists():
            (path / TASK_WEIGHTS_FILE).unlink()  # A stale task file would not match this config.


def _json_default(value):
    if hasattr(value, "get_config"):
        return keras.saving.serialize_keras_object(value)
    raise TypeError(f"Cannot write {type(value).__name__} into config.json")


def read_config(path):
    path = Path(path)
    try:
        return json.loads((path / CONFIG_FILE).read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path / CONFIG_FILE} is not valid JSON: {error}") from None


def load_kbert_preset(cls, path, load_weights=True, fresh_heads=None, **kwargs):
    """Builds `cls` from a kbert preset directory (see the module docstring).

    With `fresh_heads=True` only the backbone weights are loaded, even when the preset holds
    a model of the same class (start a new task head from a fine-tuned preset).
    """
    from kbert.models.backbone import BertBackbone

    path = Path(path)
    config = read_config(path)
    backbone_config = dict(config["backbone"])
    backbone_overrides = {k: kwargs.pop(k) for k in list(kwargs) if k in backbone_config}
    backbone_config.update(backbone_overrides)
    backbone = BertBackbone.from_config(backbone_config)
    same_task = config.get("class_name") == cls.__name__ and config.get("task") is not None
    same_task = same_task and not fresh_heads
    if same_task:
        task_config = {k: v for k, v in config["task"].items() if k not in ("name", "trainable")}
        kwargs = {**task_config, **kwargs}
        kwargs.pop("dtype", None)
    if load_weights and not same_task:
        _load_weights(backbone, path / BACKBONE_WEIGHTS_FILE)
    model = cls.from_backbone(backbone, **kwargs)
    if load_weights and same_task:
        _load_weights(model, path / TASK_WEIGHTS_FILE)
    if (path / VOCABULARY_FILE).is_file():
        model.preset_vocabulary_path = str(path / VOCABULARY_FILE)
    return model


def _load_weights(model, weights_path):
    if not weights_path.is_file():
        raise FileNotFoundError(
            f"The preset has no weights file {weights_path.name}. Expected {weights_path}"
        )
    model.load_weights(weights_path)
