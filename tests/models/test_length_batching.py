"""Length-aware batching: bucketed fit/evaluate/predict equal the full-length runs.

Every comparison runs the same model twice, with `length_batching` on and off (every batch
padded to the preprocessor's full length), and compares real positions only; rows have very
different lengths and the outputs of different rows differ by far more than the tolerance,
so a lost, cropped or reordered row fails.
"""

import keras
import numpy as np
import pytest

from kbert.data import batching
from kbert.models import BertClassifier, BertQuestionAnswerer, BertTagger
from tests.models.test_classifier import TOY_WORDS, toy_backbone, toy_preprocessor
from tests.per_backend import per_backend
from tests.test_case import assert_all_close

SEQUENCE_LENGTH = 48  # Buckets (16, 32, 48).
BUCKETS = batching.bucket_lengths(SEQUENCE_LENGTH)


def _sentences(count, seed=0, longest=40):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, longest, size=count)
    return [" ".join(rng.choice(TOY_WORDS, size=n)) for n in lengths]


def _differ(reference):
    """The rows' outputs differ from each other by far more than the tolerance."""
    flat = np.asarray(reference, "float64").reshape(len(reference), -1)
    assert np.abs(flat - flat[::-1]).max() > 1e-3


def _large_weights(model, seed=0):
    """Matrices drawn with std 0.2 (as HF's initializer_range in the parity tests): the
    rows' outputs then differ by far more than float error."""
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        if len(variable.shape) >= 2:
            variable.assign(rng.normal(0.0, 0.2, variable.shape).astype("float32"))
    return model


def _both(model, run):
    """`run(model)` with length batching, then with every batch at the full length."""
    bucketed = run(model)
    model.length_batching = False
    try:
        full = run(model)
    finally:
        model.length_batching = True
    return bucketed, full


# ------------------------------------------------------------------------- planning
def test_bucket_lengths_and_bound():
    assert batching.bucket_lengths(128) == (16, 32, 48, 64, 80, 96, 112, 128)
    assert len(batching.bucket_lengths(512)) == 16
    assert batching.bucket_lengths(40, granularity=16) == (16, 32, 40)
    with pytest.raises(ValueError, match="granularity"):
        batching.bucket_lengths(128, granularity=0)
    # Inference: steps of 4 up to 64, 8 up to 128, 16 up to 256, 32 beyond.
    short = tuple(range(4, 65, 4)) + tuple(range(72, 129, 8))
    assert batching.inference_buckets(128) == short
    assert batching.inference_buckets(300) == short + tuple(range(144, 257, 16)) + (288, 300)
    assert len(batching.inference_buckets(512)) == 40
    assert batching.inference_buckets(5) == (4, 5)
    assert batching.inference_buckets(3) == (3,)


def test_plan_sorts_for_inference_and_groups_shuffled_for_training():
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 49, size=203)
    plan = batching.plan_batches(lengths, 8, BUCKETS)
    rows = np.concatenate([r for r, _ in plan])
    assert sorted(rows.tolist()) == list(range(203)) and len(plan) == 26
    assert np.all(np.diff(lengths[rows]) <= 0)  # longest first
    for r, padded in plan:  # the smallest bucket holding the batch's longest row
        assert padded == min(b for b in BUCKETS if b >= lengths[r].max())

    first = batching.plan_batches(lengths, 8, BUCKETS, shuffle=True, seed=1, group_size=4)
    second = batching.plan_batches(lengths, 8, BUCKETS, shuffle=True, seed=2, group_size=4)
    for shuffled in (first, second):
        rows = np.concatenate([r for r, _ in shuffled])
        assert sorted(rows.tolist()) == list(range(203)) and len(shuffled) == 26
    assert [r.tolist() for r, _ in first] != [r.tolist() for r, _ in second]
    # Grouped by length: far less padding than random batches of the same rows.
    padding = sum(len(r) * lengths[r].max() - lengths[r].sum() for r, _ in first)
    random_rows = np.random.default_rng(3).permutation(203)
    random_batches = [random_rows[i : i + 8] for i in range(0, 203, 8)]
    random_padding = sum(len(r) * lengths[r].max() - lengths[r].sum() for r in random_batches)
    assert padding < 0.5 * random_padding


@pytest.mark.backend_independent
def test_tight_plan_cuts_the_sorted_rows_where_padding_is_least():
    """`plan_tight_batches`: the least padded positions plus `call_cost` per batch, found
    by trying every cut of the sorted rows (small cases), at most `batch_size` rows each."""
    import itertools

    def cost(batches, lengths, call_cost):
        return sum(len(r) * max(lengths[r]) + call_cost for r in batches)

    rng = np.random.default_rng(0)
    for trial in range(40):
        count, batch_size = int(rng.integers(1, 10)), int(rng.integers(1, 5))
        lengths = rng.integers(1, 49, size=count)
        call_cost = int(rng.choice([0, 3, 20, 64]))
        plan = batching.plan_tight_batches(lengths, batch_size, range(1, 49), call_cost)
        rows = np.concatenate([r for r, _ in plan])
        assert sorted(rows.tolist()) == list(range(count))
        assert np.all(np.diff(lengths[rows]) <= 0)  # longest first
        assert all(len(r) <= batch_size and padded == lengths[r].max() for r, padded in plan)
        order = np.argsort(-lengths, kind="stable")
        best = min(
            cost([order[a:b] for a, b in zip((0,) + cuts, cuts + (count,))], lengths, call_cost)
            for k in range(count)
            for cuts in itertools.combinations(range(1, count), k)
            if all(b - a <= batch_size for a, b in zip((0,) + cuts, cuts + (count,)))
        )
        assert cost([r for r, _ in plan], lengths, call_cost) == best, trial
    # Two long rows among short ones get a batch of their own; equal lengths are cut every
    # `batch_size` rows, as `plan_batches` cuts them; padded lengths are the buckets'.
    lengths = np.array([9] * 30 + [48, 47])
    plan = batching.plan_tight_batches(lengths, 32, BUCKETS)
    assert [(sorted(r.tolist()), padded) for r, padded in plan] == [
        ([30, 31], 48),
        (list(range(30)), 16),
    ]
    assert [len(r) for r, _ in batching.plan_batches(lengths, 32, BUCKETS)] == [32]
    same = batching.plan_tight_batches(np.full(70, 20), 32, BUCKETS)
    assert [(len(r), padded) for r, padded in same] == [(32, 32), (32, 32), (6, 32)]
    for bad in (-1, 1.5, True, None):
        with pytest.raises(ValueError, match="`call_cost` must be an int >= 0"):
            batching.plan_tight_batches(lengths, 32, BUCKETS, call_cost=bad)


@pytest.mark.backend_independent  # NumPy plans
def test_processes_take_equal_slices_of_one_process_plan():
    rng = np.random.default_rng(4)
    lengths = rng.integers(1, 49, size=43)
    mask = (np.arange(48)[None, :] < lengths[:, None]).astype("int32")
    x = {"token_ids": mask * 7, "segment_ids": 0 * mask, "padding_mask": mask}
    y = np.arange(43)
    kwargs = dict(batch_size=8, buckets=BUCKETS, shuffle=True, seed=11)
    alone = batching.LengthBatches(x, y, **kwargs)
    shares = [
        batching.LengthBatches(x, y, num_processes=3, process_index=i, **kwargs) for i in range(3)
    ]
    # One process whose 3 devices split each batch: the processes' slices, joined.
    devices = batching.LengthBatches(x, y, row_multiple=3, **kwargs)
    for _ in range(2):  # two epochs
        # 43 rows in batches of 8: the batch of 3 rows splits 1-1-1, the others lose 2 rows
        # each (8 = 3 * 2 + 2); every process plans the same number of batches.
        assert {len(share) for share in shares} == {len(alone)}
        for index in range(len(alone)):
            (x1, y1) = alone[index]
            parts = [share[index] for share in shares]
            share_rows = len(y1) // 3
            joined = np.concatenate([part[1] for part in parts])
            np.testing.assert_array_equal(joined, y1[: 3 * share_rows])  # in plan order
            np.testing.assert_array_equal(devices[index][1], joined)
            for part in parts:  # cropped to the global batch's bucket
                assert part[0]["token_ids"].shape[-1] == x1["token_ids"].shape[-1]
        used = sum(3 * (len(alone[i][1]) // 3) for i in range(len(alone)))
        assert shares[0].dropped_rows == 43 - used
        assert devices.dropped_rows == shares[0].dropped_rows
        for batches in [alone, devices, *shares]:
            batches.on_epoch_end()
    # `epoch_batches` gives an epoch's batches without moving the current plan.
    first = [b[1].tolist() for b in shares[1].epoch_batches(0)]
    now = [shares[1][i][1].tolist() for i in range(len(shares[1]))]
    fresh = batching.LengthBatches(x, y, num_processes=3, process_index=1, **kwargs)
    assert first == [fresh[i][1].tolist() for i in range(len(fresh))] and first != now
    with pytest.raises(ValueError, match="process_index"):
        batching.LengthBatches(x, y, num_processes=2, process_index=2, **kwargs)


@pytest.mark.backend_independent  # NumPy
def test_row_lengths_keep_every_real_position():
    mask = np.zeros((4, 10), "int32")
    mask[0, :3] = 1
    mask[1, :] = 1
    mask[2, [0, 4]] = 1  # a hole: keep up to the last real position
    # Row 3 is padding only: length 0.
    assert batching.row_lengths(mask).tolist() == [3, 10, 5, 0]
    # (batch, num_choices, sequence), as BertMultipleChoice packs: a row's longest choice,
    # whichever choice it is.
    choices = np.zeros((3, 3, 10), "int32")
    choices[0, 0, :2], choices[0, 2, :7] = 1, 1
    choices[1, 1, :9] = 1
    assert batching.row_lengths(choices).tolist() == [7, 9, 0]


@pytest.mark.backend_independent  # NumPy
def test_training_plans_sort_within_groups_of_batches():
    """`group_size` batches are sorted together: one batch per group is random batching, one
    group for every row sorts them all (each batch then holds consecutive lengths)."""
    lengths = np.random.default_rng(0).permutation(400)

    def padding(group_size):
        plan = batching.plan_batches(
            lengths, 4, (400,), shuffle=True, seed=1, group_size=group_size
        )
        assert sorted(np.concatenate([r for r, _ in plan]).tolist()) == list(range(400))
        return sum(int(lengths[r].max() * len(r) - lengths[r].sum()) for r, _ in plan)

    alone, grouped, whole = padding(1), padding(10), padding(100)
    assert whole == 100 * (1 + 2 + 3)  # batches of 4 consecutive lengths
    assert alone > 4 * grouped and grouped > 4 * whole


@pytest.mark.backend_independent  # NumPy
def test_batching_arguments_and_data_are_checked():
    for bad in (True, 0, 2.0):
        with pytest.raises(ValueError, match="`batch_size` must be a positive integer"):
            batching.plan_batches([3, 4], bad, (8,))
    for buckets in ((0, 8), (-4, 8), ()):
        with pytest.raises(ValueError, match="increasing positive lengths"):
            batching.bucket_for([3], buckets)
    with pytest.raises(ValueError, match=r"\(batch_size, ..., sequence_length\).*\(5,\)"):
        batching.row_lengths(np.ones(5, "int32"))
    empty = np.zeros((0, 8), "int32")
    with pytest.raises(ValueError, match="0 rows"):
        batching.LengthBatches({"padding_mask": empty}, batch_size=2, buckets=(8,))
    mask = np.zeros((2, 10), "int32")
    mask[0, :9] = 1
    x = {"token_ids": mask, "segment_ids": mask * 0, "padding_mask": mask}
    with pytest.raises(ValueError, match="length 9 exceeds the packed length 8"):
        batching.pack_rows(x, sequence_length=8)
    with pytest.raises(ValueError, match="no training or no validation rows out of 10"):
        batching.split_tail({"token_ids": np.zeros((10, 4))}, None, None, 0.0)
    # Per-row arrays (rank 1) are taken by row, never cut to the batch's length.
    cropped = batching.crop_batch({"ids": np.ones((6, 8)), "label": np.arange(6)}, [5, 4, 3], 2)
    assert cropped["ids"].shape == (3, 2) and cropped["label"].tolist() == [5, 4, 3]
    # Labels are NumPy arrays of one row count, or not planned here (Keras checks them).
    assert batching.rows_of({"a": np.zeros(3), "b": np.zeros((3, 2))}) == 3
    assert batching.rows_of({"a": np.zeros(3), "b": np.zeros(4)}) is None
    assert batching.as_arrays([1, 0, 1]).tolist() == [1, 0, 1]
    for not_planned in ([[1, 2], [3]], np.array(5), {"a": [1], "b": "text"}, "labels"):
        assert batching.as_arrays(not_planned) is None


@pytest.mark.backend_independent  # NumPy
def test_shuffled_rows_draw_a_new_order_each_epoch():
    shuffled = batching.ShuffledRows(50, 8, seed=0)
    first = np.concatenate([shuffled.batch_rows(i) for i in range(len(shuffled))])
    shuffled.on_epoch_end()
    second = np.concatenate([shuffled.batch_rows(i) for i in range(len(shuffled))])
    assert sorted(first.tolist()) == sorted(second.tolist()) == list(range(50))
    assert first.tolist() != second.tolist()
    in_order = batching.ShuffledRows(10, 4, shuffle=False)
    in_order.on_epoch_end()
    assert np.concatenate([in_order.batch_rows(i) for i in range(3)]).tolist() == list(range(10))


@pytest.mark.backend_independent  # NumPy
def test_planning_helpers_keep_their_contracts():
    """Ties keep the caller's order, a row longer than the last bucket and repeated buckets
    are refused, 3-D arrays are cropped on the sequence axis the caller names, the fill value
    lands past each row's bucket, and the last partial batch and the validation tail are
    Keras'."""
    lengths = np.tile([5, 9, 1], 20)
    rows = np.concatenate([r for r, _ in batching.plan_batches(lengths, 3, (4, 16))])
    expected = [i for value in (9, 5, 1) for i in range(60) if lengths[i] == value]
    assert rows.tolist() == expected  # longest first, ties in row order
    # One sorting group holds every row: the batches are shuffled after the sort.
    lengths = np.arange(64)
    orders = [
        [
            int(lengths[r].max())
            for r, _ in batching.plan_batches(
                lengths, 4, (64,), shuffle=True, seed=seed, group_size=16
            )
        ]
        for seed in range(3)
    ]
    assert all(order != sorted(order, reverse=True) for order in orders)
    with pytest.raises(ValueError, match="length 17 does not fit the longest bucket 16"):
        batching.plan_batches([3, 17], 2, (8, 16))
    with pytest.raises(ValueError, match="increasing"):
        batching.bucket_for([3], (8, 8, 16))

    labels = np.arange(2 * 6 * 3).reshape(2, 6, 3)  # (batch, sequence, classes)
    assert batching.crop_batch(labels, [1], 4).shape == (1, 4, 3)
    choices = np.arange(2 * 3 * 6).reshape(2, 3, 6)  # (batch, num_choices, sequence)
    np.testing.assert_array_equal(
        batching.crop_batch(choices, [1, 0], 4, axis=-1), choices[[1, 0], :, :4]
    )

    collected = batching.OrderedOutputs(3, 8, sequence_outputs=True, fill_value=-1e9)
    collected.add(np.array([2, 0]), 4, np.ones((2, 4), "float32"))
    collected.add(np.array([1]), 8, np.full((1, 8), 2.0, "float32"))
    result = collected.result()
    np.testing.assert_array_equal(result[[0, 2], :4], 1.0)
    np.testing.assert_array_equal(result[[0, 2], 4:], -1e9)
    np.testing.assert_array_equal(result[1], 2.0)

    shuffled = batching.ShuffledRows(10, 4, seed=0)
    parts = [shuffled.batch_rows(i) for i in range(len(shuffled))]
    assert [len(p) for p in parts] == [4, 4, 2]
    assert sorted(np.concatenate(parts).tolist()) == list(range(10))

    # First-fit decreasing; a row of padding only still takes one position.
    mask = np.zeros((7, 10), "int32")
    for row, length in enumerate([1, 1, 1, 8, 8, 8, 0]):
        mask[row, :length] = 1
    packed, placements = batching.pack_rows(
        {"token_ids": mask * 7, "segment_ids": mask * 0, "padding_mask": mask}
    )
    assert len(packed["token_ids"]) == 3  # first-fit in the given order needs 4
    assert placements.tolist() == [
        [0, 8, 1],
        [0, 9, 1],
        [1, 8, 1],
        [0, 0, 8],
        [1, 0, 8],
        [2, 0, 8],
        [1, 9, 1],
    ]

    x = {"token_ids": np.arange(10)[:, None]}
    train, held_out = batching.split_tail(x, np.arange(10), None, 0.25)
    assert len(train[0]["token_ids"]) == 7 and held_out[1].tolist() == [7, 8, 9]  # floor


# ------------------------------------------------------------------- the three tasks
def test_classifier_predict_and_evaluate_equal_full_length():
    preprocessor = toy_preprocessor(SEQUENCE_LENGTH)
    model = BertClassifier(toy_backbone(), num_classes=3, preprocessor=preprocessor)
    _large_weights(model)
    texts = _sentences(24)
    pairs = (texts, _sentences(24, seed=1, longest=12))
    labels = np.arange(24) % 3
    for x in (texts, pairs):
        bucketed, full = _both(model, lambda m, x=x: m.predict(x, batch_size=8, verbose=0))
        _differ(full)
        assert_all_close(bucketed, full, atol=1e-5, rtol=0)
    packed = model.preprocessor(texts)
    packed = {k: keras.ops.convert_to_numpy(v) for k, v in packed.items()}
    bucketed, full = _both(model, lambda m: m.predict(packed, batch_size=8, verbose=0))
    assert_all_close(bucketed, full, atol=1e-5, rtol=0)

    bucketed, full = _both(
        model, lambda m: m.evaluate(texts, labels, batch_size=8, verbose=0, return_dict=True)
    )
    assert sorted(bucketed) == sorted(full)
    for key in full:
        assert abs(bucketed[key] - full[key]) <= 1e-5, (key, bucketed, full)


def test_tagger_word_predictions_equal_full_length():
    tags = ["O", "B-PER", "I-PER", "B-LOC"]
    model = BertTagger(toy_backbone(), labels=tags, preprocessor=toy_preprocessor(SEQUENCE_LENGTH))
    _large_weights(model)
    sentences = [s.split() for s in _sentences(16, seed=2)]
    features = model.encode(sentences)
    bucketed, full = _both(model, lambda m: m.predict(features.inputs, batch_size=4, verbose=0))
    _differ(full)
    assert_all_close(bucketed, full, atol=1e-5, rtol=0, mask=features.inputs["padding_mask"])
    words, words_full = _both(model, lambda m: m.predict_words(sentences, batch_size=4, verbose=0))
    assert words == words_full
    # One batch (same rows together in both runs): the per-piece weighted loss is equal too.
    word_labels = [[tags[i % 4] for i in range(len(s))] for s in sentences]
    bucketed, full = _both(
        model,
        lambda m: m.evaluate(sentences, word_labels, batch_size=32, verbose=0, return_dict=True),
    )
    for key in full:
        assert abs(bucketed[key] - full[key]) <= 1e-5, (key, bucketed, full)


def test_question_answerer_same_windows_same_answers():
    model = BertQuestionAnswerer(
        toy_backbone(), preprocessor=toy_preprocessor(), sequence_length=SEQUENCE_LENGTH
    )
    _large_weights(model)
    contexts = _sentences(6, seed=3, longest=70)  # some need several windows
    questions = _sentences(6, seed=4, longest=8)
    examples = [
        {"id": str(i), "question": q, "context": c}
        for i, (q, c) in enumerate(zip(questions, contexts))
    ]
    features = model.encode(examples)
    assert len(features) > len(examples)
    bucketed, full = _both(model, lambda m: m.predict(features.inputs, batch_size=4, verbose=0))
    _differ(full["start_logits"])
    mask = features.inputs["padding_mask"]
    assert_all_close(bucketed, full, atol=1e-5, rtol=0, mask=mask)
    answers, answers_full = _both(
        model, lambda m: m.predict_answers(examples, batch_size=4, return_details=True, verbose=0)
    )
    assert answers[0] == answers_full[0]
    for key, value in answers[1].items():
        assert abs(value - answers_full[1][key]) <= 1e-4


def test_buckets_follow_the_backend_and_jit_compile():
    """Torch compiles a program per shape only with `jit_compile`: eager torch pads each batch
    to its own longest row, compiled torch takes `bucket_lengths` in `fit` and `predict` (an
    Inductor compile costs too much for the finer inference steps). JAX and TensorFlow compile
    per shape whatever `jit_compile` says: finer steps in `predict` than in `fit`."""

    class Model:
        def __init__(self, jit_compile):
            self.jit_compile = jit_compile

    coarse, fine = batching.bucket_lengths(256), batching.inference_buckets(256)
    every = tuple(range(1, 257))
    for jit_compile in (False, True):
        model = Model(jit_compile)
        compiles, predict, fit = per_backend(
            tensorflow=(True, fine, coarse),
            jax=(True, fine, coarse),
            torch=(True, coarse, coarse) if jit_compile else (False, every, every),
        )
        assert batching.compiles_per_shape(model) is compiles
        assert batching.model_buckets(model, 256) == predict
        assert batching.model_buckets(model, 256, training=True) == fit
        # A granularity given by the model wins on every backend.
        assert batching.model_buckets(model, 256, granularity=64) == (64, 128, 192, 256)


# ------------------------------------------------------------------- shapes and fit
class _ComputedLengths(keras.callbacks.Callback):
    """Records the (rows, length) of every per-token output the compiled predict function
    returned: the length the backend really computed at, whatever shapes its trace saw."""

    def __init__(self):
        super().__init__()
        self.batches = []

    def on_predict_batch_end(self, batch, logs=None):
        outputs = keras.ops.convert_to_numpy(logs["outputs"])
        self.batches.append(tuple(outputs.shape[:2]))


def _expected_lengths(lengths, batch_size, buckets):
    """Rows sorted longest first, cut into batches, each padded to the smallest bucket that
    holds its longest row (computed here, not with the library's planner)."""
    ordered = sorted(lengths, reverse=True)
    result = []
    for start in range(0, len(ordered), batch_size):
        chunk = ordered[start : start + batch_size]
        result.append((len(chunk), min(b for b in buckets if b >= chunk[0])))
    return result


def _traced_once_per_bucket(traced, buckets, batches):
    """One trace per bucket at most (TensorFlow may relax a retrace to a `None` length)."""
    assert len(traced) <= len(buckets) + 1, traced
    assert {shape[1] for shape in traced} - {None} <= set(buckets)


def _called_at_every_batch(traced, buckets, batches):
    """Eager torch traces nothing: `call` runs once per batch, at the batch's shape."""
    assert traced == batches, traced


def test_bounded_number_of_shapes():
    """Each batch is computed at the bucket of its longest row (read from the outputs the
    compiled function returns), and JAX and TensorFlow trace `call` at most once per bucket
    plus the one short batch. Eager torch pads each batch to its own longest row and runs
    `call` once per batch, at that shape."""
    tags = ["O", "B-PER", "I-PER"]
    model = BertTagger(toy_backbone(), labels=tags, preprocessor=toy_preprocessor(SEQUENCE_LENGTH))
    traced = []
    original = model.call

    def recording_call(inputs, *args, **kwargs):
        traced.append(tuple(inputs["token_ids"].shape))
        return original(inputs, *args, **kwargs)

    model.call = recording_call
    texts = _sentences(44, seed=5)
    packed = {
        k: keras.ops.convert_to_numpy(v)
        for k, v in toy_preprocessor(SEQUENCE_LENGTH)(texts).items()
    }
    lengths = packed["padding_mask"].sum(axis=1).astype(int).tolist()
    assert max(lengths) > 32 and min(lengths) < 12  # Several buckets are needed.
    computed = _ComputedLengths()
    model.predict(packed, batch_size=8, verbose=0, callbacks=[computed])
    model.predict(packed, batch_size=8, verbose=0, callbacks=[computed])
    # Eager torch compiles nothing per shape: every length is a bucket, in `fit` as in
    # `predict`. JAX and TensorFlow: 4-token steps in `predict`, `bucket_lengths`' in `fit`.
    every_length = tuple(range(1, SEQUENCE_LENGTH + 1))
    compiled = (tuple(range(4, 49, 4)), BUCKETS)
    buckets, training_buckets = per_backend(
        tensorflow=compiled, jax=compiled, torch=(every_length, every_length)
    )
    assert batching.model_buckets(model, SEQUENCE_LENGTH) == buckets
    assert batching.model_buckets(model, SEQUENCE_LENGTH, training=True) == training_buckets
    expected = _expected_lengths(lengths, 8, buckets)
    assert len({length for _, length in expected}) >= 4
    # Full-length batches (length batching off) would give 48 for every batch.
    assert computed.batches == expected * 2
    per_backend(
        tensorflow=_traced_once_per_bucket,
        jax=_traced_once_per_bucket,
        torch=_called_at_every_batch,
    )(traced, buckets, computed.batches)


def test_fit_shuffles_every_epoch_and_trains():
    model = BertClassifier(toy_backbone(), num_classes=2, preprocessor=toy_preprocessor(32))
    model.compile(learning_rate=1e-2)
    texts = _sentences(24, seed=6, longest=28)
    labels = np.array([int("good" in t or "great" in t) for t in texts])
    plans = []
    original = batching.plan_batches

    def recording_plan(*args, **kwargs):
        plan = original(*args, **kwargs)
        plans.append((kwargs.get("shuffle"), [rows.tolist() for rows, _ in plan]))
        return plan

    batching.plan_batches = recording_plan
    try:
        history = model.fit(texts, labels, batch_size=8, epochs=2, verbose=0)
    finally:
        batching.plan_batches = original
    training = [batches for shuffle, batches in plans if shuffle]
    assert len(training) >= 2  # one plan per epoch
    for batches in training:
        assert sorted(sum(batches, [])) == list(range(24))
    assert training[0] != training[1]
    assert np.isfinite(history.history["loss"]).all()


def test_fit_on_tagger_word_labels_crops_them():
    tags = ["O", "B-PER", "I-PER", "B-LOC"]
    model = BertTagger(toy_backbone(), labels=tags, preprocessor=toy_preprocessor(32))
    sentences = [s.split() for s in _sentences(16, seed=7, longest=28)]
    word_labels = [[tags[len(w) % 4] for w in s] for s in sentences]
    history = model.fit(
        sentences, word_labels, batch_size=4, epochs=1, verbose=0, validation_split=0.25
    )
    assert np.isfinite(history.history["val_loss"]).all()
    # The held-out quarter is the last 4 sentences, as Keras takes it.
    expected = model.evaluate(sentences[12:], word_labels[12:], batch_size=4, verbose=0)[0]
    assert abs(history.history["val_loss"][0] - expected) < 1e-5


# ------------------------------------------------------------------------ bad input
def test_bad_input_names_what_is_wrong():
    model = BertClassifier(toy_backbone(), num_classes=2, preprocessor=toy_preprocessor(16))
    with pytest.raises(ValueError, match="empty batch"):
        model.predict([])
    with pytest.raises(ValueError, match="index 2.*NoneType"):
        model.predict(["a film", "the plot", None])
    with pytest.raises(ValueError, match="index 1.*int"):
        model.evaluate(["a film", 3], [0, 1], verbose=0)


@pytest.mark.backend_independent  # NumPy; the packed backbone is tested in test_packing.
def test_packed_rows_give_each_text_its_own_outputs():
    backbone = toy_backbone()
    _large_weights(backbone)
    packed_backbone = toy_backbone(packed=True)
    packed_backbone.set_weights(backbone.get_weights())
    texts = _sentences(12, seed=8, longest=20)
    x = toy_preprocessor(SEQUENCE_LENGTH)(texts)
    x = {k: keras.ops.convert_to_numpy(v) for k, v in x.items()}
    packed, placements = batching.pack_rows(x)
    assert len(packed["token_ids"]) < len(texts)  # several texts per row
    alone = keras.ops.convert_to_numpy(backbone(x)["sequence_output"])
    _differ(alone[:, 0])
    together = keras.ops.convert_to_numpy(packed_backbone(packed)["sequence_output"])
    for row, (target, start, length) in enumerate(placements):
        np.testing.assert_allclose(
            together[target, start : start + length], alone[row, :length], atol=1e-5, rtol=0
        )
