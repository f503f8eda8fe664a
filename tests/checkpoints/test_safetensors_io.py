"""The NumPy safetensors reader against the `safetensors` package's own writer (no Keras
involved)."""

import numpy as np
import pytest
from safetensors.numpy import save_file

from kbert.checkpoints import read_safetensors
from kbert.checkpoints.safetensors_io import safetensors_metadata

pytestmark = pytest.mark.backend_independent


def _tensors():
    rng = np.random.default_rng(0)
    return {
        "a.weight": rng.normal(size=(3, 5)).astype(np.float32),
        "b.bias": rng.normal(size=(7,)).astype(np.float16),
        "c.ids": np.arange(6, dtype=np.int64).reshape(2, 3),
        "d.double": rng.normal(size=(2, 2, 2)).astype(np.float64),
        "e.empty": np.zeros((0, 4), np.float32),
        "f.flags": np.array([True, False, True]),
    }


def test_round_trip_equals_safetensors_writer(tmp_path):
    tensors = _tensors()
    save_file(tensors, tmp_path / "m.safetensors", metadata={"format": "pt"})
    loaded = read_safetensors(tmp_path / "m.safetensors")
    assert sorted(loaded) == sorted(tensors)
    for name, value in tensors.items():
        assert loaded[name].dtype == value.dtype, name
        np.testing.assert_array_equal(loaded[name], value)
    assert safetensors_metadata(tmp_path / "m.safetensors") == {"format": "pt"}
    subset = read_safetensors(tmp_path / "m.safetensors", names=["c.ids"])
    assert list(subset) == ["c.ids"]


def test_bfloat16_is_widened_exactly(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file as save_torch

    values = torch.tensor([[1.0, -2.5, 3.140625], [1e-3, 65280.0, -0.0]], dtype=torch.bfloat16)
    save_torch({"w": values}, str(tmp_path / "bf16.safetensors"))
    loaded = read_safetensors(tmp_path / "bf16.safetensors")["w"]
    assert loaded.dtype == np.float32
    np.testing.assert_array_equal(loaded, values.float().numpy())


def test_truncated_file_is_reported(tmp_path):
    save_file(_tensors(), tmp_path / "m.safetensors")
    data = (tmp_path / "m.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[:-10])
    with pytest.raises(ValueError, match="is truncated: tensor"):
        read_safetensors(tmp_path / "cut.safetensors")
    (tmp_path / "header_cut.safetensors").write_bytes(data[:40])
    with pytest.raises(ValueError, match="truncated"):
        read_safetensors(tmp_path / "header_cut.safetensors")
    (tmp_path / "tiny.safetensors").write_bytes(data[:5])
    with pytest.raises(ValueError, match="truncated or empty"):
        read_safetensors(tmp_path / "tiny.safetensors")


def test_corrupt_header_and_absent_names(tmp_path):
    header = b'{"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}}'
    (tmp_path / "bad.safetensors").write_bytes(
        len(header).to_bytes(8, "little") + header + b"\0" * 16
    )
    with pytest.raises(ValueError, match="need 16 bytes"):
        read_safetensors(tmp_path / "bad.safetensors")
    (tmp_path / "json.safetensors").write_bytes((5).to_bytes(8, "little") + b"{nope" + b"\0" * 4)
    with pytest.raises(ValueError, match="bad JSON header"):
        read_safetensors(tmp_path / "json.safetensors")
    save_file(_tensors(), tmp_path / "m.safetensors")
    with pytest.raises(ValueError, match="no tensors named"):
        read_safetensors(tmp_path / "m.safetensors", names=["missing"])
