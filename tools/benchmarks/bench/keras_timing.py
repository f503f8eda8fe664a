"""Timing kbert and keras-hub models (any Keras backend): fit steps and forward passes."""

import time

from bench.common import minor_page_faults, random_batch


class _KerasStepTimer:
    """Records the wall time (and minor page faults) of each `fit` step, synchronising on its
    loss."""

    def __init__(self):
        import keras

        timer = self

        class Callback(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                timer.stamps = [time.perf_counter()]
                timer.faults = [minor_page_faults()]

            def on_train_batch_end(self, batch, logs=None):
                for value in (logs or {}).values():
                    float(value)  # Waits for the (possibly asynchronous) step to finish.
                timer.stamps.append(time.perf_counter())
                timer.faults.append(minor_page_faults())

        self.callback = Callback()
        self.stamps = []
        self.faults = []

    def step_times(self):
        deltas = [b - a for a, b in zip(self.stamps, self.stamps[1:])]
        return deltas[1:] if len(deltas) > 1 else deltas  # The first step also starts the iterator.

    def faults_per_step(self):
        """Median minor page faults of the timed steps (the same steps as `step_times`)."""
        deltas = [b - a for a, b in zip(self.faults, self.faults[1:])]
        deltas = deltas[1:] if len(deltas) > 1 else deltas
        return sorted(deltas)[len(deltas) // 2] if deltas else None


def _keras_fit_times(model, x, y, sample_weight, batch_size, warmup, steps):
    """Runs `warmup` then `steps + 1` fit steps.

    Returns the per-step times of the timed ones and their median count of minor page faults.
    """
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
    return timer.step_times(), timer.faults_per_step()


def _device_forward(model, x, jit_compile):
    """A function running `model`'s forward pass on `x` whose outputs stay on the device.

    The inputs are moved to the device once; every call waits until the outputs are computed
    (`block_until_ready` on JAX, a device synchronisation on torch and TensorFlow) but never
    copies them to the host, as Hugging Face's forward is timed too. `predict_on_batch` would
    add a device-to-host copy of the outputs to every step.
    """
    import keras

    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        inputs = jax.device_put(dict(x))
        trainable = [v.value for v in model.trainable_variables]
        non_trainable = [v.value for v in model.non_trainable_variables]

        def forward(trainable, non_trainable, inputs):
            return model.stateless_call(trainable, non_trainable, inputs, training=False)[0]

        if jit_compile:
            forward = jax.jit(forward)
        return lambda: jax.block_until_ready(forward(trainable, non_trainable, inputs))
    if backend == "torch":
        import torch

        inputs = {k: keras.ops.convert_to_tensor(v) for k, v in x.items()}

        def forward(inputs):
            return model(inputs, training=False)

        if jit_compile:
            forward = torch.compile(forward)

        def run():
            with torch.no_grad():
                outputs = forward(inputs)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            return outputs

        return run
    import tensorflow as tf

    inputs = {k: tf.convert_to_tensor(v) for k, v in x.items()}
    forward = tf.function(
        lambda inputs: model(inputs, training=False), jit_compile=bool(jit_compile)
    )

    def run():
        outputs = forward(inputs)
        tf.test.experimental.sync_devices()
        return outputs

    return run


def _keras_predict_times(model, x, warmup, steps, jit_compile):
    """Times `steps` forward passes, outputs kept on the device; returns times and page faults."""
    run = _device_forward(model, x, jit_compile)
    for _ in range(max(warmup, 1)):
        run()
    times, faults = [], []
    for _ in range(steps):
        before = minor_page_faults()
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
        faults.append(minor_page_faults() - before)
    return times, sorted(faults)[len(faults) // 2]


# kbert's variants of a workload, each timed in a process of its own (row label
# "kbert-<variant>"): what the recipe changes to let a faster kernel run.
# - "flash": no attention-probability dropout (BERT's recipe has 0.1), so that the fused
#   attention kernel (cuDNN's flash attention on a GPU under JAX) takes the training step;
#   with dropout the step needs the probabilities and runs the explicit softmax path.
# - "float8": `model.quantize("float8")` before compiling: Keras' float8 training of every
#   Dense layer (inputs and kernels quantized to float8 and back with delayed scaling; XLA
#   can rewrite such a product into a float8 one on a GPU with float8 units, Hopper). Whether
#   it does, and whether that pays at BERT-Base's sizes, is what this row measures.
KBERT_VARIANTS = ("flash", "float8")


def _keras_models(framework, shape, precision, workload, remat=False, variant=None):
    """Builds the Keras model of a workload for kbert or keras-hub (fresh weights); `variant`:
    one of `KBERT_VARIANTS` (kbert only)."""

    if framework == "kbert":
        from kbert.models import BertBackbone, BertClassifier, BertPretrainer

        extra = {"remat": True} if remat else {}
        if variant == "flash":
            extra.update(attention_dropout=0.0, flash_attention=True)
        elif variant not in (None, "float8"):
            raise ValueError(f"Unknown kbert variant {variant!r}; expected one of {KBERT_VARIANTS}")
        backbone = BertBackbone(**shape, dtype=precision, **extra)
        if workload == "inference":
            model = backbone
        elif workload == "pretrain":
            model = BertPretrainer(backbone)
        else:
            # What a user fine-tunes (pooled output, dropout 0.1, dense logits): its train step
            # is kbert's compiled one under `jit_compile=True` on torch.
            model = BertClassifier(backbone, num_classes=2, dropout=0.1)
        if variant == "float8":
            model.quantize("float8")
        return model

    import keras_hub

    hub_shape = {k: v for k, v in shape.items()}
    backbone = keras_hub.models.BertBackbone(**hub_shape, dropout=0.1, dtype=precision)
    if workload == "inference":
        return backbone
    if workload == "pretrain":
        return keras_hub.models.BertMaskedLM(backbone, preprocessor=None)
    return keras_hub.models.BertTextClassifier(backbone, num_classes=2, preprocessor=None)


def _keras_optimizer(gradient_accumulation_steps=None, optimizer="kbert"):
    """kbert's `bert_optimizer` (the default), or Keras' own `AdamW(2e-5)` as a user's script writes
    it."""
    if optimizer == "keras":
        import keras

        return keras.optimizers.AdamW(2e-5)
    from kbert.optimizers import bert_optimizer

    kwargs = {}
    if gradient_accumulation_steps:
        kwargs["gradient_accumulation_steps"] = gradient_accumulation_steps
    return bert_optimizer(5e-5, total_steps=10_000, warmup_steps=100, **kwargs)


def _compile_keras(model, framework, workload, jit_compile, accumulation=None, optimizer="kbert"):
    import keras

    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if framework == "kbert" and workload == "pretrain":
        kwargs = {"jit_compile": jit_compile}
        if accumulation or optimizer != "kbert":
            kwargs["optimizer"] = _keras_optimizer(accumulation, optimizer)
        else:  # BERT's recipe with the schedule of `_keras_optimizer`.
            kwargs.update(total_steps=10_000, warmup_steps=100)
        model.compile(**kwargs)  # BertPretrainer keeps its MLM + NSP losses.
    else:
        model.compile(
            optimizer=_keras_optimizer(accumulation, optimizer), loss=loss, jit_compile=jit_compile
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


def run_keras_cell(
    framework, shape, cell, jit_compile, warmup, steps, optimizer="kbert", variant=None
):
    """Times one cell; returns the step times and the record's extra fields.

    `optimizer`: "kbert" (`bert_optimizer`) or "keras" (`keras.optimizers.AdamW(2e-5)`);
    `variant`: one of `KBERT_VARIANTS`, or None for kbert's defaults.
    """
    import keras

    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(0)
    workload, batch_size = cell["workload"], cell["batch_size"]
    model = _keras_models(framework, shape, cell["precision"], workload, variant=variant)
    batch = random_batch(shape, batch_size, cell["sequence_length"], cell["num_masks"])
    x, y, sample_weight = _keras_data(framework, workload, batch)
    extra = {}
    if workload == "inference":
        model.compile(jit_compile=jit_compile)
        times, faults = _keras_predict_times(model, x, warmup, steps, model.jit_compile)
        extra["outputs"] = "on device"
    else:
        _compile_keras(model, framework, workload, jit_compile, optimizer=optimizer)
        times, faults = _keras_fit_times(model, x, y, sample_weight, batch_size, warmup, steps)
        if optimizer != "kbert":
            extra["optimizer"] = "keras.optimizers.AdamW(2e-5)"
            extra["label"] = f"{framework}+AdamW"
    return times, dict(extra, jit_compile=bool(model.jit_compile), page_faults_per_step=faults)
