"""Packs one or two token-id segments into BERT's fixed-length model input."""

import itertools

import keras
import numpy as np

from kbert.backend import tensorflow

TRUNCATION_STRATEGIES = ("longest_first", "waterfall")


def truncated_lengths(length_a, length_b, budget, truncate):
    """Lengths kept of a segment pair so that their sum fits in `budget`.

    `"longest_first"` equals the reference's `_truncate_seq_pair`
    (google-research/bert `run_classifier.py`): while the pair is too long,
    drop the last token of the longer segment, of the second one on a tie.
    Its result in closed form: when the pair does not fit,
    `a = min(len_a, max(budget - len_b, ceil(budget / 2)))`, `b = budget - a`.
    `"waterfall"` keeps as much of the first segment as fits, then of the
    second.

    Works on Python ints, numpy arrays and TF tensors alike.
    """
    if truncate == "waterfall":
        new_a = _minimum(length_a, budget)
        return new_a, _minimum(length_b, budget - new_a)
    fits = length_a + length_b <= budget
    new_a = _minimum(length_a, _maximum(budget - length_b, (budget + 1) // 2))
    new_a = _where(fits, length_a, new_a)
    new_b = _where(fits, length_b, budget - new_a)
    return new_a, new_b


def _minimum(a, b):
    if tensorflow.is_tensor(a) or tensorflow.is_tensor(b):
        return tensorflow.tensorflow().minimum(a, b)
    return np.minimum(a, b)


def _maximum(a, b):
    if tensorflow.is_tensor(a) or tensorflow.is_tensor(b):
        return tensorflow.tensorflow().maximum(a, b)
    return np.maximum(a, b)


def _where(c, a, b):
    if tensorflow.is_tensor(c):
        return tensorflow.tensorflow().where(c, a, b)
    return np.where(c, a, b)


def _is_int(value):
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _python_segment(segment, index):
    """A Python / numpy segment as `((values, lengths), batched)`: all its ids in one 1-D
    int64 array and the number of ids of each row."""
    if isinstance(segment, np.ndarray):
        if segment.dtype.kind not in "iu" and not (segment.dtype.kind == "O"):
            raise ValueError(
                f"Segment {index} must hold integer token ids. Received a numpy "
                f"array of dtype {segment.dtype}."
            )
        if segment.ndim == 1 and segment.dtype.kind != "O":
            return (segment.astype(np.int64), np.array([len(segment)], np.int64)), False
        segment = list(segment)
    if not isinstance(segment, (list, tuple)):
        raise ValueError(
            f"Segment {index} must be a list of token ids, a list of such lists, "
            f"or an int tensor. Received an object of type {type(segment).__name__}."
        )
    if all(_is_int(x) for x in segment):
        values = np.array([int(x) for x in segment], dtype=np.int64)
        return (values, np.array([len(values)], np.int64)), False
    rows = list(segment)
    try:
        lengths = np.fromiter(map(len, rows), np.int64, len(rows))
        values = np.asarray(list(itertools.chain.from_iterable(rows)))
    except (TypeError, ValueError):  # A row without a length; nested rows of unequal lengths.
        values = None
    if values is None or values.ndim != 1 or (values.size and values.dtype.kind not in "iu"):
        for row in rows:  # The first row that is not a flat row of ints names the error.
            if not isinstance(row, (list, tuple, np.ndarray)):
                _raise_bad_row(row, index)
            if not all(_is_int(x) for x in row):
                _raise_bad_row(row, index)
        _raise_bad_row(segment, index)
    return (values.astype(np.int64), lengths), True


def _raise_bad_row(row, index):
    raise ValueError(
        f"Segment {index} must be a list of int or a list of lists of int. "
        f"Received an element {row!r}."
    )


def _tensor_segment(segment, index):
    """A tensor segment as (RaggedTensor [B, None] int32, batched)."""
    tf = tensorflow.tensorflow()
    if not segment.dtype.is_integer:
        raise ValueError(
            f"Segment {index} must hold integer token ids. Received a tensor of "
            f"dtype {segment.dtype.name}."
        )
    if isinstance(segment, tf.RaggedTensor):
        if segment.shape.rank != 2:
            raise ValueError(
                f"Segment {index} must be a RaggedTensor of shape [batch, None]. "
                f"Received shape {segment.shape}."
            )
        return tf.cast(segment, tf.int32), True
    rank = segment.shape.rank
    if rank == 1:
        return tf.RaggedTensor.from_tensor(tf.cast(segment, tf.int32)[tf.newaxis]), False
    if rank == 2:
        return tf.RaggedTensor.from_tensor(tf.cast(segment, tf.int32)), True
    raise ValueError(
        f"Segment {index} must have rank 1 (one sequence) or 2 (a batch). "
        f"Received shape {segment.shape}."
    )


def _pack(segments, settings):
    """Packs RaggedTensors `[B, None]` into dense `[B, sequence_length]`.

    `settings` is an int32 tensor `[sequence_length, cls_token_id,
    sep_token_id, pad_token_id, waterfall]`, so one trace serves every packer.
    """
    tf = tensorflow.tensorflow()
    length, cls_token_id, sep_token_id, pad_token_id = tf.unstack(settings[:4])
    waterfall = settings[4] > 0
    batch = segments[0].nrows(out_type=tf.int32)
    if len(segments) == 2:
        tf.debugging.assert_equal(
            batch,
            segments[1].nrows(out_type=tf.int32),
            message="BertPacker: both segments must have the same batch size.",
        )
    lengths = [tf.cast(s.row_lengths(), tf.int32) for s in segments]
    budget = length - 1 - len(segments)
    if len(segments) == 1:
        kept = [tf.minimum(lengths[0], budget)]
    else:
        first = truncated_lengths(lengths[0], lengths[1], budget, "longest_first")
        second = truncated_lengths(lengths[0], lengths[1], budget, "waterfall")
        kept = [tf.where(waterfall, b, a) for a, b in zip(first, second)]
    # Scatter every kept token to its place: [CLS] A [SEP] B [SEP].
    rows = tf.range(batch)
    indices = [tf.stack([rows, tf.zeros_like(rows)], axis=1)]
    updates = [tf.fill([batch], cls_token_id)]
    offset = tf.ones_like(rows)  # (batch,) first free position.
    for segment, kept_length in zip(segments, kept):
        row = tf.cast(segment.value_rowids(), tf.int32)
        starts = tf.cast(segment.row_splits, tf.int32)
        position = tf.range(tf.size(segment.flat_values)) - tf.gather(starts, row)
        inside = tf.where(position < tf.gather(kept_length, row))[:, 0]
        row = tf.gather(row, inside)
        position = tf.gather(position, inside) + tf.gather(offset, row)
        indices.append(tf.stack([row, position], axis=1))
        updates.append(tf.gather(segment.flat_values, inside))
        offset = offset + kept_length
        indices.append(tf.stack([rows, offset], axis=1))
        updates.append(tf.fill([batch], sep_token_id))
        offset = offset + 1
    token_ids = tf.tensor_scatter_nd_update(
        tf.fill([batch, length], pad_token_id),
        tf.concat(indices, axis=0),
        tf.concat(updates, axis=0),
    )
    positions = tf.range(length)[tf.newaxis, :]  # (1, sequence_length)
    total = offset[:, tf.newaxis]  # (batch, 1) packed length.
    padding_mask = tf.cast(positions < total, tf.int32)
    if len(segments) == 2:
        second_start = (kept[0] + 2)[:, tf.newaxis]
        segment_ids = tf.cast((positions >= second_start) & (positions < total), tf.int32)
    else:
        segment_ids = tf.zeros_like(token_ids)
    return {
        "token_ids": token_ids,
        "segment_ids": segment_ids,
        "padding_mask": padding_mask,
    }


# One traced graph per number of segments, shared by all packers (built on first use).
_PACK_FUNCTIONS = {}


def _pack_function(num_segments):
    if num_segments not in _PACK_FUNCTIONS:
        tf = tensorflow.tensorflow("BertPacker on TensorFlow tensors")
        with tf.init_scope():
            _PACK_FUNCTIONS[num_segments] = _trace_pack(tf, num_segments)
    return _PACK_FUNCTIONS[num_segments]


def _trace_pack(tf, num_segments):
    segment_spec = tf.RaggedTensorSpec([None, None], tf.int32, ragged_rank=1)
    settings_spec = tf.TensorSpec([5], tf.int32)
    return tf.function(
        _pack,
        input_signature=[[segment_spec] * num_segments, settings_spec],
        autograph=False,
    )


def _pack_numpy(segments, sequence_length, cls_token_id, sep_token_id, pad_token_id, truncate):
    """`_pack` in NumPy, for Python / NumPy segments (`(values, lengths)` of
    `_python_segment`), with whole-array operations only."""
    if len(segments) == 2 and len(segments[0][1]) != len(segments[1][1]):
        raise ValueError(
            f"BertPacker: both segments must have the same batch size. Received "
            f"{len(segments[0][1])} and {len(segments[1][1])} sequences."
        )
    batch = len(segments[0][1])
    budget = sequence_length - 1 - len(segments)
    lengths = [row_lengths for _, row_lengths in segments]
    if len(segments) == 1:
        kept = [np.minimum(lengths[0], budget)]
    else:
        kept = list(truncated_lengths(lengths[0], lengths[1], budget, truncate))
    # Scatter every kept token to its place: [CLS] A [SEP] B [SEP].
    token_ids = np.full((batch, sequence_length), pad_token_id, dtype=np.int32)
    token_ids[:, 0] = cls_token_id
    rows = np.arange(batch)
    offset = np.ones(batch, np.int64)  # (batch,) first free position.
    for (values, row_lengths), kept_length in zip(segments, kept):
        row = np.repeat(rows, row_lengths)
        starts = np.cumsum(row_lengths) - row_lengths
        position = np.arange(len(values)) - starts[row]
        inside = position < kept_length[row]
        token_ids[row[inside], position[inside] + offset[row[inside]]] = values[inside]
        offset = offset + kept_length
        token_ids[rows, offset] = sep_token_id
        offset = offset + 1
    positions = np.arange(sequence_length)[np.newaxis, :]
    total = offset[:, np.newaxis]  # (batch, 1) packed length.
    padding_mask = (positions < total).astype(np.int32)
    if len(segments) == 2:
        second_start = (kept[0] + 2)[:, np.newaxis]
        segment_ids = ((positions >= second_start) & (positions < total)).astype(np.int32)
    else:
        segment_ids = np.zeros_like(token_ids)
    return {"token_ids": token_ids, "segment_ids": segment_ids, "padding_mask": padding_mask}


@keras.saving.register_keras_serializable(package="kbert")
class BertPacker:
    """Packs token ids into `[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]`.

    Truncates the segments to fit `sequence_length`, adds the special tokens
    and pads with `pad_token_id`. Returns a dict with the three inputs of a
    BERT backbone, all int32 of shape `(batch_size, sequence_length)` (or
    `(sequence_length,)` for one unbatched example):
    - `token_ids`: the packed ids;
    - `segment_ids`: 0 for `[CLS] A [SEP]`, 1 for `B [SEP]`, 0 on padding;
    - `padding_mask`: 1 on real tokens, 0 on padding (int32, like the
      `padding_mask` input of keras-hub's `BertBackbone`; Keras casts it to
      bool where masks are needed).

    Works eagerly on Python lists / numpy arrays (returns numpy arrays) and on
    tensors, also inside `tf.data` (returns tensors).

    Args:
        sequence_length: int. Length of the packed sequence, at least 3.
        cls_token_id: int. Id of `[CLS]`.
        sep_token_id: int. Id of `[SEP]`.
        pad_token_id: int. Id of `[PAD]`. Defaults to `0`.
        truncate: str. `"longest_first"` (the original BERT rule: drop tokens
            from the end of the longer segment, of the second segment on a
            tie) or `"waterfall"` (keep the first segment whole if possible,
            truncate the second). Defaults to `"longest_first"`.

    Call arguments:
        inputs: one segment, or a tuple of one or two segments. A segment is
            a list of int (one sequence), a list of lists of int (a batch), a
            numpy array, a 1-D / 2-D int tensor or a `tf.RaggedTensor` of
            shape `(batch_size, None)`. A dense 2-D tensor is taken as rows of
            real tokens (no padding). Pairs must be given as a tuple.
        sequence_length: int or `None`. Length of this call's packed rows
            (e.g. the bucket of one batch, see `kbert.data.batching`): at
            least 2 for one segment, 3 for pairs. Defaults to the packer's
            `sequence_length`.

    Example:

    >>> packer = kbert.text.BertPacker(8, cls_token_id=101, sep_token_id=102)
    >>> out = packer(([7, 8, 9], [4, 5, 6, 3]))
    >>> out["token_ids"]  # 7 tokens do not fit in 8 - 3: B, longer, is cut.
    array([101,   7,   8,   9, 102,   4,   5, 102], dtype=int32)
    >>> out["segment_ids"]
    array([0, 0, 0, 0, 0, 1, 1, 1], dtype=int32)
    """

    def __init__(
        self,
        sequence_length,
        cls_token_id,
        sep_token_id,
        pad_token_id=0,
        truncate="longest_first",
    ):
        if not _is_int(sequence_length) or sequence_length < 3:
            raise ValueError(
                f"`sequence_length` must be an integer >= 3, enough for "
                f"`[CLS] A [SEP] B [SEP]`. Received: sequence_length={sequence_length!r}"
            )
        for name, value in (
            ("cls_token_id", cls_token_id),
            ("sep_token_id", sep_token_id),
            ("pad_token_id", pad_token_id),
        ):
            if not _is_int(value) or value < 0:
                raise ValueError(
                    f"`{name}` must be a non-negative integer. Received: {name}={value!r}"
                )
        if truncate not in TRUNCATION_STRATEGIES:
            raise ValueError(
                f"`truncate` must be one of {TRUNCATION_STRATEGIES}. Received: "
                f"truncate={truncate!r}"
            )
        self.sequence_length = int(sequence_length)
        self.cls_token_id = int(cls_token_id)
        self.sep_token_id = int(sep_token_id)
        self.pad_token_id = int(pad_token_id)
        self.truncate = truncate

    @tensorflow.do_not_convert
    def __call__(self, inputs, sequence_length=None):
        segments = inputs if isinstance(inputs, tuple) else (inputs,)
        if len(segments) not in (1, 2):
            raise ValueError(
                f"BertPacker takes one or two segments. Received a tuple of "
                f"{len(segments)} segments."
            )
        if sequence_length is None:
            sequence_length = self.sequence_length
        elif not _is_int(sequence_length) or sequence_length < len(segments) + 1:
            raise ValueError(
                f"`sequence_length` must be an integer >= {len(segments) + 1}, enough for "
                f"the special tokens of {len(segments)} segment(s). Received: "
                f"sequence_length={sequence_length!r}"
            )
        if not any(tensorflow.is_tensor(s) for s in segments):
            converted = [_python_segment(s, i) for i, s in enumerate(segments)]
            batched = self._check_batched(converted)
            outputs = _pack_numpy(
                [values for values, _ in converted],
                int(sequence_length),
                self.cls_token_id,
                self.sep_token_id,
                self.pad_token_id,
                self.truncate,
            )
            if not batched:
                outputs = {k: v[0] for k, v in outputs.items()}
            return outputs
        tf = tensorflow.tensorflow()
        converted = []
        for index, segment in enumerate(segments):
            if tf.is_tensor(segment):
                converted.append(_tensor_segment(segment, index))
            else:
                (values, lengths), batched = _python_segment(segment, index)
                ragged = tf.RaggedTensor.from_row_lengths(values.astype(np.int32), lengths)
                converted.append((ragged, batched))
        batched = self._check_batched(converted)
        segments = [s for s, _ in converted]
        settings = tf.constant(
            [
                int(sequence_length),
                self.cls_token_id,
                self.sep_token_id,
                self.pad_token_id,
                int(self.truncate == "waterfall"),
            ],
            dtype=tf.int32,
        )
        outputs = _pack_function(len(segments))(segments, settings)
        if not tf.executing_eagerly():
            shape = [None, int(sequence_length)]
            outputs = {k: tf.ensure_shape(v, shape) for k, v in outputs.items()}
        if not batched:
            outputs = {k: v[0] for k, v in outputs.items()}
        return outputs

    @staticmethod
    def _check_batched(converted):
        batched = {b for _, b in converted}
        if len(batched) != 1:
            raise ValueError(
                "Both segments must be batched, or both unbatched. Received one "
                "single sequence and one batch."
            )
        return batched.pop()

    def get_config(self):
        return {
            "sequence_length": self.sequence_length,
            "cls_token_id": self.cls_token_id,
            "sep_token_id": self.sep_token_id,
            "pad_token_id": self.pad_token_id,
            "truncate": self.truncate,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)
