"""Without TensorFlow: kbert imports, and what needs TensorFlow says so in one clear error."""

import importlib
import importlib.util
import json

import pytest

TENSORFLOW_EXTRA = 'pip install "kbert[tensorflow]"'


def test_tensorflow_is_not_installed():
    assert importlib.util.find_spec("tensorflow") is None
    assert importlib.util.find_spec("tensorflow_text") is None


@pytest.mark.parametrize(
    "module",
    [
        "kbert",
        "kbert.layers",
        "kbert.models",
        "kbert.optimizers",
        "kbert.backend",
        "kbert.text",
        "kbert.data",
        "kbert.metrics",
        "kbert.checkpoints",
        "kbert.distribution",
        "kbert.callbacks",
        "kbert.export",
        # The serving runtime, retrieval and SPLADE losses of the newer models (issue #45
        # item 7; tests/no_tensorflow/test_new_models.py runs them).
        "kbert.serving",
        "kbert.retrieval",
        "kbert.retrieval_index",
        "kbert.losses_sparse",
    ],
)
def test_every_subpackage_imports(module):
    imported = importlib.import_module(module)
    for name in getattr(imported, "__all__", []):
        if name in getattr(imported, "_TENSORFLOW_NAMES", ()):
            continue  # tf.data: the clear error below.
        assert getattr(imported, name) is not None


@pytest.mark.parametrize(
    "name",
    [
        "pretraining_dataset",
        "packed_pretraining_dataset",
        "read_documents",
        "split_sentences",
        "write_pretraining_shards",
        "read_shard_metadata",
        "vocabulary_digest",
    ],
)
def test_tf_data_functions_raise_one_clear_error(name):
    import kbert

    with pytest.raises(
        ImportError,
        match=r"needs TensorFlow.*" + TENSORFLOW_EXTRA.replace("[", r"\[").replace("]", r"\]"),
    ) as info:
        getattr(kbert.data, name)
    assert f"kbert.data.{name}" in str(info.value)
    with pytest.raises(ImportError, match="kbert.tensorflow"):
        exec(f"from kbert.data import {name}", {})


def test_vocabulary_training_raises_the_clear_error():
    from kbert.text import train_wordpiece_vocabulary

    with pytest.raises(
        ImportError, match=r"train_wordpiece_vocabulary needs TensorFlow.*kbert\[tensorflow\]"
    ):
        train_wordpiece_vocabulary(["some text"], vocabulary_size=50)


def test_google_checkpoint_raises_the_clear_error(tmp_path):
    from kbert.models import BertBackbone

    config = {
        "vocab_size": 10,
        "hidden_size": 8,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 16,
        "max_position_embeddings": 16,
        "type_vocab_size": 2,
        "hidden_act": "gelu",
    }
    (tmp_path / "bert_config.json").write_text(json.dumps(config))
    (tmp_path / "bert_model.ckpt.index").write_bytes(b"")
    (tmp_path / "bert_model.ckpt.data-00000-of-00001").write_bytes(b"")
    with pytest.raises(
        ImportError, match=r"Google TF checkpoint needs TensorFlow.*kbert\[tensorflow\]"
    ):
        BertBackbone.from_preset(str(tmp_path))
