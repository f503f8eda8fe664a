"""`jit_compile=True` on the torch backend: kbert's compiled steps (`kbert.backend.torch_steps`).

Each step compiles the forward pass (and loss) with static shapes, one program per input shape,
without a graph break; the backward runs the graph compiled with it and the optimizer updates
after it. A `fit` or `predict` compiles at most once per length bucket (a partial last batch
adds no shape) and gives the eager numbers (float32, dropout 0).

The model tests compile with Dynamo's `aot_eager` backend: it captures the same graphs (graph
breaks and recompiles are Dynamo's, the backward comes from AOTAutograd) without Inductor's
C++ code generation, which takes minutes on a small CPU. Tracing still takes seconds per
shape, hence `large` and few shapes.
"""

import functools
import warnings

import keras
import numpy as np
import pytest

from kbert.models import BertBackbone, BertClassifier, BertPretrainer
from tests.test_case import random_backbone_inputs, tiny_backbone_kwargs

LENGTH = 32  # fit's buckets: (16, 32)
BATCH = 4
ROWS = 14  # lengths 32, 29, ..., 2, 2: both buckets, and a partial last batch


@pytest.fixture
def dynamo(monkeypatch):
    """`torch.compile` with the `aot_eager` backend; yields Dynamo's counters."""
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    yield counters
    torch._dynamo.reset()


def _pretraining_rows(seed=0):
    rng = np.random.default_rng(seed)
    x = random_backbone_inputs(ROWS, LENGTH, seed=seed)
    x["mask_positions"] = np.sort(rng.integers(1, 5, size=(ROWS, 3)), axis=1).astype("int32")
    y = {
        "mlm": rng.integers(1, 97, size=(ROWS, 3)).astype("int32"),
        "nsp": rng.integers(0, 2, size=ROWS).astype("int32"),
    }
    return x, y


def _eager_and_compiled(make_model):
    keras.utils.set_random_seed(0)
    eager, compiled = make_model(), make_model()
    compiled.set_weights(eager.get_weights())
    eager.compile(optimizer=keras.optimizers.AdamW(1e-3), jit_compile=False)
    compiled.compile(optimizer=keras.optimizers.AdamW(1e-3), jit_compile=True)
    return eager, compiled


def _lengths(step):
    """The sequence lengths of the shapes `step` compiled: in each program's signature (grad
    mode, then `(shape, dtype, device)` per tensor) the longest axis 1 of a 2-D tensor."""
    return sorted(
        {
            max(shape[1] for shape, _, _ in signature[1:] if len(shape) == 2)
            for signature in step.compiled.programs
        }
    )


def _classifier():
    backbone = BertBackbone(**tiny_backbone_kwargs(max_sequence_length=LENGTH))
    return BertClassifier(backbone, num_classes=3, dropout=0.0)


def _pretrainer():
    return BertPretrainer(BertBackbone(**tiny_backbone_kwargs(max_sequence_length=LENGTH)))


def _assert_histories_equal(history, expected):
    assert expected["loss"][-1] < expected["loss"][0]  # It trains: not constants compared.
    for name, values in expected.items():
        np.testing.assert_allclose(history[name], values, rtol=1e-5, atol=1e-6, err_msg=name)


TORCH_ONLY = pytest.mark.backends(
    "torch", reason="jit_compile=True means kbert's torch.compile steps on torch"
)


@pytest.mark.large
@TORCH_ONLY
def test_fit_and_predict_compile_once_per_bucket_without_graph_breaks_as_eager(dynamo):
    """A classifier's `fit` (with validation) and `predict` compiled: no graph break anywhere
    (Keras' own step breaks at `loss.backward()`), one program per length bucket for each step
    (nothing compiled in the second epoch; the partial batch of `fit` run eagerly, that of
    `predict` padded), and the eager model's history and predictions."""
    eager, compiled = _eager_and_compiled(_classifier)
    x = random_backbone_inputs(ROWS, LENGTH, seed=0)
    y = np.random.default_rng(0).integers(0, 3, size=ROWS).astype("int32")
    kwargs = dict(batch_size=BATCH, epochs=2, shuffle=False, verbose=0, validation_data=(x, y))
    expected = eager.fit(x, y, **kwargs).history
    history = compiled.fit(x, y, **kwargs).history
    outputs = compiled.predict(x, batch_size=BATCH, verbose=0)

    assert not dynamo["graph_break"], dict(dynamo["graph_break"])
    buckets = list(compiled.bucket_lengths(LENGTH, training=True))
    train = compiled.train_function.compiled
    test = compiled.test_function.compiled
    predict = compiled.predict_function.compiled
    assert _lengths(compiled.train_function) == buckets  # both buckets, each once
    assert train.compiles == len(buckets) and train.eager_calls == 2  # partial batch, 2 epochs
    assert test.compiles <= len(buckets)
    assert _lengths(compiled.predict_function) == list(compiled.bucket_lengths(LENGTH))
    assert predict.eager_calls == 0
    graphs = train.compiles + test.compiles + predict.compiles
    assert dynamo["stats"]["unique_graphs"] == graphs  # nothing compiled behind our count
    _assert_histories_equal(history, expected)
    np.testing.assert_allclose(
        outputs, eager.predict(x, batch_size=BATCH, verbose=0), rtol=1e-5, atol=1e-6
    )


@pytest.mark.large
@TORCH_ONLY
def test_pretrainer_trains_compiled_as_eager_and_new_shapes_past_the_budget_run_eagerly(
    dynamo, monkeypatch
):
    """`BertPretrainer` (two outputs, two losses) trains compiled as eager without a graph
    break; past `MAX_SHAPES` a new shape runs eagerly, with one warning, and the same numbers."""
    from kbert.backend import torch_steps

    eager, compiled = _eager_and_compiled(_pretrainer)
    x, y = _pretraining_rows()
    kwargs = dict(batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    _assert_histories_equal(compiled.fit(x, y, **kwargs).history, eager.fit(x, y, **kwargs).history)
    assert not dynamo["graph_break"], dict(dynamo["graph_break"])

    step = compiled.predict_function or compiled.make_predict_function()
    monkeypatch.setattr(torch_steps, "MAX_SHAPES", 1)
    # A second batch size is a second shape (more rows than seen: not padded, compiled).
    batches = [{k: v[:rows] for k, v in x.items()} for rows in (BATCH, BATCH + 2)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outputs = [compiled.predict_on_batch(batch) for batch in batches]
    assert step.compiled.compiles == 1 and step.compiled.eager_calls == 1
    assert sum("MAX_SHAPES" in str(w.message) for w in caught) == 1
    for got, batch in zip(outputs, batches):
        want = eager.predict_on_batch(batch)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)


@pytest.mark.backend_independent
def test_shape_compiled_gives_each_shape_its_own_program_and_pads_or_runs_eagerly(monkeypatch):
    """`ShapeCompiled` on a plain torch function: more shapes than Dynamo's recompile limit (8
    per code object) each compile once and run compiled; rows fewer than the largest seen are
    padded and cut back (`pad_rows`) or run eagerly."""
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    from kbert.backend.torch_steps import ShapeCompiled

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    torch._dynamo.reset()
    counters.clear()

    def row_wise(x):
        return {"y": x * 2.0 + x.sum(-1, keepdim=True)}

    step = ShapeCompiled(row_wise, "predict", pad_rows=True)
    inputs = [torch.randn(4, length) for length in range(1, 11)]
    with torch._dynamo.config.patch(error_on_recompile=True):
        for x in inputs:
            np.testing.assert_allclose(step(x)["y"], row_wise(x)["y"], rtol=1e-6)
        short = inputs[3][:3]
        np.testing.assert_allclose(step(short)["y"], row_wise(short)["y"], rtol=1e-6)
    assert step.compiles == 10 and step.eager_calls == 0
    assert counters["stats"]["unique_graphs"] == 10  # every shape ran compiled

    eager_rest = ShapeCompiled(row_wise, "train")
    eager_rest(inputs[0])
    eager_rest(inputs[0][:2])
    assert eager_rest.compiles == 1 and eager_rest.eager_calls == 1
    torch._dynamo.reset()


@TORCH_ONLY
def test_a_model_with_its_own_step_keeps_it_under_jit_compile():
    """`compile(jit_compile=True)` runs kbert's compiled steps only where the model uses Keras'
    own `train_step` / `test_step` / `predict_step`; a subclass's own step is what Keras runs."""
    from kbert import backend

    class OwnTrainStep(BertClassifier):
        def train_step(self, data):
            return super().train_step(data)

    plain = _classifier()
    own = OwnTrainStep(plain.backbone, num_classes=3, dropout=0.0)
    for model in (plain, own):
        model.compile(optimizer=keras.optimizers.AdamW(1e-3), jit_compile=True)
    assert backend.torch_step_function(plain, "train") is not None
    assert backend.torch_step_function(own, "train") is None
    # The steps it does not override stay kbert's.
    assert backend.torch_step_function(own, "test") is not None
    assert backend.torch_step_function(own, "predict") is not None
    own.make_train_function()
    assert getattr(own.train_function, "compiled", None) is None
