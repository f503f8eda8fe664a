"""What to measure: named suites, their goals, and the cells built from the command line."""

from bench.common import PRECISIONS, WORKLOADS
from bench.flops import resolve_preset

# Named cell sets. Each suite is measured in one run and its goals checked at the end of it.
# cpu-goals: the CPU goals of the performance issue, a fine-tuning step of L6-H384-A12 at batch
#   32, length 128, and a BERT-Base forward pass at batch 8, length 128, both float32.
# gpu-goals: the GPU goals (issue 12), BERT-Base in bf16 mixed precision at length 128,
#   pretraining (MLM + NSP) at batch 256, fine-tuning at batch 32, inference at batch 128;
#   kbert on JAX and torch, HF eager and (pretraining) HF `torch.compile`.
# host-overhead: a tiny model's fine-tuning step on the torch backend, where the per-step host
#   work (Python, dispatch, casts) dominates: kbert/torch against HF eager.
SUITES = {
    "cpu-goals": [
        "finetune:L6-H384-A12:32:128",
        "inference:bert_base_en_uncased:8:128",
    ],
    "gpu-goals": [
        "pretrain:bert_base_en_uncased:256:128:mixed_bfloat16",
        "finetune:bert_base_en_uncased:32:128:mixed_bfloat16",
        "inference:bert_base_en_uncased:128:128:mixed_bfloat16",
    ],
    "host-overhead": [
        "finetune:L2-H128-A2:8:32",
    ],
}
# The processes a suite needs; a suite not listed runs every `--backend` and `--framework`.
# `hf_compile`: the workloads also timed with Hugging Face under `torch.compile`;
# `kbert_compile`: those also timed with kbert's compiled torch steps (`jit_compile=True`);
# `kbert_cuda_graphs`: those also timed with kbert's compiled torch steps capturing CUDA graphs
# (`kbert.backend.torch_steps.CUDA_GRAPHS = True`; on a CPU the same programs as
# `kbert_compile`); `kbert_variants`: (backend, variant, workloads) timed with a variant of
# kbert's recipe (`keras_timing.KBERT_VARIANTS`), each in a process of its own.
SUITE_PROCESSES = {
    "gpu-goals": {
        "backends": ("jax", "torch"),
        "frameworks": ("kbert", "hf"),
        "hf_compile": ("pretrain",),
        "kbert_compile": ("pretrain", "finetune", "inference"),
        "kbert_cuda_graphs": ("finetune", "inference"),
        "kbert_variants": (("jax", "flash", ("pretrain",)), ("jax", "float8", ("pretrain",))),
    },
    "host-overhead": {"backends": ("torch",), "frameworks": ("kbert", "hf"), "hf_compile": ()},
}
# `--config tiny`: every suite cell on this shape, to exercise a suite's whole code path in
# seconds (smoke tests; no figure of it means anything).
TINY = {"preset": "L2-H64-A2-V512", "batch_size": 4, "sequence_length": 16, "num_masks": 3}

# Each goal: (workload, what, threshold).
CPU_GOALS = (
    ("finetune", "kbert/jax vs HF", 1.1),
    ("finetune", "kbert/torch vs HF", 1.0),
    ("inference", "best kbert backend, share of the matmul limit", 0.9),
)
# Each goal: (workload, backend of kbert, measure, threshold[, kbert row]). Measures: "seq/s"
# (absolute, for the suite's own shape only), "mfu" (against the device's common matmul peak),
# or "vs LABEL" (throughput ratio to that row: "hf" is HF eager, "hf-compile" HF under
# torch.compile). The kbert row is "kbert" (the default path) unless named: "kbert-compile" is
# kbert's compiled torch steps ("kbert-cudagraphs" with CUDA graphs), "kbert-flash" /
# "kbert-float8" the variants of JAX
# pretraining (`keras_timing.KBERT_VARIANTS`). The thresholds are issue #44's (torch against
# HF, JAX pretraining MFU) and the earlier GPU issue's (JAX throughput and fine-tuning).
GPU_GOALS = (
    ("pretrain", "jax", "seq/s", 5600),
    ("pretrain", "jax", "mfu", 0.45),
    ("pretrain", "jax", "mfu", 0.45, "kbert-flash"),
    ("pretrain", "jax", "mfu", 0.45, "kbert-float8"),
    ("pretrain", "torch", "vs hf-compile", 1.0),
    ("finetune", "jax", "vs hf", 1.5),
    ("finetune", "torch", "vs hf", 1.5),
    ("inference", "jax", "seq/s", 12000),
    ("inference", "torch", "vs hf", 1.0),
    ("pretrain", "torch", "vs hf-compile", 1.0, "kbert-compile"),
    ("finetune", "torch", "vs hf", 1.5, "kbert-compile"),
    ("inference", "torch", "vs hf", 1.0, "kbert-compile"),
    ("finetune", "torch", "vs hf", 1.5, "kbert-cudagraphs"),
    ("inference", "torch", "vs hf", 1.0, "kbert-cudagraphs"),
)
HOST_OVERHEAD_GOALS = (("finetune", "torch", "vs hf", 1.0),)


def parse_cell(text, num_masks, precision="float32", check_preset=True):
    """`WORKLOAD:PRESET:BATCH:LENGTH[:PRECISION]` -> a cell dict; `check_preset=False` skips
    looking the preset up (a suite's cell on the tiny shape: its name is replaced, and a
    preset name is looked up in kbert, whose import starts Keras)."""
    parts = text.split(":")
    if len(parts) not in (4, 5) or parts[0] not in WORKLOADS:
        raise SystemExit(
            "--cell must be WORKLOAD:PRESET:BATCH:LENGTH[:PRECISION] with WORKLOAD in "
            f"{WORKLOADS}. "
            f"Received: {text!r}"
        )
    workload, preset, batch, length = parts[:4]
    precision = parts[4] if len(parts) == 5 else precision
    if precision not in PRECISIONS:
        raise SystemExit(
            f"Unknown precision {precision!r} in --cell {text!r}; expected one of {PRECISIONS}"
        )
    if check_preset:
        resolve_preset(preset)
    return {
        "preset": preset,
        "sequence_length": int(length),
        "batch_size": int(batch),
        "precision": precision,
        "workload": workload,
        "num_masks": num_masks,
    }


def suite_cells(suite, num_masks, tiny=False, precision="float32"):
    """The cells of a named suite; with `tiny`, each on the `TINY` shape (same workload and
    precision).

    `precision` applies to the cells that name none.
    """
    cells = [
        parse_cell(text, num_masks, precision, check_preset=not tiny) for text in SUITES[suite]
    ]
    if tiny:
        cells = [dict(cell, **TINY) for cell in cells]
    return cells


def build_cells(args):
    tiny = getattr(args, "config", "full") == "tiny"
    explicit = [parse_cell(text, args.num_masks, args.precision[0]) for text in args.cell or []]
    for suite in args.suite or []:
        explicit += [
            c
            for c in suite_cells(suite, args.num_masks, tiny, args.precision[0])
            if c not in explicit
        ]
    if explicit:
        return explicit
    cells = []
    for preset in args.preset:
        resolve_preset(preset)  # Fails early on an unknown name.
        for sequence_length in args.sequence_length:
            for batch_size in args.batch_size:
                for precision in args.precision:
                    for workload in args.workload:
                        cells.append(
                            {
                                "preset": preset,
                                "sequence_length": sequence_length,
                                "batch_size": batch_size,
                                "precision": precision,
                                "workload": workload,
                                "num_masks": args.num_masks,
                            }
                        )
    return cells
