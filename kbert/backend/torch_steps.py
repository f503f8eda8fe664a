"""kbert's compiled train / test / predict steps on torch: what `compile(jit_compile=True)` runs.

Keras' own `jit_compile=True` on torch wraps its whole step in one bare `torch.compile`: the
step breaks at `loss.backward()`, shapes turn dynamic from the second one seen, and past
Dynamo's recompile limit (8 per function) it silently runs eagerly. kbert's tasks own their
length buckets and their optimizer, so their steps are compiled this way instead:

- the compiled part of each step is the model's forward pass and loss (`train`, `test`) or
  its forward pass (`predict`, which `encode` and `predict_on_batch` use): one graph, no
  break; `loss.backward()` runs the backward graph AOTAutograd compiled with it, and the
  optimizer's update runs after it as one call (`BertAdamW`: torch's fused AdamW kernel);
- shapes are static (`dynamic=False`): each input signature (shapes, dtypes, device) gets a
  program of its own, compiled once (`ShapeCompiled`); with kbert's length buckets a `fit`
  or `predict` compiles at most once per bucket;
- a batch with fewer rows than the step has seen (the last, partial batch of an epoch) adds
  no shape: `predict` pads it with copies of its first row and drops their outputs, `train`
  and `test` run it eagerly (same numbers; padding would change the loss's mean);
- at most `MAX_SHAPES` programs per step; a further signature runs eagerly, with one warning;
- on a CUDA device `CUDA_GRAPHS = True` compiles with `mode="reduce-overhead"` (torch's CUDA
  graphs: one graph per shape, replayed), and outputs are copied out before the next replay.

Loss, metrics and the optimizer are the model's compiled ones, called through Keras' public
`Model` API (`compute_loss`, `compute_metrics`, `optimizer.apply`), so `fit`'s history,
callbacks and checkpoints see what the eager step gives them.
"""

import types
import warnings

import keras
import numpy as np
import torch
from keras import ops, tree

# Programs per step (train, test or predict) before new signatures run eagerly. kbert's
# buckets stay far below it: 8 lengths up to 128 tokens, 16 up to 512.
MAX_SHAPES = 32

# Whether steps on a CUDA device capture CUDA graphs (`torch.compile`'s "reduce-overhead").
CUDA_GRAPHS = False


def _own_code(function):
    """A copy of `function` with a code object of its own.

    Dynamo keeps its compiled programs, and counts its recompile limit, per code object; a
    copy per signature gives each shape its own entry, so a bucket never evicts another.
    """
    return types.FunctionType(
        function.__code__.replace(),
        function.__globals__,
        function.__name__,
        function.__defaults__,
        function.__closure__,
    )


def _unpack(data):
    """`(x, y, sample_weight)` of a step's `data` (Keras passes `[batch]`), arrays as tensors
    (`predict_on_batch` hands NumPy arrays through)."""
    batch = tree.map_structure(
        lambda v: ops.convert_to_tensor(v) if isinstance(v, np.ndarray) else v, data[0]
    )
    return keras.utils.unpack_x_y_sample_weight(batch)


def _tensors(structure):
    return [leaf for leaf in tree.flatten(structure) if isinstance(leaf, torch.Tensor)]


def _signature(tensors):
    return (torch.is_grad_enabled(),) + tuple((tuple(t.shape), t.dtype, t.device) for t in tensors)


def _pad_rows(structure, rows):
    """Every tensor of `structure` grown to `rows` rows with copies of its first row."""

    def pad(value):
        if not isinstance(value, torch.Tensor) or value.shape[0] >= rows:
            return value
        filler = value[:1].expand(rows - value.shape[0], *value.shape[1:])
        return torch.cat([value, filler])

    return tree.map_structure(pad, structure)


def _first_rows(structure, rows):
    return tree.map_structure(
        lambda v: v[:rows] if isinstance(v, torch.Tensor) and v.ndim else v, structure
    )


class ShapeCompiled:
    """`function(*args)` compiled by `torch.compile(dynamic=False)`, one program per signature.

    Args:
        function: a function of tensors (nested structures of them) to tensors.
        name: what the step is called in the warning past `MAX_SHAPES`.
        pad_rows: bool. Pad a batch with fewer rows than the largest seen so far up to it and
            cut the outputs back (for functions whose rows do not interact); else such a batch
            runs `function` eagerly.

    Attributes:
        compiles: how many programs were compiled (one per signature).
        eager_calls: how many calls ran `function` eagerly.
    """

    def __init__(self, function, name, pad_rows=False):
        self.function = function
        self.name = name
        self.pad_rows = pad_rows
        self.programs = {}
        self.rows = None
        self.compiles = 0
        self.eager_calls = 0
        self._warned = False

    def _program(self, signature, cuda_graphs):
        program = self.programs.get(signature)
        if program is None:
            if len(self.programs) >= MAX_SHAPES:
                if not self._warned:
                    self._warned = True
                    warnings.warn(
                        f"kbert's compiled {self.name} step has compiled {MAX_SHAPES} input "
                        "shapes (kbert.backend.torch_steps.MAX_SHAPES); batches of a new shape "
                        "now run eagerly. Pad inputs to a few lengths (kbert's tasks bucket "
                        "them by length) to keep every batch compiled.",
                        stacklevel=3,
                    )
                return None
            program = torch.compile(
                _own_code(self.function),
                dynamic=False,
                mode="reduce-overhead" if cuda_graphs else None,
            )
            self.programs[signature] = program
            self.compiles += 1
        return program

    def __call__(self, *args):
        tensors = _tensors(args)
        rows = tensors[0].shape[0] if tensors and tensors[0].ndim else None
        given_rows = rows
        if rows is not None:
            if self.rows is None or rows > self.rows:
                self.rows = rows
            elif rows < self.rows:
                if not self.pad_rows:
                    self.eager_calls += 1
                    return self.function(*args)
                args, rows = _pad_rows(args, self.rows), self.rows
                tensors = _tensors(args)
        cuda_graphs = CUDA_GRAPHS and any(t.device.type == "cuda" for t in tensors)
        program = self._program(_signature(tensors), cuda_graphs)
        if program is None:
            self.eager_calls += 1
            outputs = self.function(*args)
        else:
            if cuda_graphs:
                torch.compiler.cudagraph_mark_step_begin()
            outputs = program(*args)
            if cuda_graphs:  # The next replay writes over the graph's output buffers.
                outputs = tree.map_structure(
                    lambda v: v.clone() if isinstance(v, torch.Tensor) else v, outputs
                )
        if given_rows is not None and rows != given_rows:
            outputs = _first_rows(outputs, given_rows)
        return outputs


def _track_loss(model, loss, x):
    """Adds the batch's loss to the model's `loss` metric, weighted by the batch's rows, as
    Keras' own steps do. The metric is the first of `model.metrics` named `"loss"` (Keras
    lists its loss tracker first once compiled); a task finds it once per compile and keeps a
    weak reference to it (`BertTask.compile`), other models walk their metrics."""
    found = getattr(model, "_loss_metric", None)
    metric = found() if found is not None else None
    if metric is None:
        metric = next((m for m in model.metrics if m.name == "loss"), None)
    if metric is not None:
        rows = next(t for t in _tensors(x)).shape[0]
        metric.update_state(loss.detach(), sample_weight=rows)


def _check_steps_per_execution(model):
    if model.steps_per_execution > 1:
        raise ValueError(
            "`steps_per_execution` must be 1 with the PyTorch backend. "
            f"Received: steps_per_execution={model.steps_per_execution}"
        )


def _forward_and_loss(model, training):
    """The function a train (`training=True`) or test step compiles: `(y_pred, loss)`."""

    def forward_and_loss(x, y, sample_weight):
        y_pred = model(x, training=training)
        loss = model.compute_loss(
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training
        )
        return y_pred, loss

    return forward_and_loss


def _update(model, x, y, y_pred, loss, sample_weight):
    """The rest of a train step after the forward pass and loss: the loss metric, the
    gradients of the trainable weights (walked once; their `.grad` cleared first), one
    optimizer update, then the metrics' results."""
    _track_loss(model, loss, x)
    variables = model.trainable_weights
    if variables:
        for variable in variables:  # `Module.zero_grad` walks every module for these
            variable.value.grad = None
        scaled = model.optimizer.scale_loss(loss) if model.optimizer is not None else loss
        scaled.backward()
        gradients = [v.value.grad for v in variables]
        with torch.no_grad():
            model.optimizer.apply(gradients, variables)
    else:
        warnings.warn("The model does not have any trainable weights.", stacklevel=3)
    with torch.no_grad():
        y_pred = tree.map_structure(lambda v: v.detach(), y_pred)
        return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


def train_step(model, data):
    """Keras' `train_step` on eager torch, with the trainable weights walked once (Keras walks
    them three times, and every module once more to clear their gradients): the forward
    pass, `compute_loss`, the loss metric, the gradients, one optimizer update, the metrics.
    Only the weights that train take gradients, so only theirs are cleared."""
    x, y, sample_weight = _unpack([data])
    y_pred, loss = _forward_and_loss(model, training=True)(x, y, sample_weight)
    return _update(model, x, y, y_pred, loss, sample_weight)


def train_function(model):
    """`model`'s train function: compiled forward and loss, backward, one optimizer update."""
    _check_steps_per_execution(model)
    forward = ShapeCompiled(_forward_and_loss(model, training=True), "train")

    def step(data):
        x, y, sample_weight = _unpack(data)
        y_pred, loss = forward(x, y, sample_weight)
        return _update(model, x, y, y_pred, loss, sample_weight)

    step.compiled = forward
    return step


def test_function(model):
    """`model`'s test function: compiled forward and loss, then the metrics."""
    _check_steps_per_execution(model)
    forward = ShapeCompiled(_forward_and_loss(model, training=False), "test")

    def step(data):
        x, y, sample_weight = _unpack(data)
        with torch.no_grad():
            y_pred, loss = forward(x, y, sample_weight)
            _track_loss(model, loss, x)
            return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    step.compiled = forward
    return step


def predict_function(model):
    """`model`'s predict function: the compiled forward pass; a partial batch is padded."""
    _check_steps_per_execution(model)

    def forward(x):
        return model(x, training=False)

    compiled = ShapeCompiled(forward, "predict", pad_rows=True)

    def step(data):
        x, _, _ = _unpack(data)
        with torch.no_grad():
            return compiled(x)

    step.compiled = compiled
    return step
