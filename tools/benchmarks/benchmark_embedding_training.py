"""Contrastive fine-tuning: `applications/embeddings.py train` next to sentence-transformers.

    python tools/benchmarks/benchmark_embedding_training.py --data-dir DATA_DIR [--backend torch]

Both start from all-MiniLM-L6-v2 (or `--preset`) and train one epoch with
MultipleNegativesRankingLoss (in-batch negatives, cosine scaled by 20) on the (question,
paragraph) pairs of SQuAD v1.1 dev articles 0-31, in the same seeded order, with the same
batch size, learning rate, warm-up (1 %), weight decay (0.01, not on biases and LayerNorm),
Adam epsilon (1e-6), gradient clipping (1.0) and maximum length (256). kbert runs the
application itself (`embeddings.py train --task squad`); sentence-transformers runs its own
`SentenceTransformerTrainer` (it needs `pip install datasets accelerate`). Each system runs in
its own process; both are scored with the same function on the questions of articles 32-47
retrieved among their own paragraphs, before and after training. The goal: kbert's gain in
recall@1 within 1 point of sentence-transformers'.

Prints a table and writes `--json` (and `--chart`, a PNG) if asked.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.charts import before_after_bars
from bench.data import REPO, default_data_dir, minilm_directory
from bench.harness import emit, log, spawn, worker_environment, write_json
from bench.recipes import trainer_arguments
from bench.tables import before_after_table

METRICS = ("squad_recall@1", "squad_recall@10", "squad_mrr@10", "squad_ndcg@10")


def run_kbert(args):
    """`applications/embeddings.py train --task squad` in its own process; its metrics.json."""
    with tempfile.TemporaryDirectory() as directory:
        command = [
            sys.executable,
            str(REPO / "applications" / "embeddings.py"),
            "train",
            "--task",
            "squad",
            "--preset",
            args.preset,
            "--data-dir",
            args.data_dir,
            "--output-dir",
            directory,
            "--seed",
            str(args.seed),
            "--batch-size",
            str(args.batch_size),
            "--learning-rate",
            str(args.learning_rate),
            "--max-length",
            str(args.max_length),
        ]
        if args.max_train_examples:
            command += ["--max-train-examples", str(args.max_train_examples)]
        # The application's own output goes to stderr: stdout carries the worker's result.
        environment = dict(os.environ, KERAS_BACKEND=args.backend)
        subprocess.run(command, check=True, env=environment, stdout=sys.stderr)
        report = json.loads((Path(directory) / "metrics.json").read_text())
    return {
        "before": {k: report["before"][k] for k in METRICS},
        "after": {k: report["metrics"][k] for k in METRICS},
        "train_seconds": report["train_seconds"],
        "train_examples": report["train_examples"],
        "train_steps": report["train_steps"],
    }


def run_sentence_transformers(args):
    """sentence-transformers' own trainer on the same pairs, in the same order (run as a
    worker whose PYTHONPATH holds the repository, so `applications` imports)."""
    from applications import common
    from applications.embeddings import (
        HELD_OUT_ARTICLES,
        TRAIN_ARTICLES,
        evaluate_embeddings,
        squad_retrieval_data,
    )

    try:
        from datasets import Dataset
        from sentence_transformers import (
            SentenceTransformer,
            SentenceTransformerTrainer,
            SentenceTransformerTrainingArguments,
            losses,
        )
    except ImportError as error:
        raise SystemExit(
            f"error: the sentence-transformers run needs `pip install sentence-transformers "
            f"datasets accelerate` ({error})"
        ) from None
    import torch

    torch.manual_seed(args.seed)
    questions, paragraphs, relevant = squad_retrieval_data(args.data_dir, TRAIN_ARTICLES)
    held_out = squad_retrieval_data(args.data_dir, HELD_OUT_ARTICLES)
    order = common.shuffled_indices(len(questions), args.seed, args.max_train_examples)
    train = Dataset.from_dict(
        {
            "anchor": [questions[i] for i in order],
            "positive": [paragraphs[relevant[i]] for i in order],
        }
    )
    model = SentenceTransformer(args.preset, device="cpu")
    model.max_seq_length = args.max_length

    def score():
        encode = lambda texts, kind: model.encode(texts, batch_size=32)  # noqa: E731
        metrics = evaluate_embeddings(encode, None, held_out)
        return {k: metrics[k] for k in METRICS}

    before = score()
    with tempfile.TemporaryDirectory() as directory:
        training_args = SentenceTransformerTrainingArguments(
            **trainer_arguments(
                directory, args.batch_size, args.learning_rate, args.seed, 20, warmup_ratio=0.01
            )
        )
        trainer = SentenceTransformerTrainer(
            model=model,
            args=training_args,
            train_dataset=train,
            loss=losses.MultipleNegativesRankingLoss(model, scale=20.0),
        )
        start = time.time()
        result = trainer.train()
        seconds = time.time() - start
    return {
        "before": before,
        "after": score(),
        "train_seconds": seconds,
        "train_examples": len(order),
        "train_steps": int(result.global_step),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=str(default_data_dir()))
    parser.add_argument("--preset", default=None, help="Default: all-MiniLM-L6-v2 (installed).")
    parser.add_argument("--backend", choices=("tensorflow", "jax", "torch"), default="torch")
    parser.add_argument(
        "--system",
        nargs="+",
        choices=("kbert", "sentence-transformers"),
        default=["kbert", "sentence-transformers"],
    )
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=2e-5)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--max-train-examples", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    parser.add_argument("--chart", default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:  # One system, in this process (spec: the parent's arguments, the system).
        spec = json.loads(args.worker)
        run = run_kbert if spec["system"] == "kbert" else run_sentence_transformers
        emit(run(argparse.Namespace(**spec)))
        return None
    if not args.data_dir or not (Path(args.data_dir) / "squad" / "dev-v1.1.json").is_file():
        raise SystemExit("error: --data-dir must hold squad/dev-v1.1.json")
    args.preset = args.preset or minilm_directory()
    if args.preset is None:
        parser.error("give --preset: the all-MiniLM-L6-v2 package is not installed")
    results = {}
    for system in args.system:
        log(f"== {system}")
        # The repository on PYTHONPATH: the sentence-transformers worker imports
        # `applications`; kbert's application runs with the worker's KERAS_BACKEND.
        environment = worker_environment(args.backend, pythonpath=str(REPO))
        spec = dict(vars(args), system=system)
        results[system] = spawn(__file__, spec, environment, name=f"{system} worker")
    before_after_table(
        results,
        METRICS,
        lambda r: (
            f"recall@1 gain {r['after']['squad_recall@1'] - r['before']['squad_recall@1']:+.2f} "
            f"in {r['train_steps']} steps, {r['train_seconds']:.0f} s"
        ),
    )
    if len(results) == 2:
        gains = [
            r["after"]["squad_recall@1"] - r["before"]["squad_recall@1"] for r in results.values()
        ]
        print(f"gain difference kbert - sentence-transformers: {gains[0] - gains[1]:+.2f} points")
    if args.json:
        write_json(args.json, {"backend": args.backend, "results": results}, indent=2)
    if args.chart:
        before_after_bars(
            results,
            args.chart,
            "squad_recall@1",
            "held-out recall@1 (x 100)",
            "SQuAD dev articles 32-47, after 1 epoch of MNRL on articles 0-31",
        )
    return results


if __name__ == "__main__":
    main()
