"""The newer models without TensorFlow (issue #45 item 7): one run each of `BertCrossEncoder`,
`BertSparseEncoder`, `BertMultipleChoice` and `BertTextEmbedder` on raw text, each loaded from
a random Hugging Face checkpoint and checked against `transformers` on the same weights (with
the pooling, scoring and losses written out in NumPy); `quantize("int8")`; and an ONNX export
served by `kbert.serving` with the Keras model's scores and ranking.

Tiny models over the toy vocabulary of tests/models/test_classifier.py, and few input shapes
per model (JAX compiles one program per shape), keep the file quick on both backends of
`make test-notf`.
"""

import keras
import numpy as np
import pytest

from kbert import retrieval, serving
from kbert.losses_sparse import SpladeLoss
from kbert.models import (
    BertCrossEncoder,
    BertMultipleChoice,
    BertSparseEncoder,
    BertTextEmbedder,
)
from tests.models.test_classifier import TOY_VOCABULARY, hf_outputs, load_quietly, save_hf_model

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

QUERY = "who wrote it ?"
DOCUMENTS = [
    "it was written by ann in 1990 .",
    "the cat sat on the mat",
    "a dog ran in london",
    "john smith sings and dances in paris",
    "a very dull and boring film",
    "ann wrote it",
]
# Small and 16 wide: every test's model has the same (cheap) shapes.
TINY = dict(
    vocab_size=len(TOY_VOCABULARY), num_hidden_layers=1, hidden_size=16, intermediate_size=24
)


def _checkpoint(root, transformers_class, **config):
    """A random `transformers` model saved with the toy vocabulary: (directory, model). A
    classification head is redrawn large, so that its scores spread far apart."""
    reference = save_hf_model(transformers_class, root, **{**TINY, **config})
    if hasattr(reference, "classifier"):
        with torch.no_grad():
            reference.classifier.weight.normal_(0.0, 1.0)
        reference.save_pretrained(root)
    (root / "vocab.txt").write_text("\n".join(TOY_VOCABULARY) + "\n")
    return root, reference


def _logsumexp(x, axis):
    top = x.max(axis=axis, keepdims=True)
    return np.squeeze(top, axis) + np.log(np.exp(x - top).sum(axis=axis))


# ----------------------------------------------------------------------- cross-encoder
@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory):
    """A one-label Hugging Face sequence classifier loaded as a `BertCrossEncoder`, and the
    reference logits of (QUERY, document) pairs from `transformers`."""
    path, reference = _checkpoint(
        tmp_path_factory.mktemp("cross_encoder"),
        transformers.BertForSequenceClassification,
        num_labels=1,
    )
    model = load_quietly(BertCrossEncoder, path, dropout=0.0, sequence_length=24)
    packed = model.preprocessor(([QUERY] * len(DOCUMENTS), DOCUMENTS))
    logits = hf_outputs(reference, packed).logits.numpy()[:, 0].astype("float64")
    return path, model, logits


def test_cross_encoder_predict_rank_and_fit_step_equal_transformers(cross_encoder):
    """`predict` is the sigmoid of Hugging Face's logits on `[CLS] query [SEP] document
    [SEP]`, `rank` orders the documents by those scores, and a training step's loss is the
    binary cross-entropy of those logits; the next steps lower it."""
    path, model, logits = cross_encoder
    assert np.ptp(logits) > 0.5  # The documents score apart: an order mix-up would show.
    expected = 1.0 / (1.0 + np.exp(-logits))
    scores = model.predict([(QUERY, d) for d in DOCUMENTS])
    np.testing.assert_allclose(scores, expected, atol=1e-5)
    ranking = model.rank(QUERY, DOCUMENTS, return_documents=True)
    assert [hit["corpus_id"] for hit in ranking] == list(np.argsort(-expected, kind="stable"))
    np.testing.assert_allclose([hit["score"] for hit in ranking], np.sort(expected)[::-1], 1e-5)
    assert [hit["text"] for hit in ranking] == [DOCUMENTS[hit["corpus_id"]] for hit in ranking]

    # A twin with the same weights trains (the fixture's model stays as loaded).
    twin = load_quietly(BertCrossEncoder, path, dropout=0.0, sequence_length=24)
    twin.compile(optimizer=keras.optimizers.Adam(1e-2))
    labels = np.array([1, 0, 0, 0, 0, 1], "float32")
    pairs = ([QUERY] * len(DOCUMENTS), DOCUMENTS)
    with pytest.raises(ValueError, match=r"must lie in \[0, 1\]"):
        twin.fit(pairs, labels + 1.0, batch_size=len(labels), epochs=1, verbose=0)
    history = twin.fit(pairs, labels, batch_size=len(labels), epochs=3, verbose=0)
    losses = history.history["loss"]
    bce = np.mean(np.logaddexp(0.0, logits) - labels * logits)
    np.testing.assert_allclose(losses[0], bce, rtol=1e-5)  # One batch: the weights before.
    assert losses[-1] < 0.8 * losses[0], losses


def test_onnx_export_served_equals_the_keras_cross_encoder(cross_encoder, tmp_path):
    """The cross-encoder exported to ONNX (traced on torch: in this process on the torch
    backend, in a torch-backend subprocess on JAX) and run by `kbert.serving` scores pairs and
    ranks documents as the Keras model does, and its directory reloads alone."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    _, model, _ = cross_encoder
    served = serving.from_model(model, "onnx", directory=tmp_path / "served")
    assert isinstance(served, serving.ExportedCrossEncoder)
    pairs = [(QUERY, d) for d in DOCUMENTS]
    expected = model.predict(pairs)
    np.testing.assert_allclose(served.predict(pairs), expected, atol=2e-5)
    keras_ranking, served_ranking = model.rank(QUERY, DOCUMENTS), served.rank(QUERY, DOCUMENTS)
    assert [h["corpus_id"] for h in served_ranking] == [h["corpus_id"] for h in keras_ranking]
    np.testing.assert_allclose(
        [h["score"] for h in served_ranking], [h["score"] for h in keras_ranking], atol=2e-5
    )
    reloaded = serving.load(tmp_path / "served")
    np.testing.assert_allclose(reloaded.predict(pairs[:2]), expected[:2], atol=2e-5)


# ---------------------------------------------------------------------- sparse encoder
def test_sparse_encoder_encode_search_and_splade_loss_equal_transformers(tmp_path):
    """A Hugging Face masked-LM checkpoint as a `BertSparseEncoder`: `encode` gives SciPy CSR
    rows equal to SPLADE written out on `transformers`' masked-LM logits (`max_t log(1 +
    relu(logits[t]))` over real tokens), so their dot products and `retrieval.sparse_search`'s
    ranking are the dense ones; `SpladeLoss` of (query, document) columns equals in-batch
    negatives on dot products plus the FLOPS terms of documents and queries, written out."""
    scipy_sparse = pytest.importorskip("scipy.sparse")
    path, reference = _checkpoint(tmp_path, transformers.BertForMaskedLM)
    model = load_quietly(BertSparseEncoder, path, sequence_length=16)
    texts = [QUERY, "the cat sat", "john smith sings"] + DOCUMENTS
    vectors = model.encode(texts)
    assert scipy_sparse.isspmatrix_csr(vectors) and vectors.dtype == np.float32
    packed = model.preprocessor(texts)
    logits = hf_outputs(reference, packed).logits.numpy().astype("float64")
    real = packed["padding_mask"].astype(bool)[:, :, None]
    expected = np.log1p(np.maximum(np.where(real, logits, -np.inf).max(axis=1), 0.0))
    np.testing.assert_allclose(vectors.toarray(), expected, atol=1e-5, rtol=1e-5)
    assert (vectors.data > 0).all() and 0 < vectors.nnz < 0.9 * np.prod(vectors.shape)
    queries, documents = vectors[:3], vectors[3:]
    dots = expected[:3] @ expected[3:].T
    np.testing.assert_allclose((queries @ documents.T).toarray(), dots, rtol=1e-5)
    scores, indices = retrieval.sparse_search(queries, documents, top_k=3)
    np.testing.assert_array_equal(indices, np.argsort(-dots, axis=1, kind="stable")[:, :3])
    np.testing.assert_allclose(scores, np.sort(dots, axis=1)[:, ::-1][:, :3], rtol=1e-5)

    # The default loss, compiled with regulariser weights large enough to show in the sum.
    assert isinstance(model.loss, SpladeLoss)
    model.compile(loss=SpladeLoss(document_regularizer_weight=0.1, query_regularizer_weight=0.2))
    in_batch = dots[:, :3]  # query i against the documents of the batch; its own is i
    flops = [np.sum(expected[rows].mean(axis=0) ** 2) for rows in (slice(3, 6), slice(0, 3))]
    expected_loss = np.mean(_logsumexp(in_batch, 1) - np.diag(in_batch))
    expected_loss += 0.1 * flops[0] + 0.2 * flops[1]
    loss = model.evaluate((texts[:3], texts[3:6]), batch_size=3, verbose=0, return_dict=True)
    np.testing.assert_allclose(loss["loss"], expected_loss, rtol=1e-4)


# --------------------------------------------------------------------- multiple choice
def test_multiple_choice_equals_transformers_and_follows_the_choice_order(tmp_path):
    """A Hugging Face `BertForMultipleChoice` checkpoint gives the same logits on raw
    (context, choices) rows; a row's choices permuted permute its logits, and a padded choice
    gets the masked logit."""
    path, reference = _checkpoint(tmp_path, transformers.BertForMultipleChoice)
    model = load_quietly(BertMultipleChoice, path, sequence_length=16)
    contexts = ["the cat sat", "john smith lives in", "the cat sat"]
    choices = [["on the mat", "in paris", "very dull"], ["london", "paris"]]
    order = [2, 0, 1]
    choices.append([choices[0][i] for i in order])
    logits = model.predict((contexts, choices), verbose=0)
    for row, (context, options) in enumerate(zip(contexts, choices)):
        packed = model.preprocessor(([context] * len(options), options))
        expected = hf_outputs(reference, {k: v[None] for k, v in packed.items()}).logits
        np.testing.assert_allclose(logits[row, : len(options)], expected.numpy()[0], atol=1e-5)
    assert np.ptp(logits[0]) > 1e-3
    np.testing.assert_allclose(logits[2], logits[0, order], atol=1e-5)
    assert logits[1, 2] < -1e8 and logits[1].argmax() < 2


# ----------------------------------------------------------------------- text embedder
@pytest.fixture(scope="module")
def text_embedder(tmp_path_factory):
    """A Hugging Face `BertModel` checkpoint as a `BertTextEmbedder` (mean pooling), the
    embeddings of QUERY + DOCUMENTS, and `transformers`' model."""
    path, reference = _checkpoint(tmp_path_factory.mktemp("embedder"), transformers.BertModel)
    model = load_quietly(BertTextEmbedder, path, sequence_length=16)
    texts = [QUERY] + DOCUMENTS
    return path, model, reference, texts, model.encode(texts, normalize=True)


def test_text_embedder_encode_is_normalised_mean_pooling_and_search_is_cosine(text_embedder):
    """`encode(normalize=True)` is `transformers`' last hidden state averaged over each
    text's real tokens and L2-normalised; `similarity` and `retrieval.search` rank by that
    cosine."""
    _, model, reference, texts, embeddings = text_embedder
    packed = model.preprocessor(texts)
    sequence = hf_outputs(reference, packed).last_hidden_state.numpy().astype("float64")
    mask = packed["padding_mask"][:, :, None]
    mean = (sequence * mask).sum(axis=1) / mask.sum(axis=1)
    expected = mean / np.linalg.norm(mean, axis=1, keepdims=True)
    np.testing.assert_allclose(embeddings, expected, atol=1e-5)
    cosines = expected[:1] @ expected[1:].T
    similarity = keras.ops.convert_to_numpy(model.similarity(embeddings[:1], embeddings[1:]))
    np.testing.assert_allclose(similarity, cosines, atol=1e-5)
    assert np.ptp(cosines) > 1e-2
    scores, indices = retrieval.search(embeddings[:1], embeddings[1:], top_k=3)
    np.testing.assert_array_equal(indices, np.argsort(-cosines, axis=1, kind="stable")[:, :3])
    np.testing.assert_allclose(scores, np.sort(cosines, axis=1)[:, ::-1][:, :3], atol=1e-5)


def test_quantize_int8_stays_close_to_float_and_is_not_exported(text_embedder):
    """`quantize("int8")` on a twin of the embedder stores int8 kernels and moves the
    embeddings by rounding only (cosine to float >= 0.99, not equal); a serving export of the
    quantized model says to dequantize first."""
    path, _, _, texts, float_embeddings = text_embedder
    model = load_quietly(BertTextEmbedder, path, sequence_length=16)
    model.quantize("int8")
    kernels = [v for v in model.weights if v.path.endswith("/kernel")]
    assert kernels and all(keras.backend.standardize_dtype(v.dtype) == "int8" for v in kernels)
    quantized = model.encode(texts, normalize=True)
    cosines = np.sum(quantized * float_embeddings, axis=1)
    assert cosines.min() > 0.99 and np.abs(quantized - float_embeddings).max() > 1e-6, cosines
    with pytest.raises(ValueError, match="[Dd]equantize"):
        serving.from_model(model, "onnx")
