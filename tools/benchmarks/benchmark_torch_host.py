"""Host cost of kbert on torch against Hugging Face, on the CPU: issue #44's CPU goals.

    KERAS_BACKEND=torch python tools/benchmarks/benchmark_torch_host.py --rounds 7 \
        --json host.json --chart host.png

One process, one torch thread, random weights; every ratio is kbert / Hugging Face (below 1.0:
kbert costs less), the median over `--rounds` rounds that time kbert and HF alternately
(`--calls` calls each per round), so a machine that slows down mid-run slows both:

* **ops**: a BERT-Base forward (batch 2, length 16, no gradient) under `mixed_bfloat16`:
  the `aten::` ops `torch.profiler` records, and among them the casts (`aten::to` +
  `aten::_to_copy`), against HF `BertModel` (sdpa) under `torch.autocast("cpu", bfloat16)`;
* **backbone call / predict_on_batch**: a tiny backbone (2 layers, hidden 128, 2 heads,
  intermediate 512; batch 8, length 16, float32) against HF eager `BertModel` under
  `torch.no_grad()`;
* **train_on_batch**: a tiny classifier (same shape, vocabulary 1,024, 2 classes) compiled
  with `compile()`'s defaults (BERT's AdamW recipe, gradient clipping), under
  `mixed_bfloat16` and float32, against HF `BertForSequenceClassification` + `torch.optim.AdamW(
  foreach=True)` under `torch.autocast("cpu", bfloat16)` (float32: without autocast);
  `train_step_vs_keras_*`: the same `train_on_batch` against the classifier on Keras' own
  `train_step` and `compute_loss` (kbert against itself: what its eager step and torch loss
  save).

Prints a table with the goals; `--json` writes the figures, `--chart` a bar chart of the ratios.

`--graph` runs kbert's backbone through its functional graph of Keras layers (the code
before the lean path), for a before / after comparison. `--before-after` checks instead that
nothing a user runs on the CPU got slower: kbert with the lean backbone path
(`kbert.backend.paths.LEAN_TORCH_BACKBONE`, the default) against the functional graph,
alternately in one process with the machine's threads: `encode` of SQuAD
dev questions and paragraphs with all-MiniLM-L6-v2 (`BertTextEmbedder`, batch 32), and
`fit` steps of a classifier on all-MiniLM-L6-v2 (SST-2 sentences, batch 32, `compile()`'s
recipe). Ratios are lean / graph time (below 1.0: faster now).

    KERAS_BACKEND=torch python tools/benchmarks/benchmark_torch_host.py --before-after \
        --data-dir DATA --rounds 3

`--deep` measures what a step costs the host at BERT-Base's depth: 12 layers and 12 heads at
hidden size 96 (intermediate 384, vocabulary 1,024, batch 2, length 16), where the products
cost next to nothing, so the time is the host's (Python, dispatch, casts), as on a GPU whose
steps are host-bound: the backbone call, `predict_on_batch` and `train_on_batch` (compile()'s
defaults, vs HF + AdamW foreach; `train_step_vs_keras_*` as above) in float32 and under
`mixed_bfloat16` (HF under autocast), and a pretrainer's `train_on_batch` (masked LM at 3
positions a row + NSP, vs HF `BertForPreTraining` + AdamW foreach; `pretrain_lean_heads_*`:
the same step with its heads as torch calls against Keras layer calls, kbert against itself).

    KERAS_BACKEND=torch python tools/benchmarks/benchmark_torch_host.py --deep --rounds 7

`--phases` times a classifier's train step at that depth phase by phase (`zero_grad`, the
forward pass, `compute_loss`, the backward pass, the trainable weights and their gradients,
`optimizer.apply`, `compute_metrics`: Keras' `train_step` written out), next to HF's
(`zero_grad`, forward with loss, backward, AdamW step), medians over `--rounds` x `--calls`
steps: what each part costs the host.

    KERAS_BACKEND=torch python tools/benchmarks/benchmark_torch_host.py --phases --calls 20

`--cast-layouts` times what the lean path's mixed-precision casts choose between
(`kbert.backend.torch_encoder.transposed_casts`): a bfloat16 `addmm` on a kernel stored
`(in, out)` or laid out as rows of `(out, in)`, and the float32 -> bfloat16 cast that makes
each copy, at BERT's shapes, one thread (`--calls` calls each).

    KERAS_BACKEND=torch python tools/benchmarks/benchmark_torch_host.py --cast-layouts --calls 200

`--compiled` measures kbert's compiled steps (`compile(jit_compile=True)`, Inductor,
`kbert.backend.torch_steps`) on the tiny classifier, float32, one thread: `train_on_batch`
and `predict_on_batch` against kbert's eager step, HF eager and HF `torch.compile` (its
model's forward compiled, AdamW foreach), with each side's compile time (the first calls).

    KERAS_BACKEND=torch python tools/benchmarks/benchmark_torch_host.py --compiled --rounds 5
"""

import argparse
import os
import statistics
import time

GOALS = {
    "ops": 1.0,
    "casts": 1.0,
    "backbone_call": 1.0,
    "predict_on_batch": 1.0,
    "train_on_batch_mixed_bfloat16": 1.0,
}
TINY = dict(num_layers=2, hidden_dim=128, num_heads=2, intermediate_dim=512)
BASE = dict(num_layers=12, hidden_dim=768, num_heads=12, intermediate_dim=3072)
# BERT-Base's 12 layers and 12 heads at a width where the products cost next to nothing (`--deep`).
DEEP = dict(num_layers=12, hidden_dim=96, num_heads=12, intermediate_dim=384)


def _hf_config(shape, vocabulary_size, **extra):
    """HF's configuration of `shape` with `vocabulary_size` (512 positions, HF's default), sdpa."""
    from bench.hf_timing import hf_config

    full = dict(shape, vocabulary_size=vocabulary_size, max_sequence_length=512)
    return hf_config(full, attn_implementation="sdpa", **extra)


def _inputs(batch, length, vocabulary_size, seed=0):
    """kbert's and HF's inputs for the same random batch (the last quarter of half the rows
    padding)."""
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    ids = rng.integers(1, vocabulary_size, (batch, length))
    mask = np.ones((batch, length), "int64")
    mask[: batch // 2, length - length // 4 :] = 0
    ids = ids * mask
    kbert_inputs = {
        "token_ids": torch.tensor(ids, dtype=torch.int32),
        "segment_ids": torch.zeros((batch, length), dtype=torch.int32),
        "padding_mask": torch.tensor(mask, dtype=torch.int32),
    }
    hf_inputs = {
        "input_ids": torch.tensor(ids),
        "attention_mask": torch.tensor(mask),
        "token_type_ids": torch.zeros((batch, length), dtype=torch.long),
    }
    return kbert_inputs, hf_inputs


def _backbone(shape, vocabulary_size, dtype):
    from kbert.models import BertBackbone

    return BertBackbone(vocabulary_size=vocabulary_size, dtype=dtype, **shape)


def count_ops(run):
    """`(aten ops, casts)` that `torch.profiler` records for one call of `run`."""
    from torch.profiler import profile

    run()
    with profile() as prof:
        run()
    names = [event.name for event in prof.events() if event.name.startswith("aten::")]
    return len(names), sum(name in ("aten::to", "aten::_to_copy") for name in names)


def op_counts():
    """BERT-Base forward under mixed bfloat16: kbert's and HF's op and cast counts."""
    import torch
    import transformers

    kbert_inputs, hf_inputs = _inputs(2, 16, 30522)
    backbone = _backbone(BASE, 30522, "mixed_bfloat16")
    hf = transformers.BertModel(_hf_config(BASE, 30522)).eval()

    def kbert_call():
        with torch.no_grad():
            backbone(kbert_inputs)

    def hf_call():
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
            hf(**hf_inputs)

    (kbert_ops, kbert_casts), (hf_ops, hf_casts) = count_ops(kbert_call), count_ops(hf_call)
    return {
        "kbert_ops": kbert_ops,
        "hf_ops": hf_ops,
        "kbert_casts": kbert_casts,
        "hf_casts": hf_casts,
        "ops": kbert_ops / hf_ops,
        "casts": kbert_casts / hf_casts,
    }


def alternate(kbert_run, hf_run, rounds, calls, warmup=5):
    """Median of `rounds` ratios kbert / HF of the time of `calls` calls, timed alternately;
    with the per-call medians in milliseconds."""
    for run in (kbert_run, hf_run):
        for _ in range(warmup):
            run()
    ratios, kbert_times, hf_times = [], [], []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            kbert_run()
        middle = time.perf_counter()
        for _ in range(calls):
            hf_run()
        end = time.perf_counter()
        kbert_times.append((middle - start) / calls)
        hf_times.append((end - middle) / calls)
        ratios.append(kbert_times[-1] / hf_times[-1])
    return {
        "ratio": statistics.median(ratios),
        "kbert_ms": 1e3 * statistics.median(kbert_times),
        "hf_ms": 1e3 * statistics.median(hf_times),
    }


def backbone_host(rounds, calls, shape=TINY, batch=8, policy="float32"):
    """A backbone (the tiny one, float32, by default): `backbone(inputs)` and `predict_on_batch`
    against HF eager (under `torch.autocast` for a mixed `policy`)."""
    import torch
    import transformers

    kbert_inputs, hf_inputs = _inputs(batch, 16, 1024)
    backbone = _backbone(shape, 1024, policy)
    hf = transformers.BertModel(_hf_config(shape, 1024)).eval()
    mixed = policy != "float32"

    def kbert_call():
        with torch.no_grad():
            backbone(kbert_inputs)

    def hf_call():
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=mixed):
            hf(**hf_inputs)

    return {
        "backbone_call": alternate(kbert_call, hf_call, rounds, calls),
        "predict_on_batch": alternate(
            lambda: backbone.predict_on_batch(kbert_inputs), hf_call, rounds, calls
        ),
    }


def _under_policy(policy, make):
    """A task made by `make()` with `policy` as Keras' global dtype policy (its head layers
    take it), compiled with `compile()`'s defaults."""
    import keras

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        task = make()
        task.compile()
    finally:
        keras.config.set_dtype_policy(previous)
    return task


def _hf_train_step(model, policy, learning_rate, **batch):
    """HF's training step on `batch`: `model` in training mode, `torch.optim.AdamW(foreach=True)`,
    under `torch.autocast("cpu", bfloat16)` for a mixed `policy`."""
    import torch

    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, foreach=True)
    mixed = policy != "float32"

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", torch.bfloat16, enabled=mixed):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()

    return step


def _classifiers(policy, shape, batch):
    """`(classifier, hf, kbert_inputs, hf_inputs, labels)`: kbert's two-class classifier of
    `shape` (vocabulary 1,024) made under `policy`, HF's `BertForSequenceClassification` of
    the same shape, and one random batch of `batch` rows of 16 tokens for each."""
    import torch
    import transformers

    from kbert.models import BertClassifier

    kbert_inputs, hf_inputs = _inputs(batch, 16, 1024)
    labels = torch.tensor([0, 1] * (batch // 2))
    classifier = _under_policy(
        policy, lambda: BertClassifier(_backbone(shape, 1024, policy), num_classes=2)
    )
    hf = transformers.BertForSequenceClassification(_hf_config(shape, 1024, num_labels=2))
    return classifier, hf, kbert_inputs, hf_inputs, labels


def _with_keras_step(task):
    """`task` training through Keras' own `train_step` and `compute_loss` (kbert's eager step
    and torch loss switched off on this instance): the step before kbert owned it."""
    import types

    import keras

    task.train_step = types.MethodType(keras.Model.train_step, task)
    task._lean_loss = None
    return task


def train_host(policy, rounds, calls, shape=TINY, batch=8, fit_step=False, keras_step=False):
    """A classifier (the tiny one by default): `train_on_batch` with `compile()`'s defaults
    against HF + AdamW (`{"train_on_batch": ...}`), with `fit_step` its train function as
    `fit` calls it (`"fit_step"`), and with `keras_step` against the same classifier on
    Keras' own `train_step` and `compute_loss` (`"vs_keras_step"`, kbert against itself)."""
    classifier, hf, kbert_inputs, hf_inputs, labels = _classifiers(policy, shape, batch)
    hf_step = _hf_train_step(hf, policy, 2e-5, **hf_inputs, labels=labels)

    results = {
        "train_on_batch": alternate(
            lambda: classifier.train_on_batch(kbert_inputs, labels), hf_step, rounds, calls
        )
    }
    if keras_step:
        before = _with_keras_step(_classifiers(policy, shape, batch)[0])
        results["vs_keras_step"] = alternate(
            lambda: classifier.train_on_batch(kbert_inputs, labels),
            lambda: before.train_on_batch(kbert_inputs, labels),
            rounds,
            calls,
        )
    if fit_step:
        # The step as `fit` runs it: `train_on_batch` adds Keras' per-call model build check
        # and re-tracking of every variable, and a metrics reset, around the same function.
        classifier.make_train_function()
        step = classifier.train_function
        results["fit_step"] = alternate(
            lambda: step([(kbert_inputs, labels)]), hf_step, rounds, calls
        )
    return results


def pretrain_host(policy, rounds, calls, shape=DEEP, batch=2, predictions=3):
    """A pretrainer (masked LM + NSP): `train_on_batch` with `compile()`'s defaults against HF
    `BertForPreTraining` + AdamW (foreach) on the same batch and masked positions (HF computes
    its decoder at every position, kbert at the masked ones: at this width both cost next to
    nothing)."""
    import numpy as np
    import torch
    import transformers

    from kbert.backend import torch_heads
    from kbert.models import BertPretrainer

    kbert_inputs, hf_inputs = _inputs(batch, 16, 1024)
    rng = np.random.default_rng(1)
    # Positions among the first 12 (real in every row), distinct within a row.
    positions = np.stack([rng.permutation(12)[:predictions] for _ in range(batch)])
    ids = kbert_inputs["token_ids"].numpy()
    targets = np.take_along_axis(ids, positions, axis=1)
    kbert_inputs = dict(kbert_inputs, mask_positions=torch.tensor(positions, dtype=torch.int32))
    next_sentence = torch.tensor([0, 1] * (batch // 2))
    y = {"mlm": torch.tensor(targets, dtype=torch.int32), "nsp": next_sentence}
    sample_weight = {"mlm": torch.ones(batch, predictions), "nsp": torch.ones(batch)}
    hf_labels = np.full(ids.shape, -100)
    np.put_along_axis(hf_labels, positions, targets, axis=1)
    hf_labels = torch.tensor(hf_labels)
    pretrainer = _under_policy(policy, lambda: BertPretrainer(_backbone(shape, 1024, policy)))
    hf = transformers.BertForPreTraining(_hf_config(shape, 1024))
    hf_step = _hf_train_step(
        hf, policy, 1e-4, **hf_inputs, labels=hf_labels, next_sentence_label=next_sentence
    )

    def kbert_step(lean=True):
        torch_heads.LEAN_TORCH_TASKS = lean
        pretrainer.train_on_batch(kbert_inputs, y, sample_weight=sample_weight)

    try:
        return {
            "train_on_batch": alternate(kbert_step, hf_step, rounds, calls),
            # The pretraining heads as torch calls against the same heads as Keras layer
            # calls (`torch_heads.LEAN_TORCH_TASKS`), the backbone lean either way.
            "lean_heads": alternate(kbert_step, lambda: kbert_step(False), rounds, calls),
        }
    finally:
        torch_heads.LEAN_TORCH_TASKS = True


def compiled_host(rounds, calls):
    """kbert's compiled steps against its eager ones and HF's, tiny classifier, float32."""
    import keras
    import torch
    import transformers

    from kbert.models import BertClassifier

    kbert_inputs, hf_inputs = _inputs(8, 16, 1024)
    labels = torch.tensor([0, 1] * 4)
    keras.utils.set_random_seed(0)
    eager = BertClassifier(_backbone(TINY, 1024, "float32"), num_classes=2)
    compiled = BertClassifier(_backbone(TINY, 1024, "float32"), num_classes=2)
    eager.compile()
    compiled.compile(jit_compile=True)
    hf = transformers.BertForSequenceClassification(_hf_config(TINY, 1024, num_labels=2))
    hf_compiled = transformers.BertForSequenceClassification(_hf_config(TINY, 1024, num_labels=2))
    hf_forward = torch.compile(hf_compiled)

    def hf_step(model, forward):
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, foreach=True)
        model.train()

        def step():
            optimizer.zero_grad(set_to_none=True)
            forward(**hf_inputs, labels=labels).loss.backward()
            optimizer.step()

        return step

    def hf_predict(forward):
        def predict():
            with torch.no_grad():
                forward(**hf_inputs)

        return predict

    def first_call_seconds(run):
        start = time.perf_counter()
        run()
        return time.perf_counter() - start

    kbert_train = lambda: compiled.train_on_batch(kbert_inputs, labels)  # noqa: E731
    kbert_predict = lambda: compiled.predict_on_batch(kbert_inputs)  # noqa: E731
    hf_train_compiled = hf_step(hf_compiled, hf_forward)
    compile_seconds = {
        "kbert_train": first_call_seconds(kbert_train),
        "kbert_predict": first_call_seconds(kbert_predict),
        "hf_train": first_call_seconds(hf_train_compiled),
    }
    hf_train = hf_step(hf, hf)
    hf_compiled.eval()
    compile_seconds["hf_predict"] = first_call_seconds(hf_predict(hf_forward))
    hf_compiled.train()
    return {
        "compile_seconds": compile_seconds,
        "train_compiled_vs_hf_eager": alternate(kbert_train, hf_train, rounds, calls),
        "train_compiled_vs_kbert_eager": alternate(
            kbert_train, lambda: eager.train_on_batch(kbert_inputs, labels), rounds, calls
        ),
        "train_compiled_vs_hf_compiled": alternate(kbert_train, hf_train_compiled, rounds, calls),
        "predict_compiled_vs_hf_eager": alternate(
            kbert_predict, hf_predict(hf.eval()), rounds, calls
        ),
    }


LAYOUT_SHAPES = ((128, 128, 512), (128, 512, 128), (256, 768, 768), (256, 768, 3072))


def cast_layouts(calls):
    """Per `(rows, in, out)` of `LAYOUT_SHAPES`: microseconds of a bfloat16 `addmm` on a
    kernel `(in, out)` laid out as stored or as rows of `(out, in)`, and of the float32 ->
    bfloat16 cast that makes each copy (`--cast-layouts`; what `transposed_casts` chooses
    between)."""
    return {
        f"{rows}x{width}x{out}": _layout_times(rows, width, out, calls)
        for rows, width, out in LAYOUT_SHAPES
    }


def _layout_times(rows, width, out, calls):
    import torch

    def timed(run):
        run()
        start = time.perf_counter()
        for _ in range(calls):
            run()
        return 1e6 * (time.perf_counter() - start) / calls

    x = torch.randn(rows, width).bfloat16()
    kernel, bias = torch.randn(width, out), torch.randn(out).bfloat16()
    stored = kernel.to(torch.bfloat16)
    transposed = kernel.t().to(torch.bfloat16, memory_format=torch.contiguous_format).t()
    return {
        "addmm_stored_us": timed(lambda: torch.addmm(bias, x, stored)),
        "addmm_transposed_us": timed(lambda: torch.addmm(bias, x, transposed)),
        "cast_stored_us": timed(lambda: kernel.to(torch.bfloat16)),
        "cast_transposed_us": timed(
            lambda: kernel.t().to(torch.bfloat16, memory_format=torch.contiguous_format)
        ),
    }


def step_phases(steps, policy="float32", shape=DEEP, batch=2):
    """Where a classifier's train step spends its time, phase by phase, against HF's: the
    parts of Keras' `train_step` (and kbert's update) written out in one loop with HF's step
    after each, medians over `steps` steps in milliseconds (`--phases`)."""
    import keras
    import torch

    classifier, hf, kbert_inputs, hf_inputs, labels = _classifiers(policy, shape, batch)
    hf.train()
    optimizer = torch.optim.AdamW(hf.parameters(), lr=2e-5, foreach=True)
    mixed = policy != "float32"
    for _ in range(5):
        classifier.train_on_batch(kbert_inputs, labels)
    times = {}

    def phase(name, start):
        now = time.perf_counter()
        times.setdefault(name, []).append(1e3 * (now - start))
        return now

    for _ in range(steps):
        now = time.perf_counter()
        classifier.zero_grad()
        now = phase("kbert zero_grad", now)
        y_pred = classifier(kbert_inputs, training=True)
        now = phase("kbert forward", now)
        loss = classifier.compute_loss(
            x=kbert_inputs, y=labels, y_pred=y_pred, sample_weight=None, training=True
        )
        now = phase("kbert compute_loss", now)
        loss.backward()
        now = phase("kbert backward", now)
        variables = classifier.trainable_weights[:]
        gradients = [variable.value.grad for variable in variables]
        now = phase("kbert trainable_weights + grads", now)
        with torch.no_grad():
            classifier.optimizer.apply(gradients, variables)
        now = phase("kbert optimizer.apply", now)
        classifier.compute_metrics(kbert_inputs, labels, y_pred.detach(), sample_weight=None)
        now = phase("kbert compute_metrics", now)
        optimizer.zero_grad(set_to_none=True)
        now = phase("HF zero_grad", now)
        with torch.autocast("cpu", torch.bfloat16, enabled=mixed):
            hf_loss = hf(**hf_inputs, labels=labels).loss
        now = phase("HF forward + loss", now)
        hf_loss.backward()
        now = phase("HF backward", now)
        optimizer.step()
        phase("HF AdamW step", now)
    keras.backend.clear_session()
    return {name: statistics.median(values[steps // 5 :]) for name, values in times.items()}


def deep_host(rounds, calls):
    """BERT-Base's depth at a width where computing costs next to nothing (`DEEP`, batch 2 x
    16): what a step costs the host, as on a GPU where the host is the bound (`--deep`)."""
    results = {}
    for policy in ("float32", "mixed_bfloat16"):
        calls_of = backbone_host(rounds, calls, DEEP, batch=2, policy=policy)
        results[f"backbone_call_{policy}"] = calls_of["backbone_call"]
        results[f"predict_on_batch_{policy}"] = calls_of["predict_on_batch"]
        steps = train_host(policy, rounds, calls, DEEP, batch=2, keras_step=True)
        results[f"train_on_batch_{policy}"] = steps["train_on_batch"]
        results[f"train_step_vs_keras_{policy}"] = steps["vs_keras_step"]
        pretraining = pretrain_host(policy, rounds, calls)
        results[f"pretrain_on_batch_{policy}"] = pretraining["train_on_batch"]
        results[f"pretrain_lean_heads_{policy}"] = pretraining["lean_heads"]
    return results


def before_after(data_dir, rounds):
    """Raw-text encode and fine-tuning steps, lean path against the graph (`--before-after`)."""
    import numpy as np
    from bench.data import (
        check_data_files,
        minilm_directory,
        squad_dev_paragraphs,
        sst2_dev_sentences,
    )

    from kbert.backend import paths
    from kbert.models import BertClassifier, BertTextEmbedder

    check_data_files(data_dir, "squad/dev-v1.1.json", "glue/SST-2/dev.tsv")
    paragraphs = squad_dev_paragraphs(data_dir)
    questions = [q["question"] for p in paragraphs for q in p["qas"]][:512]
    contexts = [p["context"] for p in paragraphs][:128]
    sentences = list(sst2_dev_sentences(data_dir))[:256]
    checkpoint = str(minilm_directory())
    embedder = BertTextEmbedder.from_preset(checkpoint)
    classifier = BertClassifier.from_preset(checkpoint, num_classes=2)
    classifier.compile()
    labels = np.arange(len(sentences)) % 2

    def lean(flag, run):
        def timed():
            paths.LEAN_TORCH_BACKBONE = flag
            try:
                run()
            finally:
                paths.LEAN_TORCH_BACKBONE = True

        return timed

    workloads = {
        "encode_questions": lambda: embedder.encode(questions, batch_size=32),
        "encode_paragraphs": lambda: embedder.encode(contexts, batch_size=32),
        "fit_steps": lambda: classifier.fit(sentences, labels, batch_size=32, epochs=1, verbose=0),
    }
    return {
        name: alternate(lean(True, run), lean(False, run), rounds, 1, warmup=1)
        for name, run in workloads.items()
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="alternating rounds (median)")
    parser.add_argument("--calls", type=int, default=50, help="calls per system per round")
    parser.add_argument("--before-after", action="store_true", help="lean path vs graph")
    parser.add_argument(
        "--graph", action="store_true", help="kbert through its functional graph (as before)"
    )
    parser.add_argument(
        "--compiled", action="store_true", help="kbert's compiled steps (jit_compile=True)"
    )
    parser.add_argument(
        "--deep",
        action="store_true",
        help="BERT-Base's depth at a negligible width: the host cost of its steps",
    )
    parser.add_argument(
        "--phases",
        action="store_true",
        help="a train step at BERT-Base's depth phase by phase, kbert's and HF's",
    )
    parser.add_argument(
        "--cast-layouts",
        action="store_true",
        help="bfloat16 products and casts of a kernel in either layout",
    )
    parser.add_argument("--data-dir", default=None, help="shared data (--before-after)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--chart", help="write a PNG bar chart of the ratios here")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.calls < 1:
        parser.error(f"--rounds and --calls must be >= 1. Received {args.rounds}, {args.calls}")
    if os.environ.get("KERAS_BACKEND") != "torch":
        parser.error("run with KERAS_BACKEND=torch")
    if args.before_after:
        from bench.data import default_data_dir

        results = before_after(args.data_dir or default_data_dir(), args.rounds)
        print(f"{'workload':20s} {'lean / graph':>12s} {'lean s':>8s} {'graph s':>8s}")
        for name, row in results.items():
            print(
                f"{name:20s} {row['ratio']:12.3f} {row['kbert_ms'] / 1e3:8.2f} "
                f"{row['hf_ms'] / 1e3:8.2f}"
            )
        if args.json:
            from bench.harness import command_line, write_json

            write_json(args.json, {"command": command_line(__file__, argv), "results": results})
        return
    import torch

    if args.compiled:
        torch.set_num_threads(1)
        results = compiled_host(args.rounds, args.calls)
        seconds = results.pop("compile_seconds")
        print("first calls (compile), s: " + ", ".join(f"{k} {v:.1f}" for k, v in seconds.items()))
        print(f"{'measure':32s} {'ratio':>6s}  {'kbert ms':>9s} {'other ms':>9s}")
        for name, row in results.items():
            print(f"{name:32s} {row['ratio']:6.2f}  {row['kbert_ms']:9.3f} {row['hf_ms']:9.3f}")
        if args.json:
            from bench.harness import command_line, write_json

            results["compile_seconds"] = seconds
            write_json(args.json, {"command": command_line(__file__, argv), "results": results})
        return
    if args.cast_layouts:
        torch.set_num_threads(1)
        print(f"CPU capability: {torch.backends.cpu.get_cpu_capability()}")
        results = cast_layouts(args.calls)
        print(
            f"{'rows x in x out':18s} {'addmm (in,out)':>14s} {'addmm (out,in)':>14s} "
            f"{'cast (in,out)':>14s} {'cast (out,in)':>14s}   microseconds"
        )
        for name, row in results.items():
            print(f"{name:18s} " + " ".join(f"{value:14.1f}" for value in row.values()))
        if args.json:
            from bench.harness import command_line, write_json

            write_json(args.json, {"command": command_line(__file__, argv), "results": results})
        return
    if args.phases:
        torch.set_num_threads(1)
        results = {
            policy: step_phases(args.calls * args.rounds, policy)
            for policy in ("float32", "mixed_bfloat16")
        }
        print(f"{'phase (L12-H96-A12, batch 2 x 16), ms':38s} {'float32':>8s} {'mixed':>8s}")
        for name in results["float32"]:
            print(
                f"{name:38s} {results['float32'][name]:8.3f} {results['mixed_bfloat16'][name]:8.3f}"
            )
        if args.json:
            from bench.harness import command_line, write_json

            write_json(args.json, {"command": command_line(__file__, argv), "results": results})
        return
    if args.deep:
        torch.set_num_threads(1)
        results = deep_host(args.rounds, args.calls)
        print(
            f"{'measure (L12-H96-A12, batch 2 x 16)':36s} {'kbert / HF':>10s}  {'kbert ms':>9s} "
            f"{'HF ms':>8s}   (*_lean_heads: lean heads / graph heads, ms of each)"
        )
        for name, row in results.items():
            print(f"{name:36s} {row['ratio']:10.2f}  {row['kbert_ms']:9.3f} {row['hf_ms']:8.3f}")
        if args.json:
            from bench.harness import command_line, write_json

            write_json(args.json, {"command": command_line(__file__, argv), "results": results})
        return
    if args.graph:
        from kbert.backend import paths

        paths.LEAN_TORCH_BACKBONE = False
    torch.set_num_threads(1)
    results = {"ops": op_counts()}
    results.update(backbone_host(args.rounds, args.calls))
    for policy in ("mixed_bfloat16", "float32"):
        steps = train_host(policy, args.rounds, args.calls, fit_step=True, keras_step=True)
        results[f"train_on_batch_{policy}"] = steps["train_on_batch"]
        results[f"fit_step_{policy}"] = steps["fit_step"]
        results[f"train_step_vs_keras_{policy}"] = steps["vs_keras_step"]
    ratios = {
        "ops": results["ops"]["ops"],
        "casts": results["ops"]["casts"],
        **{
            name: value["ratio"]
            for name, value in results.items()
            if isinstance(value, dict) and "ratio" in value
        },
    }
    counts = results["ops"]
    print(
        f"BERT-Base forward, mixed_bfloat16: aten ops kbert {counts['kbert_ops']} / HF "
        f"{counts['hf_ops']}, casts kbert {counts['kbert_casts']} / HF {counts['hf_casts']}"
    )
    print(f"{'measure':34s} {'kbert / HF':>10s} {'goal':>6s}  {'kbert ms':>9s} {'HF ms':>8s}")
    for name, ratio in ratios.items():
        goal = GOALS.get(name)
        row = results.get(name, {})
        times = f"{row['kbert_ms']:9.3f} {row['hf_ms']:8.3f}" if "kbert_ms" in row else " " * 18
        verdict = "" if goal is None else ("met" if ratio <= goal else "NOT met")
        goal_text = "" if goal is None else f"<={goal:.1f}"
        print(f"{name:34s} {ratio:10.2f} {goal_text:>6s}  {times}  {verdict}")
    if args.json:
        from bench.harness import command_line, write_json

        write_json(
            args.json,
            {"command": command_line(__file__, argv), "ratios": ratios, "results": results},
        )
    if args.chart:
        _chart(ratios, args.chart)


def _chart(ratios, path):
    from bench.charts import pyplot, save

    plt = pyplot()
    figure, axis = plt.subplots(figsize=(8, 3.5))
    names = list(ratios)
    bars = axis.barh(names, [ratios[name] for name in names], color="#4c72b0")
    axis.axvline(1.0, color="black", linewidth=0.8)
    axis.bar_label(bars, [f"{ratios[name]:.2f}x" for name in names], padding=3)
    axis.set_xlabel("kbert / Hugging Face (lower is better; goal <= 1.0)")
    axis.set_title("Host cost on torch (CPU, one thread)")
    axis.invert_yaxis()
    save(figure, path)


if __name__ == "__main__":
    main()
