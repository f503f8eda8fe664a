"""SPLADE fine-tuning: kbert's `BertSparseEncoder.fit` next to sentence-transformers' trainer.

    python tools/benchmarks/benchmark_sparse_training.py --data-dir DATA_DIR \
        [--backend torch] [--st-python PYTHON]

Both systems start from the same sparse encoder: all-MiniLM-L6-v2's encoder (or `--preset`)
with a fresh masked-LM head drawn by kbert under `--seed`, written as a sentence-transformers
SparseEncoder directory (`kbert.checkpoints.export_to_sparse_encoder`) that
sentence-transformers' `SparseEncoder` loads. Each trains one epoch with SpladeLoss (in-batch
negatives on dot products, sentence-transformers' `SparseMultipleNegativesRankingLoss` with
scale 1, plus FLOPS regularisers weighted 3e-5 on the documents and 5e-5 on the queries) on
the (question, paragraph) pairs of SQuAD v1.1 dev articles 0-31 after the same seeded
shuffle, with the same batch size, peak rate, warm-up ratio, linear decay, weight decay (0.01,
not on biases and LayerNorm), Adam epsilon (1e-6), clipping at norm 1.0 and maximum length.
kbert runs `compile` + `fit` on the text columns; sentence-transformers its
`SparseEncoderTrainer`, with the regulariser weights held constant as kbert's SpladeLoss holds
them (the trainer's default schedule raises them from 0 over the first third of the steps).
It needs `pip install "sentence-transformers[train]"`: `--st-python` names an interpreter
whose environment has it and kbert. Each system runs in its own process; both are scored by
the same function: the questions of articles 32-47 search their 688 paragraphs by sparse dot
product (`kbert.retrieval.sparse_search`), before and after training. The goal (issue #32):
kbert's gain in recall@1 and nDCG@10 within 1 point of sentence-transformers'.

Prints a table and writes `--json` (and `--chart`, a PNG) if asked.
"""

import argparse
import math
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
SYSTEMS = ("kbert", "sentence-transformers")
DOCUMENT_REGULARIZER_WEIGHT = 3e-5
QUERY_REGULARIZER_WEIGHT = 5e-5


def training_data(args):
    """`(queries, documents, held_out)`: the seeded training pairs of articles 0-31 and the
    held-out `(questions, paragraphs, relevant)` of articles 32-47."""
    from applications import common
    from applications.embeddings import (
        HELD_OUT_ARTICLES,
        TRAIN_ARTICLES,
        limit_questions,
        squad_retrieval_data,
    )

    questions, paragraphs, relevant = squad_retrieval_data(args.data_dir, TRAIN_ARTICLES)
    order = common.shuffled_indices(len(questions), args.seed, args.max_train_examples)
    held_out = limit_questions(
        squad_retrieval_data(args.data_dir, HELD_OUT_ARTICLES), args.max_eval_questions, args.seed
    )
    queries = [questions[i] for i in order]
    return queries, [paragraphs[relevant[i]] for i in order], held_out


def score(encode, held_out):
    """Held-out SQuAD retrieval metrics (x 100) of `encode(texts)` -> SciPy CSR rows."""
    from applications.embeddings import evaluate_embeddings
    from kbert import retrieval

    metrics = evaluate_embeddings(
        lambda texts, kind: encode(texts), None, held_out, search=retrieval.sparse_search
    )
    return {k: metrics[k] for k in METRICS}


def _result(before, after, seconds, queries, steps, loss):
    """What a worker emits."""
    return {
        "before": before,
        "after": after,
        "train_seconds": seconds,
        "train_examples": len(queries),
        "train_steps": int(steps),
        "final_loss": float(loss),
    }


def run_kbert(args):
    """Draws the shared start, writes it for sentence-transformers, trains it with `fit`."""
    import keras

    from kbert.checkpoints import export_to_sparse_encoder
    from kbert.models import BertSparseEncoder

    keras.utils.set_random_seed(args.seed)
    queries, documents, held_out = training_data(args)
    encoder = BertSparseEncoder.from_preset(
        args.preset, fresh_heads=True, sequence_length=args.max_length
    )
    export_to_sparse_encoder(encoder, args.start)

    def encode(texts):
        return encoder.encode(texts, batch_size=args.batch_size)

    before = score(encode, held_out)
    log(f"kbert before: {before}")
    encoder.compile(
        learning_rate=args.learning_rate, warmup_ratio=args.warmup_ratio, weight_decay=0.01
    )
    start = time.time()
    history = encoder.fit((queries, documents), batch_size=args.batch_size, epochs=1)
    seconds = time.time() - start
    steps = math.ceil(len(queries) / args.batch_size)
    return _result(
        before, score(encode, held_out), seconds, queries, steps, history.history["loss"][-1]
    )


def run_sentence_transformers(args):
    """sentence-transformers' `SparseEncoderTrainer` from kbert's start, on the same pairs."""
    try:
        from datasets import Dataset
        from sentence_transformers import (
            SparseEncoder,
            SparseEncoderTrainer,
            SparseEncoderTrainingArguments,
        )
        from sentence_transformers.sparse_encoder.callbacks.splade_callbacks import (
            SpladeRegularizerWeightSchedulerCallback,
        )
        from sentence_transformers.sparse_encoder.losses import (
            SparseMultipleNegativesRankingLoss,
            SpladeLoss,
        )
    except ImportError as error:
        raise SystemExit(
            "error: the sentence-transformers run needs `pip install "
            f'"sentence-transformers[train]"` (datasets, accelerate); see --st-python ({error})'
        ) from None
    import scipy.sparse
    import torch

    torch.manual_seed(args.seed)
    queries, documents, held_out = training_data(args)
    model = SparseEncoder(args.start, device="cpu")
    model.max_seq_length = args.max_length

    def encode(texts):
        vectors = model.encode(
            texts,
            batch_size=args.batch_size,
            convert_to_tensor=True,
            convert_to_sparse_tensor=False,
        )
        return scipy.sparse.csr_matrix(vectors.cpu().numpy())

    before = score(encode, held_out)
    log(f"sentence-transformers before: {before}")
    steps = math.ceil(len(queries) / args.batch_size)
    loss = SpladeLoss(
        model,
        loss=SparseMultipleNegativesRankingLoss(model),
        document_regularizer_weight=DOCUMENT_REGULARIZER_WEIGHT,
        query_regularizer_weight=QUERY_REGULARIZER_WEIGHT,
    )
    with tempfile.TemporaryDirectory() as directory:
        # The warm-up as a count of steps, rounded as kbert rounds its warm-up ratio.
        warmup_steps = int(round(args.warmup_ratio * steps))
        training_args = SparseEncoderTrainingArguments(
            **trainer_arguments(
                directory,
                args.batch_size,
                args.learning_rate,
                args.seed,
                max(1, steps // 8),
                warmup_steps=warmup_steps,
            )
        )
        trainer = SparseEncoderTrainer(
            model=model,
            args=training_args,
            train_dataset=Dataset.from_dict({"query": queries, "document": documents}),
            loss=loss,
            # The trainer would otherwise add its default schedule of the regulariser weights
            # (0 -> full over the first third of the steps): kbert's SpladeLoss keeps them.
            callbacks=[_constant_weights(SpladeRegularizerWeightSchedulerCallback)(loss)],
        )
        start = time.time()
        result = trainer.train()
        seconds = time.time() - start
    after = score(encode, held_out)
    return _result(before, after, seconds, queries, result.global_step, result.training_loss)


def _constant_weights(scheduler):
    """sentence-transformers' regulariser-weight scheduler with no schedule: the loss keeps
    the weights it was built with (the trainer adds the scheduler unless it is given one)."""

    class ConstantWeights(scheduler):
        def on_train_begin(self, *args, **kwargs):
            pass

        def on_step_begin(self, *args, **kwargs):
            pass

        def on_log(self, *args, **kwargs):  # It would log its unset schedule's weights.
            pass

    return ConstantWeights


def _report(results):
    before_after_table(
        results,
        METRICS,
        lambda r: (
            f"{r['train_steps']} steps, {r['train_seconds']:.0f} s, last loss {r['final_loss']:.4f}"
        ),
    )
    gains = {
        system: {m: r["after"][m] - r["before"][m] for m in METRICS}
        for system, r in results.items()
    }
    if len(results) == 2:
        for m in METRICS:
            kbert, other = gains["kbert"][m], gains["sentence-transformers"][m]
            print(
                f"gain in {m[6:]}: kbert {kbert:+.2f}, sentence-transformers {other:+.2f} "
                f"(difference {kbert - other:+.2f})"
            )
    return gains


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=str(default_data_dir()))
    parser.add_argument("--preset", default=None, help="Default: all-MiniLM-L6-v2 (installed).")
    parser.add_argument("--backend", choices=("tensorflow", "jax", "torch"), default="torch")
    parser.add_argument("--system", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument(
        "--st-python",
        default=None,
        help="Interpreter of the sentence-transformers run (an environment with "
        "sentence-transformers[train] and kbert). Default: this one.",
    )
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=2e-5)
    parser.add_argument("--warmup-ratio", type=float, default=0.1)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--max-train-examples", type=int, default=None)
    parser.add_argument("--max-eval-questions", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    parser.add_argument("--chart", default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return parser


def main(argv=None):
    import json

    args = build_parser().parse_args(argv)
    if args.worker:  # One system, in this process (spec: the parent's arguments, the system).
        spec = json.loads(args.worker)
        run = run_kbert if spec["system"] == "kbert" else run_sentence_transformers
        emit(run(argparse.Namespace(**spec)))
        return None
    if not (Path(args.data_dir) / "squad" / "dev-v1.1.json").is_file():
        raise SystemExit("error: --data-dir must hold squad/dev-v1.1.json")
    if "sentence-transformers" in args.system and "kbert" not in args.system:
        raise SystemExit("error: the sentence-transformers run starts from kbert's: add kbert")
    args.preset = args.preset or minilm_directory()
    if args.preset is None:
        raise SystemExit("error: give --preset: the all-MiniLM-L6-v2 package is not installed")
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        start = str(Path(scratch) / "start")
        for system in SYSTEMS:
            if system not in args.system:
                continue
            log(f"== {system}")
            # The repository on PYTHONPATH: both workers import `applications`.
            environment = worker_environment(args.backend, pythonpath=str(REPO))
            python = args.st_python if system == "sentence-transformers" else None
            spec = dict(vars(args), system=system, start=start, python=python or sys.executable)
            results[system] = spawn(__file__, spec, environment, name=f"{system} worker")
    gains = _report(results)
    if args.json:
        payload = {"backend": args.backend, "settings": vars(args), "results": results}
        write_json(args.json, dict(payload, gains=gains), indent=2)
    if args.chart:
        before_after_bars(
            results,
            args.chart,
            "squad_ndcg@10",
            "held-out nDCG@10 (x 100)",
            "SPLADE on SQuAD dev articles 32-47, after 1 epoch on articles 0-31",
        )
    return results


if __name__ == "__main__":
    main()
