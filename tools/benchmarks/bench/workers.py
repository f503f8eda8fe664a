"""The model benchmark's worker (benchmark.py): one process per (framework family, backend).

`KERAS_BACKEND` is fixed when Keras is imported, so each backend runs in its own process; Hugging
Face runs in its own process too (eager and `torch.compile` separately). The worker runs every
cell of its spec and emits its records (`bench.harness`).
"""

import time

from bench.common import median_and_all, process_family
from bench.devices import device_kind, device_name
from bench.flops import encoder_matmuls, resolve_preset, step_flops
from bench.harness import emit, log
from bench.hf_timing import run_hf_cell
from bench.keras_timing import run_keras_cell
from bench.peak import measure_matmul_peak, measure_matmuls_seconds


def _versions(family):
    if family == "hf":
        import torch
        import transformers

        return {"torch": torch.__version__, "transformers": transformers.__version__}
    import importlib.metadata

    import keras

    versions = {"keras": keras.__version__}
    try:  # From its metadata: importing keras_hub imports TensorFlow where it is installed.
        versions["keras_hub"] = importlib.metadata.version("keras-hub")
    except importlib.metadata.PackageNotFoundError:
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
    if spec.get("cuda_graphs"):  # kbert's documented switch, read at every compiled call
        import kbert.backend.torch_steps

        kbert.backend.torch_steps.CUDA_GRAPHS = True
    if spec.get("torch_threads") and backend == "torch":
        import torch

        torch.set_num_threads(spec["torch_threads"])
    # The cells are timed first, in a process that has computed nothing else yet, as a user's
    # script runs them; the matmul peaks and bounds (large products of their own) come after.
    for cell in spec["cells"]:
        precision = cell["precision"]
        shape = resolve_preset(cell["preset"])
        for framework, optimizer in _runs(spec, cell):
            if spec.get("stop_at") and time.time() > spec["stop_at"]:
                log(f"  not running {cell['workload']} ({framework}): the time budget is spent")
                continue
            # A process of its own (compiled, CUDA graphs, a variant) labels its rows so.
            family = process_family(spec)
            name = framework if family == spec["family"] else family
            label = (
                f"[{name}/{backend}] {cell['preset']} {cell['workload']} "
                f"b={cell['batch_size']} s={cell['sequence_length']} {precision}"
                + (" keras AdamW" if optimizer == "keras" else "")
            )
            log(f"  running {label} ...")
            record = dict(cell, framework=framework, backend=backend)
            if name != framework:
                record["label"] = name
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
                        variant=spec.get("kbert_variant"),
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
                log(f"    failed: {record['error']}")
            results.append(record)
    _add_peaks_and_bounds(backend, info["device_kind"], results, peaks)
    emit({"info": info, "peaks": peaks, "results": results})
