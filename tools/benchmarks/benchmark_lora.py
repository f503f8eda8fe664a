"""LoRA vs full fine-tuning on the quality benchmark's SST-2 recipe: parameters, memory, accuracy.

A benchmark, not a test. Runs each mode in its own process (so that peak memory is per mode),
one after the other, and prints them side by side; writes `benchmarks/lora.json` and
`benchmarks/lora.png`:

    python tools/benchmarks/benchmark_lora.py --backend jax --seed 0
    python tools/benchmarks/benchmark_lora.py --plot-only   # redraw from benchmarks/lora.json

Recipe: the quality benchmark's `sst2` (`bench.recipes`: the first 8,000 rows of SST-2 train after
the seeded shuffle, length 64, batch 32, one epoch, AdamW with weight decay 0.01 except LayerNorm
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
import time
from pathlib import Path

from bench.charts import pyplot, save
from bench.data import REPO, default_data_dir, minilm_directory
from bench.harness import emit, spawn, worker_environment, write_json
from bench.recipes import RECIPES, sst2_data


def _maxrss_mib():
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def run_one(mode, args):
    """Trains one mode in this process and returns its row."""
    import keras
    import numpy as np

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
    modes = [r["mode"] for r in rows]
    panels = [
        ("trainable_parameters", "trainable parameters (millions)", 1e-6),
        ("peak_rss_mib", "peak training memory (MiB, RSS)", 1),
        ("dev_accuracy", "SST-2 dev accuracy", 1),
    ]
    figure, axes = pyplot().subplots(1, 3, figsize=(11, 3.5))
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
    save(figure, path, dpi=110)


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
        default=str(default_data_dir()),
        help="Folder holding glue/SST-2/ (as benchmark_quality.py). "
        "Default: $KBERT_DATA_DIR, else ../shared/data next to the repository.",
    )
    parser.add_argument("--modes", default="full,lora")
    parser.add_argument(
        "--train-examples", type=int, default=None, help="Smoke runs only (the recipe: 8,000)."
    )
    parser.add_argument("--output", default=str(REPO / "benchmarks" / "lora.json"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--plot-only", action="store_true")
    args = parser.parse_args(argv)
    if args.worker:  # One mode in this process (spec: the parent's arguments and the mode).
        spec = json.loads(args.worker)
        emit(run_one(spec.pop("mode"), argparse.Namespace(**spec)))
        return
    args.preset = args.preset or minilm_directory()
    if args.preset is None:
        parser.error("give --preset: the all-MiniLM-L6-v2 package is not installed")
    output = Path(args.output)
    if not args.plot_only:
        rows = []
        for mode in args.modes.split(","):
            spec = dict(vars(args), mode=mode)
            try:
                rows.append(spawn(__file__, spec, worker_environment(args.backend)))
            except RuntimeError as error:
                raise SystemExit(f"The {mode} run failed: {error}.") from None
            print(json.dumps(rows[-1]), flush=True)
        write_json(output, rows, indent=2)
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
