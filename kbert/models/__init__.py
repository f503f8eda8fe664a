"""kbert models: the backbone, the pretrainer, task models, presets and the optimizer."""

from kbert.models.backbone import BertBackbone
from kbert.models.optimization import WarmupLinearDecay, bert_optimizer
from kbert.models.presets import BACKBONE_PRESETS
from kbert.models.pretrainer import BertPretrainer

__all__ = [
    "BACKBONE_PRESETS",
    "BertBackbone",
    "BertPretrainer",
    "WarmupLinearDecay",
    "bert_optimizer",
]
