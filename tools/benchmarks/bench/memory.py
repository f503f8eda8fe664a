"""Peak memory of a fine-tuning step for one memory option (plain / remat / accumulate)."""

import statistics

from bench.common import random_batch
from bench.devices import device_kind
from bench.flops import resolve_preset
from bench.harness import emit
from bench.keras_timing import _compile_keras, _keras_data, _keras_fit_times, _keras_models


def _peak_rss_bytes():
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB.


def _gpu_peak_reset_and_reader(backend):
    """Returns a function giving the framework's peak device memory since this call (GPU only)."""
    if backend == "torch":
        import torch

        torch.cuda.reset_peak_memory_stats()
        return lambda: torch.cuda.max_memory_allocated()
    if backend == "jax":
        import jax

        device = jax.devices()[0]
        return lambda: device.memory_stats().get("peak_bytes_in_use")
    import tensorflow as tf

    tf.config.experimental.reset_memory_stats("GPU:0")
    return lambda: tf.config.experimental.get_memory_info("GPU:0")["peak"]


def _jax_step_temp_bytes(model, x, y, batch_size):
    """XLA's temporary-buffer size of the compiled train step (JAX only)."""
    import jax
    import numpy as np

    model.make_train_function()
    model.optimizer.build(model.trainable_variables)
    state = (
        [v.value for v in model.trainable_variables],
        [v.value for v in model.non_trainable_variables],
        [v.value for v in model.optimizer.variables],
        [v.value for v in model.metrics_variables],
    )
    data = ({k: np.asarray(v[:batch_size]) for k, v in x.items()}, np.asarray(y[:batch_size]), None)
    lowered = jax.jit(model.train_step).lower(state, data)
    analysis = lowered.compile().memory_analysis()
    return getattr(analysis, "temp_size_in_bytes", None)


def memory_worker_main(spec):
    """Peak memory of a fine-tuning step for one variant (plain / remat / accumulate)."""
    import keras

    backend = spec["backend"]
    shape = resolve_preset(spec["preset"])
    variant = spec["variant"]
    accumulation = spec["accumulation"] if variant == "accumulate" else None
    batch_size = spec["batch_size"] // accumulation if accumulation else spec["batch_size"]
    keras.utils.set_random_seed(0)
    backbone_model = _keras_models(
        "kbert", shape, spec["precision"], "finetune", remat=variant == "remat"
    )
    _compile_keras(backbone_model, "kbert", "finetune", spec["jit_compile"], accumulation)
    batch = random_batch(shape, batch_size, spec["sequence_length"], 20)
    x, y, _ = _keras_data("kbert", "finetune", batch)
    on_gpu = device_kind() == "gpu"
    record = dict(spec, micro_batch_size=batch_size)
    if backend == "jax" and not on_gpu:
        try:
            record["xla_temp_bytes"] = _jax_step_temp_bytes(backbone_model, x, y, batch_size)
        except Exception as error:
            record["xla_temp_error"] = f"{type(error).__name__}: {error}"[:300]
    reader = _gpu_peak_reset_and_reader(backend) if on_gpu else None
    rss_before = _peak_rss_bytes()
    steps = accumulation or 1
    times, _ = _keras_fit_times(
        backbone_model, x, y, None, batch_size, warmup=steps, steps=2 * steps
    )
    record["rss_peak_growth_bytes"] = _peak_rss_bytes() - rss_before
    record["rss_peak_bytes"] = _peak_rss_bytes()
    if reader is not None:
        record["device_peak_bytes"] = reader()
    record["seconds_per_effective_batch"] = statistics.median(times) * steps
    emit(record)
