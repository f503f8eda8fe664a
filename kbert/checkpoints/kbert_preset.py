"""The kbert preset directory: `config.json`, `model.weights.h5` (+ `task.weights.h5`), `vocab.txt`.

`model.weights.h5` always holds the backbone's weights, so any model class can start from any
kbert preset; `task.weights.h5` holds the whole model when it is more than a backbone, and is
used when the same class is loaded again.
"""

import json
import os
from pathlib import Path

import keras

from kbert import processes
from kbert.checkpoints._config import read_json
from kbert.checkpoints.model_card import CARD_FILE, model_card
from kbert.checkpoints.vocabulary import (
    TOKENIZER_CONFIG_FILE,
    VOCABULARY_FILE,
    find_vocabulary,
    model_tokenizer,
    read_tokenizer_files,
    read_vocabulary,
    tokenizer_file_settings,
    write_tokenizer_files,
)
from kbert.layers.utils import weights_from_checkpoint

CONFIG_FILE = "config.json"
BACKBONE_WEIGHTS_FILE = "model.weights.h5"
TASK_WEIGHTS_FILE = "task.weights.h5"
FORMAT_NAME = "kbert"


def is_kbert_preset(path):
    config_path = Path(path) / CONFIG_FILE
    if not config_path.is_file():
        return False
    try:
        return json.loads(config_path.read_text()).get("format") == FORMAT_NAME
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return False


PREPROCESSOR_FILE = "preprocessor.json"
# Files a kbert preset save owns: an old copy is dropped unless the new save writes it again.
OWNED_FILES = (
    CONFIG_FILE,
    CARD_FILE,
    BACKBONE_WEIGHTS_FILE,
    TASK_WEIGHTS_FILE,
    VOCABULARY_FILE,
    PREPROCESSOR_FILE,
    TOKENIZER_CONFIG_FILE,
)


def read_preprocessor_settings(directory):
    """The settings `save_preset` wrote to `preprocessor.json` in `directory` (`{}` if there is
    none).

    A dict with `sequence_length`, `truncate` and `tokenizer` (the tokenizer's arguments other
    than its vocabulary), each optional. A file that is not a JSON object is an error naming it.
    """
    file = Path(directory) / PREPROCESSOR_FILE
    if not file.is_file():
        return {}
    settings = read_json(file)
    if not isinstance(settings, dict):
        raise ValueError(f"{file} must hold a JSON object. Received: {settings!r}")
    return settings


def tokenizer_settings(tokenizer):
    """A tokenizer's constructor arguments other than the vocabulary (written to
    preprocessor.json)."""
    config = tokenizer.get_config() if hasattr(tokenizer, "get_config") else {}
    return {
        k: v for k, v in config.items() if k not in ("vocabulary", "name", "trainable", "dtype")
    }


def preprocessor_settings(preprocessor):
    """A preprocessor's settings other than the vocabulary (which the preset stores as
    vocab.txt)."""
    settings = {"sequence_length": getattr(preprocessor, "sequence_length", None)}
    if hasattr(preprocessor, "truncate"):
        settings["truncate"] = preprocessor.truncate
    tokenizer = getattr(preprocessor, "tokenizer", None)
    if tokenizer is not None:
        settings["tokenizer"] = tokenizer_settings(tokenizer)
    return settings


def _save_weights(model, weights_path, include_optimizer):
    """`model.save_weights`, leaving the optimizer's state out unless `include_optimizer`."""
    optimizer = getattr(model, "optimizer", None)
    if include_optimizer or optimizer is None:
        model.save_weights(weights_path)
        return
    model.optimizer = None
    try:
        model.save_weights(weights_path)
    finally:
        model.optimizer = optimizer


def save_preset(model, path, tokenizer=None, include_optimizer=False):
    """Writes `model` as a kbert preset directory at `path`, atomically.

    Writes `config.json`, `model.weights.h5` (the backbone), `task.weights.h5` (the whole
    model, when it is more than a backbone), the model card `README.md` (the Hub's metadata,
    how to load the model, its training run and architecture; see
    `kbert.checkpoints.model_card`), and when the model has a tokenizer (its
    preprocessor's, the `tokenizer` argument, or the vocabulary of the preset it was loaded
    from): `vocab.txt`, `tokenizer_config.json` (casing, for any BERT tokenizer) and
    `preprocessor.json` (tokenizer settings and, with a preprocessor, its `sequence_length`
    and `truncate`).

    The new version is written into a sibling directory and swapped in with renames (see
    `kbert.checkpoints.atomic`): a kill at any instant leaves the old or the new complete
    preset, which `from_preset` reads consistently.

    Args:
        model: a kbert model.
        path: str or path. The preset directory.
        tokenizer: optional `kbert.text.BertTokenizer` to store with the model (e.g. for a
            `BertPretrainer`, which has no preprocessor). Defaults to the model's own.
        include_optimizer: bool. Also store the optimizer's state (to resume training).
            Defaults to `False`.

    In a run over several processes (`kbert.distribution.initialize`) only process 0 writes;
    the others return without writing.
    """
    from kbert.checkpoints.atomic import atomic_directory, fix_file_modes

    if not processes.is_writer():  # Several processes: process 0 writes the preset.
        return
    card = model_card(model, os.fspath(path))
    path = Path(path)
    backbone = getattr(model, "backbone", model)
    config = {
        "format": FORMAT_NAME,
        "class_name": type(model).__name__,
        "backbone": backbone.get_config(),
        "task": None if backbone is model else model.get_config(),
        "optimizer_state": bool(
            include_optimizer and getattr(model, "optimizer", None) is not None
        ),
    }
    if getattr(model, "base_model", None):  # The Hub repository it started from.
        config["base_model"] = model.base_model
    quantization = getattr(model, "quantization_record", None)
    if quantization:  # Rebuilt quantized before the weights load (`kbert.models.quantization`).
        config["quantization"] = quantization
    if config["task"] is not None:
        config["task"] = dict(config["task"])
        config["task"].pop("backbone", None)
        config["task"].pop("preprocessor", None)
    config_text = json.dumps(config, indent=2, default=_json_default)
    if tokenizer is None:
        tokenizer = model_tokenizer(model)
    preprocessor = getattr(model, "preprocessor", None)
    settings = {}
    if preprocessor is not None:
        settings = preprocessor_settings(preprocessor)
    vocabulary = file_settings = None
    if tokenizer is not None:
        vocabulary = list(tokenizer.vocabulary)
        settings["tokenizer"] = tokenizer_settings(tokenizer)
        file_settings = tokenizer_file_settings(tokenizer)
    elif getattr(model, "preset_vocabulary_path", None) is not None:
        # The vocabulary and settings of the preset the model was loaded from.
        vocabulary_path, arguments = read_tokenizer_files(model.preset_vocabulary_path)
        vocabulary = read_vocabulary(vocabulary_path)
        settings["tokenizer"] = dict(arguments)
        file_settings = tokenizer_file_settings(arguments)
    with atomic_directory(path, owned_files=OWNED_FILES) as staging:
        (staging / CONFIG_FILE).write_text(config_text)
        (staging / CARD_FILE).write_text(card, encoding="utf-8")
        _save_weights(
            backbone, staging / BACKBONE_WEIGHTS_FILE, include_optimizer and backbone is model
        )
        if backbone is not model:
            _save_weights(model, staging / TASK_WEIGHTS_FILE, include_optimizer)
        if vocabulary is not None:
            write_tokenizer_files(staging, vocabulary, **file_settings)
            (staging / PREPROCESSOR_FILE).write_text(json.dumps(settings, indent=2))
        fix_file_modes(staging)


def _json_default(value):
    if hasattr(value, "get_config"):
        return keras.saving.serialize_keras_object(value)
    raise TypeError(f"Cannot write {type(value).__name__} into config.json")


def read_config(path):
    path = Path(path)
    file = path / CONFIG_FILE
    config = read_json(file)
    if not isinstance(config, dict):
        raise ValueError(f"{file} must hold a JSON object. Received: {type(config).__name__}")
    if not isinstance(config.get("backbone"), dict):
        raise ValueError(
            f'{file} has no "backbone" object (the BertBackbone arguments). '
            f"Received: backbone={config.get('backbone')!r}"
        )
    if config.get("task") is not None and not isinstance(config["task"], dict):
        raise ValueError(f'{file}: "task" must be an object or null. Received: {config["task"]!r}')
    return config


# Shapes of the backbone's tensors in a Keras `model.weights.h5`, by the path below the model's
# group: `layers/<layer>/.../vars/<i>`. `H`, `I`, `V`, `P`, `S` are the config's sizes.
_H5_SHAPES = {
    "bert_embeddings/token_embedding/vars/0": ("V", "H"),
    "bert_embeddings/position_embedding/vars/0": ("P", "H"),
    "bert_embeddings/segment_embedding/vars/0": ("S", "H"),
    "bert_embeddings/layer_norm/vars/0": ("H",),
    "bert_embeddings/layer_norm/vars/1": ("H",),
    "bert_pooler/dense/vars/0": ("H", "H"),
    "bert_pooler/dense/vars/1": ("H",),
}
_H5_LAYER_SHAPES = {
    "attention_layer_norm/vars/0": ("H",),
    "attention_layer_norm/vars/1": ("H",),
    "intermediate_dense/vars/0": ("H", "I"),
    "intermediate_dense/vars/1": ("I",),
    "output_dense/vars/0": ("I", "H"),
    "output_dense/vars/1": ("H",),
    "output_layer_norm/vars/0": ("H",),
    "output_layer_norm/vars/1": ("H",),
    "self_attention/key_dense/vars/0": ("H", "H"),
    "self_attention/key_dense/vars/1": ("H",),
    "self_attention/output_dense/vars/0": ("H", "H"),
    "self_attention/output_dense/vars/1": ("H",),
    "self_attention/query_dense/vars/0": ("H", "H"),
    "self_attention/query_dense/vars/1": ("H",),
    "self_attention/value_dense/vars/0": ("H", "H"),
    "self_attention/value_dense/vars/1": ("H",),
}
_SIZE_KEYS = {
    "H": "hidden_dim",
    "I": "intermediate_dim",
    "V": "vocabulary_size",
    "P": "max_sequence_length",
    "S": "num_segments",
}


def h5_shapes(weights_path, group=""):
    """`{dataset path: shape}` of an HDF5 weights file, read from its metadata alone (no data)."""
    import h5py

    shapes = {}
    try:
        with h5py.File(weights_path, "r") as file:
            root = file[group] if group else file
            root.visititems(
                lambda name, item: (
                    shapes.__setitem__(name, tuple(int(d) for d in item.shape))
                    if isinstance(item, h5py.Dataset)
                    else None
                )
            )
    except KeyError:
        return {}
    except OSError as error:
        raise ValueError(
            f"Cannot read the weights file {weights_path}: it is damaged, truncated or not an "
            f"HDF5 file ({error}). Save the preset again or restore it from a copy."
        ) from None
    return shapes


def check_weights_header(weights_path, backbone_config, group=""):
    """Compares the backbone tensors' shapes in a `.weights.h5` file with a backbone config.

    Reads the file's metadata only. Raises a ValueError listing every tensor whose shape
    differs from what the config implies, and missing or extra transformer layers, before
    any model is built (so a config that does not match its weights cannot allocate a
    model of the wrong size).
    """
    shapes = h5_shapes(weights_path, group)
    prefix = "layers/"
    if not any(name.startswith(prefix + "bert_embeddings/") for name in shapes):
        return  # Another layout (e.g. a future Keras): the full load reports mismatches.
    sizes = {letter: backbone_config.get(key) for letter, key in _SIZE_KEYS.items()}
    expected = {}
    for name, shape in _H5_SHAPES.items():
        expected[prefix + name] = shape
    num_layers = backbone_config.get("num_layers")
    layer_names = {
        name.split("/")[1] for name in shapes if name.startswith(prefix + "transformer_encoder")
    }
    problems = []
    if len(layer_names) != num_layers:
        problems.append(
            f"the file has {len(layer_names)} transformer layers, the config "
            f"num_layers={num_layers}"
        )
    for i in range(min(len(layer_names), num_layers)):
        layer = "transformer_encoder" + (f"_{i}" if i else "")
        for name, shape in _H5_LAYER_SHAPES.items():
            expected[f"{prefix}{layer}/{name}"] = shape
    for name, letters in expected.items():
        want = tuple(sizes[letter] for letter in letters)
        have = shapes.get(name)
        if have is None:
            problems.append(f"{name}: missing from the file, expected shape {list(want)}")
        elif have != want:
            meaning = ", ".join(
                f"{_SIZE_KEYS[letter]}={sizes[letter]}" for letter in dict.fromkeys(letters)
            )
            problems.append(
                f"{name}: shape {list(have)} in the file, expected {list(want)} from the config "
                f"({meaning})"
            )
    if problems:
        shown = problems[:20] + ([f"... ({len(problems) - 20} more)"] if len(problems) > 20 else [])
        raise ValueError(
            f"The weights in {weights_path} do not match the backbone config in "
            f"{Path(weights_path).parent / CONFIG_FILE}; nothing was loaded:\n  "
            + "\n  ".join(shown)
        )


def load_kbert_preset(
    cls,
    path,
    backbone_class,
    load_weights=True,
    fresh_heads=None,
    backbone_arguments=None,
    model_arguments=None,
):
    """Builds `cls` from a kbert preset directory (see the module docstring).

    The backbone config, completed with `backbone_arguments`, is validated and, with
    `load_weights`, compared with the tensor shapes in the weights file's header before
    anything is built. With `fresh_heads=True` only the backbone weights are loaded, even when
    the preset holds a model of the same class (start a new task head from a fine-tuned preset).

    Args:
        cls: the kbert model class; `cls.from_backbone(backbone, **arguments)` builds it.
        path: the preset directory.
        backbone_class: the backbone's class (`kbert.models.BertBackbone`): built with
            `backbone_class(**config)` once `backbone_class.validate_config(config, source)`
            has accepted the config.
        load_weights: bool. Whether to load the weights (else fresh ones).
        fresh_heads: `None`, `True` or `False`; see `kbert.checkpoints.formats`.
        backbone_arguments: dict of backbone config entries that override the preset's.
        model_arguments: dict of `cls` constructor arguments, over those the preset saved
            for the same class.
    """
    from kbert.checkpoints.atomic import recover

    path = recover(path)
    config = read_config(path)
    backbone_config = {**config["backbone"], **(backbone_arguments or {})}
    backbone_class.validate_config(backbone_config, source=f'{path / CONFIG_FILE} "backbone"')
    saved_class = config.get("class_name")
    same_task = saved_class == cls.__name__ and config.get("task") is not None and not fresh_heads
    quantization = config.get("quantization")
    if load_weights and not quantization:  # (Quantized tensors have other shapes, e.g. int4.)
        if same_task:
            _require_file(path / TASK_WEIGHTS_FILE)
            check_weights_header(
                path / TASK_WEIGHTS_FILE, backbone_config, group="layers/bert_backbone"
            )
        else:
            _require_file(path / BACKBONE_WEIGHTS_FILE)
            check_weights_header(path / BACKBONE_WEIGHTS_FILE, backbone_config)
    # Every backbone weight comes from the weights file (a missing one fails the load): none
    # is drawn at random first.
    with weights_from_checkpoint(load_weights):
        backbone = backbone_class(**backbone_config)
    if quantization and not same_task:
        backbone.apply_quantization_record(quantization)  # Its layers among the record's.
    arguments = dict(model_arguments or {})
    recipe = None
    if same_task:
        task_config = {
            k: v for k, v in config["task"].items() if k not in ("name", "trainable", "dtype")
        }
        if hasattr(cls, "split_training_config"):
            # Presets of earlier releases carry training settings: they become the compile's.
            task_config, recipe = cls.split_training_config(task_config)
        arguments = {**task_config, **arguments}
    # A bare backbone saved with `include_optimizer` and loaded as a backbone keeps that state.
    backbone_with_optimizer = config.get("task") is None and saved_class == cls.__name__
    if load_weights and not same_task:
        _load_weights(
            backbone,
            path / BACKBONE_WEIGHTS_FILE,
            bool(config.get("optimizer_state")) and backbone_with_optimizer,
        )
    model = cls.from_backbone(backbone, **arguments)
    if recipe:
        model.compile(**recipe)
    if quantization and same_task:
        model.apply_quantization_record(quantization)
    if load_weights and same_task:
        _load_weights(model, path / TASK_WEIGHTS_FILE, bool(config.get("optimizer_state")))
    vocabulary = find_vocabulary(path)
    if vocabulary is not None:
        model.preset_vocabulary_path = str(vocabulary)
    return model


def _require_file(weights_path):
    if not weights_path.is_file():
        raise FileNotFoundError(
            f"The preset has no weights file {weights_path.name}. Expected {weights_path}"
        )


def _load_weights(model, weights_path, with_optimizer=False):
    """`model.load_weights` with the path in errors; the optimizer state only `with_optimizer`."""
    _require_file(weights_path)
    optimizer = getattr(model, "optimizer", None)
    try:
        if optimizer is None:
            model.load_weights(weights_path)
        elif with_optimizer:
            optimizer.build(model.trainable_variables)
            model.load_weights(weights_path)
        else:
            model.optimizer = None  # The file holds no optimizer state (see `_save_weights`).
            try:
                model.load_weights(weights_path)
            finally:
                model.optimizer = optimizer
    except (OSError, ValueError, KeyError) as error:
        raise ValueError(
            f"Cannot load the weights file {weights_path} into {type(model).__name__}: {error}"
        ) from None
