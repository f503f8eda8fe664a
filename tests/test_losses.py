"""kbert.losses against NumPy formulas and sentence-transformers' losses on the same embeddings."""

import keras
import numpy as np
import pytest

from kbert.losses import (
    BinaryCrossEntropyLoss,
    CoSENTLoss,
    LambdaLoss,
    MatryoshkaLoss,
    MultipleNegativesRankingLoss,
    RerankingMultipleNegativesLoss,
)


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


def test_dot_similarity_and_matryoshka_prefixes_match_numpy():
    """`similarity="dot"` scores raw embeddings (no normalisation); Matryoshka normalises each
    prefix before the inner loss, so a dot-product loss sees unit prefixes."""
    e = _embeddings(columns=3) * 0.3  # norms ~1.2: dot and cosine scores differ by far
    scores = np.einsum("bd,cd->bc", e[:, 0], np.concatenate([e[:, 1], e[:, 2]]))
    expected = np.mean(_logsumexp(20.0 * scores, axis=1) - 20.0 * np.diag(scores[:, :6]))
    dot = MultipleNegativesRankingLoss(similarity="dot")
    np.testing.assert_allclose(_value(dot, np.zeros(6), e), expected, rtol=1e-5)
    assert abs(expected - _mnrl_numpy(e)) > 1.0
    matryoshka = MatryoshkaLoss(dot, [16, 4])
    expected = _mnrl_numpy(e) + _mnrl_numpy(e[..., :4])
    np.testing.assert_allclose(_value(matryoshka, np.zeros(6), e), expected, rtol=1e-5)


def _assert_round_trips(loss, default, y_true, y_pred):
    """`loss` comes back from Keras serialization with its config and value; that value
    differs from `default`'s, so a setting the config drops would show."""
    restored = keras.losses.deserialize(keras.losses.serialize(loss))
    assert type(restored) is type(loss) and restored.get_config() == loss.get_config()
    value = _value(loss, y_true, y_pred)
    np.testing.assert_allclose(_value(restored, y_true, y_pred), value, rtol=1e-6)
    assert abs(_value(default, y_true, y_pred) - value) > 1e-2


def test_configs_round_trip_through_keras_serialization():
    e = _embeddings(columns=2)
    labels = np.array([0.1, 0.9, 0.5, 0.5, 0.0, 1.0], "float32")
    for loss, default in (
        (
            MultipleNegativesRankingLoss(scale=7.0, symmetric=True, similarity="dot"),
            MultipleNegativesRankingLoss(),
        ),
        (CoSENTLoss(scale=3.0), CoSENTLoss()),
        (
            MatryoshkaLoss(CoSENTLoss(scale=5.0), [16, 8], weights=[0.5, 2.0]),
            MatryoshkaLoss(CoSENTLoss(), [16, 8]),
        ),
    ):
        _assert_round_trips(loss, default, labels, e)


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: MultipleNegativesRankingLoss(scale=True), "scale=True"),
        (lambda: CoSENTLoss(scale="20"), "scale='20'"),
        (lambda: MultipleNegativesRankingLoss(similarity="euclidean"), "'euclidean'"),
        (lambda: MatryoshkaLoss("mnrl", [8]), "must be a Keras loss"),
        (lambda: MatryoshkaLoss(CoSENTLoss(), []), r"Received: \[\]"),
        (lambda: MatryoshkaLoss(CoSENTLoss(), [8, 0]), r"Received: \[8, 0\]"),
        (lambda: MatryoshkaLoss(CoSENTLoss(), [True]), r"Received: \[True\]"),
        (lambda: MatryoshkaLoss(CoSENTLoss(), [8.0]), r"Received: \[8.0\]"),
        (lambda: LambdaLoss(k=0), "k=0"),
        (lambda: LambdaLoss(k=True), "k=True"),
        (lambda: LambdaLoss(k=2.5), "k=2.5"),
        (lambda: LambdaLoss(reduction_log="log10"), "'log10'"),
        (lambda: LambdaLoss(sigma=0), "sigma=0"),
        (lambda: BinaryCrossEntropyLoss(pos_weight=-1.0), "pos_weight=-1.0"),
        (lambda: RerankingMultipleNegativesLoss(activation="relu"), "activation='relu'"),
    ],
)
def test_bad_settings(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_one_column_is_refused():
    for loss in (MultipleNegativesRankingLoss(), CoSENTLoss()):
        with pytest.raises(ValueError, match=r"columns >= 2.*\(3, 1, 8\)"):
            loss(np.zeros(3), np.ones((3, 1, 8), "float32"))


# ------------------------------------------------------------------ reranking (cross-encoder)
# Their values against sentence-transformers' are in tests/models/test_cross_encoder.py.
def _logits(batch=5, candidates=4, seed=1):
    return np.random.default_rng(seed).normal(0, 2, (batch, candidates)).astype("float32")


def test_reranking_tanh_activation_matches_numpy():
    logits = _logits()
    activated = 2.0 * np.tanh(logits.astype("float64"))
    expected = np.mean(_logsumexp(activated, axis=1) - activated[:, 0])
    loss = RerankingMultipleNegativesLoss(scale=2.0, activation="tanh")
    np.testing.assert_allclose(_value(loss, np.zeros(5), logits), expected, rtol=1e-5)


def test_lambda_loss_ignores_a_query_without_relevant_documents():
    """A query whose labels are all 0 has no ordered pair and an ideal DCG of 0: it adds
    nothing (its gains are 0, not 0 / 0), so the batch's loss is the other query's."""
    logits = _logits(batch=2, candidates=3)
    labels = np.array([[2.0, 0.0, 1.0], [0.0, 0.0, 0.0]], "float32")
    both = _value(LambdaLoss(), labels, logits)
    alone = _value(LambdaLoss(), labels[:1], logits[:1])
    assert np.isfinite(both) and alone > 0.1
    np.testing.assert_allclose(both, alone, rtol=1e-6)


def test_reranking_configs_round_trip_through_keras_serialization():
    labels = np.array([[3.0, 0.0, 1.0, 2.0]] * 5, "float32")
    logits = _logits()
    _assert_round_trips(
        BinaryCrossEntropyLoss(pos_weight=3.0),
        BinaryCrossEntropyLoss(),
        labels[:, 0] > 1,
        logits[:, :1],
    )
    _assert_round_trips(
        RerankingMultipleNegativesLoss(num_negatives=2, scale=5.0, activation="tanh"),
        RerankingMultipleNegativesLoss(),
        np.zeros(5),
        logits,
    )
    _assert_round_trips(
        LambdaLoss(k=2, sigma=0.5, mu=3.0, reduction_log="natural", activation="sigmoid"),
        LambdaLoss(),
        labels,
        logits,
    )
    num_negatives = RerankingMultipleNegativesLoss(num_negatives=7).get_config()["num_negatives"]
    assert num_negatives == 7  # read by BertCrossEncoder.fit to build the groups


def test_reranking_losses_refuse_logits_that_are_not_a_matrix():
    for loss in (RerankingMultipleNegativesLoss(), LambdaLoss()):
        with pytest.raises(ValueError, match=r"\(batch_size, .*Received shape \(4,\)"):
            loss(np.zeros(4), np.zeros(4, "float32"))
