"""Readers for the fine-tuning datasets' files: GLUE TSVs, CoNLL-2003, SQuAD JSON.

They read the files exactly as distributed (GLUE's `download_glue_data.py`
layout, the CoNLL shared-task files, the official SQuAD JSON), check them, and
return plain Python / NumPy data that the `kbert.data` pipelines turn into
model inputs. Every malformed row is a `ValueError` naming the file and line.
"""

import dataclasses
import json
import os
import types
import warnings

import numpy as np

# ---------------------------------------------------------------------------
# GLUE
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _GlueSpec:
    folder: str
    sentence1: object  # header name, or column index for header-less files
    sentence2: object  # same, or None for single-sentence tasks
    label: object
    label_names: object  # tuple of label strings (index = class id), None = float
    metrics: tuple
    splits: tuple = ("train", "dev")
    num_columns: object = None  # header-less files only
    # Unlabelled test files: split -> file name, and their (index, sentence1, sentence2) headers.
    test_files: tuple = (("test", "test.tsv"),)
    test_columns: object = None  # None: ("index", sentence1, sentence2)
    skip_malformed: bool = False  # QQP: skip rows with missing fields instead of failing


_MNLI_LABELS = ("contradiction", "entailment", "neutral")

# Label orders follow google-research/bert `run_classifier.py` and the Hugging
# Face GLUE processors (note: the `datasets` hub copy orders MNLI differently).
_GLUE_SPECS = types.MappingProxyType(
    {
        "cola": _GlueSpec(
            "CoLA",
            3,
            None,
            1,
            ("0", "1"),
            ("matthews_corrcoef",),
            num_columns=4,
            test_columns=("index", "sentence", None),
        ),
        "sst2": _GlueSpec("SST-2", "sentence", None, "label", ("0", "1"), ("accuracy",)),
        "mrpc": _GlueSpec(
            "MRPC", "#1 String", "#2 String", "Quality", ("0", "1"), ("accuracy", "f1")
        ),
        "qqp": _GlueSpec(
            "QQP",
            "question1",
            "question2",
            "is_duplicate",
            ("0", "1"),
            ("accuracy", "f1"),
            test_columns=("id", "question1", "question2"),
            skip_malformed=True,
        ),
        "stsb": _GlueSpec(
            "STS-B",
            "sentence1",
            "sentence2",
            "score",
            None,
            ("pearson_corr", "spearman_corr"),
        ),
        "mnli": _GlueSpec(
            "MNLI",
            "sentence1",
            "sentence2",
            "gold_label",
            _MNLI_LABELS,
            ("accuracy",),
            splits=("train", "dev_matched", "dev_mismatched"),
            test_files=(
                ("test_matched", "test_matched.tsv"),
                ("test_mismatched", "test_mismatched.tsv"),
            ),
        ),
        "qnli": _GlueSpec(
            "QNLI",
            "question",
            "sentence",
            "label",
            ("entailment", "not_entailment"),
            ("accuracy",),
        ),
        "rte": _GlueSpec(
            "RTE",
            "sentence1",
            "sentence2",
            "label",
            ("entailment", "not_entailment"),
            ("accuracy",),
        ),
        "wnli": _GlueSpec("WNLI", "sentence1", "sentence2", "label", ("0", "1"), ("accuracy",)),
        # The diagnostic set (AX): a test file alone, predicted with an MNLI model.
        "ax": _GlueSpec(
            "diagnostic",
            "sentence1",
            "sentence2",
            None,
            _MNLI_LABELS,
            (),
            splits=(),
            test_files=(("test", "diagnostic.tsv"),),
        ),
    }
)

GLUE_TASKS = tuple(_GLUE_SPECS)


@dataclasses.dataclass
class GlueData:
    """One split of a GLUE task, as read by `read_glue`.

    Also readable as a dict: `data["sentence1"]`, `data["sentence2"]`,
    `data["label"]`.

    Attributes:
        task: str. Task name (`"sst2"`, `"cola"`, ...).
        split: str. Split name (`"train"`, `"dev"`, `"test"`, ...).
        sentence1: list of str. First sentence (or the only one).
        sentence2: list of str, or None for single-sentence tasks.
        label: numpy array: int32 class ids, or float32 scores for STS-B;
            None for the unlabelled test splits.
        num_classes: int. Number of classes; 1 for the STS-B regression.
        label_names: tuple of str (the file's label strings, index = class
            id), or None for STS-B.
        metrics: tuple of str. `kbert.metrics` functions GLUE reports for the
            task, e.g. `("accuracy", "f1")` for MRPC.
        index: list of str. The test files' `index` column (QQP: `id`), the
            row ids of a leaderboard submission; None for train and dev.
        skipped_lines: tuple of int. Line numbers of malformed rows that were
            skipped (QQP train and dev only); empty elsewhere.
    """

    task: str
    split: str
    sentence1: list
    sentence2: object
    label: object
    num_classes: int
    label_names: object
    metrics: tuple
    index: object = None
    skipped_lines: tuple = ()

    @property
    def is_regression(self):
        return self.label_names is None

    def __len__(self):
        return len(self.sentence1)

    def __getitem__(self, key):
        if key not in ("sentence1", "sentence2", "label"):
            raise KeyError(f"{key!r}: GlueData keys are 'sentence1', 'sentence2' and 'label'.")
        return getattr(self, key)

    def keys(self):
        return ("sentence1", "sentence2", "label")


def _read_lines(path, encoding):
    """Lines split on "\\n" only (GLUE text may hold other Unicode breaks)."""
    text = _decode_file(path, encoding)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the file's final newline
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def _decode_file(path, encoding):
    """The text of a file; a ValueError naming the file, line and byte for undecodable bytes."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        raise ValueError(
            f"{path}:{line}: byte {data[error.start : error.start + 1]!r} at column {column} is "
            "not "
            f"valid {encoding} ({error.reason}). Expected a {encoding} text file; re-encode it, "
            "e.g. with `iconv -f latin1 -t utf-8`."
        ) from None


def glue_file_candidates(task, split, data_dir):
    """The paths `read_glue(task, split, data_dir)` looks for, in order.

    `<data_dir>/<TASK>/<file>` and `<data_dir>/glue/<TASK>/<file>`, with `<file>`
    `<split>.tsv`, or the diagnostic set's `diagnostic/diagnostic.tsv` for `"ax"`.

    Example:

    >>> [p.replace(os.sep, "/") for p in glue_file_candidates("mnli", "test_matched", "data")]
    ['data/MNLI/test_matched.tsv', 'data/glue/MNLI/test_matched.tsv']
    """
    spec, split = _checked_task_split(task, split)
    name = dict(spec.test_files).get(split, f"{split}.tsv")
    data_dir = os.fspath(data_dir)
    return [
        os.path.join(data_dir, spec.folder, name),
        os.path.join(data_dir, "glue", spec.folder, name),
    ]


def glue_test_splits(task):
    """The unlabelled test splits of a GLUE task: `("test",)`, MNLI's
    `("test_matched", "test_mismatched")`.

    Example:

    >>> glue_test_splits("mnli"), glue_test_splits("ax")
    (('test_matched', 'test_mismatched'), ('test',))
    """
    return tuple(split for split, _ in _checked_task_split(task, None)[0].test_files)


def _checked_task_split(task, split):
    """`(spec, split)` of a known task and split (any split when `split` is None)."""
    name = str(task).lower().replace("-", "")
    if name not in _GLUE_SPECS:
        raise ValueError(f"Unknown GLUE task {task!r}. Expected one of {GLUE_TASKS}.")
    spec = _GLUE_SPECS[name]
    known = spec.splits + tuple(split for split, _ in spec.test_files)
    if split is not None and split not in known:
        raise ValueError(
            f"Unknown split {split!r} for GLUE task {name!r}. Expected one of {known}."
        )
    return spec, split


def _glue_path(task, split, data_dir):
    candidates = glue_file_candidates(task, split, data_dir)
    for path in candidates:
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(
        f"No GLUE {task} {split} file: looked for {candidates[0]} and {candidates[1]}."
    )


def _header_columns(path, lines, wanted):
    """The header's column count and the positions of the `wanted` names (None stays None)."""
    if not lines:
        raise ValueError(f"{path} is empty; expected a header line.")
    header = lines[0].split("\t")
    missing = [c for c in wanted if c is not None and c not in header]
    if missing:
        raise ValueError(f"{path}:1: the header lacks the column(s) {missing}. Found: {header}")
    return len(header), [None if c is None else header.index(c) for c in wanted]


def _parse_label(spec, raw_label, where):
    """The class id of a label string, or the float of an STS-B score."""
    if spec.label_names is not None:
        if raw_label not in spec.label_names:
            raise ValueError(
                f"{where}: unknown label {raw_label!r}; expected one of {spec.label_names}."
            )
        return spec.label_names.index(raw_label)
    try:
        label = float(raw_label)
    except ValueError:
        raise ValueError(f"{where}: the score {raw_label!r} is not a number.") from None
    if not np.isfinite(label):
        raise ValueError(
            f"{where}: the score {raw_label!r} is not a finite number; expected a similarity "
            "score such as 3.8 (a NaN label would make the training loss NaN)."
        )
    return label


def _table_rows(path, lines, num_columns, first_line, skip_malformed):
    """`(line_number, fields)` of every row with `num_columns` columns, and the skipped lines.

    A row with another column count is a ValueError, or is skipped when `skip_malformed`."""
    rows, skipped = [], []
    for line_number, line in enumerate(lines, start=first_line):
        fields = line.split("\t")
        if len(fields) == num_columns:
            rows.append((line_number, fields))
        elif skip_malformed:
            skipped.append(line_number)
        else:
            raise ValueError(
                f"{path}:{line_number}: expected {num_columns} tab-separated "
                f"columns, found {len(fields)}: {line[:80]!r}"
            )
    if skipped:
        warnings.warn(
            f"{path}: skipped {len(skipped)} malformed rows (not {num_columns} tab-separated "
            f"columns) at lines {skipped[:10]}{' ...' if len(skipped) > 10 else ''}.",
            stacklevel=3,
        )
    return rows, tuple(skipped)


def read_glue(task, split, data_dir):
    """Reads one split of a GLUE task from its TSV file.

    Files are laid out as GLUE's `download_glue_data.py` writes them:
    `<data_dir>/<TASK>/<split>.tsv` with `TASK` one of `CoLA`, `SST-2`,
    `MRPC`, `QQP`, `STS-B`, `MNLI`, `QNLI`, `RTE`, `WNLI`, and the
    diagnostic set (task `"ax"`) at `<data_dir>/diagnostic/diagnostic.tsv`
    (a `data_dir` that holds a `glue/` folder also works). Columns are split
    on tabs only: quote characters are text, not CSV quoting. A UTF-8
    byte-order mark (MRPC's files) is dropped. CoLA's train and dev files
    have no header and 4 columns (source, label, original mark, sentence);
    the other files' columns are found by their header names, and every row
    must have as many columns as the header.

    QQP's train file as GLUE distributes it has a few rows with missing
    fields. As other GLUE readers do, QQP's train and dev rows with another
    number of columns are skipped (with a warning; their line numbers are in
    `GlueData.skipped_lines`) rather than failing the whole file.

    String labels become class ids in a fixed order, kept in
    `GlueData.label_names`: RTE / QNLI `("entailment", "not_entailment")`,
    MNLI `("contradiction", "entailment", "neutral")` (as BERT's
    `run_classifier.py`), 0/1 tasks `("0", "1")`. STS-B scores are float32.
    Test splits have no labels: they come with their row ids in `index`.

    Args:
        task: str. One of `"cola"`, `"sst2"`, `"mrpc"`, `"qqp"`, `"stsb"`,
            `"mnli"`, `"qnli"`, `"rte"`, `"wnli"`, `"ax"` (case and `-`
            ignored).
        split: str. `"train"`, `"dev"` or `"test"` (MNLI: `"train"`,
            `"dev_matched"`, `"dev_mismatched"`, `"test_matched"`,
            `"test_mismatched"`; AX: `"test"` only).
        data_dir: path of the GLUE folder.

    Returns:
        `GlueData` with `sentence1`, `sentence2` (None for CoLA and SST-2),
        `label` (None for test splits), `index` (test splits) and the task's
        metadata.

    Raises:
        ValueError: an unknown task or split, a header without the expected
            columns, a row with another number of columns, or a label that
            cannot be read (the message gives the file and line number).
        FileNotFoundError: no such file under `data_dir`.

    Example:

    >>> os.makedirs("glue/SST-2")
    >>> with open("glue/SST-2/dev.tsv", "w") as file:
    ...     print("sentence\\tlabel\\na gripping film\\t1\\ntedious and flat\\t0", file=file)
    >>> data = read_glue("sst2", "dev", "glue")
    >>> len(data), data.num_classes, data.metrics, data.label
    (2, 2, ('accuracy',), array([1, 0], dtype=int32))
    """
    spec, split = _checked_task_split(task, split)
    if split is None:
        raise ValueError(f"`split` must be a split name. Received: split={split!r}")
    name = str(task).lower().replace("-", "")
    path = _glue_path(name, split, data_dir)
    lines = _read_lines(path, "utf-8-sig")
    test = split in dict(spec.test_files)
    if test:
        wanted = spec.test_columns or ("index", spec.sentence1, spec.sentence2)
        wanted = (*wanted, None)
    else:
        wanted = (None, spec.sentence1, spec.sentence2, spec.label)
    if test or spec.num_columns is None:  # header: find the columns by name
        num_columns, columns = _header_columns(path, lines, wanted)
        first_line, lines = 2, lines[1:]
    else:
        num_columns, columns, first_line = spec.num_columns, list(wanted), 1
    index_col, s1_col, s2_col, label_col = columns
    skip = spec.skip_malformed and not test  # a submission needs every test row
    rows, skipped = _table_rows(path, lines, num_columns, first_line, skip)
    labels = (
        [_parse_label(spec, f[label_col], f"{path}:{n}") for n, f in rows] if not test else None
    )
    return GlueData(
        task=name,
        split=split,
        sentence1=[fields[s1_col] for _, fields in rows],
        sentence2=None if s2_col is None else [fields[s2_col] for _, fields in rows],
        label=None
        if test
        else np.asarray(labels, dtype="float32" if spec.label_names is None else "int32"),
        num_classes=1 if spec.label_names is None else len(spec.label_names),
        label_names=spec.label_names,
        metrics=spec.metrics,
        index=[fields[index_col] for _, fields in rows] if test else None,
        skipped_lines=skipped,
    )


# ---------------------------------------------------------------------------
# CoNLL
# ---------------------------------------------------------------------------


def _split_tag(tag, where):
    if tag == "O":
        return "O", ""
    prefix, hyphen, entity_type = tag.partition("-")
    if not hyphen or prefix not in ("B", "I") or not entity_type:
        raise ValueError(f"Invalid IOB tag {tag!r}{where}: expected 'O', 'B-TYPE' or 'I-TYPE'.")
    return prefix, entity_type


def iob1_to_iob2(tags):
    """Converts one sentence's IOB1 tags (CoNLL-2003) to IOB2.

    In IOB1 a chunk starts with `I-` unless it directly follows a chunk of
    the same type; in IOB2 every chunk starts with `B-`. So `I-X` becomes
    `B-X` when the previous tag is neither `B-X` nor `I-X`.

    Args:
        tags: list of str, one sentence's tags.

    Returns:
        list of str.

    Example:

    >>> iob1_to_iob2(["I-PER", "I-PER", "B-PER", "O", "I-LOC", "I-ORG"])
    ['B-PER', 'I-PER', 'B-PER', 'O', 'B-LOC', 'B-ORG']
    """
    converted = []
    previous_type = ""  # type of the previous tag, "" for O / sentence start
    for i, tag in enumerate(tags):
        prefix, entity_type = _split_tag(tag, f" at position {i}")
        if prefix == "I" and entity_type != previous_type:
            tag = f"B-{entity_type}"
        converted.append(tag)
        previous_type = entity_type
    return converted


def read_conll(path, tag_column=3, num_columns=4, to_iob2=False, encoding="utf-8"):
    """Reads a CoNLL-format file (one token per line, blank line between sentences).

    CoNLL-2003 lines are `word POS chunk NER`; `-DOCSTART-` lines (document
    separators) are skipped and end any open sentence.

    Args:
        path: path of the file (e.g. `eng.train`, `eng.testa`).
        tag_column: int. Column of the tags to return (0-based; negative
            counts from the end). Defaults to 3, the NER tags (2 = chunks,
            1 = POS).
        num_columns: int or None. Columns every token line must have;
            None takes the count of the first token line. Defaults to 4.
        to_iob2: bool. Convert the tags from IOB1 (the files' scheme) to IOB2
            with `iob1_to_iob2`. Defaults to False (tags as in the file).
        encoding: str. Defaults to `"utf-8"`.

    Returns:
        list of `(words, tags)` tuples, one per sentence, each a list of str.

    Raises:
        ValueError: a line with another number of columns (with its line
            number), a `tag_column` out of range, or (with `to_iob2`) a tag
            that is not IOB.

    Example:

    >>> lines = ["-DOCSTART- -X- -X- O", "", "EU NNP I-NP I-ORG", "rejects VBZ I-VP O",
    ...          "German JJ I-NP I-MISC", "call NN I-NP O", "", "Peter NNP I-NP I-PER"]
    >>> with open("eng.train", "w") as file:
    ...     print(*lines, sep="\\n", file=file)
    >>> sentences = read_conll("eng.train", to_iob2=True)
    >>> sentences[0]
    (['EU', 'rejects', 'German', 'call'], ['B-ORG', 'O', 'B-MISC', 'O'])
    >>> len(sentences)
    2
    """
    path = os.fspath(path)
    if num_columns is not None and (not isinstance(num_columns, int) or num_columns < 2):
        raise ValueError(
            f"`num_columns` must be an integer >= 2 or None. Received: {num_columns!r}"
        )
    sentences = []
    words, tags = [], []

    def flush():
        if words:
            sentences.append((list(words), list(tags)))
            words.clear()
            tags.clear()

    for line_number, line in enumerate(_read_lines(path, encoding), start=1):
        fields = line.split()
        if not fields:
            flush()
            continue
        if fields[0] == "-DOCSTART-":
            flush()
            continue
        if num_columns is None:
            num_columns = len(fields)
        if len(fields) != num_columns:
            raise ValueError(
                f"{path}:{line_number}: expected {num_columns} columns, found "
                f"{len(fields)}: {line!r}"
            )
        if not -num_columns <= tag_column < num_columns:
            raise ValueError(
                f"`tag_column`={tag_column} is out of range for {num_columns} columns."
            )
        words.append(fields[0])
        tags.append(fields[tag_column])
    flush()
    if to_iob2:
        sentences = [
            (sentence_words, _iob2_or_raise(sentence_tags, path, index))
            for index, (sentence_words, sentence_tags) in enumerate(sentences)
        ]
    return sentences


def _iob2_or_raise(tags, path, sentence_index):
    try:
        return iob1_to_iob2(tags)
    except ValueError as error:
        raise ValueError(f"{path}, sentence {sentence_index}: {error}") from None


def label_list(sentences):
    """The sorted set of tags, `"O"` first: a stable tag -> id mapping.

    Args:
        sentences: list of `(words, tags)` pairs (as `read_conll` returns),
            or list of tag lists.

    Returns:
        list of str: `"O"` (if present) then the other tags sorted.

    Example:

    >>> label_list([(["EU", "rejects"], ["B-ORG", "O"]), (["Peter"], ["B-PER"])])
    ['O', 'B-ORG', 'B-PER']
    """
    found = set()
    for index, item in enumerate(sentences):
        if (
            isinstance(item, (tuple, list))
            and len(item) == 2
            and isinstance(item[0], (list, tuple))
        ):
            item = item[1]
        if isinstance(item, str) or not isinstance(item, (list, tuple)):
            raise ValueError(
                f"Item {index} of `sentences` must be a (words, tags) pair or a "
                f"list of tags. Received: {type(item).__name__}"
            )
        found.update(item)
    return (["O"] if "O" in found else []) + sorted(found - {"O"})


# ---------------------------------------------------------------------------
# SQuAD
# ---------------------------------------------------------------------------


class SquadExamples(list):
    """The list of examples `read_squad` returns, with what it found.

    A plain list of example dicts (so it can be passed wherever examples are
    expected) with these extra attributes:

    Attributes:
        version: str. `"1.1"` or `"2.0"`.
        data: list. The SQuAD `data` (articles) the examples came from; pass
            it (or a slice) to `kbert.metrics.squad_scores`.
        misaligned: list of dicts `{"id", "text", "answer_start",
            "article_index"}`: answers whose text is not at `answer_start` in
            the context. They were removed from the examples' `answers`.
        dropped: list of dicts `{"id", "article_index"}`: answerable questions
            left with no aligned answer. They are not in the list, so they are
            not trained on.
    """

    def __init__(self, examples, version, data, misaligned, dropped):
        super().__init__(examples)
        self.version = version
        self.data = data
        self.misaligned = misaligned
        self.dropped = dropped

    @property
    def num_misaligned(self):
        """Number of answers removed because they did not match the context."""
        return len(self.misaligned)

    def articles(self, start, stop):
        """Examples of articles `start <= article_index < stop`, `data` sliced too.

        Example: `examples.articles(0, 32)` to train and
        `examples.articles(32, 48)` to evaluate on SQuAD v1.1 dev.
        """

        def keep(item):
            return start <= item["article_index"] < stop

        return SquadExamples(
            [e for e in self if keep(e)],
            self.version,
            self.data[start:stop],
            [m for m in self.misaligned if keep(m)],
            [d for d in self.dropped if keep(d)],
        )


def _squad_articles(path_or_dict):
    """`(source, articles)`: where the data comes from (for messages) and its `data` list."""
    source = "the SQuAD data"
    if isinstance(path_or_dict, (str, os.PathLike)):
        source = os.fspath(path_or_dict)
        try:
            path_or_dict = json.loads(_decode_file(source, "utf-8"))
        except json.JSONDecodeError as error:
            raise ValueError(f"{source} is not valid JSON: {error}") from None
    data = path_or_dict
    if isinstance(data, dict):
        if "data" not in data:
            raise ValueError(
                f"{source} has no 'data' key; expected SQuAD's "
                "{'version', 'data': [articles]} layout."
            )
        data = data["data"]
    if not isinstance(data, list):
        raise ValueError(f"{source}: expected a list of articles. Received: {type(data).__name__}")
    return source, data


def _paragraph_context(where, paragraph):
    """The context of a checked paragraph object (a string, with a list of `qas`)."""
    missing = [key for key in ("context", "qas") if key not in paragraph]
    if missing:
        raise ValueError(
            f"{where} has no {missing}; expected SQuAD's {{'context': str, 'qas': [...]}}."
        )
    context = paragraph["context"]
    if not isinstance(context, str) or not isinstance(paragraph["qas"], list):
        raise ValueError(
            f"{where}: 'context' must be a string and 'qas' a list. Received: "
            f"{type(context).__name__} and {type(paragraph['qas']).__name__}"
        )
    return context


def _aligned_answers(where, raw_answers, context):
    """`(answers, misaligned)`: the checked answers found in `context` at their
    `answer_start`, and the others (`{"text", "answer_start"}` each)."""
    if not isinstance(raw_answers, list):
        raise ValueError(f"{where}: 'answers' must be a list. Received: {raw_answers!r:.80}")
    answers, misaligned = [], []
    for answer in raw_answers:
        text = answer.get("text") if isinstance(answer, dict) else None
        start = answer.get("answer_start") if isinstance(answer, dict) else None
        if not isinstance(text, str) or isinstance(start, bool) or not isinstance(start, int):
            raise ValueError(
                f"{where}: an answer must be {{'text': str, 'answer_start': int}}. "
                f"Received: {answer!r:.120}"
            )
        if 0 <= start and context[start : start + len(text)] == text:
            answers.append({"text": text, "answer_start": start})
        else:
            misaligned.append({"text": text, "answer_start": start})
    return answers, misaligned


def read_squad(path_or_dict, version="1.1"):
    """Reads SQuAD v1.1 / v2.0 JSON into a list of question examples.

    Each example is a dict with `id`, `question`, `context`, `answers` (list
    of `{"text", "answer_start"}`, `answer_start` a character offset into
    `context`), `is_impossible` (v2.0 unanswerable questions; always False for
    v1.1), `title`, `article_index` and `paragraph_index`. The article index
    lets callers split by article (`examples.articles(0, 32)`).

    Every answer is checked: `context[answer_start:answer_start+len(text)]`
    must equal `text`. Answers that do not match are removed from `answers`,
    counted (`examples.num_misaligned`, listed in `examples.misaligned`) and
    reported with a warning; an answerable question left with none is dropped
    (`examples.dropped`) rather than being trained on as "no answer".

    Args:
        path_or_dict: path of the JSON file, the parsed JSON dict, or its
            `data` list.
        version: str. `"1.1"` or `"2.0"`. Defaults to `"1.1"`.

    Returns:
        `SquadExamples` (a list of example dicts, in file order).

    Raises:
        ValueError: an unknown version, a file that is not SQuAD's layout, or
            (v1.1) an unanswerable question.

    Example:

    >>> article = {"title": "Books", "paragraphs": [{
    ...     "context": "It was written by Ann in 1990.",
    ...     "qas": [{"id": "q1", "question": "Who wrote it?",
    ...              "answers": [{"text": "Ann", "answer_start": 18}]}]}]}
    >>> examples = read_squad({"version": "1.1", "data": [article, article]})  # or a file
    >>> len(examples), examples.num_misaligned
    (2, 0)
    >>> train, dev = examples.articles(0, 1), examples.articles(1, 2)
    >>> [e["article_index"] for e in dev]
    [1]
    """
    if version not in ("1.1", "2.0"):
        raise ValueError(f"`version` must be '1.1' or '2.0'. Received: {version!r}")
    source, data = _squad_articles(path_or_dict)

    examples, misaligned, dropped = [], [], []
    for article_index, article in enumerate(data):
        if not isinstance(article, dict) or "paragraphs" not in article:
            raise ValueError(
                f"{source}: article {article_index} has no 'paragraphs'; expected SQuAD's layout."
            )
        title = article.get("title", "")
        paragraphs = article["paragraphs"]
        if not isinstance(paragraphs, list):
            raise ValueError(
                f"{source}: article {article_index} ({title!r}): 'paragraphs' must be a list. "
                f"Received: {type(paragraphs).__name__}"
            )
        for paragraph_index, paragraph in enumerate(paragraphs):
            where = f"{source}: article {article_index} ({title!r}), paragraph {paragraph_index}"
            if not isinstance(paragraph, dict):
                raise ValueError(
                    f"{where}: expected an object with 'context' and 'qas'. Received: "
                    f"{paragraph!r:.80}"
                )
            context = _paragraph_context(where, paragraph)
            for qa_index, qa in enumerate(paragraph["qas"]):
                if not isinstance(qa, dict) or "question" not in qa or "id" not in qa:
                    raise ValueError(
                        f"{where}, question {qa_index}: expected an object with 'id', 'question' "
                        f"and 'answers'. Received: {qa!r:.80}"
                    )
                qid = qa["id"]
                impossible = bool(qa.get("is_impossible", False))
                if impossible and version == "1.1":
                    raise ValueError(
                        f"{source}: question {qid!r} is marked is_impossible; use version='2.0'."
                    )
                raw_answers = [] if impossible else qa.get("answers", [])
                question = f"{where}, question {qid!r}"
                answers, wrong = _aligned_answers(question, raw_answers, context)
                misaligned.extend(
                    {"id": qid, **answer, "article_index": article_index} for answer in wrong
                )
                if not impossible and not answers:
                    if raw_answers or version == "1.1":
                        dropped.append({"id": qid, "article_index": article_index})
                        continue
                    impossible = True  # v2.0 question without answers
                examples.append(
                    {
                        "id": qid,
                        "question": qa["question"],
                        "context": context,
                        "answers": answers,
                        "is_impossible": impossible,
                        "title": title,
                        "article_index": article_index,
                        "paragraph_index": paragraph_index,
                    }
                )
    if misaligned or dropped:
        warnings.warn(
            f"{source}: {len(misaligned)} answers do not match their context at "
            f"answer_start and were removed; {len(dropped)} questions were left "
            "without an answer and dropped.",
            stacklevel=2,
        )
    return SquadExamples(examples, version, data, misaligned, dropped)
