"""BertTagger: HF head parity, word-level raw input, loss over first pieces, presets, errors."""

import keras
import numpy as np
import pytest

from kbert.models import BertTagger
from tests.models.test_classifier import (
    TOY_VOCABULARY,
    hf_outputs,
    load_quietly,
    save_hf_model,
    toy_backbone,
    toy_preprocessor,
)
from tests.test_case import TestCase, assert_all_close, random_backbone_inputs, to_numpy

TAGS = ["O", "B-PER", "I-PER", "B-LOC"]


class TestBertTagger(TestCase):
    def test_huggingface_token_classification_loads_with_equal_logits(self, tmp_path):
        transformers = pytest.importorskip("transformers")
        id2label = {i: tag for i, tag in enumerate(TAGS)}
        reference = save_hf_model(
            transformers.BertForTokenClassification,
            tmp_path,
            num_labels=4,
            id2label=id2label,
            label2id={t: i for i, t in id2label.items()},
        )
        model = load_quietly(BertTagger, tmp_path)
        assert model.num_classes == 4 and model.labels == TAGS
        inputs = random_backbone_inputs(3, 12)
        expected = hf_outputs(reference, inputs).logits.numpy()
        assert_all_close(model(inputs), expected, atol=1e-4, rtol=1e-4, mask=inputs["padding_mask"])
        fresh = load_quietly(BertTagger, tmp_path, fresh_heads=True)
        assert np.abs(to_numpy(fresh(inputs)) - expected).max() > 1e-2

    def test_export_to_huggingface_round_trip(self, tmp_path):
        transformers = pytest.importorskip("transformers")
        from kbert.checkpoints import export_to_huggingface

        model = BertTagger(toy_backbone(), labels=TAGS)
        model.output_dense.bias.assign(np.array([1.0, -1.0, 0.5, 0.0], "float32"))
        export_to_huggingface(model, tmp_path)
        reference = transformers.BertForTokenClassification.from_pretrained(tmp_path).eval()
        assert reference.config.id2label == dict(enumerate(TAGS))
        inputs = random_backbone_inputs(2, 10, vocabulary_size=len(TOY_VOCABULARY))
        assert_all_close(
            hf_outputs(reference, inputs).logits.numpy(),
            to_numpy(model(inputs)),
            atol=1e-4,
            rtol=1e-4,
            mask=inputs["padding_mask"],
        )

    def test_fit_and_predict_words_on_raw_sentences(self):
        sentences = [
            ["John", "Smith", "sings", "in", "Paris"],
            ["Mary", "Jones", "dances"],
            ["Mary", "visited", "London"],
            "John lives in London",  # a string is split on whitespace
        ]
        tags = [
            ["B-PER", "I-PER", "O", "O", "B-LOC"],
            ["B-PER", "I-PER", "O"],
            ["B-PER", "O", "B-LOC"],
            ["B-PER", "O", "O", "B-LOC"],
        ]
        model = BertTagger(
            toy_backbone(), labels=TAGS, dropout=0.0, preprocessor=toy_preprocessor(12)
        )
        model.compile(learning_rate=2e-2)
        history = self.run_task_test(
            model,
            raw_x=sentences,
            preprocess=lambda words: model.encode(words).inputs,
            raw_fit_data=(sentences * 15, tags * 15),
            fit_kwargs=dict(batch_size=6, epochs=6),
            max_loss_ratio=0.1,
        )
        assert history.history["accuracy"][-1] == 1.0
        assert model.predict_words(sentences, verbose=0) == tags
        assert model.predict_words(sentences[:1], return_ids=True, verbose=0) == [[1, 2, 0, 0, 3]]

    def test_loss_averages_over_first_pieces_only(self):
        """Cross-entropy averaged over labelled pieces: Hugging Face's ignore_index=-100
        convention."""
        model = BertTagger(
            toy_backbone(), num_classes=4, dropout=0.0, preprocessor=toy_preprocessor(12)
        )
        features = model.encode(
            [["John", "filmed", "and", "plots"], ["Paris"]], [[1, 0, 0, 0], [3]]
        )
        # "filmed" and "plots" are two pieces each: their second pieces carry weight 0.
        assert (
            features.sample_weight.sum() == 5
            and (features.inputs["padding_mask"].sum(1) == [8, 3]).all()
        )
        logits = to_numpy(model(features.inputs))
        log_probs = logits - logits.max(-1, keepdims=True)
        log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
        picked = np.take_along_axis(log_probs, features.labels[..., None], -1)[..., 0]
        expected = -(picked * features.sample_weight).sum() / features.sample_weight.sum()
        loss = model.compute_loss(
            x=features.inputs,
            y=features.labels,
            y_pred=logits,
            sample_weight=features.sample_weight,
        )
        assert float(to_numpy(loss)) == pytest.approx(expected, rel=1e-5)

    def test_packed_labels_with_ignored_positions(self):
        """Packed labels may hold HF's -100 filler where `sample_weight` is 0: the loss is the
        cross-entropy over the weighted positions; without weights the filler is an error."""
        model = BertTagger(toy_backbone(), num_classes=4)
        inputs = random_backbone_inputs(2, 6, vocabulary_size=len(TOY_VOCABULARY))
        labels = np.array([[-100, 1, 2, 0, -100, -100], [-100, 3, 3, -100, -100, -100]])
        weights = (labels >= 0).astype("float32")
        logits = to_numpy(model(inputs))
        log_probs = logits - logits.max(-1, keepdims=True)
        log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
        picked = np.take_along_axis(log_probs, np.maximum(labels, 0)[..., None], -1)[..., 0]
        expected = -(picked * weights).sum() / weights.sum()
        results = model.evaluate(
            inputs, labels, sample_weight=weights, batch_size=2, verbose=0, return_dict=True
        )
        assert results["loss"] == pytest.approx(expected, rel=1e-5)
        with pytest.raises(ValueError, match=r"\[-100\]"):
            model.evaluate(inputs, labels, verbose=0)

    def test_label_errors_name_what_is_wrong(self):
        model = BertTagger(toy_backbone(), labels=TAGS, preprocessor=toy_preprocessor())
        before = [np.array(w) for w in model.get_weights()]
        with pytest.raises(ValueError, match=r"unknown labels \['B-ORG', 'I-MISC'\]"):
            model.fit([["John", "Smith"], ["Paris"]], [["B-ORG", "I-MISC"], ["B-LOC"]], verbose=0)
        with pytest.raises(ValueError, match=r"out-of-range ids \[4\]"):
            model.fit([["John", "Smith"]], [[1, 4]], verbose=0)
        with pytest.raises(ValueError, match="2 words but 1 labels"):
            model.fit([["John", "Smith"]], [["B-PER"]], verbose=0)
        with pytest.raises(ValueError, match="needs word labels"):
            model.fit([["John", "Smith"]], verbose=0)
        with pytest.raises(ValueError, match="sample_weight"):
            model.fit([["John"]], [["O"]], sample_weight=[1.0], verbose=0)
        assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
        unnamed = BertTagger(toy_backbone(), num_classes=3, preprocessor=toy_preprocessor())
        with pytest.raises(ValueError, match="no label set"):
            unnamed.fit([["John"]], [["B-PER"]], verbose=0)
        with pytest.raises(ValueError, match="num_classes"):
            BertTagger(toy_backbone(), num_classes=3, labels=TAGS)
        with pytest.raises(ValueError, match="distinct"):
            BertTagger(toy_backbone(), labels=["O", "O"])
        with pytest.raises(ValueError, match="num_classes"):
            BertTagger(toy_backbone())

    def test_preset_and_keras_round_trips(self, tmp_path):
        model = BertTagger(
            toy_backbone(), labels=TAGS, dropout=0.2, preprocessor=toy_preprocessor(10)
        )
        sentences = [["John", "Smith", "sings"], ["Paris"]]
        features = model.encode(sentences)
        restored = self.run_preset_test(model, features.inputs, tmp_path)
        assert (
            restored.labels == TAGS
            and restored.dropout == 0.2
            and restored.preprocessor.sequence_length == 10
        )
        self.run_task_test(model, input_data=features.inputs, tmp_path=tmp_path)
        loaded = keras.saving.load_model(tmp_path / "model.keras")
        assert loaded.labels == TAGS
        assert loaded.predict_words(sentences, verbose=0) == model.predict_words(
            sentences, verbose=0
        )

    def test_from_preset_without_tokenizer_config_tokenizes_as_the_tokenizer_preset(self, tmp_path):
        """An HF directory with weights and vocab.txt only: the attached preprocessor infers the
        casing exactly as `BertTokenizer.from_preset` does (here: uncased, so capitalised words
        are found in the vocabulary instead of becoming [UNK])."""
        transformers = pytest.importorskip("transformers")
        from kbert.text import BertTokenizer

        vocabulary = list(TOY_VOCABULARY) + ["ℝ"]  # upper-case, but with no lower-case form
        save_hf_model(
            transformers.BertForTokenClassification,
            tmp_path,
            num_labels=3,
            vocab_size=len(vocabulary),
        )
        (tmp_path / "vocab.txt").write_text("\n".join(vocabulary) + "\n", "utf-8")
        tagger = load_quietly(BertTagger, tmp_path, sequence_length=16)
        assert tagger.tokenizer.lowercase and BertTokenizer.from_preset(tmp_path).lowercase
        words = [[word.capitalize() for word in TOY_VOCABULARY[5:9]]]
        features = tagger.encode(words)
        assert tagger.tokenizer.unk_token_id not in features.inputs["token_ids"][0]
        np.testing.assert_array_equal(
            features.inputs["token_ids"],
            tagger.encode([[w.lower() for w in words[0]]]).inputs["token_ids"],
        )
        # Whatever the directory says about the tokenizer, the task reads it as the tokenizer preset
        # does.
        (tmp_path / "tokenizer_config.json").write_text(
            '{"do_lower_case": true, "strip_accents": false}'
        )
        tagger = load_quietly(BertTagger, tmp_path, sequence_length=16)
        assert tagger.tokenizer.strip_accents is False
        assert tagger.tokenizer.get_config() == BertTokenizer.from_preset(tmp_path).get_config()
