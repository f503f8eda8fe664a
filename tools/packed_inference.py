"""Packed inference against length batching: texts per second of a backbone's forward pass.

Runs the same texts three ways on one backend, in one process, alternating repetitions:

- `fixed`: every batch padded to the full `--sequence-length` (kbert before length batching);
- `bucketed`: rows sorted by length, each batch cropped to its bucket
  (`kbert.data.batching.plan_batches` with `model_buckets`, what the tasks' `predict` does;
  on TensorFlow both backbones are compiled with XLA, as the tasks' `predict` is);
- `packed`: several texts per row (`kbert.data.batching.pack_rows`) through
  `BertBackbone(packed=True)` (per-document attention mask, positions restarting), packed rows
  also sorted and cropped to buckets, with batches of about as many tokens as `bucketed`.

Prints texts/s of each, the ratios to `bucketed`, and the largest difference of the packed
and bucketed sequence outputs at real positions (they must agree to float error).

Usage:
    KERAS_BACKEND=torch python tools/packed_inference.py --preset PATH \\
        --tsv /work/shared/data/glue/SST-2/dev.tsv [--sequence-length 128] [--batch-size 32]
"""

import argparse
import statistics
import time

import numpy as np


def _read_sentences(path, limit):
    lines = open(path, encoding="utf-8").read().splitlines()[1:]
    return [line.split("\t")[0] for line in lines if line.strip()][:limit]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", required=True)
    parser.add_argument("--tsv", required=True, help="a TSV with a header; texts in column 0")
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--limit", type=int, default=872)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import keras

    from kbert.data import batching
    from kbert.models import BertBackbone, BertClassifier

    texts = _read_sentences(args.tsv, args.limit)
    preprocessor = BertClassifier.from_preset(
        args.preset, num_classes=2, sequence_length=args.sequence_length
    ).preprocessor
    x = {k: np.asarray(v).astype("int32") for k, v in preprocessor(texts).items()}
    backbone = BertBackbone.from_preset(args.preset)
    packed_backbone = BertBackbone.from_preset(args.preset, packed=True)
    if keras.backend.backend() == "tensorflow":
        # As the tasks' `predict` on TensorFlow: compiled with XLA (see BertTask).
        backbone.compile(jit_compile=True)
        packed_backbone.compile(jit_compile=True)
    lengths = batching.row_lengths(x["padding_mask"])
    # The buckets the tasks' `predict` uses on this backend (each batch's longest row on eager
    # torch, steps of 4/8/16/32 tokens on JAX and TensorFlow).
    buckets = batching.model_buckets(backbone, args.sequence_length)

    def fixed():
        for start in range(0, len(texts), args.batch_size):
            rows = np.arange(start, min(start + args.batch_size, len(texts)))
            backbone.predict_on_batch(batching.crop_batch(x, rows, args.sequence_length))

    def bucketed(collect=None):
        for rows, length in batching.plan_batches(lengths, args.batch_size, buckets):
            out = backbone.predict_on_batch(batching.crop_batch(x, rows, length))
            if collect is not None:
                collect.add(rows, length, keras.ops.convert_to_numpy(out["sequence_output"]))

    packed_x, placements = batching.pack_rows(x, args.sequence_length)
    packed_lengths = batching.row_lengths(packed_x["padding_mask"])
    tokens_per_batch = args.batch_size * lengths.mean()
    packed_batch = max(1, int(round(tokens_per_batch / packed_lengths.mean())))

    def packed(collect=None):
        plan = batching.plan_batches(packed_lengths, packed_batch, buckets)
        for rows, length in plan:
            out = packed_backbone.predict_on_batch(batching.crop_batch(packed_x, rows, length))
            if collect is not None:
                collect.add(rows, length, keras.ops.convert_to_numpy(out["sequence_output"]))

    # Warm-up (compiles every shape) and the agreement check.
    fixed()
    reference = batching.OrderedOutputs(len(texts), args.sequence_length, True)
    bucketed(reference)
    packed_out = batching.OrderedOutputs(len(packed_lengths), args.sequence_length, True)
    packed(packed_out)
    reference, packed_out = reference.result(), packed_out.result()
    difference = 0.0
    for row, (target, start, length) in enumerate(placements):
        got = packed_out[target, start : start + length]
        difference = max(difference, float(np.abs(got - reference[row, :length]).max()))

    runs = {"fixed": fixed, "bucketed": bucketed, "packed": packed}
    seconds = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - start)
    print(
        f"backend {keras.backend.backend()}, {len(texts)} texts, mean length {lengths.mean():.1f} "
        f"tokens, sequence length {args.sequence_length}, batch {args.batch_size} "
        f"(packed: {len(packed_lengths)} rows, batch {packed_batch}); median of {args.repeats}"
    )
    anchor = len(texts) / statistics.median(seconds["bucketed"])
    for name in runs:
        rate = len(texts) / statistics.median(seconds[name])
        print(f"{name:>9s}: {rate:8.1f} texts/s  {rate / anchor:5.2f}x bucketed")
    scale = max(
        float(np.abs(reference[row, :length]).max())
        for row, (_, _, length) in enumerate(placements)
    )
    print(
        f"max |packed - bucketed| at real positions: {difference:.2e} (outputs up to {scale:.2f})"
    )


if __name__ == "__main__":
    main()
