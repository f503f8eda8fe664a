"""kbert.losses against NumPy formulas and sentence-transformers' losses on the same embeddings."""

import keras
import numpy as np
import pytest

from kbert.losses import CoSENTLoss, MatryoshkaLoss, MultipleNegativesRankingLoss


def _normalize(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _logsumexp(x, axis=None):
    top = np.max(x, axis=axis, keepdims=True)
    return np.squeeze(top, axis=axis) + np.log(np.sum(np.exp(x - top), axis=axis))


def _mnrl_numpy(embeddings, scale=20.0, symmetric=False):
    e = _normalize(embeddings.astype("float64"))
    anchors = e[:, 0]
    candidates = np.concatenate([e[:, c] for c in range(1, e.shape[1])], axis=0)
    scores = scale * anchors @ candidates.T
    batch = len(anchors)
    positive = scores[np.arange(batch), np.arange(batch)]
    forward = _logsumexp(scores, axis=1)
    if not symmetric:
        return np.mean(forward - positive)
    backward = _logsumexp(scores[:, :batch], axis=0)
    return np.mean((forward + backward) / 2 - positive)


def _cosent_numpy(embeddings, labels, scale=20.0):
    e = _normalize(embeddings.astype("float64"))
    s = scale * np.sum(e[:, 0] * e[:, 1], axis=-1)
    terms = [0.0] + [
        s[i] - s[j] for i in range(len(s)) for j in range(len(s)) if labels[i] < labels[j]
    ]
    return _logsumexp(np.array(terms))


def _embeddings(batch=6, columns=3, dim=16, seed=0):
    # Spread-out vectors: the loss values are far from any degenerate case.
    return np.random.default_rng(seed).normal(size=(batch, columns, dim)).astype("float32")


def _value(loss, y_true, y_pred):
    return float(keras.ops.convert_to_numpy(loss(y_true, y_pred)))


@pytest.mark.parametrize("columns", [2, 3])
@pytest.mark.parametrize("symmetric", [False, True])
def test_mnrl_matches_numpy(columns, symmetric):
    e = _embeddings(columns=columns)
    expected = _mnrl_numpy(e, symmetric=symmetric)
    actual = _value(MultipleNegativesRankingLoss(symmetric=symmetric), np.zeros(6), e)
    np.testing.assert_allclose(actual, expected, rtol=1e-5)


def test_cosent_matches_numpy():
    e = _embeddings(columns=2)
    labels = np.array([0.1, 0.9, 0.5, 0.5, 0.0, 1.0], "float32")
    np.testing.assert_allclose(_value(CoSENTLoss(), labels, e), _cosent_numpy(e, labels), rtol=1e-5)


def test_matryoshka_matches_numpy():
    e = _embeddings(columns=2)
    loss = MatryoshkaLoss(MultipleNegativesRankingLoss(), [16, 8, 4], weights=[1.0, 0.5, 2.0])
    expected = sum(w * _mnrl_numpy(e[..., :d]) for d, w in ((16, 1.0), (8, 0.5), (4, 2.0)))
    np.testing.assert_allclose(_value(loss, np.zeros(6), e), expected, rtol=1e-5)
    restored = MatryoshkaLoss.from_config(loss.get_config())
    np.testing.assert_allclose(_value(restored, np.zeros(6), e), expected, rtol=1e-5)


def test_losses_equal_sentence_transformers():
    """The same embeddings through sentence-transformers' own loss classes, built with their
    public constructors (the model they take is only held; `compute_loss_from_embeddings`
    reads the given embeddings)."""
    pytest.importorskip("sentence_transformers")
    torch = pytest.importorskip("torch")
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import losses as st_losses
    from sentence_transformers.sentence_transformer.modules import Pooling

    e = _embeddings(columns=3)
    columns = [torch.tensor(e[:, c]) for c in range(3)]
    labels = torch.zeros(6)
    model = SentenceTransformer(modules=[Pooling(e.shape[-1])], device="cpu")

    def reference(loss, embeddings, targets):
        with torch.no_grad():
            return float(loss.compute_loss_from_embeddings(embeddings, targets))

    np.testing.assert_allclose(
        _value(MultipleNegativesRankingLoss(), np.zeros(6), e),
        reference(st_losses.MultipleNegativesRankingLoss(model), columns, labels),
        rtol=1e-5,
    )
    symmetric = st_losses.MultipleNegativesRankingLoss(
        model, directions=("query_to_doc", "doc_to_query"), partition_mode="per_direction"
    )
    np.testing.assert_allclose(
        _value(MultipleNegativesRankingLoss(symmetric=True), np.zeros(6), e),
        reference(symmetric, columns, labels),
        rtol=1e-5,
    )
    scores = np.array([0.1, 0.9, 0.5, 0.5, 0.0, 1.0], "float32")
    expected = reference(st_losses.CoSENTLoss(model), columns[:2], torch.tensor(scores))
    np.testing.assert_allclose(_value(CoSENTLoss(), scores, e[:, :2]), expected, rtol=1e-5)


def test_bad_input():
    with pytest.raises(ValueError, match="positive number"):
        MultipleNegativesRankingLoss(scale=0)
    with pytest.raises(ValueError, match="columns >= 2"):
        MultipleNegativesRankingLoss()(np.zeros(3), np.zeros((3, 8)))
    with pytest.raises(ValueError, match="one entry per dimension"):
        MatryoshkaLoss(CoSENTLoss(), [8, 4], weights=[1.0])
    with pytest.raises(ValueError, match=r"exceed the embedding size 16"):
        MatryoshkaLoss(CoSENTLoss(), [32])(np.zeros(6), _embeddings(columns=2))
