"""Timing Hugging Face transformers (PyTorch, sdpa attention; eager or `torch.compile`)."""

import time

from bench.common import minor_page_faults, random_batch

# Wall-time floors of the warm-up and of the timed steps (see the loop in `run_hf_cell`).
MIN_WARMUP_SECONDS = 0.5
MIN_TIMED_SECONDS = 1.0


def hf_config(shape, **settings):
    """The `transformers.BertConfig` of a backbone shape (`bench.flops.resolve_preset`), with
    `settings` added."""
    import transformers

    return transformers.BertConfig(
        vocab_size=shape["vocabulary_size"],
        hidden_size=shape["hidden_dim"],
        num_hidden_layers=shape["num_layers"],
        num_attention_heads=shape["num_heads"],
        intermediate_size=shape["intermediate_dim"],
        max_position_embeddings=shape["max_sequence_length"],
        **settings,
    )


def run_hf_cell(shape, cell, warmup, steps, torch_compile=False):
    import numpy as np
    import torch
    import transformers

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = hf_config(
        shape,
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
    autocast_dtype = {"mixed_bfloat16": torch.bfloat16, "mixed_float16": torch.float16}.get(
        precision
    )
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
            {
                "params": [p for n, p in model.named_parameters() if not n.endswith(no_decay)],
                "weight_decay": 0.01,
            },
            {
                "params": [p for n, p in model.named_parameters() if n.endswith(no_decay)],
                "weight_decay": 0.0,
            },
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

    # A fast step (a tiny model) is warmed up and timed for a minimum wall time as well as a
    # minimum count, as a user's script that loops for a while runs it: a handful of 30 ms steps
    # right after start-up is not the step's steady speed.
    started, done = time.perf_counter(), 0
    while done < max(warmup, 1) or (
        time.perf_counter() - started < MIN_WARMUP_SECONDS and done < 100
    ):
        step()
        done += 1
    times, faults = [], []
    while len(times) < steps or (sum(times) < MIN_TIMED_SECONDS and len(times) < 200):
        before = minor_page_faults()
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
        faults.append(minor_page_faults() - before)
    extra = {
        "torch_compile": torch_compile,
        "attn_implementation": "sdpa",
        "page_faults_per_step": sorted(faults)[len(faults) // 2],
    }
    if torch_compile:
        extra["label"] = "hf-compile"
    return times, extra
