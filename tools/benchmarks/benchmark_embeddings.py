"""encode speed: kbert's BertTextEmbedder on each backend against sentence-transformers.

    python tools/benchmarks/benchmark_embeddings.py --data-dir DATA --rounds 2 --json e.json \
        --chart e.png

Encodes SQuAD v1.1 dev questions (short texts, the first `--questions`) and paragraphs (long
texts, the first `--paragraphs`) with `BertTextEmbedder.from_preset(checkpoint).encode(texts,
batch_size)` on each Keras backend and with `SentenceTransformer(checkpoint).encode(texts,
batch_size)`, on all-MiniLM-L6-v2 (or `--checkpoint`), CPU, float32. Every system runs in its
own process (one Keras backend per process; two engines in one process compete for the same
cores with their idle threads), as a user's plain script would: one untimed pass over each
workload, then `--repeats` timed passes, the best kept. `--rounds N` runs the whole list of
systems N times one after the other and keeps each system's fastest round. Prints texts per
second, the ratio to sentence-transformers (issue #21's goals: >= 1.2x on the best backend,
>= 1.0x on every backend) and the largest difference between each kbert system's embeddings
and sentence-transformers'.

Serving runtimes (issue #31): `kbert-onnx`, `kbert-onnx-int8`, `kbert-openvino`,
`kbert-openvino-int8` export the embedder once in their worker (untimed:
`kbert.export.export_onnx(embedder, dir, quantize=...)` / `export_openvino`) and time
`kbert.serving.load(dir).encode(texts, batch_size)`. `sentence-transformers-onnx` and
`sentence-transformers-onnx-int8` are sentence-transformers' own ONNX backend
(`SentenceTransformer(checkpoint, backend="onnx")`, exported by optimum in the worker; int8:
`export_dynamic_quantized_onnx_model(model, "avx512_vnni", ...)`, loaded with its
`onnx/model_qint8_avx512_vnni.onnx`). That backend needs `optimum-onnx`, which pins
transformers 4.x, so it runs in its own virtual environment, named by `--st-onnx-python`:

    python3.11 -m venv .venv-st-onnx
    .venv-st-onnx/bin/pip install torch==2.13.0 sentence-transformers 'optimum-onnx[onnxruntime]'

(on 2026-11-27 this resolved to sentence-transformers 5.7.0, optimum-onnx 0.1.0, optimum
2.1.0, transformers 4.57.6, onnxruntime 1.32.0). Every row also gets the mean and smallest
cosine of its embeddings to sentence-transformers' float32 (torch) embeddings. `--max-length`
sets both sides' token limit (all-MiniLM-L6-v2's own is 256).
"""

import argparse
import json
import tempfile
from pathlib import Path

from bench import st_onnx
from bench.charts import ratio_bars
from bench.data import checkpoint_name, default_data_dir, resolve_checkpoint
from bench.harness import (
    check_positive_ints,
    command_line,
    emit,
    load_average,
    run_rounds,
    timed_row,
    write_results,
)

SYSTEMS = (
    "kbert-torch",
    "kbert-jax",
    "kbert-tensorflow",
    "kbert-torch-int8",
    "kbert-jax-int8",
    "kbert-tensorflow-int8",
    "kbert-onnx",
    "kbert-onnx-int8",
    "kbert-openvino",
    "kbert-openvino-int8",
    "sentence-transformers",
    "sentence-transformers-onnx",
    "sentence-transformers-onnx-int8",
)
WORKLOADS = ("questions", "paragraphs", "sst2")
REFERENCE = "sentence-transformers"


def load_texts(data_dir, counts):
    """The texts of each workload: the first `counts["questions"]` SQuAD dev questions and the
    first `counts["paragraphs"]` paragraphs."""
    with open(Path(data_dir) / "squad" / "dev-v1.1.json", encoding="utf-8") as f:
        paragraphs = [p for a in json.load(f)["data"] for p in a["paragraphs"]]
    texts = {
        "questions": [q["question"] for p in paragraphs for q in p["qas"]][: counts["questions"]],
        "paragraphs": [p["context"] for p in paragraphs][: counts["paragraphs"]],
    }
    sst2 = Path(data_dir) / "glue" / "SST-2" / "dev.tsv"
    if counts.get("sst2") and sst2.is_file():
        lines = sst2.read_text(encoding="utf-8").splitlines()[1:]
        texts["sst2"] = [line.split("\t")[0] for line in lines][: counts["sst2"]]
    return texts


def build_encoder(spec):
    """`encode(texts) -> NumPy` of the system, built in its worker."""
    batch_size = spec["batch_size"]
    length = spec.get("max_length")
    if spec["system"].startswith(REFERENCE):
        from sentence_transformers import SentenceTransformer

        if spec["system"] in st_onnx.SYSTEMS:
            model = st_onnx.load_model(spec["checkpoint"], spec["system"], spec["out_dir"])
        else:
            model = SentenceTransformer(spec["checkpoint"], device="cpu")
        if length:
            model.max_seq_length = length
        return lambda texts: model.encode(texts, batch_size=batch_size, convert_to_numpy=True)
    from kbert.models import BertTextEmbedder

    settings = {"sequence_length": length} if length else {}
    model = BertTextEmbedder.from_preset(spec["checkpoint"], **settings)
    runtime = spec["system"].split("-", 1)[1]
    if spec["system"].endswith("-int8") and not runtime.startswith(("onnx", "openvino")):
        model.quantize("int8")  # Keras' int8 layers; torch's int8 kernel on torch
    if runtime.startswith(("onnx", "openvino")):
        from kbert import export, serving

        directory = Path(spec["out_dir"]) / f"{spec['system']}-export"
        quantize = "int8" if runtime.endswith("int8") else None
        if runtime.startswith("onnx"):
            export.export_onnx(model, directory, quantize=quantize)
        else:
            export.export_openvino(model, directory, quantize=quantize)
        served = serving.load(directory)
        return lambda texts: served.encode(texts, batch_size=batch_size)
    return lambda texts: model.encode(texts, batch_size=batch_size)


def worker_main(spec):
    import numpy as np

    encode = build_encoder(spec)
    workloads = load_texts(spec["data_dir"], spec["counts"])
    results = []
    for workload in WORKLOADS:
        if workload not in workloads:
            continue
        texts = workloads[workload]
        embeddings = encode(texts)  # Untimed: every shape compiled, every cache filled.
        np.save(Path(spec["out_dir"]) / f"{spec['system']}-{workload}.npy", embeddings)
        results.append(timed_row(spec, workload, texts, encode))
    emit(results)


def add_differences(results, out_dir):
    """Each kbert row gets `max_abs_diff`: its embeddings against sentence-transformers'."""
    import numpy as np

    for row in results:
        reference = Path(out_dir) / f"{REFERENCE}-{row['workload']}.npy"
        ours = Path(out_dir) / f"{row['system']}-{row['workload']}.npy"
        if row["system"] != REFERENCE and reference.is_file() and ours.is_file():
            ours, reference = np.load(ours), np.load(reference)
            row["max_abs_diff"] = float(np.abs(ours - reference).max())
            cosines = np.sum(ours * reference, -1) / (
                np.linalg.norm(ours, axis=-1) * np.linalg.norm(reference, axis=-1)
            )
            row["cosine_mean"] = float(cosines.mean())
            row["cosine_min"] = float(cosines.min())
    return results


def format_table(results):
    lines = []
    for workload in WORKLOADS:
        rows = [r for r in results if r["workload"] == workload]
        if not rows:
            continue
        lines.append(f"\n{workload}: {rows[0].get('texts', '?')} texts")
        lines.append(
            f"  {'system':<32} {'texts/s':>9} {'vs s-t':>7} {'max |diff|':>11} "
            f"{'cos mean':>9} {'cos min':>8}"
        )
        anchor = next(
            (r["texts_per_second"] for r in rows if r["system"] == REFERENCE and "error" not in r),
            None,
        )
        for r in rows:
            if "error" in r:
                lines.append(f"  {r['system']:<32} failed: {r['error'][:70]}")
                continue
            rate = r["texts_per_second"]
            ratio = f"{rate / anchor:.2f}x" if anchor else "-"
            diff = f"{r['max_abs_diff']:.1e}" if "max_abs_diff" in r else "-"
            mean = f"{r['cosine_mean']:.4f}" if "cosine_mean" in r else "-"
            low = f"{r['cosine_min']:.4f}" if "cosine_min" in r else "-"
            lines.append(
                f"  {r['system']:<32} {rate:>9.1f} {ratio:>7} {diff:>11} {mean:>9} {low:>8}"
            )
    return "\n".join(lines)


def squad_heading(workload, rows):
    return f"SQuAD dev {workload}"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", default=None, help="Default: all-MiniLM-L6-v2.")
    parser.add_argument("--data-dir", default=str(default_data_dir()))
    parser.add_argument("--questions", type=int, default=1024)
    parser.add_argument("--paragraphs", type=int, default=256)
    parser.add_argument("--sst2", type=int, default=872, help="SST-2 dev sentences (0: none)")
    parser.add_argument("--max-length", type=int, default=None, help="token limit, both sides")
    st_onnx.add_arguments(parser, SYSTEMS)
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
    if not (Path(args.data_dir) / "squad" / "dev-v1.1.json").is_file():
        raise SystemExit(f"--data-dir must hold squad/dev-v1.1.json. Received: {args.data_dir!r}")
    checkpoint = resolve_checkpoint(args.checkpoint)
    command = command_line(__file__, argv)
    load = load_average()
    out_dir = tempfile.mkdtemp(prefix="kbert-embeddings-")
    base = {
        "checkpoint": checkpoint,
        "data_dir": args.data_dir,
        "counts": {"questions": args.questions, "paragraphs": args.paragraphs, "sst2": args.sst2},
        "max_length": args.max_length,
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "device": "cpu",
        "out_dir": out_dir,
    }
    environment = st_onnx.environment(args)

    results = add_differences(
        run_rounds(__file__, base, args.system, args.rounds, WORKLOADS, environment), out_dir
    )
    end_load = load_average()
    title = (
        f"{checkpoint_name(checkpoint)}, "
        f"batch {args.batch_size}, float32, CPU; load average {load[0]:.1f} -> {end_load[0]:.1f}"
    )
    print(f"\n{title}")
    print(format_table(results))
    if args.chart:
        ratio_bars(results, args.chart, title, WORKLOADS, anchor=REFERENCE, heading=squad_heading)
        print(f"chart written to {args.chart}")
    if args.json:
        settings = {k: v for k, v in base.items() if k not in ("out_dir", "data_dir")}
        write_results(args.json, command, settings, load, end_load, results)


if __name__ == "__main__":
    main()
