"""Serving benchmark: raw texts in, model outputs out, kbert on each backend against Hugging Face,
sentence-transformers and kbert's ONNX export under onnxruntime, on the same checkpoint.

Two workloads of real text (`/work/shared/data`, or `--data-dir`):

* `short`: the 872 SST-2 dev sentences, truncated at `--short-length` tokens (128);
* `long`: the first 400 SQuAD dev paragraphs, truncated at `--long-length` tokens (512).

Systems, each in its own process (a Keras backend is fixed when Keras is imported), each as a
user's plain script serves a list of strings at `--batch-size`:

* `kbert-torch`, `kbert-jax`, `kbert-tensorflow`: `BertClassifier.from_preset(checkpoint,
  num_classes=2, sequence_length=L).predict(texts, batch_size=B)` (its default length-aware
  batching); `kbert-<backend>-int8`: the same model after `model.quantize("int8")` (on torch,
  torch's int8 linear kernel; elsewhere Keras' int8 layers); `kbert-<backend>-float8`: after
  `model.quantize("float8")` (Keras' float8 layers: inputs and weights rounded to float8
  with per-tensor scales; XLA on a GPU with float8 units can run the products in float8);
* `hf`: `AutoTokenizer` with `padding=True, truncation=True` per batch of the texts in their
  order, `AutoModelForSequenceClassification` under `torch.inference_mode()`;
* `sentence-transformers`: `SentenceTransformer(checkpoint).encode(texts, batch_size=B)` with
  `max_seq_length = L` (it sorts by length and pads per batch);
* `onnx`: the classifier exported by `kbert.export.export_onnx` (dynamic batch and sequence
  axes, exported once before timing), fed by the checkpoint's HF fast tokenizer with the texts
  sorted by length and padded per batch, under `onnxruntime.InferenceSession`;
* `kbert-onnx`, `kbert-onnx-int8`, `kbert-openvino`, `kbert-openvino-int8`: the classifier
  exported once per worker (untimed) into a serving directory by
  `kbert.export.export_onnx(model, dir, quantize=None | "int8")` / `export_openvino`, served by
  `kbert.serving.load(dir, sequence_length=L).predict(texts, batch_size=B)` (kbert's
  tokenizer, packer and length-ordered batches);
* `sentence-transformers-onnx`, `sentence-transformers-onnx-int8`: sentence-transformers'
  ONNX backend (exported by optimum in the worker; int8 by its
  `export_dynamic_quantized_onnx_model(model, "avx512_vnni", ...)`). It needs `optimum-onnx`,
  which pins transformers 4.x, so these workers run under `--st-onnx-python`, the interpreter
  of a separate environment (see tools/benchmarks/benchmark_embeddings.py for its setup; the
  embeddings benchmark also reports each quantized path's cosine to float32).

Every system first serves the whole workload once untimed (compilation of every shape, caches),
then `--repeats` timed passes; the best pass is kept. `--rounds N` runs the whole list of
systems N times, one after the other, and keeps each system's fastest round (a machine whose
speed drifts over minutes then penalises every system alike). The outputs come back to the
host as NumPy arrays in every system. Texts per second and the ratios to HF and to
sentence-transformers are printed, all from the same run; `--json` and `--chart` write them
(the chart as a PNG).

On a GPU: `--device gpu --dtype bfloat16 --batch-size 128` (HF and sentence-transformers cast
to bfloat16, kbert built with `dtype="bfloat16"`, ONNX on onnxruntime's CUDA provider in
float32 when it has one). `--device cpu` hides every GPU from the workers.

Example:
```
python tools/benchmarks/benchmark_serving.py --chart serving.png --json serving.json
python tools/benchmarks/benchmark_serving.py --workload short --system kbert-torch hf \
    --max-texts 128
python tools/benchmarks/benchmark_serving.py --device gpu --dtype bfloat16 --batch-size 128
```
"""

import argparse
import csv
import json
import os
import tempfile
import time
from pathlib import Path

from bench import st_onnx
from bench.charts import ratio_bars
from bench.data import checkpoint_name, default_data_dir, resolve_checkpoint
from bench.harness import (
    check_positive_ints,
    command_line,
    emit,
    load_average,
    log,
    run_rounds,
    timed_row,
    write_results,
)

INT8_SYSTEMS = ("kbert-torch-int8", "kbert-jax-int8", "kbert-tensorflow-int8")
FLOAT8_SYSTEMS = ("kbert-torch-float8", "kbert-jax-float8", "kbert-tensorflow-float8")
SYSTEMS = (
    "kbert-torch",
    "kbert-jax",
    "kbert-tensorflow",
    "kbert-onnx",
    "kbert-onnx-int8",
    "kbert-openvino",
    "kbert-openvino-int8",
    "hf",
    "sentence-transformers",
    "sentence-transformers-onnx",
    "sentence-transformers-onnx-int8",
    "onnx",
    *INT8_SYSTEMS,
    *FLOAT8_SYSTEMS,
)
WORKLOADS = ("short", "long")


def load_texts(workload, data_dir, max_texts=None):
    """The texts of a workload: SST-2 dev sentences or the first 400 SQuAD dev paragraphs."""
    data_dir = Path(data_dir)
    if workload == "short":
        path = data_dir / "glue" / "SST-2" / "dev.tsv"
        with open(path, encoding="utf-8", newline="") as f:
            rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
        if not rows or rows[0][:1] != ["sentence"]:
            raise SystemExit(f"{path}: expected a header starting with 'sentence'")
        texts = [row[0] for row in rows[1:]]
    else:
        path = data_dir / "squad" / "dev-v1.1.json"
        with open(path, encoding="utf-8") as f:
            articles = json.load(f)["data"]
        texts = [p["context"] for a in articles for p in a["paragraphs"]][:400]
    return texts[:max_texts] if max_texts else texts


# ----------------------------------------------------------------------------- the systems
# Each builder returns `serve(texts) -> None`; it runs in a worker with the right environment.


def _kbert(spec):
    from kbert.models import BertClassifier

    kwargs = {"num_classes": 2, "sequence_length": spec["length"], "fresh_heads": True}
    if spec["dtype"] != "float32":
        kwargs["dtype"] = spec["dtype"]
    model = BertClassifier.from_preset(spec["checkpoint"], **kwargs)
    mode = spec["system"].rsplit("-", 1)[1]
    if mode in ("int8", "float8"):
        model.quantize(mode)
    batch_size = spec["batch_size"]

    def serve(texts):
        model.predict(texts, batch_size=batch_size, verbose=0)

    return serve


def _torch_device_and_dtype(spec):
    import torch

    return ("cuda" if spec["device"] == "gpu" else "cpu"), getattr(torch, spec["dtype"])


def _hf(spec):
    import torch
    import transformers

    transformers.logging.set_verbosity_error()  # The fresh 2-class head's warning.
    device, dtype = _torch_device_and_dtype(spec)
    tokenizer = transformers.AutoTokenizer.from_pretrained(spec["checkpoint"])
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        spec["checkpoint"], num_labels=2, attn_implementation="sdpa"
    )
    model = model.to(device=device, dtype=dtype).eval()
    batch_size, length = spec["batch_size"], spec["length"]

    def serve(texts):
        for start in range(0, len(texts), batch_size):
            batch = tokenizer(
                texts[start : start + batch_size],
                padding=True,
                truncation=True,
                max_length=length,
                return_tensors="pt",
            ).to(device)
            with torch.inference_mode():
                model(**batch).logits.float().cpu().numpy()

    return serve


def _kbert_serving(spec):
    """The classifier's serving directory (exported once per worker), on kbert.serving."""
    from kbert import export, serving
    from kbert.models import BertClassifier

    runtime = spec["system"].split("-", 1)[1]
    directory = Path(spec["export_dir"]) / spec["system"]
    if not directory.is_dir():
        model = BertClassifier.from_preset(spec["checkpoint"], num_classes=2, fresh_heads=True)
        quantize = "int8" if runtime.endswith("int8") else None
        started = time.perf_counter()
        if runtime.startswith("onnx"):
            export.export_onnx(model, directory, quantize=quantize)
        else:
            export.export_openvino(model, directory, quantize=quantize)
        log(f"  exported {directory} in {time.perf_counter() - started:.0f} s")
    served = serving.load(directory, sequence_length=spec["length"])
    batch_size = spec["batch_size"]

    def serve(texts):
        served.predict(texts, batch_size=batch_size)

    return serve


def _sentence_transformers(spec):
    import sentence_transformers

    device, dtype = _torch_device_and_dtype(spec)
    if spec["system"] in st_onnx.SYSTEMS:
        model = st_onnx.load_model(spec["checkpoint"], spec["system"], spec["export_dir"])
    else:
        model = sentence_transformers.SentenceTransformer(spec["checkpoint"], device=device)
        model = model.to(dtype)
    model.max_seq_length = spec["length"]
    batch_size = spec["batch_size"]

    def serve(texts):
        model.encode(texts, batch_size=batch_size, convert_to_numpy=True)

    return serve


def _onnx(spec):
    import numpy as np
    import onnxruntime
    import transformers

    from kbert.export import export_onnx
    from kbert.models import BertClassifier

    path = spec["onnx_path"]
    if not Path(path).is_file():
        model = BertClassifier.from_preset(
            spec["checkpoint"], num_classes=2, preprocessor=None, fresh_heads=True
        )
        started = time.perf_counter()
        export_onnx(model, path)  # Dynamic batch and sequence axes.
        log(f"  exported {path} in {time.perf_counter() - started:.0f} s")
    providers = ["CPUExecutionProvider"]
    if spec["device"] == "gpu" and "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        providers.insert(0, "CUDAExecutionProvider")
    session = onnxruntime.InferenceSession(path, providers=providers)
    tokenizer = transformers.AutoTokenizer.from_pretrained(spec["checkpoint"])
    batch_size, length = spec["batch_size"], spec["length"]

    def serve(texts):
        encoded = tokenizer(texts, truncation=True, max_length=length)["input_ids"]
        order = np.argsort([len(ids) for ids in encoded], kind="stable")
        for start in range(0, len(order), batch_size):
            rows = [encoded[i] for i in order[start : start + batch_size]]
            width = max(len(ids) for ids in rows)
            token_ids = np.zeros((len(rows), width), "int32")
            padding_mask = np.zeros((len(rows), width), "int32")
            for k, ids in enumerate(rows):
                token_ids[k, : len(ids)] = ids
                padding_mask[k, : len(ids)] = 1
            feed = {
                "token_ids": token_ids,
                "segment_ids": np.zeros_like(token_ids),
                "padding_mask": padding_mask,
            }
            session.run(None, feed)

    return serve


BUILDERS = {
    "kbert-torch": _kbert,
    "kbert-jax": _kbert,
    "kbert-tensorflow": _kbert,
    **{name: _kbert for name in INT8_SYSTEMS + FLOAT8_SYSTEMS},
    "kbert-onnx": _kbert_serving,
    "kbert-onnx-int8": _kbert_serving,
    "kbert-openvino": _kbert_serving,
    "kbert-openvino-int8": _kbert_serving,
    "hf": _hf,
    "sentence-transformers": _sentence_transformers,
    "sentence-transformers-onnx": _sentence_transformers,
    "sentence-transformers-onnx-int8": _sentence_transformers,
    "onnx": _onnx,
}


def worker_main(spec):
    """In a worker: builds the system, serves each workload (one untimed pass, then timed ones)."""
    results = []
    if spec["system"] == "onnx" and not spec.get("onnx_path"):  # One export for every workload.
        spec = dict(
            spec, onnx_path=os.path.join(tempfile.mkdtemp(prefix="kbert-serving-"), "m.onnx")
        )
    # One export (or optimum export) per worker, shared by its workloads.
    spec = dict(spec, export_dir=tempfile.mkdtemp(prefix="kbert-serving-"))
    for workload in spec["workloads"]:
        texts = load_texts(workload, spec["data_dir"], spec["max_texts"])
        length = spec["lengths"][workload]
        serve = BUILDERS[spec["system"]](dict(spec, length=length))
        serve(texts)  # Warm-up: every shape compiled, every cache filled.
        results.append(
            timed_row(spec, workload, texts, serve, sequence_length=length),
        )
    emit(results)


# ----------------------------------------------------------------------------- the report


def format_table(results):
    """One block per workload: texts/s and ratios to HF and to sentence-transformers."""
    lines = []
    for workload in WORKLOADS:
        rows = [r for r in results if r["workload"] == workload]
        if not rows:
            continue
        measured = [r for r in rows if "error" not in r]
        if measured:
            first = measured[0]
            lines.append(
                f"\n{workload}: {first['texts']} texts, truncated at "
                f"{first['sequence_length']} tokens"
            )
        else:
            lines.append(f"\n{workload}: every system failed")
        anchors = {r["system"]: r["texts_per_second"] for r in rows if "error" not in r}
        lines.append(
            f"  {'system':<32} {'texts/s':>9} {'vs HF':>7} {'vs sentence-transformers':>25}"
        )
        for r in rows:
            if "error" in r:
                lines.append(f"  {r['system']:<32} failed: {r['error'][:70]}")
                continue
            rate = r["texts_per_second"]
            hf = f"{rate / anchors['hf']:.2f}x" if anchors.get("hf") else "-"
            st = anchors.get("sentence-transformers")
            st = f"{rate / st:.2f}x" if st else "-"
            lines.append(f"  {r['system']:<32} {rate:>9.1f} {hf:>7} {st:>25}")
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--checkpoint", default=None, help="model directory (default: all-MiniLM-L6-v2)"
    )
    parser.add_argument("--data-dir", default=str(default_data_dir()))
    parser.add_argument("--workload", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--short-length", type=int, default=128)
    parser.add_argument("--long-length", type=int, default=512)
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    parser.add_argument(
        "--repeats", type=int, default=1, help="timed passes per workload; best kept"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="passes over all systems, each system in a new process per round, one after the "
        "other (slow drifts of the machine's speed then hit every system); the fastest round "
        "of each is kept",
    )
    parser.add_argument("--max-texts", type=int, default=None, help="only the first N texts")
    parser.add_argument("--onnx-path", default=None, help="reuse (or keep) this exported file")
    st_onnx.add_arguments(parser, SYSTEMS)
    parser.add_argument("--json", help="write the results to this JSON file")
    parser.add_argument("--chart", help="write a PNG bar chart to this path")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    names = ("batch_size", "short_length", "long_length", "repeats", "rounds", "max_texts")
    check_positive_ints(parser, args, names)
    if args.device == "cpu" and args.dtype != "float32":
        parser.error(f"--dtype {args.dtype} is meant for --device gpu; on CPU use float32")
    args.system = st_onnx.default_systems(args, SYSTEMS)
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        worker_main(json.loads(args.worker))
        return
    checkpoint = resolve_checkpoint(args.checkpoint)
    command = command_line(__file__, argv)
    load = load_average()
    log(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    base = {
        "checkpoint": checkpoint,
        "data_dir": args.data_dir,
        "workloads": args.workload,
        "lengths": {"short": args.short_length, "long": args.long_length},
        "batch_size": args.batch_size,
        "device": args.device,
        "dtype": args.dtype,
        "repeats": args.repeats,
        "rounds": args.rounds,
        "max_texts": args.max_texts,
        "onnx_path": args.onnx_path,
    }
    environment = st_onnx.environment(args)

    results = run_rounds(__file__, base, args.system, args.rounds, args.workload, environment)
    end_load = load_average()
    title = (
        f"{checkpoint_name(checkpoint)}, batch {args.batch_size}, {args.dtype}, "
        f"{args.device}; load average {load[0]:.1f} -> {end_load[0]:.1f}"
    )
    print(f"\n{title}")
    print(format_table(results))
    print(f"load average at end: {end_load[0]:.2f} {end_load[1]:.2f} {end_load[2]:.2f}")
    if args.chart:
        ratio_bars(results, args.chart, title, WORKLOADS)
        print(f"chart written to {args.chart}")
    if args.json:
        settings = {k: v for k, v in base.items() if k != "workloads"}
        write_results(args.json, command, settings, load, end_load, results)


if __name__ == "__main__":
    main()
