"""kbert.retrieval.EmbeddingIndex at corpus scale: quality of quantized search on SQuAD with
distractors, and speed and memory of exact, HNSW and binary + rescoring search at 1M vectors.

    python tools/benchmarks/benchmark_index.py --data-dir DATA --json index.json \
        --chart index.png [--scale-rows 1000000]

1. Quality. The corpus is SQuAD v1.1 dev's 2,067 paragraphs plus distractor passages cut from
   wikitext-2 (`wiki.valid.raw` and `wiki.test.raw`: each article's text lines, headings
   dropped, joined and cut into passages of `--passage-words` words; the last piece of an
   article is kept when it has at least 20 words). The documents are encoded by
   all-MiniLM-L6-v2 (`--checkpoint`; `BertTextEmbedder.encode_document(...,
   output_dir=CACHE)`, shards an index reads with `EmbeddingIndex.from_shards`; a second run
   reuses them), the questions (`--questions`, seeded sample; default all 10,570) by
   `encode_query`. Each question's relevant document is its paragraph. Recall@10 and MRR@10
   of: exact float32 search, int8 and binary indexes with and without float rescoring
   (`rescore_multiplier` 1 = no rescoring, 2, 4, 10), the same candidates rescored with
   the float vectors the index keeps on disk (`rescore_vectors="float32"`), and the float32
   HNSW index; with the bytes each index holds in memory for the whole corpus.
2. Scale. `--scale-rows` vectors (default 1,000,000) made from the real document embeddings:
   row `i` is document `j` (drawn uniformly, seed 0) plus Gaussian noise of standard
   deviation `--noise` per dimension (default 0.02: a copy keeps a cosine of about 0.93 with
   its document), L2-normalised; so the corpus is clusters of near-duplicates around real
   documents, searched by `--scale-queries` real questions (default 1,000). Reported for the
   exact NumPy float32 index, the FAISS HNSW float32 index (`--hnsw-m`,
   `--ef-construction`; one row per search beam width of `--ef-search`, default 128, 256 and
   512, on the same graph) and the FAISS binary flat index with float
   rescoring (`--rescore-multiplier`, default 4) against its bits and against the float
   vectors saved beside them (loaded memory-mapped): build time, bytes of the stored vectors,
   resident memory growth of the process while building, query latency p50 / p99 (one query
   per call; `--latency-queries` for the exact index, every scale query for the others), and
   recall@10 against the exact index's top 10. The speed ratio is exact p50 / HNSW p50.

Prints the tables and the goals of issue #47 (HNSW recall@10 >= 0.98 of exact at >= 20x its
query speed; binary + rescoring within 1 point of float recall@10 at <= 1/16 of its memory);
`--json` writes every figure, `--chart` a PNG of both parts. Needs FAISS
(`pip install "kbert[retrieval]"`).
"""

import argparse
import gc
import json
import random
import re
import time
from pathlib import Path

import numpy as np
from bench.charts import pyplot, save
from bench.data import (
    check_data_files,
    checkpoint_name,
    default_data_dir,
    resolve_checkpoint,
    squad_dev_paragraphs,
)
from bench.harness import (
    check_positive_ints,
    command_line,
    load_average,
    log,
    write_results,
)

MULTIPLIERS = (1, 2, 4, 10)
HEADING = re.compile(r"^\s*=+ .* =+\s*$")


def wikitext_passages(data_dir, words_per_passage):
    """wikitext-2 (valid and test) cut into passages of `words_per_passage` words: each
    article's text lines (headings dropped) joined, then cut; a last piece under 20 words is
    dropped. Articles start at a top-level heading `= Title =`."""
    passages = []
    for name in ("wiki.valid.raw", "wiki.test.raw"):
        text = (Path(data_dir) / "wikitext-2-raw" / name).read_text(encoding="utf-8")
        articles, current = [], []
        for line in text.splitlines():
            stripped = line.strip()
            if re.match(r"^= [^=].* =$", stripped):
                articles.append(current)
                current = []
            elif stripped and not HEADING.match(line):
                current.extend(stripped.split())
        articles.append(current)
        for words in articles:
            for start in range(0, len(words), words_per_passage):
                piece = words[start : start + words_per_passage]
                if len(piece) >= 20:
                    passages.append(" ".join(piece))
    return passages


def squad_corpus(data_dir, max_questions, seed):
    """`(questions, paragraphs, relevant)`: SQuAD dev questions (a seeded sample of
    `max_questions`, or all) and each one's paragraph index."""
    paragraphs = squad_dev_paragraphs(data_dir)
    questions = [(q["question"], i) for i, p in enumerate(paragraphs) for q in p["qas"]]
    if max_questions and max_questions < len(questions):
        questions = random.Random(seed).sample(questions, max_questions)
    return [q for q, _ in questions], [p["context"] for p in paragraphs], [i for _, i in questions]


def rss_bytes():
    """Resident memory of this process (Linux /proc)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def latencies(index, queries, **kwargs):
    """Seconds of each one-query `search` call, after one untimed call (warm-up)."""
    index.search(queries[:1], **kwargs)
    times = []
    for row in queries:
        start = time.perf_counter()
        index.search(row[None, :], **kwargs)
        times.append(time.perf_counter() - start)
    return times


def percentile(times, q):
    return float(np.percentile(np.asarray(times) * 1000, q))


def recall_against(found, expected):
    return float(np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(found, expected)]))


def quality_part(args, documents, queries, relevant, retrieval):
    from kbert.retrieval import EmbeddingIndex

    rows = []

    def evaluate(label, index, **kwargs):
        start = time.perf_counter()
        ids = index.search(queries, top_k=10, **kwargs)[1]
        seconds = time.perf_counter() - start
        row = {
            "index": label,
            "recall@10": 100 * retrieval.recall_at_k(ids, relevant, 10),
            "mrr@10": 100 * retrieval.mrr_at_k(ids, relevant, 10),
            "index_bytes": index.nbytes,
            "rescore_bytes_on_disk": index.rescore_nbytes,
            "search_seconds": seconds,
        }
        rows.append(row)
        log(
            f"  {label:<28s} recall@10 {row['recall@10']:6.2f}  MRR@10 {row['mrr@10']:6.2f}  "
            f"{row['index_bytes'] / 2**20:8.2f} MiB"
        )
        return row

    evaluate("float32 exact", EmbeddingIndex.from_shards(args.cache, precision="float32"))
    for precision in ("int8", "binary"):
        index = EmbeddingIndex.from_shards(args.cache, precision=precision)
        for multiplier in MULTIPLIERS:
            name = "no rescoring" if multiplier == 1 else f"rescore x{multiplier}"
            evaluate(
                f"{precision} {name}",
                index,
                rescore=multiplier > 1,
                rescore_multiplier=multiplier,
            )
        # The candidates rescored with the float vectors kept on disk beside the codes.
        index = EmbeddingIndex.from_shards(
            args.cache, precision=precision, rescore_vectors="float32"
        )
        for multiplier in MULTIPLIERS[1:]:
            evaluate(
                f"{precision} float rescore x{multiplier}", index, rescore_multiplier=multiplier
            )
    hnsw = EmbeddingIndex.from_embeddings(
        documents,
        approximate="hnsw",
        hnsw_m=args.hnsw_m,
        ef_construction=args.ef_construction,
        ef_search=args.ef_search[0],
    )
    evaluate("float32 HNSW", hnsw)
    return rows


def perturbed_corpus(documents, rows, noise, seed=0, chunk=100_000):
    """`rows` normalised vectors: a uniformly drawn document embedding plus Gaussian noise."""
    rng = np.random.default_rng(seed)
    out = np.empty((rows, documents.shape[1]), np.float32)
    for start in range(0, rows, chunk):
        count = min(chunk, rows - start)
        block = documents[rng.integers(len(documents), size=count)]
        block = block + noise * rng.standard_normal(block.shape, dtype=np.float32)
        out[start : start + count] = block / np.linalg.norm(block, axis=1, keepdims=True)
    return out


def built(label, make):
    gc.collect()
    before, start = rss_bytes(), time.perf_counter()
    index = make()
    seconds = time.perf_counter() - start
    gc.collect()
    growth = rss_bytes() - before
    log(f"  built {label} in {seconds:.1f} s (+{growth / 2**20:.0f} MiB resident)")
    return index, seconds, growth


def on_disk(index, path):
    """`index` saved to `path` and loaded back: its float rescoring vectors memory-mapped."""
    from kbert.retrieval import EmbeddingIndex

    index.save(path)
    return EmbeddingIndex.load(path)


def scale_part(args, documents, question_vectors):
    from kbert.retrieval import EmbeddingIndex

    log(
        f"scale: {args.scale_rows:,} perturbed vectors (noise {args.noise}), "
        f"{args.scale_queries} queries"
    )
    corpus = perturbed_corpus(documents, args.scale_rows, args.noise)
    queries = question_vectors[: args.scale_queries]
    rows = []
    exact, seconds, growth = built(
        "exact float32", lambda: EmbeddingIndex.from_embeddings(corpus, similarity="dot")
    )
    start = time.perf_counter()
    truth = exact.search(queries, top_k=10)[1]
    batch_seconds = time.perf_counter() - start
    times = latencies(exact, queries[: args.latency_queries], top_k=10)
    rows.append(
        {
            "index": "float32 exact (NumPy)",
            "build_seconds": seconds,
            "resident_growth": growth,
            "index_bytes": exact.nbytes,
            "p50_ms": percentile(times, 50),
            "p99_ms": percentile(times, 99),
            "latency_queries": len(times),
            "recall@10": 1.0,
            "batch_queries_per_second": len(queries) / batch_seconds,
        }
    )
    del exact
    gc.collect()
    for label, make, kwargs in (
        (
            "float32 HNSW (FAISS)",
            lambda: EmbeddingIndex.from_embeddings(
                corpus,
                similarity="dot",
                approximate="hnsw",
                hnsw_m=args.hnsw_m,
                ef_construction=args.ef_construction,
                ef_search=args.ef_search[0],
            ),
            {},
        ),
        (
            f"binary + rescore x{args.rescore_multiplier} (FAISS flat)",
            lambda: EmbeddingIndex.from_embeddings(
                corpus, similarity="dot", precision="binary", backend="faiss"
            ),
            {"rescore_multiplier": args.rescore_multiplier},
        ),
        (
            f"binary + float rescore x{args.rescore_multiplier} (FAISS flat, floats on disk)",
            lambda: on_disk(
                EmbeddingIndex.from_embeddings(
                    corpus,
                    similarity="dot",
                    precision="binary",
                    backend="faiss",
                    rescore_vectors="float32",
                ),
                Path(args.cache).parent / "benchmark_index_scale",
            ),
            {"rescore_multiplier": args.rescore_multiplier},
        ),
    ):
        index, seconds, growth = built(label, make)
        # HNSW: one row per search beam width (`--ef-search`), on the same graph.
        beams = args.ef_search if index.approximate == "hnsw" else [None]
        for beam in beams:
            if beam is not None:
                index.ef_search = beam
            times = latencies(index, queries, top_k=10, **kwargs)
            found = index.search(queries, top_k=10, **kwargs)[1]
            rows.append(
                {
                    "index": label if beam is None else f"{label}, ef_search {beam}",
                    "build_seconds": seconds,
                    "resident_growth": growth,
                    "index_bytes": index.nbytes,
                    "rescore_bytes_on_disk": index.rescore_nbytes,
                    "p50_ms": percentile(times, 50),
                    "p99_ms": percentile(times, 99),
                    "latency_queries": len(times),
                    "recall@10": recall_against(found, truth),
                    **({} if beam is None else {"ef_search": beam}),
                }
            )
        del index
        gc.collect()
    for row in rows:
        row["speedup_vs_exact_p50"] = rows[0]["p50_ms"] / row["p50_ms"]
        log(
            f"  {row['index']:<34s} build {row['build_seconds']:7.1f} s  "
            f"{row['index_bytes'] / 2**20:8.1f} MiB stored (+{row['resident_growth'] / 2**20:.0f}"
            f" MiB resident)  p50 {row['p50_ms']:8.2f} ms  p99 {row['p99_ms']:8.2f} ms  "
            f"recall@10 {row['recall@10']:.4f}  {row['speedup_vs_exact_p50']:.1f}x exact"
        )
    return rows


def goals(quality, scale):
    lines = []
    for hnsw in (r for r in scale if "HNSW" in r["index"]):
        lines.append(
            f"HNSW at {hnsw.get('rows', 'scale')}, ef_search {hnsw.get('ef_search')}: recall@10 "
            f"{hnsw['recall@10']:.4f} (goal >= 0.98): "
            f"{'met' if hnsw['recall@10'] >= 0.98 else 'NOT met'}; "
            f"{hnsw['speedup_vs_exact_p50']:.1f}x exact p50 (goal >= 20x): "
            f"{'met' if hnsw['speedup_vs_exact_p50'] >= 20 else 'NOT met'}"
        )
    float_row = quality[0]
    for row in quality:
        if row["index"].startswith(("binary rescore", "binary float rescore")):
            gap = float_row["recall@10"] - row["recall@10"]
            share = row["index_bytes"] / float_row["index_bytes"]
            ok = gap <= 1 and share <= 1 / 16
            lines.append(
                f"{row['index']}: recall@10 {row['recall@10']:.2f} vs float "
                f"{float_row['recall@10']:.2f}"
                f" ({gap:+.2f} points below; goal <= 1), memory 1/{1 / share:.0f} of float "
                f"(goal <= 1/16): {'met' if ok else 'NOT met'}"
            )
    return lines


def write_chart(quality, scale, path):
    plt = pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    labels = [r["index"] for r in quality]
    left.barh(labels, [r["recall@10"] for r in quality], color="#4c72b0")
    for y, row in enumerate(quality):
        left.text(
            row["recall@10"] + 0.3,
            y,
            f"{row['recall@10']:.2f}  ({row['index_bytes'] / 2**20:.2f} MiB)",
            va="center",
            fontsize=8,
        )
    low = min(r["recall@10"] for r in quality)
    left.set_xlim(max(0, low - 10), 100)
    left.invert_yaxis()
    left.set_xlabel("recall@10 (x 100), SQuAD dev + wikitext-2 distractors")
    left.set_title("Quantized search: recall@10 and stored bytes")
    names = [r["index"] for r in scale]
    right.barh(names, [r["p50_ms"] for r in scale], color="#dd8452")
    right.set_xscale("log")
    for y, row in enumerate(scale):
        right.text(
            row["p50_ms"] * 1.1,
            y,
            f"p50 {row['p50_ms']:.2f} ms, recall@10 "
            f"{row['recall@10']:.3f}, {row['index_bytes'] / 2**20:.0f} MiB",
            va="center",
            fontsize=8,
        )
    right.invert_yaxis()
    right.set_xlabel("one-query latency p50 (ms, log)")
    right.set_title(f"{scale[0].get('rows', 0):,} perturbed vectors")
    save(figure, path)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=str(default_data_dir()))
    parser.add_argument("--checkpoint", help="embedding model. Default: all-MiniLM-L6-v2")
    parser.add_argument(
        "--cache",
        default="runs/benchmark_index_shards",
        help="where the document embedding shards go (reused by a next run)",
    )
    parser.add_argument("--questions", type=int, default=None, help="default: all 10,570")
    parser.add_argument("--passage-words", type=int, default=120)
    parser.add_argument(
        "--distractors",
        type=int,
        default=None,
        help="wikitext-2 passages kept (the first N). Default: all",
    )
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--scale-rows", type=int, default=1_000_000)
    parser.add_argument("--scale-queries", type=int, default=1000)
    parser.add_argument("--latency-queries", type=int, default=100)
    parser.add_argument("--noise", type=float, default=0.02)
    parser.add_argument("--hnsw-m", type=int, default=32)
    parser.add_argument("--ef-construction", type=int, default=200)
    parser.add_argument(
        "--ef-search",
        type=int,
        nargs="+",
        default=[128, 256, 512],
        help="HNSW search beam widths, each timed on the same graph (the quality part: first)",
    )
    parser.add_argument("--rescore-multiplier", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the results to this JSON file")
    parser.add_argument("--chart", help="write a PNG chart to this path")
    args = parser.parse_args(argv)
    check_positive_ints(
        parser,
        args,
        [
            "questions",
            "passage_words",
            "distractors",
            "batch_size",
            "scale_rows",
            "scale_queries",
            "latency_queries",
            "hnsw_m",
            "ef_construction",
            "rescore_multiplier",
        ],
    )
    if min(args.ef_search) < 1:
        parser.error(f"--ef-search takes positive integers. Received: {args.ef_search}")
    return args


def main(argv=None):
    args = parse_args(argv)
    check_data_files(
        args.data_dir,
        "squad/dev-v1.1.json",
        "wikitext-2-raw/wiki.valid.raw",
        "wikitext-2-raw/wiki.test.raw",
    )
    checkpoint = resolve_checkpoint(args.checkpoint)
    load = load_average()
    from kbert import retrieval
    from kbert.models import BertTextEmbedder

    questions, paragraphs, relevant = squad_corpus(args.data_dir, args.questions, args.seed)
    distractors = wikitext_passages(args.data_dir, args.passage_words)[: args.distractors]
    texts = paragraphs + distractors
    log(
        f"quality: {len(questions)} SQuAD dev questions over {len(paragraphs)} paragraphs + "
        f"{len(distractors)} wikitext-2 passages ({checkpoint_name(checkpoint)})"
    )
    embedder = BertTextEmbedder.from_preset(checkpoint)
    start = time.perf_counter()
    embedder.encode_document(
        texts, batch_size=args.batch_size, output_dir=args.cache, verbose=False
    )
    encode_seconds = time.perf_counter() - start
    from kbert.models.process_inference import load_shards

    documents = load_shards(args.cache)
    query_vectors = embedder.encode_query(questions, batch_size=args.batch_size)
    log(f"  encoded in {encode_seconds:.0f} s (documents; 0 when the shards were there)")
    quality = quality_part(args, documents, query_vectors, relevant, retrieval)
    scale = scale_part(args, documents, query_vectors)
    for row in scale:
        row["rows"] = args.scale_rows
    lines = goals(quality, scale)
    for line in lines:
        print(line)
    settings = {
        "checkpoint": checkpoint_name(checkpoint),
        "questions": len(questions),
        "paragraphs": len(paragraphs),
        "distractors": len(distractors),
        **{k: v for k, v in vars(args).items() if k not in ("json", "chart")},
    }
    if args.json:
        write_results(
            args.json,
            command_line(__file__, argv),
            settings,
            load,
            load_average(),
            {"quality": quality, "scale": scale, "goals": lines},
        )
    if args.chart:
        write_chart(quality, scale, args.chart)
    print(json.dumps({"quality": quality, "scale": scale}, indent=1))


if __name__ == "__main__":
    main()
