"""Worker processes: one per (framework family, backend), spawned by the parent, results as JSON.

`KERAS_BACKEND` is fixed when Keras is imported, so each backend runs in its own process; Hugging
Face runs in its own process too (eager and `torch.compile` separately). A worker prints one line,
`RESULT_MARKER` + JSON, which `spawn` reads back.
"""

import json
import os
import subprocess
import sys

from bench.common import RESULT_MARKER, log, median_and_all
from bench.devices import device_kind, device_name
from bench.flops import encoder_matmuls, resolve_preset, step_flops
from bench.hf_timing import run_hf_cell
from bench.keras_timing import run_keras_cell
from bench.peak import measure_matmul_peak, measure_matmuls_seconds

BENCHMARK_SCRIPT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmark.py"
)

# glibc >= 2.35: back malloc's large blocks with transparent huge pages (when the kernel's THP
# mode is `madvise`). XLA's per-step temporary buffer (1.5 GiB for the L6-H384 fine-tuning step)
# is a fresh mmap each step; on 4 KiB pages that is ~490k page faults and ~1 s of kernel time
# per step on the 2-vCPU machine, on 2 MiB pages ~1.4k. It is a process setting, given to
# every worker (kbert, keras-hub and HF alike) or to none.
HUGEPAGE_TUNABLE = "glibc.malloc.hugetlb=1"


def _versions(family):
    if family == "hf":
        import torch
        import transformers

        return {"torch": torch.__version__, "transformers": transformers.__version__}
    import keras

    versions = {"keras": keras.__version__}
    try:
        import keras_hub

        versions["keras_hub"] = keras_hub.__version__
    except ImportError:
        pass
    return versions


def _allocator_state(tune):
    """Calls `kbert.tune_allocator()` if `tune` (as a script that opts in does, before it
    computes), and returns what kbert did to the C allocator in this process."""
    import kbert.runtime

    if tune:
        return kbert.runtime.tune_allocator()
    return kbert.runtime.allocator_tuning()


def _runs(spec, cell):
    """(framework, optimizer) pairs of one cell: kbert's training cells also with Keras' AdamW if
    asked."""
    for framework in spec["frameworks"]:
        optimizers = ["kbert"]
        if framework == "kbert" and cell["workload"] != "inference":
            optimizers = spec.get("optimizers", ["kbert"])
        for optimizer in optimizers:
            yield framework, optimizer


def _add_peaks_and_bounds(backend, kind, records, peaks):
    """Measures the matmul peak of each precision of `records` (filling `peaks`), and the matmul
    bound of each forward cell; sets each record's `matmul_peak_flops`, `mfu` and
    `matmul_bound_seconds`."""
    bounds = {}
    for record in records:
        precision = record["precision"]
        if precision not in peaks:
            try:
                peaks[precision] = measure_matmul_peak(backend, precision)
            except Exception as error:  # e.g. float16 matmul unsupported on this CPU build.
                peaks[precision] = None
                log(f"  matmul peak for {precision} on {backend} failed: {error}")
        if "error" in record:
            continue
        record["matmul_peak_flops"] = peaks[precision]
        record["mfu"] = record["achieved_flops"] / peaks[precision] if peaks[precision] else None
        # A forward pass is bounded by its own matmuls, at its own shapes, on this backend.
        # CPU only: on a GPU one product takes tens of microseconds, and timing each with a
        # synchronisation would measure launch latency rather than the bound.
        if record["workload"] != "inference" or kind == "gpu":
            continue
        key = (record["preset"], record["batch_size"], record["sequence_length"], precision)
        if key not in bounds:
            shape = resolve_preset(record["preset"])
            matmuls = encoder_matmuls(shape, record["batch_size"], record["sequence_length"])
            try:
                bounds[key] = measure_matmuls_seconds(backend, precision, matmuls)
                log(f"  the forward's matmuls alone on {backend}: {bounds[key] * 1000:.0f} ms")
            except Exception as error:
                bounds[key] = None
                log(f"  timing the forward's matmuls on {backend} failed: {error}")
        if bounds[key] is not None:
            record["matmul_bound_seconds"] = round(bounds[key], 5)


def worker_main(spec):
    """Runs every cell of one process (one framework family on one backend); prints JSON."""
    backend = spec["backend"]
    results = []
    peaks = {}
    # First, as a script that opts in tunes the allocator before it computes (kbert.runtime).
    allocator = (
        _allocator_state(spec.get("allocator_tuning", False)) if spec["family"] != "hf" else None
    )
    info = {
        "device": device_name(),
        "device_kind": device_kind(),
        "versions": _versions(spec["family"]),
    }
    if allocator is not None:
        info["allocator"] = allocator
    if spec.get("torch_threads") and backend == "torch":
        import torch

        torch.set_num_threads(spec["torch_threads"])
    # The cells are timed first, in a process that has computed nothing else yet, as a user's
    # script runs them; the matmul peaks and bounds (large products of their own) come after.
    for cell in spec["cells"]:
        precision = cell["precision"]
        shape = resolve_preset(cell["preset"])
        for framework, optimizer in _runs(spec, cell):
            name = "hf-compile" if framework == "hf" and spec["torch_compile"] else framework
            label = (
                f"[{name}/{backend}] {cell['preset']} {cell['workload']} "
                f"b={cell['batch_size']} s={cell['sequence_length']} {precision}"
                + (" keras AdamW" if optimizer == "keras" else "")
            )
            log(f"  running {label} ...")
            record = dict(cell, framework=framework, backend=backend)
            try:
                if framework == "hf":
                    times, extra = run_hf_cell(
                        shape, cell, spec["warmup"], spec["steps"], spec["torch_compile"]
                    )
                else:
                    times, extra = run_keras_cell(
                        framework,
                        shape,
                        cell,
                        spec["jit_compile"],
                        spec["warmup"],
                        spec["steps"],
                        optimizer=optimizer,
                    )
                median, all_times = median_and_all(times)
                flops = step_flops(
                    shape, cell["sequence_length"], cell["workload"], cell["num_masks"]
                )
                throughput = cell["batch_size"] / median
                record.update(
                    extra,
                    step_seconds=round(median, 5),
                    step_seconds_all=all_times,
                    sequences_per_second=round(throughput, 3),
                    flops_per_sequence=flops,
                    achieved_flops=throughput * flops,
                )
                log(f"    {throughput:8.2f} seq/s (median step {median * 1000:.0f} ms)")
            except Exception as error:
                record["error"] = f"{type(error).__name__}: {error}"[:500]
                if framework == "hf" and spec["torch_compile"]:
                    record["label"] = "hf-compile"
                log(f"    failed: {record['error']}")
            results.append(record)
    _add_peaks_and_bounds(backend, info["device_kind"], results, peaks)
    print(
        RESULT_MARKER + json.dumps({"info": info, "peaks": peaks, "results": results}), flush=True
    )


def worker_environment(backend, hugepages=False, allocator_tuning=True):
    """The environment of a worker: its Keras backend, and the allocator settings asked for.

    `hugepages=False` also removes the tunable from a `GLIBC_TUNABLES` inherited from the caller
    (the Makefile exports it), so that "off" means off. `allocator_tuning=False` sets
    `KBERT_MALLOC_TUNING=0`: `kbert.tune_allocator()` then leaves glibc's allocator as it is.
    """
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2")
    tunables = [t for t in env.get("GLIBC_TUNABLES", "").split(":") if t and t != HUGEPAGE_TUNABLE]
    if hugepages:
        tunables.append(HUGEPAGE_TUNABLE)
    if tunables:
        env["GLIBC_TUNABLES"] = ":".join(tunables)
    else:
        env.pop("GLIBC_TUNABLES", None)
    if not allocator_tuning:
        env["KBERT_MALLOC_TUNING"] = "0"
    return env


def spawn(spec, backend, nice, hugepages=False, allocator_tuning=False):
    """Runs one worker process for `spec` and returns its JSON result.

    Hugging Face workers never get kbert's allocator tuning: HF's users do not import kbert.
    """
    allocator_tuning = allocator_tuning and spec.get("family") != "hf"
    env = worker_environment(backend, hugepages, allocator_tuning)
    spec = dict(spec, allocator_tuning=allocator_tuning)
    command = [sys.executable, BENCHMARK_SCRIPT, "--worker", json.dumps(spec)]
    if nice:
        command = ["nice", "-n", str(nice)] + command
    process = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True)
    for line in process.stdout.splitlines():
        if line.startswith(RESULT_MARKER):
            return json.loads(line[len(RESULT_MARKER) :])
    raise RuntimeError(f"worker for {backend} exited with {process.returncode} and no result")
