"""Plain-text result tables of the benchmark scripts: per workload, each system's rate, its ratio
to a reference system and the script's own columns."""


def ratio_table(results, workloads, anchor, columns=(), unit="texts", anchor_label="s-t"):
    """One block per workload of `workloads` that has rows: a heading (`workload: N <unit>`),
    then one line per system of `results` (rows of `system`, `workload`, `texts`,
    `texts_per_second`, or `error`) with its rate, its ratio to the `anchor` system's rate
    ("-" without one) and a cell per column.

    Args:
        results: list of dict. The result rows.
        workloads: the workload names, in the order printed.
        anchor: str. The system the ratios are taken to.
        columns: `(title, key, format)` triples: a cell of `format` (e.g. "{:.1e}") applied to
            `row[key]`, "-" where the row has no `key`. Defaults to none.
        unit: str. What the systems process ("texts", "pairs"). Defaults to `"texts"`.
        anchor_label: str. The anchor's name in the ratio header. Defaults to `"s-t"`.

    Returns:
        str, the table's lines (starting with a blank line per workload).
    """
    columns = list(columns)
    widths = [max(len(title) + 1, 7) for title, _, _ in columns]
    rate_header = f"{unit}/s"
    ratio_header = f"vs {anchor_label}"
    lines = []
    for workload in workloads:
        rows = [r for r in results if r["workload"] == workload]
        if not rows:
            continue
        lines.append(f"\n{workload}: {rows[0].get('texts', '?')} {unit}")
        header = f"  {'system':<22} {rate_header:>9} {ratio_header:>7}"
        header += "".join(f" {title:>{w}}" for (title, _, _), w in zip(columns, widths))
        lines.append(header)
        base = next(
            (r["texts_per_second"] for r in rows if r["system"] == anchor and "error" not in r),
            None,
        )
        for r in rows:
            if "error" in r:
                lines.append(f"  {r['system']:<22} failed: {r['error'][:70]}")
                continue
            rate = r["texts_per_second"]
            ratio = f"{rate / base:.2f}x" if base else "-"
            line = f"  {r['system']:<22} {rate:>9.1f} {ratio:>7}"
            for (_, key, form), w in zip(columns, widths):
                cell = form.format(r[key]) if key in r else "-"
                line += f" {cell:>{w}}"
            lines.append(line)
    return "\n".join(lines)


def before_after_table(results, metrics, footer):
    """Prints each system's `before` and `after` scores of `metrics` (a training comparison;
    names shown without their "squad_" prefix) and `footer(result)` under each system."""
    print()
    print(f"{'system':<24s} {'':>6s} " + " ".join(f"{m[6:]:>10s}" for m in metrics))
    for system, result in results.items():
        for stage in ("before", "after"):
            row = " ".join(f"{result[stage][m]:10.2f}" for m in metrics)
            print(f"{system:<24s} {stage:>6s} {row}")
        print(f"{'':<24s} {footer(result)}")
