"""Readers for multiple-choice datasets: SWAG's CSV files and HellaSwag's JSONL files.

Both return a `MultipleChoiceData`: contexts, one list of choices per context and the index of
the right choice, the raw rows `kbert.models.BertMultipleChoice` takes
(`model.fit((data.contexts, data.choices), data.labels)`). Every malformed row is a
`ValueError` naming the file and line.
"""

import csv
import dataclasses
import io
import json

import numpy as np

# SWAG's columns: the context, the start of every ending, and the four endings.
SWAG_ENDINGS = ("ending0", "ending1", "ending2", "ending3")
_SWAG_COLUMNS = ("sent1", "sent2") + SWAG_ENDINGS


@dataclasses.dataclass
class MultipleChoiceData:
    """Multiple-choice rows, as read by `read_swag` and `read_hellaswag`.

    Attributes:
        contexts: list of str. One context per row.
        choices: list of lists of str. The choices of each row.
        labels: int32 array `(rows,)`: the index of the right choice of each row, or `None`
            for files without labels (the test splits).
    """

    contexts: list
    choices: list
    labels: object

    def __len__(self):
        return len(self.contexts)


def _read_text(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def _label(value, count, where):
    """A label string/number as an int in `[0, count)`; a ValueError naming `where` otherwise."""
    try:
        label = int(str(value).strip())
    except ValueError:
        label = None
    if label is None or isinstance(value, bool) or not 0 <= label < count:
        raise ValueError(f"{where}: label {value!r} is not a choice index in [0, {count}).")
    return label


def read_swag(path):
    """Reads a SWAG CSV file (`train.csv`, `val.csv`, `test.csv` of the SWAG release).

    The context of a row is `sent1`; its four choices are `sent2 + " " + ending<i>`, as
    Hugging Face's `run_swag.py` builds them. `label` is the right ending's index; a file
    without a `label` column (or with it empty everywhere, the test split) has `labels=None`.

    Args:
        path: str or path of the CSV file (with its header row).

    Returns:
        A `MultipleChoiceData`.

    Example:
    >>> with open("val.csv", "w") as f:
    ...     _ = f.write("sent1,sent2,ending0,ending1,ending2,ending3,label\\n"
    ...                 "A man sits.,He,stands.,eats.,sings.,runs.,1\\n")
    >>> data = read_swag("val.csv")
    >>> data.contexts, data.choices[0][1], data.labels.tolist()
    (['A man sits.'], 'He eats.', [1])
    """
    reader = csv.DictReader(io.StringIO(_read_text(path), newline=""))
    header = reader.fieldnames or []
    missing = [name for name in _SWAG_COLUMNS if name not in header]
    if missing:
        raise ValueError(
            f"{path}: missing SWAG columns {missing}. Expected a header with {list(_SWAG_COLUMNS)} "
            f"and `label`. Received: {header}"
        )
    contexts, choices, labels = [], [], []
    for row in reader:
        where = f"{path}:{reader.line_num}"
        if any(row.get(name) is None for name in _SWAG_COLUMNS):
            raise ValueError(f"{where}: the row has fewer columns than the header.")
        start = row["sent2"].strip()
        contexts.append(row["sent1"].strip())
        choices.append([f"{start} {row[name].strip()}".strip() for name in SWAG_ENDINGS])
        labels.append(row.get("label"))
    if all(label in (None, "") for label in labels):
        return MultipleChoiceData(contexts, choices, None)
    checked = [
        _label(label, len(SWAG_ENDINGS), f"{path}: data row {i + 1}")
        for i, label in enumerate(labels)
    ]
    return MultipleChoiceData(contexts, choices, np.array(checked, "int32"))


def read_hellaswag(path):
    """Reads a HellaSwag JSONL file (`hellaswag_train.jsonl`, `hellaswag_val.jsonl`, ...).

    One JSON object a line. The context is `ctx`, or `ctx_a + " " + ctx_b` where a line has no
    `ctx`; the choices are `endings` (a list of strings); `label` (an int or a digit string) is
    the right ending's index. A file whose lines have no `label` (the test split) has
    `labels=None`.

    Args:
        path: str or path of the JSONL file.

    Returns:
        A `MultipleChoiceData`.

    Example:
    >>> line = '{"ctx": "A man sits.", "endings": ["He eats.", "He sings."], "label": 1}'
    >>> with open("val.jsonl", "w") as f:
    ...     _ = f.write(line + "\\n")
    >>> data = read_hellaswag("val.jsonl")
    >>> data.contexts, data.choices, data.labels.tolist()
    (['A man sits.'], [['He eats.', 'He sings.']], [1])
    """
    contexts, choices, labels = [], [], []
    for number, line in enumerate(_read_text(path).split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: not a JSON object ({error.msg}).") from None
        if not isinstance(item, dict):
            raise ValueError(f"{where}: expected a JSON object. Received {type(item).__name__}")
        if "ctx" in item:
            context = item["ctx"]
        elif "ctx_a" in item:
            context = f"{item['ctx_a']} {item.get('ctx_b', '')}"
        else:
            raise ValueError(f"{where}: no context: expected `ctx` or `ctx_a`/`ctx_b`.")
        endings = item.get("endings")
        if (
            not isinstance(endings, list)
            or not endings
            or not all(isinstance(e, str) for e in endings)
            or not isinstance(context, str)
        ):
            raise ValueError(
                f"{where}: expected a string context and `endings`, a non-empty list of "
                f"strings. Received endings={endings!r}"
            )
        contexts.append(context.strip())
        choices.append([e.strip() for e in endings])
        labels.append(_label(item["label"], len(endings), where) if "label" in item else None)
    if all(label is None for label in labels):
        return MultipleChoiceData(contexts, choices, None)
    if any(label is None for label in labels):
        raise ValueError(f"{path}: some lines have a `label` and others do not.")
    return MultipleChoiceData(contexts, choices, np.array(labels, "int32"))
