"""BertClassifier: sentence and sentence-pair classification or regression on the [CLS] vector."""

import keras
import numpy as np

from kbert.layers.dropout import HashDropout
from kbert.models.pipeline import check_class_ids
from kbert.models.task import BertTask


@keras.saving.register_keras_serializable(package="kbert")
class BertClassifier(BertTask):
    """BERT for sequence classification: pooled [CLS] output -> dropout -> dense logits.

    One head serves the GLUE family: single sentences (SST-2, CoLA) and pairs (MRPC, RTE,
    QNLI) as classification with `num_classes >= 2` (softmax cross-entropy), regression with
    `num_classes=1` (mean squared error, STS-B), and multi-label classification with
    `multi_label=True` (one sigmoid per class, binary cross-entropy). The model returns logits
    `(batch_size, num_classes)`; the loss lives in `compile`.

    Inputs are the backbone's dict (`token_ids`, `segment_ids`, `padding_mask`), or, with a
    `preprocessor` attached (automatic with `from_preset` on a source that has a vocabulary),
    raw strings or `(first, second)` pairs of string batches. Labels are integer class ids in
    `[0, num_classes)` (checked before training), floats for regression, or multi-hot rows
    `(batch_size, num_classes)` of 0/1 for multi-label.

    The model comes compiled with BERT's fine-tuning recipe (`compile()`; change its
    settings with e.g. `compile(learning_rate=2e-5)`): AdamW at 5e-5, weight decay 0.01
    except LayerNorm and biases, gradients clipped to norm 1, 10 % linear warm-up then linear
    decay to 0 over each `fit` call (see `kbert.models.task`);
    metrics: accuracy (classification), binary accuracy at logit 0 (multi-label), Pearson
    correlation (regression).

    The head loads from and exports to Hugging Face sequence-classification checkpoints (the
    label count and problem type travel in `config.json`) and loads from Google
    `run_classifier.py` ones (`kbert.checkpoints` names its weights in each format).

    Args:
        backbone: `kbert.models.BertBackbone`.
        num_classes: int. Number of classes; `1` means regression (unless `multi_label`).
        dropout: float. Dropout on the pooled output before the dense layer. Defaults to `0.1`.
        multi_label: bool. Independent sigmoid per class instead of a softmax. Defaults to `False`.
        preprocessor: `kbert.text.BertPreprocessor` or `None`. Defaults to `None`.
        learning_rate, weight_decay, warmup_ratio, total_steps: deprecated (a
            `DeprecationWarning`); pass them to `compile` (see `BertTask.compile`).

    Example:
    >>> backbone = kbert.models.BertBackbone(vocabulary_size=9, num_layers=1, num_heads=2,
    ...                                      hidden_dim=16, intermediate_dim=32)
    >>> classifier = BertClassifier(backbone, num_classes=2)
    >>> x = {"token_ids": np.array([[2, 5, 6, 3]]), "segment_ids": np.zeros((1, 4), "int32"),
    ...      "padding_mask": np.ones((1, 4), "int32")}
    >>> history = classifier.fit(x, np.array([1]), epochs=1, verbose=0)
    >>> classifier.predict(x, verbose=0).shape
    (1, 2)
    >>> # From a checkpoint with a vocabulary: raw strings.
    >>> tokenizer = kbert.text.BertTokenizer(
    ...     ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "good", "dull", "film"])
    >>> backbone.save_to_preset("my_bert", tokenizer=tokenizer)
    >>> classifier = BertClassifier.from_preset("my_bert", num_classes=2)
    >>> history = classifier.fit(["a good film", "a dull film"], [1, 0], batch_size=2, verbose=0)
    >>> classifier.predict([("A film.", "A good film.")], verbose=0).shape  # pairs work too
    (1, 2)

    Reference: Devlin et al., 2018, section 4.1 (GLUE fine-tuning).
    """

    def __init__(
        self,
        backbone,
        num_classes,
        dropout=0.1,
        multi_label=False,
        preprocessor=None,
        learning_rate=None,
        weight_decay=None,
        warmup_ratio=None,
        total_steps=None,
        **kwargs,
    ):
        self._check_backbone(backbone, "BertClassifier")
        if (
            not isinstance(num_classes, (int, np.integer))
            or isinstance(num_classes, bool)
            or num_classes < 1
        ):
            raise ValueError(
                f"`num_classes` must be a positive integer. Received: num_classes={num_classes!r}"
            )
        if (
            isinstance(dropout, bool)
            or not isinstance(dropout, (int, float))
            or not 0 <= dropout < 1
        ):
            raise ValueError(f"`dropout` must be a number in [0, 1). Received: dropout={dropout!r}")
        if not isinstance(multi_label, bool):
            raise ValueError(
                f"`multi_label` must be True or False. Received: multi_label={multi_label!r}"
            )
        num_classes = int(num_classes)

        # === Layers ===
        output_dropout = HashDropout(
            dropout, dtype=backbone.dtype_policy, name="classifier_dropout"
        )
        output_dense = keras.layers.Dense(
            num_classes,
            kernel_initializer=keras.initializers.TruncatedNormal(stddev=0.02),
            dtype=backbone.dtype_policy,
            name="classifier",
        )

        # === Functional model ===
        inputs = dict(backbone.input)
        # The head reads [CLS] alone: the last block computes that row only.
        pooled = backbone(inputs, first_token_only=True)["pooled_output"]  # (batch, hidden)
        logits = output_dense(output_dropout(pooled))  # (batch, num_classes)
        super().__init__(
            inputs=inputs,
            outputs=logits,
            backbone=backbone,
            preprocessor=preprocessor,
            learning_rate=learning_rate,
            weight_decay=weight_decay,
            warmup_ratio=warmup_ratio,
            total_steps=total_steps,
            **kwargs,
        )
        self.output_dropout = output_dropout
        self.output_dense = output_dense

        # === Config ===
        self.num_classes = num_classes
        self.dropout = dropout
        self.multi_label = bool(multi_label)

        # === Default compile ===
        self.compile()

    def _lean_head_layers(self):
        return (self.output_dropout, self.output_dense)

    def _lean_head(self, calls, inputs, training):
        """The graph's computation on eager torch (`kbert.backend.lean_task_outputs`)."""
        pooled = calls.backbone(self, inputs, training, first_token_only=True)["pooled_output"]
        return calls.dense(self.output_dense, calls.dropout(self.output_dropout, pooled, training))

    @property
    def is_regression(self):
        """True when the head is a single regression output (`num_classes=1`, not multi-label)."""
        return self.num_classes == 1 and not self.multi_label

    def _default_loss(self):
        if self.is_regression:
            return keras.losses.MeanSquaredError(name="mse")
        if self.multi_label:
            return keras.losses.BinaryCrossentropy(from_logits=True, name="bce")
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True, name="cross_entropy")

    def _default_metrics(self):
        if self.is_regression:
            from kbert.metrics.correlation import PearsonCorrelation

            return [PearsonCorrelation(name="pearson")]
        if self.multi_label:
            return [keras.metrics.BinaryAccuracy(threshold=0.0, name="accuracy")]
        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]

    def _check_labels(self, y):
        """Checks the labels; class ids come back as int32."""
        labels = np.asarray(y)
        if self.is_regression:
            if labels.dtype.kind not in "biuf":
                raise ValueError(
                    "Regression labels (num_classes=1) must be numbers. "
                    f"Received dtype {labels.dtype}"
                )
            finite = np.isfinite(labels.astype("float64"))
            if not finite.all():
                where = np.argwhere(~finite)[:5].tolist()
                raise ValueError(
                    "Regression labels must be finite numbers (a NaN or infinite label makes the "
                    f"loss and then every weight NaN). Received {int((~finite).sum())} non-finite "
                    f"labels, e.g. {labels[~finite][:5].tolist()} at rows {where}"
                )
            return y
        if self.multi_label:
            if labels.ndim != 2 or labels.shape[1] != self.num_classes:
                raise ValueError(
                    "Multi-label targets must be an array (num_examples, num_classes) = "
                    f"(n, {self.num_classes}) of 0/1. Received shape {labels.shape}"
                )
            bad = ~np.isin(labels, (0, 1))
            if bad.any():
                raise ValueError(
                    "Multi-label targets must be 0 or 1. "
                    f"Received values {sorted(set(np.unique(labels[bad]).tolist()))[:10]}"
                )
            return y
        check_class_ids(labels, self.num_classes, "labels")
        return labels.astype("int32")

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_classes": self.num_classes,
                "dropout": self.dropout,
                "multi_label": self.multi_label,
            }
        )
        return config
