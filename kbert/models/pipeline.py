"""PipelineModel: the one input pipeline of kbert's task models.

`fit`, `evaluate`, `predict` and the `*_on_batch` methods of every task (and of the text
embedder) take their input through one route, in this order:

1. **Raw input -> packed arrays** (`preprocess_samples`, the task's hook): raw strings,
   `(a, b)` pairs and lists of pairs are read once (`text_parts`), tokenized by the attached
   preprocessor's tokenizer and packed by its `kbert.text.BertPacker`; a `tf.data.Dataset` of
   strings is mapped through the preprocessor; tasks add their own raw forms (words and word
   labels, questions and contexts, text columns) and check their labels here.
2. **Ids checked once** (`kbert.models.input_checks.check_data`): packed NumPy arrays whole,
   on the host, before any step; a `tf.data.Dataset` in its own pipeline.
3. **Batched by length** (`kbert.data.batching`): packed NumPy data is planned into batches
   of rows of similar length, each cropped to the smallest bucket length holding its rows;
   `fit` and `evaluate` hand Keras a `LengthBatches`, `predict` runs the planned batches and
   returns the outputs in the caller's order. Datasets, generators, `steps`, distributed
   runs and `length_batching = False` go to Keras as given.
4. **Keras' own loops** (`keras.Model.fit` through `kbert.models.multiprocess`,
   `evaluate`, `predict_on_batch`), with the callbacks and progress bar Keras gives them.

The batches of step 3 are not checked again: a model's `call` checks only inputs that reach
it in host memory (`model(x)` with NumPy), and the planned `predict` batches reach it as
backend tensors.

This module uses keras.ops and NumPy only; TensorFlow is reached through `kbert.backend.tensorflow`
when the input is a `tf.data.Dataset`.
"""

import math
import warnings

import keras
import numpy as np

from kbert import backend, processes
from kbert.backend.tensorflow import is_dataset
from kbert.data import batching
from kbert.models import process_inference
from kbert.models.backbone import BACKBONE_INPUTS, check_input_keys
from kbert.models.input_checks import check_data, check_model_inputs
from kbert.models.multiprocess import MultiProcessTraining, batch_axis_size

# Rows sent through the tokenizer and packer at a time when raw Python text is converted.
_PREPROCESS_CHUNK = 4096
# Keras' own default when `fit`/`evaluate`/`predict` get arrays and no `batch_size`.
KERAS_DEFAULT_BATCH_SIZE = 32


# ------------------------------------------------------------------------------ raw text
def _is_text(value):
    """True for one string or a batch of them (list, NumPy array, TensorFlow string tensor)."""
    if isinstance(value, (str, bytes)):
        return True
    if isinstance(value, np.ndarray):
        return value.dtype.kind in "US" or (
            value.dtype.kind == "O" and any(isinstance(v, (str, bytes)) for v in value.flat)
        )
    if isinstance(value, list):  # Any string makes it text: other items get an error by index.
        return any(isinstance(item, (str, bytes)) for item in value)
    return getattr(getattr(value, "dtype", None), "name", None) == "string"


def is_raw_text(x):
    """True when `x` is text: a string, a batch of strings, an `(a, b)` pair of batches or a
    list of `(a, b)` string pairs. `text_parts` turns such an `x` into lists of `str`."""
    if isinstance(x, tuple) and len(x) in (1, 2):
        return all(_is_text(part) for part in x)
    if isinstance(x, list) and x and isinstance(x[0], tuple):  # [(a, b), ...]
        return len(x[0]) == 2 and all(isinstance(part, (str, bytes)) for part in x[0])
    return _is_text(x)


def text_parts(x):
    """Raw text (see `is_raw_text`) as a list of one or two equally long lists of `str`.

    The one place where kbert reads the shapes raw text comes in and checks its items:
    single strings, batches, `(first, second)` batches and lists of `(first, second)` pairs;
    bytes are decoded as UTF-8.
    """
    if isinstance(x, list) and x and isinstance(x[0], tuple):
        bad = [i for i, pair in enumerate(x) if not (isinstance(pair, tuple) and len(pair) == 2)]
        if bad:
            raise ValueError(
                f"Expected every item to be a (first, second) pair of strings. Item {bad[0]} is "
                f"{x[bad[0]]!r}"
            )
        x = ([pair[0] for pair in x], [pair[1] for pair in x])
    parts = [_as_text_list(part) for part in (x if isinstance(x, tuple) else (x,))]
    if len(parts) == 2 and len(parts[0]) != len(parts[1]):
        raise ValueError(
            "The two parts of a sentence pair must have the same number of rows. "
            f"Received: {len(parts[0])} and {len(parts[1])}"
        )
    if not parts[0]:
        raise ValueError("Received an empty batch of strings.")
    return parts


def _as_text_list(x):
    """A batch of strings as a Python list of `str` (bytes are decoded as UTF-8)."""
    if isinstance(x, (str, bytes)):
        x = [x]
    if hasattr(x, "numpy") and not isinstance(x, np.ndarray):
        x = x.numpy()
    values = x.tolist() if isinstance(x, np.ndarray) else list(x)
    out = []
    for index, value in enumerate(values):
        if isinstance(value, bytes):
            value = value.decode("utf-8", errors="replace")
        if not isinstance(value, str):
            raise ValueError(
                f"Expected a batch of strings. The item at index {index} is of type "
                f"{type(value).__name__}: {value!r}"
            )
        out.append(value)
    return out


def dataset_has_strings(dataset):
    """True when the elements of a `tf.data.Dataset` hold a string tensor anywhere."""
    leaves = keras.tree.flatten(dataset.element_spec)
    return any(getattr(getattr(spec, "dtype", None), "name", None) == "string" for spec in leaves)


def _is_empty_batch(x):
    """True for an empty list/tuple/array, or a dict/tuple of them, given to `predict`."""
    if isinstance(x, dict):
        return len(x) > 0 and all(_is_empty_batch(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        if len(x) == 0:
            return True
        return isinstance(x, tuple) and all(
            isinstance(part, (list, tuple, np.ndarray)) and len(part) == 0 for part in x
        )
    if isinstance(x, np.ndarray):
        return x.size == 0 or (x.ndim >= 1 and x.shape[0] == 0)
    return False


def _num_rows(x):
    """Number of examples in an array, a list, or a dict / tuple of arrays."""
    if isinstance(x, dict):
        x = next(iter(x.values()))
    elif isinstance(x, (tuple, list)) and x and hasattr(x[0], "shape"):
        x = x[0]
    return len(x)


_UNKNOWN_CARDINALITY = -2  # tf.data.UNKNOWN_CARDINALITY (-1 is INFINITE)


def _cardinality(dataset):
    try:
        return int(dataset.cardinality())
    except (TypeError, ValueError):
        return None


def _count_batches(dataset):
    """Number of elements of a `tf.data.Dataset` (one pass over it); `None` when it is empty."""
    count = int(dataset.reduce(np.int64(0), lambda count, *_: count + 1))
    return count or None


def check_class_ids(labels, num_classes, name):
    """Raises a ValueError unless every entry of `labels` is an integer in `[0, num_classes)`."""
    labels = np.asarray(labels)
    if labels.size == 0:
        return
    if labels.dtype.kind == "f":
        if not np.all(np.isfinite(labels)) or np.any(labels != np.round(labels)):
            raise ValueError(
                f"`{name}` must be integer class ids in [0, {num_classes}). "
                "Received non-integer values, e.g. "
                f"{labels[labels != np.round(labels)][:5].tolist()}"
            )
    elif labels.dtype.kind not in "biu":
        raise ValueError(
            f"`{name}` must be integer class ids in [0, {num_classes}). "
            f"Received dtype {labels.dtype} (e.g. {labels.ravel()[:3].tolist()})"
        )
    low, high = labels.min(), labels.max()
    if low < 0 or high >= num_classes:
        bad = np.unique(labels[(labels < 0) | (labels >= num_classes)])
        raise ValueError(
            f"`{name}` must lie in [0, num_classes) = [0, {num_classes}). "
            f"Received out-of-range values {bad[:10].astype(int).tolist()}"
        )


def _as_tensors(x):
    """A batch of NumPy arrays as backend tensors (what Keras' predict step makes of them)."""
    return {key: keras.ops.convert_to_tensor(value) for key, value in x.items()}


class PipelineModel(MultiProcessTraining, keras.Model):
    """A `keras.Model` whose `fit`, `evaluate`, `predict` and `*_on_batch` share one input
    pipeline (see the module docstring); the base of `kbert.models.BertTask`.

    A subclass sets `self.backbone` (the `BertBackbone` whose limits the ids are checked
    against) and may override `preprocess_samples` for its own raw input and `_check_labels`
    for its labels. `preprocessor` (a `kbert.text.BertPreprocessor` or `None`) turns raw
    strings into packed inputs.

    Attributes that steer the batching (class attributes; set them on a model to change it):
        length_batching: bool. Batch packed NumPy data (raw text included) by length.
            `False` pads every batch to the full length. Defaults to `True`.
        bucket_granularity: int or `None`. Step between bucket lengths; `None` follows the
            backend (see `kbert.data.batching.model_buckets`). Defaults to `None`.
        sequence_targets: bool. Labels and sample weights are per token and are cropped
            with the inputs. Defaults to `False`.
        prediction_fill_value: float. Value of per-token `predict` outputs past a row's
            bucket (never at real positions). Defaults to `0.0`.
    """

    # Keys of the model's input dict.
    input_names = BACKBONE_INPUTS
    # Rank of each packed input array: `(batch, sequence)`; `BertMultipleChoice` packs
    # `(batch, num_choices, sequence)`. Length batching crops the last axis.
    packed_input_ndim = 2
    length_batching = True
    bucket_granularity = None
    sequence_targets = False
    prediction_fill_value = 0.0

    def __init__(self, *args, preprocessor=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.preprocessor = preprocessor
        # The train (test) function a `train_on_batch` (`test_on_batch`) through Keras' own
        # last ran (torch only).
        self._repeat_train = None
        self._repeat_test = None

    def call(self, inputs, training=None, mask=None):
        check_input_keys(inputs, self.input_names, type(self).__name__)
        inputs = backend.strategy_build_inputs(inputs)
        check_model_inputs(inputs, self.backbone)
        outputs = backend.lean_task_outputs(self, inputs, training)
        if outputs is not None:
            return outputs
        return super().call(inputs, training=training, mask=mask)

    # ------------------------------------------------------------ raw input (hooks)
    @property
    def tokenizer(self):
        """The attached preprocessor's tokenizer, or `None`."""
        return getattr(self.preprocessor, "tokenizer", None)

    def _require_preprocessor(self, what):
        if self.preprocessor is None:
            raise ValueError(
                f"{type(self).__name__} received {what} but has no preprocessor to turn them into "
                "token ids. Build the model with `from_preset(<directory with vocab.txt>)` or pass "
                "`preprocessor=kbert.text.BertPreprocessor(...)`; otherwise give packed dicts with "
                f"keys {list(BACKBONE_INPUTS)}."
            )

    def _preprocess_text(self, x):
        """Raw strings or `(a, b)` pairs -> packed int32 NumPy arrays: the strings are read
        once (`text_parts`), then tokenized and packed by the preprocessor's tokenizer and
        packer, in chunks of rows."""
        self._require_preprocessor("raw strings")
        parts = text_parts(x)
        tokenizer, packer = self.preprocessor.tokenizer, self.preprocessor.packer
        chunks = []
        for start in range(0, len(parts[0]), _PREPROCESS_CHUNK):
            ids = tuple(
                tokenizer.tokenize(part[start : start + _PREPROCESS_CHUNK]) for part in parts
            )
            chunks.append(packer(ids))
        if len(chunks) == 1:
            return chunks[0]
        return {k: np.concatenate([c[k] for c in chunks]) for k in BACKBONE_INPUTS}

    def _check_labels(self, y):
        """Raises a ValueError for labels this task cannot train on; returns the labels as the
        model takes them (overridden by tasks)."""
        return y

    def preprocess_samples(self, x, y=None, sample_weight=None, mode="fit", batch_size=None):
        """Maps what the user gave to `fit`/`evaluate`/`predict` onto packed model inputs.

        The task's hook of the pipeline (step 1 of the module docstring): labels are checked
        (`_check_labels`), raw text goes through the preprocessor, a `tf.data.Dataset` of
        strings is mapped through it. Tasks override it for their own raw input.

        Args:
            x, y, sample_weight: as given to `fit`/`evaluate`/`predict`.
            mode: `"fit"`, `"evaluate"` or `"predict"`.
            batch_size: the batch size of the call (for tasks that batch their raw input
                themselves), or `None`.

        Returns:
            `(x, y, sample_weight)`.
        """
        if is_dataset(x):
            if self.preprocessor is not None and dataset_has_strings(x):
                return x.map(self.preprocessor, num_parallel_calls=-1), None, None
            return x, y, sample_weight
        if y is not None and not is_dataset(y):
            y = self._check_labels(y)
        if is_raw_text(x):
            x = self._preprocess_text(x)
        return x, y, sample_weight

    # ----------------------------------------------------------------- the route
    def _prepare(self, x, y=None, sample_weight=None, mode="fit", batch_size=None):
        """Steps 1 and 2 of the pipeline: `preprocess_samples`, then the ids checked once."""
        x, y, sample_weight = self.preprocess_samples(x, y, sample_weight, mode, batch_size)
        return check_data(x, self.backbone), y, sample_weight

    def _prepare_validation_data(self, validation_data, batch_size=None):
        if validation_data is None:
            return None
        if is_dataset(validation_data):
            return self._prepare(validation_data, mode="evaluate")[0]
        if not isinstance(validation_data, (tuple, list)) or len(validation_data) not in (2, 3):
            raise ValueError(
                "`validation_data` must be a dataset or a tuple (x, y) or (x, y, sample_weight). "
                f"Received: {type(validation_data).__name__}"
            )
        prepared = self._prepare(*validation_data, mode="evaluate", batch_size=batch_size)
        return prepared if prepared[2] is not None else prepared[:2]

    # ---------------------------------------------------------- length batching
    def _distributed(self, over_processes=True):
        """True under a `keras.distribution` of several devices, several processes (unless
        `over_processes=False`: this process' own share) or a multi-replica `tf.distribute`
        strategy: Keras' own loops (or `kbert.models.multiprocess`) split those batches, so
        the data is left to them."""
        if over_processes and processes.process_count() > 1:
            return True
        distribution = keras.distribution.distribution()
        if distribution is not None and np.size(distribution.device_mesh.devices) > 1:
            return True  # A distribution over one device (one process) splits nothing.
        strategy = getattr(self, "distribute_strategy", None)
        return getattr(strategy, "num_replicas_in_sync", 1) > 1

    def _local_replicas(self):
        """Devices of this process that split every batch: those of the batch axis of a
        `keras.distribution` (1 without one)."""
        distribution = keras.distribution.distribution()
        return 1 if distribution is None else batch_axis_size(distribution)

    def _can_batch_by_length(self, x, y=None, sample_weight=None, over_processes=True):
        """True when `fit`/`evaluate`/`predict` input can be batched by length here, in one
        process: `length_batchable` and no distribution splits the batches."""
        return self.length_batchable(x, y, sample_weight) and not self._distributed(over_processes)

    def length_batchable(self, x, y=None, sample_weight=None):
        """True when the data can be planned in length batches (also over several processes).

        That is: `length_batching` is on, `x` is a dict of NumPy arrays of rank
        `packed_input_ndim` (2: `(batch, sequence)`) with exactly the
        model's inputs (`token_ids`, `segment_ids`, `padding_mask`; a packed backbone's
        `document_ids` are left alone), `y` and `sample_weight` are `None` or NumPy arrays (or
        dicts of them) with as many rows.
        """
        if not self.length_batching or not isinstance(x, dict):
            return False
        if set(x) != {"token_ids", "segment_ids", "padding_mask"} or set(self.input_names) != set(
            x
        ):
            return False
        arrays = list(x.values())
        if not all(isinstance(a, np.ndarray) and a.ndim == self.packed_input_ndim for a in arrays):
            return False
        if len({a.shape for a in arrays}) != 1 or arrays[0].shape[0] == 0:
            return False
        rows = arrays[0].shape[0]
        for part in (y, sample_weight):
            if part is not None and batching.rows_of(batching.as_arrays(part)) != rows:
                return False
        return True

    def bucket_lengths(self, sequence_length, training=False):
        """The lengths this model pads its batches to (`kbert.data.batching.model_buckets`
        with the model's `bucket_granularity`); `training=True`: `fit`'s."""
        return batching.model_buckets(
            self, sequence_length, training=training, granularity=self.bucket_granularity
        )

    def planned_batches(self, x, y=None, sample_weight=None, batch_size=None, **kwargs):
        """A `kbert.data.batching.LengthBatches` of checked, packed NumPy data with this
        model's buckets (`training=True`: `fit`'s); `shuffle`, `seed`, `num_processes` and
        `process_index` as there. Training draws one seed from NumPy's global generator
        (each epoch plans with seed + epoch), so `keras.utils.set_random_seed` repeats a run
        and several processes that agree on the seed plan the same batches."""
        training = kwargs.pop("training", False)
        if kwargs.get("shuffle") and kwargs.get("seed") is None:
            kwargs["seed"] = batching.draw_seed()
        return batching.LengthBatches(
            x,
            None if y is None else batching.as_arrays(y),
            None if sample_weight is None else batching.as_arrays(sample_weight),
            batch_size=batch_size or KERAS_DEFAULT_BATCH_SIZE,
            buckets=self.bucket_lengths(x["padding_mask"].shape[-1], training=training),
            sequence_targets=self.sequence_targets,
            **kwargs,
        )

    def _length_batches(
        self,
        x,
        y=None,
        sample_weight=None,
        batch_size=None,
        shuffle=False,
        training=False,
        row_multiple=1,
    ):
        """The planned batches of checked, packed NumPy data, for Keras' `fit` / `evaluate`:
        `(data, batches)`, `data` the `LengthBatches` `batches` (JAX, PyTorch) or its
        `tf.data.Dataset` (TensorFlow; for training, whose plan `batches.epoch_callback()`
        renews at each epoch's end)."""
        batches = self.planned_batches(
            x,
            y,
            sample_weight,
            batch_size,
            shuffle=shuffle,
            training=training,
            row_multiple=row_multiple,
        )
        if keras.backend.backend() == "tensorflow":
            return batches.as_tf_dataset(new_plan_each_pass=not training), batches
        return batches, batches

    def _batch_fit_data(
        self, x, y, sample_weight, batch_size, validation_data, validation_split, fit_kwargs
    ):
        """`fit`'s NumPy data (and validation data) as length-planned batches, when it can be;
        otherwise everything as given. Returns `(x, y, sample_weight, batch_size,
        validation_data, validation_split)` and updates `fit_kwargs`."""
        validation_size = fit_kwargs.get("validation_batch_size") or batch_size
        if isinstance(validation_data, tuple) and self._can_batch_by_length(*validation_data):
            fit_kwargs.pop("validation_batch_size", None)
            validation_data = self._length_batches(*validation_data, batch_size=validation_size)[0]
        strategy = getattr(self, "distribute_strategy", None)
        if (
            not self.length_batchable(x, y, sample_weight)
            or processes.process_count() > 1
            or getattr(strategy, "num_replicas_in_sync", 1) > 1  # tf.distribute splits them
        ):
            return x, y, sample_weight, batch_size, validation_data, validation_split
        # Devices that split each batch: the planned batches keep a multiple of them.
        row_multiple = self._local_replicas()
        if row_multiple > 1 and (batch_size or KERAS_DEFAULT_BATCH_SIZE) % row_multiple:
            raise ValueError(
                f"The batch size must be divisible by the {row_multiple} devices that share "
                f"each batch. Received: batch_size={batch_size or KERAS_DEFAULT_BATCH_SIZE}. "
                f"Use a multiple of {row_multiple}."
            )
        if validation_split and validation_data is None:
            (x, y, sample_weight), held_out = batching.split_tail(
                x, y, sample_weight, validation_split
            )
            fit_kwargs.pop("validation_batch_size", None)
            validation_data = self._length_batches(*held_out, batch_size=validation_size)[0]
        shuffle = bool(fit_kwargs.get("shuffle", True))
        x, batches = self._length_batches(
            x, y, sample_weight, batch_size, shuffle, training=True, row_multiple=row_multiple
        )
        if batches.dropped_rows:
            warnings.warn(
                f"Batches of {batch_size} rows or fewer do not split evenly over the "
                f"{row_multiple} devices of the distribution: {batches.dropped_rows} rows are "
                "left out of each epoch.",
                stacklevel=3,
            )
        if is_dataset(x) and shuffle:
            callbacks = fit_kwargs.get("callbacks") or []
            if not isinstance(callbacks, keras.callbacks.CallbackList):
                fit_kwargs["callbacks"] = [*callbacks, batches.epoch_callback()]
        # The plan shuffles (Keras would shuffle a PyDataset's batch order again, and ignores
        # `shuffle` for datasets): several processes then run the same order.
        fit_kwargs["shuffle"] = False
        return x, None, None, None, validation_data, 0.0

    def _sequence_outputs(self):
        """Per output of the model: True when axis 1 is the (variable) sequence axis."""
        return keras.tree.map_structure(
            lambda spec: len(spec.shape) >= 2 and spec.shape[1] is None, self.output
        )

    def _predict_by_length(self, x, batch_size=None, verbose="auto", callbacks=None):
        """`predict` on checked, packed NumPy inputs, batch by batch in length order.

        Rows are sorted by length (`kbert.data.batching.plan_batches`), each batch is cropped
        to its bucket and run with Keras' `predict_on_batch`, and the outputs come back in the
        caller's row order; per-token outputs are padded back to the input's length with
        `prediction_fill_value`. Callbacks and the progress bar behave as in
        `keras.Model.predict` (a `keras.callbacks.CallbackList`, `on_predict_*` hooks).
        """
        num_rows, sequence_length = x["token_ids"].shape[0], x["token_ids"].shape[-1]
        plan = batching.plan_batches(
            batching.row_lengths(x["padding_mask"]),
            batch_size or KERAS_DEFAULT_BATCH_SIZE,
            self.bucket_lengths(sequence_length),
        )
        if not isinstance(callbacks, keras.callbacks.CallbackList):
            callbacks = keras.callbacks.CallbackList(
                callbacks,
                add_progbar=verbose != 0,
                verbose=verbose,
                epochs=1,
                steps=len(plan),
                model=self,
            )
        collected = batching.OrderedOutputs(
            num_rows,
            sequence_length,
            self._sequence_outputs(),
            fill_value=self.prediction_fill_value,
        )
        self.stop_predicting = False
        callbacks.on_predict_begin()
        for step, (rows, length) in enumerate(plan):
            callbacks.on_predict_batch_begin(step)
            batch = _as_tensors(batching.crop_batch(x, rows, length, axis=-1))
            outputs = keras.Model.predict_on_batch(self, batch)
            collected.add(rows, length, outputs)
            callbacks.on_predict_batch_end(step, {"outputs": outputs})
            if self.stop_predicting:
                break
        callbacks.on_predict_end()
        return collected.result()

    # -------------------------------------------------------------- Keras' loops
    def _steps_per_epoch(self, x, batch_size, steps_per_epoch, validation_split):
        """Batches one epoch of `fit` will run, or `None` when the input does not say."""
        if steps_per_epoch is not None:
            return steps_per_epoch
        if is_dataset(x):
            cardinality = _cardinality(x)
            return cardinality if cardinality is not None and cardinality > 0 else None
        if isinstance(x, keras.utils.PyDataset):
            return len(x)
        try:
            rows = _num_rows(x)
        except TypeError:  # A generator or another iterable without a length.
            return None
        if validation_split:
            rows = int(math.ceil(rows * (1.0 - validation_split)))
        return int(math.ceil(rows / (batch_size or KERAS_DEFAULT_BATCH_SIZE)))

    def _count_fit_steps(self, x, batch_size, steps_per_epoch, validation_split):
        """`(x, steps_per_epoch, steps)`: the batches one epoch of `fit` will run (`None` when
        the input does not say). A `tf.data.Dataset` of unknown size is counted here, one pass
        over it, and repeated with `steps_per_epoch` set to its count."""
        steps = self._steps_per_epoch(x, batch_size, steps_per_epoch, validation_split)
        if steps is None and is_dataset(x) and _cardinality(x) == _UNKNOWN_CARDINALITY:
            steps = _count_batches(x)
            # Each epoch takes exactly `steps` batches of the repeated dataset: no
            # "ran out of data" stop when a later pass yields fewer batches.
            if steps is not None:
                x, steps_per_epoch = x.repeat(), steps
        return x, steps_per_epoch, steps

    def _plan_schedule(self, x, batch_size, epochs, steps_per_epoch, initial_epoch, split):
        """Called by `fit` with its prepared data before training starts; returns `(x,
        steps_per_epoch)`. Here nothing is planned (`BertTask` plans its schedule)."""
        return x, steps_per_epoch

    def fit(
        self,
        x=None,
        y=None,
        batch_size=None,
        epochs=1,
        sample_weight=None,
        validation_data=None,
        steps_per_epoch=None,
        initial_epoch=0,
        validation_split=0.0,
        **kwargs,
    ):
        """`keras.Model.fit` through the pipeline (see the module docstring).

        Packed NumPy data (raw text included) is batched by length: each epoch draws rows in
        a new random order, groups rows of similar length into batches (as Hugging Face's
        `group_by_length`), shuffles the batches, and crops each batch to the smallest bucket
        length holding its longest row. `validation_split` takes the last rows, as Keras
        does. Datasets and generators are used as given (see `kbert.data.batch_by_length`
        for tf.data).
        """
        _listed_callbacks(kwargs)
        x, y, sample_weight = self._prepare(x, y, sample_weight, "fit", batch_size)
        # The model card's data size (kbert.checkpoints.model_card); None for datasets.
        self.training_examples = _row_count(x)
        validation_data = self._prepare_validation_data(validation_data, batch_size)
        x, y, sample_weight, batch_size, validation_data, validation_split = self._batch_fit_data(
            x, y, sample_weight, batch_size, validation_data, validation_split, kwargs
        )
        if is_dataset(x):
            # Keras warns that `shuffle` (on by default) is ignored for datasets: say it is off.
            kwargs.setdefault("shuffle", False)
        x, steps_per_epoch = self._plan_schedule(
            x, batch_size, epochs, steps_per_epoch, initial_epoch, validation_split
        )
        return self.fit_over_processes(
            x=x,
            y=y,
            batch_size=batch_size,
            epochs=epochs,
            sample_weight=sample_weight,
            validation_data=validation_data,
            steps_per_epoch=steps_per_epoch,
            initial_epoch=initial_epoch,
            validation_split=validation_split,
            **kwargs,
        )

    def evaluate(self, x=None, y=None, batch_size=None, sample_weight=None, **kwargs):
        """`keras.Model.evaluate` through the pipeline.

        Packed NumPy data (raw text included) is batched by length, sorted and each batch
        cropped to its bucket: accuracy-type metrics and row-averaged losses equal those of
        full-length batches; a loss averaged per batch over weighted tokens (`BertTagger`)
        depends, as in Keras, on which rows share a batch.
        """
        _listed_callbacks(kwargs)
        x, y, sample_weight = self._prepare(x, y, sample_weight, "evaluate", batch_size)
        if self._shares_rows_over_processes(x, kwargs) and not is_dataset(y):
            # Each process predicts its share; every process scores the whole predictions.
            y_pred = process_inference.predict_over_processes(
                self, x, lambda model, rows: model._predict_here(rows, batch_size, verbose=0)
            )
            return process_inference.evaluate_predictions(
                self, x, y, sample_weight, y_pred, kwargs.get("return_dict", False)
            )
        if self._can_batch_by_length(x, y, sample_weight):
            x = self._length_batches(x, y, sample_weight, batch_size)[0]
            y = sample_weight = batch_size = None
        results = super().evaluate(
            x=x, y=y, batch_size=batch_size, sample_weight=sample_weight, **kwargs
        )
        # The model card's evaluation results (kbert.checkpoints.model_card).
        self.evaluation_results = dict(self.get_metrics_result())
        return results

    def predict(self, x, batch_size=None, **kwargs):
        """`keras.Model.predict` through the pipeline.

        Packed NumPy data (raw text included; longer texts are truncated to the
        preprocessor's `sequence_length`) is run in length order, each batch cropped to the
        smallest bucket length holding its rows, and returned in the caller's order: equal to
        full-length batches at real positions; per-token outputs keep the full length, with
        `prediction_fill_value` past a row's bucket. JAX and TensorFlow compile at most one
        shape per bucket plus one for the short batch. `length_batching = False`, `steps`,
        datasets and generators take Keras' own loop. An empty input (no row) raises a
        ValueError; a `None` or non-string item in a list of texts raises a ValueError
        naming its index.
        """
        if _is_empty_batch(x):
            raise ValueError(
                f"{type(self).__name__}.predict received an empty batch ({type(x).__name__} with "
                "0 rows). Expected at least one string, pair or packed row."
            )
        _listed_callbacks(kwargs)
        x, _, _ = self._prepare(x, mode="predict", batch_size=batch_size)
        if self._shares_rows_over_processes(x, kwargs):
            if not processes.is_writer():
                kwargs["verbose"] = 0  # One progress bar: process 0's.
            return process_inference.predict_over_processes(
                self, x, lambda model, rows: model._predict_here(rows, batch_size, **kwargs)
            )
        return self._predict_here(x, batch_size, **kwargs)

    def _predict_here(self, x, batch_size=None, **kwargs):
        """`predict` of packed inputs in this process alone."""
        if kwargs.get("steps") is None and self._can_batch_by_length(x, over_processes=False):
            return self._predict_by_length(
                x, batch_size, kwargs.get("verbose", "auto"), kwargs.get("callbacks")
            )
        return super().predict(x, batch_size=batch_size, **kwargs)

    def _shares_rows_over_processes(self, x, kwargs):
        """True when `predict`/`evaluate` split packed NumPy rows over the processes
        (`kbert.models.process_inference`)."""
        return (
            process_inference.sharing_processes()
            and kwargs.get("steps") is None
            and isinstance(x, dict)
            and "padding_mask" in x
            and all(isinstance(v, np.ndarray) for v in x.values())
        )

    def train_on_batch(self, x, y=None, sample_weight=None, class_weight=None, return_dict=False):
        """`keras.Model.train_on_batch` through the pipeline (steps 1 and 2).

        On torch, a call after one that went through Keras' `train_on_batch` with the same
        train function (no `compile` since; a `compile` makes a new one) and without
        `class_weight` runs that function directly: Keras' `train_on_batch` would first check
        that every layer, metric and the optimizer is built (they are) and re-track every
        variable of the model for torch (a new variable the optimizer does not know fails
        its update either way), which costs a tiny model about a twentieth of its step. The
        metrics are reset and the logs returned as Keras returns them (floats, in the
        metrics' order, or a dict with `return_dict=True`).
        """
        x, y, sample_weight = self._prepare(x, y, sample_weight, mode="fit")
        function = self.train_function
        repeat = getattr(self, "_repeat_train", None)
        if class_weight is None and function is not None and function is repeat:
            self.reset_metrics()
            return self._batch_logs(function([(x, y, sample_weight)]), return_dict)
        logs = super().train_on_batch(
            x, y, sample_weight=sample_weight, class_weight=class_weight, return_dict=return_dict
        )
        if keras.backend.backend() == "torch":
            self._repeat_train = self.train_function
        return logs

    def _batch_logs(self, logs, return_dict):
        """A train or test function's logs as Keras' `*_on_batch` methods return them: floats
        where they are scalars (NumPy arrays otherwise), nested dicts flattened; a dict sorted
        by name, or a list in the order of `metrics` (a compiled metrics container expanded
        into its metrics; names no metric has, sorted, after them), one value alone bare."""
        flat = {}

        def add(entries):
            for key, value in entries.items():
                if isinstance(value, dict):
                    add(value)
                    continue
                value = keras.ops.convert_to_numpy(value) if keras.ops.is_tensor(value) else value
                try:
                    value = float(value)
                except (TypeError, ValueError):
                    pass
                flat[key] = value

        add(logs or {})
        if return_dict:
            return dict(sorted(flat.items()))
        names = []
        for metric in self.metrics:
            inner = getattr(metric, "metrics", None)
            names += [m.name for m in inner] if isinstance(inner, list) else [metric.name]
        values = [flat[name] for name in names if name in flat]
        values += [flat[key] for key in sorted(flat) if key not in names]
        return values[0] if len(values) == 1 else values

    def test_on_batch(self, x, y=None, sample_weight=None, return_dict=False):
        """`keras.Model.test_on_batch` through the pipeline (steps 1 and 2).

        On torch, a call after one that went through Keras' `test_on_batch` with the same
        test function (no `compile` since) runs that function directly, as `train_on_batch`
        does: the metrics reset, the logs returned as Keras returns them.
        """
        x, y, sample_weight = self._prepare(x, y, sample_weight, mode="evaluate")
        function = self.test_function
        if function is not None and function is getattr(self, "_repeat_test", None):
            self.reset_metrics()
            return self._batch_logs(function([(x, y, sample_weight)]), return_dict)
        logs = super().test_on_batch(x, y, sample_weight=sample_weight, return_dict=return_dict)
        if keras.backend.backend() == "torch":
            self._repeat_test = self.test_function
        return logs

    def predict_on_batch(self, x):
        """`keras.Model.predict_on_batch` through the pipeline (steps 1 and 2)."""
        x, _, _ = self._prepare(x, mode="predict")
        return super().predict_on_batch(x)


def _listed_callbacks(kwargs):
    """`kwargs["callbacks"]` as a list when it is one `keras.callbacks.Callback`.

    Keras takes a list; given one callback alone it runs it all the same, but its check of
    which callbacks may run in a background thread reads lists only, so a lone callback's
    batch hooks ran asynchronously, alongside the next steps (a callback that freezes layers
    after a batch then froze them at some later step)."""
    callbacks = kwargs.get("callbacks")
    if isinstance(callbacks, keras.callbacks.Callback):
        kwargs["callbacks"] = [callbacks]


def _row_count(x):
    """The number of rows of packed inputs (a dict of arrays or an array), else None."""
    if isinstance(x, dict) and all(hasattr(v, "shape") for v in x.values()) or hasattr(x, "shape"):
        return _num_rows(x)
    return None
