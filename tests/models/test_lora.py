"""LoRA: which weights train, the update against NumPy, adapter save/load, merging, saving,
errors."""

import keras
import numpy as np
import pytest

from kbert.models import BertBackbone, BertClassifier, BertPretrainer
from kbert.models.lora import lora_layers
from tests.test_case import (
    TestCase,
    assert_all_close,
    random_backbone_inputs,
    tiny_backbone_kwargs,
    to_numpy,
    values_by_path,
)

RANK = 4


def tiny_classifier(**backbone_overrides):
    backbone = BertBackbone(**tiny_backbone_kwargs(**backbone_overrides))
    return BertClassifier(backbone, num_classes=3, dropout=0.0)


def randomize_lora(model, seed=0, scale=0.3):
    """LoRA B starts at zero (no change); random A and B make the adapter visible in outputs."""
    rng = np.random.default_rng(seed)
    backbone = getattr(model, "backbone", model)
    for dense in lora_layers(backbone).values():
        for variable in (dense.lora_kernel_a, dense.lora_kernel_b):
            variable.assign(rng.normal(0, scale, variable.shape).astype("float32"))


class TestLora(TestCase):
    def test_only_lora_and_head_train_and_base_weights_stay_fixed_in_fit(self):
        model = tiny_classifier()
        model.enable_lora(RANK)
        trainable = sorted(v.path for v in model.trainable_weights)
        expected = sorted(
            [
                f"transformer_layer_{i}/self_attention/{name}/lora_kernel_{ab}"
                for i in range(2)
                for name in ("query", "key", "value", "attention_output")
                for ab in "ab"
            ]
            + ["classifier/kernel", "classifier/bias"]
        )
        assert trainable == expected
        inputs = random_backbone_inputs(batch_size=8)
        labels = np.arange(8) % 3
        before = values_by_path(model)
        model.fit(inputs, labels, batch_size=4, epochs=2, verbose=0)
        after = values_by_path(model)
        changed = sorted(path for path in before if not np.array_equal(before[path], after[path]))
        # B starts at 0 so A's first gradient is 0; B and the head must move.
        assert {p for p in changed if "lora_kernel_b" in p}, changed
        assert set(changed) <= set(expected), sorted(set(changed) - set(expected))
        assert "classifier/kernel" in changed

    def test_feedforward_flag_adds_the_feedforward_layers(self):
        backbone = BertBackbone(**tiny_backbone_kwargs())
        backbone.enable_lora(RANK, feedforward=True)
        names = sorted(lora_layers(backbone))
        assert (
            "transformer_layer_1/intermediate_dense" in names
            and "transformer_layer_0/output_dense" in names
        )
        assert len(names) == 2 * 6
        trainable = {v.path for v in backbone.trainable_weights}
        assert all("lora_kernel" in p for p in trainable) and len(trainable) == 2 * 6 * 2

    def test_lora_update_equals_numpy_low_rank_update(self):
        """The adapted backbone equals a plain one whose kernels are W + alpha / r * A @ B."""
        alpha = 2.0
        backbone = BertBackbone(**tiny_backbone_kwargs())
        reference = BertBackbone(**tiny_backbone_kwargs())
        reference.set_weights(backbone.get_weights())
        backbone.enable_lora(RANK, alpha=alpha)
        randomize_lora(backbone)
        for name, dense in lora_layers(backbone).items():
            a, b = to_numpy(dense.lora_kernel_a), to_numpy(dense.lora_kernel_b)
            block, rest = name.split("/", 1)
            index = int(block.rsplit("_", 1)[1])
            attention = reference.transformer_layers[index].self_attention
            target = {
                "self_attention/query": attention.query_dense,
                "self_attention/key": attention.key_dense,
                "self_attention/value": attention.value_dense,
                "self_attention/attention_output": attention.output_dense,
            }[rest]
            target.kernel.assign(to_numpy(target.kernel) + alpha / RANK * a @ b)
        inputs = random_backbone_inputs()
        expected = reference(inputs)
        actual = backbone(inputs)
        # The adapter must matter, or the comparison proves nothing.
        plain = BertBackbone(**tiny_backbone_kwargs())
        assert not np.allclose(
            to_numpy(actual["pooled_output"]), to_numpy(plain(inputs)["pooled_output"]), atol=1e-3
        )
        assert_all_close(actual, expected, atol=1e-4, rtol=1e-4, mask=inputs["padding_mask"])

    def test_save_and_load_lora_weights_round_trip(self, tmp_path):
        model = tiny_classifier()
        model.enable_lora(RANK)
        randomize_lora(model)
        path = tmp_path / "adapter.safetensors"
        model.save_lora_weights(path)
        assert sorted(p.name for p in tmp_path.iterdir()) == [
            "adapter.safetensors"
        ]  # No temp left.
        # A second model with the same base weights (the adapter file alone does not hold them).
        other = tiny_classifier()
        base = {v.path: v for v in model.weights if "lora" not in v.path}
        for variable in other.weights:
            variable.assign(to_numpy(base[variable.path]))
        other.enable_lora(RANK)
        other.load_lora_weights(path)
        inputs = random_backbone_inputs()
        assert_all_close(
            other.predict(inputs, verbose=0), model.predict(inputs, verbose=0), atol=1e-5
        )

    def test_merge_lora_keeps_outputs_and_drops_lora_variables(self):
        model = tiny_classifier()
        model.enable_lora(RANK, feedforward=True)
        randomize_lora(model)
        inputs = random_backbone_inputs()
        merged = model.merge_lora()
        assert type(merged) is BertClassifier
        assert not any("lora" in v.path for v in merged.weights)
        assert not lora_layers(merged.backbone)
        assert len(merged.weights) == len(tiny_classifier().weights)
        assert_all_close(
            merged.predict(inputs, verbose=0), model.predict(inputs, verbose=0), atol=1e-5
        )

    def test_full_saves_store_the_merged_model(self, tmp_path):
        """`.keras` and `save_to_preset` of a LoRA model load as a plain model with the same
        outputs."""
        model = tiny_classifier()
        model.enable_lora(RANK)
        randomize_lora(model)
        inputs = random_backbone_inputs()
        expected = model.predict(inputs, verbose=0)
        model.save(tmp_path / "model.keras")
        loaded = keras.saving.load_model(tmp_path / "model.keras")
        assert not any("lora" in v.path for v in loaded.weights)
        assert_all_close(loaded.predict(inputs, verbose=0), expected, atol=1e-5)
        loaded = self.run_preset_test(model, inputs, tmp_path, same_weights=False, atol=1e-5)
        assert not any("lora" in v.path for v in loaded.weights)

    def test_pretrainer_delegates_to_its_backbone(self):
        backbone = BertBackbone(**tiny_backbone_kwargs())
        pretrainer = BertPretrainer(backbone)
        pretrainer.enable_lora(RANK)
        assert len(lora_layers(backbone)) == 2 * 4
        trainable = {v.path for v in pretrainer.trainable_weights}
        assert not any(
            p.startswith(("embeddings/", "transformer_layer_")) and "lora" not in p
            for p in trainable
        )
        assert {p for p in trainable if "lora" in p}
        assert any(p.startswith("nsp_head") for p in trainable)

    @pytest.mark.parametrize("rank", [0, -1, 2.5, True])
    def test_bad_rank(self, rank):
        backbone = BertBackbone(**tiny_backbone_kwargs())
        with pytest.raises(ValueError, match=r"positive integer. Received: rank="):
            backbone.enable_lora(rank)
        assert not lora_layers(backbone)

    def test_rank_larger_than_layer(self):
        backbone = BertBackbone(**tiny_backbone_kwargs())  # hidden 32
        with pytest.raises(
            ValueError, match=r"kernel of shape \(32, 32\), so rank <= 32. Received: rank=33"
        ):
            backbone.enable_lora(33)
        assert not lora_layers(backbone)  # Nothing half-enabled.

    def test_enable_twice(self):
        backbone = BertBackbone(**tiny_backbone_kwargs())
        backbone.enable_lora(RANK)
        with pytest.raises(ValueError, match="already enabled"):
            backbone.enable_lora(RANK)

    def test_load_lora_into_other_shape_or_without_lora(self, tmp_path):
        model = tiny_classifier()
        model.enable_lora(RANK)
        path = tmp_path / "adapter.safetensors"
        model.save_lora_weights(path)

        no_lora = tiny_classifier()
        with pytest.raises(ValueError, match=r"no LoRA enabled. Call `model.enable_lora\(rank=4"):
            no_lora.load_lora_weights(path)

        other_rank = tiny_classifier()
        other_rank.enable_lora(2)
        with pytest.raises(
            ValueError,
            match=(
                r"'transformer_layer_0/self_attention/query/lora_kernel_a'.* "
                r"shape \(32, 4\).* shape \(32, 2\)"
            ),
        ):
            other_rank.load_lora_weights(path)

        wider = tiny_classifier(hidden_dim=16, num_heads=2)
        wider.enable_lora(RANK)
        with pytest.raises(ValueError, match=r"lora_kernel_a'.* shape \(32, 4\).* shape \(16, 4\)"):
            wider.load_lora_weights(path)

        deeper = tiny_classifier(num_layers=3)
        deeper.enable_lora(RANK)
        with pytest.raises(ValueError, match=r"the file lacks \['transformer_layer_2"):
            deeper.load_lora_weights(path)

        with pytest.raises(ValueError, match="needs a model with LoRA enabled"):
            no_lora.save_lora_weights(tmp_path / "none.safetensors")
        with pytest.raises(ValueError, match="needs a model with LoRA enabled"):
            no_lora.merge_lora()
        with pytest.raises(ValueError, match=r"\.safetensors"):
            model.save_lora_weights(tmp_path / "adapter.h5")
        with pytest.raises(FileNotFoundError):
            model.load_lora_weights(tmp_path / "missing.safetensors")

    def test_enable_lora_after_full_fine_tuning_trains_the_adapter_only(self):
        """The optimizer built by an earlier `fit` tracked other variables: LoRA replaces it."""
        model = tiny_classifier()
        model.compile(
            total_steps=4
        )  # A fixed schedule: `fit` would not re-plan (and so rebuild) it.
        inputs = random_backbone_inputs(batch_size=8)
        labels = np.arange(8) % 3
        model.fit(inputs, labels, batch_size=4, epochs=1, verbose=0)
        model.enable_lora(RANK)
        before = values_by_path(model)
        model.fit(inputs, labels, batch_size=4, epochs=1, verbose=0)
        after = values_by_path(model)
        changed = {path for path in before if not np.array_equal(before[path], after[path])}
        assert changed and all(
            "lora_kernel" in p or p.startswith("classifier/") for p in changed
        ), changed
