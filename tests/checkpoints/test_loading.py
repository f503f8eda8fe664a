"""`from_preset`'s plumbing: arguments split by signature, per-class name tables,
preprocessor.json."""

import json
import warnings

import numpy as np
import pytest

from kbert import checkpoints
from kbert.checkpoints import google, huggingface
from kbert.models import (
    BertBackbone,
    BertClassifier,
    BertMultipleChoice,
    BertPretrainer,
    BertQuestionAnswerer,
    BertSparseEncoder,
    BertTagger,
)
from tests.checkpoints._reference import hf_config, to_numpy
from tests.test_case import tiny_backbone_kwargs


def _tiny_backbone():
    return BertBackbone(
        **tiny_backbone_kwargs(
            vocabulary_size=20,
            num_layers=1,
            hidden_dim=8,
            intermediate_dim=16,
            max_sequence_length=8,
        )
    )


@pytest.fixture(scope="module")
def hf_classifier_dir(tmp_path_factory):
    """A `transformers.BertForSequenceClassification` (3 labels, dropout 0.2) saved to disk."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = hf_config(num_labels=3, hidden_dropout_prob=0.2)
    model = transformers.BertForSequenceClassification(config).eval()
    path = tmp_path_factory.mktemp("hf_classifier")
    model.save_pretrained(path)
    return path, {name: value.detach().numpy() for name, value in model.state_dict().items()}


def test_task_and_backbone_arguments_are_split_by_signature(hf_classifier_dir):
    path, _ = hf_classifier_dir
    classifier = BertClassifier.from_preset(
        path, dropout=0.3, flash_attention=False, preprocessor=None
    )
    # `dropout` is the classifier's own argument: its head's, the backbone keeps the checkpoint's.
    assert classifier.dropout == 0.3
    assert classifier.backbone.dropout == pytest.approx(0.2)
    assert classifier.backbone.flash_attention is False
    # For the backbone class itself, `dropout` overrides the checkpoint's.
    assert BertBackbone.from_preset(path, dropout=0.05).dropout == 0.05


def test_unknown_arguments_are_refused_naming_both_signatures(hf_classifier_dir):
    path, _ = hf_classifier_dir
    expected = r"Unexpected arguments for BertClassifier.from_preset: \['num_clases'\]"
    with pytest.raises(ValueError, match=expected) as info:
        BertClassifier.from_preset(path, num_clases=3, preprocessor=None)
    assert "'num_classes'" in str(info.value) and "'flash_attention'" in str(info.value)
    with pytest.raises(ValueError, match=r"\['num_classes'\]"):
        BertBackbone.from_preset(path, num_classes=2)


def test_named_preset_without_weights_takes_any_backbone_argument():
    backbone = BertBackbone.from_preset(
        "bert_tiny_en_uncased",
        load_weights=False,
        vocabulary_size=50,
        max_sequence_length=16,
        remat=True,
    )
    assert (backbone.vocabulary_size, backbone.max_sequence_length, backbone.remat) == (
        50,
        16,
        True,
    )
    pretrainer = BertPretrainer.from_preset(
        "bert_tiny_en_uncased", load_weights=False, vocabulary_size=50
    )
    assert pretrainer.backbone.vocabulary_size == 50


def test_head_rows_follow_the_class_hierarchy(hf_classifier_dir):
    """A subclass of BertClassifier loads `classifier.*` through the classifier's row."""
    path, state = hf_classifier_dir

    class MyClassifier(BertClassifier):
        pass

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # No "fresh head" warning: the head is found.
        model = MyClassifier.from_preset(path, preprocessor=None)
    assert model.num_classes == 3  # From config.json's num_labels (MODEL_ARGUMENTS).
    np.testing.assert_array_equal(to_numpy(model.output_dense.kernel), state["classifier.weight"].T)
    np.testing.assert_array_equal(to_numpy(model.output_dense.bias), state["classifier.bias"])


def test_every_head_row_names_a_variable_of_its_model():
    backbone = _tiny_backbone()
    models = {
        "BertBackbone": backbone,
        "BertPretrainer": BertPretrainer(backbone),
        "BertClassifier": BertClassifier(backbone, num_classes=2),
        "BertTagger": BertTagger(backbone, num_classes=3),
        "BertQuestionAnswerer": BertQuestionAnswerer(backbone),
        "BertMultipleChoice": BertMultipleChoice(backbone),
        "BertSparseEncoder": BertSparseEncoder(backbone),
    }
    for table in (huggingface.HEAD_WEIGHTS, google.HEAD_WEIGHTS):
        for class_name, rows in table.items():
            model = models[class_name]
            head = [v for v in model.weights if not any(v is w for w in backbone.weights)]
            named = [checkpoints._weights.attribute(model, path) for _, path, _ in rows]
            assert len({id(v) for v in named}) == len(rows)
            assert all(any(v is h for h in head) for v in named), class_name
            if table is huggingface.HEAD_WEIGHTS:  # HF names every head variable (export).
                assert len(named) == len(head), class_name
    assert set(huggingface.ARCHITECTURES) == set(models)


def test_load_model_is_from_preset(hf_classifier_dir):
    path, _ = hf_classifier_dir
    model = checkpoints.load_model(BertClassifier, path, preprocessor=None)
    assert isinstance(model, BertClassifier) and model.num_classes == 3
    with pytest.raises(ValueError, match="kbert model class"):
        checkpoints.load_model(dict, path)


def test_read_preprocessor_settings(tmp_path):
    assert checkpoints.read_preprocessor_settings(tmp_path) == {}
    (tmp_path / "preprocessor.json").write_text(json.dumps({"sequence_length": 64}))
    assert checkpoints.read_preprocessor_settings(tmp_path) == {"sequence_length": 64}
    (tmp_path / "preprocessor.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="preprocessor.json must hold a JSON object"):
        checkpoints.read_preprocessor_settings(tmp_path)
    (tmp_path / "preprocessor.json").write_text("{not json")
    with pytest.raises(ValueError, match="preprocessor.json is not valid JSON"):
        checkpoints.read_preprocessor_settings(tmp_path)


def test_backbone_preset_saved_with_optimizer_state_loads(tmp_path):
    """A compiled bare backbone saved with `include_optimizer=True` loads back as a backbone."""
    backbone = _tiny_backbone()
    backbone.compile(optimizer="adam", loss="mse")
    backbone.optimizer.build(backbone.trainable_variables)
    backbone.save_to_preset(tmp_path / "preset", include_optimizer=True)
    assert json.loads((tmp_path / "preset" / "config.json").read_text())["optimizer_state"] is True
    loaded = BertBackbone.from_preset(tmp_path / "preset")
    for saved, restored in zip(backbone.weights, loaded.weights):
        np.testing.assert_array_equal(to_numpy(saved), to_numpy(restored))


def test_rows_of_an_absent_optional_head_are_skipped():
    """A head attribute set to None (a model built without that optional head) names nothing."""
    backbone = _tiny_backbone()
    pretrainer = BertPretrainer(backbone)
    full = {e.name for e in checkpoints._weights.head_entries(pretrainer, huggingface.HEAD_WEIGHTS)}
    assert "cls.seq_relationship.weight" in full
    pretrainer.next_sentence_head = None
    entries = checkpoints._weights.head_entries(pretrainer, huggingface.HEAD_WEIGHTS)
    names = {e.name for e in entries}
    assert "cls.predictions.bias" in names
    assert not any(name.startswith("cls.seq_relationship") for name in names)
