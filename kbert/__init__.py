"""kbert: BERT for Keras 3 on TensorFlow, JAX and PyTorch.

Subpackages:
    kbert.backend      Backend-specific speed paths (tested equal to keras.ops); optional TF.
    kbert.layers       Keras layers (embeddings, attention, encoder block, heads).
    kbert.models       BertBackbone, BertPretrainer, task models, presets.
    kbert.optimizers   BERT's AdamW recipe (warm-up, linear decay), LAMB.
    kbert.text         WordPiece tokenizer identical to the reference, input packer.
    kbert.data         Dataset readers, SQuAD / tagging features, tf.data pretraining pipeline.
    kbert.metrics      MCC, Pearson/Spearman, entity F1, SQuAD EM/F1.
    kbert.losses       Contrastive embedding losses: in-batch negatives, CoSENT, Matryoshka.
    kbert.losses_sparse  SPLADE training: in-batch negatives + FLOPS regularisers, active dims.
    kbert.retrieval    Exact chunked top-k search (dense, sparse); EmbeddingIndex (float32 /
                       int8 / binary, saved, FAISS HNSW optional) with rescoring;
                       retrieve-then-rerank; recall@k, MRR@k, nDCG@k, Spearman of cosine.
    kbert.checkpoints  Readers/writers for HF, Google TF and keras-hub checkpoints.
    kbert.hub          `hf://` handles and preset names: download, cache, offline (huggingface_hub).
    kbert.callbacks    Resumable training: atomic backups every N steps, exact resume.
    kbert.export       SavedModel (raw strings in, tokenizer in the graph), ONNX (float or
                       int8) and OpenVINO export.
    kbert.serving      Runs an ONNX / OpenVINO export on raw text: `load(dir).encode(texts)`.
    kbert.distribution Data- and model-parallel training (keras.distribution) with BERT layouts;
                       `initialize()` for `fit` over several processes on every backend.
    kbert.processes    This process' index in a multi-process run; which one writes files.
    kbert.tracking     Record a run: per-step loss, dev scores per epoch, metrics.json, curve PNG.
    kbert.runtime      Opt-in process settings: `tune_allocator()` (glibc malloc reuse on CPU).

Importing kbert changes nothing in the process: it sets no allocator or logging options,
leaves stderr alone, probes no devices and imports nothing heavy. Each subpackage (and Keras
with it) is imported the first time it is used, e.g. `kbert.models.BertClassifier` or
`from kbert import models`.

TensorFlow is optional: everything runs with Keras on JAX or PyTorch alone except the tf.data
pipelines, the tokenizer inside a tf.data graph and Google TF checkpoints, which raise one clear
error naming `pip install "kbert[tensorflow]"` when it is missing. TensorFlow is imported only
when one of those is used.
"""

import importlib

__version__ = "0.1.0"

_SUBMODULES = (
    "backend",
    "callbacks",
    "checkpoints",
    "data",
    "distribution",
    "export",
    "hub",
    "layers",
    "losses",
    "losses_sparse",
    "metrics",
    "models",
    "optimizers",
    "processes",
    "retrieval",
    "runtime",
    "serving",
    "text",
    "tracking",
)

__all__ = [*_SUBMODULES, "tune_allocator"]


def tune_allocator():
    """Makes glibc's malloc reuse large blocks; see `kbert.runtime.tune_allocator`.

    Returns:
        A dict: `"applied"` (bool) and `"reason"` (what was done, or why not).
    """
    from kbert import runtime

    return runtime.tune_allocator()


def __getattr__(name):
    if name in _SUBMODULES:
        # Imports the subpackage, which binds it as an attribute of this module.
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_SUBMODULES))
