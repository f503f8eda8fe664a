"""`import kbert` leaves the process alone, on the backend of this session.

Each check runs in a fresh interpreter (what a user's script sees): no allocator setting (large
malloc blocks still fault their pages in on every reuse), no stderr capture (neither
`sys.stderr` nor file descriptor 2 replaced, even for a moment), no warnings filter added, no
device probed, no TensorFlow imported under JAX or PyTorch, and `import kbert` with every
subpackage imports no third-party package beyond those Keras already imported but
`safetensors` (the optional libraries - transformers, huggingface_hub, matplotlib, SciPy ... -
load when a function needs them). What that costs in seconds is measured elsewhere (a timing
bound fails on a loaded machine for reasons that are not kbert's).
"""

import functools
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import keras

from tests.per_backend import per_backend

REPO = Path(__file__).resolve().parents[1]
BACKEND = keras.backend.backend()
# What a script touches first: every subpackage, and the names most scripts start with.
TOUCH_KBERT = (
    "import kbert\n"
    "kbert.models.BertClassifier, kbert.models.BertBackbone, kbert.text.BertTokenizer\n"
    "kbert.layers, kbert.metrics, kbert.checkpoints, kbert.data.read_glue, kbert.callbacks\n"
    "kbert.tracking, kbert.export, kbert.distribution\n"
)

PROBE = r"""
import functools, importlib, importlib.abc, json, os, resource, sys, warnings

backend = os.environ["KERAS_BACKEND"]
import keras  # Keras' own effects are the baseline.

probes = []


def watch(module, *names):
    for name in names:
        original = getattr(module, name)

        def probe(*args, __original=original, __name=f"{module.__name__}.{name}", **kwargs):
            probes.append(__name)
            return __original(*args, **kwargs)

        setattr(module, name, probe)


# Per backend: the device-probing functions watched, as (module path, function names).
DEVICE_PROBES = {
    "jax": [
        ("jax", ["devices", "local_devices", "device_count", "local_device_count",
                 "default_backend"]),
    ],
    "tensorflow": [
        ("tensorflow.config", ["list_physical_devices", "list_logical_devices",
                               "get_visible_devices"]),
        ("tensorflow.config.experimental", ["list_physical_devices", "list_logical_devices"]),
    ],
    "torch": [("torch.cuda", ["is_available", "device_count", "init"])],
}
for path, names in DEVICE_PROBES[backend]:
    package, *attributes = path.split(".")
    watch(functools.reduce(getattr, attributes, importlib.import_module(package)), *names)


def descriptor_2():
    status = os.fstat(2)
    return (status.st_dev, status.st_ino)


stderr, fd2, filters = sys.stderr, descriptor_2(), list(warnings.filters)
seen_fd2 = set()


class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        seen_fd2.add(descriptor_2())  # fd 2 at every import kbert makes
        return None


sys.meta_path.insert(0, Watch())
before = set(sys.modules)
exec(sys.argv[1])
added = {name.split(".")[0] for name in set(sys.modules) - before}
sys.meta_path.pop(0)

# Allocate, write and free a 64 MiB block three times: untuned glibc maps it afresh each time.
import numpy as np

for _ in range(3):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = np.ones(64 << 20, dtype=np.uint8)
    del block
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

print(json.dumps({
    "tensorflow": "tensorflow" in sys.modules,
    "stderr_same": sys.stderr is stderr,
    "fd2_same": seen_fd2 <= {fd2} and descriptor_2() == fd2,
    "filters_same": warnings.filters == filters,
    "probes": probes,
    "allocator": kbert.runtime.allocator_tuning(),
    "faults": faults,
    "added_packages": sorted(added - set(sys.stdlib_module_names)),
}))
"""


def _run(script, code):
    environment = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES",)}
    environment.update(KERAS_BACKEND=BACKEND, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(
        [sys.executable, "-c", script, code],
        env=environment,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


@functools.cache
def _probe():
    """One fresh process's report (shared by the tests: each process costs seconds)."""
    return json.loads(_run(PROBE, TOUCH_KBERT))


def test_import_kbert_leaves_the_process_alone():
    report = _probe()
    # Under JAX and torch nothing imports TensorFlow; under TensorFlow, Keras has imported it.
    has_tensorflow = per_backend(tensorflow=True, jax=False, torch=False)
    assert report["tensorflow"] == has_tensorflow, (
        f"TensorFlow imported: {report['tensorflow']}, under {BACKEND}"
    )
    assert report["stderr_same"], "import kbert replaced sys.stderr"
    assert report["fd2_same"], "import kbert redirected file descriptor 2"
    assert report["filters_same"], "import kbert changed the warnings filters"
    assert report["probes"] == [], f"import kbert probed devices: {report['probes']}"
    assert report["allocator"] == {"applied": False, "reason": "not attempted"}
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        # 64 MiB in 4 KiB pages, or 32 faults if the kernel backs the mapping with huge pages.
        assert report["faults"] >= 16, f"large blocks are reused: malloc was tuned ({report})"


def test_import_kbert_brings_in_no_optional_library():
    """Beyond what `import keras` loaded, kbert's import adds itself and safetensors only."""
    added = set(_probe()["added_packages"])
    assert added <= {"kbert", "safetensors"}, f"import kbert also imported {sorted(added)}"
    assert "kbert" in added
