"""kbert.checkpoints."""
