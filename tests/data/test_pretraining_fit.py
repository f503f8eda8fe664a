"""The tf.data pretraining dataset feeds `BertPretrainer.fit` on every backend (the dataset itself
is backend-independent and tested once, in test_pretraining.py)."""

import keras
import numpy as np
import pytest

from tests.data import test_pretraining as pretraining
from tests.data.test_pretraining import SEQ_LEN, VOCAB, _build

# The dataset module's fixtures.
corpus = pretraining.corpus
tokenizer = pretraining.tokenizer


def test_feeds_bert_pretrainer_fit(corpus, tokenizer):
    from kbert.models import BertBackbone, BertPretrainer

    backbone = BertBackbone(
        vocabulary_size=len(VOCAB),
        num_layers=1,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=SEQ_LEN,
    )
    pretrainer = BertPretrainer(backbone)
    pretrainer.compile(learning_rate=1e-3, total_steps=10, warmup_steps=1)
    dataset = _build(corpus, tokenizer, batch_size=16, repeat=True)
    history = pretrainer.fit(dataset, steps_per_epoch=2, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all()

    # The mlm sample weights reach the loss: labels in padded slots (weight 0) do not count,
    # labels in real slots do.
    x, y, sample_weight = next(iter(dataset))
    x = {k: v.numpy() for k, v in x.items()}
    y = {k: v.numpy() for k, v in y.items()}
    sample_weight = {k: v.numpy() for k, v in sample_weight.items()}
    assert (sample_weight["mlm"] == 0).any()
    # Random logits stand in for the forward pass: only the loss path is under test here.
    rng = np.random.default_rng(0)
    y_pred = {
        "mlm": rng.normal(size=y["mlm"].shape + (len(VOCAB),)).astype("float32"),
        "nsp": rng.normal(size=(len(y["nsp"]), 2)).astype("float32"),
    }

    def loss(labels):
        value = pretrainer.compute_loss(
            x=x, y=dict(y, mlm=labels), y_pred=y_pred, sample_weight=sample_weight, training=False
        )
        return float(keras.ops.convert_to_numpy(value))

    base = loss(y["mlm"])
    in_padding = np.where(sample_weight["mlm"] == 0, 7, y["mlm"])
    in_real = np.where(sample_weight["mlm"] == 1, 7, y["mlm"])
    assert np.isfinite(base)
    assert loss(in_padding) == pytest.approx(base, rel=1e-6)
    assert abs(loss(in_real) - base) > 1e-3
