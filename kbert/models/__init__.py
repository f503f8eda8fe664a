"""kbert models: the backbone, the pretrainer, task models, presets and the optimizer."""

from kbert.models.backbone import BertBackbone
from kbert.models.classifier import BertClassifier
from kbert.models.lamb import Lamb, lamb_large_batch_settings
from kbert.models.optimization import BertAdamW, WarmupLinearDecay, bert_optimizer
from kbert.models.presets import BACKBONE_PRESETS
from kbert.models.pretrainer import BertPretrainer
from kbert.models.question_answerer import BertQuestionAnswerer
from kbert.models.tagger import BertTagger
from kbert.models.task import BertTask
from kbert.models.text_embedder import BertTextEmbedder

__all__ = [
    "BACKBONE_PRESETS",
    "BertAdamW",
    "BertBackbone",
    "BertClassifier",
    "BertPretrainer",
    "BertQuestionAnswerer",
    "BertTagger",
    "BertTask",
    "BertTextEmbedder",
    "Lamb",
    "WarmupLinearDecay",
    "bert_optimizer",
    "lamb_large_batch_settings",
]
