"""BertPreprocessor: parity with Hugging Face encoding, tf.data, Keras fit."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from kbert.text import BertPreprocessor, BertTokenizer

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Héllo, wörld! 中文 and emoji 😀.",
    "",
    "A considerably longer sentence that will certainly be truncated at sixteen tokens.",
]
SECONDS = [
    "It was not amused.",
    "Second segment, quite a bit longer than the first one in this pair.",
    "Only the second segment has words.",
    "Short.",
]


@pytest.fixture(scope="module")
def preprocessor(minilm_dir):
    return BertPreprocessor.from_preset(minilm_dir, sequence_length=16)


def hf_encode(hf, *texts, length=16):
    out = hf(
        *texts,
        truncation="longest_first",
        max_length=length,
        padding="max_length",
        return_token_type_ids=True,
    )
    return {
        "token_ids": np.array(out["input_ids"]),
        "segment_ids": np.array(out["token_type_ids"]),
        "padding_mask": np.array(out["attention_mask"]),
    }


def assert_same(got, expected):
    assert set(got) == set(expected)
    for key in expected:
        value = got[key].numpy() if tf.is_tensor(got[key]) else got[key]
        assert value.dtype == np.int32, key
        np.testing.assert_array_equal(value, expected[key], err_msg=key)


def test_single_sentences_match_hugging_face(preprocessor, hf_legacy_tokenizer):
    expected = hf_encode(hf_legacy_tokenizer, SENTENCES)
    assert_same(preprocessor(SENTENCES), expected)
    assert_same(preprocessor(np.array(SENTENCES)), expected)
    assert_same(preprocessor(tf.constant(SENTENCES)), expected)
    single = preprocessor(SENTENCES[0])
    np.testing.assert_array_equal(single["token_ids"], expected["token_ids"][0])


def test_pairs_match_hugging_face(preprocessor, hf_legacy_tokenizer):
    expected = hf_encode(hf_legacy_tokenizer, SENTENCES, SECONDS)
    assert_same(preprocessor((SENTENCES, SECONDS)), expected)
    assert_same(preprocessor((tf.constant(SENTENCES), tf.constant(SECONDS))), expected)
    single = preprocessor((SENTENCES[1], SECONDS[1]))
    np.testing.assert_array_equal(single["segment_ids"], expected["segment_ids"][1])


def test_labels_and_weights_pass_through(preprocessor):
    labels = np.array([0, 1, 1, 0])
    weights = np.array([1.0, 0.5, 1.0, 2.0])
    x, y = preprocessor(SENTENCES, labels)
    assert y is labels and x["token_ids"].shape == (4, 16)
    x, y, w = preprocessor((SENTENCES, SECONDS), labels, weights)
    assert y is labels and w is weights and x["segment_ids"].shape == (4, 16)


def test_tf_data_map_equals_eager(preprocessor):
    labels = [0, 1, 1, 0]
    eager = preprocessor((SENTENCES, SECONDS))
    ds = tf.data.Dataset.from_tensor_slices(((SENTENCES, SECONDS), labels))
    batched = list(ds.batch(3).map(preprocessor))
    for key in eager:
        got = np.concatenate([x[key].numpy() for x, _ in batched])
        np.testing.assert_array_equal(got, eager[key])
    assert np.concatenate([y.numpy() for _, y in batched]).tolist() == labels
    for i, (x, y) in enumerate(ds.map(preprocessor)):
        np.testing.assert_array_equal(x["token_ids"].numpy(), eager["token_ids"][i])
        assert int(y) == labels[i]
    plain = tf.data.Dataset.from_tensor_slices(SENTENCES).batch(4).map(preprocessor)
    np.testing.assert_array_equal(
        next(iter(plain))["token_ids"].numpy(), preprocessor(SENTENCES)["token_ids"]
    )


def test_feeds_a_keras_model_on_every_backend(preprocessor):
    """The packed dict is a valid input for a Keras model with BERT's three
    int32 inputs, eagerly (numpy) and through tf.data in `fit`."""
    inputs = {
        name: keras.Input(shape=(None,), dtype="int32", name=name)
        for name in ("token_ids", "segment_ids", "padding_mask")
    }
    embedded = keras.layers.Embedding(30522, 4, name="embedding")(inputs["token_ids"])
    mask = keras.ops.cast(inputs["padding_mask"], "float32")[:, :, None]
    segments = keras.ops.cast(inputs["segment_ids"], "float32")[:, :, None]
    pooled = keras.ops.sum(embedded * mask + segments, axis=1)
    model = keras.Model(inputs, keras.layers.Dense(1, name="head")(pooled))
    x = preprocessor((SENTENCES, SECONDS))
    table = model.get_layer("embedding").embeddings
    table = keras.ops.convert_to_numpy(table)
    kernel, bias = (keras.ops.convert_to_numpy(w) for w in model.get_layer("head").weights)
    expected_pooled = (table[x["token_ids"]] * x["padding_mask"][:, :, None]).sum(1)
    expected_pooled += x["segment_ids"].sum(1, keepdims=True)
    np.testing.assert_allclose(
        model.predict(x, verbose=0), expected_pooled @ kernel + bias, rtol=1e-5, atol=1e-5
    )
    model.compile(optimizer="sgd", loss="mse")
    ds = tf.data.Dataset.from_tensor_slices((SENTENCES, [0.0, 1.0, 1.0, 0.0]))
    history = model.fit(ds.batch(2).map(preprocessor), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_config_round_trip(preprocessor):
    config = preprocessor.get_config()
    assert set(config) == {"tokenizer", "sequence_length", "truncate"}
    restored = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(preprocessor)
    )
    assert isinstance(restored, BertPreprocessor)
    assert isinstance(restored.tokenizer, BertTokenizer)
    assert restored.get_config() == config
    assert_same(restored((SENTENCES, SECONDS)), preprocessor((SENTENCES, SECONDS)))
    waterfall = BertPreprocessor(preprocessor.tokenizer, sequence_length=8, truncate="waterfall")
    x = waterfall(("one two three four five six", "seven eight"))
    assert x["segment_ids"].tolist() == [0] * 7 + [1]


def test_errors(preprocessor):
    with pytest.raises(ValueError, match="must be a kbert.text.BertTokenizer"):
        BertPreprocessor("not a tokenizer")
    with pytest.raises(ValueError, match="sequence_length"):
        BertPreprocessor(preprocessor.tokenizer, sequence_length=2)
    with pytest.raises(ValueError, match="one or two string batches"):
        preprocessor(("a", "b", "c"))
    with pytest.raises(ValueError, match="Segment 0 must be a list of strings"):
        preprocessor([1, 2])
    with pytest.raises(ValueError, match="Segment 1 must hold strings"):
        preprocessor((tf.constant(["a"]), tf.constant([1])))
    with pytest.raises(ValueError, match="both batches"):
        preprocessor(("a", ["b"]))
    with pytest.raises(ValueError, match="Segment 0 must be a string"):
        preprocessor(3.5)
