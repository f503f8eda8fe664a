"""An opt-in process setting: glibc's malloc keeps large blocks for reuse.

kbert applies nothing when it is imported; call `kbert.tune_allocator()` (or
`kbert.runtime.tune_allocator()`) yourself, first thing in a training script, or pass
`--tune-allocator` to the applications. Whether it pays depends on the backend and the machine:
BENCHMARKS.md has its measured effect.

On CPU, XLA (the JAX and TensorFlow backends) and PyTorch allocate the temporary buffers of
every training step afresh; the fine-tuning step of a 6-layer, 384-wide BERT at batch 32 and
length 128 asks for about 1.5 GiB of them. glibc serves each block above its mmap threshold
(32 MiB at most) with a fresh `mmap` and gives it back with `munmap` when it is freed, and
blocks asked for by a thread that has its own malloc arena are mapped afresh whatever the
threshold. Every step then faults every page of its buffers in again: for that step about
146,000 minor page faults, a large share of its wall time on a 2-vCPU machine (the counts
are in BENCHMARKS.md).

`tune_allocator()` asks glibc (`mallopt`) to serve every block from the process' heap
(`M_MMAP_MAX = 0`), to keep memory freed at the top of the heap rather than return it to the
system (`M_TRIM_THRESHOLD`), and to use one arena for every thread (`M_ARENA_MAX = 1`), so
that a block freed in one step is reused, already mapped, in the next: no page faults after
the first step. The cost is that memory the process has freed stays reserved for it (its
resident size stays at its peak). A thread keeps the arena it already has, so the setting
takes full effect only before the backend first computes: call it before the first
computation. In a multi-threaded server one arena serialises allocations and memory is never
returned to the system: leave it off there.

It applies on Linux with glibc only, and not when `KBERT_MALLOC_TUNING=0` is set, nor when
`GLIBC_TUNABLES` already sets one of these malloc parameters (the user's choice wins).
`GLIBC_TUNABLES=glibc.malloc.hugetlb=1` is another remedy (large blocks on 2 MiB pages) but
must be set before the process starts.
"""

import ctypes
import ctypes.util
import os
import platform

# mallopt parameter numbers (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8

# The largest trim threshold mallopt takes (an int): freed memory is in effect never trimmed.
_NEVER_TRIM = 2**31 - 1

_SETTINGS = {
    "M_MMAP_MAX": (_M_MMAP_MAX, 0, "glibc.malloc.mmap_max"),
    "M_TRIM_THRESHOLD": (_M_TRIM_THRESHOLD, _NEVER_TRIM, "glibc.malloc.trim_threshold"),
    "M_ARENA_MAX": (_M_ARENA_MAX, 1, "glibc.malloc.arena_max"),
}

_state = {"applied": False, "reason": "not attempted"}


def _glibc():
    """The C library if it is glibc (has `mallopt` and `gnu_get_libc_version`), else None."""
    if platform.system() != "Linux":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        libc.gnu_get_libc_version()
        libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        libc.mallopt.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


def tune_allocator():
    """Makes glibc's malloc reuse large blocks instead of mapping them afresh for every step.

    Never called by kbert itself. Call it once, before the backend first computes; calling it
    again does nothing more. See the module docstring for what it sets, why, and its cost.

    Example (it changes the process, so it is not run here), on Linux with glibc:

        kbert.tune_allocator()["applied"]  # True

    Returns:
        A dict: `"applied"` (bool) and `"reason"` (a sentence saying what was done or why not).
    """
    if _state["applied"]:
        return dict(_state)
    if os.environ.get("KBERT_MALLOC_TUNING", "1").strip() == "0":
        _state.update(applied=False, reason="KBERT_MALLOC_TUNING=0: left as it is")
        return dict(_state)
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    chosen = [tunable for _, _, tunable in _SETTINGS.values() if tunable in tunables]
    if chosen:
        _state.update(
            applied=False, reason=f"GLIBC_TUNABLES sets {', '.join(chosen)}: left as it is"
        )
        return dict(_state)
    libc = _glibc()
    if libc is None:
        _state.update(applied=False, reason="not Linux with glibc: nothing to do")
        return dict(_state)
    failed = [
        name for name, (param, value, _) in _SETTINGS.items() if libc.mallopt(param, value) != 1
    ]
    if failed:
        _state.update(applied=False, reason=f"mallopt refused {', '.join(failed)}")
    else:
        _state.update(
            applied=True,
            reason="mallopt: M_MMAP_MAX=0, M_TRIM_THRESHOLD=2**31-1, M_ARENA_MAX=1",
        )
    return dict(_state)


def allocator_tuning():
    """What `tune_allocator` did in this process: a dict with `"applied"` and `"reason"`
    (`"not attempted"` until it is called)."""
    return dict(_state)
