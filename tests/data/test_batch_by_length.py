"""kbert.data.batch_by_length: tf.data batches cropped to buckets, every row once, metrics equal."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from kbert.data import batch_by_length, batching  # noqa: E402
from kbert.models import BertClassifier, BertTagger  # noqa: E402
from tests.models.test_classifier import TOY_WORDS, toy_backbone, toy_preprocessor  # noqa: E402


def _packed(count, sequence_length=48, seed=0):
    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(TOY_WORDS, size=n)) for n in rng.integers(1, 40, size=count)]
    packed = toy_preprocessor(sequence_length)(texts)
    return {key: np.asarray(value) for key, value in packed.items()}


def test_batches_hold_every_row_once_cropped_to_its_bucket():
    x = _packed(50)
    rows = np.arange(50)
    dataset = tf.data.Dataset.from_tensor_slices((x, rows))
    buckets = batching.bucket_lengths(48)
    lengths = batching.row_lengths(x["padding_mask"])
    seen = []
    for features, batch_rows in batch_by_length(dataset, batch_size=4):
        batch_rows = batch_rows.numpy()
        length = features["token_ids"].shape[1]
        assert length == min(b for b in buckets if b >= lengths[batch_rows].max())
        for key, value in features.items():
            np.testing.assert_array_equal(value.numpy(), x[key][batch_rows, :length])
        assert not x["padding_mask"][batch_rows, length:].any()  # only padding was cut
        seen.extend(batch_rows.tolist())
    assert sorted(seen) == list(range(50))
    # With `drop_remainder`, each bucket's last, incomplete batch is left out: only full
    # batches, and every row of the buckets' full batches.
    kept = []
    for _, batch_rows in batch_by_length(dataset, batch_size=4, drop_remainder=True):
        assert len(batch_rows) == 4
        kept.extend(batch_rows.numpy().tolist())
    per_bucket = np.bincount(np.searchsorted(buckets, lengths), minlength=len(buckets))
    assert len(kept) == len(set(kept)) == int((per_bucket // 4 * 4).sum()) < 50


def test_per_token_labels_are_cropped_and_bad_input_is_refused():
    x = _packed(9, sequence_length=32)
    labels = np.tile(np.arange(32), (9, 1))
    dataset = tf.data.Dataset.from_tensor_slices((x, labels, (labels > 0).astype("float32")))
    for features, y, weights in batch_by_length(dataset, batch_size=4, crop_labels=True):
        assert y.shape == features["token_ids"].shape == weights.shape
    with pytest.raises(ValueError, match="unbatched"):
        batch_by_length(tf.data.Dataset.from_tensor_slices(x).batch(2), batch_size=4)
    with pytest.raises(ValueError, match="padding_mask"):
        batch_by_length(tf.data.Dataset.from_tensor_slices({"token_ids": x["token_ids"]}), 4)


@pytest.mark.backends(
    "tensorflow",
    reason="tf.data batches are backend-independent; each backend's Keras loop with varying "
    "shapes is tested in tests/models/test_length_batching.py: run once",
)
def test_evaluate_equals_the_full_length_run():
    model = BertClassifier(toy_backbone(), num_classes=3)
    x = _packed(24)
    y = np.arange(24) % 3
    dataset = batch_by_length(tf.data.Dataset.from_tensor_slices((x, y)), batch_size=8)
    bucketed = model.evaluate(dataset, verbose=0, return_dict=True)
    model.length_batching = False
    full = model.evaluate(x, y, batch_size=8, verbose=0, return_dict=True)
    for key in full:
        assert abs(bucketed[key] - full[key]) <= 1e-5, (key, bucketed, full)
    tagger = BertTagger(toy_backbone(), num_classes=3)
    tokens = np.where(x["padding_mask"] > 0, np.arange(48) % 3, 0)
    dataset = tf.data.Dataset.from_tensor_slices((x, tokens, x["padding_mask"].astype("float32")))
    history = tagger.fit(batch_by_length(dataset, 8, crop_labels=True), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
