"""BertPacker: truncation equal to the reference, layout, tf.data, errors."""

import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

from kbert.text import BertPacker
from kbert.text.packer import truncated_lengths

pytestmark = pytest.mark.backend_independent

CLS, SEP, PAD = 101, 102, 0


def reference_truncate_pair(tokens_a, tokens_b, max_length):
    """google-research/bert run_classifier.py `_truncate_seq_pair`, restated:
    pop from the longer list until the pair fits; on a tie, pop from b."""
    tokens_a, tokens_b = list(tokens_a), list(tokens_b)
    while len(tokens_a) + len(tokens_b) > max_length:
        if len(tokens_a) > len(tokens_b):
            tokens_a.pop()
        else:
            tokens_b.pop()
    return tokens_a, tokens_b


def reference_pack(a, b, sequence_length):
    """Reference layout `[CLS] A [SEP] B [SEP]` + padding (run_classifier.py)."""
    if b is None:
        a = a[: sequence_length - 2]
        ids = [CLS] + a + [SEP]
        segments = [0] * len(ids)
    else:
        a, b = reference_truncate_pair(a, b, sequence_length - 3)
        ids = [CLS] + a + [SEP] + b + [SEP]
        segments = [0] * (len(a) + 2) + [1] * (len(b) + 1)
    mask = [1] * len(ids)
    pad = sequence_length - len(ids)
    return ids + [PAD] * pad, segments + [0] * pad, mask + [0] * pad


def test_longest_first_closed_form_equals_reference_loop():
    for la, lb, budget in itertools.product(range(15), range(15), range(0, 16)):
        a, b = reference_truncate_pair(range(la), range(lb), budget)
        got = truncated_lengths(la, lb, budget, "longest_first")
        assert (int(got[0]), int(got[1])) == (len(a), len(b)), (la, lb, budget)


def test_waterfall_equals_tensorflow_text_trimmer():
    tf_text = pytest.importorskip("tensorflow_text")
    lengths = list(itertools.product(range(9), range(9)))
    a = tf.ragged.constant([list(range(la)) for la, _ in lengths], dtype=tf.int32)
    b = tf.ragged.constant([list(range(lb)) for _, lb in lengths], dtype=tf.int32)
    for sequence_length in (3, 4, 7, 12):
        packer = BertPacker(sequence_length, CLS, SEP, truncate="waterfall")
        out = packer((a, b))
        trimmed = tf_text.WaterfallTrimmer(sequence_length - 3).trim([a, b])
        expected_a = trimmed[0].row_lengths().numpy()
        expected_b = trimmed[1].row_lengths().numpy()
        segment_ids = out["segment_ids"].numpy()
        mask = out["padding_mask"].numpy()
        np.testing.assert_array_equal(mask.sum(1), expected_a + expected_b + 3)
        np.testing.assert_array_equal(segment_ids.sum(1), expected_b + 1)


@pytest.mark.parametrize("sequence_length", [3, 4, 5, 8, 13])
def test_pairs_match_reference_layout_in_python_and_tf(sequence_length):
    lengths = list(itertools.product(range(8), range(8)))
    a = [[1000 + i for i in range(la)] for la, _ in lengths]
    b = [[2000 + i for i in range(lb)] for _, lb in lengths]
    expected = [reference_pack(x, y, sequence_length) for x, y in zip(a, b)]
    packer = BertPacker(sequence_length, CLS, SEP, PAD)
    python_out = packer((a, b))
    tf_out = packer((tf.ragged.constant(a, dtype=tf.int32), tf.ragged.constant(b, dtype=tf.int64)))
    for out in (python_out, {k: v.numpy() for k, v in tf_out.items()}):
        assert out["token_ids"].tolist() == [e[0] for e in expected]
        assert out["segment_ids"].tolist() == [e[1] for e in expected]
        assert out["padding_mask"].tolist() == [e[2] for e in expected]
        assert all(v.dtype == np.int32 for v in out.values())


def test_single_segment_and_unbatched():
    packer = BertPacker(6, CLS, SEP, pad_token_id=7)
    out = packer([[1, 2, 3, 4, 5, 6], [1], []])
    assert out["token_ids"].tolist() == [
        [CLS, 1, 2, 3, 4, SEP],
        [CLS, 1, SEP, 7, 7, 7],
        [CLS, SEP, 7, 7, 7, 7],
    ]
    assert out["padding_mask"].tolist() == [[1] * 6, [1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0]]
    assert not out["segment_ids"].any()
    single = packer([1, 2])
    assert single["token_ids"].tolist() == [CLS, 1, 2, SEP, 7, 7]
    pair = packer((tf.constant([1, 2, 3]), tf.constant([4, 5, 6])))
    assert pair["token_ids"].shape == (6,)
    assert pair["token_ids"].numpy().tolist() == [CLS, 1, 2, SEP, 4, SEP]
    assert pair["segment_ids"].numpy().tolist() == [0, 0, 0, 0, 1, 1]
    dense = packer(np.array([[1, 2], [3, 4]]))
    assert dense["token_ids"].tolist() == [[CLS, 1, 2, SEP, 7, 7], [CLS, 3, 4, SEP, 7, 7]]


def test_matches_hugging_face_pair_encoding(tokenizer, hf_tokenizer, hf_legacy_tokenizer):
    """Real sentence pairs, truncated: HF's Python tokenizer implements the
    reference rule exactly; HF's Rust tokenizer differs only on ties (it
    gives the extra token to the second segment), so it is compared on
    pairs whose truncation involves no tie."""
    firsts = [
        "The quick brown fox jumps over the lazy dog near the river bank.",
        "A short one.",
        "Tokenization of unaffable words is a hard problem for BERT models.",
        "One two three four five",
        "",
    ]
    seconds = [
        "It was not amused.",
        "This second sentence is considerably longer than the first one, by far.",
        "Yes.",
        "six seven eight nine ten",
        "Only the second segment has words.",
    ]
    for sequence_length in (6, 9, 12, 16, 40):
        packer = BertPacker(
            sequence_length, tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id
        )
        out = packer((tokenizer(firsts), tokenizer(seconds)))
        kwargs = dict(
            truncation="longest_first",
            max_length=sequence_length,
            padding="max_length",
            return_token_type_ids=True,
        )
        legacy = hf_legacy_tokenizer(firsts, seconds, **kwargs)
        assert out["token_ids"].tolist() == legacy["input_ids"]
        assert out["segment_ids"].tolist() == legacy["token_type_ids"]
        assert out["padding_mask"].tolist() == legacy["attention_mask"]
        fast = hf_tokenizer(firsts, seconds, **kwargs)
        compared = 0
        for i, (a, b) in enumerate(zip(tokenizer(firsts), tokenizer(seconds))):
            budget = sequence_length - 3
            # The Rust rule gives the odd token to the longer segment, the
            # reference to the first one when the second is not shorter.
            rust_differs = (
                len(a) + len(b) > budget
                and budget % 2 == 1
                and len(b) >= len(a)
                and 2 * len(a) > budget
            )
            if not rust_differs:
                assert out["token_ids"][i].tolist() == fast["input_ids"][i]
                assert out["segment_ids"][i].tolist() == fast["token_type_ids"][i]
                compared += 1
        assert compared >= 3


def test_tf_data_graph_equals_eager():
    rng = np.random.default_rng(0)
    a = [rng.integers(1000, 2000, rng.integers(0, 12)).tolist() for _ in range(20)]
    b = [rng.integers(1000, 2000, rng.integers(0, 12)).tolist() for _ in range(20)]
    packer = BertPacker(10, CLS, SEP)
    eager = packer((a, b))
    ds = tf.data.Dataset.from_tensor_slices(
        (tf.ragged.constant(a, dtype=tf.int32), tf.ragged.constant(b, dtype=tf.int32))
    )
    batched = ds.batch(6).map(lambda x, y: packer((x, y)))
    rows = {k: np.concatenate([e[k].numpy() for e in batched]) for k in eager}
    for key in eager:
        np.testing.assert_array_equal(rows[key], eager[key])
    unbatched = list(ds.map(lambda x, y: packer((x, y))))
    for i, element in enumerate(unbatched):
        for key in eager:
            np.testing.assert_array_equal(element[key].numpy(), eager[key][i])


def test_errors():
    with pytest.raises(ValueError, match=r"must be an integer >= 3.*Received: sequence_length=2"):
        BertPacker(2, CLS, SEP)
    with pytest.raises(ValueError, match="sequence_length"):
        BertPacker(8.0, CLS, SEP)
    with pytest.raises(ValueError, match="`truncate` must be one of"):
        BertPacker(8, CLS, SEP, truncate="round_robin")
    with pytest.raises(ValueError, match="cls_token_id"):
        BertPacker(8, -1, SEP)
    packer = BertPacker(8, CLS, SEP)
    with pytest.raises(ValueError, match="one or two segments"):
        packer(([1], [2], [3]))
    with pytest.raises(ValueError, match="both unbatched"):
        packer(([1, 2], [[3], [4]]))
    with pytest.raises(ValueError, match="integer token ids"):
        packer(tf.constant([1.0, 2.0]))
    with pytest.raises(ValueError, match="list of int"):
        packer([[1, 2], ["a"]])
    with pytest.raises(ValueError, match="must be a list of token ids"):
        packer("hello")
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError)):
        packer(([[1], [2]], [[3]]))


def test_inputs_and_lengths_refused_or_taken():
    packer = BertPacker(6, CLS, SEP)
    with pytest.raises(ValueError, match="integer token ids.*dtype float64"):
        packer(np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="list of int.*Received an element True"):
        packer([True, 2])
    with pytest.raises(ValueError, match="cls_token_id=True"):
        BertPacker(6, True, SEP)
    with pytest.raises(ValueError, match=r"shape \[batch, None\]"):
        packer(tf.ragged.constant([[[1], [2, 3]]]))
    with pytest.raises(ValueError, match=r"rank 1 \(one sequence\) or 2 \(a batch\)"):
        packer(tf.zeros((2, 2, 2), tf.int32))
    # A batch of empty rows (an empty float array once joined) packs [CLS] [SEP].
    empty = packer([[], []])
    assert empty["token_ids"].tolist() == [[CLS, SEP, PAD, PAD, PAD, PAD]] * 2
    # A call's own length (a batch's bucket): at least the special tokens' count.
    assert packer([1, 2, 3], sequence_length=4)["token_ids"].tolist() == [CLS, 1, 2, SEP]
    assert packer([1, 2, 3], sequence_length=2)["token_ids"].tolist() == [CLS, SEP]
    for segments, length, minimum in (([1], 1, 2), (([1], [2]), 2, 3), ([1], 4.0, 2)):
        with pytest.raises(ValueError, match=f">= {minimum}.*sequence_length={length!r}"):
            packer(segments, sequence_length=length)
    # Tensors are padded with the packer's own pad id, as lists are.
    padded = BertPacker(6, CLS, SEP, pad_token_id=9)(tf.constant([1]))
    assert padded["token_ids"].numpy().tolist() == [CLS, 1, SEP, 9, 9, 9]
    # Inside a graph the outputs keep the static length.
    dataset = tf.data.Dataset.from_tensor_slices(tf.ragged.constant([[1, 2], [3]])).batch(2)
    spec = dataset.map(lambda ids: packer(ids)).element_spec
    assert all(value.shape.as_list() == [None, 6] for value in spec.values())


def test_config_round_trip():
    packer = BertPacker(12, 5, 6, pad_token_id=9, truncate="waterfall")
    config = packer.get_config()
    assert config == {
        "sequence_length": 12,
        "cls_token_id": 5,
        "sep_token_id": 6,
        "pad_token_id": 9,
        "truncate": "waterfall",
    }
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(packer))
    assert restored.get_config() == config
    pairs = ([[1] * 9, [2]], [[3] * 4, [4] * 20])
    for key, value in packer(pairs).items():
        np.testing.assert_array_equal(restored(pairs)[key], value)
