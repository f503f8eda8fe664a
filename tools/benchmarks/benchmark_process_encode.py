"""Corpus encoding over two processes against one process that uses both cores, per backend.

    python tools/benchmarks/benchmark_process_encode.py --data-dir DATA --rounds 2 \
        --json e.json --chart e.png

`BertTextEmbedder.from_preset(checkpoint).encode(texts, batch_size)` (all-MiniLM-L6-v2 by
default) on SQuAD v1.1 dev paragraphs (long texts, the first `--paragraphs`) and questions
(short texts, the first `--questions`), CPU, float32, on each Keras backend, two ways:

* **one process** with every core of the machine (the backend's own threads);
* **two processes** started as the README's launch lines start them (torch's
  `RANK`/`WORLD_SIZE`/`MASTER_*`, `TF_CONFIG`, `KERAS_DISTRIBUTION_*`), each pinned to its
  own core with one compute thread, `kbert.distribution.initialize()`, then the same
  `encode`: each process embeds its share and gets every row back.

Each run does one untimed pass, then `--repeats` timed passes (the processes start each
pass together, after a barrier; a pass ends when process 0 holds every row), the best kept;
`--rounds N` keeps each setting's fastest of N rounds. Prints texts per second, the ratio
two processes / one process, and the largest difference between the two runs' embeddings.
`--json` writes the results, `--chart` a bar chart of the ratios.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.charts import pyplot, save
from bench.data import check_data_files, default_data_dir, resolve_checkpoint, squad_dev_paragraphs
from bench.harness import (
    RESULT_MARKER,
    check_positive_ints,
    command_line,
    emit,
    load_average,
    log,
    merge_rounds,
    worker_environment,
    write_results,
)
from bench.tables import ratio_table

BACKENDS = ("jax", "tensorflow", "torch")
WORKLOADS = ("paragraphs", "questions")


def _texts(spec):
    paragraphs = squad_dev_paragraphs(spec["data_dir"])
    if spec["workload"] == "paragraphs":
        return [p["context"] for p in paragraphs[: spec["paragraphs"]]]
    questions = [q["question"] for p in paragraphs for q in p["qas"]]
    return questions[: spec["questions"]]


def worker(spec):
    """One process of one setting: times `encode` and saves the embeddings (process 0)."""
    import numpy as np

    import kbert
    from kbert import processes
    from kbert.models import BertTextEmbedder

    if spec["processes"] > 1:
        kbert.distribution.initialize(timeout=300)
    embedder = BertTextEmbedder.from_preset(spec["checkpoint"])
    texts = _texts(spec)

    def run():
        processes.all_sum([np.zeros(1)])  # start together
        start = time.perf_counter()
        embeddings = embedder.encode(texts, batch_size=spec["batch_size"])
        return time.perf_counter() - start, embeddings

    run()
    best, embeddings = min(run() for _ in range(spec["repeats"]))
    if processes.is_writer():
        np.save(spec["embeddings"], embeddings)
        emit({"seconds": best, "texts": len(texts)})


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch_env(backend, index, count, ports, threads):
    env = worker_environment(backend, device="cpu")
    env.update(OMP_NUM_THREADS=str(threads), TF_NUM_INTRAOP_THREADS=str(threads))
    env.update(TF_NUM_INTEROP_THREADS="1", TOKENIZERS_PARALLELISM="false")
    if threads == 1 and backend == "jax":
        flags = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        env["XLA_FLAGS"] = " ".join(filter(None, [env.get("XLA_FLAGS"), flags]))
    if count == 1:
        return env
    if backend == "torch":
        env.update(RANK=str(index), LOCAL_RANK=str(index), WORLD_SIZE=str(count))
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(ports[0]))
    elif backend == "jax":
        env.update(KERAS_DISTRIBUTION_JOB_ADDRESSES=f"127.0.0.1:{ports[0]}")
        env.update(KERAS_DISTRIBUTION_NUM_PROCESSES=str(count))
        env.update(KERAS_DISTRIBUTION_PROCESS_ID=str(index))
    else:
        workers = [f"127.0.0.1:{p}" for p in ports]
        env["TF_CONFIG"] = json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        )
    return env


def run_setting(spec, backend, count):
    """The two-process (or one-process) run of `spec`: its result row."""
    cores = sorted(os.sched_getaffinity(0))
    ports = [_free_port() for _ in range(count)]
    spec = dict(spec, processes=count)
    started = []
    for index in range(count):
        threads = 1 if count > 1 else len(cores)
        command = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)]
        if count > 1:
            command = ["taskset", "-c", str(cores[index % len(cores)])] + command
        env = _launch_env(backend, index, count, ports, threads)
        started.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True))
    outputs = [p.communicate()[0] for p in started]
    system = f"kbert-{backend}-{count}p"
    row = {"system": system, "workload": spec["workload"], "processes": count}
    lines = [line for line in outputs[0].splitlines() if line.startswith(RESULT_MARKER)]
    if not lines or any(p.returncode for p in started):
        codes = [p.returncode for p in started]
        return dict(row, error=f"exit codes {codes}, no result" if not lines else str(codes))
    result = json.loads(lines[-1][len(RESULT_MARKER) :])
    return dict(row, texts=result["texts"], texts_per_second=result["texts"] / result["seconds"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--data-dir", default=str(default_data_dir()))
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--paragraphs", type=int, default=400)
    parser.add_argument("--questions", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", default=None)
    parser.add_argument("--chart", default=None)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(json.loads(args.worker))
    check_positive_ints(
        parser, args, ("paragraphs", "questions", "batch_size", "repeats", "rounds")
    )
    check_data_files(args.data_dir, "squad/dev-v1.1.json")
    backends = [b for b in args.backends.split(",") if b]
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown:
        parser.error(f"--backends takes {','.join(BACKENDS)}. Received: {unknown}")
    load = load_average()
    base = dict(
        checkpoint=resolve_checkpoint(args.checkpoint),
        data_dir=args.data_dir,
        paragraphs=args.paragraphs,
        questions=args.questions,
        batch_size=args.batch_size,
        repeats=args.repeats,
    )
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for round_index in range(args.rounds):
            for backend in backends:
                for workload in WORKLOADS:
                    saved = {}
                    for count in (1, 2):
                        log(
                            f"[round {round_index + 1}/{args.rounds}] {backend} {workload} {count}p"
                        )
                        path = str(Path(folder) / f"{backend}-{workload}-{count}.npy")
                        spec = dict(base, workload=workload, embeddings=path)
                        row = run_setting(spec, backend, count)
                        saved[count] = path
                        results = merge_rounds(results, [row])
                    _add_difference(results, backend, workload, saved)
    _print(results, backends)
    if args.chart:
        _chart(results, backends, args.chart)
    if args.json:
        write_results(args.json, command_line(__file__, argv), base, load, load_average(), results)


def _add_difference(results, backend, workload, saved):
    import numpy as np

    if not all(Path(p).is_file() for p in saved.values()):
        return
    difference = float(np.abs(np.load(saved[1]) - np.load(saved[2])).max())
    for row in results:
        if row["workload"] == workload and row["system"] == f"kbert-{backend}-2p":
            row["max_abs_diff_vs_one_process"] = difference


def _print(results, backends):
    for backend in backends:
        rows = [r for r in results if r["system"].startswith(f"kbert-{backend}-")]
        anchor = f"kbert-{backend}-1p"
        columns = (("max|diff|", "max_abs_diff_vs_one_process", "{:.1e}"),)
        print(ratio_table(rows, list(WORKLOADS), anchor, columns, anchor_label="1p"))


def _chart(results, backends, path):
    """Per workload: texts/s of one and of two processes on each backend, with the ratio."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(WORKLOADS), figsize=(6 * len(WORKLOADS), 3.5), squeeze=False)
    for ax, workload in zip(axes[0], WORKLOADS):
        names, rates, colors, notes = [], [], [], []
        for backend in backends:
            rows = {
                r["processes"]: r
                for r in results
                if r["workload"] == workload
                and r["system"].startswith(f"kbert-{backend}-")
                and "error" not in r
            }
            for count in (1, 2):
                if count not in rows:
                    continue
                names.append(f"{backend}, {count} process{'es' if count > 1 else ''}")
                rates.append(rows[count]["texts_per_second"])
                colors.append("tab:gray" if count == 1 else "tab:blue")
                ratio = rates[-1] / rows[1]["texts_per_second"] if count == 2 and 1 in rows else 0
                notes.append(f" {rates[-1]:.1f}" + (f" ({ratio:.2f}x)" if ratio else ""))
        bars = ax.barh(names, rates, color=colors)
        for bar, note in zip(bars, notes):
            y = bar.get_y() + bar.get_height() / 2
            ax.text(bar.get_width(), y, note, va="center", fontsize=8)
        ax.invert_yaxis()
        ax.set_title(f"{workload}: 2 processes (1 core each) vs 1 (2 cores)", fontsize=10)
        ax.set_xlabel("texts / second")
        ax.set_xlim(0, max(rates + [1]) * 1.4)
    save(fig, path)


if __name__ == "__main__":
    main()
