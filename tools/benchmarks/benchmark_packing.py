"""Sequence packing against unpacked rows: masked-LM training (`training`) and inference
(`inference`).

    KERAS_BACKEND=jax python tools/benchmarks/benchmark_packing.py training   # WikiText-2, 512
    python tools/benchmarks/benchmark_packing.py training --preset bert_mini_en_uncased --steps 20
    KERAS_BACKEND=torch python tools/benchmarks/benchmark_packing.py inference --preset PATH \\
        --tsv DATA/glue/SST-2/dev.tsv [--sequence-length 128] [--batch-size 32]

`training`: real (non-padding) tokens per second of masked-LM training. Reads WikiText-2
(`$KBERT_DATA_DIR/wikitext-2-raw/wiki.valid.raw` unless files are given) and builds three
inputs of `--sequence-length` tokens from the same text, same tokenizer, same seed:

- `packed`: `kbert.data.packed_pretraining_dataset`, several whole documents per row, on a
  backbone built with `packed=True` (attention inside each document, positions restarting);
- `pieces`: the same pieces one per row (`pack=False`): what packing removes, nothing else;
- `standard`: `kbert.data.pretraining_dataset(nsp=False)`, BERT's sequences of whole sentences
  with 10 % shorter target lengths, the usual unpacked input of masked-LM training.

For each it prints the fraction of padding over one whole pass (packing emits full rows first,
so a pass's first batches would flatter it), then times `--rounds` x `--steps` training steps of
`BertPretrainer(next_sentence=False)` on the first `--batches` batches, pre-built
(`train_on_batch`, after warm-up steps; the inputs take turns every `--steps` steps so that
each sees the same machine load)
and prints the real tokens per second and the ratio packed / unpacked. The architecture is
`--preset`'s with fresh weights (`bert_tiny_en_uncased` by default) and the vocabulary the
`--vocab` file (default: all-MiniLM-L6-v2's uncased WordPiece vocabulary when that package is
installed). One JSON line at the end holds every figure. CPU by default; a machine shared with
other work gives noisy timings (the padding fractions are exact).

`inference`: texts per second of a backbone's forward pass, the same texts three ways on one
backend, in one process, taking turns each repetition:

- `fixed`: every batch padded to the full `--sequence-length` (kbert before length batching);
- `bucketed`: rows sorted by length, each batch cropped to its bucket
  (`kbert.data.batching.plan_batches` with `model_buckets`, what the tasks' `predict` does;
  on TensorFlow both backbones are compiled with XLA, as the tasks' `predict` is);
- `packed`: several texts per row (`kbert.data.batching.pack_rows`) through
  `BertBackbone(packed=True)` (per-document attention mask, positions restarting), packed rows
  also sorted and cropped to buckets, with batches of about as many tokens as `bucketed`.

It prints texts/s of each (median of `--repeats`), the ratios to `bucketed`, and the largest
difference of the packed and bucketed sequence outputs at real positions (they must agree to
float error).
"""

import argparse
import json
import os
import statistics

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from bench.data import default_data_dir, minilm_directory  # noqa: E402
from bench.devices import device_name  # noqa: E402
from bench.harness import command_line, interleave, write_json  # noqa: E402


def default_files():
    path = default_data_dir() / "wikitext-2-raw" / "wiki.valid.raw"
    if not path.is_file():
        raise SystemExit(
            f"WikiText-2 not found at {path}. Set KBERT_DATA_DIR to the folder holding "
            "wikitext-2-raw/, or pass text files."
        )
    return [str(path)]


def default_vocab():
    directory = minilm_directory()
    if directory is None:
        raise SystemExit("Pass --vocab (a BERT vocab.txt or a preset folder).")
    return directory


def _training_batches(args, files, tokenizer):
    """The first `--batches` batches of each input (as NumPy) and its padding over one pass."""
    import numpy as np

    from kbert.data import packed_pretraining_dataset, pretraining_dataset

    common = dict(
        sequence_length=args.sequence_length,
        max_predictions=args.max_predictions,
        batch_size=args.batch_size,
        seed=args.seed,
    )
    datasets = {
        "packed": packed_pretraining_dataset(files, tokenizer, **common),
        "pieces": packed_pretraining_dataset(files, tokenizer, pack=False, **common),
        "standard": pretraining_dataset(files, tokenizer, nsp=False, **common),
    }
    batches, padding = {}, {}
    for name, dataset in datasets.items():
        taken, real_tokens, slots = [], 0, 0
        for x, y, sample_weight in dataset:  # One pass: its padding; its first batches: timed.
            real_tokens += int(x["padding_mask"].numpy().sum())
            slots += int(np.prod(x["padding_mask"].shape))
            if len(taken) == args.batches:
                continue
            if name != "packed":  # One document per row: the unpacked model, no document ids.
                x = {k: v for k, v in x.items() if k != "document_ids"}
            taken.append(
                (
                    {k: v.numpy() for k, v in x.items()},
                    {k: v.numpy() for k, v in y.items()},
                    {k: v.numpy() for k, v in sample_weight.items()},
                )
            )
        batches[name] = taken
        padding[name] = 1.0 - real_tokens / slots
        print(
            f"{name:>8}: {slots // args.sequence_length} rows of {args.sequence_length} in a "
            f"pass, {real_tokens:,} real tokens, padding {padding[name]:.2%}"
        )
    return batches, padding


def save_batches(path, batches, padding, settings):
    """Writes the inputs' batches, padding fractions and `settings` to one `.npz` file (through
    a temporary sibling), for `--batches-from` on a machine without the tf.data pipeline."""
    import numpy as np

    arrays = {"settings": np.array(json.dumps(dict(settings, padding=padding)))}
    for name, taken in batches.items():
        for index, parts in enumerate(taken):
            for part, tree in zip(("x", "y", "w"), parts):
                for key, value in tree.items():
                    arrays[f"{name}/{index}/{part}/{key}"] = value
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    temporary = f"{path}.tmp.npz"
    np.savez_compressed(temporary, **arrays)
    os.replace(temporary, path)


def load_batches(path):
    """`save_batches`' file -> (batches, padding, settings)."""
    import numpy as np

    with np.load(path, allow_pickle=False) as data:
        settings = json.loads(str(data["settings"]))
        batches = {}
        for key in data.files:
            if key == "settings":
                continue
            name, index, part, field = key.split("/")
            taken = batches.setdefault(name, {})
            taken.setdefault(int(index), {"x": {}, "y": {}, "w": {}})[part][field] = data[key]
    batches = {
        name: [(b["x"], b["y"], b["w"]) for _, b in sorted(taken.items())]
        for name, taken in batches.items()
    }
    return batches, settings.pop("padding"), settings


def training(args):
    """Real tokens per second of masked-LM training steps on packed and unpacked rows."""
    import keras

    from kbert.models import BACKBONE_PRESETS, BertBackbone, BertPretrainer

    if args.batches_from:
        batches, padding, settings = load_batches(args.batches_from)
        vocabulary_size = settings["vocabulary_size"]
        args.sequence_length, args.batch_size = settings["sequence_length"], settings["batch_size"]
        files = settings["files"]
    else:
        from kbert.text import BertTokenizer

        files = args.files or default_files()
        tokenizer = BertTokenizer.from_preset(args.vocab or default_vocab())
        batches, padding = _training_batches(args, files, tokenizer)
        vocabulary_size = len(tokenizer.vocabulary)
    if args.save_batches:
        settings = dict(
            vocabulary_size=vocabulary_size,
            sequence_length=args.sequence_length,
            batch_size=args.batch_size,
            files=[os.path.basename(f) for f in files],
        )
        save_batches(args.save_batches, batches, padding, settings)
        print(f"batches written to {args.save_batches}")
        return None
    config = dict(BACKBONE_PRESETS[args.preset]["config"])
    config.update(
        vocabulary_size=vocabulary_size,
        max_sequence_length=max(config["max_sequence_length"], args.sequence_length),
    )
    models = {}
    for name in batches:
        keras.utils.set_random_seed(args.seed)
        backbone = BertBackbone(**dict(config, packed=name == "packed"), dtype=args.precision)
        models[name] = BertPretrainer(backbone, next_sentence=False)
        models[name].compile(total_steps=10**6)

    def run(name, steps, offset):
        model, data = models[name], batches[name]
        tokens = 0
        for step in range(steps):
            x, y, sample_weight = data[(offset + step) % len(data)]
            model.train_on_batch(x, y, sample_weight=sample_weight)
            tokens += int(x["padding_mask"].sum())
        return tokens

    for name in batches:  # Warm-up: compile the step.
        run(name, 2, 0)
    runs = {
        name: lambda round_index, name=name: run(name, args.steps, 2 + round_index * args.steps)
        for name in batches
    }
    measured = interleave(runs, args.rounds)
    rates = {
        name: sum(tokens for _, tokens in rounds) / sum(seconds for seconds, _ in rounds)
        for name, rounds in measured.items()
    }
    step_seconds = {
        name: sum(seconds for seconds, _ in rounds) / (args.steps * args.rounds)
        for name, rounds in measured.items()
    }
    for name in batches:
        print(
            f"{name:>8}: {rates[name]:,.0f} real tokens/s ({step_seconds[name] * 1000:.0f} ms "
            f"per step of {args.batch_size} rows)"
        )
    ratio_pieces = rates["packed"] / rates["pieces"]
    ratio_standard = rates["packed"] / rates["standard"]
    print(f"packed / pieces: {ratio_pieces:.2f}x; packed / standard: {ratio_standard:.2f}x")
    result = {
        "backend": keras.backend.backend(),
        "device": device_name(),
        "precision": args.precision,
        "preset": args.preset,
        "sequence_length": args.sequence_length,
        "batch_size": args.batch_size,
        "files": files,
        "padding_fraction": {k: round(v, 4) for k, v in padding.items()},
        "real_tokens_per_s": {k: round(v) for k, v in rates.items()},
        "ms_per_step": {k: round(v * 1000, 1) for k, v in step_seconds.items()},
        "ratio_packed_to_pieces": round(ratio_pieces, 3),
        "ratio_packed_to_standard": round(ratio_standard, 3),
    }
    print(json.dumps(result))
    if args.json:
        write_json(args.json, dict(result, command=command_line(__file__)))
    return result


def _read_sentences(path, limit):
    lines = open(path, encoding="utf-8").read().splitlines()[1:]
    return [line.split("\t")[0] for line in lines if line.strip()][:limit]


def inference(args):
    """Texts per second of the forward pass: full-length batches, buckets, packed rows."""
    import keras
    import numpy as np

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
    measured = interleave(
        {name: lambda _, run=run: run() for name, run in runs.items()}, args.repeats
    )
    rates = {
        name: len(texts) / statistics.median(seconds for seconds, _ in rounds)
        for name, rounds in measured.items()
    }
    print(
        f"backend {keras.backend.backend()}, {len(texts)} texts, mean length {lengths.mean():.1f} "
        f"tokens, sequence length {args.sequence_length}, batch {args.batch_size} "
        f"(packed: {len(packed_lengths)} rows, batch {packed_batch}); median of {args.repeats}"
    )
    for name in runs:
        print(
            f"{name:>9s}: {rates[name]:8.1f} texts/s  "
            f"{rates[name] / rates['bucketed']:5.2f}x bucketed"
        )
    scale = max(
        float(np.abs(reference[row, :length]).max())
        for row, (_, _, length) in enumerate(placements)
    )
    print(
        f"max |packed - bucketed| at real positions: {difference:.2e} (outputs up to {scale:.2f})"
    )
    return {"texts_per_second": rates, "max_abs_difference": difference, "output_scale": scale}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("training", help="real tokens/s of masked-LM training steps")
    train.add_argument("files", nargs="*")
    train.add_argument("--vocab", default=None)
    train.add_argument("--preset", default="bert_tiny_en_uncased")
    train.add_argument("--sequence-length", type=int, default=512)
    train.add_argument("--max-predictions", type=int, default=80)
    train.add_argument("--batch-size", type=int, default=8)
    train.add_argument("--batches", type=int, default=40, help="Batches measured for padding.")
    train.add_argument("--steps", type=int, default=4, help="Timed steps per input and round.")
    train.add_argument("--rounds", type=int, default=5)
    train.add_argument("--seed", type=int, default=0)
    train.add_argument(
        "--precision", default="float32", help="the backbone's dtype policy (mixed_bfloat16...)"
    )
    train.add_argument(
        "--save-batches",
        metavar="NPZ",
        help="write the inputs' batches and padding to this file and stop (no training)",
    )
    train.add_argument(
        "--batches-from",
        metavar="NPZ",
        help="train on a --save-batches file instead of running the tf.data pipeline (a "
        "machine without TensorFlow)",
    )
    train.add_argument("--json", help="write the result to this JSON file")
    infer = commands.add_parser("inference", help="texts/s of the forward pass")
    infer.add_argument("--preset", required=True)
    infer.add_argument("--tsv", required=True, help="a TSV with a header; texts in column 0")
    infer.add_argument("--sequence-length", type=int, default=128)
    infer.add_argument("--batch-size", type=int, default=32)
    infer.add_argument("--limit", type=int, default=872)
    infer.add_argument("--repeats", type=int, default=3)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    return training(args) if args.command == "training" else inference(args)


if __name__ == "__main__":
    main()
