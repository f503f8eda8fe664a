"""`fit` over several processes: each process trains on its slice of every global batch.

Started by `kbert.distribution.initialize` (see `kbert.processes`), every process runs the
same script with the same full inputs and the global `batch_size`. `MultiProcessTraining`, a
base of `kbert.models.BertTask`, then turns `fit`'s inputs into this process' share and keeps
the replicas equal:

* **Raw text and packed inputs** are planned in length batches exactly as one process plans
  them (`kbert.data.batching.LengthBatches`, the same buckets, one shuffle seed drawn by
  process 0 from NumPy's global generator and sent to all): process `p` of `P` takes the
  `p`-th of `P` equal slices of each planned batch, so the processes together run one
  process' steps on the same global batches (a batch whose row count does not split evenly
  leaves its last rows out, with a warning).
* **Other NumPy arrays**: `ProcessBatches` gives process `p`
  of `P` rows `[p * B/P, (p + 1) * B/P)` of every global batch of `B` rows. `B` must be a
  multiple of `P` (a ValueError otherwise). The last, partial batch of `n` rows keeps its
  first `n - n % P` rows, split the same way on every process (a warning names the rows
  left out of each epoch), so every process runs the same number of steps. On JAX, `P`
  counts the processes along the distribution's batch axis (`batch_slices`): under
  `model_parallel` with a batch axis of size 1 every process feeds the whole global batch.
  With `shuffle` (the default) the order of each epoch is drawn from a seed process 0 sends
  to all.
* **`tf.data.Dataset`s** are taken as this process' batches (kbert's `pretraining_dataset`
  splits its files by process index); nothing is split again.
* **Replicas**: at the start of `fit` the weights of process 0 are sent to all (JAX, torch;
  TensorFlow's strategy does it itself). Per backend the global step is:
  JAX - one program over the global batch (`keras.distribution`); TensorFlow -
  `MultiWorkerMirroredStrategy` sums the replicas' gradients of per-replica losses scaled by
  `1/P`; torch - after each parameter's gradient is accumulated in `backward()`, a hook
  (`torch.Tensor.register_post_accumulate_grad_hook`) all-reduces it (`torch.distributed`)
  and divides it by `P`, before Keras' own `TorchTrainer.train_step` applies the optimizer;
  the metrics' states are summed over processes when they are read (`get_metrics_result`),
  so the logs are the global batch's, as on the other backends.

So a loss that is a mean over each batch's examples gives the one-process result for the
global batch exactly. A loss normalised by a count that differs between slices (e.g. the
masked-LM loss, a mean over each slice's masked positions) is the mean of the slices' means,
as with `torch.nn.parallel.DistributedDataParallel` and `tf.distribute`.
"""

import contextlib
import math
import warnings

import keras
import numpy as np

from kbert import processes
from kbert.backend import tensorflow
from kbert.backend.tensorflow import is_dataset
from kbert.data import batching

# Models in `fit` over several torch processes: their metric states are summed when read.
_SUMMING_METRICS = set()


def _rows(x):
    leaves = [leaf for leaf in keras.tree.flatten(x) if leaf is not None]
    counts = {len(leaf) for leaf in leaves}
    if len(counts) != 1:
        raise ValueError(
            f"Every input array must have the same number of rows. Received row counts "
            f"{sorted(counts)}"
        )
    return counts.pop()


def batch_axis_size(distribution):
    """Devices along the data-parallel (batch) axis of a `keras.distribution`'s mesh."""
    mesh = distribution.device_mesh
    axis = distribution.batch_dim_name
    if axis not in mesh.axis_names:
        return 1
    return int(mesh.shape[list(mesh.axis_names).index(axis)])


def check_global_batch_size(batch_size, num_processes=None):
    """Raises a ValueError unless the global `batch_size` splits evenly over the processes."""
    num_processes = num_processes or processes.process_count()
    if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(
            "Training over several processes needs the global `batch_size` (examples per step "
            f"over all {num_processes} processes). Received: batch_size={batch_size!r}"
        )
    if batch_size % num_processes:
        raise ValueError(
            f"The global batch size must be divisible by the {num_processes} processes, which "
            f"each take an equal slice of every batch. Received: batch_size={int(batch_size)}. "
            f"Use a multiple of {num_processes}."
        )


def batch_slices(group):
    """`(slices, index)`: the slices each global batch splits into, and this process' one.

    torch and TensorFlow: one slice per process. JAX: the processes along the data-parallel
    (batch) axis of the distribution's device mesh: process `p` feeds the rows that its
    devices hold (`jax.make_array_from_process_local_data`), so with a batch axis of size 1
    (`model_parallel` over every device) each process feeds the whole global batch.
    """
    if group.backend != "jax":
        return group.num_processes, group.process_id
    import jax

    distribution = keras.distribution.distribution()
    mesh = distribution.device_mesh
    axis = list(mesh.axis_names).index(distribution.batch_dim_name)
    devices = np.moveaxis(np.asarray(mesh.backend_mesh.devices), axis, 0)
    devices = devices.reshape(devices.shape[0], -1)  # batch position x the other axes
    own = [
        i
        for i in range(devices.shape[0])
        if any(d.process_index == jax.process_index() for d in devices[i].flat)
    ]
    size = len(own)
    if own != list(range(own[0], own[0] + size)) or devices.shape[0] % size or own[0] % size:
        raise ValueError(
            f"Process {jax.process_index()} holds batch positions {own} of the mesh's "
            f"{devices.shape[0]} along {distribution.batch_dim_name!r}: each process must hold "
            "an aligned, contiguous block of them (list the devices in process order)."
        )
    return devices.shape[0] // size, own[0] // size


def host_value(value):
    """A variable's whole value as NumPy, also when JAX shards it over several processes."""
    if (
        keras.backend.backend() == "jax"
        and not value.is_fully_addressable
        and not value.is_fully_replicated
    ):
        from jax.experimental import multihost_utils

        # A collective: every process gathers the shards the others hold.
        return np.asarray(multihost_utils.process_allgather(value, tiled=True))
    return keras.ops.convert_to_numpy(value)


class ProcessBatches(keras.utils.PyDataset):
    """This process' slice of every global batch of NumPy arrays.

    Args:
        x, y, sample_weight: NumPy arrays (or dicts / tuples of them) with the same rows; `y`
            and `sample_weight` may be `None`.
        batch_size: int. The global batch size, a multiple of `num_processes`.
        shuffle: bool. Draw a new order every epoch (the same on every process).
        seed: int. Seed of the orders (the same on every process). Defaults to 0.
        num_processes: int. Defaults to `kbert.processes.process_count()`.
        process_index: int. Defaults to `kbert.processes.process_index()`.
    """

    def __init__(
        self,
        x,
        y=None,
        sample_weight=None,
        *,
        batch_size,
        shuffle=False,
        seed=0,
        num_processes=None,
        process_index=None,
    ):
        super().__init__()
        self.num_processes = num_processes or processes.process_count()
        self.process_index = processes.process_index() if process_index is None else process_index
        check_global_batch_size(batch_size, self.num_processes)
        self.data = tuple(d for d in (x, y, sample_weight) if d is not None)
        self.rows = _rows(self.data)
        self.batch_size = int(batch_size)
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        last = self.rows % self.batch_size
        self.dropped_rows = last % self.num_processes
        if self.rows < self.num_processes:
            raise ValueError(
                f"{self.rows} rows cannot be split over {self.num_processes} processes."
            )
        self.used_rows = self.rows - self.dropped_rows
        self._order = self._make_order()

    def _make_order(self, epoch=None):
        if not self.shuffle:
            return np.arange(self.rows)
        epoch = self.epoch if epoch is None else epoch
        return np.random.default_rng([self.seed, epoch]).permutation(self.rows)

    @property
    def num_batches(self):
        return math.ceil(self.used_rows / self.batch_size)

    def __len__(self):
        return self.num_batches

    def __getitem__(self, index):
        if not 0 <= index < self.num_batches:
            raise IndexError(f"Batch {index} of {self.num_batches}.")
        return self._batch(self._order, index)

    def _batch(self, order, index):
        start = index * self.batch_size
        size = min(self.batch_size, self.used_rows - start)
        share = size // self.num_processes
        first = start + self.process_index * share
        rows = order[first : first + share]
        batch = keras.tree.map_structure(lambda a: np.asarray(a)[rows], self.data)
        return batch if len(batch) > 1 else batch[0]

    def on_epoch_end(self):
        self.epoch += 1
        self._order = self._make_order()

    def epoch_batches(self, epoch):
        """The batches of epoch `epoch` (0, 1, ...), leaving the current order as it is."""
        order = self._make_order(epoch)
        for index in range(len(self)):
            yield self._batch(order, index)


def _tf_distributed(group, data):
    """A TensorFlow strategy's dataset that hands each worker `data` (its own batches) as is."""
    tf = tensorflow.tensorflow("Multi-process training on TensorFlow")

    if isinstance(data, keras.utils.PyDataset):  # ProcessBatches or LengthBatches
        batches = data
        first = batches[0]
        # Every axis variable: length-planned batches differ in rows and padded length.
        spec = keras.tree.map_structure(
            lambda a: tf.TensorSpec((None,) * np.ndim(a), tf.as_dtype(np.asarray(a).dtype)),
            first,
        )

        def generate():  # Endless: `fit` takes `len(batches)` steps per epoch.
            # Each generator counts its own epochs (Keras may start one to peek at a batch).
            epoch = 0
            while True:
                yield from batches.epoch_batches(epoch)
                epoch += 1

        dataset = tf.data.Dataset.from_generator(generate, output_signature=spec)
    else:
        dataset = data
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    dataset = dataset.with_options(options)
    return group.strategy.distribute_datasets_from_function(lambda context: dataset)


@contextlib.contextmanager
def local_metrics(model):
    """Inside, `model`'s metric results are this process' own (not summed over the processes,
    as in its `fit`): for metrics computed on outputs every process already holds whole."""
    summing = id(model) in _SUMMING_METRICS
    _SUMMING_METRICS.discard(id(model))
    try:
        yield
    finally:
        if summing:
            _SUMMING_METRICS.add(id(model))


class MultiProcessTraining:
    """Mixin of `keras.Model` subclasses: `fit` over the processes of `kbert.distribution`.

    The model's own `fit` (the one override, `kbert.models.BertTask.fit`) hands its prepared
    inputs to `fit_over_processes` instead of `keras.Model.fit`. In a single process that is
    `keras.Model.fit` itself. See the module docstring for what it does in several.
    """

    def fit_over_processes(self, x=None, y=None, batch_size=None, **kwargs):
        """`keras.Model.fit` with this process' share of `x` (see the module docstring)."""
        group = processes.process_group()
        if group is None or group.num_processes == 1:
            return keras.Model.fit(self, x=x, y=y, batch_size=batch_size, **kwargs)
        self._check_multi_process_setup(group)
        if kwargs.get("validation_split"):
            raise ValueError(
                "`validation_split` is not supported when training over several processes: "
                "pass `validation_data` (the same full arrays on every process)."
            )
        shuffle = kwargs.pop("shuffle", True)
        seed = batching.agreed_seed() if shuffle and not is_dataset(x) else 0
        x, y, sample_weight, steps = self._process_inputs(
            group, x, y, kwargs.pop("sample_weight", None), batch_size, shuffle, seed, True
        )
        if steps is not None and kwargs.get("steps_per_epoch") is None:
            kwargs["steps_per_epoch"] = steps  # TensorFlow: an endless dataset of epochs.
        validation = kwargs.get("validation_data")
        if validation is not None:
            parts = (validation,) if is_dataset(validation) else tuple(validation)
            validation, _, _, steps = self._process_inputs(
                group,
                *(parts + (None, None))[:3],
                kwargs.pop("validation_batch_size", None) or batch_size,
                False,
                0,
                False,
            )
            kwargs["validation_data"] = validation
            if steps is not None:
                kwargs.setdefault("validation_steps", steps)
        self._broadcast_weights(group)
        hooks = self._average_gradients(group)
        _SUMMING_METRICS.add(id(self))
        try:
            return keras.Model.fit(
                self, x=x, y=y, sample_weight=sample_weight, shuffle=False, **kwargs
            )
        finally:
            _SUMMING_METRICS.discard(id(self))
            for hook in hooks:
                hook.remove()

    def _check_multi_process_setup(self, group):
        if group.backend != keras.backend.backend():
            raise RuntimeError(
                f"kbert.distribution.initialize started {group.backend!r}, but Keras runs on "
                f"{keras.backend.backend()!r}."
            )
        if group.backend == "jax" and keras.distribution.distribution() is None:
            raise RuntimeError(
                f"{type(self).__name__}.fit runs in process {group.process_id} of "
                f"{group.num_processes}, but outside a distribution: call it (and create the "
                "model) inside `with kbert.distribution.data_parallel().scope():`."
            )
        if group.backend == "tensorflow" and self.distribute_strategy is not group.strategy:
            raise RuntimeError(
                f"{type(self).__name__} was not created in the scope of the run's "
                "MultiWorkerMirroredStrategy: create (and compile) the model inside "
                "`with kbert.distribution.data_parallel().scope():`."
            )

    def _process_inputs(self, group, x, y, sample_weight, batch_size, shuffle, seed, training):
        if is_dataset(x):
            data = x
            if group.backend == "tensorflow":
                data = _tf_distributed(group, data)
            return data, None, None, None
        if batch_size is None:
            raise ValueError(
                "Training over several processes needs the global `batch_size` (examples per "
                f"step over all {group.num_processes} processes) with array or text inputs."
            )
        slices, index = batch_slices(group)
        if self.length_batchable(x, y, sample_weight):
            # The batches one process would plan (same seed and buckets: `fit`'s for the
            # training data, `evaluate`'s for validation), each split over the processes.
            batches = self.planned_batches(
                x,
                y,
                sample_weight,
                batch_size,
                shuffle=shuffle,
                seed=seed if shuffle else None,
                training=training,
                num_processes=slices,
                process_index=index,
            )
            check_global_batch_size(batch_size, slices)
        else:
            batches = ProcessBatches(
                x,
                y,
                sample_weight,
                batch_size=batch_size,
                shuffle=shuffle,
                seed=seed,
                num_processes=slices,
                process_index=index,
            )
        if batches.dropped_rows:
            warnings.warn(
                f"A batch of {batch_size} rows or fewer does not split evenly over {slices} "
                f"processes: {batches.dropped_rows} rows are left out of the epoch (on every "
                "process alike).",
                stacklevel=3,
            )
        if group.backend == "tensorflow":
            return _tf_distributed(group, batches), None, None, len(batches)
        return batches, None, None, None

    def _broadcast_weights(self, group):
        """Process 0's weights (and seed states) on every process (JAX and torch)."""
        if group.backend == "tensorflow":
            return  # MultiWorkerMirroredStrategy creates its variables equal everywhere.
        variables = list(self.variables)
        values = processes.broadcast([host_value(v.value) for v in variables])
        for variable, value in zip(variables, values):
            variable.assign(value)

    def _average_gradients(self, group):
        """Torch: hooks that all-reduce each parameter's gradient and divide it by P."""
        if group.backend != "torch":
            return []
        import torch.distributed as dist

        size = group.num_processes

        def average(parameter):
            dist.all_reduce(parameter.grad, op=dist.ReduceOp.SUM)
            parameter.grad.div_(size)

        return [
            v.value.register_post_accumulate_grad_hook(average)
            for v in self.trainable_variables
            if getattr(v.value, "requires_grad", False)
        ]

    def get_metrics_result(self):
        """The metrics' results; in `fit` on torch over several processes (its training and
        validation steps), of the states summed over the processes."""
        group = processes.process_group()
        if (
            group is None
            or group.num_processes == 1
            or group.backend != "torch"
            or id(self) not in _SUMMING_METRICS
        ):
            return super().get_metrics_result()
        variables = list(self.metrics_variables)
        local = [keras.ops.convert_to_numpy(v) for v in variables]
        for variable, total in zip(variables, processes.all_sum(local)):
            variable.assign(total)
        try:
            return super().get_metrics_result()
        finally:
            for variable, value in zip(variables, local):
                variable.assign(value)
