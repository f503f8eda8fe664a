"""kbert.metrics."""
