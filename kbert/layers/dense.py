"""`Dense`: `keras.layers.Dense` with one fused kernel for matmul + bias on torch."""

import keras


@keras.saving.register_keras_serializable(package="kbert")
class Dense(keras.layers.Dense):
    """`keras.layers.Dense` whose torch path adds the bias inside the matrix product.

    Keras' `Dense` runs `matmul` and then `add` as two kernels; on the torch backend this layer
    calls `torch.nn.functional.linear` instead, one BLAS call that adds the bias as it writes
    the product (what `torch.nn.Linear` does). On the CPU the separate bias pass was about a
    tenth of an encoder's forward time (it reads and writes every activation once more). The
    weights, their names, LoRA (`enable_lora`, through the `kernel` property) and every other
    backend behave exactly as `keras.layers.Dense`; quantised layers keep Keras' own path.
    """

    def call(self, inputs, training=None):
        if keras.backend.backend() != "torch" or self.bias is None or self.quantization_mode:
            return super().call(inputs, training=training)
        import torch

        kernel = keras.ops.convert_to_tensor(self.kernel)  # LoRA added; autocast applied
        bias = keras.ops.convert_to_tensor(self.bias)
        x = torch.nn.functional.linear(inputs, kernel.t(), bias)
        if self.activation is not None:
            x = self.activation(x)
        return x
