"""BERT pretraining datasets: the stages assembled into a `tf.data.Dataset`.

The recipe follows google-research/bert `create_pretraining_data.py` (Devlin et al. 2018,
arXiv 1810.04805), with one deliberate change: masking is *dynamic*. Instead of baking one
mask per example into files, the masks are drawn in the `tf.data` pipeline for every pass over
the data (as RoBERTa does), with stateless random ops, so a given seed always reproduces the
same batches.

Pipeline (streaming; memory does not grow with the corpus):

1. The files (this process's share) are read line by line and parsed into documents made of
   sentences; pre-tokenized shards (`kbert.data.shards`) skip this step and the next (they are
   read and parsed by a parallel `tf.data` interleave, 64 records at a time).
2. Sentences are tokenized in chunks with the tokenizer, in worker threads.
3. A Python generator passes the documents (flat id arrays with sentence offsets) through a
   seeded buffer, builds the sentence pairs (target length, random `A` end, 50 % random next
   sentence from another buffered document, longest-first truncation from random ends) as
   views into those arrays - chunks found by bisection, truncation in closed form, a few
   operations per pair - shuffles them in a bounded buffer and packs each batch
   `[CLS] A [SEP] B [SEP]` with one NumPy scatter. This is what makes pre-tokenized shards fast
   (tens of thousands of sequences per second on one core); raw text is bound by tokenization
   (plain-ASCII sentences take tensorflow-text's fused tokenizer, the rest the exact graph).
4. A batched `Dataset.map` in TensorFlow ops chooses the masked positions and applies the
   80 % `[MASK]` / 10 % random token / 10 % unchanged replacement.

Each stage is a module: `documents` (steps 1-2), `nsp` (step 3), `masking` (step 4); this one
assembles them, and `masked_lm_dataset` is the tail every builder shares (`packing` builds
rows of several documents instead of pairs and ends with the same tail).
"""

from kbert.backend import tensorflow
from kbert.data.checks import check_positive_int, check_rate, checked_seed
from kbert.data.documents import check_tokenizer, open_documents
from kbert.data.masking import DynamicMasker, check_masking_rates
from kbert.data.nsp import PairGenerator

tf = tensorflow.tensorflow("kbert's pretraining pipeline")


def pretraining_dataset(
    files,
    tokenizer,
    sequence_length=128,
    max_predictions=20,
    mask_rate=0.15,
    nsp=True,
    short_seq_prob=0.1,
    whole_word_masking=False,
    batch_size=32,
    seed=None,
    dupe_factor=1,
    shuffle=True,
    repeat=False,
    random_token_rate=0.1,
    unchanged_rate=0.1,
    text_format="auto",
    drop_remainder=False,
    verbose=False,
    num_processes=None,
    process_index=None,
    document_buffer=1000,
    example_buffer=10000,
):
    """Builds the BERT pretraining `tf.data.Dataset` (masked LM + next sentence prediction).

    The files are read as streams: text is parsed line by line and tokenized in chunks by
    worker threads while training runs (or read pre-tokenized from shards written by
    `tools/prepare_pretraining_data.py`), so memory is bounded by the buffers below, not by the
    corpus, and the first batch comes after a few thousand sentences. Each pass over the returned
    dataset builds new sentence pairs (google-research/bert's `create_pretraining_data.py`
    recipe) and draws new masks (dynamic masking), so every epoch of `fit` sees different
    examples. Pass `k` is a pure function of `(seed, k)` and the process split: two datasets
    built with the same arguments and seed yield identical batches, masks included.

    Streaming. Each pass reads this process's files in a seeded random order, up to 4 at a time,
    one document from each in turn. Raw text is limited by tokenization, shards are not: for
    long runs, tokenize once into shards (figures in BENCHMARKS.md). Documents go through a
    buffer of `document_buffer` documents; the next document made into examples is drawn from it
    at random (the oldest with `shuffle=False`). Examples go through a shuffle buffer of
    `example_buffer` examples. Both buffers start handing out items before they are full (one
    for every two new ones), so the first batch comes early. Deviation from the in-memory
    reference: the "random other document" of a NotNext pair is drawn uniformly from the
    document buffer and the `document_buffer` documents used last, not from the whole corpus;
    the NotNext rate (about 50 %) and the fact that B comes from another document are unchanged.
    With a corpus smaller than the buffer, the whole corpus is the pool, as in the reference.

    Several processes (hosts). With `num_processes > 1`, each process reads a disjoint part:
    file `i` goes to process `i % num_processes` when there are at least as many files as
    processes (write enough shards), else document `k` of the stream goes to process
    `k % num_processes` (each process then reads, but skips, the others' text). By default
    (`None`) the split comes from `jax.process_count()` / `jax.process_index()` when JAX is
    loaded, else one process.

    Pairs. For each document, a target length of `sequence_length - 3` tokens (uniform in
    `[2, sequence_length - 3]` with probability `short_seq_prob`) is filled with whole
    sentences; the first `a_end` of them (random) form segment A. With probability 0.5, or
    always when only one sentence was gathered, B is read from a random start in another
    document (label 1, NotNext) and the unused sentences are read again for the next example;
    otherwise B is the rest of the gathered sentences (label 0, IsNext). The pair is truncated
    longest-first, one token at a time from the front or the back at random (computed in closed
    form: the kept lengths, then a Binomial(cut, 1/2) number of cuts at the front, which is the
    same distribution). The other document
    is drawn uniformly among all other documents (the reference retries up to 10 times and may
    fall back to the same document). With `nsp=False`, the gathered sentences form one segment
    of at most `sequence_length - 2` tokens, `segment_ids` are all 0 and the NSP entries are
    absent.

    Masking. Candidates are all tokens except `[CLS]`, `[SEP]` and `[PAD]`. The number of
    predictions is `min(max_predictions, max(1, round(num_candidates * mask_rate)))` (Python
    rounding, half to even). Each chosen token becomes `[MASK]` with probability
    `1 - random_token_rate - unchanged_rate`, a random token with probability
    `random_token_rate` (uniform over the vocabulary except `[PAD]`, `[UNK]`, `[CLS]`, `[SEP]`
    and `[MASK]`), and stays unchanged otherwise. With `whole_word_masking=True`, words
    (a piece followed by its "##" pieces, never across `[SEP]`) are visited in a random order
    and taken whole when they still fit in the prediction budget, so an example can get fewer
    predictions than the formula when no remaining word fits; each piece of a chosen word is
    still replaced independently (80/10/10), as in the reference. Masks are drawn by stateless
    random ops keyed by `(seed, pass, batch index)`.

    Args:
        files: str, path-like, or list of them. Text files or glob patterns; see
            `read_documents` for the formats (BERT's one sentence per line with blank lines
            between documents, or WikiText raw). Invalid UTF-8 is decoded as U+FFFD. `"auto"`
            looks for a WikiText title line in the first 20,000 lines of each file. Or shards
            (`*.tfrecord`) written by `tools/prepare_pretraining_data.py` with this
            tokenizer's vocabulary (shards of another vocabulary are refused). Empty and binary
            files are refused.
        tokenizer: a `kbert.text.BertTokenizer` or an object with the same interface:
            `tokenize(tf.string batch) -> tf.RaggedTensor` of ids, `vocabulary` (list of str)
            and `cls_token_id`, `sep_token_id`, `pad_token_id`, `mask_token_id`,
            `unk_token_id`.
        sequence_length: int. Length of every packed example. At least 8. Defaults to 128.
        max_predictions: int. Masked positions per example (the width of `mask_positions`).
            At most `sequence_length - 3` (`- 2` without NSP). Defaults to 20.
        mask_rate: float in [0, 1]. Fraction of the candidate tokens to predict.
            Defaults to 0.15.
        nsp: bool. Build sentence pairs with NSP labels. Needs at least two documents.
            Defaults to `True`.
        short_seq_prob: float in [0, 1]. Probability of a shorter target length.
            Defaults to 0.1.
        whole_word_masking: bool. Mask whole words instead of single pieces.
            Defaults to `False`.
        batch_size: int. Examples per batch. Defaults to 32.
        seed: int or `None`. Seed of the pairing and masking. `None` draws one at random.
            Defaults to `None`.
        dupe_factor: int. How many times each pass goes over every document (each time with
            different pairs). Defaults to 1.
        shuffle: bool. Shuffle the documents and the examples of each pass. With `False`,
            examples come in document order. Defaults to `True`.
        repeat: bool. Repeat forever; every repetition is a new pass with new pairs and
            masks. Defaults to `False`.
        random_token_rate: float in [0, 1]. Fraction of the chosen tokens replaced by a
            random token. Defaults to 0.1.
        unchanged_rate: float in [0, 1]. Fraction of the chosen tokens left unchanged.
            `random_token_rate + unchanged_rate` must be at most 1. Defaults to 0.1.
        text_format: str. `"auto"`, `"lines"` or `"wikitext"`; see `read_documents`.
            Defaults to `"auto"`.
        drop_remainder: bool. Drop the last, smaller batch of each pass. Defaults to `False`.
        verbose: bool. Print one line describing the input. Defaults to `False`.
        num_processes: int or `None`. Number of processes reading the data (see above).
            Pass it together with `process_index`. Defaults to `None`.
        process_index: int or `None`. This process's index, in `[0, num_processes)`.
            Defaults to `None`.
        document_buffer: int. Documents held for choosing the next document and the random
            next sentence. Defaults to 1000.
        example_buffer: int. Examples held for shuffling. Defaults to 10000.

    Returns:
        A `tf.data.Dataset` of `(x, y, sample_weight)`, the input of `BertPretrainer.fit`:
        `x` = `{"token_ids", "segment_ids", "padding_mask"}` int32 `(batch_size,
        sequence_length)` (`padding_mask` is 1 for real tokens, 0 for padding) and
        `"mask_positions"` int32 `(batch_size, max_predictions)`, ascending, padded with 0;
        `y` = `{"mlm"}` int32 `(batch_size, max_predictions)`, the original ids at
        `mask_positions` (0 in padded slots), and `"nsp"` int32 `(batch_size,)`, 0 = IsNext,
        1 = NotNext; `sample_weight` = `{"mlm"}` float32, 1 for a real prediction and 0 for a
        padded slot, and `"nsp"` float32 ones. Without NSP, the `"nsp"` keys are absent.

    Example:

    ```python
    tokenizer = kbert.text.BertTokenizer("vocab.txt")
    ds = kbert.data.pretraining_dataset(
        "wiki.valid.raw", tokenizer, sequence_length=128, batch_size=32, seed=0
    )
    x, y, sample_weight = next(iter(ds))
    pretrainer.fit(ds, epochs=3)  # new pairs and new masks every epoch
    ```

    Reference:
        Devlin et al., "BERT: Pre-training of Deep Bidirectional Transformers for Language
        Understanding", 2018 (arXiv 1810.04805); google-research/bert
        `create_pretraining_data.py`.
    """
    seed = check_masked_lm_arguments(
        tokenizer,
        sequence_length=sequence_length,
        max_predictions=max_predictions,
        reserved_tokens=3 if nsp else 2,
        batch_size=batch_size,
        mask_rate=mask_rate,
        random_token_rate=random_token_rate,
        unchanged_rate=unchanged_rate,
        seed=seed,
    )
    check_positive_int("dupe_factor", dupe_factor)
    check_rate("short_seq_prob", short_seq_prob)
    check_positive_int("document_buffer", document_buffer)
    check_positive_int("example_buffer", example_buffer)
    source, paths, kind, num_processes, process_index = open_documents(
        files,
        tokenizer,
        text_format,
        num_processes,
        process_index,
        shuffle,
        min_documents=2 if nsp else 1,
    )
    if verbose:
        print(
            f"Pretraining data: {len(paths)} {kind} file(s), streamed; process "
            f"{process_index} of {num_processes}."
        )

    generator = PairGenerator(
        source,
        sequence_length=sequence_length,
        nsp=nsp,
        short_seq_prob=short_seq_prob,
        dupe_factor=dupe_factor,
        shuffle=shuffle,
        repeat=repeat,
        batch_size=batch_size,
        drop_remainder=drop_remainder,
        seed=seed,
        cls_id=int(tokenizer.cls_token_id),
        sep_id=int(tokenizer.sep_token_id),
        pad_id=int(tokenizer.pad_token_id),
        document_buffer=document_buffer,
        example_buffer=example_buffer,
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
        nsp=nsp,
    )


def check_masked_lm_arguments(
    tokenizer,
    *,
    sequence_length,
    max_predictions,
    reserved_tokens,
    batch_size,
    mask_rate,
    random_token_rate,
    unchanged_rate,
    seed,
):
    """The checks every masked-LM builder makes first; returns the checked `seed`.

    `reserved_tokens` is the number of special tokens of a row that are never masked (3 for
    `[CLS] A [SEP] B [SEP]`, 2 for `[CLS] text [SEP]`).
    """
    check_tokenizer(tokenizer)
    check_positive_int("sequence_length", sequence_length, minimum=8)
    check_positive_int("max_predictions", max_predictions)
    max_maskable = sequence_length - reserved_tokens
    if max_predictions > max_maskable:
        raise ValueError(
            "`max_predictions` cannot exceed the number of maskable positions of a row, "
            f"sequence_length - {reserved_tokens} = {max_maskable}. "
            f"Received: max_predictions={max_predictions}, sequence_length={sequence_length}"
        )
    check_positive_int("batch_size", batch_size)
    check_masking_rates(mask_rate, random_token_rate, unchanged_rate)
    return checked_seed(seed)


def masked_lm_dataset(
    generator,
    tokenizer,
    *,
    sequence_length,
    batch_size,
    drop_remainder,
    max_predictions,
    mask_rate,
    whole_word_masking,
    random_token_rate,
    unchanged_rate,
    nsp,
    row_features=(),
):
    """The tail every pretraining builder shares: rows from `generator`, masked, prefetched.

    Args:
        generator: a callable returning an iterator of batches `(token_ids, segment_ids,
            lengths, nsp_labels, *row_features, mask_seed)`: int32 arrays `(rows,
            sequence_length)`, `(rows, sequence_length)`, `(rows,)`, `(rows,)`, one int32
            `(rows, sequence_length)` array per name of `row_features`, and the int64 pair
            `(seed, pass << 32 | batch index)` the masks are drawn from.
        tokenizer: the tokenizer (its special token ids and vocabulary).
        row_features: names of extra `(rows, sequence_length)` int32 features passed through
            into `x` unchanged (e.g. `"document_ids"`).
        The other arguments: as `pretraining_dataset`'s.

    Returns:
        The `tf.data.Dataset` of `(x, y, sample_weight)` described in `pretraining_dataset`.
    """
    masker = DynamicMasker(
        tokenizer,
        max_predictions=max_predictions,
        mask_rate=float(mask_rate),
        whole_word_masking=whole_word_masking,
        random_token_rate=float(random_token_rate),
        unchanged_rate=float(unchanged_rate),
        nsp=nsp,
    )
    row_features = tuple(row_features)
    rows = batch_size if drop_remainder else None
    matrix = tf.TensorSpec((rows, sequence_length), tf.int32)
    vector = tf.TensorSpec((rows,), tf.int32)
    dataset = tf.data.Dataset.from_generator(
        generator,
        output_signature=(
            (matrix, matrix, vector, vector)
            + (matrix,) * len(row_features)
            + (tf.TensorSpec((2,), tf.int64),)
        ),
    )

    def mask(token_ids, segment_ids, lengths, nsp_labels, *rest):
        x, y, sample_weight = masker(token_ids, segment_ids, lengths, nsp_labels, rest[-1])
        x.update(zip(row_features, rest[:-1]))
        return x, y, sample_weight

    # The masker is plain TensorFlow ops (its loop is an explicit `tf.while_loop`): no AutoGraph
    # conversion, which would cost seconds before the first batch.
    dataset = dataset.map(
        tf.autograph.experimental.do_not_convert(mask),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    return dataset.prefetch(tf.data.AUTOTUNE)
