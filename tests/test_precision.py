"""Mixed precision: every matmul-bearing layer of every kbert model computes in the policy's
low-precision dtype with float32 variables; LayerNorms compute in float32; the policy is kept
by the models and survives their config and presets."""

import keras
import numpy as np
import pytest

from kbert.models import (
    BertBackbone,
    BertClassifier,
    BertMultipleChoice,
    BertPretrainer,
    BertQuestionAnswerer,
    BertTagger,
)
from tests.test_case import (
    LayerCallRecorder,
    TestCase,
    dtype_name,
    random_backbone_inputs,
    tiny_backbone_kwargs,
)

POLICIES = {"mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}


def _backbone(policy):
    return BertBackbone(**tiny_backbone_kwargs(dtype=policy))


INPUTS = random_backbone_inputs(2, 10)
PRETRAINER_INPUTS = dict(INPUTS, mask_positions=np.array([[1, 2], [3, 4]], "int32"))
PRETRAINER_FIT_DATA = (
    PRETRAINER_INPUTS,
    {"mlm": np.array([[5, 6], [7, 8]], "int32"), "nsp": np.array([0, 1], "int32")},
    {"mlm": np.array([[1, 1], [1, 0]], "float32"), "nsp": np.ones(2, "float32")},
)
MODELS = {
    # name: (model for a policy, inputs, output dtypes: "low" is the policy's compute dtype)
    "backbone": (_backbone, INPUTS, "low"),
    "pretrainer": (
        lambda p: BertPretrainer(_backbone(p)),
        PRETRAINER_INPUTS,
        {"mlm": "low", "nsp": "low"},
    ),
    "classifier": (lambda p: BertClassifier(_backbone(p), num_classes=3), INPUTS, "low"),
    "tagger": (lambda p: BertTagger(_backbone(p), num_classes=5), INPUTS, "low"),
    # Choice logits are float32 (the -1e9 of padded choices does not fit float16).
    "multiple_choice": (
        lambda p: BertMultipleChoice(_backbone(p)),
        {key: value.reshape(1, 2, 10) for key, value in INPUTS.items()},
        "float32",
    ),
    # Span logits are float32 (the -1e9 mask value does not fit float16).
    "question_answerer": (
        lambda p: BertQuestionAnswerer(_backbone(p), sequence_length=10),
        INPUTS,
        {"start_logits": "float32", "end_logits": "float32"},
    ),
}


@pytest.fixture
def layer_calls(monkeypatch):
    """Every sublayer called through Keras' `__call__`, which the layer-call record needs: on
    eager torch the backbone otherwise computes in plain torch calls (its precision is
    tested in tests/backend/test_torch_encoder.py)."""
    from kbert.backend import paths

    monkeypatch.setattr(paths, "LEAN_TORCH_BACKBONE", False)


class TestPrecision(TestCase):
    @pytest.mark.parametrize("name", sorted(MODELS))
    def test_every_kernel_layer_computes_in_low_precision(self, name, tmp_path, layer_calls):
        model_fn, inputs, output_dtypes = MODELS[name]
        self.run_precision_test(
            model_fn,
            inputs,
            output_dtypes=output_dtypes,
            min_kernel_layers=12,
            tmp_path=tmp_path if name == "backbone" else None,  # `.keras` once: the rest is config
            fit_data=PRETRAINER_FIT_DATA
            if name == "pretrainer"
            else None,  # loss scaling under float16
        )

    def test_pretrainer_tied_decoder_and_heads_follow_the_backbone_policy(self, layer_calls):
        model = BertPretrainer(_backbone("mixed_bfloat16"))
        head = model.masked_lm_head
        assert head.dtype_policy.name == "mixed_bfloat16"
        assert model.next_sentence_head.compute_dtype == "bfloat16"
        with LayerCallRecorder() as record:
            outputs = model(PRETRAINER_INPUTS)
        # The 97-wide decoder is the reverse call of the token embedding: it runs in bfloat16.
        reverse_calls = [d for layer, d in record.calls if layer is head.token_embedding]
        assert len(reverse_calls) == 2 and all(d == ["bfloat16"] for d in reverse_calls)
        assert dtype_name(outputs["mlm"]) == "bfloat16"
        assert head.output_bias.dtype == "float32"

    @pytest.mark.parametrize("policy", sorted(POLICIES))
    def test_policy_survives_config_and_preset(self, policy, tmp_path):
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

    def test_global_policy_is_followed_and_reported(self):
        keras.config.set_dtype_policy("mixed_bfloat16")
        backbone = BertBackbone(**tiny_backbone_kwargs())
        assert backbone.dtype_policy.name == "mixed_bfloat16"
        keras.config.set_dtype_policy("float32")
        assert BertBackbone.from_config(backbone.get_config()).dtype_policy.name == "mixed_bfloat16"

    def test_mixed_precision_training_step_is_finite(self):
        model = BertClassifier(_backbone("mixed_bfloat16"), num_classes=2, dropout=0.0)
        inputs = random_backbone_inputs(4, 10)
        labels = np.array([0, 1, 1, 0], "int32")
        history = model.fit(inputs, labels, batch_size=4, epochs=2, verbose=0)
        assert np.isfinite(history.history["loss"]).all()
        for variable in model.trainable_variables:
            assert variable.dtype == "float32", variable.path

    @pytest.mark.parametrize("bad", ["mixed_bf16", "float33", "bfloat"])
    def test_unknown_policy_name_is_a_clear_error(self, bad):
        with pytest.raises(ValueError, match=f"Unknown dtype policy: dtype='{bad}'"):
            BertBackbone(**tiny_backbone_kwargs(dtype=bad))
