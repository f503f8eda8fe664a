"""Shared plumbing of the fine-tuning applications (glue.py, ner.py, squad.py).

Flags every application takes, choosing the Keras backend before Keras is imported, seeding,
the per-step loss record, and the outputs of a run: `metrics.json` and a training-curve PNG.
The applications themselves stay thin: data readers, models and metrics live in `kbert`.
"""

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA_DIR = Path(os.environ.get("KBERT_DATA_DIR", REPO_ROOT.parent / "shared" / "data"))
BACKENDS = ("tensorflow", "jax", "torch")


def base_parser(description, *, epochs, batch_size, learning_rate, max_length):
    """An argparse parser with the flags shared by the applications and the given defaults."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--preset",
        required=True,
        help="Preset name or checkpoint directory with a vocabulary (kbert preset, Hugging Face, "
        "Google BERT or keras-hub directory).",
    )
    parser.add_argument(
        "--data-dir",
        default=str(DEFAULT_DATA_DIR),
        help="Folder holding the datasets (glue/, conll2003/, squad/). Default: %(default)s "
        "($KBERT_DATA_DIR overrides).",
    )
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default=None,
        help="Keras backend (sets KERAS_BACKEND before Keras is imported). Default: the "
        "KERAS_BACKEND environment variable, else Keras' default.",
    )
    parser.add_argument("--epochs", type=int, default=epochs, help="Default: %(default)s.")
    parser.add_argument("--batch-size", type=int, default=batch_size, help="Default: %(default)s.")
    parser.add_argument(
        "--learning-rate", type=float, default=learning_rate, help="Peak AdamW rate. Default: %(default)s."
    )
    parser.add_argument(
        "--max-length", type=int, default=max_length, help="Packed sequence length. Default: %(default)s."
    )
    parser.add_argument("--seed", type=int, default=0, help="Default: %(default)s.")
    parser.add_argument(
        "--max-train-examples",
        type=int,
        default=None,
        help="Train on this many examples, taken after a seeded shuffle. Default: all.",
    )
    parser.add_argument(
        "--output-dir",
        default=None,
        help="Where metrics.json and training_curve.png go. Default: ./runs/<application>.",
    )
    return parser


def parse_args(parser, argv=None):
    """Parses the flags and selects the Keras backend before anything imports Keras."""
    args = parser.parse_args(argv)
    for name in ("epochs", "batch_size", "max_length"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.max_train_examples is not None and args.max_train_examples < 1:
        parser.error("--max-train-examples must be >= 1")
    if args.backend:
        loaded = sys.modules.get("keras")
        if loaded is not None and loaded.backend.backend() != args.backend:
            parser.error(
                f"--backend {args.backend} was given but Keras is already imported with the "
                f"{loaded.backend.backend()} backend; run the application in a fresh process."
            )
        os.environ["KERAS_BACKEND"] = args.backend
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if not Path(args.data_dir).is_dir():
        parser.error(f"--data-dir {args.data_dir} does not exist")
    return args


def seed_everything(seed):
    """Seeds Python, NumPy and the Keras backend."""
    import keras

    keras.utils.set_random_seed(seed)


def shuffled_indices(num_examples, seed, limit=None):
    """A seeded permutation of `range(num_examples)`, cut to `limit` items."""
    import numpy as np

    order = np.random.default_rng(seed).permutation(num_examples)
    return order if limit is None else order[:limit]


def step_history():
    """A Keras callback recording the loss of every training step (and the epoch logs)."""
    import keras

    class StepHistory(keras.callbacks.Callback):
        """Per-step training loss and per-epoch logs.

        Keras reports the running mean of the loss over the current epoch; the loss of each
        step is recovered from consecutive running means.
        """

        def __init__(self):
            super().__init__()
            self.step_loss = []
            self.epochs = []
            self._previous_mean = 0.0
            self._batches = 0
            self.start_time = None

        def on_train_begin(self, logs=None):
            self.start_time = time.time()

        def on_epoch_begin(self, epoch, logs=None):
            self._previous_mean, self._batches = 0.0, 0

        def on_train_batch_end(self, batch, logs=None):
            if not logs or "loss" not in logs:
                return
            mean = float(logs["loss"])
            self._batches += 1
            step = mean * self._batches - self._previous_mean * (self._batches - 1)
            self._previous_mean = mean
            self.step_loss.append(step)

        def on_epoch_end(self, epoch, logs=None):
            self.epochs.append({k: float(v) for k, v in (logs or {}).items()})

    return StepHistory()


def output_dir(args, application):
    path = Path(args.output_dir or Path("runs") / application)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _moving_average(values, window):
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def write_results(directory, application, metrics, history, args, extra=None):
    """Writes `metrics.json` and `training_curve.png` into `directory`; returns their paths
    (the curve's is None without matplotlib).

    Args:
        directory: output folder.
        application: str, e.g. `"glue/sst2"`.
        metrics: dict of final evaluation metrics (floats).
        history: the `step_history()` callback used in `fit` (or None).
        args: the parsed flags (recorded for reproducibility).
        extra: optional dict of further facts to record (data sizes, timings, ...).
    """
    import keras

    directory = Path(directory)
    record = {
        "application": application,
        "backend": keras.backend.backend(),
        "metrics": metrics,
        "arguments": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(args).items()},
        "train_steps": len(history.step_loss) if history else 0,
        "epochs": history.epochs if history else [],
        "step_loss": history.step_loss if history else [],
    }
    if extra:
        record.update(extra)
    metrics_path = directory / "metrics.json"
    metrics_path.write_text(json.dumps(record, indent=2, default=float) + "\n")

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print('matplotlib is not installed: no training_curve.png (pip install "kbert[plots]").')
        return metrics_path, None
    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    steps = history.step_loss if history else []
    if steps:
        axes[0].plot(range(1, len(steps) + 1), steps, alpha=0.35, label="loss per step")
        window = max(1, min(50, len(steps) // 10))
        axes[0].plot(range(1, len(steps) + 1), _moving_average(steps, window), label=f"mean of {window} steps")
        axes[0].legend()
    axes[0].set_xlabel("training step")
    axes[0].set_ylabel("training loss")
    axes[0].set_title(f"{application}: training loss")
    epochs = history.epochs if history else []
    keys = sorted({k for e in epochs for k in e if k.startswith("val_")})
    if keys:  # Validation curves per epoch.
        for key in keys:
            values = [e.get(key, math.nan) for e in epochs]
            axes[1].plot(range(1, len(epochs) + 1), values, marker="o", label=key)
        axes[1].set_xlabel("epoch")
        axes[1].legend()
    scores = {k: v for k, v in metrics.items() if isinstance(v, float)}
    if scores and not keys:  # Final scores as bars.
        bars = axes[1].bar(list(scores), list(scores.values()), color="tab:green")
        axes[1].bar_label(bars, fmt="%.4g")
    axes[1].set_title(f"{application}: evaluation")
    figure.tight_layout()
    curve_path = directory / "training_curve.png"
    figure.savefig(curve_path, dpi=100)
    plt.close(figure)
    return metrics_path, curve_path


def print_metrics(application, metrics):
    """Prints the final metrics, one per line."""
    print(f"\n== {application}: final metrics ==")
    for name, value in metrics.items():
        print(f"{name:>24s}: {value:.4f}" if isinstance(value, float) else f"{name:>24s}: {value}")
