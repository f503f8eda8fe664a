"""The measured matmul peak of a device, against which MFU is reported."""

import statistics
import time

from bench.devices import device_kind
from bench.harness import time_calls

# The compute dtype of each precision policy: the operands of the timed matmuls.
COMPUTE_DTYPE = {"float32": "float32", "mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}


def measure_matmul_peak(backend, precision, size=None, repeats=7):
    """Median FLOP/s of a large square matmul on `backend` ("jax", "torch", "tensorflow").

    The operand dtype is the compute dtype of `precision`. The peak is measured, not taken
    from a data sheet: MFU is reported against what this device does on this software. The
    size grows from 256 until one product takes 50 ms (or reaches 2048 on CPU, 8192 on GPU),
    so that slow emulated dtypes (float16 on most CPUs) do not take minutes. On a GPU every
    size from 1024 up is timed and the largest median kept: one product of a large GPU takes
    about a millisecond, and the figure of the largest size alone varies with clocks and
    launch overhead (the largest stable figure is the device's limit).
    """
    dtype = COMPUTE_DTYPE[precision]
    on_gpu = device_kind() == "gpu"
    largest = size or (8192 if on_gpu else 2048)
    n = size or 256
    best = 0.0
    while True:
        run = matmul_runner(backend, dtype, 1, n, n, n, on_gpu)
        run()  # Compilation / first-call set-up.
        start = time.perf_counter()
        run()
        elapsed = time.perf_counter() - start
        if on_gpu and not size and n >= 1024:
            best = max(best, _median_flops(run, n, repeats))
        if size or (elapsed > 0.05 and not on_gpu) or n >= largest:
            break
        n *= 2
    return max(best, _median_flops(run, n, repeats))


def matmul_runner(backend, dtype, batch, m, k, n, on_gpu=False):
    """A function that runs one (batched) matmul `(batch, m, k) x (batch, k, n)` on `backend` in
    `dtype` and waits for it; random operands (`batch == 1`: plain 2-D operands)."""
    import numpy as np

    rng = np.random.default_rng(0)
    lead = (batch,) if batch > 1 else ()
    a = rng.standard_normal(lead + (m, k), dtype="float32")
    b = rng.standard_normal(lead + (k, n), dtype="float32")
    if backend == "jax":
        import jax
        import jax.numpy as jnp

        x, y = jnp.asarray(a, dtype=dtype), jnp.asarray(b, dtype=dtype)
        fn = jax.jit(jnp.matmul)
        return lambda: fn(x, y).block_until_ready()
    if backend == "tensorflow":
        import tensorflow as tf

        x, y = tf.cast(tf.constant(a), dtype), tf.cast(tf.constant(b), dtype)
        fn = tf.function(tf.linalg.matmul, jit_compile=False)
        # Reading one element waits for the product without copying all of it to the host.
        return lambda: tf.reshape(fn(x, y), [-1])[0].numpy()
    import torch

    device = "cuda" if on_gpu else "cpu"
    x = torch.from_numpy(a).to(device=device, dtype=getattr(torch, dtype))
    y = torch.from_numpy(b).to(device=device, dtype=getattr(torch, dtype))

    def run():
        z = x @ y
        if on_gpu:
            torch.cuda.synchronize()
        return z

    return run


def measure_matmuls_seconds(backend, precision, matmuls, repeats=7):
    """Seconds that `matmuls` (`(count, batch, m, k, n)` tuples, see `bench.flops.encoder_matmuls`)
    take on `backend` run alone, one after another: the median of each shape times its count.

    A model's forward pass cannot be faster than its own matmuls at its own shapes on the same
    library; this is that bound (the square peak of `measure_matmul_peak` can sit above or
    below what a model's shapes reach). Meant for CPUs: each product is timed with its own
    synchronisation, which on a GPU would add the launch latency to every product.
    """
    dtype = COMPUTE_DTYPE[precision]
    on_gpu = device_kind() == "gpu"
    total = 0.0
    for count, batch, m, k, n in matmuls:
        run = matmul_runner(backend, dtype, batch, m, k, n, on_gpu)
        run()  # Compilation / first-call set-up.
        total += count * _median_seconds(run, repeats)
    return total


def _median_seconds(run, repeats):
    """Median wall time of `repeats` calls of `run`."""
    return statistics.median(time_calls(run, repeats))


def _median_flops(run, n, repeats):
    return 2 * n**3 / _median_seconds(run, repeats)
