"""GLUE leaderboard files: a fine-tuned model's test-set predictions, as gluebenchmark.com takes
them.

The leaderboard takes one zip of 11 TSV files, one per test set, each with the header
`index<TAB>prediction` and one row per test row, in the test file's order, `index` being the
test file's own row id (QQP's `id`). Predictions are label strings for the entailment tasks
(MNLI-m, MNLI-mm and AX: `entailment` / `neutral` / `contradiction`; QNLI and RTE:
`entailment` / `not_entailment`), 0 or 1 for CoLA, SST-2, MRPC, QQP and WNLI, and a similarity
score in [0, 5] for STS-B. AX (the diagnostic set) is predicted with the MNLI model, so a model
fine-tuned on MNLI writes MNLI-m.tsv, MNLI-mm.tsv and AX.tsv.
"""

import types
from pathlib import Path

import numpy as np

from kbert.checkpoints.atomic import atomic_directory

# (task, test split of `read_glue`) -> the file name the leaderboard expects.
GLUE_SUBMISSION_FILES = types.MappingProxyType(
    {
        ("cola", "test"): "CoLA.tsv",
        ("sst2", "test"): "SST-2.tsv",
        ("mrpc", "test"): "MRPC.tsv",
        ("stsb", "test"): "STS-B.tsv",
        ("qqp", "test"): "QQP.tsv",
        ("mnli", "test_matched"): "MNLI-m.tsv",
        ("mnli", "test_mismatched"): "MNLI-mm.tsv",
        ("qnli", "test"): "QNLI.tsv",
        ("rte", "test"): "RTE.tsv",
        ("wnli", "test"): "WNLI.tsv",
        ("ax", "test"): "AX.tsv",
    }
)
SUBMISSION_HEADER = "index\tprediction"
STSB_RANGE = (0.0, 5.0)


def glue_submission_splits(task):
    """The `(task, split)` test sets a model fine-tuned on `task` predicts for the leaderboard.

    Example:

    >>> glue_submission_splits("mnli")
    (('mnli', 'test_matched'), ('mnli', 'test_mismatched'), ('ax', 'test'))
    >>> glue_submission_splits("rte")
    (('rte', 'test'),)
    """
    splits = tuple(key for key in GLUE_SUBMISSION_FILES if key[0] == task and task != "ax")
    if not splits:
        trained = sorted({name for name, _ in GLUE_SUBMISSION_FILES} - {"ax"})
        raise ValueError(
            f"No GLUE test set is predicted by a model fine-tuned on {task!r}: expected one of "
            f"{trained} (AX is predicted by the MNLI model)."
        )
    return splits + ((("ax", "test"),) if task == "mnli" else ())


def glue_predictions(data, outputs):
    """The leaderboard's prediction strings for the model `outputs` on a test split.

    Args:
        data: `GlueData` of a test split (`read_glue(task, "test", ...)`).
        outputs: array `(num_rows, num_classes)` of logits, or `(num_rows, 1)` scores for
            STS-B.

    Returns:
        list of str: the label string of the largest logit (`data.label_names`), or the
        STS-B score clipped to [0, 5] with 3 decimals.

    Example:

    >>> from kbert.data import GlueData
    >>> rte = GlueData("rte", "test", ["a", "b"], ["c", "d"], None, 2,
    ...                ("entailment", "not_entailment"), ("accuracy",), index=["0", "1"])
    >>> glue_predictions(rte, [[2.0, -1.0], [0.0, 3.0]])
    ['entailment', 'not_entailment']
    """
    outputs = np.asarray(outputs, dtype="float64")
    where = f"GLUE {data.task} {data.split}"
    expected = (len(data), data.num_classes)
    if outputs.ndim != 2 or outputs.shape != expected:
        raise ValueError(
            f"{where}: the outputs must have shape (rows, classes) = {expected}. "
            f"Received: shape {outputs.shape}"
        )
    if not np.isfinite(outputs).all():
        rows = np.flatnonzero(~np.isfinite(outputs).all(-1))
        raise ValueError(
            f"{where}: the outputs of rows {rows[:10].tolist()} are not finite; expected finite "
            "logits or scores."
        )
    if data.is_regression:
        return [f"{score:.3f}" for score in np.clip(outputs[:, 0], *STSB_RANGE)]
    return [data.label_names[k] for k in outputs.argmax(-1)]


def _submission_text(data, predictions):
    key = (data.task, data.split)
    if key not in GLUE_SUBMISSION_FILES:
        raise ValueError(
            f"GLUE {data.task} {data.split} is not a leaderboard test set; expected one of "
            f"{list(GLUE_SUBMISSION_FILES)}."
        )
    if data.index is None or len(data.index) != len(predictions):
        raise ValueError(
            f"GLUE {data.task} {data.split}: expected one prediction per test row id. Received: "
            f"{len(predictions)} predictions for "
            f"{'no row ids' if data.index is None else f'{len(data.index)} row ids'}."
        )
    rows = (f"{index}\t{label}\n" for index, label in zip(data.index, predictions))
    return SUBMISSION_HEADER + "\n" + "".join(rows)


def write_glue_submission(directory, results):
    """Writes leaderboard files into `directory`, atomically (all of them, or none).

    The new files and those of other tasks already in `directory` (from earlier runs) form
    the new version of the folder, which replaces the old one in one rename
    (`kbert.checkpoints.atomic_directory`): an error or a kill leaves the old folder as it
    was, never a partial one. So one folder can collect the 11 files of a submission, run
    after run; zip its `*.tsv` files to submit.

    Args:
        directory: str or path. The submission folder, e.g. `runs/glue_mnli/glue_submission`.
        results: list of `(data, outputs)`: a test split's `GlueData` and the model's outputs
            on it (see `glue_predictions`).

    Returns:
        list of `Path`: the files written.

    Example:

    >>> from kbert.data import GlueData
    >>> sst2 = GlueData("sst2", "test", ["a fine film"], None, None, 2, ("0", "1"),
    ...                 ("accuracy",), index=["0"])
    >>> [path.name for path in write_glue_submission("submission", [(sst2, [[0.2, 1.5]])])]
    ['SST-2.tsv']
    >>> print(open("submission/SST-2.tsv").read(), end="")
    index	prediction
    0	1
    """
    texts = {}
    for data, outputs in results:  # Every check before anything is written.
        text = _submission_text(data, glue_predictions(data, outputs))
        texts[GLUE_SUBMISSION_FILES[(data.task, data.split)]] = text
    with atomic_directory(directory) as staging:
        for name, text in texts.items():
            (staging / name).write_text(text, encoding="utf-8")
    return [Path(directory) / name for name in texts]
