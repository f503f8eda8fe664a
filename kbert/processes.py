"""Which process this is when one training run is spread over several processes.

`kbert.distribution.initialize` starts the backend's engine (`jax.distributed`,
`tf.distribute.MultiWorkerMirroredStrategy` or `torch.distributed`) and records the process
group here. The rest of kbert asks this module, which imports no backend, three things:

* `process_count()` / `process_index()` - 1 and 0 until a group is started;
* `is_writer()` - True on process 0 only: presets (`kbert.checkpoints.save_preset`), training
  backups (`kbert.callbacks.TrainingBackup`) and run reports (`kbert.tracking`) are written by
  that one process, atomically; every process reads them;
* `all_sum(arrays)` / `broadcast(arrays)` - NumPy arrays summed over, or sent from process 0
  to, every process, with the backend's own collectives (every process must call them, in the
  same order).

Example:
>>> from kbert import processes
>>> if processes.is_writer():
...     print("process 0 of", processes.process_count())
process 0 of 1
"""

import numpy as np

_GROUP = None


class ProcessGroup:
    """The processes of one run, as started by `kbert.distribution.initialize`.

    Args:
        backend: str. `"jax"`, `"tensorflow"` or `"torch"`.
        num_processes: int. Processes in the run.
        process_id: int. This process' index, `0 <= process_id < num_processes`.
        coordinator_address: str. `host:port` of process 0's coordinator.
        strategy: the `tf.distribute.MultiWorkerMirroredStrategy` (TensorFlow only).
        device: str. Device of torch's collective tensors (`"cpu"` for gloo, `"cuda"` for
            nccl).
    """

    def __init__(
        self, backend, num_processes, process_id, coordinator_address, strategy=None, device="cpu"
    ):
        self.backend = backend
        self.num_processes = int(num_processes)
        self.process_id = int(process_id)
        self.coordinator_address = coordinator_address
        self.strategy = strategy
        self.device = device

    def __repr__(self):
        return (
            f"ProcessGroup(backend={self.backend!r}, num_processes={self.num_processes}, "
            f"process_id={self.process_id}, coordinator_address={self.coordinator_address!r})"
        )


def set_process_group(group):
    """Records the process group (called by `kbert.distribution.initialize`)."""
    global _GROUP
    _GROUP = group


def process_group():
    """The `ProcessGroup` started by `kbert.distribution.initialize`, or `None`."""
    return _GROUP


def process_count():
    """Processes in this run (1 until `kbert.distribution.initialize` starts a group)."""
    return _GROUP.num_processes if _GROUP is not None else 1


def process_index():
    """This process' index in the run (0 until a group is started)."""
    return _GROUP.process_id if _GROUP is not None else 0


def is_writer():
    """True on the one process that writes presets, backups and reports (process 0)."""
    return process_index() == 0


def all_sum(arrays):
    """The element-wise sums over every process of a list of NumPy arrays (a collective).

    Args:
        arrays: list of NumPy arrays, of the same shapes and dtypes on every process.

    Returns:
        list of NumPy arrays.
    """
    arrays = [np.asarray(a) for a in arrays]
    if _GROUP is None or _GROUP.num_processes == 1 or not arrays:
        return arrays
    if _GROUP.backend == "torch":
        import torch
        import torch.distributed as dist

        out = []
        for a in arrays:
            tensor = torch.from_numpy(np.array(a)).to(_GROUP.device)
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
            out.append(tensor.cpu().numpy())
        return out
    if _GROUP.backend == "jax":
        from jax.experimental import multihost_utils

        gathered = multihost_utils.process_allgather(arrays)
        return [np.asarray(g).sum(axis=0).astype(a.dtype) for g, a in zip(gathered, arrays)]
    import tensorflow as tf

    strategy = _GROUP.strategy
    out = []
    for a in arrays:
        # One value per worker (one replica each), summed over the workers.
        value = strategy.run(lambda a=a: tf.constant(a))
        out.append(strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None).numpy())
    return out


def broadcast(arrays):
    """Process 0's values of a list of NumPy arrays, on every process (a collective).

    Args:
        arrays: list of NumPy arrays, of the same shapes and dtypes on every process.

    Returns:
        list of NumPy arrays: process 0's.
    """
    arrays = [np.asarray(a) for a in arrays]
    if _GROUP is None or _GROUP.num_processes == 1 or not arrays:
        return arrays
    if _GROUP.backend == "torch":
        import torch
        import torch.distributed as dist

        out = []
        for a in arrays:
            tensor = torch.from_numpy(np.array(a)).to(_GROUP.device)
            dist.broadcast(tensor, src=0)
            out.append(tensor.cpu().numpy())
        return out
    if _GROUP.backend == "jax":
        from jax.experimental import multihost_utils

        return [np.asarray(v) for v in multihost_utils.broadcast_one_to_all(arrays)]
    zeros = arrays if _GROUP.process_id == 0 else [np.zeros_like(a) for a in arrays]
    return [s.astype(a.dtype) for s, a in zip(all_sum(zeros), arrays)]
