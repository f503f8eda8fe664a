"""BertAdamW and the warm-up schedule against a NumPy transcription of torch.optim.AdamW.

Also everything Keras' `Optimizer.apply` does around BertAdamW's update (global and per-variable
clipping, gradient accumulation, the decay mask, EMA, loss scaling, missing gradients), state
kept in `optimizer.variables` through restores and `.keras` save/load, and that the optimizers
read no private Keras attribute. Each reference check is also run against the reference with one
feature wrong, which must be far off: the checks can fail.
"""

from pathlib import Path

import keras
import numpy as np
import pytest

from kbert.optimizers import BertAdamW, WarmupLinearDecay, bert_optimizer
from kbert.optimizers.optimization import planned_schedule
from tests.test_case import assert_all_close

NAMES = ("kernel", "bias", "gamma")
SHAPES = ((40, 6), (6,), (6,))


def _problem(num_steps=6, seed=0):
    rng = np.random.default_rng(seed)
    initial = [rng.normal(size=shape).astype("float32") for shape in SHAPES]
    # Gradients from 1e-7 to 1e-2: where epsilon (1e-6) is added matters for the small ones.
    grads = [
        [
            (rng.normal(size=shape) * 10.0 ** rng.integers(-7, -1, size=shape)).astype("float32")
            for shape in SHAPES
        ]
        for _ in range(num_steps)
    ]
    return initial, grads


def _reference_adamw(initial, grads, peak, total, warmup, weight_decay, epsilon, clipnorm):
    """`torch.optim.AdamW` (epsilon after bias correction) with BERT's schedule, decay mask and
    global-norm clipping, written out in NumPy float64."""
    params = [p.astype("float64") for p in initial]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    for step, step_grads in enumerate(grads):
        lr = (
            peak * step / warmup
            if step < warmup
            else peak * max(0.0, (total - step) / (total - warmup))
        )
        g = [x.astype("float64") for x in step_grads]
        norm = np.sqrt(sum(np.sum(x * x) for x in g))
        g = [x * min(1.0, clipnorm / norm) for x in g]
        t = step + 1
        for i, name in enumerate(NAMES):
            if name == "kernel":
                params[i] *= 1 - lr * weight_decay
            m[i] = 0.9 * m[i] + 0.1 * g[i]
            v[i] = 0.999 * v[i] + 0.001 * g[i] ** 2
            m_hat, v_hat = m[i] / (1 - 0.9**t), v[i] / (1 - 0.999**t)
            params[i] -= lr * m_hat / (np.sqrt(v_hat) + epsilon)
    return params


def _kbert_adamw(initial, grads, **kwargs):
    variables = [keras.Variable(p, name=name) for p, name in zip(initial, NAMES)]
    optimizer = bert_optimizer(**kwargs)
    for step_grads in grads:
        optimizer.apply([keras.ops.convert_to_tensor(g) for g in step_grads], variables)
    return [keras.ops.convert_to_numpy(v) for v in variables], optimizer


SETTINGS = dict(learning_rate=3e-2, total_steps=8, warmup_steps=2, weight_decay=0.1, epsilon=1e-6)


def test_bert_adamw_equals_torch_adamw_transcription():
    initial, grads = _problem()
    expected = _reference_adamw(initial, grads, 3e-2, 8, 2, 0.1, 1e-6, clipnorm=1.0)
    actual, optimizer = _kbert_adamw(initial, grads, **SETTINGS)
    assert isinstance(optimizer, BertAdamW)
    for a, e, p in zip(actual, expected, initial):
        assert np.abs(e - p).max() > 1e-3  # every variable moved
        assert_all_close(a, e, atol=2e-6, rtol=1e-5)
    # Keras' own placement of epsilon gives measurably different weights: the check can fail.
    keras_placement, _ = _kbert_adamw(initial, grads, torch_epsilon=False, **SETTINGS)
    assert max(np.abs(a - e).max() for a, e in zip(keras_placement, expected)) > 100 * 2e-6


@pytest.mark.backends("torch", reason="torch's multi-tensor update path")
def test_torch_update_without_the_fused_kernel_gives_the_same_weights(monkeypatch):
    """The multi-tensor (foreach) form of torch.optim.AdamW computes the fused kernel's update."""
    from kbert.backend import torch as torch_paths

    initial, grads = _problem(seed=1)
    fused, optimizer = _kbert_adamw(initial, grads, **SETTINGS)
    assert torch_paths.torch_adamw(optimizer).param_groups[0]["fused"]
    monkeypatch.setattr(torch_paths, "FUSED_ADAMW", False)
    fallback, optimizer = _kbert_adamw(initial, grads, **SETTINGS)
    assert not torch_paths.torch_adamw(optimizer).param_groups[0]["fused"]
    expected = _reference_adamw(initial, grads, 3e-2, 8, 2, 0.1, 1e-6, clipnorm=1.0)
    for a, b, e in zip(fused, fallback, expected):
        assert_all_close(b, e, atol=2e-6, rtol=1e-5)
        assert_all_close(a, b, atol=2e-6, rtol=1e-5)


def test_accumulated_micro_batches_equal_one_update_of_their_mean():
    initial, grads = _problem(num_steps=4, seed=2)
    accumulated, _ = _kbert_adamw(initial, grads, gradient_accumulation_steps=2, **SETTINGS)
    means = [[(a + b) / 2 for a, b in zip(grads[i], grads[i + 1])] for i in (0, 2)]
    expected = _reference_adamw(initial, means, 3e-2, 8, 2, 0.1, 1e-6, clipnorm=1.0)
    for a, e in zip(accumulated, expected):
        assert_all_close(a, e, atol=2e-6, rtol=1e-5)


# === The update around the math: clipping, accumulation, decay mask, EMA, loss scaling ===
# One NumPy reference with every feature as a switch; each test also computes the reference
# with one feature wrong and checks that kbert's weights are far from it, so the checks can fail.

VARYING = (3.0, 0.05, 10.0, 0.2, 1.5, 0.01)  # Global gradient norms well above and below 1.


def _varying_problem(num_steps=6, seed=3):
    rng = np.random.default_rng(seed)
    initial = [rng.normal(size=shape).astype("float32") for shape in SHAPES]
    grads = []
    for step in range(num_steps):
        raw = [rng.normal(size=shape) * 10.0 ** rng.integers(-3, 1, size=shape) for shape in SHAPES]
        norm = np.sqrt(sum(np.sum(g * g) for g in raw))
        grads.append([(g * VARYING[step % len(VARYING)] / norm).astype("float32") for g in raw])
    return initial, grads


def _reference(
    initial,
    grads,
    rate,
    weight_decay=0.1,
    epsilon=1e-6,
    clip=("global", 1.0),
    decayed=("kernel",),
    bias_correction=True,
    accumulation=1,
    ema_momentum=None,
):
    """AdamW in float64: `rate(update)`, clipping `("global", c)`/`("each", c)`/`None`, decoupled
    decay of the variables named in `decayed`, `accumulation` micro-batches averaged per update,
    and the EMA of the weights after every update (Keras' form: the first average is the
    weights)."""
    params = [p.astype("float64") for p in initial]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    averages = None
    updates = [
        [
            np.mean([grads[i + k][j] for k in range(accumulation)], axis=0, dtype="float64")
            for j in range(len(NAMES))
        ]
        for i in range(0, len(grads), accumulation)
    ]
    for step, g in enumerate(updates):
        lr = rate(step)
        if clip is not None and clip[0] == "global":
            norm = np.sqrt(sum(np.sum(x * x) for x in g))
            g = [x * min(1.0, clip[1] / norm) for x in g]
        elif clip is not None:
            g = [x * min(1.0, clip[1] / np.sqrt(np.sum(x * x))) for x in g]
        t = step + 1
        for i, name in enumerate(NAMES):
            if name in decayed:
                params[i] *= 1 - lr * weight_decay
            m[i] = 0.9 * m[i] + 0.1 * g[i]
            v[i] = 0.999 * v[i] + 0.001 * g[i] ** 2
            m_hat, v_hat = (
                (m[i] / (1 - 0.9**t), v[i] / (1 - 0.999**t)) if bias_correction else (m[i], v[i])
            )
            params[i] -= lr * m_hat / (np.sqrt(v_hat) + epsilon)
        if ema_momentum is not None:
            momentum = 0.0 if averages is None else ema_momentum
            averages = [p.copy() for p in params] if averages is None else averages
            averages = [momentum * a + (1 - momentum) * p for a, p in zip(averages, params)]
    return params if ema_momentum is None else (params, averages)


def _bert_schedule(peak=3e-2, total=8, warmup=2):
    return lambda step: (
        peak * step / warmup
        if step < warmup
        else peak * max(0.0, (total - step) / (total - warmup))
    )


def _train(optimizer, initial, grads, scale=1.0):
    variables = [keras.Variable(p, name=name) for p, name in zip(initial, NAMES)]
    for step_grads in grads:
        optimizer.apply([keras.ops.convert_to_tensor(g * scale) for g in step_grads], variables)
    return variables


def _assert_matches_only(actual, expected, wrong, atol=3e-6):
    actual = [keras.ops.convert_to_numpy(a) for a in actual]
    for a, e in zip(actual, expected):
        assert_all_close(a, e, atol=atol, rtol=1e-5)
    for name, w in wrong.items():
        distance = max(np.abs(a - x).max() for a, x in zip(actual, w))
        assert distance > 100 * atol, f"the reference with {name} wrong is as close: {distance}"


def test_bert_optimizer_equals_numpy_adamw_with_clipping_accumulation_and_decay_mask():
    initial, grads = _varying_problem(num_steps=8)
    schedule = _bert_schedule()
    optimizer = bert_optimizer(gradient_accumulation_steps=2, **SETTINGS)
    variables = _train(optimizer, initial, grads)
    reference = dict(rate=schedule, accumulation=2)
    wrong = {
        "no clipping": _reference(initial, grads, **{**reference, "clip": None}),
        "no accumulation": _reference(initial, grads, schedule),
        "decay of biases and LayerNorm": _reference(initial, grads, **reference, decayed=NAMES),
        "no bias correction": _reference(initial, grads, **reference, bias_correction=False),
    }
    _assert_matches_only(variables, _reference(initial, grads, **reference), wrong)
    assert int(keras.ops.convert_to_numpy(optimizer.iterations)) == 4  # updates, not micro-batches


def test_per_variable_clipnorm_ema_and_loss_scale_factor():
    """Keras' `clipnorm`, `use_ema` (averages of the updated weights) and `loss_scale_factor`."""
    initial, grads = _varying_problem(seed=4)
    optimizer = BertAdamW(
        learning_rate=1e-2,
        weight_decay=0.1,
        epsilon=1e-6,
        clipnorm=0.5,
        use_ema=True,
        ema_momentum=0.5,
        loss_scale_factor=64.0,
    )
    optimizer.exclude_from_weight_decay(var_names=["bias", "gamma"])
    variables = _train(optimizer, initial, grads, scale=64.0)
    reference = dict(rate=lambda step: 1e-2, clip=("each", 0.5), ema_momentum=0.5)
    params, averages = _reference(initial, grads, **reference)
    wrong_params, _ = _reference(initial, grads, **{**reference, "clip": ("global", 0.5)})
    _assert_matches_only(variables, params, {"global clipping": wrong_params})
    optimizer.finalize_variable_values(variables)  # What `fit` does at its end with EMA.
    _, stale = _reference(initial, grads[:-1], **reference)  # EMA lagging one update behind
    _assert_matches_only(variables, averages, {"the EMA of the weights before each update": stale})


@pytest.mark.backends(
    "tensorflow",
    "torch",
    reason="JAX applies a LossScaleOptimizer only statelessly, inside fit",
)
def test_loss_scale_optimizer_skips_non_finite_steps_and_unscales():
    initial, grads = _varying_problem(num_steps=4, seed=5)
    inner = bert_optimizer(**SETTINGS)
    optimizer = keras.optimizers.LossScaleOptimizer(inner, initial_scale=1024.0)
    variables = [keras.Variable(p, name=name) for p, name in zip(initial, NAMES)]
    scale = 1024.0
    for step, step_grads in enumerate(grads):
        if step == 2:  # An overflowing step: skipped, the scale halves.
            optimizer.apply(
                [keras.ops.convert_to_tensor(g * np.inf) for g in step_grads], variables
            )
            scale /= 2
        optimizer.apply([keras.ops.convert_to_tensor(g * scale) for g in step_grads], variables)
    assert float(keras.ops.convert_to_numpy(optimizer.dynamic_scale)) == scale
    assert int(keras.ops.convert_to_numpy(inner.iterations)) == len(grads)
    expected = _reference(initial, grads, _bert_schedule())
    _assert_matches_only(
        variables,
        expected,
        {"no clipping": _reference(initial, grads, _bert_schedule(), clip=None)},
    )


def test_missing_gradients_leave_their_variable_alone():
    """Keras drops `None` gradients before the update (the torch path must count the rest)."""
    initial, grads = _varying_problem(num_steps=3, seed=6)
    optimizer = bert_optimizer(**SETTINGS)
    variables = [keras.Variable(p, name=name) for p, name in zip(initial, NAMES)]
    for step_grads in grads:
        with pytest.warns(UserWarning, match="Gradients do not exist"):
            some = [
                keras.ops.convert_to_tensor(step_grads[0]),
                None,
                keras.ops.convert_to_tensor(step_grads[2]),
            ]
            optimizer.apply(some, variables)
    zero_bias = [[g[0], np.zeros_like(g[1]), g[2]] for g in grads]
    expected = _reference(initial, zero_bias, _bert_schedule())
    expected[1] = initial[1]
    _assert_matches_only(variables, expected, {})


def test_moments_are_optimizer_variables_and_restoring_them_resumes_exactly():
    """The moments are in `optimizer.variables`; assigning saved values to those variables
    (as `kbert.callbacks.TrainingBackup` restores) continues exactly, also on torch after its
    fused optimizer was built."""
    initial, grads = _varying_problem(num_steps=6, seed=7)
    optimizer = bert_optimizer(**SETTINGS)
    variables = _train(optimizer, initial, grads[:3])
    ids = {id(v) for v in optimizer.variables}
    for variable in variables:
        m, v = optimizer.moments(variable)
        assert id(m) in ids and id(v) in ids
        assert np.abs(keras.ops.convert_to_numpy(v)).max() > 0
    saved = [np.array(keras.ops.convert_to_numpy(v)) for v in optimizer.variables]
    weights = [np.array(keras.ops.convert_to_numpy(v)) for v in variables]
    for step_grads in grads[3:]:
        optimizer.apply([keras.ops.convert_to_tensor(g) for g in step_grads], variables)
    first = [np.array(keras.ops.convert_to_numpy(v)) for v in variables]
    for variable, value in zip(optimizer.variables, saved):
        variable.assign(value)
    for variable, value in zip(variables, weights):
        variable.assign(value)
    for step_grads in grads[3:]:
        optimizer.apply([keras.ops.convert_to_tensor(g) for g in step_grads], variables)
    _assert_matches_only(variables, first, {}, atol=1e-7)
    # Outside an update the rate follows the step again (what a callback logs).
    rate = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
    assert rate == pytest.approx(_bert_schedule()(len(grads)), rel=1e-6)
    first = _bert_schedule()(1)  # (step 0's rate is 0 in the warm-up)
    wrong = {"one rate at every step": _reference(initial, grads, lambda step: first)}
    _assert_matches_only(variables, _reference(initial, grads, _bert_schedule()), wrong)
    with pytest.raises(ValueError, match="not built with the variable"):
        optimizer.moments(keras.Variable(np.zeros(3, "float32"), name="stranger"))


def test_keras_save_and_load_restores_the_optimizer_state(tmp_path):
    """`.keras` save/load of a compiled model: the moments come back and training continues
    as it would have without the round trip."""
    rng = np.random.default_rng(8)
    x, y = rng.normal(size=(16, 6)).astype("float32"), rng.normal(size=(16, 2)).astype("float32")

    def build():
        keras.utils.set_random_seed(1)
        model = keras.Sequential(
            [
                keras.Input((6,)),
                keras.layers.Dense(4),
                keras.layers.LayerNormalization(),
                keras.layers.Dense(2),
            ]
        )
        model.compile(optimizer=bert_optimizer(1e-2, total_steps=20, warmup_steps=2), loss="mse")
        return model

    model = build()
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded.optimizer, BertAdamW)
    assert len(loaded.optimizer.variables) == len(model.optimizer.variables)
    for a, b in zip(loaded.optimizer.variables, model.optimizer.variables):
        assert_all_close(a, b, atol=0, rtol=0)
    for m in (model, loaded):
        m.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    moved = max(np.abs(a - b).max() for a, b in zip(model.get_weights(), loaded.get_weights()))
    assert moved < 1e-6


def test_kbert_optimizers_use_no_private_keras_attribute():
    """The optimizers reach Keras only through public hooks: every `obj._name` they read is an
    attribute kbert itself defines."""
    import ast
    import inspect

    from kbert.backend import paths
    from kbert.optimizers import lamb, optimization, slots

    sources = [inspect.getsource(module) for module in (optimization, lamb, slots)]
    functions = (paths.has_multi_tensor_adamw, paths.adamw_update)
    sources += [inspect.getsource(f) for f in functions]
    # The torch side, read as text (importing it imports torch): the whole module is used.
    sources.append(Path(paths.__file__).with_name("torch.py").read_text(encoding="utf-8"))
    trees = [ast.parse(s) for s in sources] + [ast.parse(inspect.getsource(paths))]
    own = {
        n.attr
        for t in trees
        for n in ast.walk(t)
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
    }
    own |= {
        n.name for t in trees for n in ast.walk(t) if isinstance(n, (ast.FunctionDef, ast.ClassDef))
    }
    assigned = (n for tree in trees for n in ast.walk(tree) if isinstance(n, ast.Assign))
    own |= {t.id for n in assigned for t in n.targets if isinstance(t, ast.Name)}
    used = {n.attr for s in sources for n in ast.walk(ast.parse(s)) if isinstance(n, ast.Attribute)}
    private = {a for a in used if a.startswith("_") and not a.startswith("__")}
    assert private <= own, sorted(private - own)


@pytest.mark.large
@pytest.mark.backends("torch", reason="torch.compile of the training step")
def test_compiled_torch_training_step_updates_as_eager():
    """`jit_compile=True` (Dynamo) on torch: the fused update inside the compiled step gives the
    eager weights (before the step counts followed `iterations`, they drifted by ~4e-3 here)."""
    rng = np.random.default_rng(9)
    x, y = rng.normal(size=(16, 6)).astype("float32"), rng.normal(size=(16, 2)).astype("float32")

    def train(jit_compile):
        keras.utils.set_random_seed(1)
        model = keras.Sequential(
            [
                keras.Input((6,)),
                keras.layers.Dense(4),
                keras.layers.LayerNormalization(),
                keras.layers.Dense(2),
            ]
        )
        optimizer = bert_optimizer(1e-2, total_steps=20, warmup_steps=2)
        model.compile(optimizer=optimizer, loss="mse", jit_compile=jit_compile)
        model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
        return model.get_weights()

    eager, compiled = train(False), train(True)
    assert max(np.abs(a - b).max() for a, b in zip(compiled, eager)) < 1e-6


def test_global_clipping_leaves_out_a_variable_that_takes_its_gradient_as_value(monkeypatch):
    """Keras sets a variable with `overwrite_with_gradient` to its gradient, unclipped, and
    clips the others by their own global norm (the torch path clips before Keras' `apply`)."""
    import kbert.backend

    initial, grads = _varying_problem(num_steps=4, seed=7)
    calls = []
    if kbert.backend.has_multi_tensor_adamw():  # torch: clipped at once, checked to be so
        clip = kbert.backend.clip_by_global_norm
        monkeypatch.setattr(
            kbert.backend, "clip_by_global_norm", lambda *a: calls.append(1) or clip(*a)
        )
    rng = np.random.default_rng(8)
    counters = [(rng.normal(size=(5,)) * 30.0).astype("float32") for _ in grads]
    optimizer = bert_optimizer(**SETTINGS)
    variables = [keras.Variable(p, name=name) for p, name in zip(initial, NAMES)]
    counter = keras.Variable(np.zeros(5, "float32"), name="counter")
    counter.overwrite_with_gradient = True
    for step_grads, value in zip(grads, counters):
        tensors = [keras.ops.convert_to_tensor(g) for g in step_grads + [value]]
        optimizer.apply(tensors, variables + [counter])
    assert_all_close(keras.ops.convert_to_numpy(counter), counters[-1], atol=0, rtol=0)
    expected = _reference(initial, grads, _bert_schedule())
    # Counting the large overwritten gradient in the norm would clip the others far more.
    norms = [np.sqrt(sum(np.sum(g.astype("float64") ** 2) for g in step)) for step in grads]
    with_counter = [
        [g * min(1.0, norm / np.sqrt(norm**2 + np.sum(c.astype("float64") ** 2))) for g in step]
        for step, c, norm in zip(grads, counters, norms)
    ]
    wrong = {
        "the overwritten gradient in the norm": _reference(initial, with_counter, _bert_schedule())
    }
    _assert_matches_only(variables, expected, wrong)
    assert len(calls) == (len(grads) if kbert.backend.has_multi_tensor_adamw() else 0)


def test_clipping_scales_a_steps_own_gradients_in_place_and_leaves_given_ones_as_they_are():
    """A train step hands the optimizer each variable's own `.grad`: clipped in place there (no
    new tensor per variable, as `torch.nn.utils.clip_grad_norm_`). Gradients given otherwise
    (a user's own tensors) are never changed; every optimizer update still matches the
    reference (tests above)."""
    import kbert.backend

    initial, grads = _varying_problem(num_steps=2, seed=11)
    step = [g * 40.0 for g in grads[0]]  # norm 40 x the first VARYING value: clipped
    norm = np.sqrt(sum(np.sum(g.astype("float64") ** 2) for g in step))
    scale = min(1.0, 1.0 / norm)
    variables = [keras.Variable(p, name=name) for p, name in zip(initial, NAMES)]
    given = [keras.ops.convert_to_tensor(g) for g in step]
    optimizer = bert_optimizer(**SETTINGS)
    optimizer.apply(given, variables)
    for tensor, original in zip(given, step):
        assert_all_close(keras.ops.convert_to_numpy(tensor), original, atol=0, rtol=0)
    if not kbert.backend.has_multi_tensor_adamw():
        return
    own = [keras.ops.convert_to_tensor(g.copy()) for g in step[:2]]
    for variable, tensor in zip(variables, own):
        variable.value.grad = tensor
    other = keras.ops.convert_to_tensor(step[2].copy())
    try:
        clipped = kbert.backend.clip_by_global_norm(own + [other], 1.0, variables)
    finally:
        for variable in variables:
            variable.value.grad = None
    assert clipped[0] is own[0] and clipped[1] is own[1]
    assert clipped[2] is not other
    for tensor, original in zip(clipped, step):
        assert_all_close(keras.ops.convert_to_numpy(tensor), original * scale, rtol=1e-6)
    assert_all_close(keras.ops.convert_to_numpy(other), step[2], atol=0, rtol=0)
    # Without the variables no gradient is known to be a step's own: each is left as it is.
    given = [keras.ops.convert_to_tensor(g.copy()) for g in step]
    clipped = kbert.backend.clip_by_global_norm(given, 1.0)
    for tensor, new, original in zip(given, clipped, step):
        assert_all_close(keras.ops.convert_to_numpy(tensor), original, atol=0, rtol=0)
        assert_all_close(keras.ops.convert_to_numpy(new), original * scale, rtol=1e-6)


def test_a_non_finite_gradient_norm_gives_non_finite_weights_as_keras_clipping_does():
    """An infinite gradient under global-norm clipping: Keras' scale, `clip_norm * min(1 / norm,
    1 / clip_norm) + (norm - norm)`, is NaN, so every gradient and every weight turns NaN (on
    torch too, where kbert clips all gradients at once); a step that only zeroed the other
    gradients would hide the overflow."""
    initial, grads = _varying_problem(num_steps=1, seed=12)
    step = [g.copy() for g in grads[0]]
    step[0][0, 0] = np.inf
    variables = [keras.Variable(p, name=name) for p, name in zip(initial, NAMES)]
    optimizer = bert_optimizer(**SETTINGS)
    assert optimizer.global_clipnorm == 1.0
    optimizer.apply([keras.ops.convert_to_tensor(g) for g in step], variables)
    for variable in variables:
        assert np.isnan(keras.ops.convert_to_numpy(variable)).all(), variable.path


def test_one_update_computes_its_learning_rate_once(monkeypatch):
    """Keras asks for the rate twice per update (weight decay, then the update); the
    multi-tensor update (torch) computes BERT's schedule once per update, at each update's
    own step (the reference tests above check the rates themselves)."""
    import kbert.backend
    from kbert.optimizers import WarmupLinearDecay

    computed = []
    original = WarmupLinearDecay._rate_at
    monkeypatch.setattr(
        WarmupLinearDecay, "_rate_at", lambda self, step: computed.append(1) or original(self, step)
    )
    initial, grads = _problem(num_steps=3)
    optimizer = bert_optimizer(**SETTINGS)
    variables = [keras.Variable(p, name=name) for p, name in zip(initial, NAMES)]
    for step_grads in grads:
        optimizer.apply([keras.ops.convert_to_tensor(g) for g in step_grads], variables)
    once = kbert.backend.has_multi_tensor_adamw()
    assert len(computed) == len(grads) if once else len(computed) >= 2 * len(grads)
    # Outside an update the rate follows the step again (what a callback logs).
    rate = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
    assert rate == pytest.approx(_bert_schedule()(len(grads)), rel=1e-6)
    first = _bert_schedule()(1)  # (step 0's rate is 0 in the warm-up)
    wrong = {"one rate at every step": _reference(initial, grads, lambda step: first)}
    _assert_matches_only(variables, _reference(initial, grads, _bert_schedule()), wrong)


def test_an_update_in_one_call_keeps_keras_decay_exclusions_and_clipping(monkeypatch):
    """On torch a plain update (no accumulation, EMA, loss scale, per-variable clipping or
    constraint) is one backend call: clipping, the decay of the variables Keras' rule decays
    (excluded by object, and by name, each call replacing the last) and the update. Every
    backend gives the reference's weights; an update with a constraint runs Keras' `apply`."""
    import kbert.backend
    from kbert.backend import paths

    calls = []
    original = paths.adamw_update
    monkeypatch.setattr(
        paths,
        "adamw_update",
        lambda *args, **kwargs: calls.append(kwargs.get("decays")) or original(*args, **kwargs),
    )
    monkeypatch.setattr(kbert.backend, "adamw_update", paths.adamw_update)
    initial, grads = _varying_problem(seed=5)
    schedule = _bert_schedule()
    settings = dict(weight_decay=0.1, epsilon=1e-6, global_clipnorm=1.0)
    variables = [keras.Variable(p, name=name) for p, name in zip(initial, NAMES)]
    optimizer = BertAdamW(learning_rate=WarmupLinearDecay(3e-2, 8, warmup_steps=2), **settings)
    optimizer.exclude_from_weight_decay(var_names=["kernel"])  # replaced by the next call
    optimizer.exclude_from_weight_decay(var_list=[variables[0]], var_names="gamma")
    for step_grads in grads:
        optimizer.apply([keras.ops.convert_to_tensor(g) for g in step_grads], variables)
    reference = dict(rate=schedule, decayed=("bias",))
    first_only = ("bias", "gamma")  # what the first call alone leaves decayed
    wrong = {
        "the second call ignored": _reference(initial, grads, schedule, decayed=first_only),
        "no clipping": _reference(initial, grads, **reference, clip=None),
        "every variable decayed": _reference(initial, grads, schedule, decayed=NAMES),
    }
    _assert_matches_only(variables, _reference(initial, grads, **reference), wrong)
    if kbert.backend.has_multi_tensor_adamw():
        # The first `apply` builds the optimizer (Keras' `apply`); the others are one call each.
        assert calls[1:] == [[False, True, False]] * (len(grads) - 1)

    calls.clear()
    constrained = [keras.Variable(p, name=name) for p, name in zip(initial, NAMES)]
    constrained[1].constraint = keras.constraints.MaxNorm(0.5)
    optimizer = BertAdamW(learning_rate=3e-2, **settings)
    for step_grads in grads[:3]:
        optimizer.apply([keras.ops.convert_to_tensor(g) for g in step_grads], constrained)
    assert np.linalg.norm(keras.ops.convert_to_numpy(constrained[1])) <= 0.5 + 1e-6
    assert all(decays is None for decays in calls)  # Keras' `apply`: per-variable updates


def test_ema_loss_scale_and_a_new_variable_order_each_keep_keras_update():
    """Each setting the one-call update leaves to Keras' `apply`, alone: EMA, and a loss
    scale (Keras clips after unscaling); and a reordered variable list, whose decay mask is
    found again."""
    initial, grads = _varying_problem(seed=6)
    settings = dict(learning_rate=1e-2, weight_decay=0.1, epsilon=1e-6)
    constant = dict(rate=lambda step: 1e-2)

    optimizer = BertAdamW(use_ema=True, ema_momentum=0.5, **settings)
    optimizer.exclude_from_weight_decay(var_names=["bias", "gamma"])
    variables = _train(optimizer, initial, grads)
    optimizer.finalize_variable_values(variables)
    _, averages = _reference(initial, grads, **constant, clip=None, ema_momentum=0.5)
    unaveraged = _reference(initial, grads, **constant, clip=None)
    _assert_matches_only(variables, averages, {"no EMA": unaveraged})

    optimizer = BertAdamW(global_clipnorm=1.0, loss_scale_factor=64.0, **settings)
    optimizer.exclude_from_weight_decay(var_names=["bias", "gamma"])
    variables = _train(optimizer, initial, grads, scale=64.0)
    scaled_clip = _reference(initial, grads, **constant, clip=("global", 1.0 / 64))
    _assert_matches_only(
        variables,
        _reference(initial, grads, **constant),
        {"clipping before unscaling": scaled_clip},
    )

    optimizer = BertAdamW(global_clipnorm=1.0, **settings)
    optimizer.exclude_from_weight_decay(var_names=["bias", "gamma"])
    variables = [keras.Variable(p, name=name) for p, name in zip(initial, NAMES)]
    for step, step_grads in enumerate(grads):
        order = [0, 1, 2] if step < 3 else [2, 1, 0]
        optimizer.apply(
            [keras.ops.convert_to_tensor(step_grads[i]) for i in order],
            [variables[i] for i in order],
        )
    # A mask kept from the first order would decay gamma instead of the kernel.
    _assert_matches_only(
        variables,
        _reference(initial, grads, **constant),
        {"every variable decayed": _reference(initial, grads, **constant, decayed=NAMES)},
    )


def test_schedule_edges_follow_the_stated_rule():
    """Warm-up from `warmup_ratio` rounds; no warm-up starts at the peak; a planned length
    rounds micro-batches up to whole updates, and a warm-up longer than the plan is cut to it;
    a schedule of no steps is refused."""

    def rate(schedule, step):
        return float(keras.ops.convert_to_numpy(schedule(step)))

    ratio = WarmupLinearDecay(1.0, total_steps=15, warmup_ratio=0.1)  # 1.5 warm-up steps
    assert ratio.warmup_steps == 2 and rate(ratio, 1) == pytest.approx(0.5)
    with ratio.reused():  # one update's rate is computed once, another step's anew
        assert [rate(ratio, 1), rate(ratio, 1), rate(ratio, 10)] == pytest.approx(
            [0.5, 0.5, 5 / 13]
        )
    assert rate(WarmupLinearDecay(1.0, total_steps=10, warmup_steps=0), 0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="total_steps=0"):
        WarmupLinearDecay(1.0, total_steps=0)

    schedule = planned_schedule(bert_optimizer(1.0, warmup_steps=5, gradient_accumulation_steps=2))
    schedule.plan(7)  # 7 micro-batches: 4 updates, the last of one micro-batch
    assert schedule.planned_length() == (4, 4)
    assert [rate(schedule, micro) for micro in (0, 2, 4, 6)] == pytest.approx([0, 0.25, 0.5, 0.75])


@pytest.mark.parametrize("clip", [("each", 0.5), ("global", 1.0)])
def test_replicas_clip_their_summed_gradient_and_each_applies_its_share(monkeypatch, clip):
    """Over several TensorFlow replicas `BertAdamW` clips the replicas' summed gradient (as
    one worker clips its whole batch's) and gives each replica `1 / replicas` of it, which
    Keras adds up again. Simulated: two replicas with the same gradient, whose sum
    `replicas_gradient_sum` returns; without a strategy the one share is the update.
    A large epsilon makes the update depend on the gradient's scale, which Adam otherwise
    cancels."""
    import kbert.backend

    monkeypatch.setattr(
        kbert.backend, "replicas_gradient_sum", lambda grads: ([g * 2.0 for g in grads], 2)
    )
    initial, grads = _varying_problem(seed=7)
    kind, norm = clip
    setting = {"clipnorm" if kind == "each" else "global_clipnorm": norm}
    optimizer = BertAdamW(learning_rate=1e-2, weight_decay=0.1, epsilon=1e-3, **setting)
    optimizer.exclude_from_weight_decay(var_names=["bias", "gamma"])
    variables = _train(optimizer, initial, grads)
    reference = dict(rate=lambda step: 1e-2, epsilon=1e-3)
    # The share of a sum clipped to `norm` is the gradient clipped to `norm / 2`.
    expected = _reference(initial, grads, **reference, clip=(kind, norm / 2))
    wrong = {
        "each replica clipped alone": _reference(initial, grads, **reference, clip=clip),
        "the whole sum applied": _reference(
            initial,
            [[2 * g for g in step] for step in grads],
            **reference,
            clip=clip,
        ),
    }
    _assert_matches_only(variables, expected, wrong)
