"""One process of tests/test_multiprocess.py's inference tests: predict, evaluate and encode.

Started as `tests/_multiprocess_worker.py` is (the launcher's environment, or
`--coordinator` on JAX). Every process builds the same tiny classifier (inside
`data_parallel().scope()`, so on JAX and TensorFlow its variables span the processes) and a
tiny embedder, cross-encoder, sparse encoder and multiple-choice model (outside it), then runs
`predict` on packed arrays and on raw text, `evaluate`, `encode`, `encode(..., output_dir=...)`,
the cross-encoder's `predict` and `rank`, the sparse encoder's `encode` and multiple choice's
`predict`; it writes what it got into `<results>/inference_<index>.npz` / `.json`, with the
rows each call ran through a model in this process (`rows_run`: the length of every row, from
`PipelineModel._predict_by_length`, which every share passes through). `--encode-only` runs
only the sharded encode; with `--die-in encode:K` this process kills itself (`kill -9`) right
after writing its K-th shard.

`reference()` computes the same in one process, for the test to compare.
"""

import contextlib
import json
import os
import signal

from tests._multiprocess_worker import join, launcher_arguments


def _parse(argv):
    parser = launcher_arguments()
    parser.add_argument("--encode-only", action="store_true", help="Only encode into shards.")
    parser.add_argument("--die-in", default=None, help="encode:K - kill -9 after shard K.")
    return parser.parse_args(argv)


def texts():
    from tests.models.test_classifier import TOY_WORDS

    # 23 texts of 1 to 45 words: more rows than processes, not a multiple of them.
    words = TOY_WORDS
    return [
        " ".join(words[(7 * i + j) % len(words)] for j in range(1 + (i * 13) % 45))
        for i in range(23)
    ]


def packed(rows=37, length=16):
    """Packed rows of many lengths, padding with holes, id 0 at padded positions."""
    import numpy as np

    rng = np.random.default_rng(5)
    mask = (np.arange(length)[None] < rng.integers(2, length + 1, (rows, 1))).astype("int32")
    mask[3::7, 1:3] = 0
    x = {
        "token_ids": rng.integers(5, 40, (rows, length)).astype("int32") * mask,
        "segment_ids": np.zeros((rows, length), "int32"),
        "padding_mask": mask,
    }
    return x, rng.integers(0, 3, (rows,)).astype("int32")


# Per call of `run`: the lengths of the rows this process ran through a model.
ROWS_RUN = {}
_COUNTING = []


@contextlib.contextmanager
def count_rows():
    """While inside: records, under the label of the call being run (`counting`), the row
    lengths of every batch plan `PipelineModel._predict_by_length` runs."""
    from kbert.data import batching
    from kbert.models.pipeline import PipelineModel

    original = PipelineModel.__dict__["_predict_by_length"]

    def counted(self, x, *args, **kwargs):
        if _COUNTING:
            lengths = batching.row_lengths(x["padding_mask"]).tolist()
            ROWS_RUN.setdefault(_COUNTING[-1], []).extend(lengths)
        return original(self, x, *args, **kwargs)

    PipelineModel._predict_by_length = counted
    try:
        yield
    finally:
        PipelineModel._predict_by_length = original


@contextlib.contextmanager
def counting(label):
    _COUNTING.append(label)
    ROWS_RUN.setdefault(label, [])
    try:
        yield
    finally:
        _COUNTING.pop()


def pairs():
    """Query-document pairs for the cross-encoder: 13 pairs, one far longer than the rest."""
    all_texts = texts()
    return [(all_texts[i], all_texts[(i * 5 + 3) % len(all_texts)]) for i in range(13)]


def choices(rows=11, num_choices=3, length=12):
    """Packed multiple-choice rows `(rows, num_choices, length)` of many lengths."""
    import numpy as np

    rng = np.random.default_rng(7)
    mask = (np.arange(length) < rng.integers(2, length + 1, (rows, num_choices, 1))).astype("int32")
    return {
        "token_ids": rng.integers(5, 40, (rows, num_choices, length)).astype("int32") * mask,
        "segment_ids": np.zeros((rows, num_choices, length), "int32"),
        "padding_mask": mask,
    }


def build_others():
    """A cross-encoder, a sparse encoder and a multiple-choice model, the same everywhere."""
    import keras
    import numpy as np

    from kbert.models import BertBackbone, BertCrossEncoder, BertMultipleChoice, BertSparseEncoder
    from tests.models.test_classifier import TOY_VOCABULARY, toy_preprocessor
    from tests.test_case import tiny_backbone_kwargs

    keras.utils.set_random_seed(1)
    kwargs = tiny_backbone_kwargs(vocabulary_size=len(TOY_VOCABULARY), max_sequence_length=64)
    models = (
        BertCrossEncoder(BertBackbone(**kwargs), preprocessor=toy_preprocessor(40)),
        BertSparseEncoder(BertBackbone(**kwargs), preprocessor=toy_preprocessor(48)),
        BertMultipleChoice(BertBackbone(**kwargs), dropout=0.0),
    )
    rng = np.random.default_rng(1)
    for model in models:
        model.set_weights(
            [
                (w.path.endswith("gamma") + rng.normal(0, 0.3, w.shape)).astype(w.dtype)
                for w in model.weights
            ]
        )
    return models


def build(scope=None):
    """The classifier (in `scope`, if given) and the embedder, the same in every process."""
    import keras
    import numpy as np

    from kbert.models import BertBackbone, BertClassifier, BertTextEmbedder
    from tests.models.test_classifier import TOY_VOCABULARY, toy_preprocessor
    from tests.test_case import tiny_backbone_kwargs

    keras.utils.set_random_seed(0)
    kwargs = tiny_backbone_kwargs(vocabulary_size=len(TOY_VOCABULARY), max_sequence_length=64)
    with scope if scope is not None else contextlib.nullcontext():
        classifier = BertClassifier(
            BertBackbone(**kwargs), num_classes=3, preprocessor=toy_preprocessor(16)
        )
    embedder = BertTextEmbedder(BertBackbone(**kwargs), preprocessor=toy_preprocessor(48))
    rng = np.random.default_rng(0)
    for model in (classifier, embedder):
        model.set_weights(
            [
                (w.path.endswith("gamma") + rng.normal(0, 0.3, w.shape)).astype(w.dtype)
                for w in model.weights
            ]
        )
    return classifier, embedder


def run(classifier, embedder, shards):
    """What the test compares: NumPy arrays and a JSON-able dict (`rows_run` included)."""
    ROWS_RUN.clear()
    x, y = packed()
    cross_encoder, sparse_encoder, multiple_choice = build_others()
    calls = {
        "predict": lambda: classifier.predict(x, batch_size=4, verbose=0),
        "predict_text": lambda: classifier.predict(texts()[:9], batch_size=4, verbose=0),
        "encode": lambda: embedder.encode(texts(), batch_size=4),
        "encode_binary": lambda: embedder.encode(texts(), batch_size=4, precision="ubinary"),
        "cross_encoder": lambda: cross_encoder.predict(pairs(), batch_size=4),
        "rank": lambda: np_scores(cross_encoder.rank(texts()[0], texts()[1:12], batch_size=4)),
        "sparse_encoder": lambda: sparse_encoder.encode(
            texts(), batch_size=4, convert_to_sparse=False
        ),
        "multiple_choice": lambda: multiple_choice.predict(choices(), batch_size=4, verbose=0),
    }
    arrays = {}
    with count_rows():
        for label, call in calls.items():
            with counting(label):
                arrays[label] = call()
        with counting("evaluate"):
            evaluated = classifier.evaluate(x, y, batch_size=4, return_dict=True, verbose=0)
        report = {"evaluate": evaluated}
        with counting("shards"):
            paths = embedder.encode(texts(), batch_size=4, output_dir=shards, shard_rows=5)
    report["shards"] = [p.name for p in paths]
    report["rows_run"] = {label: list(lengths) for label, lengths in ROWS_RUN.items()}
    return arrays, report


def np_scores(ranking):
    """`rank`'s list of dicts as an array `(documents, 2)`: corpus id and score."""
    import numpy as np

    return np.array([[r["corpus_id"], r["score"]] for r in ranking], "float64")


def reference(output):
    """One process, no distribution: `run`'s arrays and report."""
    return run(*build(), os.path.join(output, "shards"))


def _die_after_shard(k):
    from kbert.models import process_inference

    written = []
    original = process_inference.atomic_file

    @contextlib.contextmanager
    def atomic_file(path):
        with original(path) as temporary:
            yield temporary
        written.append(path)
        if len(written) == k:
            os.kill(os.getpid(), signal.SIGKILL)

    process_inference.atomic_file = atomic_file


def main(argv=None):
    args = _parse(argv)
    import numpy as np

    import kbert
    from kbert import processes

    os.makedirs(args.results, exist_ok=True)
    index = join(args)
    if args.encode_only:
        if args.die_in:
            _die_after_shard(int(args.die_in.split(":")[1]))
        _, embedder = build()
        embedder.encode(
            texts(), batch_size=4, output_dir=os.path.join(args.output, "shards"), shard_rows=5
        )
        raise SystemExit("Encoded, although a process died.")
    classifier, embedder = build(kbert.distribution.data_parallel().scope())
    arrays, report = run(classifier, embedder, os.path.join(args.output, "shards"))
    np.savez(os.path.join(args.results, f"inference_{index}.npz"), **arrays)
    report["process_count"] = processes.process_count()
    with open(os.path.join(args.results, f"inference_{index}.json"), "w") as f:
        json.dump(report, f)
    kbert.distribution.shutdown()


if __name__ == "__main__":
    main()
