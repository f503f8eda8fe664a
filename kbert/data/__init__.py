"""kbert.data: tf.data pipelines for pretraining and fine-tuning, and dataset readers.

The readers and the SQuAD / tagging preprocessing are plain Python and NumPy. The pretraining
pipeline is `tf.data` and needs TensorFlow (`pip install "kbert[tensorflow]"`): its names are
imported on first use, so `import kbert.data` works without TensorFlow and asking for them
without it raises one clear error.
"""

from kbert.backend import tensorflow
from kbert.data.glue_submission import (
    GLUE_SUBMISSION_FILES,
    glue_predictions,
    glue_submission_splits,
    write_glue_submission,
)
from kbert.data.readers import (
    GLUE_TASKS,
    GlueData,
    SquadExamples,
    glue_file_candidates,
    glue_test_splits,
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
from kbert.data.swag import MultipleChoiceData, read_hellaswag, read_swag
from kbert.data.tagging import TaggingFeatures, encode_tagging, words_from_token_predictions

__all__ = [
    "GLUE_SUBMISSION_FILES",
    "GLUE_TASKS",
    "GlueData",
    "MultipleChoiceData",
    "SquadExample",
    "SquadExamples",
    "SquadFeatures",
    "TaggingFeatures",
    "batch_by_length",
    "decode_squad_predictions",
    "encode_tagging",
    "glue_file_candidates",
    "glue_predictions",
    "glue_submission_splits",
    "glue_test_splits",
    "iob1_to_iob2",
    "label_list",
    "packed_pretraining_dataset",
    "prepare_squad_features",
    "pretraining_dataset",
    "read_conll",
    "read_documents",
    "read_glue",
    "read_hellaswag",
    "read_shard_metadata",
    "read_squad",
    "read_swag",
    "split_sentences",
    "vocabulary_digest",
    "words_from_token_predictions",
    "write_glue_submission",
    "write_pretraining_shards",
]

# Names that live in modules needing TensorFlow, imported on first access.
_TENSORFLOW_NAMES = {
    "batch_by_length": "kbert.data.batching",
    "packed_pretraining_dataset": "kbert.data.packing",
    "pretraining_dataset": "kbert.data.pretraining",
    "read_documents": "kbert.data.documents",
    "split_sentences": "kbert.data.documents",
    "read_shard_metadata": "kbert.data.shards",
    "vocabulary_digest": "kbert.data.shards",
    "write_pretraining_shards": "kbert.data.shards",
}


def __getattr__(name):
    if name in _TENSORFLOW_NAMES:
        import importlib

        tensorflow.tensorflow(f"kbert.data.{name}")
        module = importlib.import_module(_TENSORFLOW_NAMES[name])
        value = getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kbert.data' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_TENSORFLOW_NAMES))
