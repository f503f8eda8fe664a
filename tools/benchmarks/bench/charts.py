"""PNG charts of the benchmark scripts (matplotlib, imported only when a chart is drawn)."""


def pyplot():
    """`matplotlib.pyplot` on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(figure, path, dpi=120):
    """Lays `figure` out, writes it to `path` as PNG and closes it."""
    figure.tight_layout()
    figure.savefig(path, dpi=dpi)
    pyplot().close(figure)


def length_heading(workload, rows):
    return f"{workload} texts (max length {rows[0]['sequence_length'] if rows else '?'})"


def titled(titles):
    """A `heading` of `ratio_bars` titling workload `w`'s panel `titles[w]`."""
    return lambda workload, rows: titles[workload]


# How a bar's ratio names its anchor system ("1.20x HF"); other anchors go unnamed.
ANCHOR_LABELS = {"hf": " HF", "sentence-transformers": " s-t"}


def ratio_bars(results, path, title, workloads, anchor="hf", heading=length_heading, unit="texts"):
    """One horizontal bar chart per workload: `unit`/s of each system (`results` rows of
    `system`, `workload`, `texts_per_second`) and its ratio to the `anchor` system (named as
    `ANCHOR_LABELS` names it); `heading(workload, rows)` titles each panel."""
    plt = pyplot()
    label = ANCHOR_LABELS.get(anchor, "")
    workloads = [w for w in workloads if any(r["workload"] == w for r in results)]
    fig, axes = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 4), squeeze=False)
    for ax, workload in zip(axes[0], workloads):
        rows = [r for r in results if r["workload"] == workload and "error" not in r]
        base = next((r["texts_per_second"] for r in rows if r["system"] == anchor), None)
        names = [r["system"] for r in rows]
        rates = [r["texts_per_second"] for r in rows]
        colors = ["tab:blue" if n.startswith("kbert") else "tab:gray" for n in names]
        bars = ax.barh(names, rates, color=colors)
        for bar, rate in zip(bars, rates):
            text = f" {rate:.1f}" + (f" ({rate / base:.2f}x{label})" if base else "")
            ax.text(
                bar.get_width(), bar.get_y() + bar.get_height() / 2, text, va="center", fontsize=8
            )
        ax.invert_yaxis()
        ax.set_title(heading(workload, rows))
        ax.set_xlabel(f"{unit} / second")
        ax.set_xlim(0, max(rates + [1]) * 1.45)
    fig.suptitle(title, fontsize=9)
    save(fig, path)


def before_after_bars(results, path, metric, ylabel, title):
    """Grouped bars of `results[system]["before"][metric]` and `["after"][metric]` per system
    (a training comparison: the same start, each system's score after training)."""
    names = list(results)
    figure, axis = pyplot().subplots(figsize=(7, 4))
    width = 0.35
    for j, stage in enumerate(("before", "after")):
        values = [results[n][stage][metric] for n in names]
        positions = [i + (j - 0.5) * width for i in range(len(names))]
        bars = axis.bar(positions, values, width, label=f"{stage} training")
        axis.bar_label(bars, fmt="%.2f", fontsize=8)
    axis.set_xticks(range(len(names)), names)
    axis.set_ylabel(ylabel)
    axis.set_title(title)
    axis.legend(loc="lower right")
    save(figure, path)
