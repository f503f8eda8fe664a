"""Training kbert models on several devices.

* **JAX** - `keras.distribution`. `data_parallel()` replicates the model on every device and
  splits each batch; `model_parallel(model_parallel_size)` arranges the devices in a
  `(batch, model)` mesh and shards every transformer block Megatron-style with
  `BertBackbone.get_layout_map` (heads and feed-forward columns over `model`, the batch over
  `batch`). Both return a distribution whose scope the model is created in and trained in:

      distribution = kbert.distribution.model_parallel(2, config=backbone_config)
      with distribution.scope():
          model = kbert.models.BertClassifier.from_preset("bert_base_en_uncased", num_classes=2)
          model.fit(dataset)

  They are `keras.distribution.DataParallel` / `ModelParallel` that also reject, with a
  clear error, a batch that the data-parallel axis cannot split evenly (use a batch size
  that is a multiple of the number of replicas, and `drop_remainder=True` in tf.data).
* **TensorFlow** - `tf.distribute` strategies (e.g. `tf.distribute.MirroredStrategy()`):
  create and compile the model inside `strategy.scope()`, then `fit` as usual; Keras splits
  each global batch over the replicas.
* **PyTorch** - the Keras torch backend has no `keras.distribution`; within one process kbert
  trains on one device. Over several processes see below.

**Several processes** (one per host or per accelerator; tested with 2 local processes on
CPU). Every process runs the same script; `initialize()` starts the backend's own engine from
the launcher's environment (torchrun's `RANK`/`WORLD_SIZE`/`MASTER_ADDR`/`MASTER_PORT`,
`TF_CONFIG`, Keras' `KERAS_DISTRIBUTION_*`) or from explicit arguments, and `data_parallel()`
then spans every process on every backend:

    kbert.distribution.initialize()          # before the first model is created
    distribution = kbert.distribution.data_parallel()
    with distribution.scope():
        model = kbert.models.BertClassifier.from_preset(..., num_classes=2)
        model.fit(x, y, batch_size=64)       # same full x, y and global batch everywhere

JAX runs `jax.distributed` (gloo collectives on CPU) under `keras.distribution` (a
`model_parallel` mesh also takes every process' devices; only `data_parallel` is tested over
processes); TensorFlow runs `MultiWorkerMirroredStrategy`; torch runs `torch.distributed`
(gloo on CPU, nccl on GPU) and kbert's tasks average the gradients over the processes in
their train step (`kbert.models.multiprocess`). Each process trains on its slice of every
global batch; process 0 alone writes presets, backups and run reports
(`kbert.processes.is_writer`). `initialize(timeout=...)` bounds the wait for the coordinator
and the other processes and, on torch and TensorFlow, every collective (JAX: its heartbeat),
so a process that dies makes the others fail instead of hang.

`predict`, `evaluate` and `BertTextEmbedder.encode` then split their rows over the processes
and give every process the whole result (`kbert.models.process_inference`; `encode(...,
output_dir=...)` writes ordered shards instead).

Example, on JAX:

    distribution = data_parallel()
    with distribution.scope():
        backbone = BertBackbone.from_preset("bert_tiny_en_uncased", load_weights=False)
"""

import contextlib
import datetime
import json
import os
import socket
import time

import keras
import numpy as np

from kbert import processes
from kbert.models.backbone import BertBackbone
from kbert.models.multiprocess import batch_axis_size, check_global_batch_size

# Seconds `initialize` waits for every process to join by default, and the bound of every
# collective after that (a process that died makes the others fail after at most this long).
DEFAULT_TIMEOUT = 120


def check_batch_size(batch_size, distribution=None):
    """Raises a ValueError when `batch_size` does not split evenly over the data-parallel axis.

    Args:
        batch_size: int. The global batch size (examples per step over all devices).
        distribution: a `keras.distribution.Distribution`, or None for the current one
            (nothing is checked when none is set).

    Example, on JAX:

        check_batch_size(32, data_parallel())  # fine on 1, 2, 4, 8... devices
    """
    distribution = distribution or keras.distribution.distribution()
    if distribution is None or batch_size is None:
        return
    replicas = batch_axis_size(distribution)
    if processes.process_count() > 1:
        # Keras hands each process' own rows to the layout: they split over its devices.
        replicas = max(replicas // processes.process_count(), 1)
    if int(batch_size) % replicas:
        raise ValueError(
            f"The batch size must be divisible by the {replicas} devices of the data-parallel "
            f"mesh axis {distribution.batch_dim_name!r}, which each take an equal share. "
            f"Received: batch_size={int(batch_size)}. Use a multiple of {replicas} "
            "(and `drop_remainder=True` when batching a tf.data.Dataset, so that the last "
            "batch is not smaller)."
        )


class DataParallel(keras.distribution.DataParallel):
    """`keras.distribution.DataParallel` that rejects batches the devices cannot share evenly.

    Args:
        device_mesh: optional 1-D `keras.distribution.DeviceMesh`.
        devices: optional list of devices (default: all of them).
        **kwargs: passed to `keras.distribution.DataParallel`.

    Example, on JAX:

        with DataParallel().scope():
            model = build_model()
            model.fit(x, y, batch_size=64)
    """

    def get_data_layout(self, data_shape):
        check_batch_size(data_shape[0], self)
        return super().get_data_layout(data_shape)


class ModelParallel(keras.distribution.ModelParallel):
    """`keras.distribution.ModelParallel` that rejects batches the data axis cannot split evenly.

    Args:
        layout_map: `keras.distribution.LayoutMap`, e.g. `BertBackbone.get_layout_map(mesh)`.
        batch_dim_name: str. The mesh axis that splits the batch. Defaults to the mesh's
            first axis.
        **kwargs: passed to `keras.distribution.ModelParallel`.

    Example, on JAX with 8 devices:

        mesh = keras.distribution.DeviceMesh((2, 4), ["batch", "model"])
        distribution = ModelParallel(
            layout_map=BertBackbone.get_layout_map(mesh), batch_dim_name="batch")
    """

    def get_data_layout(self, data_shape):
        check_batch_size(data_shape[0], self)
        return super().get_data_layout(data_shape)


def data_parallel(devices=None):
    """A `DataParallel` distribution over `devices` (default: all devices of the backend).

    Args:
        devices: optional list of device names (`keras.distribution.list_devices()`).

    After `initialize()` in several processes the distribution spans them all: on JAX a
    `DataParallel` over every process' devices; on TensorFlow and torch a
    `ProcessDataParallel` (the run's `MultiWorkerMirroredStrategy`, or torch.distributed).
    On torch in one process (no `initialize()`, or torchrun with one process) it is a
    `ProcessDataParallel` of that one process: Keras has no distribution API on torch, and
    the script written for several processes runs unchanged.

    Returns:
        `kbert.distribution.DataParallel` or `kbert.distribution.ProcessDataParallel`.
    """
    group = processes.process_group()
    if group is not None and group.num_processes > 1 and group.backend != "jax":
        return ProcessDataParallel(group)
    if not _keras_distributes():
        # One torch process (plain `python`, or torchrun with one process): its one device,
        # so the script that runs over several processes runs unchanged in one.
        return ProcessDataParallel(group)
    distribution = DataParallel(devices=devices or keras.distribution.list_devices())
    if group is not None and group.num_processes > 1:
        # kbert gives each process its own rows (kbert.models.multiprocess); Keras must not
        # split a tf.data input again.
        distribution.auto_shard_dataset = False
    return distribution


def _keras_distributes():
    """True where `keras.distribution` (device meshes, layouts) exists: JAX and TensorFlow.
    Keras has none on torch, where kbert splits work over processes itself."""
    return keras.backend.backend() != "torch"


def _no_model_parallel():
    raise ValueError(
        "model_parallel() splits weights with keras.distribution, which Keras offers on JAX "
        f"and TensorFlow only. Received: KERAS_BACKEND={keras.backend.backend()!r}. On torch, "
        "use data_parallel() (one process per device, started with torchrun)."
    )


def _backbone_config(config):
    if config is None:
        return None
    if isinstance(config, BertBackbone):
        return config.get_config()
    if isinstance(config, str):
        from kbert.models.presets import BACKBONE_PRESETS

        if config not in BACKBONE_PRESETS:
            raise ValueError(
                f"Unknown preset {config!r}. Expected one of {sorted(BACKBONE_PRESETS)}, a "
                "BertBackbone or its config dict."
            )
        return BACKBONE_PRESETS[config]["config"]
    if isinstance(config, dict):
        return config
    raise ValueError(
        "`config` must be a preset name, a BertBackbone or a BertBackbone config dict. "
        f"Received: {type(config).__name__}"
    )


def check_model_parallel_config(config, model_parallel_size, data_parallel_size=1):
    """Raises a ValueError when a backbone cannot be split over the given axis sizes.

    Heads must stay whole on a device (`num_heads` divisible by the model axis) and the
    hidden and intermediate widths must split evenly.

    Args:
        config: a preset name, a `BertBackbone` or its config dict.
        model_parallel_size: int. Size of the model-parallel axis.
        data_parallel_size: int. Size of the data-parallel axis when weights are also split
            over it (0 or 1 when they are not). Defaults to `1`.
    """
    config = _backbone_config(config)
    checks = [
        ("num_heads", config["num_heads"], model_parallel_size, "model-parallel"),
        ("hidden_dim", config["hidden_dim"], model_parallel_size, "model-parallel"),
        ("intermediate_dim", config["intermediate_dim"], model_parallel_size, "model-parallel"),
    ]
    if data_parallel_size and data_parallel_size > 1:
        checks += [
            ("hidden_dim", config["hidden_dim"], data_parallel_size, "data-parallel"),
            ("intermediate_dim", config["intermediate_dim"], data_parallel_size, "data-parallel"),
        ]
    for name, value, size, axis in checks:
        if value % size:
            raise ValueError(
                f"`{name}`={value} cannot be split evenly over the {size} devices of the "
                f"{axis} axis. Choose an axis size that divides {value}."
            )


def model_parallel(
    model_parallel_size,
    devices=None,
    config=None,
    model_parallel_dim_name="model",
    data_parallel_dim_name="batch",
    shard_weights_over_batch=True,
):
    """A `(batch, model)` mesh over `devices` with BERT's Megatron layout, as a `ModelParallel`.

    Args:
        model_parallel_size: int. Devices that share one copy of the model (the size of the
            model axis). The rest form the data-parallel axis:
            `len(devices) // model_parallel_size` replicas.
        devices: optional list of device names. Defaults to all devices.
        config: optional preset name, `BertBackbone` or config dict; when given, the split
            is checked against its widths and head count before any variable exists.
        model_parallel_dim_name: str. Defaults to `"model"`.
        data_parallel_dim_name: str. Defaults to `"batch"`.
        shard_weights_over_batch: bool. Also split each kernel's other dimension over the
            data axis (fully sharded weights). Defaults to `True`.

    Returns:
        `kbert.distribution.ModelParallel`.

    Example, on JAX:

        distribution = model_parallel(4, config="bert_base_en_uncased")  # 8 devices: 2 x 4
        with distribution.scope():
            backbone = BertBackbone.from_preset("bert_base_en_uncased", load_weights=False)
    """
    if devices is None and not _keras_distributes():
        _no_model_parallel()
    devices = list(devices or keras.distribution.list_devices())
    if (
        not isinstance(model_parallel_size, int)
        or model_parallel_size < 1
        or len(devices) % model_parallel_size
    ):
        raise ValueError(
            "`model_parallel_size` must be a positive integer that divides the number of "
            f"devices ({len(devices)}). Received: model_parallel_size={model_parallel_size!r}"
        )
    data_size = len(devices) // model_parallel_size
    if config is not None:
        check_model_parallel_config(
            config, model_parallel_size, data_size if shard_weights_over_batch else 1
        )
    if not _keras_distributes():
        _no_model_parallel()
    mesh = keras.distribution.DeviceMesh(
        shape=(data_size, model_parallel_size),
        axis_names=[data_parallel_dim_name, model_parallel_dim_name],
        devices=np.array(devices).reshape(data_size, model_parallel_size),
    )
    layout_map = BertBackbone.get_layout_map(
        mesh,
        model_parallel_dim_name=model_parallel_dim_name,
        data_parallel_dim_name=data_parallel_dim_name if shard_weights_over_batch else None,
    )
    distribution = ModelParallel(layout_map=layout_map, batch_dim_name=data_parallel_dim_name)
    if processes.process_count() > 1:
        distribution.auto_shard_dataset = False  # kbert gives each process its own rows.
    return distribution


# ------------------------------------------------------------------------ several processes
class ProcessDataParallel:
    """Data parallelism over the processes of a TensorFlow or torch run.

    Returned by `data_parallel()` after `initialize()` in several processes. Create the model
    inside `scope()` and call `fit` with the global batch: each process trains a replica on
    its slice of every batch (`kbert.models.multiprocess`).

    Also what `data_parallel()` returns on torch in a single process (`group` is then `None`
    or a group of one): Keras has no distribution API on torch, and one process trains on its
    one device as without a distribution.

    Args:
        group: the `kbert.processes.ProcessGroup` started by `initialize`, or `None`.

    Attributes:
        num_processes: int.
        process_id: int.
        strategy: the `tf.distribute.MultiWorkerMirroredStrategy` (TensorFlow), else `None`.
    """

    def __init__(self, group):
        self.group = group
        self.num_processes = group.num_processes if group is not None else 1
        self.process_id = group.process_id if group is not None else 0
        self.strategy = group.strategy if group is not None else None

    def check_batch_size(self, batch_size):
        """Raises a ValueError unless the global `batch_size` splits over the processes."""
        check_global_batch_size(batch_size, self.num_processes)

    @contextlib.contextmanager
    def scope(self):
        """Models created (and compiled) inside train across the processes."""
        if self.strategy is not None:
            with self.strategy.scope():
                yield self
        else:
            yield self

    def __repr__(self):
        return f"ProcessDataParallel({self.group!r})"


def _environment_settings():
    """`(coordinator_address, num_processes, process_id, where)` from a launcher, or None."""
    env = os.environ
    if "WORLD_SIZE" in env and "RANK" in env:
        port = env.get("MASTER_PORT")
        if not port:
            raise ValueError("torchrun's RANK and WORLD_SIZE are set but MASTER_PORT is not.")
        address = f"{env.get('MASTER_ADDR', '127.0.0.1')}:{port}"
        return address, int(env["WORLD_SIZE"]), int(env["RANK"]), "torchrun's RANK/WORLD_SIZE"
    if env.get("TF_CONFIG"):
        try:
            config = json.loads(env["TF_CONFIG"])
            workers = list(config["cluster"]["worker"])
            task = config["task"]
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(
                'TF_CONFIG must be JSON like {"cluster": {"worker": ["host:port", ...]}, '
                f'"task": {{"type": "worker", "index": i}}}}. '
                f"Received: {env['TF_CONFIG']!r} ({error})"
            ) from None
        if task.get("type", "worker") != "worker" or set(config["cluster"]) != {"worker"}:
            raise ValueError(
                "kbert runs TensorFlow's MultiWorkerMirroredStrategy with workers only: "
                f"TF_CONFIG must name a cluster of 'worker' tasks. Received: {env['TF_CONFIG']!r}"
            )
        return workers[0], len(workers), int(task["index"]), "TF_CONFIG"
    if env.get("KERAS_DISTRIBUTION_JOB_ADDRESSES"):
        addresses = env["KERAS_DISTRIBUTION_JOB_ADDRESSES"].split(",")
        count = int(env.get("KERAS_DISTRIBUTION_NUM_PROCESSES", len(addresses)))
        index = int(env.get("KERAS_DISTRIBUTION_PROCESS_ID", 0))
        return addresses[0], count, index, "KERAS_DISTRIBUTION_*"
    return None


def _resolve(coordinator_address, num_processes, process_id):
    found = _environment_settings()
    if found is None:
        if num_processes is None or process_id is None or coordinator_address is None:
            raise ValueError(
                "kbert.distribution.initialize needs `coordinator_address`, `num_processes` and "
                "`process_id`, or a launcher's environment (torchrun's RANK/WORLD_SIZE/"
                "MASTER_ADDR/MASTER_PORT, TF_CONFIG, or KERAS_DISTRIBUTION_*). Received: "
                f"coordinator_address={coordinator_address!r}, num_processes={num_processes!r}, "
                f"process_id={process_id!r} and none of those variables."
            )
        return coordinator_address, int(num_processes), int(process_id)
    address, count, index, where = found
    for name, given, launched in (
        ("num_processes", num_processes, count),
        ("process_id", process_id, index),
        ("coordinator_address", coordinator_address, address),
    ):
        if given is not None and given != launched:
            raise ValueError(
                f"`{name}`={given!r} does not match the launcher's {launched!r} ({where}). "
                "Leave the argument out to take the launcher's, or launch with the same value."
            )
    return address, count, index


def _check_settings(coordinator_address, num_processes, process_id):
    if not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"`num_processes` must be a positive integer. Received: {num_processes!r}")
    if not isinstance(process_id, int) or not 0 <= process_id < num_processes:
        raise ValueError(
            f"`process_id` must lie in [0, num_processes) = [0, {num_processes}). "
            f"Received: process_id={process_id!r}"
        )
    host, _, port = str(coordinator_address).rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(
            "`coordinator_address` must be 'host:port' (process 0's address). "
            f"Received: {coordinator_address!r}"
        )
    return host, int(port)


def _wait_for_coordinator(host, port, timeout, process_id):
    """Waits (at most `timeout` seconds) until process 0's coordinator accepts connections."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=2):
                return
        except OSError as error:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"Process {process_id} could not reach the coordinator at {host}:{port} "
                    f"within {timeout} s ({error}). Check that process 0 runs, the address "
                    "and port, and the firewall."
                ) from None
            time.sleep(0.2)


def initialize(coordinator_address=None, num_processes=None, process_id=None, timeout=None):
    """Starts the backend's multi-process engine; `data_parallel()` then spans every process.

    Call it first thing, in every process, before any model exists. The settings come from
    the arguments or the launcher's environment: torchrun's `RANK`, `WORLD_SIZE`,
    `MASTER_ADDR` and `MASTER_PORT`; `TF_CONFIG` (workers only; its first worker is the
    coordinator); Keras' `KERAS_DISTRIBUTION_JOB_ADDRESSES`, `..._NUM_PROCESSES` and
    `..._PROCESS_ID`. Arguments that contradict the launcher are a ValueError.

    * JAX: `jax.distributed.initialize` (with gloo collectives on CPU, set before it);
    * TensorFlow: a `tf.distribute.MultiWorkerMirroredStrategy` (needs `TF_CONFIG`, which
      names every worker's address);
    * torch: `torch.distributed.init_process_group`, gloo on CPU, nccl when CUDA is
      available (each process then uses GPU `LOCAL_RANK`).

    With `num_processes=1` nothing is started.

    Args:
        coordinator_address: str. `host:port` of process 0 (JAX's coordinator, torch's
            `MASTER_ADDR:MASTER_PORT`, TensorFlow's first worker).
        num_processes: int. Processes in the run.
        process_id: int. This process' index, 0 to `num_processes - 1`.
        timeout: seconds. How long to wait for every process to join (a ValueError/
            TimeoutError/RuntimeError after it), and on torch and TensorFlow the bound of each
            collective, so that a process that died makes the others fail instead of hang.
            Defaults to `DEFAULT_TIMEOUT` (120).

    Returns:
        `kbert.processes.ProcessGroup`.

    Example, in the first of two processes:

        kbert.distribution.initialize("10.0.0.1:1234", num_processes=2, process_id=0)
    """
    timeout = int(DEFAULT_TIMEOUT if timeout is None else timeout)
    coordinator_address, num_processes, process_id = _resolve(
        coordinator_address, num_processes, process_id
    )
    host, port = _check_settings(coordinator_address, num_processes, process_id)
    existing = processes.process_group()
    if existing is not None:
        if (existing.num_processes, existing.process_id) != (num_processes, process_id):
            raise RuntimeError(f"kbert.distribution is already initialized: {existing!r}.")
        return existing
    backend = keras.backend.backend()
    if num_processes == 1:
        group = processes.ProcessGroup(backend, 1, 0, coordinator_address)
        processes.set_process_group(group)
        return group
    start = {"jax": _start_jax, "tensorflow": _start_tensorflow, "torch": _start_torch}[backend]
    group = start(coordinator_address, host, port, num_processes, process_id, timeout)
    processes.set_process_group(group)
    return group


def _start_jax(address, host, port, num_processes, process_id, timeout):
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if process_id != 0:
        _wait_for_coordinator(host, port, timeout, process_id)
    jax.distributed.initialize(
        coordinator_address=address,
        num_processes=num_processes,
        process_id=process_id,
        initialization_timeout=timeout,
        heartbeat_timeout_seconds=max(10, min(timeout, 100)),
    )
    return processes.ProcessGroup("jax", num_processes, process_id, address)


def _start_tensorflow(address, host, port, num_processes, process_id, timeout):
    import tensorflow as tf

    if not os.environ.get("TF_CONFIG"):
        raise ValueError(
            "On TensorFlow, kbert.distribution.initialize needs TF_CONFIG, which lists every "
            'worker\'s address: TF_CONFIG=\'{"cluster": {"worker": ["host0:port", '
            '"host1:port"]}, "task": {"type": "worker", "index": 0}}\'.'
        )
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING,
        timeout_seconds=timeout,
    )
    if process_id != 0:
        _wait_for_coordinator(host, port, timeout, process_id)
    strategy = _nested_reduce_strategy(tf)(communication_options=options)
    if strategy.num_replicas_in_sync != num_processes:
        raise ValueError(
            f"The TensorFlow cluster has {strategy.num_replicas_in_sync} replicas, but kbert "
            f"expects one per process ({num_processes}): use one device per worker."
        )
    return processes.ProcessGroup("tensorflow", num_processes, process_id, address, strategy)


def _nested_reduce_strategy(tf):
    """`MultiWorkerMirroredStrategy` whose `reduce` also takes a nest of per-replica values.

    `tf.distribute.Strategy.reduce` is documented for nests, but with several workers the
    collective implementation converts the whole nest to one tensor and fails; Keras reduces
    a first batch of `(x, y, sample_weight)` this way to build the model
    (keras-team/keras#20329), so dict inputs could not train on two workers. Keras also
    reduces each step's scalar logs with `axis=0`, which fails on a scalar. Each leaf is
    reduced on its own here, scalars over the replicas.
    """

    class MultiWorkerMirroredStrategy(tf.distribute.MultiWorkerMirroredStrategy):
        def reduce(self, reduce_op, value, axis):
            parent = super()

            def reduce_leaf(leaf):
                local = tf.convert_to_tensor(self.experimental_local_results(leaf)[0])
                # Keras also reduces its scalar logs over `axis=0`: scalars have no axis.
                leaf_axis = axis if local.shape.rank else None
                # A MEAN of integer ids comes back as floats: keep the dtype.
                return tf.cast(parent.reduce(reduce_op, leaf, leaf_axis), local.dtype)

            return tf.nest.map_structure(reduce_leaf, value)

    return MultiWorkerMirroredStrategy


def _start_torch(address, host, port, num_processes, process_id, timeout):
    import torch
    import torch.distributed as dist

    if torch.cuda.is_available():
        backend, device = "nccl", "cuda"
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", process_id)))
    else:
        backend, device = "gloo", "cpu"
    # Under torchrun its agent already serves the rendezvous store at MASTER_PORT.
    launched = "WORLD_SIZE" in os.environ and "RANK" in os.environ
    if process_id != 0 and not launched:
        _wait_for_coordinator(host, port, timeout, process_id)
    try:
        dist.init_process_group(
            backend,
            init_method="env://" if launched else f"tcp://{host}:{port}",
            world_size=num_processes,
            rank=process_id,
            timeout=datetime.timedelta(seconds=timeout),
        )
    except Exception as error:
        raise RuntimeError(
            f"Process {process_id} of {num_processes} could not join the torch.distributed "
            f"group at {address} within {timeout} s: {error}"
        ) from error
    return processes.ProcessGroup("torch", num_processes, process_id, address, device=device)


def shutdown():
    """Leaves the process group started by `initialize` (at the end of a run)."""
    group = processes.process_group()
    if group is None:
        return
    if group.num_processes > 1 and group.backend == "torch":
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    elif group.num_processes > 1 and group.backend == "jax":
        import jax

        jax.distributed.shutdown()
    processes.set_process_group(None)
