"""The harness every benchmark script runs on: worker processes, rounds, timing, results.

* A system (a Keras backend, Hugging Face, sentence-transformers...) runs in its own worker
  process: `KERAS_BACKEND` is fixed when Keras is imported, and two engines in one process
  compete for the same cores with their idle threads. `spawn` starts `script --worker SPEC`
  in the environment of `worker_environment`; the worker computes and calls `emit(result)`,
  which prints one line, `RESULT_MARKER` + JSON, that `spawn` reads back. Every other line the
  worker prints goes on to the caller's stderr as it comes.
* `run_rounds` runs a list of systems `rounds` times, one after the other, and `merge_rounds`
  keeps each row's fastest round (a machine whose speed drifts over minutes then penalises
  every system alike) with the rate of every round.
* `time_calls` and `interleave` time callables in a process: repeated calls, or several
  callables taking turns; `timed_row` is the result row of the best of repeated passes over
  a list of texts.
* `write_json` writes a result file atomically, `write_results` a run of rows with its
  command, date, settings and load averages; `command_line` and `load_average` describe the
  run.
"""

import datetime
import json
import os
import subprocess
import sys
import time

# The line prefix of a worker's (or a checked plain script's) JSON result on stdout.
RESULT_MARKER = "@@KBERT_BENCHMARK@@"

# glibc >= 2.35: back malloc's large blocks with transparent huge pages (when the kernel's THP
# mode is `madvise`). XLA's per-step temporary buffer (1.5 GiB for the L6-H384 fine-tuning step)
# is a fresh mmap each step; on 4 KiB pages that is ~490k page faults and ~1 s of kernel time
# per step on the 2-vCPU machine, on 2 MiB pages ~1.4k. It is a process setting, given to
# every worker (kbert, keras-hub and HF alike) or to none.
HUGEPAGE_TUNABLE = "glibc.malloc.hugetlb=1"


def log(message):
    print(message, file=sys.stderr, flush=True)


def emit(result):
    """In a worker: prints `result` as the line `spawn` reads back."""
    print(RESULT_MARKER + json.dumps(result), flush=True)


def worker_environment(
    backend, device=None, hugepages=None, allocator_tuning=None, defaults=None, pythonpath=None
):
    """The environment of a worker: the caller's, with its Keras backend and the settings asked.

    `device="cpu"` hides every GPU (`CUDA_VISIBLE_DEVICES=""`). `hugepages` True adds
    `HUGEPAGE_TUNABLE` to `GLIBC_TUNABLES`, False also removes it from an inherited
    `GLIBC_TUNABLES` (the Makefile exports it), so that "off" means off; None leaves it as
    inherited. `allocator_tuning=False` sets `KBERT_MALLOC_TUNING=0`: `kbert.tune_allocator()`
    then leaves glibc's allocator as it is. `defaults` are set where the caller has not set
    them; `pythonpath` is put in front of the inherited `PYTHONPATH`.
    """
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2")
    for name, value in (defaults or {}).items():
        env.setdefault(name, value)
    if hugepages is not None:
        tunables = env.get("GLIBC_TUNABLES", "").split(":")
        tunables = [t for t in tunables if t and t != HUGEPAGE_TUNABLE]
        if hugepages:
            tunables.append(HUGEPAGE_TUNABLE)
        if tunables:
            env["GLIBC_TUNABLES"] = ":".join(tunables)
        else:
            env.pop("GLIBC_TUNABLES", None)
    if allocator_tuning is False:
        env["KBERT_MALLOC_TUNING"] = "0"
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, env.get("PYTHONPATH")]))
    return env


def run_for_result(command, env=None, name="worker"):
    """Runs `command` and returns the JSON of its `RESULT_MARKER` line (the last, if several);
    its other stdout lines go to stderr as they come. Raises `RuntimeError` without one."""
    result = None
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True) as process:
        for line in process.stdout:
            if line.startswith(RESULT_MARKER):
                result = json.loads(line[len(RESULT_MARKER) :])
            else:
                sys.stderr.write(line)
        returncode = process.wait()
    if result is None:
        raise RuntimeError(f"the {name} exited with {returncode} and no result")
    return result


def spawn(script, spec, env, nice=0, name=None):
    """Runs `script --worker SPEC` (SPEC as JSON) in a new process with `env`, under
    `nice -n NICE` if asked, and returns what the worker emitted. `spec["python"]`, when
    given, is the interpreter (a system from another virtual environment)."""
    python = spec.get("python") or sys.executable
    command = [python, os.path.abspath(script), "--worker", json.dumps(spec)]
    if nice:
        command = ["nice", "-n", str(nice)] + command
    return run_for_result(command, env, name or "worker")


def system_environment(spec):
    """The environment of a text system's worker (`spec["system"]`: "kbert-<backend>" or a
    torch library): its Keras backend (torch for the others), no GPU visible where
    `spec["device"]` is "cpu", no tokenizer thread pool unless the caller asks for one."""
    system = spec["system"]
    # "kbert-<backend>" or "kbert-<backend>-<variant>" (e.g. kbert-torch-int8).
    backend = system.split("-")[1] if system.startswith("kbert-") else "torch"
    if backend in ("onnx", "openvino"):  # kbert's serving exports: traced on torch
        backend = "torch"
    defaults = {"TOKENIZERS_PARALLELISM": "false"}
    return worker_environment(backend, device=spec.get("device"), defaults=defaults)


def run_rounds(script, base, systems, rounds, workloads, environment=system_environment):
    """Runs every system `rounds` times, one after the other, each in a new worker of `script`
    (spec `base` + `system`, environment `environment(spec)`), and returns the merged rows
    (`merge_rounds`); a failed worker gives an error row per workload."""
    results = []
    for round_index in range(rounds):
        for index, system in enumerate(systems):
            log(f"[round {round_index + 1}/{rounds}, {index + 1}/{len(systems)}] {system}")
            spec = dict(base, system=system)
            try:
                rows = spawn(script, spec, environment(spec), name=f"{system} worker")
            except RuntimeError as error:
                rows = [{"system": system, "workload": w, "error": str(error)} for w in workloads]
            results = merge_rounds(results, rows)
    return results


def merge_rounds(results, rows, key=lambda row: (row["system"], row["workload"]), rate=None):
    """Adds one round's rows to `results`: per `key(row)` the row with the highest `rate`
    (default "texts_per_second") is kept, and every round's rate is listed under
    `rounds_<rate>` (None for a failed round, a row with "error"). A failed row never
    replaces a measured one."""
    rate = rate or "texts_per_second"
    merged = {key(r): r for r in results}
    for row in rows:
        previous = merged.get(key(row))
        history = [] if previous is None else previous.get(f"rounds_{rate}", [])
        best = row
        if previous is not None and "error" not in previous:
            if "error" in row or previous[rate] >= row[rate]:
                best = previous
        merged[key(row)] = dict(best, **{f"rounds_{rate}": history + [row.get(rate)]})
    return list(merged.values())


def time_calls(run, repeats, warmup=0, sync=None):
    """Wall seconds of `repeats` calls of `run` after `warmup` untimed ones; `sync()` (waiting
    for a device) is called after each and counted in its time."""
    for _ in range(warmup):
        run()
    if sync:
        sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        if sync:
            sync()
        times.append(time.perf_counter() - start)
    return times


def timed_row(spec, workload, texts, run, **extra):
    """Times `run(texts)` `spec["repeats"]` times (after the caller's untimed pass) and returns
    the result row of the best pass (`extra` added to it)."""
    times = time_calls(lambda: run(texts), spec["repeats"])
    best = min(times)
    log(f"  {spec['system']} {workload}: {len(texts) / best:.1f} texts/s")
    return {
        "system": spec["system"],
        "workload": workload,
        "texts": len(texts),
        **extra,
        "seconds": round(best, 4),
        "seconds_all": [round(t, 4) for t in times],
        "texts_per_second": round(len(texts) / best, 2),
    }


def interleave(runs, rounds):
    """Calls every `runs[name](round_index)` once per round, taking turns (each sees the
    machine's load alike); returns `{name: [(seconds, returned value) per round]}`."""
    measured = {name: [] for name in runs}
    for round_index in range(rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            value = run(round_index)
            measured[name].append((time.perf_counter() - start, value))
    return measured


def check_positive_ints(parser, args, names):
    """`parser.error` for the first option of `names` set to an integer below 1 (None = unset)."""
    for name in names:
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(
                f"--{name.replace('_', '-')} must be a positive integer. Received: {value}"
            )


def command_line(script, argv=None):
    """The command of this run as a user types it: `python <script> <arguments>`."""
    arguments = sys.argv[1:] if argv is None else list(argv)
    return "python " + " ".join([os.path.relpath(script)] + arguments)


def load_average():
    """The 1-, 5- and 15-minute load averages (None where the system has none)."""
    try:
        return os.getloadavg()
    except OSError:
        return None


def write_json(path, payload, indent=1):
    """Writes `payload` as indented JSON, through a temporary file (no half-written results)."""
    path = os.fspath(path)
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    temporary = path + ".tmp"
    with open(temporary, "w") as f:
        json.dump(payload, f, indent=indent)
        f.write("\n")
    os.replace(temporary, path)


def write_results(path, command, settings, load, end_load, results):
    """The run as JSON: command, date, settings, load averages and every result row."""
    payload = {
        "command": command,
        "date": datetime.datetime.now().isoformat(),
        "settings": settings,
        "load_average_start": load,
        "load_average_end": end_load,
        "results": results,
    }
    write_json(path, payload)
