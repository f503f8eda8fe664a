"""Every GPU goal of issue #44 in one call on a lent GPU, within a time budget: JSON, PNG and the
BENCHMARKS.md rows.

Two commands. Here, on the development machine (network, the dev environment):

    python tools/benchmarks/gpu_goals.py prepare            # writes .gpu/ (git-ignored)

and on the GPU machine, from the repository root with `.gpu` carried along:

    python3 tools/benchmarks/gpu_goals.py run --out $OUT    # at most --budget seconds (480)

`prepare` puts into `.gpu/` what the GPU machine lacks (it has torch, JAX, transformers and
sentence-transformers, no network, no Keras): the wheels of Keras and the two packages Keras
needs beyond that image (`--wheel`, for CPython 3.12 on manylinux x86-64, the versions installed
here), all-MiniLM-L6-v2's configuration and tokenizer without its weights, the data files the
serving part reads, the pretraining batches of the packing part (made here with the tf.data
pipeline; the GPU machine has no TensorFlow) and the commit. It prints the size to carry.

`run` installs the wheels into a folder of its own (`--site`, on `PYTHONPATH` of every process
it starts; nothing is installed into the machine's Python), then runs the parts in order, each
in its own process group with the time the budget has left (a part that runs out is stopped,
and its workers that finished are kept; a part with less than `--min-part` seconds left is
skipped and reported as such):

1. `core`: benchmark.py's gpu-goals suite (BERT-Base, `mixed_bfloat16`, length 128: MLM + NSP
   pretraining at batch 256, classifier fine-tuning at 32, the backbone's forward at 128) on
   kbert's default paths on JAX and torch, HF eager and HF `torch.compile` (pretraining);
2. `serving`: benchmark_serving.py's long texts (the first 400 SQuAD dev paragraphs, length
   512, bf16, batch 128) on kbert-torch, kbert-jax, HF and sentence-transformers, with
   all-MiniLM-L6-v2's architecture and random weights made on the machine (seed 0);
3. `compiled`: the same suite's cells with kbert's compiled torch steps (`jit_compile=True`),
   and its fine-tuning and inference cells with them capturing CUDA graphs;
4. `variants`: JAX pretraining without attention dropout under flash attention, and with
   float8 matmuls;
5. `packing`: benchmark_packing.py's masked-LM training at length 512 on BERT-Base, JAX, bf16:
   packed rows against the same pieces one per row and BERT's standard sequences.

Then it judges every goal on the merged rows (one common matmul peak per precision for all MFU
figures) and writes to `--out`: `gpu_goals.json` (every part's results, status and time, the
goals, device, commit and command), `gpu_goals.md` (the BENCHMARKS.md section: tables and goal
lines), `gpu_goals.png` (each goal's measured value over its threshold), `throughput.png` and
`serving.png` (the parts' own charts) and `gpu_goals.log` (everything the parts printed).

A part skipped for time can be measured by a second call right after the first, on the same
machine (`--parts variants packing --budget 240`, say): each call's files describe its own
parts, and the goals of the parts it did not run read "not measured".

`--config tiny` runs the same parts on tiny shapes on whatever device there is (the CPU here),
to exercise the whole path in a few minutes; its figures mean nothing. `--parts` picks parts.
"""

import argparse
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.cells import GPU_GOALS
from bench.charts import pyplot, save
from bench.data import default_data_dir, minilm_directory
from bench.devices import device_name
from bench.harness import command_line, write_json
from bench.report import apply_common_peaks, best_of_rounds, judge_goals, label

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PARTS = ("core", "serving", "compiled", "variants", "packing")
# The parts that are runs of benchmark.py: their rows are merged and judged together.
BENCHMARK_PARTS = ("core", "compiled", "variants")
# Packages the GPU machine's image lacks: Keras and what Keras needs beyond that image.
WHEELS = ("keras", "namex", "optree")
# The files of the serving and packing parts, relative to the data folder.
DATA_FILES = ("squad/dev-v1.1.json", "wikitext-2-raw/wiki.valid.raw")
SERVING_GOALS = (("kbert-torch", 1.2), ("kbert-jax", 1.2))  # long texts, vs sentence-transformers
FULL_PRESET = "bert_base_en_uncased"
PACKING_BATCHES = "packing_512.npz"


def log(message, stream=None):
    print(message, flush=True)
    if stream:
        stream.write(message + "\n")
        stream.flush()


# --- prepare ----------------------------------------------------------------------------------


def _wheel_download(name, version, target):
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    command += ["--python-version", "3.12", "--implementation", "cp", "-d", str(target)]
    for platform in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"):
        command += ["--platform", platform]
    command.append(f"{name}=={version}")
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def prepare(args):
    """Writes the bundle folder that `run` reads on the GPU machine (see the module docstring)."""
    import importlib.metadata

    bundle = Path(args.bundle)
    temporary = bundle.with_name(bundle.name + ".tmp")
    shutil.rmtree(temporary, ignore_errors=True)
    (temporary / "wheels").mkdir(parents=True)
    for name in WHEELS:
        version = importlib.metadata.version(name)
        print(f"wheel: {name}=={version}")
        _wheel_download(name, version, temporary / "wheels")
    source = Path(args.checkpoint or minilm_directory() or "")
    if not (source / "config.json").is_file():
        raise SystemExit(f"--checkpoint must be a BERT directory. Received: {str(source)!r}")
    shutil.copytree(
        source, temporary / "checkpoint", ignore=shutil.ignore_patterns("*.safetensors", "*.bin")
    )
    data = Path(args.data_dir)
    for name in DATA_FILES:
        if not (data / name).is_file():
            raise SystemExit(f"--data-dir must hold {name}. Received: {str(data)!r}")
        (temporary / "data" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(data / name, temporary / "data" / name)
    print("packing batches: the tf.data pipeline, length 512 (a minute or two) ...", flush=True)
    subprocess.run(
        [sys.executable, str(HERE / "benchmark_packing.py"), "training"]
        + [str(data / "wikitext-2-raw" / "wiki.valid.raw"), "--vocab", str(source)]
        + ["--batch-size", "32", "--batches", "6"]
        + ["--save-batches", str(temporary / PACKING_BATCHES)],
        check=True,
        env=dict(os.environ, KERAS_BACKEND="jax"),
    )
    commit = _commit()
    (temporary / "commit").write_text(commit)
    shutil.rmtree(bundle, ignore_errors=True)
    temporary.rename(bundle)
    size = sum(f.stat().st_size for f in bundle.rglob("*") if f.is_file())
    print(f"\n{bundle}: {size / 2**20:.1f} MiB to carry (commit {commit})")
    print(
        f"on the GPU machine: carry {bundle.name!r} and run\n"
        "    python3 tools/benchmarks/gpu_goals.py run --out $OUT"
    )


# --- run --------------------------------------------------------------------------------------


def install_wheels(bundle, site):
    """Installs the bundle's wheels into `site` unless Keras imports already; returns the
    folder to put on `PYTHONPATH` (or None)."""
    wheels = sorted((Path(bundle) / "wheels").glob("*.whl"))
    probe = subprocess.run([sys.executable, "-c", "import keras"], capture_output=True)
    if probe.returncode == 0 or not wheels:
        return None
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
    command += ["--no-compile", "--no-cache-dir", "--upgrade", "--target", str(site)]
    subprocess.run(command + [str(w) for w in wheels], check=True)
    return str(site)


def random_weights_checkpoint(source, target, seed=0):
    """`source` (a BERT directory, weights or not) copied to `target` with random weights made
    by `transformers.BertModel(config)` under torch seed `seed`."""
    import torch
    import transformers

    shutil.copytree(
        source, target, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"), dirs_exist_ok=True
    )
    torch.manual_seed(seed)
    config = transformers.BertConfig.from_pretrained(source)
    transformers.BertModel(config).save_pretrained(target)
    return str(target)


def part_commands(args, work):
    """Each part's command, result file and (optional) chart, in the order they run."""
    python = sys.executable
    tiny = args.config == "tiny"
    benchmark = [python, str(HERE / "benchmark.py"), "--suite", "gpu-goals"]
    if tiny:
        benchmark += ["--config", "tiny", "--steps", "1", "--warmup", "1"]
    parts = {
        "core": benchmark
        + ["--process", "keras/jax", "keras/torch", "hf/torch", "hf-compile/torch"]
        + ["--chart", str(Path(args.out) / "throughput.png")],
        "compiled": benchmark + ["--process", "kbert-compile/torch", "kbert-cudagraphs/torch"],
        "variants": benchmark + ["--process", "kbert-flash/jax", "kbert-float8/jax"],
    }
    serving = [python, str(HERE / "benchmark_serving.py"), "--workload", "long"]
    serving += ["--system", "kbert-torch", "kbert-jax", "hf", "sentence-transformers"]
    serving += ["--checkpoint", str(work / "checkpoint"), "--data-dir", str(args.bundle_data)]
    serving += ["--chart", str(Path(args.out) / "serving.png")]
    if tiny:
        serving += ["--max-texts", "8", "--batch-size", "4", "--long-length", "64"]
    else:
        serving += ["--device", "gpu", "--dtype", "bfloat16", "--batch-size", "128"]
    parts["serving"] = serving
    packing = [python, str(HERE / "benchmark_packing.py"), "training"]
    packing += ["--batches-from", str(Path(args.bundle) / PACKING_BATCHES)]
    if tiny:
        packing += ["--preset", "bert_tiny_en_uncased", "--steps", "1", "--rounds", "1"]
    else:
        packing += ["--preset", FULL_PRESET, "--precision", "mixed_bfloat16"]
        packing += ["--steps", "4", "--rounds", "2"]
    parts["packing"] = packing
    commands = []
    for name in PARTS:
        result = work / f"{name}.json"
        command = parts[name] + ["--json", str(result)]
        env = {"KERAS_BACKEND": "jax"} if name == "packing" else {}
        # benchmark.py's parts start no cell in the part's last `--margin` seconds.
        budgeted = name in BENCHMARK_PARTS
        commands.append(
            {"name": name, "command": command, "result": result, "env": env, "budgeted": budgeted}
        )
    return commands


def run_part(part, seconds, stream, env):
    """Runs one part in its own process group for at most `seconds`; returns its status, time
    and result (the result file's content, also a partial one)."""
    started = time.monotonic()
    log(f"\n== {part['name']}: {' '.join(part['command'][1:])} (at most {seconds:.0f} s)", stream)
    process = subprocess.Popen(
        part["command"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(env, **part["env"]),
        start_new_session=True,  # its workers share its group: a stop ends them all
        cwd=REPO,
    )
    deadline = started + seconds
    status = None
    os.set_blocking(process.stdout.fileno(), False)
    while True:
        line = process.stdout.readline()
        if line:
            sys.stdout.write(line)
            stream.write(line)
            continue
        if process.poll() is not None:
            rest = process.stdout.read() or ""
            sys.stdout.write(rest)
            stream.write(rest)
            break
        if time.monotonic() > deadline:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            status = f"stopped after {seconds:.0f} s (time budget)"
            break
        time.sleep(0.05)
    if status is None:
        status = "done" if process.returncode == 0 else f"failed (exit {process.returncode})"
    elapsed = time.monotonic() - started
    result = None
    if part["result"].is_file():
        result = json.loads(part["result"].read_text())
    log(f"== {part['name']}: {status} in {elapsed:.0f} s", stream)
    return {"status": status, "seconds": round(elapsed, 1), "result": result}


def _model_rows(parts):
    """The benchmark.py rows of every part, merged, MFU against one common peak per precision."""
    records, peaks = [], {}
    for name in BENCHMARK_PARTS:
        result = (parts.get(name) or {}).get("result") or {}
        records += result.get("results", [])
        for key, peak in result.get("matmul_peaks", {}).items():
            peaks[key] = max(peaks.get(key, 0), peak or 0)
    return apply_common_peaks(best_of_rounds(records), peaks), peaks


def serving_goals(rows, tiny=False):
    """The long-text goals: each kbert system's texts/s over sentence-transformers'."""
    speeds = {
        r["system"]: r["texts_per_second"]
        for r in rows
        if r.get("workload") == "long" and "error" not in r
    }
    goals = []
    for system, threshold in SERVING_GOALS:
        value, status = None, "not measured"
        text = f"{system} vs sentence-transformers >= {threshold:.2f}x"
        if system in speeds and "sentence-transformers" in speeds:
            value = speeds[system] / speeds["sentence-transformers"]
            status = "met" if value >= threshold else "not met"
            text = f"{system} vs sentence-transformers = {value:.2f}x (goal >= {threshold:.2f}x)"
            if tiny:
                status = "not judged"
        shown = {"not met": "NOT met", "not judged": "not judged (tiny shapes)"}.get(status, status)
        goals.append(
            {
                "workload": "serving long texts",
                "row": system,
                "measure": "vs sentence-transformers",
                "threshold": threshold,
                "value": value,
                "status": status,
                "text": f"serving long texts: {text}: {shown}",
            }
        )
    return goals


def unjudged(goals):
    """`goals` with every verdict replaced by "not judged (tiny shapes)": ratios measured on
    tiny shapes judge nothing either."""
    result = []
    for goal in goals:
        if goal["status"] in ("met", "not met"):
            verdict = "NOT met" if goal["status"] == "not met" else "met"
            text = goal["text"][: -len(verdict)] + "not judged (tiny shapes)"
            goal = dict(goal, status="not judged", text=text)
        result.append(goal)
    return result


def markdown(summary):
    """The BENCHMARKS.md section of a run."""
    lines = [
        f"### GPU goals ({summary['device']}, {summary['date'][:16].replace('T', ' ')} UTC)",
        "",
        f"Commit {summary['commit']}, `gpu_goals.py run` with a budget of "
        f"{summary['budget_seconds']:.0f} s ({summary['seconds']:.0f} s used):",
        "",
        f"    {summary['command']}",
        "",
        "| part | status | seconds |",
        "|---|---|---:|",
    ]
    for name, part in summary["parts"].items():
        seconds = "-" if part.get("seconds") is None else f"{part['seconds']:.0f}"
        lines.append(f"| {name} | {part['status']} | {seconds} |")
    rows = summary["model_rows"]
    if rows:
        lines += [
            "",
            "| workload | batch x length | system | seq/s | step ms | MFU | vs HF eager |",
            "|---|---|---|---:|---:|---:|---:|",
        ]
        for workload in ("pretrain", "finetune", "inference"):
            mine = [r for r in rows if r["workload"] == workload]
            eager = next(
                (
                    r
                    for r in mine
                    if r["framework"] == "hf" and label(r) == "hf" and "error" not in r
                ),
                None,
            )
            for r in mine:
                system = label(r) + ("" if r["framework"] == "hf" else f" / {r['backend']}")
                shape = f"{r['batch_size']} x {r['sequence_length']}"
                if "error" in r:
                    lines.append(f"| {workload} | {shape} | {system} | failed | | | |")
                    continue
                mfu = f"{100 * r['mfu']:.0f} %" if r.get("mfu") else "-"
                ratio = (
                    f"{r['sequences_per_second'] / eager['sequences_per_second']:.2f}x"
                    if eager
                    else "-"
                )
                lines.append(
                    f"| {workload} | {shape} | {system} | {r['sequences_per_second']:,.0f} | "
                    f"{1000 * r['step_seconds']:.0f} | {mfu} | {ratio} |"
                )
    serving = summary["serving_rows"]
    if serving:
        lines += ["", "| long texts | texts/s |", "|---|---:|"]
        for r in serving:
            speed = "failed" if "error" in r else f"{r['texts_per_second']:,.0f}"
            lines.append(f"| {r['system']} | {speed} |")
    packing = summary.get("packing")
    if packing:
        lines += [
            "",
            f"Packing: {packing['preset']}, {packing['precision']}, masked-LM training, batch "
            f"{packing['batch_size']} x {packing['sequence_length']}, {packing['backend']} on "
            f"{packing['device']}; packed / pieces {packing['ratio_packed_to_pieces']:.2f}x, "
            f"packed / standard {packing['ratio_packed_to_standard']:.2f}x.",
            "",
            "| input | real tokens/s | ms per step | padding |",
        ]
        lines.append("|---|---:|---:|---:|")
        for name, rate in packing["real_tokens_per_s"].items():
            lines.append(
                f"| {name} | {rate:,} | {packing['ms_per_step'][name]} | "
                f"{100 * packing['padding_fraction'][name]:.2f} % |"
            )
    lines += ["", "Goals, this run:", ""]
    lines += [f"- {goal['text']}" for goal in summary["goals"]]
    return "\n".join(lines) + "\n"


def goals_chart(goals, path, title="GPU goals, this run"):
    """Each measured goal's value over its threshold (1.0: just met)."""
    measured = [g for g in goals if g["value"] is not None]
    if not measured:
        return
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(9, 0.45 * len(measured) + 1.5))
    names = [f"{g['workload']}: {g['row']} {g['measure']}" for g in measured]
    values = [g["value"] / g["threshold"] for g in measured]
    palette = {"met": "#2ca02c", "not met": "#d62728"}
    colours = [palette.get(g["status"], "#9e9e9e") for g in measured]
    axis.barh(names, values, color=colours)
    axis.axvline(1.0, color="black", linewidth=1)
    axis.invert_yaxis()
    axis.set_xlabel("measured / goal (1.0 = goal)")
    axis.tick_params(axis="y", labelsize=7)
    axis.set_title(title + " (green: met, red: not met, grey: not judged)", fontsize=9)
    save(figure, path)


def run(args):
    started, clock = datetime.datetime.now(datetime.timezone.utc), time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # Scratch outside `--out`: a run stopped from outside leaves only finished files there.
    work = Path(args.work or tempfile.mkdtemp(prefix="kbert-gpu-goals-"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    args.bundle_data = Path(args.bundle) / "data" if args.config == "full" else args.data_dir
    env = dict(os.environ)
    site = install_wheels(args.bundle, args.site)
    paths = [str(REPO)] + ([site] if site else []) + [env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    parts = {}
    with open(out / "gpu_goals.log", "w") as stream:
        log(f"gpu_goals.py run: budget {args.budget:.0f} s, parts {' '.join(args.parts)}", stream)
        for part in part_commands(args, work):
            name = part["name"]
            if name not in args.parts:
                continue
            left = args.budget - (time.monotonic() - clock)
            if left < args.min_part:
                parts[name] = {"status": f"skipped ({left:.0f} s of the budget left)"}
                log(f"\n== {name}: {parts[name]['status']}", stream)
                continue
            if name == "serving":
                source = Path(args.bundle) / "checkpoint"
                if args.config == "tiny" or not source.is_dir():
                    source = Path(args.checkpoint or minilm_directory() or source)
                try:
                    random_weights_checkpoint(source, work / "checkpoint")
                except Exception as error:  # the other parts still run
                    message = f"{type(error).__name__}: {error}"[:300]
                    parts[name] = {"status": f"failed (its checkpoint from {source}: {message})"}
                    log(f"\n== {name}: {parts[name]['status']}", stream)
                    continue
            if part["budgeted"]:
                soft = max(left - args.margin, 1.0)
                part = dict(part, command=part["command"] + ["--stop-after", f"{soft:.0f}"])
            parts[name] = run_part(part, left, stream, env)
    rows, peaks = _model_rows(parts)
    tiny = args.config == "tiny"
    goals = judge_goals(GPU_GOALS, rows, full_preset=FULL_PRESET)
    if tiny:
        goals = unjudged(goals)
    serving_rows = ((parts.get("serving") or {}).get("result") or {}).get("results", [])
    goals += serving_goals(serving_rows, tiny)
    packing = (parts.get("packing") or {}).get("result")
    bundle_commit = Path(args.bundle) / "commit"
    summary = {
        "command": command_line(__file__, args.argv),
        "date": started.isoformat(),
        "device": device_name(),
        "commit": bundle_commit.read_text().strip() if bundle_commit.is_file() else _commit(),
        "config": args.config,
        "budget_seconds": args.budget,
        "seconds": round(time.monotonic() - clock, 1),
        "parts": {
            name: {"status": part["status"], "seconds": part.get("seconds")}
            for name, part in parts.items()
        },
        "part_results": {k: v.get("result") for k, v in parts.items()},
        "matmul_peaks": peaks,
        "model_rows": rows,
        "serving_rows": serving_rows,
        "packing": packing,
        "goals": goals,
    }
    write_json(out / "gpu_goals.json", summary)
    section = markdown(summary)
    (out / "gpu_goals.md").write_text(section)
    title = "tiny shapes: the code path, no figure means anything" if tiny else "GPU goals"
    goals_chart(goals, out / "gpu_goals.png", title)
    shutil.rmtree(work, ignore_errors=True)
    print("\n" + section)
    print(f"written to {out}: {', '.join(sorted(p.name for p in out.iterdir()))}")
    return summary


def _commit():
    """The repository's short commit, "(with uncommitted changes)" added when tracked files
    differ from it; "unknown" outside a git checkout."""

    def git(*arguments):
        command = ["git", "-C", str(REPO), *arguments]
        return subprocess.run(command, capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return commit + (" (with uncommitted changes)" if dirty else "")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    bundle_help = "the folder prepare writes and run reads (.gpu/ is git-ignored)"
    ready = commands.add_parser("prepare", help="write .gpu/ for the GPU machine (run here)")
    ready.add_argument("--bundle", default=str(REPO / ".gpu"), help=bundle_help)
    ready.add_argument("--checkpoint", help="all-MiniLM-L6-v2's folder (default: installed)")
    ready.add_argument("--data-dir", default=str(default_data_dir()))
    go = commands.add_parser("run", help="measure every GPU goal (run on the GPU machine)")
    go.add_argument("--out", required=True, help="folder of the JSON, PNG, Markdown and log")
    go.add_argument("--bundle", default=str(REPO / ".gpu"), help=bundle_help)
    go.add_argument("--budget", type=float, default=480.0, help="seconds for all parts")
    go.add_argument("--min-part", type=float, default=45.0, help="skip a part with less left")
    go.add_argument(
        "--margin",
        type=float,
        default=60.0,
        help="benchmark.py's parts start no worker or cell in their last MARGIN seconds (a "
        "part still running at its limit is stopped and loses its unfinished worker)",
    )
    go.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    go.add_argument("--config", choices=("full", "tiny"), default="full")
    go.add_argument("--site", default="/tmp/kbert-gpu-site", help="where the wheels go")
    go.add_argument("--work", help="scratch folder (default: a new temporary one, removed)")
    go.add_argument("--checkpoint", help="tiny config: the serving checkpoint's configuration")
    go.add_argument("--data-dir", default=str(default_data_dir()), help="tiny config: data")
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    return args


def main(argv=None):
    args = parse_args(argv)
    return prepare(args) if args.command == "prepare" else run(args)


if __name__ == "__main__":
    main()
