"""Accuracy, F1 and MCC: plain functions against independent formulas, and
the Keras metrics against the plain functions over several batches, after
`reset_state`, and inside `compile` / `fit` / `evaluate` on each backend."""

import keras
import numpy as np
import pytest
import scipy.stats

from kbert.metrics import (
    Accuracy,
    F1Score,
    MatthewsCorrelation,
    accuracy,
    f1_score,
    matthews_corrcoef,
)


def _reference_f1_per_class(y_true, y_pred, label):
    """F1 through precision and recall (sklearn's route), 0 where undefined."""
    predicted = np.sum(y_pred == label)
    actual = np.sum(y_true == label)
    hits = np.sum((y_pred == label) & (y_true == label))
    precision = hits / predicted if predicted else 0.0
    recall = hits / actual if actual else 0.0
    if precision + recall == 0:
        return 0.0
    return 2 * precision * recall / (precision + recall)


def _reference_mcc(y_true, y_pred):
    """MCC as a correlation of one-hot indicator matrices (Gorodkin 2004)."""
    labels = np.unique(np.concatenate([y_true, y_pred]))
    x = (y_true[:, None] == labels[None, :]).astype(float)
    y = (y_pred[:, None] == labels[None, :]).astype(float)
    xc, yc = x - x.mean(0), y - y.mean(0)
    denominator = np.sqrt(np.sum(xc * xc) * np.sum(yc * yc))
    return float(np.sum(xc * yc) / denominator) if denominator else 0.0


# --------------------------------------------------------------- functions


def test_accuracy_labels_and_scores():
    rng = np.random.default_rng(0)
    y_true = rng.integers(0, 3, 50)
    scores = rng.normal(size=(50, 3))
    expected = np.count_nonzero(scores.argmax(-1) == y_true) / 50
    assert accuracy(y_true, scores) == pytest.approx(expected)
    assert accuracy(y_true, scores.argmax(-1)) == pytest.approx(expected)
    assert accuracy(["a", "b", "b"], ["a", "a", "b"]) == pytest.approx(2 / 3)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_f1_binary_matches_precision_recall_route(seed):
    rng = np.random.default_rng(seed)
    y_true = rng.integers(0, 2, 40)
    y_pred = np.where(rng.random(40) < 0.7, y_true, 1 - y_true)
    expected = _reference_f1_per_class(y_true, y_pred, 1)
    assert f1_score(y_true, y_pred) == pytest.approx(expected, abs=1e-12)
    expected0 = _reference_f1_per_class(y_true, y_pred, 0)
    assert f1_score(y_true, y_pred, pos_label=0) == pytest.approx(expected0)
    assert expected != pytest.approx(expected0)  # pos_label matters here


def test_f1_hand_values_and_zero_division():
    # TP=2, FP=1, FN=1 -> P=R=2/3 -> F1=2/3.
    assert f1_score([0, 1, 1, 0, 1], [0, 1, 0, 1, 1]) == pytest.approx(2 / 3)
    # No positive anywhere: 0, as sklearn with zero_division=0.
    assert f1_score([0, 0, 0], [0, 0, 0]) == 0.0


def test_f1_macro_matches_per_class_mean():
    rng = np.random.default_rng(3)
    y_true = rng.integers(0, 4, 60)
    y_pred = np.where(rng.random(60) < 0.5, y_true, rng.integers(0, 5, 60))
    labels = np.union1d(y_true, y_pred)
    expected = np.mean([_reference_f1_per_class(y_true, y_pred, c) for c in labels])
    assert f1_score(y_true, y_pred, average="macro") == pytest.approx(expected)
    # String labels work too; an explicit label list restricts the mean.
    names = np.array(["neg", "neu", "pos", "x", "y"])
    assert f1_score(names[y_true], names[y_pred], average="macro") == pytest.approx(expected)
    expected_01 = np.mean([_reference_f1_per_class(y_true, y_pred, c) for c in (0, 1)])
    assert f1_score(y_true, y_pred, average="macro", labels=[0, 1]) == pytest.approx(expected_01)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_mcc_binary_is_phi_coefficient(seed):
    rng = np.random.default_rng(seed)
    y_true = rng.integers(0, 2, 80)
    y_pred = np.where(rng.random(80) < 0.75, y_true, 1 - y_true)
    phi = scipy.stats.pearsonr(y_true, y_pred).statistic
    assert matthews_corrcoef(y_true, y_pred) == pytest.approx(phi, abs=1e-12)


def test_mcc_hand_value_multiclass_and_degenerate():
    # TP=2 TN=2 FP=0 FN=1: (4 - 0) / sqrt(2 * 3 * 3 * 2) = 2/3.
    assert matthews_corrcoef([1, 1, 0, 0, 1], [1, 0, 0, 0, 1]) == pytest.approx(2 / 3)
    rng = np.random.default_rng(5)
    y_true = rng.integers(0, 4, 70)
    y_pred = np.where(rng.random(70) < 0.6, y_true, rng.integers(0, 4, 70))
    assert matthews_corrcoef(y_true, y_pred) == pytest.approx(
        _reference_mcc(y_true, y_pred), abs=1e-12
    )
    assert matthews_corrcoef([0, 1, 1], [1, 1, 1]) == 0.0  # constant prediction
    assert matthews_corrcoef([0, 1], [1, 0]) == pytest.approx(-1.0)


def test_function_errors():
    with pytest.raises(ValueError, match="same shape"):
        accuracy([0, 1, 1], [0, 1])
    with pytest.raises(ValueError, match="at most two distinct labels"):
        f1_score([0, 1, 2], [0, 1, 1])
    with pytest.raises(ValueError, match="average"):
        f1_score([0, 1], [0, 1], average="micro")
    with pytest.raises(ValueError, match="at least one example"):
        matthews_corrcoef([], [])
    # Only float scores are arg-maxed; integer ids with an extra axis are a shape error.
    with pytest.raises(ValueError, match="same shape"):
        accuracy([0, 1], [[0, 1], [1, 0]])
    # A label asked for but absent everywhere scores 0 (zero_division=0) and stays in the mean.
    assert f1_score([0, 1], [0, 1], average="macro", labels=[0, 1, 2]) == pytest.approx(2 / 3)


# ------------------------------------------------------------ Keras metrics


def _batches(rng, sizes, num_classes):
    for size in sizes:
        labels = rng.integers(0, num_classes, size)
        logits = rng.normal(size=(size, num_classes)).astype("float32")
        logits[np.arange(size), labels] += rng.random(size) * 1.5  # some skill
        yield labels, logits


@pytest.mark.parametrize(
    "metric_fn, function",
    [
        (lambda: Accuracy(num_classes=3), accuracy),
        (
            lambda: F1Score(num_classes=3, average="macro"),
            lambda t, p: f1_score(t, p, average="macro"),
        ),
        (lambda: MatthewsCorrelation(num_classes=3), matthews_corrcoef),
    ],
    ids=["accuracy", "macro_f1", "mcc"],
)
def test_keras_metric_accumulates_and_resets(metric_fn, function):
    rng = np.random.default_rng(7)
    metric = metric_fn()
    for _ in range(2):  # second pass checks reset_state
        labels, logits = zip(*_batches(rng, [7, 16, 1], 3))
        for y, p in zip(labels, logits):
            metric.update_state(y, p)
        expected = function(np.concatenate(labels), np.concatenate(logits))
        np.testing.assert_allclose(float(metric.result()), expected, atol=1e-6)
        metric.reset_state()
    assert float(metric.result()) == 0.0


def test_binary_single_score_threshold_and_label_shapes():
    rng = np.random.default_rng(8)
    y_true = rng.integers(0, 2, (23, 1))
    logit = rng.normal(size=(23, 1)).astype("float32") + (y_true - 0.5)
    predicted = (logit[:, 0] > 0.0).astype(int)
    metric = F1Score(threshold=0.0)
    metric.update_state(y_true[:7], logit[:7])
    metric.update_state(y_true[7:], logit[7:])
    np.testing.assert_allclose(float(metric.result()), f1_score(y_true[:, 0], predicted), atol=1e-6)
    mcc = MatthewsCorrelation()
    probabilities = 1 / (1 + np.exp(-logit[:, 0]))
    mcc.update_state(y_true[:7, 0], probabilities[:7])
    mcc.update_state(y_true[7:, 0], probabilities[7:])
    np.testing.assert_allclose(
        float(mcc.result()), matthews_corrcoef(y_true[:, 0], predicted), atol=1e-6
    )


def test_sample_weight_equals_repetition_and_padding_is_skipped():
    rng = np.random.default_rng(9)
    labels = rng.integers(0, 2, 16)
    logits = rng.normal(size=(16, 2)).astype("float32")
    weights = rng.integers(0, 3, 16)
    metric = MatthewsCorrelation()
    metric.update_state(labels, logits, sample_weight=weights.astype("float32"))
    repeated = np.repeat(np.arange(16), weights)
    np.testing.assert_allclose(
        float(metric.result()),
        matthews_corrcoef(labels[repeated], logits[repeated]),
        atol=1e-6,
    )
    # Token level: (batch, seq) labels with -100 padding are skipped.
    token_labels = rng.integers(0, 3, (4, 6))
    token_labels[:, 4:] = -100
    token_logits = rng.normal(size=(4, 6, 3)).astype("float32")
    acc = Accuracy(num_classes=3)
    acc.update_state(token_labels, token_logits)
    keep = token_labels != -100
    np.testing.assert_allclose(
        float(acc.result()),
        accuracy(token_labels[keep], token_logits[keep]),
        atol=1e-6,
    )


def test_keras_metrics_on_ids_thresholds_unseen_classes_and_pos_label():
    y_true = np.array([0, 1, 2, 0, 2, 1])
    # Integer predictions are class ids (with three classes there is nothing to threshold);
    # one outside [0, num_classes) is never a correct class.
    ids = np.array([0, 2, 2, 0, 1, 1])
    acc = Accuracy(num_classes=3)
    acc.update_state(y_true, ids)
    assert float(acc.result()) == pytest.approx(accuracy(y_true, ids))
    # Ids outside [0, num_classes) are wrong whatever the label: one class of their own, as
    # the plain functions read them.
    out = np.array([0, 3, 2, 3, 2, 1])
    for metric, function in (
        (Accuracy(num_classes=3), accuracy),
        (F1Score(num_classes=3, average="macro"), lambda t, p: f1_score(t, p, average="macro")),
        (MatthewsCorrelation(num_classes=3), matthews_corrcoef),
    ):
        metric.update_state(y_true[:3], out[:3])
        metric.update_state(y_true[3:], out[3:])
        assert float(metric.result()) == pytest.approx(function(y_true, out)), metric.name
    binary = F1Score()
    binary.update_state([1, 1, 0], np.array([1, 5, 0]))
    assert float(binary.result()) == pytest.approx(2 / 3)  # The 5 is a missed positive.
    # A single score equal to the threshold is not above it: class 0.
    f1 = F1Score(threshold=0.5)
    f1.update_state([1, 1], np.array([[0.5], [0.9]], "float32"))
    assert float(f1.result()) == pytest.approx(f1_score([1, 1], [0, 1]))
    # Macro F1 leaves out classes neither seen nor predicted, as the function does.
    scores = np.eye(4, dtype="float32")[[0, 1, 2, 0, 1, 1]]
    macro = F1Score(num_classes=4, average="macro")
    macro.update_state(y_true, scores)
    expected = f1_score(y_true, [0, 1, 2, 0, 1, 1], average="macro")
    assert float(macro.result()) == pytest.approx(expected) and expected > 0.5
    # pos_label picks the class whose F1 is reported.
    labels, logits = np.array([0, 0, 1, 0, 1]), np.eye(2, dtype="float32")[[0, 1, 1, 1, 1]]
    negative = F1Score(pos_label=0)
    negative.update_state(labels, logits)
    assert float(negative.result()) == pytest.approx(f1_score(labels, logits, pos_label=0))
    assert f1_score(labels, logits, pos_label=0) != pytest.approx(f1_score(labels, logits))
    # A (batch, 1) sample weight is the (batch,) one.
    weights = np.array([1.0, 0.0, 2.0, 1.0, 1.0], "float32")
    column, flat = MatthewsCorrelation(), MatthewsCorrelation()
    column.update_state(labels, logits, sample_weight=weights[:, None])
    flat.update_state(labels, logits, sample_weight=weights)
    assert float(column.result()) == pytest.approx(float(flat.result()))


def test_keras_metric_errors_and_config():
    with pytest.raises(ValueError, match="num_classes"):
        Accuracy(num_classes=1)
    with pytest.raises(ValueError, match="average"):
        F1Score(average="weighted")
    with pytest.raises(ValueError, match="pos_label"):
        F1Score(num_classes=2, pos_label=2)
    with pytest.raises(ValueError, match="class scores"):
        Accuracy(num_classes=3).update_state([0, 1], np.zeros((2, 4), "float32"))
    metric = F1Score(num_classes=4, average="macro", name="f1_macro")
    clone = F1Score.from_config(metric.get_config())
    assert clone.get_config() == metric.get_config()
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(metric))
    assert isinstance(restored, F1Score) and restored.average == "macro"
    metric = F1Score(pos_label=0, threshold=0.2)
    clone = F1Score.from_config(metric.get_config())
    assert (clone.pos_label, clone.threshold) == (0, 0.2)


def test_metrics_in_compile_fit_and_evaluate():
    rng = np.random.default_rng(10)
    features = rng.normal(size=(40, 5)).astype("float32")
    labels = (features[:, 0] + 0.5 * rng.normal(size=40) > 0).astype("int32")
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(2)])
    model.compile(
        optimizer="sgd",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[Accuracy(), F1Score(), MatthewsCorrelation()],
    )
    history = model.fit(features, labels, batch_size=16, epochs=1, verbose=0)
    assert set(history.history) >= {"accuracy", "f1", "matthews_correlation"}
    results = model.evaluate(features, labels, batch_size=16, verbose=0, return_dict=True)
    logits = keras.ops.convert_to_numpy(model(features))
    np.testing.assert_allclose(results["accuracy"], accuracy(labels, logits), atol=1e-6)
    np.testing.assert_allclose(results["f1"], f1_score(labels, logits), atol=1e-6)
    np.testing.assert_allclose(
        results["matthews_correlation"], matthews_corrcoef(labels, logits), atol=1e-6
    )
