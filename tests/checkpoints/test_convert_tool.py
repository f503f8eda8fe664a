"""tools/convert_checkpoint.py end to end on a Hugging Face, a Google and a keras-hub source."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
keras_hub = pytest.importorskip("keras_hub")

from tests.checkpoints import _reference as R  # noqa: E402

TOOL = Path(__file__).resolve().parents[2] / "tools" / "convert_checkpoint.py"


def _tool():
    spec = importlib.util.spec_from_file_location("convert_checkpoint", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sources(tmp_path):
    config = R.hf_config()
    hf_model = R.make_hf_model(config, "pretraining")
    hf_model.save_pretrained(tmp_path / "hf")
    google = R.write_google_checkpoint(
        tmp_path / "google", R.google_variables_from_hf(hf_model), R.google_bert_config(config)
    )
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=97,
        num_layers=2,
        num_heads=4,
        hidden_dim=32,
        intermediate_dim=50,
        max_sequence_length=24,
    )
    rng = np.random.default_rng(0)
    for variable in backbone.weights:
        offset = 1.0 if variable.path.endswith("gamma") else 0.0
        variable.assign(offset + 0.5 * rng.standard_normal(tuple(variable.shape)).astype("float32"))
    backbone.save_to_preset(tmp_path / "keras_hub")
    return {"huggingface": tmp_path / "hf", "google": google, "keras_hub": tmp_path / "keras_hub"}


def test_convert_checkpoint_reports_parity(tmp_path, capsys):
    tool = _tool()
    sources = _sources(tmp_path)
    runs = [
        ("huggingface", "pretrainer", "huggingface", {"mlm", "nsp", "sequence_output"}),
        ("google", "pretrainer", "kbert", {"mlm", "nsp", "sequence_output", "pooled_output"}),
        ("keras_hub", "backbone", "huggingface", {"sequence_output", "pooled_output"}),
    ]
    for source, model, out_format, compared in runs:
        output = tmp_path / f"out_{source}"
        report = tool.main(
            [
                "--source",
                str(sources[source]),
                "--output",
                str(output),
                "--format",
                out_format,
                "--model",
                model,
            ]
        )
        assert report["source_format"] == source
        assert set(report["against_source"]) == compared, source
        assert report["ok"], report
        assert all(value == 0.0 for value in report["round_trip"].values()), report
        assert (
            output / ("model.safetensors" if out_format == "huggingface" else "model.weights.h5")
        ).is_file()
    printed = capsys.readouterr().out
    assert "Parity report" in printed and "FAIL" not in printed

    # Differences above the tolerance fail the report (float32 round-off is far above 1e-12).
    report = tool.main(
        [
            "--source",
            str(sources["huggingface"]),
            "--output",
            str(tmp_path / "strict"),
            "--tolerance",
            "1e-12",
        ]
    )
    assert not report["ok"] and report["against_source"]["sequence_output"] > 1e-12
    assert "FAIL" in capsys.readouterr().out
