"""Fine-tune BERT for multiple choice on SWAG or HellaSwag and score dev accuracy.

    python applications/swag.py --preset CHECKPOINT_DIR --data-dir DATA_DIR
    python applications/swag.py --preset CHECKPOINT_DIR --dataset hellaswag --data-dir DATA_DIR
    python applications/swag.py --preset CHECKPOINT_DIR --train-file train.csv --dev-file val.csv

Reads SWAG's CSV files (`<data-dir>/swag/train.csv`, `val.csv`: columns `sent1`, `sent2`,
`ending0..3`, `label`; the context is `sent1`, each choice `sent2 + " " + ending<i>`, as Hugging
Face's `run_swag.py` builds them) with `kbert.data.read_swag`, or HellaSwag's JSONL files
(`<data-dir>/hellaswag/hellaswag_train.jsonl`, `hellaswag_val.jsonl`: `ctx` or `ctx_a`/`ctx_b`,
`endings`, `label`) with `kbert.data.read_hellaswag`; `--train-file` / `--dev-file` name the
files directly (`.csv` is SWAG, `.jsonl` HellaSwag). Builds
`kbert.models.BertMultipleChoice.from_preset(--preset)` with a fresh head, fine-tunes it on the
raw (context, choices) rows with BERT's recipe (AdamW, weight decay 0.01, 10 % warm-up and
linear decay over the run) and reports dev accuracy after every epoch, against chance (one
over the number of choices).

What a run should reach: the paper fine-tunes BERT-Base on SWAG for 3 epochs at learning rate
2e-5, batch size 16 (the defaults here) and reports 81.6 dev accuracy (BERT-Large 86.6; table
4); chance is 25 %. No kbert figure has been measured for this application yet: a full run was
not made here (2-core CPU), and smaller checkpoints or subsets (`--max-train-examples`) score
lower.

Writes `metrics.json` (dev accuracy, and the predicted choice of every dev row under
`dev_predictions`) and `training_curve.png` to `--output-dir`.
"""

import time
from pathlib import Path

if __package__:  # Imported as applications.swag (the tests).
    from applications import common
else:  # Run as `python applications/swag.py`: Python put this folder first on sys.path.
    import common

# --dataset -> (folder under --data-dir, train file, dev file).
DATASETS = {
    "swag": ("swag", "train.csv", "val.csv"),
    "hellaswag": ("hellaswag", "hellaswag_train.jsonl", "hellaswag_val.jsonl"),
}


def build_parser():
    parser = common.base_parser(
        __doc__, epochs=3, batch_size=16, learning_rate=2e-5, max_length=128
    )
    parser.add_argument(
        "--dataset", choices=sorted(DATASETS), default="swag", help="Default: %(default)s."
    )
    parser.add_argument("--train-file", default=None, help="Training file (.csv or .jsonl).")
    parser.add_argument("--dev-file", default=None, help="Dev file (.csv or .jsonl).")
    parser.add_argument(
        "--max-eval-examples",
        type=int,
        default=None,
        help="Score the first this many dev rows. Default: all.",
    )
    common.add_save_model_flag(parser, "multiple-choice model")
    return parser


def read_rows(path):
    """`kbert.data.read_swag` for a .csv file, `read_hellaswag` otherwise."""
    from kbert.data import read_hellaswag, read_swag

    data = read_swag(path) if Path(path).suffix == ".csv" else read_hellaswag(path)
    if data.labels is None:
        common.fail(f"{path} has no labels (a test split?); training and scoring need them.")
    return data


def data_files(args):
    """`(train_file, dev_file)` from `--train-file`/`--dev-file` or `--data-dir`/`--dataset`."""
    folder, train_name, dev_name = DATASETS[args.dataset]
    if args.train_file and args.dev_file:
        files = (args.train_file, args.dev_file)
    else:
        data_dir = common.check_data_dir(
            args, required=[f"{folder}/{name}" for name in (train_name, dev_name)]
        )
        files = (
            args.train_file or data_dir / folder / train_name,
            args.dev_file or data_dir / folder / dev_name,
        )
    for path in files:
        if not Path(path).is_file():
            common.fail(f"no such file: {path}")
    return files


def score(model, dev, batch_size):
    """Dev accuracy and the predicted choice of every dev row."""
    import numpy as np

    logits = common.predict(model, (dev.contexts, dev.choices), batch_size=batch_size)
    predictions = np.asarray(logits).argmax(-1)
    return float(np.mean(predictions == dev.labels)), predictions


def main(argv=None):
    args = common.parse_args(build_parser(), argv)
    if args.max_eval_examples is not None and args.max_eval_examples < 1:
        common.fail("--max-eval-examples must be >= 1")
    train_file, dev_file = data_files(args)
    args.preset = common.check_preset(args.preset)
    common.start_processes()  # Several processes when a launcher started them (README).
    common.quiet_startup()
    common.seed_everything(args.seed)
    import numpy as np

    from kbert import tracking
    from kbert.data import MultipleChoiceData
    from kbert.models import BertMultipleChoice

    try:
        train, dev = read_rows(train_file), read_rows(dev_file)
    except ValueError as error:  # A malformed row: the reader names file and line.
        common.fail(str(error))
    order = common.shuffled_indices(len(train), args.seed, args.max_train_examples)
    train_x = ([train.contexts[i] for i in order], [train.choices[i] for i in order])
    train_y = train.labels[order]
    keep = slice(0, args.max_eval_examples)
    dev = MultipleChoiceData(dev.contexts[keep], dev.choices[keep], dev.labels[keep])
    print(f"{args.dataset}: {len(train_y)} training rows, {len(dev)} dev rows")
    history = tracking.StepLossHistory()
    batch = max(args.batch_size, 64)
    last = {}  # The predictions of the latest evaluation.

    def evaluate(m):
        accuracy, last["predictions"] = score(m, dev, batch)
        return {"accuracy": accuracy}

    evaluation = tracking.EpochEvaluation(evaluate)
    with common.training_scope():  # Over every process a launcher started, else as is.
        model = BertMultipleChoice.from_preset(
            args.preset, sequence_length=args.max_length, fresh_heads=True
        )
        if model.preprocessor is None:
            common.fail(f"--preset {args.preset} has no vocabulary (vocab.txt).")
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
    common.save_model(args, model)
    metrics = {"accuracy": evaluation.evaluations[-1]["accuracy"]}
    application = f"multiple_choice/{args.dataset}"
    tracking.print_metrics(application, metrics)
    chance = float(np.mean([1.0 / len(choices) for choices in dev.choices]))
    print(f"{'chance':>24s}: accuracy {chance:.4f}")
    paths = tracking.write_run_report(
        common.output_dir(args, args.dataset),
        application,
        metrics,
        step_loss=history.step_loss,
        epoch_logs=history.epochs,
        arguments={**vars(args), "train_file": str(train_file), "dev_file": str(dev_file)},
        extra={
            "train_examples": int(len(train_y)),
            "dev_examples": len(dev),
            "train_seconds": train_seconds,
            "dev_predictions": last["predictions"].astype(int).tolist(),
        },
        evaluations=evaluation.evaluations,
        baseline=("chance", {"accuracy": chance}),
    )
    if common.is_writer():
        print("Wrote", *(path for path in paths if path))
    return metrics


if __name__ == "__main__":
    main()
