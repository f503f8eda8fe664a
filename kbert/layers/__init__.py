"""kbert.layers."""
