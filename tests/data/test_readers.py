"""GLUE / CoNLL / SQuAD readers: small files written here (exact values and
every error path), and the official counts of the real files when the shared
data folder is present."""

import json
import os
from pathlib import Path

import numpy as np
import pytest

from kbert.data.readers import (
    GLUE_TASKS,
    glue_test_splits,
    iob1_to_iob2,
    label_list,
    read_conll,
    read_glue,
    read_squad,
)
from kbert.metrics import entity_f1, squad_scores

pytestmark = pytest.mark.backend_independent

_DATA_DIR = Path(
    os.environ.get(
        "KBERT_DATA_DIR",
        Path(__file__).resolve().parents[2] / ".." / "shared" / "data",
    )
)
_needs_data = pytest.mark.skipif(
    not (_DATA_DIR / "glue").is_dir(), reason="shared data folder not present"
)


def _write(path, text, encoding="utf-8"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode(encoding))
    return path


# -------------------------------------------------------------------- GLUE


def test_glue_single_sentence_tasks(tmp_path):
    # Quotes are text, a row ends with a space, U+2028 is not a line break.
    _write(
        tmp_path / "SST-2" / "train.tsv",
        'sentence\tlabel\n"it \'s a "charming" film \t1\nbad\u2028movie \t0\n',
    )
    data = read_glue("sst2", "train", tmp_path)
    assert data.sentence1 == ['"it \'s a "charming" film ', "bad\u2028movie "]
    assert data.sentence2 is None
    np.testing.assert_array_equal(data.label, [1, 0])
    assert data.label.dtype == np.int32
    assert (data.num_classes, data.metrics, len(data)) == (2, ("accuracy",), 2)
    assert data["sentence1"] is data.sentence1 and data.task == "sst2"

    # CoLA: no header, 4 columns, no newline after the last row.
    _write(
        tmp_path / "CoLA" / "dev.tsv",
        "gj04\t1\t\tOur friends won't buy this analysis.\nclc95\t0\t*\tThe more we study.",
    )
    data = read_glue("CoLA", "dev", tmp_path)
    assert data.sentence1 == ["Our friends won't buy this analysis.", "The more we study."]
    np.testing.assert_array_equal(data.label, [1, 0])
    assert data.metrics == ("matthews_corrcoef",)


def test_glue_pair_tasks_labels_and_bom(tmp_path):
    _write(
        tmp_path / "MRPC" / "dev.tsv",
        "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\r\n"
        '1\t1\t2\tHe said "the witness".\tHe called him "the witness".\r\n',
    )
    data = read_glue("mrpc", "dev", tmp_path)
    assert data.sentence1 == ['He said "the witness".']
    assert data.sentence2 == ['He called him "the witness".']
    assert data.metrics == ("accuracy", "f1")

    _write(
        tmp_path / "glue" / "RTE" / "train.tsv",  # a folder holding glue/ works too
        "index\tsentence1\tsentence2\tlabel\n"
        "0\tA cat.\tAn animal.\tentailment\n1\tA dog.\tA fish.\tnot_entailment\n",
    )
    data = read_glue("rte", "train", tmp_path)
    np.testing.assert_array_equal(data.label, [0, 1])
    assert data.label_names == ("entailment", "not_entailment")

    header = (
        "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
    )
    _write(
        tmp_path / "STS-B" / "dev.tsv",
        header + "\n0\tmain\tf\t2012\t1\ts\ts\tA man.\tA person.\t4.750\n"
        "1\tmain\tf\t2012\t2\ts\ts\tA.\tB.\t0.0\n",
    )
    data = read_glue("sts-b", "dev", tmp_path)
    assert data.label.dtype == np.float32 and data.is_regression
    np.testing.assert_allclose(data.label, [4.75, 0.0])
    assert (data.num_classes, data.label_names) == (1, None)
    assert data.metrics == ("pearson_corr", "spearman_corr")

    mnli_header = (
        "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
        "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label"
    )
    _write(
        tmp_path / "MNLI" / "dev_matched.tsv",
        mnli_header + "\n" + "\t".join(["0"] * 8 + ["P.", "H.", "neutral", "neutral"]) + "\n",
    )
    data = read_glue("mnli", "dev_matched", tmp_path)
    np.testing.assert_array_equal(data.label, [2])
    assert (data.sentence1, data.sentence2) == (["P."], ["H."])
    assert set(GLUE_TASKS) >= {"cola", "sst2", "mrpc", "rte", "stsb", "qnli", "mnli"}


def test_glue_errors_name_file_and_line(tmp_path):
    _write(tmp_path / "SST-2" / "train.tsv", "sentence\tlabel\ngood\t1\nmissing label\n")
    with pytest.raises(
        ValueError, match=r"SST-2.train\.tsv:3: expected 2 tab-separated columns, found 1"
    ):
        read_glue("sst2", "train", tmp_path)
    _write(tmp_path / "SST-2" / "dev.tsv", "sentence\tlabel\ngood\t2\n")
    with pytest.raises(ValueError, match=r"dev\.tsv:2: unknown label '2'"):
        read_glue("sst2", "dev", tmp_path)
    _write(tmp_path / "CoLA" / "train.tsv", "gj04\t1\t\tok.\ngj04\t1\tsentence without mark\n")
    with pytest.raises(ValueError, match=r"train\.tsv:2: expected 4"):
        read_glue("cola", "train", tmp_path)
    _write(tmp_path / "RTE" / "dev.tsv", "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tmaybe\n")
    with pytest.raises(ValueError, match="unknown label 'maybe'"):
        read_glue("rte", "dev", tmp_path)
    _write(tmp_path / "QNLI" / "dev.tsv", "index\tquestion\tsentence\n0\ta\tb\n")
    with pytest.raises(ValueError, match=r":1: the header lacks the column\(s\) \['label'\]"):
        read_glue("qnli", "dev", tmp_path)
    header = "\t".join(["c"] * 7 + ["sentence1", "sentence2", "score"])
    _write(tmp_path / "STS-B" / "train.tsv", header + "\n" + "\t".join(["x"] * 9 + ["high"]) + "\n")
    with pytest.raises(ValueError, match="score 'high' is not a number"):
        read_glue("stsb", "train", tmp_path)
    with pytest.raises(ValueError, match="Unknown GLUE task 'imdb'"):
        read_glue("imdb", "train", tmp_path)
    with pytest.raises(ValueError, match="Unknown split .validation."):
        read_glue("sst2", "validation", tmp_path)
    with pytest.raises(FileNotFoundError):
        read_glue("mrpc", "train", tmp_path)


def test_glue_reader_edge_cases(tmp_path):
    """Undecodable bytes name their line and column, an empty file and a missing split are
    refused, and the dict view has exactly the three keys it names."""
    _write(tmp_path / "SST-2" / "dev.tsv", "sentence\tlabel\nok\t1\n")
    data = read_glue("sst2", "dev", tmp_path)
    with pytest.raises(KeyError, match="GlueData keys are 'sentence1', 'sentence2' and 'label'"):
        data["index"]
    # Latin-1 writes the character U+00FF as the byte 0xFF, which is not UTF-8.
    _write(tmp_path / "SST-2" / "train.tsv", "sentence\tlabel\ngood\t1\nab\xffc\t0\n", "latin-1")
    with pytest.raises(ValueError, match=r"train\.tsv:3: byte b'\\xff' at column 3 is not valid"):
        read_glue("sst2", "train", tmp_path)
    _write(tmp_path / "RTE" / "dev.tsv", "")
    with pytest.raises(ValueError, match=r"dev\.tsv is empty; expected a header line"):
        read_glue("rte", "dev", tmp_path)
    with pytest.raises(ValueError, match="`split` must be a split name. Received: split=None"):
        read_glue("sst2", None, tmp_path)


_MNLI_COLUMNS = (
    "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
    "sentence1_parse\tsentence2_parse\tsentence1\tsentence2"
)


def _mnli_row(index, premise, hypothesis, *labels):
    parses = ["( P )", "( H )", "(ROOT P)", "(ROOT H)"]
    return "\t".join(
        [str(index), "31193", f"{index}n", "fiction", *parses, premise, hypothesis, *labels]
    )


def test_glue_mnli_train_dev_and_test_splits(tmp_path):
    folder = tmp_path / "MNLI"
    _write(
        folder / "train.tsv",
        _MNLI_COLUMNS
        + "\tlabel1\tgold_label\n"
        + _mnli_row(0, "A man sleeps.", "Nobody sleeps.", "contradiction", "contradiction")
        + "\n"
        + _mnli_row(1, "A man sleeps.", "A person rests.", "entailment", "entailment")
        + "\n",
    )
    labels = ["neutral"] * 5  # dev: five annotators' labels, then the gold one
    header = _MNLI_COLUMNS + "\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label\n"
    _write(folder / "dev_mismatched.tsv", header + _mnli_row(7, "P.", "H.", *labels, "neutral"))
    _write(folder / "test_matched.tsv", _MNLI_COLUMNS + "\n" + _mnli_row(3, "Q.", "R.") + "\n")
    train = read_glue("mnli", "train", tmp_path)
    assert (train.sentence1, train.sentence2) == (
        ["A man sleeps."] * 2,
        ["Nobody sleeps.", "A person rests."],
    )
    np.testing.assert_array_equal(train.label, [0, 1])
    assert train.label_names == ("contradiction", "entailment", "neutral")
    assert train.index is None and train.skipped_lines == ()
    dev = read_glue("mnli", "dev_mismatched", tmp_path)
    np.testing.assert_array_equal(dev.label, [2])
    test = read_glue("mnli", "test_matched", tmp_path)
    assert (test.index, test.sentence1, test.sentence2, test.label) == (["3"], ["Q."], ["R."], None)
    assert glue_test_splits("mnli") == ("test_matched", "test_mismatched")
    with pytest.raises(FileNotFoundError, match=r"MNLI.test_mismatched\.tsv"):
        read_glue("mnli", "test_mismatched", tmp_path)
    _write(folder / "dev_matched.tsv", header + _mnli_row(0, "P.", "H.", *labels, "unknown") + "\n")
    with pytest.raises(ValueError, match=r"dev_matched\.tsv:2: unknown label 'unknown'; expected"):
        read_glue("mnli", "dev_matched", tmp_path)


def test_glue_qqp_skips_malformed_rows_with_a_count(tmp_path):
    header = "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
    _write(
        tmp_path / "QQP" / "train.tsv",
        header
        + "10\t1\t2\tHow do I cook rice?\tHow to cook rice?\t1\n"
        + "11\t3\t4\tWhat is Keras?\n"  # a question and the label missing
        + "12\t5\t6\tIs it raining?\tWhere is Paris?\t0\n"
        + "13\t7\t8\tA?\tB?\t\t1\n",  # one field too many
    )
    with pytest.warns(UserWarning, match=r"skipped 2 malformed rows .* at lines \[3, 5\]"):
        data = read_glue("qqp", "train", tmp_path)
    assert data.sentence1 == ["How do I cook rice?", "Is it raining?"]
    assert data.sentence2 == ["How to cook rice?", "Where is Paris?"]
    np.testing.assert_array_equal(data.label, [1, 0])
    assert data.skipped_lines == (3, 5) and data.metrics == ("accuracy", "f1")
    _write(tmp_path / "QQP" / "dev.tsv", header + "1\t1\t2\tA?\tB?\tyes\n")
    with pytest.raises(ValueError, match=r"QQP.dev\.tsv:2: unknown label 'yes'; expected one of"):
        read_glue("qqp", "dev", tmp_path)
    # A submission needs every test row: a malformed test row fails, naming file and line.
    _write(tmp_path / "QQP" / "test.tsv", "id\tquestion1\tquestion2\n0\tA?\tB?\n1\tC?\n")
    with pytest.raises(ValueError, match=r"test\.tsv:3: expected 3 tab-separated columns, found 2"):
        read_glue("qqp", "test", tmp_path)
    _write(tmp_path / "QQP" / "test.tsv", "id\tquestion1\tquestion2\n5\tA?\tB?\n")
    test = read_glue("qqp", "test", tmp_path)
    assert (test.index, test.sentence1, test.sentence2) == (["5"], ["A?"], ["B?"])


def test_glue_wnli_ax_and_test_headers(tmp_path):
    _write(
        tmp_path / "WNLI" / "train.tsv",
        "index\tsentence1\tsentence2\tlabel\n0\tI stuck a pin.\tThe pin had a hole.\t0\n"
        "1\tJohn ran.\tJohn moved.\t1\n",
    )
    data = read_glue("wnli", "train", tmp_path)
    np.testing.assert_array_equal(data.label, [0, 1])
    assert (data.label_names, data.metrics) == (("0", "1"), ("accuracy",))
    _write(tmp_path / "WNLI" / "dev.tsv", "index\tsentence1\tsentence2\tlabel\n0\ta\tb\t2\n")
    with pytest.raises(ValueError, match=r"WNLI.dev\.tsv:2: unknown label '2'; expected one of"):
        read_glue("wnli", "dev", tmp_path)
    _write(
        tmp_path / "glue" / "diagnostic" / "diagnostic.tsv",
        "index\tsentence1\tsentence2\n0\tThe cat sat.\tThe cat did not sit.\n1\tA.\tB.\n",
    )
    ax = read_glue("ax", "test", tmp_path)
    assert (ax.index, ax.sentence2, ax.label) == (["0", "1"], ["The cat did not sit.", "B."], None)
    assert ax.label_names == ("contradiction", "entailment", "neutral")
    with pytest.raises(ValueError, match=r"Unknown split 'train' for GLUE task 'ax'"):
        read_glue("ax", "train", tmp_path)
    # CoLA's test file has a header, unlike its train and dev files.
    _write(tmp_path / "CoLA" / "test.tsv", "index\tsentence\n0\tBill left.\n1\tLeft Bill.\n")
    cola = read_glue("cola", "test", tmp_path)
    assert (cola.index, cola.sentence1, cola.sentence2) == (
        ["0", "1"],
        ["Bill left.", "Left Bill."],
        None,
    )
    _write(tmp_path / "RTE" / "test.tsv", "index\tsentence1\n0\ta\n")
    with pytest.raises(
        ValueError, match=r"RTE.test\.tsv:1: the header lacks the column\(s\) \['sentence2'\]"
    ):
        read_glue("rte", "test", tmp_path)


_GLUE_COUNTS = [
    ("sst2", "train", [29780, 37569]),
    ("sst2", "dev", [428, 444]),
    ("cola", "train", [2528, 6023]),
    ("cola", "dev", [322, 721]),
    ("mrpc", "train", [1194, 2474]),
    ("mrpc", "dev", [129, 279]),
    ("rte", "train", [1249, 1241]),
    ("rte", "dev", [146, 131]),
    ("qnli", "dev", [2702, 2761]),
]


@_needs_data
@pytest.mark.parametrize("task, split, counts", _GLUE_COUNTS)
def test_real_glue_official_counts(task, split, counts):
    data = read_glue(task, split, _DATA_DIR / "glue")
    np.testing.assert_array_equal(np.bincount(data.label), counts)
    assert len(data.sentence1) == sum(counts)
    if data.sentence2 is not None:
        assert len(data.sentence2) == sum(counts)


@_needs_data
def test_real_glue_stsb_and_mrpc_text():
    for split, size in (("train", 5749), ("dev", 1500)):
        data = read_glue("stsb", split, _DATA_DIR)  # the parent of glue/ works
        assert len(data) == size
        assert data.label.min() == 0.0 and data.label.max() == 5.0
    mrpc = read_glue("mrpc", "train", _DATA_DIR / "glue")
    assert mrpc.sentence1[0].startswith("Amrozi accused his brother")
    assert '"' in mrpc.sentence1[0]  # literal quotes kept


# ------------------------------------------------------------------- CoNLL

_CONLL = """-DOCSTART- -X- O O

EU NNP I-NP I-ORG
rejects VBZ I-VP O
German JJ I-NP I-MISC
call NN I-NP O

Peter NNP I-NP I-PER
Blackburn NNP I-NP I-PER
Bush NNP I-NP B-PER


-DOCSTART- -X- O O

Brussels NNP I-NP I-LOC
"""


def test_read_conll_sentences_tags_and_iob2(tmp_path):
    path = _write(tmp_path / "eng.mini", _CONLL)
    sentences = read_conll(path)
    assert sentences == [
        (["EU", "rejects", "German", "call"], ["I-ORG", "O", "I-MISC", "O"]),
        (["Peter", "Blackburn", "Bush"], ["I-PER", "I-PER", "B-PER"]),
        (["Brussels"], ["I-LOC"]),
    ]
    assert read_conll(path, tag_column=1)[0][1] == ["NNP", "VBZ", "JJ", "NN"]
    assert read_conll(path, tag_column=-2, num_columns=None)[1][1] == ["I-NP"] * 3
    iob2 = read_conll(path, to_iob2=True)
    assert [tags for _, tags in iob2] == [
        ["B-ORG", "O", "B-MISC", "O"],
        ["B-PER", "I-PER", "B-PER"],
        ["B-LOC"],
    ]
    # The conversion keeps the entities: IOB1 read by conlleval = IOB2 strict.
    iob1_tags = [tags for _, tags in sentences]
    iob2_tags = [tags for _, tags in iob2]
    assert (
        entity_f1(iob1_tags, iob1_tags)["per_type"]
        == entity_f1(iob2_tags, iob2_tags, scheme="IOB2", mode="strict")["per_type"]
    )
    assert label_list(sentences) == ["O", "B-PER", "I-LOC", "I-MISC", "I-ORG", "I-PER"]
    assert label_list(iob2_tags) == ["O", "B-LOC", "B-MISC", "B-ORG", "B-PER", "I-PER"]


def test_iob1_to_iob2_by_hand():
    assert iob1_to_iob2(["I-PER", "I-PER", "B-PER", "O", "I-LOC", "I-ORG"]) == [
        "B-PER",
        "I-PER",
        "B-PER",
        "O",
        "B-LOC",
        "B-ORG",
    ]
    assert iob1_to_iob2(["B-PER", "I-PER", "O", "O"]) == ["B-PER", "I-PER", "O", "O"]
    assert iob1_to_iob2([]) == []
    with pytest.raises(ValueError, match="Invalid IOB tag 'S-PER' at position 1"):
        iob1_to_iob2(["O", "S-PER"])


def test_read_conll_errors(tmp_path):
    path = _write(tmp_path / "bad.txt", "EU NNP I-NP I-ORG\nrejects VBZ O\n")
    with pytest.raises(ValueError, match=r"bad\.txt:2: expected 4 columns, found 3"):
        read_conll(path)
    path = _write(tmp_path / "bad_tag.txt", "EU NNP I-NP X-ORG\n")
    with pytest.raises(ValueError, match="sentence 0: Invalid IOB tag 'X-ORG'"):
        read_conll(path, to_iob2=True)
    with pytest.raises(ValueError, match="tag_column"):
        read_conll(_write(tmp_path / "ok.txt", "EU NNP I-NP I-ORG\n"), tag_column=4)
    with pytest.raises(ValueError, match="num_columns"):
        read_conll(tmp_path / "ok.txt", num_columns=1)
    with pytest.raises(ValueError, match="pair or a list of tags"):
        label_list(["O", "B-PER"])
    with pytest.raises(ValueError, match="Invalid IOB tag 'B-' at position 0"):
        iob1_to_iob2(["B-", "O"])
    with pytest.raises(ValueError, match="`tag_column`=-5 is out of range for 4 columns"):
        read_conll(tmp_path / "ok.txt", tag_column=-5)


def test_read_conll_document_breaks_column_counts_and_tag_lists(tmp_path):
    """A -DOCSTART- line ends a sentence even with no blank line before it; `num_columns=None`
    takes the first line's count; lists of exactly two tags are tag lists, not pairs."""
    path = _write(
        tmp_path / "three.txt",
        "EU I-NP I-ORG\nrejects I-VP O\n-DOCSTART- -X- O\nPeter I-NP I-PER\n",
    )
    assert read_conll(path, tag_column=2, num_columns=None) == [
        (["EU", "rejects"], ["I-ORG", "O"]),
        (["Peter"], ["I-PER"]),
    ]
    with pytest.raises(ValueError, match=r"three\.txt:1: expected 4 columns, found 3"):
        read_conll(path)
    assert label_list([["B-PER", "O"], ["I-LOC", "O"]]) == ["O", "B-PER", "I-LOC"]


@_needs_data
def test_real_conll_official_counts():
    expected = {
        "eng.train": (14041, 203621, {"LOC": 7140, "MISC": 3438, "ORG": 6321, "PER": 6600}),
        "eng.testa": (3250, 51362, {"LOC": 1837, "MISC": 922, "ORG": 1341, "PER": 1842}),
    }
    for name, (num_sentences, num_tokens, entities) in expected.items():
        sentences = read_conll(_DATA_DIR / "conll2003" / name, to_iob2=True)
        assert len(sentences) == num_sentences
        assert sum(len(words) for words, _ in sentences) == num_tokens
        tags = [t for _, t in sentences]
        counts = entity_f1(tags, tags, scheme="IOB2", mode="strict")["per_type"]
        assert {k: v["num_true"] for k, v in counts.items()} == entities
        assert label_list(sentences) == [
            "O",
            "B-LOC",
            "B-MISC",
            "B-ORG",
            "B-PER",
            "I-LOC",
            "I-MISC",
            "I-ORG",
            "I-PER",
        ]


# ------------------------------------------------------------------- SQuAD


def _squad(version="1.1"):
    context = "Paris is the capital of France."
    qas = [
        {
            "id": "a",
            "question": "Capital?",
            "answers": [
                {"text": "Paris", "answer_start": 0},
                {"text": "France", "answer_start": 24},
            ],
        },
        {
            "id": "b",
            "question": "Off?",
            "answers": [
                {"text": "capital", "answer_start": 3},
                {"text": "capital", "answer_start": 13},
            ],
        },
        {"id": "c", "question": "Lost?", "answers": [{"text": "Lyon", "answer_start": 0}]},
    ]
    articles = [
        {"title": "Paris", "paragraphs": [{"context": context, "qas": qas}]},
        {
            "title": "Other",
            "paragraphs": [
                {
                    "context": "x y",
                    "qas": [
                        {"id": "d", "question": "?", "answers": [{"text": "y", "answer_start": 2}]}
                    ],
                }
            ],
        },
    ]
    return {"version": version, "data": articles}


def test_read_squad_checks_answer_offsets(tmp_path):
    with pytest.warns(UserWarning, match="2 answers do not match.*1 questions were left"):
        examples = read_squad(_squad())
    assert [e["id"] for e in examples] == ["a", "b", "d"]
    first = examples[0]
    assert first["answers"] == [
        {"text": "Paris", "answer_start": 0},
        {"text": "France", "answer_start": 24},
    ]
    assert (first["title"], first["article_index"], first["paragraph_index"]) == ("Paris", 0, 0)
    assert first["is_impossible"] is False
    assert examples[1]["answers"] == [{"text": "capital", "answer_start": 13}]
    assert examples.num_misaligned == 2
    assert [(m["id"], m["answer_start"]) for m in examples.misaligned] == [("b", 3), ("c", 0)]
    assert examples.dropped == [{"id": "c", "article_index": 0}]
    # Article slices, and the same from a file path / the data list.
    second = examples.articles(1, 2)
    assert [e["id"] for e in second] == ["d"] and second.num_misaligned == 0
    assert squad_scores({"d": "y"}, second.data)["exact_match"] == 100.0
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(_squad()), encoding="utf-8")
    with pytest.warns(UserWarning):
        assert list(read_squad(path)) == list(examples)
    with pytest.warns(UserWarning):
        assert list(read_squad(_squad()["data"])) == list(examples)


def test_read_squad_v2_and_errors():
    data = _squad("2.0")
    data["data"][1]["paragraphs"][0]["qas"].append(
        {
            "id": "e",
            "question": "?",
            "answers": [],
            "is_impossible": True,
            "plausible_answers": [{"text": "x", "answer_start": 0}],
        }
    )
    with pytest.warns(UserWarning):
        examples = read_squad(data, version="2.0")
    assert examples[-1]["id"] == "e" and examples[-1]["is_impossible"] is True
    assert examples[-1]["answers"] == []
    with pytest.raises(ValueError, match="is_impossible; use version='2.0'"):
        read_squad(data, version="1.1")
    with pytest.raises(ValueError, match="version"):
        read_squad(data, version="2")
    with pytest.raises(ValueError, match="no 'data' key"):
        read_squad({"articles": []})
    with pytest.raises(ValueError, match="no 'paragraphs'"):
        read_squad([{"title": "x"}])
    # v2.0: an answerable question whose answers are all misaligned is dropped too, not
    # turned into "no answer"; an unanswerable one keeps no answers even if it lists some.
    data = _squad("2.0")
    data["data"][1]["paragraphs"][0]["qas"].append(
        {
            "id": "f",
            "question": "?",
            "is_impossible": True,
            "answers": [{"text": "x", "answer_start": 0}],
        }
    )
    with pytest.warns(UserWarning):
        examples = read_squad(data, version="2.0")
    assert [e["id"] for e in examples] == ["a", "b", "d", "f"]
    assert examples.dropped == [{"id": "c", "article_index": 0}]
    assert (examples[-1]["is_impossible"], examples[-1]["answers"]) == (True, [])


def test_read_squad_questions_without_answers_and_slices(tmp_path):
    """A v1.1 question with no answers is dropped with a warning of its own; article slices
    keep their own dropped questions; an article without a title has the empty title."""
    article = {
        "paragraphs": [
            {
                "context": "x y",
                "qas": [
                    {"id": "k", "question": "?", "answers": [{"text": "y", "answer_start": 2}]},
                    {"id": "e", "question": "?", "answers": []},
                ],
            }
        ]
    }
    with pytest.warns(UserWarning, match="0 answers do not match.*1 questions were left"):
        examples = read_squad({"data": [article]})
    assert [e["id"] for e in examples] == ["k"] and examples[0]["title"] == ""
    assert examples.dropped == [{"id": "e", "article_index": 0}]
    with pytest.warns(UserWarning):
        both = read_squad(_squad())
    assert both.articles(1, 2).dropped == [] and both.articles(0, 1).dropped == both.dropped
    # An answer before the context's start is misaligned, even an empty one.
    negative = _squad()
    negative["data"][1]["paragraphs"][0]["qas"][0]["answers"].append(
        {"text": "", "answer_start": -1}
    )
    with pytest.warns(UserWarning):
        assert read_squad(negative).misaligned[-1] == {
            "id": "d",
            "text": "",
            "answer_start": -1,
            "article_index": 1,
        }


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.update(data={"x": 1}), "expected a list of articles. Received: dict"),
        (
            lambda d: d["data"][0].update(paragraphs="text"),
            r"article 0 \('Paris'\): 'paragraphs' must be a list. Received: str",
        ),
        (
            lambda d: d["data"][0].update(paragraphs=["a context"]),
            r"paragraph 0: expected an object with 'context' and 'qas'. Received: 'a context'",
        ),
        (
            lambda d: d["data"][0]["paragraphs"][0].update(qas="abc"),
            "'context' must be a string and 'qas' a list. Received: str and str",
        ),
        (
            lambda d: d["data"][0]["paragraphs"][0].update(context=3),
            "'context' must be a string and 'qas' a list. Received: int and list",
        ),
        (
            lambda d: d["data"][0]["paragraphs"][0]["qas"][0].update(answers={"text": "P"}),
            r"question 'a': 'answers' must be a list. Received: \{'text': 'P'\}",
        ),
        (
            lambda d: d["data"][0]["paragraphs"][0]["qas"][0].update(
                answers=[{"text": "Paris", "answer_start": True}]
            ),
            "an answer must be {'text': str, 'answer_start': int}",
        ),
    ],
)
def test_read_squad_refuses_other_layouts(edit, message):
    data = _squad()
    edit(data)
    with pytest.raises(ValueError, match=message):
        read_squad(data)


@_needs_data
def test_real_squad_dev():
    examples = read_squad(_DATA_DIR / "squad" / "dev-v1.1.json")
    assert len(examples) == 10570
    assert examples.num_misaligned == 0 and examples.dropped == []
    assert len({e["article_index"] for e in examples}) == 48
    assert sum(len(e["answers"]) for e in examples) == 34726
    train, held_out = examples.articles(0, 32), examples.articles(32, 48)
    assert len(train) + len(held_out) == 10570
    assert len(held_out.data) == 16
    first = {e["id"]: e["answers"][0]["text"] for e in held_out}
    assert squad_scores(first, held_out.data)["exact_match"] == 100.0
