"""kbert.callbacks: exact resume after `kill -9`, settings checks, a full disk during a backup."""

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

from kbert.callbacks import BatchStream, TrainingBackup, resumable_fit

EPOCHS, STEPS_PER_EPOCH = 3, 7

# A tiny model with dropout trained on a stream whose passes (5 batches each) depend only on
# their index; epochs (7 steps) cross pass boundaries. One thread everywhere: `_run` sets the
# thread counts in the child's environment (torch, too, starts with OMP_NUM_THREADS threads).
TRAINING = (
    textwrap.dedent(
        """
    import json, os, sys, time
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np
    from kbert.callbacks import BatchStream, TrainingBackup, resumable_fit

    backup_dir, out, delay = sys.argv[1], sys.argv[2], float(sys.argv[3])
    learning_rate = float(sys.argv[4]) if len(sys.argv) > 4 else 0.01

    class Passes:
        def __init__(self):
            self.passes = 0

        def __iter__(self):
            rng = np.random.default_rng(self.passes)
            self.passes += 1
            for _ in range(5):
                x = rng.normal(size=(8, 6)).astype("float32")
                yield x, (x.sum(axis=1) > 0).astype("int32")

    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((6,)),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dropout(0.3),
        keras.layers.Dense(2),
    ])
    model.compile(
        optimizer=keras.optimizers.AdamW(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )

    class Progress(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            print("step", flush=True)
            time.sleep(delay)

    backup = TrainingBackup(backup_dir, save_every=1, settings={"learning_rate": learning_rate})
    try:
        if backup.exists():
            print("resuming at", backup.read_metadata()["global_step"], flush=True)
        resumable_fit(model, BatchStream(Passes()), EPOCHS, STEPS_PER_EPOCH, backup,
                      callbacks=[Progress()], verbose=0)
    except ValueError as error:
        sys.exit(f"error: {error}")
    np.savez(out, *model.get_weights())
    with open(out + ".json", "w") as f:
        json.dump({"epochs": backup.epochs, "step_loss": backup.step_loss}, f)
    """
    )
    .replace("EPOCHS", str(EPOCHS))
    .replace("STEPS_PER_EPOCH", str(STEPS_PER_EPOCH))
)


def _run(script, *args, kill_after_steps=None):
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        TF_NUM_INTRAOP_THREADS="1",
        TF_NUM_INTEROP_THREADS="1",
        # One XLA thread, added to the flags the caller set (the test legs' faster compiles).
        XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} --xla_cpu_multi_thread_eigen=false".strip(),
    )
    process = subprocess.Popen(
        [sys.executable, str(script), *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    if kill_after_steps is None:
        out, err = process.communicate(timeout=600)
        return process.returncode, out, err
    steps = 0
    for line in process.stdout:
        steps += line.startswith("step")
        if steps >= kill_after_steps:
            process.send_signal(signal.SIGKILL)
            break
    process.wait(timeout=60)
    process.stdout.close()
    process.stderr.close()
    return process.returncode, "", ""


def test_resume_after_kill_9_equals_an_uninterrupted_run(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAINING)
    code, _, err = _run(script, tmp_path / "a", tmp_path / "a_out.npz", 0)
    assert code == 0, err
    # Killed mid-epoch (step 10 of 21, in epoch 2), while it backs up after every step.
    code, _, _ = _run(script, tmp_path / "b", tmp_path / "b_out.npz", 0.05, kill_after_steps=10)
    assert code == -signal.SIGKILL
    assert not (tmp_path / "b_out.npz").exists()
    step = TrainingBackup(tmp_path / "b").read_metadata()["global_step"]
    assert 10 <= step < EPOCHS * STEPS_PER_EPOCH
    code, out, err = _run(script, tmp_path / "b", tmp_path / "b_out.npz", 0)
    assert code == 0, err
    assert f"resuming at {step}" in out
    with np.load(tmp_path / "a_out.npz") as a, np.load(tmp_path / "b_out.npz") as b:
        assert len(a.files) == 4
        for key in a.files:
            assert np.max(np.abs(a[key] - b[key])) == 0, key
    first = json.loads((tmp_path / "a_out.npz.json").read_text())
    resumed = json.loads((tmp_path / "b_out.npz.json").read_text())
    # Every epoch's logs cover the whole epoch, the interrupted one included.
    assert len(resumed["epochs"]) == EPOCHS and resumed["epochs"] == first["epochs"]
    assert len(resumed["step_loss"]) == EPOCHS * STEPS_PER_EPOCH
    np.testing.assert_allclose(resumed["step_loss"], first["step_loss"], rtol=1e-5, atol=1e-6)


class _Passes:
    def __init__(self):
        self.passes = 0

    def __iter__(self):
        rng = np.random.default_rng(self.passes)
        self.passes += 1
        for _ in range(3):
            x = rng.normal(size=(4, 3)).astype("float32")
            yield x, x.sum(axis=1, keepdims=True)


def _model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


def test_a_full_disk_during_a_backup_keeps_the_last_good_one(tmp_path, monkeypatch):
    backup = TrainingBackup(tmp_path / "backup", save_every=2)
    real_savez = np.savez
    calls = []

    def savez(file, **arrays):
        calls.append(1)
        if len(calls) == 3:  # The third backup (step 5, epoch end) finds the disk full.
            file.write(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_savez(file, **arrays)

    monkeypatch.setattr(np, "savez", savez)
    model = _model()
    with pytest.raises(OSError, match="No space left .* step 5.*last good backup \\(step 4\\)"):
        resumable_fit(model, BatchStream(_Passes()), 3, 5, backup, verbose=0)
    monkeypatch.setattr(np, "savez", real_savez)
    assert sorted(os.listdir(tmp_path / "backup")) == ["training_state.npz"]
    fresh = _model()
    again = TrainingBackup(tmp_path / "backup", save_every=2)
    assert again.restore(fresh) == 4
    assert int(keras.ops.convert_to_numpy(fresh.optimizer.iterations)) == 4


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="save_every"):
        TrainingBackup(tmp_path, save_every=0)
    with pytest.raises(ValueError, match="JSON"):
        TrainingBackup(tmp_path, settings={"x": object()})
    backup = TrainingBackup(tmp_path / "b", settings={"seed": 1})
    model = _model()
    resumable_fit(model, BatchStream(_Passes()), 1, 2, backup, verbose=0)
    other = TrainingBackup(tmp_path / "b", settings={"seed": 2})
    with pytest.raises(ValueError, match="seed: 1 in the backup, 2 now"):
        other.restore(_model())
    wider = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    wider.compile(optimizer="adam", loss="mse")
    with pytest.raises(ValueError, match="does not fit this model"):
        TrainingBackup(tmp_path / "b", settings={"seed": 1}).restore(wider)
