"""Pre-tokenized pretraining shards: TFRecord files of documents, tagged with their vocabulary.

`write_pretraining_shards` tokenizes text files once into shards (run by
`tools/prepare_pretraining_data.py`); `kbert.data.pretraining_dataset` and
`kbert.data.packed_pretraining_dataset` read them. The file format, its writer and readers are
in `kbert.data.shard_records`; its public names are available here too.
"""

import os

import numpy as np

from kbert.data.checks import check_positive_int
from kbert.data.documents import DocumentSource, check_text_file, expand_files
from kbert.data.shard_records import (
    SHARD_FORMAT,
    SHARD_SUFFIX,
    ShardWriter,
    check_shards,
    read_shard_documents,
    read_shard_flat_documents,
    read_shard_metadata,
    vocabulary_digest,
)

__all__ = [
    "SHARD_FORMAT",
    "SHARD_SUFFIX",
    "ShardWriter",
    "check_shards",
    "read_shard_documents",
    "read_shard_flat_documents",
    "read_shard_metadata",
    "vocabulary_digest",
    "write_pretraining_shards",
]


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
    check_positive_int("num_shards", num_shards)
    paths = expand_files(files)
    for path in paths:
        if path.endswith(SHARD_SUFFIX):
            raise ValueError(f"{path!r} is already a shard; pass text files.")
        check_text_file(path)
    os.makedirs(output_dir, exist_ok=True)
    source = DocumentSource(paths, "text", tokenizer, text_format, 1, 0, shuffle=False)
    targets = [
        os.path.join(output_dir, f"shard-{i:05d}-of-{num_shards:05d}{SHARD_SUFFIX}")
        for i in range(num_shards)
    ]
    writers = [ShardWriter(path, tokenizer) for path in targets]
    progbar = None
    if verbose:
        import keras

        progbar = keras.utils.Progbar(None, unit_name="document", stateful_metrics=["tokens"])
    try:
        count = tokens = 0
        for count, (ids, bounds) in enumerate(source.flat_documents(rng=None), start=1):
            writers[(count - 1) % num_shards].write_flat(ids, np.diff(bounds))
            tokens += len(ids)
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
        print(
            f"Wrote {count:,} documents, {tokens:,} tokens into {num_shards} shards in {output_dir}"
        )
    return targets
