"""applications/glue.py, ner.py and squad.py: a smoke run each on tiny data written here, and
their one-line errors for the usual mistakes (checked before Keras is imported). The scripts run
as a user runs them (`python applications/glue.py`, from another folder) in the error and help
checks; the smoke runs call their `main` in the test process, on the test session's backend."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import keras
import numpy as np
import pytest

from applications import glue, ner, squad
from kbert.data.readers import read_conll, read_squad
from kbert.metrics import entity_f1, squad_scores
from kbert.models import BertBackbone, BertClassifier, BertQuestionAnswerer, BertTagger
from kbert.text import BertTokenizer
from tests.applications import ONE_BACKEND
from tests.test_case import tiny_backbone_kwargs

REPO = Path(__file__).resolve().parents[2]
WORDS = (
    "a good great fine bad awful dull film movie plot the cat dog sat ran on mat in paris john "
    "smith lives works at acme who where what did is was ? ."
).split()
VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    """A tiny kbert preset directory with weights and a vocabulary."""
    folder = tmp_path_factory.mktemp("preset")
    backbone = BertBackbone(
        **tiny_backbone_kwargs(
            vocabulary_size=len(VOCABULARY), num_layers=1, max_sequence_length=64
        )
    )
    backbone.save_to_preset(folder)
    BertTokenizer(VOCABULARY).save_to_preset(folder)
    return folder


def _write_glue(data):
    folder = data / "glue" / "SST-2"
    folder.mkdir(parents=True)
    rows = [
        "a good film",
        "a great movie",
        "a fine plot",
        "a bad film",
        "an awful movie",
        "a dull plot",
    ]
    labels = [1, 1, 1, 0, 0, 0]
    text = "sentence\tlabel\n" + "".join(f"{r}\t{y}\n" for r, y in zip(rows * 4, labels * 4))
    (folder / "train.tsv").write_text(text)
    (folder / "dev.tsv").write_text(
        "sentence\tlabel\n" + "".join(f"{r}\t{y}\n" for r, y in zip(rows, labels))
    )


def _write_conll(data):
    folder = data / "conll2003"
    folder.mkdir(parents=True)
    sentence = [
        ("john", "I-PER"),
        ("smith", "I-PER"),
        ("works", "O"),
        ("at", "O"),
        ("acme", "I-ORG"),
        ("in", "O"),
        ("paris", "I-LOC"),
        (".", "O"),
    ]
    block = "".join(f"{w} NN O {t}\n" for w, t in sentence) + "\n"
    for name, copies in (("eng.train", 8), ("eng.testa", 2)):
        (folder / name).write_text("-DOCSTART- -X- -X- O\n\n" + block * copies)


def _write_squad(data):
    folder = data / "squad"
    folder.mkdir(parents=True)
    context = "john smith lives in paris . the cat sat on the mat ."

    def article(index):
        questions = [("where does john smith live ?", "paris"), ("who sat on the mat ?", "the cat")]
        return {
            "title": f"article {index}",
            "paragraphs": [
                {
                    "context": context,
                    "qas": [
                        {
                            "id": f"{index}-{k}",
                            "question": q,
                            "answers": [{"text": a, "answer_start": context.index(a)}],
                        }
                        for k, (q, a) in enumerate(questions)
                    ],
                }
            ],
        }

    (folder / "dev-v1.1.json").write_text(
        json.dumps({"version": "1.1", "data": [article(i) for i in range(3)]})
    )


def _check_outputs(output_dir, metric):
    record = json.loads((output_dir / "metrics.json").read_text())
    assert record["backend"] == keras.backend.backend()
    assert record["train_steps"] == len(record["step_loss"]) > 0
    assert np.isfinite(record["step_loss"]).all()
    assert record["evaluations"] and metric in record["evaluations"][-1]
    assert record["baseline"] is not None
    png = (output_dir / "training_curve.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    return record


def test_glue_runs_on_tiny_data(preset, tmp_path):
    _write_glue(tmp_path / "data")
    out, saved = tmp_path / "out", tmp_path / "model"
    argv = ["--task", "sst2", "--preset", str(preset), "--data-dir", str(tmp_path / "data")]
    argv += ["--epochs", "2", "--batch-size", "8", "--max-length", "16", "--output-dir", str(out)]
    metrics = glue.main([*argv, "--save-model", str(saved), "--quantize", "int8"])
    record = _check_outputs(out, "accuracy")
    assert len(record["evaluations"]) == 2  # one per epoch
    assert record["baseline"] == {"name": "majority class", "accuracy": 0.5}
    # The reported accuracy is the trained model's on dev: the saved model, reloaded, scores
    # the dev rows to the same value, and it did not stay at its initial weights.
    dev = (tmp_path / "data" / "glue" / "SST-2" / "dev.tsv").read_text().splitlines()[1:]
    rows = [line.split("\t") for line in dev]
    model = BertClassifier.from_preset(saved)
    logits = np.asarray(model.predict([r[0] for r in rows], verbose=0))
    accuracy = float(np.mean(logits.argmax(-1) == np.array([int(r[1]) for r in rows])))
    assert {k: v for k, v in record["evaluations"][-1].items() if k != "step"} == {
        "accuracy": accuracy
    }
    # --quantize int8: the saved model stays float; the same model quantized scores
    # `accuracy_int8`, reported next to the float accuracy.
    quantized = BertClassifier.from_preset(saved)
    quantized.quantize("int8")
    logits8 = np.asarray(quantized.predict([r[0] for r in rows], verbose=0))
    assert np.abs(logits8 - logits).max() > 1e-5  # really quantized
    accuracy8 = float(np.mean(logits8.argmax(-1) == np.array([int(r[1]) for r in rows])))
    assert metrics == {"accuracy": accuracy, "accuracy_int8": accuracy8}
    assert record["quantized"] == {"accuracy_int8": accuracy8}
    initial = BertBackbone.from_preset(preset).pooler.weights[0]
    assert not np.allclose(model.backbone.pooler.weights[0], initial, atol=1e-6)


_MNLI_HEADER = (
    "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
    "sentence1_parse\tsentence2_parse\tsentence1\tsentence2"
)
_PAIRS = [
    ("the cat sat on the mat", "the cat sat", "entailment"),
    ("the dog ran in paris", "the dog sat", "contradiction"),
    ("john smith lives in paris", "john smith works at acme", "neutral"),
]


def _write_mnli(data):
    """MNLI's train, dev and test files and the AX diagnostic file, in GLUE's layouts. Every
    evaluated file has 4 rows: one batch shape, one compiled predict step (JAX, TensorFlow)."""

    def rows(count, labels, ids=None):
        lines = []
        for k in range(count):
            premise, hypothesis, label = _PAIRS[k % len(_PAIRS)]
            index = ids[k] if ids else str(k)
            fields = [index, "1", f"{k}e", "fiction", "( a )", "( b )", "(A)", "(B)"]
            lines.append("\t".join(fields + [premise, hypothesis] + [label] * labels) + "\n")
        return "".join(lines)

    folder = data / "glue" / "MNLI"
    folder.mkdir(parents=True)
    dev_header = _MNLI_HEADER + "\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label\n"
    (folder / "train.tsv").write_text(_MNLI_HEADER + "\tlabel1\tgold_label\n" + rows(16, 2))
    (folder / "dev_matched.tsv").write_text(dev_header + rows(4, 6))
    (folder / "dev_mismatched.tsv").write_text(dev_header + rows(4, 6))
    (folder / "test_matched.tsv").write_text(_MNLI_HEADER + "\n" + rows(4, 0, ["9", "2", "5", "0"]))
    (folder / "test_mismatched.tsv").write_text(_MNLI_HEADER + "\n" + rows(4, 0))
    (data / "glue" / "diagnostic").mkdir()
    (data / "glue" / "diagnostic" / "diagnostic.tsv").write_text(
        "index\tsentence1\tsentence2\n"
        + "".join(f"{k}\t{p}\t{h}\n" for k, (p, h, _) in enumerate(_PAIRS + _PAIRS[:1]))
    )


@pytest.mark.backends("torch", reason=ONE_BACKEND)
def test_glue_mnli_predict_test_writes_what_the_model_predicts(preset, tmp_path):
    data, out, saved = tmp_path / "data", tmp_path / "out", tmp_path / "model"
    _write_mnli(data)
    argv = ["--task", "mnli", "--preset", str(preset), "--data-dir", str(data), "--epochs", "1"]
    argv += ["--batch-size", "16", "--max-length", "16", "--output-dir", str(out)]
    metrics = glue.main([*argv, "--predict-test", "--save-model", str(saved)])
    assert sorted(metrics) == ["accuracy_matched", "accuracy_mismatched"]
    record = _check_outputs(out, "accuracy_mismatched")
    assert record["dev_examples"] == {"dev_matched": 4, "dev_mismatched": 4}
    folder = out / "glue_submission"
    assert sorted(p.name for p in folder.iterdir()) == ["AX.tsv", "MNLI-m.tsv", "MNLI-mm.tsv"]
    model = BertClassifier.from_preset(saved)
    labels = ("contradiction", "entailment", "neutral")  # the MNLI model's class order
    for name, test_file in (
        ("MNLI-m.tsv", data / "glue" / "MNLI" / "test_matched.tsv"),
        ("MNLI-mm.tsv", data / "glue" / "MNLI" / "test_mismatched.tsv"),
        ("AX.tsv", data / "glue" / "diagnostic" / "diagnostic.tsv"),
    ):
        rows = [line.split("\t") for line in test_file.read_text().splitlines()[1:]]
        pairs = ([r[-2] for r in rows], [r[-1] for r in rows])
        if name == "AX.tsv":
            pairs = ([r[1] for r in rows], [r[2] for r in rows])
        predicted = np.asarray(model.predict(pairs, batch_size=64, verbose=0)).argmax(-1)
        expected = "".join(f"{r[0]}\t{labels[k]}\n" for r, k in zip(rows, predicted))
        assert (folder / name).read_text() == "index\tprediction\n" + expected, name


def _binary_scores(labels, predictions):
    """GLUE's accuracy and F1 of the positive class (1), as the official scorer (scikit-learn's
    `f1_score`, binary) computes them: F1 = 2 TP / (2 TP + FP + FN)."""
    labels, predictions = np.asarray(labels), np.asarray(predictions)
    tp = int(np.sum((predictions == 1) & (labels == 1)))
    fp = int(np.sum((predictions == 1) & (labels == 0)))
    fn = int(np.sum((predictions == 0) & (labels == 1)))
    return float(np.mean(predictions == labels)), 2 * tp / (2 * tp + fp + fn)


def _pair_rows(count, seed, flipped=()):
    """`(first, second, label)` rows a tiny model learns in a few steps: the label is 1 when the
    second sentence's words are among "good great fine", 0 when among "bad awful dull"; rows in
    `flipped` carry the other label (what the model gets wrong once it learned the rule)."""
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(count):
        label = k % 2
        first = " ".join(rng.choice(WORDS[8:], 3))
        second = " ".join(rng.choice(WORDS[1:4] if label else WORDS[4:7], 3))
        rows.append((first, second, 1 - label if k in flipped else label))
    return rows


@pytest.fixture
def kept_export(monkeypatch, tmp_path):
    """Makes the app's `--quantize onnx-int8 / openvino-int8` export (`kbert.serving.from_model`)
    stay in `tmp_path / "served"` (the app's call itself unchanged), for the test to load."""
    import kbert.serving

    from_model, kept = kbert.serving.from_model, tmp_path / "served"

    def keeping(model, runtime="onnx", directory=None, threads=None):
        assert directory is None  # the app's own call: a temporary export
        return from_model(model, runtime, directory=kept, threads=threads)

    monkeypatch.setattr(kbert.serving, "from_model", keeping)
    return kept


def _load_export(directory, runtime):
    """The app's export (kept by `kept_export`), checked to be `runtime`'s int8 graph."""
    import kbert.serving

    assert (directory / "kbert_serving.json").is_file(), "the app exported no serving directory"
    config = json.loads((directory / "kbert_serving.json").read_text())
    assert (config["format"], config["quantize"]) == (runtime, "int8"), config
    return kbert.serving.load(directory)


@pytest.mark.backends(
    "torch",
    reason="Application logic (QQP's F1, the ONNX int8 export's "
    "scores); the export traces on torch whatever the backend.",
)
def test_glue_qqp_reports_f1_and_the_onnx_int8_export_scores(preset, tmp_path, kept_export):
    """QQP: accuracy and F1 of the positive class, as GLUE's scorer computes them, of the saved
    model; `--quantize onnx-int8`: the same metrics of that model's ONNX int8 export; a train
    row with missing fields is skipped and said."""
    folder = tmp_path / "data" / "glue" / "QQP"
    folder.mkdir(parents=True)
    header = "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"

    def tsv(rows):
        return header + "".join(
            f"{k}\t{2 * k}\t{2 * k + 1}\t{a}\t{b}\t{y}\n" for k, (a, b, y) in enumerate(rows)
        )

    # Dev: 5 rows labelled against the rule, so that F1 (positive class) and accuracy differ.
    dev = _pair_rows(16, seed=1, flipped=(0, 1, 3, 5, 7))
    (folder / "train.tsv").write_text(tsv(_pair_rows(64, seed=0)) + "99\t1\t2\tmissing fields\n")
    (folder / "dev.tsv").write_text(tsv(dev))
    out, saved = tmp_path / "out", tmp_path / "model"
    argv = ["--task", "qqp", "--preset", str(preset), "--data-dir", str(tmp_path / "data")]
    argv += ["--epochs", "6", "--batch-size", "16", "--max-length", "16", "--learning-rate"]
    argv += ["5e-3", "--classifier-dropout", "0", "--output-dir", str(out)]
    metrics = glue.main([*argv, "--save-model", str(saved), "--quantize", "onnx-int8"])
    record = _check_outputs(out, "f1")
    assert record["train_examples"] == 64
    assert "qqp train: skipped 1 malformed rows (lines [66])." in record["note"]
    x, labels = ([a for a, _, _ in dev], [b for _, b, _ in dev]), [y for _, _, y in dev]
    logits = np.asarray(BertClassifier.from_preset(saved).predict(x, verbose=0))
    accuracy, f1 = _binary_scores(labels, logits.argmax(-1))
    assert accuracy != f1 and 0 < f1 < 1  # a report of one for the other would show
    served = np.asarray(_load_export(kept_export, "onnx").predict(x))
    # The export is the saved model's, quantized: near its logits, not equal (int8 weights and
    # activations quantized per call move this tiny model's logits by up to ~10 %).
    assert 1e-5 < np.abs(served - logits).max() < 0.25 * np.abs(logits).max()
    accuracy8, f1_8 = _binary_scores(labels, served.argmax(-1))
    assert metrics == {
        "accuracy": accuracy,
        "f1": f1,
        "accuracy_onnx-int8": accuracy8,
        "f1_onnx-int8": f1_8,
    }
    assert record["quantized"] == {"accuracy_onnx-int8": accuracy8, "f1_onnx-int8": f1_8}


@pytest.mark.backends(
    "torch",
    reason="Application logic (the split of dev without a train "
    "file, the OpenVINO int8 export's scores); the export traces on torch.",
)
def test_glue_without_train_file_splits_dev_and_scores_openvino_int8(preset, tmp_path, kept_export):
    """WNLI with a dev file alone: trained on a seeded 80 % of dev, scored (accuracy) on the
    other 20 %, as said in the output; `--quantize openvino-int8` scores the model's OpenVINO
    int8 export on those rows."""
    folder = tmp_path / "data" / "glue" / "WNLI"
    folder.mkdir(parents=True)
    rows = _pair_rows(80, seed=2, flipped=range(0, 80, 5))
    (folder / "dev.tsv").write_text(
        "index\tsentence1\tsentence2\tlabel\n"
        + "".join(f"{k}\t{a}\t{b}\t{y}\n" for k, (a, b, y) in enumerate(rows))
    )
    out, saved = tmp_path / "out", tmp_path / "model"
    argv = ["--task", "wnli", "--preset", str(preset), "--data-dir", str(tmp_path / "data")]
    argv += ["--epochs", "6", "--batch-size", "16", "--max-length", "16", "--learning-rate"]
    argv += ["5e-3", "--classifier-dropout", "0", "--output-dir", str(out), "--seed", "3"]
    metrics = glue.main([*argv, "--save-model", str(saved), "--quantize", "openvino-int8"])
    record = _check_outputs(out, "accuracy")
    note = "wnli: no train file; trained on a seeded 80% of dev (64 rows) and evaluated on the "
    assert record["note"] == note + "other 16 rows."
    assert record["train_examples"] == 64 and record["dev_examples"] == {"dev": 16}
    # The held-out rows: the last fifth of NumPy's permutation seeded with --seed.
    held_out = np.sort(np.random.default_rng(3).permutation(80)[64:])
    x = ([rows[k][0] for k in held_out], [rows[k][1] for k in held_out])
    labels = np.array([rows[k][2] for k in held_out])
    counts = np.bincount(labels, minlength=2)
    assert record["baseline"] == {"name": "majority class", "accuracy": counts.max() / 16}
    logits = np.asarray(BertClassifier.from_preset(saved).predict(x, verbose=0))
    served = np.asarray(_load_export(kept_export, "openvino").predict(x))
    # The saved model's export with int8 weights (activations float): near its logits.
    assert 1e-5 < np.abs(served - logits).max() < 0.05 * np.abs(logits).max()
    assert metrics == {
        "accuracy": float(np.mean(logits.argmax(-1) == labels)),
        "accuracy_openvino-int8": float(np.mean(served.argmax(-1) == labels)),
    }


@pytest.mark.backends("torch", reason="The reader and the split only; no model is built.")
def test_glue_without_train_file_notes_skipped_dev_rows_once(tmp_path):
    """QQP with dev.tsv alone: the dev row with missing fields is skipped and said once (the
    split's training rows are that same file), and the split covers the other rows."""
    folder = tmp_path / "glue" / "QQP"
    folder.mkdir(parents=True)
    rows = [f"{k}\t{k}\t{k}\tq {k}\tp {k}\t{k % 2}\n" for k in range(10)]
    rows.insert(3, "3b\t1\t2\tmissing fields\n")
    (folder / "dev.tsv").write_text(
        "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n" + "".join(rows)
    )
    with pytest.warns(UserWarning, match="skipped 1 malformed rows"):
        (train_x, train_y, devs, notes) = glue.load_splits("qqp", tmp_path, 0, None)
    assert notes == [
        "qqp: no train file; trained on a seeded 80% of dev (8 rows) and evaluated on the "
        "other 2 rows.",
        "qqp dev: skipped 1 malformed rows (lines [5]).",
    ]
    ((_, dev_x, dev_y, _),) = devs
    assert sorted(train_x[0] + dev_x[0]) == sorted(f"q {k}" for k in range(10))
    assert [int(x[2:]) % 2 for x in train_x[0]] == train_y.tolist()


@pytest.mark.backends("jax", reason=ONE_BACKEND)
def test_ner_runs_on_tiny_data(preset, tmp_path):
    _write_conll(tmp_path / "data")
    out, saved = tmp_path / "out", tmp_path / "model"
    argv = ["--preset", str(preset), "--data-dir", str(tmp_path / "data"), "--epochs", "1"]
    argv += ["--batch-size", "4", "--max-length", "16", "--output-dir", str(out)]
    metrics = ner.main([*argv, "--save-model", str(saved)])
    _check_outputs(out, "entity_f1")
    # The conlleval file holds the saved model's tags for every dev word, and the reported
    # scores are those of that file.
    dev = read_conll(tmp_path / "data" / "conll2003" / "eng.testa", to_iob2=True)
    predicted = BertTagger.from_preset(saved).predict_words([w for w, _ in dev], verbose=0)
    lines = [f"{w} {t} {g}" for (ws, ts), gs in zip(dev, predicted) for w, t, g in zip(ws, ts, gs)]
    written = (out / "eng.testa.predictions.txt").read_text().split("\n")
    assert [line for line in written if line] == lines and written.count("") == len(dev) + 1
    scores = entity_f1([t for _, t in dev], predicted, scheme="IOB2")
    assert metrics == {
        "entity_precision": scores["precision"],
        "entity_recall": scores["recall"],
        "entity_f1": scores["f1"],
    }
    with pytest.raises(SystemExit):
        ner.main([*argv, "--features", "last", "--save-model", str(saved)])


@pytest.mark.backends("torch", reason=ONE_BACKEND)
def test_ner_feature_based_last4_learns_the_tiny_data(tmp_path):
    """--features last4: the frozen 4-layer backbone's last four hidden states, concatenated,
    train a BiLSTM that tags the one training sentence (also the dev sentence) exactly."""
    from applications import feature_tagging

    assert tuple(feature_tagging.FEATURES) == ner.FEATURE_VARIANTS
    folder = tmp_path / "preset"
    backbone = BertBackbone(
        **tiny_backbone_kwargs(
            vocabulary_size=len(VOCABULARY), num_layers=4, hidden_dim=16, intermediate_dim=32
        )
    )
    backbone.save_to_preset(folder)
    BertTokenizer(VOCABULARY).save_to_preset(folder)
    weights = [np.array(w) for w in backbone.get_weights()]
    _write_conll(tmp_path / "data")
    out = tmp_path / "out"
    epochs, batch_size = 10, 8
    metrics = ner.main(
        ["--preset", str(folder), "--data-dir", str(tmp_path / "data"), "--features", "last4"]
        + ["--lstm-units", "16", "--lstm-learning-rate", "0.05", "--max-length", "16"]
        + ["--epochs", str(epochs), "--batch-size", str(batch_size), "--output-dir", str(out)]
    )
    record = _check_outputs(out, "entity_f1")
    assert record["features"] == "last4" and record["feature_layers"] == [1, 2, 3, 4]
    assert record["feature_row"] == "Concat Last Four Hidden"
    assert record["train_steps"] == epochs * (8 // batch_size)  # eight training sentences
    assert record["metrics"] == metrics and record["evaluations"][-1]["entity_f1"] == 1.0
    assert {k: v["f1"] for k, v in record["per_type"].items()} == {"PER": 1, "ORG": 1, "LOC": 1}
    assert record["step_loss"][-1] < record["step_loss"][0] / 3
    # The preset on disk is unchanged: the backbone stayed frozen (it is only read).
    restored = BertBackbone.from_preset(folder)
    for before, after in zip(weights, restored.get_weights()):
        np.testing.assert_array_equal(before, after)


def test_feature_variants_are_table_7_rows():
    from applications.feature_tagging import FEATURES, feature_layers

    assert {name: feature_layers(name, 12) for name in FEATURES} == {
        "embeddings": [0],
        "second-to-last": [11],
        "last": [12],
        "sum-last4": [9, 10, 11, 12],
        "last4": [9, 10, 11, 12],
        "weighted": list(range(1, 13)),  # "Weighted Sum All 12 Layers"
    }
    assert FEATURES["weighted"][0] == "Weighted Sum All Layers"


def test_word_features_are_each_words_first_piece_and_scalar_mix_weights():
    """`word_features` holds, for every word, the chosen hidden states at its first piece;
    `ScalarMix` sums layers with softmax weights times gamma."""
    from applications.feature_tagging import ScalarMix, word_features
    from kbert.data.tagging import encode_tagging

    tokenizer = BertTokenizer(VOCABULARY + ["##s"])
    sentences = [["cats", "sat", "on", "mats"], ["john", "ran"]]  # cat ##s, mat ##s
    encoded = encode_tagging(sentences, tokenizer, sequence_length=12)
    backbone = BertBackbone(
        **tiny_backbone_kwargs(vocabulary_size=len(VOCABULARY) + 1, output_hidden_states=True)
    )
    features = word_features(backbone, encoded, layers=[2, 0], batch_size=1)
    hidden = backbone.predict_on_batch(encoded.inputs)["hidden_states"]
    first_pieces = [[1, 3, 4, 5], [1, 2]]  # [CLS] cat ##s sat on mat ##s [SEP]
    for row, positions in enumerate(first_pieces):
        assert features[row].shape == (len(positions), 2, 32)
        for word, position in enumerate(positions):
            np.testing.assert_allclose(features[row][word, 0], hidden[2][row, position], atol=1e-5)
            np.testing.assert_allclose(features[row][word, 1], hidden[0][row, position], atol=1e-5)

    mix = ScalarMix(3)
    x = np.arange(24, dtype="float32").reshape(1, 2, 3, 4)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(mix(x)), x.mean(axis=2), atol=1e-5)
    mix.set_weights([np.log(np.array([1.0, 2.0, 1.0], "float32")), np.array(2.0, "float32")])
    expected = 2.0 * (0.25 * x[:, :, 0] + 0.5 * x[:, :, 1] + 0.25 * x[:, :, 2])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(mix(x)), expected, atol=1e-4)


@pytest.mark.backends("tensorflow", reason=ONE_BACKEND)
def test_lstm_tagger_dropout_acts_in_training_only():
    """`--lstm-dropout`: dropout before each BiLSTM layer and before the tag layer; inference
    is deterministic and padded words stay masked; 0 builds the tagger without dropout."""
    from applications.feature_tagging import build_lstm_tagger

    plain = build_lstm_tagger("last4", 4, 8, 5, units=6)
    assert not [layer for layer in plain.layers if isinstance(layer, keras.layers.Dropout)]
    model = build_lstm_tagger("last4", 4, 8, 5, units=6, dropout=0.5)
    names = [layer.name for layer in model.layers if isinstance(layer, keras.layers.Dropout)]
    assert names == ["dropout_0", "dropout_1", "dropout_2"]
    inputs = {
        "features": np.random.default_rng(0).normal(size=(2, 8, 4, 8)).astype("float32"),
        "word_mask": np.arange(8)[None, :] < np.array([[8], [3]]),
    }
    first = keras.ops.convert_to_numpy(model(inputs, training=False))
    np.testing.assert_allclose(first, keras.ops.convert_to_numpy(model(inputs)), atol=1e-6)
    assert not np.allclose(first, keras.ops.convert_to_numpy(model(inputs, training=True)))
    # Padded words do not change the real words' logits.
    changed = {**inputs, "features": inputs["features"].copy()}
    changed["features"][1, 3:] = 100.0
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(model(changed))[1, :3], first[1, :3], atol=1e-5
    )


def test_ner_features_need_enough_layers(preset, tmp_path, capsys):
    _write_conll(tmp_path / "data")
    with pytest.raises(SystemExit):
        ner.main(
            ["--preset", str(preset), "--data-dir", str(tmp_path / "data"), "--features", "last4"]
        )
    expected = (
        "--features last4 needs a backbone with at least 4 transformer layers. Received a "
        "backbone with num_layers=1."
    )
    assert expected in capsys.readouterr().err


@pytest.mark.backends("torch", reason=ONE_BACKEND)
def test_squad_runs_on_tiny_data(preset, tmp_path):
    _write_squad(tmp_path / "data")
    out, saved = tmp_path / "out", tmp_path / "model"
    metrics = squad.main(
        [
            "--preset",
            str(preset),
            "--data-dir",
            str(tmp_path / "data"),
            "--epochs",
            "1",
            "--batch-size",
            "4",
            "--max-length",
            "32",
            "--doc-stride",
            "8",
            "--max-query-length",
            "12",
            "--train-articles",
            "0:2",
            "--eval-articles",
            "2:3",
            "--output-dir",
            str(out),
            "--save-model",
            str(saved),
        ]
    )
    _check_outputs(out, "f1")
    # predictions.json holds the saved model's answers to the evaluated questions, and the
    # reported scores are the official ones of that file.
    predictions = json.loads((out / "predictions.json").read_text())
    evaluation = read_squad(tmp_path / "data" / "squad" / "dev-v1.1.json").articles(2, 3)
    questions = list(evaluation)
    assert sorted(predictions) == sorted(q["id"] for q in questions)
    assert predictions == BertQuestionAnswerer.from_preset(saved).predict_answers(questions)
    data = evaluation.data
    scores = squad_scores(predictions, data, version="1.1")
    assert metrics == {k: float(v) for k, v in scores.items() if isinstance(v, (int, float))}


def _run(script, *args, env_extra=None, cwd=None):
    """Runs `python applications/<script> ...` in a fresh process, from `cwd` (another folder
    than the repository's by default). PYTHONPATH points at this checkout's kbert only: the
    script finds its sibling `common.py` by itself."""
    env = {k: v for k, v in os.environ.items() if k != "KBERT_DATA_DIR"}
    env["PYTHONPATH"] = str(REPO)
    env.update(env_extra or {})
    start = time.time()
    result = subprocess.run(
        [sys.executable, str(REPO / "applications" / script), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=cwd or REPO / "tests",
    )
    return result, time.time() - start


@pytest.mark.backend_independent  # Argument checks before Keras is imported.
def test_mistakes_fail_at_once_in_one_line(preset, tmp_path):
    _write_glue(tmp_path / "data")
    (tmp_path / "no_vocab").mkdir()
    (tmp_path / "no_vocab" / "model.weights.h5").write_bytes(b"")
    (tmp_path / "no_weights").mkdir()
    (tmp_path / "no_weights" / "vocab.txt").write_text("[PAD]\n")
    data = ["--data-dir", str(tmp_path / "data")]
    cases = [
        (("glue.py", "--task", "sst2", "--preset", str(preset)), "KBERT_DATA_DIR"),
        (
            (
                "glue.py",
                "--task",
                "sst2",
                "--preset",
                str(preset),
                "--data-dir",
                str(tmp_path / "nowhere"),
            ),
            "does not exist",
        ),
        (("glue.py", "--task", "cola", "--preset", str(preset), *data), "CoLA/dev.tsv"),
        (
            ("glue.py", "--task", "sst2", "--preset", "bert_tiny_en_uncased", *data),
            "without weights",
        ),
        (
            ("glue.py", "--task", "sst2", "--preset", str(tmp_path / "missing"), *data),
            "no such directory",
        ),
        (
            ("glue.py", "--task", "sst2", "--preset", str(tmp_path / "no_vocab"), *data),
            "no vocabulary",
        ),
        (
            ("glue.py", "--task", "sst2", "--preset", str(tmp_path / "no_weights"), *data),
            "no weights",
        ),
        (("glue.py", "--task", "mnli", "--preset", str(preset), *data), "MNLI/dev_matched.tsv"),
        (
            ("glue.py", "--task", "sst2", "--preset", str(preset), *data, "--predict-test"),
            f"--predict-test: no {tmp_path / 'data' / 'glue' / 'SST-2' / 'test.tsv'} (nor ",
        ),
        (("ner.py", "--preset", str(preset), *data), "conll2003/eng.train"),
        (("squad.py", "--preset", str(preset), *data), "squad/dev-v1.1.json"),
    ]
    # A test-only sitecustomize records which frameworks the process had imported at its exit.
    hooks, record = tmp_path / "hooks", tmp_path / "imported.txt"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(
        "import atexit, os, sys\n"
        "def _report():\n"
        "    with open(os.environ['KBERT_TEST_IMPORTS'], 'w') as f:\n"
        "        f.write(' '.join(m for m in ('keras', 'tensorflow', 'jax', 'torch')\n"
        "                         if m in sys.modules))\n"
        "atexit.register(_report)\n"
    )
    env = {
        "KBERT_PRESETS_DIR": str(tmp_path / "presets"),
        "PYTHONPATH": os.pathsep.join([str(hooks), str(REPO)]),
        "KBERT_TEST_IMPORTS": str(record),
    }
    for args, message in cases:
        record.unlink(missing_ok=True)
        result, _ = _run(*args, env_extra=env)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2, (args, result.stderr)
        assert len(lines) == 1 and message in lines[0], (args, result.stderr)
        assert "Traceback" not in result.stderr
        # The check ran before any framework was imported (the seconds that would cost).
        assert record.read_text() == "", (args, record.read_text())


@pytest.mark.backend_independent  # The reader's error, before any model is built.
def test_malformed_tsv_row_fails_in_one_line(preset, tmp_path):
    _write_glue(tmp_path / "data")
    dev = tmp_path / "data" / "glue" / "SST-2" / "dev.tsv"
    dev.write_text(dev.read_text() + "a broken row\t1\textra column\n")
    data = str(tmp_path / "data")
    result, _ = _run("glue.py", "--task", "sst2", "--preset", str(preset), "--data-dir", data)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "dev.tsv:8: expected 2 tab-separated columns, found 3" in lines[-1], result.stderr


@pytest.mark.backend_independent  # Paths only: the app's checks match the library's reader.
def test_glue_app_checks_the_files_the_readers_read(tmp_path):
    from kbert.data import glue_file_candidates, glue_submission_splits

    for task in glue.TASKS:
        splits = glue_submission_splits(task)
        read = [glue_file_candidates(name, split, tmp_path)[1] for name, split in splits]
        checked = [str(tmp_path / "glue" / relative) for relative in glue.test_files(task)]
        assert [os.path.normpath(p) for p in read] == [os.path.normpath(p) for p in checked]
        dev = [glue_file_candidates(task, split, tmp_path)[1] for split, _ in glue.dev_splits(task)]
        folder = glue.GLUE_FOLDERS[task]
        assert dev == [
            str(tmp_path / "glue" / folder / f"{s}.tsv") for s, _ in glue.dev_splits(task)
        ]


@pytest.mark.backend_independent
def test_help_states_the_recipes():
    for script, recipe in (
        ("glue.py", "--max-train-examples 8000 --max-length 64 --epochs 1 --learning-rate 5e-5"),
        ("ner.py", "--max-train-examples 2000 --epochs 1 --batch-size 16 --learning-rate 1e-4"),
        ("squad.py", "--max-train-examples 1500 --epochs 1 --max-length 256"),
        ("demo.py", "recipe of the README"),
    ):
        result, _ = _run(script, "--help")
        assert result.returncode == 0 and recipe in " ".join(result.stdout.split()), (
            script,
            result.stdout,
        )
        assert "$KBERT_DATA_DIR" in result.stdout or script == "demo.py"


def test_startup_notices_are_dropped_and_errors_kept():
    spec_path = REPO / "kbert" / "startup.py"
    code = (
        "import importlib.util, os\n"
        f"spec = importlib.util.spec_from_file_location('s', {str(spec_path)!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "with m.quiet_native_startup():\n"
        "    os.write(2, b'E0000 00:00 1 cuda_executor.cc:1 failed call to cuInit: "
        "INTERNAL: CUDA error (303)\\n')\n"
        "    os.write(2, b'I0000 port.cc:153] oneDNN custom operations are on.\\n')\n"
        "    os.write(2, b'E0000 something real went wrong\\n')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0
    assert result.stderr == "E0000 something real went wrong\n"
