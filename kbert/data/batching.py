"""Length-aware batching: pad each batch only to the shortest bucket that holds its rows.

kbert's preprocessors pack every text to one fixed `sequence_length`. Run as is, a batch of
short texts spends most of its compute on padding. This module plans batches of rows of
similar length and crops each batch to the smallest of a small, fixed set of *bucket*
lengths that holds its longest row:

- `bucket_lengths(sequence_length, granularity)`: the fixed set, multiples of `granularity`
  up to `sequence_length` (which is always the last bucket). A compiling backend (JAX, and
  TensorFlow with or without XLA) therefore sees at most `len(buckets)` sequence lengths,
  i.e. `ceil(sequence_length / granularity)`, and at most one more batch size (the one short
  batch): at most `len(buckets) + 1` input shapes in all. `inference_buckets` has finer
  steps for short lengths; `model_buckets` picks the set for a Keras model (exact
  per-batch lengths on eager torch, where nothing is compiled per shape).
- `plan_batches(lengths, batch_size, buckets, shuffle, seed)`: which rows go together and
  their padded length. For `predict`/`evaluate` (`shuffle=False`) rows are sorted by length,
  longest first; for `fit` (`shuffle=True`) rows are drawn in a random order, grouped by
  length inside groups of `group_size` batches and the batches shuffled, as Hugging Face's
  `group_by_length` sampler does.
- `plan_tight_batches`: the same sorted rows cut where padding is least, for runtimes that
  take any shape at no cost (kbert.serving's onnxruntime and OpenVINO).
- `crop_batch` / `OrderedOutputs`: crop packed arrays (`token_ids`, `segment_ids`,
  `padding_mask`, per-token labels and weights) to a batch's bucket, and put the outputs of
  the planned batches back into the caller's row order, per-token outputs padded back to
  `sequence_length` with a fill value.
- `LengthBatches`: a `keras.utils.PyDataset` yielding the planned batches, which Keras'
  `fit`/`evaluate` consume on every backend; `LengthBatches.as_tf_dataset()` gives the
  same batches as a `tf.data.Dataset` with a variable sequence dimension (TensorFlow infers a
  `PyDataset`'s shapes from its first two batches, so it needs the explicit signature).
- `pack_rows`: several short rows in one row of a packed backbone's inputs.
- `batch_by_length`: the same bucketing for an unbatched, tokenized `tf.data.Dataset`.

Cropping changes no output at real positions: every kbert encoder masks padded keys, so the
positions past a row's last real token contribute nothing (up to float rounding, well below
1e-5 in float32). The task models' input pipeline (`kbert.models.pipeline`) batches their
packed NumPy data (raw text included) with this module in `fit`, `evaluate` and `predict`.

This module uses NumPy and Keras only at import; TensorFlow is imported by
`LengthBatches.as_tf_dataset` and `batch_by_length` alone.
"""

import math

import keras
import numpy as np

from kbert.backend import tensorflow

_FEATURES = ("token_ids", "segment_ids", "padding_mask")

# Granularity of the buckets when none is given: 16 up to length 128, 32 beyond.
_SHORT_GRANULARITY = 16
_LONG_GRANULARITY = 32


def _positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
    return int(value)


def bucket_lengths(sequence_length, granularity=None):
    """The padded lengths batches are cropped to: multiples of `granularity`, then the length.

    Args:
        sequence_length: int. The packed (longest) length.
        granularity: int or `None`. Step between buckets. `None` takes 16 for
            `sequence_length <= 128` and 32 beyond.

    Returns:
        Sorted tuple of ints ending with `sequence_length`; it has
        `ceil(sequence_length / granularity)` entries, the bound on the number of sequence
        lengths a model sees.

    Example:
    >>> bucket_lengths(128)
    (16, 32, 48, 64, 80, 96, 112, 128)
    >>> bucket_lengths(40, granularity=16)
    (16, 32, 40)
    """
    sequence_length = _positive_int(sequence_length, "sequence_length")
    if granularity is None:
        granularity = _SHORT_GRANULARITY if sequence_length <= 128 else _LONG_GRANULARITY
    granularity = _positive_int(granularity, "granularity")
    steps = range(granularity, sequence_length, granularity)
    return tuple(steps) + (sequence_length,)


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


def compiles_per_shape(model):
    """False when `model` runs on torch without `jit_compile`: nothing is compiled per input
    shape there, so batches may take any length. True on JAX and TensorFlow."""
    return keras.backend.backend() != "torch" or bool(getattr(model, "jit_compile", False))


def model_buckets(model, sequence_length, training=False, granularity=None):
    """The bucket lengths a Keras model's batches are padded to (see `bucket_lengths`).

    `granularity` sets the step; when it is `None` (the default) the step follows the
    backend:

    - torch without `jit_compile` runs eagerly and compiles nothing per shape: step 1, every
      batch is padded only to its own longest row, as Hugging Face and sentence-transformers
      pad per batch;
    - JAX and TensorFlow (and torch with `jit_compile=True`) compile one program per input
      shape: `predict`/`evaluate` pad to steps of 4 tokens up to 64, 8 up to 128, 16 up to 256
      and 32 beyond (padding stays a small share of short rows: 8-token steps cost 1.28x the
      real tokens on 1,024 SQuAD questions, 4-token steps 1.13x; at most 24, 32 and 40 shapes
      at lengths 128, 256 and 512); `fit` (`training=True`), whose step costs more to compile,
      to the steps of `bucket_lengths` (16 up to length 128, else 32: at most 8 and 16 shapes
      at lengths 128 and 512). On torch with `jit_compile=True`, where a compile (Inductor's
      code generation) costs far more than XLA's, `predict` and `evaluate` take the steps of
      `bucket_lengths` too.
    """
    if granularity is None:
        if not compiles_per_shape(model):
            granularity = 1
        elif not training and keras.backend.backend() != "torch":
            return inference_buckets(sequence_length)
    return bucket_lengths(sequence_length, granularity)


# Batches per group in which `plan_batches(shuffle=True)` sorts rows by length (Hugging
# Face's `LengthGroupedSampler` uses megabatches of 50 batches).
DEFAULT_GROUP_SIZE = 50


def row_lengths(padding_mask):
    """Per row, the index of its last real (non-zero mask) position plus one; 0 for none.

    Cropping a row to this length keeps every real position, even when the mask has holes.
    A mask `(batch_size, ..., sequence_length)` (e.g. `BertMultipleChoice`'s
    `(batch_size, num_choices, sequence_length)`) gives each row the longest of its parts.
    """
    mask = np.asarray(padding_mask) != 0
    if mask.ndim < 2:
        raise ValueError(
            "`padding_mask` must be (batch_size, ..., sequence_length). "
            f"Received shape {mask.shape}"
        )
    if mask.ndim > 2:  # Each row's sequences are cropped together: the longest counts.
        mask = mask.reshape(mask.shape[0], -1, mask.shape[-1]).any(axis=1)
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


def draw_seed():
    """A shuffle seed drawn from NumPy's global generator (`keras.utils.set_random_seed` seeds
    it, so seeded runs plan the same batches)."""
    return int(np.random.randint(0, 2**31 - 1))


def agreed_seed():
    """`draw_seed()`, the same on every process when training over several of
    `kbert.processes` (process 0's, sent to all: a collective, so every process calls it at
    the same point of `fit`); a seeded run repeats and draws what one process would draw."""
    from kbert import processes

    seed = draw_seed()
    if processes.process_count() == 1:
        return seed
    return int(processes.broadcast([np.array([seed], "int64")])[0][0])


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
            seed = draw_seed()
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


# The cost of one more call to a runtime that takes any shape, counted in padded positions:
# `plan_tight_batches` opens a new batch only where it saves more padding than this.
CALL_COST_POSITIONS = 64


def plan_tight_batches(lengths, batch_size, buckets, call_cost=CALL_COST_POSITIONS):
    """Rows sorted by length, longest first, cut into the batches of least padding.

    For runtimes that run every input shape at no extra cost (onnxruntime and OpenVINO with
    dynamic axes; not a compiling backend). `plan_batches` cuts the sorted rows every
    `batch_size` rows, so a batch whose lengths spread (a long question-paragraph pair with
    shorter ones) pads every row to its longest. Here the cuts are where the padded positions
    of all batches (rows x padded length), plus `call_cost` positions per batch, add up to
    the least (dynamic programming over the sorted rows, `O(rows x batch_size)`): batches
    hold at most `batch_size` rows, fewer where that saves padding. On ties the larger
    batch is kept.

    Args:
        lengths: 1-D ints, each row's real length.
        batch_size: int. Most rows per batch.
        buckets: increasing ints (see `bucket_lengths`); the last holds every row.
        call_cost: int >= 0. What one more batch costs, in padded positions. Defaults to
            `CALL_COST_POSITIONS`.

    Returns:
        List of `(row_indices, padded_length)` as `plan_batches(shuffle=False)`, longest
        first; every row is in exactly one batch.
    """
    lengths = np.asarray(lengths, dtype="int64").reshape(-1)
    batch_size = _positive_int(batch_size, "batch_size")
    if isinstance(call_cost, bool) or not isinstance(call_cost, (int, np.integer)) or call_cost < 0:
        raise ValueError(f"`call_cost` must be an int >= 0. Received: call_cost={call_cost!r}")
    padded = bucket_for(lengths, buckets)
    order = np.argsort(-lengths, kind="stable")
    sizes = padded[order]  # non-increasing: a batch starting at row i pads to sizes[i]
    count = len(order)
    best = np.zeros(count + 1, dtype="float64")  # best[i]: least cost of rows i..count-1
    end = np.zeros(count, dtype="int64")
    steps = np.arange(1, batch_size + 1, dtype="float64")
    for start in range(count - 1, -1, -1):
        after = best[start + 1 : start + 1 + batch_size]
        costs = steps[: len(after)] * sizes[start] + call_cost + after
        last = len(costs) - 1 - int(np.argmin(costs[::-1]))  # the largest of the cheapest
        best[start] = costs[last]
        end[start] = start + 1 + last
    plan, start = [], 0
    while start < count:
        rows = order[start : end[start]]
        plan.append((rows.astype("int64"), int(sizes[start])))
        start = int(end[start])
    return plan


def crop_batch(arrays, rows, length, sequence_keys=None, axis=1):
    """Rows `rows` of packed arrays, cropped to `length` positions.

    Args:
        arrays: an array, or a (nested) dict / tuple / list of arrays, all with the rows on
            axis 0; `None` leaves stay `None`.
        rows: int array of row indices.
        length: int. Positions kept on the sequence axis of the sequence arrays.
        sequence_keys: `None` to crop every array of rank >= 2, or a structure of booleans
            matching `arrays` that says which to crop (e.g. per-token labels yes, multi-hot
            class labels no).
        axis: `1` or `-1`. The sequence axis: `1` for per-token labels
            `(batch, sequence, ...)`, `-1` for model inputs, whose last axis is the sequence
            (`(batch, sequence)`, or `(batch, num_choices, sequence)` for
            `BertMultipleChoice`). Defaults to `1`.

    Returns:
        The same structure of NumPy arrays.
    """
    if axis not in (1, -1):
        raise ValueError(f"`axis` must be 1 or -1. Received: axis={axis!r}")

    def take(array, crop=True):
        if array is None:
            return None
        array = np.asarray(array)[rows]
        if crop and array.ndim >= 2:
            array = array[:, :length] if axis == 1 else array[..., :length]
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


class ShuffledRows(keras.utils.PyDataset):
    """Base of `PyDataset`s that serve `num_rows` rows in batches of `batch_size`, in a new
    random order each epoch (`shuffle`): `batch_rows(index)` gives batch `index`'s rows.
    `self.random` (seeded) is the dataset's generator, also for subclasses' own draws. Its
    seed: `seed`, or when `None` for shuffled rows one drawn under
    `keras.utils.set_random_seed` and agreed over processes (`agreed_seed`), so that a
    seeded run repeats and another seed draws other batches; 0 for rows in order."""

    def __init__(self, num_rows, batch_size, shuffle=True, seed=None):
        super().__init__()
        self.num_rows = int(num_rows)
        self.batch_size = _positive_int(batch_size, "batch_size")
        self.shuffle = bool(shuffle)
        if seed is None:
            seed = agreed_seed() if self.shuffle else 0
        self.random = np.random.default_rng(seed)
        self.order = np.arange(self.num_rows)
        if self.shuffle:
            self.random.shuffle(self.order)

    def __len__(self):
        return -(-self.num_rows // self.batch_size)

    def batch_rows(self, index):
        return self.order[index * self.batch_size : (index + 1) * self.batch_size]

    def on_epoch_end(self):
        if self.shuffle:
            self.random.shuffle(self.order)


class LengthBatches(keras.utils.PyDataset):
    """Planned, cropped batches of packed NumPy data, for Keras' `fit` and `evaluate`.

    Each item is `(x,)`, `(x, y)` or `(x, y, sample_weight)` for one batch of
    `plan_batches`, its arrays cropped to the batch's bucket. With `shuffle=True` every
    epoch gets a new plan (Keras calls `on_epoch_end`); the number of batches stays
    `ceil(num_rows / batch_size)`.

    Args:
        x: dict of packed arrays `(num_rows, sequence_length)` (or `(num_rows, ...,
            sequence_length)`: cropped on the last axis) with a `padding_mask`.
        y: labels or `None`; arrays or a dict of arrays with the rows on axis 0.
        sample_weight: `None` or an array with the rows on axis 0.
        batch_size: int.
        buckets: increasing ints ending with `sequence_length` (see `bucket_lengths`).
        shuffle: bool. Plan for training (see `plan_batches`). Defaults to `False`.
        seed: int or `None`. Seed of the first epoch's plan. Defaults to `None`.
        sequence_targets: bool. Crop `y` and `sample_weight` too (per-token labels).
            Defaults to `False`.
        num_processes, process_index: ints. Training over several processes
            (`kbert.models.multiprocess`): every process plans the same batches (same
            `seed`) and takes slice `process_index` of `num_processes` equal slices of each;
            a batch of `n` rows leaves its last `n % num_processes` rows out (`dropped_rows`
            per epoch), a batch of fewer rows than processes is left out. Defaults to one.
        row_multiple: int. In one process whose devices split every batch (a
            `keras.distribution` or `tf.distribute` strategy over `row_multiple` devices):
            each planned batch keeps a multiple of `row_multiple` rows, its first ones (the
            others counted in `dropped_rows`). Defaults to 1.
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
        num_processes=1,
        process_index=0,
        row_multiple=1,
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
        self.num_processes = _positive_int(num_processes, "num_processes")
        if not 0 <= process_index < self.num_processes:
            raise ValueError(
                f"`process_index` must be in [0, {self.num_processes}). "
                f"Received: process_index={process_index!r}"
            )
        self.process_index = int(process_index)
        self.row_multiple = _positive_int(row_multiple, "row_multiple")
        self._seed = seed
        self._epoch = 0
        self.dropped_rows = 0
        self.plan = self._plan(self._epoch)

    def _plan(self, epoch):
        seed = self._seed
        if self.shuffle and seed is not None:
            seed = seed + epoch
        plan = plan_batches(
            self.lengths, self.batch_size, self.buckets, shuffle=self.shuffle, seed=seed
        )
        if self.num_processes == 1 and self.row_multiple == 1:
            return plan
        own, self.dropped_rows = [], 0
        parts = self.num_processes * self.row_multiple
        for rows, length in plan:
            share = len(rows) // parts * self.row_multiple
            self.dropped_rows += len(rows) - share * self.num_processes
            if share:
                first = self.process_index * share
                own.append((rows[first : first + share], length))
        return own

    def __len__(self):
        return len(self.plan)

    def __getitem__(self, index):
        return self._batch(*self.plan[index])

    def _batch(self, rows, length):
        x = crop_batch(self.x, rows, length, axis=-1)
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
            self.plan = self._plan(self._epoch)

    def epoch_callback(self):
        """A Keras callback that calls `on_epoch_end` at the end of each training epoch (for
        `as_tf_dataset(new_plan_each_pass=False)`)."""
        batches = self

        class NewPlanEachEpoch(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                batches.on_epoch_end()

        return NewPlanEachEpoch()

    def epoch_batches(self, epoch):
        """The items of epoch `epoch` (0, 1, ...), planned with seed + epoch, without changing
        the current plan (for generators that count their own epochs)."""
        for rows, length in self._plan(epoch):
            yield self._batch(rows, length)

    def as_tf_dataset(self, new_plan_each_pass=True):
        """The batches as a `tf.data.Dataset` whose sequence dimension is variable.

        With `new_plan_each_pass` each iteration over the dataset after the first starts with
        a new plan (when shuffling), as `on_epoch_end` does for Keras' own `PyDataset` loop.
        Keras' `fit` may iterate a dataset once more before its first epoch (to build the
        metrics), so a `fit` that must follow the plans epoch by epoch passes `False` and
        calls `on_epoch_end` at each epoch's end itself (`epoch_callback`).
        """
        tf = tensorflow.tensorflow("Length batches as a tf.data.Dataset")

        first = self[0]

        def spec(value, is_sequence, axis=1):
            value = np.asarray(value)
            shape = [None] + list(value.shape[1:])
            if is_sequence and value.ndim >= 2:
                shape[axis] = None
            return tf.TensorSpec(shape, tf.as_dtype(value.dtype))

        # Inputs have the sequence last; per-token labels on axis 1 (see `crop_batch`).
        signature = [keras.tree.map_structure(lambda v: spec(v, True, -1), first[0])]
        for part in first[1:]:
            signature.append(
                keras.tree.map_structure(lambda v: spec(v, self.sequence_targets), part)
            )

        passes = [0]

        def generate():
            if passes[0] and new_plan_each_pass:  # A new epoch: a new plan when shuffling.
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


def as_arrays(value):
    """Labels or weights as a NumPy array or a dict of them (lists converted); `None` when
    they are something else (a backend tensor, a ragged list)."""
    if isinstance(value, dict):
        converted = {key: as_arrays(part) for key, part in value.items()}
        return None if any(part is None for part in converted.values()) else converted
    if not isinstance(value, (np.ndarray, list, tuple)):
        return None
    try:
        array = np.asarray(value)
    except ValueError:
        return None
    return array if array.dtype != object and array.ndim >= 1 else None


def rows_of(value):
    """The common number of rows of a structure of NumPy arrays, or `None`."""
    leaves = keras.tree.flatten(value)
    if not leaves or not all(isinstance(leaf, np.ndarray) and leaf.ndim for leaf in leaves):
        return None
    rows = {len(leaf) for leaf in leaves}
    return rows.pop() if len(rows) == 1 else None


def split_tail(x, y, sample_weight, validation_split):
    """`(train, validation)` parts of NumPy data, each an `(x, y, sample_weight)` tuple: the
    last `validation_split` of the rows is the validation data, as Keras' `fit` takes it."""
    y = None if y is None else as_arrays(y)
    sample_weight = None if sample_weight is None else as_arrays(sample_weight)
    rows = rows_of(x)
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


# ---------------------------------------------------------------------------------- tf.data
def _features_of(element):
    if isinstance(element, dict):
        return element
    if isinstance(element, (tuple, list)) and element and isinstance(element[0], dict):
        return element[0]
    return None


def batch_by_length(
    dataset,
    batch_size,
    sequence_length=None,
    granularity=None,
    crop_labels=False,
    drop_remainder=False,
):
    """Batches an unbatched dataset of packed rows by length, each batch cropped to a bucket.

    Rows are grouped by bucket (`tf.data.Dataset.group_by_window`): each bucket fills its
    own batch of `batch_size` rows in the order the rows arrive, so shuffle *before* this
    call (`dataset.shuffle(...)`) for training; the batches come out in the order they
    fill. The rows of a batch are cropped to the smallest bucket length holding the
    batch's longest row (the last real position of `padding_mask`); real positions are
    never cut. The order of rows changes, so use it for `fit` and `evaluate` (metrics are
    order-free); `predict` on NumPy or raw text batches by length itself and keeps the
    caller's order.

    Args:
        dataset: `tf.data.Dataset` of unbatched elements: a dict with `token_ids`,
            `segment_ids` and `padding_mask` (each `(sequence_length,)`), or an `(x, y)` /
            `(x, y, sample_weight)` tuple with such a dict as `x`. Other keys of the dict
            (with the same length) are cropped too.
        batch_size: int. Rows per batch.
        sequence_length: int or `None`. The packed length; `None` reads it from the
            dataset's `padding_mask` spec.
        granularity: int or `None`. Step between bucket lengths (see
            `bucket_lengths`; `None`: 16 up to length 128, else 32).
        crop_labels: bool. Also crop `y` and `sample_weight` (per-token labels, as for
            `BertTagger`). Defaults to `False`.
        drop_remainder: bool. Drop each bucket's last, incomplete batch (a fixed batch
            size, e.g. to split batches evenly over devices). Defaults to `False`.

    Returns:
        A `tf.data.Dataset` of batches whose sequence dimension varies from batch to batch.

    Example:
    >>> import tensorflow as tf
    >>> tokenizer = kbert.text.BertTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"])
    >>> preprocessor = kbert.text.BertPreprocessor(tokenizer, sequence_length=64)
    >>> texts, labels = ["a", "a " * 20, "a a", "a " * 30], [0, 1, 0, 1]
    >>> dataset = tf.data.Dataset.from_tensor_slices((preprocessor(texts), labels))
    >>> batches = batch_by_length(dataset, batch_size=2)  # then `model.fit(batches)`
    >>> [(x["token_ids"].shape[1], y.numpy().tolist()) for x, y in batches]  # (length, labels)
    [(16, [0, 0]), (32, [1, 1])]
    """
    tf = tensorflow.tensorflow("kbert.data.batch_by_length")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"`batch_size` must be a positive integer. Received: {batch_size!r}")
    spec = _features_of(dataset.element_spec)
    if spec is None or any(key not in spec for key in _FEATURES):
        raise ValueError(
            "batch_by_length expects elements that are a dict with keys "
            f"{list(_FEATURES)} or an (x, y[, sample_weight]) tuple with such a dict. "
            f"Received element_spec: {dataset.element_spec}"
        )
    mask_shape = spec["padding_mask"].shape
    if mask_shape.rank != 1:
        raise ValueError(
            "batch_by_length expects unbatched rows (`padding_mask` of shape "
            f"(sequence_length,)). Received shape {mask_shape}; call it before `.batch()`."
        )
    if sequence_length is None:
        sequence_length = mask_shape[0]
        if sequence_length is None:
            raise ValueError("The dataset's sequence length is not static: pass `sequence_length`.")
    buckets = tf.constant(bucket_lengths(sequence_length, granularity), tf.int64)

    def row_length(*element):
        features = _features_of(element[0] if len(element) == 1 else element)
        mask = tf.cast(features["padding_mask"], tf.bool)
        positions = tf.range(1, tf.shape(mask, out_type=tf.int64)[0] + 1)
        return tf.reduce_max(tf.where(mask, positions, tf.zeros_like(positions)))

    def bucket_index(*element):
        length = tf.reshape(row_length(*element), [1])
        return tf.searchsorted(buckets, length, out_type=tf.int64)[0]

    def crop(*batch):
        features = _features_of(batch[0] if len(batch) == 1 else batch)
        mask = tf.cast(features["padding_mask"], tf.bool)
        positions = tf.range(1, tf.shape(mask, out_type=tf.int64)[1] + 1)
        longest = tf.reduce_max(tf.where(mask, positions, tf.zeros_like(positions)))
        length = tf.gather(buckets, tf.searchsorted(buckets, tf.reshape(longest, [1]))[0])

        def cut(value):
            return value[:, :length] if value.shape.rank >= 2 else value

        x = {key: cut(value) for key, value in features.items()}
        if len(batch) == 1 and isinstance(batch[0], dict):
            return x
        rest = batch[1:]
        if crop_labels:
            rest = tuple(tf.nest.map_structure(cut, part) for part in rest)
        return (x,) + tuple(rest)

    batched = dataset.group_by_window(
        key_func=bucket_index,
        reduce_func=lambda _, window: window.batch(batch_size, drop_remainder=drop_remainder),
        window_size=batch_size,
    )
    return batched.map(crop, num_parallel_calls=tf.data.AUTOTUNE)
