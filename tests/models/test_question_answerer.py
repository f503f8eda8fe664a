"""BertQuestionAnswerer: HF head parity, context masking, answers as context spans, training,
errors."""

import keras
import numpy as np
import pytest

from kbert.models import BertQuestionAnswerer
from tests.models.test_classifier import (
    TOY_VOCABULARY,
    hf_outputs,
    load_quietly,
    save_hf_model,
    toy_backbone,
    toy_preprocessor,
    train_huggingface,
)
from tests.test_case import TestCase, assert_all_close, random_backbone_inputs, to_numpy


def allowed_positions(inputs):
    """[CLS] and the real segment-1 pieces before the final [SEP] (what the head leaves
    unmasked)."""
    real = inputs["padding_mask"] > 0
    positions = np.arange(real.shape[1])[None, :]
    allowed = real & (inputs["segment_ids"] == 1) & (positions < real.sum(1, keepdims=True) - 1)
    allowed[:, 0] = True
    return allowed


def toy_answerer(**kwargs):
    kwargs.setdefault("preprocessor", toy_preprocessor())
    backbone = kwargs.pop("backbone", None) or toy_backbone()
    return BertQuestionAnswerer(
        backbone, sequence_length=24, doc_stride=8, max_query_length=8, **kwargs
    )


class TestBertQuestionAnswerer(TestCase):
    """Mixed precision (float32 span logits, float16 head): tests/test_precision.py."""

    def test_huggingface_question_answering_loads_with_equal_logits(self, tmp_path):
        transformers = pytest.importorskip("transformers")
        reference = save_hf_model(transformers.BertForQuestionAnswering, tmp_path, num_labels=2)
        model = load_quietly(BertQuestionAnswerer, tmp_path, sequence_length=40, max_query_length=8)
        inputs = random_backbone_inputs(3, 12)
        expected = hf_outputs(reference, inputs)
        outputs = to_numpy(model(inputs))
        allowed = allowed_positions(inputs)
        assert allowed.sum() > 6 and not allowed.all()
        for key in ("start_logits", "end_logits"):
            assert outputs[key].dtype == np.float32
            assert_all_close(
                outputs[key][allowed], getattr(expected, key).numpy()[allowed], atol=1e-4, rtol=1e-4
            )
            assert (outputs[key][~allowed] == -1e9).all()
        fresh = load_quietly(
            BertQuestionAnswerer, tmp_path, sequence_length=40, max_query_length=8, fresh_heads=True
        )
        assert (
            np.abs(
                to_numpy(fresh(inputs))["start_logits"][allowed]
                - expected.start_logits.numpy()[allowed]
            ).max()
            > 1e-2
        )

    def test_unmasked_head_trains_exactly_like_huggingface(self, tmp_path):
        """`context_only=False` is HF's `BertForQuestionAnswering`: equal logits at every real
        position, and three AdamW steps on the loss over all positions land on HF's weights. The
        default (masked) head trains differently, by far more than the tolerance."""
        transformers = pytest.importorskip("transformers")
        pytest.importorskip("torch")
        from kbert.optimizers import bert_optimizer

        reference = save_hf_model(transformers.BertForQuestionAnswering, tmp_path, num_labels=2)
        inputs = random_backbone_inputs(4, 12)
        real = inputs["padding_mask"] > 0
        rng = np.random.default_rng(0)
        # Answers anywhere in the real tokens, question included: only the unmasked head can learn
        # these.
        starts = np.array([rng.integers(0, n) for n in real.sum(1)])
        ends = np.array([rng.integers(s, n) for s, n in zip(starts, real.sum(1))])

        def kbert_logits(context_only):
            model = load_quietly(
                BertQuestionAnswerer, tmp_path, sequence_length=40, context_only=context_only
            )
            if not context_only:
                before = to_numpy(model(inputs))
                for key in ("start_logits", "end_logits"):
                    assert_all_close(
                        before[key],
                        getattr(hf_outputs(reference, inputs), key).numpy(),
                        1e-4,
                        1e-4,
                        real,
                    )
            model.compile(optimizer=bert_optimizer(1e-3, total_steps=10, warmup_steps=0))
            for _ in range(3):
                model.train_on_batch(inputs, {"start_logits": starts, "end_logits": ends})
            return to_numpy(model(inputs))

        unmasked, masked = kbert_logits(False), kbert_logits(True)
        train_huggingface(reference, inputs, 3, start_positions=starts, end_positions=ends)
        expected = hf_outputs(reference, inputs)
        allowed = allowed_positions(inputs)
        for key in ("start_logits", "end_logits"):
            hf_logits = getattr(expected, key).numpy()
            assert_all_close(unmasked[key], hf_logits, atol=5e-4, rtol=1e-4, mask=real)
            assert np.abs(masked[key][allowed] - hf_logits[allowed]).max() > 20 * 5e-4

    def test_export_to_huggingface_round_trip(self, tmp_path):
        transformers = pytest.importorskip("transformers")
        from kbert.checkpoints import export_to_huggingface

        model = toy_answerer()
        model.span_dense.bias.assign(np.array([0.7, -0.3], "float32"))
        export_to_huggingface(model, tmp_path)
        reference = transformers.BertForQuestionAnswering.from_pretrained(tmp_path).eval()
        inputs = random_backbone_inputs(2, 10, vocabulary_size=len(TOY_VOCABULARY))
        expected = hf_outputs(reference, inputs)
        outputs = to_numpy(model(inputs))
        allowed = allowed_positions(inputs)
        for key in ("start_logits", "end_logits"):
            assert_all_close(
                outputs[key][allowed], getattr(expected, key).numpy()[allowed], atol=1e-4, rtol=1e-4
            )

    def test_answers_are_spans_of_the_contexts(self):
        model = toy_answerer()
        rng = np.random.default_rng(0)
        model.span_dense.kernel.assign(rng.normal(size=(16, 2)).astype("float32"))
        contexts = [
            "It was written by Ann in 1990.",
            "  The   cat sat on the mat,  and the dog ran far away.  ",
            "Café Zürich: naïve cats sat on mats. " * 6,  # accents, unknown words, several windows
            " ".join(["the dog ran"] * 30) + " and John Smith wrote it.",
        ]
        questions = ["Who wrote it?", "Where did the cat sit?", "Who sat?", "Who wrote it?"]
        features = model.encode(
            [
                {"id": str(i), "question": q, "context": c}
                for i, (q, c) in enumerate(zip(questions, contexts))
            ]
        )
        assert (np.bincount(features.example_index) > 1)[2:].all()  # long contexts: several windows
        answers = model.answer(questions, contexts)
        assert len(answers) == 4
        for answer, context in zip(answers, contexts):
            assert answer and answer in context and answer == answer.strip()
        assert model.answer("Who wrote it?", contexts[0]) == answers[0]

    def test_fit_on_raw_examples_learns_to_answer(self):
        examples = [
            ("who wrote it ?", "it was written by ann in 1990 .", "ann"),
            ("who ran ?", "the dog ran far away .", "the dog"),
            ("who sat ?", "on the mat sat mary jones .", "mary jones"),
            ("who wrote it ?", "in 1990 it was written by john smith .", "john smith"),
            ("who sat on the mat ?", "the cat sat on the mat .", "the cat"),
        ]
        questions = [q for q, _, _ in examples]
        contexts = [c for _, c, _ in examples]
        answers = [{"text": a, "answer_start": c.index(a)} for _, c, a in examples]
        model = toy_answerer(
            backbone=toy_backbone(num_layers=2, hidden_dim=32, intermediate_dim=48)
        )
        model.compile(learning_rate=1e-2)
        self.run_task_test(
            model,
            raw_x=(questions[:2], contexts[:2]),
            preprocess=lambda pair: (
                model.encode(
                    [
                        {"id": str(i), "question": q, "context": c}
                        for i, (q, c) in enumerate(zip(*pair))
                    ]
                ).inputs
            ),
            raw_fit_data=((questions * 20, contexts * 20), answers * 20),
            fit_kwargs=dict(batch_size=10, epochs=8),
            max_loss_ratio=0.2,
        )
        assert model.answer(questions, contexts) == [a for _, _, a in examples]
        squad_style = [
            {"id": f"q{i}", "question": q, "context": c}
            for i, (q, c) in enumerate(zip(questions, contexts))
        ]
        assert model.predict_answers(squad_style, verbose=0) == {
            f"q{i}": a for i, (_, _, a) in enumerate(examples)
        }

    def test_loss_is_the_mean_of_start_and_end_cross_entropies(self):
        model = toy_answerer()
        features = model.encode(
            [
                {
                    "id": "a",
                    "question": "who wrote it ?",
                    "context": "it was written by ann .",
                    "answers": [{"text": "ann", "answer_start": 18}],
                }
            ],
            labels=True,
        )
        outputs = model(features.inputs)
        logits = to_numpy(outputs)

        def cross_entropy(x, index):
            x = x - x.max()
            return -(x[index] - np.log(np.exp(x).sum()))

        start, end = features.start_positions[0], features.end_positions[0]
        expected = 0.5 * (
            cross_entropy(logits["start_logits"][0], start)
            + cross_entropy(logits["end_logits"][0], end)
        )
        loss = model.compute_loss(x=features.inputs, y=features.labels, y_pred=outputs)
        assert float(to_numpy(loss)) == pytest.approx(expected, rel=1e-5)

    def test_errors(self):
        model = toy_answerer()
        with pytest.raises(ValueError, match="empty question"):
            model.answer(["", "who ran ?"], ["the dog ran .", "the dog ran ."])
        with pytest.raises(ValueError, match="as many contexts as questions"):
            model.answer(["who ran ?"], ["a", "b"])
        inputs = random_backbone_inputs(2, 10, vocabulary_size=len(TOY_VOCABULARY))
        with pytest.raises(ValueError, match=r"\[0, 10\).*\[12\]"):
            model.fit(
                inputs,
                {"start_logits": np.array([1, 12]), "end_logits": np.array([2, 3])},
                verbose=0,
            )
        with pytest.raises(ValueError, match="start_logits"):
            model.fit(inputs, np.array([1, 2]), verbose=0)
        with pytest.raises(ValueError, match="no preprocessor"):
            toy_answerer(preprocessor=None).answer(["who ran ?"], ["the dog ran ."])
        with pytest.raises(ValueError, match="cannot exceed"):
            BertQuestionAnswerer(toy_backbone(), sequence_length=128)
        with pytest.raises(ValueError, match="doc_stride"):
            BertQuestionAnswerer(toy_backbone(), sequence_length=24, doc_stride=0)

    def test_unanswerable_questions_train_on_cls(self):
        """With `allow_no_answer`, a question without an answer is trained to point at [CLS]:
        the loss is the cross-entropy of start = end = 0 for it."""
        model = toy_answerer(allow_no_answer=True)
        questions, contexts = ["who ran ?", "who sat ?"], ["the dog ran .", "the cat sat ."]
        answer = {"text": "the cat", "answer_start": 0}
        answered = model.encode(
            [{"id": "1", "question": questions[1], "context": contexts[1], "answers": [answer]}],
            labels=True,
        )
        start, end = int(answered.start_positions[0]), int(answered.end_positions[0])
        assert 0 < start <= end
        logits = to_numpy(model.predict((questions, contexts), verbose=0))
        assert logits["start_logits"].shape == (2, 24)

        def cross_entropy(x, index):
            x = x - x.max()
            return -(x[index] - np.log(np.exp(x).sum()))

        expected = np.mean(
            [
                0.5
                * (
                    cross_entropy(logits["start_logits"][0], 0)
                    + cross_entropy(logits["end_logits"][0], 0)
                ),
                0.5
                * (
                    cross_entropy(logits["start_logits"][1], start)
                    + cross_entropy(logits["end_logits"][1], end)
                ),
            ]
        )
        results = model.evaluate(
            (questions, contexts), [None, answer], batch_size=2, verbose=0, return_dict=True
        )
        assert results["loss"] == pytest.approx(expected, rel=1e-5)

    def test_preset_and_keras_round_trips(self, tmp_path):
        # A preprocessor of the model's own length: a preset stores one length (the model's).
        model = toy_answerer(
            allow_no_answer=True,
            null_score_diff_threshold=1.5,
            n_best_size=5,
            preprocessor=toy_preprocessor(24),
        )
        inputs = random_backbone_inputs(2, 10, vocabulary_size=len(TOY_VOCABULARY))
        restored = self.run_preset_test(model, inputs, tmp_path)
        assert (restored.sequence_length, restored.doc_stride, restored.max_query_length) == (
            24,
            8,
            8,
        )
        assert (
            restored.allow_no_answer
            and restored.null_score_diff_threshold == 1.5
            and restored.n_best_size == 5
        )
        assert restored.tokenizer is not None
        self.run_task_test(model, input_data=inputs, tmp_path=tmp_path)
        loaded = keras.saving.load_model(tmp_path / "model.keras")
        assert loaded.answer("who ran ?", "the dog ran .") == model.answer(
            "who ran ?", "the dog ran ."
        )
