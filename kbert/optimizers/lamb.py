"""LAMB (You et al. 2019): Adam moments with a layer-wise trust ratio, for large batches."""

import math

import keras
from keras import ops

from kbert.optimizers.slots import SlotIndex

# BERT excludes biases and LayerNorm parameters from weight decay (and LAMB from adaptation).
_NO_DECAY = ("bias", "gamma", "beta")


@keras.saving.register_keras_serializable(package="kbert")
class Lamb(keras.optimizers.Optimizer):
    """LAMB as in Algorithm 2 of You et al., "Large Batch Optimization for Deep Learning:
    Training BERT in 76 minutes" (2019, arXiv 1904.00962).

    For each variable `w` with gradient `g` at update `t`:

        m = beta_1 * m + (1 - beta_1) * g
        v = beta_2 * v + (1 - beta_2) * g**2
        r = (m / (1 - beta_1**t)) / (sqrt(v / (1 - beta_2**t)) + epsilon) + weight_decay * w
        trust = ||w|| / ||r||  (1 when either norm is 0)
        w = w - learning_rate * trust * r

    Unlike `keras.optimizers.Lamb`, the weight decay is part of `r`, so it is scaled by the
    trust ratio as in the paper. Variables whose path contains one of
    `exclude_from_weight_decay` get no decay, and those matching `exclude_from_layer_adaptation`
    (by default the same list) use `trust = 1`, as in the reference implementation for BERT.
    With `gradient_accumulation_steps`, `t` counts updates, not micro-batches.

    Args:
        learning_rate: float or schedule. Defaults to `1e-3`.
        beta_1, beta_2: floats. Moment decay rates. Defaults to `0.9`, `0.999`.
        epsilon: float. Defaults to `1e-6`.
        weight_decay: float. Decay coefficient inside the update. Defaults to `0.01`.
        exclude_from_weight_decay: list of str. Substrings of variable paths without decay.
            Defaults to `("bias", "gamma", "beta")` (biases and LayerNorm).
        exclude_from_layer_adaptation: list of str or `None`. Substrings of variable paths
            updated without the trust ratio; `None` uses `exclude_from_weight_decay`.
        **kwargs: the base optimizer arguments (`global_clipnorm`,
            `gradient_accumulation_steps`, ...), except `weight_decay`.

    Example:

    >>> optimizer = Lamb(**lamb_large_batch_settings(batch_size=32768))
    """

    def __init__(
        self,
        learning_rate=1e-3,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-6,
        weight_decay=0.01,
        exclude_from_weight_decay=_NO_DECAY,
        exclude_from_layer_adaptation=None,
        name="lamb",
        **kwargs,
    ):
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        if not isinstance(weight_decay, (int, float)) or weight_decay < 0:
            raise ValueError(
                f"`weight_decay` must be a number >= 0. Received: weight_decay={weight_decay!r}"
            )
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self.decay_rate = float(weight_decay)
        # Not `self.exclude_from_weight_decay`: that name is Keras' Optimizer method.
        self.no_decay_names = list(exclude_from_weight_decay or ())
        self.exclude_from_layer_adaptation = (
            list(exclude_from_layer_adaptation)
            if exclude_from_layer_adaptation is not None
            else list(self.no_decay_names)
        )

    def build(self, var_list):
        if self.built:
            return
        super().build(var_list)
        self.momentums, self.velocities = self.add_optimizer_variables(
            var_list, ["momentum", "velocity"]
        )
        self._slot_index = SlotIndex(var_list)

    @staticmethod
    def _matches(variable, patterns):
        path = getattr(variable, "path", None) or variable.name
        return any(pattern in path for pattern in patterns)

    def update_step(self, gradient, variable, learning_rate):
        dtype = variable.dtype
        lr = ops.cast(learning_rate, dtype)
        gradient = ops.cast(gradient, dtype)
        step = ops.cast(self.iterations + 1, dtype)
        position = self._slot_index(variable)
        m, v = self.momentums[position], self.velocities[position]
        self.assign(
            m, ops.add(ops.multiply(m, self.beta_1), ops.multiply(gradient, 1 - self.beta_1))
        )
        self.assign(
            v,
            ops.add(
                ops.multiply(v, self.beta_2), ops.multiply(ops.square(gradient), 1 - self.beta_2)
            ),
        )
        m_hat = ops.divide(m, 1.0 - ops.power(ops.cast(self.beta_1, dtype), step))
        v_hat = ops.divide(v, 1.0 - ops.power(ops.cast(self.beta_2, dtype), step))
        update = ops.divide(m_hat, ops.add(ops.sqrt(v_hat), self.epsilon))
        if self.decay_rate and not self._matches(variable, self.no_decay_names):
            update = ops.add(update, ops.multiply(variable, self.decay_rate))
        if not self._matches(variable, self.exclude_from_layer_adaptation):
            w_norm = ops.sqrt(ops.sum(ops.square(variable)))
            r_norm = ops.sqrt(ops.sum(ops.square(update)))
            ratio = ops.where(
                ops.logical_and(ops.greater(w_norm, 0), ops.greater(r_norm, 0)),
                ops.divide(w_norm, ops.maximum(r_norm, 1e-30)),
                1.0,
            )
            update = ops.multiply(update, ratio)
        self.assign_sub(variable, ops.multiply(lr, update))

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "beta_1": self.beta_1,
                "beta_2": self.beta_2,
                "epsilon": self.epsilon,
                "weight_decay": self.decay_rate,
                "exclude_from_weight_decay": self.no_decay_names,
                "exclude_from_layer_adaptation": self.exclude_from_layer_adaptation,
            }
        )
        return config


def lamb_large_batch_settings(
    batch_size, total_steps=None, base_learning_rate=1e-4, base_batch_size=256
):
    """LAMB settings for large-batch BERT pretraining, after You et al. (2019).

    The learning rate follows the paper's untuned square-root scaling rule from BERT's
    `1e-4` at 256 sequences: `base_learning_rate * sqrt(batch_size / base_batch_size)`;
    moments `beta_1=0.9`, `beta_2=0.999`, `epsilon=1e-6`, weight decay `0.01` without biases
    and LayerNorm, gradients clipped to a global norm of 1. With `total_steps`, it adds a
    warm-up of `ceil(total_steps * 0.01)` updates (BERT's 10k of 1M; kbert's default ratio).
    The paper tunes the warm-up per batch size; treat this one as a starting point.

    Args:
        batch_size: int. Global batch (sequences per update, all processes and accumulated
            micro-batches together).
        total_steps: int or `None`. Updates of the run, to derive `warmup_steps`.
        base_learning_rate: float. Learning rate at `base_batch_size`. Defaults to `1e-4`.
        base_batch_size: int. Defaults to 256.

    Returns:
        A dict with `learning_rate` (the peak), `beta_1`, `beta_2`, `epsilon`, `weight_decay`,
        `global_clipnorm` (the `Lamb` arguments) and `warmup_steps` when `total_steps` is given
        (for `kbert.optimizers.WarmupLinearDecay`; pop it before calling `Lamb`).
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"`batch_size` must be a positive integer. Received: {batch_size!r}")
    settings = {
        "learning_rate": base_learning_rate * math.sqrt(batch_size / base_batch_size),
        "beta_1": 0.9,
        "beta_2": 0.999,
        "epsilon": 1e-6,
        "weight_decay": 0.01,
        "global_clipnorm": 1.0,
    }
    if total_steps is not None:
        settings["warmup_steps"] = max(1, math.ceil(total_steps * 0.01))
    return settings
