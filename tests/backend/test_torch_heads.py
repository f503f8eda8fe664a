"""The lean path of kbert's tasks on torch (`kbert.backend.torch_heads`).

On eager torch a task's call computes its backbone through torch's `Module.__call__` (the
backbone's lean path) and its head as one torch call per layer, without Keras' `__call__`
per layer. It must compute what the functional graph computes: the same outputs and
gradients from the same variables, the same dropout draws in the same order, LoRA's update;
torch's hooks on the backbone still run. What it does not cover runs through the graph.
"""

import keras
import numpy as np
import pytest

from kbert.backend import torch_heads
from kbert.models import (
    BertBackbone,
    BertClassifier,
    BertCrossEncoder,
    BertMultipleChoice,
    BertPretrainer,
    BertQuestionAnswerer,
    BertSparseEncoder,
    BertTagger,
    BertTextEmbedder,
)
from tests.test_case import random_backbone_inputs, record_answers, tiny_backbone_kwargs

pytestmark = pytest.mark.backends("torch", reason="the lean path is the torch backend's")


@pytest.fixture
def lean_calls(monkeypatch):
    """Whether each task call took the lean path (it answers None where the graph runs)."""
    return record_answers(monkeypatch, torch_heads, "task_outputs")


def _backbone(**kwargs):
    return BertBackbone(**tiny_backbone_kwargs(dropout=0.3, attention_dropout=0.3, **kwargs))


def _scrambled(model, scale=0.3, seed=0):
    """Every trainable weight drawn from N(0, scale): large enough that a head computed on the
    wrong input, a skipped dropout or a swapped mask moves the outputs far beyond rounding."""
    rng = np.random.default_rng(seed)
    for variable in model.trainable_weights:
        variable.assign(rng.normal(0.0, scale, variable.shape).astype(variable.dtype))
    return model


def _tensors(inputs):
    import torch

    return {key: torch.tensor(value) for key, value in inputs.items()}


def _choice_inputs(batch=2, choices=3, length=10):
    rows = random_backbone_inputs(batch * choices, length)
    rows["padding_mask"][-1] = 0  # a choice that is all padding
    rows["token_ids"][-1] = 0
    rows["segment_ids"][-1] = 0
    return {key: value.reshape(batch, choices, length) for key, value in rows.items()}


def _pretraining_inputs(batch=3, length=12):
    inputs = random_backbone_inputs(batch, length)
    # Distinct positions per row, among them a padded one and position 0.
    inputs["mask_positions"] = np.array([[1, 4, 0], [7, 2, 11], [3, 3, 5]], "int32")[:batch]
    return inputs


TASKS = {
    "classifier": (lambda: BertClassifier(_backbone(), num_classes=3, dropout=0.3), None),
    "tagger": (lambda: BertTagger(_backbone(), num_classes=4, dropout=0.3), None),
    "multiple_choice": (
        lambda: BertMultipleChoice(_backbone(), num_choices=3, dropout=0.3),
        _choice_inputs,
    ),
    "question_answerer": (lambda: BertQuestionAnswerer(_backbone()), None),
    "cross_encoder": (lambda: BertCrossEncoder(_backbone(), dropout=0.3), None),
    "pretrainer": (lambda: BertPretrainer(_backbone()), _pretraining_inputs),
    "masked_lm": (lambda: BertPretrainer(_backbone(), next_sentence=False), _pretraining_inputs),
    "sparse_encoder": (lambda: BertSparseEncoder(_backbone()), None),
    "text_embedder": (lambda: BertTextEmbedder(_backbone(), pooling="mean"), None),
    "text_embedder_cls": (lambda: BertTextEmbedder(_backbone(), pooling="cls"), None),
}


def _flat(outputs):
    return [o.detach().float().numpy() for o in keras.tree.flatten(outputs)]


def _both_ways(task, inputs, monkeypatch, seed=5, training=True):
    """`[(outputs, gradients)]` of the lean path and of the graph, from the same torch seed;
    the gradients are those of a loss on every output, for every trainable variable."""
    import torch

    results = []
    for lean in (True, False):
        monkeypatch.setattr(torch_heads, "LEAN_TORCH_TASKS", lean)
        torch.manual_seed(seed)
        outputs = task(inputs, training=training)
        loss = sum(
            torch.where(o > -1e8, o, 0).float().pow(2).sum() for o in keras.tree.flatten(outputs)
        )
        variables = [v.value for v in task.trainable_weights]
        grads = torch.autograd.grad(loss, variables, allow_unused=True)
        results.append((outputs, [None if g is None else g.numpy() for g in grads]))
    monkeypatch.setattr(torch_heads, "LEAN_TORCH_TASKS", True)
    return results


@pytest.mark.parametrize("name", sorted(TASKS))
def test_each_task_computes_its_graph_on_the_lean_path(name, lean_calls, monkeypatch):
    """With dropout on the backbone and the head, a seeded training call of each task takes
    the lean path and equals the graph's, outputs and every gradient: the same head on the
    same backbone output, the same masks in the same order."""
    make, make_inputs = TASKS[name]
    task = _scrambled(make())
    inputs = _tensors(make_inputs() if make_inputs else random_backbone_inputs(3, 12))
    (lean, lean_grads), (graph, graph_grads) = _both_ways(task, inputs, monkeypatch)
    assert lean_calls == [True, False]  # the lean path, then the graph (lean path off)
    assert type(lean) is type(graph)
    for a, b in zip(_flat(lean), _flat(graph), strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)
    inference = _flat(task(inputs, training=False))
    assert max(np.abs(a - b).max() for a, b in zip(_flat(lean), inference)) > 0.1  # dropped
    assert len(lean_grads) == len(task.trainable_weights)
    for variable, a, b in zip(task.trainable_weights, lean_grads, graph_grads):
        assert (a is None) == (b is None), variable.path
        if a is not None and not variable.path.endswith("key/bias"):
            scale = max(float(np.abs(b).max()), 1e-3)
            np.testing.assert_allclose(a / scale, b / scale, atol=1e-4, err_msg=variable.path)


def test_backbone_hooks_run_and_lora_and_mixed_precision(lean_calls, monkeypatch):
    """A torch forward hook on the backbone runs in the task's lean call; LoRA on the head's
    `Dense`, enabled after a lean call read its kernel, reaches the lean head; under
    mixed_bfloat16 the logits stay within bfloat16's rounding of the graph's and have its
    dtype."""
    classifier = BertClassifier(_backbone(), num_classes=3, dropout=0.3)
    classifier(_tensors(random_backbone_inputs(2, 12)))  # the head's kernel read without LoRA
    lean_calls.clear()
    classifier.output_dense.enable_lora(rank=2)
    _scrambled(classifier)
    hooks = []
    classifier.backbone.register_forward_hook(lambda *args: hooks.append(args[2]))
    inputs = _tensors(random_backbone_inputs(3, 12))
    (lean, grads), (graph, graph_grads) = _both_ways(classifier, inputs, monkeypatch)
    assert lean_calls == [True, False] and len(hooks) == 2  # the lean call and the graph's
    assert set(hooks[0]) == {"sequence_output", "pooled_output"}
    np.testing.assert_allclose(_flat(lean)[0], _flat(graph)[0], rtol=1e-5, atol=1e-4)
    lora = [i for i, v in enumerate(classifier.trainable_weights) if "lora" in v.path]
    assert len(lora) == 2
    for i in lora:
        np.testing.assert_allclose(grads[i], graph_grads[i], rtol=1e-4, atol=1e-5)

    keras.utils.set_random_seed(0)
    mixed = _scrambled(
        BertClassifier(_backbone(dtype="mixed_bfloat16"), num_classes=3, dropout=0.3)
    )
    (lean, _), (graph, _) = _both_ways(mixed, inputs, monkeypatch, training=False)
    assert lean.dtype == graph.dtype and str(lean.dtype) == "torch.bfloat16"
    a, b = _flat(lean)[0], _flat(graph)[0]
    assert np.abs(a - b).max() < 0.02 * np.abs(b).max()


def test_head_layers_set_to_float32_under_a_mixed_backbone(lean_calls, monkeypatch):
    """A head layer given the float32 policy on a mixed_bfloat16 task (the classifier's
    `Dense`, the embedder's pooling, the answerer's span logits): its bfloat16 inputs are
    cast to float32 first, as Keras' `__call__` casts them, so the lean path gives the
    graph's float32 outputs."""
    inputs = _tensors(random_backbone_inputs(3, 12))
    classifier = _scrambled(BertClassifier(_backbone(dtype="mixed_bfloat16"), num_classes=3))
    embedder = _scrambled(BertTextEmbedder(_backbone(dtype="mixed_bfloat16"), pooling="mean"))
    answerer = _scrambled(BertQuestionAnswerer(_backbone(dtype="mixed_bfloat16")))
    cases = (  # task, layer, relative tolerance
        (classifier, classifier.output_dense, 1e-6),
        (embedder, embedder.pooler, 1e-6),
        # The span `Dense` before it computes in bfloat16: torch's `linear` (the graph's) and
        # `addmm` (the lean head's) may round its outputs a bfloat16 step apart.
        (answerer, answerer.span_logits, 2**-7),
    )
    for task, layer, tolerance in cases:
        task(inputs)
        layer.dtype_policy = "float32"
        lean_calls.clear()
        (lean, _), (graph, _) = _both_ways(task, inputs, monkeypatch, training=False)
        assert lean_calls == [True, False]
        for a, b in zip(keras.tree.flatten(lean), keras.tree.flatten(graph), strict=True):
            assert str(a.dtype) == str(b.dtype) == "torch.float32", layer.name
            np.testing.assert_allclose(
                a.detach().numpy(),
                b.detach().numpy(),
                rtol=tolerance,
                atol=1e-6,
                err_msg=layer.name,
            )


def test_what_the_lean_head_leaves_to_the_graph(lean_calls):
    """A head `Dense` quantized on its own, a head layer that is not the graph's (a built one
    put in its place) and a backbone the lean path does not cover run through the graph, and
    still compute."""
    inputs = _tensors(random_backbone_inputs(2, 12))
    classifier = BertClassifier(_backbone(), num_classes=3)
    float_logits = classifier(inputs).detach().numpy()
    classifier.output_dense.quantize("int8")
    quantized = classifier(inputs).detach().numpy()
    assert lean_calls == [True, False]
    assert 0 < np.abs(quantized - float_logits).max() < 0.05

    lean_calls.clear()
    tagger = BertTagger(_backbone(), num_classes=4)
    expected = tagger(inputs).detach().numpy()
    replacement = keras.layers.Dense(4)  # built, but not the layer the graph calls
    replacement.build((None, None, tagger.backbone.hidden_dim))
    tagger.output_dense = replacement
    np.testing.assert_allclose(tagger(inputs).detach().numpy(), expected, atol=1e-6)
    assert lean_calls == [True, False]

    lean_calls.clear()
    attentions = BertClassifier(_backbone(output_attentions=True), num_classes=3)
    assert np.isfinite(attentions(inputs).detach().numpy()).all()
    assert lean_calls == [False]


def test_pretraining_heads_in_mixed_precision_and_what_they_leave_to_the_graph(
    lean_calls, monkeypatch
):
    """The pretrainer's masked-LM and NSP heads under mixed_bfloat16 stay within bfloat16's
    rounding of the graph and keep its dtypes; a quantized transform `Dense` runs through the
    graph."""
    inputs = _tensors(_pretraining_inputs())
    mixed = _scrambled(BertPretrainer(_backbone(dtype="mixed_bfloat16")), scale=0.1)
    (lean, _), (graph, _) = _both_ways(mixed, inputs, monkeypatch, training=False)
    assert lean_calls == [True, False]
    for name in ("mlm", "nsp"):
        assert lean[name].dtype == graph[name].dtype, name
        a, b = lean[name].float().detach().numpy(), graph[name].float().detach().numpy()
        assert np.abs(a - b).max() < 0.03 * np.abs(b).max(), name

    pretrainer = BertPretrainer(_backbone())
    lean_calls.clear()
    expected = pretrainer(inputs)["mlm"].detach().numpy()
    pretrainer.masked_lm_head.transform_dense.quantize("int8")
    quantized = pretrainer(inputs)["mlm"].detach().numpy()
    assert lean_calls == [True, False]
    assert 0 < np.abs(quantized - expected).max() < 0.05 * np.abs(expected).max()


# ------------------------------------------------------------------------------ the loss
@pytest.fixture
def lean_losses(monkeypatch):
    """Whether each `compute_loss` took the torch loss (it answers None where Keras' runs)."""
    return record_answers(monkeypatch, torch_heads, "sparse_cross_entropy")


def _losses_both_ways(task, x, y, monkeypatch, sample_weight=None):
    """`[(loss, d loss / d logits)]` of `task.compute_loss` with the torch loss and with Keras'
    path, on the same logits (scaled up: far from a loss that rounding could confuse)."""
    import torch

    logits = task(x, training=False).detach()
    logits = (logits.float() * 40.0).to(logits.dtype)
    results = []
    for lean in (True, False):
        monkeypatch.setattr(torch_heads, "LEAN_TORCH_TASKS", lean)
        y_pred = logits.clone().requires_grad_(True)
        loss = task.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight)
        (grad,) = torch.autograd.grad(loss, y_pred)
        results.append((loss.detach().numpy(), grad.float().numpy()))
    monkeypatch.setattr(torch_heads, "LEAN_TORCH_TASKS", True)
    return results


LOSS_CASES = {
    # name: (task, inputs, labels, sample weights)
    "classifier": (
        lambda: BertClassifier(_backbone(), num_classes=3),
        lambda: random_backbone_inputs(4, 12),
        np.array([0, 2, 1, 2]),
        None,
    ),
    "classifier_weighted": (
        lambda: BertClassifier(_backbone(), num_classes=3),
        lambda: random_backbone_inputs(4, 12),
        np.array([0, 2, 1, 2]),
        np.array([0.5, 2.0, 0.0, 1.0]),
    ),
    "classifier_mixed": (
        lambda: BertClassifier(_backbone(dtype="mixed_bfloat16"), num_classes=3),
        lambda: random_backbone_inputs(4, 12),
        np.array([0, 2, 1, 2]),
        None,
    ),
    "tagger": (  # mean over the sample weights (the real tokens)
        lambda: BertTagger(_backbone(), num_classes=4),
        lambda: random_backbone_inputs(3, 12),
        np.random.default_rng(1).integers(0, 4, (3, 12)),
        (np.arange(12)[None, :] < np.array([[12], [7], [3]])).astype("float32"),
    ),
    "tagger_unweighted": (
        lambda: BertTagger(_backbone(), num_classes=4),
        lambda: random_backbone_inputs(3, 12),
        np.random.default_rng(1).integers(0, 4, (3, 12)),
        None,
    ),
    "multiple_choice": (
        lambda: BertMultipleChoice(_backbone(), num_choices=3),
        _choice_inputs,
        np.array([2, 0]),
        None,
    ),
}


@pytest.mark.parametrize("name", sorted(LOSS_CASES))
def test_default_cross_entropy_is_keras_loss_in_torch_calls(name, lean_losses, monkeypatch):
    """A task compiled with its default cross-entropy computes `compute_loss` as torch calls,
    equal to Keras' path to float32 rounding, loss and gradient: the same weights, the same
    mean (over the rows, or over the sample weights for the tagger), under mixed precision
    too (the logits cast to float32 first)."""
    make, make_inputs, labels, weights = LOSS_CASES[name]
    task = _scrambled(make())
    x = _tensors(make_inputs())
    (loss, grad), (expected, expected_grad) = _losses_both_ways(
        task, x, labels, monkeypatch, sample_weight=weights
    )
    assert lean_losses[0] is True and len(lean_losses) == 1
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-5, atol=1e-8)
    assert float(expected) > 1.0  # logits far from the labels: a wrong mean shows


def test_what_the_torch_loss_leaves_to_keras(lean_losses, monkeypatch):
    """Keras' `compute_loss` runs, and its loss is what the task gets, where the torch loss
    would miss part of it: a regularizer's loss, `loss_weights`, a loss of the user's own or
    a task's own default (subclasses of Keras' cross-entropy), `ignore_class`, labels Keras
    reshapes first; and in Keras' symbolic build, which builds the compiled loss."""
    import torch

    x = _tensors(random_backbone_inputs(4, 12))
    labels = np.array([0, 2, 1, 2])
    task = _scrambled(BertClassifier(_backbone(), num_classes=3))
    y_pred = task(x, training=False).detach() * 40.0
    plain = float(task.compute_loss(x=x, y=labels, y_pred=y_pred))
    assert lean_losses == [True] and plain > 1.0

    lean_losses.clear()
    kernel = task.output_dense.kernel
    kernel.regularizer = keras.regularizers.L2(1.0)
    try:
        regularized = float(task.compute_loss(x=x, y=labels, y_pred=y_pred))
    finally:
        kernel.regularizer = None
    penalty = float((kernel.value.detach() ** 2).sum())
    assert lean_losses == [] and regularized == pytest.approx(plain + penalty, rel=1e-5)

    task.compile(loss_weights=3.0)
    assert float(task.compute_loss(x=x, y=labels, y_pred=y_pred)) == pytest.approx(3 * plain)

    class Doubled(keras.losses.SparseCategoricalCrossentropy):
        def call(self, y_true, y_pred):
            return 2.0 * super().call(y_true, y_pred)

    class DoublingClassifier(BertClassifier):
        def _default_loss(self):
            return Doubled(from_logits=True)

    for doubled in (task, DoublingClassifier(task.backbone, num_classes=3)):
        if doubled is task:
            task.compile(loss=Doubled(from_logits=True))
        loss = float(doubled.compute_loss(x=x, y=labels, y_pred=y_pred))
        assert loss == pytest.approx(2 * plain) and lean_losses == []

    # A default loss with `ignore_class`: Keras leaves those labels out of the loss and its mean.
    class IgnoringClassifier(BertClassifier):
        def _default_loss(self):
            return keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=2)

    ignoring_task = IgnoringClassifier(task.backbone, num_classes=3)
    ignoring_task.compile()
    ignoring = float(ignoring_task.compute_loss(x=x, y=labels, y_pred=y_pred))
    task.compile()
    kept = float(task.compute_loss(x=x, y=labels[[0, 2]], y_pred=y_pred[[0, 2]]))
    assert ignoring == pytest.approx(kept, rel=1e-5) and abs(ignoring - plain) > 0.1

    lean_losses.clear()
    column = float(task.compute_loss(x=x, y=labels[:, None], y_pred=y_pred))
    assert column == pytest.approx(plain, rel=1e-6) and lean_losses == [False]

    task.compile()
    lean_losses.clear()
    history = task.fit(x, torch.tensor(labels), batch_size=4, epochs=1, verbose=0)
    assert task._compile_loss.built and lean_losses[0] is False  # meta tensors: Keras' build
    assert lean_losses[1:] == [True] and np.isfinite(history.history["loss"]).all()
