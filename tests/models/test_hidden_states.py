"""`BertBackbone(output_hidden_states=True, output_attentions=True)`: every layer's output and
attention probabilities, against Hugging Face's `BertModel` (eager attention); a classifier on
such a backbone against `BertForSequenceClassification`.

The reference is a random `transformers` model with every parameter drawn at scale 0.5
(`tests/checkpoints/_reference.py`), so consecutive layers differ by far more than the
tolerance and a shifted or reordered layer fails the comparison.
"""

import keras
import numpy as np
import pytest

from kbert.models import BertBackbone, BertClassifier
from tests.checkpoints import _reference as R
from tests.test_case import random_backbone_inputs, tiny_backbone_kwargs, to_numpy

# float32 on every backend; TensorFlow's oneDNN kernels sum in another order than torch.
TOLERANCE = 1e-5


def _state_bound(reference):
    """TOLERANCE relative to the largest hidden value (layers reach values of 2-4 here, where
    float32 sums in another order differ by about 1e-5): far below the 0.1 between layers."""
    return TOLERANCE * max(1.0, float(np.abs(reference).max()))


@pytest.fixture(scope="module")
def hf_directory(tmp_path_factory):
    """A saved random `transformers.BertModel` (2 layers, 4 heads) and the model itself."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    config = R.hf_config(attn_implementation="eager")
    model = R.make_hf_model(config, kind="model")
    path = tmp_path_factory.mktemp("hf_bert")
    model.save_pretrained(path)
    return path, model


@pytest.fixture(scope="module")
def hf_classifier_directory(hf_directory, tmp_path_factory):
    """A saved `transformers.BertForSequenceClassification` (3 labels) on the encoder of
    `hf_directory`, with a large random head, and the model itself."""
    import torch
    import transformers

    _, encoder = hf_directory
    config = R.hf_config(attn_implementation="eager", num_labels=3)
    model = transformers.BertForSequenceClassification(config).eval()
    model.bert.load_state_dict(encoder.state_dict())
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        model.classifier.weight.copy_(
            torch.randn(model.classifier.weight.shape, generator=generator)
        )
        model.classifier.bias.copy_(torch.randn(3, generator=generator))
    path = tmp_path_factory.mktemp("hf_bert_classifier")
    model.save_pretrained(path)
    return path, model


def test_hidden_states_and_attentions_match_transformers(hf_directory):
    path, hf_model = hf_directory
    backbone = BertBackbone.from_preset(path, output_hidden_states=True, output_attentions=True)
    assert backbone.output_hidden_states and backbone.output_attentions
    assert backbone.get_config()["output_hidden_states"] is True
    inputs = R.backbone_inputs(R.random_inputs(hf_model.config))
    mask = inputs["padding_mask"]
    outputs = backbone.predict_on_batch(inputs)  # Compiled: faster than eager on JAX.
    expected = R.hf_outputs(hf_model, inputs, attentions=True)
    hidden_states, attentions = expected["hidden_states"], expected["attentions"]

    assert isinstance(outputs["hidden_states"], tuple) and isinstance(outputs["attentions"], tuple)
    assert len(outputs["hidden_states"]) == backbone.num_layers + 1 == len(hidden_states)
    assert len(outputs["attentions"]) == backbone.num_layers == len(attentions)
    for index, (actual, expected) in enumerate(zip(outputs["hidden_states"], hidden_states)):
        assert R.max_diff(actual, expected, mask) < _state_bound(expected), ("hidden state", index)
    for index, (actual, expected) in enumerate(zip(outputs["attentions"], attentions)):
        assert R.max_diff(actual, expected, mask) < TOLERANCE, ("attention", index)
    # The comparison can fail: the layers differ from one another far beyond the tolerance.
    assert R.max_diff(outputs["hidden_states"][1], hidden_states[2], mask) > 0.1
    assert R.max_diff(outputs["attentions"][0], attentions[1], mask) > 0.01
    # Padding keys get no probability; the last hidden state is `sequence_output`.
    padded_keys = ~mask.astype(bool)[:, None, None, :]
    assert np.all(np.where(padded_keys, to_numpy(outputs["attentions"][0]), 0.0) == 0.0)
    np.testing.assert_array_equal(
        to_numpy(outputs["hidden_states"][-1]), to_numpy(outputs["sequence_output"])
    )


def test_flags_change_only_the_outputs(tmp_path):
    """Same weights and outputs with and without the flags; `.keras` and packed rows keep them."""
    inputs = random_backbone_inputs(batch_size=2, sequence_length=8)
    plain = BertBackbone(**tiny_backbone_kwargs())
    full = BertBackbone(
        **tiny_backbone_kwargs(output_hidden_states=True, output_attentions=True, packed=True)
    )
    assert [w.path for w in full.weights] == [w.path for w in plain.weights]
    full.set_weights(plain.get_weights())
    # One document per row: a packed row computes what the unpacked one does.
    outputs = full.predict_on_batch(dict(inputs, document_ids=inputs["padding_mask"]))
    reference = plain.predict_on_batch(inputs)
    real = inputs["padding_mask"].astype(bool)  # Packed padding attends elsewhere: not compared.
    np.testing.assert_allclose(
        to_numpy(outputs["sequence_output"])[real], reference["sequence_output"][real], atol=1e-6
    )
    np.testing.assert_allclose(
        to_numpy(outputs["pooled_output"]), reference["pooled_output"], atol=1e-6
    )

    full.save(tmp_path / "model.keras")
    restored = keras.saving.load_model(tmp_path / "model.keras")
    assert restored.output_hidden_states and restored.output_attentions and restored.packed
    again = restored.predict_on_batch(dict(inputs, document_ids=inputs["padding_mask"]))
    for key in ("hidden_states", "attentions"):
        for actual, expected in zip(again[key], outputs[key]):
            np.testing.assert_allclose(to_numpy(actual), to_numpy(expected), atol=1e-6)


def test_classifier_on_hidden_states_backbone_matches_transformers(hf_classifier_directory):
    """A classifier whose backbone returns every layer: logits equal Hugging Face's
    `BertForSequenceClassification`, and the hidden states of the call the classifier makes
    (`first_token_only=True`, which a backbone with hidden states runs in full) equal HF's
    `output_hidden_states=True` at real positions."""
    path, hf_model = hf_classifier_directory
    classifier = BertClassifier.from_preset(path, output_hidden_states=True)
    assert classifier.backbone.output_hidden_states and classifier.num_classes == 3
    inputs = R.backbone_inputs(R.random_inputs(hf_model.config))
    mask = inputs["padding_mask"]
    expected = R.hf_outputs(hf_model, inputs)
    hf_logits, hf_states = expected["logits"], expected["hidden_states"]

    logits = to_numpy(classifier.predict_on_batch(inputs))
    np.testing.assert_allclose(logits, hf_logits, atol=TOLERANCE, rtol=TOLERANCE)
    assert np.abs(hf_logits[0] - hf_logits[1]).max() > 0.1  # Rows differ: the check can fail.

    # Backend tensors, as the classifier passes them (on torch: the lean encoder's path).
    tensors = {key: keras.ops.convert_to_tensor(value) for key, value in inputs.items()}
    states = classifier.backbone(tensors, first_token_only=True)["hidden_states"]
    assert len(states) == classifier.backbone.num_layers + 1 == len(hf_states)
    for index, (actual, reference) in enumerate(zip(states, hf_states)):
        bound = _state_bound(reference)
        assert R.max_diff(actual, reference, mask) < bound, ("hidden state", index)
    assert R.max_diff(states[1], hf_states[2], mask) > 0.1


def test_mixed_precision_outputs_are_in_compute_dtype():
    backbone = BertBackbone(
        **tiny_backbone_kwargs(
            output_hidden_states=True, output_attentions=True, dtype="mixed_bfloat16"
        )
    )
    outputs = backbone(random_backbone_inputs(batch_size=2, sequence_length=8))
    dtypes = {keras.backend.standardize_dtype(t.dtype) for t in outputs["hidden_states"]}
    dtypes |= {keras.backend.standardize_dtype(t.dtype) for t in outputs["attentions"]}
    assert dtypes == {keras.backend.standardize_dtype(outputs["sequence_output"].dtype)}
    assert dtypes == {"bfloat16"}
