"""Record a training run: the loss of every step, dev scores, `metrics.json` and a curve PNG.

Keras' `History` keeps one figure per epoch, and its per-batch logs hold the running mean of the
epoch so far, not the loss of the step. `StepLossHistory` recovers the loss of every step from
those running means; `EpochEvaluation` scores held-out data at every epoch end with a function
of the model; `write_run_report` writes both, with the final metrics and the settings of the
run, to `metrics.json` and draws them in `training_curve.png`. The applications
(`applications/glue.py`, `ner.py`, `squad.py`, `pretrain.py`) record their runs with it.

Example:

```python
history = kbert.tracking.StepLossHistory()
evaluation = kbert.tracking.EpochEvaluation(
    lambda model: {"accuracy": float(np.mean(model.predict(x_dev).argmax(-1) == y_dev))}
)
classifier.fit(x, y, epochs=2, callbacks=[history, evaluation])
final = {k: v for k, v in evaluation.evaluations[-1].items() if k != "step"}
kbert.tracking.write_run_report(
    "runs/sst2", "glue/sst2", final,
    step_loss=history.step_loss, evaluations=evaluation.evaluations,
    baseline=("majority class", {"accuracy": 0.51}),
)
```
"""

import json
import math
import numbers
import warnings
from pathlib import Path

import keras

from kbert import processes
from kbert.checkpoints.atomic import atomic_file


class StepLossHistory(keras.callbacks.Callback):
    """Keeps the training loss of every step and the logs of every epoch.

    Keras passes `on_train_batch_end` the running mean of the loss over the epoch so far;
    the loss of step `n` of an epoch is `n * mean_n - (n - 1) * mean_(n-1)`.

    Attributes:
        step_loss: list of float. The loss of every training step, in order, over all epochs.
        epochs: list of dict. The logs Keras gives at each epoch end (float values).
    """

    def __init__(self):
        super().__init__()
        self.step_loss = []
        self.epochs = []
        self._previous_mean = 0.0
        self._batches = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._previous_mean, self._batches = 0.0, 0

    def on_train_batch_end(self, batch, logs=None):
        if not logs or "loss" not in logs:
            return
        mean = float(logs["loss"])
        self._batches += 1
        self.step_loss.append(mean * self._batches - self._previous_mean * (self._batches - 1))
        self._previous_mean = mean

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append({k: float(v) for k, v in (logs or {}).items()})


class EpochEvaluation(keras.callbacks.Callback):
    """Scores held-out data at the end of every epoch with `evaluate(model)`.

    Args:
        evaluate: callable. Takes the model being trained and returns a dict of metric name
            to float (for instance the task's scores of `model.predict` on a dev set).
        verbose: bool. Print the scores after each epoch. Defaults to `True`.

    Attributes:
        evaluations: list of dict. One `{"step": int, name: float, ...}` per epoch, `step`
            being the number of training steps run so far (the x axis of the curve
            `write_run_report` draws).
    """

    def __init__(self, evaluate, verbose=True):
        super().__init__()
        if not callable(evaluate):
            raise ValueError(
                "`evaluate` must be a function of the model returning a dict of metrics. "
                f"Received: evaluate={evaluate!r}"
            )
        self.evaluate = evaluate
        self.verbose = verbose
        self.evaluations = []
        self._steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self._steps += 1

    def on_epoch_end(self, epoch, logs=None):
        scores = self.evaluate(self.model)
        _check_metrics(scores, "the result of `evaluate(model)`")
        self.evaluations.append({"step": self._steps, **{k: float(v) for k, v in scores.items()}})
        if self.verbose:
            print("  dev: " + ", ".join(f"{k} {v:.4f}" for k, v in scores.items()))


def write_run_report(
    directory,
    name,
    metrics,
    *,
    step_loss=(),
    epoch_logs=(),
    evaluations=None,
    baseline=None,
    arguments=None,
    extra=None,
    plot=True,
    evaluation_label="dev",
    plot_metrics=None,
):
    """Writes `metrics.json` and `training_curve.png` of a run into `directory`.

    Each file is written to a temporary sibling and renamed over the old one, so an
    interruption never leaves half a file. The figure has two panels on honest axes: the
    loss of every step (and its moving mean) from 0 up, and each dev metric at every
    evaluation against the training step, on its full range (`[0, 1]` for scores), with the
    `baseline` as a dashed line; the title gives the final metrics.

    Args:
        directory: str or `Path`. Output folder, created if missing.
        name: str. What was run, e.g. `"glue/sst2"` (recorded and used as the title).
        metrics: dict. The final metrics, name to number (other JSON values are recorded but
            not drawn).
        step_loss: sequence of float. The training loss of every step
            (`StepLossHistory.step_loss`). Defaults to none.
        epoch_logs: sequence of dict. Keras' logs of every epoch (`StepLossHistory.epochs`).
        evaluations: list of `{"step": int, name: float, ...}` (`EpochEvaluation.evaluations`).
            The final numeric `metrics` are added at the last step unless they are already
            the last entry. Defaults to none.
        baseline: `(label, {metric: value})`, e.g. `("majority class", {"accuracy": 0.51})`:
            the score of a trivial predictor, drawn for comparison. Defaults to `None`.
        arguments: dict. The settings of the run (for instance `vars(args)` of argparse),
            recorded for reproducibility. Defaults to `None`.
        extra: dict. Further facts to record at the top level (data sizes, timings, ...).
        plot: bool. Draw `training_curve.png` (needs matplotlib: `pip install
            "kbert[plots]"`; without it a warning is given and no figure is drawn).
            Defaults to `True`.
        evaluation_label: str. What the evaluations were computed on, for the figure's
            legend and title. Defaults to `"dev"`.
        plot_metrics: list of str. The metrics drawn in the evaluation panel. Defaults to
            every numeric metric of `metrics`.

    In a run over several processes (`kbert.distribution.initialize`) only process 0 writes;
    the others return the paths without writing.

    Returns:
        `(metrics_path, curve_path)`; `curve_path` is `None` when no figure was drawn.
    """
    _check_metrics(metrics, "`metrics`", numbers_only=False)
    if baseline is not None and not (
        isinstance(baseline, (tuple, list)) and len(baseline) == 2 and isinstance(baseline[1], dict)
    ):
        raise ValueError(
            f"`baseline` must be a pair (label, {{metric: value}}). Received: baseline={baseline!r}"
        )
    step_loss = [float(v) for v in step_loss]
    evaluations = [dict(e) for e in (evaluations or [])]
    for entry in evaluations:
        if "step" not in entry:
            raise ValueError(f"Every evaluation needs a 'step'. Received: {entry!r}")
    scores = {k: float(v) for k, v in metrics.items() if _is_number(v)}
    if scores and (not evaluations or {k: evaluations[-1].get(k) for k in scores} != scores):
        evaluations.append({"step": len(step_loss), **scores})
    record = {
        "application": name,
        "backend": keras.backend.backend(),
        "metrics": metrics,
        "arguments": {
            k: (list(v) if isinstance(v, tuple) else v) for k, v in (arguments or {}).items()
        },
        "train_steps": len(step_loss),
        "epochs": [dict(e) for e in epoch_logs],
        "step_loss": step_loss,
        "evaluations": evaluations,
        "baseline": {"name": baseline[0], **baseline[1]} if baseline else None,
    }
    record.update(extra or {})
    directory = Path(directory)
    metrics_path = directory / "metrics.json"
    if not processes.is_writer():  # Several processes: process 0 writes the run's report.
        return metrics_path, None
    directory.mkdir(parents=True, exist_ok=True)
    text = json.dumps(record, indent=2, default=_json_default) + "\n"
    with atomic_file(metrics_path) as temporary:
        temporary.write_text(text)
    curve_path = None
    if plot:
        curve_path = plot_training_curve(
            directory / "training_curve.png",
            name,
            step_loss,
            evaluations,
            baseline=baseline,
            metric_names=list(plot_metrics or scores),
            evaluation_label=evaluation_label,
        )
    return metrics_path, curve_path


def plot_training_curve(
    path, name, step_loss, evaluations=(), baseline=None, metric_names=None, evaluation_label="dev"
):
    """Draws the training loss per step and the metrics of every evaluation into a PNG.

    Args:
        path: str or `Path`. The PNG to write (atomically).
        name: str. Title of the figure.
        step_loss: sequence of float. Training loss of every step.
        evaluations: list of `{"step": int, name: float, ...}`.
        baseline: optional `(label, {metric: value})`, drawn dashed.
        metric_names: list of str. The metrics to draw. Defaults to every metric in
            `evaluations`.
        evaluation_label: str. What the evaluations were computed on (`"dev"`, or e.g.
            `"training batches"`), shown in the legend and the panel's title.

    Returns:
        The `Path` written, or `None` without matplotlib (with a warning).
    """
    try:
        from matplotlib.figure import Figure
    except ImportError:
        warnings.warn(
            'matplotlib is not installed: no training curve drawn (pip install "kbert[plots]").',
            stacklevel=2,
        )
        return None
    step_loss = list(step_loss)
    evaluations = list(evaluations)
    names = list(metric_names or sorted({k for e in evaluations for k in e if k != "step"}))
    # `Figure` without pyplot: no GUI backend is chosen, nothing global is changed.
    figure = Figure(figsize=(11, 4.2))
    loss_axis, dev_axis = figure.subplots(1, 2)
    if step_loss:
        x = range(1, len(step_loss) + 1)
        loss_axis.plot(x, step_loss, alpha=0.35, label="loss per step")
        window = max(1, min(50, len(step_loss) // 10))
        loss_axis.plot(x, _moving_average(step_loss, window), label=f"mean of {window} steps")
        finite = [v for v in step_loss if math.isfinite(v)]
        if finite:
            loss_axis.set_ylim(0, max(max(finite), 1e-9) * 1.05)  # From zero: flat looks flat.
        loss_axis.legend()
    loss_axis.set_xlabel("training step")
    loss_axis.set_ylabel("training loss")
    loss_axis.set_title("training loss")
    for metric in names:
        points = [(e["step"], e[metric]) for e in evaluations if metric in e]
        if points:
            dev_axis.plot(*zip(*points), marker="o", label=f"{evaluation_label} {metric}")
    baseline_values = dict(baseline[1]) if baseline else {}
    for metric, value in baseline_values.items():
        dev_axis.axhline(
            value, linestyle="--", color="gray", label=f"{baseline[0]} ({metric} {value:.3f})"
        )
    values = [e[n] for e in evaluations for n in names if n in e] + list(baseline_values.values())
    values = [v for v in values if math.isfinite(v)]
    if values and all(-1.0 <= v <= 1.0 for v in values):
        dev_axis.set_ylim(min(0.0, min(values)) - 0.02, 1.02)
    elif values:
        dev_axis.set_ylim(min(0.0, min(values)), max(values) * 1.1 + 1e-9)
    dev_axis.set_xlim(0, max(len(step_loss), 1) * 1.02)
    dev_axis.set_xlabel("training step")
    dev_axis.set_title(f"{evaluation_label}, at each evaluation")
    if names or baseline_values:
        dev_axis.legend(loc="lower right")
    final = evaluations[-1] if evaluations else {}
    summary = ", ".join(f"{k} {final[k]:.4g}" for k in names if k in final)
    figure.suptitle(f"{name} ({keras.backend.backend()}): {summary}" if summary else name)
    figure.tight_layout()
    path = Path(path)
    with atomic_file(path) as temporary:
        figure.savefig(temporary, dpi=100, format="png")
    return path


def print_metrics(name, metrics):
    """Prints the final metrics of a run, one per line."""
    print(f"\n== {name}: final metrics ==")
    for key, value in metrics.items():
        print(f"{key:>24s}: {value:.4f}" if isinstance(value, float) else f"{key:>24s}: {value}")


def _is_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_metrics(metrics, where, numbers_only=True):
    if not isinstance(metrics, dict) or not all(isinstance(k, str) for k in metrics):
        raise ValueError(f"{where} must be a dict of metric name to value. Received: {metrics!r}")
    if numbers_only:
        bad = {k: v for k, v in metrics.items() if not _is_number(v)}
        if bad:
            raise ValueError(f"{where} must map metric names to numbers. Received: {bad!r}")


def _json_default(value):
    if hasattr(value, "tolist"):  # NumPy scalars and arrays.
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable: {value!r}")


def _moving_average(values, window):
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out
