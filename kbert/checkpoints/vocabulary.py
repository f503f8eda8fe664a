"""WordPiece vocabulary files (`vocab.txt`, one token a line) for the checkpoint readers and writers."""

from pathlib import Path


def read_vocabulary(path):
    """The tokens of a `vocab.txt`, one per line (only `\\n` separates tokens; `\\r` is stripped).

    Splitting on `\\n` alone keeps tokens such as U+2028 intact, which `str.splitlines` would
    break apart.
    """
    text = Path(path).read_text(encoding="utf-8")
    tokens = [line.rstrip("\r") for line in text.split("\n")]
    if tokens and tokens[-1] == "":
        tokens.pop()
    return tokens


def check_vocabulary_size(path, vocabulary_size, source=None):
    """Raises a ValueError when the vocabulary file's size differs from the model's `vocabulary_size`."""
    if path is None:
        return
    count = len(read_vocabulary(path))
    if count != vocabulary_size:
        raise ValueError(
            f"The vocabulary {path} has {count} tokens but "
            f"{source or 'the model config'} says vocabulary_size={vocabulary_size}. "
            "A vocabulary and its embedding table must have the same size."
        )


def write_vocabulary(tokens, path):
    Path(path).write_text("".join(f"{t}\n" for t in tokens), encoding="utf-8")


def resolve_vocabulary(model, vocabulary, vocabulary_size):
    """The tokens to export for `model`: `vocabulary` (list or path), else the model's own, else None."""
    from kbert.checkpoints.kbert_preset import _vocabulary_source

    if vocabulary is None:
        vocabulary = _vocabulary_source(model)
    if vocabulary is None:
        return None
    if isinstance(vocabulary, (list, tuple)):
        tokens = [str(t) for t in vocabulary]
    else:
        tokens = read_vocabulary(vocabulary)
    if len(tokens) != vocabulary_size:
        raise ValueError(
            f"The vocabulary has {len(tokens)} tokens but the model's vocabulary_size is "
            f"{vocabulary_size}."
        )
    return tokens
