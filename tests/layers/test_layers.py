"""Layer numerics against NumPy implementations of the original formulas."""

import keras
import numpy as np
import pytest
from scipy.special import erf

from kbert.layers import BertEmbeddings, BertSelfAttention, ReversibleEmbedding, TransformerEncoder
from tests.test_case import assert_all_close, to_numpy


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


@pytest.fixture
def inputs():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 6, 16)).astype("float32")
    mask = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]], "int32")
    return x, mask


def test_embeddings_match_reference():
    layer = BertEmbeddings(vocabulary_size=50, hidden_dim=16, max_sequence_length=10, dropout=0.0)
    token_ids = np.array([[3, 7, 9, 0], [1, 2, 3, 4]], "int32")
    segment_ids = np.array([[0, 0, 1, 1], [0, 1, 1, 1]], "int32")
    outputs = to_numpy(layer(token_ids, segment_ids))
    tokens = to_numpy(layer.token_embedding.embeddings)[token_ids]
    positions = to_numpy(layer.position_embedding.embeddings)[:4][None]
    segments = to_numpy(layer.segment_embedding.embeddings)[segment_ids]
    gamma, beta = (to_numpy(w) for w in layer.layer_norm.weights)
    assert_all_close(outputs, _layer_norm(tokens + positions + segments, gamma, beta), atol=1e-5)
    # Explicit position ids (packing several examples into a row) restart positions.
    position_ids = np.array([[0, 1, 0, 1], [0, 1, 2, 3]], "int32")
    restarted = to_numpy(layer(token_ids, segment_ids, position_ids=position_ids))
    positions = to_numpy(layer.position_embedding.embeddings)[position_ids]
    assert_all_close(restarted, _layer_norm(tokens + positions + segments, gamma, beta), atol=1e-5)


def test_reversible_embedding_projects_with_the_table():
    layer = ReversibleEmbedding(30, 8)
    hidden = np.random.default_rng(0).normal(size=(2, 3, 8)).astype("float32")
    layer.build((None,))
    expected = hidden @ to_numpy(layer.embeddings).T
    assert_all_close(layer(hidden, reverse=True), expected, atol=1e-5)


def test_attention_matches_reference_and_masks_keys(inputs):
    x, mask = inputs
    layer = BertSelfAttention(num_heads=4, hidden_dim=16)
    outputs = to_numpy(layer(x, padding_mask=mask))
    weights = [_dense_weights(d) for d in (layer.query_dense, layer.key_dense, layer.value_dense, layer.output_dense)]
    expected = _attention_reference(x, mask, weights, num_heads=4)
    assert_all_close(outputs, expected, atol=1e-5)


def test_explicit_and_fused_attention_paths_agree(inputs):
    x, mask = inputs
    layer = BertSelfAttention(num_heads=4, hidden_dim=16, dropout=0.3)
    fused = to_numpy(layer(x, padding_mask=mask, training=False))
    q, k, v = (layer._split_heads(d(x)) for d in (layer.query_dense, layer.key_dense, layer.value_dense))
    keys = keras.ops.cast(mask, "bool")[:, None, None, :]
    context = layer._explicit_attention(q, k, v, keys, training=False)
    explicit = to_numpy(layer.output_dense(keras.ops.reshape(context, (2, 6, 16))))
    assert_all_close(explicit, fused, atol=1e-5)
    # Training with dropout really drops attention probabilities (outputs change).
    dropped = to_numpy(layer(x, padding_mask=mask, training=True))
    assert np.abs(dropped - fused).max() > 1e-3


def test_encoder_block_matches_post_layer_norm_reference(inputs):
    x, mask = inputs
    block = TransformerEncoder(num_heads=4, intermediate_dim=24, dropout=0.0, attention_dropout=0.0)
    outputs = to_numpy(block(x, padding_mask=mask))
    attention = block.self_attention
    weights = [_dense_weights(d) for d in (attention.query_dense, attention.key_dense, attention.value_dense, attention.output_dense)]
    h = _layer_norm(x + _attention_reference(x, mask, weights, 4), *_dense_weights(block.attention_layer_norm))
    w1, b1 = _dense_weights(block.intermediate_dense)
    w2, b2 = _dense_weights(block.output_dense)
    expected = _layer_norm(h + _gelu_exact(h @ w1 + b1) @ w2 + b2, *_dense_weights(block.output_layer_norm))
    real = mask.astype(bool)
    assert_all_close(outputs[real], expected[real], atol=1e-4)


def test_layer_configs_round_trip():
    for layer in (
        BertEmbeddings(50, 16, max_sequence_length=10, layer_norm_epsilon=1e-6),
        BertSelfAttention(num_heads=4, hidden_dim=16, dropout=0.2),
        TransformerEncoder(num_heads=4, intermediate_dim=24, activation="gelu_approximate"),
    ):
        config = layer.get_config()
        assert type(layer).from_config(config).get_config() == config


def test_attention_rejects_indivisible_heads():
    with pytest.raises(ValueError, match="hidden_dim=10, num_heads=3"):
        BertSelfAttention(num_heads=3, hidden_dim=10)


@pytest.mark.parametrize("pad_token_id", [0, None])
def test_pad_row_gets_no_gradient_like_huggingface_padding_idx(pad_token_id):
    """One SGD step on a loss that reads every position, padded ones included: the [PAD] row
    stays put (HF's `padding_idx`) unless `pad_token_id=None`; every other used row moves."""
    token_ids = np.array([[5, 6, 7, 0, 0], [8, 9, 0, 0, 0]], "int32")
    tokens = keras.Input((None,), dtype="int32")
    segments = keras.Input((None,), dtype="int32")
    layer = BertEmbeddings(vocabulary_size=12, hidden_dim=8, dropout=0.0, pad_token_id=pad_token_id)
    model = keras.Model([tokens, segments], layer(tokens, segments))
    model.compile(optimizer=keras.optimizers.SGD(1.0), loss="mse")
    before = to_numpy(layer.token_embedding.embeddings).copy()
    targets = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")
    model.train_on_batch([token_ids, np.zeros_like(token_ids)], targets)
    moved = np.abs(to_numpy(layer.token_embedding.embeddings) - before).max(axis=1) > 1e-6
    assert moved[[5, 6, 7, 8, 9]].all() and not moved[[1, 2, 3, 4, 10, 11]].any()
    assert moved[0] == (pad_token_id is None)
    assert layer.get_config()["pad_token_id"] == pad_token_id
