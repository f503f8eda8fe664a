"""kbert.text: WordPiece tokenizer identical to the reference, input packer,
preprocessor and vocabulary training."""

from kbert.text.packer import BertPacker
from kbert.text.preprocessor import BertPreprocessor
from kbert.text.tokenizer import BertTokenizer
from kbert.text.vocabulary import train_wordpiece_vocabulary

__all__ = [
    "BertTokenizer",
    "BertPacker",
    "BertPreprocessor",
    "train_wordpiece_vocabulary",
]
