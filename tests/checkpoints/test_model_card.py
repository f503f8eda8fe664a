"""The model card `README.md` every `save_to_preset` writes: the Hub's metadata header, read by
`huggingface_hub.ModelCard.load` without warnings, and a body that reports the training run
and the evaluation the model went through. The card is text built from the model's record
(the backend does not change it), so these tests run once."""

import json
import logging
import warnings

import numpy as np
import pytest

from kbert.checkpoints import model_card
from kbert.models import BertBackbone, BertClassifier, BertTagger
from kbert.text import BertPreprocessor, BertTokenizer
from tests.test_case import tiny_backbone_kwargs

pytestmark = pytest.mark.backend_independent

WORDS = "a good bad film".split()
TEXTS = ["a good film", "a bad film"]


def _classifier():
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
    vocabulary += [f"w{i}" for i in range(97 - len(vocabulary))]
    preprocessor = BertPreprocessor(BertTokenizer(vocabulary), sequence_length=8)
    return BertClassifier(
        BertBackbone(**tiny_backbone_kwargs()), num_classes=2, preprocessor=preprocessor
    )


def _load_card(path, caplog):
    """`ModelCard.load` of `path`, failing on any warning or logged warning."""
    huggingface_hub = pytest.importorskip("huggingface_hub")
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING):
        warnings.simplefilter("error")
        card = huggingface_hub.ModelCard.load(path)
    assert not [r for r in caplog.records if r.name.startswith("huggingface_hub")]
    return card


def test_card_of_a_trained_and_evaluated_model(tmp_path, caplog):
    classifier = _classifier()
    classifier.card_data = {"license": "apache-2.0", "datasets": "glue", "language": "en"}
    history = classifier.fit(TEXTS, np.array([1, 0]), epochs=3, verbose=0)
    results = classifier.evaluate(TEXTS, np.array([1, 0]), verbose=0, return_dict=True)
    classifier.save_to_preset(tmp_path / "preset")

    card = _load_card(tmp_path / "preset" / "README.md", caplog)
    data = card.data.to_dict()
    assert data["library_name"] == "kbert"
    assert data["pipeline_tag"] == "text-classification"
    assert data["license"] == "apache-2.0"
    assert data["datasets"] == ["glue"] and data["language"] == ["en"]
    assert {"kbert", "keras", "text-classification"} <= set(data["tags"])
    evaluated = {r.metric_type: r.metric_value for r in card.data.eval_results}
    assert evaluated == pytest.approx(results)
    assert {r.dataset_name for r in card.data.eval_results} == {"glue"}

    text = card.text
    assert 'BertClassifier.from_preset("' in text
    assert "- Epochs: 3" in text and "- Training examples: 2" in text
    assert "`BertAdamW`" in text and "`WarmupLinearDecay`" in text
    for epoch, loss in enumerate(history.history["loss"], 1):  # the fit history, per epoch
        assert f"| {epoch} | " in text and f"{loss:.4g}" in text
    assert "| num_layers | 2 |" in text and "| hidden_dim | 32 |" in text


def test_card_of_an_untrained_model_has_no_results_and_records_its_base(tmp_path, caplog):
    tagger_source = tmp_path / "source"
    _classifier().save_to_preset(tagger_source)
    config = json.loads((tagger_source / "config.json").read_text())
    config["base_model"] = "kbert-test/base"  # what a preset loaded from the Hub records
    (tagger_source / "config.json").write_text(json.dumps(config))

    tagger = BertTagger.from_preset(tagger_source, labels=["O", "B-X"])
    assert tagger.base_model == "kbert-test/base"
    tagger.save_to_preset(tmp_path / "tagger")
    card = _load_card(tmp_path / "tagger" / "README.md", caplog)
    data = card.data.to_dict()
    assert data["pipeline_tag"] == "token-classification"
    assert data["base_model"] == "kbert-test/base"
    assert "model-index" not in data and not card.data.eval_results
    assert "not trained with `fit`" in card.text
    saved = json.loads((tmp_path / "tagger" / "config.json").read_text())
    assert saved["base_model"] == "kbert-test/base"  # carried to the next load


def test_card_names_the_formats_beside_the_preset():
    classifier = _classifier()
    card = model_card.model_card(classifier, "hf://me/clf", formats=("transformers",))
    assert 'AutoModelForSequenceClassification.from_pretrained("me/clf")' in card
    assert 'BertClassifier.from_preset("hf://me/clf")' in card
    assert "SentenceTransformer" not in card
    with pytest.raises(ValueError, match=r"Unknown formats \['onnx'\]"):
        model_card.model_card(classifier, "x", formats=("onnx",))
    classifier.card_data = {"licence": "mit"}
    with pytest.raises(ValueError, match=r"Unknown `card_data` keys \['licence'\]"):
        model_card.model_card(classifier, "x")


def test_exports_write_the_card_of_their_format(tmp_path, caplog):
    from kbert.checkpoints import export_to_huggingface, export_to_sentence_transformers
    from kbert.models import BertTextEmbedder

    classifier = _classifier()
    export_to_huggingface(classifier, tmp_path / "hf")
    card = _load_card(tmp_path / "hf" / "README.md", caplog)
    assert card.data.to_dict()["pipeline_tag"] == "text-classification"
    assert "transformers" in card.data.tags
    assert "AutoModelForSequenceClassification.from_pretrained(" in card.text

    embedder = BertTextEmbedder(classifier.backbone, preprocessor=classifier.preprocessor)
    export_to_sentence_transformers(embedder, tmp_path / "st")
    card = _load_card(tmp_path / "st" / "README.md", caplog)  # the embedder's, not the backbone's
    assert card.data.to_dict()["pipeline_tag"] == "sentence-similarity"
    assert "SentenceTransformer(" in card.text


def python_block(text):
    """The first ```python block of a card."""
    return text.split("```python\n", 1)[1].split("```", 1)[0]


def test_serving_cards_say_how_to_serve_instead_of_a_preset():
    """A serving export's card (tests/test_serving.py runs the ONNX one's snippet) shows the
    runtime's call, not `from_preset`; a SavedModel's shows TensorFlow's."""
    classifier = _classifier()
    text = model_card.model_card(classifier, "served", serving="openvino", quantize="int8")
    block = python_block(text)
    assert 'kbert.serving.load("served")' in block and "served.predict(" in block
    assert "from_preset" not in text and "OpenVINO (int8 weights)" in text
    assert '"openvino"' in text.split("---")[1] and '"int8"' in text.split("---")[1]
    text = model_card.model_card(classifier, "exported", serving="saved_model")
    block = python_block(text)
    assert 'tf.saved_model.load("exported")' in block and "import tensorflow_text" in block
    assert '"tensorflow"' in text.split("---")[1] and "from_preset" not in text
    with pytest.raises(ValueError, match="`serving` must be one of"):
        model_card.model_card(classifier, "x", serving="tflite")
