"""applications/rerank.py: a smoke run on tiny data (a tiny embedder and reranker), its
figures recomputed here by hand, and a one-line error for a reranker that is no reranker."""

import numpy as np
import pytest

from applications import rerank
from tests.applications.test_embeddings_app import _write_data
from tests.applications.test_finetuning_apps import preset  # noqa: F401  (fixture)


def test_retrieve_then_rerank(tmp_path, preset, capsys):  # noqa: F811
    from kbert.models import BertCrossEncoder, BertTextEmbedder

    data = _write_data(tmp_path / "data")
    reranker = BertCrossEncoder.from_preset(preset, sequence_length=48)
    reranker.save_to_preset(tmp_path / "reranker")
    results = rerank.main(
        [
            "--preset",
            str(preset),
            "--reranker",
            str(tmp_path / "reranker"),
            "--data-dir",
            str(data),
            "--output-dir",
            str(tmp_path / "out"),
            "--max-length",
            "32",
            "--top-k",
            "5",
        ]
    )
    # The same figures by hand: cosine ranks in NumPy, then the top 5 re-sorted by the
    # reranker's scores of each pair.
    questions, paragraphs, relevant = rerank.squad_retrieval_data(data)
    embedder = BertTextEmbedder.from_preset(preset, sequence_length=32)
    q, p = embedder.encode(questions), embedder.encode(paragraphs)
    cosine = (q / np.linalg.norm(q, axis=-1, keepdims=True)) @ (
        p / np.linalg.norm(p, axis=-1, keepdims=True)
    ).T
    top = np.argsort(-cosine, axis=1, kind="stable")[:, :5]
    pairs = [(question, paragraphs[i]) for question, row in zip(questions, top) for i in row]
    scores = reranker.predict(pairs).reshape(top.shape)
    reranked = np.take_along_axis(top, np.argsort(-scores, axis=1, kind="stable"), axis=1)
    for label, ranked in (("retrieved", top), ("reranked", reranked)):
        hit = np.array([list(row).index(r) if r in row else 99 for row, r in zip(ranked, relevant)])
        assert results[label]["recall@1"] == pytest.approx(100 * np.mean(hit < 1), abs=1e-6)
        assert results[label]["recall@5"] == pytest.approx(100 * np.mean(hit < 5), abs=1e-6)
        mrr = 100 * np.mean(np.where(hit < 10, 1 / (hit + 1), 0.0))
        assert results[label]["mrr@10"] == pytest.approx(mrr, abs=1e-6)
    assert (reranked != top).any()  # the reranker reorders
    assert (tmp_path / "out" / "metrics.json").is_file()
    # A reranker directory that holds no sequence classifier: one line, exit status 2.
    from kbert.checkpoints import export_to_huggingface
    from kbert.models import BertTagger

    export_to_huggingface(BertTagger.from_preset(preset, num_classes=3), tmp_path / "hf_tagger")
    with pytest.raises(SystemExit) as stop:
        rerank.main(
            [
                "--preset",
                str(preset),
                "--reranker",
                str(tmp_path / "hf_tagger"),
                "--data-dir",
                str(data),
            ]
        )
    assert stop.value.code == 2
    assert "not a cross-encoder" in capsys.readouterr().err
