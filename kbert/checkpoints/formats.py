"""Foreign BERT checkpoint formats: detection, loading, and the hooks models implement for them.

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

Hooks a model class implements to be loadable / exportable with its heads
(`BertBackbone` and `BertPretrainer` implement them; task models add theirs):

- `huggingface_architecture` (class attribute, str): the `transformers` class written into
  `config.json` `architectures` on export, e.g. `"BertModel"`, `"BertForPreTraining"`,
  `"BertForSequenceClassification"`.
- `huggingface_head_weights(self)` -> list of `(hf_tensor_name, keras_variable, transpose)`:
  one triple per variable the model has beyond its backbone. `hf_tensor_name` is the full
  name in the HF state dict (`"cls.seq_relationship.weight"`, `"classifier.bias"`,
  `"qa_outputs.weight"`; backbone tensors are handled by the loader, under `bert.`).
  `transpose=True` for torch `Linear` weights (`(out, in)` -> Keras `(in, out)`).
- `huggingface_config(self)` -> dict (optional): extra `config.json` entries on export, e.g.
  `{"num_labels": 3, "id2label": {...}, "problem_type": ...}`.
- `huggingface_model_kwargs(cls, config)` (optional classmethod): constructor arguments read
  from an HF `config.json` dict when loading, e.g. `{"num_classes": config["num_labels"]}`;
  the caller's `from_preset` kwargs override them.
- `google_head_weights(self)` -> list of `(tf_variable_name, keras_variable, transpose)`
  (optional): the same for original Google checkpoints (e.g. `"cls/seq_relationship/output_weights"`,
  transposed because it is stored `[2, hidden]`; run_classifier's `"output_weights"`).

Head variables a hook does not name count as absent heads (see the policy above).
"""

import inspect
import json
from pathlib import Path

from kbert.checkpoints import _weights, google, huggingface, keras_hub
from kbert.checkpoints.vocabulary import check_vocabulary_size

_READERS = {"huggingface": huggingface, "google": google, "keras_hub": keras_hub}


def _json_or_none(path):
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None


def detect(path):
    """The format name of a foreign checkpoint directory: "huggingface", "google", "keras_hub" or None."""
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


def load(cls, path, fmt, load_weights=True, **kwargs):
    """Builds `cls` from a foreign checkpoint directory (see the module docstring).

    Args:
        cls: the kbert model class (`BertBackbone`, `BertPretrainer`, a task model).
        path: the checkpoint directory.
        fmt: "huggingface", "google" or "keras_hub" (from `detect`).
        load_weights: bool. Whether to load the weights (else fresh ones).
        **kwargs: `fresh_heads` (see the module docstring), `BertBackbone` arguments that
            override the checkpoint's config (`dtype`, `dropout`, `flash_attention`, ...),
            and the model's own arguments (e.g. `num_classes`).
    """
    if fmt not in _READERS:
        raise ValueError(f"Unknown checkpoint format {fmt!r}. Expected one of {sorted(_READERS)}")
    from kbert.models.backbone import BertBackbone, validate_backbone_config

    reader = _READERS[fmt]
    fresh_heads = kwargs.pop("fresh_heads", None)
    path = Path(path)
    config, vocabulary, raw = reader.read_config(path, require_weights=load_weights)
    check_vocabulary_size(vocabulary, config["vocabulary_size"], source=f"the config in {path}")
    backbone_arguments = set(inspect.signature(BertBackbone.__init__).parameters) - {"self", "kwargs"}
    overrides = {k: kwargs.pop(k) for k in list(kwargs) if k in backbone_arguments}
    config.update(overrides)
    config_file = str(path / (reader.CONFIG_FILE if hasattr(reader, "CONFIG_FILE") else "config.json"))
    validate_backbone_config(config, source=config_file)
    header_shapes = getattr(reader, "header_shapes", None)
    if load_weights and header_shapes is not None:
        shapes = header_shapes(path)
        if shapes:
            _weights.check_config_sizes(config, shapes, reader.SIZE_TENSORS, str(path), config_file)
    backbone = BertBackbone(**config)
    model_kwargs = getattr(cls, "huggingface_model_kwargs", None)
    if fmt == "huggingface" and callable(model_kwargs):
        kwargs = {**model_kwargs(raw), **kwargs}
    model = cls.from_backbone(backbone, **kwargs)
    if load_weights:
        reader.load_weights(model, path, fresh_heads=fresh_heads)
    if vocabulary is not None:
        model.preset_vocabulary_path = str(vocabulary)
    return model
