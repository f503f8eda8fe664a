"""Keras layers of BERT, written with keras.ops only (TensorFlow, JAX and PyTorch)."""

from kbert.layers.attention import BertSelfAttention
from kbert.layers.dropout import HashDropout
from kbert.layers.embeddings import BertEmbeddings, ReversibleEmbedding
from kbert.layers.encoder import TransformerEncoder
from kbert.layers.heads import (
    BertPooler,
    ChoiceLogits,
    ContextSpanLogits,
    EmbeddingPooling,
    FlattenChoices,
    MaskedLMHead,
    NextSentenceHead,
)
from kbert.layers.sparse import SpladePooling
from kbert.layers.utils import get_activation

__all__ = [
    "BertEmbeddings",
    "BertPooler",
    "BertSelfAttention",
    "ChoiceLogits",
    "ContextSpanLogits",
    "EmbeddingPooling",
    "FlattenChoices",
    "HashDropout",
    "MaskedLMHead",
    "NextSentenceHead",
    "ReversibleEmbedding",
    "SpladePooling",
    "TransformerEncoder",
    "get_activation",
]
