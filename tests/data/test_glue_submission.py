"""GLUE leaderboard files (`kbert.data.glue_submission`) checked against the format the GLUE
site takes, written down here independently of the code: tiny test files in the official
layouts, every one of the 11 files, header, row count, index order, allowed predictions, and
the all-or-nothing write."""

import math
from pathlib import Path

import numpy as np
import pytest

from kbert.data import (
    glue_predictions,
    glue_submission_splits,
    read_glue,
    write_glue_submission,
)

pytestmark = pytest.mark.backend_independent

_NLI = {"entailment", "neutral", "contradiction"}
_BINARY_NLI = {"entailment", "not_entailment"}
_ZERO_ONE = {"0", "1"}
# The leaderboard's specification: file name -> (task, split, test file, its header, allowed).
# `None` as allowed: a float score in [0, 5].
_MNLI_TEST = (
    "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
    "sentence1_parse\tsentence2_parse\tsentence1\tsentence2"
)
_SPEC = {
    "CoLA.tsv": ("cola", "test", "CoLA/test.tsv", "index\tsentence", _ZERO_ONE),
    "SST-2.tsv": ("sst2", "test", "SST-2/test.tsv", "index\tsentence", _ZERO_ONE),
    "MRPC.tsv": (
        "mrpc",
        "test",
        "MRPC/test.tsv",
        "index\t#1 ID\t#2 ID\t#1 String\t#2 String",
        _ZERO_ONE,
    ),
    "STS-B.tsv": (
        "stsb",
        "test",
        "STS-B/test.tsv",
        "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2",
        None,
    ),
    "QQP.tsv": ("qqp", "test", "QQP/test.tsv", "id\tquestion1\tquestion2", _ZERO_ONE),
    "MNLI-m.tsv": ("mnli", "test_matched", "MNLI/test_matched.tsv", _MNLI_TEST, _NLI),
    "MNLI-mm.tsv": ("mnli", "test_mismatched", "MNLI/test_mismatched.tsv", _MNLI_TEST, _NLI),
    "QNLI.tsv": ("qnli", "test", "QNLI/test.tsv", "index\tquestion\tsentence", _BINARY_NLI),
    "RTE.tsv": ("rte", "test", "RTE/test.tsv", "index\tsentence1\tsentence2", _BINARY_NLI),
    "WNLI.tsv": ("wnli", "test", "WNLI/test.tsv", "index\tsentence1\tsentence2", _ZERO_ONE),
    "AX.tsv": ("ax", "test", "diagnostic/diagnostic.tsv", "index\tsentence1\tsentence2", _NLI),
}
# Row ids out of order, as the files may hold them: the submission keeps the file's order.
_IDS = ["7", "3", "11", "0"]


def _write_test_files(folder):
    for _, _, relative, header, _ in _SPEC.values():
        columns = header.split("\t")
        rows = ["\t".join([i] + [f"w{i}{c}" for c in range(1, len(columns))]) for i in _IDS]
        path = folder / "glue" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")


def _outputs(data):
    """Logits whose argmax is row k -> class k % num_classes; STS-B scores below, inside and
    above [0, 5]."""
    if data.is_regression:
        return np.array([[-1.0], [2.5], [7.0], [4.1234]])
    outputs = np.zeros((len(data), data.num_classes))
    outputs[np.arange(len(data)), np.arange(len(data)) % data.num_classes] = 3.0
    return outputs


def test_the_eleven_files_follow_the_leaderboard_format(tmp_path):
    _write_test_files(tmp_path)
    trained = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli")
    splits = [key for task in trained for key in glue_submission_splits(task)]
    assert sorted(splits) == sorted((task, split) for task, split, *_ in _SPEC.values())
    results = [(data, _outputs(data)) for data in (read_glue(t, s, tmp_path) for t, s in splits)]
    written = write_glue_submission(tmp_path / "out" / "glue_submission", results)
    folder = tmp_path / "out" / "glue_submission"
    assert sorted(path.name for path in written) == sorted(_SPEC)
    assert sorted(path.name for path in folder.iterdir()) == sorted(_SPEC)
    for name, (_, _, relative, _, allowed) in _SPEC.items():
        lines = (folder / name).read_text(encoding="utf-8").split("\n")
        assert lines[0] == "index\tprediction", name
        assert lines[-1] == "", name  # a final newline, no blank row
        rows = [line.split("\t") for line in lines[1:-1]]
        test_rows = (tmp_path / "glue" / relative).read_text().splitlines()[1:]
        assert len(rows) == len(test_rows), name
        assert [row[0] for row in rows] == [line.split("\t")[0] for line in test_rows] == _IDS
        labels = [row[1] for row in rows]
        if allowed is None:
            scores = [float(label) for label in labels]
            assert all(math.isfinite(s) and 0.0 <= s <= 5.0 for s in scores), name
            assert labels == ["0.000", "2.500", "5.000", "4.123"]  # clipped to [0, 5]
        else:
            assert set(labels) <= allowed, (name, labels)
    # The label strings are the classes of the largest logit, in the readers' label order.
    assert (folder / "MNLI-m.tsv").read_text().split("\n")[1:-1] == [
        "7\tcontradiction",
        "3\tentailment",
        "11\tneutral",
        "0\tcontradiction",
    ]
    assert [line.split("\t")[1] for line in (folder / "RTE.tsv").read_text().split("\n")[1:-1]] == [
        "entailment",
        "not_entailment",
        "entailment",
        "not_entailment",
    ]
    assert (folder / "QQP.tsv").read_text() == "index\tprediction\n7\t0\n3\t1\n11\t0\n0\t1\n"


def test_submission_splits_and_bad_outputs(tmp_path):
    assert glue_submission_splits("mnli") == (
        ("mnli", "test_matched"),
        ("mnli", "test_mismatched"),
        ("ax", "test"),
    )
    assert glue_submission_splits("wnli") == (("wnli", "test"),)
    with pytest.raises(ValueError, match=r"fine-tuned on 'ax'.*predicted by the MNLI model"):
        glue_submission_splits("ax")
    _write_test_files(tmp_path)
    rte = read_glue("rte", "test", tmp_path)
    with pytest.raises(ValueError, match=r"shape \(rows, classes\) = \(4, 2\). Received: shape"):
        glue_predictions(rte, np.zeros((4, 3)))
    with pytest.raises(ValueError, match=r"rows \[2\] are not finite"):
        glue_predictions(rte, np.array([[0, 1], [1, 0], [np.nan, 0], [0, 1]]))
    train = read_glue("rte", "test", tmp_path)
    train.split = "train"
    with pytest.raises(ValueError, match="GLUE rte train is not a leaderboard test set"):
        write_glue_submission(tmp_path / "sub", [(train, np.zeros((4, 2)))])
    assert not (tmp_path / "sub").exists()
    # Test rows without their row ids, or with fewer ids than rows, cannot be submitted.
    unlabelled = read_glue("rte", "test", tmp_path)
    unlabelled.index = None
    with pytest.raises(ValueError, match="4 predictions for no row ids"):
        write_glue_submission(tmp_path / "sub", [(unlabelled, np.zeros((4, 2)))])
    unlabelled.index = ["0", "1", "2"]
    with pytest.raises(ValueError, match="one prediction per test row id.*4 predictions for 3"):
        write_glue_submission(tmp_path / "sub", [(unlabelled, np.zeros((4, 2)))])
    assert not (tmp_path / "sub").exists()


def test_the_write_is_all_or_nothing(tmp_path, monkeypatch):
    _write_test_files(tmp_path)
    folder = tmp_path / "glue_submission"
    sst2, cola = read_glue("sst2", "test", tmp_path), read_glue("cola", "test", tmp_path)
    write_glue_submission(folder, [(sst2, _outputs(sst2))])
    before = (folder / "SST-2.tsv").read_text()

    original, calls = Path.write_text, []

    def fail_on_the_second_file(self, *args, **kwargs):
        calls.append(self.name)
        if len(calls) == 2:
            raise OSError("disk full")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", fail_on_the_second_file)
    with pytest.raises(OSError, match="disk full"):
        write_glue_submission(folder, [(cola, _outputs(cola)), (sst2, -_outputs(sst2))])
    monkeypatch.undo()
    assert calls == ["CoLA.tsv", "SST-2.tsv"]
    # The old folder as it was: no CoLA.tsv, SST-2.tsv unchanged, no staging folder beside it.
    assert sorted(p.name for p in folder.iterdir()) == ["SST-2.tsv"]
    assert (folder / "SST-2.tsv").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["glue", "glue_submission"]
    # A later run of another task adds its file; the earlier task's file is kept.
    write_glue_submission(folder, [(cola, _outputs(cola))])
    assert sorted(p.name for p in folder.iterdir()) == ["CoLA.tsv", "SST-2.tsv"]
    assert (folder / "SST-2.tsv").read_text() == before
