"""`predict`, `evaluate` and `encode` over several processes: each process computes a share.

After `kbert.distribution.initialize` every process runs the same script with the same full
inputs. `BertTask.predict` and `evaluate` (packed NumPy data, raw text included) and
`BertTextEmbedder.encode` then split the rows: rows are ordered by length (longest first)
and dealt to the processes in turn, so every process gets rows of every length and about the
same work; each process runs its share through the one-process pipeline (length-planned
batches on its own devices) and the outputs come back whole, in the caller's row order, on
every process (`kbert.processes.all_sum` of each process' rows: the backend's own
collectives). `evaluate` computes the loss and metrics of those gathered outputs, the same on
every process. `encode(..., output_dir=...)` writes ordered shards instead, for corpora that
do not fit in memory (`write_shards`).

The share is computed on a model whose variables live in this process: the model itself, or,
for a model created inside a distribution that spans the processes (JAX's `DataParallel`,
TensorFlow's `MultiWorkerMirroredStrategy`), a local copy built once outside it that takes
the model's current weights at each call (`local_model`).

A process that dies, or a coordinator that is gone, makes the others' next collective fail
within the `timeout` given to `initialize` (JAX: its heartbeat); the error says which step
failed. Shards are written through a temporary sibling and one rename: an interrupted run
leaves whole shards only, and the same call again writes only the missing ones.

Example (two processes, each runs this):

    kbert.distribution.initialize()
    embedder = kbert.models.BertTextEmbedder.from_preset("all-MiniLM-L6-v2")
    embeddings = embedder.encode(corpus)  # each process embeds half; all get every row
"""

import concurrent.futures
import contextlib
import hashlib
import json
import math
import re
import weakref
from pathlib import Path

import keras
import numpy as np

from kbert import processes
from kbert.checkpoints.atomic import atomic_file, atomic_write_text

# Local copies of models whose variables span several processes, one per model.
_LOCAL_COPIES = weakref.WeakKeyDictionary()
# Rows per shard of `encode(..., output_dir=...)` by default.
DEFAULT_SHARD_ROWS = 10_000
_SHARD_NAME = re.compile(r"^embeddings-(\d{5})-of-(\d{5})-([0-9a-f]{12})\.npy$")
MANIFEST = "embeddings.json"


def sharing_processes():
    """True when several processes run together (`kbert.distribution.initialize`)."""
    return processes.process_count() > 1


def row_share(lengths, index=None, count=None):
    """The rows process `index` of `count` computes: rows ordered by length, longest first,
    dealt in turn (sorted back to ascending row order).

    Args:
        lengths: 1-D ints (or any size per row: characters of raw texts).
        index, count: ints. Default to this process and the process count.

    Returns:
        int64 array of row indices.
    """
    index = processes.process_index() if index is None else int(index)
    count = processes.process_count() if count is None else int(count)
    order = np.argsort(-np.asarray(lengths), kind="stable")
    return np.sort(order[index::count]).astype("int64")


def take_rows(x, rows):
    """Rows `rows` of every array of the structure `x`."""
    return keras.tree.map_structure(lambda a: None if a is None else np.asarray(a)[rows], x)


def _collective(what, arrays):
    """`processes.all_sum(arrays)`, with an error that says what failed and why it may have."""
    try:
        return processes.all_sum(arrays)
    except Exception as error:
        raise RuntimeError(
            f"{what}: process {processes.process_index()} of {processes.process_count()} "
            "could not exchange results with the others: a process died or stopped, or the "
            "coordinator is gone (collectives wait at most the `timeout` given to "
            f"kbert.distribution.initialize). Cause: {type(error).__name__}: {error}"
        ) from error


def barrier(what):
    """Waits until every process reaches this point (a collective)."""
    _collective(what, [np.zeros((1,), "int32")])


def gather_rows(outputs, rows, num_rows, what="predict"):
    """Every process' rows of `outputs` (NumPy, rows first), whole and in row order.

    Args:
        outputs: a structure of NumPy arrays: this process' outputs of rows `rows`.
        rows: int array. The rows (of `num_rows`) `outputs` hold, in their order.
        num_rows: int. Rows of the whole input.
        what: str. Named in the error when a process is gone.

    Returns:
        the structure of `outputs` with `num_rows` rows per array.
    """
    leaves = keras.tree.flatten(outputs)
    whole = []
    for leaf in leaves:
        leaf = np.asarray(leaf)
        # Summed exactly: float32 / int64 (each row is nonzero on one process only).
        dtype = "int64" if np.issubdtype(leaf.dtype, np.integer) or leaf.dtype == bool else None
        array = np.zeros((num_rows,) + leaf.shape[1:], dtype or "float32")
        array[rows] = leaf
        whole.append(array)
    summed = _collective(what, whole)
    summed = [s.astype(leaf.dtype) for s, leaf in zip(summed, leaves)]
    return keras.tree.pack_sequence_as(outputs, summed)


def _spans_processes(model):
    backend = keras.backend.backend()
    if backend == "jax":
        if keras.distribution.distribution() is not None:
            return True
        return any(not getattr(v.value, "is_fully_addressable", True) for v in model.weights)
    if backend == "tensorflow":
        strategy = getattr(model, "distribute_strategy", None)
        return getattr(strategy, "num_replicas_in_sync", 1) > 1
    return False


@contextlib.contextmanager
def without_distribution():
    """No `keras.distribution` while inside (JAX): this process computes on its own."""
    distribution = keras.distribution.distribution()
    if distribution is None:
        yield
        return
    keras.distribution.set_distribution(None)
    try:
        yield
    finally:
        keras.distribution.set_distribution(distribution)


def _host_value(value):
    from kbert.models.multiprocess import host_value

    return host_value(value)


def local_model(model, compiled=False):
    """`model`, or a copy of it whose variables live in this process (see the module
    docstring), with `model`'s current weights; `compiled=True` compiles the copy as
    `model` (its loss and metrics)."""
    if not _spans_processes(model):
        return model
    values = [_host_value(v.value) for v in model.weights]
    with without_distribution():
        copy = _LOCAL_COPIES.get(model)
        if copy is None:
            copy = type(model).from_config(model.get_config())
            _LOCAL_COPIES[model] = copy
        if compiled:
            _compile_like(copy, model)
        copy.set_weights(values)
    return copy


def _compile_like(copy, model):
    config = model.get_compile_config()
    if config is None:
        return
    if "kbert_recipe" in config:
        copy.compile(**config["kbert_recipe"])
        return
    config = keras.saving.deserialize_keras_object(config)
    config.pop("optimizer", None)
    copy.compile(**config)


def outside_strategy(function):
    """`function()`, run where no `tf.distribute` strategy scope is entered: on TensorFlow
    inside one (a callback of `fit` over workers) in a thread of its own, whose strategy is
    the default (scopes are per thread), so that a local copy can be built and run there."""
    if keras.backend.backend() == "tensorflow":
        from kbert.backend.tensorflow import tensorflow

        if tensorflow("Inference over TensorFlow workers").distribute.has_strategy():
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                return pool.submit(function).result()
    return function()


def compute_here(model, function):
    """`function(local_model(model))` in this process alone (see `local_model`)."""

    def compute():
        local = local_model(model)
        with without_distribution():
            return function(local)

    return outside_strategy(compute)


def predict_over_processes(model, x, predict_here, what="predict"):
    """`predict_here(local_model, rows_of_x)` for this process' share of the rows of the
    packed NumPy dict `x`, gathered whole and in order on every process."""
    from kbert.data import batching

    lengths = batching.row_lengths(x["padding_mask"])
    num_rows = len(lengths)
    if num_rows < processes.process_count():
        # Fewer rows than processes: each computes them all (no exchange needed).
        return compute_here(model, lambda local: predict_here(local, x))
    rows = row_share(lengths)
    part = take_rows(x, rows)
    outputs = compute_here(model, lambda local: predict_here(local, part))
    return gather_rows(outputs, rows, num_rows, what)


def evaluate_predictions(model, x, y, sample_weight, y_pred, return_dict):
    """`evaluate`'s results (loss and compiled metrics) of whole predictions `y_pred`, computed
    once on this process (every process gets the same)."""
    return outside_strategy(lambda: _evaluate_here(model, x, y, sample_weight, y_pred, return_dict))


def _evaluate_here(model, x, y, sample_weight, y_pred, return_dict):
    from kbert.models.multiprocess import local_metrics

    local = local_model(model, compiled=True)
    with without_distribution(), local_metrics(local):
        to_tensor = lambda a: None if a is None else keras.ops.convert_to_tensor(a)  # noqa: E731
        x, y, y_pred, sample_weight = (
            keras.tree.map_structure(to_tensor, part) if part is not None else None
            for part in (x, y, y_pred, sample_weight)
        )
        for metric in local.metrics:
            metric.reset_state()
        loss = local.compute_loss(
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=False
        )
        logs = dict(local.compute_metrics(x, y, y_pred, sample_weight))
    logs = {k: float(keras.ops.convert_to_numpy(v)) for k, v in logs.items()}
    logs["loss"] = float(keras.ops.convert_to_numpy(loss))
    logs = {"loss": logs.pop("loss"), **logs}
    if return_dict:
        return logs
    values = list(logs.values())
    return values[0] if len(values) == 1 else values


# ---------------------------------------------------------------------- shards on disk
def corpus_fingerprint(texts, settings):
    """12 hex digits naming a corpus and the settings it is embedded with."""
    digest = hashlib.sha1(json.dumps(settings, sort_keys=True).encode())
    for text in texts:
        digest.update(text.encode("utf-8", "surrogatepass") + b"\0")
    return digest.hexdigest()[:12]


def shard_paths(output_dir, num_shards, fingerprint):
    """The paths of the shards of a corpus, in row order."""
    return [
        Path(output_dir) / f"embeddings-{k:05d}-of-{num_shards:05d}-{fingerprint}.npy"
        for k in range(num_shards)
    ]


def _check_output_dir(output_dir, fingerprint):
    output_dir = Path(output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise ValueError(f"`output_dir` must be a directory. Received a file: {output_dir}")
    if not output_dir.is_dir():
        return
    others = sorted(
        p.name
        for p in output_dir.iterdir()
        if _SHARD_NAME.match(p.name) and _SHARD_NAME.match(p.name).group(3) != fingerprint
    )
    if others:
        raise ValueError(
            f"`output_dir` {str(output_dir)!r} holds embedding shards of another corpus or "
            f"other settings ({others[0]}{' and more' if len(others) > 1 else ''}). Use an "
            "empty directory, or the same texts and settings to complete an interrupted run."
        )


def write_shards(texts, output_dir, shard_rows, settings, embed, verbose=False):
    """Embeds `texts` into ordered `.npy` shards of `shard_rows` rows under `output_dir`.

    Shard `k` holds rows `[k * shard_rows, (k + 1) * shard_rows)`; over several processes
    process `p` writes shards `p, p + P, ...`. Each shard is written through a temporary
    sibling and one rename; shards already there (an interrupted run of the same texts and
    settings) are kept. Process 0 writes `embeddings.json` (rows, dimension, dtype, shard
    names) once every shard is there.

    Args:
        texts: list of str.
        output_dir: str or path.
        shard_rows: int. Rows per shard.
        settings: dict (JSON) of what changes the embeddings (prompt, precision, ...).
        embed: function `texts -> NumPy array (len(texts), ...)`.
        verbose: bool. Print each shard as it is written.

    Returns:
        list of the shard paths, in row order (on every process).
    """
    if isinstance(shard_rows, bool) or not isinstance(shard_rows, (int, np.integer)):
        raise ValueError(f"`shard_rows` must be a positive integer. Received: {shard_rows!r}")
    if shard_rows < 1:
        raise ValueError(f"`shard_rows` must be a positive integer. Received: {shard_rows!r}")
    fingerprint = corpus_fingerprint(texts, dict(settings, shard_rows=int(shard_rows)))
    _check_output_dir(output_dir, fingerprint)
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    num_shards = math.ceil(len(texts) / shard_rows)
    paths = shard_paths(output_dir, num_shards, fingerprint)
    index, count = processes.process_index(), processes.process_count()
    for k in range(index, num_shards, count):
        if paths[k].exists():
            continue
        embeddings = np.asarray(embed(texts[k * shard_rows : (k + 1) * shard_rows]))
        with atomic_file(paths[k]) as temporary, open(temporary, "wb") as file:
            np.save(file, embeddings)
        if verbose:
            print(f"process {index}: wrote {paths[k].name} ({len(embeddings)} rows)")
    if count > 1:
        barrier("encode(output_dir=...) waiting for the other processes' shards")
    if processes.is_writer():
        first = np.load(paths[0], mmap_mode="r")
        manifest = {
            "rows": len(texts),
            "shape": [len(texts), *first.shape[1:]],
            "dtype": str(first.dtype),
            "shard_rows": int(shard_rows),
            "fingerprint": fingerprint,
            "shards": [p.name for p in paths],
        }
        atomic_write_text(Path(output_dir) / MANIFEST, json.dumps(manifest, indent=1))
    return paths


def load_shards(output_dir):
    """The embeddings written by `encode(..., output_dir=...)`, as one NumPy array, using the
    directory's `embeddings.json`."""
    output_dir = Path(output_dir)
    manifest_path = output_dir / MANIFEST
    if not manifest_path.is_file():
        raise FileNotFoundError(
            f"No {MANIFEST} in {str(output_dir)!r}: not a finished encode(output_dir=...) run."
        )
    manifest = json.loads(manifest_path.read_text())
    return np.concatenate([np.load(output_dir / name) for name in manifest["shards"]])
