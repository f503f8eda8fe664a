"""Fine-tuning quality side by side: kbert vs Hugging Face transformers, same checkpoint and recipe.

A benchmark, not a test. Each call trains ONE framework on ONE task with ONE seed and appends a
JSON line to `--results`; `--summary` prints the table of everything recorded. Run the
frameworks one after the other (each needs the whole CPU):

    python tools/benchmarks/benchmark_quality.py sst2 --framework kbert --backend jax --seed 0 \
        --preset DIR
    python tools/benchmarks/benchmark_quality.py sst2 --framework hf --seed 0 --preset DIR
    python tools/benchmarks/benchmark_quality.py --summary

Recipes (identical on both sides; `DIR` is a Hugging Face BERT directory, e.g. all-MiniLM-L6-v2):

- `sst2`: the first `--train-examples` (8,000) rows of SST-2 train.tsv after a shuffle seeded
  with `--seed` (NumPy `default_rng(seed).permutation`), in that order (no further shuffling),
  length 64, batch 32, one epoch, AdamW 5e-5 (beta 0.9/0.999, epsilon 1e-6), weight decay 0.01
  except LayerNorm and biases, gradient norm clipped at 1.0, linear warm-up over 10 % of the
  steps then linear decay to 0, dropout 0.1; metric: dev accuracy (872 rows). kbert tokenizes
  with `kbert.text`, HF with its `BertTokenizerFast` (they give identical ids).
- `conll`: CoNLL-2003 (IOB2 tags), the first `--train-examples` (2,000) training sentences
  after the seeded shuffle, length 128, batch 16, one epoch (125 steps), same optimizer at a
  peak rate of 1e-4 (at 5e-5 and batch 32, 63 steps barely leave the start); metric: conlleval
  entity F1 on the first `--eval-examples` (1,000) eng.testa sentences. Both sides train and
  predict on the same features (`kbert.data.tagging.encode_tagging`: first piece of each word
  labelled), so only the model and training code differ.
- `squad`: SQuAD v1.1 dev, `--train-examples` (1,500) questions of articles 0-31 after the
  seeded shuffle, `--eval-examples` (500) questions of articles 32-47, windows of length 256,
  stride 128, question cap 64, batch 16, one epoch, same optimizer at a peak rate of 1e-4;
  metric: official EM / F1.
  Both sides train on the same windows (`kbert.data.squad.prepare_squad_features`) and their
  logits go through the same decoder (n-best 20, max answer 30 pieces, max-context windows).
  HF logits are masked to the context by kbert's `ContextSpanLogits` before decoding.

Ablation `--no-dropout` (every task): both sides load one HF directory made from the checkpoint plus
the task's head that HF initialises under `torch.manual_seed(seed)`, with dropout 0 in its
config (and in kbert's head), so they start from identical weights and train without randomness:
what remains between them is only floating-point rounding, not seed noise.

Ablation `--unmasked-qa` (squad, kbert only): `BertQuestionAnswerer(context_only=False)`, the
unmasked head of HF's `BertForQuestionAnswering`, whose loss spreads over every position (kbert's
default masks the question, `[SEP]` and padding out of the softmax). With `--no-dropout` it
reproduces HF's run; without the flag the difference is the masking alone.

Ablation `--torch-epsilon` (kbert only): Keras' Adam adds epsilon to the uncorrected sqrt(v),
torch to the bias-corrected one, so with epsilon 1e-6 Keras damps small-gradient updates early in
training where torch does not. The flag compiles kbert's model with
`bert_optimizer(torch_epsilon=True)` (`BertAdamW`, torch's update exactly) at the recipe's rate,
schedule and decay. That is kbert's default optimizer since the runs recorded with the flag;
it is kept so they can be reproduced.
"""

import argparse
import json
import os
import shutil
import time
from pathlib import Path

from bench.data import REPO, default_data_dir, minilm_directory
from bench.recipes import (
    CLIP_NORM,
    DOC_STRIDE,
    EPSILON,
    MAX_QUERY_LENGTH,
    RECIPES,
    WARMUP_RATIO,
    WEIGHT_DECAY,
    conll_data,
    squad_data,
    sst2_data,
)


def kbert_tokenizer(preset):
    from kbert.text import BertTokenizer

    return BertTokenizer.from_preset(preset)


# --------------------------------------------------------------------------- kbert
def torch_epsilon_optimizer(num_steps, learning_rate):
    """kbert's AdamW recipe with epsilon added after bias correction, as torch.optim.AdamW adds it.

    `bert_optimizer(torch_epsilon=True)` (kbert's public optimizer, `BertAdamW`); the same
    schedule, decay, epsilon and clipping as the recipe.
    """
    from kbert.optimizers import bert_optimizer

    return bert_optimizer(
        learning_rate,
        total_steps=num_steps,
        warmup_steps=int(round(num_steps * WARMUP_RATIO)),
        weight_decay=WEIGHT_DECAY,
        epsilon=EPSILON,
        global_clipnorm=CLIP_NORM,
        torch_epsilon=True,
    )


def _maybe_torch_epsilon(model, args, num_examples, recipe):
    if args.torch_epsilon:
        num_steps = -(-num_examples // recipe["batch_size"])
        model.compile(optimizer=torch_epsilon_optimizer(num_steps, recipe["learning_rate"]))


HF_TASK_CLASSES = {
    "sst2": "BertForSequenceClassification",
    "conll": "BertForTokenClassification",
    "squad": "BertForQuestionAnswering",
}


def no_dropout_checkpoint(preset, seed, task, num_labels=None):
    """`preset` + the task's head initialised by HF under `torch.manual_seed(seed)`, with
    dropout 0 in its config, saved once as an HF directory both frameworks load: the two then
    start from the same weights and train without randomness."""
    import torch
    import transformers

    target = REPO / "runs" / f"{task}_no_dropout_seed{seed}"
    if not (target / "config.json").exists():
        torch.manual_seed(seed)
        extra = {} if num_labels is None else {"num_labels": num_labels}
        model = getattr(transformers, HF_TASK_CLASSES[task]).from_pretrained(
            preset, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **extra
        )
        model.save_pretrained(target)
        shutil.copy(Path(preset) / "vocab.txt", target / "vocab.txt")  # both read vocab.txt
    return str(target)


def _source(task, args, common, num_labels=None, head_dropout=True):
    """The directory to load and the head arguments: the preset with a fresh head, or (with
    `--no-dropout`) the shared HF-initialised head with every dropout at 0."""
    if not args.no_dropout:
        common.update(fresh_heads=True)
        return args.preset
    common.update(fresh_heads=False, **({"dropout": 0.0} if head_dropout else {}))
    return no_dropout_checkpoint(args.preset, args.seed, task, num_labels)


def run_kbert(task, args, recipe):
    import numpy as np

    from kbert.models import BertClassifier, BertQuestionAnswerer, BertTagger

    training = dict(
        learning_rate=recipe["learning_rate"], weight_decay=WEIGHT_DECAY, warmup_ratio=WARMUP_RATIO
    )
    common = {}
    if task == "sst2":
        x, y, dev_x, dev_y = sst2_data(args.data_dir, args.seed, recipe["train_examples"])
        source = _source(task, args, common, num_labels=2)
        model = BertClassifier.from_preset(
            source, num_classes=2, sequence_length=recipe["max_length"], **common
        )
        model.compile(**training)
        _maybe_torch_epsilon(model, args, len(y), recipe)
        start = time.time()
        model.fit(x, y, batch_size=recipe["batch_size"], epochs=1, shuffle=False)
        seconds = time.time() - start
        logits = model.predict(dev_x, batch_size=128)
        return {"accuracy": float(np.mean(np.asarray(logits).argmax(-1) == dev_y))}, seconds
    if task == "conll":
        from kbert.metrics import entity_f1

        train, dev, labels = conll_data(
            args.data_dir, args.seed, recipe["train_examples"], recipe["eval_examples"]
        )
        source = _source(task, args, common, num_labels=len(labels))
        model = BertTagger.from_preset(
            source, labels=labels, sequence_length=recipe["max_length"], **common
        )
        model.compile(**training)
        if args.torch_epsilon:
            num_rows = len(model.encode([w for w, _ in train]).sentence_ids)
            _maybe_torch_epsilon(model, args, num_rows, recipe)
        start = time.time()
        model.fit(
            [w for w, _ in train],
            [t for _, t in train],
            batch_size=recipe["batch_size"],
            epochs=1,
            shuffle=False,
        )
        seconds = time.time() - start
        predicted = model.predict_words([w for w, _ in dev], batch_size=128)
        scores = entity_f1([t for _, t in dev], predicted, scheme="IOB2")
        return {
            "entity_f1": scores["f1"],
            "precision": scores["precision"],
            "recall": scores["recall"],
        }, seconds
    from kbert.metrics import squad_scores

    train, eval_examples, data = squad_data(
        args.data_dir, args.seed, recipe["train_examples"], recipe["eval_examples"]
    )
    source = _source(task, args, common, head_dropout=False)
    model = BertQuestionAnswerer.from_preset(
        source,
        context_only=not args.unmasked_qa,
        sequence_length=recipe["max_length"],
        doc_stride=DOC_STRIDE,
        max_query_length=MAX_QUERY_LENGTH,
        **common,
    )
    model.compile(**training)
    features = model.encode(train, labels=True)
    _maybe_torch_epsilon(model, args, len(features), recipe)
    start = time.time()
    model.fit(
        features.inputs, features.labels, batch_size=recipe["batch_size"], epochs=1, shuffle=False
    )
    seconds = time.time() - start
    answers = model.predict_answers(eval_examples, batch_size=64)  # context spans, either head
    scores = squad_scores(answers, data)
    return {"exact_match": scores["exact_match"], "f1": scores["f1"]}, seconds


# ------------------------------------------------------------------------------ HF
def _hf_optimizer(model, num_steps, learning_rate):
    import torch
    import transformers

    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        (no_decay if name.endswith("bias") or "LayerNorm" in name else decay).append(parameter)
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": WEIGHT_DECAY},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=learning_rate,
        betas=(0.9, 0.999),
        eps=EPSILON,
    )
    schedule = transformers.get_linear_schedule_with_warmup(
        optimizer, int(round(num_steps * WARMUP_RATIO)), num_steps
    )
    return optimizer, schedule


def _hf_train(model, batches, learning_rate):
    """One epoch over `batches` (dicts of torch tensors with labels), with a progress line."""
    import torch

    optimizer, schedule = _hf_optimizer(model, len(batches), learning_rate)
    model.train()
    start = time.time()
    running = 0.0
    for step, batch in enumerate(batches, 1):
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        running += float(loss)
        if step % 10 == 0 or step == len(batches):
            print(
                f"\rstep {step}/{len(batches)} - loss {running / step:.4f} "
                f"- {time.time() - start:.0f}s",
                end="",
                flush=True,
            )
    print()
    model.eval()
    return time.time() - start


def _hf_model(task, args, num_labels=None):
    """The HF task model: the preset with a head HF initialises under the run's seed, or the
    shared no-dropout directory (`--no-dropout`)."""
    import transformers

    model_class = getattr(transformers, HF_TASK_CLASSES[task])
    if args.no_dropout:
        return model_class.from_pretrained(
            no_dropout_checkpoint(args.preset, args.seed, task, num_labels)
        )
    return model_class.from_pretrained(
        args.preset, **({} if num_labels is None else {"num_labels": num_labels})
    )


def _chunks(n, size):
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def run_hf(task, args, recipe):
    import numpy as np
    import torch
    import transformers

    torch.manual_seed(args.seed)
    torch.set_num_threads(os.cpu_count() or 1)
    bs = recipe["batch_size"]
    if task == "sst2":
        x, y, dev_x, dev_y = sst2_data(args.data_dir, args.seed, recipe["train_examples"])
        tokenizer = transformers.BertTokenizerFast.from_pretrained(args.preset)
        model = _hf_model(task, args, num_labels=2)

        def encode(texts):
            return tokenizer(
                texts,
                truncation=True,
                max_length=recipe["max_length"],
                padding=True,
                return_tensors="pt",
            )

        batches = []
        for part in _chunks(len(x), bs):
            batch = dict(encode(x[part]))
            batch["labels"] = torch.tensor(np.asarray(y[part]), dtype=torch.long)
            batches.append(batch)
        seconds = _hf_train(model, batches, recipe["learning_rate"])
        predictions = []
        with torch.no_grad():
            for part in _chunks(len(dev_x), 128):
                predictions.append(model(**encode(dev_x[part])).logits.argmax(-1).numpy())
        return {"accuracy": float(np.mean(np.concatenate(predictions) == dev_y))}, seconds

    if task == "conll":
        from kbert.data.tagging import encode_tagging, words_from_token_predictions
        from kbert.metrics import entity_f1

        train, dev, labels = conll_data(
            args.data_dir, args.seed, recipe["train_examples"], recipe["eval_examples"]
        )
        tokenizer = kbert_tokenizer(args.preset)
        label_to_id = {label: i for i, label in enumerate(labels)}
        features = encode_tagging(
            [w for w, _ in train],
            tokenizer,
            recipe["max_length"],
            [t for _, t in train],
            label_to_id,
        )
        model = _hf_model(task, args, num_labels=len(labels))
        hf_labels = np.where(features.sample_weight > 0, features.labels, -100)
        batches = [
            {
                "input_ids": torch.tensor(features.inputs["token_ids"][part], dtype=torch.long),
                "token_type_ids": torch.tensor(
                    features.inputs["segment_ids"][part], dtype=torch.long
                ),
                "attention_mask": torch.tensor(
                    features.inputs["padding_mask"][part], dtype=torch.long
                ),
                "labels": torch.tensor(hf_labels[part], dtype=torch.long),
            }
            for part in _chunks(len(hf_labels), bs)
        ]
        seconds = _hf_train(model, batches, recipe["learning_rate"])
        dev_features = encode_tagging([w for w, _ in dev], tokenizer, recipe["max_length"])
        logits = _hf_logits(model, dev_features.inputs)["logits"]
        ids = words_from_token_predictions(
            logits.argmax(-1), dev_features, fill_value=label_to_id["O"]
        )
        predicted = [[labels[i] for i in sentence] for sentence in ids]
        scores = entity_f1([t for _, t in dev], predicted, scheme="IOB2")
        return {
            "entity_f1": scores["f1"],
            "precision": scores["precision"],
            "recall": scores["recall"],
        }, seconds

    from kbert.data.squad import prepare_squad_features
    from kbert.metrics import squad_scores

    train, eval_examples, data = squad_data(
        args.data_dir, args.seed, recipe["train_examples"], recipe["eval_examples"]
    )
    tokenizer = kbert_tokenizer(args.preset)
    window = dict(
        max_sequence_length=recipe["max_length"],
        doc_stride=DOC_STRIDE,
        max_query_length=MAX_QUERY_LENGTH,
    )
    features = prepare_squad_features(train, tokenizer, labels=True, **window)
    model = _hf_model(task, args)
    batches = [
        {
            "input_ids": torch.tensor(features.inputs["token_ids"][part], dtype=torch.long),
            "token_type_ids": torch.tensor(features.inputs["segment_ids"][part], dtype=torch.long),
            "attention_mask": torch.tensor(features.inputs["padding_mask"][part], dtype=torch.long),
            "start_positions": torch.tensor(features.start_positions[part], dtype=torch.long),
            "end_positions": torch.tensor(features.end_positions[part], dtype=torch.long),
        }
        for part in _chunks(len(features), bs)
    ]
    seconds = _hf_train(model, batches, recipe["learning_rate"])
    eval_features = prepare_squad_features(eval_examples, tokenizer, **window)
    answers = _decode_in_context(
        eval_examples, eval_features, _hf_logits(model, eval_features.inputs)
    )
    scores = squad_scores(answers, data)
    return {"exact_match": scores["exact_match"], "f1": scores["f1"]}, seconds


def _decode_in_context(examples, features, logits):
    """HF's answers: its logits masked to the context as kbert's head masks them
    (`ContextSpanLogits`), then kbert's decoder, so both frameworks' n-best lists hold context
    positions only."""
    import keras
    import numpy as np

    from kbert.data.squad import decode_squad_predictions
    from kbert.models.question_answerer import ContextSpanLogits

    stacked = np.stack([logits["start_logits"], logits["end_logits"]], axis=-1)
    start, end = ContextSpanLogits()(
        stacked, features.inputs["segment_ids"], features.inputs["padding_mask"]
    )
    return decode_squad_predictions(
        examples, features, keras.ops.convert_to_numpy(start), keras.ops.convert_to_numpy(end)
    )


def _hf_logits(model, inputs, batch_size=64):
    import numpy as np
    import torch

    outputs = {}
    n = len(inputs["token_ids"])
    with torch.no_grad():
        for part in _chunks(n, batch_size):
            result = model(
                input_ids=torch.tensor(inputs["token_ids"][part], dtype=torch.long),
                token_type_ids=torch.tensor(inputs["segment_ids"][part], dtype=torch.long),
                attention_mask=torch.tensor(inputs["padding_mask"][part], dtype=torch.long),
            )
            for key in ("logits", "start_logits", "end_logits"):
                if getattr(result, key, None) is not None:
                    outputs.setdefault(key, []).append(getattr(result, key).numpy())
    return {k: np.concatenate(v) for k, v in outputs.items()}


# -------------------------------------------------------------------------- driver
def summary(results_path):
    """Prints every recorded run, then per task x framework x backend the mean over seeds next to
    HF's."""
    import numpy as np

    rows = [
        json.loads(line) for line in Path(results_path).read_text().splitlines() if line.strip()
    ]
    print("| task | framework | backend | seed | metric | value | train s |")
    print("| --- | --- | --- | ---: | --- | ---: | ---: |")
    for row in rows:
        for name, value in row["metrics"].items():
            print(
                f"| {row['task']} | {row['framework']} | {row.get('backend', '-')} "
                f"| {row['seed']} | {name} | {value:.4f} | {row['train_seconds']:.0f} |"
            )
    groups = {}
    for row in rows:
        key = (row["task"], row["framework"], row.get("backend", "-"))
        for name, value in row["metrics"].items():
            groups.setdefault(key + (name,), {})[row["seed"]] = value
    print()
    print(
        "| task | framework | backend | metric | seeds | mean | std | HF mean (same seeds) "
        "| difference |"
    )
    print("| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: |")
    for (task, framework, backend, name), by_seed in groups.items():
        seeds = sorted(by_seed)
        values = np.array([by_seed[s] for s in seeds])
        suffix = "+no_dropout" if framework.endswith("+no_dropout") else ""
        reference = groups.get((task, "hf" + suffix, "torch", name), {})
        shared = [s for s in seeds if s in reference]
        if not framework.startswith("hf") and shared:
            ours = np.mean([by_seed[s] for s in shared])
            theirs = np.mean([reference[s] for s in shared])
            versus = f"{theirs:.4f} | {ours - theirs:+.4f}"
        else:
            versus = "- | -"
        print(
            f"| {task} | {framework} | {backend} | {name} | {','.join(map(str, seeds))} | "
            f"{values.mean():.4f} | {values.std():.4f} | {versus} |"
        )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("task", nargs="?", choices=sorted(RECIPES))
    parser.add_argument("--framework", choices=("kbert", "hf"), default="kbert")
    parser.add_argument("--backend", choices=("tensorflow", "jax", "torch"), default="jax")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--preset",
        default=None,
        help="Hugging Face BERT directory (default: all-MiniLM-L6-v2 if installed).",
    )
    parser.add_argument("--data-dir", default=str(default_data_dir()))
    parser.add_argument("--train-examples", type=int, default=None)
    parser.add_argument("--eval-examples", type=int, default=None)
    parser.add_argument("--results", default=str(REPO / "runs" / "quality.jsonl"))
    parser.add_argument(
        "--torch-epsilon",
        action="store_true",
        help="kbert ablation: epsilon added as torch's AdamW adds it.",
    )
    parser.add_argument(
        "--no-dropout",
        action="store_true",
        help="dropout 0 and the same seeded head on both sides (a deterministic comparison)",
    )
    parser.add_argument(
        "--unmasked-qa",
        action="store_true",
        help="squad, kbert: context_only=False, HF's unmasked head (loss over every position)",
    )
    parser.add_argument(
        "--summary", action="store_true", help="Print the recorded results and exit."
    )
    args = parser.parse_args(argv)
    if args.summary:
        summary(args.results)
        return
    if args.task is None:
        parser.error("give a task (or --summary)")
    if args.framework == "kbert":
        os.environ["KERAS_BACKEND"] = args.backend
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    args.preset = args.preset or minilm_directory()
    if args.preset is None:
        parser.error("give --preset: the all-MiniLM-L6-v2 package is not installed")
    recipe = dict(RECIPES[args.task])
    for key in ("train_examples", "eval_examples"):
        if getattr(args, key) is not None:
            recipe[key] = getattr(args, key)
    if args.framework == "kbert":
        import keras

        keras.utils.set_random_seed(args.seed)
        metrics, seconds = run_kbert(args.task, args, recipe)
    else:
        metrics, seconds = run_hf(args.task, args, recipe)
    row = {
        "task": args.task,
        "framework": args.framework
        + ("+torch_epsilon" if args.torch_epsilon else "")
        + ("+unmasked" if args.unmasked_qa else "")
        + ("+no_dropout" if args.no_dropout else ""),
        "backend": args.backend if args.framework == "kbert" else "torch",
        "seed": args.seed,
        "recipe": recipe,
        "metrics": {k: float(v) for k, v in metrics.items()},
        "train_seconds": seconds,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    print(json.dumps(row))
    Path(args.results).parent.mkdir(parents=True, exist_ok=True)
    with open(args.results, "a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
