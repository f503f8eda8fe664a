"""`quantize` on every kbert model: every Dense and Embedding quantized, outputs that follow the
float model, torch's int8 kernel on Keras' int8 weights, LoRA merged first, quantized presets
that reload with equal outputs, and clear errors for modes kbert models cannot take."""

import keras
import numpy as np
import pytest

from kbert.models import (
    BertClassifier,
    BertMultipleChoice,
    BertPretrainer,
    BertQuestionAnswerer,
    BertTagger,
    BertTextEmbedder,
)
from tests.models.test_classifier import toy_backbone, toy_preprocessor
from tests.test_case import TestCase, to_numpy

TEXTS = ["the cat sat on the mat", "a dog", "john smith lives in paris and sings very well"]


def _backbone():
    # Two blocks, wide enough that int8 rounding is small next to the outputs.
    return toy_backbone(num_layers=2, hidden_dim=32, intermediate_dim=64)


def _quantized_variables(model):
    """(int8 tensors, int8 kernels of Dense layers, int8 embedding tables) by variable path."""
    int8 = [v.path for v in model.weights if keras.backend.standardize_dtype(v.dtype) == "int8"]
    kernels = [p for p in int8 if p.endswith("/kernel")]
    tables = [p for p in int8 if p.endswith("/embeddings")]
    return int8, kernels, tables


def _inputs_of(name, inputs):
    if name == "pretrainer":
        return dict(inputs, mask_positions=np.array([[1, 2], [4, 5]], "int32"))
    if name == "multiple_choice":
        return {k: v[:, None] for k, v in inputs.items()}
    return inputs


def to_numpy_tree(outputs):
    """`{path: array}` of a model's float outputs."""
    return {
        path: to_numpy(value)
        for path, value in keras.tree.flatten_with_path(outputs)
        if "float" in keras.backend.standardize_dtype(value.dtype)
    }


def _relative_error(actual, expected):
    return float(np.abs(actual - expected).max() / np.abs(expected).max())


class TestQuantize(TestCase):
    def test_int8_quantizes_every_dense_and_embedding_of_every_model(self):
        # Per block: query, key, value, attention output, intermediate, output = 6 Dense; the
        # embeddings: token, position, segment; the pooler's Dense; then each task's heads.
        num_layers = 2
        backbone_dense = 6 * num_layers + 1
        builders = {
            "embedder": (lambda b: BertTextEmbedder(b), 0),  # first: the backbone's layers
            "classifier": (lambda b: BertClassifier(b, num_classes=3, dropout=0.0), 1),
            "tagger": (lambda b: BertTagger(b, num_classes=4, dropout=0.0), 1),
            "question_answerer": (lambda b: BertQuestionAnswerer(b), 1),
            "multiple_choice": (lambda b: BertMultipleChoice(b, dropout=0.0), 1),
            "pretrainer": (lambda b: BertPretrainer(b), 2),  # MLM transform + NSP
            "backbone": (lambda b: b, 0),  # last: every layer quantized already
        }
        ids = np.array([[2, 9, 14, 20, 31, 3, 0], [2, 40, 41, 3, 50, 51, 3]], "int32")
        inputs = {
            "token_ids": ids,
            "segment_ids": np.array([[0] * 7, [0, 0, 0, 0, 1, 1, 1]], "int32"),
            "padding_mask": (ids > 0).astype("int32"),
        }
        # One backbone under every model (Keras' quantize costs a garbage collection per
        # layer): the first `quantize` changes the backbone and its heads, each later one
        # its own heads; each model then holds every layer quantized.
        backbone = _backbone()
        models, float_outputs = {}, {}
        for name, (build, _) in builders.items():
            models[name] = build(backbone)
            float_outputs[name] = to_numpy_tree(models[name](_inputs_of(name, inputs)))
        for name, (_, heads) in builders.items():
            model = models[name]
            if name == "backbone":
                with pytest.raises(ValueError, match="already quantized"):
                    model.quantize("int8")
            else:
                model.quantize("int8")
            int8, kernels, tables = _quantized_variables(model)
            assert len(kernels) == backbone_dense + heads, (name, kernels)
            assert len(tables) == 3, (name, tables)
            quantized = to_numpy_tree(model(_inputs_of(name, inputs)))
            for key, expected in float_outputs[name].items():
                # Quantized, and close: int8 rounding moves outputs by a few percent of their range.
                error = _relative_error(quantized[key], expected)
                assert 0 < error < 0.1, (name, key, error)

    def test_modes_and_errors(self):
        backbone = _backbone()
        backbone.quantize("int4")
        int8, kernels, tables = _quantized_variables(backbone)  # int4 values are stored as int8
        assert len(kernels) == 13 and len(tables) == 3

        backbone = _backbone()
        backbone.quantize("float8")  # Keras' Embedding has no float8: the tables stay float.
        modes = {v.path.rsplit("/", 1)[0] for v in backbone.weights if "kernel_amax" in v.path}
        assert len(modes) == 13
        assert _quantized_variables(backbone)[2] == []

        backbone = _backbone()
        with pytest.raises(ValueError, match="GPTQConfig"):
            backbone.quantize("gptq")
        with pytest.raises(ValueError, match="mode"):
            backbone.quantize("int3")
        with pytest.raises(ValueError, match="filters"):
            backbone.quantize("int8", filters=3)
        backbone.quantize("int8", filters="intermediate")  # Keras' regex on layer names
        assert len(_quantized_variables(backbone)[1]) == 2

    def test_lora_is_merged_before_quantizing_and_quantized_presets_reload(self, tmp_path):
        classifier = BertClassifier(
            _backbone(), num_classes=3, dropout=0.0, preprocessor=toy_preprocessor(24)
        )
        classifier.enable_lora(2)
        rng = np.random.default_rng(0)
        for variable in classifier.backbone.weights:
            if variable.path.endswith("lora_kernel_b"):
                variable.assign(rng.normal(0, 1.0, variable.shape).astype("float32"))
        merged = classifier.merge_lora()  # kbert's own merge: a new float model
        classifier.quantize("int8")
        assert not any(
            v.path.endswith(("lora_kernel_a", "lora_kernel_b")) for v in classifier.weights
        )
        floats = [v for v in classifier.backbone.weights if not v.name.endswith("_scale")]
        assert all(v.trainable for v in floats if v.dtype == "float32")  # no longer frozen
        merged.quantize("int8")
        quantized = classifier.predict(TEXTS, verbose=0)
        # Merged in place then quantized = quantizing kbert's merged copy, to the bit.
        np.testing.assert_array_equal(quantized, merged.predict(TEXTS, verbose=0))

        classifier.save_to_preset(tmp_path / "preset")
        reloaded = BertClassifier.from_preset(tmp_path / "preset")
        np.testing.assert_array_equal(reloaded.predict(TEXTS, verbose=0), quantized)
        assert reloaded.quantization_record == classifier.quantization_record
        # Another task from the quantized preset: its backbone comes back quantized.
        tagger = BertTagger.from_preset(tmp_path / "preset", num_classes=2)
        assert len(_quantized_variables(tagger)[1]) == 13  # the backbone's; the new head float
        for a, b in zip(tagger.backbone.weights, classifier.backbone.weights, strict=True):
            np.testing.assert_array_equal(to_numpy(a), to_numpy(b))

    def test_quantized_embedder_encodes_close_to_float(self):
        embedder = BertTextEmbedder(_backbone(), preprocessor=toy_preprocessor(24))
        expected = embedder.encode(TEXTS, batch_size=2)
        embedder.quantize("int8")
        actual = embedder.encode(TEXTS, batch_size=2)
        cosine = np.sum(actual * expected, -1) / (
            np.linalg.norm(actual, axis=-1) * np.linalg.norm(expected, axis=-1)
        )
        assert cosine.min() > 0.99 and not np.array_equal(actual, expected)


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch's int8 kernel")
class TestTorchInt8Kernel(TestCase):
    def test_dense_runs_torch_int8_kernel_on_keras_int8_weights(self):
        import torch

        from kbert.backend import torch as torch_paths
        from kbert.layers.dense import Dense

        rng = np.random.default_rng(1)
        layer = Dense(48, activation="gelu")
        layer.build((None, 32))
        layer.set_weights([rng.normal(0, 0.3, (32, 48)), rng.normal(0, 0.3, (48,))])
        x = rng.normal(0, 1, (2, 5, 32)).astype("float32")
        float_kernel, bias = (to_numpy(w) for w in layer.get_weights())
        layer.quantize("int8")
        int8_kernel = to_numpy(layer.kernel)
        scale = to_numpy(layer.kernel_scale)
        outputs = to_numpy(layer(x))
        # torch's packed layer holds Keras' int8 values and scales exactly.
        packed = torch_paths._INT8_GROUPS[layer][3]
        weight, _ = torch.ops.quantized.linear_unpack(packed)
        np.testing.assert_array_equal(weight.int_repr().numpy(), int8_kernel.T)
        np.testing.assert_allclose(weight.q_per_channel_scales().numpy(), 1 / scale, rtol=1e-6)
        # The product of de-quantized weights, up to the inputs' 8-bit rounding.
        dequantized = x @ (int8_kernel / scale) + bias
        expected = to_numpy(keras.activations.gelu(dequantized))
        assert _relative_error(outputs, expected) < 0.02
        # Keras' own int8 path (training=True steps aside) agrees to the same rounding.
        keras_path = to_numpy(layer(x, training=True))
        assert _relative_error(outputs, keras_path) < 0.02 and not np.array_equal(
            outputs, keras_path
        )
        # New weights (same shapes) repack: the outputs follow them.
        variables = {v.name: v for v in layer.weights}
        variables["kernel"].assign(int8_kernel // 2)
        variables["kernel_scale"].assign(scale * 2)
        repacked = to_numpy(layer(x))
        expected = to_numpy(keras.activations.gelu(x @ ((int8_kernel // 2) / (scale * 2)) + bias))
        assert _relative_error(repacked, expected) < 0.02
        weight, _ = torch.ops.quantized.linear_unpack(torch_paths._INT8_GROUPS[layer][3])
        np.testing.assert_array_equal(weight.int_repr().numpy(), (int8_kernel // 2).T)
        # Gradients go through Keras' path (torch's int8 kernel has none).
        xt = torch.tensor(x, requires_grad=True)
        layer(xt).sum().backward()
        assert xt.grad is not None and float(xt.grad.abs().sum()) > 0

    def test_attention_projections_in_one_int8_product_equal_separate_ones(self, monkeypatch):
        from kbert import backend

        backbone = _backbone()
        backbone.quantize("int8")
        ids = np.array([[2, 9, 14, 20, 31, 3, 0, 0], [2, 40, 41, 3, 50, 51, 52, 3]], "int32")
        x = {"token_ids": ids, "segment_ids": 0 * ids, "padding_mask": (ids > 0).astype("int32")}
        calls = []
        group = backend.int8_dense_group
        monkeypatch.setattr(
            backend, "int8_dense_group", lambda *a, **k: calls.append(1) or group(*a, **k)
        )
        fused = to_numpy(backbone(x)["sequence_output"])
        assert len(calls) == 2  # one product per block
        monkeypatch.setattr(backend, "int8_dense_group", lambda *a, **k: None)
        separate = to_numpy(backbone(x)["sequence_output"])
        # One input quantisation per tensor either way: the same int8 products.
        np.testing.assert_array_equal(fused, separate)
