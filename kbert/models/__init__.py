"""kbert models: the backbone, the pretrainer, task models and presets.

The optimizers moved to `kbert.optimizers`; their names here (`BertAdamW`, `WarmupLinearDecay`,
`bert_optimizer`, `Lamb`, `lamb_large_batch_settings`) still work for one release, with a
`DeprecationWarning`.
"""

import warnings

from kbert.models.backbone import BertBackbone
from kbert.models.classifier import BertClassifier
from kbert.models.cross_encoder import BertCrossEncoder
from kbert.models.multiple_choice import BertMultipleChoice
from kbert.models.presets import BACKBONE_PRESETS
from kbert.models.pretrainer import BertPretrainer
from kbert.models.question_answerer import BertQuestionAnswerer
from kbert.models.sparse_encoder import BertSparseEncoder
from kbert.models.tagger import BertTagger
from kbert.models.task import BertTask
from kbert.models.text_embedder import BertTextEmbedder

__all__ = [
    "BACKBONE_PRESETS",
    "BertBackbone",
    "BertClassifier",
    "BertCrossEncoder",
    "BertMultipleChoice",
    "BertPretrainer",
    "BertQuestionAnswerer",
    "BertSparseEncoder",
    "BertTagger",
    "BertTask",
    "BertTextEmbedder",
]

# Names that moved to `kbert.optimizers`, offered here for one release.
_MOVED_TO_OPTIMIZERS = (
    "BertAdamW",
    "Lamb",
    "WarmupLinearDecay",
    "bert_optimizer",
    "lamb_large_batch_settings",
)


def __getattr__(name):
    if name in _MOVED_TO_OPTIMIZERS:
        warnings.warn(
            f"`kbert.models.{name}` moved to `kbert.optimizers.{name}`; the old name will be "
            "removed in the next release.",
            DeprecationWarning,
            stacklevel=2,
        )
        from kbert import optimizers

        return getattr(optimizers, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
