"""The model card (`README.md`) written with every kbert preset, export and upload.

The card follows the Hugging Face Hub's model-card format: a YAML header with the Hub's
metadata keys (`library_name`, `pipeline_tag`, `base_model`, `tags`, `license`, `datasets`,
`model-index` with the evaluation results when the model was evaluated), then a body that
says how to load the model in kbert (and in `transformers` / `sentence-transformers` when the
directory or repository holds their files), the training run (loss, optimizer and schedule,
epochs, examples, the `fit` history) and the architecture.

What the card says comes from the model itself: its class and configuration, the source it
was loaded from (`base_model`, for an `hf://` handle or a preset name), its compiled loss and
optimizer, the `keras.callbacks.History` of its last `fit` (`model.history`), the number of
training rows and the results of its last `evaluate` (both recorded by
`kbert.models.pipeline`), and `model.card_data`, a dict the user may set for what the model
cannot know: `license`, `datasets`, `language`, `model_name`, `dataset_name` (the name of the
evaluation data in `model-index`), `tags`.

The YAML is written by this module (JSON scalars, which YAML reads as the same values), so
no YAML library is needed.
"""

import json
import math

# kbert class -> (Hub pipeline tag, transformers Auto class, what the model does).
_CLASSES = {
    "BertBackbone": ("feature-extraction", "AutoModel", "the BERT encoder"),
    "BertPretrainer": ("fill-mask", "AutoModelForPreTraining", "masked-LM + next-sentence"),
    "BertClassifier": (
        "text-classification",
        "AutoModelForSequenceClassification",
        "sequence classification",
    ),
    "BertTagger": ("token-classification", "AutoModelForTokenClassification", "token tagging"),
    "BertQuestionAnswerer": (
        "question-answering",
        "AutoModelForQuestionAnswering",
        "span question answering",
    ),
    "BertMultipleChoice": (None, "AutoModelForMultipleChoice", "multiple choice"),
    "BertTextEmbedder": ("sentence-similarity", "AutoModel", "sentence embeddings"),
    "BertCrossEncoder": (
        "text-ranking",
        "AutoModelForSequenceClassification",
        "reranking (cross-encoder)",
    ),
    "BertSparseEncoder": ("feature-extraction", "AutoModelForMaskedLM", "sparse (SPLADE) vectors"),
}
# Directory formats a card can announce next to kbert's own preset.
CARD_FILE = "README.md"
FORMATS = ("transformers", "sentence-transformers", "cross-encoder", "sparse-encoder")
# Serving exports a card can describe instead of a preset (`kbert.export`): runtime -> its tag.
SERVING = {"onnx": "onnx", "openvino": "openvino", "saved_model": "tensorflow"}
CARD_KEYS = ("license", "datasets", "language", "model_name", "dataset_name", "tags")


def _class_info(model):
    for cls in type(model).__mro__:
        if cls.__name__ in _CLASSES:
            return cls.__name__, _CLASSES[cls.__name__]
    return type(model).__name__, (None, None, type(model).__name__)


def card_data(model):
    """`model.card_data` checked: a dict whose keys are among `CARD_KEYS`."""
    data = getattr(model, "card_data", None) or {}
    if not isinstance(data, dict):
        raise ValueError(
            f"`card_data` must be a dict with keys among {list(CARD_KEYS)}. "
            f"Received: {type(data).__name__}"
        )
    unknown = sorted(set(data) - set(CARD_KEYS))
    if unknown:
        raise ValueError(
            f"Unknown `card_data` keys {unknown}. Expected keys among {list(CARD_KEYS)}."
        )
    for key in ("datasets", "language", "tags"):
        if isinstance(data.get(key), str):
            data = {**data, key: [data[key]]}
    return data


def _number(value):
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _yaml_value(value, indent):
    """`value` as YAML lines at `indent` (dicts and lists nested, scalars as JSON)."""
    pad = " " * indent
    if isinstance(value, dict):
        lines = []
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                lines.append(f"{pad}{key}:")
                lines.extend(_yaml_value(item, indent + 2))
            else:
                lines.append(f"{pad}{key}: {json.dumps(item)}")
        return lines
    if isinstance(value, list):
        lines = []
        for item in value:
            if isinstance(item, dict) and item:
                nested = _yaml_value(item, indent + 2)
                lines.append(f"{pad}- {nested[0].lstrip()}")
                lines.extend(nested[1:])
            else:
                lines.append(f"{pad}- {json.dumps(item)}")
        return lines
    return [f"{pad}{json.dumps(value)}"]


def training_record(model):
    """What the model's last `fit` and `evaluate` recorded, as a dict (empty when untrained)."""
    record = {}
    loss = getattr(model, "loss", None)
    if loss is not None:
        record["loss"] = getattr(loss, "name", None) or getattr(loss, "__name__", None)
        record["loss"] = record["loss"] or type(loss).__name__
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        record["optimizer"] = type(optimizer).__name__
        schedule = getattr(optimizer, "_learning_rate", None)
        if hasattr(schedule, "get_config"):
            config = schedule.get_config()
            record["schedule"] = {
                "name": type(schedule).__name__,
                **{k: v for k, v in config.items() if isinstance(v, (int, float, str))},
            }
            # A planned schedule keeps its length in optimizer variables (see
            # kbert.optimizers.WarmupLinearDecay.plan): report what the last fit planned.
            if getattr(schedule, "planned", False) and callable(
                getattr(schedule, "planned_length", None)
            ):
                total, warmup = schedule.planned_length()
                if total:
                    record["schedule"]["total_steps"] = int(total)
                    record["schedule"]["warmup_steps"] = int(warmup)
        else:
            rate = _number(getattr(optimizer, "learning_rate", None))
            if rate is not None:
                record["learning_rate"] = rate
        decay = _number(getattr(optimizer, "weight_decay", None))
        if decay is not None:
            record["weight_decay"] = decay
    history = getattr(model, "history", None)
    if history is not None and getattr(history, "history", None):
        record["epochs"] = len(next(iter(history.history.values())))
        record["steps_per_epoch"] = (getattr(history, "params", None) or {}).get("steps")
        record["history"] = {
            name: [_number(v) for v in values] for name, values in history.history.items()
        }
    examples = getattr(model, "training_examples", None)
    if examples:
        record["examples"] = int(examples)
    evaluation = getattr(model, "evaluation_results", None)
    if evaluation:
        record["evaluation"] = {
            name: value
            for name, value in ((k, _number(v)) for k, v in evaluation.items())
            if value is not None
        }
    return record


def _metadata(
    model, class_name, pipeline_tag, base_model, formats, data, record, title, serving=None
):
    library = "kbert"
    tags = ["kbert", "keras", "bert"]
    if serving:
        tags.append(SERVING[serving[0]])
        if serving[1]:
            tags.append(serving[1])
    if "transformers" in formats:
        tags.append("transformers")
    if {"sentence-transformers", "cross-encoder", "sparse-encoder"} & set(formats):
        tags.append("sentence-transformers")
    if pipeline_tag:
        tags.append(pipeline_tag)
    tags += [t for t in data.get("tags", ()) if t not in tags]
    header = {"library_name": library}
    if pipeline_tag:
        header["pipeline_tag"] = pipeline_tag
    if base_model:
        header["base_model"] = base_model
    header["tags"] = tags
    for key in ("license", "language", "datasets"):
        if data.get(key):
            header[key] = data[key]
    if record.get("evaluation") and pipeline_tag:
        dataset = data.get("dataset_name") or (data.get("datasets") or [None])[0]
        dataset = dataset or "evaluation data"
        header["model-index"] = [
            {
                "name": title,
                "results": [
                    {
                        "task": {"type": pipeline_tag},
                        "dataset": {"name": dataset, "type": dataset},
                        "metrics": [
                            {"type": name, "value": value, "name": name}
                            for name, value in record["evaluation"].items()
                        ],
                    }
                ],
            }
        ]
    return header


def _usage(class_name, auto_class, location, formats, in_subfolder):
    kbert_source = location
    lines = [
        "## How to use",
        "",
        "With kbert (`pip install kbert`), on TensorFlow, JAX or PyTorch:",
        "",
        "```python",
        "import kbert",
        "",
        f'model = kbert.models.{class_name}.from_preset("{kbert_source}")',
        "```",
        "",
    ]
    root = location.removeprefix("hf://")
    if in_subfolder:
        lines += [
            "kbert's own preset (configuration, weights, tokenizer and preprocessor settings) is "
            "the `kbert/` folder; `from_preset` on the repository reads it.",
            "",
        ]
    if "sentence-transformers" in formats:
        lines += [
            "With sentence-transformers:",
            "",
            "```python",
            "from sentence_transformers import SentenceTransformer",
            "",
            f'model = SentenceTransformer("{root}")',
            "```",
            "",
        ]
    if "cross-encoder" in formats:
        lines += [
            "With sentence-transformers:",
            "",
            "```python",
            "from sentence_transformers import CrossEncoder",
            "",
            f'model = CrossEncoder("{root}")',
            "```",
            "",
        ]
    if "sparse-encoder" in formats:
        lines += [
            "With sentence-transformers:",
            "",
            "```python",
            "from sentence_transformers import SparseEncoder",
            "",
            f'model = SparseEncoder("{root}")',
            "```",
            "",
        ]
    if "transformers" in formats or {"sentence-transformers", "cross-encoder", "sparse-encoder"} & (
        set(formats)
    ):
        lines += [
            "With transformers:",
            "",
            "```python",
            f"from transformers import {auto_class}",
            "",
            f'model = {auto_class}.from_pretrained("{root}")',
            "```",
            "",
        ]
    return lines


# The call a served model answers, per task class (`kbert.serving.ExportedModel`).
_SERVED_CALLS = {
    "BertTextEmbedder": 'served.encode(["A sentence to embed."])',
    "BertSparseEncoder": 'served.encode(["A sentence to encode."])  # SciPy sparse rows',
    "BertCrossEncoder": 'served.rank("a query", ["a document", "another document"])',
}


def _serving_usage(class_name, location, serving):
    runtime, quantize = serving
    weights = "int8" if quantize else "float32"
    if runtime == "saved_model":
        return [
            "## How to use",
            "",
            "A TensorFlow SavedModel that answers raw text (its tokenizer is in the graph); "
            "serving needs TensorFlow and tensorflow-text, not kbert:",
            "",
            "```python",
            "import tensorflow as tf",
            "import tensorflow_text  # registers the tokenizer's ops",
            "",
            f'served = tf.saved_model.load("{location}")',
            'outputs = served.signatures["serving_default"](text=tf.constant(["A sentence."]))',
            "```",
            "",
        ]
    name = {"onnx": "onnxruntime", "openvino": "OpenVINO"}[runtime]
    call = _SERVED_CALLS.get(class_name, 'served.predict(["A sentence."])')
    return [
        "## How to use",
        "",
        f"A `kbert.models.{class_name}` exported for {name} ({weights} weights), served on raw "
        "text by `kbert.serving` without a Keras backend:",
        "",
        "```python",
        "import kbert",
        "",
        f'served = kbert.serving.load("{location}")',
        call,
        "```",
        "",
    ]


def _training(record):
    if not record.get("history") and not record.get("evaluation"):
        return ["## Training", "", "This model was not trained with `fit` since it was loaded.", ""]
    lines = ["## Training", ""]
    facts = []
    if record.get("loss"):
        facts.append(f"- Loss: `{record['loss']}`")
    if record.get("optimizer"):
        optimizer = f"- Optimizer: `{record['optimizer']}`"
        if record.get("weight_decay") is not None:
            optimizer += f", weight decay {record['weight_decay']:g}"
        if record.get("learning_rate") is not None:
            optimizer += f", learning rate {record['learning_rate']:g}"
        facts.append(optimizer)
    if record.get("schedule"):
        settings = ", ".join(
            f"{k} {v}" for k, v in record["schedule"].items() if k != "name" and v is not None
        )
        facts.append(f"- Schedule: `{record['schedule']['name']}` ({settings})")
    if record.get("epochs"):
        facts.append(f"- Epochs: {record['epochs']}")
    if record.get("steps_per_epoch"):
        facts.append(f"- Steps per epoch: {record['steps_per_epoch']}")
    if record.get("examples"):
        facts.append(f"- Training examples: {record['examples']}")
    lines += facts + [""]
    history = record.get("history")
    if history:
        names = list(history)
        lines += [
            "The `fit` history (one row per epoch):",
            "",
            "| epoch | " + " | ".join(names) + " |",
            "| ---: | " + " | ".join("---:" for _ in names) + " |",
        ]
        for epoch in range(len(history[names[0]])):
            cells = []
            for name in names:
                value = history[name][epoch] if epoch < len(history[name]) else None
                cells.append("" if value is None else f"{value:.4g}")
            lines.append(f"| {epoch + 1} | " + " | ".join(cells) + " |")
        lines.append("")
    if record.get("evaluation"):
        lines += ["Results of the last `evaluate`:", "", "| metric | value |", "| --- | ---: |"]
        lines += [f"| {name} | {value:.4g} |" for name, value in record["evaluation"].items()]
        lines.append("")
    return lines


def _architecture(model, class_name, description):
    backbone = getattr(model, "backbone", model)
    config = backbone.get_config() if hasattr(backbone, "get_config") else {}
    keys = (
        "vocabulary_size",
        "num_layers",
        "num_heads",
        "hidden_dim",
        "intermediate_dim",
        "max_sequence_length",
        "num_segments",
    )
    lines = [
        "## Architecture",
        "",
        f"`kbert.models.{class_name}` ({description}) on a BERT encoder"
        + (f" with {backbone.count_params():,} parameters" if backbone.built else "")
        + ":",
        "",
        "| setting | value |",
        "| --- | ---: |",
    ]
    lines += [f"| {key} | {config[key]} |" for key in keys if key in config]
    quantization = getattr(model, "quantization_record", None)
    if quantization:
        lines += ["", f"Quantized: `{json.dumps(quantization)}`."]
    lines.append("")
    return lines


def model_card(
    model, location, formats=(), base_model=None, in_subfolder=False, serving=None, quantize=None
):
    """The model card of `model` as Markdown text with the Hub's YAML header.

    Args:
        model: a kbert model.
        location: str. How to name the model in the usage snippets: an `hf://` handle or a
            directory.
        formats: the directory formats written beside kbert's preset, among `FORMATS`.
        base_model: optional str. The Hub repository the model started from. Defaults to
            the one it was loaded from (`model.base_model`), if any.
        in_subfolder: bool. kbert's preset is the `kbert/` folder of a repository whose top
            holds the other formats. Defaults to `False`.
        serving: `None`, or the runtime of a serving export the card describes instead of a
            preset: `"onnx"`, `"openvino"` (a `kbert.serving` directory) or `"saved_model"`.
        quantize: `None` or `"int8"`: the serving export's weights.

    Returns:
        The card's text.

    Example:
    >>> backbone = kbert.models.BertBackbone(vocabulary_size=100, num_layers=1, num_heads=2,
    ...                                      hidden_dim=16, intermediate_dim=32)
    >>> card = model_card(kbert.models.BertClassifier(backbone, num_classes=2), "my_model")
    >>> card.splitlines()[:3]
    ['---', 'library_name: "kbert"', 'pipeline_tag: "text-classification"']
    """
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        raise ValueError(f"Unknown formats {unknown}. Expected formats among {list(FORMATS)}.")
    if serving is not None and serving not in SERVING:
        raise ValueError(f"`serving` must be one of {list(SERVING)} or None. Received {serving!r}")
    data = card_data(model)
    class_name, (pipeline_tag, auto_class, description) = _class_info(model)
    record = training_record(model)
    base_model = base_model or getattr(model, "base_model", None)
    title = data.get("model_name") or str(location).rstrip("/").rsplit("/", 1)[-1]
    served = None if serving is None else (serving, quantize)
    header = _metadata(
        model, class_name, pipeline_tag, base_model, formats, data, record, title, served
    )
    lines = ["---", *_yaml_value(header, 0), "---", "", f"# {title}", ""]
    summary = f"A `kbert.models.{class_name}` ({description})"
    if base_model:
        summary += f" from [{base_model}](https://huggingface.co/{base_model})"
    lines += [summary + ", written by kbert.", ""]
    if served:
        lines += _serving_usage(class_name, str(location), served)
    else:
        lines += _usage(class_name, auto_class, str(location), formats, in_subfolder)
    lines += _training(record)
    lines += _architecture(model, class_name, description)
    return "\n".join(lines)
