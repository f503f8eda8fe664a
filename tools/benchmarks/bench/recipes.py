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


def trainer_arguments(directory, batch_size, learning_rate, seed, logging_steps, **warmup):
    """Keyword arguments of a Hugging Face `TrainingArguments` (sentence-transformers' trainers)
    for one epoch of kbert's recipe on the CPU: AdamW with weight decay `WEIGHT_DECAY` and
    epsilon `EPSILON`, clipping at `CLIP_NORM`, linear decay after the `warmup` given
    (`warmup_steps=` or `warmup_ratio=`); nothing saved or reported."""
    return dict(
        output_dir=directory,
        num_train_epochs=1,
        per_device_train_batch_size=batch_size,
        learning_rate=learning_rate,
        weight_decay=WEIGHT_DECAY,
        adam_epsilon=EPSILON,
        max_grad_norm=CLIP_NORM,
        lr_scheduler_type="linear",
        seed=seed,
        save_strategy="no",
        report_to="none",
        logging_steps=logging_steps,
        use_cpu=True,
        **warmup,
    )


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
