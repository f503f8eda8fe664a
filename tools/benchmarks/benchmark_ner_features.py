"""Feature-based NER (the BERT paper's section 5.3, Table 7) next to fine-tuning, on CoNLL-2003.

A benchmark, not a test. Runs `applications/ner.py` once per named run, each in its own process,
one after the other (wall time measured around the process), and writes the entity F1 of each to
`benchmarks/ner_features.json` (rows of the same run and backend are replaced) and a bar chart to
`benchmarks/ner_features.png`:

    python tools/benchmarks/benchmark_ner_features.py --backend jax
    python tools/benchmarks/benchmark_ner_features.py --backend torch --runs last4 \
        --max-train-examples 500 --max-eval-sentences 300 --json benchmarks/ner_features_small.json
    python tools/benchmarks/benchmark_ner_features.py --plot-only   # redraw from the JSON

Runs: `fine-tune` (ner.py without --features: the whole model trains, `--ft-epochs` epochs, default
3, at a peak rate of `--ft-learning-rate`, default 1e-4) and the six `--features` variants (frozen
backbone, a two-layer BiLSTM of `--lstm-units` per direction, default 256, trained `--lstm-epochs`
epochs, default 3, with Adam at `--lstm-learning-rate`, default 1e-3). Both use batch 16, read the
same `--max-train-examples` sentences (default 2,000; the seeded shuffle of eng.train) and score
the first `--max-eval-sentences` sentences of eng.testa (default 1,000). Checkpoint: the
installed all-MiniLM-L6-v2 unless `--checkpoint`. Run directories go to `--runs-dir`
(`runs/ner_features`, ignored by git); `--reuse` reads back runs already there.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from bench.charts import pyplot, save
from bench.data import REPO, checkpoint_name, default_data_dir, resolve_checkpoint

VARIANTS = ("embeddings", "second-to-last", "last", "sum-last4", "last4", "weighted")
RUNS = ("fine-tune",) + VARIANTS


def command(run, args):
    line = [
        sys.executable,
        "applications/ner.py",
        "--preset",
        args.checkpoint,
        "--data-dir",
        str(args.data_dir),
        "--backend",
        args.backend,
        "--seed",
        str(args.seed),
        "--max-train-examples",
        str(args.max_train_examples),
        "--max-eval-sentences",
        str(args.max_eval_sentences),
        "--batch-size",
        "16",
    ]
    if run == "fine-tune":
        line += ["--epochs", str(args.ft_epochs), "--learning-rate", str(args.ft_learning_rate)]
    else:
        line += [
            "--features",
            run,
            "--epochs",
            str(args.lstm_epochs),
            "--lstm-units",
            str(args.lstm_units),
            "--lstm-learning-rate",
            str(args.lstm_learning_rate),
        ]
    return line


def run_one(run, args):
    output = Path(args.runs_dir) / f"{args.backend}_{run}"
    line = command(run, args) + ["--output-dir", str(output)]
    shown = " ".join(["python"] + line[1:])
    wall_file = output / "wall_seconds.txt"
    if args.reuse and wall_file.exists():  # A finished run of the same command: read it back.
        wall = float(wall_file.read_text())
    else:
        print(f"== {run}: {shown}", flush=True)
        start = time.time()
        subprocess.run(line, cwd=REPO, check=True)
        wall = time.time() - start
        wall_file.write_text(f"{wall:.1f}\n")
    record = json.loads((output / "metrics.json").read_text())
    return {
        "run": run,
        "backend": args.backend,
        "entity_f1": record["metrics"]["entity_f1"],
        "entity_precision": record["metrics"]["entity_precision"],
        "entity_recall": record["metrics"]["entity_recall"],
        "wall_seconds": round(wall, 1),
        "feature_seconds": round(record.get("feature_seconds", 0.0), 1),
        "train_seconds": round(record["train_seconds"], 1),
        "train_sentences": record["train_sentences"],
        "eval_sentences": record["eval_sentences"],
        "checkpoint": checkpoint_name(args.checkpoint),
        "command": shown,
    }


def plot(rows, path):
    backend = rows[0]["backend"]
    rows = [r for r in rows if r["backend"] == backend]
    rows.sort(key=lambda r: RUNS.index(r["run"]))
    names = [r["run"] for r in rows]
    values = [100 * r["entity_f1"] for r in rows]
    figure, axis = pyplot().subplots(figsize=(7, 3.2))
    colors = ["tab:gray" if n == "fine-tune" else "tab:blue" for n in names]
    bars = axis.barh(names, values, color=colors)
    for bar, value in zip(bars, values):
        axis.text(value, bar.get_y() + bar.get_height() / 2, f" {value:.1f}", va="center")
    axis.invert_yaxis()
    axis.set_xlim(0, max(values) * 1.15)
    axis.set_xlabel(f"entity F1 (first {rows[0]['eval_sentences']} eng.testa sentences)")
    axis.set_title(
        f"CoNLL-2003, {rows[0]['checkpoint']} ({backend}), {rows[0]['train_sentences']} "
        "training sentences:\nfine-tuning (gray) vs frozen features + BiLSTM (blue)",
        fontsize=9,
    )
    save(figure, path, dpi=100)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("tensorflow", "jax", "torch"), default="jax")
    parser.add_argument("--runs", default=",".join(RUNS), help="Comma-separated subset of RUNS.")
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-train-examples", type=int, default=2000)
    parser.add_argument("--max-eval-sentences", type=int, default=1000)
    parser.add_argument("--ft-epochs", type=int, default=3)
    parser.add_argument("--ft-learning-rate", type=float, default=1e-4)
    parser.add_argument("--lstm-epochs", type=int, default=3)
    parser.add_argument("--lstm-units", type=int, default=256)
    parser.add_argument("--lstm-learning-rate", type=float, default=1e-3)
    parser.add_argument("--runs-dir", default=str(REPO / "runs" / "ner_features"))
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "ner_features.json"))
    parser.add_argument("--png", default=None, help="Default: the JSON's path with .png.")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="Read back runs already in --runs-dir (metrics.json and wall_seconds.txt) "
        "instead of running them again.",
    )
    parser.add_argument("--plot-only", action="store_true")
    args = parser.parse_args(argv)
    path = Path(args.json)
    png = Path(args.png) if args.png else path.with_suffix(".png")
    rows = json.loads(path.read_text()) if path.exists() else []
    if not args.plot_only:
        runs = [r.strip() for r in args.runs.split(",") if r.strip()]
        unknown = sorted(set(runs) - set(RUNS))
        if unknown:
            parser.error(f"--runs: unknown {unknown}; choose from {list(RUNS)}")
        args.checkpoint = resolve_checkpoint(args.checkpoint)
        args.data_dir = args.data_dir or default_data_dir()
        for run in runs:
            row = run_one(run, args)
            rows = [r for r in rows if (r["run"], r["backend"]) != (run, args.backend)] + [row]
            rows.sort(key=lambda r: (r["backend"], RUNS.index(r["run"])))
            path.write_text(json.dumps(rows, indent=2) + "\n")
            print(
                f"{run:>15} {args.backend}: entity F1 {row['entity_f1']:.4f}, "
                f"wall {row['wall_seconds']:.0f} s",
                flush=True,
            )
    for row in rows:
        print(
            f"{row['run']:>15} {row['backend']:>10}: {row['entity_f1']:.4f} "
            f"({row['wall_seconds']:.0f} s)"
        )
    if rows:
        plot(rows, png)
        print("Wrote", path, png)


if __name__ == "__main__":
    main()
