"""`quantize` on every kbert model: every Dense and Embedding quantized with per-channel scales
(the int8 values written out in NumPy), outputs that follow the float model, torch's int8 kernel
on Keras' int8 weights, LoRA merged first, presets of every mode (int8, int4, float8, a
`config`, two filtered calls) that reload with equal outputs, a quantized `BertPretrainer`
preset that starts a sparse encoder, and clear errors for modes kbert models cannot take."""

import keras
import numpy as np
import pytest

from kbert.models import (
    BertClassifier,
    BertCrossEncoder,
    BertMultipleChoice,
    BertPretrainer,
    BertQuestionAnswerer,
    BertSparseEncoder,
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
    """Largest difference over the largest value, at real positions: the -1e9 logits of
    padded positions (the question answerer's) would hide any error."""
    real = np.abs(expected) < 1e8
    assert real.any() and np.array_equal(real, np.abs(actual) < 1e8)
    return float(np.abs(actual - expected)[real].max() / np.abs(expected)[real].max())


def _abs_max_int8(values, axis):
    """Keras' int8 abs-max quantisation written out: per slice along `axis` (the input axis of
    a kernel, the hidden axis of a table), scale = 127 / max |value|, values rounded."""
    values = np.asarray(values, "float64")
    scale = 127.0 / (np.abs(values).max(axis=axis, keepdims=True) + 1e-7)
    return np.clip(np.round(values * scale), -127, 127), np.squeeze(scale, axis)


class TestQuantize(TestCase):
    def test_int8_quantizes_every_dense_and_embedding_of_every_model(self):
        # Per block: query, key, value, attention output, intermediate, output = 6 Dense; the
        # embeddings: token, position, segment; the pooler's Dense; then each task's heads.
        num_layers = 2
        backbone_dense = 6 * num_layers + 1
        builders = {
            "embedder": (lambda b: BertTextEmbedder(b), 0),  # first: the backbone's layers
            "classifier": (lambda b: BertClassifier(b, num_classes=3, dropout=0.0), 1),
            "cross_encoder": (lambda b: BertCrossEncoder(b, dropout=0.0), 1),
            "tagger": (lambda b: BertTagger(b, num_classes=4, dropout=0.0), 1),
            "question_answerer": (lambda b: BertQuestionAnswerer(b), 1),
            "multiple_choice": (lambda b: BertMultipleChoice(b, dropout=0.0), 1),
            "sparse_encoder": (lambda b: BertSparseEncoder(b), 1),  # MLM transform
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
        models, float_outputs, float_weights = {}, {}, {}
        for name, (build, _) in builders.items():
            models[name] = build(backbone)
            float_outputs[name] = to_numpy_tree(models[name](_inputs_of(name, inputs)))
            float_weights[name] = {v.path: to_numpy(v) for v in models[name].weights}
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
            # Every int8 tensor: the float one rounded with one scale per output channel
            # (kernels) or per row (tables), not one scale for the whole tensor.
            values = {v.path: to_numpy(v) for v in model.weights}
            for path in kernels + tables:
                axis = 0 if path in kernels else -1
                expected, scale = _abs_max_int8(float_weights[name][path], axis)
                np.testing.assert_array_equal(values[path], expected, err_msg=path)
                np.testing.assert_allclose(values[path + "_scale"], scale, rtol=1e-6)
            quantized = to_numpy_tree(model(_inputs_of(name, inputs)))
            for key, expected in float_outputs[name].items():
                # Quantized, and close: int8 rounding of weights and inputs moves outputs by
                # 0.4-2 % of their range on torch; the two or three logits of the
                # multiple-choice and cross-encoder heads up to 6.7 % (JAX, TensorFlow), so
                # those few-value outputs keep 10 %. The weights' per-channel rounding is
                # checked exactly above.
                error = _relative_error(quantized[key], expected)
                assert 0 < error < (0.03 if expected.size >= 8 else 0.1), (name, key, error)

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

    def test_presets_of_every_mode_reload_with_equal_outputs(self, tmp_path):
        ways = {
            "int4": lambda m: m.quantize("int4"),
            "float8": lambda m: m.quantize("float8"),
            "config": lambda m: m.quantize(
                config=keras.quantizers.Int4QuantizationConfig(block_size=8)
            ),
            "two_filtered_calls": lambda m: (
                m.quantize("int8", filters="intermediate"),
                m.quantize("int4", filters=["query", "key"]),
            ),
        }
        backbone = _backbone()
        weights = backbone.get_weights()
        # The models are called on packed inputs (one compiled `predict` per model and way
        # would only add compile time: `predict` of int8 models is tested above).
        x = toy_preprocessor(24)(TEXTS)
        for name, quantize in ways.items():
            model = BertClassifier(
                _backbone(), num_classes=3, dropout=0.0, preprocessor=toy_preprocessor(24)
            )
            model.backbone.set_weights(weights)
            before = to_numpy(model(x))
            quantize(model)
            quantized = to_numpy(model(x))
            assert not np.array_equal(quantized, before), name
            model.save_to_preset(tmp_path / name)
            reloaded = BertClassifier.from_preset(tmp_path / name)
            assert reloaded.quantization_record == model.quantization_record, name
            np.testing.assert_array_equal(to_numpy(reloaded(x)), quantized, name)
            for a, b in zip(reloaded.weights, model.weights, strict=True):
                assert a.path == b.path and a.dtype == b.dtype, name
        # The two filtered calls: int8 and int4 layers, each as asked, the rest float.
        modes = {
            layer.path: layer.quantization_mode
            for layer in reloaded._flatten_layers()
            if getattr(layer, "quantization_mode", None)
        }
        assert set(modes.values()) == {"int8", "int4"}
        assert all(("intermediate" in p) == (m == "int8") for p, m in modes.items()), modes
        assert len(modes) == 2 + 4 and reloaded.get_layer("classifier").quantization_mode is None

    def test_task_from_another_tasks_quantized_preset_saves_and_reloads(self, tmp_path):
        classifier = BertClassifier(
            _backbone(), num_classes=3, dropout=0.0, preprocessor=toy_preprocessor(24)
        )
        classifier.quantize("int8")
        classifier.save_to_preset(tmp_path / "classifier")
        tagger = BertTagger.from_preset(tmp_path / "classifier", num_classes=2)
        expected = tagger.predict(TEXTS, verbose=0)
        # Its own preset says the backbone is quantized: the tagger comes back equal.
        tagger.save_to_preset(tmp_path / "tagger")
        reloaded = BertTagger.from_preset(tmp_path / "tagger")
        assert len(_quantized_variables(reloaded)[1]) == 13
        np.testing.assert_array_equal(reloaded.predict(TEXTS, verbose=0), expected)

    def test_sparse_encoder_from_a_quantized_pretrainer_preset_is_the_pretrainers_splade(
        self, tmp_path
    ):
        """SPLADE written out in NumPy on the pretrainer's own masked-LM logits at every
        position: max over real tokens of log(1 + relu(logits)); float and int8 presets."""
        ids = np.array([[2, 9, 14, 20, 31, 3, 0, 0], [2, 40, 41, 3, 50, 51, 52, 3]], "int32")
        x = {"token_ids": ids, "segment_ids": 0 * ids, "padding_mask": (ids > 0).astype("int32")}
        positions = np.tile(np.arange(8, dtype="int32"), (2, 1))
        for mode in (None, "int8"):
            pretrainer = BertPretrainer(_backbone(), preprocessor=toy_preprocessor(24))
            rng = np.random.default_rng(0)  # a head far from its initial values
            for variable in pretrainer.masked_lm_head.weights[:1]:
                variable.assign(rng.normal(0, 1.0, variable.shape).astype("float32"))
            if mode:
                pretrainer.quantize(mode)
            pretrainer.save_to_preset(tmp_path / str(mode))
            logits = to_numpy(pretrainer(dict(x, mask_positions=positions))["mlm"])
            expected = (np.log1p(np.maximum(logits, 0)) * x["padding_mask"][..., None]).max(1)
            encoder = BertSparseEncoder.from_preset(tmp_path / str(mode))
            # Int8: the backbone's 13 kernels and the masked-LM transform's, as the pretrainer.
            assert len(_quantized_variables(encoder)[1]) == (14 if mode else 0)
            np.testing.assert_allclose(to_numpy(encoder(x)), expected, atol=1e-5, rtol=1e-5)
            # Its own preset reloads to the same vectors.
            encoder.save_to_preset(tmp_path / f"{mode}_sparse")
            reloaded = BertSparseEncoder.from_preset(tmp_path / f"{mode}_sparse")
            np.testing.assert_array_equal(to_numpy(reloaded(x)), to_numpy(encoder(x)))

    def test_quantized_embedder_encodes_close_to_float(self):
        embedder = BertTextEmbedder(_backbone(), preprocessor=toy_preprocessor(24))
        expected = embedder.encode(TEXTS, batch_size=2)
        embedder.quantize("int8")
        actual = embedder.encode(TEXTS, batch_size=2)
        cosine = np.sum(actual * expected, -1) / (
            np.linalg.norm(actual, axis=-1) * np.linalg.norm(expected, axis=-1)
        )
        assert cosine.min() > 0.99 and not np.array_equal(actual, expected)


@pytest.mark.backends("torch", reason="torch's int8 kernel")
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


@pytest.mark.backend_independent
def test_quantize_collections_walk_only_new_objects_and_the_collector_is_restored():
    """Keras runs a full `gc.collect()` for every variable `quantize` deletes, each walking every
    object of the process. During kbert's `quantize` the objects alive before it are frozen, so
    those collections skip them; afterwards nothing stays frozen and a last full collection runs.
    A process that froze objects itself keeps exactly its own freeze."""
    import gc

    freeze_counts = []

    def record(phase, info):
        if phase == "start" and info["generation"] == 2:
            freeze_counts.append(gc.get_freeze_count())

    model = _backbone()
    gc.unfreeze()  # tests/conftest.py froze the earlier objects: a fresh process has none.
    gc.callbacks.append(record)
    try:
        model.quantize("int8")
        left_frozen = gc.get_freeze_count()
    finally:
        gc.callbacks.remove(record)
        gc.freeze()
    # Keras' own collections (one per deleted kernel or table), then kbert's last one.
    assert len(freeze_counts) > 10, freeze_counts
    assert all(count > 0 for count in freeze_counts[:-1]), freeze_counts
    assert freeze_counts[-1] == 0 and left_frozen == 0

    frozen = gc.get_freeze_count()
    assert frozen > 0
    _backbone().quantize("int8")
    # Frozen objects that die meanwhile leave the count (a few, at most), while a `quantize`
    # that left its own objects frozen would add thousands and one that unfroze would drop all.
    assert frozen - 100 <= gc.get_freeze_count() <= frozen
