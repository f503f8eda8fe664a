"""kbert.export: SavedModel on raw strings (loaded where kbert never was), ONNX, errors."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from kbert import export
from kbert.models import BertBackbone, BertClassifier
from kbert.models.lora import lora_layers
from tests.models.test_classifier import toy_preprocessor
from tests.test_case import random_backbone_inputs, tiny_backbone_kwargs

TEXTS = ["a good film", "the plot was very dull and boring", "john smith sings in paris ."]
PAIRS = ["a cat sat", "not a dog", "who wrote it ?"]

# Runs in a fresh interpreter: plain TensorFlow (+ tensorflow-text for the WordPiece op).
LOADER = """
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401  registers the FastWordpieceTokenizer op
served = tf.saved_model.load(sys.argv[1])
texts, pairs = json.loads(sys.argv[2])
single = served.signatures["serving_default"](text=tf.constant(texts))
pair = served.signatures["serve_pairs"](text=tf.constant(texts), text_pair=tf.constant(pairs))
print(json.dumps({
    "single": {k: v.numpy().tolist() for k, v in single.items()},
    "pair": {k: v.numpy().tolist() for k, v in pair.items()},
    "kbert_imported": any(name == "kbert" or name.startswith("kbert.") for name in sys.modules),
}))
"""


def toy_classifier():
    backbone = BertBackbone(**tiny_backbone_kwargs(max_sequence_length=32))
    return BertClassifier(backbone, num_classes=3, dropout=0.0, preprocessor=toy_preprocessor(16))


@pytest.mark.large
@pytest.mark.backends(
    "tensorflow",
    "torch",
    reason="TensorFlow exports in process; JAX hands its config and weights to the TensorFlow "
    "subprocess exactly as torch does (kbert/export.py), so torch covers that path",
)
def test_saved_model_answers_raw_strings_without_kbert(tmp_path):
    """Trained (here: LoRA-adapted, adapter randomized) on the current backend, served by plain
    TF."""
    pytest.importorskip(
        "tensorflow_text", reason="the SavedModel export and its loader need TensorFlow"
    )
    model = toy_classifier()
    model.enable_lora(2)
    rng = np.random.default_rng(0)
    for dense in lora_layers(model.backbone).values():
        for variable in (dense.lora_kernel_a, dense.lora_kernel_b):
            variable.assign(rng.normal(0, 0.3, variable.shape).astype("float32"))
    expected_single = model.predict(TEXTS, verbose=0)
    expected_pair = model.predict((TEXTS, PAIRS), verbose=0)

    model.export(tmp_path / "served")  # BertTask.export -> kbert.export.export_saved_model
    assert sorted(p.name for p in tmp_path.iterdir()) == ["served"]  # No staging left behind.
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KERAS_BACKEND")}
    result = subprocess.run(
        [sys.executable, "-c", LOADER, str(tmp_path / "served"), json.dumps([TEXTS, PAIRS])],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # Not the repository: `import kbert` could not find the worktree here.
        env=environment,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    served = json.loads(result.stdout.strip().splitlines()[-1])
    assert served["kbert_imported"] is False
    np.testing.assert_allclose(served["single"]["logits"], expected_single, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(served["pair"]["logits"], expected_pair, atol=1e-4, rtol=1e-4)
    # The pair signature really packs the second segment.
    assert not np.allclose(expected_single, expected_pair, atol=1e-3)


def test_export_errors(tmp_path):
    unbuilt = keras.Sequential([keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="never built"):
        export.export_saved_model(unbuilt, tmp_path / "a")
    with pytest.raises(ValueError, match="never built"):
        export.export_onnx(unbuilt, tmp_path / "a.onnx")
    backbone = BertBackbone(**tiny_backbone_kwargs())
    with pytest.raises(ValueError, match="needs a preprocessor"):
        export.export_saved_model(backbone, tmp_path / "b")
    with pytest.raises(ValueError, match="must be a kbert.text.BertPreprocessor. Received: dict"):
        export.export_saved_model(backbone, tmp_path / "b", preprocessor={})
    (tmp_path / "file").write_text("keep me")
    with pytest.raises(ValueError, match="existing file"):
        export.export_saved_model(toy_classifier(), tmp_path / "file")
    assert (tmp_path / "file").read_text() == "keep me"
    # A path not ending in `.onnx` is a serving directory: an existing file is kept.
    with pytest.raises(ValueError, match="existing file"):
        export.export_onnx(backbone, tmp_path / "file")
    assert (tmp_path / "file").read_text() == "keep me"
    (tmp_path / "dir.onnx").mkdir()
    with pytest.raises(ValueError, match="is an existing directory"):
        export.export_onnx(backbone, tmp_path / "dir.onnx")
    (tmp_path / "dir.onnx").rmdir()
    with pytest.raises(ValueError, match=r"positive integer, or None .* sequence_length=0"):
        export.export_onnx(backbone, tmp_path / "model.onnx", sequence_length=0)
    with pytest.raises(ValueError, match=r"at most the backbone's max_sequence_length \(24\)"):
        export.export_onnx(backbone, tmp_path / "model.onnx", sequence_length=25)
    assert not list(tmp_path.glob(".*"))


@pytest.mark.large
@pytest.mark.backends(
    "tensorflow",
    "torch",
    reason="torch traces in process; JAX hands its config and weights to the PyTorch subprocess "
    "exactly as TensorFlow does (kbert/export.py), so TensorFlow covers that path",
)
def test_onnx_matches_predict(tmp_path):
    onnxruntime = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    model = toy_classifier()
    inputs = random_backbone_inputs(batch_size=3, sequence_length=10)
    expected = model.predict(inputs, verbose=0)
    export.export_onnx(model, tmp_path / "model.onnx", batch_size=3, sequence_length=10)
    session = onnxruntime.InferenceSession(
        str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    names = [i.name for i in session.get_inputs()]
    feed = {}
    for name in names:
        key = next(k for k in inputs if k in name)
        feed[name] = inputs[key].astype("int32")
    (actual,) = session.run(None, feed)
    np.testing.assert_allclose(actual, expected, atol=1e-4, rtol=1e-4)


# The exported program is traced by one backend whatever KERAS_BACKEND is (ONNX by torch, the
# SavedModel by TensorFlow, in a subprocess elsewhere): once. Each backend's hand-over of its
# config and weights is tested by test_onnx_matches_predict and
# test_saved_model_answers_raw_strings_without_kbert, which run on every backend.
@pytest.mark.backend_independent
@pytest.mark.large
def test_onnx_dynamic_axes_serve_every_batch_size_and_length(tmp_path):
    """One file, dynamic batch and sequence axes: equal to the model at real positions for two
    batch sizes and lengths."""
    onnxruntime = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from kbert.models import BertTagger

    backbone = BertBackbone(**tiny_backbone_kwargs(max_sequence_length=32))
    model = BertTagger(backbone, num_classes=5, dropout=0.0)
    model(random_backbone_inputs(batch_size=2, sequence_length=8))
    export.export_onnx(model, tmp_path / "model.onnx")
    session = onnxruntime.InferenceSession(
        str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    assert [o.name for o in session.get_outputs()] == ["logits"]
    assert [i.name for i in session.get_inputs()] == ["token_ids", "segment_ids", "padding_mask"]
    outputs = []
    for batch_size, sequence_length, seed in ((3, 11, 1), (6, 32, 2)):
        inputs = random_backbone_inputs(batch_size, sequence_length, seed=seed)
        expected = keras.ops.convert_to_numpy(model(inputs, training=False))
        (actual,) = session.run(["logits"], inputs)
        assert actual.shape == (batch_size, sequence_length, 5)
        real = inputs["padding_mask"].astype(bool)
        np.testing.assert_allclose(actual[real], expected[real], atol=1e-5, rtol=1e-5)
        outputs.append(actual)
    # The rows really differ by length and content (not a constant the export baked in).
    assert not np.allclose(outputs[0][0, :11], outputs[1][0, :11], atol=1e-3)
    # Each layer's attention is one fused `Attention` op (with the padding mask), not
    # matmuls around a softmax over the whole score tensor.
    onnx = pytest.importorskip("onnx")
    ops = [node.op_type for node in onnx.load(str(tmp_path / "model.onnx")).graph.node]
    assert ops.count("Attention") == backbone.num_layers
    assert "Softmax" not in ops
    # An inference graph: no gradient-only op (the [PAD] row's `where` around its embedding).
    assert "Where" not in ops
    # The op takes the projections' (batch, sequence, hidden) layout: once onnxruntime has
    # cancelled the transposes around it, no activation is transposed.
    options = onnxruntime.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    onnxruntime.InferenceSession(
        str(tmp_path / "model.onnx"), options, providers=["CPUExecutionProvider"]
    )
    optimized = [node.op_type for node in onnx.load(str(tmp_path / "optimized.onnx")).graph.node]
    assert optimized.count("Attention") == backbone.num_layers
    assert "Transpose" not in optimized


@pytest.mark.backend_independent
@pytest.mark.large
def test_onnx_int8_weights_take_7_bits_where_the_cpus_int8_products_saturate(tmp_path, monkeypatch):
    """onnxruntime's uint8 x int8 products saturate 8-bit weights on x86 CPUs without VNNI:
    there `quantize="int8"` writes 7-bit weights (`reduce_range`), elsewhere 8-bit ones;
    `reduce_range=False` / `True` choose. Per-channel symmetric scales put each channel's
    largest weight on the end of the range: 127 on 8 bits, 64 at most on 7."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from onnx import numpy_helper

    from kbert.backend import cpu

    def widest(path):
        tables = [
            numpy_helper.to_array(t).astype(np.int32)
            for t in onnx.load(str(path)).graph.initializer
            if t.data_type == onnx.TensorProto.INT8
        ]
        assert len(tables) >= 6  # the query/key/value/output and feed-forward kernels
        return max(int(np.abs(t).max()) for t in tables)

    model = BertClassifier(BertBackbone(**tiny_backbone_kwargs()), num_classes=2)
    monkeypatch.setattr(cpu, "int8_products_saturate", lambda: True)
    export.export_onnx(model, tmp_path / "explicit.onnx", quantize="int8", reduce_range=False)
    assert widest(tmp_path / "explicit.onnx") == 127
    # Every product with a weight is int8, the last block's key and value too (the classifier
    # computes that block's [CLS] row only): none is left float for a weight the graph
    # computes (a joined kernel) instead of reading it.
    ops = [node.op_type for node in onnx.load(str(tmp_path / "explicit.onnx")).graph.node]
    assert "MatMul" not in ops and "Gemm" not in ops
    assert ops.count("MatMulInteger") == 6 * model.backbone.num_layers + 2
    export.export_onnx(model, tmp_path / "float.onnx")
    for saturate, expected in ((True, 64), (False, 127)):
        monkeypatch.setattr(cpu, "int8_products_saturate", lambda saturate=saturate: saturate)
        export.quantize_onnx_int8(tmp_path / "float.onnx", tmp_path / f"{saturate}.onnx")
        assert widest(tmp_path / f"{saturate}.onnx") == expected, saturate
    export.quantize_onnx_int8(tmp_path / "float.onnx", tmp_path / "seven.onnx", True)
    assert widest(tmp_path / "seven.onnx") == 64
    with pytest.raises(ValueError, match="`reduce_range` must be None, True or False"):
        export.export_onnx(model, tmp_path / "bad.onnx", quantize="int8", reduce_range="7")


@pytest.mark.backend_independent
@pytest.mark.large
def test_onnx_names_every_hidden_state_and_attention(tmp_path):
    """A backbone's `hidden_states` and `attentions` tuples leave as one output per tensor."""
    onnxruntime = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    backbone = BertBackbone(
        **tiny_backbone_kwargs(output_hidden_states=True, output_attentions=True)
    )
    inputs = random_backbone_inputs(batch_size=2, sequence_length=8)
    expected = export.flat_outputs(backbone(inputs))
    export.export_onnx(backbone, tmp_path / "model.onnx")
    session = onnxruntime.InferenceSession(
        str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    names = [o.name for o in session.get_outputs()]
    assert (
        sorted(names)
        == sorted(expected)
        == sorted(
            ["sequence_output", "pooled_output", "attentions_0", "attentions_1"]
            + ["hidden_states_0", "hidden_states_1", "hidden_states_2"]
        )
    )
    real = inputs["padding_mask"].astype(bool)
    for name, actual in zip(names, session.run(None, inputs)):
        reference = keras.ops.convert_to_numpy(expected[name])
        if name.startswith(("hidden_states", "sequence")):  # Real positions only.
            actual, reference = actual[real], reference[real]
        np.testing.assert_allclose(actual, reference, atol=1e-5, rtol=1e-5, err_msg=name)


def choice_inputs(rows, choices, sequence_length, seed):
    """Packed multiple-choice inputs `(rows, choices, sequence)`: rows of different lengths,
    and (with more than one choice) the last choice of rows 0 and 2 padding (all zeros)."""
    flat = random_backbone_inputs(rows * choices, sequence_length, seed=seed)
    packed = {k: v.reshape(rows, choices, sequence_length) for k, v in flat.items()}
    if choices > 1:
        for value in packed.values():
            value[::2, -1] = 0
    return packed


def spread_weights(model, seed=0):
    """Every matrix redrawn with a larger spread than the initializer's, so that the scores of
    a row's choices lie far enough apart for a wrong pairing or order of choices to show."""
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        if len(variable.shape) == 2:
            variable.assign(rng.normal(0, 0.3, variable.shape).astype("float32"))


@pytest.mark.backend_independent
@pytest.mark.large
def test_onnx_multiple_choice_dynamic_rows_choices_and_sequence(tmp_path):
    """`BertMultipleChoice` (rows, choices, seq) inputs: one file, every axis dynamic, equal to
    `predict` for two shapes, padded choices masked (-1e9) as `predict` masks them."""
    onnxruntime = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from kbert.layers.heads import MASKED_LOGIT
    from kbert.models import BertMultipleChoice

    backbone = BertBackbone(**tiny_backbone_kwargs(max_sequence_length=32, num_layers=1))
    model = BertMultipleChoice(backbone, dropout=0.0)
    model(choice_inputs(2, 3, 8, seed=0))
    spread_weights(model)
    model.export(tmp_path / "model.onnx", format="onnx")
    session = onnxruntime.InferenceSession(
        str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    assert [i.shape for i in session.get_inputs()] == [["batch", "choices", "sequence"]] * 3
    assert [o.shape for o in session.get_outputs()] == [["batch", "choices"]]
    for rows, choices, sequence_length, seed in ((3, 4, 11, 1), (5, 2, 32, 2)):
        inputs = choice_inputs(rows, choices, sequence_length, seed=seed)
        expected = model.predict(inputs, verbose=0)
        (actual,) = session.run(["logits"], inputs)
        assert actual.shape == (rows, choices)
        np.testing.assert_allclose(actual, expected, atol=1e-5, rtol=1e-5)
        assert np.all(actual[::2, -1] == MASKED_LOGIT) and np.all(actual[1::2] > MASKED_LOGIT)
        assert np.ptp(actual[1]) > 1e-3  # The choices of a row really score differently.


CHOICE_LOADER = """
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401  registers the FastWordpieceTokenizer op
served = tf.saved_model.load(sys.argv[1])
contexts, choices, counts, packed = json.loads(sys.argv[2])
rows = {"context": tf.constant(contexts), "choices": tf.constant(choices)}
full = served.signatures["serving_default"](**rows)
padded = served.signatures["serve_padded"](**rows, choice_counts=tf.constant(counts))
ids = served.signatures["serve_ids"](**{k: tf.constant(v, tf.int32) for k, v in packed.items()})
print(json.dumps({
    "full": full["logits"].numpy().tolist(),
    "padded": padded["logits"].numpy().tolist(),
    "ids": ids["logits"].numpy().tolist(),
    "kbert_imported": any(name == "kbert" or name.startswith("kbert.") for name in sys.modules),
}))
"""


@pytest.mark.backend_independent
@pytest.mark.large
def test_saved_model_multiple_choice_answers_context_and_choices_without_kbert(tmp_path):
    """`BertMultipleChoice`: rows of (context, choices) strings in, served by plain TF, equal to
    `predict` on the raw rows; `serve_padded` masks the padding of rows with fewer choices
    whatever its strings, and `serve_ids` takes packed (rows, choices, seq) inputs."""
    pytest.importorskip(
        "tensorflow_text", reason="the SavedModel export and its loader need TensorFlow"
    )
    from kbert.models import BertMultipleChoice
    from tests.models.test_classifier import toy_backbone

    model = BertMultipleChoice(toy_backbone(), dropout=0.0, preprocessor=toy_preprocessor(16))
    spread_weights(model)
    contexts = ["the cat sat", "john smith lives in", "a dog ran"]
    rows = [["on the mat", "in paris", "very dull"], ["paris", "london"], ["by the cat", "it"]]
    expected = model.predict((contexts, rows), verbose=0)  # (3, 3), row 1 and 2 padded
    counts = [len(row) for row in rows]
    padded = [row + ["a good film"] * (3 - len(row)) for row in rows]  # Padding: any strings.
    packed = model.preprocess_samples((contexts, rows), mode="predict")[0]

    model.export(tmp_path / "served")
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KERAS_BACKEND")}
    arguments = [contexts, padded, counts, {k: v.tolist() for k, v in packed.items()}]
    result = subprocess.run(
        [sys.executable, "-c", CHOICE_LOADER, str(tmp_path / "served"), json.dumps(arguments)],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # Not the repository: `import kbert` could not find the worktree here.
        env=environment,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    served = json.loads(result.stdout.strip().splitlines()[-1])
    assert served["kbert_imported"] is False
    np.testing.assert_allclose(served["padded"], expected, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(served["ids"], expected, atol=1e-4, rtol=1e-4)
    # Every choice of `serving_default` is real: the padding strings are scored as choices.
    np.testing.assert_allclose(served["full"][0], expected[0], atol=1e-4, rtol=1e-4)
    assert np.all(np.asarray(served["full"])[1:, 2] > -1e8)
    assert np.ptp(expected[0]) > 1e-3  # The choices of a row really score differently.
