"""Shared pytest set-up: quiet TensorFlow, deterministic seeds, backend marker."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import pytest


if keras.backend.backend() == "torch":
    import torch

    # Tiny test models gain nothing from intra-op threads, and spinning OpenMP workers on a
    # shared 2-core machine make each small matmul orders of magnitude slower.
    torch.set_num_threads(1)


def pytest_report_header(config):
    return f"keras backend: {keras.backend.backend()}, keras {keras.__version__}"


@pytest.fixture(autouse=True)
def _seed_and_reset():
    keras.utils.set_random_seed(1337)
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")
