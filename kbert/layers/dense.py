"""`Dense`: `keras.layers.Dense` with one fused kernel for matmul + bias on torch."""

import keras

from kbert import backend


@keras.saving.register_keras_serializable(package="kbert")
class Dense(keras.layers.Dense):
    """`keras.layers.Dense` whose torch path adds the bias inside the matrix product.

    Keras' `Dense` runs `matmul` and then `add` as two kernels; on the torch backend this layer
    computes both in one BLAS call (`kbert.backend.fused_dense`), as `torch.nn.Linear` does.
    The weights, their names, LoRA (`enable_lora`, through the `kernel` property) and every
    other backend behave exactly as `keras.layers.Dense`; quantised layers keep Keras' own path.
    """

    def call(self, inputs, training=None):
        outputs = backend.fused_dense(self, inputs)
        if outputs is None:
            return super().call(inputs, training=training)
        return outputs
