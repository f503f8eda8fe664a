"""The SWAG / HellaSwag readers (once) and applications/swag.py on tiny files, its scores
checked against the model it saves."""

import json

import numpy as np
import pytest

from applications import swag
from kbert.data import read_hellaswag, read_swag
from kbert.models import BertBackbone, BertMultipleChoice
from kbert.text import BertTokenizer
from tests.applications import ONE_BACKEND
from tests.applications.test_finetuning_apps import VOCABULARY
from tests.test_case import tiny_backbone_kwargs

SWAG_HEADER = (
    "video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3"
)


def _write_swag(path, rows):
    """`rows`: (sent1, sent2, four endings, label) tuples, written as SWAG's CSV."""
    lines = [SWAG_HEADER + ",label"]
    for i, (sent1, sent2, endings, label) in enumerate(rows):
        fields = [f"v{i}", str(i), f'"{sent1} {sent2}"', f'"{sent1}"', sent2, "gold"]
        lines.append(",".join(fields + list(endings) + [str(label)]))
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.backend_independent
def test_readers_follow_the_swag_and_hellaswag_layouts(tmp_path):
    _write_swag(
        tmp_path / "val.csv",
        [("The cat, tired, sat", "It", ("slept.", "ran.", "sang.", "flew."), 2)],
    )
    data = read_swag(tmp_path / "val.csv")
    assert data.contexts == ["The cat, tired, sat"]  # a quoted comma stays in the field
    assert data.choices == [["It slept.", "It ran.", "It sang.", "It flew."]]
    assert data.labels.tolist() == [2] and data.labels.dtype == np.int32
    lines = [
        {"ctx": "A man sits.", "endings": ["He eats.", "He sings."], "label": 1},
        {"ctx_a": "A dog runs.", "ctx_b": "it", "endings": ["stops.", "a", "b"], "label": "0"},
    ]
    (tmp_path / "val.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    data = read_hellaswag(tmp_path / "val.jsonl")
    assert data.contexts == ["A man sits.", "A dog runs. it"]
    assert data.choices == [["He eats.", "He sings."], ["stops.", "a", "b"]]
    assert data.labels.tolist() == [1, 0]
    # Errors name the file and the line.
    _write_swag(tmp_path / "bad.csv", [("A", "B", ("c", "d", "e", "f"), 4)])
    with pytest.raises(ValueError, match=r"bad\.csv: data row 1: label '4' is not a choice"):
        read_swag(tmp_path / "bad.csv")
    (tmp_path / "cols.csv").write_text("sent1,sent2,label\nA,B,0\n")
    with pytest.raises(ValueError, match=r"missing SWAG columns \['ending0'"):
        read_swag(tmp_path / "cols.csv")
    (tmp_path / "bad.jsonl").write_text(json.dumps(lines[0]) + "\n" + '{"ctx": "x", "endings": []}')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: .*non-empty list"):
        read_hellaswag(tmp_path / "bad.jsonl")


@pytest.mark.backend_independent
def test_readers_strip_fields_check_labels_and_read_unlabelled_files(tmp_path):
    """Fields are stripped as `run_swag.py` joins them, labels must be whole choice indices
    of their own row, test files (no or empty labels) have none, and every malformed line is
    named."""
    header = "sent1,sent2,ending0,ending1,ending2,ending3"
    (tmp_path / "spaces.csv").write_text(
        f"{header},label\n The cat , It ,slept.,ran.,sang.,flew., 2\nA dog,,barks.,a,b,c,0\n"
    )
    data = read_swag(tmp_path / "spaces.csv")
    assert data.contexts == ["The cat", "A dog"]
    assert data.choices == [
        ["It slept.", "It ran.", "It sang.", "It flew."],
        ["barks.", "a", "b", "c"],
    ]
    assert data.labels.tolist() == [2, 0]
    for name, text in (
        ("empty.csv", f"{header},label\nA,B,c,d,e,f,\nG,H,i,j,k,l,\n"),
        ("none.csv", f"{header}\nA,B,c,d,e,f\n"),
    ):
        (tmp_path / name).write_text(text)
        assert read_swag(tmp_path / name).labels is None
    (tmp_path / "short.csv").write_text(f"{header},label\nA,B,c,d,e,f,1\nA,B,c\n")
    with pytest.raises(ValueError, match=r"short\.csv:3: the row has fewer columns"):
        read_swag(tmp_path / "short.csv")
    for label in ("1.0", "-1", "x"):
        (tmp_path / "label.csv").write_text(f"{header},label\nA,B,c,d,e,f,{label}\n")
        with pytest.raises(ValueError, match=f"data row 1: label '{label}' is not a choice index"):
            read_swag(tmp_path / "label.csv")

    def hellaswag(*lines):
        (tmp_path / "h.jsonl").write_text("\n".join(lines) + "\n")
        return read_hellaswag(tmp_path / "h.jsonl")

    data = hellaswag(json.dumps({"ctx": "  A man sits. ", "endings": [" He eats. ", "He sings."]}))
    assert (data.contexts, data.choices, data.labels) == (
        ["A man sits."],
        [["He eats.", "He sings."]],
        None,
    )
    ok = json.dumps({"ctx": "A", "endings": ["b", "c"], "label": 1})
    for line, message in (
        ("{not json", "h.jsonl:2: not a JSON object"),
        ("[1, 2]", "h.jsonl:2: expected a JSON object. Received list"),
        (json.dumps({"endings": ["b"]}), "h.jsonl:2: no context"),
        (json.dumps({"ctx": "A", "endings": ["b", 3]}), "h.jsonl:2: expected a string context"),
        (json.dumps({"ctx": 3, "endings": ["b"]}), "h.jsonl:2: expected a string context"),
        (
            json.dumps({"ctx": "A", "endings": ["b", "c"], "label": 2}),
            r"label 2 is not a choice index in \[0, 2\)",
        ),
        (
            json.dumps({"ctx": "A", "endings": ["b", "c"], "label": True}),
            "label True is not a choice",
        ),
        (
            json.dumps({"ctx": "A", "endings": ["b", "c"]}),
            "some lines have a `label` and others do not",
        ),
    ):
        with pytest.raises(ValueError, match=message):
            hellaswag(ok, line)


@pytest.mark.backends("jax", reason=ONE_BACKEND)
def test_swag_app_reports_the_accuracy_of_the_saved_model(tmp_path):
    """The reported dev accuracy and `dev_predictions` are those of the model written by
    `--save-model`, reloaded here and run on the dev rows (not the app's own predictions file
    checked against itself)."""
    preset = tmp_path / "preset"
    BertBackbone(
        **tiny_backbone_kwargs(
            vocabulary_size=len(VOCABULARY), num_layers=1, max_sequence_length=64
        )
    ).save_to_preset(preset)
    BertTokenizer(VOCABULARY).save_to_preset(preset)
    endings = ("on the mat .", "in paris .", "at acme .", "is dull .")
    rows = [("the cat sat", "it sat", endings, 0), ("john smith lives", "he lives", endings, 1)]
    _write_swag(tmp_path / "train.csv", rows * 4)
    dev = [  # HellaSwag layout, 2 to 4 choices a row: the dev file may have either.
        {"ctx": "the dog sat", "endings": ["on the mat .", "in paris ."], "label": 0},
        {"ctx": "mary lives", "endings": ["in paris .", "on the mat .", "at acme ."], "label": 0},
        {"ctx": "a cat ran", "endings": list(endings), "label": 3},
        {"ctx": "john sat", "endings": ["is dull .", "on the mat .", "in paris ."], "label": 1},
        {"ctx": "the film", "endings": ["at acme .", "is dull ."], "label": 1},
    ]
    (tmp_path / "dev.jsonl").write_text("\n".join(json.dumps(d) for d in dev) + "\n")
    out, saved = tmp_path / "out", tmp_path / "model"
    metrics = swag.main(
        [
            "--preset",
            str(preset),
            "--train-file",
            str(tmp_path / "train.csv"),
            "--dev-file",
            str(tmp_path / "dev.jsonl"),
            "--epochs",
            "2",
            "--batch-size",
            "4",
            "--max-length",
            "16",
            "--learning-rate",
            "1e-3",
            "--output-dir",
            str(out),
            "--save-model",
            str(saved),
        ]
    )
    record = json.loads((out / "metrics.json").read_text())
    model = BertMultipleChoice.from_preset(saved)
    contexts, choices = [d["ctx"] for d in dev], [d["endings"] for d in dev]
    logits = np.asarray(model.predict((contexts, choices), verbose=0))
    predictions = logits.argmax(-1)
    assert all(p < len(d["endings"]) for p, d in zip(predictions, dev))  # never a padded choice
    accuracy = float(np.mean(predictions == np.array([d["label"] for d in dev])))
    assert record["dev_predictions"] == predictions.tolist()
    assert metrics == record["metrics"] == {"accuracy": accuracy}
    assert len(record["evaluations"]) == 2 and record["train_steps"] == 4
    assert record["evaluations"][-1]["accuracy"] == accuracy
    assert record["baseline"]["accuracy"] == pytest.approx(
        (1 / 2 + 1 / 3 + 1 / 4 + 1 / 3 + 1 / 2) / 5
    )
    assert (out / "training_curve.png").read_bytes().startswith(b"\x89PNG")
    # The saved model is the trained one, not the preset's initial weights.
    initial = BertBackbone.from_preset(preset).get_weights()
    moved = max(float(np.abs(a - b).max()) for a, b in zip(model.backbone.get_weights(), initial))
    assert moved > 1e-4, moved
