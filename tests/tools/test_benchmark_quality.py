"""tools/benchmarks/benchmark_quality.py: its CLI loads, and its `--torch-epsilon` ablation uses
kbert's public optimizer at each recipe's own rate. (Its recipes need the real data sets: not run
here.)"""

import importlib
import subprocess
import sys
from pathlib import Path

import keras
import pytest

pytestmark = pytest.mark.backend_independent

BENCHMARKS = Path(__file__).resolve().parents[2] / "tools" / "benchmarks"


@pytest.fixture
def quality(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("benchmark_quality")


def test_help_lists_the_tasks_and_ablations():
    out = subprocess.run(
        [sys.executable, str(BENCHMARKS / "benchmark_quality.py"), "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for word in ("sst2", "conll", "squad", "--torch-epsilon", "--no-dropout", "--summary"):
        assert word in out


@pytest.mark.parametrize("task", ["sst2", "conll"])
def test_torch_epsilon_optimizer_is_kbert_adamw_at_the_recipe_rate(quality, task):
    from kbert.models import BertAdamW

    recipe = quality.RECIPES[task]
    optimizer = quality.torch_epsilon_optimizer(100, recipe["learning_rate"])
    assert isinstance(optimizer, BertAdamW)
    assert optimizer.epsilon == quality.EPSILON and optimizer.global_clipnorm == quality.CLIP_NORM
    rates = []
    for step in (0, 10, 100):  # Warm-up over 10 % of 100 steps, then linear decay to 0.
        optimizer.iterations.assign(step)
        rates.append(float(keras.ops.convert_to_numpy(optimizer.learning_rate)))
    assert rates[1] == pytest.approx(recipe["learning_rate"])
    assert rates[0] < rates[1] and rates[2] == pytest.approx(0.0, abs=1e-12)
