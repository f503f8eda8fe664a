"""Quiet start-up for kbert's command-line entry points (applications and tools).

TensorFlow and XLA write notices to the process's stderr from C++ when they load and when
they first look for devices: "oneDNN custom operations are on", "Could not find cuda
drivers", `cudart_stub.cc`, and on a machine without GPU `E0000 ... failed call to cuInit:
... CUDA error (303)`. `TF_CPP_MIN_LOG_LEVEL` does not reach those written before logging is
initialised. `quiet_native_startup()` holds back what is written to file descriptor 2 while
its block runs and then writes back every line that is not one of those known notices, so
real errors still show.
"""

import contextlib
import os
import re
import sys
import tempfile

# Start-up notices that say nothing wrong on a CPU machine.
NOTICE_PATTERNS = (
    r"All log messages before absl::InitializeLog\(\) is called are written to STDERR",
    r"oneDNN custom operations are on",
    r"cudart_stub\.cc",
    r"Could not find cuda drivers on your machine",
    r"failed call to cuInit",
    r"Unable to register cu(DNN|FFT|BLAS) factory",
    r"computation placer already registered",
    r"This TensorFlow binary is optimized to use available CPU instructions",
    r"To enable the following instructions: .* rebuild TensorFlow",
    r"TF-TRT Warning: Could not find TensorRT",
    r"An NVIDIA GPU may be present on this machine, but a CUDA-enabled jaxlib is not installed",
)
_NOTICE = re.compile("|".join(NOTICE_PATTERNS))


def is_startup_notice(line):
    """True for one of the known start-up notices of TensorFlow/XLA listed in `NOTICE_PATTERNS`."""
    return bool(_NOTICE.search(line))


@contextlib.contextmanager
def quiet_native_startup():
    """Runs its block with file descriptor 2 held back, then replays it minus known notices.

    Example:
    >>> with quiet_native_startup():
    ...     import keras  # TensorFlow/XLA start-up lines are dropped, errors kept
    """
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # No usable descriptor 2 (e.g. an embedded interpreter).
        yield
        return
    with tempfile.TemporaryFile(mode="w+b") as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            try:
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            text = held.read().decode("utf-8", errors="replace")
            kept = [line for line in text.splitlines(keepends=True) if not is_startup_notice(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()
