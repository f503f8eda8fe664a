"""Readers and writers of BERT checkpoints: kbert presets, Hugging Face, Google TF, keras-hub."""

from kbert.checkpoints.kbert_preset import save_preset
from kbert.checkpoints.loading import detect_format, installed_presets_dir, load_model

__all__ = ["detect_format", "installed_presets_dir", "load_model", "save_preset"]
