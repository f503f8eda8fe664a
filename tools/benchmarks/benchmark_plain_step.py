"""A Hugging Face cell of benchmark.py written as a user's own script: its consistency check.

The benchmark's HF worker (`bench/hf_timing.py`) times its cells inside a worker process
that the tool starts. This script is the same workload as a plain user script writes it,
with nothing of the tool around it: no worker, no matmul-peak measurement, no environment of its
own, the model and the loop written out here. `benchmark.py --check-plain` runs it for every
HF cell of a run, in the same run, and prints its figure beside the worker's: they must agree
(within the machine's noise), or the tool measures something a user's script does not do.

Run alone (prints one JSON line: the step times in seconds and their median):
```
python tools/benchmarks/benchmark_plain_step.py --cell finetune:L2-H128-A2:8:32
```
"""

import argparse
import statistics

from bench.cells import parse_cell  # NumPy-only helpers: the very inputs of the benchmark.
from bench.common import random_batch
from bench.flops import resolve_preset
from bench.harness import emit, time_calls
from bench.hf_timing import hf_config


def _model_and_step(shape, cell):
    """The HF model of the cell and one step of it, as a user's float32 eager script writes it."""
    import numpy as np
    import torch
    import transformers

    torch.manual_seed(0)
    config = hf_config(shape, num_labels=2, attn_implementation="sdpa")
    batch = random_batch(shape, cell["batch_size"], cell["sequence_length"], cell["num_masks"])
    inputs = {
        "input_ids": torch.tensor(batch["token_ids"], dtype=torch.long),
        "token_type_ids": torch.tensor(batch["segment_ids"], dtype=torch.long),
        "attention_mask": torch.tensor(batch["padding_mask"], dtype=torch.long),
    }
    if cell["workload"] == "inference":
        model = transformers.BertModel(config).eval()

        def step():
            with torch.inference_mode():
                model(**inputs)

        return step
    if cell["workload"] == "finetune":
        model = transformers.BertForSequenceClassification(config)
        inputs["labels"] = torch.tensor(batch["labels"], dtype=torch.long)
    else:
        model = transformers.BertForPreTraining(config)
        labels = np.full(batch["token_ids"].shape, -100, "int64")
        np.put_along_axis(labels, batch["mask_positions"], batch["mlm_labels"], axis=1)
        inputs["labels"] = torch.tensor(labels)
        inputs["next_sentence_label"] = torch.tensor(batch["labels"], dtype=torch.long)
    model.train()
    no_decay = ("bias", "LayerNorm.weight")
    named = list(model.named_parameters())
    optimizer = torch.optim.AdamW(
        [
            {"params": [p for n, p in named if not n.endswith(no_decay)], "weight_decay": 0.01},
            {"params": [p for n, p in named if n.endswith(no_decay)], "weight_decay": 0.0},
        ],
        lr=5e-5,
        eps=1e-6,
    )

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = model(**inputs).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        loss.item()

    return step


def run(cell, warmup, steps):
    """Step times (seconds) of `steps` timed steps after `warmup` untimed ones."""
    return time_calls(_model_and_step(resolve_preset(cell["preset"]), cell), steps, warmup)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cell", required=True, help="WORKLOAD:PRESET:BATCH:LENGTH (float32)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--num-masks", type=int, default=20)
    args = parser.parse_args(argv)
    cell = parse_cell(args.cell, args.num_masks)
    if cell["precision"] != "float32":
        raise SystemExit(f"plain_step.py times float32 cells only. Received: {args.cell!r}")
    times = run(cell, args.warmup, args.steps)
    result = {"cell": args.cell, "step_seconds_all": [round(t, 5) for t in times]}
    result["step_seconds"] = round(statistics.median(times), 5)
    emit(result)


if __name__ == "__main__":
    main()
