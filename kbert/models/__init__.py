"""kbert.models."""
