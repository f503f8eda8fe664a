"""The kbert demo: pretrain a small BERT from scratch, fine-tune it, print the accuracy.

Runs end to end on the data this project ships (`applications/demo_data/`, written by
`applications/demo_data/generate.py`), with nothing downloaded:

1. learns a WordPiece vocabulary from the corpus (`kbert.text.train_wordpiece_vocabulary`);
2. pretrains the `bert_tiny_en_uncased` architecture (2 layers, hidden 128) with masked LM +
   next-sentence prediction on `corpus.txt` (`kbert.data.pretraining_dataset` ->
   `BertPretrainer.fit`);
3. fine-tunes a `BertClassifier` on raw review strings from `reviews.tsv` and prints the
   accuracy on the held-out reviews.

Expected result (any backend): masked-LM accuracy well above chance after pretraining, and
held-out sentiment accuracy >= 0.90.

    KERAS_BACKEND=jax python applications/demo.py [--pretrain-steps 300] [--output-dir runs/demo]
"""

import argparse
import json
import os
import sys
from pathlib import Path

if __package__:  # Imported as applications.demo (the tests).
    from applications import common
else:  # Run as `python applications/demo.py` (make demo): this folder is first on sys.path.
    import common

DEMO_DATA = Path(__file__).resolve().parent / "demo_data"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__ + "\nThe defaults are the recipe of the README's figure (`make demo`).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--backend",
        choices=["tensorflow", "jax", "torch"],
        default=None,
        help="Keras backend (default: $KERAS_BACKEND, else tensorflow).",
    )
    parser.add_argument("--pretrain-steps", type=int, default=300, help="Default: %(default)s.")
    parser.add_argument("--finetune-epochs", type=int, default=8, help="Default: %(default)s.")
    parser.add_argument("--batch-size", type=int, default=32, help="Default: %(default)s.")
    parser.add_argument(
        "--finetune-learning-rate", type=float, default=3e-4, help="Default: %(default)s."
    )
    parser.add_argument("--sequence-length", type=int, default=64, help="Default: %(default)s.")
    parser.add_argument("--seed", type=int, default=0, help="Default: %(default)s.")
    parser.add_argument("--output-dir", default="runs/demo", help="Default: %(default)s.")
    common.add_tune_allocator_flag(parser)
    return parser.parse_args(argv)


def read_reviews(path):
    lines = path.read_text(encoding="utf-8").splitlines()[1:]
    sentences, labels = zip(*(line.rsplit("\t", 1) for line in lines if line))
    return list(sentences), [int(label) for label in labels]


def main(argv=None):
    args = parse_args(argv)
    if args.backend:
        os.environ["KERAS_BACKEND"] = args.backend
    common.apply_tune_allocator(args)
    for name in ("corpus.txt", "reviews.tsv"):
        if not (DEMO_DATA / name).is_file():
            common.fail(
                f"{DEMO_DATA / name} is missing; restore it with "
                "`git checkout applications/demo_data`."
            )
    common.quiet_startup()
    import keras
    import numpy as np

    import kbert

    keras.utils.set_random_seed(args.seed)
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    print(f"kbert demo on the {keras.backend.backend()} backend")

    # 1. Vocabulary and tokenizer.
    corpus = DEMO_DATA / "corpus.txt"
    vocabulary = kbert.text.train_wordpiece_vocabulary(
        [corpus, DEMO_DATA / "reviews.tsv"],
        vocabulary_size=1000,
        output_path=output_dir,
        verbose=False,
    )
    tokenizer = kbert.text.BertTokenizer(vocabulary)
    print(f"[1/3] WordPiece vocabulary: {len(vocabulary)} tokens")

    # 2. Pretraining (MLM + NSP) from fresh weights.
    backbone = kbert.models.BertBackbone.from_preset(
        "bert_tiny_en_uncased",
        load_weights=False,
        vocabulary_size=len(vocabulary),
        max_sequence_length=args.sequence_length,
    )
    dataset = kbert.data.pretraining_dataset(
        corpus,
        tokenizer,
        sequence_length=args.sequence_length,
        max_predictions=10,
        batch_size=args.batch_size,
        seed=args.seed,
        repeat=True,
    )
    pretrainer = kbert.models.BertPretrainer(backbone)
    pretrainer.compile(
        learning_rate=1e-3,
        total_steps=args.pretrain_steps,
        warmup_steps=args.pretrain_steps // 10,
    )
    print(
        f"[2/3] Pretraining {backbone.count_params():,} parameters for {args.pretrain_steps} steps"
    )
    epochs = 5
    history = pretrainer.fit(
        dataset, epochs=epochs, steps_per_epoch=max(1, args.pretrain_steps // epochs), verbose=2
    ).history
    pretrainer.save_to_preset(output_dir / "pretrained")

    # 3. Fine-tuning on raw strings.
    sentences, labels = read_reviews(DEMO_DATA / "reviews.tsv")
    split = int(0.75 * len(sentences))
    classifier = kbert.models.BertClassifier(
        backbone,
        num_classes=2,
        preprocessor=kbert.text.BertPreprocessor(tokenizer, sequence_length=32),
    )
    classifier.compile(learning_rate=args.finetune_learning_rate)
    print(f"[3/3] Fine-tuning on {split} reviews, evaluating on {len(sentences) - split}")
    classifier.fit(
        sentences[:split],
        np.array(labels[:split]),
        batch_size=args.batch_size,
        epochs=args.finetune_epochs,
        verbose=2,
    )
    logits = classifier.predict(sentences[split:], batch_size=128, verbose=0)
    accuracy = float(np.mean(np.argmax(logits, axis=-1) == np.array(labels[split:])))

    metrics = {
        "backend": keras.backend.backend(),
        "mlm_accuracy": float(history["mlm_accuracy"][-1]),
        "nsp_accuracy": float(history["nsp_accuracy"][-1]),
        "sentiment_accuracy": accuracy,
    }
    (output_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    print(
        f"masked-LM accuracy {metrics['mlm_accuracy']:.3f}, "
        f"NSP accuracy {metrics['nsp_accuracy']:.3f}, "
        f"held-out sentiment accuracy {accuracy:.3f}"
    )
    return metrics


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
