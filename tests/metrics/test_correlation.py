"""Pearson / Spearman: plain functions against scipy.stats, Keras metrics
against the float64 functions over several batches and after reset_state."""

import keras
import numpy as np
import pytest
import scipy.stats

from kbert.metrics import (
    PearsonCorrelation,
    SpearmanCorrelation,
    average_ranks,
    pearson_corr,
    spearman_corr,
)


def _sts_like(seed, n=60):
    """Gold scores on a 0-5 grid (many ties) and noisy predictions."""
    rng = np.random.default_rng(seed)
    gold = np.round(rng.uniform(0, 5, n) * 5) / 5
    pred = gold + rng.normal(scale=1.0, size=n)
    return gold, pred


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_functions_match_scipy(seed):
    gold, pred = _sts_like(seed)
    assert pearson_corr(gold, pred) == pytest.approx(
        scipy.stats.pearsonr(gold, pred).statistic, abs=1e-12
    )
    assert spearman_corr(gold, pred) == pytest.approx(
        scipy.stats.spearmanr(gold, pred).statistic, abs=1e-12
    )
    np.testing.assert_array_equal(average_ranks(gold), scipy.stats.rankdata(gold, method="average"))


def test_function_edge_cases():
    # Constant input: scipy gives nan, kbert documents 0.0.
    assert pearson_corr([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]) == 0.0
    assert spearman_corr([1.0, 2.0, 3.0], [5.0, 5.0, 5.0]) == 0.0
    assert pearson_corr([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="same number of values"):
        pearson_corr([1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="at least 2"):
        spearman_corr([1.0], [1.0])
    with pytest.raises(ValueError, match="NaN"):
        pearson_corr([1.0, np.nan], [1.0, 2.0])


def test_pearson_metric_accumulates_resets_and_weights():
    metric = PearsonCorrelation()
    for seed in (3, 4):  # second pass checks reset_state
        gold, pred = _sts_like(seed, n=39)
        for start, stop in ((0, 7), (7, 23), (23, 24), (24, 39)):
            metric.update_state(gold[start:stop, None], pred[start:stop, None])
        np.testing.assert_allclose(float(metric.result()), pearson_corr(gold, pred), atol=2e-6)
        metric.reset_state()
    assert float(metric.result()) == 0.0
    # Integer weights equal repeating the examples.
    gold, pred = _sts_like(5, n=16)
    weights = np.random.default_rng(5).integers(0, 3, 16).astype("float32")
    metric.update_state(gold, pred, sample_weight=weights)
    repeated = np.repeat(np.arange(16), weights.astype(int))
    np.testing.assert_allclose(
        float(metric.result()), pearson_corr(gold[repeated], pred[repeated]), atol=2e-6
    )


def test_pearson_metric_is_stable_with_large_offset():
    # Naive float32 sums (sum x^2 - n mean^2) lose every digit here.
    rng = np.random.default_rng(6)
    gold = 3000.0 + rng.normal(size=64)
    pred = 3000.0 + gold - 3000.0 + rng.normal(scale=0.5, size=64)
    metric = PearsonCorrelation()
    for start in range(0, 64, 16):
        metric.update_state(gold[start : start + 16], pred[start : start + 16])
    np.testing.assert_allclose(float(metric.result()), pearson_corr(gold, pred), atol=1e-4)


def test_perfectly_correlated_inputs_stay_within_one_and_sizes_must_match():
    # Rounding puts the raw quotient of an exact linear relation just above 1 for many inputs
    # (14 of these 40 for the function); the functions and the metrics clip it.
    rng = np.random.default_rng(11)
    pearson = PearsonCorrelation()
    for _ in range(40):
        x = rng.normal(size=int(rng.integers(5, 40))) * 100.0
        assert 1.0 - 1e-12 <= pearson_corr(x, 3.0 * x + 1.0) <= 1.0
        assert -1.0 <= pearson_corr(x, -7.3 * x) <= -1.0 + 1e-12
        pearson.reset_state()
        pearson.update_state(x, 3.0 * x + 1.0)
        assert 1.0 - 1e-6 <= float(pearson.result()) <= 1.0
    with pytest.raises(ValueError, match="one prediction per label"):
        PearsonCorrelation().update_state(np.ones(3), np.ones(2))


def test_spearman_metric_accumulates_resets_and_overflows():
    metric = SpearmanCorrelation(capacity=64)
    for seed in (7, 8):
        gold, pred = _sts_like(seed, n=39)
        pred = np.round(pred, 1)  # ties in the predictions too
        for start, stop in ((0, 16), (16, 32), (32, 39)):
            metric.update_state(gold[start:stop], pred[start:stop, None])
        np.testing.assert_allclose(
            float(metric.result()),
            scipy.stats.spearmanr(gold, pred).statistic,
            atol=1e-6,
        )
        metric.reset_state()
    gold, pred = _sts_like(9, n=39)
    for _ in range(4):
        metric.update_state(gold[:16], pred[:16])
    np.testing.assert_allclose(  # exactly full: 4 copies, same ranking
        float(metric.result()), scipy.stats.spearmanr(gold[:16], pred[:16]).statistic, atol=1e-6
    )
    metric.update_state(gold[:1], pred[:1])  # 65 > capacity 64
    assert np.isnan(float(metric.result()))
    metric.update_state(gold[:7], pred[:7])
    assert np.isnan(float(metric.result()))
    with pytest.raises(ValueError, match="sample_weight"):
        metric.update_state(gold, pred, sample_weight=np.ones(39))
    with pytest.raises(ValueError, match="capacity"):
        SpearmanCorrelation(capacity=1)
    restored = SpearmanCorrelation.from_config(metric.get_config())
    assert restored.capacity == 64


def test_correlation_metrics_in_compile_and_evaluate():
    rng = np.random.default_rng(10)
    features = rng.normal(size=(40, 4)).astype("float32")
    target = (features @ np.array([1.0, -0.5, 0.2, 0.0]) + rng.normal(size=40)).astype("float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(
        optimizer="sgd",
        loss="mse",
        metrics=[PearsonCorrelation(), SpearmanCorrelation(capacity=128)],
    )
    results = model.evaluate(features, target, batch_size=16, verbose=0, return_dict=True)
    pred = keras.ops.convert_to_numpy(model(features))[:, 0]
    np.testing.assert_allclose(
        results["pearson_correlation"], pearson_corr(target, pred), atol=2e-6
    )
    np.testing.assert_allclose(
        results["spearman_correlation"], spearman_corr(target, pred), atol=1e-6
    )
