"""`hf://` handles without TensorFlow: a kbert preset served by the loopback Hub stand-in loads
through huggingface_hub, tokenizer included, and equals the local directory."""

import numpy as np
import pytest

from kbert.models import BertClassifier
from tests.checkpoints._hub_server import HubServer, Repository
from tests.checkpoints.test_hub import TEXTS, WORDS, _files
from tests.models.test_classifier import toy_backbone
from tests.test_case import to_numpy

pytest.importorskip("huggingface_hub")


def test_handle_loads_without_tensorflow(tmp_path, monkeypatch):
    from kbert.text import BertPreprocessor, BertTokenizer

    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
    backbone = toy_backbone(vocabulary_size=len(vocabulary))
    preprocessor = BertPreprocessor(BertTokenizer(vocabulary), sequence_length=12)
    BertClassifier(backbone, num_classes=2, preprocessor=preprocessor).save_to_preset(
        tmp_path / "preset"
    )
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with HubServer({"kbert-test/toy": Repository(_files(tmp_path / "preset"))}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        loaded = BertClassifier.from_preset("hf://kbert-test/toy")
    local = BertClassifier.from_preset(tmp_path / "preset")
    np.testing.assert_array_equal(
        to_numpy(loaded.predict(TEXTS, verbose=0)), to_numpy(local.predict(TEXTS, verbose=0))
    )
