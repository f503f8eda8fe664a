"""Reports: best-of-rounds selection, the common matmul peak, the text tables, the goal lines, the
chart."""

from bench.cells import CPU_GOALS, GPU_GOALS, HOST_OVERHEAD_GOALS
from bench.charts import pyplot, save
from bench.harness import merge_rounds


def cell_key(record):
    return (
        record["preset"],
        record["sequence_length"],
        record["batch_size"],
        record["precision"],
        record["workload"],
    )


def label(record):
    """A row's name: the framework, or a variant of it ("hf-compile", "kbert+AdamW")."""
    return record.get("label", record["framework"])


def best_of_rounds(records):
    """Keeps, per (cell, row label, backend), the round with the highest throughput; every
    round's figure is listed under `rounds_sequences_per_second`."""
    return merge_rounds(
        [],
        records,
        key=lambda r: cell_key(r) + (label(r), r["backend"]),
        rate="sequences_per_second",
    )


def common_peaks(peaks):
    """Per precision, the largest matmul peak measured on the device by any backend in the run.

    `peaks` maps "backend/precision" to FLOP/s. One figure per precision serves every row's
    MFU: the device's limit does not depend on the framework that measured it (on an H100,
    JAX's own bf16 figure was 487 TFLOP/s against torch's 765).
    """
    common = {}
    for name, peak in peaks.items():
        precision = name.split("/", 1)[1]
        if peak:
            common[precision] = max(common.get(precision, 0), peak)
    return common


def apply_common_peaks(records, peaks):
    """Sets every record's `mfu` against the common peak of its precision (the own-backend MFU
    kept)."""
    common = common_peaks(peaks)
    for record in records:
        if "error" in record or record["precision"] not in common:
            continue
        record["mfu_own_peak"] = record.get("mfu")
        record["matmul_peak_flops"] = common[record["precision"]]
        record["mfu"] = record["achieved_flops"] / common[record["precision"]]
    return records


def _reference(rows):
    """The HF row ratios are taken against: eager when measured, else the compiled one."""
    ok = [r for r in rows if r["framework"] == "hf" and "error" not in r]
    return next((r for r in ok if not r.get("torch_compile")), ok[0] if ok else None)


def format_table(records):
    """A text table per cell: throughput, MFU and ratios to HF and to keras-hub on the same
    backend."""
    lines = []
    by_cell = {}
    for record in records:
        by_cell.setdefault(cell_key(record), []).append(record)
    width = max([10] + [len(label(r)) for r in records])
    for key in sorted(by_cell):
        preset, length, batch, precision, workload = key
        rows = by_cell[key]
        hf = _reference(rows)
        lines.append(f"\n{workload}  {preset}  batch={batch}  seq={length}  {precision}")
        lines.append(
            f"  {'framework':<{width}} {'backend':<11} {'seq/s':>9} {'step ms':>9} {'MFU':>7} "
            f"{'vs HF':>7} {'vs keras-hub':>13}"
        )
        for record in sorted(rows, key=lambda r: (label(r), r["backend"])):
            if "error" in record:
                lines.append(
                    f"  {label(record):<{width}} {record['backend']:<11} "
                    f"failed: {record['error'][:70]}"
                )
                continue
            speed = record["sequences_per_second"]
            hub = next(
                (
                    r
                    for r in rows
                    if r["framework"] == "keras_hub"
                    and r["backend"] == record["backend"]
                    and "error" not in r
                ),
                None,
            )
            vs_hf = f"{speed / hf['sequences_per_second']:.2f}x" if hf else "-"
            vs_hub = (
                f"{speed / hub['sequences_per_second']:.2f}x"
                if hub and record["framework"] == "kbert"
                else "-"
            )
            mfu = f"{100 * record['mfu']:.0f}%" if record.get("mfu") else "-"
            lines.append(
                f"  {label(record):<{width}} {record['backend']:<11} {speed:>9.2f} "
                f"{1000 * record['step_seconds']:>9.0f} {mfu:>7} {vs_hf:>7} {vs_hub:>13}"
            )
    return "\n".join(lines)


def format_page_faults(records):
    """Minor page faults per timed step of every row (`getrusage`; robust to load on the
    machine)."""
    lines = ["\nminor page faults per step (median of the timed steps):"]
    for record in sorted(records, key=lambda r: cell_key(r) + (label(r), r["backend"])):
        if record.get("page_faults_per_step") is None:
            continue
        lines.append(
            f"  {record['workload']:<9} {record['preset']:<22} {label(record):<12} "
            f"{record['backend']:<11} {record['page_faults_per_step']:>9}"
        )
    return "\n".join(lines)


def _suite_records(records, cells):
    """The records of a suite's cells."""
    keys = {cell_key(cell) for cell in cells}
    return [r for r in records if cell_key(r) in keys]


def check_goals(records, peaks, suite_records=None):
    """Lines stating each CPU goal of the performance issue, the measured value and whether it is
    met.

    The forward-pass goal divides kbert's FLOP rate by the highest matmul peak measured on
    any backend in the run (the machine's matmul limit), and also reports each backend's own.
    A further line gives each forward row's share of its backend's matmul bound: the time the
    forward's own matmuls take alone, at its shapes, on that backend (`matmul_bound_seconds`).
    """
    if suite_records is not None:
        records = suite_records

    def find(workload, framework, backend=None):
        return [
            r
            for r in records
            if r["workload"] == workload
            and r["framework"] == framework
            and "error" not in r
            and (backend is None or r["backend"] == backend)
            and "label" not in r
        ]

    lines = ["\ngoals (CPU, this run):"]
    hf = {r["workload"]: r for r in find("finetune", "hf")}
    for workload, what, threshold in CPU_GOALS:
        if workload == "finetune":
            backend = what.split()[0].split("/")[1]
            ours = find(workload, "kbert", backend)
            if not ours or workload not in hf:
                lines.append(f"  {workload}: {what} >= {threshold:.2f}x: not measured")
                continue
            ratio = ours[0]["sequences_per_second"] / hf[workload]["sequences_per_second"]
            verdict = "met" if ratio >= threshold else "NOT met"
            lines.append(
                f"  {workload}: {what} = {ratio:.2f}x (goal >= {threshold:.2f}x): {verdict}"
            )
        else:
            ours = find(workload, "kbert")
            cpu_peaks = [v for k, v in peaks.items() if k.endswith("/float32")]
            if not ours or not cpu_peaks:
                lines.append(f"  {workload}: {what} >= {threshold:.0%}: not measured")
                continue
            best = max(ours, key=lambda r: r["sequences_per_second"])
            limit = max(cpu_peaks)
            share = best["sequences_per_second"] * best["flops_per_sequence"] / limit
            own = ", ".join(
                f"{r['backend']} {100 * r['mfu_own_peak']:.0f}% of its own"
                for r in ours
                if r.get("mfu_own_peak")
            )
            verdict = "met" if share >= threshold else "NOT met"
            lines.append(
                f"  {workload}: {what} = {share:.0%} ({best['backend']}, "
                f"{best['sequences_per_second']:.2f} seq/s against {limit / 1e9:.0f} GFLOP/s; "
                f"{own}) (goal >= {threshold:.0%}): {verdict}"
            )
            bounded = [
                f"{r['framework']}/{r['backend']} "
                f"{r['matmul_bound_seconds'] / r['step_seconds']:.0%}"
                for r in ours + find(workload, "hf")
                if r.get("matmul_bound_seconds")
            ]
            if bounded:
                lines.append(
                    f"  {workload}: share of the backend's own matmuls at the forward's shapes "
                    f"(their time alone / the step's): {', '.join(bounded)}"
                )
    return "\n".join(lines)


def judge_goals(goals, records, full_preset=None):
    """Each goal's measured value against its threshold, as dicts: `workload`, `row`
    ("<label>/<backend>"), `measure`, `threshold`, `value` (None when not measured), `status`
    ("met", "not met", "not measured" or "not judged") and `text` (the goal line).

    `goals`: (workload, kbert backend, measure, threshold[, row label]) tuples (see
    `bench.cells`). Absolute throughput and MFU goals hold for `full_preset` only; on another
    shape (`--config tiny`) their status is "not judged".
    """

    def row(workload, name, backend=None):
        return next(
            (
                r
                for r in records
                if r["workload"] == workload
                and label(r) == name
                and "error" not in r
                and (backend is None or r["backend"] == backend)
            ),
            None,
        )

    judged = []
    for workload, backend, measure, threshold, *name in goals:
        name = name[0] if name else "kbert"
        ours = row(workload, name, backend)
        what = f"{name}/{backend}"
        value, status = None, "not measured"
        if measure.startswith("vs "):
            reference = row(workload, measure[3:])
            text = f"{what} {measure} >= {threshold:.2f}x"
            if ours is not None and reference is not None:
                value = ours["sequences_per_second"] / reference["sequences_per_second"]
                text = f"{what} {measure} = {value:.2f}x (goal >= {threshold:.2f}x)"
        elif measure == "mfu":
            text = f"{what} MFU >= {threshold:.0%}"
            if ours is not None and ours.get("mfu"):
                value = ours["mfu"]
                text = (
                    f"{what} MFU = {value:.1%} against the common peak "
                    f"{ours['matmul_peak_flops'] / 1e12:.4g} TFLOP/s (goal >= {threshold:.0%})"
                )
        else:
            text = f"{what} >= {threshold:,} seq/s"
            if ours is not None:
                value = ours["sequences_per_second"]
                text = f"{what} = {value:,.0f} seq/s (goal >= {threshold:,})"
        if value is not None:
            status = "met" if value >= threshold else "not met"
            absolute = not measure.startswith("vs ")
            if absolute and full_preset and ours["preset"] != full_preset:
                status = f"not judged ({ours['preset']} is not {full_preset})"
        judged.append(
            {
                "workload": workload,
                "row": what,
                "measure": measure,
                "threshold": threshold,
                "value": value,
                "status": status.split(" (")[0],
                "text": f"{workload}: {text}: {'NOT met' if status == 'not met' else status}",
            }
        )
    return judged


def check_suite_goals(title, goals, records, full_preset=None):
    """Goal lines of a suite (`judge_goals`), under a title."""
    lines = [f"\ngoals ({title}, this run):"]
    lines += [f"  {goal['text']}" for goal in judge_goals(goals, records, full_preset)]
    return "\n".join(lines)


def goal_report(suite_cells, records, peaks):
    """The goal lines of every suite of the run that has goals; `suite_cells`: suite -> its
    cells."""
    parts = []
    for suite, cells in suite_cells.items():
        mine = _suite_records(records, cells)
        if suite == "cpu-goals":
            parts.append(check_goals(records, peaks, mine))
        elif suite == "gpu-goals":
            parts.append(
                check_suite_goals("GPU", GPU_GOALS, mine, full_preset="bert_base_en_uncased")
            )
        elif suite == "host-overhead":
            parts.append(check_suite_goals("host overhead, CPU", HOST_OVERHEAD_GOALS, mine))
    return "".join(parts)


def write_chart(records, path):
    by_cell = {}
    for record in records:
        if "error" not in record:
            by_cell.setdefault(cell_key(record), []).append(record)
    keys = sorted(by_cell)
    if not keys:
        return
    figure, axes = pyplot().subplots(len(keys), 1, figsize=(9, 2.6 * len(keys)), squeeze=False)
    colours = {"kbert": "#1f77b4", "keras_hub": "#ff7f0e", "hf": "#2ca02c"}
    rows_key = lambda r: (label(r), r["backend"])  # noqa: E731
    for axis, key in zip(axes[:, 0], keys):
        rows = sorted(by_cell[key], key=rows_key)
        labels = [
            f"{label(r)}\n{'torch' if r['framework'] == 'hf' else r['backend']}" for r in rows
        ]
        values = [r["sequences_per_second"] for r in rows]
        bars = axis.bar(labels, values, color=[colours[r["framework"]] for r in rows])
        for bar, record in zip(bars, rows):
            mfu = record.get("mfu")
            text = f"{bar.get_height():.1f}" + (f"\n{100 * mfu:.0f}% MFU" if mfu else "")
            axis.annotate(
                text,
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=7,
            )
        preset, length, batch, precision, workload = key
        axis.set_title(
            f"{workload}: {preset}, batch {batch}, seq {length}, {precision}", fontsize=9
        )
        axis.set_ylabel("sequences / s")
        axis.set_ylim(0, max(values) * 1.35)
        axis.tick_params(axis="x", labelsize=7)
    save(figure, path)
