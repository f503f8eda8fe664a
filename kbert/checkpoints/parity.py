"""Parity checks of a converted model against the checkpoint's own framework.

`reference_outputs` runs the source checkpoint with its reference implementation - Hugging
Face `transformers` (torch) for HF directories, keras-hub's `BertBackbone` for keras-hub
presets, the independent NumPy forward pass of `kbert.checkpoints.numpy_reference` for
original Google checkpoints - and `max_differences` compares kbert's outputs with it on the
real (non-padding) positions. Used by `tools/convert_checkpoint.py`.
"""

from pathlib import Path

import keras
import numpy as np

from kbert.backend import tensorflow
from kbert.checkpoints import google, keras_hub


class ReferenceUnavailable(RuntimeError):
    """The source's reference framework is not installed (or the format has none)."""


def sample_inputs(backbone, batch_size=2, sequence_length=16, num_predictions=3, seed=0):
    """Deterministic model inputs with trailing padding in every row after the first.

    Token ids avoid 0 on real positions; `mask_positions` point at real tokens.
    """
    rng = np.random.default_rng(seed)
    sequence_length = min(sequence_length, backbone.max_sequence_length)
    token_ids = rng.integers(1, backbone.vocabulary_size, (batch_size, sequence_length))
    segment_ids = rng.integers(0, backbone.num_segments, (batch_size, sequence_length))
    padding_mask = np.zeros((batch_size, sequence_length), "int32")
    lengths = [max(sequence_length - 5 * row, 2) for row in range(batch_size)]
    for row, length in enumerate(lengths):
        padding_mask[row, :length] = 1
        token_ids[row, length:] = 0
        segment_ids[row, length:] = 0
    positions = np.stack(
        [
            np.sort(rng.choice(n, min(num_predictions, n), replace=False))[:num_predictions]
            for n in lengths
        ]
    )
    return {
        "token_ids": token_ids.astype("int32"),
        "segment_ids": segment_ids.astype("int32"),
        "padding_mask": padding_mask,
        "mask_positions": positions.astype("int32"),
    }


def model_outputs(model, inputs):
    """Runs a kbert backbone or pretrainer on `inputs`; returns a dict of float64 NumPy arrays."""
    backbone = getattr(model, "backbone", model)
    keys = ("token_ids", "segment_ids", "padding_mask")
    results = {}
    features = backbone({k: inputs[k] for k in keys})
    results["sequence_output"] = features["sequence_output"]
    results["pooled_output"] = features["pooled_output"]
    if backbone is not model and "mask_positions" in getattr(model, "input", {}):
        heads = model({k: inputs[k] for k in keys + ("mask_positions",)})
        results.update({k: heads[k] for k in ("mlm", "nsp") if k in heads})
    return {k: np.asarray(keras.ops.convert_to_numpy(v), np.float64) for k, v in results.items()}


def reference_outputs(source, fmt, inputs, heads=False):
    """The source checkpoint's outputs on `inputs`, computed by its own framework.

    Args:
        source: the checkpoint directory.
        fmt: "huggingface", "google" or "keras_hub".
        inputs: dict from `sample_inputs`.
        heads: bool. Also compute `mlm` (at `mask_positions`) and `nsp` logits.

    Returns:
        dict of float64 arrays (`sequence_output`, `pooled_output`, and `mlm`, `nsp` with heads).

    Raises:
        ReferenceUnavailable: when the reference framework is missing or the format has none.
    """
    source = Path(source)
    if fmt == "huggingface":
        return _huggingface_reference(source, inputs, heads)
    if fmt == "google":
        tf = tensorflow.tensorflow("Checking a Google TF checkpoint")

        from kbert.checkpoints._config import read_json
        from kbert.checkpoints.numpy_reference import google_bert_forward

        config = read_json(source / google.CONFIG_FILE)
        reader = tf.train.load_checkpoint(str(google.checkpoint_prefix(source)))
        return google_bert_forward(
            reader.get_tensor,
            config,
            inputs["token_ids"],
            inputs["segment_ids"],
            inputs["padding_mask"],
            inputs["mask_positions"] if heads else None,
        )
    if fmt == "keras_hub":
        if heads:
            raise ReferenceUnavailable("keras-hub presets carry no pretraining heads")
        model = _keras_hub_backbone(source)
        outputs = model({k: inputs[k] for k in ("token_ids", "segment_ids", "padding_mask")})
        return {
            k: np.asarray(keras.ops.convert_to_numpy(v), np.float64) for k, v in outputs.items()
        }
    raise ReferenceUnavailable(f"no reference implementation for {fmt!r} sources")


def _keras_hub_backbone(source):
    """The preset's `keras_hub.models.BertBackbone` (float32), its weights loaded by keras-hub."""
    try:
        import keras_hub as keras_hub_package
    except ImportError as error:
        raise ReferenceUnavailable(f"keras-hub is needed: {error}") from None
    from kbert.checkpoints._config import read_json

    source = Path(source)
    config_path = source / keras_hub.CONFIG_FILE
    fields = keras_hub.backbone_fields(read_json(config_path), str(config_path))
    weights = source / keras_hub.WEIGHTS_FILE
    if not weights.is_file():
        raise FileNotFoundError(f"The keras-hub preset {source} has no {keras_hub.WEIGHTS_FILE}")
    model = keras_hub_package.models.BertBackbone(**fields, dtype="float32")
    try:
        model.load_weights(str(weights))
    except Exception as error:  # h5py/keras raise many types for damaged or mismatched files.
        raise ValueError(f"keras-hub could not load {weights}: {error}") from None
    return model


def _huggingface_reference(source, inputs, heads):
    try:
        import torch
        import transformers
    except ImportError as error:
        raise ReferenceUnavailable(f"transformers and torch are needed: {error}") from None
    cls = transformers.BertForPreTraining if heads else transformers.BertModel
    model = cls.from_pretrained(str(source)).eval()
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(inputs["token_ids"], dtype=torch.long),
            token_type_ids=torch.tensor(inputs["segment_ids"], dtype=torch.long),
            attention_mask=torch.tensor(inputs["padding_mask"], dtype=torch.long),
            output_hidden_states=True,
        )
    result = {"sequence_output": out.hidden_states[-1].double().numpy()}
    if heads:
        positions = inputs["mask_positions"][:, :, None].astype("int64")
        result["mlm"] = np.take_along_axis(out.prediction_logits.double().numpy(), positions, 1)
        result["nsp"] = out.seq_relationship_logits.double().numpy()
    else:
        result["pooled_output"] = out.pooler_output.double().numpy()
    return result


# Logits whose round-off scales with their range (the hidden vector times a 30k-row decoder):
# compared relative to max(1, max |reference|).
RELATIVE_OUTPUTS = ("mlm",)


def max_differences(outputs, reference, padding_mask, relative=RELATIVE_OUTPUTS):
    """`{name: max |outputs - reference|}` for the names both have; sequence outputs on real
    positions.

    Names in `relative` are divided by `max(1, max |reference|)` (masked-LM logits reach
    |20| and more, where float32 round-off alone exceeds 1e-4).
    """
    keep = np.asarray(padding_mask).astype(bool)
    differences = {}
    for name in sorted(set(outputs) & set(reference)):
        actual, expected = np.asarray(outputs[name]), np.asarray(reference[name])
        if actual.shape != expected.shape:
            raise ValueError(
                f"{name}: kbert shape {actual.shape} != reference shape {expected.shape}"
            )
        if actual.ndim == 3 and actual.shape[:2] == keep.shape:
            actual, expected = actual[keep], expected[keep]
        difference = float(np.max(np.abs(actual - expected)))
        if name in relative:
            difference /= max(1.0, float(np.max(np.abs(expected))))
        differences[name] = difference
    return differences
