"""`save_to_preset` writes everything `from_preset` needs to use the model as it was used.

Vocabulary and tokenizer settings (also for a `BertPretrainer`, through `tokenizer=`), the
preprocessor's sequence length, optimizer state only when asked for, no warnings on reload;
and task defaults that fit checkpoints with few positions.
"""

import logging
import warnings

import numpy as np

from kbert.models import BertBackbone, BertClassifier, BertPretrainer, BertQuestionAnswerer
from kbert.text import BertPreprocessor, BertTokenizer
from tests.test_case import tiny_backbone_kwargs

VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [
    "the",
    "a",
    "film",
    "good",
    "bad",
    "is",
    "was",
    "it",
    "and",
    "##s",
    "hello",
    "world",
    "Hello",
]


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(record)


def _quietly(fn):
    """Runs `fn`, failing on any Python warning or WARNING log record it emits."""
    handler = _Records()
    logging.getLogger().addHandler(handler)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            result = fn()
    finally:
        logging.getLogger().removeHandler(handler)
    assert handler.records == [], [r.getMessage() for r in handler.records]
    return result


def _backbone(**overrides):
    return BertBackbone(**tiny_backbone_kwargs(vocabulary_size=len(VOCABULARY), **overrides))


def test_pretrainer_preset_carries_its_tokenizer_and_no_optimizer_state(tmp_path):
    pretrainer = BertPretrainer(_backbone())
    pretrainer.optimizer.build(pretrainer.trainable_variables)  # As after `fit`.
    tokenizer = BertTokenizer(VOCABULARY, lowercase=False)
    pretrainer.save_to_preset(tmp_path / "p", tokenizer=tokenizer)

    reloaded = _quietly(lambda: BertPretrainer.from_preset(tmp_path / "p"))
    for a, b in zip(reloaded.get_weights(), pretrainer.get_weights()):
        np.testing.assert_array_equal(a, b)
    classifier = _quietly(lambda: BertClassifier.from_preset(tmp_path / "p", num_classes=2))
    assert classifier.tokenizer.lowercase is False  # The setting, not a guess from the vocabulary.
    assert list(classifier.tokenizer.vocabulary) == VOCABULARY
    assert classifier.predict(["Hello world"], verbose=0).shape == (1, 2)
    assert BertTokenizer.from_preset(tmp_path / "p").lowercase is False

    # Saving the reloaded pretrainer again keeps the tokenizer (from the preset it came from).
    reloaded.save_to_preset(tmp_path / "p2")
    assert BertTokenizer.from_preset(tmp_path / "p2").lowercase is False
    assert (tmp_path / "p2" / "vocab.txt").read_text().split("\n")[:-1] == VOCABULARY


def test_optimizer_state_is_saved_only_when_asked(tmp_path):
    pretrainer = BertPretrainer(_backbone())
    pretrainer.optimizer.build(pretrainer.trainable_variables)
    pretrainer.optimizer.iterations.assign(7)
    pretrainer.save_to_preset(tmp_path / "with", include_optimizer=True)
    reloaded = _quietly(lambda: BertPretrainer.from_preset(tmp_path / "with"))
    assert int(reloaded.optimizer.iterations) == 7
    pretrainer.save_to_preset(tmp_path / "without")
    reloaded = _quietly(lambda: BertPretrainer.from_preset(tmp_path / "without"))
    assert int(reloaded.optimizer.iterations) == 0


def test_classifier_preset_keeps_the_preprocessor_settings(tmp_path):
    tokenizer = BertTokenizer(VOCABULARY, lowercase=True)
    classifier = BertClassifier(
        _backbone(), num_classes=3, preprocessor=BertPreprocessor(tokenizer, sequence_length=16)
    )
    classifier.save_to_preset(tmp_path / "c")
    reloaded = _quietly(lambda: BertClassifier.from_preset(tmp_path / "c"))
    assert reloaded.preprocessor.sequence_length == 16
    assert reloaded.tokenizer.lowercase is True
    np.testing.assert_allclose(
        reloaded.predict(["the film was good"], verbose=0),
        classifier.predict(["the film was good"], verbose=0),
        atol=1e-6,
    )


def test_task_defaults_fit_a_checkpoint_with_few_positions(tmp_path):
    backbone = _backbone(max_sequence_length=20)
    backbone.save_to_preset(tmp_path / "short", tokenizer=BertTokenizer(VOCABULARY, lowercase=True))
    qa = BertQuestionAnswerer.from_preset(tmp_path / "short")
    assert qa.sequence_length == 20
    assert qa.doc_stride <= 20 // 3 and qa.max_query_length <= 20 // 4
    classifier = BertClassifier.from_preset(tmp_path / "short", num_classes=2)
    assert classifier.preprocessor.sequence_length == 20
    long_text = " ".join(["the good film"] * 30)
    assert classifier.predict([long_text], verbose=0).shape == (1, 2)
    # An explicit length above the checkpoint's positions is still an error.
    try:
        BertQuestionAnswerer.from_preset(tmp_path / "short", sequence_length=384)
    except ValueError as error:
        assert "sequence_length=384" in str(error)
    else:
        raise AssertionError("sequence_length=384 on a 20-position checkpoint was accepted")
