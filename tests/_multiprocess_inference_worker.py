"""One process of tests/test_multiprocess.py's inference tests: predict, evaluate and encode.

Started as `tests/_multiprocess_worker.py` is (the launcher's environment, or
`--coordinator` on JAX). Every process builds the same tiny classifier (inside
`data_parallel().scope()`, so on JAX and TensorFlow its variables span the processes) and a
tiny embedder (outside it), then runs `predict` on packed arrays and on raw text, `evaluate`,
`encode`, and `encode(..., output_dir=...)`; it writes what it got into
`<results>/inference_<index>.npz` / `.json`. `--encode-only` runs only the sharded encode;
with `--die-in encode:K` this process kills itself (`kill -9`) right after writing its K-th
shard.

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
    """What the test compares: NumPy arrays and a JSON-able dict."""
    x, y = packed()
    arrays = {
        "predict": classifier.predict(x, batch_size=4, verbose=0),
        "predict_text": classifier.predict(texts()[:9], batch_size=4, verbose=0),
        "encode": embedder.encode(texts(), batch_size=4),
        "encode_binary": embedder.encode(texts(), batch_size=4, precision="ubinary"),
    }
    report = {"evaluate": classifier.evaluate(x, y, batch_size=4, return_dict=True, verbose=0)}
    paths = embedder.encode(texts(), batch_size=4, output_dir=shards, shard_rows=5)
    report["shards"] = [p.name for p in paths]
    return arrays, report


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
