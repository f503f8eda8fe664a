"""`jit_compile=True` on the torch backend: Keras compiles the train step with `torch.compile`.

Dynamo must trace kbert's layers without graph breaks and compile the step once: a graph
break inside a Keras layer call (under its name scope) makes Dynamo compile each layer's
`__call__` frame on its own, guarded on the layer's name path, so it recompiles once per
encoder layer until it hits its recompile limit. The compiled step must train exactly as the
eager one: same loss curve from the same weights and data (dropout 0).

The tests compile with Dynamo's `aot_eager` backend: it captures the same graphs (graph
breaks and recompiles are Dynamo's, the backward comes from AOTAutograd) without Inductor's
C++ code generation, which takes minutes on a small CPU. Tracing Keras' step still takes
tens of seconds per model, hence `large`.
"""

import functools

import keras
import numpy as np
import pytest

from kbert.models import BertBackbone, BertClassifier, BertPretrainer
from tests.test_case import random_backbone_inputs, tiny_backbone_kwargs

pytestmark = pytest.mark.backends(
    "torch",
    reason="jit_compile=True compiles with torch.compile only on the torch backend",
)

BATCH, LENGTH, STEPS = 4, 16, 4


def _backbone_kwargs():
    return tiny_backbone_kwargs(max_sequence_length=LENGTH)


def _pretrainer():
    return BertPretrainer(BertBackbone(**_backbone_kwargs()))


def _classifier():
    # One encoder layer: the per-layer recompiles are the pretrainer test's; this one checks the
    # classifier's head and loss under the compiled step (tracing time grows with the layers).
    backbone = BertBackbone(**dict(_backbone_kwargs(), num_layers=1))
    return BertClassifier(backbone, num_classes=3, dropout=0.0)


def _batches(kind, seed=0):
    """`STEPS` times one batch `(x, y[, sample_weight])` of NumPy arrays for a model of `kind`.

    The same batch every step, so that the eager loss must fall (the curves compared are
    not constants).
    """
    rng = np.random.default_rng(seed)
    x = random_backbone_inputs(BATCH, LENGTH, seed=seed)
    if kind == "pretrainer":
        x["mask_positions"] = np.sort(rng.integers(1, LENGTH // 2, size=(BATCH, 3)), axis=1).astype(
            "int32"
        )
        y = {
            "mlm": rng.integers(1, 97, size=(BATCH, 3)).astype("int32"),
            "nsp": rng.integers(0, 2, size=BATCH).astype("int32"),
        }
        weights = {"mlm": np.ones((BATCH, 3), "float32"), "nsp": np.ones(BATCH, "float32")}
        batch = (x, y, weights)
    elif kind == "classifier":
        batch = (x, rng.integers(0, 3, size=BATCH).astype("int32"))
    else:
        batch = (x, rng.integers(0, 5, size=(BATCH, LENGTH)).astype("int32"))
    return [batch] * STEPS


def _as_tensors(batch):
    return keras.tree.map_structure(keras.ops.convert_to_tensor, batch)


def _loss_curve(model, batches):
    return [
        float(model.train_on_batch(*_as_tensors(batch), return_dict=True)["loss"])
        for batch in batches
    ]


def _train_both_ways(make_model, kind):
    """Loss curves of eager and compiled training from the same initial weights."""
    keras.utils.set_random_seed(0)
    eager = make_model()
    compiled = make_model()
    compiled.set_weights(eager.get_weights())
    eager.compile(optimizer=keras.optimizers.AdamW(1e-3), jit_compile=False)
    compiled.compile(optimizer=keras.optimizers.AdamW(1e-3), jit_compile=True)
    batches = _batches(kind)
    return _loss_curve(eager, batches), _loss_curve(compiled, batches)


@pytest.fixture
def dynamo(monkeypatch):
    """Keras' `torch.compile` with the `aot_eager` backend; yields Dynamo's counters."""
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    yield counters
    torch._dynamo.reset()


@pytest.mark.large
def test_pretrainer_compiles_once_without_graph_breaks_and_trains_as_eager(dynamo):
    """One compiled `BertPretrainer` step: every layer traced into the step's graphs, once.

    The only graph break allowed is Keras' `loss.backward()` in its torch train step (Dynamo
    cannot trace `Tensor.backward`); a break inside a layer would make Dynamo compile the
    layers' `__call__` frames one by one and recompile them per encoder layer. After the
    first two steps (the optimizer builds its state in the first) nothing is compiled again.
    """
    import torch._dynamo

    keras.utils.set_random_seed(0)
    eager = _pretrainer()
    compiled = _pretrainer()
    compiled.set_weights(eager.get_weights())
    eager.compile(optimizer=keras.optimizers.AdamW(1e-3), jit_compile=False)
    compiled.compile(optimizer=keras.optimizers.AdamW(1e-3), jit_compile=True)
    batches = _batches("pretrainer")
    compiled_losses = _loss_curve(compiled, batches[:2])
    graphs = dynamo["stats"]["unique_graphs"]
    with torch._dynamo.config.patch(error_on_recompile=True):
        compiled_losses += _loss_curve(compiled, batches[2:])
    assert dynamo["stats"]["unique_graphs"] == graphs, "Dynamo compiled again after step 2"
    reasons = list(dynamo["graph_break"])
    assert all("Tensor.backward" in reason for reason in reasons), "\n\n".join(reasons)

    eager_losses = _loss_curve(eager, batches)
    assert eager_losses[-1] < eager_losses[0]  # It trains: not a comparison of constants.
    np.testing.assert_allclose(compiled_losses, eager_losses, rtol=2e-5, atol=2e-6)


@pytest.mark.large
@pytest.mark.parametrize("kind, make_model", [("classifier", _classifier)])
def test_task_models_train_compiled_as_eager(dynamo, kind, make_model):
    eager, compiled = _train_both_ways(make_model, kind)
    assert eager[-1] < eager[0]
    np.testing.assert_allclose(compiled, eager, rtol=2e-5, atol=2e-6)
