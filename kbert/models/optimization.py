"""BERT's optimizer: AdamW (or LAMB) with linear warm-up and linear decay."""

import keras
from keras import ops

from kbert import backend_paths

# Variables that BERT excludes from weight decay: biases and LayerNorm scale/offset.
NO_DECAY_VARIABLE_NAMES = ["bias", "gamma", "beta"]


@keras.saving.register_keras_serializable(package="kbert")
class WarmupLinearDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up from 0 to `peak_learning_rate` over `warmup_steps`, then linear decay.

    The rate reaches `end_learning_rate` at `total_steps` and stays there.

    Args:
        peak_learning_rate: float. The rate at the end of warm-up.
        total_steps: int. Number of training steps of the whole schedule.
        warmup_steps: int. Number of warm-up steps.
        end_learning_rate: float. Defaults to `0.0`.
        accumulation_steps: int. Micro-batches per optimizer update. An optimizer with
            `gradient_accumulation_steps=k` calls its schedule with the number of
            micro-batches seen; the schedule then advances once every `k` of them, so
            `warmup_steps` and `total_steps` keep counting updates. Defaults to `1`.

    Example:
    >>> schedule = WarmupLinearDecay(1e-4, total_steps=1000, warmup_steps=100)
    >>> float(schedule(50))  # half-way through warm-up
    5e-05
    """

    def __init__(
        self,
        peak_learning_rate,
        total_steps,
        warmup_steps,
        end_learning_rate=0.0,
        accumulation_steps=1,
    ):
        if total_steps < 1 or warmup_steps < 0 or warmup_steps > total_steps:
            raise ValueError(
                "Expected 0 <= warmup_steps <= total_steps and total_steps >= 1. "
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
        self.end_learning_rate = end_learning_rate

    def __call__(self, step):
        if self.accumulation_steps > 1:
            step = ops.floor_divide(step, self.accumulation_steps)
        step = ops.cast(step, "float32")
        peak = ops.cast(self.peak_learning_rate, "float32")
        warmup = ops.cast(max(self.warmup_steps, 1), "float32")
        decay_steps = ops.cast(max(self.total_steps - self.warmup_steps, 1), "float32")
        warming = peak * step / warmup
        progress = ops.minimum((step - self.warmup_steps) / decay_steps, 1.0)
        decaying = peak + (self.end_learning_rate - peak) * progress
        return ops.where(step < self.warmup_steps, warming, decaying)

    def get_config(self):
        return {
            "peak_learning_rate": self.peak_learning_rate,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "end_learning_rate": self.end_learning_rate,
            "accumulation_steps": self.accumulation_steps,
        }


@keras.saving.register_keras_serializable(package="kbert")
class BertAdamW(keras.optimizers.AdamW):
    """AdamW whose epsilon is added after bias correction, as `torch.optim.AdamW` adds it.

    Keras' `Adam` adds `epsilon` to the uncorrected `sqrt(v)`, which equals adding
    `epsilon / sqrt(1 - beta_2**t)` to the corrected one: 32x `epsilon` at the first step,
    still 2x after 250 steps. With BERT's `epsilon=1e-6` and fine-tuning's small gradients,
    that damps the early updates noticeably. This class computes the update of PyTorch's
    AdamW (and so of Hugging Face fine-tuning recipes) exactly:

        m_hat = m / (1 - beta_1**t),  v_hat = v / (1 - beta_2**t)
        variable -= learning_rate * m_hat / (sqrt(v_hat) + epsilon)

    Everything else (decoupled weight decay, clipping, accumulation, loss scaling) is
    Keras' `AdamW`.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.amsgrad:
            raise ValueError("`BertAdamW` does not implement AMSGrad. Received: amsgrad=True")

    def update_step(self, gradient, variable, learning_rate):
        dtype = variable.dtype
        learning_rate = ops.cast(learning_rate, dtype)
        gradient = ops.cast(gradient, dtype)
        step = ops.cast(self.iterations + 1, dtype)
        beta_1_power = ops.power(ops.cast(self.beta_1, dtype), step)
        beta_2_power = ops.power(ops.cast(self.beta_2, dtype), step)
        index = self._get_variable_index(variable)
        m, v = self._momentums[index], self._velocities[index]
        self.assign_add(m, ops.multiply(ops.subtract(gradient, m), 1 - self.beta_1))
        self.assign_add(v, ops.multiply(ops.subtract(ops.square(gradient), v), 1 - self.beta_2))
        correction_2 = ops.sqrt(1 - beta_2_power)
        step_size = learning_rate * correction_2 / (1 - beta_1_power)
        # sqrt(v_hat) + eps == (sqrt(v) + eps * sqrt(1 - beta_2**t)) / sqrt(1 - beta_2**t)
        denominator = ops.add(ops.sqrt(v), self.epsilon * correction_2)
        self.assign_sub(variable, ops.divide(ops.multiply(m, step_size), denominator))

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        # Keras gives its own `AdamW` a multi-tensor update on torch, but not subclasses: they
        # fall back to `update_step` per variable, ~15 eager ops each. For BERT-sized models
        # that costs more than the matmuls of a fine-tuning step on CPU, so the torch backend
        # updates every variable at once (see `kbert.backend_paths.adamw_update`).
        if not backend_paths.adamw_update(self, grads, trainable_variables, learning_rate):
            super()._backend_update_step(grads, trainable_variables, learning_rate)


def bert_optimizer(
    learning_rate=1e-4,
    total_steps=1_000_000,
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
        total_steps: int. Length of the schedule in steps. Defaults to `1_000_000`.
        warmup_steps: int or None. Warm-up steps; `None` uses `warmup_ratio`.
        warmup_ratio: float. Warm-up as a fraction of `total_steps` (the paper: 10k of 1M).
            Defaults to `0.01`.
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
    if warmup_steps is None:
        warmup_steps = int(round(total_steps * warmup_ratio))
    if gradient_accumulation_steps is not None and (
        not isinstance(gradient_accumulation_steps, int) or gradient_accumulation_steps < 2
    ):
        raise ValueError(
            "`gradient_accumulation_steps` must be None or an integer >= 2. "
            f"Received: gradient_accumulation_steps={gradient_accumulation_steps!r}"
        )
    schedule = WarmupLinearDecay(
        learning_rate,
        total_steps,
        warmup_steps,
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
        result = (BertAdamW if torch_epsilon else keras.optimizers.AdamW)(**common)
    elif optimizer == "lamb":
        result = keras.optimizers.Lamb(**common)
    else:
        raise ValueError(f'`optimizer` must be "adamw" or "lamb". Received: optimizer={optimizer!r}')
    result.exclude_from_weight_decay(var_names=NO_DECAY_VARIABLE_NAMES)
    return result
