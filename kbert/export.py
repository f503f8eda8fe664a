"""Export kbert models for serving: a SavedModel on raw strings, ONNX, OpenVINO.

`export_saved_model(model, path)` writes a SavedModel whose signatures run the whole pipeline
- tokenizer, packer and model - in one TensorFlow graph:

- `serving_default(text)`: a batch of strings, `tf.string` of shape `(batch_size,)`;
- `serve_pairs(text, text_pair)`: sentence pairs (two string batches of the same size);
- `serve_ids(token_ids, segment_ids, padding_mask)`: packed int32 inputs.

`BertMultipleChoice` takes rows of a context and its choices instead, so its text signatures
are `serving_default(context, choices)` (`context` `(rows,)`, `choices` `(rows, choices)`
strings, every choice real) and `serve_padded(context, choices, choice_counts)` (rows with
fewer choices padded with any strings, `choice_counts` `(rows,)` int32 the number of real ones:
the padded choices get the logit -1e9 as in `predict`); its `serve_ids` takes packed inputs
`(rows, choices, sequence)` (`choices` fixed when the model's `num_choices` is).

Each returns the model's outputs as a dict: `logits` for `BertClassifier` / `BertTagger`,
`start_logits` / `end_logits` for `BertQuestionAnswerer`, `sequence_output` /
`pooled_output` for `BertBackbone` (with `output_hidden_states=True` also `hidden_states_0`
... `hidden_states_<num_layers>`, with `output_attentions=True` `attentions_0` ...: one named
output per tensor of those tuples). The model may come from any backend: on JAX and PyTorch
its config and weights are handed to a TensorFlow-backend subprocess that rebuilds and
exports it. A LoRA model is exported with the adapter merged.

Loading needs TensorFlow and tensorflow-text (the WordPiece step is tensorflow-text's
`FastWordpieceTokenizer` op, registered by `import tensorflow_text`), not kbert: see the
example of `export_saved_model`.

`export_onnx(model, path)` writes ONNX through torch's exporter on the PyTorch backend: packed
int32 ids in, with dynamic batch and sequence axes by default (one file serves every batch size
and every padded length up to the model's maximum), the model's outputs out (no tokenizer).
`BertMultipleChoice`'s inputs are `(rows, choices, sequence)`, its choices axis dynamic too
unless `num_choices` fixes it.

`export_onnx(model, directory, quantize=None | "int8")` (a path not ending in `.onnx`) and
`export_openvino(model, directory, quantize=...)` write serving directories: the graph and
`kbert_serving.json` (task, outputs, settings, preprocessor), which `kbert.serving.load`
runs on raw text with the model's own `predict` / `encode`. `export_onnx(...,
interface="huggingface")` writes a backbone under Hugging Face's input and output names, the
file sentence-transformers' ONNX backend loads (see
`kbert.checkpoints.sentence_transformers.export_to_sentence_transformers(onnx=True)`).

A model describes its packed inputs' axes in `packed_input_axes` (see `_packed_axes`).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import keras

from kbert.backend import tensorflow
from kbert.checkpoints import atomic

_PACKED_INPUTS = ("token_ids", "segment_ids", "padding_mask")
# Hugging Face's names of the packed inputs (sentence-transformers' ONNX backend), in its order.
_HUGGINGFACE_INPUTS = {
    "input_ids": "token_ids",
    "attention_mask": "padding_mask",
    "token_type_ids": "segment_ids",
}
# Axes of the packed inputs, `(name, fixed size or None)`, unless a model names its own
# (`packed_input_axes`; see `_packed_axes`).
_DEFAULT_AXES = (("batch", None), ("sequence", None))


def flat_outputs(outputs):
    """A model's dict of outputs with every tuple (a backbone's `hidden_states` and
    `attentions`) spread into one entry per tensor, `<name>_0`, `<name>_1`, ...: serving
    signatures and ONNX outputs name single tensors."""
    flat = {}
    for name, value in outputs.items():
        if isinstance(value, (tuple, list)):
            flat.update({f"{name}_{index}": tensor for index, tensor in enumerate(value)})
        else:
            flat[name] = value
    return flat


def _check_exportable(model, what):
    from kbert.checkpoints.quantized import check_not_quantized

    if not isinstance(model, keras.Model):
        raise ValueError(f"{what} exports a keras.Model. Received: {type(model).__name__}")
    if not model.built:
        raise ValueError(
            f"{what}: the model {model.name!r} was never built, so its input shapes and weights "
            "are unknown. Build it first (call it on a batch, or `model.build(input_shape)`)."
        )
    check_not_quantized(model, what)


def _check_path(path, what):
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{what} writes a directory, but {str(path)!r} is an existing file.")
    return path


def export_saved_model(model, path, preprocessor=None):
    """Writes a TensorFlow SavedModel that answers raw strings (see the module docstring).

    Args:
        model: a kbert model (`BertClassifier`, `BertTagger`, `BertQuestionAnswerer`,
            `BertMultipleChoice`, `BertBackbone`, ...), built, on any backend.
        path: str or path. Directory to write; written beside it first and renamed into
            place, so an interrupted export leaves any earlier export at `path` intact.
        preprocessor: `kbert.text.BertPreprocessor` or `None`. Defaults to the model's own
            (`model.preprocessor`); required for a model without one.

    Example:
    >>> tokenizer = kbert.text.BertTokenizer(
    ...     ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "good", "dull", "film"])
    >>> backbone = kbert.models.BertBackbone(vocabulary_size=9, num_layers=1, num_heads=2,
    ...                                      hidden_dim=16, intermediate_dim=32)
    >>> backbone.save_to_preset("my_bert", tokenizer=tokenizer)  # or a HF directory
    >>> classifier = kbert.models.BertClassifier.from_preset("my_bert", num_classes=2)
    >>> history = classifier.fit(["a good film", "a dull film"], [1, 0], verbose=0)
    >>> kbert.export.export_saved_model(classifier, "exported")
    >>> import tensorflow as tf, tensorflow_text  # noqa: F401  (registers the op)
    >>> served = tf.saved_model.load("exported")
    >>> logits = served.signatures["serving_default"](text=tf.constant(["a good film"]))
    >>> np.allclose(logits["logits"], classifier.predict(["a good film"], verbose=0), atol=1e-5)
    True
    """
    _check_exportable(model, "export_saved_model")
    preprocessor = (
        preprocessor if preprocessor is not None else getattr(model, "preprocessor", None)
    )
    if preprocessor is None:
        raise ValueError(
            "export_saved_model needs a preprocessor to put the tokenizer into the SavedModel: "
            f"{type(model).__name__} has none. Pass "
            "`preprocessor=kbert.text.BertPreprocessor(...)` "
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
        write_card(model, target, path, "saved_model")
        _move_into_place(target, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _move_into_place(source, path):
    """Replaces the directory `path` with the complete `source` (`kbert.checkpoints.atomic`)."""
    atomic.recover(path)
    atomic.replace_directory(source, path)


def _export_in_tensorflow_process(model, preprocessor, target, staging):
    """Saves config + weights (LoRA merged by Keras) and rebuilds them on TensorFlow to export."""
    _export_in_backend_process(
        "tensorflow", model, preprocessor, staging, ["saved_model", str(target)]
    )


def _export_in_backend_process(backend, model, preprocessor, staging, arguments):
    """Hands config + weights (LoRA merged by Keras' `Dense`) to a `backend` subprocess."""
    config = model.get_config()
    if "preprocessor" in config:  # Handed over separately; the rebuilt model needs none.
        config = dict(config, preprocessor=None)
    (staging / "model.json").write_text(
        json.dumps(
            {"module": type(model).__module__, "class_name": type(model).__name__, "config": config}
        )
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
        [
            sys.executable,
            "-c",
            "import sys; from kbert.export import _main; _main(*sys.argv[1:])",
            str(staging),
        ]
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
        raise ValueError(
            f"Cannot export a {spec['module']}.{spec['class_name']} through a subprocess"
        )
    cls = getattr(importlib.import_module(spec["module"]), spec["class_name"])
    model = cls.from_config(spec["config"])
    model.load_weights(staging / "model.weights.h5")
    preprocessor = None
    if (staging / "preprocessor.json").is_file():
        import kbert.text.preprocessor  # noqa: F401  (registers BertPreprocessor, BertTokenizer)

        preprocessor = keras.saving.deserialize_keras_object(
            json.loads((staging / "preprocessor.json").read_text())
        )
    return model, preprocessor


def _tokenizer_resources(preprocessor):
    """The TensorFlow resources (lookup tables, tensorflow-text ops) the tokenizer's graph uses."""
    return preprocessor.tokenizer.graph_resources()


def _packed_axes(model, batch_size=None, sequence_length=None):
    """The axes of `model`'s packed inputs, `[(name, size), ...]`: `size` an int for a fixed
    axis, `None` for a dynamic one.

    A model describes its own axes in `packed_input_axes` (default `(("batch", None),
    ("sequence", None))`; `BertMultipleChoice`: `("batch", None), ("choices", num_choices),
    ("sequence", None)`); `batch_size` and `sequence_length` fix the first and last axes.
    """
    axes = [tuple(axis) for axis in getattr(model, "packed_input_axes", _DEFAULT_AXES)]
    axes[0] = (axes[0][0], batch_size if batch_size is not None else axes[0][1])
    axes[-1] = (axes[-1][0], sequence_length if sequence_length is not None else axes[-1][1])
    return axes


def _packed_of(tf, preprocessor, segments):
    """In the SavedModel graph: string batches (one per segment) -> the packed int32 dict."""
    return {
        name: tf.cast(value, "int32")
        for name, value in preprocessor.packer(
            tuple(preprocessor.tokenizer.tokenize(s) for s in segments)
        ).items()
    }


def _text_endpoints(tf, preprocessor, outputs_of):
    """`serve(text)` and `serve_pairs(text, text_pair)`: `(name, function, signature)` each."""

    def serve(text):
        return outputs_of(_packed_of(tf, preprocessor, (text,)))

    def serve_pairs(text, text_pair):
        tf.debugging.assert_equal(
            tf.shape(text),
            tf.shape(text_pair),
            message="`text` and `text_pair` must have the same size",
        )
        return outputs_of(_packed_of(tf, preprocessor, (text, text_pair)))

    strings = tf.TensorSpec([None], tf.string, name="text")
    return [
        ("serve", serve, [strings]),
        ("serve_pairs", serve_pairs, [strings, tf.TensorSpec([None], tf.string, name="text_pair")]),
    ]


def _choice_endpoints(tf, preprocessor, outputs_of, num_choices):
    """`serve(context, choices)` (every choice real) and `serve_padded(context, choices,
    choice_counts)` (the first `choice_counts[i]` choices of row `i` real, the rest padding
    whatever the strings) for multiple choice: `choices` is `(rows, choices)`, each pair packed
    as `[CLS] context [SEP] choice [SEP]` and padded choices zeroed as `predict` pads them."""

    def serve_padded(context, choices, choice_counts):
        rows, width = tf.shape(choices)[0], tf.shape(choices)[1]
        checks = [
            tf.debugging.assert_equal(
                tf.shape(context)[0], rows, message="`context` needs one string per row"
            ),
            tf.debugging.assert_equal(
                tf.shape(choice_counts)[0], rows, message="`choice_counts` needs one per row"
            ),
            tf.debugging.assert_greater_equal(
                choice_counts, 1, message="every row needs at least one real choice"
            ),
            tf.debugging.assert_less_equal(
                choice_counts, width, message="`choice_counts` exceeds the number of choices"
            ),
        ]
        with tf.control_dependencies(checks):
            firsts = tf.repeat(context, width)  # the context of each pair, row by row
        pairs = _packed_of(tf, preprocessor, (firsts, tf.reshape(choices, [-1])))
        real = tf.sequence_mask(choice_counts, width, dtype=tf.int32)[:, :, None]
        return outputs_of(
            {
                name: tf.reshape(value, tf.stack([rows, width, tf.shape(value)[-1]])) * real
                for name, value in pairs.items()
            }
        )

    def serve(context, choices):
        shape = tf.shape(choices)
        return serve_padded(context, choices, tf.fill(shape[:1], shape[1]))

    contexts = tf.TensorSpec([None], tf.string, name="context")
    choices = tf.TensorSpec([None, num_choices], tf.string, name="choices")
    counts = tf.TensorSpec([None], tf.int32, name="choice_counts")
    return [
        ("serve", serve, [contexts, choices]),
        ("serve_padded", serve_padded, [contexts, choices, counts]),
    ]


def _write_saved_model(model, preprocessor, target):
    tf = tensorflow.tensorflow("Exporting a SavedModel")
    axes = _packed_axes(model)

    def outputs_of(packed):
        outputs = model(packed, training=False)
        if not isinstance(outputs, dict):  # `embeddings` for a BertTextEmbedder
            outputs = {getattr(model, "export_output_name", "logits"): outputs}
        return {name: tf.convert_to_tensor(value) for name, value in flat_outputs(outputs).items()}

    def serve_ids(token_ids, segment_ids, padding_mask):
        return outputs_of(
            {"token_ids": token_ids, "segment_ids": segment_ids, "padding_mask": padding_mask}
        )

    archive = keras.export.ExportArchive()
    archive.track(model)
    for resource in _tokenizer_resources(preprocessor):
        archive.track(resource)
    if "choices" in dict(axes):  # (context, choices) rows instead of strings or pairs
        raw = _choice_endpoints(tf, preprocessor, outputs_of, dict(axes)["choices"])
    else:
        raw = _text_endpoints(tf, preprocessor, outputs_of)
    for name, function, signature in raw:
        archive.add_endpoint(name, function, input_signature=signature)
    shape = [size for _, size in axes]
    archive.add_endpoint(
        "serve_ids",
        serve_ids,
        input_signature=[tf.TensorSpec(shape, tf.int32, name=name) for name in _PACKED_INPUTS],
    )
    archive.write_out(str(target), verbose=False)


def export_onnx(
    model,
    path,
    batch_size=None,
    sequence_length=None,
    quantize=None,
    interface="kbert",
    reduce_range=None,
):
    """Writes the model as ONNX, traced with torch's dynamo exporter on PyTorch.

    Inputs are the packed int32 `token_ids`, `segment_ids` and `padding_mask` of shape `(batch,
    sequence)` (`(batch, choices, sequence)` for `BertMultipleChoice`, the choices axis dynamic,
    or fixed by its `num_choices`; padded choices get the logit -1e9); outputs are the model's,
    named as in the module docstring (`logits`, ...). By default both axes are dynamic: one file
    serves every batch size and every padded length from 1 up to the backbone's
    `max_sequence_length` (for example each length bucket of a length-sorted stream), with the
    same results as the model at real positions. An int `batch_size` or `sequence_length` fixes
    that axis instead. The graph is traced on the PyTorch backend - in process on PyTorch, in a
    PyTorch-backend subprocess on TensorFlow and JAX - through `torch.onnx.export(...,
    dynamo=True, dynamic_shapes=...)`. (Other routes fail on BERT: tf2onnx cannot convert the
    `Erfc` op of TensorFlow's exact GELU, and torch's TorchScript exporter cannot convert
    `LayerNormalization`.) The graph is ONNX opset 23: each layer's attention is one fused
    `Attention` op (with the padding mask), which onnxruntime (1.23 or later) and OpenVINO
    run per head in cache, instead of matmuls around a softmax over the whole score tensor.
    Needs `onnx` (1.18 or later) and `onnxscript`.

    A `path` ending in `.onnx` is that one file. Any other `path` is a serving directory
    that `kbert.serving.load` runs on raw text: `model.onnx` and `kbert_serving.json` (the
    task, its settings and the preprocessor - tokenizer, packer, sequence length - when the
    model has one). A `BertTextEmbedder`'s output is its sentence embedding, `embeddings`
    `(batch, dim)`: pooled over the real tokens and normalised when the model normalises,
    what `encode` returns before its own options (truncation, normalisation, precision).

    `quantize="int8"` writes the graph with int8 weights through onnxruntime's dynamic
    quantization (`onnxruntime.quantization.quantize_dynamic`): the weight matrices of every
    `MatMul` as per-output-channel QInt8, activations quantized per call; the embedding
    tables, the `Attention` ops (scores, softmax, weighted sum) and LayerNorms stay float32.
    Per-channel scales keep the embeddings of all-MiniLM-L6-v2 at a mean cosine of about
    0.994 to float32 on SQuAD paragraphs, one scale per matrix only at about 0.95, for the
    same speed. Needs `onnxruntime`. onnxruntime's own graph optimisations (GELU with bias,
    the int8 products with their scales) run when a session loads either file;
    `kbert.serving` leaves out its fusion of residual additions into LayerNorm
    (`SkipLayerNormFusion`), whose fused kernel is slower here than the two ops it replaces.
    On x86 CPUs without VNNI onnxruntime's uint8 x int8 products can saturate 8-bit weights
    (its documented remedy is `reduce_range`: weights on 7 bits), so by default the weights
    take 7 bits where the exporting CPU lacks VNNI and 8 where it has it; the file runs on
    any CPU. Measured on a cross-encoder reranking SQuAD candidates on a CPU without VNNI:
    MAP -1.06 points against float with 8 bits, -0.28 with 7 (BENCHMARKS.md).

    Args:
        model: a built kbert model whose inputs are the packed dict (a backbone or a task).
        path: str or path. The `.onnx` file, or a serving directory (see above); written
            beside it first and renamed.
        batch_size: int or `None`. Rows per call; `None` (default) for a dynamic axis.
        sequence_length: int or `None`. Packed length; `None` (default) for a dynamic axis
            bounded by the backbone's `max_sequence_length`.
        quantize: `None` or `"int8"`. Defaults to `None` (float32 weights).
        interface: `"kbert"` (default) or `"huggingface"`: the model's backbone (a task's,
            or the backbone itself) with Hugging Face's names, int64 `input_ids`,
            `attention_mask`, `token_type_ids` in and `last_hidden_state` out, the file
            sentence-transformers' ONNX backend (through optimum) loads; a `.onnx` path only.
        reduce_range: `None` (default), `True` or `False`. With `quantize="int8"`, whether
            the weights take 7 bits instead of 8; `None` chooses 7 where this CPU's int8
            products saturate (x86 without VNNI, `kbert.backend.int8_products_saturate`).

    Example, on the PyTorch backend:

        export_onnx(classifier, "model.onnx")
        session = onnxruntime.InferenceSession("model.onnx")
        session.run(["logits"], packed_int32_inputs)

        export_onnx(embedder, "served", quantize="int8")
        kbert.serving.load("served").encode(["a good film"])
    """
    _check_exportable(model, "export_onnx")
    _check_quantize(quantize, "export_onnx")
    if reduce_range not in (None, True, False):
        raise ValueError(
            f"`reduce_range` must be None, True or False. Received: reduce_range={reduce_range!r}"
        )
    if interface not in ("kbert", "huggingface"):
        raise ValueError(
            f"`interface` must be 'kbert' or 'huggingface'. Received: interface={interface!r}"
        )
    path = Path(path)
    if interface == "huggingface":
        model = getattr(model, "backbone", model)
        if path.suffix != ".onnx":
            raise ValueError(
                "export_onnx(interface='huggingface') writes one `.onnx` file. "
                f"Received: path={str(path)!r}"
            )
    if path.suffix != ".onnx":
        _check_path(path, "export_onnx (to a path not ending in `.onnx`)")
        _check_servable(model, "export_onnx (to a path not ending in `.onnx`)")
    elif path.is_dir():
        raise ValueError(
            f"export_onnx writes the file {str(path)!r}, but it is an existing directory."
        )
    for name, value in (("batch_size", batch_size), ("sequence_length", sequence_length)):
        fixed = value is not None
        if fixed and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(
                f"`{name}` must be a positive integer, or None for a dynamic axis. "
                f"Received: {name}={value!r}"
            )
    longest = _max_sequence_length(model)
    if sequence_length is not None and longest is not None and sequence_length > longest:
        raise ValueError(
            f"`sequence_length` must be at most the backbone's max_sequence_length ({longest}). "
            f"Received: sequence_length={sequence_length}"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp-"))
    try:
        target = staging / "float.onnx"
        write_onnx_file(model, target, batch_size, sequence_length, interface)
        if quantize == "int8":
            quantized = staging / "int8.onnx"
            quantize_onnx_int8(target, quantized, reduce_range)
            target = quantized
        if path.suffix == ".onnx":
            atomic.replace_file(target, path)
        else:
            directory = staging / "served"
            directory.mkdir()
            target.rename(directory / SERVING_FILES["onnx"])
            write_serving_config(model, directory, "onnx", quantize)
            write_card(model, directory, path, "onnx", quantize)
            _move_into_place(directory, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def export_openvino(model, path, quantize=None):
    """Writes a serving directory for OpenVINO, which `kbert.serving.load` runs on raw text.

    The model is exported to ONNX as by `export_onnx` (dynamic batch and sequence axes) and
    converted with `openvino.convert_model`; the directory holds `openvino_model.xml` /
    `openvino_model.bin` (float32 weights) and `kbert_serving.json` (see `export_onnx`).
    `quantize="int8"` compresses the weight matrices to int8 with NNCF's
    `nncf.compress_weights` (`CompressWeightsMode.INT8_ASYM`, one scale and zero point per
    output channel; activations stay float). Needs `openvino` (and `nncf` for int8), `onnx`
    and `onnxscript`.

    Args:
        model: a built kbert model whose inputs are the packed dict (a backbone or a task).
        path: str or path. The serving directory; written beside it first and renamed.
        quantize: `None` or `"int8"`. Defaults to `None`.

    Example:

        export_openvino(embedder, "served_openvino")
        kbert.serving.load("served_openvino").encode(["a good film"])
    """
    _check_exportable(model, "export_openvino")
    _check_quantize(quantize, "export_openvino")
    path = _check_path(path, "export_openvino")
    _check_servable(model, "export_openvino")
    try:
        import openvino
    except ImportError as error:
        raise ImportError(
            "export_openvino needs OpenVINO: `pip install openvino` (or kbert[serving])."
        ) from error
    compress = None
    if quantize == "int8":
        try:
            import nncf
        except ImportError as error:
            raise ImportError(
                "export_openvino(quantize='int8') compresses the weights with NNCF: "
                "`pip install nncf`."
            ) from error
        compress = nncf
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp-"))
    try:
        source = staging / "float.onnx"
        write_onnx_file(model, source)
        converted = openvino.convert_model(str(source))
        if compress is not None:
            converted = compress.compress_weights(
                converted, mode=compress.CompressWeightsMode.INT8_ASYM
            )
        directory = staging / "served"
        directory.mkdir()
        openvino.save_model(
            converted, str(directory / SERVING_FILES["openvino"]), compress_to_fp16=False
        )
        write_serving_config(model, directory, "openvino", quantize)
        write_card(model, directory, path, "openvino", quantize)
        _move_into_place(directory, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_onnx_file(model, target, batch_size=None, sequence_length=None, interface="kbert"):
    """Traces `model` to the ONNX file `target` on PyTorch: in this process on the PyTorch
    backend, else in a PyTorch-backend subprocess. `interface="huggingface"` (a backbone
    only) names the inputs and output as Hugging Face's BERT does: int64 `input_ids`,
    `attention_mask`, `token_type_ids` in, `last_hidden_state` out."""
    target = Path(target)
    if keras.config.backend() == "torch":
        _write_onnx(model, target, batch_size, sequence_length, interface)
    else:
        axes = [str(batch_size or 0), str(sequence_length or 0)]  # 0: dynamic.
        kind = "onnx" if interface == "kbert" else "onnx_huggingface"
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".handover-"))
        try:
            _export_in_backend_process("torch", model, None, staging, [kind, str(target)] + axes)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


QUANTIZE_MODES = (None, "int8")
# Tasks whose serving directories kbert.serving does not run, and what to do instead.
UNSERVED_TASKS = {
    "BertMultipleChoice": (
        "kbert.serving does not serve multiple choice: its rows of (context, choices) need "
        "their own packing. Export it to one ONNX file "
        "(`kbert.export.export_onnx(model, 'model.onnx')`, packed inputs `(rows, choices, "
        "sequence)`) or to a SavedModel on raw text (`kbert.export.export_saved_model`), or "
        "run the Keras model's `predict`."
    ),
}


def _check_servable(model, what):
    """Refuses a serving directory of a task kbert.serving does not run (`UNSERVED_TASKS`)."""
    for cls in type(model).__mro__:
        if cls.__name__ in UNSERVED_TASKS:
            raise ValueError(
                f"{what} writes a kbert.serving directory, and this model is a "
                f"{type(model).__name__}. {UNSERVED_TASKS[cls.__name__]}"
            )


# The model file of each serving format inside a serving directory.
SERVING_FILES = {"onnx": "model.onnx", "openvino": "openvino_model.xml"}
SERVING_CONFIG = "kbert_serving.json"


def _check_quantize(quantize, what):
    if quantize not in QUANTIZE_MODES:
        raise ValueError(
            f"{what}: unknown `quantize` mode {quantize!r}. Expected one of {list(QUANTIZE_MODES)}"
        )


def quantize_onnx_int8(source, target, reduce_range=None):
    """onnxruntime's dynamic int8 quantization of the ONNX file `source` into `target`: the
    constant weight matrices of `MatMul` as per-channel QInt8, on 7 bits with `reduce_range`
    (`None`: where this CPU's int8 products saturate; see `export_onnx`)."""
    if reduce_range is None:
        from kbert.backend.cpu import int8_products_saturate

        reduce_range = int8_products_saturate()
    try:
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as error:
        raise ImportError(
            "quantize='int8' needs onnxruntime: `pip install onnxruntime` (or kbert[serving])."
        ) from error
    quantize_dynamic(
        str(source),
        str(target),
        weight_type=QuantType.QInt8,
        per_channel=True,
        reduce_range=bool(reduce_range),
        op_types_to_quantize=["MatMul"],
    )


def _json_safe(value):
    """`value` if JSON can hold it (checked by a round trip), else `None`."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return None


def write_card(model, directory, path, runtime, quantize=None):
    """Writes the model card (`README.md`, `kbert.checkpoints.model_card`) of a serving export
    into its staging `directory`: how to serve it from `path`, the training run, the
    architecture."""
    from kbert.checkpoints.model_card import CARD_FILE, model_card

    card = model_card(model, os.fspath(path), serving=runtime, quantize=quantize)
    (Path(directory) / CARD_FILE).write_text(card, encoding="utf-8")


def write_serving_config(model, directory, format, quantize):
    """Writes `kbert_serving.json` into a serving directory: what `kbert.serving.load`
    needs to run the exported graph on raw text (the task, its outputs, its settings, the
    preprocessor)."""
    names = _output_names(model)
    flat = (
        flat_outputs(model.output) if isinstance(model.output, dict) else {names[0]: model.output}
    )
    settings = {
        key: value
        for key, value in model.get_config().items()
        if key not in ("backbone", "preprocessor", "name", "trainable", "dtype")
    }
    preprocessor = getattr(model, "preprocessor", None)
    backbone = getattr(model, "backbone", model)
    config = {
        "format": format,
        "quantize": quantize,
        "task": type(model).__name__,
        "outputs": names,
        # Per output: the sequence is its axis 1 (per-token outputs, padded back in order).
        "sequence_outputs": {
            name: len(flat[name].shape) >= 2 and flat[name].shape[1] is None for name in names
        },
        "prediction_fill_value": float(getattr(model, "prediction_fill_value", 0.0)),
        "max_sequence_length": getattr(backbone, "max_sequence_length", None),
        "sequence_length": getattr(model, "sequence_length", None)
        if isinstance(getattr(model, "sequence_length", None), int)
        else None,
        "settings": {key: _json_safe(value) for key, value in settings.items()},
        "preprocessor": None
        if preprocessor is None
        else keras.saving.serialize_keras_object(preprocessor),
    }
    (Path(directory) / SERVING_CONFIG).write_text(json.dumps(config, indent=1))


def _output_names(model):
    """The names of the exported outputs, in order: the flat output dict's keys, or the one
    tensor's name (`export_output_name`, else `logits`)."""
    if isinstance(model.output, dict):
        return list(flat_outputs(model.output))
    return [getattr(model, "export_output_name", "logits")]


def _max_sequence_length(model):
    """The longest packed length `model` takes (its backbone's), or None if it names none."""
    backbone = getattr(model, "backbone", model)
    return getattr(backbone, "max_sequence_length", None)


class _PackedInputs:
    """Builds the torch module the ONNX exporter traces: positional packed inputs in, the
    model's outputs out as a tuple (named after the model's output dict), plus the axes."""

    def __init__(self, model, batch_size, sequence_length, interface="kbert"):
        import numpy as np
        import torch

        self.longest = _max_sequence_length(model) or 512
        self.axes = _packed_axes(model, batch_size, sequence_length)
        # Sample inputs of sizes other than 0 and 1 (which torch.export would specialise on):
        # 2 rows, 3 of each middle axis (choices), 8 positions; padding in one row so the
        # masked path is traced, and with a choices axis, one padded choice.
        default = {"batch": 2, "sequence": min(8, self.longest)}
        shape = tuple(size or default.get(name, 3) for name, size in self.axes)
        mask = np.ones(shape, "int32")
        mask[-1, ..., max(1, shape[-1] // 2) :] = 0
        if mask.ndim > 2 and shape[1] > 1:
            mask[(0,) + (-1,) * (mask.ndim - 2)] = 0
        ids = np.full(shape, 1, "int32") * mask
        # On the backend's device (a GPU when torch has one), as the weights are.
        self.sample = tuple(keras.ops.convert_to_tensor(a) for a in (ids, np.zeros_like(ids), mask))
        outputs = model(dict(zip(_PACKED_INPUTS, self.sample)), training=False)
        # As the SavedModel's signatures: a task's one tensor is `logits` (`embeddings` for
        # a BertTextEmbedder).
        self.output_names = (
            list(flat_outputs(outputs))
            if isinstance(outputs, dict)
            else [getattr(model, "export_output_name", "logits")]
        )
        self.input_names = list(_PACKED_INPUTS)
        if interface == "huggingface":  # A backbone under Hugging Face's names, int64 ids.
            self.input_names = list(_HUGGINGFACE_INPUTS)
            self.output_names = ["last_hidden_state"]
            self.sample = tuple(
                keras.ops.cast(
                    self.sample[_PACKED_INPUTS.index(_HUGGINGFACE_INPUTS[name])], "int64"
                )
                for name in self.input_names
            )

        class Packed(torch.nn.Module):
            def __init__(self, wrapped, names):
                super().__init__()
                self.wrapped = wrapped
                self.names = names

            def forward(self, token_ids, segment_ids, padding_mask):
                packed = {"token_ids": token_ids, "segment_ids": segment_ids}
                outputs = self.wrapped(dict(packed, padding_mask=padding_mask), training=False)
                if isinstance(outputs, dict):
                    outputs = flat_outputs(outputs)
                    return tuple(outputs[name] for name in self.names)
                return outputs

        class HuggingFace(torch.nn.Module):
            def __init__(self, backbone):
                super().__init__()
                self.backbone = backbone

            def forward(self, input_ids, attention_mask, token_type_ids):
                packed = {
                    "token_ids": input_ids.to(torch.int32),
                    "segment_ids": token_type_ids.to(torch.int32),
                    "padding_mask": attention_mask.to(torch.int32),
                }
                return self.backbone(packed, training=False)["sequence_output"]

        if interface == "huggingface":
            self.module = HuggingFace(model).eval()
        else:
            self.module = Packed(model, self.output_names).eval()

    def dynamic_shapes(self):
        """torch.export's axes spec: a `Dim` for each dynamic axis, `None` for a fixed one; the
        sequence axis is bounded by the backbone's `max_sequence_length`."""
        import torch

        axes = {}
        for index, (name, size) in enumerate(self.axes):
            if size is None:
                bound = {"max": self.longest} if name == "sequence" else {}
                axes[index] = torch.export.Dim(name, **bound)
        return {name: dict(axes) for name in self.input_names} if axes else None


# ONNX opset of the exported graphs: 23 has the fused `Attention` op.
ONNX_OPSET = 23


def _onnx_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """`aten.scaled_dot_product_attention` as ONNX's one fused `Attention` op (opset 23).

    torch's exporter otherwise writes it out as matmuls, a softmax and NaN guards over the
    whole `(batch, heads, sequence, sequence)` scores, several passes over memory that
    onnxruntime and OpenVINO then run one by one; their `Attention` kernels do it per head in
    cache. Inputs are `(batch, heads, sequence, head_dim)`, the layout kbert's layers make
    from each projection's `(batch, sequence, hidden)` by a reshape and a transpose. The op
    takes the projections' layout itself (`q_num_heads` / `kv_num_heads`), so the inputs are
    transposed back and the output forward again: each pair of transposes cancels in the
    runtimes' graph optimisation, and four copies of every layer's activations are not made.
    kbert's boolean key mask `(batch, 1, 1, sequence)` (or a pairwise `(batch, 1, sequence,
    sequence)` one) is broadcast to `(batch, 1, sequence, sequence)`, the shape
    onnxruntime's kernel asks for (true: attend). The output is `(batch, heads, sequence,
    head_dim)` as the aten op's. Attention dropout is off in an exported (inference) graph.
    """
    from onnxscript import opset23 as op

    if enable_gqa:
        raise ValueError("export_onnx: grouped-query attention is not a BERT attention.")
    attributes = {"is_causal": int(bool(is_causal))}
    if scale is not None:
        attributes["scale"] = float(scale)
    arguments = [query, key, value]
    if attn_mask is not None:
        rows = op.Shape(query, start=0, end=1)
        length = op.Shape(query, start=2, end=3)
        keys = op.Shape(key, start=2, end=3)
        shape = op.Concat(rows, op.Constant(value_ints=[1]), length, keys, axis=0)
        arguments.append(op.Expand(attn_mask, shape))
    heads = [_static_dim(tensor, 1) for tensor in (query, key)]
    if None in heads:  # heads unknown at export: the op's 4-D form
        return op.Attention(*arguments, **attributes)[0]
    flat = op.Constant(value_ints=[0, 0, -1])
    for index in range(3):  # (batch, heads, sequence, dim) -> (batch, sequence, heads * dim)
        arguments[index] = op.Reshape(op.Transpose(arguments[index], perm=[0, 2, 1, 3]), flat)
    context = op.Attention(*arguments, q_num_heads=heads[0], kv_num_heads=heads[1], **attributes)[0]
    split = op.Constant(value_ints=[0, 0, heads[0], -1])
    return op.Transpose(op.Reshape(context, split), perm=[0, 2, 1, 3])


def _static_dim(tensor, axis):
    """The size of `tensor`'s `axis` when the traced graph fixes it, else `None`."""
    try:
        size = tensor.shape[axis]
    except (AttributeError, IndexError, TypeError):
        return None
    return size if isinstance(size, int) else None


def _write_onnx(model, target, batch_size=None, sequence_length=None, interface="kbert"):
    """Traces `model` on the PyTorch backend and writes its ONNX program to `target`."""
    import torch

    traced = _PackedInputs(model, batch_size, sequence_length, interface)
    with torch.no_grad():  # an inference graph: no gradient-only ops (the [PAD] row's `where`)
        program = torch.onnx.export(
            traced.module,
            traced.sample,
            dynamo=True,
            input_names=traced.input_names,
            output_names=traced.output_names,
            dynamic_shapes=traced.dynamic_shapes(),
            opset_version=ONNX_OPSET,
            custom_translation_table={
                torch.ops.aten.scaled_dot_product_attention.default: _onnx_attention
            },
            verbose=False,
            optimize=True,  # once: a second `program.optimize()` leaves dangling constants
        )
    program.save(str(target))


def _main(staging, kind, target, *arguments):
    model, preprocessor = _rebuild(staging)
    if kind == "saved_model":
        _write_saved_model(model, preprocessor, Path(target))
    else:
        interface = "huggingface" if kind == "onnx_huggingface" else "kbert"
        _write_onnx(model, target, *(int(a) or None for a in arguments), interface=interface)


if __name__ == "__main__":  # The TensorFlow-backend subprocess of `export_saved_model`.
    _main(*sys.argv[1:])
