import keras
import numpy as np
import pytest

from kbert.models import BertBackbone, BertPretrainer
from kbert.optimizers import Lamb, bert_optimizer
from tests.test_case import (
    TestCase,
    assert_all_close,
    random_backbone_inputs,
    tiny_backbone_kwargs,
    to_numpy,
)

NUM_PREDICTIONS = 4


def pretrainer_data(batch_size=3, sequence_length=12, seed=0):
    inputs = random_backbone_inputs(batch_size, sequence_length, seed=seed)
    rng = np.random.default_rng(seed)
    positions = np.sort(rng.integers(1, 6, size=(batch_size, NUM_PREDICTIONS)), axis=1).astype(
        "int32"
    )
    x = dict(inputs, mask_positions=positions)
    y = {
        "mlm": np.take_along_axis(inputs["token_ids"], positions, axis=1),
        "nsp": rng.integers(0, 2, size=batch_size).astype("int32"),
    }
    weights = {
        "mlm": np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], "float32")[:batch_size],
        "nsp": np.ones(batch_size, "float32"),
    }
    return x, y, weights


def make_pretrainer(**overrides):
    return BertPretrainer(BertBackbone(**tiny_backbone_kwargs(**overrides)))


def _layer_norm(x, gamma, beta, epsilon):
    mean = x.mean(-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + epsilon) * gamma + beta


def _cross_entropy(logits, labels):
    logits = logits - logits.max(-1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return -np.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]


def _structured_corpus(num_examples, sequence_length=16, vocabulary_size=40, seed=0):
    """Sequences of consecutive ids; B follows A for IsNext and starts anywhere for NotNext.

    Masked tokens are predictable from their neighbours and NSP from the A/B seam, so a
    working gradient path must lower both losses.
    """
    rng = np.random.default_rng(seed)
    first, mask_id, cls_id, sep_id = 5, 4, 2, 3
    span = vocabulary_size - first
    half = (sequence_length - 3) // 2
    token_ids = np.zeros((num_examples, sequence_length), "int32")
    segment_ids = np.zeros_like(token_ids)
    nsp = rng.integers(0, 2, num_examples).astype("int32")
    for i in range(num_examples):
        start = rng.integers(0, span)
        a = (start + np.arange(half)) % span + first
        b_start = start + half if nsp[i] == 0 else rng.integers(0, span)
        b = (b_start + np.arange(half)) % span + first
        row = np.concatenate([[cls_id], a, [sep_id], b, [sep_id]])
        token_ids[i, : len(row)] = row
        segment_ids[i, half + 2 : len(row)] = 1
    padding_mask = (token_ids > 0).astype("int32")
    positions = np.stack(
        [
            np.sort(rng.choice(np.arange(2, 2 * half + 2), 3, replace=False))
            for _ in range(num_examples)
        ]
    )
    positions = np.where(positions == half + 1, half + 3, positions).astype("int32")
    labels = np.take_along_axis(token_ids, positions, axis=1)
    masked = token_ids.copy()
    np.put_along_axis(masked, positions, mask_id, axis=1)
    x = {
        "token_ids": masked,
        "segment_ids": segment_ids,
        "padding_mask": padding_mask,
        "mask_positions": positions,
    }
    return (
        x,
        {"mlm": labels, "nsp": nsp},
        {"mlm": np.ones(positions.shape, "float32"), "nsp": np.ones(num_examples, "float32")},
    )


class TestBertPretrainer(TestCase):
    def test_task_checks(self, tmp_path):
        """Config and `.keras` round-trips, variable lengths, a fit step (mixed precision:
        test_precision.py)."""
        x, y, weights = pretrainer_data()
        self.run_task_test(
            make_pretrainer(),
            input_data=x,
            tmp_path=tmp_path,
            preprocessed_data=(x, y, weights),
            sequence_lengths=(9,),
        )

    def test_output_shapes(self):
        x, _, _ = pretrainer_data(batch_size=3)
        outputs = to_numpy(make_pretrainer()(x))
        assert outputs["mlm"].shape == (3, NUM_PREDICTIONS, 97)
        assert outputs["nsp"].shape == (3, 2)

    def test_mlm_head_is_the_original_tied_decoder(self):
        """logits = LN(gelu(gather(h) W + b)) E^T + output_bias, with E the token embedding
        table."""
        model = make_pretrainer()
        head = model.masked_lm_head
        head.output_bias.assign(np.random.default_rng(0).normal(size=97).astype("float32"))
        x, _, _ = pretrainer_data()
        sequence = to_numpy(
            model.backbone({k: x[k] for k in ("token_ids", "segment_ids", "padding_mask")})
        )
        gathered = np.take_along_axis(
            sequence["sequence_output"], x["mask_positions"][:, :, None], axis=1
        )
        kernel, bias = (to_numpy(w) for w in head.transform_dense.weights)
        hidden = gathered @ kernel + bias
        hidden = to_numpy(keras.activations.gelu(hidden, approximate=False))
        gamma, beta = (to_numpy(w) for w in head.layer_norm.weights)
        hidden = _layer_norm(hidden, gamma, beta, 1e-12)
        table = to_numpy(model.backbone.token_embedding.embeddings)
        expected = hidden @ table.T + to_numpy(head.output_bias)
        assert_all_close(model(x)["mlm"], expected, atol=1e-4, rtol=1e-4)
        # The decoder is tied: changing the input table changes the logits.
        assert head.token_embedding is model.backbone.token_embedding

    def test_loss_is_mlm_mean_over_real_predictions_plus_nsp(self):
        model = make_pretrainer()
        x, y, weights = pretrainer_data()
        outputs = to_numpy(model(x))
        mlm = (_cross_entropy(outputs["mlm"], y["mlm"]) * weights["mlm"]).sum() / weights[
            "mlm"
        ].sum()
        nsp = _cross_entropy(outputs["nsp"], y["nsp"]).mean()
        results = model.evaluate(
            x, y, sample_weight=weights, batch_size=3, verbose=0, return_dict=True
        )
        np.testing.assert_allclose(results["mlm_loss"], mlm, rtol=1e-4)
        np.testing.assert_allclose(results["nsp_loss"], nsp, rtol=1e-4)
        np.testing.assert_allclose(results["loss"], mlm + nsp, rtol=1e-4)
        # Padded prediction slots do not count: changing their labels changes nothing.
        y_other = dict(y, mlm=np.where(weights["mlm"] > 0, y["mlm"], 5))
        other = model.evaluate(
            x, y_other, sample_weight=weights, batch_size=3, verbose=0, return_dict=True
        )
        np.testing.assert_allclose(other["mlm_loss"], results["mlm_loss"], rtol=1e-6)

    def test_default_compile_is_the_papers_recipe(self):
        model = BertPretrainer(BertBackbone(**tiny_backbone_kwargs()))
        model.compile(total_steps=1_000_000, warmup_steps=10_000)
        optimizer = model.optimizer
        assert isinstance(optimizer, keras.optimizers.AdamW)
        assert optimizer.weight_decay == pytest.approx(0.01)
        assert optimizer.beta_1 == pytest.approx(0.9) and optimizer.beta_2 == pytest.approx(0.999)
        # The schedule, read through the optimizer's learning rate at given iterations.
        assert optimizer.get_config()["learning_rate"]["class_name"] == "WarmupLinearDecay"
        for step, rate in ((5_000, 0.5e-4), (10_000, 1e-4), (505_000, 0.5e-4)):
            optimizer.iterations.assign(step)
            assert float(keras.ops.convert_to_numpy(optimizer.learning_rate)) == pytest.approx(
                rate, rel=1e-3
            )
        # Weight decay, seen in one update with zero gradients (Adam's step is then 0): decayed
        # variables shrink, biases and LayerNorm scales/offsets stay (all set away from 0 first).
        rng = np.random.default_rng(0)
        for variable in model.trainable_variables:
            variable.assign(1.0 + rng.random(variable.shape).astype("float32"))
        before = {v.path: to_numpy(v).copy() for v in model.trainable_variables}
        optimizer.apply_gradients(
            [(keras.ops.zeros(v.shape), v) for v in model.trainable_variables]
        )
        decayed = {
            v.path: not np.array_equal(to_numpy(v), before[v.path])
            for v in model.trainable_variables
        }
        assert not any(
            flag for path, flag in decayed.items() if path.endswith(("bias", "gamma", "beta"))
        ), decayed
        assert all(
            flag for path, flag in decayed.items() if path.endswith(("kernel", "embeddings"))
        ), decayed
        assert any(path.endswith("bias") for path in decayed) and any(
            path.endswith("gamma") for path in decayed
        )
        assert isinstance(bert_optimizer(optimizer="lamb"), Lamb)  # decay inside the trust ratio
        with pytest.raises(ValueError, match="adamw.*lamb.*sgd"):
            bert_optimizer(optimizer="sgd")

    def test_compile_with_only_an_optimizer_keeps_losses_and_metrics(self):
        model = make_pretrainer()
        model.compile(optimizer=keras.optimizers.Adam(1e-3))
        x, y, weights = pretrainer_data()
        history = model.fit(x, y, sample_weight=weights, epochs=1, verbose=0).history
        for key in ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy"):
            assert key in history, sorted(history)

    def test_training_lowers_mlm_and_nsp_loss(self):
        keras.utils.set_random_seed(0)
        backbone = BertBackbone(
            vocabulary_size=40,
            num_layers=2,
            num_heads=2,
            hidden_dim=64,
            intermediate_dim=128,
            max_sequence_length=16,
            dropout=0.0,
            attention_dropout=0.0,
        )
        model = BertPretrainer(backbone)
        model.compile(optimizer=keras.optimizers.Adam(2e-3))
        x, y, weights = _structured_corpus(512)
        history = model.fit(
            x, y, sample_weight=weights, batch_size=32, epochs=10, verbose=0
        ).history
        assert history["mlm_loss"][-1] < 0.6 * history["mlm_loss"][0], history["mlm_loss"]
        assert history["nsp_loss"][-1] < 0.85 * history["nsp_loss"][0], history["nsp_loss"]

    def test_missing_mask_positions(self):
        x, _, _ = pretrainer_data()
        with pytest.raises(ValueError, match="mask_positions"):
            make_pretrainer()({k: v for k, v in x.items() if k != "mask_positions"})

    def test_mask_positions_out_of_range(self):
        x, _, _ = pretrainer_data(sequence_length=12)
        with pytest.raises(
            ValueError, match=r"`mask_positions` must lie in \[0, sequence_length\) = \[0, 12\)"
        ):
            make_pretrainer()(dict(x, mask_positions=x["mask_positions"] + 20))

    def test_backbone_must_be_a_kbert_backbone(self):
        with pytest.raises(ValueError, match="BertBackbone. Received: Dense"):
            BertPretrainer(keras.layers.Dense(3))

    def test_pretrainer_preset_round_trip(self, tmp_path):
        model = make_pretrainer()
        model.masked_lm_head.output_bias.assign(np.linspace(-1, 1, 97).astype("float32"))
        x, _, _ = pretrainer_data()
        model.save_to_preset(tmp_path / "preset")
        restored = BertPretrainer.from_preset(tmp_path / "preset")
        assert_all_close(restored(x), model(x), atol=0, rtol=0)
        # The backbone alone loads from the same directory.
        backbone = BertBackbone.from_preset(tmp_path / "preset")
        inputs = {k: x[k] for k in ("token_ids", "segment_ids", "padding_mask")}
        assert_all_close(backbone(inputs), model.backbone(inputs), atol=0, rtol=0)
