"""Strings (or string pairs) -> packed BERT inputs, for fine-tuning."""

import keras
import numpy as np

from kbert.backend import tensorflow
from kbert.text.packer import BertPacker
from kbert.text.tokenizer import BertTokenizer


def _convert_segment(segment, index):
    """A string segment as ("tensor", tf.string tensor) or ("python", str or list of str)."""
    if tensorflow.is_tensor(segment):
        tf = tensorflow.tensorflow()
        if segment.dtype != tf.string:
            raise ValueError(
                f"Segment {index} must hold strings. Received a tensor of dtype "
                f"{segment.dtype.name}."
            )
        if isinstance(segment, tf.RaggedTensor) or segment.shape.rank not in (0, 1):
            raise ValueError(
                f"Segment {index} must be a scalar or a 1-D batch of strings. "
                f"Received shape {segment.shape}."
            )
        return "tensor", segment
    if isinstance(segment, (str, bytes)):
        return "python", segment
    if isinstance(segment, np.ndarray):
        if segment.dtype.kind not in "USO" or segment.ndim not in (0, 1):
            raise ValueError(
                f"Segment {index} must be a 0-D or 1-D numpy array of strings. "
                f"Received dtype {segment.dtype} and shape {segment.shape}."
            )
        segment = segment.tolist()
        if isinstance(segment, (str, bytes)):
            return "python", segment
    if isinstance(segment, (list, tuple)):
        bad = [x for x in segment if not isinstance(x, (str, bytes))]
        if bad:
            raise ValueError(
                f"Segment {index} must be a list of strings. Received an element "
                f"of type {type(bad[0]).__name__}: {bad[0]!r}."
            )
        return "python", list(segment)
    raise ValueError(
        f"Segment {index} must be a string, a list / numpy array of strings or a "
        f"string tensor. Received an object of type {type(segment).__name__}."
    )


def _is_batch(kind, value):
    if kind == "tensor":
        return value.shape.rank == 1
    return isinstance(value, list)


@keras.saving.register_keras_serializable(package="kbert")
class BertPreprocessor:
    """Turns raw strings, or pairs of strings, into BERT model inputs.

    Tokenizes with a `BertTokenizer` and packs with a `BertPacker` into a dict
    `token_ids`, `segment_ids`, `padding_mask` (int32, shape
    `(batch_size, sequence_length)`). Call it on Python strings / lists /
    numpy arrays (returns numpy arrays; pure Python, no TensorFlow needed) or
    map it over a `tf.data.Dataset` (returns tensors; needs TensorFlow). Like
    keras-hub preprocessors it accepts `(x, y)` and
    `(x, y, sample_weight)` and passes `y` and `sample_weight` through, so
    `dataset.map(preprocessor)` works on labelled datasets.

    A sentence pair is a tuple `(first, second)` given as `x`. Beware that
    `tf.data` unpacks element tuples into arguments: for a dataset of
    unlabelled pairs `(a, b)` use `ds.map(lambda a, b: preprocessor((a, b)))`;
    for labelled pairs, make the elements `((a, b), label)`.

    Args:
        tokenizer: `kbert.text.BertTokenizer`.
        sequence_length: int. Packed length. Defaults to `128`.
        truncate: str. `"longest_first"` (the original BERT rule) or
            `"waterfall"`. Defaults to `"longest_first"`.

    Call arguments:
        x: a string, a batch of strings (list, numpy array, 1-D `tf.string`),
            or a tuple of one or two such batches (sentence pairs).
        y: optional labels, passed through unchanged.
        sample_weight: optional sample weights, passed through unchanged.

    Example:

    >>> tokenizer = kbert.text.BertTokenizer(
    ...     ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "quick", "fox", "."]
    ... )
    >>> preprocessor = kbert.text.BertPreprocessor(tokenizer, sequence_length=8)
    >>> preprocessor(["The quick fox.", "Hello!"])["token_ids"]
    array([[2, 5, 6, 7, 8, 3, 0, 0],
           [2, 1, 1, 3, 0, 0, 0, 0]], dtype=int32)
    >>> preprocessor(("The fox.", "The quick fox."))["segment_ids"]  # a pair, cut to fit
    array([0, 0, 0, 0, 0, 1, 1, 1], dtype=int32)
    >>> import tensorflow as tf
    >>> ds = tf.data.Dataset.from_tensor_slices((["The fox.", "Hello!"], [1, 0]))
    >>> inputs, labels = next(iter(ds.batch(2).map(preprocessor)))  # (inputs dict, labels)
    >>> inputs["padding_mask"].numpy(), labels.numpy()
    (array([[1, 1, 1, 1, 1, 0, 0, 0],
           [1, 1, 1, 1, 0, 0, 0, 0]], dtype=int32), array([1, 0], dtype=int32))
    """

    def __init__(self, tokenizer, sequence_length=128, truncate="longest_first"):
        if isinstance(tokenizer, dict):
            tokenizer = keras.saving.deserialize_keras_object(tokenizer)
        if not isinstance(tokenizer, BertTokenizer):
            raise ValueError(
                f"`tokenizer` must be a kbert.text.BertTokenizer. Received an "
                f"object of type {type(tokenizer).__name__}."
            )
        self.tokenizer = tokenizer
        self.packer = BertPacker(
            sequence_length=sequence_length,
            cls_token_id=tokenizer.cls_token_id,
            sep_token_id=tokenizer.sep_token_id,
            pad_token_id=tokenizer.pad_token_id,
            truncate=truncate,
        )
        self.sequence_length = self.packer.sequence_length
        self.truncate = truncate

    @tensorflow.do_not_convert
    def __call__(self, x, y=None, sample_weight=None):
        segments = x if isinstance(x, tuple) else (x,)
        if len(segments) not in (1, 2):
            raise ValueError(
                f"`x` must be strings or a tuple of one or two string batches. "
                f"Received a tuple of {len(segments)} elements."
            )
        converted = [_convert_segment(s, i) for i, s in enumerate(segments)]
        if len({_is_batch(kind, value) for kind, value in converted}) != 1:
            raise ValueError("Both segments of a pair must be single strings, or both batches.")
        if any(kind == "tensor" for kind, _ in converted):
            tf = tensorflow.tensorflow()
            tensors = [
                value if kind == "tensor" else tf.constant(value, dtype=tf.string)
                for kind, value in converted
            ]
            token_ids = tuple(self.tokenizer.tokenize(t) for t in tensors)
        else:
            token_ids = tuple(self.tokenizer.tokenize(value) for _, value in converted)
        outputs = self.packer(token_ids)
        return keras.utils.pack_x_y_sample_weight(outputs, y, sample_weight)

    def get_config(self):
        return {
            "tokenizer": keras.saving.serialize_keras_object(self.tokenizer),
            "sequence_length": self.sequence_length,
            "truncate": self.truncate,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["tokenizer"] = keras.saving.deserialize_keras_object(config["tokenizer"])
        return cls(**config)

    @classmethod
    def from_preset(cls, preset, sequence_length=128, truncate="longest_first", **kwargs):
        """Preprocessor for a preset directory, a vocab file, an `hf://` handle or a
        preset name (see `BertTokenizer.from_preset`); `kwargs` go to
        `BertTokenizer.from_preset`."""
        tokenizer = BertTokenizer.from_preset(preset, **kwargs)
        return cls(tokenizer, sequence_length=sequence_length, truncate=truncate)
