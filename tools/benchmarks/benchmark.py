"""Throughput and memory benchmark of kbert against Hugging Face transformers and keras-hub.

For every `--preset` x `--sequence-length` x `--batch-size` x `--backend` x `--precision` it
measures, on fresh (random) weights:

* `inference`: forward pass of the backbone, outputs kept on the device (a compiled call that
  is waited for, not copied to NumPy), sequences per second;
* `finetune`: one fit-style training step of a classifier (backbone -> dropout 0.1 -> dense on
  the pooled output, AdamW with BERT's schedule and global-norm clipping, dropout 0.1 in train
  mode), sequences per second;
* `pretrain`: one training step of `BertPretrainer` (masked LM at `--num-masks` positions +
  next-sentence prediction), sequences per second;

and the same workloads on Hugging Face transformers (PyTorch, `attn_implementation="sdpa"`,
`BertModel` / `BertForSequenceClassification` / `BertForPreTraining`) and keras-hub
(`BertBackbone` / `BertTextClassifier` / `BertMaskedLM`, built from a config, no download).

Model-FLOPs utilisation (MFU) is the analytic matmul FLOPs of the workload (forward x 1,
training x 3) per second divided by the MEASURED matmul peak of the device for that precision:
a large square matmul is timed in every worker, and the largest figure of the run (any
backend) is the one common peak of every row. Each Keras backend runs in its own
subprocess (`KERAS_BACKEND` is fixed at import); Hugging Face runs in its own subprocess
too. Warm-up steps (compilation) are excluded; a cell is the median of the timed steps; with
`--rounds N` every process is run N times, interleaved, and the best round is kept (the
machine may be shared). Workers run in the caller's environment, as a user's script does:
`--malloc-hugepages on` gives every worker `GLIBC_TUNABLES=glibc.malloc.hugetlb=1` (large malloc
blocks on 2 MiB pages, fewer page faults for XLA's fresh per-step buffers on CPU), a process
setting a plain script does not have, so its figures are not a plain script's. The timed cells
run first in each worker; the matmul peak and bound (large products) are measured after them.
`--check-plain` also times every float32 HF cell with `benchmark_plain_step.py` (next to this
script), the workload written as a user's own script, in the same run, and prints both figures
side by side.

`--memory` measures instead the peak memory of a fine-tuning step for the memory options:
plain, `BertBackbone(remat=True)` and gradient accumulation (`bert_optimizer(...,
gradient_accumulation_steps=k)` with micro-batches of `batch_size / k`), each in a fresh
process. On GPU the figure is the framework's peak allocator statistic; on CPU it is the
growth of the process' peak resident memory (`ru_maxrss`) over the steps, and on JAX also
XLA's own buffer assignment of the compiled step (`memory_analysis().temp_size_in_bytes`).

Example:
```
python tools/benchmarks/benchmark.py --preset L6-H384-A12 --batch-size 32 --sequence-length 128 \
    --workload finetune inference --backend jax torch tensorflow --chart bench.png
python tools/benchmarks/benchmark.py --preset bert_base_en_uncased --batch-size 8 \
    --workload inference
python tools/benchmarks/benchmark.py --suite cpu-goals --rounds 2  # the CPU goals, in one run
python tools/benchmarks/benchmark.py --suite gpu-goals             # GPU goals (BERT-Base, bf16)
python tools/benchmarks/benchmark.py --suite gpu-goals --config tiny --steps 2  # its code path
python tools/benchmarks/benchmark.py --suite host-overhead         # tiny model, torch vs HF eager
python tools/benchmarks/benchmark.py --suite cpu-goals --plain     # as a user's script runs
python tools/benchmarks/benchmark.py --suite host-overhead --check-plain  # HF vs a plain script
python tools/benchmarks/benchmark.py --memory --preset bert_mini_en_uncased --sequence-length 512 \
    --batch-size 16 --backend jax torch
```
A preset is a kbert preset name (`bert_base_en_uncased`...) or a shape
`L<layers>-H<hidden>-A<heads>` (intermediate 4 x hidden, the uncased vocabulary of 30,522 tokens;
`-V<size>` for another).

Its parts live in `bench/` next to this script (see `bench/__init__.py`); the processes, rounds
and result files are `bench.harness`'s, as in every benchmark script.
"""

import argparse
import datetime
import json
import time

from bench.cells import SUITE_PROCESSES, SUITES, build_cells, suite_cells
from bench.common import (
    BACKENDS,
    FRAMEWORKS,
    MEMORY_VARIANTS,
    PRECISIONS,
    WORKLOADS,
    process_family,
)
from bench.harness import (
    HUGEPAGE_TUNABLE,
    command_line,
    load_average,
    log,
    spawn,
    worker_environment,
    write_json,
)
from bench.memory import memory_worker_main
from bench.plain_check import format_plain_checks, run_plain_checks
from bench.report import (
    apply_common_peaks,
    best_of_rounds,
    common_peaks,
    format_page_faults,
    format_table,
    goal_report,
    write_chart,
)
from bench.workers import worker_main


def _spawn(spec, backend, args, hugepages):
    """Runs one worker of this script for `spec` on `backend` and returns its result.

    Hugging Face workers never get kbert's allocator tuning: HF's users do not import kbert.
    """
    tuning = args.allocator_tuning == "on" and spec.get("family") != "hf"
    env = worker_environment(backend, hugepages=hugepages, allocator_tuning=tuning)
    spec = dict(spec, allocator_tuning=tuning)
    return spawn(__file__, spec, env, nice=args.nice, name=f"{backend} worker")


def _processes(args, cells):
    """The worker specs of a run: (backend, spec) per Keras backend, then HF eager and compiled."""
    backends, frameworks = list(args.backend), list(args.framework)
    hf_compile, kbert_compile, cuda_graphs, variants = set(), set(), set(), {}
    suites = args.suite or []
    if suites and not args.cell and all(s in SUITE_PROCESSES for s in suites):
        backends = [b for b in BACKENDS if any(b in SUITE_PROCESSES[s]["backends"] for s in suites)]
        frameworks = [
            f for f in FRAMEWORKS if any(f in SUITE_PROCESSES[s]["frameworks"] for s in suites)
        ]
    for suite in suites:
        hf_compile.update(SUITE_PROCESSES.get(suite, {}).get("hf_compile", ()))
        if getattr(args, "kbert_compile", "on") == "on":
            kbert_compile.update(SUITE_PROCESSES.get(suite, {}).get("kbert_compile", ()))
            cuda_graphs.update(SUITE_PROCESSES.get(suite, {}).get("kbert_cuda_graphs", ()))
        if getattr(args, "kbert_variants", "on") == "on":
            for backend, variant, workloads in SUITE_PROCESSES.get(suite, {}).get(
                "kbert_variants", ()
            ):
                variants.setdefault((backend, variant), set()).update(workloads)
    common = {
        "cells": cells,
        "warmup": args.warmup,
        "steps": args.steps,
        "jit_compile": {"auto": "auto", "on": True, "off": False}[args.jit_compile],
        "torch_compile": args.torch_compile,
        "optimizers": ["kbert", "keras"] if args.plain else ["kbert"],
        # A tiny model gains nothing from intra-op threads; spinning ones slow it on a loaded
        # machine.
        "torch_threads": 1 if args.config == "tiny" else None,
    }
    keras_frameworks = [f for f in frameworks if f != "hf"]
    specs = []
    if keras_frameworks:
        for backend in backends:
            specs.append(
                (
                    backend,
                    dict(common, family="keras", backend=backend, frameworks=keras_frameworks),
                )
            )
    compiled = [c for c in cells if c["workload"] in kbert_compile]
    if (
        "kbert" in keras_frameworks
        and "torch" in backends
        and compiled
        and common["jit_compile"] is not True
    ):
        specs.append(
            _torch_spec(common, "keras", "kbert", compiled, jit_compile=True, kbert_compile=True)
        )
        graphed = [c for c in cells if c["workload"] in cuda_graphs]
        if graphed:
            specs.append(
                _torch_spec(
                    common,
                    "keras",
                    "kbert",
                    graphed,
                    jit_compile=True,
                    kbert_compile=True,
                    cuda_graphs=True,
                )
            )
    if "hf" in frameworks:
        specs.append(_torch_spec(common, "hf", "hf", cells))
        compiled = [c for c in cells if c["workload"] in hf_compile]
        if compiled and not args.torch_compile:
            specs.append(_torch_spec(common, "hf", "hf", compiled, torch_compile=True))
    if "kbert" in keras_frameworks:
        for (backend, variant), workloads in variants.items():
            chosen = [c for c in cells if c["workload"] in workloads]
            if chosen and backend in backends:
                spec = dict(common, family="keras", backend=backend, frameworks=["kbert"])
                specs.append((backend, dict(spec, cells=chosen, kbert_variant=variant)))
    chosen = getattr(args, "process", None)
    if chosen:
        names = [process_name(spec) for _, spec in specs]
        unknown = sorted(set(chosen) - set(names))
        if unknown:
            raise SystemExit(
                f"--process {' '.join(unknown)}: not a process of this run; its processes are "
                f"{', '.join(names)}"
            )
        specs = [(b, spec) for b, spec in specs if process_name(spec) in chosen]
    return specs


def process_name(spec):
    """A worker's name in the results (`processes`) and for `--process`: `keras/<backend>`
    (kbert and keras-hub with the run's settings), `kbert-compile/torch` (kbert's compiled
    torch steps), `kbert-cudagraphs/torch` (the same capturing CUDA graphs),
    `kbert-<variant>/<backend>`, `hf/torch` or `hf-compile/torch` (`process_family`)."""
    return f"{process_family(spec)}/{spec['backend']}"


def _torch_spec(common, family, framework, cells, **settings):
    """`("torch", spec)`: a torch worker of `framework` over `cells`, with `settings`."""
    spec = dict(common, family=family, backend="torch", frameworks=[framework], cells=cells)
    return "torch", dict(spec, **settings)


def run_benchmark(args, on_worker=None):
    """Runs every worker of the run; returns (records, process infos, peaks, plain checks).

    `on_worker(records, infos, peaks, checks)`, when given, is called after each worker with
    what the run has so far (the JSON file is written then, so a run stopped part-way keeps
    the workers that finished)."""
    cells = build_cells(args)
    specs = _processes(args, cells)
    hugepages = args.malloc_hugepages == "on" and not args.plain
    records, infos, peaks, checks = [], {}, {}, []
    total = args.rounds * len(specs)
    done = 0
    stop_at = time.time() + args.stop_after if args.stop_after else None
    for round_index in range(args.rounds):
        for backend, spec in specs:
            done += 1
            name = process_name(spec)
            if stop_at:
                if time.time() > stop_at:
                    log(f"[{done}/{total}] {name}: not started, the time budget is spent")
                    continue
                spec = dict(spec, stop_at=stop_at)
            log(f"[{done}/{total}] round {round_index + 1}: {name}")
            output = _spawn(spec, backend, args, hugepages)
            records.extend(output["results"])
            infos[name] = output["info"]
            for precision, peak in output["peaks"].items():
                if peak:
                    key = f"{backend}/{precision}"
                    peaks[key] = max(peaks.get(key, 0), peak)
            if args.check_plain and spec["family"] == "hf" and not spec["torch_compile"]:
                checks.extend(run_plain_checks(spec["cells"], args))
            if on_worker:
                on_worker(apply_common_peaks(best_of_rounds(records), peaks), infos, peaks, checks)
    records = apply_common_peaks(best_of_rounds(records), peaks)
    return records, infos, peaks, checks


def run_memory(args):
    results = []
    variants = args.memory_variants
    total = len(args.backend) * len(variants)
    done = 0
    for backend in args.backend:
        for variant in variants:
            done += 1
            log(f"[{done}/{total}] memory: {variant} on {backend}")
            spec = {
                "mode": "memory",
                "backend": backend,
                "preset": args.preset[0],
                "sequence_length": args.sequence_length[0],
                "batch_size": args.batch_size[0],
                "precision": args.precision[0],
                "variant": variant,
                "accumulation": args.accumulation_steps,
                "jit_compile": {"auto": "auto", "on": True, "off": False}[args.jit_compile],
            }
            try:
                results.append(_spawn(spec, backend, args, args.malloc_hugepages == "on"))
            except RuntimeError as error:
                results.append(dict(spec, error=str(error)))
    lines = [
        f"\nmemory: fine-tuning step, {args.preset[0]}, batch {args.batch_size[0]}, "
        f"seq {args.sequence_length[0]}, {args.precision[0]}",
        f"  {'backend':<11} {'variant':<11} {'micro-batch':>11} {'RSS growth MiB':>15} "
        f"{'XLA temp MiB':>13} {'device peak MiB':>16} {'s / batch':>10}",
    ]
    mib = 1024 * 1024
    for r in results:
        if "error" in r:
            lines.append(f"  {r['backend']:<11} {r['variant']:<11} failed: {r['error'][:60]}")
            continue
        xla = f"{r['xla_temp_bytes'] / mib:.0f}" if r.get("xla_temp_bytes") else "-"
        device = f"{r['device_peak_bytes'] / mib:.0f}" if r.get("device_peak_bytes") else "-"
        lines.append(
            f"  {r['backend']:<11} {r['variant']:<11} {r['micro_batch_size']:>11} "
            f"{r['rss_peak_growth_bytes'] / mib:>15.0f} {xla:>13} {device:>16} "
            f"{r['seconds_per_effective_batch']:>10.2f}"
        )
    return results, "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", nargs="+", default=["L6-H384-A12"])
    parser.add_argument("--sequence-length", nargs="+", type=int, default=[128])
    parser.add_argument("--batch-size", nargs="+", type=int, default=[32])
    parser.add_argument("--backend", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument("--precision", nargs="+", choices=PRECISIONS, default=["float32"])
    parser.add_argument("--workload", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--framework", nargs="+", choices=FRAMEWORKS, default=list(FRAMEWORKS))
    parser.add_argument(
        "--cell",
        action="append",
        metavar="WORKLOAD:PRESET:BATCH:LENGTH[:PRECISION]",
        help="measure exactly this cell (repeatable); replaces the preset x length x batch x "
        "workload product",
    )
    parser.add_argument(
        "--suite",
        nargs="+",
        choices=sorted(SUITES),
        help="named cell sets, each checked against its goals at the end of the run: cpu-goals, "
        "gpu-goals (BERT-Base bf16; kbert on JAX and torch, HF eager and torch.compile), "
        "host-overhead (tiny model on torch vs HF eager)",
    )
    parser.add_argument(
        "--config",
        choices=("full", "tiny"),
        default="full",
        help="tiny: every suite cell on a tiny model (L2-H64-A2, vocabulary 512, batch 4, length "
        "16), to exercise a suite's code path in seconds; its figures mean nothing",
    )
    parser.add_argument("--num-masks", type=int, default=20, help="masked positions per sequence")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per cell")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps (compilation)")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved repeats; best kept")
    parser.add_argument(
        "--jit-compile",
        choices=("auto", "on", "off"),
        default="auto",
        help="Keras compile(jit_compile=...): auto = XLA on JAX/TensorFlow, eager on torch",
    )
    parser.add_argument(
        "--torch-compile", action="store_true", help="torch.compile the Hugging Face model"
    )
    parser.add_argument(
        "--kbert-compile",
        choices=("on", "off"),
        default="on",
        help="also time kbert's compiled torch steps (jit_compile=True), also with CUDA graphs, "
        "where a suite asks",
    )
    parser.add_argument(
        "--kbert-variants",
        choices=("on", "off"),
        default="on",
        help="also time the variants of kbert's recipe a suite names (gpu-goals: JAX "
        "pretraining without attention dropout and with flash attention, and with float8 "
        "matmuls), each in a process of its own",
    )
    parser.add_argument(
        "--process",
        nargs="+",
        metavar="NAME",
        help="run only these processes of the run (keras/jax, keras/torch, kbert-compile/torch, "
        "kbert-cudagraphs/torch, kbert-flash/jax, kbert-float8/jax, hf/torch, "
        "hf-compile/torch...); the JSON and goal lines then hold their rows only",
    )
    parser.add_argument(
        "--stop-after",
        type=float,
        metavar="SECONDS",
        help="a time budget: no worker and no cell starts after this many seconds (their rows "
        "are missing: their goals read 'not measured'); what runs then finishes",
    )
    parser.add_argument("--nice", type=int, default=0, help="run workers under `nice -n N`")
    parser.add_argument(
        "--malloc-hugepages",
        choices=("on", "off"),
        default="off",
        help=f"on: run every worker with GLIBC_TUNABLES={HUGEPAGE_TUNABLE} (fewer page faults; "
        "a process setting a plain script does not have); off (default) also removes it from "
        "an inherited GLIBC_TUNABLES",
    )
    parser.add_argument(
        "--allocator-tuning",
        choices=("on", "off"),
        default="off",
        help="on: every kbert worker calls kbert.tune_allocator() before it computes (glibc "
        "malloc reuse); off (default, as a script that does not opt in): malloc as it is",
    )
    parser.add_argument(
        "--plain",
        action="store_true",
        help="run as a user's script would: no GLIBC_TUNABLES, kbert's training cells also "
        "with keras.optimizers.AdamW(2e-5); prints page faults per step",
    )
    parser.add_argument(
        "--check-plain",
        action="store_true",
        help="also time every float32 HF cell as a plain user script "
        "(benchmark_plain_step.py) after each HF worker, and print both figures and their ratio",
    )
    parser.add_argument("--json", help="write all records to this JSON file")
    parser.add_argument("--chart", help="write a PNG bar chart to this path")
    parser.add_argument("--memory", action="store_true", help="measure peak memory instead")
    parser.add_argument(
        "--memory-variants", nargs="+", choices=MEMORY_VARIANTS, default=list(MEMORY_VARIANTS)
    )
    parser.add_argument("--accumulation-steps", type=int, default=4)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        spec = json.loads(args.worker)
        if spec.get("mode") == "memory":
            if spec.get("allocator_tuning"):
                import kbert

                kbert.tune_allocator()
            memory_worker_main(spec)
        else:
            worker_main(spec)
        return
    started = datetime.datetime.now()
    command = command_line(__file__)
    load = load_average()
    log(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    hugepages = "off" if args.plain else args.malloc_hugepages
    log(f"malloc huge pages for every worker: {hugepages}")
    if args.memory:
        results, table = run_memory(args)
        print(table)
        payload = {"command": command, "date": started.isoformat(), "memory": results}
        payload["malloc_hugepages"] = args.malloc_hugepages
    else:

        def payload_of(records, infos, peaks, checks):
            return {
                "command": command,
                "date": started.isoformat(),
                "processes": infos,
                "matmul_peaks": peaks,
                "common_matmul_peaks": common_peaks(peaks),
                "results": records,
                "malloc_hugepages": hugepages,
                "plain": args.plain,
                "plain_checks": checks,
            }

        def write_partial(*so_far):
            if args.json:  # Complete after every worker: a run stopped part-way keeps them.
                write_json(args.json, dict(payload_of(*so_far), complete=False))

        records, infos, peaks, checks = run_benchmark(args, on_worker=write_partial)
        print(f"\ndevice: {next(iter(infos.values()))['device'] if infos else '?'}")
        for name, peak in sorted(peaks.items()):
            print(f"measured matmul peak {name}: {peak / 1e9:.1f} GFLOP/s")
        if len(peaks) > 1:
            for precision, peak in sorted(common_peaks(peaks).items()):
                print(
                    f"common matmul peak {precision} (MFU of every row): {peak / 1e9:.1f} GFLOP/s"
                )
        print(format_table(records))
        tiny = args.config == "tiny"
        cells = {
            s: suite_cells(s, args.num_masks, tiny, args.precision[0]) for s in args.suite or []
        }
        goals = goal_report(cells, records, peaks)
        if goals:
            print(goals)
        if args.plain:
            print(format_page_faults(records))
        if args.check_plain:
            print(format_plain_checks(checks, records))
        if args.chart:
            write_chart(records, args.chart)
            print(f"\nchart written to {args.chart}")
        payload = dict(payload_of(records, infos, peaks, checks), complete=True)
    load = load_average()
    print(f"load average at end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    payload["load_average_end"] = load
    if args.json:
        write_json(args.json, payload)


if __name__ == "__main__":
    main()
