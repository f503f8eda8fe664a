"""Which device the current worker process runs on, and its name."""

import os
import platform
import subprocess


def device_kind():
    """ "gpu" when the current process' framework sees an accelerator, else "cpu"."""
    backend = os.environ.get("KERAS_BACKEND", "torch")
    try:
        if backend == "jax":
            import jax

            return "gpu" if jax.devices()[0].platform in ("gpu", "cuda", "rocm") else "cpu"
        if backend == "tensorflow":
            import tensorflow as tf

            return "gpu" if tf.config.list_physical_devices("GPU") else "cpu"
        import torch

        return "gpu" if torch.cuda.is_available() else "cpu"
    except Exception:
        return "cpu"


def device_name():
    if device_kind() == "gpu":
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                check=True,
            )
            return out.stdout.strip().splitlines()[0]
        except Exception:
            return "GPU"
    cpu = platform.processor() or "CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} logical CPUs"
