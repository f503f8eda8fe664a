"""kbert.data: tf.data pipelines for pretraining and fine-tuning, and dataset readers."""

from kbert.data.pretraining import pretraining_dataset, read_documents, split_sentences
from kbert.data.readers import (
    GLUE_TASKS,
    GlueData,
    SquadExamples,
    iob1_to_iob2,
    label_list,
    read_conll,
    read_glue,
    read_squad,
)

__all__ = [
    "GLUE_TASKS",
    "GlueData",
    "SquadExamples",
    "iob1_to_iob2",
    "label_list",
    "pretraining_dataset",
    "read_conll",
    "read_documents",
    "read_glue",
    "read_squad",
    "split_sentences",
]
