"""Throughput of kbert's pretraining input pipeline and tokenizer: next to keras-hub and HF, and
at corpus scale.

`compare` measures, on real text (WikiText-2 raw by default):

- pipelines, in sequences per second: `kbert.data.pretraining_dataset` (NSP pairs + dynamic
  masking, with and without whole-word masking) and keras-hub's `BertMaskedLMPreprocessor`
  mapped over batches of lines (tokenize + mask + pack every epoch, one segment);
- tokenizers, in tokens per second: `kbert.text.BertTokenizer` and keras-hub's
  `BertTokenizer` in a batched `tf.data` map, Hugging Face's `BertTokenizerFast` on batches of
  Python strings, and tensorflow-text's `FastBertTokenizer` alone (the engine kbert wraps; it
  is not reference-exact on its own).

Every rate is given twice: per wall-clock second on this machine (all its cores), and per
CPU-second (process CPU time, all threads), which is the rate of one core. A many-core host
is estimated as the per-core rate times its core count. Everything is built from a local
vocabulary file; nothing is downloaded.

`stream` measures `kbert.data.pretraining_dataset` alone on a corpus (text files or the shards
of tools/prepare_pretraining_data.py), in one process, with the issue's settings by default
(sequence length 128, batch 256, 20 predictions, NSP, repeat):

- first batch: seconds from the call that builds the dataset to the first batch in hand (and
  the CPU-seconds the process spent on it, all threads);
- steady rate: sequences per second over the batches after the first, for `--seconds`;
- CPU: sequences per CPU-second of the whole process (all threads). On a shared machine this
  varies much less with the load than the wall-clock rate, so it helps compare two versions
  measured under the same load; it is not a throughput;
- peak RSS: the process's peak resident memory (`ru_maxrss`), imports included;
- the load average of the machine before and after (a rate taken under load is not a clean
  figure).

It prints a table of these figures, the goal lines of issue 17 (first batch <= 10 s, steady
>= 20,000 sequences/s, peak RSS <= 1.5 GB) with PASS or FAIL, and one JSON line with everything
(`--json` prints only the JSON line). The exit status is 0 whatever the verdicts.

Examples:

```
python tools/benchmarks/benchmark_pipeline.py compare --data-dir DATA --out-dir runs/pipeline
python tools/benchmarks/benchmark_pipeline.py stream --vocab vocab.txt 'shards/*.tfrecord'
```
"""

import argparse
import datetime
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
from bench.charts import pyplot, save  # noqa: E402
from bench.data import default_data_dir, minilm_directory  # noqa: E402
from bench.harness import load_average, write_json  # noqa: E402

WIKITEXT_FILES = ("wikitext-2-raw/wiki.valid.raw", "wikitext-2-raw/wiki.test.raw")

# `stream`'s goals: (key, label, bound, smaller is better).
GOALS = (
    ("first_batch_s", "first batch <= 10 s", 10.0, True),
    ("steady_sequences_per_s", "steady >= 20,000 seq/s", 20000.0, False),
    ("peak_rss_gb", "peak RSS <= 1.5 GB", 1.5, True),
)


def _default_vocabulary():
    directory = minilm_directory()
    return None if directory is None else os.path.join(directory, "vocab.txt")


def _progress(label, total):
    import keras

    print(label, flush=True)
    return keras.utils.Progbar(total, unit_name="step")


def _time_batches(iterator, min_seconds, count_fn, label=None, warmup=3):
    """Consumes `iterator` for at least `min_seconds` after `warmup` batches; returns (items,
    wall s, cpu s). A progress bar under `label`, if one is given."""
    for _ in range(warmup):
        next(iterator)
    progbar = _progress(label, None) if label else None
    items, steps = 0, 0
    wall, cpu = time.perf_counter(), time.process_time()
    while time.perf_counter() - wall < min_seconds:
        items += count_fn(next(iterator))
        steps += 1
        if progbar and steps % 20 == 0:
            progbar.update(steps)
    if progbar:
        progbar.update(steps, finalize=True)
    return items, time.perf_counter() - wall, time.process_time() - cpu


def _time_pass(batches, count_fn, label, total):
    """Consumes one full pass; returns (items, wall s, cpu s)."""
    progbar = _progress(label, total)
    items, steps = 0, 0
    wall, cpu = time.perf_counter(), time.process_time()
    for batch in batches:
        items += count_fn(batch)
        steps += 1
        if steps % 10 == 0:
            progbar.update(steps)
    progbar.update(steps, finalize=True)
    return items, time.perf_counter() - wall, time.process_time() - cpu


def _result(name, kind, unit, items, wall, cpu, **extra):
    row = {
        "name": name,
        "kind": kind,
        "unit": unit,
        "items": int(items),
        "wall_s": wall,
        "cpu_s": cpu,
        "per_wall_s": items / wall,
        "per_cpu_s": items / cpu,
    }
    row.update(extra)
    print(f"  -> {row['per_wall_s']:,.0f} {unit}/s wall, {row['per_cpu_s']:,.0f} {unit}/CPU-s")
    return row


def _corpus_lines(files):
    """Text lines of the files without blank lines and WikiText headings."""
    lines = []
    for path in files:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", errors="replace")
        for line in text.split("\n"):
            stripped = line.strip()
            if stripped and not (stripped.startswith("=") and stripped.endswith("=")):
                lines.append(stripped)
    return lines


def _real_tokens(batch):
    return int(tf.reduce_sum(tf.cast(batch[0]["padding_mask"], tf.int32)))


def bench_pipelines(args, files, vocabulary):
    import keras_hub

    import kbert

    results = []
    tokenizer = kbert.text.BertTokenizer(vocabulary)
    tokenizer.tokenize(tf.constant(["warm up the tokenizer's graph"]))

    # End to end: read + tokenize + one pass, as the first epoch of a run sees it.
    name = "kbert pretraining_dataset, 1st epoch incl. read + tokenize"
    print(f"\n[{name}]", flush=True)
    wall, cpu = time.perf_counter(), time.process_time()
    dataset = kbert.data.pretraining_dataset(
        files,
        tokenizer,
        sequence_length=args.sequence_length,
        max_predictions=args.max_predictions,
        batch_size=args.batch_size,
        seed=0,
    )
    items = sum(int(x["token_ids"].shape[0]) for x, _, _ in dataset)
    results.append(
        _result(
            name,
            "pipeline",
            "sequences",
            items,
            time.perf_counter() - wall,
            time.process_time() - cpu,
            note="read + tokenize + NSP pairs + masking, one pass",
        )
    )
    for whole_word_masking in (False, True):
        name = "kbert pretraining_dataset" + (" (whole-word)" if whole_word_masking else "")
        print(f"\n[{name}] building (read + tokenize once)", flush=True)
        start = time.perf_counter()
        dataset = kbert.data.pretraining_dataset(
            files,
            tokenizer,
            sequence_length=args.sequence_length,
            max_predictions=args.max_predictions,
            batch_size=args.batch_size,
            whole_word_masking=whole_word_masking,
            repeat=True,
            seed=0,
            verbose=True,
        )
        build_s = time.perf_counter() - start
        iterator = iter(dataset)
        tokens = []

        def count(batch, tokens=tokens):
            tokens.append(_real_tokens(batch))
            return int(batch[0]["token_ids"].shape[0])

        items, wall, cpu = _time_batches(iterator, args.seconds, count, f"[{name}] timing")
        results.append(
            _result(
                name,
                "pipeline",
                "sequences",
                items,
                wall,
                cpu,
                build_s=build_s,
                real_tokens_per_sequence=sum(tokens) / items,
                note="NSP pairs + dynamic masking; tokenization done once at build",
            )
        )

    print("\n[keras-hub BertMaskedLMPreprocessor] building", flush=True)
    hub_tokenizer = keras_hub.models.BertTokenizer(vocabulary=vocabulary, lowercase=True)
    preprocessor = keras_hub.models.BertMaskedLMPreprocessor(
        hub_tokenizer,
        sequence_length=args.sequence_length,
        mask_selection_rate=0.15,
        mask_selection_length=args.max_predictions,
    )
    lines = _corpus_lines(files)
    dataset = (
        tf.data.Dataset.from_tensor_slices(tf.constant(lines))
        .repeat()
        .batch(args.batch_size)
        .map(preprocessor, num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(tf.data.AUTOTUNE)
    )
    tokens = []

    def count_hub(batch):
        tokens.append(_real_tokens(batch))
        return int(batch[0]["token_ids"].shape[0])

    items, wall, cpu = _time_batches(
        iter(dataset), args.seconds, count_hub, "[keras-hub BertMaskedLMPreprocessor] timing"
    )
    results.append(
        _result(
            "keras-hub BertMaskedLMPreprocessor",
            "pipeline",
            "sequences",
            items,
            wall,
            cpu,
            real_tokens_per_sequence=sum(tokens) / items,
            note="one line per sequence, tokenize + mask + pack every epoch, no NSP",
        )
    )
    return results


def bench_tokenizers(args, files, vocabulary):
    import keras_hub
    import tensorflow_text as tf_text
    from transformers import BertTokenizerFast

    import kbert

    lines = _corpus_lines(files)
    batches = [
        lines[i : i + args.tokenizer_batch] for i in range(0, len(lines), args.tokenizer_batch)
    ]
    num_batches = len(batches)
    results, counts = [], {}

    def tf_pass(name, tokenize_fn, note):
        dataset = (
            tf.data.Dataset.from_tensor_slices(tf.constant(lines))
            .batch(args.tokenizer_batch)
            .map(tokenize_fn, num_parallel_calls=tf.data.AUTOTUNE)
            .prefetch(tf.data.AUTOTUNE)
        )
        for _ in dataset.take(2):  # warm-up: tracing
            pass
        items, wall, cpu = _time_pass(
            dataset, lambda ids: int(tf.size(ids.flat_values)), f"[{name}]", num_batches
        )
        counts[name] = items
        results.append(_result(name, "tokenizer", "tokens", items, wall, cpu, note=note))

    vocabulary_list = [line.rstrip("\n") for line in open(vocabulary, encoding="utf-8")]
    kbert_tokenizer = kbert.text.BertTokenizer(vocabulary)
    tf_pass("kbert BertTokenizer", kbert_tokenizer.tokenize, "reference-exact, tf.data map")
    hub_tokenizer = keras_hub.models.BertTokenizer(vocabulary=vocabulary, lowercase=True)
    tf_pass("keras-hub BertTokenizer", hub_tokenizer.tokenize, "tf.data map")
    engine = tf_text.FastBertTokenizer(
        vocabulary_list, token_out_type=tf.int32, lower_case_nfd_strip_accents=True
    )
    tf_pass("tf-text FastBertTokenizer", engine.tokenize, "engine alone, not reference-exact")

    try:
        hf_tokenizer = BertTokenizerFast(vocab=vocabulary, do_lower_case=True)
    except TypeError:  # transformers < 5
        hf_tokenizer = BertTokenizerFast(vocab_file=vocabulary, do_lower_case=True)
    hf_tokenizer(batches[0], add_special_tokens=False)  # warm-up
    items, wall, cpu = _time_pass(
        batches,
        lambda b: sum(map(len, hf_tokenizer(b, add_special_tokens=False)["input_ids"])),
        "[HF BertTokenizerFast]",
        num_batches,
    )
    counts["HF BertTokenizerFast"] = items
    results.append(
        _result(
            "HF BertTokenizerFast", "tokenizer", "tokens", items, wall, cpu, note="Rust, batch call"
        )
    )
    return results, counts


def _table(results, reference_name):
    reference = {r["kind"]: r for r in results if r["name"] == reference_name.get(r["kind"])}
    header = (
        "| what | measured | per wall-s (all cores) | per CPU-s (one core) "
        "| vs reference (per CPU-s) |\n"
        "| --- | --- | ---: | ---: | ---: |"
    )
    rows = [header]
    for r in results:
        ref = reference.get(r["kind"])
        ratio = f"{r['per_cpu_s'] / ref['per_cpu_s']:.2f}x" if ref else "-"
        rows.append(
            f"| {r['name']} | {r['unit']}/s | {r['per_wall_s']:,.0f} "
            f"| {r['per_cpu_s']:,.0f} | {ratio} |"
        )
    return "\n".join(rows)


def _chart(results, path):
    kinds = [
        ("pipeline", "sequences / CPU-second", "Pretraining input pipelines (per core)"),
        ("tokenizer", "tokens / CPU-second", "WordPiece tokenizers (per core)"),
    ]
    kinds = [k for k in kinds if any(r["kind"] == k[0] for r in results)]  # --skip-tokenizers
    fig, axes = pyplot().subplots(1, len(kinds), figsize=(6.5 * len(kinds), 4.2), squeeze=False)
    for ax, (kind, label, title) in zip(axes[0], kinds):
        rows = [r for r in results if r["kind"] == kind]
        names = [r["name"].replace(" ", "\n", 1) for r in rows]
        values = [r["per_cpu_s"] for r in rows]
        colors = ["tab:blue" if r["name"].startswith("kbert") else "tab:gray" for r in rows]
        bars = ax.barh(names, values, color=colors)
        ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values], padding=3, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(label)
        ax.set_xlim(0, max(values) * 1.25)
        ax.tick_params(axis="y", labelsize=8)
        ax.set_title(title)
    save(fig, path)


def _positive(value):
    number = float(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be positive. Received: {value}")
    return number


def _add_compare_arguments(parser):
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=default_data_dir(),
        help="folder holding wikitext-2-raw/ (default: $KBERT_DATA_DIR, else ../shared/data)",
    )
    parser.add_argument(
        "--files",
        nargs="+",
        default=None,
        help="text files to use instead of WikiText-2 valid + test",
    )
    parser.add_argument(
        "--vocabulary",
        default=_default_vocabulary(),
        help="vocab.txt (default: the all-MiniLM-L6-v2 test package's vocabulary)",
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=Path("runs/benchmark_pipeline"),
        help="where the PNG chart, JSON and markdown table go",
    )
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--max-predictions", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--tokenizer-batch", type=int, default=256, help="lines per tokenizer call")
    parser.add_argument(
        "--seconds", type=_positive, default=8.0, help="timed seconds per pipeline measurement"
    )
    parser.add_argument(
        "--target",
        type=float,
        default=5000.0,
        help="sequences/s a host must feed (for the many-core estimate)",
    )
    parser.add_argument("--cores", type=int, default=16, help="cores of the host to estimate")
    parser.add_argument("--skip-tokenizers", action="store_true")


def _add_stream_arguments(parser):
    parser.add_argument("files", nargs="+", help="Text files, shards or glob patterns.")
    parser.add_argument(
        "--vocab", required=True, help="vocab.txt, or a preset directory/name with a vocabulary."
    )
    parser.add_argument(
        "--seconds",
        type=_positive,
        default=60.0,
        help="Length of the steady measurement (default 60).",
    )
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--max-predictions", type=int, default=20)
    parser.add_argument("--whole-word-masking", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="Print only the JSON line.")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    _add_compare_arguments(
        commands.add_parser("compare", help="kbert's pipeline and tokenizer vs keras-hub and HF")
    )
    _add_stream_arguments(
        commands.add_parser(
            "stream", help="pretraining_dataset at corpus scale: first batch, rate, memory"
        )
    )
    return parser.parse_args(argv)


def compare(args):
    """Pipelines and tokenizers side by side; writes the chart, JSON and table to --out-dir."""
    if args.vocabulary is None or not os.path.isfile(args.vocabulary):
        raise SystemExit(f"--vocabulary must name a vocab.txt. Received: {args.vocabulary}")
    files = args.files or [str(args.data_dir / f) for f in WIKITEXT_FILES]
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        raise SystemExit(f"Missing input files {missing}; pass --data-dir or --files.")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    print(f"files: {files}\nvocabulary: {args.vocabulary}\ncpu count: {os.cpu_count()}")

    results = bench_pipelines(args, files, args.vocabulary)
    counts = {}
    if not args.skip_tokenizers:
        tokenizer_results, counts = bench_tokenizers(args, files, args.vocabulary)
        results += tokenizer_results

    reference = {
        "pipeline": "keras-hub BertMaskedLMPreprocessor",
        "tokenizer": "keras-hub BertTokenizer",
    }
    table = _table(results, reference)
    by_name = {r["name"]: r for r in results}
    kbert_rate = by_name["kbert pretraining_dataset"]["per_cpu_s"]
    first_epoch = by_name["kbert pretraining_dataset, 1st epoch incl. read + tokenize"]["per_cpu_s"]
    hub_rate = next(r for r in results if r["name"] == reference["pipeline"])["per_cpu_s"]
    estimate = kbert_rate * args.cores
    lines = [
        table,
        "",
        f"Reference for the ratios: {reference['pipeline']} (pipelines), "
        f"{reference['tokenizer']} (tokenizers).",
        f"Goal 1 - at least keras-hub's rate: kbert {kbert_rate:,.0f} vs keras-hub "
        f"{hub_rate:,.0f} sequences per CPU-second ({kbert_rate / hub_rate:.2f}x): "
        f"{'met' if kbert_rate >= hub_rate else 'NOT met'} (steady state, every epoch after the "
        f"first); first epoch including read + tokenize: {first_epoch:,.0f} "
        f"({first_epoch / hub_rate:.2f}x).",
        f"Goal 2 - {args.cores} cores x {kbert_rate:,.0f} sequences per CPU-second = "
        f"{estimate:,.0f} sequences/s vs {args.target:,.0f} needed: "
        f"{'met' if estimate >= args.target else 'NOT met'} (linear-scaling estimate).",
    ]
    for r in results:
        if "real_tokens_per_sequence" in r:
            lines.append(
                f"{r['name']}: {r['real_tokens_per_sequence']:.1f} real tokens per sequence"
                + (f", build (read + tokenize) {r['build_s']:.1f} s" if "build_s" in r else "")
            )
    if counts:
        lines.append(f"Token counts over the corpus: {counts}")
    report = "\n".join(lines)
    print("\n" + report)

    stamp = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "command": " ".join([Path(sys.executable).name] + sys.argv),
    }
    write_json(
        args.out_dir / "pipeline_benchmark.json",
        {"run": stamp, "results": results, "token_counts": counts},
        indent=2,
    )
    (args.out_dir / "pipeline_benchmark.md").write_text(report + "\n")
    _chart(results, args.out_dir / "pipeline_benchmark.png")
    print(f"\nwrote {args.out_dir / 'pipeline_benchmark.png'}, .json and .md")
    return results


def goal_lines(result):
    """Returns `stream`'s `goal ...: PASS/FAIL` lines for a result dict."""
    lines = []
    for key, label, bound, smaller in GOALS:
        value = result[key]
        passed = value <= bound if smaller else value >= bound
        lines.append(f"goal {label}: {'PASS' if passed else 'FAIL'} ({value:,})")
    return lines


def _one_minute_load():
    load = load_average()
    return None if load is None else round(load[0], 2)


def stream(args):
    """`pretraining_dataset` at corpus scale: first batch, steady rate, CPU, peak memory."""
    from kbert.data import pretraining_dataset
    from kbert.text import BertTokenizer

    paths = []
    for pattern in args.files:
        matches = sorted(tf.io.gfile.glob(pattern))
        if not matches:
            raise SystemExit(f"no file matches {pattern!r}")
        paths.extend(matches)
    size = sum(tf.io.gfile.stat(p).length for p in paths)
    tokenizer = BertTokenizer.from_preset(args.vocab)
    load_before = _one_minute_load()
    start, start_cpu = time.perf_counter(), time.process_time()
    dataset = pretraining_dataset(
        paths,
        tokenizer,
        sequence_length=args.sequence_length,
        max_predictions=args.max_predictions,
        batch_size=args.batch_size,
        seed=args.seed,
        whole_word_masking=args.whole_word_masking,
        repeat=True,
    )
    iterator = iter(dataset)
    next(iterator)
    first = time.perf_counter() - start
    first_cpu = time.process_time() - start_cpu
    sequences, wall, cpu = _time_batches(
        iterator, args.seconds, lambda batch: int(batch[0]["token_ids"].shape[0]), warmup=0
    )
    result = {
        "corpus_mb": round(size / 1e6, 1),
        "files": len(paths),
        "kind": "shards" if paths[0].endswith(".tfrecord") else "text",
        "first_batch_s": round(first, 2),
        "first_batch_cpu_s": round(first_cpu, 2),
        "steady_sequences_per_s": round(sequences / wall),
        "sequences_per_cpu_s": round(sequences / cpu) if cpu > 0 else None,
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3),
        "load_average_before": load_before,
        "load_average_after": _one_minute_load(),
        "cpu_count": os.cpu_count(),
    }
    if not args.json:
        print(f"corpus: {result['corpus_mb']} MB in {len(paths)} {result['kind']} file(s)")
        print(
            f"first batch:   {result['first_batch_s']} s "
            f"({result['first_batch_cpu_s']} CPU-seconds)"
        )
        print(
            f"steady rate:   {result['steady_sequences_per_s']:,} sequences/s (over {wall:.1f} s)"
        )
        print(f"CPU:           {result['sequences_per_cpu_s']:,} sequences per CPU-second")
        print(f"peak RSS:      {result['peak_rss_gb']} GB")
        print(
            f"load average:  {load_before} before, {result['load_average_after']} after, "
            f"{result['cpu_count']} CPUs"
        )
        for line in goal_lines(result):
            print(line)
    print(json.dumps(result))
    return result


def main(argv=None):
    args = parse_args(argv)
    return compare(args) if args.command == "compare" else stream(args)


if __name__ == "__main__":
    main()
