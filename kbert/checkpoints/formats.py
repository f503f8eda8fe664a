"""Foreign BERT checkpoint formats: detection, loading, and where each format names BERT's weights.

`from_preset(source)` on any kbert model accepts, besides preset names and kbert preset
directories:

- a **Hugging Face** BERT directory (`config.json` with `model_type: bert`,
  `model.safetensors` / shards / `pytorch_model.bin`), see `kbert.checkpoints.huggingface`;
- an **original Google BERT** directory (`bert_config.json`, `bert_model.ckpt.*`), see
  `kbert.checkpoints.google`;
- a **keras-hub** BERT preset (`config.json` of `keras_hub>BertBackbone`,
  `model.weights.h5`), see `kbert.checkpoints.keras_hub`.

Loading is all-or-nothing: the config is translated and checked (BERT? vocabulary size?),
the model is built, every tensor is read and checked (missing, unexpected, wrong shape: one
error listing them all), and only then are the variables assigned.

Policy for parts a checkpoint may lack:

- Backbone tensors are required.
- The pooler may be absent (sentence-embedding exports and `BertForMaskedLM` drop it): the
  pooler keeps fresh weights and a warning says so; `sequence_output` is unaffected.
- Heads follow the `fresh_heads` argument of `from_preset`: `None` (default) loads the heads
  the checkpoint has and warns, naming them, about head variables it lacks (they stay
  freshly initialised, e.g. a classifier built on a plain `BertModel`); `False` makes absent
  heads an error; `True` never loads heads (start a task from a pretraining checkpoint).
- Tensors in the backbone namespace that kbert has no place for are an error; other tensors
  (heads of another architecture, optimizer slots, buffers) are left unused.
- The vocabulary (`kbert.checkpoints.vocabulary.find_vocabulary`) may be absent: the model
  has no tokenizer. A `tokenizer.json` whose model is not WordPiece (BPE, Unigram) gives none
  either, with a warning saying what it holds; any other fault of it is an error.

Each format's module holds the one table of BERT's names in that format: the backbone's
(`backbone_entries`) and each kbert model's head (`HEAD_WEIGHTS`, keyed by kbert class name;
a subclass uses its base class's row). For Hugging Face, `ARCHITECTURES` names the
`transformers` class of each kbert model, `EXPORT_CONFIG` the `config.json` entries a head
adds on export (labels) and `MODEL_ARGUMENTS` the constructor arguments read back from them.
Head variables no row names count as absent heads (see the policy above). Model classes hold
no foreign names: this package reads and writes them, and imports nothing from `kbert.models`
(the models call it, passing their classes in).
"""

import json
import warnings
from pathlib import Path

from kbert.checkpoints import _weights, google, huggingface, keras_hub
from kbert.checkpoints.vocabulary import NotWordPieceError, check_vocabulary_size
from kbert.layers.utils import weights_from_checkpoint

_READERS = {"huggingface": huggingface, "google": google, "keras_hub": keras_hub}


def _json_or_none(path):
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None


def detect(path):
    """The format name of a foreign checkpoint directory: "huggingface", "google", "keras_hub" or
    None."""
    path = Path(path)
    if (path / "config.json").is_file():
        config = _json_or_none(path / "config.json")
        if keras_hub.is_keras_hub_config(config):
            return "keras_hub"
        if huggingface.looks_like_huggingface_config(config):
            return "huggingface"
    if google.is_google_dir(path):
        return "google"
    weight_names = (
        huggingface.SAFETENSORS_FILE,
        huggingface.SAFETENSORS_INDEX_FILE,
        huggingface.TORCH_FILE,
        huggingface.TORCH_INDEX_FILE,
    )
    if any((path / name).is_file() for name in weight_names):
        return "huggingface"  # The loader then reports what is missing (config.json).
    return None


def load(
    cls,
    path,
    fmt,
    backbone_class,
    load_weights=True,
    fresh_heads=None,
    backbone_arguments=None,
    model_arguments=None,
):
    """Builds `cls` from a foreign checkpoint directory (see the module docstring).

    Args:
        cls: the kbert model class (`BertBackbone`, `BertPretrainer`, a task model);
            `cls.from_backbone(backbone, **arguments)` builds it.
        path: the checkpoint directory.
        fmt: "huggingface", "google" or "keras_hub" (from `detect`).
        backbone_class: the backbone's class (`kbert.models.BertBackbone`): built with
            `backbone_class(**config)` once `backbone_class.validate_config(config, source)`
            has accepted the translated config.
        load_weights: bool. Whether to load the weights (else fresh ones).
        fresh_heads: `None`, `True` or `False` (see the module docstring).
        backbone_arguments: dict of backbone arguments that override the checkpoint's config
            (`dtype`, `dropout`, `flash_attention`, ...).
        model_arguments: dict of `cls` constructor arguments (e.g. `num_classes`); for Hugging
            Face checkpoints they override those read from `config.json` (`MODEL_ARGUMENTS`).
    """
    if fmt not in _READERS:
        raise ValueError(f"Unknown checkpoint format {fmt!r}. Expected one of {sorted(_READERS)}")
    reader = _READERS[fmt]
    path = Path(path)
    config, vocabulary, raw = reader.read_config(path, require_weights=load_weights)
    try:
        check_vocabulary_size(vocabulary, config["vocabulary_size"], source=f"the config in {path}")
    except NotWordPieceError as error:
        # The weights are still BERT's: they load, without a tokenizer.
        warnings.warn(
            f"{error} {cls.__name__} loads without a tokenizer: pass token ids, or a "
            "preprocessor built on a WordPiece vocabulary.",
            stacklevel=2,
        )
        vocabulary = None
    config.update(backbone_arguments or {})
    config_file = str(path / getattr(reader, "CONFIG_FILE", "config.json"))
    backbone_class.validate_config(config, source=config_file)
    header_shapes = getattr(reader, "header_shapes", None)
    if load_weights and header_shapes is not None:
        shapes = header_shapes(path)
        if shapes:
            _weights.check_config_sizes(config, shapes, reader.SIZE_TENSORS, str(path), config_file)
    # The backbone's weights come from the checkpoint: none is drawn at random first (a
    # missing backbone weight fails the load below; a pooler it lacks is drawn after it).
    with weights_from_checkpoint(load_weights) as checkpoint_load:
        backbone = backbone_class(**config)
    arguments = dict(model_arguments or {})
    if fmt == "huggingface":
        arguments = {**huggingface.model_arguments(cls, raw), **arguments}
    model = cls.from_backbone(backbone, **arguments)
    if load_weights:
        report = reader.load_weights(model, path, fresh_heads=fresh_heads)
        checkpoint_load.initialize(report.fresh)
    if vocabulary is not None:
        model.preset_vocabulary_path = str(vocabulary)
    return model
