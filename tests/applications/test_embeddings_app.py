"""applications/embeddings.py: evaluate and train smoke runs on tiny data written here, and a
one-line error for a missing data folder."""

import json
import subprocess
import sys

import numpy as np
import pytest

from applications import embeddings
from tests.applications import ONE_BACKEND
from tests.applications.test_finetuning_apps import REPO, preset  # noqa: F401  (fixture)

PLACES = ["paris", "london", "acme"]
ADJECTIVES = ["good", "great", "fine", "bad", "awful", "dull"]


def _write_data(data):
    squad = data / "squad"
    squad.mkdir(parents=True)
    articles = []
    for index in range(34):
        place = PLACES[index % 3]
        # 34 distinct paragraphs (no ties in the ranking), each with both answers.
        first, second = ADJECTIVES[index % 6], ADJECTIVES[index // 6]
        context = (
            f"john smith lives in {place} . a {first} {second} film . the cat sat on the mat ."
        )
        articles.append(
            {
                "title": str(index),
                "paragraphs": [
                    {
                        "context": context,
                        "qas": [
                            {
                                "id": f"{index}-0",
                                "question": "where does john live ?",
                                "answers": [{"text": place, "answer_start": context.index(place)}],
                            },
                            {
                                "id": f"{index}-1",
                                "question": "who sat on the mat ?",
                                "answers": [
                                    {"text": "the cat", "answer_start": context.index("the cat")}
                                ],
                            },
                        ],
                    }
                ],
            }
        )
    (squad / "dev-v1.1.json").write_text(json.dumps({"version": "1.1", "data": articles}))
    sts = data / "glue" / "STS-B"
    sts.mkdir(parents=True)
    rows = [
        ("a good film", "a great movie", 4.5),
        ("a cat sat", "the dog ran", 1.0),
        ("john lives in paris", "john smith lives in paris", 4.0),
        ("a dull plot", "a cat", 0.0),
    ]
    columns = "index genre filename year old_index source1 source2 sentence1 sentence2 score"
    header = "\t".join(columns.split()) + "\n"
    body = "".join(
        f"{i}\tmain\tx\t2012\t{i}\tnone\tnone\t{a}\t{b}\t{s}\n"
        for i, (a, b, s) in enumerate(rows * 2)
    )
    for split in ("train", "dev"):
        (sts / f"{split}.tsv").write_text(header + body)
    return data


@pytest.mark.backends("torch", reason=ONE_BACKEND)
def test_evaluate_and_train(tmp_path, preset):  # noqa: F811
    data = _write_data(tmp_path / "data")
    results = embeddings.main(
        [
            "evaluate",
            "--preset",
            str(preset),
            "--data-dir",
            str(data),
            "--output-dir",
            str(tmp_path / "eval"),
            "--max-length",
            "32",
            "--quantize",
            "int8",
        ]
    )
    metrics = results["kbert"]
    # STS-B: Spearman (x 100) of the pairs' cosines, computed here with SciPy from the
    # embeddings of the same preset.
    from scipy.stats import spearmanr

    from kbert.models import BertTextEmbedder

    embedder = BertTextEmbedder.from_preset(preset, sequence_length=32)
    first, second, scores = embeddings.stsb_data(data, "dev")
    a, b = embedder.encode(first), embedder.encode(second)
    cosines = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    expected = 100 * spearmanr(cosines, scores).correlation
    assert np.isfinite(expected)
    assert metrics["stsb_spearman"] == pytest.approx(expected, abs=1e-3)
    # SQuAD retrieval: each question's paragraph ranked by cosine among all, computed here in
    # NumPy (ranks counted by hand), against the application's kbert.retrieval figures.
    questions, paragraphs, relevant = embeddings.squad_retrieval_data(data)
    q, p = embedder.encode(questions), embedder.encode(paragraphs)
    q, p = (
        q / np.linalg.norm(q, axis=-1, keepdims=True),
        p / np.linalg.norm(p, axis=-1, keepdims=True),
    )
    rank = np.array([(row > row[r]).sum() for row, r in zip(q @ p.T, relevant)])
    assert len(p) > 2 and len(set(relevant)) > 1  # rankings that can be wrong
    assert metrics["squad_recall@1"] == pytest.approx(100 * np.mean(rank < 1), abs=1e-6)
    assert metrics["squad_recall@10"] == pytest.approx(100 * np.mean(rank < 10), abs=1e-6)
    mrr = 100 * np.mean(np.where(rank < 10, 1 / (rank + 1), 0.0))
    assert metrics["squad_mrr@10"] == pytest.approx(mrr, abs=1e-6)
    written = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert written["results"]["kbert"]["squad_mrr@10"] == pytest.approx(metrics["squad_mrr@10"])
    # --quantize int8: the same figures of the same preset after quantize("int8"), next to the
    # float ones (the int8 embeddings differ, so a float figure reported twice would show).
    embedder.quantize("int8")
    a8, b8 = embedder.encode(first), embedder.encode(second)
    assert np.abs(a8 - a).max() > 1e-4
    cosines = (a8 * b8).sum(-1) / np.linalg.norm(a8, axis=-1) / np.linalg.norm(b8, axis=-1)
    quantized = results["kbert-int8"]
    assert quantized["stsb_spearman"] == pytest.approx(
        100 * spearmanr(cosines, scores).correlation, abs=1e-3
    )
    assert written["results"]["kbert-int8"] == pytest.approx(quantized)
    trained = embeddings.main(
        [
            "train",
            "--task",
            "squad",
            "--preset",
            str(preset),
            "--data-dir",
            str(data),
            "--output-dir",
            str(tmp_path / "train"),
            "--max-length",
            "32",
            "--batch-size",
            "8",
            "--max-train-examples",
            "16",
        ]
    )
    assert set(trained["before"]) == set(trained["after"])
    assert (tmp_path / "train" / "metrics.json").is_file()


def test_missing_data_dir_is_one_line(tmp_path, preset):  # noqa: F811
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "applications" / "embeddings.py"),
            "evaluate",
            "--preset",
            str(preset),
            "--data-dir",
            str(tmp_path / "nowhere"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "does not exist" in result.stderr
