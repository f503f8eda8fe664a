"""Entity-level precision / recall / F1 for sequence tagging (NER, chunking).

The default (`mode="conlleval"`) reproduces the CoNLL shared tasks' official
`conlleval` perl script: the same chunk start/end rules, the same counts and
so the same precision, recall and F1 (conlleval prints them multiplied by 100).
Its rules, for tags `B-X`, `I-X` and `O`:

- a chunk ends before `O`, before `B-`, and before a tag of another type;
- a chunk starts at every `B-`, at an `I-X` after `O` (so an IOB2 sequence
  whose chunk lacks its `B-` still counts that chunk), and at any tag whose
  type differs from the previous tag's (`I-Y I-X` starts an `X` chunk);
- `I-X` after `B-X` or `I-X` continues the chunk.

These rules read IOB1 (CoNLL-2003's own scheme, where `B-` only separates two
adjacent chunks of one type) and IOB2 the same way; `scheme` then only says
which prefixes are legal. For IOBES, conlleval's rules for `E-` are kept
(`E-X` after `O` or after `E-X` starts a chunk) and, since the perl script
predates `S-`, the rules are completed as in `seqeval`'s default mode: a chunk
always ends after `E-`/`S-`, and always starts at `B-`/`S-`.

`mode="strict"` (IOB2 and IOBES only) counts only well-formed chunks: IOB2
`B-X I-X*`; IOBES `S-X` or `B-X I-X* E-X`. Tokens that do not form such a
chunk are ignored.
"""

import collections

_SCHEMES = {"IOB1": "BI", "IOB2": "BI", "IOBES": "BIES"}
_MODES = ("conlleval", "strict")


def _parse_tag(tag, scheme, position):
    """Splits `tag` into (prefix, type); `O` is ("O", "")."""
    if not isinstance(tag, str):
        raise ValueError(
            f"Tags must be strings. Received {tag!r} ({type(tag).__name__}) at {position}."
        )
    if tag == "O":
        return "O", ""
    prefix, hyphen, entity_type = tag.partition("-")
    if not hyphen or prefix not in _SCHEMES[scheme] or not entity_type:
        allowed = ", ".join(f"{p}-TYPE" for p in _SCHEMES[scheme])
        raise ValueError(
            f"Invalid tag {tag!r} at {position} for scheme={scheme!r}: expected "
            f"'O' or one of {allowed}."
        )
    return prefix, entity_type


def _chunk_ends(prev_prefix, prefix, prev_type, entity_type):
    """conlleval's endOfChunk: does the chunk ending at the previous tag end?"""
    if prev_prefix in "BI" and prefix in "BO":
        return True
    if prev_prefix == "E" and prefix in "EIO":
        return True
    if prev_prefix != "O" and prev_type != entity_type:
        return True
    # IOBES completion (no effect on B/I/O tags): E- and S- close a chunk,
    # and a following S- closes the open one.
    return prev_prefix in "ES" or (prev_prefix in "BI" and prefix == "S")


def _chunk_starts(prev_prefix, prefix, prev_type, entity_type):
    """conlleval's startOfChunk: does a chunk start at this tag?"""
    if prefix == "B" and prev_prefix in "BIO":
        return True
    if (prev_prefix, prefix) in {("O", "I"), ("O", "E"), ("E", "E"), ("E", "I")}:
        return True
    if prefix != "O" and prev_type != entity_type:
        return True
    # IOBES completion: B- and S- always open a chunk, and a tag after S-
    # cannot continue it.
    return prefix in "BS" or (prev_prefix == "S" and prefix in "IE")


def _lenient_chunks(parsed):
    chunks = []
    start = None
    prev_prefix, prev_type = "O", ""
    for i, (prefix, entity_type) in enumerate(parsed + [("O", "")]):
        if start is not None and _chunk_ends(prev_prefix, prefix, prev_type, entity_type):
            chunks.append((start, i, prev_type))
            start = None
        if prefix != "O" and _chunk_starts(prev_prefix, prefix, prev_type, entity_type):
            start = i
        prev_prefix, prev_type = prefix, entity_type
    return chunks


def _strict_chunks(parsed, scheme):
    chunks = []
    i = 0
    n = len(parsed)
    while i < n:
        prefix, entity_type = parsed[i]
        if scheme == "IOBES" and prefix == "S":
            chunks.append((i, i + 1, entity_type))
            i += 1
            continue
        if prefix != "B":
            i += 1
            continue
        j = i + 1
        while j < n and parsed[j] == ("I", entity_type):
            j += 1
        if scheme == "IOB2":
            chunks.append((i, j, entity_type))
            i = j
        elif j < n and parsed[j] == ("E", entity_type):
            chunks.append((i, j + 1, entity_type))
            i = j + 1
        else:  # IOBES B-X I-X* not closed by E-X: not an entity.
            i = j
    return chunks


def extract_entities(tags, scheme="IOB1", mode="conlleval"):
    """Chunks of one tag sequence as `(start, end, type)` (end exclusive).

    Args:
        tags: list of string tags for one sentence.
        scheme: str. `"IOB1"`, `"IOB2"` or `"IOBES"`. Defaults to `"IOB1"`.
        mode: str. `"conlleval"` or `"strict"` (see the module docstring).
            Defaults to `"conlleval"`.

    Returns:
        list of `(start, end, type)` tuples in order of position.

    Example:

    >>> extract_entities(["I-PER", "I-PER", "B-PER", "O", "I-LOC"])
    [(0, 2, 'PER'), (2, 3, 'PER'), (4, 5, 'LOC')]
    >>> extract_entities(["O", "I-PER", "B-LOC"], scheme="IOB2", mode="strict")
    [(2, 3, 'LOC')]
    """
    _check_scheme_and_mode(scheme, mode)
    parsed = [_parse_tag(t, scheme, f"position {i}") for i, t in enumerate(tags)]
    if mode == "strict":
        return _strict_chunks(parsed, scheme)
    return _lenient_chunks(parsed)


def _check_scheme_and_mode(scheme, mode):
    if scheme not in _SCHEMES:
        raise ValueError(f"`scheme` must be one of {tuple(_SCHEMES)}. Received: scheme={scheme!r}")
    if mode not in _MODES:
        raise ValueError(f"`mode` must be one of {_MODES}. Received: mode={mode!r}")
    if mode == "strict" and scheme == "IOB1":
        raise ValueError(
            "`mode='strict'` is defined for the IOB2 and IOBES schemes; IOB1 is "
            "read with conlleval's rules only. Received: scheme='IOB1', "
            "mode='strict'"
        )


def _is_tag_sequence(value):
    return not isinstance(value, str) and hasattr(value, "__len__")


def _sentences(tags, name):
    """Nested sentences, or a flat list split at "" (blank-line) markers."""
    if isinstance(tags, str) or not hasattr(tags, "__len__"):
        raise ValueError(
            f"`{name}` must be a list of sentences (lists of string tags) or a "
            f"flat list of string tags. Received: {type(tags).__name__}"
        )
    items = list(tags)
    if items and all(_is_tag_sequence(item) for item in items):
        return [list(sentence) for sentence in items]
    if any(_is_tag_sequence(item) for item in items):
        raise ValueError(
            f"`{name}` mixes sentences (lists) and single tags; pass either a "
            "list of sentences or one flat list of tags."
        )
    sentences = [[]]
    for tag in items:
        if tag == "":
            sentences.append([])
        else:
            sentences[-1].append(tag)
    return sentences


def _scores(correct, true, pred):
    precision = correct / pred if pred else 0.0
    recall = correct / true if true else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "num_true": true,
        "num_pred": pred,
        "num_correct": correct,
    }


def entity_f1(true_tags, pred_tags, scheme="IOB1", mode="conlleval"):
    """Entity-level precision, recall and F1, as CoNLL's `conlleval` script.

    A predicted entity counts as correct when a true entity has exactly the
    same first token, last token and type. Entities never cross sentences.

    Args:
        true_tags: gold tags: a list of sentences, each a list of string tags
            (`"O"`, `"B-PER"`, ...); or one flat list of tags in which an
            empty string `""` marks a sentence boundary (as a blank line does
            in conlleval's input).
        pred_tags: predicted tags, laid out as `true_tags` with the same
            lengths.
        scheme: str. `"IOB1"` (CoNLL-2003's files), `"IOB2"` or `"IOBES"`: the
            prefixes allowed (B/I, B/I, B/I/E/S) and, in strict mode, what a
            well-formed chunk is. Defaults to `"IOB1"`.
        mode: str. `"conlleval"` (the official script's rules, lenient on
            ill-formed chunks) or `"strict"` (IOB2 / IOBES only: ill-formed
            chunks are not entities). Defaults to `"conlleval"`.

    Returns:
        dict with float `precision`, `recall`, `f1` in [0, 1] (0.0 where
        undefined, as conlleval), int `num_true`, `num_pred`, `num_correct`,
        float `accuracy` (token tags equal, as conlleval's "accuracy"), and
        `per_type`: {type: dict of the same six keys}, for every type found in
        the gold or the predicted entities.

    Example:

    >>> scores = entity_f1(
    ...     [["B-PER", "I-PER", "O", "B-LOC"]],
    ...     [["B-PER", "I-PER", "O", "B-ORG"]],
    ...     scheme="IOB2",
    ... )
    >>> scores["precision"], scores["recall"], scores["per_type"]["PER"]["f1"]
    (0.5, 0.5, 1.0)

    Reference: https://www.clips.uantwerpen.be/conll2000/chunking/output.html
    """
    _check_scheme_and_mode(scheme, mode)
    true_sentences = _sentences(true_tags, "true_tags")
    pred_sentences = _sentences(pred_tags, "pred_tags")
    if len(true_sentences) != len(pred_sentences):
        raise ValueError(
            "`true_tags` and `pred_tags` must hold the same number of sentences. "
            f"Received: {len(true_sentences)} and {len(pred_sentences)}"
        )
    true_count = collections.Counter()
    pred_count = collections.Counter()
    correct_count = collections.Counter()
    equal_tokens = 0
    total_tokens = 0
    for index, (true_sentence, pred_sentence) in enumerate(zip(true_sentences, pred_sentences)):
        if len(true_sentence) != len(pred_sentence):
            raise ValueError(
                f"Sentence {index} has {len(true_sentence)} gold tags but "
                f"{len(pred_sentence)} predicted tags; expected equal lengths."
            )
        parsed = []
        for tags, which in ((true_sentence, "true"), (pred_sentence, "pred")):
            parsed.append(
                [
                    _parse_tag(tag, scheme, f"{which}_tags sentence {index}, token {i}")
                    for i, tag in enumerate(tags)
                ]
            )
        if mode == "strict":
            true_chunks = _strict_chunks(parsed[0], scheme)
            pred_chunks = _strict_chunks(parsed[1], scheme)
        else:
            true_chunks = _lenient_chunks(parsed[0])
            pred_chunks = _lenient_chunks(parsed[1])
        true_count.update(chunk[2] for chunk in true_chunks)
        pred_count.update(chunk[2] for chunk in pred_chunks)
        correct_count.update(chunk[2] for chunk in set(true_chunks).intersection(pred_chunks))
        equal_tokens += sum(t == p for t, p in zip(true_sentence, pred_sentence))
        total_tokens += len(true_sentence)

    scores = _scores(
        sum(correct_count.values()), sum(true_count.values()), sum(pred_count.values())
    )
    scores["accuracy"] = equal_tokens / total_tokens if total_tokens else 0.0
    scores["per_type"] = {
        entity_type: _scores(
            correct_count[entity_type],
            true_count[entity_type],
            pred_count[entity_type],
        )
        for entity_type in sorted(set(true_count) | set(pred_count))
    }
    return scores
