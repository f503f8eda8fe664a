"""sentence-transformers' ONNX backends as benchmark systems (benchmark_serving.py,
benchmark_embeddings.py, its `CrossEncoder` in benchmark_rerank.py and its `SparseEncoder` in
benchmark_sparse.py).

Its `backend="onnx"` needs `optimum-onnx`, which pins transformers 4.x, so these systems'
workers run under the interpreter of a separate environment, given as `--st-onnx-python`
(setup in benchmark_embeddings.py's docstring). A run that names none leaves them out of its
default systems.
"""

import shutil
from pathlib import Path

from bench.harness import system_environment

SYSTEMS = ("sentence-transformers-onnx", "sentence-transformers-onnx-int8")


def add_arguments(parser, systems):
    """`--system` (any of `systems`; default: see `default_systems`) and `--st-onnx-python`."""
    parser.add_argument(
        "--system",
        nargs="+",
        choices=systems,
        default=None,
        help="Default: every system (sentence-transformers' ONNX ones with --st-onnx-python).",
    )
    parser.add_argument(
        "--st-onnx-python",
        default=None,
        help="interpreter of the sentence-transformers ONNX environment (see the docstring)",
    )


def default_systems(args, systems):
    """`args.system`, or when none was named every one of `systems` this run can start (the
    ONNX ones only with `--st-onnx-python`)."""
    if args.system is not None:
        return args.system
    return [s for s in systems if args.st_onnx_python or s not in SYSTEMS]


def environment(args):
    """`run_rounds`' environment function: the ONNX systems' workers under
    `--st-onnx-python`; exits when one is asked for without it."""
    asked = sorted(set(args.system) & set(SYSTEMS))
    if asked and not args.st_onnx_python:
        raise SystemExit(
            f"{asked} run in their own environment: "
            "give --st-onnx-python (see the docstring), or leave them out with --system."
        )

    def of(spec):
        if spec["system"] in SYSTEMS:
            spec["python"] = args.st_onnx_python
        return system_environment(spec)

    return of


# sentence-transformers' model class of each kind of system.
MODEL_CLASSES = {
    "embedder": "SentenceTransformer",
    "cross-encoder": "CrossEncoder",
    "sparse-encoder": "SparseEncoder",
}


def load_model(checkpoint, system, folder, kind="embedder"):
    """sentence-transformers' ONNX backend on a copy of `checkpoint` under `folder` (optimum
    exports into it once; int8 by sentence-transformers' own quantization function): a
    `SentenceTransformer`, `CrossEncoder` or `SparseEncoder` as `kind` says (a key of
    `MODEL_CLASSES`)."""
    if kind not in MODEL_CLASSES:
        raise ValueError(f"`kind` must be one of {sorted(MODEL_CLASSES)}. Received: {kind!r}")
    import sentence_transformers

    model_class = getattr(sentence_transformers, MODEL_CLASSES[kind])
    copy = Path(folder) / system
    name = "onnx/model_qint8_avx512_vnni.onnx" if system.endswith("int8") else None
    if not copy.is_dir():
        shutil.copytree(checkpoint, copy)
        model = model_class(str(copy), device="cpu", backend="onnx")
        model.save_pretrained(str(copy))
        if name:
            from sentence_transformers import export_dynamic_quantized_onnx_model

            export_dynamic_quantized_onnx_model(model, "avx512_vnni", str(copy))
    kwargs = {"model_kwargs": {"file_name": name}} if name else {}
    return model_class(str(copy), device="cpu", backend="onnx", **kwargs)
