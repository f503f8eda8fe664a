"""kbert.text."""
