"""Readers and writers of BERT checkpoints: kbert presets, Hugging Face, Google TF, keras-hub."""

from kbert.checkpoints._weights import LoadReport
from kbert.checkpoints.atomic import atomic_directory, atomic_write_bytes, atomic_write_text
from kbert.checkpoints.google import load_weights as load_google_weights
from kbert.checkpoints.huggingface import export_to_huggingface
from kbert.checkpoints.huggingface import load_weights as load_huggingface_weights
from kbert.checkpoints.kbert_preset import read_preprocessor_settings, save_preset
from kbert.checkpoints.keras_hub import load_weights as load_keras_hub_weights
from kbert.checkpoints.loading import (
    detect_format,
    installed_presets_dir,
    load_checkpoint,
    load_model,
)
from kbert.checkpoints.safetensors_io import read_safetensors
from kbert.checkpoints.sentence_transformers import export_to_sentence_transformers
from kbert.checkpoints.sparse_encoder import export_to_sparse_encoder
from kbert.checkpoints.vocabulary import read_vocabulary

__all__ = [
    "LoadReport",
    "atomic_directory",
    "atomic_write_bytes",
    "atomic_write_text",
    "detect_format",
    "export_to_huggingface",
    "export_to_sentence_transformers",
    "export_to_sparse_encoder",
    "installed_presets_dir",
    "load_checkpoint",
    "load_google_weights",
    "load_huggingface_weights",
    "load_keras_hub_weights",
    "load_model",
    "read_preprocessor_settings",
    "read_safetensors",
    "read_vocabulary",
    "save_preset",
]
