"""Out-of-range and float token ids are refused on every backend, in eager calls and in the
compiled steps of fit / evaluate / predict, with the range received and the vocabulary size."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from kbert.models import BertBackbone, BertClassifier, BertPretrainer
from tests.test_case import random_backbone_inputs, tiny_backbone_kwargs

VOCABULARY = 97  # tiny_backbone_kwargs
RANGE = (
    r"`token_ids` must lie in \[0, vocabulary_size\) = \[0, 97\)\. Received values in \[{}, {}\]"
)


def _classifier():
    return BertClassifier(BertBackbone(**tiny_backbone_kwargs()), num_classes=2, dropout=0.0)


def _bad_inputs(low, high, batch_size=4):
    inputs = random_backbone_inputs(batch_size, 8, pad=False)
    inputs["token_ids"][0, 1] = low
    inputs["token_ids"][-1, 2] = high
    return inputs


@pytest.mark.parametrize("low, high", [(1, VOCABULARY), (-1, 5), (-3, 10**6)])
def test_out_of_range_ids_are_refused_by_every_entry_point(low, high):
    model = _classifier()
    inputs = _bad_inputs(low, high)
    real_high = max(high, int(inputs["token_ids"].max()))
    real_low = min(low, int(inputs["token_ids"].min()))
    message = RANGE.format(real_low, real_high)
    labels = np.zeros(4, "int32")
    weights_before = [w.copy() for w in model.get_weights()]
    with pytest.raises(ValueError, match=message):
        model(inputs)
    with pytest.raises(ValueError, match=message):
        model.fit(inputs, labels, batch_size=2, epochs=1, verbose=0)
    with pytest.raises(ValueError, match=message):
        model.evaluate(inputs, labels, batch_size=2, verbose=0)
    with pytest.raises(ValueError, match=message):
        model.predict(inputs, batch_size=2, verbose=0)
    with pytest.raises(ValueError, match=message):
        model.train_on_batch(inputs, labels)
    with pytest.raises(ValueError, match=message):
        model.predict_on_batch(inputs)
    with pytest.raises(ValueError, match=message):
        model.backbone.predict(inputs, verbose=0)
    # Nothing was trained on the bad batch.
    for before, after in zip(weights_before, model.get_weights()):
        np.testing.assert_array_equal(before, after)


def test_out_of_range_ids_in_validation_data_are_refused():
    model = _classifier()
    good = random_backbone_inputs(4, 8)
    labels = np.zeros(4, "int32")
    with pytest.raises(ValueError, match=RANGE.format(r"\d+", 97)):
        model.fit(good, labels, validation_data=(_bad_inputs(1, 97), labels), epochs=1, verbose=0)


def test_out_of_range_ids_in_a_tf_data_batch_stop_the_compiled_step():
    """Only the third batch is bad: the check runs per batch, inside the tf.data pipeline."""
    model = _classifier()
    inputs = random_backbone_inputs(6, 8, pad=False)
    inputs["token_ids"][5, 3] = 120
    labels = np.zeros(6, "int32")
    dataset = tf.data.Dataset.from_tensor_slices((inputs, labels)).batch(2)
    with pytest.raises(
        Exception,
        match=(
            r"`token_ids` must lie in \[0, vocabulary_size\) = \[0, 97\)\. "
            r"Received values in \[\d+, 120\]"
        ),
    ):
        model.fit(dataset, epochs=1, verbose=0)
    with pytest.raises(Exception, match=r"Received values in \[\d+, 120\]"):
        _classifier().predict(dataset.map(lambda x, y: x), verbose=0)
    good = tf.data.Dataset.from_tensor_slices((random_backbone_inputs(4, 8), labels[:4])).batch(2)
    history = _classifier().fit(good, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all()


def test_segment_ids_and_mask_positions_are_checked_in_fit():
    model = BertPretrainer(BertBackbone(**tiny_backbone_kwargs()))
    inputs = random_backbone_inputs(2, 8)
    x = dict(inputs, mask_positions=np.array([[1, 2], [3, 8]], "int32"))
    y = {"mlm": np.ones((2, 2), "int32"), "nsp": np.zeros(2, "int32")}
    with pytest.raises(
        ValueError,
        match=(
            r"`mask_positions` must lie in \[0, sequence_length\) = \[0, 8\)\. "
            r"Received values in \[1, 8\]"
        ),
    ):
        model.fit(x, y, epochs=1, verbose=0)
    x["mask_positions"][1, 1] = 7
    x["segment_ids"] = x["segment_ids"] + 2
    with pytest.raises(
        ValueError, match=r"`segment_ids` must lie in \[0, num_segments\) = \[0, 2\)"
    ):
        model.fit(x, y, epochs=1, verbose=0)


@pytest.mark.parametrize("container", ["numpy", "tf.data"])
def test_float_ids_are_refused_not_truncated(container):
    model = _classifier()
    inputs = random_backbone_inputs(2, 2, pad=False)
    inputs["token_ids"] = np.array([[2.5, 5.0], [3.0, 4.0]])
    if container == "tf.data":
        dataset = tf.data.Dataset.from_tensor_slices(inputs).batch(2)
        with pytest.raises(
            ValueError, match=r"`token_ids` must be integer ids\. Received an array of dtype float"
        ):
            model.predict(dataset, verbose=0)
        return
    for run in (model, lambda x: model.predict(x, verbose=0)):
        with pytest.raises(
            ValueError,
            match=(
                r"`token_ids` must be integer ids\. "
                r"Received an array of dtype float64 \(first values \[2\.5, 5\.0"
            ),
        ):
            run(inputs)


def test_valid_ids_at_the_edges_are_accepted():
    model = _classifier()
    inputs = _bad_inputs(0, VOCABULARY - 1)
    eager = keras.ops.convert_to_numpy(model(inputs))
    predicted = model.predict(inputs, verbose=0)
    np.testing.assert_allclose(predicted, eager, atol=1e-5)
