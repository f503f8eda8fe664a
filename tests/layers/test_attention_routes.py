"""Every attention route gives the numbers of the plain `keras.ops` route, on every backend.

`BertSelfAttention(attention_implementation=...)` picks the computation: `"plain"` is kbert's
softmax-matmul in `keras.ops`; `"auto"` and `"fused"` use `keras.ops.dot_product_attention`
(on torch, `"auto"` calls torch's `scaled_dot_product_attention` itself, as does
`"torch_sdpa"`); `flash_attention=True` asks the fused op for its flash kernel (falling back
where there is none). Float32, attention dropout 0, padded rows and packed (pairwise) masks.
"""

import warnings

import keras
import numpy as np
import pytest

from kbert.layers import BertSelfAttention
from kbert.models import BertBackbone
from tests.per_backend import per_backend
from tests.test_case import (
    TestCase,
    on_cpu,
    random_backbone_inputs,
    tiny_backbone_kwargs,
    to_numpy,
)

NUM_HEADS, HIDDEN = 4, 16
RNG = np.random.default_rng(7)
X = RNG.normal(size=(3, 7, HIDDEN)).astype("float32")
# Key masks: a full row, a row of 4 real tokens, a row of 2.
KEY_MASK = np.array([[1] * 7, [1] * 4 + [0] * 3, [1] * 2 + [0] * 5], "int32")
# Pairwise masks of packed rows: two documents per row (block diagonal), then padding.
_DOCUMENTS = np.array([[1, 1, 1, 2, 2, 2, 2], [1, 1, 2, 2, 2, 0, 0], [1, 2, 2, 2, 0, 0, 0]])
PAIR_MASK = (_DOCUMENTS[:, :, None] == _DOCUMENTS[:, None, :]) & (_DOCUMENTS[:, :, None] > 0)
PAIR_MASK = PAIR_MASK.astype("int32")
TOLERANCE = dict(atol=2e-5, rtol=1e-5)


def _routes():
    """`(name, constructor arguments)` of every route this backend has."""
    routes = [
        ("auto", {}),
        ("fused", {"attention_implementation": "fused"}),
        ("flash requested", {"flash_attention": True}),
    ]
    torch_sdpa = [("torch_sdpa", {"attention_implementation": "torch_sdpa"})]
    return routes + per_backend(torch=torch_sdpa, jax=[], tensorflow=[])


def _layer(weights=None, **kwargs):
    layer = BertSelfAttention(
        NUM_HEADS,
        HIDDEN,
        kernel_initializer=keras.initializers.RandomNormal(stddev=0.5, seed=3),
        **kwargs,
    )
    layer.build(X.shape)
    if weights is not None:
        layer.set_weights(weights)
    return layer


def _numpy_attention(weights, x, mask, return_probabilities=False):
    """Multi-head softmax attention written out in NumPy (float64) from the layer's weights;
    with `return_probabilities`, also the `(batch, heads, query, key)` probabilities."""
    (wq, bq), (wk, bk), (wv, bv), (wo, bo) = [weights[i : i + 2] for i in range(0, 8, 2)]
    x = x.astype("float64")

    def heads(t):
        return t.reshape(t.shape[0], t.shape[1], NUM_HEADS, -1).transpose(0, 2, 1, 3)

    q, k, v = heads(x @ wq + bq), heads(x @ wk + bk), heads(x @ wv + bv)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(HIDDEN // NUM_HEADS)
    allowed = mask[:, None, None, :] if mask.ndim == 2 else mask[:, None, :, :]
    scores = np.where(allowed.astype(bool), scores, -1e30)
    probabilities = np.exp(scores - scores.max(-1, keepdims=True))
    probabilities /= probabilities.sum(-1, keepdims=True)
    context = (probabilities @ v).transpose(0, 2, 1, 3).reshape(x.shape)
    return (context @ wo + bo, probabilities) if return_probabilities else context @ wo + bo


def _real(output, mask):
    """The rows of real queries (padding rows carry no meaning)."""
    queries = mask if mask.ndim == 2 else mask.any(-1)
    return np.asarray(output)[queries.astype(bool)]


def _torch_sdpa():
    """`[(module, name)]` of torch's fused attention op."""
    import torch

    return [(torch.nn.functional, "scaled_dot_product_attention")]


class _Calls:
    """Counts calls of `keras.ops.dot_product_attention` and torch's fused attention."""

    def __init__(self, monkeypatch):
        self.keras_op = self.torch_sdpa = 0
        self.masked_by = []  # per Keras-op call: "bias", "mask" or None
        original = keras.ops.dot_product_attention

        def keras_op(*args, **kwargs):
            self.keras_op += 1
            given = [k for k in ("bias", "mask") if kwargs.get(k) is not None]
            self.masked_by.append(given[0] if len(given) == 1 else None)
            return original(*args, **kwargs)

        monkeypatch.setattr(keras.ops, "dot_product_attention", keras_op)
        for module, name in per_backend(torch=_torch_sdpa, jax=list, tensorflow=list)():
            sdpa = getattr(module, name)

            def torch_sdpa(*args, _sdpa=sdpa, **kwargs):
                self.torch_sdpa += 1
                return _sdpa(*args, **kwargs)

            monkeypatch.setattr(module, name, torch_sdpa)


class TestAttentionRoutes(TestCase):
    @pytest.mark.parametrize("mask", [KEY_MASK, PAIR_MASK], ids=["key_mask", "pairwise_mask"])
    @pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
    def test_every_route_equals_the_plain_keras_ops_route(self, mask, training, monkeypatch):
        plain = _layer(attention_implementation="plain")
        weights = plain.get_weights()
        calls = _Calls(monkeypatch)
        expected = to_numpy(plain(X, padding_mask=mask, training=training))
        # The plain route is softmax attention (checked against NumPy) and calls no fused op.
        assert calls.keras_op == calls.torch_sdpa == 0
        reference = _numpy_attention(weights, X, mask)
        np.testing.assert_allclose(_real(expected, mask), _real(reference, mask), **TOLERANCE)
        # The comparison can fail: ignoring the mask moves real rows by far more than the
        # tolerance.
        unmasked = to_numpy(plain(X, training=training))
        assert np.abs(_real(unmasked, mask) - _real(expected, mask)).max() > 1e-1
        # How the Keras op is masked at inference. JAX on CPU, float32: key padding as an added
        # bias (`key_mask_as_bias`); pairwise masks and the other backends: a boolean mask.
        key_masked_by = per_backend(
            tensorflow="mask", jax="bias" if on_cpu() else "mask", torch="mask"
        )
        masked_by = key_masked_by if mask is KEY_MASK else "mask"
        for name, kwargs in _routes():
            layer = _layer(weights, **kwargs)
            before = (calls.keras_op, calls.torch_sdpa)
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "`flash_attention=True` was requested")
                output = to_numpy(layer(X, padding_mask=mask, training=training))
            used = (calls.keras_op - before[0], calls.torch_sdpa - before[1])
            assert used != (0, 0), f"{name} ran no fused attention"
            if used[0] and not training:
                assert calls.masked_by[-1] == masked_by, name
            np.testing.assert_allclose(
                _real(output, mask), _real(expected, mask), err_msg=name, **TOLERANCE
            )

    @pytest.mark.parametrize("mask", [KEY_MASK, PAIR_MASK], ids=["key_mask", "pairwise_mask"])
    def test_attention_scores_on_every_route(self, mask, monkeypatch):
        """`return_attention_scores=True` gives NumPy's probabilities and the route's outputs,
        on the explicit route whatever the layer's route is."""
        weights = _layer().get_weights()
        expected, probabilities = _numpy_attention(weights, X, mask, return_probabilities=True)
        queries = (mask if mask.ndim == 2 else mask.any(-1)).astype(bool)
        calls = _Calls(monkeypatch)
        for name, kwargs in [("plain", {"attention_implementation": "plain"}), *_routes()]:
            layer = _layer(weights, **kwargs)
            output, scores = layer(X, padding_mask=mask, return_attention_scores=True)
            assert (calls.keras_op, calls.torch_sdpa) == (0, 0), name
            np.testing.assert_allclose(
                _real(to_numpy(output), mask), _real(expected, mask), err_msg=name, **TOLERANCE
            )
            np.testing.assert_allclose(
                to_numpy(scores).transpose(0, 2, 1, 3)[queries],
                probabilities.transpose(0, 2, 1, 3)[queries],
                err_msg=name,
                **TOLERANCE,
            )

    @pytest.mark.parametrize("mask", [KEY_MASK, PAIR_MASK], ids=["key_mask", "pairwise_mask"])
    def test_query_length_gives_the_first_rows_on_every_route(self, mask):
        """`query_length=n` attends from the first `n` positions to every key: the first `n`
        rows of the full attention (NumPy's), with their probabilities."""
        weights = _layer().get_weights()
        expected, probabilities = _numpy_attention(weights, X, mask, return_probabilities=True)
        queries = (mask if mask.ndim == 2 else mask.any(-1)).astype(bool)
        for name, kwargs in [("plain", {"attention_implementation": "plain"}), *_routes()]:
            layer = _layer(weights, **kwargs)
            for n in (1, 3):
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", "`flash_attention=True` was requested")
                    output = to_numpy(layer(X, padding_mask=mask, query_length=n))
                assert output.shape == (3, n, HIDDEN), name
                real = queries[:, :n]
                np.testing.assert_allclose(
                    output[real], expected[:, :n][real], err_msg=f"{name}, {n}", **TOLERANCE
                )
            output, scores = layer(
                X, padding_mask=mask, query_length=2, return_attention_scores=True
            )
            assert tuple(scores.shape) == (3, NUM_HEADS, 2, 7)
            np.testing.assert_allclose(
                to_numpy(scores).transpose(0, 2, 1, 3)[queries[:, :2]],
                probabilities[:, :, :2].transpose(0, 2, 1, 3)[queries[:, :2]],
                err_msg=name,
                **TOLERANCE,
            )
        # The comparison can fail: the first row attending to itself alone is far off.
        alone = to_numpy(
            _layer(weights)(
                X[:, :1], padding_mask=mask[:, :1, :1] if mask.ndim == 3 else mask[:, :1]
            )
        )
        assert np.abs(alone[:, 0] - expected[:, 0]).max() > 1e-1
        with pytest.raises(ValueError, match="`query_length` must be a positive integer"):
            _layer(weights)(X, padding_mask=mask, query_length=0)

    @pytest.mark.backends("tensorflow")
    @pytest.mark.skipif(not on_cpu(), reason="TensorFlow on CPU")
    def test_one_row_training_graph_has_no_batched_matmul_on_tensorflow_cpu(self):
        """TensorFlow on CPU: a one-row query trains through broadcast products and sums, not
        oneDNN's einsums, whose one-row form corrupted the heap in some fresh processes
        (`kbert.backend.one_row_attention_by_products`); the gradients equal the einsum
        route's (two rows, cut to the first)."""
        import tensorflow as tf

        weights = _layer().get_weights()
        layer = _layer(weights, attention_implementation="plain")
        x, mask = tf.constant(X), tf.constant(KEY_MASK)

        def traced(query_length):
            @tf.function
            def gradients(x):
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    rows = layer(x, padding_mask=mask, query_length=query_length, training=True)
                    loss = tf.reduce_sum(rows[:, :1] ** 2)
                return tape.gradient(loss, [x, *layer.trainable_variables])

            graph = gradients.get_concrete_function(x).graph
            return gradients(x), {op.type for op in graph.get_operations()}

        (one, one_ops), (two, two_ops) = traced(1), traced(2)
        # (Keras' TensorFlow einsum runs some equations as batched matmuls.)
        batched = {"Einsum", "BatchMatMulV2", "BatchMatMulV3"}
        assert not one_ops & batched and two_ops & batched, (one_ops, two_ops)
        # Relative to the largest gradient entry: the two routes sum in other orders, and on
        # CPUs without AVX-512 oneDNN's einsum kernels round differently (up to 2.5e-5 of it;
        # the key bias' gradient, zero but for rounding, too); a wrong route is off by far more.
        scale = max(float(np.abs(to_numpy(b)).max()) for b in two)
        for a, b in zip(one, two):
            np.testing.assert_allclose(to_numpy(a) / scale, to_numpy(b) / scale, atol=1e-4)
        assert np.abs(to_numpy(one[0])).max() > 1e-2  # the gradients are not all zero

    def test_backbone_switch_gives_the_same_outputs_and_round_trips(self):
        kwargs = tiny_backbone_kwargs(num_layers=1)
        plain = BertBackbone(**kwargs, attention_implementation="plain")
        auto = BertBackbone(**kwargs)
        auto.set_weights(plain.get_weights())
        inputs = random_backbone_inputs(batch_size=3, sequence_length=9)
        mask = inputs["padding_mask"]
        expected = to_numpy(plain(inputs)["sequence_output"])
        np.testing.assert_allclose(
            _real(to_numpy(auto(inputs)["sequence_output"]), mask),
            _real(expected, mask),
            **TOLERANCE,
        )
        config = plain.get_config()
        assert config["attention_implementation"] == "plain"
        restored = BertBackbone.from_config(config)
        assert restored.get_config() == config
        layer = restored.transformer_layers[0]
        assert layer.get_config()["attention_implementation"] == "plain"

    def test_bad_choices_are_refused(self):
        with pytest.raises(ValueError, match=r"attention_implementation='eager'"):
            BertSelfAttention(NUM_HEADS, HIDDEN, attention_implementation="eager")
        with pytest.raises(ValueError, match=r"attention_implementation='sdpa'"):
            BertBackbone(**tiny_backbone_kwargs(), attention_implementation="sdpa")
        with pytest.raises(ValueError, match="flash_attention=True"):
            BertSelfAttention(
                NUM_HEADS, HIDDEN, attention_implementation="plain", flash_attention=True
            )

    @pytest.mark.backends(
        "tensorflow", "jax", reason="torch's own fused op: a route of the torch backend only"
    )
    def test_torch_sdpa_is_refused_on_the_other_backends(self):
        with pytest.raises(ValueError, match="needs the torch backend"):
            BertSelfAttention(NUM_HEADS, HIDDEN, attention_implementation="torch_sdpa")
