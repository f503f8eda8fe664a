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

`--check-steps N` instead trains both systems N steps from the shared start on the same
batches in the same order (the first N x batch pairs, as kbert batches them unshuffled), with
dropout off in both, and compares what they did: the loss of every step and the update of
every weight (the trained weights minus the start's), as the relative difference of the two
updates. Equal steps leave only the batches drawn and dropout's draws between the two full
runs.
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
    queries, documents, held_out = training_data(args)
    encoder = _draw_start(args)

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


def _draw_start(args):
    """The shared start: the preset's encoder with a masked-LM head drawn under `args.seed`,
    written to `args.start` as a SparseEncoder directory."""
    import keras

    from kbert.checkpoints import export_to_sparse_encoder
    from kbert.models import BertSparseEncoder

    keras.utils.set_random_seed(args.seed)
    encoder = BertSparseEncoder.from_preset(
        args.preset, fresh_heads=True, sequence_length=args.max_length
    )
    export_to_sparse_encoder(encoder, args.start)
    return encoder


def run_sentence_transformers(args):
    """sentence-transformers' `SparseEncoderTrainer` from kbert's start, on the same pairs."""
    import scipy.sparse
    import torch

    st = _sentence_transformers()
    torch.manual_seed(args.seed)
    queries, documents, held_out = training_data(args)
    model = st.SparseEncoder(args.start, device="cpu")
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
    start = time.time()
    _, result = _train(st, args, model, queries, documents, max(1, steps // 8))
    seconds = time.time() - start
    after = score(encode, held_out)
    return _result(before, after, seconds, queries, result.global_step, result.training_loss)


def _sentence_transformers():
    """sentence-transformers' training classes, or a one-line error without them."""
    import types

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
    return types.SimpleNamespace(
        Dataset=Dataset,
        SparseEncoder=SparseEncoder,
        SparseEncoderTrainer=SparseEncoderTrainer,
        SparseEncoderTrainingArguments=SparseEncoderTrainingArguments,
        SpladeRegularizerWeightSchedulerCallback=SpladeRegularizerWeightSchedulerCallback,
        SparseMultipleNegativesRankingLoss=SparseMultipleNegativesRankingLoss,
        SpladeLoss=SpladeLoss,
    )


def _train(st, args, model, queries, documents, logging_steps, in_order=False):
    """One epoch of `st.SparseEncoderTrainer` on the pairs with kbert's recipe and SpladeLoss
    (regulariser weights held constant); `in_order`: the batches in the pairs' order (the
    trainer's default draws them). Returns the trainer and what its `train` returned."""
    import torch

    class InOrder(st.SparseEncoderTrainer):
        def get_batch_sampler(self, dataset, batch_size, drop_last, *args, **kwargs):
            rows = torch.utils.data.SequentialSampler(range(len(dataset)))
            return torch.utils.data.BatchSampler(rows, batch_size, drop_last)

    loss = st.SpladeLoss(
        model,
        loss=st.SparseMultipleNegativesRankingLoss(model),
        document_regularizer_weight=DOCUMENT_REGULARIZER_WEIGHT,
        query_regularizer_weight=QUERY_REGULARIZER_WEIGHT,
    )
    steps = math.ceil(len(queries) / args.batch_size)
    with tempfile.TemporaryDirectory() as directory:
        arguments = trainer_arguments(
            directory,
            args.batch_size,
            args.learning_rate,
            args.seed,
            logging_steps,
            # The warm-up as a count of steps, rounded as kbert rounds its warm-up ratio.
            warmup_steps=int(round(args.warmup_ratio * steps)),
        )
        trainer = (InOrder if in_order else st.SparseEncoderTrainer)(
            model=model,
            args=st.SparseEncoderTrainingArguments(**arguments),
            train_dataset=st.Dataset.from_dict({"query": queries, "document": documents}),
            loss=loss,
            # The trainer would otherwise add its default schedule of the regulariser weights
            # (0 -> full over the first third of the steps): kbert's SpladeLoss keeps them.
            callbacks=[_constant_weights(st.SpladeRegularizerWeightSchedulerCallback)(loss)],
        )
        result = trainer.train()
    return trainer, result


def check_kbert(args):
    """`--check-steps`: kbert's steps on the first batches, in order, without dropout; writes
    the trained weights as a SparseEncoder directory and returns each step's loss."""
    import keras

    from kbert.checkpoints import export_to_sparse_encoder
    from kbert.losses_sparse import SpladeLoss
    from kbert.models import BertSparseEncoder
    from kbert.models.text_embedder import TextColumnBatches

    queries, documents = _check_pairs(args)
    _draw_start(args)
    encoder = BertSparseEncoder.from_preset(
        args.start, sequence_length=args.max_length, dropout=0.0, attention_dropout=0.0
    )
    encoder.compile(
        learning_rate=args.learning_rate,
        warmup_ratio=args.warmup_ratio,
        weight_decay=0.01,
        loss=SpladeLoss(
            document_regularizer_weight=DOCUMENT_REGULARIZER_WEIGHT,
            query_regularizer_weight=QUERY_REGULARIZER_WEIGHT,
        ),
    )
    batches = TextColumnBatches(
        encoder, [queries, documents], None, None, args.batch_size, shuffle=False
    )
    means = []

    class StepLosses(keras.callbacks.Callback):  # Keras logs the running mean of the epoch.
        def on_train_batch_end(self, batch, logs=None):
            means.append(float(logs["loss"]))

    encoder.fit(batches, epochs=1, shuffle=False, verbose=0, callbacks=[StepLosses()])
    export_to_sparse_encoder(encoder, args.trained)
    return {"losses": step_losses(means)}


def step_losses(running_means):
    """Each step's loss from Keras' running means of the epoch's losses."""
    import numpy as np

    totals = np.asarray(running_means, "float64") * np.arange(1, len(running_means) + 1)
    return np.diff(totals, prepend=0.0).tolist()


def check_sentence_transformers(args):
    """`--check-steps`: the trainer's steps on the same batches in the same order, without
    dropout; writes the trained model and returns each step's loss."""
    st = _sentence_transformers()
    queries, documents = _check_pairs(args)
    no_dropout = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    model = st.SparseEncoder(args.start, device="cpu", config_kwargs=no_dropout)
    model.max_seq_length = args.max_length
    trainer, _ = _train(st, args, model, queries, documents, 1, in_order=True)
    model.save(args.trained)
    return {"losses": [r["loss"] for r in trainer.state.log_history if "loss" in r]}


def _check_pairs(args):
    """The first `check_steps` batches of the training pairs."""
    queries, documents, _ = training_data(args)
    rows = args.check_steps * args.batch_size
    return queries[:rows], documents[:rows]


def compare_updates(start, trained):
    """Per weight of the SparseEncoder directories `trained` (system -> directory): the
    relative difference of kbert's update to sentence-transformers' (`|dk - ds| / |ds|`), and
    the same over all weights at once."""
    import numpy as np
    from safetensors.numpy import load_file

    first = load_file(str(Path(start) / "model.safetensors"))
    ours, theirs = (load_file(str(Path(trained[s]) / "model.safetensors")) for s in SYSTEMS)
    rows, total_difference, total = {}, 0.0, 0.0
    for name, value in first.items():
        if name not in ours or name not in theirs:
            continue
        a, b = ours[name] - value, theirs[name] - value
        difference, size = float(np.sum((a - b) ** 2)), float(np.sum(b**2))
        total_difference, total = total_difference + difference, total + size
        rows[name] = (difference**0.5 / max(size**0.5, 1e-30), size**0.5)
    return rows, (total_difference / total) ** 0.5


def _report_check(results, rows, overall):
    losses = [results[s]["losses"] for s in SYSTEMS]
    print("step  kbert loss  sentence-transformers loss  relative difference")
    for step, (a, b) in enumerate(zip(*losses)):
        print(f"{step:>4} {a:>11.4f} {b:>27.4f} {abs(a - b) / abs(b):>20.2e}")
    # Updates that are float noise in both (the attention key biases, whose gradient is 0 in
    # exact arithmetic: softmax ignores a per-query constant) are listed apart.
    largest = max(size for _, size in rows.values())
    real = {k: v for k, v in rows.items() if v[1] > 1e-3 * largest}
    ranked = sorted(real.items(), key=lambda item: -item[1][0])
    name, (worst, _) = ranked[0]
    for weight, (difference, size) in ranked[:5]:
        print(f"  {weight}: update norm {size:.3e}, relative difference {difference:.2e}")
    print(
        f"weight updates: relative difference over all weights {overall:.2e}; largest of one "
        f"weight {worst:.2e} ({name}); {len(rows) - len(real)} weights with updates below "
        f"1e-3 of the largest left out of that maximum"
    )
    return {"overall": overall, "largest": worst, "largest_weight": name}


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
    parser.add_argument(
        "--check-steps",
        type=int,
        default=None,
        help="compare N steps of both systems on the same batches without dropout (see above)",
    )
    parser.add_argument("--json", default=None)
    parser.add_argument("--chart", default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return parser


def main(argv=None):
    import json

    args = build_parser().parse_args(argv)
    if args.worker:  # One system, in this process (spec: the parent's arguments, the system).
        spec = json.loads(args.worker)
        kbert = spec["system"] == "kbert"
        if spec.get("check_steps"):
            run = check_kbert if kbert else check_sentence_transformers
        else:
            run = run_kbert if kbert else run_sentence_transformers
        emit(run(argparse.Namespace(**spec)))
        return None
    if not (Path(args.data_dir) / "squad" / "dev-v1.1.json").is_file():
        raise SystemExit("error: --data-dir must hold squad/dev-v1.1.json")
    if "sentence-transformers" in args.system and "kbert" not in args.system:
        raise SystemExit("error: the sentence-transformers run starts from kbert's: add kbert")
    if args.check_steps is not None and (args.check_steps < 1 or len(args.system) != 2):
        raise SystemExit(
            "error: --check-steps takes a positive number of steps of both systems. Received: "
            f"--check-steps {args.check_steps} --system {' '.join(args.system)}"
        )
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
            spec["trained"] = str(Path(scratch) / system)
            results[system] = spawn(__file__, spec, environment, name=f"{system} worker")
        if args.check_steps:
            rows, overall = compare_updates(start, {s: str(Path(scratch) / s) for s in SYSTEMS})
            check = _report_check(results, rows, overall)
            if args.json:
                write_json(args.json, {"settings": vars(args), "results": results, **check})
            return results
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
