"""encode speed: kbert's BertSparseEncoder (SPLADE) on each backend against sentence-transformers.

    python tools/benchmarks/benchmark_sparse.py --data-dir DATA --rounds 2 --json s.json \
        --chart s.png

Encodes SQuAD v1.1 dev questions (short texts, the first `--questions`) and paragraphs (long texts,
the first `--paragraphs`) with `BertSparseEncoder.from_preset(checkpoint).encode(texts,
batch_size)` on each Keras backend, with its serving exports (`kbert-onnx`, `kbert-onnx-int8`,
`kbert-openvino`: `kbert.serving.from_model(encoder, runtime).encode(texts, batch_size)`, exported
untimed in the worker) and with `SparseEncoder(checkpoint).encode(texts, batch_size)`, CPU, float32
(int8 weights for `kbert-onnx-int8`), on the same SparseEncoder directory (`--checkpoint`). Without
one, the script writes a SparseEncoder directory in a temporary folder: all-MiniLM-L6-v2's
architecture and 30,522-token vocabulary with random masked-LM weights (the same work per text as a
trained model of that size; the vectors mean nothing, and nearly every vocabulary entry is active
where a trained model keeps ~100, so building the sparse output weighs more than it would). Every
system runs in its own process, as `benchmark_embeddings.py` does (the `bench` harness): one
untimed pass over each workload, then `--repeats` timed passes, the best kept; `--rounds N` keeps
each system's fastest of N rounds. Prints texts per second, the ratio to sentence-transformers, and
the largest difference between each kbert system's vectors and sentence-transformers'; `--json`
writes the results, `--chart` a bar chart of them.

`sentence-transformers-onnx` and `sentence-transformers-onnx-int8` are sentence-transformers'
own ONNX backend for `SparseEncoder` (`SparseEncoder(checkpoint, backend="onnx")`, exported by
optimum in the worker; int8: `export_dynamic_quantized_onnx_model(model, "avx512_vnni", ...)`).
It needs `optimum-onnx`, which pins transformers 4.x: those workers run under
`--st-onnx-python`, the interpreter of an environment of their own (setup in
benchmark_embeddings.py's docstring); without it they are left out of the default systems.
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
WORKLOADS = ("questions", "paragraphs")
TITLES = {"questions": "SQuAD dev questions", "paragraphs": "SQuAD dev paragraphs"}
REFERENCE = "sentence-transformers"


def load_texts(data_dir, counts):
    """The first `counts["questions"]` SQuAD dev questions and `counts["paragraphs"]`
    paragraphs."""
    paragraphs = squad_dev_paragraphs(data_dir)
    return {
        "questions": [q["question"] for p in paragraphs for q in p["qas"]][: counts["questions"]],
        "paragraphs": [p["context"] for p in paragraphs][: counts["paragraphs"]],
    }


def random_splade_directory(target):
    """A SparseEncoder directory written by sentence-transformers: MiniLM-L6's architecture and
    vocabulary, random masked-LM weights (seed 0)."""
    import transformers
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    masked_lm = random_minilm(transformers.BertForMaskedLM, Path(target) / "masked_lm")
    model = SparseEncoder(
        modules=[MLMTransformer(masked_lm, max_seq_length=256), SpladePooling("max")],
        device="cpu",
    )
    directory = Path(target) / "splade-minilm-l6-random"
    model.save(str(directory))
    shutil.copy(Path(masked_lm) / "vocab.txt", directory / "vocab.txt")  # what kbert reads
    return str(directory)


def build_encoder(spec):
    """`encode(texts) -> SciPy CSR` of the system, built in its worker."""
    batch_size = spec["batch_size"]
    if spec["system"] == REFERENCE or spec["system"] in st_onnx.SYSTEMS:
        import numpy as np
        import scipy.sparse
        from sentence_transformers import SparseEncoder

        if spec["system"] == REFERENCE:
            model = SparseEncoder(spec["checkpoint"], device="cpu")
        else:  # exported once, here, untimed
            model = st_onnx.load_model(
                spec["checkpoint"], spec["system"], spec["out_dir"], kind="sparse-encoder"
            )

        def encode(texts):
            vectors = model.encode(texts, batch_size=batch_size).coalesce()
            rows, columns = vectors.indices().numpy()
            values = vectors.values().numpy().astype(np.float32)
            return scipy.sparse.csr_matrix((values, (rows, columns)), shape=tuple(vectors.shape))

        return encode
    from kbert.models import BertSparseEncoder

    model = BertSparseEncoder.from_preset(spec["checkpoint"])
    if spec["system"] in SERVED:  # exported once, here, untimed
        import kbert.serving

        model = kbert.serving.from_model(model, SERVED[spec["system"]])
    return lambda texts: model.encode(texts, batch_size=batch_size)


def worker_main(spec):
    import scipy.sparse

    encode = build_encoder(spec)
    workloads = load_texts(spec["data_dir"], spec["counts"])
    results = []
    for workload in WORKLOADS:
        texts = workloads[workload]
        vectors = encode(texts)  # Untimed: every shape compiled, every cache filled.
        scipy.sparse.save_npz(Path(spec["out_dir"]) / f"{spec['system']}-{workload}.npz", vectors)
        results.append(
            timed_row(spec, workload, texts, encode, active_dims=vectors.nnz / len(texts))
        )
    emit(results)


def add_differences(results, out_dir):
    """Each kbert row gets `max_abs_diff`: its vectors against sentence-transformers'."""
    import numpy as np
    import scipy.sparse

    for row in results:
        reference = Path(out_dir) / f"{REFERENCE}-{row['workload']}.npz"
        ours = Path(out_dir) / f"{row['system']}-{row['workload']}.npz"
        if row["system"] != REFERENCE and reference.is_file() and ours.is_file():
            difference = scipy.sparse.load_npz(ours) - scipy.sparse.load_npz(reference)
            row["max_abs_diff"] = float(np.abs(difference).max()) if difference.nnz else 0.0
    return results


def format_table(results):
    columns = [("max |diff|", "max_abs_diff", "{:.1e}"), ("active", "active_dims", "{:.0f}")]
    return ratio_table(results, WORKLOADS, REFERENCE, columns)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--checkpoint", default=None, help="A SparseEncoder directory. Default: a random one."
    )
    parser.add_argument("--data-dir", default=str(default_data_dir()))
    st_onnx.add_arguments(parser, SYSTEMS)
    parser.add_argument("--questions", type=int, default=512)
    parser.add_argument("--paragraphs", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2, help="timed passes; best kept")
    parser.add_argument("--rounds", type=int, default=1, help="passes over all systems")
    parser.add_argument("--json", help="write the results to this JSON file")
    parser.add_argument("--chart", help="write a PNG bar chart to this path")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    names = ("questions", "paragraphs", "batch_size", "repeats", "rounds")
    check_positive_ints(parser, args, names)
    args.system = st_onnx.default_systems(args, SYSTEMS)
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        worker_main(json.loads(args.worker))
        return
    check_data_files(args.data_dir, "squad/dev-v1.1.json")
    out_dir = tempfile.mkdtemp(prefix="kbert-sparse-")
    checkpoint = args.checkpoint or random_splade_directory(out_dir)
    if not Path(checkpoint).is_dir():
        raise SystemExit(
            f"--checkpoint must be a SparseEncoder directory. Received: {checkpoint!r}"
        )
    report = {
        "differences": add_differences,
        "table": format_table,
        "chart": lambda results, path, title: ratio_bars(
            results, path, title, WORKLOADS, anchor=REFERENCE, heading=titled(TITLES)
        ),
    }
    run_comparison(
        __file__,
        argv,
        args,
        checkpoint,
        out_dir,
        {"questions": args.questions, "paragraphs": args.paragraphs},
        WORKLOADS,
        report,
        environment=st_onnx.environment(args),
    )


if __name__ == "__main__":
    main()
