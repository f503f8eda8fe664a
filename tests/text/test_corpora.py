"""Whole real corpora: ids and character offsets identical to Hugging Face.

Needs the shared datasets (`$KBERT_DATA_DIR` or `<repo>/../shared/data`);
skipped without them. Tokenization does not depend on the Keras backend, so
this heavy check runs under the TensorFlow backend only.
"""

import json

import pytest

from tests.text.conftest import data_dir

DATA = data_dir()

pytestmark = [
    pytest.mark.backend_independent,
    pytest.mark.large,
    pytest.mark.skipif(DATA is None, reason="shared datasets not available"),
]


def read_tsv_column(path, column, header=True):
    with open(path, encoding="utf-8-sig") as f:
        rows = [line.rstrip("\n").split("\t") for line in f]
    return [row[column] for row in rows[1 if header else 0 :]]


def sst2():
    return [
        text
        for split in ("train", "dev")
        for text in read_tsv_column(DATA / "glue" / "SST-2" / f"{split}.tsv", 0)
    ]


def squad():
    with open(DATA / "squad" / "dev-v1.1.json", encoding="utf-8") as f:
        articles = json.load(f)["data"]
    texts = []
    for article in articles:
        for paragraph in article["paragraphs"]:
            texts.append(paragraph["context"])
            texts.extend(qa["question"] for qa in paragraph["qas"])
    return texts


def conll():
    sentences = []
    for split in ("eng.train", "eng.testa"):
        words = []
        with open(DATA / "conll2003" / split, encoding="utf-8") as f:
            for line in f:
                token = line.split(" ")[0].strip()
                if token and token != "-DOCSTART-":
                    words.append(token)
                elif words:
                    sentences.append(" ".join(words))
                    words = []
        if words:
            sentences.append(" ".join(words))
    return sentences


def wikitext():
    lines = []
    for split in ("valid", "test"):
        with open(DATA / "wikitext-2-raw" / f"wiki.{split}.raw", encoding="utf-8") as f:
            lines.extend(f.read().split("\n"))
    return lines


@pytest.mark.parametrize(
    "name, reader, count",
    [
        pytest.param("SST-2 train+dev", sst2, 67349 + 872, id="sst2"),
        pytest.param("SQuAD dev contexts+questions", squad, 2067 + 10570, id="squad"),
        pytest.param("CoNLL-2003 train+testa sentences", conll, 14041 + 3250, id="conll"),
        pytest.param("WikiText-2 valid+test lines", wikitext, 3761 + 4359, id="wikitext"),
    ],
)
def test_corpus_matches_hugging_face(name, reader, count, tokenizer, hf_tokenizer):
    texts = reader()
    assert len(texts) == count
    ids, starts, ends, word_ids = tokenizer.tokenize_with_offsets(texts)
    encoded = hf_tokenizer(
        texts, add_special_tokens=False, return_offsets_mapping=True, split_special_tokens=True
    )
    mismatched = [t for t, a, b in zip(texts, ids, encoded["input_ids"]) if a != b]
    assert not mismatched, f"{len(mismatched)} {name} lines differ, e.g. {mismatched[:3]}"
    for text, s, e, expected in zip(texts, starts, ends, encoded["offset_mapping"]):
        assert list(zip(s, e)) == [tuple(o) for o in expected], text
    # Python strings take the pure-Python path; string tensors the TensorFlow graph: equal.
    tf = pytest.importorskip("tensorflow")
    python = (ids, starts, ends, word_ids)
    graph = tokenizer.tokenize_with_offsets(tf.constant(texts))
    for got, expected in zip(graph, python):
        assert got.to_list() == expected
