"""Names and small helpers of the model benchmark (benchmark.py): the workload names, the random
batch every framework is timed on, step statistics."""

import resource
import statistics

WORKLOADS = ("inference", "finetune", "pretrain")

FRAMEWORKS = ("kbert", "keras_hub", "hf")

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")

BACKENDS = ("tensorflow", "jax", "torch")

MEMORY_VARIANTS = ("plain", "remat", "accumulate")


def process_family(spec):
    """The rows' label of a worker's process: `hf-compile` (HF under `torch.compile`),
    `kbert-cudagraphs` / `kbert-compile` (kbert's compiled torch steps with / without CUDA
    graphs), `kbert-<variant>` (`keras_timing.KBERT_VARIANTS`), else the spec's family
    (`keras`: kbert and keras-hub as the run sets them, each row labelled by its framework;
    `hf`)."""
    if spec["family"] == "hf" and spec.get("torch_compile"):
        return "hf-compile"
    if spec.get("cuda_graphs"):
        return "kbert-cudagraphs"
    if spec.get("kbert_compile"):
        return "kbert-compile"
    if spec.get("kbert_variant"):
        return f"kbert-{spec['kbert_variant']}"
    return spec["family"]


def random_batch(shape, batch_size, sequence_length, num_masks, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    low = 1000 if shape["vocabulary_size"] > 2000 else 5  # Past the special tokens.
    token_ids = rng.integers(low, shape["vocabulary_size"], (batch_size, sequence_length))
    token_ids[:, 0] = 101
    segment_ids = np.zeros((batch_size, sequence_length), "int32")
    segment_ids[:, sequence_length // 2 :] = 1
    num_masks = min(num_masks, sequence_length - 1)
    mask_positions = np.stack(
        [
            np.sort(rng.choice(np.arange(1, sequence_length), num_masks, False))
            for _ in range(batch_size)
        ]
    )
    return {
        "token_ids": token_ids.astype("int32"),
        "segment_ids": segment_ids,
        "padding_mask": np.ones((batch_size, sequence_length), "int32"),
        "mask_positions": mask_positions.astype("int32"),
        "labels": rng.integers(0, 2, (batch_size,)).astype("int32"),
        "mlm_labels": rng.integers(low, shape["vocabulary_size"], (batch_size, num_masks)).astype(
            "int32"
        ),
    }


def median_and_all(times):
    return statistics.median(times), [round(t, 5) for t in times]


def minor_page_faults():
    """Minor page faults of this process so far (`getrusage`): robust to other load on the
    machine."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
