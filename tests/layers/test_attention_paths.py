"""Which attention path runs when, the flash-attention fallback, and the hash dropout.

The fused path (`keras.ops.dot_product_attention`) must be taken at inference and in training
without attention dropout; the explicit softmax path only when attention dropout is active;
both give the reference numbers. `flash_attention=True` where the backend cannot do it falls
back with one warning and identical outputs. `HashDropout` must behave as Bernoulli dropout.
"""

import math

import keras
import numpy as np
import pytest

from kbert.layers import BertSelfAttention, TransformerEncoder
from kbert.layers.attention import HashDropout
from tests.per_backend import per_backend
from tests.test_case import TestCase, on_cpu, run_in_backend, to_numpy

BACKEND = keras.backend.backend()


def _reference_attention(layer, x, padding_mask):
    """NumPy multi-head attention with the layer's weights (keys masked, as BERT does)."""
    w = {
        d.name: [np.asarray(to_numpy(v)) for v in d.weights]
        for d in (layer.query_dense, layer.key_dense, layer.value_dense, layer.output_dense)
    }
    batch, length, hidden = x.shape
    heads, head_dim = layer.num_heads, layer.head_dim

    def project(name):
        kernel, bias = w[name]
        return (x @ kernel + bias).reshape(batch, length, heads, head_dim).transpose(0, 2, 1, 3)

    q, k, v = project("query"), project("key"), project("value")
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(head_dim)  # (batch, heads, seq, seq)
    scores = np.where(padding_mask[:, None, None, :].astype(bool), scores, -1e9)
    scores = scores - scores.max(-1, keepdims=True)
    probabilities = np.exp(scores) / np.exp(scores).sum(-1, keepdims=True)
    context = (probabilities @ v).transpose(0, 2, 1, 3).reshape(batch, length, hidden)
    kernel, bias = w["attention_output"]
    return context @ kernel + bias


def _inputs(batch=2, length=6, hidden=8, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, length, hidden)).astype("float32")
    padding_mask = np.ones((batch, length), "int32")
    padding_mask[1, 4:] = 0
    return x, padding_mask


def _torch_sdpa():
    import torch

    return torch.nn.functional, "scaled_dot_product_attention"


def _keras_op():
    return keras.ops, "dot_product_attention"


def _fused_op_owner():
    """`(module, name)` of the fused attention op the layer calls on this backend.

    On torch the layer calls `torch.nn.functional.scaled_dot_product_attention` itself (the
    Keras op probes flash support with an object Dynamo cannot trace); elsewhere it calls
    `keras.ops.dot_product_attention`.
    """
    return per_backend(torch=_torch_sdpa, jax=_keras_op, tensorflow=_keras_op)()


class _CallCounter:
    """Counts calls of the backend's fused attention op while passing them through."""

    def __init__(self, monkeypatch):
        self.calls = 0
        module, name = _fused_op_owner()
        original = getattr(module, name)

        def counting(*args, **kwargs):
            self.calls += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, counting)


_FLASH_WARNINGS_PROGRAM = """
import json, logging, warnings
import keras
import numpy as np
from kbert.layers import BertSelfAttention, TransformerEncoder

records = []
logging.getLogger().addHandler(
    type("H", (logging.Handler,), {"emit": lambda self, r: records.append(r.levelno)})()
)
rng = np.random.default_rng(2)
x = rng.standard_normal((2, 6, 8)).astype("float32")
padding_mask = np.ones((2, 6), "int32")
padding_mask[1, 4:] = 0
keras.utils.set_random_seed(0)
plain = TransformerEncoder(num_heads=2, intermediate_dim=16, flash_attention=False)
plain.build(x.shape)
blocks = []
for _ in range(2):
    block = TransformerEncoder(num_heads=2, intermediate_dim=16, flash_attention=True)
    block.build(x.shape)
    block.set_weights(plain.get_weights())
    blocks.append(block)
expected = keras.ops.convert_to_numpy(plain(x, padding_mask=padding_mask))
equal = True
with warnings.catch_warnings(record=True) as fallback:
    warnings.simplefilter("always")
    for _ in range(2):  # Two layers, two calls each: still one warning.
        for block in blocks:
            output = keras.ops.convert_to_numpy(block(x, padding_mask=padding_mask))
            equal = equal and bool(np.array_equal(output, expected))
layer = BertSelfAttention(num_heads=2, hidden_dim=8, dropout=0.1, flash_attention=True)
layer.build(x.shape)
finite = True
with warnings.catch_warnings(record=True) as dropout:
    warnings.simplefilter("always")
    for _ in range(3):
        finite = finite and bool(
            np.isfinite(
                keras.ops.convert_to_numpy(layer(x, padding_mask=padding_mask, training=True))
            ).all()
        )
print(json.dumps({
    "fallback": [str(w.message) for w in fallback if "flash_attention=True" in str(w.message)],
    "dropout": [str(w.message) for w in dropout if "attention dropout" in str(w.message)],
    "equal": equal,
    "finite": finite,
    "logged": [level for level in records if level >= logging.WARNING],
}))
"""


class TestAttentionPaths(TestCase):
    @pytest.mark.parametrize(
        "dropout, training, fused",
        [(0.0, False, True), (0.0, True, True), (0.2, False, True), (0.2, True, False)],
    )
    def test_path_choice_and_numbers(self, monkeypatch, dropout, training, fused):
        x, padding_mask = _inputs()
        layer = BertSelfAttention(num_heads=2, hidden_dim=8, dropout=dropout)
        layer.build(x.shape)
        counter = _CallCounter(monkeypatch)
        output = to_numpy(layer(x, padding_mask=padding_mask, training=training))
        assert counter.calls == (1 if fused else 0)
        real = padding_mask.astype(bool)
        if fused:  # No dropout active: the reference numbers, at real positions.
            expected = _reference_attention(layer, x, padding_mask)
            np.testing.assert_allclose(output[real], expected[real], atol=2e-5, rtol=1e-5)
        else:  # Attention dropout active: outputs differ from the no-dropout reference.
            expected = _reference_attention(layer, x, padding_mask)
            assert np.abs(output[real] - expected[real]).max() > 1e-3

    def test_dropout_path_at_a_negligible_rate_equals_the_fused_path(self, monkeypatch):
        """The training path with attention dropout (explicit softmax, or torch's fused op with
        dropout) computes the same attention as the fused inference path, once nothing is dropped
        (an explicit `dropout_seed` also checks that argument reaches the mask)."""
        x, padding_mask = _inputs(seed=1)
        layer = BertSelfAttention(num_heads=2, hidden_dim=8, dropout=1e-9)
        layer.build(x.shape)
        counter = _CallCounter(monkeypatch)
        seed = np.array([3, 1000], "int32")
        dropout_path = to_numpy(
            layer(x, padding_mask=padding_mask, training=True, dropout_seed=seed)
        )
        assert counter.calls == 0  # not the fused inference op
        fused = to_numpy(layer(x, padding_mask=padding_mask, training=False))
        assert counter.calls == 1
        np.testing.assert_allclose(dropout_path, fused, atol=1e-6, rtol=1e-6)
        real = padding_mask.astype(bool)
        np.testing.assert_allclose(
            fused[real], _reference_attention(layer, x, padding_mask)[real], atol=2e-5, rtol=1e-5
        )

    @pytest.mark.skipif(not on_cpu(), reason="the fallback is exercised where flash is unavailable")
    def test_flash_attention_falls_back_with_one_warning_per_process(self):
        """`flash_attention=True` where the backend cannot do it: identical outputs, one warning
        per process however many layers and calls, nothing logged; with training attention dropout
        one more warning (none on torch, whose fused op takes the dropout itself). A fresh
        process, since the warnings are once per process."""
        import json

        result = json.loads(
            run_in_backend(BACKEND, _FLASH_WARNINGS_PROGRAM).strip().splitlines()[-1]
        )
        assert result["equal"] and result["finite"], result
        assert len(result["fallback"]) == 1, result["fallback"]
        assert "Falling back" in result["fallback"][0] and BACKEND in result["fallback"][0]
        assert result["logged"] == [], result["logged"]
        dropout_warnings = per_backend(tensorflow=1, jax=1, torch=0)
        assert len(result["dropout"]) == dropout_warnings, result["dropout"]

    def test_training_attention_is_an_unbiased_dropout_of_inference_attention(self):
        """Whatever op does it (explicit softmax + dropout, torch's fused SDPA with dropout_p), the
        output is linear in the dropped probabilities: its mean over many draws is the inference
        output, padded keys included (they must stay masked), while single draws differ."""
        x, padding_mask = _inputs(seed=4)
        keras.utils.set_random_seed(4)
        layer = BertSelfAttention(num_heads=2, hidden_dim=8, dropout=0.3)
        layer.build(x.shape)
        # Weights well above the init scale, so that attention is far from uniform.
        layer.set_weights([np.asarray(w) * 15 for w in layer.get_weights()])
        expected = _reference_attention(layer, x, padding_mask)
        draws = np.stack(
            [to_numpy(layer(x, padding_mask=padding_mask, training=True)) for _ in range(400)]
        )
        real = padding_mask.astype(bool)
        single = np.abs(draws[:, real] - expected[real]).mean()
        averaged = np.abs(draws.mean(0)[real] - expected[real]).mean()
        assert single > 0.05 * np.abs(expected[real]).mean(), single  # dropout is applied
        assert averaged < 0.15 * single, (averaged, single)  # ~1/sqrt(400) of a draw's deviation

    def test_hash_dropout_is_bernoulli(self):
        rate = 0.1
        layer = HashDropout(rate)
        x = np.ones((256, 12, 8, 64), "float32")
        first = to_numpy(layer(x, training=True))
        second = to_numpy(layer(x, training=True))
        dropped, dropped_again = first == 0, second == 0
        n = dropped.size
        # Drop rate within 5 standard deviations; kept values scaled by exactly 1 / (1 - rate).
        assert abs(dropped.mean() - rate) < 5 * math.sqrt(rate * (1 - rate) / n)
        np.testing.assert_allclose(first[~dropped], 1 / (1 - rate), rtol=1e-6)
        # A fresh mask at every call, independent of the last one.
        assert abs((dropped & dropped_again).mean() - rate**2) < 5 * math.sqrt(rate**2 / n)
        # No structure along rows, columns or neighbours.
        flat = dropped.reshape(-1, 64)
        column_rates = flat.mean(axis=0)
        row_block_rates = flat.reshape(-1, 96, 64).mean(axis=(1, 2))
        sigma_column = math.sqrt(rate * (1 - rate) / flat.shape[0])
        sigma_row_block = math.sqrt(rate * (1 - rate) / (96 * 64))
        assert np.abs(column_rates - rate).max() < 5 * sigma_column
        assert np.abs(row_block_rates - rate).max() < 5 * sigma_row_block
        both_neighbours = (flat[:, 1:] & flat[:, :-1]).mean()
        assert abs(both_neighbours - rate**2) < 5 * math.sqrt(rate**2 / flat[:, 1:].size)
        both_rows = (flat[1:] & flat[:-1]).mean()
        assert abs(both_rows - rate**2) < 5 * math.sqrt(rate**2 / flat[1:].size)

    def test_hash_dropout_seeding_and_edge_rates(self):
        x = np.ones((4, 32, 16), "float32")
        keras.utils.set_random_seed(11)
        a = to_numpy(HashDropout(0.3)(x, training=True))
        keras.utils.set_random_seed(11)
        b = to_numpy(HashDropout(0.3)(x, training=True))
        np.testing.assert_array_equal(a, b)  # Reproducible under set_random_seed.
        layer = HashDropout(0.3)
        np.testing.assert_array_equal(to_numpy(layer(x, training=False)), x)
        np.testing.assert_array_equal(to_numpy(HashDropout(0.0)(x, training=True)), x)
        np.testing.assert_array_equal(to_numpy(HashDropout(1.0)(x, training=True)), 0 * x)
        if layer.uses_hash:  # An explicit key gives the same mask every time.
            seed = np.array([5, 9], "int32")
            np.testing.assert_array_equal(
                to_numpy(layer(x, training=True, seed=seed)),
                to_numpy(layer(x, training=True, seed=seed)),
            )
        with pytest.raises(ValueError, match="rate"):
            HashDropout(1.5)

    def test_hash_dropout_tiny_rate_drops_nothing(self):
        """At rate 1e-9 an element is dropped with probability 1e-9: 20 calls on 4,096 elements
        should drop none (expected 8e-5 drops)."""
        layer = HashDropout(1e-9)
        x = np.ones((64, 64), "float32")
        dropped = [int((to_numpy(layer(x, training=True)) == 0).sum()) for _ in range(20)]
        assert sum(dropped) == 0, dropped

    @pytest.mark.backends("tensorflow", reason="graph mode with an unknown batch size")
    def test_hash_dropout_in_tf_graph_with_unknown_batch(self):
        import tensorflow as tf

        layer = HashDropout(0.5)
        run = tf.function(
            lambda x: layer(x, training=True), input_signature=[tf.TensorSpec((None, 3, 40))]
        )
        output = run(tf.ones((64, 3, 40))).numpy()
        assert abs((output == 0).mean() - 0.5) < 0.03
        assert set(np.unique(output)) == {0.0, 2.0}

    def test_encoder_remat_round_trips_config(self):
        block = TransformerEncoder(num_heads=2, intermediate_dim=16, remat=True)
        config = block.get_config()
        assert config["remat"] is True
        assert TransformerEncoder.from_config(config).remat is True

    def test_mask_reaching_the_fused_op_is_full_and_boolean(self, monkeypatch):
        """cuDNN refuses (batch, 1, 1, seq) masks: the Keras op gets (batch, 1, seq, seq)
        booleans. torch's SDPA kernels broadcast a (batch, 1, 1, seq) boolean mask themselves.
        JAX on CPU gets the keys as an added (batch, 1, 1, seq) bias, 0 or -1e9, and no mask."""
        x, padding_mask = _inputs(seed=4)
        padding_mask[0, :] = 0  # An all-padding row attends everywhere instead.
        layer = BertSelfAttention(num_heads=2, hidden_dim=8)
        layer.build(x.shape)
        masks = []
        module, name = _fused_op_owner()
        original = getattr(module, name)
        mask_keyword = per_backend(tensorflow="mask", jax="mask", torch="attn_mask")

        biases = []

        def recording(query, key, value, *args, **kwargs):
            mask = kwargs.get(mask_keyword)
            masks.append(None if mask is None else to_numpy(mask))
            bias = kwargs.get("bias")
            biases.append(None if bias is None else to_numpy(bias))
            return original(query, key, value, *args, **kwargs)

        monkeypatch.setattr(module, name, recording)
        output = to_numpy(layer(x, padding_mask=padding_mask))
        expected_keys = padding_mask.astype(bool)
        expected_keys[0, :] = True
        expected = _reference_attention(layer, x, np.where(expected_keys, 1, 0))
        np.testing.assert_allclose(output, expected, atol=2e-5, rtol=1e-5)
        keys = expected_keys[:, None, None, :]  # (batch, 1, 1, seq)
        # (mask, bias) as the op receives them.
        full_mask = (np.broadcast_to(keys, (2, 1, 6, 6)), None)
        key_bias = (None, np.where(keys, 0.0, -1e9).astype("float32"))
        expected_mask, expected_bias = per_backend(
            tensorflow=full_mask,
            jax=key_bias if on_cpu() else full_mask,
            torch=(keys, None),
        )
        (mask,), (bias,) = masks, biases
        for got, expected in ((mask, expected_mask), (bias, expected_bias)):
            if expected is None:
                assert got is None, got
            else:  # Same shape, dtype (boolean masks) and values.
                np.testing.assert_array_equal(got, expected, strict=True)
