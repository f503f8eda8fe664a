"""Argument checks the pretraining data builders share (plain Python, no TensorFlow)."""

import random

import numpy as np


def check_rate(name, value):
    """Checks that `value` (the argument `name`) is a number in [0, 1]."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value <= 1.0:
        raise ValueError(f"`{name}` must be a number in [0, 1]. Received: {name}={value!r}")


def check_positive_int(name, value, minimum=1):
    """Checks that `value` (the argument `name`) is an integer >= `minimum`."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}. Received: {name}={value!r}")


def checked_seed(seed):
    """`seed` as a non-negative int below 2**63 (a fresh random one for `None`), or a clear
    error."""
    if seed is None:
        seed = random.SystemRandom().randrange(2**31)
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"`seed` must be a non-negative integer or None. Received: seed={seed!r}")
    return int(seed) % (2**63)
