"""kbert's optimizers: BERT's AdamW recipe with its warm-up / linear-decay schedule, and LAMB.

Modules:
    optimization  `WarmupLinearDecay`, `BertAdamW` (epsilon placed as `torch.optim.AdamW`
                  places it) and `bert_optimizer`, BERT's recipe in one call.
    lamb          `Lamb` and `lamb_large_batch_settings` for large-batch pretraining.
    slots         `SlotIndex`: where each variable's optimizer slots are.
"""

from kbert.optimizers.lamb import Lamb, lamb_large_batch_settings
from kbert.optimizers.optimization import BertAdamW, WarmupLinearDecay, bert_optimizer

__all__ = [
    "BertAdamW",
    "Lamb",
    "WarmupLinearDecay",
    "bert_optimizer",
    "lamb_large_batch_settings",
]
