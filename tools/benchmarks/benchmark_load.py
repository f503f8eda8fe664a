"""Loading a pretrained BERT: kbert's `from_preset` per backend against Hugging Face's
`from_pretrained`.

    python tools/benchmarks/benchmark_load.py --shape bert_base_en_uncased --repeats 3 \
        --json load.json --chart load.png

One Hugging Face BERT directory of the shape (`--shape`: a kbert preset name or
`L<layers>-H<hidden>-A<heads>[-V<vocabulary>]`; random `transformers` weights, saved as
safetensors with a WordPiece vocabulary of the right size) is loaded, on the CPU, each way in
a process of its own:

* `kbert-<backend>`: `kbert.models.BertBackbone.from_preset(directory)`; the backbone is
  built without drawing the weights it loads;
* `kbert-<backend>-draw-then-load`: `BertBackbone(**config)` (every weight drawn from its
  initializer), then `kbert.checkpoints.load_huggingface_weights(backbone, directory)`: what
  a load costs when it draws the weights first;
* `hf`: `transformers.BertModel.from_pretrained(directory)` (torch).

Each worker imports its libraries (untimed; the draw-then-load way also builds one backbone
without weights to read its config), times a first load (one-time compilations included),
then `--repeats` more, of which the fastest is kept. Prints seconds per load and each way's
ratio to HF; `--json` writes the results, `--chart` a bar chart.
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

from bench.charts import pyplot, save
from bench.flops import resolve_preset
from bench.harness import (
    check_positive_ints,
    command_line,
    emit,
    load_average,
    log,
    spawn,
    system_environment,
    time_calls,
    write_results,
)
from bench.hf_timing import hf_config

BACKENDS = ("jax", "tensorflow", "torch")
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def write_checkpoint(shape, directory):
    """A Hugging Face BERT directory of `shape` (a `resolve_preset` dict), random weights."""
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.BertModel(hf_config(shape))
    model.save_pretrained(directory, safe_serialization=True)
    count = shape["vocabulary_size"] - len(SPECIAL_TOKENS)
    words = list(SPECIAL_TOKENS) + [f"w{i}" for i in range(count)]
    (Path(directory) / "vocab.txt").write_text("\n".join(words) + "\n")


def _load_once(spec):
    """The load `spec["system"]` times, its libraries imported."""
    if spec["system"] == "hf":
        from transformers import BertModel

        return lambda: BertModel.from_pretrained(spec["directory"])
    from kbert.checkpoints import load_huggingface_weights
    from kbert.models import BertBackbone

    if not spec["system"].endswith("draw-then-load"):
        return lambda: BertBackbone.from_preset(spec["directory"])
    config = BertBackbone.from_preset(spec["directory"], load_weights=False).get_config()

    def draw_then_load():
        backbone = BertBackbone.from_config(config)
        load_huggingface_weights(backbone, spec["directory"])
        return backbone

    return draw_then_load


def worker(spec):
    load = _load_once(spec)
    (first,) = time_calls(load, 1)
    times = time_calls(load, spec["repeats"])
    emit({"system": spec["system"], "first_seconds": first, "seconds": min(times)})


def _systems(backends):
    systems = []
    for backend in backends:
        systems += [f"kbert-{backend}", f"kbert-{backend}-draw-then-load"]
    return systems + ["hf"]


def run(args):
    backends = [b for b in args.backends.split(",") if b]
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown:
        raise SystemExit(f"--backends takes {','.join(BACKENDS)}. Received: {unknown}")
    shape = resolve_preset(args.shape)
    results = []
    with tempfile.TemporaryDirectory() as directory:
        log(f"writing a Hugging Face checkpoint of {args.shape} ...")
        write_checkpoint(shape, directory)
        for system in _systems(backends):
            log(f"loading with {system} ...")
            spec = {"system": system, "device": "cpu", "directory": directory}
            spec["repeats"] = args.repeats
            env = system_environment(spec)  # kbert-<backend>'s backend; torch for HF
            try:
                results.append(spawn(__file__, spec, env, name=f"{system} worker"))
            except RuntimeError as error:
                results.append({"system": system, "error": str(error)})
    return shape, results


def print_table(shape_name, results):
    base = next((r["seconds"] for r in results if r["system"] == "hf" and "error" not in r), None)
    print(f"\nloading a Hugging Face BERT directory of {shape_name} (CPU, best of the repeats)")
    print(f"  {'system':<32} {'first s':>8} {'best s':>8} {'vs HF':>7}")
    for row in results:
        if "error" in row:
            print(f"  {row['system']:<32} failed: {row['error'][:60]}")
            continue
        ratio = f"{row['seconds'] / base:.2f}x" if base else "-"
        line = f"  {row['system']:<32} {row['first_seconds']:>8.2f} {row['seconds']:>8.2f}"
        print(f"{line} {ratio:>7}")
    print("  (vs HF: seconds of a load over HF's; below 1.00x loads faster)")


def chart(shape_name, results, path):
    rows = [r for r in results if "error" not in r]
    figure, axis = pyplot().subplots(figsize=(7, 0.45 * len(rows) + 1.2))
    names = [r["system"] for r in rows]
    seconds = [r["seconds"] for r in rows]
    colors = [
        "tab:gray" if n == "hf" else "tab:orange" if n.endswith("draw-then-load") else "tab:blue"
        for n in names
    ]
    bars = axis.barh(names, seconds, color=colors)
    for bar, value in zip(bars, seconds):
        y = bar.get_y() + bar.get_height() / 2
        axis.text(bar.get_width(), y, f" {value:.2f} s", va="center", fontsize=8)
    axis.invert_yaxis()
    axis.set_xlabel("seconds per load (best of the repeats; lower is better)")
    axis.set_xlim(0, max(seconds + [0.1]) * 1.3)
    axis.set_title(f"Loading a Hugging Face BERT directory of {shape_name}, CPU", fontsize=9)
    save(figure, path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--shape", default="bert_base_en_uncased")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None)
    parser.add_argument("--chart", default=None)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(json.loads(args.worker))
    check_positive_ints(parser, args, ("repeats",))
    load = load_average()
    shape, results = run(args)
    print_table(args.shape, results)
    if args.chart:
        chart(args.shape, results, args.chart)
    if args.json:
        settings = {"shape": args.shape, **shape, "repeats": args.repeats}
        write_results(
            args.json, command_line(__file__, argv), settings, load, load_average(), results
        )
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
