"""applications/demo.py (`make demo`): a short run of the whole job on the shipped data.

Five pretraining steps and the demo's eight fine-tuning epochs, in the torch session: the
vocabulary, the pretrained preset and metrics.json are written, the preset loads back, and
the held-out sentiment accuracy is well above the majority class (51.75 % of the 400
held-out reviews; `make demo`'s 300 pretraining steps reach >= 0.90).
"""

import json

import keras
import pytest

from applications import demo
from kbert.models import BertBackbone

pytest.importorskip("tensorflow", reason="the demo's pretraining data is a tf.data pipeline")


@pytest.mark.backends(
    "torch",
    reason="the whole job, run once (torch's session is the quickest); the models it uses are "
    "tested on every backend",
)
def test_demo_runs_end_to_end_on_the_shipped_data(tmp_path):
    out = tmp_path / "demo"
    metrics = demo.main([
        "--pretrain-steps", "5", "--finetune-epochs", "8", "--batch-size", "64",
        "--sequence-length", "32", "--output-dir", str(out),
    ])  # fmt: skip
    assert json.loads((out / "metrics.json").read_text()) == metrics
    assert metrics["backend"] == keras.backend.backend()
    # Fine-tuning on raw reviews learns the task (0.76 measured with these settings, seed 0).
    assert metrics["sentiment_accuracy"] >= 0.65
    # Five masked-LM steps learn the frequent tokens: far above 1 / vocabulary size.
    assert metrics["mlm_accuracy"] >= 0.05

    vocabulary = (out / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert vocabulary[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert 100 < len(vocabulary) <= 1000  # --vocabulary_size 1000 at most, trained on the corpus.
    backbone = BertBackbone.from_preset(out / "pretrained")
    assert backbone.vocabulary_size == len(vocabulary)
    assert backbone.max_sequence_length == 32
    assert (backbone.num_layers, backbone.hidden_dim) == (2, 128)  # bert_tiny_en_uncased


def test_demo_states_what_is_missing_when_its_data_is_gone(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(demo, "DEMO_DATA", tmp_path)
    with pytest.raises(SystemExit) as stop:
        demo.main(["--output-dir", str(tmp_path / "out")])
    assert stop.value.code == 2
    assert "corpus.txt is missing; restore it with `git checkout applications/demo_data`" in (
        capsys.readouterr().err
    )
