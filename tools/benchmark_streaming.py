"""Time to first batch, steady throughput and peak memory of `kbert.data.pretraining_dataset`.

    python tools/benchmark_streaming.py --vocab vocab.txt --seconds 60 /tmp/corpus_1g.txt

Prints one JSON line: the corpus size, seconds to the first batch (from the call that builds
the dataset), the steady rate in sequences per second (batches after the first, for
`--seconds`), and the process's peak resident memory (`ru_maxrss`).
"""

import argparse
import json
import os
import resource
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--vocab", required=True)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--max-predictions", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import tensorflow as tf

    from kbert.data import pretraining_dataset
    from kbert.text import BertTokenizer

    paths = [p for pattern in args.files for p in tf.io.gfile.glob(pattern)]
    size = sum(os.path.getsize(p) for p in paths)
    tokenizer = BertTokenizer.from_preset(args.vocab)
    start = time.perf_counter()
    dataset = pretraining_dataset(
        paths, tokenizer, sequence_length=args.sequence_length,
        max_predictions=args.max_predictions, batch_size=args.batch_size, seed=args.seed,
        repeat=True,
    )
    iterator = iter(dataset)
    next(iterator)
    first = time.perf_counter() - start
    sequences, steady_start = 0, time.perf_counter()
    while time.perf_counter() - steady_start < args.seconds:
        x, _, _ = next(iterator)
        sequences += int(x["token_ids"].shape[0])
    steady = sequences / (time.perf_counter() - steady_start)
    print(json.dumps({
        "corpus_mb": round(size / 1e6, 1),
        "files": len(paths),
        "first_batch_s": round(first, 2),
        "steady_sequences_per_s": round(steady),
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3),
    }))


if __name__ == "__main__":
    main()
