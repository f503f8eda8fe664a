"""kbert.runtime: once `tune_allocator()` is called, glibc's malloc keeps large blocks for reuse,
so a training step does not fault its buffers in afresh every time. Checked in fresh processes
by counting minor page faults; nothing is tuned unless asked."""

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.backend_independent,
    pytest.mark.skipif(
        platform.system() != "Linux" or not platform.libc_ver()[0] == "glibc",
        reason="the allocator tuning applies to Linux with glibc only",
    ),
]

RUNTIME = Path(__file__).resolve().parents[1] / "kbert" / "runtime.py"

# Allocates, writes and frees a 64 MiB block repeatedly, from the main thread and from a new
# thread (which gets its own malloc arena unless told otherwise), and prints the minor page
# faults of the last repetition.
PROBE = r"""
import importlib.util, resource, sys, threading
import numpy as np

# The module alone (importing the kbert package would import every backend: slow).
spec = importlib.util.spec_from_file_location("kbert_runtime", sys.argv[1])
runtime = importlib.util.module_from_spec(spec)
spec.loader.exec_module(runtime)
state = runtime.tune_allocator() if sys.argv[2] == "tune" else runtime.allocator_tuning()
faults = {}

def touch(name):
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        block = np.ones(64 << 20, dtype=np.uint8)
        del block
        faults[name] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

touch("main")
thread = threading.Thread(target=touch, args=("thread",))
thread.start()
thread.join()
print(state["applied"], faults["main"], faults["thread"], state["reason"], sep="|")
"""


def probe(tune=True, **env):
    environment = {
        k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "KBERT_MALLOC_TUNING")
    }
    environment.update(env)
    out = (
        subprocess.run(
            [sys.executable, "-c", PROBE, str(RUNTIME), "tune" if tune else "leave"],
            env=environment,
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    applied, main, thread, reason = out.split("|")
    return applied == "True", int(main), int(thread), reason


def test_large_blocks_are_reused_without_page_faults():
    # Without the tuning every repetition maps the block afresh and faults its pages in again
    # (4 KiB pages, or 2 MiB ones where the kernel backs mappings with huge pages).
    applied, main_untuned, thread_untuned, reason = probe(tune=False)
    assert not applied and reason == "not attempted"
    assert main_untuned >= 16 and thread_untuned >= 16, (main_untuned, thread_untuned)
    applied, main, thread, reason = probe()
    assert applied, reason
    assert main <= main_untuned // 10 and thread <= thread_untuned // 10, (main, thread)


def test_kbert_malloc_tuning_0_vetoes_the_call():
    applied, main, thread, reason = probe(KBERT_MALLOC_TUNING="0")
    assert not applied and "KBERT_MALLOC_TUNING=0" in reason
    assert main >= 16 and thread >= 16, (main, thread)


def test_the_users_glibc_tunables_win():
    applied, _, _, reason = probe(GLIBC_TUNABLES="glibc.malloc.mmap_max=10")
    assert not applied
    assert "glibc.malloc.mmap_max" in reason
