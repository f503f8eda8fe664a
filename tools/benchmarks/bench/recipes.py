"""The fine-tuning recipes of the quality benchmark (benchmark_quality.py, also benchmark_lora.py):
hyperparameters, and each task's data, read and shuffled the same way for every framework."""

from pathlib import Path

RECIPES = {
    "sst2": dict(
        train_examples=8000, eval_examples=None, max_length=64, batch_size=32, learning_rate=5e-5
    ),
    "conll": dict(
        train_examples=2000, eval_examples=1000, max_length=128, batch_size=16, learning_rate=1e-4
    ),
    "squad": dict(
        train_examples=1500, eval_examples=500, max_length=256, batch_size=16, learning_rate=1e-4
    ),
}
WEIGHT_DECAY = 0.01
WARMUP_RATIO = 0.1
EPSILON = 1e-6
CLIP_NORM = 1.0
DOC_STRIDE = 128
MAX_QUERY_LENGTH = 64


def sst2_data(data_dir, seed, limit):
    import numpy as np

    from kbert.data.readers import read_glue

    train = read_glue("sst2", "train", data_dir)
    dev = read_glue("sst2", "dev", data_dir)
    order = np.random.default_rng(seed).permutation(len(train))[:limit]
    return (
        [train.sentence1[i] for i in order],
        train.label[order],
        list(dev.sentence1),
        dev.label,
    )


def conll_data(data_dir, seed, limit, eval_limit):
    import numpy as np

    from kbert.data.readers import label_list, read_conll

    folder = Path(data_dir) / "conll2003"
    train = read_conll(folder / "eng.train", to_iob2=True)
    dev = read_conll(folder / "eng.testa", to_iob2=True)[:eval_limit]
    labels = label_list(train)
    order = np.random.default_rng(seed).permutation(len(train))[:limit]
    return [train[i] for i in order], dev, labels


def squad_data(data_dir, seed, limit, eval_limit):
    import numpy as np

    from kbert.data.readers import read_squad

    examples = read_squad(Path(data_dir) / "squad" / "dev-v1.1.json")
    train = examples.articles(0, 32)
    evaluation = examples.articles(32, 48)
    order = np.random.default_rng(seed).permutation(len(train))[:limit]
    eval_examples = list(evaluation)[:eval_limit]
    keep = {e["id"] for e in eval_examples}
    data = [
        {
            **a,
            "paragraphs": [
                {**p, "qas": [q for q in p["qas"] if q["id"] in keep]} for p in a["paragraphs"]
            ],
        }
        for a in evaluation.data
    ]
    return [train[i] for i in order], eval_examples, data
