"""keras-hub BERT presets, written by keras-hub itself, against keras-hub's own outputs."""

import json
import shutil

import numpy as np
import pytest

keras_hub = pytest.importorskip("keras_hub")

import kbert  # noqa: E402
from tests.checkpoints import _reference as R  # noqa: E402

VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"tok{i}" for i in range(92)]


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=97,
        num_layers=2,
        num_heads=4,
        hidden_dim=32,
        intermediate_dim=50,
        max_sequence_length=24,
        num_segments=3,
        dropout=0.0,
    )
    rng = np.random.default_rng(7)
    for variable in backbone.weights:  # Large random weights (biases and LayerNorms too).
        offset = 1.0 if variable.path.endswith("gamma") else 0.0
        variable.assign(offset + 0.5 * rng.standard_normal(tuple(variable.shape)).astype("float32"))
    path = tmp_path_factory.mktemp("keras_hub_preset")
    backbone.save_to_preset(path)
    keras_hub.models.BertTokenizer(vocabulary=VOCABULARY).save_to_preset(path)
    return path, backbone


def _inputs():
    inputs = R.backbone_inputs(R.random_inputs(R.hf_config(type_vocab_size=3)))
    return inputs


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_backbone_matches_keras_hub(preset):
    path, reference = preset
    assert (path / "config.json").is_file() and (path / "model.weights.h5").is_file()
    backbone = kbert.models.BertBackbone.from_preset(path)
    assert backbone.activation == "gelu_approximate" and backbone.num_segments == 3
    assert backbone.preset_vocabulary_path == str(path / "assets" / "tokenizer" / "vocabulary.txt")
    inputs = _inputs()
    expected = {k: R.to_numpy(v) for k, v in reference(inputs).items()}
    outputs = backbone(inputs)
    R.assert_close(outputs["sequence_output"], expected["sequence_output"], inputs["padding_mask"])
    R.assert_close(outputs["pooled_output"], expected["pooled_output"])

    # The check can fail: the same weights with exact GELU are far off.
    exact = kbert.models.BertBackbone.from_preset(path, activation="gelu")
    difference = R.max_diff(
        exact(inputs)["sequence_output"], expected["sequence_output"], inputs["padding_mask"]
    )
    assert difference > 10 * R.TOLERANCE


def test_pretrainer_heads_are_fresh_and_reported(preset):
    path, _ = preset
    with pytest.warns(UserWarning, match="mlm_head/mlm_transform_dense/kernel"):
        kbert.models.BertPretrainer.from_preset(path)
    with pytest.raises(ValueError, match="missing head weights"):
        kbert.models.BertPretrainer.from_preset(path, fresh_heads=False)


def test_refusals(preset, tmp_path):
    path, _ = preset
    other = _copy(path, tmp_path / "roberta")
    config = json.loads((other / "config.json").read_text())
    config["registered_name"] = "keras_hub>RobertaBackbone"
    config["class_name"] = "RobertaBackbone"
    config["module"] = "keras_hub.src.models.roberta.roberta_backbone"
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="not a BERT checkpoint.*RobertaBackbone"):
        kbert.models.BertBackbone.from_preset(other)

    no_weights = _copy(path, tmp_path / "no_weights")
    (no_weights / "model.weights.h5").unlink()
    with pytest.raises(FileNotFoundError, match="model.weights.h5"):
        kbert.models.BertBackbone.from_preset(no_weights)

    vocabulary = _copy(path, tmp_path / "vocabulary")
    (vocabulary / "assets" / "tokenizer" / "vocabulary.txt").write_text(
        "\n".join(VOCABULARY[:40]) + "\n"
    )
    with pytest.raises(ValueError, match="has 40 tokens but .* vocabulary_size=97"):
        kbert.models.BertBackbone.from_preset(vocabulary)

    unknown = _copy(path, tmp_path / "unknown_key")
    config = json.loads((unknown / "config.json").read_text())
    config["config"]["activation"] = "relu"
    (unknown / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"unknown \['activation'\]"):
        kbert.models.BertBackbone.from_preset(unknown)


def test_h5py_reader_equals_keras_hub_weights(preset):
    """The h5py reader names every variable as keras-hub does and reads its exact value."""
    path, reference = preset
    arrays = kbert.checkpoints.keras_hub.read_weights_h5(path / "model.weights.h5")
    expected = {v.path: R.to_numpy(v) for v in reference.weights}
    assert sorted(arrays) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(arrays[name], value, err_msg=name)
    # And a model keras-hub itself loads from the file has the same values.
    loaded = keras_hub.models.BertBackbone.from_preset(str(path))
    for variable in loaded.weights:
        np.testing.assert_array_equal(
            arrays[variable.path], R.to_numpy(variable), err_msg=variable.path
        )


def test_damaged_weights_file_is_named(preset, tmp_path):
    path, _ = preset
    damaged = _copy(path, tmp_path / "damaged")
    data = (damaged / "model.weights.h5").read_bytes()
    (damaged / "model.weights.h5").write_bytes(data[: len(data) // 3])
    with pytest.raises(
        ValueError, match=r"damaged.*model\.weights\.h5|model\.weights\.h5.*damaged"
    ):
        kbert.models.BertBackbone.from_preset(damaged)


def test_unexpected_h5_layouts_are_refused(preset, tmp_path):
    import h5py

    path, _ = preset
    extra = _copy(path, tmp_path / "extra_variable")
    with h5py.File(extra / "model.weights.h5", "a") as file:
        file["layers/dense/vars"].create_dataset("2", data=np.zeros(3, "float32"))
    with pytest.raises(ValueError, match=r"unexpected variables \['0', '1', '2'\].*'pooled_dense'"):
        kbert.models.BertBackbone.from_preset(extra)

    other = _copy(path, tmp_path / "no_layers")
    with h5py.File(other / "model.weights.h5", "w") as file:
        file.create_dataset("kernel", data=np.zeros(3, "float32"))
    with pytest.raises(ValueError, match=r"model\.weights\.h5 has no 'layers' group"):
        kbert.models.BertBackbone.from_preset(other)
