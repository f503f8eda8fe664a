"""`--check-plain`: the benchmark's HF figures against the same workload as a plain user script.

`benchmark_plain_step.py` (next to benchmark.py) is the HF cell written as a user's own script.
It runs here, in the same run as the HF worker (right after it, each round), in the caller's
unchanged environment; the best round of each is compared. A ratio far from 1 means the tool times
something a user's script does not do (a process setting, a short or cold measurement, other
work in the process).
"""

import os
import sys

from bench.harness import log, run_for_result
from bench.report import cell_key

PLAIN_SCRIPT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmark_plain_step.py"
)

# The largest |worker / plain - 1| reported as consistent: same-run noise on a shared machine.
TOLERANCE = 0.15


def cell_text(cell):
    return f"{cell['workload']}:{cell['preset']}:{cell['batch_size']}:{cell['sequence_length']}"


def run_plain_checks(cells, args):
    """Times each float32 cell of `cells` with the plain script; one record per cell."""
    checks = []
    for cell in cells:
        if cell["precision"] != "float32":
            continue
        command = [sys.executable, PLAIN_SCRIPT, "--cell", cell_text(cell)]
        command += ["--num-masks", str(cell["num_masks"])]
        log(f"  plain-script check: {cell_text(cell)} ...")
        try:  # The caller's environment, unchanged.
            result = run_for_result(command, name="benchmark_plain_step.py")
        except RuntimeError as error:
            checks.append(dict(cell, error=str(error)))
            continue
        log(f"    {cell['batch_size'] / result['step_seconds']:8.2f} seq/s (plain script)")
        checks.append(dict(cell, **result))
    return checks


def format_plain_checks(checks, records):
    """A table: each checked cell's HF figure in the worker and as a plain script (best rounds)."""
    best = {}
    for check in checks:
        if "error" in check:
            continue
        key = cell_key(check)
        if key not in best or check["step_seconds"] < best[key]["step_seconds"]:
            best[key] = check
    hf = {
        cell_key(r): r
        for r in records
        if r["framework"] == "hf" and not r.get("torch_compile") and "error" not in r
    }
    lines = [
        "\nplain-script check (HF eager: the tool's worker vs the same code as a plain script)"
    ]
    lines.append(f"  {'cell':<34} {'worker ms':>10} {'plain ms':>9} {'worker/plain':>13}  verdict")
    failed = [c for c in checks if "error" in c]
    for key, check in sorted(best.items()):
        worker = hf.get(key)
        if worker is None:
            continue
        ratio = worker["step_seconds"] / check["step_seconds"]
        verdict = "consistent" if abs(ratio - 1) <= TOLERANCE else "DIFFERS"
        lines.append(
            f"  {cell_text(check):<34} {1000 * worker['step_seconds']:>10.1f} "
            f"{1000 * check['step_seconds']:>9.1f} {ratio:>12.2f}x  {verdict}"
        )
    for check in failed:
        lines.append(f"  {cell_text(check):<34} failed: {check['error']}")
    return "\n".join(lines)
