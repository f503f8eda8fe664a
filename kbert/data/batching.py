"""Length-aware batching of a tokenized `tf.data.Dataset` (`batch_by_length` needs TensorFlow).

`batch_by_length` is the tf.data counterpart of the length batching that the task models'
`fit`, `evaluate` and `predict` apply to NumPy and raw-text inputs
(`kbert.models.batching`): rows of similar length share a batch, and each batch is cropped
to the smallest bucket length that holds its longest row, so a compiling backend sees at most
`len(bucket_lengths(sequence_length))` sequence lengths (plus one batch size per bucket for
each bucket's last, shorter batch unless `drop_remainder`). `bucket_lengths`, the set of
bucket lengths both use, is NumPy only.
"""

import numpy as np

from kbert.backend import tensorflow

_FEATURES = ("token_ids", "segment_ids", "padding_mask")


# Granularity of the buckets when none is given: 16 up to length 128, 32 beyond.
_SHORT_GRANULARITY = 16
_LONG_GRANULARITY = 32


def _positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
    return int(value)


def bucket_lengths(sequence_length, granularity=None):
    """The padded lengths batches are cropped to: multiples of `granularity`, then the length.

    Args:
        sequence_length: int. The packed (longest) length.
        granularity: int or `None`. Step between buckets. `None` takes 16 for
            `sequence_length <= 128` and 32 beyond.

    Returns:
        Sorted tuple of ints ending with `sequence_length`; it has
        `ceil(sequence_length / granularity)` entries, the bound on the number of sequence
        lengths a model sees.

    Example:
    >>> bucket_lengths(128)
    (16, 32, 48, 64, 80, 96, 112, 128)
    >>> bucket_lengths(40, granularity=16)
    (16, 32, 40)
    """
    sequence_length = _positive_int(sequence_length, "sequence_length")
    if granularity is None:
        granularity = _SHORT_GRANULARITY if sequence_length <= 128 else _LONG_GRANULARITY
    granularity = _positive_int(granularity, "granularity")
    steps = range(granularity, sequence_length, granularity)
    return tuple(steps) + (sequence_length,)


def _features_of(element):
    if isinstance(element, dict):
        return element
    if isinstance(element, (tuple, list)) and element and isinstance(element[0], dict):
        return element[0]
    return None


def batch_by_length(
    dataset,
    batch_size,
    sequence_length=None,
    granularity=None,
    crop_labels=False,
    drop_remainder=False,
):
    """Batches an unbatched dataset of packed rows by length, each batch cropped to a bucket.

    Rows are grouped by bucket (`tf.data.Dataset.group_by_window`): each bucket fills its
    own batch of `batch_size` rows in the order the rows arrive, so shuffle *before* this
    call (`dataset.shuffle(...)`) for training; the batches come out in the order they
    fill. The rows of a batch are cropped to the smallest bucket length holding the
    batch's longest row (the last real position of `padding_mask`); real positions are
    never cut. The order of rows changes, so use it for `fit` and `evaluate` (metrics are
    order-free); `predict` on NumPy or raw text batches by length itself and keeps the
    caller's order.

    Args:
        dataset: `tf.data.Dataset` of unbatched elements: a dict with `token_ids`,
            `segment_ids` and `padding_mask` (each `(sequence_length,)`), or an `(x, y)` /
            `(x, y, sample_weight)` tuple with such a dict as `x`. Other keys of the dict
            (with the same length) are cropped too.
        batch_size: int. Rows per batch.
        sequence_length: int or `None`. The packed length; `None` reads it from the
            dataset's `padding_mask` spec.
        granularity: int or `None`. Step between bucket lengths (see
            `kbert.models.batching.bucket_lengths`; `None`: 16 up to length 128, else 32).
        crop_labels: bool. Also crop `y` and `sample_weight` (per-token labels, as for
            `BertTagger`). Defaults to `False`.
        drop_remainder: bool. Drop each bucket's last, incomplete batch (a fixed batch
            size, e.g. to split batches evenly over devices). Defaults to `False`.

    Returns:
        A `tf.data.Dataset` of batches whose sequence dimension varies from batch to batch.

    Example:
    >>> import tensorflow as tf
    >>> tokenizer = kbert.text.BertTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"])
    >>> preprocessor = kbert.text.BertPreprocessor(tokenizer, sequence_length=64)
    >>> texts, labels = ["a", "a " * 20, "a a", "a " * 30], [0, 1, 0, 1]
    >>> dataset = tf.data.Dataset.from_tensor_slices((preprocessor(texts), labels))
    >>> batches = batch_by_length(dataset, batch_size=2)  # then `model.fit(batches)`
    >>> [(x["token_ids"].shape[1], y.numpy().tolist()) for x, y in batches]  # (length, labels)
    [(16, [0, 0]), (32, [1, 1])]
    """
    tf = tensorflow.tensorflow("kbert.data.batch_by_length")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"`batch_size` must be a positive integer. Received: {batch_size!r}")
    spec = _features_of(dataset.element_spec)
    if spec is None or any(key not in spec for key in _FEATURES):
        raise ValueError(
            "batch_by_length expects elements that are a dict with keys "
            f"{list(_FEATURES)} or an (x, y[, sample_weight]) tuple with such a dict. "
            f"Received element_spec: {dataset.element_spec}"
        )
    mask_shape = spec["padding_mask"].shape
    if mask_shape.rank != 1:
        raise ValueError(
            "batch_by_length expects unbatched rows (`padding_mask` of shape "
            f"(sequence_length,)). Received shape {mask_shape}; call it before `.batch()`."
        )
    if sequence_length is None:
        sequence_length = mask_shape[0]
        if sequence_length is None:
            raise ValueError("The dataset's sequence length is not static: pass `sequence_length`.")
    buckets = tf.constant(bucket_lengths(sequence_length, granularity), tf.int64)

    def row_length(*element):
        features = _features_of(element[0] if len(element) == 1 else element)
        mask = tf.cast(features["padding_mask"], tf.bool)
        positions = tf.range(1, tf.shape(mask, out_type=tf.int64)[0] + 1)
        return tf.reduce_max(tf.where(mask, positions, tf.zeros_like(positions)))

    def bucket_index(*element):
        length = tf.reshape(row_length(*element), [1])
        return tf.searchsorted(buckets, length, out_type=tf.int64)[0]

    def crop(*batch):
        features = _features_of(batch[0] if len(batch) == 1 else batch)
        mask = tf.cast(features["padding_mask"], tf.bool)
        positions = tf.range(1, tf.shape(mask, out_type=tf.int64)[1] + 1)
        longest = tf.reduce_max(tf.where(mask, positions, tf.zeros_like(positions)))
        length = tf.gather(buckets, tf.searchsorted(buckets, tf.reshape(longest, [1]))[0])

        def cut(value):
            return value[:, :length] if value.shape.rank >= 2 else value

        x = {key: cut(value) for key, value in features.items()}
        if len(batch) == 1 and isinstance(batch[0], dict):
            return x
        rest = batch[1:]
        if crop_labels:
            rest = tuple(tf.nest.map_structure(cut, part) for part in rest)
        return (x,) + tuple(rest)

    batched = dataset.group_by_window(
        key_func=bucket_index,
        reduce_func=lambda _, window: window.batch(batch_size, drop_remainder=drop_remainder),
        window_size=batch_size,
    )
    return batched.map(crop, num_parallel_calls=tf.data.AUTOTUNE)
