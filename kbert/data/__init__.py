"""kbert.data."""
