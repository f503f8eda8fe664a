"""Resumable training: back up the whole training state atomically and resume exactly.

`TrainingBackup` is a Keras callback that writes the training state (weights, optimizer state
and step, the random state of dropout, the running epoch metrics, the per-step loss and the
epoch logs so far) to one `.npz` file every `save_every` steps and at every epoch end, and
`resumable_fit` runs `model.fit` from where the last backup stopped, with the data stream
(`BatchStream`) fast-forwarded to the next batch. After an interruption at any moment
(Ctrl-C, `kill -9`, a crash), running the same code again continues from the last backup; the
result equals an uninterrupted run's, bit for bit wherever the backend's kernels are
deterministic (checked on CPU with JAX, TensorFlow, and torch with one thread).

Why not `keras.callbacks.BackupAndRestore` alone: it restores weights, optimizer and the
epoch/step counters, but not the position of a data stream, the random state of dropout
(torch draws it from global generators), nor the running metrics of an interrupted epoch, and it
cannot refuse a backup made with other settings. `TrainingBackup` keeps its interface idea (a
backup folder, `save_every` steps, deleted at the end when asked) and adds these.
"""

import errno
import json
import os
import threading
import time
from collections import OrderedDict

import keras
import numpy as np

from kbert import processes
from kbert.backend import tensorflow
from kbert.checkpoints.atomic import atomic_file

BACKUP_FORMAT = "kbert-training-backup-1"
BACKUP_FILE = "training_state.npz"


# ------------------------------------------------------------------------------ data stream
class BatchStream:
    """A dataset's batches addressed by their global index, read back to back over passes.

    Batch `k` is the `k`-th batch of passes 0, 1, 2, ... of `source` (an iterable that gives
    one pass per iteration, such as `kbert.data.pretraining_dataset(..., repeat=False)`, whose
    pass `p` depends only on its seed). So batch `k` depends only on the source, and a resumed
    run finds it again with `skip_to(k)` (which regenerates and drops the batches before it:
    its cost grows with `k`, reading is not needed again for pre-tokenized shards).
    `dataset(start)` hands Keras a `tf.data.Dataset` starting at batch `start` each time it is
    iterated; recent batches are cached, since Keras may start an iteration more than once.

    Args:
        source: an iterable of batches; each iteration is one pass and must yield at least one
            batch.
        cache_size: int. Recent batches kept. Defaults to 256.
    """

    def __init__(self, source, cache_size=256):
        self._source = source
        self._iterator = None
        self._next_index = 0
        self._pass_had_batches = False
        self._cache = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self.passes_started = 0

    def _read(self):
        tf = tensorflow.tensorflow("Resumable batches")

        while True:
            if self._iterator is None:
                self._iterator = iter(self._source)
                self.passes_started += 1
                self._pass_had_batches = False
            try:
                batch = next(self._iterator)
            except StopIteration:
                self._iterator = None
                if not self._pass_had_batches:
                    raise ValueError("A pass over the data gives no batch.") from None
                continue
            self._pass_had_batches = True
            return tf.nest.map_structure(lambda t: np.asarray(t), batch)

    def count_pass(self):
        """Reads one whole pass (before any batch is taken) and returns its number of batches."""
        if self._next_index or self._iterator is not None:
            raise RuntimeError("count_pass() must run before the stream is read.")
        self._iterator = iter(self._source)
        self.passes_started += 1
        count = sum(1 for _ in self._iterator)
        self._iterator = None
        if not count:
            raise ValueError("A pass over the data gives no batch.")
        return count

    def get(self, index):
        """Batch `index` (the batches before it are generated first)."""
        with self._lock:
            while self._next_index <= index:
                self._cache[self._next_index] = self._read()
                self._next_index += 1
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
            if index not in self._cache:
                raise RuntimeError(
                    f"Batch {index} of the stream was asked for again after it left the cache "
                    f"(batches {min(self._cache)}-{max(self._cache)} are cached)."
                )
            return self._cache[index]

    def skip_to(self, index, verbose=True):
        """Generates (and drops) the batches before `index`, with a progress bar."""
        missing = index - self._next_index
        if missing <= 0:
            return
        progbar = keras.utils.Progbar(missing, unit_name="batch") if verbose else None
        with self._lock:
            while self._next_index < index:
                self._read()
                self._next_index += 1
                if progbar is not None:
                    progbar.add(1)

    def dataset(self, start):
        """A `tf.data.Dataset` of the batches from `start` on (endless)."""
        tf = tensorflow.tensorflow("Resumable batches as a tf.data.Dataset")

        first = self.get(start)
        spec = tf.nest.map_structure(lambda a: tf.TensorSpec(a.shape, tf.as_dtype(a.dtype)), first)

        def batches():
            index = start
            while True:
                yield self.get(index)
                index += 1

        return tf.data.Dataset.from_generator(batches, output_signature=spec)


# ---------------------------------------------------------------------------- backup state
def _state_variables(model):
    """Weights (dropout seed states included), optimizer variables and metric variables."""
    seeds = [v for v in model.variables if v.path.endswith("seed_generator_state")]
    weights = list(model.weights)
    seen = {id(v) for v in weights}
    weights += [v for v in seeds if id(v) not in seen]
    return weights, list(model.optimizer.variables), list(model.metrics_variables)


def _global_random_state():
    """The backend's global random generators that training draws from (torch only).

    With the torch backend, Keras draws the dropout masks of layers built without an explicit
    seed from torch's global generators, not from the layers' seed generators; Keras' torch
    data loader also draws from them when it starts iterating. Their state is carried from the
    end of one step to the start of the next by `TrainingBackup`.
    """
    if keras.backend.backend() != "torch":
        return {}
    import torch

    state = {"random/torch_cpu": torch.get_rng_state().numpy()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, value in enumerate(torch.cuda.get_rng_state_all()):
            state[f"random/torch_cuda/{i}"] = value.numpy()
    return state


def _set_global_random_state(data):
    if "random/torch_cpu" not in data:
        return
    import torch

    torch.set_rng_state(torch.from_numpy(np.asarray(data["random/torch_cpu"])))
    cuda = sorted(k for k in data if k.startswith("random/torch_cuda/"))
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([torch.from_numpy(np.asarray(data[k])) for k in cuda])


def _differences(saved, current):
    keys = sorted(set(saved) | set(current))
    return [
        f"{k}: {saved.get(k)!r} in the backup, {current.get(k)!r} now"
        for k in keys
        if saved.get(k) != current.get(k)
    ]


class TrainingBackup(keras.callbacks.Callback):
    """Backs up the whole training state atomically, to resume a run exactly.

    The state is written to `<backup_dir>/training_state.npz` at every epoch end and every
    `save_every` steps, as a new file renamed over the old one (after `fsync`), so a kill at any
    moment leaves the previous backup intact. It holds the model's weights and dropout seed
    states, the optimizer's variables (moments and iteration count, hence the learning-rate
    schedule position), the metric variables of the running epoch, torch's global random state
    (torch backend), the global step (the data position for a `BatchStream`), the per-step loss
    and the epoch logs of the whole run, the training seconds so far, and `settings`.

    `restore(model)` loads a backup (if there is one) into a compiled model, after checking that
    it was made with the same `settings`. Use it through `resumable_fit`, which also
    fast-forwards the data and finishes an interrupted epoch so that its logs (and `epochs`)
    cover the whole epoch.

    Args:
        backup_dir: str. Folder of the backup (created when first written).
        save_every: int or `None`. Also back up every this many steps. Defaults to `None`
            (epoch ends only).
        settings: dict of JSON values. What shapes the run (data, hyperparameters, seed); a
            backup made with other settings is refused, naming the ones that differ.
            Defaults to `{}`.

    Attributes:
        step: int. Global steps done.
        saved_step: int. Global step of the last backup.
        step_loss: list of float. The loss of every step of the run (resumed parts included).
        epochs: list of dict. The logs of every finished epoch.

    Example:

    ```python
    backup = kbert.callbacks.TrainingBackup("runs/x/backup", save_every=500,
                                            settings={"seed": 0, "lr": 1e-4})
    stream = kbert.callbacks.BatchStream(kbert.data.pretraining_dataset(files, tok, seed=0))
    kbert.callbacks.resumable_fit(model, stream, epochs=3, steps_per_epoch=1000, backup=backup)
    ```
    """

    def __init__(self, backup_dir, save_every=None, settings=None):
        super().__init__()
        if save_every is not None and (
            not isinstance(save_every, (int, np.integer))
            or isinstance(save_every, bool)
            or save_every < 1
        ):
            raise ValueError(
                f"`save_every` must be a positive integer or None. Received: {save_every!r}"
            )
        settings = dict(settings or {})
        try:
            settings = json.loads(json.dumps(settings))
        except TypeError as error:
            raise ValueError(f"`settings` must hold JSON values only: {error}") from None
        self.backup_dir = os.fspath(backup_dir)
        self.path = os.path.join(self.backup_dir, BACKUP_FILE)
        self.save_every = save_every
        self.settings = settings
        self.step = 0
        self.saved_step = 0
        self.step_loss = []
        self.epochs = []
        self.seconds_before = 0.0
        self._session_start = None
        self._random_state = None
        self._metric_state = None  # Restored into the metrics at the first epoch begin.
        self._epoch_batches = 0
        self._previous_mean = 0.0
        self._first_batch = True

    # ---- reading and writing
    def exists(self):
        return os.path.isfile(self.path)

    def read_metadata(self):
        with np.load(self.path) as data:
            return json.loads(str(data["metadata"]))

    def restore(self, model):
        """Loads the backup into `model` (compiled); returns the global step (0 if none)."""
        if not self.exists():
            return 0
        metadata = self.read_metadata()
        if metadata.get("format") != BACKUP_FORMAT:
            raise ValueError(
                f"{self.path} is not a kbert training backup of format {BACKUP_FORMAT!r}."
            )
        changed = _differences(metadata["settings"], self.settings)
        if changed:
            raise ValueError(
                f"The backup in {self.backup_dir} was made by a run with other settings: "
                + "; ".join(changed)
                + ". Run with the same settings to resume it, or delete the backup to start over."
            )
        if not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        groups = dict(zip(("model", "optimizer", "metrics"), _state_variables(model)))
        with np.load(self.path) as data:
            for group, variables in groups.items():
                saved = [tuple(shape) for shape in metadata[f"{group}_variables"]]
                current = [tuple(v.shape) for v in variables]
                if group == "metrics":
                    # Metrics are built by `fit`: assigned at the first epoch begin.
                    self._metric_state = [data[f"metrics/{i}"] for i in range(len(saved))]
                    continue
                if saved != current:
                    raise ValueError(
                        f"The backup {self.path} does not fit this model: its {group} state "
                        f"has {len(saved)} variables, this model's {len(current)}, or their "
                        "shapes differ."
                    )
                for i, variable in enumerate(variables):
                    variable.assign(data[f"{group}/{i}"])
            self._random_state = {k: data[k] for k in data.files if k.startswith("random/")}
        self.step = self.saved_step = int(metadata["global_step"])
        self.step_loss = list(metadata["step_loss"])
        self.epochs = list(metadata["epochs"])
        self.seconds_before = float(metadata["train_seconds"])
        self._session_start = None
        self._epoch_batches = int(metadata["epoch_batches"])
        self._previous_mean = float(metadata["previous_mean"])
        if not self._epoch_batches:
            self._metric_state = None
        return self.step

    def save(self):
        """Writes the backup now (atomically); over several processes, on process 0 only.

        Every process reads the state (on TensorFlow, reading a metric's variable is a
        collective over the workers); process 0 writes it.
        """
        model_variables, optimizer_variables, metric_variables = _state_variables(self.model)
        arrays = {}
        for group, variables in (
            ("model", model_variables),
            ("optimizer", optimizer_variables),
            ("metrics", metric_variables),
        ):
            for i, v in enumerate(variables):
                arrays[f"{group}/{i}"] = keras.ops.convert_to_numpy(v)
        metadata = {
            "format": BACKUP_FORMAT,
            "global_step": self.step,
            "settings": self.settings,
            "step_loss": self.step_loss,
            "epochs": self.epochs,
            "train_seconds": self.seconds(),
            "epoch_batches": self._epoch_batches,
            "previous_mean": self._previous_mean,
            "model_variables": [list(v.shape) for v in model_variables],
            "optimizer_variables": [list(v.shape) for v in optimizer_variables],
            "metrics_variables": [list(v.shape) for v in metric_variables],
        }
        arrays.update(self._random_state or {})
        arrays["metadata"] = np.array(json.dumps(metadata))
        if not processes.is_writer():
            self.saved_step = self.step  # Process 0 writes the run's one backup.
            return
        os.makedirs(self.backup_dir, exist_ok=True)
        try:
            with atomic_file(self.path) as temporary, open(temporary, "wb") as file:
                np.savez(file, **arrays)
        except OSError as error:
            if error.errno == errno.ENOSPC:
                raise OSError(
                    errno.ENOSPC,
                    f"No space left on the device while backing up step {self.step} to "
                    f"{self.path}. The last good backup (step {self.saved_step}) is unchanged; "
                    "free some space and run again to resume from it.",
                ) from error
            raise
        self.saved_step = self.step

    def delete(self):
        """Removes the backup file (e.g. once the final model is safely written)."""
        if not processes.is_writer():
            return
        if self.exists():
            os.remove(self.path)
        try:
            os.rmdir(self.backup_dir)
        except OSError:
            pass

    def seconds(self):
        """Training seconds of the whole run, resumed parts included."""
        now = time.time() - self._session_start if self._session_start else 0.0
        return self.seconds_before + now

    # ---- callback hooks
    def on_train_begin(self, logs=None):
        if self._session_start is None:
            self._session_start = time.time()
        self._first_batch = True

    def on_epoch_begin(self, epoch, logs=None):
        if self._metric_state is not None:
            # Resumed inside this epoch: the metrics continue from the backed-up sums.
            variables = self.model.metrics_variables
            saved = [tuple(v.shape) for v in self._metric_state]
            if saved != [tuple(v.shape) for v in variables]:
                raise ValueError(
                    f"The backup {self.path} does not fit this model: its metrics state has "
                    f"{len(saved)} variables, this model's {len(variables)}, or their shapes "
                    "differ (was the model compiled with other metrics?)."
                )
            for variable, value in zip(variables, self._metric_state):
                variable.assign(value)
            self._metric_state = None
        else:
            self._epoch_batches, self._previous_mean = 0, 0.0

    def on_train_batch_begin(self, batch, logs=None):
        if self._first_batch and self._random_state:
            _set_global_random_state(self._random_state)
        self._first_batch = False

    def on_train_batch_end(self, batch, logs=None):
        self._random_state = _global_random_state() or None
        self.step += 1
        if logs and "loss" in logs:
            # Keras reports the running mean over the epoch; recover this step's loss.
            mean = float(logs["loss"])
            self._epoch_batches += 1
            n = self._epoch_batches
            self.step_loss.append(mean * n - self._previous_mean * (n - 1))
            self._previous_mean = mean
        if self.save_every and self.step % self.save_every == 0:
            self.save()

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append({k: float(v) for k, v in (logs or {}).items()})
        self._epoch_batches, self._previous_mean = 0, 0.0
        self.save()


class _StopAfterEpoch(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        self.model.stop_training = True


def resumable_fit(
    model, stream, epochs, steps_per_epoch, backup, callbacks=(), verbose="auto", first_epoch=0
):
    """Trains `model` for `epochs x steps_per_epoch` steps, resuming from `backup` if it exists.

    Restores the backup (weights, optimizer, random and metric state; refused when its
    settings differ), fast-forwards `stream` to the next batch, finishes an interrupted epoch
    (its logs cover the whole epoch: the metric sums were backed up) and runs the remaining
    epochs. Global step `k` of the run trains on `stream.get(k - first_epoch * steps_per_epoch)`.

    A run in phases (e.g. BERT's 90 % of the steps at length 128, then 512) calls it once per
    phase with the same `backup` and model: `epochs` is where the phase ends and `first_epoch`
    where it starts, each phase with its own stream.

    Args:
        model: a compiled Keras model.
        stream: a `BatchStream` (or any object with `skip_to(k)` and `dataset(start)`).
        epochs: int. Total epochs of the run.
        steps_per_epoch: int. Steps per epoch.
        backup: a `TrainingBackup`.
        callbacks: extra Keras callbacks.
        verbose: passed to `fit`.
        first_epoch: int. First epoch of this phase; the stream's batch 0 is its first step.
            Defaults to 0.

    Returns:
        The global step reached (`epochs * steps_per_epoch` when training finished).
    """
    start = backup.restore(model)
    total = epochs * steps_per_epoch
    first_step = first_epoch * steps_per_epoch
    if start > total:
        raise ValueError(
            f"The backup is at step {start}, past the end of this run ({total} steps)."
        )
    if start < first_step:
        raise ValueError(
            f"The backup is at step {start}, before this phase's first step {first_step}: "
            "run the earlier phase first."
        )
    if first_step < start < total:
        stream.skip_to(start - first_step)
    if backup._metric_state is not None and [tuple(v.shape) for v in backup._metric_state] != [
        tuple(v.shape) for v in model.metrics_variables
    ]:
        # TensorFlow builds the compiled metrics when it first traces a step; one evaluation
        # step builds them now (fit resets them), so the backed-up sums can be put back.
        model.evaluate(stream.dataset(start - first_step), steps=1, verbose=0)
    epoch, offset = divmod(start, steps_per_epoch)
    segments = []
    if offset:  # Finish the interrupted epoch, then run the others.
        segments.append((epoch, steps_per_epoch - offset, True))
        epoch += 1
    if epoch < epochs:
        segments.append((epoch, steps_per_epoch, False))
    for initial_epoch, steps, stop in segments:
        model.fit(
            stream.dataset(start=backup.step - first_step),
            epochs=epochs,
            initial_epoch=initial_epoch,
            steps_per_epoch=steps,
            shuffle=False,
            verbose=verbose,
            callbacks=[backup] + ([_StopAfterEpoch()] if stop else []) + list(callbacks),
        )
    return backup.step
