"""kbert.metrics: evaluation metrics for the BERT fine-tuning tasks.

Plain functions (numpy / Python in, float or dict out) score whole prediction
sets; the Keras metrics accumulate over batches in `model.compile(metrics=...)`
on the TensorFlow, JAX and PyTorch backends.

| Task                | Function                               | Keras metric            |
| ------------------- | -------------------------------------- | ----------------------- |
| SST-2, RTE, QNLI... | `accuracy`                             | `Accuracy`              |
| MRPC, QQP           | `f1_score` (binary / macro)            | `F1Score`               |
| CoLA                | `matthews_corrcoef`                    | `MatthewsCorrelation`   |
| STS-B               | `pearson_corr`, `spearman_corr`        | `PearsonCorrelation`, `SpearmanCorrelation` (buffered) |
| CoNLL NER           | `entity_f1` (conlleval)                | -                       |
| SQuAD v1.1 / v2.0   | `squad_scores`                         | -                       |
"""  # noqa: E501

from kbert.metrics.classification import (
    Accuracy,
    F1Score,
    MatthewsCorrelation,
    accuracy,
    f1_score,
    matthews_corrcoef,
)
from kbert.metrics.correlation import (
    PearsonCorrelation,
    SpearmanCorrelation,
    average_ranks,
    pearson_corr,
    spearman_corr,
)
from kbert.metrics.squad import normalize_answer, squad_scores
from kbert.metrics.tagging import entity_f1, extract_entities

__all__ = [
    "Accuracy",
    "F1Score",
    "MatthewsCorrelation",
    "PearsonCorrelation",
    "SpearmanCorrelation",
    "accuracy",
    "average_ranks",
    "entity_f1",
    "extract_entities",
    "f1_score",
    "matthews_corrcoef",
    "normalize_answer",
    "pearson_corr",
    "spearman_corr",
    "squad_scores",
]
