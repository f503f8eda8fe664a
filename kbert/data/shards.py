"""Pre-tokenized pretraining shards: TFRecord files of documents, tagged with their vocabulary.

A shard is a TFRecord file (the format `tf.data.TFRecordDataset` streams) of `tf.train.Example`
records. The first record holds the metadata: feature `kbert_shard` (bytes, a JSON object with
`format`, `vocabulary_digest`, `vocabulary_size` and `lowercase`). Each following record is one
document: feature `token_ids` (bytes, the little-endian int32 ids of all its sentences, back to
back) and `sentence_lengths` (bytes, little-endian int32, the number of ids of each sentence).
Storing raw int32 bytes instead of int64 lists keeps shards small and reading them fast.

`tools/prepare_pretraining_data.py` writes shards; `kbert.data.pretraining_dataset` reads them.
"""

import hashlib
import json
import os

import numpy as np
import tensorflow as tf

SHARD_FORMAT = "kbert-pretraining-shard-1"
SHARD_SUFFIX = ".tfrecord"


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
        self.temporary = f"{self.path}.tmp-{os.getpid()}"
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
        ids = np.concatenate(sentences).astype("<i4")
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
        os.replace(self.temporary, self.path)

    def abort(self):
        self._writer.close()
        if os.path.exists(self.temporary):
            os.remove(self.temporary)


def read_shard_metadata(path):
    """Returns the metadata dict of a shard; raises `ValueError` for a file that is not one."""
    try:
        first = next(iter(tf.data.TFRecordDataset(path).take(1)), None)
    except tf.errors.OpError as error:
        raise ValueError(
            f"{path!r} is not a readable TFRecord shard ({error.message.splitlines()[0]}). "
            "Expected a shard written by tools/prepare_pretraining_data.py."
        ) from None
    if first is None:
        raise ValueError(f"The shard {path!r} is empty. Expected a shard written by "
                         "tools/prepare_pretraining_data.py.")
    try:
        example = tf.train.Example.FromString(first.numpy())
        value = example.features.feature["kbert_shard"].bytes_list.value[0]
        metadata = json.loads(value.decode("utf-8"))
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


def read_shard_documents(path):
    """Yields the documents of one shard, each a list of int32 arrays (its sentences)."""
    records = iter(tf.data.TFRecordDataset(path, buffer_size=1 << 22).prefetch(64))
    next(records)  # The metadata record.
    for record in records:
        features = tf.train.Example.FromString(record.numpy()).features.feature
        ids = np.frombuffer(features["token_ids"].bytes_list.value[0], "<i4").astype(np.int32)
        lengths = np.frombuffer(features["sentence_lengths"].bytes_list.value[0], "<i4")
        yield np.split(ids, np.cumsum(lengths)[:-1])


def write_pretraining_shards(
    files, tokenizer, output_dir, num_shards=8, text_format="auto", verbose=True
):
    """Tokenizes text files once into `num_shards` pretraining shards.

    Documents are read as a stream (see `kbert.data.read_documents` for the formats), tokenized
    with `tokenizer` and dealt to the shards in turn (document `k` goes to shard
    `k % num_shards`), so the shards are about equally large and memory stays bounded. Each shard
    is written to a temporary sibling file and renamed when complete; an existing shard is
    replaced only when the new one is complete.

    Args:
        files: str, path-like, or list of them. Text files or glob patterns.
        tokenizer: a `kbert.text.BertTokenizer` (its vocabulary digest is recorded).
        output_dir: str. Folder of the shards, created if needed. The shards are named
            `shard-00000-of-00008.tfrecord` etc.
        num_shards: int. Number of shard files; use at least the number of processes that will
            read them (each process reads whole shards). Defaults to 8.
        text_format: str. `"auto"`, `"lines"` or `"wikitext"`. Defaults to `"auto"`.
        verbose: bool. Show a progress bar (documents written). Defaults to `True`.

    Returns:
        The list of shard paths.
    """
    from kbert.data.pretraining import (
        _DocumentSource,
        _check_positive_int,
        _check_text_file,
        _expand_files,
    )

    _check_positive_int("num_shards", num_shards)
    paths = _expand_files(files)
    for path in paths:
        if path.endswith(SHARD_SUFFIX):
            raise ValueError(f"{path!r} is already a shard; pass text files.")
        _check_text_file(path)
    os.makedirs(output_dir, exist_ok=True)
    source = _DocumentSource(paths, "text", tokenizer, text_format, 1, 0, shuffle=False)
    targets = [
        os.path.join(output_dir, f"shard-{i:05d}-of-{num_shards:05d}{SHARD_SUFFIX}")
        for i in range(num_shards)
    ]
    writers = [ShardWriter(path, tokenizer) for path in targets]
    progbar = None
    if verbose:
        import keras

        progbar = keras.utils.Progbar(None, unit_name="document")
    try:
        count = tokens = 0
        for count, document in enumerate(source.documents(rng=None), start=1):
            writers[(count - 1) % num_shards].write(document)
            tokens += sum(len(s) for s in document)
            if progbar is not None and count % 100 == 0:
                progbar.update(count, [("tokens", tokens)], finalize=False)
        if not count:
            raise ValueError(f"No text found: the files hold no tokens. Received: files={files!r}")
    except BaseException:
        for writer in writers:
            writer.abort()
        raise
    for writer in writers:
        writer.close()
    if progbar is not None:
        progbar.update(count, finalize=True)
        print(f"Wrote {count:,} documents, {tokens:,} tokens into {num_shards} shards in "
              f"{output_dir}")
    return targets
