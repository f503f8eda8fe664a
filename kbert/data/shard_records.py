"""Pre-tokenized pretraining shards: TFRecord files of documents, tagged with their vocabulary.

A shard is a TFRecord file (the format `tf.data.TFRecordDataset` streams) of `tf.train.Example`
records. The first record holds the metadata: feature `kbert_shard` (bytes, a JSON object with
`format`, `vocabulary_digest`, `vocabulary_size` and `lowercase`). Each following record is one
document: feature `token_ids` (bytes, the little-endian int32 ids of all its sentences, back to
back) and `sentence_lengths` (bytes, little-endian int32, the number of ids of each sentence).
Storing raw int32 bytes instead of int64 lists keeps shards small and reading them fast.

This module is the format: `ShardWriter`, the readers and the checks.
`kbert.data.write_pretraining_shards` (`kbert.data.shards`, run by
`tools/prepare_pretraining_data.py`) writes shards; `kbert.data.pretraining_dataset` reads them.
"""

import hashlib
import json
import os
import struct

import numpy as np

from kbert.backend import tensorflow
from kbert.checkpoints.atomic import AtomicFile

tf = tensorflow.tensorflow("kbert's pretraining shards")

SHARD_FORMAT = "kbert-pretraining-shard-1"
SHARD_SUFFIX = ".tfrecord"
_MAX_METADATA_BYTES = 1 << 20


def vocabulary_digest(vocabulary):
    """A short SHA-256 digest of a vocabulary (its tokens in id order).

    Args:
        vocabulary: list of str, the tokens in id order.

    Returns:
        A str of 16 hexadecimal digits.

    Example:

    >>> vocabulary_digest(["[PAD]", "[UNK]", "a"])
    'c85ad14c2f651e47'
    """
    return hashlib.sha256("\n".join(vocabulary).encode("utf-8")).hexdigest()[:16]


def _bytes_feature(value):
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


class ShardWriter:
    """Writes one shard atomically: a temporary sibling file, renamed on `close()`.

    Args:
        path: str. The shard path (should end with `.tfrecord`).
        tokenizer: the tokenizer whose ids the documents hold (its vocabulary digest is
            recorded).
    """

    def __init__(self, path, tokenizer):
        self.path = os.fspath(path)
        self._file = AtomicFile(self.path)
        self.temporary = os.fspath(self._file.temporary)
        self.num_documents = 0
        self._writer = tf.io.TFRecordWriter(self.temporary)
        metadata = {
            "format": SHARD_FORMAT,
            "vocabulary_digest": vocabulary_digest(list(tokenizer.vocabulary)),
            "vocabulary_size": len(tokenizer.vocabulary),
            "lowercase": bool(getattr(tokenizer, "lowercase", True)),
        }
        record = tf.train.Example(
            features=tf.train.Features(
                feature={"kbert_shard": _bytes_feature(json.dumps(metadata).encode("utf-8"))}
            )
        )
        self._writer.write(record.SerializeToString())

    def write(self, sentences):
        """Writes one document, a list of 1-D integer arrays (the ids of its sentences)."""
        sentences = [np.asarray(s, np.int32) for s in sentences if len(s)]
        if not sentences:
            return
        lengths = np.array([len(s) for s in sentences], "<i4")
        self.write_flat(np.concatenate(sentences), lengths)

    def write_flat(self, ids, sentence_lengths):
        """Writes one document given as all its ids back to back and its sentence lengths."""
        lengths = np.asarray(sentence_lengths, "<i4")
        lengths = lengths[lengths > 0]
        if not len(lengths):
            return
        ids = np.asarray(ids).astype("<i4")
        if int(lengths.sum()) != len(ids):
            raise ValueError(
                f"`sentence_lengths` must add up to the number of ids. Received: {len(ids)} "
                f"ids and sentence lengths adding up to {int(lengths.sum())}"
            )
        record = tf.train.Example(
            features=tf.train.Features(
                feature={
                    "token_ids": _bytes_feature(ids.tobytes()),
                    "sentence_lengths": _bytes_feature(lengths.tobytes()),
                }
            )
        )
        self._writer.write(record.SerializeToString())
        self.num_documents += 1

    def close(self):
        self._writer.close()
        self._file.commit()

    def abort(self):
        self._writer.close()
        self._file.abort()


def _first_record(path):
    """The first record of a TFRecord file, read directly (no `tf.data` pipeline to build).

    A TFRecord file is a sequence of `uint64 length, uint32 CRC of length, data, uint32 CRC of
    data` (little-endian). Building a `tf.data` reader costs tens of milliseconds, which adds up
    over thousands of shards before the first batch; this reads a few bytes instead. The CRCs
    are not checked here (the JSON metadata it holds is parsed and checked instead); the records
    read for training go through `tf.data`, which checks them.
    """
    with tf.io.gfile.GFile(path, "rb") as f:
        header = f.read(12)
        if len(header) == 0:
            return None
        if len(header) < 12:
            raise ValueError("truncated record header")
        (length,) = struct.unpack("<Q", header[:8])
        if length > _MAX_METADATA_BYTES:
            raise ValueError(f"first record of {length} bytes, larger than any shard metadata")
        data = f.read(length)
        if len(data) != length:
            raise ValueError("truncated record")
        return data


def read_shard_metadata(path):
    """Returns the metadata dict of a shard; raises `ValueError` for a file that is not one."""
    try:
        first = _first_record(path)
    except (ValueError, tf.errors.OpError) as error:
        message = getattr(error, "message", str(error)).splitlines()[0]
        raise ValueError(
            f"{path!r} is not a readable TFRecord shard ({message}). "
            "Expected a shard written by tools/prepare_pretraining_data.py."
        ) from None
    if first is None:
        raise ValueError(
            f"The shard {path!r} is empty. Expected a shard written by "
            "tools/prepare_pretraining_data.py."
        )
    try:
        example = tf.train.Example.FromString(first)
        value = example.features.feature["kbert_shard"].bytes_list.value[0]
        metadata = json.loads(value.decode("utf-8"))
        if not isinstance(metadata, dict):
            raise TypeError(type(metadata).__name__)
    except Exception:
        raise ValueError(
            f"{path!r} is a TFRecord file but not a kbert pretraining shard (its first record "
            "holds no `kbert_shard` metadata). Expected a shard written by "
            "tools/prepare_pretraining_data.py."
        ) from None
    if metadata.get("format") != SHARD_FORMAT:
        raise ValueError(
            f"The shard {path!r} has format {metadata.get('format')!r}; this kbert reads "
            f"{SHARD_FORMAT!r}. Write it again with tools/prepare_pretraining_data.py."
        )
    return metadata


def check_shards(paths, tokenizer):
    """Checks that every shard was written with `tokenizer`'s vocabulary."""
    expected = vocabulary_digest(list(tokenizer.vocabulary))
    for path in paths:
        metadata = read_shard_metadata(path)
        if metadata["vocabulary_digest"] != expected:
            raise ValueError(
                f"The shard {path!r} was written with another vocabulary (digest "
                f"{metadata['vocabulary_digest']}, {metadata.get('vocabulary_size')} tokens) "
                f"than the tokenizer given here (digest {expected}, "
                f"{len(tokenizer.vocabulary)} tokens). Use the tokenizer the shards were made "
                "with, or write the shards again with this one."
            )


_DOCUMENT_FEATURES = {
    "token_ids": tf.io.FixedLenFeature([], tf.string),
    "sentence_lengths": tf.io.FixedLenFeature([], tf.string),
}
_RECORDS_PER_READ = 64


def _parse_records(records):
    """Parses a batch of document records into flat int32 arrays, in TensorFlow ops.

    Returns the ids of all the documents back to back, the number of ids of each document,
    all their sentence lengths back to back and the number of sentences of each document.
    Running this in `Dataset.map` keeps the parsing out of the Python thread.
    """
    features = tf.io.parse_example(records, _DOCUMENT_FEATURES)
    ids, lengths = features["token_ids"], features["sentence_lengths"]
    return (
        tf.io.decode_raw(tf.strings.reduce_join(ids), tf.int32, little_endian=True),
        tf.strings.length(ids) // 4,
        tf.io.decode_raw(tf.strings.reduce_join(lengths), tf.int32, little_endian=True),
        tf.strings.length(lengths) // 4,
    )


def read_shard_flat_documents(paths, cycle_length=4):
    """Yields the documents of shards as `(ids, sentence_lengths)` pairs of int32 arrays.

    `ids` holds the ids of all the document's sentences back to back; `sentence_lengths` the
    number of ids of each sentence (all positive). This is the fast form: no per-sentence
    arrays. The files are read `cycle_length` at a time, one document from each in turn (a
    finished file is replaced by the next one), by a parallel `tf.data` interleave; records are
    parsed 64 at a time in TensorFlow ops, ahead of the consumer, outside the Python thread.

    Args:
        paths: str or list of str. Shard files, read in this order.
        cycle_length: int. Files read at the same time. Defaults to 4.
    """
    paths = [paths] if isinstance(paths, (str, bytes, os.PathLike)) else list(paths)
    paths = [os.fsdecode(p) for p in paths]
    if not paths:
        return
    batches = (
        tf.data.Dataset.from_tensor_slices(paths)
        .interleave(
            # Record 0 of each file is its metadata.
            lambda path: tf.data.TFRecordDataset(path, buffer_size=1 << 22).skip(1),
            cycle_length=cycle_length,
            block_length=1,
            num_parallel_calls=min(cycle_length, len(paths)),
            deterministic=True,
        )
        .batch(_RECORDS_PER_READ)
        .map(_parse_records)
        .prefetch(2)
    )
    try:
        for ids, id_counts, lengths, length_counts in batches.as_numpy_iterator():
            id_ends = np.cumsum(id_counts)
            length_ends = np.cumsum(length_counts)
            for k in range(len(id_counts)):
                doc_ids = ids[id_ends[k] - id_counts[k] : id_ends[k]]
                doc_lengths = lengths[length_ends[k] - length_counts[k] : length_ends[k]]
                if int(doc_lengths.sum()) != len(doc_ids) or (doc_lengths <= 0).any():
                    raise ValueError(
                        f"A shard of {paths!r} holds a corrupt document record: its sentence "
                        f"lengths (sum {int(doc_lengths.sum())}) do not describe its "
                        f"{len(doc_ids)} token ids. Write the shards again with "
                        "tools/prepare_pretraining_data.py."
                    )
                yield doc_ids, doc_lengths
    except tf.errors.OpError as error:
        raise ValueError(
            f"A shard of {paths!r} cannot be read ({error.message.splitlines()[0]}). Write it "
            "again with tools/prepare_pretraining_data.py."
        ) from None


def read_shard_documents(path):
    """Yields the documents of one shard, each a list of int32 arrays (its sentences)."""
    for ids, lengths in read_shard_flat_documents(path):
        yield np.split(ids, np.cumsum(lengths)[:-1])
