"""Refusing exports of quantized models: a float export of int8 / int4 / float8 weights would not
equal the model. Used by every export (`kbert.export`, the checkpoint writers of this package)
and by `kbert.serving`; duck-typed on the model (`quantization_record`, `weights`), so it needs
nothing of `kbert.models`."""

import keras


def quantized_weights(model):
    """What makes `model` quantized: its `quantize` record (which includes its backbone's)
    and the paths of its variables stored in a non-float dtype (int8 kernels, int4 packed
    into int8, float8 scales). An empty list for a float model."""
    found = []
    for entry in getattr(model, "quantization_record", None) or []:
        found.append(f"quantize({entry['mode']!r}) of {len(entry['layers'])} layers")
    for variable in model.weights:
        dtype = keras.backend.standardize_dtype(variable.dtype)
        if not dtype.startswith(("float", "bfloat")) or dtype.startswith("float8"):
            found.append(f"{variable.path} ({dtype})")
    return found


def check_not_quantized(model, what):
    """Raises a ValueError when `model` was quantized by `quantize`: the exports (`what`)
    write float graphs and checkpoints, which a quantized model's int8 / int4 / float8
    weights would not match."""
    found = quantized_weights(model)
    if found:
        raise ValueError(
            f"{what} writes float weights, but this {type(model).__name__} was quantized "
            f"({', '.join(found[:3])}{' ...' if len(found) > 3 else ''}); its export would not "
            "equal it. Dequantize first: export the float model (before `quantize`, or loaded "
            "again from its float checkpoint). For int8 serving, export the float model with "
            "`kbert.export.export_onnx(model, directory, quantize='int8')`, "
            "`export_openvino(..., quantize='int8')` or "
            "`kbert.serving.from_model(model, 'onnx-int8')`."
        )
