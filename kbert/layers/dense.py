"""`Dense`: `keras.layers.Dense` with one fused kernel for matmul + bias on torch, and torch's
int8 kernel once quantized."""

import keras

from kbert import backend
from kbert.layers.utils import BuiltFromCheckpoint, KerasQuantization


@keras.saving.register_keras_serializable(package="kbert")
class Dense(BuiltFromCheckpoint, KerasQuantization, keras.layers.Dense):
    """`keras.layers.Dense` whose torch path adds the bias inside the matrix product.

    Keras' `Dense` runs `matmul` and then `add` as two kernels; on the torch backend this layer
    computes both in one BLAS call (`kbert.backend.fused_dense`), as `torch.nn.Linear` does.
    The weights, their names, LoRA (`enable_lora`, through the `kernel` property) and every
    other backend behave exactly as `keras.layers.Dense`.

    `quantize(mode)` takes every mode Keras' `Dense` takes, with its variables. Quantized to
    int8 on torch, inference runs torch's dynamic int8 linear kernel
    (`kbert.backend.int8_dense`: fbgemm / oneDNN, VNNI on x86) on the layer's int8 kernel and
    scales; training, LoRA and the other backends use Keras' own int8 path.
    """

    def call(self, inputs, training=None):
        outputs = backend.fused_dense(self, inputs)
        if outputs is None:
            return super().call(inputs, training=training)
        return outputs

    def quantized_call(self, inputs, training=None):
        outputs = backend.int8_dense(self, inputs, training)
        if outputs is None:
            return super().quantized_call(inputs, training=training)
        return outputs
