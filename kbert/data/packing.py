"""Packed masked-LM pretraining data: several whole documents per row.

At length 512 most rows built from one document end in padding (the last piece of every
document, and every document shorter than the row). Packing puts several documents into one row
instead, so the model computes on real tokens. A backbone built with `packed=True` keeps the
documents of a row apart: each token attends only to its own document and positions restart at
every document (see `kbert.models.BertBackbone`), so a packed row gives every document the
outputs it would get alone.
"""

import random

import numpy as np

from kbert.data.checks import check_positive_int
from kbert.data.documents import open_documents
from kbert.data.pretraining import check_masked_lm_arguments, masked_lm_dataset


def pack_pieces(pieces, sequence_length, packing_buffer):
    """First-fit packing of token pieces into rows, from a bounded set of open rows.

    Each piece becomes `[CLS] piece [SEP]` (so takes `len(piece) + 2` slots) and goes into the
    first open row (oldest first) that still has room; a row that becomes full is emitted at
    once. A piece that fits nowhere opens a new row; when more than `packing_buffer` rows are
    open, the fullest one (the oldest among equals) is emitted. At the end every open row is
    emitted, oldest first. Documents are never reordered inside a row, and no piece is split.

    Args:
        pieces: iterable of 1-D int arrays, each at most `sequence_length - 2` long.
        sequence_length: int. Row length.
        packing_buffer: int. Open rows held at most.

    Yields:
        Lists of pieces, one list per row, in the order the rows are emitted.
    """
    rows = []  # [pieces, used slots]
    for piece in pieces:
        size = len(piece) + 2
        if size > sequence_length:
            raise ValueError(
                f"A piece of {len(piece)} tokens does not fit a row of {sequence_length} "
                "with [CLS] and [SEP]."
            )
        for index, row in enumerate(rows):
            if row[1] + size <= sequence_length:
                row[0].append(piece)
                row[1] += size
                if row[1] == sequence_length:
                    yield rows.pop(index)[0]
                break
        else:
            rows.append([[piece], size])
            if size == sequence_length:
                yield rows.pop()[0]
            elif len(rows) > packing_buffer:
                fullest = max(range(len(rows)), key=lambda i: (rows[i][1], -i))
                yield rows.pop(fullest)[0]
    for row in rows:
        yield row[0]


class _PackedRowGenerator:
    """Builds the rows of one pass; one call = one pass (a pure function of seed and pass)."""

    def __init__(
        self,
        source,
        sequence_length,
        pack,
        packing_buffer,
        batch_size,
        drop_remainder,
        repeat,
        seed,
        cls_id,
        sep_id,
        pad_id,
    ):
        self.source = source
        self.sequence_length = sequence_length
        self.pack = pack
        self.packing_buffer = packing_buffer
        self.batch_size = batch_size
        self.drop_remainder = drop_remainder
        self.repeat = repeat
        self.seed = seed
        self.cls_id, self.sep_id, self.pad_id = cls_id, sep_id, pad_id
        self.passes_started = 0

    def pieces(self, rng):
        """The documents of one pass cut into pieces of at most `sequence_length - 2` tokens."""
        step = self.sequence_length - 2
        for document in self.source.documents(rng):
            tokens = np.concatenate(document).astype(np.int32)
            for start in range(0, len(tokens), step):
                yield tokens[start : start + step]

    def pass_rows(self, pass_index):
        rng = random.Random(f"kbert-packing:{self.seed}:{pass_index}")
        pieces = self.pieces(rng)
        if not self.pack:
            return ([piece] for piece in pieces)
        return pack_pieces(pieces, self.sequence_length, self.packing_buffer)

    def to_arrays(self, rows):
        n, length = len(rows), self.sequence_length
        token_ids = np.full((n, length), self.pad_id, np.int32)
        document_ids = np.zeros((n, length), np.int32)
        lengths = np.zeros((n,), np.int32)
        for r, row in enumerate(rows):
            end = 0
            for d, piece in enumerate(row, start=1):
                stop = end + len(piece) + 2
                token_ids[r, end] = self.cls_id
                token_ids[r, end + 1 : stop - 1] = piece
                token_ids[r, stop - 1] = self.sep_id
                document_ids[r, end:stop] = d
                end = stop
            lengths[r] = end
        segment_ids = np.zeros((n, length), np.int32)
        return token_ids, segment_ids, lengths, np.zeros((n,), np.int32), document_ids

    def __call__(self):
        while True:
            pass_index = self.passes_started
            self.passes_started += 1
            batch, batch_index = [], 0
            for row in self.pass_rows(pass_index):
                batch.append(row)
                if len(batch) == self.batch_size:
                    mask_seed = np.array([self.seed, (pass_index << 32) + batch_index], np.int64)
                    yield self.to_arrays(batch) + (mask_seed,)
                    batch, batch_index = [], batch_index + 1
            if batch and not self.drop_remainder:
                mask_seed = np.array([self.seed, (pass_index << 32) + batch_index], np.int64)
                yield self.to_arrays(batch) + (mask_seed,)
                batch_index += 1
            if batch_index == 0 and self.repeat:
                raise ValueError(
                    "A pass over the files gives no batch: they hold fewer rows than "
                    f"batch_size={self.batch_size} (with drop_remainder=True)."
                )
            if not self.repeat:
                return


def packed_pretraining_dataset(
    files,
    tokenizer,
    sequence_length=512,
    max_predictions=80,
    mask_rate=0.15,
    whole_word_masking=False,
    batch_size=32,
    seed=None,
    pack=True,
    packing_buffer=64,
    shuffle=True,
    repeat=False,
    random_token_rate=0.1,
    unchanged_rate=0.1,
    text_format="auto",
    drop_remainder=False,
    num_processes=None,
    process_index=None,
):
    """Masked-LM pretraining batches with several whole documents packed into each row.

    Documents are read as streams exactly as `kbert.data.pretraining_dataset` reads them (raw
    text files or the shards of `tools/prepare_pretraining_data.py`; the same file order,
    process split and memory bound). Each document's tokens are cut into pieces of at most
    `sequence_length - 2` tokens (a document that fits a row is one piece); each piece becomes
    `[CLS] piece [SEP]`, and pieces are packed first-fit into rows from a buffer of at most
    `packing_buffer` open rows (see `pack_pieces`). `document_ids` numbers the pieces of a row
    1, 2, ... (0 = padding): a backbone built with `packed=True` attends within each piece only
    and restarts positions at each, so the model sees every piece as if it were alone in a row.
    With `pack=False`, every piece gets a row of its own (the same tokens, unpacked: a baseline
    for measuring what packing gains).

    Masking is `pretraining_dataset`'s dynamic masking, per row: candidates are all tokens but
    `[CLS]`, `[SEP]` and `[PAD]`; `min(max_predictions, max(1, round(candidates * mask_rate)))`
    of them are predicted; each becomes `[MASK]`, a random token or stays unchanged in the
    proportions `1 - random_token_rate - unchanged_rate`, `random_token_rate`,
    `unchanged_rate`. Masks are stateless random draws keyed by `(seed, pass, batch index)`, so
    given the seed the batches are reproducible, and every pass (epoch) draws new masks.

    Args:
        files: str, path-like, or list of them: text files or glob patterns (see
            `kbert.data.read_documents` for the formats), or pretraining shards (`*.tfrecord`)
            of this tokenizer's vocabulary.
        tokenizer: a `kbert.text.BertTokenizer` (or an object with its interface).
        sequence_length: int. Row length, at least 8. Defaults to 512.
        max_predictions: int. Masked positions per row, at most `sequence_length - 2`.
            Defaults to 80 (BERT's value at 512).
        mask_rate: float in [0, 1]. Fraction of the candidate tokens to predict.
            Defaults to 0.15.
        whole_word_masking: bool. Mask whole words. Defaults to `False`.
        batch_size: int. Rows per batch. Defaults to 32.
        seed: int or `None`. Seed of the file order and the masks; `None` draws one.
        pack: bool. Pack several pieces per row. Defaults to `True`.
        packing_buffer: int. Open rows held while packing. Defaults to 64.
        shuffle: bool. Read the files in a seeded random order. Defaults to `True`.
        repeat: bool. Repeat forever, each pass with new masks. Defaults to `False`.
        random_token_rate: float in [0, 1]. Defaults to 0.1.
        unchanged_rate: float in [0, 1]. Defaults to 0.1.
        text_format: `"auto"`, `"lines"` or `"wikitext"`. Defaults to `"auto"`.
        drop_remainder: bool. Drop the last, smaller batch of each pass. Defaults to `False`.
        num_processes: int or `None`. Processes reading the data (see `pretraining_dataset`).
        process_index: int or `None`. This process's index in `[0, num_processes)`.

    Returns:
        A `tf.data.Dataset` of `(x, y, sample_weight)` for `BertPretrainer(backbone,
        next_sentence=False).fit` with a `packed=True` backbone: `x` = `{"token_ids",
        "segment_ids" (zeros), "padding_mask", "document_ids"}` int32 `(batch_size,
        sequence_length)` and `"mask_positions"` int32 `(batch_size, max_predictions)`;
        `y = {"mlm"}` the original ids at `mask_positions`; `sample_weight = {"mlm"}` 1 for a
        real prediction, 0 for a padded slot.

    Example:

    ```python
    backbone = kbert.models.BertBackbone.from_preset("bert_tiny_en_uncased", packed=True)
    pretrainer = kbert.models.BertPretrainer(backbone, next_sentence=False)
    ds = kbert.data.packed_pretraining_dataset("wiki.train.raw", tokenizer, seed=0)
    pretrainer.fit(ds, epochs=1)
    ```
    """
    seed = check_masked_lm_arguments(
        tokenizer,
        sequence_length=sequence_length,
        max_predictions=max_predictions,
        reserved_tokens=2,
        batch_size=batch_size,
        mask_rate=mask_rate,
        random_token_rate=random_token_rate,
        unchanged_rate=unchanged_rate,
        seed=seed,
    )
    check_positive_int("packing_buffer", packing_buffer)
    for name, value in (
        ("pack", pack),
        ("shuffle", shuffle),
        ("repeat", repeat),
        ("whole_word_masking", whole_word_masking),
        ("drop_remainder", drop_remainder),
    ):
        if not isinstance(value, bool):
            raise ValueError(f"`{name}` must be True or False. Received: {name}={value!r}")
    source, *_ = open_documents(
        files, tokenizer, text_format, num_processes, process_index, shuffle
    )
    generator = _PackedRowGenerator(
        source,
        sequence_length=sequence_length,
        pack=pack,
        packing_buffer=packing_buffer,
        batch_size=batch_size,
        drop_remainder=drop_remainder,
        repeat=repeat,
        seed=seed,
        cls_id=int(tokenizer.cls_token_id),
        sep_id=int(tokenizer.sep_token_id),
        pad_id=int(tokenizer.pad_token_id),
    )
    return masked_lm_dataset(
        generator,
        tokenizer,
        sequence_length=sequence_length,
        batch_size=batch_size,
        drop_remainder=drop_remainder,
        max_predictions=max_predictions,
        mask_rate=mask_rate,
        whole_word_masking=whole_word_masking,
        random_token_rate=random_token_rate,
        unchanged_rate=unchanged_rate,
        nsp=False,
        row_features=("document_ids",),
    )
