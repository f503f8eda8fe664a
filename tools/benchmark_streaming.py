"""Time to first batch, steady throughput and peak memory of `kbert.data.pretraining_dataset`.

    python tools/benchmark_streaming.py --vocab vocab.txt --seconds 60 /tmp/corpus_1g.txt
    python tools/benchmark_streaming.py --vocab vocab.txt --seconds 60 'shards/*.tfrecord'

Measures, in one process, with the issue's settings by default (sequence length 128, batch 256,
20 predictions, NSP, repeat):

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
"""

import argparse
import json
import os
import resource
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

GOALS = (
    # (key, label, bound, smaller is better)
    ("first_batch_s", "first batch <= 10 s", 10.0, True),
    ("steady_sequences_per_s", "steady >= 20,000 seq/s", 20000.0, False),
    ("peak_rss_gb", "peak RSS <= 1.5 GB", 1.5, True),
)


def goal_lines(result):
    """Returns the `goal ...: PASS/FAIL` lines for a result dict."""
    lines = []
    for key, label, bound, smaller in GOALS:
        value = result[key]
        passed = value <= bound if smaller else value >= bound
        lines.append(f"goal {label}: {'PASS' if passed else 'FAIL'} ({value:,})")
    return lines


def _load_average():
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", help="Text files, shards or glob patterns.")
    parser.add_argument(
        "--vocab", required=True, help="vocab.txt, or a preset directory/name with a vocabulary."
    )
    parser.add_argument(
        "--seconds", type=float, default=60.0, help="Length of the steady measurement (default 60)."
    )
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--max-predictions", type=int, default=20)
    parser.add_argument("--whole-word-masking", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="Print only the JSON line.")
    args = parser.parse_args(argv)
    if args.seconds <= 0:
        parser.error(f"--seconds must be positive. Received: {args.seconds}")

    import tensorflow as tf

    from kbert.data import pretraining_dataset
    from kbert.text import BertTokenizer

    paths = []
    for pattern in args.files:
        matches = sorted(tf.io.gfile.glob(pattern))
        if not matches:
            parser.error(f"no file matches {pattern!r}")
        paths.extend(matches)
    size = sum(tf.io.gfile.stat(p).length for p in paths)
    tokenizer = BertTokenizer.from_preset(args.vocab)
    load_before = _load_average()
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
    sequences = 0
    steady_start, cpu_start = time.perf_counter(), time.process_time()
    while time.perf_counter() - steady_start < args.seconds:
        x, _, _ = next(iterator)
        sequences += int(x["token_ids"].shape[0])
    wall = time.perf_counter() - steady_start
    cpu = time.process_time() - cpu_start
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
        "load_average_after": _load_average(),
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


if __name__ == "__main__":
    main()
