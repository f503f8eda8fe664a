"""Length-aware batching: pad each batch only to the shortest bucket that holds its rows.

kbert's preprocessors pack every text to one fixed `sequence_length`. Run as is, a batch of
short texts spends most of its compute on padding. This module plans batches of rows of
similar length and crops each batch to the smallest of a small, fixed set of *bucket*
lengths that holds its longest row:

- `bucket_lengths(sequence_length, granularity)`: the fixed set, multiples of `granularity`
  up to `sequence_length` (which is always the last bucket). A compiling backend (JAX, and
  TensorFlow with or without XLA) therefore sees at most `len(buckets)` sequence lengths,
  i.e. `ceil(sequence_length / granularity)`, and at most one more batch size (the one short
  batch): at most `len(buckets) + 1` input shapes in all.
- `plan_batches(lengths, batch_size, buckets, shuffle, seed)`: which rows go together and
  their padded length. For `predict`/`evaluate` (`shuffle=False`) rows are sorted by length,
  longest first; for `fit` (`shuffle=True`) rows are drawn in a random order, grouped by
  length inside groups of `group_size` batches and the batches shuffled, as Hugging Face's
  `group_by_length` sampler does.
- `crop_batch` / `OrderedOutputs`: crop packed arrays (`token_ids`, `segment_ids`,
  `padding_mask`, per-token labels and weights) to a batch's bucket, and put the outputs of
  the planned batches back into the caller's row order, per-token outputs padded back to
  `sequence_length` with a fill value.
- `LengthBatches`: a `keras.utils.PyDataset` yielding the planned batches, which Keras'
  `fit`/`evaluate` consume on every backend; `LengthBatches.as_tf_dataset()` gives the
  same batches as a `tf.data.Dataset` with a variable sequence dimension (TensorFlow infers a
  `PyDataset`'s shapes from its first two batches, so it needs the explicit signature).

Cropping changes no output at real positions: every kbert encoder masks padded keys, so the
positions past a row's last real token contribute nothing (up to float rounding, well below
1e-5 in float32). The tasks use this module in `fit`, `evaluate` and `predict`
(`kbert.models.BertTask`, option `length_batching`), with the buckets of `model_buckets`:
exact per-batch lengths on eager torch, steps of 4-32 tokens where shapes are compiled.

This module uses NumPy and Keras only; TensorFlow is imported by `as_tf_dataset` alone.
"""

import math

import keras
import numpy as np

from kbert import processes
from kbert.backend import tensorflow
from kbert.data.batching import bucket_lengths

# Batches per group in which `plan_batches(shuffle=True)` sorts rows by length (Hugging
# Face's `LengthGroupedSampler` uses megabatches of 50 batches).
DEFAULT_GROUP_SIZE = 50


def _positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
    return int(value)


def row_lengths(padding_mask):
    """Per row, the index of its last real (non-zero mask) position plus one; 0 for none.

    Cropping a row to this length keeps every real position, even when the mask has holes.
    """
    mask = np.asarray(padding_mask) != 0
    if mask.ndim != 2:
        raise ValueError(
            f"`padding_mask` must be (batch_size, sequence_length). Received shape {mask.shape}"
        )
    last = mask.shape[1] - np.argmax(mask[:, ::-1], axis=1)
    return np.where(mask.any(axis=1), last, 0).astype("int64")


def _check_buckets(buckets):
    buckets = tuple(int(b) for b in buckets)
    if not buckets or any(b < 1 for b in buckets) or list(buckets) != sorted(set(buckets)):
        raise ValueError(f"`buckets` must be increasing positive lengths. Received: {buckets}")
    return buckets


def bucket_for(lengths, buckets):
    """The smallest bucket holding each length (NumPy array in, array out).

    Raises a ValueError when a length exceeds the last bucket.
    """
    buckets = np.asarray(_check_buckets(buckets))
    lengths = np.asarray(lengths)
    if lengths.size and lengths.max() > buckets[-1]:
        raise ValueError(
            f"A row of length {int(lengths.max())} does not fit the longest bucket "
            f"{int(buckets[-1])}."
        )
    return buckets[np.searchsorted(buckets, lengths, side="left")]


def plan_batches(lengths, batch_size, buckets, shuffle=False, seed=None, group_size=None):
    """Groups rows into batches of similar length.

    Args:
        lengths: 1-D ints, each row's real length (see `row_lengths`).
        batch_size: int. Rows per batch (the last batch may be shorter).
        buckets: increasing ints (see `bucket_lengths`); the last holds every row.
        shuffle: bool. `False` (predict, evaluate): rows sorted by length, longest first,
            ties in their original order. `True` (fit): rows in a random order are cut into
            groups of `group_size` batches, each group sorted by length and cut into
            batches, and the batches shuffled; a new call with another seed gives another
            plan. Defaults to `False`.
        seed: int or `None`. Seed of the shuffle; `None` draws one from NumPy's global
            generator (so `keras.utils.set_random_seed` makes runs repeatable).
        group_size: int or `None`. Batches per sorting group when shuffling. Defaults to 50.

    Returns:
        List of `(row_indices, padded_length)`: `row_indices` an int64 array of rows of the
        caller's data, `padded_length` the smallest bucket holding all of them. There are
        `ceil(len(lengths) / batch_size)` batches; every row is in exactly one.
    """
    lengths = np.asarray(lengths, dtype="int64").reshape(-1)
    batch_size = _positive_int(batch_size, "batch_size")
    padded = bucket_for(lengths, buckets)
    if not shuffle:
        order = np.argsort(-lengths, kind="stable")
        batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    else:
        group_size = _positive_int(group_size or DEFAULT_GROUP_SIZE, "group_size")
        if seed is None:
            seed = int(np.random.randint(0, 2**31 - 1))
        rng = np.random.default_rng(seed)
        permutation = rng.permutation(len(lengths))
        group = batch_size * group_size
        batches = []
        for start in range(0, len(permutation), group):
            rows = permutation[start : start + group]
            rows = rows[np.argsort(-lengths[rows], kind="stable")]
            batches.extend(rows[i : i + batch_size] for i in range(0, len(rows), batch_size))
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return [(rows.astype("int64"), int(padded[rows].max())) for rows in batches]


def crop_batch(arrays, rows, length, sequence_keys=None):
    """Rows `rows` of packed arrays, cropped to `length` positions.

    Args:
        arrays: an array, or a (nested) dict / tuple / list of arrays, all with the rows on
            axis 0; `None` leaves stay `None`.
        rows: int array of row indices.
        length: int. Positions kept on axis 1 of the sequence arrays.
        sequence_keys: `None` to crop every array of rank >= 2, or a structure of booleans
            matching `arrays` that says which to crop (e.g. per-token labels yes, multi-hot
            class labels no).

    Returns:
        The same structure of NumPy arrays.
    """

    def take(array, crop=True):
        if array is None:
            return None
        array = np.asarray(array)[rows]
        if crop and array.ndim >= 2:
            array = array[:, :length]
        return array

    if sequence_keys is None:
        return keras.tree.map_structure(take, arrays, none_is_leaf=False)
    return keras.tree.map_structure(take, arrays, sequence_keys, none_is_leaf=False)


class OrderedOutputs:
    """Collects the outputs of planned batches and returns them in the caller's row order.

    Args:
        num_rows: int. Rows of the caller's data.
        sequence_length: int. Length the per-token outputs are padded back to.
        sequence_outputs: a structure of booleans matching the model's outputs (or one
            bool for a single output): which outputs have the sequence on axis 1.
        fill_value: float or a structure like `sequence_outputs`. Value at positions
            past a row's bucket (never real positions). Defaults to `0.0`.

    Example:
    >>> collected = OrderedOutputs(4, 8, sequence_outputs=False)
    >>> for rows, length in plan_batches([3, 8, 1, 5], 2, (4, 8)):
    ...     collected.add(rows, length, np.asarray(rows, "float32")[:, None])
    >>> collected.result()[:, 0]
    array([0., 1., 2., 3.], dtype=float32)
    """

    def __init__(self, num_rows, sequence_length, sequence_outputs, fill_value=0.0):
        self.num_rows = int(num_rows)
        self.sequence_length = int(sequence_length)
        self.sequence_outputs = sequence_outputs
        self.fill_value = fill_value
        self._outputs = None

    def _allocate(self, batch_output, is_sequence, fill):
        batch_output = np.asarray(batch_output)
        shape = (self.num_rows,) + batch_output.shape[1:]
        if is_sequence:
            shape = shape[:1] + (self.sequence_length,) + shape[2:]
        return np.full(shape, fill, dtype=batch_output.dtype)

    def _fills(self, outputs):
        if isinstance(self.fill_value, (int, float)):
            return keras.tree.map_structure(lambda _: self.fill_value, outputs)
        return self.fill_value

    def add(self, rows, length, outputs):
        """Stores the outputs of the batch of rows `rows` padded to `length`."""
        if self._outputs is None:
            self._outputs = keras.tree.map_structure(
                self._allocate, outputs, self.sequence_outputs, self._fills(outputs)
            )

        def put(target, batch_output, is_sequence):
            batch_output = np.asarray(batch_output)
            if is_sequence:
                target[rows, : batch_output.shape[1]] = batch_output
            else:
                target[rows] = batch_output

        keras.tree.map_structure(put, self._outputs, outputs, self.sequence_outputs)

    def result(self):
        """The outputs of every row, in the caller's order."""
        if self._outputs is None:
            raise ValueError("No batch was added.")
        return self._outputs


class LengthBatches(keras.utils.PyDataset):
    """Planned, cropped batches of packed NumPy data, for Keras' `fit` and `evaluate`.

    Each item is `(x,)`, `(x, y)` or `(x, y, sample_weight)` for one batch of
    `plan_batches`, its arrays cropped to the batch's bucket. With `shuffle=True` every
    epoch gets a new plan (Keras calls `on_epoch_end`); the number of batches stays
    `ceil(num_rows / batch_size)`.

    Args:
        x: dict of packed arrays `(num_rows, sequence_length)` with a `padding_mask`.
        y: labels or `None`; arrays or a dict of arrays with the rows on axis 0.
        sample_weight: `None` or an array with the rows on axis 0.
        batch_size: int.
        buckets: increasing ints ending with `sequence_length` (see `bucket_lengths`).
        shuffle: bool. Plan for training (see `plan_batches`). Defaults to `False`.
        seed: int or `None`. Seed of the first epoch's plan. Defaults to `None`.
        sequence_targets: bool. Crop `y` and `sample_weight` too (per-token labels).
            Defaults to `False`.
    """

    def __init__(
        self,
        x,
        y=None,
        sample_weight=None,
        *,
        batch_size,
        buckets,
        shuffle=False,
        seed=None,
        sequence_targets=False,
    ):
        super().__init__()
        if "padding_mask" not in x:
            raise ValueError(
                f"LengthBatches needs a `padding_mask` input. Received keys {sorted(x)}"
            )
        self.x = {key: np.asarray(value) for key, value in x.items()}
        self.y = y
        self.sample_weight = sample_weight
        self.batch_size = _positive_int(batch_size, "batch_size")
        self.buckets = _check_buckets(buckets)
        self.shuffle = bool(shuffle)
        self.sequence_targets = bool(sequence_targets)
        self.lengths = row_lengths(self.x["padding_mask"])
        self.num_rows = len(self.lengths)
        if not self.num_rows:
            raise ValueError("LengthBatches received 0 rows.")
        self._seed = seed
        self._epoch = 0
        self.plan = self._plan()

    def _plan(self):
        seed = self._seed
        if self.shuffle and seed is not None:
            seed = seed + self._epoch
        return plan_batches(
            self.lengths, self.batch_size, self.buckets, shuffle=self.shuffle, seed=seed
        )

    def __len__(self):
        return len(self.plan)

    def __getitem__(self, index):
        rows, length = self.plan[index]
        x = crop_batch(self.x, rows, length)
        if self.y is None:
            return (x,)
        crop = self.sequence_targets
        y = keras.tree.map_structure(
            lambda value: crop_batch(value, rows, length, sequence_keys=crop), self.y
        )
        if self.sample_weight is None:
            return (x, y)
        return (x, y, crop_batch(self.sample_weight, rows, length, sequence_keys=crop))

    def on_epoch_end(self):
        if self.shuffle:
            self._epoch += 1
            self.plan = self._plan()

    def as_tf_dataset(self):
        """The batches as a `tf.data.Dataset` whose sequence dimension is variable.

        Each iteration over the dataset after the first starts with a new plan (when
        shuffling), as `on_epoch_end` does for Keras' own `PyDataset` loop.
        """
        tf = tensorflow.tensorflow("Length batches as a tf.data.Dataset")

        first = self[0]

        def spec(value, is_sequence):
            value = np.asarray(value)
            shape = [None] + list(value.shape[1:])
            if is_sequence and value.ndim >= 2:
                shape[1] = None
            return tf.TensorSpec(shape, tf.as_dtype(value.dtype))

        signature = [keras.tree.map_structure(lambda v: spec(v, True), first[0])]
        for part in first[1:]:
            signature.append(
                keras.tree.map_structure(lambda v: spec(v, self.sequence_targets), part)
            )

        passes = [0]

        def generate():
            if passes[0]:  # A new epoch: a new plan when shuffling.
                self.on_epoch_end()
            passes[0] += 1
            for index in range(len(self)):
                yield self[index]

        dataset = tf.data.Dataset.from_generator(generate, output_signature=tuple(signature))
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(len(self)))
        return dataset.prefetch(2)


def pack_rows(x, sequence_length=None):
    """Packs several short rows into each row of a packed backbone's inputs.

    First-fit decreasing: rows, longest first, go into the first packed row with room for
    their real positions (`row_lengths`). The result feeds `BertBackbone(packed=True)`:
    `document_ids` numbers the documents of a packed row 1..k (0 is padding), so each
    document attends only to itself and its positions restart at 0; its outputs equal those
    it gets alone in its own row.

    Args:
        x: dict of packed arrays (`token_ids`, `segment_ids`, `padding_mask`) of one length.
        sequence_length: int or `None`. Length of a packed row; `None` keeps `x`'s.

    Returns:
        `(packed, placements)`: `packed` a dict with `token_ids`, `segment_ids`,
        `padding_mask` and `document_ids` `(num_packed_rows, sequence_length)`;
        `placements` an int array `(num_rows, 3)` of `(packed_row, start, length)` per input
        row, in the caller's order (`packed[...][packed_row, start:start + length]` is the
        row's real part).
    """
    lengths = row_lengths(x["padding_mask"])
    capacity = int(sequence_length or x["padding_mask"].shape[1])
    if lengths.size and lengths.max() > capacity:
        raise ValueError(
            f"A row of length {int(lengths.max())} exceeds the packed length {capacity}."
        )
    placements = np.zeros((len(lengths), 3), "int64")
    free = []  # room left in each packed row
    for row in np.argsort(-lengths, kind="stable"):
        length = max(int(lengths[row]), 1)
        target = next((i for i, room in enumerate(free) if room >= length), None)
        if target is None:
            target = len(free)
            free.append(capacity)
        placements[row] = (target, capacity - free[target], length)
        free[target] -= length
    packed = {
        key: np.zeros((len(free), capacity), "int32")
        for key in ("token_ids", "segment_ids", "padding_mask", "document_ids")
    }
    counters = [0] * len(free)
    for row in range(len(lengths)):
        target, start, length = placements[row]
        counters[target] += 1
        span = slice(start, start + length)
        packed["token_ids"][target, span] = x["token_ids"][row, :length]
        packed["segment_ids"][target, span] = x["segment_ids"][row, :length]
        packed["padding_mask"][target, span] = 1
        packed["document_ids"][target, span] = counters[target]
    return packed, placements


def num_batches(num_rows, batch_size):
    """`ceil(num_rows / batch_size)`: the batches `plan_batches` makes."""
    return int(math.ceil(num_rows / batch_size))


# ------------------------------------------------------------------------------ task models
# Keras' default batch size for arrays.
_KERAS_DEFAULT_BATCH_SIZE = 32


def _distributed(model):
    """True under a `keras.distribution` or a multi-replica `tf.distribute` strategy: Keras'
    own loops split those batches, so the tasks leave the data to them."""
    if keras.distribution.distribution() is not None or processes.process_count() > 1:
        return True  # Several processes: kbert.models.multiprocess splits the batches.
    strategy = getattr(model, "distribute_strategy", None)
    return getattr(strategy, "num_replicas_in_sync", 1) > 1


def _as_arrays(value):
    """Labels or weights as a NumPy array or a dict of them (lists converted); `None` when
    they are something else (a backend tensor, a ragged list)."""
    if isinstance(value, dict):
        converted = {key: _as_arrays(part) for key, part in value.items()}
        return None if any(part is None for part in converted.values()) else converted
    if not isinstance(value, (np.ndarray, list, tuple)):
        return None
    try:
        array = np.asarray(value)
    except ValueError:
        return None
    return array if array.dtype != object and array.ndim >= 1 else None


def _rows_of(value):
    leaves = keras.tree.flatten(value)
    if not leaves or not all(isinstance(leaf, np.ndarray) and leaf.ndim for leaf in leaves):
        return None
    rows = {len(leaf) for leaf in leaves}
    return rows.pop() if len(rows) == 1 else None


def can_batch_by_length(model, x, y=None, sample_weight=None):
    """True when a task's `fit`/`evaluate`/`predict` input can be batched by length.

    That is: `model.length_batching` is on, `x` is a dict of 2-D NumPy arrays with exactly
    the model's inputs (`token_ids`, `segment_ids`, `padding_mask`; a packed backbone's
    `document_ids` are left alone), `y` and `sample_weight` are `None` or NumPy arrays (or
    dicts of them) with as many rows, and no distribution splits the batches. Everything
    else (datasets, generators, backend tensors) goes to Keras as given.
    """
    if not getattr(model, "length_batching", False) or not isinstance(x, dict):
        return False
    if set(x) != {"token_ids", "segment_ids", "padding_mask"}:
        return False
    if set(getattr(model, "input_names", ())) != set(x):
        return False
    arrays = list(x.values())
    if not all(isinstance(a, np.ndarray) and a.ndim == 2 for a in arrays):
        return False
    if len({a.shape for a in arrays}) != 1 or arrays[0].shape[0] == 0:
        return False
    rows = arrays[0].shape[0]
    for part in (y, sample_weight):
        if part is not None and _rows_of(_as_arrays(part)) != rows:
            return False
    return not _distributed(model)


def eager_torch(model):
    """True when `model` runs on torch without `jit_compile`: nothing is compiled per input
    shape, so batches may take any length."""
    return keras.backend.backend() == "torch" and not getattr(model, "jit_compile", False)


def model_buckets(model, sequence_length, training=False):
    """The bucket lengths a task pads its batches to (see `bucket_lengths`).

    `model.bucket_granularity` sets the step; when it is `None` (the default) the step
    follows the backend:

    - torch without `jit_compile` runs eagerly and compiles nothing per shape: step 1, every
      batch is padded only to its own longest row, as Hugging Face and sentence-transformers
      pad per batch;
    - JAX and TensorFlow (and torch with `jit_compile=True`) compile one program per input
      shape: `predict`/`evaluate` pad to steps of 4 tokens up to 64, 8 up to 128, 16 up to 256
      and 32 beyond (padding stays a small share of short rows: 8-token steps cost 1.28x the
      real tokens on 1,024 SQuAD questions, 4-token steps 1.13x; at most 24, 32 and 40 shapes
      at lengths 128, 256 and 512); `fit` (`training=True`), whose step costs more to compile,
      to the steps of `bucket_lengths` (16 up to length 128, else 32: at most 8 and 16 shapes
      at lengths 128 and 512).
    """
    granularity = getattr(model, "bucket_granularity", None)
    if granularity is None:
        if eager_torch(model):
            granularity = 1
        elif not training:
            return inference_buckets(sequence_length)
    return bucket_lengths(sequence_length, granularity)


# (last length of a tier, step inside it) of `inference_buckets`.
_INFERENCE_TIERS = ((64, 4), (128, 8), (256, 16), (None, 32))


def inference_buckets(sequence_length):
    """Bucket lengths with steps that grow with the length: 4 up to 64, 8 up to 128, 16 up to
    256, 32 beyond, then `sequence_length` itself.

    >>> inference_buckets(24)
    (4, 8, 12, 16, 20, 24)
    >>> len(inference_buckets(128)), len(inference_buckets(256)), len(inference_buckets(512))
    (24, 32, 40)
    """
    sequence_length = _positive_int(sequence_length, "sequence_length")
    buckets, length = [], 0
    for last, step in _INFERENCE_TIERS:
        while length + step < sequence_length and (last is None or length + step <= last):
            length += step
            buckets.append(length)
    return tuple(buckets) + (sequence_length,)


def length_batched(
    model, x, y=None, sample_weight=None, batch_size=None, shuffle=False, training=False
):
    """The planned batches of a task's packed NumPy data, for Keras' `fit` / `evaluate`.

    `training=True` (`fit`) takes the training buckets of `model_buckets`. Checks the ids
    once, whole (Keras does not look inside a `PyDataset`), and returns a
    `LengthBatches` (JAX, PyTorch) or its `tf.data.Dataset` (TensorFlow). Per-token labels
    and weights are cropped with the inputs when `model.sequence_targets` is true.
    """
    from kbert.models.input_checks import check_model_inputs

    check_model_inputs(x, model.backbone)
    sequence_length = x["padding_mask"].shape[1]
    batches = LengthBatches(
        x,
        _as_arrays(y) if y is not None else None,
        _as_arrays(sample_weight) if sample_weight is not None else None,
        batch_size=batch_size or _KERAS_DEFAULT_BATCH_SIZE,
        buckets=model_buckets(model, sequence_length, training=training),
        shuffle=shuffle,
        sequence_targets=getattr(model, "sequence_targets", False),
    )
    if keras.backend.backend() == "tensorflow":
        return batches.as_tf_dataset()
    return batches


def split_validation_tail(x, y, sample_weight, validation_split):
    """`(train, validation)` parts of NumPy data, each an `(x, y, sample_weight)` tuple: the
    last `validation_split` of the rows is the validation data, as Keras' `fit` takes it."""
    y = None if y is None else _as_arrays(y)
    sample_weight = None if sample_weight is None else _as_arrays(sample_weight)
    rows = _rows_of(x)
    split_at = int(math.floor(rows * (1.0 - validation_split)))
    if split_at == 0 or split_at == rows:
        raise ValueError(
            f"`validation_split={validation_split}` leaves no training or no validation rows "
            f"out of {rows}."
        )

    def part(start, stop):
        def take(value):
            return None if value is None else np.asarray(value)[start:stop]

        return tuple(
            None if value is None else keras.tree.map_structure(take, value)
            for value in (x, y, sample_weight)
        )

    return part(0, split_at), part(split_at, rows)


def _sequence_outputs(model):
    """Per output of the model: True when axis 1 is the (variable) sequence axis."""
    return keras.tree.map_structure(
        lambda spec: len(spec.shape) >= 2 and spec.shape[1] is None, model.output
    )


def predict_by_length(model, x, batch_size=None, verbose="auto", callbacks=None):
    """`model.predict` on packed NumPy inputs, batch by batch in length order.

    Rows are sorted by length (`plan_batches`), each batch is cropped to its bucket and run
    with `model.predict_on_batch`, and the outputs come back in the caller's row order;
    per-token outputs are padded back to the input's length with `model.prediction_fill_value`
    (0 unless the task says otherwise). Callbacks and the progress bar behave as in
    `keras.Model.predict` (a `keras.callbacks.CallbackList`, `on_predict_*` hooks).
    """
    from kbert.models.input_checks import check_model_inputs

    check_model_inputs(x, model.backbone)
    num_rows, sequence_length = x["token_ids"].shape
    plan = plan_batches(
        row_lengths(x["padding_mask"]),
        batch_size or _KERAS_DEFAULT_BATCH_SIZE,
        model_buckets(model, sequence_length),
    )
    if not isinstance(callbacks, keras.callbacks.CallbackList):
        callbacks = keras.callbacks.CallbackList(
            callbacks,
            add_progbar=verbose != 0,
            verbose=verbose,
            epochs=1,
            steps=len(plan),
            model=model,
        )
    collected = OrderedOutputs(
        num_rows,
        sequence_length,
        _sequence_outputs(model),
        fill_value=getattr(model, "prediction_fill_value", 0.0),
    )
    model.stop_predicting = False
    callbacks.on_predict_begin()
    for step, (rows, length) in enumerate(plan):
        callbacks.on_predict_batch_begin(step)
        outputs = model.predict_on_batch(crop_batch(x, rows, length))
        collected.add(rows, length, outputs)
        callbacks.on_predict_batch_end(step, {"outputs": outputs})
        if model.stop_predicting:
            break
    callbacks.on_predict_end()
    return collected.result()
