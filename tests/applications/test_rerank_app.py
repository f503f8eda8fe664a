"""applications/rerank.py: evaluate and train smoke runs on tiny data (a tiny embedder and
reranker), their figures and mined negatives recomputed here by hand, and one-line errors for a
reranker that is no reranker and for bad training flags."""

import json

import numpy as np
import pytest

from applications import rerank
from tests.applications import ONE_BACKEND
from tests.applications.test_embeddings_app import ADJECTIVES, PLACES, _write_data
from tests.applications.test_finetuning_apps import (  # noqa: F401  (fixtures)
    _load_export,
    kept_export,
    preset,
)


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


@pytest.mark.backends(
    "torch",
    reason="Application logic (the served int8 reranker's ranking); the export traces on "
    "torch whatever the backend.",
)
def test_evaluate_reranks_with_the_served_int8_reranker(
    tmp_path,
    preset,  # noqa: F811
    kept_export,  # noqa: F811
    monkeypatch,
):
    import kbert.serving
    from kbert.models import BertCrossEncoder, BertTextEmbedder

    data = _write_data(tmp_path / "data")
    questions, paragraphs, relevant = rerank.squad_retrieval_data(data)
    embedder = BertTextEmbedder.from_preset(preset, sequence_length=32)
    top = _cosine_ranking(embedder, questions, paragraphs)[:, :5]
    pairs = [(question, paragraphs[i]) for question, row in zip(questions, top) for i in row]
    bonus = 10.0 * (top == np.asarray(relevant)[:, None]).ravel()
    # A tiny random reranker's scores are near ties, so int8 may rank as float does. The app's
    # export (kept) therefore answers with 10 added to each relevant candidate's score (the
    # pairs are scored in one call, in the candidates' order): the quantized figures can only
    # be a perfect reranking if they come from the served model's scores.
    exporting = kbert.serving.from_model

    def marked(served, scored, batch_size=32):
        assert [tuple(pair) for pair in scored] == pairs
        return served.predict(scored, batch_size=batch_size) + bonus

    class Marked:
        def __init__(self, served):
            self.served = served

        def predict(self, scored, batch_size=32):
            return marked(self.served, scored, batch_size)

    monkeypatch.setattr(kbert.serving, "from_model", lambda *a, **k: Marked(exporting(*a, **k)))
    reranker = BertCrossEncoder.from_preset(preset, sequence_length=48)
    reranker.save_to_preset(tmp_path / "reranker")
    results = rerank.main(
        [
            *("--preset", str(preset), "--reranker", str(tmp_path / "reranker")),
            *("--data-dir", str(data), "--output-dir", str(tmp_path / "out")),
            *("--max-length", "32", "--top-k", "5", "--quantize", "onnx-int8"),
        ]
    )
    # The float figures rank the candidates by the Keras reranker, the quantized ones by the
    # app's export (checked to be ONNX int8), marked as above.
    scores = {
        "float": reranker.predict(pairs),
        "onnx-int8": marked(_load_export(kept_export, "onnx"), pairs),
    }
    by_hand = {
        name: _metrics_by_hand(
            np.take_along_axis(top, np.argsort(-value.reshape(top.shape), 1, kind="stable"), 1),
            relevant,
        )
        for name, value in scores.items()
    }
    found = np.mean([r in row for row, r in zip(top, relevant)])
    assert by_hand["onnx-int8"]["map"] == pytest.approx(100 * found)  # the perfect reranking
    assert by_hand["float"]["map"] < by_hand["onnx-int8"]["map"]  # which float is not
    quantized = results["quantized"]
    for name, value in by_hand["float"].items():
        assert results["reranked"][name] == pytest.approx(value, abs=1e-6), name
    for name, value in by_hand["onnx-int8"].items():
        assert quantized[f"{name}_onnx-int8"] == pytest.approx(value, abs=1e-6), name
    report = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert report["results"]["quantized"] == quantized


def _write_held_out_articles(data):
    """Adds six articles after _write_data's 34, so that articles 32-47 hold 8 paragraphs."""
    path = data / "squad" / "dev-v1.1.json"
    squad = json.loads(path.read_text())
    for index in range(6):
        place = PLACES[index % 3]
        context = (
            f"a {ADJECTIVES[index]} {ADJECTIVES[(index + 2) % 6]} movie . john works at {place} "
            ". the dog ran ."
        )
        qas = [
            {"id": f"h{index}-{j}", "question": question, "answers": [{"text": place}]}
            for j, question in enumerate(["where does john work ?", "what ran ?"])
        ]
        squad["data"].append(
            {"title": f"h{index}", "paragraphs": [{"context": context, "qas": qas}]}
        )
    path.write_text(json.dumps(squad))


def _cosine_ranking(embedder, questions, paragraphs):
    q, p = embedder.encode(questions), embedder.encode(paragraphs)
    cosine = (q / np.linalg.norm(q, axis=-1, keepdims=True)) @ (
        p / np.linalg.norm(p, axis=-1, keepdims=True)
    ).T
    return np.argsort(-cosine, axis=1, kind="stable")


def _metrics_by_hand(ranked, relevant):
    """Rank of the one relevant paragraph per question -> MAP, recall@1, MRR@10, nDCG@10 x 100
    (a paragraph missing from the list counts 0)."""
    rank = np.array([list(row).index(r) if r in row else 10**6 for row, r in zip(ranked, relevant)])
    found = rank < ranked.shape[1]
    return {
        "map": 100 * np.mean(np.where(found, 1 / (rank + 1), 0.0)),
        "recall@1": 100 * np.mean(rank < 1),
        "mrr@10": 100 * np.mean(np.where(rank < 10, 1 / (rank + 1), 0.0)),
        "ndcg@10": 100 * np.mean(np.where(rank < 10, 1 / np.log2(rank + 2), 0.0)),
    }


@pytest.mark.backends("torch", reason=ONE_BACKEND)
def test_train_reranker_on_mined_negatives(tmp_path, preset):  # noqa: F811
    from kbert.models import BertCrossEncoder, BertTextEmbedder

    data = _write_data(tmp_path / "data")
    _write_held_out_articles(data)
    BertCrossEncoder.from_preset(preset, sequence_length=48).save_to_preset(tmp_path / "start")
    results = rerank.main(
        [
            "train",
            "--preset",
            str(preset),
            "--reranker",
            str(tmp_path / "start"),
            "--data-dir",
            str(data),
            "--output-dir",
            str(tmp_path / "out"),
            "--max-length",
            "32",
            "--negatives",
            "2",
            "--max-train-examples",
            "8",
            "--top-k",
            "5",
            "--epochs",
            "4",
            "--batch-size",
            "8",
            "--learning-rate",
            "2e-3",
            "--save-model",
            str(tmp_path / "trained"),
        ]
    )
    embedder = BertTextEmbedder.from_preset(preset, sequence_length=32)
    # Mining: each training question's two highest-cosine paragraphs of articles 0-31, its own
    # paragraph skipped (cosine ranks in NumPy).
    questions, paragraphs, relevant = rerank.squad_retrieval_data(data, rerank.TRAIN_ARTICLES)
    chosen = results["train_questions"]
    assert len(set(chosen)) == 8
    ranking = _cosine_ranking(embedder, [questions[i] for i in chosen], paragraphs)
    for row, i, mined in zip(ranking, chosen, results["negatives"]):
        assert relevant[i] not in mined
        np.testing.assert_array_equal(mined, [p for p in row if p != relevant[i]][:2])
    # Held out (articles 32-47): the embedder's top 5, reranked by the starting and by the
    # saved trained reranker; the reported figures are these rankings' metrics.
    questions, paragraphs, relevant = rerank.squad_retrieval_data(data, rerank.HELD_OUT_ARTICLES)
    assert len(paragraphs) == 8
    top = _cosine_ranking(embedder, questions, paragraphs)[:, :5]
    pairs = [(question, paragraphs[i]) for question, row in zip(questions, top) for i in row]
    trained = BertCrossEncoder.from_preset(tmp_path / "trained")
    reported, scores = {"retrieved": top}, {}
    for label, model in (
        ("before", BertCrossEncoder.from_preset(tmp_path / "start")),
        ("after", trained),
    ):
        scores[label] = model.predict(pairs).reshape(top.shape)
        order = np.argsort(-scores[label], axis=1, kind="stable")
        reported[label] = np.take_along_axis(top, order, axis=1)
    for label, ranked in reported.items():
        for name, value in _metrics_by_hand(ranked, relevant).items():
            assert results[label][name] == pytest.approx(value, abs=1e-6), (label, name)
    assert np.abs(scores["after"] - scores["before"]).max() > 1e-3  # training moved the scores
    losses = results["epoch_loss"]
    assert losses[-1] < losses[0]
    report = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert report["metrics"]["mrr@10"] == pytest.approx(results["after"]["mrr@10"])
    assert (tmp_path / "out" / "training_curve.png").is_file()


@pytest.mark.backend_independent
def test_hard_negatives_and_train_errors(tmp_path, capsys):
    # The embedder's top non-relevant paragraphs, in order, from kbert.retrieval.search's
    # ranking; checked against a cosine ranking in NumPy on random embeddings.
    from kbert import retrieval

    rng = np.random.default_rng(0)
    queries, corpus = rng.normal(size=(7, 5)), rng.normal(size=(12, 5))
    relevant = rng.integers(0, 12, size=7)
    relevant[0] = np.argmax(corpus @ queries[0] / np.linalg.norm(corpus, axis=1))  # ranked 1st
    _, ranked = retrieval.search(queries, corpus, top_k=4)
    mined = rerank.hard_negatives(ranked, relevant, 3)
    cosine = (queries @ corpus.T) / np.linalg.norm(corpus, axis=1)
    for row, gold, negatives in zip(np.argsort(-cosine, axis=1), relevant, mined):
        np.testing.assert_array_equal(negatives, [p for p in row if p != gold][:3])
    with pytest.raises(ValueError, match="3 ranked results besides its relevant one; 4"):
        rerank.hard_negatives(ranked, relevant, 4)
    # Bad flags: one line, exit status 2, before any model is loaded.
    data = _write_data(tmp_path / "data")
    flags = ["--preset", "x", "--reranker", "y", "--data-dir", str(data)]
    for argv, message in (
        (["train", "--negatives", "0", *flags], "--negatives must be >= 1. Received: 0"),
        (["train", "--warmup-ratio", "1.5", *flags], "--warmup-ratio must lie in [0, 1]"),
        ([*flags, "--save-model", str(tmp_path / "m")], "--save-model goes with the train mode"),
    ):
        with pytest.raises(SystemExit) as stop:
            rerank.main(argv)
        assert stop.value.code == 2
        assert message in capsys.readouterr().err
    args = rerank.build_parser().parse_args(["train", "--negatives", "32", *flags])
    with pytest.raises(SystemExit):
        rerank.check_training_data(args)
    assert "at most 31 negatives per question" in capsys.readouterr().err
