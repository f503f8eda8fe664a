"""applications/pretrain.py: raw text -> kbert preset, metrics, resume after an interruption."""

import json
import math
import random

import h5py
import keras
import numpy as np
import pytest

from applications import pretrain
from kbert.models import BertBackbone, BertClassifier, BertPretrainer
from kbert.text import BertTokenizer
from tests.applications import ONE_BACKEND

WORDS = (
    "the a cat dog bird fish sat ran flew swam on under over near mat rug house tree river "
    "big small red blue quick slow old new"
).split()
STEPS_PER_EPOCH = 3


def write_text(path, num_documents=40, seed=0):
    """A few KB of made-up text: one sentence per line, blank lines between documents."""
    rng = random.Random(seed)
    documents = []
    for _ in range(num_documents):
        sentences = [
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 9))) + " ."
            for _ in range(rng.randint(3, 6))
        ]
        documents.append("\n".join(sentences))
    path.write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A tiny preset directory (2 layers, hidden 32, dropout on) and a text file."""
    folder = tmp_path_factory.mktemp("inputs")
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "."] + WORDS
    keras.utils.set_random_seed(0)
    backbone = BertBackbone(
        vocabulary_size=len(vocabulary),
        num_layers=2,
        num_heads=2,
        hidden_dim=32,
        intermediate_dim=64,
        max_sequence_length=64,
        dropout=0.1,
        attention_dropout=0.1,
    )
    preset = folder / "tiny_preset"
    backbone.save_to_preset(preset)
    BertTokenizer(vocabulary).save_to_preset(preset)
    return {"preset": preset, "text": write_text(folder / "corpus.txt")}


def argv(inputs, output_dir, *extra):
    return [
        "--preset", str(inputs["preset"]),
        "--train-files", str(inputs["text"]),
        "--sequence-length", "32",
        "--max-predictions", "5",
        "--batch-size", "4",
        "--epochs", "2",
        "--steps-per-epoch", str(STEPS_PER_EPOCH),
        "--warmup-steps", "1",
        "--output-dir", str(output_dir),
        *extra,
    ]  # fmt: skip


class Capture(keras.callbacks.Callback):
    """Keeps the trained model and counts the steps run in this process."""

    def __init__(self):
        super().__init__()
        self.trained = None
        self.steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1

    def on_train_end(self, logs=None):
        self.trained = self.model


class Interrupt(Exception):
    pass


class InterruptAt(keras.callbacks.Callback):
    """Raises (like a crash, or a Ctrl-C) at the start of an epoch or after a global step."""

    def __init__(self, epoch=None, step=None, error=Interrupt):
        super().__init__()
        self.epoch, self.step, self.steps, self.error = epoch, step, 0, error

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            raise self.error(f"interrupted before epoch {epoch + 1}")

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if self.steps == self.step:
            raise self.error(f"interrupted after step {self.step}")


def preset_weights(preset_dir):
    """Every array in the preset's weight files, by file and path."""
    arrays = {}
    for name in ("model.weights.h5", "task.weights.h5"):

        def collect(key, item, name=name):
            if isinstance(item, h5py.Dataset):
                arrays[f"{name}/{key}"] = item[()]

        with h5py.File(preset_dir / name, "r") as f:
            f.visititems(collect)
    return arrays


def assert_same_weights(preset_a, preset_b):
    a, b = preset_weights(preset_a), preset_weights(preset_b)
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def fixed_inputs(vocabulary_size, batch_size=2, sequence_length=16):
    rng = np.random.default_rng(1)
    x = {
        "token_ids": rng.integers(5, vocabulary_size, (batch_size, sequence_length)).astype(
            "int32"
        ),
        "segment_ids": np.zeros((batch_size, sequence_length), "int32"),
        "padding_mask": np.ones((batch_size, sequence_length), "int32"),
    }
    x["segment_ids"][:, 8:] = 1
    x["padding_mask"][1, 12:] = 0
    return x


@pytest.fixture(scope="module")
def continuous(inputs, tmp_path_factory):
    """One uninterrupted run: 2 epochs of 3 steps."""
    output_dir = tmp_path_factory.mktemp("continuous")
    capture = Capture()
    metrics = pretrain.main(argv(inputs, output_dir), callbacks=[capture])
    return {"dir": output_dir, "model": capture.trained, "steps": capture.steps, "metrics": metrics}


def test_writes_a_loadable_preset_and_metrics(continuous):
    output_dir, trained = continuous["dir"], continuous["model"]
    assert continuous["steps"] == 2 * STEPS_PER_EPOCH
    preset = output_dir / "preset"
    assert not (output_dir / "backup").exists()
    assert not list(output_dir.glob(".preset-*"))

    x = fixed_inputs(trained.backbone.vocabulary_size)
    expected = keras.ops.convert_to_numpy(trained.backbone(x)["sequence_output"])
    backbone = BertBackbone.from_preset(preset)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(backbone(x)["sequence_output"]), expected
    )
    classifier = BertClassifier.from_preset(preset, num_classes=2, sequence_length=32)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(classifier.backbone(x)["sequence_output"]), expected
    )
    assert classifier.predict(["the cat sat on the mat ."], verbose=0).shape == (1, 2)
    # The MLM and NSP heads are in the preset too (continued pretraining starts from them).
    x["mask_positions"] = np.array([[1, 2, 3], [4, 5, 6]], "int32")
    reloaded = BertPretrainer.from_preset(preset)(x)
    original = trained(x)
    for head in ("mlm", "nsp"):
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(reloaded[head]), keras.ops.convert_to_numpy(original[head])
        )

    record = json.loads((output_dir / "metrics.json").read_text())
    assert record["application"] == "pretrain"
    assert set(record["metrics"]) == {
        "mlm_accuracy",
        "mlm_loss",
        "nsp_accuracy",
        "nsp_loss",
        "loss",
    }
    assert all(math.isfinite(v) for v in record["metrics"].values())
    assert record["metrics"] == continuous["metrics"]
    assert record["train_steps"] == record["total_steps"] == 2 * STEPS_PER_EPOCH
    assert len(record["step_loss"]) == 2 * STEPS_PER_EPOCH and len(record["epochs"]) == 2
    # One evaluation per epoch end: the training batches' metrics (there is no dev set), the
    # last one the final metrics.
    steps = [e.pop("step") for e in record["evaluations"]]
    assert steps == [STEPS_PER_EPOCH, 2 * STEPS_PER_EPOCH]
    assert record["evaluations"][-1] == record["metrics"]
    assert record["evaluations"][0]["mlm_accuracy"] == record["epochs"][0]["mlm_accuracy"]
    assert record["resumed_from_step"] == 0
    assert math.isfinite(record["train_seconds"]) and record["train_seconds"] > 0
    assert (output_dir / "training_curve.png").stat().st_size > 0


def test_an_existing_preset_is_not_overwritten(continuous, inputs):
    before = preset_weights(continuous["dir"] / "preset")
    with pytest.raises(SystemExit, match="already exists.*--overwrite"):
        pretrain.main(argv(inputs, continuous["dir"]))
    after = preset_weights(continuous["dir"] / "preset")
    assert sorted(before) == sorted(after)
    assert all(np.array_equal(before[k], after[k]) for k in before)


@pytest.mark.backends("torch", reason=ONE_BACKEND)
def test_resume_after_an_interruption_between_epochs(continuous, inputs, tmp_path, capsys):
    with pytest.raises(Interrupt):
        pretrain.main(argv(inputs, tmp_path), callbacks=[InterruptAt(epoch=1)])
    assert (tmp_path / "backup" / "training_state.npz").is_file()
    assert not (tmp_path / "preset").exists()
    capsys.readouterr()

    capture = Capture()
    pretrain.main(argv(inputs, tmp_path), callbacks=[capture])
    out = capsys.readouterr().out
    assert f"{STEPS_PER_EPOCH} of {2 * STEPS_PER_EPOCH} steps done; continuing at epoch 2." in out
    assert capture.steps == STEPS_PER_EPOCH  # Epoch 1 is not trained again.
    record = json.loads((tmp_path / "metrics.json").read_text())
    reference = json.loads((continuous["dir"] / "metrics.json").read_text())
    assert record["resumed_from_step"] == STEPS_PER_EPOCH
    # Same batches, same dropout masks, same optimizer state: the same numbers exactly.
    assert record["step_loss"] == reference["step_loss"]
    assert record["metrics"] == reference["metrics"]
    assert record["evaluations"] == reference["evaluations"]  # Epochs before the resume too.
    assert_same_weights(tmp_path / "preset", continuous["dir"] / "preset")
    assert not (tmp_path / "backup").exists()


@pytest.mark.backends("torch", reason=ONE_BACKEND)
def test_resume_mid_epoch_and_overwrite(continuous, inputs, tmp_path, capsys):
    (tmp_path / "preset").mkdir()
    (tmp_path / "preset" / "old.txt").write_text("an earlier preset")
    extra = ("--backup-every", "2", "--overwrite")
    with pytest.raises(Interrupt):  # After step 5; the last backup is step 4 (epoch 2, step 1).
        pretrain.main(argv(inputs, tmp_path, *extra), callbacks=[InterruptAt(step=5)])
    assert (tmp_path / "preset" / "old.txt").exists()
    capsys.readouterr()

    capture = Capture()
    pretrain.main(argv(inputs, tmp_path, *extra), callbacks=[capture])
    assert "4 of 6 steps done; continuing at epoch 2, step 2." in capsys.readouterr().out
    assert capture.steps == 2
    assert_same_weights(tmp_path / "preset", continuous["dir"] / "preset")
    record = json.loads((tmp_path / "metrics.json").read_text())
    reference = json.loads((continuous["dir"] / "metrics.json").read_text())
    # Per-step losses are recovered from Keras' running means over the epoch: equal up to
    # float32 rounding. The epoch logs cover the whole interrupted epoch (its metric sums were
    # backed up), so they equal the uninterrupted run's.
    np.testing.assert_allclose(record["step_loss"], reference["step_loss"], rtol=1e-5)
    assert len(record["epochs"]) == 2
    assert record["epochs"] == reference["epochs"]
    assert record["metrics"] == reference["metrics"]
    assert not (tmp_path / "preset" / "old.txt").exists()


@pytest.mark.backends("torch", reason=ONE_BACKEND)
def test_ctrl_c_names_the_backup_and_other_settings_are_not_resumed(inputs, tmp_path):
    ctrl_c = InterruptAt(epoch=1, error=KeyboardInterrupt)
    with pytest.raises(
        SystemExit, match=r"Interrupted at step 3\. The last backup \(step 3\) is in"
    ):
        pretrain.main(argv(inputs, tmp_path), callbacks=[ctrl_c])
    with pytest.raises(
        SystemExit, match=r"other settings: learning_rate: 0.001 in the backup, 0.002 now"
    ):
        pretrain.main(argv(inputs, tmp_path, "--learning-rate", "2e-3"))


# What the app does with a preset name and no --vocab (its own vocabulary, its report) does not
# depend on the backend; every backend's training and presets are tested above: once.
@pytest.mark.backend_independent
def test_a_preset_name_trains_a_vocabulary(tmp_path, capsys):
    text = write_text(tmp_path / "corpus.txt", num_documents=30)
    pretrain.main([
        "--preset", "bert_tiny_en_uncased",
        "--data-dir", str(tmp_path),
        "--sequence-length", "32",
        "--max-predictions", "5",
        "--batch-size", "16",
        "--epochs", "1",
        "--vocab-size", "200",
        "--output-dir", str(tmp_path / "run"),
    ])  # fmt: skip
    out = capsys.readouterr().out
    assert "Model: the bert_tiny_en_uncased architecture with fresh weights" in out
    assert "Vocabulary:" in out and "trained on the input text" in out
    preset = tmp_path / "run" / "preset"
    tokenizer = BertTokenizer.from_preset(preset)
    assert len(tokenizer.vocabulary) <= 200
    assert tokenizer("the cat sat .") == tokenizer("The CAT sat .")  # Uncased, as the preset.
    assert BertBackbone.from_preset(preset).vocabulary_size == len(tokenizer.vocabulary)
    record = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert record["steps_per_epoch"] >= 1  # One pass over the text, counted.
    assert record["text_files"] == [str(text)]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"--train-files": "missing.txt"}, r"--train-files: \S*missing.txt does not exist"),
        ({"--train-files": "empty.txt"}, "hold no text"),
        ({"--train-files": "*.none"}, "no file matches the pattern"),
        ({"--preset": "bert_gigantic"}, "'bert_gigantic' is neither a known preset name nor a"),
        ({"--sequence-length": "128"}, "--sequence-length 128 exceeds the max_sequence_length 64"),
        ({"--preset": "bert_tiny_en_uncased", "--sequence-length": "600"}, "Expected at most 512"),
    ],
)
def test_bad_inputs_give_clear_errors(inputs, tmp_path, change, message):
    (tmp_path / "empty.txt").write_text("\n \n")
    args = argv(inputs, tmp_path / "run")
    for flag, value in change.items():
        if flag == "--train-files":
            value = str(tmp_path / value)
        args[args.index(flag) + 1] = value
    with pytest.raises(SystemExit, match=message):
        pretrain.main(args)
    assert not (tmp_path / "run" / "preset").exists()


def test_a_folder_without_text_files(tmp_path):
    (tmp_path / "notes.md").write_text("not a corpus")
    with pytest.raises(SystemExit, match=r"holds no text files \(\*\.txt, \*\.raw\)"):
        pretrain.main(["--data-dir", str(tmp_path), "--output-dir", str(tmp_path / "run")])


@pytest.mark.backends("torch", reason=ONE_BACKEND)
def test_two_phase_recipe_resumes_across_the_phase_boundary(inputs, tmp_path, capsys):
    # Epoch 1 at 32 tokens, epoch 2 at 64 tokens (the paper: 90 % at 128, then 512).
    extra = (
        "--phase2-sequence-length",
        "64",
        "--phase2-epochs",
        "1",
        "--phase2-max-predictions",
        "9",
    )
    capture = Capture()
    pretrain.main(argv(inputs, tmp_path / "a", *extra), callbacks=[capture])
    out = capsys.readouterr().out
    assert "Two phases: epochs 1-1 at 32 tokens, epochs 2-2 at 64 tokens" in out
    assert capture.steps == 2 * STEPS_PER_EPOCH
    # Interrupted in phase 2 (after step 5, backup at step 4), resumed: the same weights.
    with pytest.raises(Interrupt):
        pretrain.main(
            argv(inputs, tmp_path / "b", *extra, "--backup-every", "2"),
            callbacks=[InterruptAt(step=5)],
        )
    resumed = Capture()
    pretrain.main(argv(inputs, tmp_path / "b", *extra, "--backup-every", "2"), callbacks=[resumed])
    assert resumed.steps == 2
    assert_same_weights(tmp_path / "b" / "preset", tmp_path / "a" / "preset")
    record = json.loads((tmp_path / "a" / "metrics.json").read_text())
    assert len(record["epochs"]) == 2 and len(record["step_loss"]) == 2 * STEPS_PER_EPOCH
    with pytest.raises(SystemExit, match="--phase2-sequence-length 128 exceeds"):
        pretrain.main(argv(inputs, tmp_path / "c", "--phase2-sequence-length", "128"))


# The app's vocabulary trainer is backend-independent; that each backend's training repeats
# itself exactly is what the resume tests above compare (a resumed run against an uninterrupted
# one, to the bit): once.
@pytest.mark.backend_independent
def test_default_vocabulary_runs_are_reproducible(tmp_path, capsys):
    # No --vocab: the vocabulary is trained on the text. Two runs with the same seed give the
    # same vocabulary and the same weights (HF's trainer used to differ from run to run).
    write_text(tmp_path / "corpus.txt", num_documents=30, seed=3)
    runs = []
    for name in ("one", "two"):
        pretrain.main([
            "--preset", "bert_tiny_en_uncased", "--data-dir", str(tmp_path),
            "--sequence-length", "32", "--max-predictions", "5", "--batch-size", "8",
            "--epochs", "1", "--steps-per-epoch", "2", "--vocab-size", "150", "--seed", "5",
            "--output-dir", str(tmp_path / name),
        ])  # fmt: skip
        runs.append(tmp_path / name / "preset")
    capsys.readouterr()
    vocabularies = [(run / "vocab.txt").read_text(encoding="utf-8") for run in runs]
    assert vocabularies[0] == vocabularies[1] and len(vocabularies[0].split()) > 50
    assert_same_weights(runs[0], runs[1])


@pytest.mark.backends("torch", reason=ONE_BACKEND)
def test_pack_trains_the_masked_lm_on_packed_rows(inputs, tmp_path, capsys):
    # --pack: MLM only, several documents per row (the 40 documents of ~30 tokens fill rows of
    # 64 two at a time), in both phases; the preset is an ordinary one with an MLM head.
    extra = (
        "--pack",
        "--phase2-sequence-length",
        "64",
        "--phase2-epochs",
        "1",
        "--phase2-max-predictions",
        "9",
    )
    capture = Capture()
    metrics = pretrain.main(argv(inputs, tmp_path / "run", *extra), callbacks=[capture])
    out = capsys.readouterr().out
    assert "masked LM only, on packed rows (--pack)" in out
    assert capture.steps == 2 * STEPS_PER_EPOCH
    trained = capture.trained
    assert trained.backbone.packed and not trained.next_sentence
    assert set(metrics) >= {"mlm_accuracy", "mlm_loss", "loss"} and "nsp_loss" not in metrics
    assert np.isfinite(list(metrics.values())).all()
    loaded = BertPretrainer.from_preset(tmp_path / "run" / "preset", next_sentence=False)
    assert not loaded.backbone.packed
    # The preset holds the trained weights: the packed model on one document per row (document
    # ids = padding mask) equals the loaded, unpacked one.
    x = fixed_inputs(loaded.backbone.vocabulary_size)
    x["segment_ids"][:] = 0
    x["mask_positions"] = np.array([[1, 2], [3, 4]], "int32")
    packed_x = dict(x, document_ids=x["padding_mask"])
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(loaded(x)["mlm"]),
        keras.ops.convert_to_numpy(trained(packed_x)["mlm"]),
        atol=1e-4,
    )
