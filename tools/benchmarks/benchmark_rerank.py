"""predict speed: kbert's BertCrossEncoder on each backend against sentence-transformers.

    python tools/benchmarks/benchmark_rerank.py --data-dir DATA --rounds 2 --json r.json \
        --chart r.png

Scores (query, document) pairs of two lengths: `short`, the first `--short` SQuAD v1.1 dev
questions each paired with the SST-2 dev sentence of the same position (a short document, as in the
serving benchmark's short texts), and `long`, the first `--long` SQuAD dev questions each paired
with its own paragraph (cut at the model's maximum length, 512 tokens for the default checkpoint,
as Hugging Face's tokenizer cuts a pair). Every pair is scored with
`BertCrossEncoder.from_preset(checkpoint).predict(pairs, batch_size)` on each Keras backend, with
its serving exports (`kbert-onnx`, `kbert-onnx-int8`, `kbert-openvino`:
`kbert.serving.from_model(model, runtime).predict(pairs, batch_size)`, exported untimed in the
worker) and with `CrossEncoder(checkpoint).predict(pairs, batch_size)`, CPU, float32 (int8 weights
for `kbert-onnx-int8`), on the same cross-encoder directory (`--checkpoint`). Without one, the
script writes a cross-encoder directory in a temporary folder: all-MiniLM-L6-v2's architecture and
vocabulary with random weights and a one-label classification head (the work per pair of a trained
reranker of that size, e.g. cross-encoder/ms-marco-MiniLM-L6-v2; the scores mean nothing). Every
system runs in its own process (the `bench` harness): one untimed pass over each workload, then
`--repeats` timed passes, the best kept; `--rounds N` keeps each system's fastest of N rounds.
Prints pairs per second, the ratio to sentence-transformers and the largest difference between each
kbert system's scores and sentence-transformers'; `--json` writes the results, `--chart` a bar
chart of them.

`sentence-transformers-onnx` and `sentence-transformers-onnx-int8` are sentence-transformers'
own ONNX backend (`CrossEncoder(checkpoint, backend="onnx")`, exported by optimum in the worker;
int8: `export_dynamic_quantized_onnx_model(model, "avx512_vnni", ...)`). It needs
`optimum-onnx`, which pins transformers 4.x: those workers run under `--st-onnx-python`, the
interpreter of an environment of their own (setup in benchmark_embeddings.py's docstring);
without it they are left out of the default systems.
"""

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from bench import st_onnx
from bench.charts import ratio_bars, titled
from bench.compare import run_comparison
from bench.data import (
    check_data_files,
    default_data_dir,
    random_minilm,
    squad_dev_paragraphs,
    sst2_dev_sentences,
)
from bench.harness import (
    check_positive_ints,
    emit,
    timed_row,
)
from bench.tables import ratio_table

SYSTEMS = (
    "kbert-torch",
    "kbert-jax",
    "kbert-tensorflow",
    "kbert-onnx",
    "kbert-onnx-int8",
    "kbert-openvino",
    "sentence-transformers",
    *st_onnx.SYSTEMS,
)
# kbert's served exports (`kbert.serving.from_model(model, runtime)`), by system name.
SERVED = {"kbert-onnx": "onnx", "kbert-onnx-int8": "onnx-int8", "kbert-openvino": "openvino"}
WORKLOADS = ("short", "long")
TITLES = {
    "short": "SQuAD dev question, SST-2 dev sentence",
    "long": "SQuAD dev question, its paragraph",
}
REFERENCE = "sentence-transformers"
DATA_FILES = ("squad/dev-v1.1.json", "glue/SST-2/dev.tsv")


def load_pairs(data_dir, counts):
    """The (query, document) pairs of each workload: the first `counts["short"]` SQuAD dev
    questions with the SST-2 dev sentence of the same position, the first `counts["long"]`
    with their paragraph."""
    with_paragraph = [
        (q["question"], p["context"]) for p in squad_dev_paragraphs(data_dir) for q in p["qas"]
    ]
    sentences = sst2_dev_sentences(data_dir)
    short = [(question, sentence) for (question, _), sentence in zip(with_paragraph, sentences)]
    return {"short": short[: counts["short"]], "long": with_paragraph[: counts["long"]]}


def random_cross_encoder_directory(target):
    """A CrossEncoder directory written by sentence-transformers: MiniLM-L6's architecture and
    vocabulary, random weights (seed 0) with a one-label classification head."""
    import transformers
    from sentence_transformers import CrossEncoder

    # Weights drawn at 5x BERT's initializer range: at 0.02 a random encoder gives nearly the
    # same [CLS] vector for every pair (scores within 1e-4 of each other), so the scores could
    # not show a pair cut or packed otherwise; at 0.1 they spread over most of (0, 1).
    classifier = random_minilm(
        transformers.BertForSequenceClassification,
        Path(target) / "classifier",
        num_labels=1,
        initializer_range=0.1,
    )
    directory = Path(target) / "cross-encoder-minilm-l6-random"
    CrossEncoder(classifier, device="cpu").save(str(directory))
    shutil.copy(Path(classifier) / "vocab.txt", directory / "vocab.txt")  # what kbert reads
    return str(directory)


def build_scorer(spec):
    """`score(pairs) -> NumPy` of the system, built in its worker."""
    batch_size = spec["batch_size"]
    if spec["system"] == REFERENCE:
        from sentence_transformers import CrossEncoder

        model = CrossEncoder(spec["checkpoint"], device="cpu")
        return lambda pairs: model.predict(pairs, batch_size=batch_size, show_progress_bar=False)
    if spec["system"] in st_onnx.SYSTEMS:  # exported once, here, untimed
        model = st_onnx.load_model(
            spec["checkpoint"], spec["system"], spec["out_dir"], kind="cross-encoder"
        )
        return lambda pairs: model.predict(pairs, batch_size=batch_size, show_progress_bar=False)
    from kbert.models import BertCrossEncoder

    model = BertCrossEncoder.from_preset(spec["checkpoint"])
    if spec["system"] in SERVED:  # exported once, here, untimed
        import kbert.serving

        model = kbert.serving.from_model(model, SERVED[spec["system"]])
    return lambda pairs: model.predict(pairs, batch_size=batch_size)


def worker_main(spec):
    import numpy as np

    score = build_scorer(spec)
    workloads = load_pairs(spec["data_dir"], spec["counts"])
    results = []
    for workload in WORKLOADS:
        pairs = workloads[workload]
        scores = score(pairs)  # Untimed: every shape compiled, every cache filled.
        np.save(Path(spec["out_dir"]) / f"{spec['system']}-{workload}.npy", scores)
        results.append(timed_row(spec, workload, pairs, score))
    emit(results)


def add_differences(results, out_dir):
    """Each kbert row gets `max_abs_diff`: its scores against sentence-transformers'."""
    import numpy as np

    for row in results:
        reference = Path(out_dir) / f"{REFERENCE}-{row['workload']}.npy"
        ours = Path(out_dir) / f"{row['system']}-{row['workload']}.npy"
        if row["system"] != REFERENCE and reference.is_file() and ours.is_file():
            row["max_abs_diff"] = float(np.abs(np.load(ours) - np.load(reference)).max())
    return results


def format_table(results):
    columns = [("max |diff|", "max_abs_diff", "{:.1e}")]
    return ratio_table(results, WORKLOADS, REFERENCE, columns, unit="pairs")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--checkpoint", default=None, help="A CrossEncoder directory. Default: a random one."
    )
    parser.add_argument("--data-dir", default=str(default_data_dir()))
    st_onnx.add_arguments(parser, SYSTEMS)
    parser.add_argument("--short", type=int, default=512, help="(question, SST-2 sentence) pairs")
    parser.add_argument("--long", type=int, default=128, help="(question, paragraph) pairs")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2, help="timed passes; best kept")
    parser.add_argument("--rounds", type=int, default=1, help="passes over all systems")
    parser.add_argument("--json", help="write the results to this JSON file")
    parser.add_argument("--chart", help="write a PNG bar chart to this path")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    check_positive_ints(parser, args, ("short", "long", "batch_size", "repeats", "rounds"))
    args.system = st_onnx.default_systems(args, SYSTEMS)
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        worker_main(json.loads(args.worker))
        return
    check_data_files(args.data_dir, *DATA_FILES)
    counts = {"short": args.short, "long": args.long}
    available = {w: len(pairs) for w, pairs in load_pairs(args.data_dir, counts).items()}
    for workload, count in counts.items():
        if available[workload] < count:
            raise SystemExit(
                f"--{workload} must be at most {available[workload]} (the {workload} pairs "
                f"{args.data_dir} holds). Received: {count}"
            )
    out_dir = tempfile.mkdtemp(prefix="kbert-rerank-")
    checkpoint = args.checkpoint or random_cross_encoder_directory(out_dir)
    if not Path(checkpoint).is_dir():
        raise SystemExit(f"--checkpoint must be a CrossEncoder directory. Received: {checkpoint!r}")
    report = {
        "differences": add_differences,
        "table": format_table,
        "chart": lambda results, path, title: ratio_bars(
            results, path, title, WORKLOADS, anchor=REFERENCE, heading=titled(TITLES), unit="pairs"
        ),
    }
    run_comparison(
        __file__,
        argv,
        args,
        checkpoint,
        out_dir,
        counts,
        WORKLOADS,
        report,
        environment=st_onnx.environment(args),
    )


if __name__ == "__main__":
    main()
