"""BERT's optimizer: AdamW (or LAMB) with linear warm-up and linear decay."""

import contextlib
import re

import keras
import numpy as np
from keras import ops

from kbert import backend
from kbert.optimizers.lamb import Lamb
from kbert.optimizers.slots import SlotIndex

# Variables that BERT excludes from weight decay: biases and LayerNorm scale/offset.
NO_DECAY_VARIABLE_NAMES = ["bias", "gamma", "beta"]


@keras.saving.register_keras_serializable(package="kbert")
class WarmupLinearDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up from 0 to `peak_learning_rate`, then linear decay to `end_learning_rate`.

    Two ways to give the schedule its length:

    - **fixed**: `total_steps` (and `warmup_steps`, else `warmup_ratio * total_steps`) given
      here. The rate reaches `end_learning_rate` at `total_steps` and stays there.
    - **planned** (`total_steps=None`): the length is set just before training by
      `plan(num_steps, start_step)`; kbert's task models call it at the start of every `fit`
      with the number of steps that `fit` will run (epochs x steps per epoch), as Hugging
      Face's `Trainer.train()` does. Warm-up is `warmup_steps` if given, else
      `round(warmup_ratio * num_steps)`. The planned length lives in two non-trainable
      variables of the optimizer (`track(optimizer)`, which `bert_optimizer` calls), so the
      compiled training step reads it on every backend and planning never recompiles. Until
      `plan` is called (or when the schedule is not tracked) the rate is `peak_learning_rate`.

    Args:
        peak_learning_rate: float. The rate at the end of warm-up.
        total_steps: int or `None`. Number of training steps of the whole schedule; `None`
            for a planned schedule. Defaults to `None`.
        warmup_steps: int or `None`. Number of warm-up steps; `None` uses `warmup_ratio`.
            Defaults to `None`.
        warmup_ratio: float. Warm-up as a fraction of the schedule's length when
            `warmup_steps` is `None`. Defaults to `0.0`.
        end_learning_rate: float. Defaults to `0.0`.
        accumulation_steps: int. Micro-batches per optimizer update. An optimizer with
            `gradient_accumulation_steps=k` calls its schedule with the number of
            micro-batches seen; the schedule then advances once every `k` of them, so
            `warmup_steps` and `total_steps` keep counting updates. Defaults to `1`.

    Example:
    >>> schedule = WarmupLinearDecay(1e-4, total_steps=1000, warmup_steps=100)
    >>> round(float(schedule(50)), 10)  # half-way through warm-up
    5e-05
    """

    def __init__(
        self,
        peak_learning_rate,
        total_steps=None,
        warmup_steps=None,
        warmup_ratio=0.0,
        end_learning_rate=0.0,
        accumulation_steps=1,
    ):
        if total_steps is not None and (not isinstance(total_steps, int) or total_steps < 1):
            raise ValueError(
                "`total_steps` must be a positive integer or None. Received: "
                f"total_steps={total_steps!r}"
            )
        if warmup_steps is not None and (not isinstance(warmup_steps, int) or warmup_steps < 0):
            raise ValueError(
                "`warmup_steps` must be an integer >= 0 or None. Received: "
                f"warmup_steps={warmup_steps!r}"
            )
        if not 0 <= warmup_ratio <= 1:
            raise ValueError(
                f"`warmup_ratio` must lie in [0, 1]. Received: warmup_ratio={warmup_ratio}"
            )
        if total_steps is not None and warmup_steps is None:
            warmup_steps = int(round(total_steps * warmup_ratio))
        if total_steps is not None and warmup_steps > total_steps:
            raise ValueError(
                "Expected 0 <= warmup_steps <= total_steps. "
                f"Received: total_steps={total_steps}, warmup_steps={warmup_steps}"
            )
        if not isinstance(accumulation_steps, int) or accumulation_steps < 1:
            raise ValueError(
                "`accumulation_steps` must be a positive integer. "
                f"Received: accumulation_steps={accumulation_steps!r}"
            )
        self.accumulation_steps = accumulation_steps
        self.peak_learning_rate = peak_learning_rate
        self.total_steps = total_steps
        self.warmup_steps = warmup_steps
        self.warmup_ratio = warmup_ratio
        self.end_learning_rate = end_learning_rate
        self._planned_start = None  # optimizer step (micro-batches) where the plan begins
        self._planned_steps = None  # length of the plan, in updates; 0 = not planned yet
        self._reused = None  # `(step, rate)` inside `reused()`, else None

    @property
    def planned(self):
        """True when the length is set by `plan` (built with `total_steps=None`)."""
        return self.total_steps is None

    def track(self, optimizer):
        """Creates the planned length's variables in `optimizer` (once; a fixed schedule has none).

        They are ordinary non-trainable optimizer variables: saved and restored with the
        optimizer's state, and passed to the compiled training step like its iteration count.
        """
        if not self.planned or self._planned_steps is not None:
            return
        self._planned_start = optimizer.add_variable(
            (), initializer="zeros", dtype="float32", name="schedule_start_step"
        )
        self._planned_steps = optimizer.add_variable(
            (), initializer="zeros", dtype="float32", name="schedule_num_steps"
        )
        optimizer.kbert_schedule = self  # found again by `planned_schedule(optimizer)`

    def plan(self, num_steps, start_step=0):
        """Sets a planned schedule to span `num_steps` training steps from `start_step` on.

        Args:
            num_steps: int >= 1. Batches (micro-batches with gradient accumulation) to train.
            start_step: int. The optimizer's `iterations` when that training starts.
        """
        if not self.planned:
            raise ValueError(
                f"This schedule has a fixed length (total_steps={self.total_steps}); only a "
                "schedule built with total_steps=None is planned."
            )
        if self._planned_steps is None:
            raise ValueError(
                "Call `schedule.track(optimizer)` (done by `bert_optimizer`) before `plan`."
            )
        if not isinstance(num_steps, (int, np.integer)) or num_steps < 1:
            raise ValueError(
                f"`num_steps` must be a positive integer. Received: num_steps={num_steps!r}"
            )
        updates = -(-int(num_steps) // self.accumulation_steps)
        self._planned_start.assign(float(start_step))
        self._planned_steps.assign(float(updates))

    def planned_length(self):
        """`(total_steps, warmup_steps)` of the current plan in updates (`(0, 0)` before `plan`)."""
        if not self.planned:
            return self.total_steps, self.warmup_steps
        if self._planned_steps is None:
            return 0, 0
        total = int(round(float(np.asarray(ops.convert_to_numpy(self._planned_steps)))))
        return total, self._warmup_of(total)

    def _warmup_of(self, total):
        if self.warmup_steps is not None:
            return min(self.warmup_steps, total)
        return int(round(total * self.warmup_ratio))

    @contextlib.contextmanager
    def reused(self):
        """Within it, a call with the same `step` object as the first call returns that call's
        rate without computing it again. One optimizer update asks for its rate more than
        once (Keras' weight decay, then the update) at the same step; on eager torch each
        computation is some 20 small ops."""
        self._reused = ()
        try:
            yield
        finally:
            self._reused = None

    def __call__(self, step):
        reused = self._reused
        if reused and reused[0] is step:
            return reused[1]
        rate = self._rate_at(step)
        if reused is not None:
            self._reused = (step, rate)
        return rate

    def _rate_at(self, step):
        peak = ops.cast(self.peak_learning_rate, "float32")
        if not self.planned:
            if self.accumulation_steps > 1:
                step = ops.floor_divide(step, self.accumulation_steps)
            return self._rate(
                ops.cast(step, "float32"), float(self.total_steps), float(self.warmup_steps)
            )
        if self._planned_steps is None:
            return peak
        step = ops.cast(step, "float32") - self._planned_start
        if self.accumulation_steps > 1:
            step = ops.floor_divide(step, float(self.accumulation_steps))
        total = ops.cast(self._planned_steps, "float32")
        if self.warmup_steps is not None:
            warmup = ops.minimum(float(self.warmup_steps), total)
        else:
            # round half to even, as Python's round() used by `planned_length`
            warmup = ops.round(total * self.warmup_ratio)
        return ops.where(total > 0, self._rate(step, total, warmup), peak)

    def _rate(self, step, total, warmup):
        peak = ops.cast(self.peak_learning_rate, "float32")
        warming = peak * step / ops.maximum(warmup, 1.0)
        progress = ops.minimum((step - warmup) / ops.maximum(total - warmup, 1.0), 1.0)
        decaying = peak + (self.end_learning_rate - peak) * progress
        return ops.where(step < warmup, warming, decaying)

    def get_config(self):
        return {
            "peak_learning_rate": self.peak_learning_rate,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "warmup_ratio": self.warmup_ratio,
            "end_learning_rate": self.end_learning_rate,
            "accumulation_steps": self.accumulation_steps,
        }


class _PendingUpdate:
    """The `update_step` calls of one multi-tensor update, collected until the last one."""

    def __init__(self, expected):
        self.expected = expected
        self.gradients = []
        self.variables = []
        self.learning_rate = None


def _clipped(grads, clipnorm, global_clipnorm, clipvalue):
    """Keras' optimizer clipping (`clipnorm` per tensor, else `global_clipnorm`, else
    `clipvalue`) of a list of gradients (`None` kept)."""
    present = [g for g in grads if g is not None]
    if clipnorm and clipnorm > 0:
        scaled = [
            g * ops.minimum(1.0, clipnorm / ops.maximum(ops.sqrt(ops.sum(ops.square(g))), 1e-12))
            for g in present
        ]
    elif global_clipnorm and global_clipnorm > 0:
        norm = ops.sqrt(sum(ops.sum(ops.square(g)) for g in present))
        factor = global_clipnorm / ops.maximum(norm, global_clipnorm)
        scaled = [g * ops.cast(factor, g.dtype) for g in present]
    elif clipvalue and clipvalue > 0:
        scaled = [ops.clip(g, -clipvalue, clipvalue) for g in present]
    else:
        scaled = present
    out = iter(scaled)
    return [None if g is None else next(out) for g in grads]


@keras.saving.register_keras_serializable(package="kbert")
class BertAdamW(keras.optimizers.AdamW):
    """AdamW whose epsilon is added after bias correction, as `torch.optim.AdamW` adds it.

    Keras' `Adam` adds `epsilon` to the uncorrected `sqrt(v)`, which equals adding
    `epsilon / sqrt(1 - beta_2**t)` to the corrected one: 32x `epsilon` at the first step,
    still 2x after 250 steps. With BERT's `epsilon=1e-6` and fine-tuning's small gradients,
    that damps the early updates noticeably. This class computes the update of PyTorch's
    AdamW (and so of Hugging Face fine-tuning recipes) exactly:

        m = beta_1 * m + (1 - beta_1) * g,  v = beta_2 * v + (1 - beta_2) * g**2
        m_hat = m / (1 - beta_1**t),  v_hat = v / (1 - beta_2**t)
        variable -= learning_rate * m_hat / (sqrt(v_hat) + epsilon)

    Everything around the update is Keras' `Optimizer.apply`, unchanged: loss scaling,
    `clipnorm`/`clipvalue`/`global_clipnorm`, gradient accumulation, the decoupled weight
    decay (`variable *= 1 - learning_rate * weight_decay` before the update, except for the
    variables given to `exclude_from_weight_decay`), EMA and constraints. The moments are
    this class' own optimizer variables (`momentum` and `velocity` per trainable variable,
    made in `build` in the order of Keras' `Adam`, so a checkpoint of either loads into the
    other); they are in `optimizer.variables` and saved and restored with it.

    On the torch backend all variables are updated at once by `torch.optim.AdamW`'s fused
    kernel (`kbert.backend.adamw_update`) rather than by one `update_step` of ~15
    eager ops per variable: `apply` collects the `update_step` calls of one update and runs
    them together when the last one arrives, that is before Keras' EMA and constraints, as
    the per-variable form would. Global-norm clipping runs there at once too
    (`kbert.backend.clip_by_global_norm`: one multi-tensor norm on a GPU instead of two ops
    per variable, Keras' scale; a train step's own `.grad` tensors scaled in place) before
    Keras' `apply`, when nothing Keras does first changes the gradients (no gradient
    accumulation, no loss scale factor). BERT's schedule (`WarmupLinearDecay`) is computed
    once per update there, where Keras asks for the rate twice (`WarmupLinearDecay.reused`).
    A plain update (the optimizer built, a gradient for each of its variables, no gradient
    accumulation, loss scale, `clipnorm`/`clipvalue`, EMA, constraint or variable that takes
    its gradient as value) is then one backend call: the clipping, the decoupled weight decay
    of the variables Keras' rule decays (inside torch's fused kernel, one parameter group
    with the decay and one without) and the update, then the step count, without Keras'
    `apply` around it; every other update goes through Keras' `apply` as above.
    Only public Keras hooks are used (`build`, `update_step`, `apply`,
    `add_optimizer_variables`).

    Args:
        exclude_from_weight_decay: list of str or `None`. Variable names (substrings, as for
            `Optimizer.exclude_from_weight_decay(var_names=...)`) that take no weight decay;
            saved in the config. Defaults to `None`.
        **kwargs: the arguments of `keras.optimizers.AdamW`, except `amsgrad=True`.

    Example:
    >>> optimizer = BertAdamW(
    ...     learning_rate=2e-5, weight_decay=0.01, epsilon=1e-6,
    ...     exclude_from_weight_decay=["bias", "gamma", "beta"],
    ... )
    """

    def __init__(self, *args, exclude_from_weight_decay=None, **kwargs):
        super().__init__(*args, **kwargs)
        rate = kwargs.get("learning_rate", args[0] if args else None)
        # The schedule whose rate one multi-tensor update computes once (see `apply`).
        self._rate_schedule = rate if isinstance(rate, WarmupLinearDecay) else None
        if self.amsgrad:
            raise ValueError("`BertAdamW` does not implement AMSGrad. Received: amsgrad=True")
        self._slot_index = None
        self._pending = None
        self.no_decay_names = []
        # The exclusions of the last `exclude_from_weight_decay` call, as Keras keeps them
        # (each call replaces the last): ids of variables, and the names' pattern or None.
        self._decay_exclusions = (frozenset(), None)
        # `(ids, decays)` of the variables last found fit for `_apply_directly`.
        self._direct_checked = None
        if exclude_from_weight_decay:
            self.exclude_from_weight_decay(var_names=exclude_from_weight_decay)

    def exclude_from_weight_decay(self, var_list=None, var_names=None):
        """Keras' `exclude_from_weight_decay`; the `var_names` are also kept in the config.

        Keras' `AdamW` forgets its exclusions on a `.keras` save/load, so a reloaded
        optimizer would decay biases and LayerNorm parameters; this one restores `var_names`
        (the exclusions by variable object, `var_list`, cannot be saved).
        """
        if isinstance(var_names, str):
            var_names = [var_names]  # (Keras would match each of its characters)
        super().exclude_from_weight_decay(var_list=var_list, var_names=var_names)
        self._decay_exclusions = (
            frozenset(id(v) for v in var_list or ()),
            re.compile("|".join(set(var_names))) if var_names else None,
        )
        if var_names:
            self.no_decay_names = self.no_decay_names + [
                n for n in var_names if n not in self.no_decay_names
            ]

    def get_config(self):
        config = super().get_config()
        config["exclude_from_weight_decay"] = list(self.no_decay_names)
        return config

    def build(self, var_list):
        if self.built:
            return
        # Keras' `Optimizer.build` (accumulators, EMA averages, iteration bookkeeping), then this
        # class' own moments. Not `Adam.build`: the moments it makes are private to Keras' Adam.
        keras.optimizers.Optimizer.build(self, var_list)
        self.momentums, self.velocities = self.add_optimizer_variables(
            var_list, ["momentum", "velocity"]
        )
        self._slot_index = SlotIndex(var_list)

    def moments(self, variable):
        """`(m, v)`: the first- and second-moment variables of the trainable `variable`."""
        if self._slot_index is None:
            raise ValueError(
                "The optimizer has no moments before it is built (by `build` or `apply`)."
            )
        position = self._slot_index(variable)
        return self.momentums[position], self.velocities[position]

    def apply(self, grads, trainable_variables=None):
        if self.clipnorm or self.global_clipnorm or self.clipvalue:
            summed, replicas = backend.replicas_gradient_sum(grads)
            if summed is not None:
                return self._apply_clipped_sum(summed, replicas, trainable_variables)
        if not backend.has_multi_tensor_adamw():
            return super().apply(grads, trainable_variables)
        schedule = self._rate_schedule
        with schedule.reused() if schedule is not None else contextlib.nullcontext():
            if self._updates_directly(grads, trainable_variables):
                return self._apply_directly(list(grads), list(trainable_variables))
            return self._apply_at_once(grads, trainable_variables)

    def _updates_directly(self, grads, trainable_variables):
        """Whether this update is one call of `backend.adamw_update` (`_apply_directly`): a
        built optimizer given its own variables, a gradient for each, and none of what Keras'
        `apply` adds around the update (gradient accumulation, a loss scale, per-variable or
        value clipping, EMA, constraints, variables that take their gradient as value)."""
        if (
            not self.built
            or trainable_variables is None
            or self.gradient_accumulation_steps
            or self.loss_scale_factor is not None
            or self.clipnorm
            or self.clipvalue
            or self.use_ema
            or len(grads) != len(trainable_variables)
            or any(g is None for g in grads)
        ):
            return False
        key = tuple(map(id, trainable_variables))
        if self._direct_checked is None or self._direct_checked[0] != key:
            try:
                for variable in trainable_variables:
                    self._slot_index(variable)
            except ValueError:  # Not built with it: Keras' `apply` raises its own error.
                return False
            self._direct_checked = (key, self._decays(trainable_variables))
        return not any(
            v.constraint is not None or getattr(v, "overwrite_with_gradient", False)
            for v in trainable_variables
        )

    def _apply_directly(self, grads, variables):
        """Keras' `apply` for an update `_updates_directly` accepts, in one backend call:
        global-norm clipping, the decoupled weight decay of the variables that take it and
        BERT's update of every variable (`backend.adamw_update`), then the step count."""
        backend.adamw_update(
            self,
            grads,
            variables,
            self.learning_rate,
            clip_norm=self.global_clipnorm if self.global_clipnorm else None,
            decays=self._direct_checked[1] if self.weight_decay else [False] * len(variables),
        )
        self.iterations.assign_add(1)

    def _decays(self, variables):
        """Whether each variable takes the weight decay: Keras' rule (not excluded by object
        or by a name pattern of `exclude_from_weight_decay`; no decay at all without
        `weight_decay`, which `_apply_directly` checks at each update)."""
        ids, pattern = self._decay_exclusions
        return [
            id(v) not in ids and (pattern is None or pattern.search(v.name) is None)
            for v in variables
        ]

    def _apply_at_once(self, grads, trainable_variables):
        """`apply` on the multi-tensor update (`backend.adamw_update`)."""
        variables = trainable_variables
        if variables is None:
            variables = self._slot_index.variables if self._slot_index is not None else ()
        variables = list(variables)
        if self._clips_at_once(grads, variables):
            return self._apply_clipped_at_once(grads, variables, trainable_variables)
        # Keras calls `update_step` once per variable with a gradient (it skips `None` gradients
        # and variables that take their gradient as value), or not at all (accumulating steps).
        expected = sum(
            1
            for gradient, variable in zip(grads, variables)
            if gradient is not None and not getattr(variable, "overwrite_with_gradient", False)
        )
        self._pending = _PendingUpdate(expected)
        try:
            result = super().apply(grads, trainable_variables)
            if self._pending.variables:  # Fewer calls than counted: still the exact update.
                self._run_pending()
            return result
        finally:
            self._pending = None

    def _clips_at_once(self, grads, variables):
        """Whether this step's global-norm clipping can run before Keras' `apply`, all at once
        (`backend.clip_by_global_norm`): the step clips by global norm only, updates the
        variables it is given now (no gradient accumulation) and has no loss scale to undo
        first (Keras clips after unscaling)."""
        return bool(
            self.global_clipnorm
            and self.global_clipnorm > 0
            and not self.clipnorm
            and not self.clipvalue
            and not self.gradient_accumulation_steps
            and self.loss_scale_factor is None
            and len(variables) == len(grads)
        )

    def _apply_clipped_at_once(self, grads, variables, trainable_variables):
        """Keras' global-norm clipping of the gradients Keras would clip (not `None`, not of a
        variable that takes its gradient as value), computed at once on the backend, then
        Keras' `apply` with its own clipping off for this call."""
        clipped_ones = [
            g is not None and not getattr(v, "overwrite_with_gradient", False)
            for g, v in zip(grads, variables)
        ]
        clipped = backend.clip_by_global_norm(
            [g if c else None for g, c in zip(grads, clipped_ones)],
            self.global_clipnorm,
            variables,
        )
        grads = [new if c else g for new, g, c in zip(clipped, grads, clipped_ones)]
        clip_norm, self.global_clipnorm = self.global_clipnorm, None
        try:
            return self.apply(grads, trainable_variables)
        finally:
            self.global_clipnorm = clip_norm

    def _apply_clipped_sum(self, summed, replicas, trainable_variables):
        """Over several TensorFlow replicas: clips the global gradient `summed` (as one worker
        clips its whole batch's) and hands each replica `1 / replicas` of it, which Keras sums
        over the replicas again, with Keras' own clipping off for this call."""
        clipped = _clipped(summed, self.clipnorm, self.global_clipnorm, self.clipvalue)
        shares = [None if g is None else g / replicas for g in clipped]
        settings = self.clipnorm, self.global_clipnorm, self.clipvalue
        self.clipnorm = self.global_clipnorm = self.clipvalue = None
        try:
            return super().apply(shares, trainable_variables)
        finally:
            self.clipnorm, self.global_clipnorm, self.clipvalue = settings

    def update_step(self, gradient, variable, learning_rate):
        pending = self._pending
        if pending is not None:
            pending.gradients.append(gradient)
            pending.variables.append(variable)
            pending.learning_rate = learning_rate
            if len(pending.variables) == pending.expected:
                self._run_pending()
            return
        dtype = variable.dtype
        m, v = self.moments(variable)
        learning_rate = ops.cast(learning_rate, dtype)
        gradient = ops.cast(gradient, dtype)
        step = ops.cast(self.iterations + 1, dtype)
        beta_1_power = ops.power(ops.cast(self.beta_1, dtype), step)
        beta_2_power = ops.power(ops.cast(self.beta_2, dtype), step)
        self.assign_add(m, ops.multiply(ops.subtract(gradient, m), 1 - self.beta_1))
        self.assign_add(v, ops.multiply(ops.subtract(ops.square(gradient), v), 1 - self.beta_2))
        correction_2 = ops.sqrt(1 - beta_2_power)
        step_size = learning_rate * correction_2 / (1 - beta_1_power)
        # sqrt(v_hat) + eps == (sqrt(v) + eps * sqrt(1 - beta_2**t)) / sqrt(1 - beta_2**t)
        denominator = ops.add(ops.sqrt(v), self.epsilon * correction_2)
        self.assign_sub(variable, ops.divide(ops.multiply(m, step_size), denominator))

    def _run_pending(self):
        pending = self._pending
        gradients, variables = pending.gradients, pending.variables
        pending.gradients, pending.variables = [], []
        backend.adamw_update(self, gradients, variables, pending.learning_rate)


def bert_optimizer(
    learning_rate=1e-4,
    total_steps=None,
    warmup_steps=None,
    warmup_ratio=0.01,
    weight_decay=0.01,
    beta_1=0.9,
    beta_2=0.999,
    epsilon=1e-6,
    global_clipnorm=1.0,
    optimizer="adamw",
    gradient_accumulation_steps=None,
    torch_epsilon=True,
):
    """The optimizer of the BERT paper: AdamW (decoupled decay) or LAMB, warm-up + linear decay.

    Weight decay skips biases and LayerNorm parameters, as in the original. Gradients are
    clipped to a global norm of 1.0, as in the original.

    Args:
        learning_rate: float. Peak learning rate. Defaults to `1e-4` (pretraining).
        total_steps: int or None. Length of the schedule in steps. `None` (the default)
            leaves the length to be planned: kbert's task models (`BertClassifier`,
            `BertPretrainer`, ...) set it at the start of each `fit` to the steps that `fit`
            runs (see `WarmupLinearDecay.plan`); with other models the rate stays at
            `learning_rate` until `optimizer.learning_rate_schedule.plan(...)` is called.
            The paper's pretraining: `1_000_000`.
        warmup_steps: int or None. Warm-up steps; `None` uses `warmup_ratio`.
        warmup_ratio: float. Warm-up as a fraction of the schedule's length (the paper:
            10k of 1M). Defaults to `0.01`.
        weight_decay: float. Defaults to `0.01`.
        beta_1, beta_2, epsilon: Adam moments. Defaults to `0.9`, `0.999`, `1e-6`.
        global_clipnorm: float or None. Defaults to `1.0`.
        optimizer: `"adamw"` or `"lamb"`. Defaults to `"adamw"`.
        gradient_accumulation_steps: int >= 2 or None. Average the gradients of this many
            consecutive batches (micro-batches) and update once: the update of a batch `k`
            times larger at the activation memory of one micro-batch. Steps of the schedule
            (`total_steps`, `warmup_steps`) count updates, not micro-batches. Clipping and
            weight decay apply to the averaged update. Defaults to `None` (update every batch).
        torch_epsilon: bool. AdamW only: add `epsilon` after bias correction, as PyTorch and
            Hugging Face do (`BertAdamW`), rather than before it, as Keras' `AdamW` does.
            Fine-tuning then follows the reference's training curve. Defaults to `True`.

    Example:
    >>> optimizer = bert_optimizer(5e-5, total_steps=2000, warmup_ratio=0.1)
    >>> # Batches of 8, one update per 4 of them (an effective batch of 32):
    >>> optimizer = bert_optimizer(5e-5, total_steps=2000, gradient_accumulation_steps=4)
    """
    if gradient_accumulation_steps is not None and (
        not isinstance(gradient_accumulation_steps, int) or gradient_accumulation_steps < 2
    ):
        raise ValueError(
            "`gradient_accumulation_steps` must be None or an integer >= 2. "
            f"Received: gradient_accumulation_steps={gradient_accumulation_steps!r}"
        )
    schedule = WarmupLinearDecay(
        learning_rate,
        total_steps=total_steps,
        warmup_steps=warmup_steps,
        warmup_ratio=warmup_ratio,
        accumulation_steps=gradient_accumulation_steps or 1,
    )
    common = dict(
        learning_rate=schedule,
        beta_1=beta_1,
        beta_2=beta_2,
        epsilon=epsilon,
        weight_decay=weight_decay,
        global_clipnorm=global_clipnorm,
        gradient_accumulation_steps=gradient_accumulation_steps,
    )
    if optimizer == "adamw":
        if torch_epsilon:
            result = BertAdamW(**common, exclude_from_weight_decay=NO_DECAY_VARIABLE_NAMES)
        else:
            result = keras.optimizers.AdamW(**common)
            result.exclude_from_weight_decay(var_names=NO_DECAY_VARIABLE_NAMES)
    elif optimizer == "lamb":  # Decay inside the trust ratio, as in You et al.
        result = Lamb(**common, exclude_from_weight_decay=NO_DECAY_VARIABLE_NAMES)
    else:
        raise ValueError(
            f'`optimizer` must be "adamw" or "lamb". Received: optimizer={optimizer!r}'
        )
    schedule.track(result)
    return result


def planned_schedule(optimizer):
    """The optimizer's `WarmupLinearDecay` if its length is planned by `fit`, else `None`.

    Finds schedules registered by `WarmupLinearDecay.track` (as `bert_optimizer` does), also
    behind a `keras.optimizers.LossScaleOptimizer` (mixed float16).
    """
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)
    schedule = getattr(optimizer, "kbert_schedule", None)
    return schedule if isinstance(schedule, WarmupLinearDecay) and schedule.planned else None
