"""tools/benchmarks/benchmark_sparse_training.py: the step check's arithmetic (each step's loss
from Keras' running means, the relative difference of two systems' weight updates) and its
argument check. The training runs themselves need sentence-transformers' trainer (datasets,
accelerate), which the test environment does not install.

Nothing here depends on the Keras backend: the module is `backend_independent`, run once."""

import numpy as np
import pytest

from tests.tools.test_benchmark import BENCHMARKS

pytestmark = pytest.mark.backend_independent


@pytest.fixture
def tool(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import benchmark_sparse_training

    return benchmark_sparse_training


def test_step_losses_undo_the_running_mean(tool):
    losses = [3.0, 5.0, 1.5, 10.0]
    means = np.cumsum(losses) / np.arange(1, 5)
    np.testing.assert_allclose(tool.step_losses(list(means)), losses, rtol=1e-12)
    assert tool.step_losses([]) == []


def test_updates_are_compared_weight_by_weight(tool, tmp_path):
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    start = {"a": rng.normal(size=(4, 3)).astype("float32"), "b": np.zeros(5, "float32")}
    update = {"a": np.full((4, 3), 0.5, "float32"), "b": np.full(5, 2.0, "float32")}
    off = {"a": update["a"], "b": update["b"] * 1.1}  # b's update 10 % larger
    directories = {}
    for name, weights in (
        ("start", start),
        ("kbert", {k: start[k] + off[k] for k in start}),
        ("sentence-transformers", {k: start[k] + update[k] for k in start}),
    ):
        (tmp_path / name).mkdir()
        save_file(weights, str(tmp_path / name / "model.safetensors"))
        directories[name] = tmp_path / name
    rows, overall = tool.compare_updates(
        directories["start"], {s: directories[s] for s in tool.SYSTEMS}
    )
    assert rows["a"][0] == pytest.approx(0.0, abs=1e-6)
    assert rows["b"] == (pytest.approx(0.1, rel=1e-4), pytest.approx(2.0 * 5**0.5, rel=1e-6))
    expected = (0.2**2 * 5 / (0.25 * 12 + 4.0 * 5)) ** 0.5
    assert overall == pytest.approx(expected, rel=1e-4)


def test_check_steps_needs_both_systems(tool, tmp_path):
    (tmp_path / "squad").mkdir()
    (tmp_path / "squad" / "dev-v1.1.json").write_text('{"data": []}')
    for arguments, shown in (
        (["--check-steps", "2", "--system", "kbert"], "--check-steps 2 --system kbert"),
        (["--check-steps", "0"], "--check-steps 0 --system kbert sentence-transformers"),
    ):
        with pytest.raises(SystemExit, match=shown):
            tool.main(["--data-dir", str(tmp_path), *arguments])
