"""kbert.serving on kbert.export's serving directories: ONNX (float, int8) and OpenVINO run
on raw text equal to the Keras model's `predict` / `encode`; errors on bad input."""

import importlib.util
import json

import numpy as np
import pytest

from kbert import export, serving
from kbert.models import (
    BertBackbone,
    BertClassifier,
    BertQuestionAnswerer,
    BertTagger,
    BertTextEmbedder,
)
from tests.checkpoints.test_model_card import python_block
from tests.models.test_classifier import toy_backbone, toy_preprocessor
from tests.test_case import tiny_backbone_kwargs

# Lengths 3 to 15 tokens: the batches of a length-ordered plan differ in length.
TEXTS = [
    "a good film",
    "the plot was very dull and boring and the cat sat on the mat by the dog",
    "john smith sings in paris .",
    "it",
    "mary jones dances , but not very good",
]
PAIRS = ["a cat sat", "not a dog", "who wrote it ?", "the movie was awful", "london"]


def spread(model, seed=0, scale=0.3):
    """Every matrix redrawn wider than the initializer: a wrong position, pooling or order
    changes outputs by far more than float rounding."""
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        if len(variable.shape) == 2:
            variable.assign(rng.normal(0, scale, variable.shape).astype("float32"))


def cosines(a, b):
    return np.sum(a * b, -1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def toy_embedder(**kwargs):
    embedder = BertTextEmbedder(
        toy_backbone(num_layers=2), preprocessor=toy_preprocessor(16), **kwargs
    )
    spread(embedder, scale=0.2)
    return embedder


# ONNX graphs are traced by torch whatever KERAS_BACKEND is (each backend's hand-over of
# weights: tests/test_export.py::test_onnx_matches_predict), and served by onnxruntime: once.
@pytest.mark.backend_independent
@pytest.mark.large
def test_onnx_serving_equals_keras_float_and_close_int8(tmp_path, capsys):
    """One embedder and one classifier, exported to ONNX: the float export's `encode` /
    `predict` on texts of different lengths and on pairs equal the Keras model's; int8's
    embeddings are close (cosine >= 0.99) and not the float ones."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    embedder = toy_embedder(prompts={"query": "who "}, truncate_dim=None)
    export.export_onnx(embedder, tmp_path / "float")
    export.export_onnx(embedder, tmp_path / "int8", quantize="int8")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["float", "int8"]  # No staging left.
    assert sorted(p.name for p in (tmp_path / "float").iterdir()) == [
        "README.md",  # its model card
        "kbert_serving.json",
        "model.onnx",
    ]
    served = serving.load(tmp_path / "float")
    expected = embedder.encode(TEXTS, batch_size=2)
    np.testing.assert_allclose(served.encode(TEXTS, batch_size=2), expected, atol=2e-5)
    # The rows really differ (an order mix-up would show), and the options are the embedder's.
    assert np.min(1 - cosines(expected[:-1], expected[1:])) > 1e-3
    np.testing.assert_allclose(
        served.encode(TEXTS[1], normalize_embeddings=True, truncate_dim=8, prompt_name="query"),
        embedder.encode(TEXTS[1], normalize=True, truncate_dim=8, prompt_name="query"),
        atol=2e-5,
    )
    np.testing.assert_array_equal(
        served.encode(TEXTS, precision="ubinary"), embedder.encode(TEXTS, precision="ubinary")
    )
    int8 = serving.load(tmp_path / "int8").encode(TEXTS)
    assert np.mean(cosines(int8, expected)) >= 0.99
    assert np.max(np.abs(int8 - expected)) > 1e-4  # Really quantized.
    # The export's model card: the Hub reads it, and its snippet serves the export as written.
    huggingface_hub = pytest.importorskip("huggingface_hub")
    card = huggingface_hub.ModelCard.load(tmp_path / "int8" / "README.md")
    assert {"onnx", "int8", "sentence-similarity"} <= set(card.data.tags)
    namespace = {}
    exec(python_block(card.text), namespace)
    assert isinstance(namespace["served"], serving.ExportedModel)
    np.testing.assert_allclose(namespace["served"].encode(TEXTS), int8, atol=1e-6)

    classifier = BertClassifier(toy_backbone(), num_classes=3, preprocessor=toy_preprocessor(16))
    spread(classifier)
    export.export_onnx(classifier, tmp_path / "classifier")
    served = serving.load(tmp_path / "classifier")
    for x in (TEXTS, (TEXTS, PAIRS)):
        expected = classifier.predict(x, batch_size=2, verbose=0)
        np.testing.assert_allclose(served.predict(x, batch_size=2), expected, atol=1e-4)
    assert not np.allclose(expected, classifier.predict(TEXTS, verbose=0), atol=1e-2)  # Pairs.
    # `verbose` as Keras' predict: a progress bar over the batches, the same outputs.
    shown = served.predict(x, batch_size=2, verbose=1)
    assert f"{-(-len(TEXTS) // 2)}/{-(-len(TEXTS) // 2)}" in capsys.readouterr().out
    np.testing.assert_allclose(shown, expected, atol=1e-4)
    # One long text among short ones: onnxruntime takes any shape, so the long row runs on
    # its own instead of padding the short ones to its length (`plan_tight_batches`); the
    # outputs are the model's, in the caller's order.
    texts = ["a", "the cat", "a dog", " ".join(["the plot was dull"] * 4), "it was", "paris"] * 2
    texts[3] = "a film"
    shapes, run = [], served.runner

    def spy(packed):
        shapes.append(packed["token_ids"].shape)
        return run(packed)

    served.runner = spy
    np.testing.assert_allclose(
        served.predict(texts, batch_size=16),
        classifier.predict(texts, batch_size=16, verbose=0),
        atol=1e-4,
    )
    assert shapes == [(1, 16), (11, 4)], shapes


@pytest.mark.backend_independent
@pytest.mark.large
def test_serving_tagger_question_answerer_and_backbone(tmp_path):
    """Per-token and two-output tasks: the tagger's word-split texts, the answerer's
    (questions, contexts) windows and a backbone's packed arrays equal their `predict`."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    tagger = BertTagger(toy_backbone(), num_classes=4, preprocessor=toy_preprocessor(16))
    answerer = BertQuestionAnswerer(toy_backbone(), preprocessor=toy_preprocessor(24))
    backbone = BertBackbone(**tiny_backbone_kwargs(max_sequence_length=32))
    for model in (tagger, answerer, backbone):
        spread(model)
    export.export_onnx(tagger, tmp_path / "tagger")
    export.export_onnx(answerer, tmp_path / "answerer")
    export.export_onnx(backbone, tmp_path / "backbone")

    expected = tagger.predict(TEXTS, batch_size=2, verbose=0)
    actual = serving.load(tmp_path / "tagger").predict(TEXTS, batch_size=2)
    assert actual.shape == expected.shape
    # Real positions only: JAX and TensorFlow pad a batch to a bucket, the runtimes to its
    # longest row, so positions past a row's end hold padding logits or the fill value.
    real = tagger.encode(TEXTS).inputs["padding_mask"].astype(bool)
    np.testing.assert_allclose(actual[real], expected[real], atol=1e-4)

    questions, contexts = PAIRS, TEXTS
    expected = answerer.predict((questions, contexts), batch_size=2, verbose=0)
    actual = serving.load(tmp_path / "answerer").predict((questions, contexts), batch_size=2)
    assert sorted(actual) == ["end_logits", "start_logits"]
    for name in actual:
        real = expected[name] > -1e8  # The context positions (the rest is masked).
        assert real.any() and np.array_equal(real, actual[name] > -1e8)
        np.testing.assert_allclose(actual[name][real], expected[name][real], atol=1e-4)

    rng = np.random.default_rng(1)
    mask = (np.arange(32)[None] < rng.integers(2, 33, (5, 1))).astype("int32")
    packed = {
        "token_ids": rng.integers(5, 97, (5, 32)) * mask,
        "segment_ids": np.zeros((5, 32), "int64"),
        "padding_mask": mask,
    }
    expected = backbone.predict(packed, verbose=0)
    actual = serving.load(tmp_path / "backbone").predict(packed, batch_size=2)
    np.testing.assert_allclose(actual["pooled_output"], expected["pooled_output"], atol=1e-4)
    real = mask.astype(bool)
    np.testing.assert_allclose(
        actual["sequence_output"][real], expected["sequence_output"][real], atol=1e-4
    )
    with pytest.raises(ValueError, match="has no preprocessor"):
        serving.load(tmp_path / "backbone").predict(TEXTS)
    with pytest.raises(ValueError, match=r"`sequence_length` must be an integer in \[3, 32\]"):
        serving.load(tmp_path / "backbone", sequence_length=33)
    with pytest.raises(ValueError, match="Packed inputs must be a dict with exactly the keys"):
        serving.load(tmp_path / "backbone").predict({"token_ids": packed["token_ids"]})
    with pytest.raises(ValueError, match="`encode` runs a BertTextEmbedder export"):
        serving.load(tmp_path / "tagger").encode(TEXTS)


@pytest.mark.backend_independent
@pytest.mark.large
def test_openvino_serving_float_and_int8(tmp_path):
    pytest.importorskip("openvino")
    pytest.importorskip("onnxscript")
    embedder = toy_embedder(normalize=True)
    expected = embedder.encode(TEXTS)
    export.export_openvino(embedder, tmp_path / "float")
    served = serving.load(tmp_path / "float")
    assert served.format == "openvino"
    assert "kbert.serving.load(" in (tmp_path / "float" / "README.md").read_text()  # its card
    np.testing.assert_allclose(served.encode(TEXTS, batch_size=2), expected, atol=2e-5)
    served = serving.from_model(embedder, "openvino")  # Export and load in one call.
    assert served.format == "openvino" and served.quantize is None
    np.testing.assert_allclose(served.encode(TEXTS, batch_size=2), expected, atol=2e-5)
    pytest.importorskip("nncf")
    export.export_openvino(embedder, tmp_path / "int8", quantize="int8")
    int8 = serving.load(tmp_path / "int8").encode(TEXTS)
    assert np.mean(cosines(int8, expected)) >= 0.99
    assert np.max(np.abs(int8 - expected)) > 1e-5


@pytest.fixture(scope="module")
def sentence_transformers_export(tmp_path_factory):
    """`(embedder, directory)`: a toy embedder exported with
    `export_to_sentence_transformers(..., onnx=True)`."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from kbert.checkpoints.sentence_transformers import export_to_sentence_transformers

    embedder = toy_embedder(normalize=True)
    path = tmp_path_factory.mktemp("st") / "st"
    return embedder, export_to_sentence_transformers(embedder, path, onnx=True)


@pytest.mark.backend_independent
@pytest.mark.large
def test_sentence_transformers_onnx_files(sentence_transformers_export):
    """`export_to_sentence_transformers(..., onnx=True)` writes onnx/model.onnx and
    onnx/model_qint8_avx512_vnni.onnx with Hugging Face's names (int64 input_ids,
    attention_mask, token_type_ids in; last_hidden_state out), the float file equal to the
    backbone, the int8 one close to it."""
    import onnxruntime

    embedder, path = sentence_transformers_export
    assert sorted(p.name for p in (path / "onnx").iterdir()) == [
        "model.onnx",
        "model_qint8_avx512_vnni.onnx",
    ]
    packed = embedder.preprocessor(TEXTS)
    expected = embedder.backbone.predict(packed, verbose=0)["sequence_output"]
    real = packed["padding_mask"].astype(bool)
    for name, tolerance in (("model.onnx", 1e-4), ("model_qint8_avx512_vnni.onnx", None)):
        session = onnxruntime.InferenceSession(
            str(path / "onnx" / name), providers=["CPUExecutionProvider"]
        )
        assert [(i.name, i.type) for i in session.get_inputs()] == [
            ("input_ids", "tensor(int64)"),
            ("attention_mask", "tensor(int64)"),
            ("token_type_ids", "tensor(int64)"),
        ]
        assert [o.name for o in session.get_outputs()] == ["last_hidden_state"]
        feed = {
            "input_ids": packed["token_ids"].astype("int64"),
            "attention_mask": packed["padding_mask"].astype("int64"),
            "token_type_ids": packed["segment_ids"].astype("int64"),
        }
        (actual,) = session.run(None, feed)
        if tolerance:
            np.testing.assert_allclose(actual[real], expected[real], atol=tolerance)
        else:
            assert np.mean(cosines(actual[real], expected[real])) >= 0.99
            assert np.max(np.abs(actual[real] - expected[real])) > 1e-5  # really int8


@pytest.mark.backend_independent
@pytest.mark.large
@pytest.mark.skipif(
    importlib.util.find_spec("optimum") is None,
    reason="sentence-transformers' ONNX backend needs optimum-onnx, which pins transformers 4.x "
    "(an environment of its own; the files themselves: test_sentence_transformers_onnx_files)",
)
def test_sentence_transformers_onnx_backend_encodes_as_the_embedder(sentence_transformers_export):
    """sentence-transformers' own ONNX backend (through optimum) loads the export and encodes
    as the embedder does."""
    import sentence_transformers

    embedder, path = sentence_transformers_export
    model = sentence_transformers.SentenceTransformer(str(path), backend="onnx", device="cpu")
    np.testing.assert_allclose(model.encode(TEXTS), embedder.encode(TEXTS), atol=1e-4)


@pytest.mark.backend_independent
def test_serving_errors(tmp_path):
    embedder = toy_embedder()
    with pytest.raises(ValueError, match=r"unknown `quantize` mode 'int4'.*\[None, 'int8'\]"):
        export.export_onnx(embedder, tmp_path / "a", quantize="int4")
    with pytest.raises(ValueError, match="unknown `quantize` mode 'int4'"):
        export.export_openvino(embedder, tmp_path / "a", quantize="int4")
    with pytest.raises(ValueError, match="`interface` must be 'kbert' or 'huggingface'"):
        export.export_onnx(embedder, tmp_path / "a.onnx", interface="hf")
    (tmp_path / "file").write_text("keep me")
    with pytest.raises(ValueError, match="existing file"):
        export.export_onnx(embedder, tmp_path / "file", quantize="int8")
    assert (tmp_path / "file").read_text() == "keep me"
    with pytest.raises(ValueError, match="no kbert_serving.json"):
        serving.load(tmp_path)
    # A directory written by hand with an unknown format.
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "kbert_serving.json").write_text(json.dumps({"format": "tflite"}))
    with pytest.raises(ValueError, match=r"names the format 'tflite'. Expected one of"):
        serving.load(tmp_path / "odd")
    with pytest.raises(ValueError, match=r"Unknown `runtime` 'tflite'. Expected one of"):
        serving.from_model(embedder, "tflite")
    with pytest.raises(ValueError, match="`threads` must be a positive integer"):
        serving.load(tmp_path / "odd", threads=0)
    assert not list(tmp_path.glob(".*"))
