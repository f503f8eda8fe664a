"""BertMultipleChoice: HF BertForMultipleChoice parity (load and export; raw rows tokenized by
each library on the real all-MiniLM-L6-v2 vocabulary, rows cut to the sequence length), padded
choices, the softmax cross-entropy over choices, round-trips through the one pipeline, bad
inputs."""

import shutil

import keras
import numpy as np
import pytest

from kbert.layers.heads import MASKED_LOGIT
from kbert.models import BertMultipleChoice
from tests.models.test_classifier import (
    TOY_VOCABULARY,
    load_quietly,
    minilm_dir,
    save_hf_model,
    toy_backbone,
    toy_preprocessor,
)
from tests.test_case import TestCase, assert_all_close, to_numpy

CONTEXTS = ["the cat sat", "john smith lives in", "a dog ran", "mary jones sings"]
CHOICES = [
    ["on the mat", "in paris", "very dull"],
    ["paris", "london"],
    ["on the mat and it was not very good", "by the cat", "who wrote it", "it was"],
    ["and dances"],
]


def _model(num_choices=None):
    return BertMultipleChoice(
        toy_backbone(), num_choices=num_choices, dropout=0.0, preprocessor=toy_preprocessor(16)
    )


def _hf_logits(reference, preprocessor, context, choices):
    """HF BertForMultipleChoice on the ids kbert's preprocessor packs for one row."""
    import torch

    packed = preprocessor(([context] * len(choices), choices))
    with torch.no_grad():
        return reference(
            **{
                name: torch.tensor(packed[key][None], dtype=torch.long)
                for name, key in (
                    ("input_ids", "token_ids"),
                    ("token_type_ids", "segment_ids"),
                    ("attention_mask", "padding_mask"),
                )
            }
        ).logits.numpy()[0]


# Rows for the MiniLM parity test, packed to MC_LENGTH (a budget of 21 word pieces per pair):
# row 0 fits; row 1's long context is cut beside short choices (where kbert's rule and Hugging
# Face's `longest_first` keep the same pieces); row 2 pairs a long context with long choices,
# both cut (where the two rules keep different pieces: see the test).
MC_LENGTH = 24
MC_CONTEXTS = [
    "A man sits at the piano.",
    "The committee, after three long hours of heated debate about the budget, the new library "
    "and the bridge over the river, finally",
    "The quick brown fox jumps over the lazy dog near the riverbank at dawn.",
]
MC_CHOICES = [
    ["He plays a waltz.", "He eats an apple."],
    ["voted yes.", "went home without deciding anything.", "laughed."],
    [
        "It then runs away into the forest, chased by three hungry wolves and a bear.",
        "Nothing happens.",
        "The dog wakes up, barks loudly at the fox and chases it across the wide open field.",
    ],
]


def _bert_rule_pair(tokenizer, context, choice, length):
    """The (token_ids, segment_ids, padding_mask) of one pair as the reference SWAG code packs
    it: Hugging Face's word pieces of each text, cut by `_truncate_seq_pair` of
    google-research/bert (also Hugging Face's original `run_swag.py`: while the pair is too
    long, drop the last piece of the longer text, of the second on a tie), then
    `[CLS] a [SEP] b [SEP]` padded with `[PAD]` to `length`."""
    first = tokenizer(context, add_special_tokens=False)["input_ids"]
    second = tokenizer(choice, add_special_tokens=False)["input_ids"]
    while len(first) + len(second) > length - 3:
        (first if len(first) > len(second) else second).pop()
    ids = [tokenizer.cls_token_id, *first, tokenizer.sep_token_id, *second, tokenizer.sep_token_id]
    segments = [0] * (len(first) + 2) + [1] * (len(second) + 1)
    pad = length - len(ids)
    return (
        np.array(ids + [tokenizer.pad_token_id] * pad),
        np.array(segments + [0] * pad),
        np.array([1] * len(ids) + [0] * pad),
    )


class TestBertMultipleChoice(TestCase):
    def test_raw_rows_equal_huggingface_tokenizer_and_model_on_minilm(self, tmp_path):
        """Raw rows through kbert (its tokenizer, packer and model) against Hugging Face's
        `BertTokenizer` and `BertForMultipleChoice` on all-MiniLM-L6-v2 (a fresh, seeded head):
        equal packed ids per row and choice, rows cut at the sequence length included, and
        equal logits."""
        transformers = pytest.importorskip("transformers")
        import torch

        source = minilm_dir()
        reference = transformers.BertForMultipleChoice.from_pretrained(source).eval()
        with torch.no_grad():  # A large seeded head: a wrong head or token moves the logits.
            generator = torch.Generator().manual_seed(0)
            reference.classifier.weight.copy_(torch.randn((1, 384), generator=generator))
            reference.classifier.bias.fill_(0.5)
        directory = tmp_path / "minilm_multiple_choice"
        reference.save_pretrained(directory)
        for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
            shutil.copy(source / name, directory / name)
        tokenizer = transformers.BertTokenizer.from_pretrained(source)

        model = BertMultipleChoice.from_preset(directory, sequence_length=MC_LENGTH)
        packed = model.preprocess_samples((MC_CONTEXTS, MC_CHOICES), mode="predict")[0]
        logits = model.predict((MC_CONTEXTS, MC_CHOICES), verbose=0)
        pieces = lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
        budget, cut = MC_LENGTH - 3, {"rules_agree": 0, "rules_differ": 0}
        for row, (context, choices) in enumerate(zip(MC_CONTEXTS, MC_CHOICES)):
            expected = [_bert_rule_pair(tokenizer, context, c, MC_LENGTH) for c in choices]
            for index, (choice, arrays) in enumerate(zip(choices, expected)):
                for key, array in zip(("token_ids", "segment_ids", "padding_mask"), arrays):
                    np.testing.assert_array_equal(
                        packed[key][row, index], array, err_msg=f"{key}, row {row}, choice {index}"
                    )
                ids, mask = arrays[0], arrays[2]
                hf_ids = tokenizer(context, choice, truncation=True, max_length=MC_LENGTH)
                hf_ids = hf_ids["input_ids"]
                lengths = (pieces(context), pieces(choice))
                if sum(lengths) <= budget:  # Not cut: Hugging Face's own encoding.
                    assert ids[mask == 1].tolist() == hf_ids, (row, index)
                elif 2 * min(lengths) <= budget:  # One text fits in half the budget: the
                    # other is cut to the rest by both rules.
                    assert mask.all() and ids.tolist() == hf_ids, (row, index)
                    cut["rules_agree"] += 1
                else:  # Both texts cut: Hugging Face's longest_first gives the odd piece to
                    # the longer text; the original BERT rule (kbert's packer) does not.
                    assert mask.all() and ids.tolist() != hf_ids, (row, index)
                    cut["rules_differ"] += 1
            with torch.no_grad():
                expected_logits = reference(
                    input_ids=torch.tensor(np.stack([e[0] for e in expected])[None]),
                    token_type_ids=torch.tensor(np.stack([e[1] for e in expected])[None]),
                    attention_mask=torch.tensor(np.stack([e[2] for e in expected])[None]),
                ).logits.numpy()[0]
            assert_all_close(logits[row, : len(choices)], expected_logits, atol=1e-5, rtol=1e-5)
            assert (logits[row, len(choices) :] == MASKED_LOGIT).all()
        assert cut == {"rules_agree": 3, "rules_differ": 2}, cut  # Rows cut both ways.
        assert np.ptp(logits[:, :2]) > 0.5  # Logits spread: a wrong token shows.

    def test_huggingface_multiple_choice_loads_and_exports_with_equal_logits(self, tmp_path):
        transformers = pytest.importorskip("transformers")
        import torch

        from kbert.checkpoints import export_to_huggingface

        source = tmp_path / "hf"
        reference = save_hf_model(
            transformers.BertForMultipleChoice, source, vocab_size=len(TOY_VOCABULARY)
        )
        with torch.no_grad():  # A large head: a wrong or missing head moves the logits a lot.
            reference.classifier.weight.normal_(0.0, 1.0)
            reference.classifier.bias.fill_(0.5)
        reference.save_pretrained(source)
        (source / "vocab.txt").write_text("\n".join(TOY_VOCABULARY) + "\n")

        model = BertMultipleChoice.from_preset(source, sequence_length=16)
        logits = model.predict((CONTEXTS, CHOICES), verbose=0)
        assert logits.shape == (4, 4)
        for row, (context, choices) in enumerate(zip(CONTEXTS, CHOICES)):
            expected = _hf_logits(reference, model.preprocessor, context, choices)
            assert_all_close(logits[row, : len(choices)], expected, atol=1e-5, rtol=1e-5)
            assert (logits[row, len(choices) :] == MASKED_LOGIT).all()
        fresh = load_quietly(BertMultipleChoice, source, fresh_heads=True, sequence_length=16)
        fresh_logits = fresh.predict((CONTEXTS, CHOICES), verbose=0)
        assert np.abs(fresh_logits[0, :3] - logits[0, :3]).max() > 0.1  # The check can fail.

        # Written back: transformers loads the directory with the same logits.
        exported = export_to_huggingface(model, tmp_path / "out")
        back = transformers.BertForMultipleChoice.from_pretrained(exported).eval()
        assert back.config.architectures == ["BertForMultipleChoice"]
        for row, (context, choices) in enumerate(zip(CONTEXTS, CHOICES)):
            expected = _hf_logits(back, model.preprocessor, context, choices)
            assert_all_close(logits[row, : len(choices)], expected, atol=1e-5, rtol=1e-5)

    def test_a_sequence_classification_head_is_refused(self, tmp_path):
        transformers = pytest.importorskip("transformers")
        save_hf_model(transformers.BertForSequenceClassification, tmp_path, num_labels=3)
        with pytest.raises(ValueError, match=r"classifier\.weight: shape \[3, 32\]"):
            BertMultipleChoice.from_preset(tmp_path)

    def test_padded_choices_never_win_and_real_logits_equal_fixed_counts(self):
        model = _model()
        # A head whose bias alone would make any choice win: the mask must still hold.
        model.output_dense.bias.assign(np.array([50.0], "float32"))
        logits = model.predict((CONTEXTS, CHOICES), batch_size=2, verbose=0)
        counts = np.array([len(c) for c in CHOICES])
        padded = np.arange(4)[None, :] >= counts[:, None]
        assert (logits[padded] == MASKED_LOGIT).all() and np.isfinite(logits).all()
        probabilities = to_numpy(keras.ops.softmax(logits, axis=-1))
        assert (probabilities[padded] == 0.0).all()
        assert (logits.argmax(-1) < counts).all()
        # The same rows alone (no padding) and through a fixed-count model: equal logits.
        for row in (0, 1):
            context, choices = CONTEXTS[row], CHOICES[row]
            fixed = BertMultipleChoice(
                model.backbone, num_choices=len(choices), preprocessor=model.preprocessor
            )
            fixed.output_dense.set_weights(model.output_dense.get_weights())
            alone = fixed.predict(([context], [choices]), verbose=0)
            assert_all_close(logits[row, : len(choices)], alone[0], atol=1e-5, rtol=1e-5)
        # Length-batched predict (caller order) equals the model on the full packed rows.
        packed = model.preprocess_samples((CONTEXTS, CHOICES), mode="predict")[0]
        assert packed["token_ids"].shape == (4, 4, 16)
        assert_all_close(logits, model.predict_on_batch(packed), atol=1e-5, rtol=1e-5)

    def test_loss_is_softmax_cross_entropy_over_real_choices_and_fit_learns(self):
        model = _model()
        labels = np.array([0, 1, 3, 0])
        logits = model.predict((CONTEXTS, CHOICES), verbose=0).astype("float64")
        expected = np.mean(
            [
                np.log(np.exp(row[: len(c)]).sum()) - row[label]
                for row, c, label in zip(logits, CHOICES, labels)
            ]
        )
        loss = model.train_on_batch((CONTEXTS, CHOICES), labels, return_dict=True)["loss"]
        np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
        # A learnable toy task: the right ending is the one that mentions "mat".
        contexts = ["the cat sat", "a dog sat", "the cat ran", "a dog ran"] * 2
        endings = [["on the mat", "in paris"], ["in london", "on the mat", "by ann"]] * 4
        labels = np.array([0, 1] * 4)
        model.compile(learning_rate=2e-2)
        history = model.fit((contexts, endings), labels, epochs=10, batch_size=4, verbose=0)
        assert history.history["accuracy"][-1] == 1.0
        assert history.history["loss"][-1] < 0.3 * history.history["loss"][0]

    def test_round_trips_through_config_keras_file_preset_and_lora(self, tmp_path):
        model = _model(num_choices=None)
        labels = np.array([2, 0, 1, 0])
        preprocess = lambda x: model.preprocess_samples(x, mode="predict")[0]  # noqa: E731
        self.run_task_test(
            model, raw_x=(CONTEXTS, CHOICES), tmp_path=tmp_path, preprocess=preprocess, atol=1e-5
        )
        packed = preprocess((CONTEXTS, CHOICES))
        restored = self.run_preset_test(model, packed, tmp_path)
        assert restored.num_choices is None and restored.preprocessor is not None
        model.enable_lora(rank=2)
        before = to_numpy(model(packed))
        model.fit((CONTEXTS, CHOICES), labels, batch_size=4, verbose=0)
        assert np.abs(to_numpy(model(packed)) - before).max() > 0

    def test_bad_inputs_are_named(self):
        model = _model()
        with pytest.raises(ValueError, match="label of row 1 is 2, which is not one of its 2"):
            model.fit((CONTEXTS, CHOICES), [0, 2, 0, 0], verbose=0)
        with pytest.raises(ValueError, match="Row 1 has an empty list of choices"):
            model.predict((["a", "b"], [["x"], []]), verbose=0)
        with pytest.raises(ValueError, match="Choice 1 of row 0 is of type int"):
            model.predict((["a"], [["x", 3]]), verbose=0)
        with pytest.raises(ValueError, match="per-row choice lists"):
            model.predict((["a", "b"], ["x", "y"]), verbose=0)
        with pytest.raises(ValueError, match="one entry per row"):
            model.predict((["a", "b"], [["x"]]), verbose=0)
        fixed = BertMultipleChoice(model.backbone, num_choices=3, preprocessor=model.preprocessor)
        with pytest.raises(ValueError, match="Row 1 has 2 choices, but .* num_choices=3"):
            fixed.predict((CONTEXTS, CHOICES), verbose=0)
        packed = model.preprocess_samples((CONTEXTS, CHOICES), mode="predict")[0]
        with pytest.raises(ValueError, match="4 choices per row, but .* num_choices=3"):
            fixed.predict(packed, verbose=0)
        with pytest.raises(ValueError, match="no preprocessor"):
            BertMultipleChoice(model.backbone).predict((CONTEXTS, CHOICES), verbose=0)
        with pytest.raises(ValueError, match="num_choices"):
            BertMultipleChoice(model.backbone, num_choices=0)
