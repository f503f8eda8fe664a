"""Entity F1 against a streaming re-implementation of conlleval written in
this file from the perl script's documented logic, strict mode against a regular
expression of its chunks, hand-built sequences whose scores differ between schemes
and modes, and bad input."""

import random
import re

import pytest

from kbert.metrics import entity_f1, extract_entities

pytestmark = pytest.mark.backend_independent


def _split(tag):
    """conlleval: 'B-ORG-X' -> ('B', 'ORG-X'); 'O' -> ('O', '')."""
    if "-" in tag:
        prefix, rest = tag.split("-", 1)
        return prefix, rest
    return tag, ""


def _oracle_end(prev, cur, prev_type, cur_type, iobes):
    pairs_end = {("B", "B"), ("B", "O"), ("I", "B"), ("I", "O"), ("E", "E"), ("E", "I"), ("E", "O")}
    end = (prev, cur) in pairs_end or (prev != "O" and prev_type != cur_type)
    if iobes:  # seqeval-default completion for S-
        end = end or prev in ("E", "S") or (prev in ("B", "I") and cur == "S")
    return end


def _oracle_start(prev, cur, prev_type, cur_type, iobes):
    pairs_start = {
        ("B", "B"),
        ("I", "B"),
        ("O", "B"),
        ("O", "I"),
        ("E", "E"),
        ("E", "I"),
        ("O", "E"),
    }
    start = (prev, cur) in pairs_start or (cur != "O" and prev_type != cur_type)
    if iobes:
        start = start or cur in ("B", "S") or (prev == "S" and cur in ("I", "E"))
    return start


def conlleval_oracle(true_sentences, pred_sentences, iobes=False):
    """conlleval's single pass over the token stream: a chunk is correct when
    gold and guess start together with one type and end together.
    Sentence breaks are O tokens. Returns (found_true, found_pred, correct)."""
    found_true = found_pred = correct = 0
    in_correct = False
    last_t, last_t_type, last_p, last_p_type = "O", "", "O", ""
    stream = []
    for ts, ps in zip(true_sentences, pred_sentences):
        stream.extend(zip(ts, ps))
        stream.append(("O", "O"))  # boundary
    for t_tag, p_tag in stream:
        t, t_type = _split(t_tag)
        p, p_type = _split(p_tag)
        end_t = _oracle_end(last_t, t, last_t_type, t_type, iobes)
        end_p = _oracle_end(last_p, p, last_p_type, p_type, iobes)
        start_t = _oracle_start(last_t, t, last_t_type, t_type, iobes)
        start_p = _oracle_start(last_p, p, last_p_type, p_type, iobes)
        if in_correct:
            if end_t and end_p and last_p_type == last_t_type:
                in_correct = False
                correct += 1
            elif end_t != end_p or p_type != t_type:
                in_correct = False
        if start_t and start_p and p_type == t_type:
            in_correct = True
        found_true += start_t
        found_pred += start_p
        last_t, last_t_type, last_p, last_p_type = t, t_type, p, p_type
    if in_correct:
        correct += 1
    return found_true, found_pred, correct


def _random_tags(rng, prefixes, length):
    return [
        "O"
        if rng.random() < 0.3
        else f"{rng.choice(prefixes)}-{rng.choice(['PER', 'LOC', 'ORG-X'])}"
        for _ in range(length)
    ]


@pytest.mark.parametrize("scheme, prefixes", [("IOB1", "BI"), ("IOB2", "BI"), ("IOBES", "BIES")])
def test_counts_equal_conlleval_oracle_on_random_sequences(scheme, prefixes):
    rng = random.Random(1234)
    for _ in range(150):
        true = [_random_tags(rng, prefixes, rng.randint(0, 9)) for _ in range(rng.randint(1, 5))]
        pred = [
            [t if rng.random() < 0.6 else _random_tags(rng, prefixes, 1)[0] for t in sentence]
            for sentence in true
        ]
        scores = entity_f1(true, pred, scheme=scheme)
        expected = conlleval_oracle(true, pred, iobes=scheme == "IOBES")
        assert (scores["num_true"], scores["num_pred"], scores["num_correct"]) == expected


_STRICT_CHUNK = {
    # A chunk is a whole run of tags of one type: IOB2 `B-X I-X*` (as long as it goes),
    # IOBES `S-X` or `B-X I-X* E-X`; every tag is one space-led word of the joined string.
    "IOB2": re.compile(r" B-(\S+)(?: I-\1)*(?= |$)"),
    "IOBES": re.compile(r" S-(\S+)(?= |$)| B-(\S+)(?: I-\2)* E-\2(?= |$)"),
}


def _strict_oracle(tags, scheme):
    """Strict-mode chunks found by a regular expression over the joined tags."""
    text = "".join(" " + tag for tag in tags)
    return [
        (
            text[: match.start()].count(" "),
            text[: match.end()].count(" "),
            match.group(1) or match.group(2),
        )
        for match in _STRICT_CHUNK[scheme].finditer(text)
    ]


@pytest.mark.parametrize("scheme, prefixes", [("IOB2", "BI"), ("IOBES", "BIES")])
def test_strict_chunks_equal_a_pattern_oracle_on_random_sequences(scheme, prefixes):
    # Two types, so that a run broken by a tag of the other type (`B-X I-Y`, `B-X I-X E-Y`)
    # comes up often.
    rng = random.Random(99)
    found = 0
    for _ in range(400):
        tags = [
            "O" if rng.random() < 0.15 else f"{rng.choice(prefixes)}-{rng.choice(['PER', 'LOC'])}"
            for _ in range(rng.randint(0, 10))
        ]
        expected = _strict_oracle(tags, scheme)
        assert extract_entities(tags, scheme=scheme, mode="strict") == expected, tags
        found += len(expected)
    assert found > 300


def test_conlleval_rules_by_hand():
    # I-X after O starts a chunk; I-Y after I-X starts a new chunk; B-X splits.
    assert extract_entities(["O", "I-PER", "I-PER", "I-LOC", "B-LOC", "O"]) == [
        (1, 3, "PER"),
        (3, 4, "LOC"),
        (4, 5, "LOC"),
    ]
    # B-X after O (ill-formed in IOB1) still starts a chunk, I-Y after B-X too.
    assert extract_entities(["B-PER", "I-LOC", "O", "B-ORG"]) == [
        (0, 1, "PER"),
        (1, 2, "LOC"),
        (3, 4, "ORG"),
    ]
    # IOBES: E- closes, S- is one token, E-X after O starts a chunk.
    assert extract_entities(
        ["S-PER", "S-PER", "B-LOC", "E-LOC", "B-LOC", "O", "E-ORG", "I-ORG"], scheme="IOBES"
    ) == [(0, 1, "PER"), (1, 2, "PER"), (2, 4, "LOC"), (4, 5, "LOC"), (6, 7, "ORG"), (7, 8, "ORG")]


def test_scores_by_hand_with_per_type_and_accuracy():
    true = [["B-PER", "I-PER", "O", "B-LOC", "I-LOC"], ["B-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-LOC", "O"], ["B-ORG", "B-MISC"]]
    scores = entity_f1(true, pred, scheme="IOB2")
    # gold: PER, LOC(3-5), ORG; pred: PER, LOC(3-4), ORG, MISC; correct: PER, ORG.
    assert (scores["num_true"], scores["num_pred"], scores["num_correct"]) == (3, 4, 2)
    assert scores["precision"] == pytest.approx(0.5)
    assert scores["recall"] == pytest.approx(2 / 3)
    assert scores["f1"] == pytest.approx(2 * 0.5 * (2 / 3) / (0.5 + 2 / 3))
    assert scores["accuracy"] == pytest.approx(5 / 7)
    assert sorted(scores["per_type"]) == ["LOC", "MISC", "ORG", "PER"]
    assert scores["per_type"]["LOC"]["f1"] == 0.0
    assert scores["per_type"]["MISC"] == {
        "precision": 0.0,
        "recall": 0.0,
        "f1": 0.0,
        "num_true": 0,
        "num_pred": 1,
        "num_correct": 0,
    }
    assert scores["per_type"]["PER"]["f1"] == 1.0


def test_scores_differ_between_schemes_and_modes():
    # A prediction that drops B- (common after IOB1 -> IOB2 confusion).
    true = [["B-PER", "I-PER", "O", "B-LOC"]]
    pred = [["I-PER", "I-PER", "O", "B-LOC"]]
    lenient = entity_f1(true, pred, scheme="IOB2")
    strict = entity_f1(true, pred, scheme="IOB2", mode="strict")
    assert lenient["f1"] == 1.0  # conlleval: I-PER after O starts the chunk
    assert (strict["num_pred"], strict["num_correct"]) == (1, 1)
    assert strict["recall"] == 0.5 and strict["precision"] == 1.0
    # IOBES: B- not closed by E- is an entity for conlleval, not in strict mode.
    true = [["B-PER", "E-PER", "O", "S-LOC"]]
    pred = [["B-PER", "I-PER", "O", "S-LOC"]]
    assert entity_f1(true, pred, scheme="IOBES")["f1"] == 1.0
    strict = entity_f1(true, pred, scheme="IOBES", mode="strict")
    assert (strict["num_true"], strict["num_pred"], strict["num_correct"]) == (2, 1, 1)
    # The same string tags, IOB2 vs IOBES strict: "B-X I-X" is complete only in IOB2.
    tags = [["B-PER", "I-PER"]]
    assert entity_f1(tags, tags, scheme="IOB2", mode="strict")["num_true"] == 1
    assert entity_f1(tags, tags, scheme="IOBES", mode="strict")["num_true"] == 0


def test_flat_input_with_boundaries_equals_nested():
    true = [["I-PER", "I-PER"], ["I-PER", "O"]]
    pred = [["I-PER", "O"], ["I-PER", "I-LOC"]]
    flat_true = ["I-PER", "I-PER", "", "I-PER", "O"]
    flat_pred = ["I-PER", "O", "", "I-PER", "I-LOC"]
    assert entity_f1(flat_true, flat_pred) == entity_f1(true, pred)
    # Chunks never cross a boundary: two PER chunks, not one.
    assert entity_f1(["I-PER", "", "I-PER"], ["I-PER", "", "I-PER"])["num_true"] == 2
    assert entity_f1(["I-PER", "I-PER"], ["I-PER", "I-PER"])["num_true"] == 1


def test_bad_input_raises():
    with pytest.raises(ValueError, match="Invalid tag 'X-PER'"):
        entity_f1([["X-PER"]], [["O"]])
    with pytest.raises(ValueError, match="Invalid tag 'E-PER'.*IOB2"):
        entity_f1([["O"]], [["E-PER"]], scheme="IOB2")
    with pytest.raises(ValueError, match="Invalid tag 'B-'"):
        entity_f1([["B-"]], [["O"]])
    with pytest.raises(ValueError, match="Invalid tag 'PER'"):
        entity_f1([["PER"]], [["O"]])
    with pytest.raises(ValueError, match="strings"):
        entity_f1([[1]], [["O"]])
    with pytest.raises(ValueError, match="Sentence 1 has 2 gold tags but 1"):
        entity_f1([["O"], ["O", "O"]], [["O"], ["O"]])
    with pytest.raises(ValueError, match="same number of sentences"):
        entity_f1([["O"], ["O"]], [["O"]])
    with pytest.raises(ValueError, match="strict"):
        entity_f1([["O"]], [["O"]], scheme="IOB1", mode="strict")
    with pytest.raises(ValueError, match="scheme"):
        entity_f1([["O"]], [["O"]], scheme="BILOU")
    with pytest.raises(ValueError, match="list of sentences"):
        entity_f1("O O", "O O")
