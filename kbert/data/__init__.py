"""kbert.data: tf.data pipelines for pretraining and fine-tuning, and dataset readers."""

from kbert.data.pretraining import pretraining_dataset, read_documents, split_sentences

__all__ = [
    "pretraining_dataset",
    "read_documents",
    "split_sentences",
]
