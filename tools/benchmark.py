"""Throughput and memory benchmark of kbert against Hugging Face transformers and keras-hub.

For every `--preset` x `--sequence-length` x `--batch-size` x `--backend` x `--precision` it
measures, on fresh (random) weights:

* `inference`: forward pass of the backbone (`predict_on_batch`), sequences per second;
* `finetune`: one fit-style training step of a classifier (backbone -> dropout 0.1 -> dense on
  the pooled output, AdamW with BERT's schedule and global-norm clipping, dropout 0.1 in train
  mode), sequences per second;
* `pretrain`: one training step of `BertPretrainer` (masked LM at `--num-masks` positions +
  next-sentence prediction), sequences per second;

and the same workloads on Hugging Face transformers (PyTorch, `attn_implementation="sdpa"`,
`BertModel` / `BertForSequenceClassification` / `BertForPreTraining`) and keras-hub
(`BertBackbone` / `BertTextClassifier` / `BertMaskedLM`, built from a config, no download).

Model-FLOPs utilisation (MFU) is the analytic matmul FLOPs of the workload (forward x 1,
training x 3) per second divided by the MEASURED matmul peak of that backend and precision
(a large square matmul timed in the same process). Each Keras backend runs in its own
subprocess (`KERAS_BACKEND` is fixed at import); Hugging Face runs in its own subprocess
too. Warm-up steps (compilation) are excluded; a cell is the median of the timed steps; with
`--rounds N` every process is run N times, interleaved, and the best round is kept (the
machine may be shared). Every worker runs with `GLIBC_TUNABLES=glibc.malloc.hugetlb=1`
(`--malloc-hugepages off` to compare): large malloc blocks on 2 MiB pages, which removes most
of the page faults XLA's fresh per-step buffers cost on CPU.

`--memory` measures instead the peak memory of a fine-tuning step for the memory options:
plain, `BertBackbone(remat=True)` and gradient accumulation (`bert_optimizer(...,
gradient_accumulation_steps=k)` with micro-batches of `batch_size / k`), each in a fresh
process. On GPU the figure is the framework's peak allocator statistic; on CPU it is the
growth of the process' peak resident memory (`ru_maxrss`) over the steps, and on JAX also
XLA's own buffer assignment of the compiled step (`memory_analysis().temp_size_in_bytes`).

Example:
```
python tools/benchmark.py --preset L6-H384-A12 --batch-size 32 --sequence-length 128 \
    --workload finetune inference --backend jax torch tensorflow --chart bench.png
python tools/benchmark.py --preset bert_base_en_uncased --batch-size 8 --workload inference
python tools/benchmark.py --suite cpu-goals --rounds 2   # the CPU goals, checked in one run
python tools/benchmark.py --memory --preset bert_mini_en_uncased --sequence-length 512 \
    --batch-size 16 --backend jax torch
```
A preset is a kbert preset name (`bert_base_en_uncased`...) or a shape `L<layers>-H<hidden>-A<heads>`
(intermediate 4 x hidden, the uncased vocabulary of 30,522 tokens).
"""

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time

RESULT_MARKER = "@@KBERT_BENCHMARK@@"
WORKLOADS = ("inference", "finetune", "pretrain")
FRAMEWORKS = ("kbert", "keras_hub", "hf")
PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
BACKENDS = ("tensorflow", "jax", "torch")
MEMORY_VARIANTS = ("plain", "remat", "accumulate")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------------------------
# Model shapes and FLOPs (no framework needed).
# ---------------------------------------------------------------------------------------------


def resolve_preset(name):
    """Returns the backbone shape (a dict of BertBackbone arguments) of a preset name or `L-H-A` spec."""
    match = re.fullmatch(r"L(\d+)-H(\d+)-A(\d+)", name)
    if match:
        layers, hidden, heads = (int(g) for g in match.groups())
        return {
            "vocabulary_size": 30522,
            "num_layers": layers,
            "num_heads": heads,
            "hidden_dim": hidden,
            "intermediate_dim": 4 * hidden,
            "max_sequence_length": 512,
        }
    sys.path.insert(0, REPO_ROOT)
    from kbert.models.presets import BACKBONE_PRESETS

    if name not in BACKBONE_PRESETS:
        raise ValueError(
            "`--preset` must be a kbert preset name or a shape `L<layers>-H<hidden>-A<heads>`. "
            f"Received: {name!r}; presets: {sorted(BACKBONE_PRESETS)}"
        )
    config = BACKBONE_PRESETS[name]["config"]
    keys = (
        "vocabulary_size",
        "num_layers",
        "num_heads",
        "hidden_dim",
        "intermediate_dim",
        "max_sequence_length",
    )
    return {key: config[key] for key in keys}


def forward_flops(shape, sequence_length, workload, num_masks=20, num_classes=2):
    """Matmul FLOPs of one forward pass of one sequence (2 x multiply-adds).

    Encoder: the four attention projections and the two feed-forward matmuls per token, plus
    the two attention products (scores and context) per layer; the pooler. Heads: the
    classifier, or the masked-LM transform and tied decoder at `num_masks` positions plus the
    next-sentence classifier. Embedding lookups, LayerNorm, softmax and GELU are not counted
    (the usual model-FLOPs convention).
    """
    h, i, n = shape["hidden_dim"], shape["intermediate_dim"], shape["num_layers"]
    s = sequence_length
    per_layer = 2 * s * (4 * h * h + 2 * h * i) + 2 * 2 * s * s * h
    flops = n * per_layer + 2 * h * h  # + pooler on [CLS]
    if workload == "finetune":
        flops += 2 * h * num_classes
    elif workload == "pretrain":
        flops += 2 * num_masks * (h * h + h * shape["vocabulary_size"]) + 2 * h * 2
    return flops


def step_flops(shape, sequence_length, workload, num_masks=20):
    """FLOPs per sequence of the workload: forward only for inference, 3 x forward when training."""
    multiplier = 1 if workload == "inference" else 3
    return multiplier * forward_flops(shape, sequence_length, workload, num_masks)


# ---------------------------------------------------------------------------------------------
# Worker side: one process per (framework family, backend).
# ---------------------------------------------------------------------------------------------


def log(message):
    print(message, file=sys.stderr, flush=True)


def random_batch(shape, batch_size, sequence_length, num_masks, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    token_ids = rng.integers(1000, shape["vocabulary_size"], (batch_size, sequence_length))
    token_ids[:, 0] = 101
    segment_ids = np.zeros((batch_size, sequence_length), "int32")
    segment_ids[:, sequence_length // 2 :] = 1
    num_masks = min(num_masks, sequence_length - 1)
    mask_positions = np.stack(
        [np.sort(rng.choice(np.arange(1, sequence_length), num_masks, False)) for _ in range(batch_size)]
    )
    return {
        "token_ids": token_ids.astype("int32"),
        "segment_ids": segment_ids,
        "padding_mask": np.ones((batch_size, sequence_length), "int32"),
        "mask_positions": mask_positions.astype("int32"),
        "labels": rng.integers(0, 2, (batch_size,)).astype("int32"),
        "mlm_labels": rng.integers(1000, shape["vocabulary_size"], (batch_size, num_masks)).astype(
            "int32"
        ),
    }


def median_and_all(times):
    return statistics.median(times), [round(t, 5) for t in times]


def device_kind():
    """"gpu" when the current process' framework sees an accelerator, else "cpu"."""
    backend = os.environ.get("KERAS_BACKEND", "torch")
    try:
        if backend == "jax":
            import jax

            return "gpu" if jax.devices()[0].platform in ("gpu", "cuda", "rocm") else "cpu"
        if backend == "tensorflow":
            import tensorflow as tf

            return "gpu" if tf.config.list_physical_devices("GPU") else "cpu"
        import torch

        return "gpu" if torch.cuda.is_available() else "cpu"
    except Exception:
        return "cpu"


def device_name():
    if device_kind() == "gpu":
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                check=True,
            )
            return out.stdout.strip().splitlines()[0]
        except Exception:
            return "GPU"
    cpu = platform.processor() or "CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} logical CPUs"


def measure_matmul_peak(backend, precision, size=None, repeats=7):
    """Median FLOP/s of a large square matmul on `backend` ("jax", "torch", "tensorflow").

    The operand dtype is the compute dtype of `precision`. The peak is measured, not taken
    from a data sheet: MFU is reported against what this device does on this software. The
    size grows from 256 until one product takes 50 ms (or reaches 2048 on CPU, 8192 on GPU),
    so that slow emulated dtypes (float16 on most CPUs) do not take minutes.
    """
    import numpy as np

    dtype = {"float32": "float32", "mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}[
        precision
    ]
    on_gpu = device_kind() == "gpu"
    largest = size or (8192 if on_gpu else 2048)

    def make_runner(n):
        rng = np.random.default_rng(0)
        a = rng.standard_normal((n, n), dtype="float32")
        b = rng.standard_normal((n, n), dtype="float32")
        if backend == "jax":
            import jax
            import jax.numpy as jnp

            x, y = jnp.asarray(a, dtype=dtype), jnp.asarray(b, dtype=dtype)
            fn = jax.jit(jnp.matmul)
            return lambda: fn(x, y).block_until_ready()
        if backend == "tensorflow":
            import tensorflow as tf

            x, y = tf.cast(tf.constant(a), dtype), tf.cast(tf.constant(b), dtype)
            fn = tf.function(tf.linalg.matmul, jit_compile=False)
            return lambda: fn(x, y).numpy()
        import torch

        device = "cuda" if on_gpu else "cpu"
        x = torch.from_numpy(a).to(device=device, dtype=getattr(torch, dtype))
        y = torch.from_numpy(b).to(device=device, dtype=getattr(torch, dtype))

        def run():
            z = x @ y
            if on_gpu:
                torch.cuda.synchronize()
            return z

        return run

    n = size or 256
    while True:
        run = make_runner(n)
        run()  # Compilation / first-call set-up.
        start = time.perf_counter()
        run()
        elapsed = time.perf_counter() - start
        if size or elapsed > 0.05 or n >= largest:
            break
        n *= 2
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return 2 * n**3 / statistics.median(times)


class _KerasStepTimer:
    """Records the wall time of each `fit` step, synchronising on the step's loss."""

    def __init__(self):
        import keras

        timer = self

        class Callback(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                timer.stamps = [time.perf_counter()]

            def on_train_batch_end(self, batch, logs=None):
                for value in (logs or {}).values():
                    float(value)  # Waits for the (possibly asynchronous) step to finish.
                timer.stamps.append(time.perf_counter())

        self.callback = Callback()
        self.stamps = []

    def step_times(self):
        deltas = [b - a for a, b in zip(self.stamps, self.stamps[1:])]
        return deltas[1:] if len(deltas) > 1 else deltas  # The first step also starts the iterator.


def _keras_fit_times(model, x, y, sample_weight, batch_size, warmup, steps):
    """Runs `warmup` then `steps + 1` fit steps; returns the per-step times of the timed ones."""
    import numpy as np

    def take(tree, n):
        if isinstance(tree, dict):
            return {k: take(v, n) for k, v in tree.items()}
        return None if tree is None else np.concatenate([tree] * n, axis=0)

    model.fit(
        take(x, max(warmup, 1)),
        take(y, max(warmup, 1)),
        sample_weight=take(sample_weight, max(warmup, 1)),
        batch_size=batch_size,
        epochs=1,
        shuffle=False,
        verbose=0,
    )
    timer = _KerasStepTimer()
    model.fit(
        take(x, steps + 1),
        take(y, steps + 1),
        sample_weight=take(sample_weight, steps + 1),
        batch_size=batch_size,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[timer.callback],
    )
    return timer.step_times()


def _keras_predict_times(model, x, warmup, steps):
    for _ in range(max(warmup, 1)):
        model.predict_on_batch(x)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        model.predict_on_batch(x)  # Returns NumPy: synchronous.
        times.append(time.perf_counter() - start)
    return times


def _keras_models(framework, shape, precision, workload, remat=False):
    """Builds the Keras model of a workload for kbert or keras-hub (fresh weights)."""
    import keras

    if framework == "kbert":
        sys.path.insert(0, REPO_ROOT)
        from kbert.models import BertBackbone, BertPretrainer

        extra = {"remat": True} if remat else {}
        backbone = BertBackbone(**shape, dtype=precision, **extra)
        if workload == "inference":
            return backbone
        if workload == "pretrain":
            return BertPretrainer(backbone, total_steps=10_000, warmup_steps=100)
        pooled = backbone(backbone.input)["pooled_output"]
        pooled = keras.layers.Dropout(0.1, dtype=backbone.dtype_policy)(pooled)
        logits = keras.layers.Dense(2, dtype=backbone.dtype_policy, name="logits")(pooled)
        return keras.Model(backbone.input, logits)

    import keras_hub

    hub_shape = {k: v for k, v in shape.items()}
    backbone = keras_hub.models.BertBackbone(**hub_shape, dropout=0.1, dtype=precision)
    if workload == "inference":
        return backbone
    if workload == "pretrain":
        return keras_hub.models.BertMaskedLM(backbone, preprocessor=None)
    return keras_hub.models.BertTextClassifier(backbone, num_classes=2, preprocessor=None)


def _keras_optimizer(gradient_accumulation_steps=None):
    sys.path.insert(0, REPO_ROOT)
    from kbert.models import bert_optimizer

    kwargs = {}
    if gradient_accumulation_steps:
        kwargs["gradient_accumulation_steps"] = gradient_accumulation_steps
    return bert_optimizer(5e-5, total_steps=10_000, warmup_steps=100, **kwargs)


def _compile_keras(model, framework, workload, jit_compile, accumulation=None):
    import keras

    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if framework == "kbert" and workload == "pretrain":
        kwargs = {"jit_compile": jit_compile}
        if accumulation:
            kwargs["optimizer"] = _keras_optimizer(accumulation)
        model.compile(**kwargs)  # BertPretrainer keeps its MLM + NSP losses.
    else:
        model.compile(
            optimizer=_keras_optimizer(accumulation), loss=loss, jit_compile=jit_compile
        )


def _keras_data(framework, workload, batch):
    import numpy as np

    x = {k: batch[k] for k in ("token_ids", "segment_ids", "padding_mask")}
    if workload == "inference":
        return x, None, None
    if workload == "finetune":
        return x, batch["labels"], None
    x["mask_positions"] = batch["mask_positions"]
    mlm_weights = np.ones(batch["mlm_labels"].shape, "float32")
    if framework == "kbert":
        y = {"mlm": batch["mlm_labels"], "nsp": batch["labels"]}
        return x, y, {"mlm": mlm_weights, "nsp": np.ones(batch["labels"].shape, "float32")}
    return x, batch["mlm_labels"], mlm_weights


def run_keras_cell(framework, shape, cell, jit_compile, warmup, steps):
    import keras

    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(0)
    workload, batch_size = cell["workload"], cell["batch_size"]
    model = _keras_models(framework, shape, cell["precision"], workload)
    batch = random_batch(shape, batch_size, cell["sequence_length"], cell["num_masks"])
    x, y, sample_weight = _keras_data(framework, workload, batch)
    if workload == "inference":
        model.compile(jit_compile=jit_compile)
        times = _keras_predict_times(model, x, warmup, steps)
    else:
        _compile_keras(model, framework, workload, jit_compile)
        times = _keras_fit_times(model, x, y, sample_weight, batch_size, warmup, steps)
    return times, {"jit_compile": bool(model.jit_compile)}


def run_hf_cell(shape, cell, warmup, steps, torch_compile=False):
    import numpy as np
    import torch
    import transformers

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = transformers.BertConfig(
        vocab_size=shape["vocabulary_size"],
        hidden_size=shape["hidden_dim"],
        num_hidden_layers=shape["num_layers"],
        num_attention_heads=shape["num_heads"],
        intermediate_size=shape["intermediate_dim"],
        max_position_embeddings=shape["max_sequence_length"],
        hidden_act="gelu",
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        type_vocab_size=2,
        num_labels=2,
        attn_implementation="sdpa",
    )
    workload, precision = cell["workload"], cell["precision"]
    classes = {
        "inference": transformers.BertModel,
        "finetune": transformers.BertForSequenceClassification,
        "pretrain": transformers.BertForPreTraining,
    }
    model = classes[workload](config).to(device)
    if model.config._attn_implementation != "sdpa":
        raise RuntimeError(f"expected sdpa attention, got {model.config._attn_implementation}")
    autocast_dtype = {"mixed_bfloat16": torch.bfloat16, "mixed_float16": torch.float16}.get(precision)
    batch = random_batch(shape, cell["batch_size"], cell["sequence_length"], cell["num_masks"])
    inputs = {
        "input_ids": torch.from_numpy(batch["token_ids"]).long().to(device),
        "token_type_ids": torch.from_numpy(batch["segment_ids"]).long().to(device),
        "attention_mask": torch.from_numpy(batch["padding_mask"]).long().to(device),
    }
    if workload == "finetune":
        inputs["labels"] = torch.from_numpy(batch["labels"]).long().to(device)
    elif workload == "pretrain":
        labels = np.full(batch["token_ids"].shape, -100, "int64")
        np.put_along_axis(labels, batch["mask_positions"], batch["mlm_labels"], axis=1)
        inputs["labels"] = torch.from_numpy(labels).to(device)
        inputs["next_sentence_label"] = torch.from_numpy(batch["labels"]).long().to(device)

    def autocast():
        if autocast_dtype is None:
            return torch.autocast(device, enabled=False)
        return torch.autocast(device, dtype=autocast_dtype)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    forward = torch.compile(model) if torch_compile else model
    if workload == "inference":
        model.eval()

        def step():
            with torch.inference_mode(), autocast():
                forward(**inputs)
            sync()

    else:
        model.train()
        no_decay = ("bias", "LayerNorm.weight")
        groups = [
            {"params": [p for n, p in model.named_parameters() if not n.endswith(no_decay)], "weight_decay": 0.01},
            {"params": [p for n, p in model.named_parameters() if n.endswith(no_decay)], "weight_decay": 0.0},
        ]
        optimizer = torch.optim.AdamW(groups, lr=5e-5, eps=1e-6)
        scaler = torch.amp.GradScaler(device, enabled=precision == "mixed_float16")

        def step():
            optimizer.zero_grad(set_to_none=True)
            with autocast():
                loss = forward(**inputs).loss
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            loss.item()
            sync()

    for _ in range(max(warmup, 1)):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times, {"torch_compile": torch_compile, "attn_implementation": "sdpa"}


def worker_main(spec):
    """Runs every cell of one process (one framework family on one backend); prints JSON."""
    backend = spec["backend"]
    results = []
    peaks = {}
    info = {"device": device_name(), "device_kind": device_kind()}
    if spec["family"] == "hf":
        import torch
        import transformers

        info["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__}
    else:
        import keras

        info["versions"] = {"keras": keras.__version__}
        try:
            import keras_hub

            info["versions"]["keras_hub"] = keras_hub.__version__
        except ImportError:
            pass
    for cell in spec["cells"]:
        precision = cell["precision"]
        if precision not in peaks:
            try:
                peaks[precision] = measure_matmul_peak(backend, precision)
            except Exception as error:  # e.g. float16 matmul unsupported on this CPU build.
                peaks[precision] = None
                log(f"  matmul peak for {precision} on {backend} failed: {error}")
        shape = resolve_preset(cell["preset"])
        for framework in spec["frameworks"]:
            label = (
                f"[{framework}/{backend}] {cell['preset']} {cell['workload']} "
                f"b={cell['batch_size']} s={cell['sequence_length']} {precision}"
            )
            log(f"  running {label} ...")
            record = dict(cell, framework=framework, backend=backend)
            try:
                if framework == "hf":
                    times, extra = run_hf_cell(
                        shape, cell, spec["warmup"], spec["steps"], spec["torch_compile"]
                    )
                else:
                    times, extra = run_keras_cell(
                        framework, shape, cell, spec["jit_compile"], spec["warmup"], spec["steps"]
                    )
                median, all_times = median_and_all(times)
                flops = step_flops(shape, cell["sequence_length"], cell["workload"], cell["num_masks"])
                throughput = cell["batch_size"] / median
                record.update(
                    extra,
                    step_seconds=round(median, 5),
                    step_seconds_all=all_times,
                    sequences_per_second=round(throughput, 3),
                    flops_per_sequence=flops,
                    achieved_flops=throughput * flops,
                    matmul_peak_flops=peaks[precision],
                    mfu=(throughput * flops / peaks[precision]) if peaks[precision] else None,
                )
                log(f"    {throughput:8.2f} seq/s (median step {median * 1000:.0f} ms)")
            except Exception as error:
                record["error"] = f"{type(error).__name__}: {error}"[:500]
                log(f"    failed: {record['error']}")
            results.append(record)
    print(RESULT_MARKER + json.dumps({"info": info, "peaks": peaks, "results": results}), flush=True)


# ---------------------------------------------------------------------------------------------
# Memory measurement (one fresh process per variant).
# ---------------------------------------------------------------------------------------------


def _peak_rss_bytes():
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB.


def _gpu_peak_reset_and_reader(backend):
    """Returns a function giving the framework's peak device memory since this call (GPU only)."""
    if backend == "torch":
        import torch

        torch.cuda.reset_peak_memory_stats()
        return lambda: torch.cuda.max_memory_allocated()
    if backend == "jax":
        import jax

        device = jax.devices()[0]
        return lambda: device.memory_stats().get("peak_bytes_in_use")
    import tensorflow as tf

    tf.config.experimental.reset_memory_stats("GPU:0")
    return lambda: tf.config.experimental.get_memory_info("GPU:0")["peak"]


def _jax_step_temp_bytes(model, x, y, batch_size):
    """XLA's temporary-buffer size of the compiled train step (JAX only)."""
    import jax
    import numpy as np

    model.make_train_function()
    model.optimizer.build(model.trainable_variables)
    state = (
        [v.value for v in model.trainable_variables],
        [v.value for v in model.non_trainable_variables],
        [v.value for v in model.optimizer.variables],
        [v.value for v in model.metrics_variables],
    )
    data = ({k: np.asarray(v[:batch_size]) for k, v in x.items()}, np.asarray(y[:batch_size]), None)
    lowered = jax.jit(model.train_step).lower(state, data)
    analysis = lowered.compile().memory_analysis()
    return getattr(analysis, "temp_size_in_bytes", None)


def memory_worker_main(spec):
    """Peak memory of a fine-tuning step for one variant (plain / remat / accumulate)."""
    import keras

    backend = spec["backend"]
    shape = resolve_preset(spec["preset"])
    variant = spec["variant"]
    accumulation = spec["accumulation"] if variant == "accumulate" else None
    batch_size = spec["batch_size"] // accumulation if accumulation else spec["batch_size"]
    keras.utils.set_random_seed(0)
    backbone_model = _keras_models(
        "kbert", shape, spec["precision"], "finetune", remat=variant == "remat"
    )
    _compile_keras(backbone_model, "kbert", "finetune", spec["jit_compile"], accumulation)
    batch = random_batch(shape, batch_size, spec["sequence_length"], 20)
    x, y, _ = _keras_data("kbert", "finetune", batch)
    on_gpu = device_kind() == "gpu"
    record = dict(spec, micro_batch_size=batch_size)
    if backend == "jax" and not on_gpu:
        try:
            record["xla_temp_bytes"] = _jax_step_temp_bytes(backbone_model, x, y, batch_size)
        except Exception as error:
            record["xla_temp_error"] = f"{type(error).__name__}: {error}"[:300]
    reader = _gpu_peak_reset_and_reader(backend) if on_gpu else None
    rss_before = _peak_rss_bytes()
    steps = accumulation or 1
    times = _keras_fit_times(backbone_model, x, y, None, batch_size, warmup=steps, steps=2 * steps)
    record["rss_peak_growth_bytes"] = _peak_rss_bytes() - rss_before
    record["rss_peak_bytes"] = _peak_rss_bytes()
    if reader is not None:
        record["device_peak_bytes"] = reader()
    record["seconds_per_effective_batch"] = statistics.median(times) * steps
    print(RESULT_MARKER + json.dumps(record), flush=True)


# ---------------------------------------------------------------------------------------------
# Parent: spawn workers, collect, report.
# ---------------------------------------------------------------------------------------------


# glibc >= 2.35: back malloc's large blocks with transparent huge pages (when the kernel's THP
# mode is `madvise`). XLA's per-step temporary buffer (1.5 GiB for the L6-H384 fine-tuning step)
# is a fresh mmap each step; on 4 KiB pages that is ~490k page faults and ~1 s of kernel time
# per step on the 2-vCPU machine, on 2 MiB pages ~1.4k. It is a process setting, given to
# every worker (kbert, keras-hub and HF alike) or to none.
HUGEPAGE_TUNABLE = "glibc.malloc.hugetlb=1"


def spawn(spec, backend, nice, hugepages=False):
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2")
    if hugepages:
        tunables = [t for t in env.get("GLIBC_TUNABLES", "").split(":") if t]
        env["GLIBC_TUNABLES"] = ":".join(tunables + [HUGEPAGE_TUNABLE])
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    command = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)]
    if nice:
        command = ["nice", "-n", str(nice)] + command
    process = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True)
    for line in process.stdout.splitlines():
        if line.startswith(RESULT_MARKER):
            return json.loads(line[len(RESULT_MARKER) :])
    raise RuntimeError(f"worker for {backend} exited with {process.returncode} and no result")


# The CPU goals of the performance issue, measured together in one run by `--suite cpu-goals`:
# a fine-tuning step of L6-H384-A12 at batch 32, length 128, and a BERT-Base forward pass at
# batch 8, length 128, both float32. Each goal: (workload, what, threshold).
SUITES = {
    "cpu-goals": [
        "finetune:L6-H384-A12:32:128",
        "inference:bert_base_en_uncased:8:128",
    ],
}
CPU_GOALS = (
    ("finetune", "kbert/jax vs HF", 1.1),
    ("finetune", "kbert/torch vs HF", 1.0),
    ("inference", "best kbert backend, share of the matmul limit", 0.9),
)


def parse_cell(text, num_masks, precision="float32"):
    """`WORKLOAD:PRESET:BATCH:LENGTH[:PRECISION]` -> a cell dict."""
    parts = text.split(":")
    if len(parts) not in (4, 5) or parts[0] not in WORKLOADS:
        raise SystemExit(
            f"--cell must be WORKLOAD:PRESET:BATCH:LENGTH[:PRECISION] with WORKLOAD in {WORKLOADS}. "
            f"Received: {text!r}"
        )
    workload, preset, batch, length = parts[:4]
    precision = parts[4] if len(parts) == 5 else precision
    if precision not in PRECISIONS:
        raise SystemExit(f"Unknown precision {precision!r} in --cell {text!r}; expected one of {PRECISIONS}")
    resolve_preset(preset)
    return {
        "preset": preset,
        "sequence_length": int(length),
        "batch_size": int(batch),
        "precision": precision,
        "workload": workload,
        "num_masks": num_masks,
    }


def build_cells(args):
    explicit = list(args.cell or []) + [c for suite in (args.suite or []) for c in SUITES[suite]]
    if explicit:
        return [parse_cell(text, args.num_masks, args.precision[0]) for text in explicit]
    cells = []
    for preset in args.preset:
        resolve_preset(preset)  # Fails early on an unknown name.
        for sequence_length in args.sequence_length:
            for batch_size in args.batch_size:
                for precision in args.precision:
                    for workload in args.workload:
                        cells.append(
                            {
                                "preset": preset,
                                "sequence_length": sequence_length,
                                "batch_size": batch_size,
                                "precision": precision,
                                "workload": workload,
                                "num_masks": args.num_masks,
                            }
                        )
    return cells


def cell_key(record):
    return (
        record["preset"],
        record["sequence_length"],
        record["batch_size"],
        record["precision"],
        record["workload"],
    )


def best_of_rounds(records):
    """Keeps, per (cell, framework, backend), the round with the highest throughput."""
    best = {}
    for record in records:
        key = cell_key(record) + (record["framework"], record["backend"])
        current = best.get(key)
        if current is None or (
            record.get("sequences_per_second", 0) > current.get("sequences_per_second", 0)
        ):
            best[key] = record
    return list(best.values())


def format_table(records):
    """A text table per cell: throughput, MFU and ratios to HF and to keras-hub on the same backend."""
    lines = []
    by_cell = {}
    for record in records:
        by_cell.setdefault(cell_key(record), []).append(record)
    for key in sorted(by_cell):
        preset, length, batch, precision, workload = key
        rows = by_cell[key]
        hf = next((r for r in rows if r["framework"] == "hf" and "error" not in r), None)
        lines.append(f"\n{workload}  {preset}  batch={batch}  seq={length}  {precision}")
        lines.append(
            f"  {'framework':<10} {'backend':<11} {'seq/s':>9} {'step ms':>9} {'MFU':>7} "
            f"{'vs HF':>7} {'vs keras-hub':>13}"
        )
        for record in sorted(rows, key=lambda r: (r["framework"], r["backend"])):
            if "error" in record:
                lines.append(
                    f"  {record['framework']:<10} {record['backend']:<11} failed: {record['error'][:70]}"
                )
                continue
            speed = record["sequences_per_second"]
            hub = next(
                (
                    r
                    for r in rows
                    if r["framework"] == "keras_hub"
                    and r["backend"] == record["backend"]
                    and "error" not in r
                ),
                None,
            )
            vs_hf = f"{speed / hf['sequences_per_second']:.2f}x" if hf else "-"
            vs_hub = (
                f"{speed / hub['sequences_per_second']:.2f}x"
                if hub and record["framework"] == "kbert"
                else "-"
            )
            mfu = f"{100 * record['mfu']:.0f}%" if record.get("mfu") else "-"
            lines.append(
                f"  {record['framework']:<10} {record['backend']:<11} {speed:>9.2f} "
                f"{1000 * record['step_seconds']:>9.0f} {mfu:>7} {vs_hf:>7} {vs_hub:>13}"
            )
    return "\n".join(lines)


def check_goals(records, peaks):
    """Lines stating each CPU goal of the performance issue, the measured value and whether it is met.

    The forward-pass goal divides kbert's FLOP rate by the highest matmul peak measured on
    any backend in the run (the machine's matmul limit), and also reports each backend's own.
    """
    def find(workload, framework, backend=None):
        return [
            r for r in records
            if r["workload"] == workload and r["framework"] == framework and "error" not in r
            and (backend is None or r["backend"] == backend)
        ]

    lines = ["\ngoals (CPU, this run):"]
    hf = {r["workload"]: r for r in find("finetune", "hf")}
    for workload, what, threshold in CPU_GOALS:
        if workload == "finetune":
            backend = what.split()[0].split("/")[1]
            ours = find(workload, "kbert", backend)
            if not ours or workload not in hf:
                lines.append(f"  {workload}: {what} >= {threshold:.2f}x: not measured")
                continue
            ratio = ours[0]["sequences_per_second"] / hf[workload]["sequences_per_second"]
            verdict = "met" if ratio >= threshold else "NOT met"
            lines.append(f"  {workload}: {what} = {ratio:.2f}x (goal >= {threshold:.2f}x): {verdict}")
        else:
            ours = find(workload, "kbert")
            cpu_peaks = [v for k, v in peaks.items() if k.endswith("/float32")]
            if not ours or not cpu_peaks:
                lines.append(f"  {workload}: {what} >= {threshold:.0%}: not measured")
                continue
            best = max(ours, key=lambda r: r["sequences_per_second"])
            limit = max(cpu_peaks)
            share = best["sequences_per_second"] * best["flops_per_sequence"] / limit
            own = ", ".join(f"{r['backend']} {100 * r['mfu']:.0f}% of its own" for r in ours if r.get("mfu"))
            verdict = "met" if share >= threshold else "NOT met"
            lines.append(
                f"  {workload}: {what} = {share:.0%} ({best['backend']}, {best['sequences_per_second']:.2f} "
                f"seq/s against {limit / 1e9:.0f} GFLOP/s; {own}) (goal >= {threshold:.0%}): {verdict}"
            )
    return "\n".join(lines)


def write_chart(records, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_cell = {}
    for record in records:
        if "error" not in record:
            by_cell.setdefault(cell_key(record), []).append(record)
    keys = sorted(by_cell)
    if not keys:
        return
    figure, axes = plt.subplots(len(keys), 1, figsize=(9, 2.6 * len(keys)), squeeze=False)
    colours = {"kbert": "#1f77b4", "keras_hub": "#ff7f0e", "hf": "#2ca02c"}
    for axis, key in zip(axes[:, 0], keys):
        rows = sorted(by_cell[key], key=lambda r: (r["framework"], r["backend"]))
        labels = [
            f"{r['framework']}\n{'torch' if r['framework'] == 'hf' else r['backend']}" for r in rows
        ]
        values = [r["sequences_per_second"] for r in rows]
        bars = axis.bar(labels, values, color=[colours[r["framework"]] for r in rows])
        for bar, record in zip(bars, rows):
            mfu = record.get("mfu")
            text = f"{bar.get_height():.1f}" + (f"\n{100 * mfu:.0f}% MFU" if mfu else "")
            axis.annotate(
                text,
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=7,
            )
        preset, length, batch, precision, workload = key
        axis.set_title(f"{workload}: {preset}, batch {batch}, seq {length}, {precision}", fontsize=9)
        axis.set_ylabel("sequences / s")
        axis.set_ylim(0, max(values) * 1.35)
        axis.tick_params(axis="x", labelsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def run_benchmark(args):
    cells = build_cells(args)
    frameworks = [f for f in args.framework if f != "hf"]
    specs = []
    for backend in args.backend:
        if frameworks:
            specs.append(
                (
                    backend,
                    {
                        "family": "keras",
                        "backend": backend,
                        "frameworks": frameworks,
                        "cells": cells,
                        "warmup": args.warmup,
                        "steps": args.steps,
                        "jit_compile": {"auto": "auto", "on": True, "off": False}[args.jit_compile],
                        "torch_compile": args.torch_compile,
                    },
                )
            )
    if "hf" in args.framework:
        specs.append(
            (
                "torch",
                {
                    "family": "hf",
                    "backend": "torch",
                    "frameworks": ["hf"],
                    "cells": cells,
                    "warmup": args.warmup,
                    "steps": args.steps,
                    "jit_compile": False,
                    "torch_compile": args.torch_compile,
                },
            )
        )
    records, infos, peaks = [], {}, {}
    total = args.rounds * len(specs)
    done = 0
    for round_index in range(args.rounds):
        for backend, spec in specs:
            done += 1
            log(f"[{done}/{total}] round {round_index + 1}: {spec['family']} on {backend}")
            output = spawn(spec, backend, args.nice, args.malloc_hugepages == "on")
            records.extend(output["results"])
            infos[f"{spec['family']}/{backend}"] = output["info"]
            for precision, peak in output["peaks"].items():
                if peak:
                    name = f"{backend}/{precision}"
                    peaks[name] = max(peaks.get(name, 0), peak)
    records = best_of_rounds(records)
    return records, infos, peaks


def run_memory(args):
    results = []
    variants = args.memory_variants
    total = len(args.backend) * len(variants)
    done = 0
    for backend in args.backend:
        for variant in variants:
            done += 1
            log(f"[{done}/{total}] memory: {variant} on {backend}")
            spec = {
                "mode": "memory",
                "backend": backend,
                "preset": args.preset[0],
                "sequence_length": args.sequence_length[0],
                "batch_size": args.batch_size[0],
                "precision": args.precision[0],
                "variant": variant,
                "accumulation": args.accumulation_steps,
                "jit_compile": {"auto": "auto", "on": True, "off": False}[args.jit_compile],
            }
            try:
                results.append(spawn(spec, backend, args.nice, args.malloc_hugepages == "on"))
            except RuntimeError as error:
                results.append(dict(spec, error=str(error)))
    lines = [
        f"\nmemory: fine-tuning step, {args.preset[0]}, batch {args.batch_size[0]}, "
        f"seq {args.sequence_length[0]}, {args.precision[0]}",
        f"  {'backend':<11} {'variant':<11} {'micro-batch':>11} {'RSS growth MiB':>15} "
        f"{'XLA temp MiB':>13} {'device peak MiB':>16} {'s / batch':>10}",
    ]
    mib = 1024 * 1024
    for r in results:
        if "error" in r:
            lines.append(f"  {r['backend']:<11} {r['variant']:<11} failed: {r['error'][:60]}")
            continue
        xla = f"{r['xla_temp_bytes'] / mib:.0f}" if r.get("xla_temp_bytes") else "-"
        device = f"{r['device_peak_bytes'] / mib:.0f}" if r.get("device_peak_bytes") else "-"
        lines.append(
            f"  {r['backend']:<11} {r['variant']:<11} {r['micro_batch_size']:>11} "
            f"{r['rss_peak_growth_bytes'] / mib:>15.0f} {xla:>13} {device:>16} "
            f"{r['seconds_per_effective_batch']:>10.2f}"
        )
    return results, "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", nargs="+", default=["L6-H384-A12"])
    parser.add_argument("--sequence-length", nargs="+", type=int, default=[128])
    parser.add_argument("--batch-size", nargs="+", type=int, default=[32])
    parser.add_argument("--backend", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument("--precision", nargs="+", choices=PRECISIONS, default=["float32"])
    parser.add_argument("--workload", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--framework", nargs="+", choices=FRAMEWORKS, default=list(FRAMEWORKS))
    parser.add_argument(
        "--cell",
        action="append",
        metavar="WORKLOAD:PRESET:BATCH:LENGTH[:PRECISION]",
        help="measure exactly this cell (repeatable); replaces the preset x length x batch x workload product",
    )
    parser.add_argument(
        "--suite",
        nargs="+",
        choices=sorted(SUITES),
        help="named cell sets; cpu-goals = the issue's CPU goals, checked at the end of the run",
    )
    parser.add_argument("--num-masks", type=int, default=20, help="masked positions per sequence")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per cell")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps (compilation)")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved repeats; best kept")
    parser.add_argument(
        "--jit-compile",
        choices=("auto", "on", "off"),
        default="auto",
        help="Keras compile(jit_compile=...): auto = XLA on JAX/TensorFlow, eager on torch",
    )
    parser.add_argument(
        "--torch-compile", action="store_true", help="torch.compile the Hugging Face model"
    )
    parser.add_argument("--nice", type=int, default=0, help="run workers under `nice -n N`")
    parser.add_argument(
        "--malloc-hugepages",
        choices=("on", "off"),
        default="on",
        help=f"run every worker with GLIBC_TUNABLES={HUGEPAGE_TUNABLE} (fewer page faults)",
    )
    parser.add_argument("--json", help="write all records to this JSON file")
    parser.add_argument("--chart", help="write a PNG bar chart to this path")
    parser.add_argument("--memory", action="store_true", help="measure peak memory instead")
    parser.add_argument(
        "--memory-variants", nargs="+", choices=MEMORY_VARIANTS, default=list(MEMORY_VARIANTS)
    )
    parser.add_argument("--accumulation-steps", type=int, default=4)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        spec = json.loads(args.worker)
        if spec.get("mode") == "memory":
            memory_worker_main(spec)
        else:
            worker_main(spec)
        return
    started = datetime.datetime.now()
    command = "python " + " ".join([os.path.relpath(__file__)] + sys.argv[1:])
    load = os.getloadavg()
    log(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    log(f"malloc huge pages for every worker: {args.malloc_hugepages}")
    if args.memory:
        results, table = run_memory(args)
        print(table)
        payload = {"command": command, "date": started.isoformat(), "memory": results}
        payload["malloc_hugepages"] = args.malloc_hugepages
    else:
        records, infos, peaks = run_benchmark(args)
        print(f"\ndevice: {next(iter(infos.values()))['device'] if infos else '?'}")
        for name, peak in sorted(peaks.items()):
            print(f"measured matmul peak {name}: {peak / 1e9:.1f} GFLOP/s")
        print(format_table(records))
        if "cpu-goals" in (args.suite or []):
            print(check_goals(records, peaks))
        if args.chart:
            write_chart(records, args.chart)
            print(f"\nchart written to {args.chart}")
        payload = {
            "command": command,
            "date": started.isoformat(),
            "processes": infos,
            "matmul_peaks": peaks,
            "results": records,
            "malloc_hugepages": args.malloc_hugepages,
        }
    load = os.getloadavg()
    print(f"load average at end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    payload["load_average_end"] = load
    if args.json:
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=1)


if __name__ == "__main__":
    main()
