"""The run of a CPU benchmark that compares kbert's backends with one reference system on the
same checkpoint (benchmark_sparse.py, benchmark_rerank.py): the rounds, the printed table, the
chart and the result file."""

from bench.data import checkpoint_name
from bench.harness import command_line, load_average, run_rounds, write_results


def run_comparison(
    script, argv, args, checkpoint, out_dir, counts, workloads, report, environment=None
):
    """Runs `args.system` over `workloads` (`args.rounds` rounds, each system in its own
    worker of `script`), then prints the title and table, writes `args.chart` and `args.json`.

    Args:
        script: the benchmark script's `__file__` (its workers run it).
        argv: the script's arguments (recorded as the command line).
        args: the parsed arguments: `system`, `rounds`, `batch_size`, `repeats`, `chart`,
            `json`.
        checkpoint: str. The directory every system loads.
        out_dir: str. Where the workers leave their outputs for `report["differences"]`.
        counts: dict. Texts (or pairs) per workload, passed to the workers.
        workloads: the workload names, in order.
        report: dict of `differences(results, out_dir) -> results`, `table(results) -> str`
            and `chart(results, path, title)`.
        environment: optional `environment(spec)` of each worker (`run_rounds`'; default:
            `system_environment`).

    Returns:
        list of dict: the result rows.
    """
    command = command_line(script, argv)
    load = load_average()
    base = {
        "checkpoint": checkpoint,
        "data_dir": args.data_dir,
        "counts": counts,
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "device": "cpu",
        "out_dir": out_dir,
    }
    extra = {} if environment is None else {"environment": environment}
    results = run_rounds(script, base, args.system, args.rounds, workloads, **extra)
    results = report["differences"](results, out_dir)
    end_load = load_average()
    title = (
        f"{checkpoint_name(checkpoint)}, batch {args.batch_size}, float32, CPU; "
        f"load average {load[0]:.1f} -> {end_load[0]:.1f}"
    )
    print(f"\n{title}")
    print(report["table"](results))
    if args.chart:
        report["chart"](results, args.chart, title)
        print(f"chart written to {args.chart}")
    if args.json:
        settings = {k: v for k, v in base.items() if k not in ("out_dir", "data_dir")}
        write_results(args.json, command, settings, load, end_load, results)
    return results
