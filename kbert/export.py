"""Export kbert models for serving: a TensorFlow SavedModel that takes raw strings, and ONNX.

`export_saved_model(model, path)` writes a SavedModel whose signatures run the whole pipeline
- tokenizer, packer and model - in one TensorFlow graph:

- `serving_default(text)`: a batch of strings, `tf.string` of shape `(batch_size,)`;
- `serve_pairs(text, text_pair)`: sentence pairs (two string batches of the same size);
- `serve_ids(token_ids, segment_ids, padding_mask)`: packed int32 inputs.

Each returns the model's outputs as a dict: `logits` for `BertClassifier` / `BertTagger`,
`start_logits` / `end_logits` for `BertQuestionAnswerer`, `sequence_output` /
`pooled_output` for `BertBackbone`. The model may come from any backend: on JAX and PyTorch
its config and weights are handed to a TensorFlow-backend subprocess that rebuilds and
exports it. A LoRA model is exported with the adapter merged.

Loading needs TensorFlow and tensorflow-text (the WordPiece step is tensorflow-text's
`FastWordpieceTokenizer` op), not kbert:

>>> import tensorflow as tf, tensorflow_text  # noqa: F401  (registers the op)
>>> served = tf.saved_model.load("exported")
>>> served.signatures["serving_default"](text=tf.constant(["a great film"]))["logits"]

`export_onnx(model, path, batch_size, sequence_length)` writes ONNX through Keras' own
`Model.export(format="onnx")` on the PyTorch backend: packed int32 ids of a fixed shape in,
the model's outputs out (no tokenizer); see its docstring for why the shape is fixed.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import keras

from kbert import _tensorflow

_PACKED_INPUTS = ("token_ids", "segment_ids", "padding_mask")


def _check_exportable(model, what):
    if not isinstance(model, keras.Model):
        raise ValueError(f"{what} exports a keras.Model. Received: {type(model).__name__}")
    if not model.built:
        raise ValueError(
            f"{what}: the model {model.name!r} was never built, so its input shapes and weights "
            "are unknown. Build it first (call it on a batch, or `model.build(input_shape)`)."
        )


def _check_path(path, what):
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{what} writes a directory, but {str(path)!r} is an existing file.")
    return path


def export_saved_model(model, path, preprocessor=None):
    """Writes a TensorFlow SavedModel that answers raw strings (see the module docstring).

    Args:
        model: a kbert model (`BertClassifier`, `BertTagger`, `BertQuestionAnswerer`,
            `BertBackbone`), built, on any backend.
        path: str or path. Directory to write; written beside it first and renamed into
            place, so an interrupted export leaves any earlier export at `path` intact.
        preprocessor: `kbert.text.BertPreprocessor` or `None`. Defaults to the model's own
            (`model.preprocessor`); required for a model without one.

    Example:
    >>> classifier = BertClassifier.from_preset("path/to/hf_dir", num_classes=2)
    >>> classifier.fit(["a good film", "a dull film"], [1, 0])
    >>> kbert.export.export_saved_model(classifier, "exported")
    """
    _check_exportable(model, "export_saved_model")
    preprocessor = preprocessor if preprocessor is not None else getattr(model, "preprocessor", None)
    if preprocessor is None:
        raise ValueError(
            "export_saved_model needs a preprocessor to put the tokenizer into the SavedModel: "
            f"{type(model).__name__} has none. Pass `preprocessor=kbert.text.BertPreprocessor(...)` "
            "or build the model with `from_preset(<directory with vocab.txt>)`."
        )
    if not all(hasattr(preprocessor, name) for name in ("tokenizer", "packer", "get_config")):
        raise ValueError(
            "`preprocessor` must be a kbert.text.BertPreprocessor. "
            f"Received: {type(preprocessor).__name__}"
        )
    path = _check_path(path, "export_saved_model")
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp-"))
    try:
        target = staging / "saved_model"
        if keras.config.backend() == "tensorflow":
            _write_saved_model(model, preprocessor, target)
        else:
            _export_in_tensorflow_process(model, preprocessor, target, staging)
        _move_into_place(target, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _move_into_place(source, path):
    old = None
    if path.exists():
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        os.replace(path, old)
    os.replace(source, path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _export_in_tensorflow_process(model, preprocessor, target, staging):
    """Saves config + weights (LoRA merged by Keras) and rebuilds them on TensorFlow to export."""
    _export_in_backend_process("tensorflow", model, preprocessor, staging, ["saved_model", str(target)])


def _export_in_backend_process(backend, model, preprocessor, staging, arguments):
    """Hands config + weights (LoRA merged by Keras' `Dense`) to a `backend` subprocess."""
    config = model.get_config()
    if "preprocessor" in config:  # Handed over separately; the rebuilt model needs none.
        config = dict(config, preprocessor=None)
    (staging / "model.json").write_text(
        json.dumps({"module": type(model).__module__, "class_name": type(model).__name__, "config": config})
    )
    model.save_weights(staging / "model.weights.h5")
    if preprocessor is not None:
        (staging / "preprocessor.json").write_text(
            json.dumps(keras.saving.serialize_keras_object(preprocessor))
        )
    environment = dict(os.environ, KERAS_BACKEND=backend)
    environment.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    result = subprocess.run(
        # Not `-m kbert.export`: `import kbert` imports kbert.export before runpy would run it.
        [sys.executable, "-c", "import sys; from kbert.export import _main; _main(*sys.argv[1:])", str(staging)]
        + arguments,
        env=environment,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"Exporting through a {backend}-backend process failed (exit status "
            f"{result.returncode}):\n{result.stderr[-4000:]}"
        )


def _rebuild(staging):
    """In the export subprocess: the model (and preprocessor) rebuilt from the hand-over."""
    import importlib

    staging = Path(staging)
    spec = json.loads((staging / "model.json").read_text())
    if not spec["module"].startswith("kbert."):  # Only kbert's own model classes are rebuilt.
        raise ValueError(f"Cannot export a {spec['module']}.{spec['class_name']} through a subprocess")
    cls = getattr(importlib.import_module(spec["module"]), spec["class_name"])
    model = cls.from_config(spec["config"])
    model.load_weights(staging / "model.weights.h5")
    preprocessor = None
    if (staging / "preprocessor.json").is_file():
        import kbert.text  # noqa: F401  (registers BertPreprocessor / BertTokenizer)

        preprocessor = keras.saving.deserialize_keras_object(
            json.loads((staging / "preprocessor.json").read_text())
        )
    return model, preprocessor


def _tokenizer_resources(preprocessor):
    """The TensorFlow resources (lookup tables, tensorflow-text ops) the tokenizer's graph uses."""
    return preprocessor.tokenizer.graph_resources()


def _write_saved_model(model, preprocessor, target):
    tf = _tensorflow.tensorflow("Exporting a SavedModel")

    def outputs_of(packed):
        outputs = model(packed, training=False)
        if not isinstance(outputs, dict):  # `embeddings` for a BertTextEmbedder
            outputs = {getattr(model, "export_output_name", "logits"): outputs}
        return {name: tf.convert_to_tensor(value) for name, value in outputs.items()}

    def packed_of(segments):
        return {
            name: tf.cast(value, "int32")
            for name, value in preprocessor.packer(
                tuple(preprocessor.tokenizer.tokenize(s) for s in segments)
            ).items()
        }

    def serve(text):
        return outputs_of(packed_of((text,)))

    def serve_pairs(text, text_pair):
        tf.debugging.assert_equal(
            tf.shape(text), tf.shape(text_pair), message="`text` and `text_pair` must have the same size"
        )
        return outputs_of(packed_of((text, text_pair)))

    def serve_ids(token_ids, segment_ids, padding_mask):
        return outputs_of(
            {"token_ids": token_ids, "segment_ids": segment_ids, "padding_mask": padding_mask}
        )

    archive = keras.export.ExportArchive()
    archive.track(model)
    for resource in _tokenizer_resources(preprocessor):
        archive.track(resource)
    strings = tf.TensorSpec([None], tf.string, name="text")
    archive.add_endpoint("serve", serve, input_signature=[strings])
    archive.add_endpoint(
        "serve_pairs",
        serve_pairs,
        input_signature=[strings, tf.TensorSpec([None], tf.string, name="text_pair")],
    )
    archive.add_endpoint(
        "serve_ids",
        serve_ids,
        input_signature=[tf.TensorSpec([None, None], tf.int32, name=name) for name in _PACKED_INPUTS],
    )
    archive.write_out(str(target), verbose=False)


def export_onnx(model, path, batch_size=1, sequence_length=128):
    """Writes the model as ONNX with Keras' `Model.export(format="onnx")` on PyTorch.

    Inputs are the packed int32 `token_ids`, `segment_ids` and `padding_mask`, of the fixed
    shape `(batch_size, sequence_length)` (pad or split batches to it); outputs are the
    model's (see the module docstring). The graph is traced on the PyTorch backend with
    torch's dynamo exporter - in process on PyTorch, in a PyTorch-backend subprocess on
    TensorFlow and JAX. (Keras' other ONNX routes fail on BERT: tf2onnx cannot convert the
    `Erfc` op of TensorFlow's exact GELU, and torch's TorchScript exporter, which Keras uses
    for dynamic shapes, cannot convert `LayerNormalization`.) Needs `onnx` and `onnxscript`.

    Args:
        model: a built kbert model.
        path: str or path of the `.onnx` file; written beside it first and renamed.
        batch_size: int. Rows per call. Defaults to `1`.
        sequence_length: int. Packed length. Defaults to `128`.
    """
    _check_exportable(model, "export_onnx")
    path = Path(path)
    if path.suffix != ".onnx":
        raise ValueError(f"export_onnx writes a `.onnx` file. Received: path={str(path)!r}")
    for name, value in (("batch_size", batch_size), ("sequence_length", sequence_length)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp-"))
    try:
        target = staging / "model.onnx"
        if keras.config.backend() == "torch":
            _write_onnx(model, target, batch_size, sequence_length)
        else:
            _export_in_backend_process(
                "torch", model, None, staging, ["onnx", str(target), str(batch_size), str(sequence_length)]
            )
        os.replace(target, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _write_onnx(model, target, batch_size, sequence_length):
    signature = {
        name: keras.InputSpec(shape=(batch_size, sequence_length), dtype="int32", name=name)
        for name in _PACKED_INPUTS
    }
    # `keras.Model.export` itself: `BertTask.export` routes "onnx" back here.
    keras.Model.export(model, str(target), format="onnx", input_signature=[signature], verbose=False)


def _main(staging, kind, target, *arguments):
    model, preprocessor = _rebuild(staging)
    if kind == "saved_model":
        _write_saved_model(model, preprocessor, Path(target))
    else:
        _write_onnx(model, target, *map(int, arguments))


if __name__ == "__main__":  # The TensorFlow-backend subprocess of `export_saved_model`.
    _main(*sys.argv[1:])
