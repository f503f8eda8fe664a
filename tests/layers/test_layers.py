"""Layer numerics against NumPy implementations of the original formulas."""

import keras
import numpy as np
import pytest
from scipy.special import erf

from kbert.layers import BertEmbeddings, BertSelfAttention, ReversibleEmbedding, TransformerEncoder
from tests.test_case import TestCase, assert_all_close, to_numpy


def _layer_norm(x, gamma, beta, epsilon=1e-12):
    mean = x.mean(-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + epsilon) * gamma + beta


def _softmax(x):
    x = x - x.max(-1, keepdims=True)
    return np.exp(x) / np.exp(x).sum(-1, keepdims=True)


def _gelu_exact(x):
    return 0.5 * x * (1 + erf(x / np.sqrt(2)))


def _attention_reference(x, mask, weights, num_heads):
    (wq, bq), (wk, bk), (wv, bv), (wo, bo) = weights
    batch, length, hidden = x.shape
    head_dim = hidden // num_heads

    def heads(t):
        return t.reshape(batch, length, num_heads, head_dim).transpose(0, 2, 1, 3)

    q, k, v = heads(x @ wq + bq), heads(x @ wk + bk), heads(x @ wv + bv)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(head_dim)  # (batch, heads, seq, seq)
    scores = np.where(mask[:, None, None, :].astype(bool), scores, -1e9)
    context = (_softmax(scores) @ v).transpose(0, 2, 1, 3).reshape(batch, length, hidden)
    return context @ wo + bo


def _dense_weights(dense):
    return tuple(to_numpy(w) for w in dense.weights)


def _attention_of(layer, x, mask):
    dense = (layer.query_dense, layer.key_dense, layer.value_dense, layer.output_dense)
    return _attention_reference(x, mask, [_dense_weights(d) for d in dense], layer.num_heads)


def _embeddings_reference(layer, input_data, call_kwargs):
    token_ids, segment_ids = input_data
    tokens = to_numpy(layer.token_embedding.embeddings)[token_ids]
    position_ids = call_kwargs.get("position_ids", np.arange(token_ids.shape[1])[None])
    positions = to_numpy(layer.position_embedding.embeddings)[position_ids]
    segments = to_numpy(layer.segment_embedding.embeddings)[segment_ids]
    gamma, beta = (to_numpy(w) for w in layer.layer_norm.weights)
    return _layer_norm(tokens + positions + segments, gamma, beta, layer.layer_norm.epsilon)


def _attention_layer_reference(layer, x, call_kwargs):
    return _attention_of(layer, x, call_kwargs["padding_mask"])


def _encoder_reference(block, x, call_kwargs):
    """Post-LayerNorm block: LN(h + FFN(h)) with h = LN(x + attention(x))."""
    mask = call_kwargs["padding_mask"]
    h = _layer_norm(
        x + _attention_of(block.self_attention, x, mask),
        *_dense_weights(block.attention_layer_norm),
    )
    w1, b1 = _dense_weights(block.intermediate_dense)
    w2, b2 = _dense_weights(block.output_dense)
    return _layer_norm(
        h + _gelu_exact(h @ w1 + b1) @ w2 + b2, *_dense_weights(block.output_layer_norm)
    )


X = np.random.default_rng(0).normal(size=(2, 6, 16)).astype("float32")
MASK = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]], "int32")
TOKEN_IDS = np.array([[3, 7, 9, 0], [1, 2, 3, 4]], "int32")
SEGMENT_IDS = np.array([[0, 0, 1, 1], [0, 1, 1, 1]], "int32")


class TestLayers(TestCase):
    def test_embeddings(self):
        kwargs = dict(
            vocabulary_size=50,
            hidden_dim=16,
            max_sequence_length=10,
            dropout=0.0,
            layer_norm_epsilon=1e-6,
        )
        self.run_layer_test(
            BertEmbeddings,
            kwargs,
            (TOKEN_IDS, SEGMENT_IDS),
            expected_output_shape=(2, 4, 16),
            # token, position, segment tables; LayerNorm gamma, beta
            expected_num_trainable_weights=5,
            reference_fn=_embeddings_reference,
        )
        # Explicit position ids (packing several examples into a row) restart positions.
        position_ids = np.array([[0, 1, 0, 1], [0, 1, 2, 3]], "int32")
        self.run_layer_test(
            BertEmbeddings,
            dict(kwargs, layer_norm_epsilon=1e-12),
            (TOKEN_IDS, SEGMENT_IDS),
            call_kwargs={"position_ids": position_ids},
            expected_num_trainable_weights=5,
            reference_fn=_embeddings_reference,
        )

    def test_reversible_embedding_projects_with_the_table(self):
        layer = ReversibleEmbedding(30, 8)
        hidden = np.random.default_rng(0).normal(size=(2, 3, 8)).astype("float32")
        layer.build((None,))
        expected = hidden @ to_numpy(layer.embeddings).T
        assert_all_close(layer(hidden, reverse=True), expected, atol=1e-5)
        self.run_layer_test(
            ReversibleEmbedding,
            {"input_dim": 30, "output_dim": 8},
            TOKEN_IDS % 30,
            expected_output_shape=(2, 4, 8),
            expected_num_trainable_weights=1,
            reference_fn=lambda layer, ids, call: to_numpy(layer.embeddings)[ids],
        )

    def test_attention_matches_reference_and_masks_keys(self):
        self.run_layer_test(
            BertSelfAttention,
            {"num_heads": 4, "hidden_dim": 16, "dropout": 0.2},
            X,
            call_kwargs={"padding_mask": MASK},
            expected_output_shape=(2, 6, 16),
            expected_num_trainable_weights=8,
            reference_fn=_attention_layer_reference,
            padding_mask_key="padding_mask",
        )

    def test_training_attention_path_gives_the_reference_numbers(self):
        """Training with attention dropout takes the dropout path (explicit softmax, or the
        backend's fused op with dropout): at a negligible rate it gives the reference numbers,
        and at a real rate it drops probabilities (outputs change)."""
        seed = np.array([5, 1000], "int32")
        layer = BertSelfAttention(num_heads=4, hidden_dim=16, dropout=1e-9)
        trained = to_numpy(layer(X, padding_mask=MASK, training=True, dropout_seed=seed))
        assert_all_close(trained, _attention_of(layer, X, MASK), atol=1e-6)
        lossy = BertSelfAttention(num_heads=4, hidden_dim=16, dropout=0.3)
        inference = to_numpy(lossy(X, padding_mask=MASK, training=False))
        assert_all_close(inference, _attention_of(lossy, X, MASK), atol=1e-5)
        dropped = to_numpy(lossy(X, padding_mask=MASK, training=True))
        assert np.abs(dropped - inference).max() > 1e-3

    def test_encoder_block_matches_post_layer_norm_reference(self):
        self.run_layer_test(
            TransformerEncoder,
            {"num_heads": 4, "intermediate_dim": 24, "dropout": 0.0, "attention_dropout": 0.0},
            X,
            call_kwargs={"padding_mask": MASK},
            expected_output_shape=(2, 6, 16),
            expected_num_trainable_weights=16,
            reference_fn=_encoder_reference,
            atol=1e-4,
            padding_mask_key="padding_mask",
        )

    def test_layer_configs_round_trip(self):
        block = TransformerEncoder(num_heads=4, intermediate_dim=24, activation="gelu_approximate")
        config = block.get_config()
        assert config["activation"] == "gelu_approximate"
        assert TransformerEncoder.from_config(config).get_config() == config

    def test_attention_rejects_indivisible_heads(self):
        with pytest.raises(ValueError, match="hidden_dim=10, num_heads=3"):
            BertSelfAttention(num_heads=3, hidden_dim=10)

    @pytest.mark.parametrize("pad_token_id", [0, None])
    def test_pad_row_gets_no_gradient_like_huggingface_padding_idx(self, pad_token_id):
        """One SGD step on a loss that reads every position, padded ones included: the [PAD] row
        stays put (HF's `padding_idx`) unless `pad_token_id=None`; every other used row moves."""
        token_ids = np.array([[5, 6, 7, 0, 0], [8, 9, 0, 0, 0]], "int32")
        tokens = keras.Input((None,), dtype="int32")
        segments = keras.Input((None,), dtype="int32")
        layer = BertEmbeddings(
            vocabulary_size=12, hidden_dim=8, dropout=0.0, pad_token_id=pad_token_id
        )
        model = keras.Model([tokens, segments], layer(tokens, segments))
        model.compile(optimizer=keras.optimizers.SGD(1.0), loss="mse")
        before = to_numpy(layer.token_embedding.embeddings).copy()
        targets = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")
        model.train_on_batch([token_ids, np.zeros_like(token_ids)], targets)
        moved = np.abs(to_numpy(layer.token_embedding.embeddings) - before).max(axis=1) > 1e-6
        assert moved[[5, 6, 7, 8, 9]].all() and not moved[[1, 2, 3, 4, 10, 11]].any()
        assert moved[0] == (pad_token_id is None)
        assert layer.get_config()["pad_token_id"] == pad_token_id
