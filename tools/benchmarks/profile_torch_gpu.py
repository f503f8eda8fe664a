"""Where kbert on the torch backend spends a BERT-Base step.

Prints the forward pass' wall time per dtype policy at batch 128 and at batch 8 (equal times
mean the step is host-bound), a fine-tuning step with kbert's recipe and with Keras' AdamW, and
`torch.profiler` tables of the mixed-precision forward and fine-tuning step (self CPU time and,
on a GPU, self CUDA time).

```
python tools/benchmarks/profile_torch_gpu.py          # BERT-Base, on the GPU machine
python tools/benchmarks/profile_torch_gpu.py --tiny   # a tiny model: the code path, in seconds
```
"""

import argparse
import os
import statistics

os.environ["KERAS_BACKEND"] = "torch"

import keras  # noqa: E402
import torch  # noqa: E402
from bench.common import random_batch  # noqa: E402
from bench.flops import resolve_preset  # noqa: E402
from bench.harness import time_calls  # noqa: E402

from kbert.models import BertBackbone  # noqa: E402
from kbert.optimizers import bert_optimizer  # noqa: E402

CUDA = torch.cuda.is_available()
ACTIVITIES = [torch.profiler.ProfilerActivity.CPU] + (
    [torch.profiler.ProfilerActivity.CUDA] if CUDA else []
)


def sync():
    if CUDA:
        torch.cuda.synchronize()


def median_ms(fn, repeats=5):
    """Median wall time of `fn` after two untimed calls, waiting for the device each time."""
    return 1000 * statistics.median(time_calls(fn, repeats, warmup=2, sync=sync))


def profile(fn, rows):
    with torch.profiler.profile(activities=ACTIVITIES) as prof:
        fn()
        sync()
    for key in ["self_cpu_time_total"] + (["self_cuda_time_total"] if CUDA else []):
        print(prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=60))


def forward_fn(model, inputs):
    def forward():
        with torch.no_grad():
            return model(inputs, training=False)

    return forward


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny model instead of BERT-Base")
    args = parser.parse_args(argv)
    shape = resolve_preset("L2-H64-A2-V512" if args.tiny else "bert_base_en_uncased")
    batch_size, length, finetune_batch = (4, 16, 4) if args.tiny else (128, 128, 32)
    batch = random_batch(shape, batch_size, length, 3)
    names = ("token_ids", "segment_ids", "padding_mask")
    inputs = {k: keras.ops.convert_to_tensor(batch[k]) for k in names}
    small = {k: v[:8] for k, v in inputs.items()}
    for policy in ("float32", "bfloat16", "mixed_bfloat16"):
        model = BertBackbone(**shape, dtype=policy)
        for label, x in ((batch_size, inputs), (min(8, batch_size), small)):
            print(f"inference b={label} {policy}: {median_ms(forward_fn(model, x)):.1f} ms")
        if policy == "mixed_bfloat16":
            profile(forward_fn(model, inputs), 18)

    backbone = BertBackbone(**shape, dtype="mixed_bfloat16")
    pooled = backbone(backbone.input)["pooled_output"]
    logits = keras.layers.Dense(2, dtype=backbone.dtype_policy)(pooled)
    x = {k: batch[k][:finetune_batch] for k in names}
    y = batch["labels"][:finetune_batch]
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizers = {
        "kbert recipe": bert_optimizer(5e-5, total_steps=10_000, warmup_steps=100),
        "keras AdamW": keras.optimizers.AdamW(2e-5),
    }
    for label, optimizer in optimizers.items():
        classifier = keras.Model(backbone.input, logits)
        classifier.compile(optimizer=optimizer, loss=loss)

        def step(classifier=classifier):
            return classifier.train_on_batch(x, y)

        print(f"finetune b={finetune_batch} mixed_bfloat16 {label}: {median_ms(step):.1f} ms")
    profile(step, 25)


if __name__ == "__main__":
    main()
