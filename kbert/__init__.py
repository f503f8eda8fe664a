"""kbert: BERT for Keras 3 on TensorFlow, JAX and PyTorch.

Subpackages:
    kbert.layers       Keras layers (embeddings, attention, encoder block, heads).
    kbert.models       BertBackbone, BertPretrainer, task models, presets.
    kbert.text         WordPiece tokenizer identical to the reference, input packer.
    kbert.data         Dataset readers, SQuAD / tagging features, tf.data pretraining pipeline.
    kbert.metrics      MCC, Pearson/Spearman, entity F1, SQuAD EM/F1.
    kbert.checkpoints  Readers/writers for HF, Google TF and keras-hub checkpoints.
    kbert.callbacks    Resumable training: atomic backups every N steps, exact resume.
    kbert.export       SavedModel (raw strings in, tokenizer in the graph) and ONNX export.
    kbert.distribution Data- and model-parallel training (keras.distribution) with BERT layouts.
    kbert.tracking     Record a run: per-step loss, dev scores per epoch, metrics.json, curve PNG.

TensorFlow is optional: everything runs with Keras on JAX or PyTorch alone except the tf.data
pipelines, the tokenizer inside a tf.data graph and Google TF checkpoints, which raise one clear
error naming `pip install "kbert[tensorflow]"` when it is missing.
"""

__version__ = "0.1.0"

# First: glibc malloc reuses large blocks across training steps (see kbert/runtime.py).
from kbert import runtime  # noqa: F401  (isort: skip)
from kbert.startup import quiet_native_startup  # Standard library only.

# Keras (and TensorFlow, where installed) start here: the known start-up notices TensorFlow/XLA
# write from C++ on a CPU machine (oneDNN, cudart, cuInit) are dropped, every other line kept.
with quiet_native_startup():
    from kbert import callbacks, checkpoints, data, distribution, export, layers, metrics, models, text
    from kbert import tracking

    import keras as _keras

    if _keras.backend.backend() == "tensorflow":
        import tensorflow as _tf

        _tf.config.list_physical_devices()  # Device discovery (cuInit on a CPU machine) prints here.
        del _tf
    del _keras
