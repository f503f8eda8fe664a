"""Mixed precision: every matmul-bearing layer of every kbert model computes in the policy's
low-precision dtype with float32 variables; LayerNorms compute in float32; the policy is kept
by the models and survives their config and presets."""

import keras
import numpy as np
import pytest

from kbert.models import (
    BertBackbone,
    BertClassifier,
    BertPretrainer,
    BertQuestionAnswerer,
    BertTagger,
)
from tests.test_case import random_backbone_inputs, tiny_backbone_kwargs

POLICIES = {"mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}


def _dtype_name(x):
    return keras.backend.standardize_dtype(x.dtype)


@pytest.fixture
def recorded_calls(monkeypatch):
    """Every `Layer.__call__` during the test: (layer, output dtypes)."""
    calls = []
    original = keras.layers.Layer.__call__

    def recording_call(self, *args, **kwargs):
        outputs = original(self, *args, **kwargs)
        dtypes = [_dtype_name(t) for t in keras.tree.flatten(outputs) if hasattr(t, "dtype")]
        calls.append((self, dtypes))
        return outputs

    monkeypatch.setattr(keras.layers.Layer, "__call__", recording_call)
    return calls


def _backbone(policy):
    return BertBackbone(**tiny_backbone_kwargs(dtype=policy))


def _models(policy):
    inputs = random_backbone_inputs(2, 10)
    yield "backbone", _backbone(policy), inputs
    positions = np.array([[1, 2], [3, 4]], "int32")
    yield "pretrainer", BertPretrainer(_backbone(policy)), dict(inputs, mask_positions=positions)
    yield "classifier", BertClassifier(_backbone(policy), num_classes=3), inputs
    yield "tagger", BertTagger(_backbone(policy), num_classes=5), inputs
    yield "question_answerer", BertQuestionAnswerer(_backbone(policy), sequence_length=10), inputs


def _kernel_layers(model):
    """Layers that own a matmul operand: Dense kernels and embedding tables (not containers)."""
    found = []
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if isinstance(layer, keras.layers.LayerNormalization):
            continue
        own = [v for v in layer._trainable_variables]  # variables created by the layer itself
        if any(v.name in ("kernel", "embeddings") for v in own):
            found.append(layer)
    return found


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_kernel_layer_computes_in_low_precision(policy, recorded_calls):
    low = POLICIES[policy]
    for name, model, inputs in _models(policy):
        assert model.dtype_policy.name == policy, name
        recorded_calls.clear()
        model(inputs)
        outputs_by_layer = {}
        for layer, dtypes in recorded_calls:
            outputs_by_layer.setdefault(id(layer), []).extend(dtypes)
        kernel_layers = _kernel_layers(model)
        assert len(kernel_layers) >= 12, (name, [layer.path for layer in kernel_layers])
        for layer in kernel_layers:
            where = f"{name}: {layer.path}"
            assert layer.compute_dtype == low, where
            for variable in layer.trainable_variables:
                assert variable.dtype == "float32", f"{where}/{variable.name}"
            dtypes = outputs_by_layer.get(id(layer))
            assert dtypes, f"{where} was not called"
            # Every output of the layer (the tied decoder's logits included) is low precision.
            assert set(dtypes) == {low}, (where, dtypes)
        norms = [
            layer
            for layer in model._flatten_layers(include_self=False, recursive=True)
            if isinstance(layer, keras.layers.LayerNormalization)
        ]
        assert norms, name
        for layer in norms:
            assert layer.compute_dtype == "float32", f"{name}: {layer.path}"
            assert set(outputs_by_layer[id(layer)]) == {"float32"}, f"{name}: {layer.path}"


def test_pretrainer_tied_decoder_and_heads_follow_the_backbone_policy(recorded_calls):
    model = BertPretrainer(_backbone("mixed_bfloat16"))
    head = model.masked_lm_head
    assert head.dtype_policy.name == "mixed_bfloat16"
    assert model.next_sentence_head.compute_dtype == "bfloat16"
    inputs = dict(random_backbone_inputs(2, 10), mask_positions=np.array([[1, 2], [3, 4]], "int32"))
    outputs = model(inputs)
    # The 97-wide decoder is the reverse call of the token embedding: it runs in bfloat16.
    reverse_calls = [d for layer, d in recorded_calls if layer is head.token_embedding]
    assert len(reverse_calls) == 2 and all(d == ["bfloat16"] for d in reverse_calls)
    assert _dtype_name(outputs["mlm"]) == "bfloat16"
    assert head.output_bias.dtype == "float32"


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_policy_survives_config_and_preset(policy, tmp_path):
    backbone = _backbone(policy)
    assert backbone.get_config()["dtype"]["config"]["name"] == policy
    assert BertBackbone.from_config(backbone.get_config()).dtype_policy.name == policy
    classifier = BertClassifier(backbone, num_classes=2)
    classifier.save_to_preset(tmp_path / "preset")
    restored = BertClassifier.from_preset(tmp_path / "preset")
    assert restored.backbone.dtype_policy.name == policy
    assert restored.output_dense.compute_dtype == POLICIES[policy]
    restored_backbone = BertBackbone.from_preset(tmp_path / "preset")
    assert restored_backbone.dtype_policy.name == policy
    inputs = random_backbone_inputs(2, 10)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(keras.ops.cast(restored(inputs), "float32")),
        keras.ops.convert_to_numpy(keras.ops.cast(classifier(inputs), "float32")),
    )


def test_global_policy_is_followed_and_reported():
    keras.config.set_dtype_policy("mixed_bfloat16")
    backbone = BertBackbone(**tiny_backbone_kwargs())
    assert backbone.dtype_policy.name == "mixed_bfloat16"
    keras.config.set_dtype_policy("float32")
    assert BertBackbone.from_config(backbone.get_config()).dtype_policy.name == "mixed_bfloat16"


def test_mixed_precision_training_step_is_finite():
    model = BertClassifier(_backbone("mixed_bfloat16"), num_classes=2, dropout=0.0)
    inputs = random_backbone_inputs(4, 10)
    labels = np.array([0, 1, 1, 0], "int32")
    history = model.fit(inputs, labels, batch_size=4, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    for variable in model.trainable_variables:
        assert variable.dtype == "float32", variable.path


@pytest.mark.parametrize("bad", ["mixed_bf16", "float33", "bfloat"])
def test_unknown_policy_name_is_a_clear_error(bad):
    with pytest.raises(ValueError, match=f"Unknown dtype policy: dtype='{bad}'"):
        BertBackbone(**tiny_backbone_kwargs(dtype=bad))
