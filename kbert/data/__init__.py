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
from kbert.data.squad import (
    SquadExample,
    SquadFeatures,
    decode_squad_predictions,
    prepare_squad_features,
)
from kbert.data.tagging import TaggingFeatures, encode_tagging, words_from_token_predictions

__all__ = [
    "GLUE_TASKS",
    "GlueData",
    "SquadExample",
    "SquadExamples",
    "SquadFeatures",
    "TaggingFeatures",
    "decode_squad_predictions",
    "encode_tagging",
    "iob1_to_iob2",
    "label_list",
    "prepare_squad_features",
    "pretraining_dataset",
    "read_conll",
    "read_documents",
    "read_glue",
    "read_squad",
    "split_sentences",
    "words_from_token_predictions",
]
