"""A keras-hub BERT preset loads with neither keras-hub nor TensorFlow installed.

keras-hub is absent here, so the preset is generated: `config.json` and a `model.weights.h5`
written with h5py in the layout keras-hub 0.32 / Keras 3 uses for a `BertBackbone` (each layer a
group named after its class, whose `vars` subgroup names the layer in its `name` attribute and
holds its variables as datasets `0`, `1`, ...; weightless layers such as dropouts are left
out). tests/checkpoints/test_keras_hub.py checks the
reader against files keras-hub itself writes.
"""

import json

import numpy as np
import pytest

from kbert.models import BertBackbone
from tests.test_case import to_numpy

h5py = pytest.importorskip("h5py")

SIZES = dict(vocabulary_size=23, num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=12)
MAX_LENGTH, SEGMENTS = 10, 2


def _layers(sizes):
    """`(h5 group path, layer name, {variable name: shape})` of a keras-hub BertBackbone."""
    H, F, heads = sizes["hidden_dim"], sizes["intermediate_dim"], sizes["num_heads"]
    dense = lambda n, m: {"kernel": (n, m), "bias": (m,)}  # noqa: E731
    norm = {"gamma": (H,), "beta": (H,)}
    layers = [
        ("reversible_embedding", "token_embedding", {"embeddings": (sizes["vocabulary_size"], H)}),
        ("position_embedding", "position_embedding", {"embeddings": (MAX_LENGTH, H)}),
        ("embedding", "segment_embedding", {"embeddings": (SEGMENTS, H)}),
        ("layer_normalization", "embeddings_layer_norm", norm),
        ("dense", "pooled_dense", dense(H, H)),
    ]
    for i in range(sizes["num_layers"]):
        encoder = "transformer_encoder" + (f"_{i}" if i else "")
        attention = f"{encoder}/_self_attention_layer"
        layers += [(encoder, f"transformer_layer_{i}", {}), (attention, "self_attention_layer", {})]
        for key in ("query", "key", "value"):
            per_head = {"kernel": (H, heads, H // heads), "bias": (heads, H // heads)}
            layers.append((f"{attention}/{key}_dense", key, per_head))
        output = {"kernel": (heads, H // heads, H), "bias": (H,)}
        layers += [
            (f"{attention}/output_dense", "attention_output", output),
            (f"{encoder}/_self_attention_layer_norm", "self_attention_layer_norm", norm),
            (f"{encoder}/_feedforward_layer_norm", "feedforward_layer_norm", norm),
            (
                f"{encoder}/_feedforward_intermediate_dense",
                "feedforward_intermediate_dense",
                dense(H, F),
            ),
            (f"{encoder}/_feedforward_output_dense", "feedforward_output_dense", dense(F, H)),
        ]
    return layers


def _write_preset(path, rng):
    """Writes a keras-hub BERT preset; returns `{keras-hub variable path: array}` written."""
    config = {
        "module": "keras_hub.src.models.bert.bert_backbone",
        "class_name": "BertBackbone",
        "config": {
            "name": "bert_backbone",
            "trainable": True,
            **SIZES,
            "dropout": 0.0,
            "max_sequence_length": MAX_LENGTH,
            "num_segments": SEGMENTS,
        },
        "registered_name": "keras_hub>BertBackbone",
    }
    (path / "config.json").write_text(json.dumps(config))
    written = {}
    parents = {}
    with h5py.File(path / "model.weights.h5", "w") as file:
        file.create_group("vars").attrs["name"] = "bert_backbone"
        for group, name, variables in _layers(SIZES):
            parent = group.rpartition("/")[0]
            variable_group = file.create_group(f"layers/{group}/vars")
            variable_group.attrs["name"] = name
            parents[group] = f"{parents[parent]}/{name}" if parent else name
            for index, (variable, shape) in enumerate(variables.items()):
                value = rng.standard_normal(shape).astype("float32") + (variable == "gamma")
                variable_group.create_dataset(str(index), data=value)
                written[f"{parents[group]}/{variable}"] = value
    return written


def test_keras_hub_preset_loads_without_keras_hub(tmp_path):
    written = _write_preset(tmp_path, np.random.default_rng(3))
    assert "transformer_layer_1/self_attention_layer/query/kernel" in written
    backbone = BertBackbone.from_preset(tmp_path)
    assert backbone.activation == "gelu_approximate" and backbone.num_layers == 2
    variables = {v.path: to_numpy(v) for v in backbone.weights}
    H = SIZES["hidden_dim"]
    for i in range(SIZES["num_layers"]):
        source = f"transformer_layer_{i}/self_attention_layer"
        np.testing.assert_array_equal(
            variables[f"transformer_layer_{i}/self_attention/query/kernel"],
            written[f"{source}/query/kernel"].reshape(H, H),
        )
        np.testing.assert_array_equal(
            variables[f"transformer_layer_{i}/self_attention/attention_output/kernel"],
            written[f"{source}/attention_output/kernel"].reshape(H, H),
        )
        np.testing.assert_array_equal(
            variables[f"transformer_layer_{i}/output_layer_norm/gamma"],
            written[f"transformer_layer_{i}/feedforward_layer_norm/gamma"],
        )
    np.testing.assert_array_equal(
        variables["embeddings/token_embedding/embeddings"], written["token_embedding/embeddings"]
    )
    np.testing.assert_array_equal(
        variables["pooler/pooler_dense/bias"], written["pooled_dense/bias"]
    )
    # Every written tensor went somewhere: the loaded weights hold exactly the same multiset.
    loaded = sorted(float(np.sum(np.abs(v))) for v in variables.values())
    assert np.allclose(loaded, sorted(float(np.sum(np.abs(v))) for v in written.values()))
