"""kbert.tracking: the loss of every step, dev scores per epoch, metrics.json and the curve PNG."""

import json

import keras
import numpy as np
import pytest

from kbert.tracking import EpochEvaluation, StepLossHistory, plot_training_curve, write_run_report

BATCH, NUM_BATCHES = 4, 5


def _frozen_linear_fit(callbacks, epochs=2):
    """Fits a linear model with learning rate 0, so every step's loss is its batch's loss under
    the initial weights; returns the data and those weights."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH * NUM_BATCHES, 3)).astype("float32")
    y = rng.normal(size=(BATCH * NUM_BATCHES, 1)).astype("float32")
    dense = keras.layers.Dense(1)
    model = keras.Sequential([keras.Input((3,)), dense])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.0), loss="mse")
    model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, callbacks=callbacks, verbose=0)
    kernel, bias = dense.get_weights()
    return x, y, kernel, bias


def test_step_loss_history_recovers_the_loss_of_every_step():
    history = StepLossHistory()
    x, y, kernel, bias = _frozen_linear_fit([history])
    per_batch = [
        float(np.mean((x[i : i + BATCH] @ kernel + bias - y[i : i + BATCH]) ** 2))
        for i in range(0, len(x), BATCH)
    ]
    # Keras logs the running mean of the epoch; the history holds each step's own loss.
    np.testing.assert_allclose(history.step_loss, per_batch * 2, rtol=1e-4, atol=1e-6)
    assert len(history.epochs) == 2
    np.testing.assert_allclose(history.epochs[0]["loss"], np.mean(per_batch), rtol=1e-5)


def test_epoch_evaluation_records_the_scores_and_the_step_of_every_epoch():
    seen = []

    def evaluate(model):
        seen.append(model)
        return {"score": np.float32(0.25 * len(seen))}

    evaluation = EpochEvaluation(evaluate, verbose=False)
    _frozen_linear_fit([evaluation], epochs=3)
    assert evaluation.evaluations == [
        {"step": NUM_BATCHES, "score": 0.25},
        {"step": 2 * NUM_BATCHES, "score": 0.5},
        {"step": 3 * NUM_BATCHES, "score": 0.75},
    ]
    assert all(isinstance(e["score"], float) for e in evaluation.evaluations)
    assert isinstance(seen[0], keras.Model)


def test_epoch_evaluation_rejects_what_is_not_a_function_or_not_scores():
    with pytest.raises(ValueError, match="Received: evaluate=0.5"):
        EpochEvaluation(0.5)
    with pytest.raises(
        ValueError, match="must map metric names to numbers. Received: {'f1': 'high'}"
    ):
        _frozen_linear_fit([EpochEvaluation(lambda model: {"f1": "high"}, verbose=False)], epochs=1)


def test_report_records_the_run_and_adds_the_final_metrics_once(tmp_path):
    metrics = {"accuracy": np.float64(0.75), "note": "short run"}
    metrics_path, curve_path = write_run_report(
        tmp_path / "run",
        "glue/sst2",
        metrics,
        step_loss=[0.7, 0.65, 0.6, 0.5],
        epoch_logs=[{"loss": 0.61}],
        evaluations=[{"step": 2, "accuracy": 0.6}],
        baseline=("majority class", {"accuracy": 0.51}),
        arguments={"task": "sst2", "articles": (0, 32)},
        extra={"train_examples": np.int64(16)},
    )
    record = json.loads(metrics_path.read_text())
    assert record["application"] == "glue/sst2"
    assert record["backend"] == keras.backend.backend()
    assert record["metrics"] == {"accuracy": 0.75, "note": "short run"}
    assert record["train_steps"] == 4 and record["step_loss"] == [0.7, 0.65, 0.6, 0.5]
    assert record["epochs"] == [{"loss": 0.61}]
    # The final score was not the last evaluation: it is added at the last step.
    assert record["evaluations"] == [{"step": 2, "accuracy": 0.6}, {"step": 4, "accuracy": 0.75}]
    assert record["baseline"] == {"name": "majority class", "accuracy": 0.51}
    assert record["arguments"] == {"task": "sst2", "articles": [0, 32]}
    assert record["train_examples"] == 16

    # Already the last evaluation: not added twice.
    metrics_path, _ = write_run_report(
        tmp_path / "run",
        "x",
        {"accuracy": 0.6},
        step_loss=[1.0, 0.9],
        evaluations=[{"step": 2, "accuracy": 0.6}],
    )
    assert json.loads(metrics_path.read_text())["evaluations"] == [{"step": 2, "accuracy": 0.6}]


def test_curve_is_a_png_of_the_stated_size_drawn_without_changing_matplotlib(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.image

    backend = matplotlib.get_backend()
    _, curve_path = write_run_report(
        tmp_path,
        "pretrain",
        {"loss": 3.5},
        step_loss=list(np.linspace(7, 3.5, 60)),
    )
    assert curve_path == tmp_path / "training_curve.png"
    image = matplotlib.image.imread(curve_path)
    assert image.shape[:2] == (420, 1100)  # 11 x 4.2 inches at 100 dpi
    assert image.std() > 0  # Something is drawn.
    assert matplotlib.get_backend() == backend  # No pyplot: the user's backend is left alone.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json", "training_curve.png"]

    path = plot_training_curve(
        tmp_path / "alone.png", "t", [], evaluations=[{"step": 0, "f1": 0.0}]
    )
    assert path.read_bytes().startswith(b"\x89PNG")


def test_a_failed_report_leaves_the_previous_one_whole(tmp_path):
    write_run_report(tmp_path, "first", {"f1": 0.5}, plot=False)
    before = (tmp_path / "metrics.json").read_text()
    with pytest.raises(TypeError, match="object is not JSON serializable"):
        write_run_report(tmp_path, "second", {"f1": 0.6}, extra={"bad": object()}, plot=False)
    assert (tmp_path / "metrics.json").read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]  # No temporary file left.


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"metrics": [0.5]},
            "`metrics` must be a dict of metric name to value. Received: \\[0.5\\]",
        ),
        (
            {"baseline": ("chance", 0.0)},
            "`baseline` must be a pair .* Received: baseline=\\('chance', 0.0\\)",
        ),
        ({"evaluations": [{"f1": 0.3}]}, "Every evaluation needs a 'step'. Received: {'f1': 0.3}"),
    ],
)
def test_report_rejects_malformed_input(tmp_path, kwargs, message):
    arguments = {"metrics": {"f1": 0.5}, **kwargs}
    with pytest.raises(ValueError, match=message):
        write_run_report(tmp_path, "run", arguments.pop("metrics"), plot=False, **arguments)
    assert not (tmp_path / "metrics.json").exists()
