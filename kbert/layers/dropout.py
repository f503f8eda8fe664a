"""Dropout whose masks are cheap on every backend (`HashDropout`)."""

import keras
from keras import ops

from kbert import backend

_INT32_MIN = -(2**31)


def _as_int32(value):
    """An unsigned 32-bit constant as the int32 with the same bits (for wrapping arithmetic)."""
    return value - 2**32 if value >= 2**31 else value


def _logical_right_shift(x, bits):
    """`x >> bits` on the 32 bits of an int32, filling with zeros (as for uint32)."""
    return ops.bitwise_and(ops.right_shift(x, bits), (1 << (32 - bits)) - 1)


def _mix32(x):
    """MurmurHash3's 32-bit finaliser: a bijection that makes every output bit depend on every input
    bit.

    Written on int32 with wrapping multiplication, which every backend provides (uint32
    arithmetic is not available on torch).
    """
    x = ops.bitwise_xor(x, _logical_right_shift(x, 16))
    x = ops.multiply(x, ops.cast(_as_int32(0x85EBCA6B), "int32"))
    x = ops.bitwise_xor(x, _logical_right_shift(x, 13))
    x = ops.multiply(x, ops.cast(_as_int32(0xC2B2AE35), "int32"))
    return ops.bitwise_xor(x, _logical_right_shift(x, 16))


@keras.saving.register_keras_serializable(package="kbert")
class HashDropout(keras.layers.Dropout):
    """`keras.layers.Dropout` whose mask comes from a counter-based hash on JAX and TensorFlow.

    Same semantics as `keras.layers.Dropout`: in training, each element is zeroed with
    probability `rate` and the others are scaled by `1 / (1 - rate)`; at inference it is the
    identity. Only the source of randomness differs. JAX's default generator (Threefry,
    20 rounds per 64 bits) and TensorFlow's stateless generator under XLA are costly on
    CPU next to the matmuls around them (see BENCHMARKS.md). Here every element's bits are a
    MurmurHash3-finalised hash of its (row, column) index and a per-call key drawn from the layer's
    `keras.random.SeedGenerator`: a few integer operations per element, fused by XLA into
    the surrounding computation. The hash is keyed afresh at every call, so masks differ
    between steps and are reproducible under `keras.utils.set_random_seed`. On torch the
    mask comes from torch's global generator (see `kbert.backend.native_dropout`), so
    `torch.utils.checkpoint` replays it. Over several replicas that each run a slice of the
    global batch (`tf.distribute`, torch processes) each replica's mask is its slice of the
    mask of the whole batch (see `kbert.backend.batch_slice`), so the replicas train as one.

    Args:
        rate: float in [0, 1]. Fraction of the elements to drop.
        seed: int or None. Seed of the layer's seed generator.

    Call arguments:
        inputs: tensor of any rank.
        training: bool. Dropout applies only when true.
        seed: optional int tensor `(2,)`, the key to use instead of drawing one from the
            layer's seed generator (see `next_seed`): a block that is recomputed in the
            backward pass (`remat`) passes the same key to both passes.

    Example:
    >>> dropout = HashDropout(0.1)
    >>> y = keras.ops.convert_to_numpy(dropout(np.ones((4, 1000)), training=True))
    >>> round(float(np.mean(y == 0)), 1)  # the fraction dropped
    0.1
    >>> round(float(y.max()), 4)  # the kept values are scaled by 1 / (1 - rate)
    1.1111
    """

    def __init__(self, rate, seed=None, **kwargs):
        kwargs.pop("noise_shape", None)
        super().__init__(rate, seed=seed, **kwargs)
        # Decided once here, not in every (possibly compiled) call.
        self._uses_hash = 0 < self.rate < 1 and backend.hash_dropout_backend()

    @property
    def uses_hash(self):
        """Whether masks come from the hash (JAX, TensorFlow) rather than the backend's dropout."""
        return self._uses_hash

    def next_seed(self):
        """Draws the key of the next call from the seed generator (`None` when none is used)."""
        return self.seed_generator.next() if self.uses_hash else None

    def call(self, inputs, training=False, seed=None):
        if not training or self.rate == 0:
            return inputs
        if self.rate >= 1:
            return ops.zeros_like(inputs)
        dropped = backend.native_dropout(inputs, self.rate)
        if dropped is not None:
            return dropped
        if not self.uses_hash:
            return super().call(inputs, training=training)
        if seed is None:
            seed = self.seed_generator.next()
        seed = ops.cast(seed, "int32")  # (2,)
        key_row = _mix32(seed[0] + ops.cast(_as_int32(0x9E3779B9), "int32"))
        # Mixed once more than key_row: a plain `seed[1] ^ key_row` made the row `seed[1]`, column 0
        # hash to 0 on every call (always dropped, whatever the rate).
        key_column = _mix32(ops.bitwise_xor(seed[1], _mix32(key_row)))
        shape = ops.shape(inputs)
        rows = 1
        for dim in shape[:-1]:
            rows = rows * dim
        row_ids = ops.arange(rows, dtype="int32")
        index, count = backend.batch_slice()
        if count > 1:
            # This replica holds slice `index` of the global batch: its rows' global ids, so
            # that its mask is its slice of the mask of one replica running the whole batch.
            row_ids = row_ids + ops.cast(index, "int32") * ops.cast(rows, "int32")
        row_ids = ops.reshape(row_ids, tuple(shape[:-1]) + (1,))
        column_ids = ops.arange(shape[-1], dtype="int32")
        row_hash = _mix32(ops.bitwise_xor(row_ids, key_row))  # (..., 1)
        column_hash = column_ids * ops.cast(_as_int32(0x9E3779B1), "int32") + key_column  # (d,)
        bits = _mix32(ops.bitwise_xor(row_hash, column_hash))  # (..., d), uniform on 32 bits
        # Keep iff the unsigned bits >= rate * 2**32; shifting by 2**31 turns that into an
        # int32 comparison.
        threshold = min(int(round(self.rate * 2**32)), 2**32 - 1) + _INT32_MIN
        keep = ops.greater_equal(
            ops.bitwise_xor(bits, ops.cast(_INT32_MIN, "int32")),
            ops.cast(threshold, "int32"),
        )
        scale = ops.cast(1.0 / (1.0 - self.rate), inputs.dtype)
        return ops.where(keep, inputs * scale, ops.zeros_like(inputs))

    def get_config(self):
        config = super().get_config()
        config.pop("noise_shape", None)
        return config
