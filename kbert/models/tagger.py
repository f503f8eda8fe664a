"""BertTagger: per-token classification (named-entity recognition, part-of-speech tagging)."""

import keras
import numpy as np

from kbert.backend.tensorflow import is_dataset
from kbert.layers.dropout import HashDropout
from kbert.models.pipeline import check_class_ids, dataset_has_strings, is_raw_text
from kbert.models.task import BertTask


def _is_word_batch(x):
    """True for raw tagging input: a list of sentences, each a string or a list of word strings."""
    if isinstance(x, np.ndarray) and x.dtype == object and x.size:
        x = x.tolist()
    if not isinstance(x, (list, tuple)) or not x:
        return False
    first = x[0]
    if isinstance(first, (str, bytes)):
        return True
    if isinstance(first, np.ndarray):
        first = first.tolist()
    return isinstance(first, (list, tuple)) and (not first or isinstance(first[0], (str, bytes)))


@keras.saving.register_keras_serializable(package="kbert")
class BertTagger(BertTask):
    """BERT for token classification: sequence output -> dropout -> dense logits per token.

    The model returns logits `(batch_size, sequence_length, num_classes)`. It is trained on
    word-level labels aligned to WordPieces the way the BERT paper does for CoNLL-2003: each
    word's first piece carries the word's label, the other pieces, `[CLS]`, `[SEP]` and
    padding get sample weight 0. The default loss is the cross-entropy averaged over the
    labelled pieces (as Hugging Face's `ignore_index=-100`), the metric the accuracy over them.

    Inputs: with a `preprocessor` attached (automatic with `from_preset` on a source with a
    vocabulary), `fit` / `evaluate` take sentences as lists of words (or strings, split on
    whitespace) with one label per word: label names (mapped with `labels`) or integer ids;
    the preprocessor's tokenizer and `sequence_length` are used (see `kbert.data.tagging`).
    `predict_words` returns one label per word. Without a preprocessor, packed dicts with
    token-level labels `(batch, sequence_length)` and sample weights, e.g. from
    `kbert.data.tagging.encode_tagging`.

    The head loads from and exports to Hugging Face token-classification checkpoints
    (`id2label` in `config.json` gives `labels`; `kbert.checkpoints` names the weights).

    Args:
        backbone: `kbert.models.BertBackbone`.
        num_classes: int or `None`. Number of tags; `None` takes `len(labels)`.
        labels: list of str or `None`. Tag names in id order (e.g. `["O", "B-PER", ...]`).
            Needed to train on, or predict, label names. Defaults to `None`.
        dropout: float. Dropout on the sequence output before the dense layer. Defaults to `0.1`.
        preprocessor: `kbert.text.BertPreprocessor` or `None`. Defaults to `None`.
        learning_rate, weight_decay, warmup_ratio, total_steps: deprecated (a
            `DeprecationWarning`); pass them to `compile` (see `BertTask.compile`).

    Example:
    >>> tokenizer = kbert.text.BertTokenizer(
    ...     ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "john", "smith", "sings"])
    >>> backbone = kbert.models.BertBackbone(vocabulary_size=8, num_layers=1, num_heads=2,
    ...                                      hidden_dim=16, intermediate_dim=32)
    >>> backbone.save_to_preset("my_bert", tokenizer=tokenizer)
    >>> tagger = BertTagger.from_preset("my_bert", labels=["O", "B-PER", "I-PER"])
    >>> tagger.compile(learning_rate=1e-2)
    >>> history = tagger.fit([["John", "Smith", "sings"]], [["B-PER", "I-PER", "O"]],
    ...                      epochs=30, verbose=0)
    >>> tagger.predict_words([["John", "Smith", "sings"]], verbose=0)  # one tag per word
    [['B-PER', 'I-PER', 'O']]

    Reference: Devlin et al., 2018, section 4.3 (CoNLL-2003 NER).
    """

    # Labels and sample weights are per token: length batching crops them with the inputs.
    sequence_targets = True

    def __init__(
        self,
        backbone,
        num_classes=None,
        labels=None,
        dropout=0.1,
        preprocessor=None,
        learning_rate=None,
        weight_decay=None,
        warmup_ratio=None,
        total_steps=None,
        **kwargs,
    ):
        self._check_backbone(backbone, "BertTagger")
        if labels is not None:
            labels = [str(label) for label in labels]
            duplicates = sorted({label for label in labels if labels.count(label) > 1})
            if duplicates or not labels:
                raise ValueError(
                    "`labels` must be a non-empty list of distinct tag names. "
                    f"Received: {labels!r} (duplicates: {duplicates})"
                )
            if num_classes is None:
                num_classes = len(labels)
            elif num_classes != len(labels):
                raise ValueError(
                    "`num_classes` must equal the number of `labels`. "
                    f"Received: num_classes={num_classes}, {len(labels)} labels"
                )
        if (
            not isinstance(num_classes, (int, np.integer))
            or isinstance(num_classes, bool)
            or num_classes < 1
        ):
            raise ValueError(
                "`num_classes` must be a positive integer (or give `labels`). "
                f"Received: num_classes={num_classes!r}"
            )
        if (
            isinstance(dropout, bool)
            or not isinstance(dropout, (int, float))
            or not 0 <= dropout < 1
        ):
            raise ValueError(f"`dropout` must be a number in [0, 1). Received: dropout={dropout!r}")
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
        sequence = backbone(inputs)["sequence_output"]  # (batch, seq, hidden)
        logits = output_dense(output_dropout(sequence))  # (batch, seq, num_classes)
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
        # The pooler is unused by this head (Hugging Face's task class has none): frozen, so
        # the optimizer neither tracks it nor warns about its missing gradients.
        backbone.pooler.trainable = False

        # === Config ===
        self.num_classes = num_classes
        self.labels = labels
        self.dropout = dropout

        # === Default compile ===
        self.compile()

    @property
    def label_to_id(self):
        """`{name: id}` for the tag names, or `None`."""
        return None if self.labels is None else {label: i for i, label in enumerate(self.labels)}

    def _lean_head_layers(self):
        return (self.output_dropout, self.output_dense)

    def _lean_head(self, calls, inputs, training):
        """The graph's computation on eager torch (`kbert.backend.lean_task_outputs`)."""
        sequence = calls.backbone(self, inputs, training)["sequence_output"]
        return calls.dense(
            self.output_dense, calls.dropout(self.output_dropout, sequence, training)
        )

    def _default_loss(self):
        return keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction="mean_with_sample_weight", name="cross_entropy"
        )

    def _default_weighted_metrics(self):
        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]

    # --------------------------------------------------------------- raw input
    @property
    def sequence_length(self):
        """Packed length used for raw word input: the preprocessor's, else 128."""
        return int(
            getattr(self.preprocessor, "sequence_length", None) or self.default_sequence_length
        )

    def encode(self, sentences, word_labels=None):
        """Word-split sentences (and word labels) -> `kbert.data.tagging.TaggingFeatures`."""
        from kbert.data.tagging import encode_tagging

        self._require_preprocessor("raw sentences")
        return encode_tagging(
            sentences,
            self.tokenizer,
            sequence_length=self.sequence_length,
            word_labels=word_labels,
            label_to_id=self.label_to_id,
            num_classes=self.num_classes,
        )

    def preprocess_samples(self, x, y=None, sample_weight=None, mode="fit", batch_size=None):
        """Words (and word labels) -> packed inputs with per-token labels and weights
        (`encode`); packed inputs keep their labels, checked as class ids."""
        if is_dataset(x):
            if self.preprocessor is not None and dataset_has_strings(x):
                raise ValueError(
                    "BertTagger takes raw sentences as Python lists (words and word labels), not "
                    "as a tf.data.Dataset of strings. Give lists, or a dataset of packed inputs "
                    "built with kbert.data.tagging.encode_tagging."
                )
            return x, y, sample_weight
        if _is_word_batch(x) or is_raw_text(x):
            if sample_weight is not None:
                raise ValueError(
                    "`sample_weight` cannot be combined with raw sentences: the tagger weights "
                    "the first piece of every word itself."
                )
            if mode != "predict" and y is None:
                raise ValueError(f"BertTagger.{mode} on raw sentences needs word labels `y`.")
            features = self.encode(x, y if mode != "predict" else None)
            return (
                features.inputs,
                features.labels,
                (features.sample_weight if mode != "predict" else None),
            )
        if y is not None:
            y = np.asarray(y)
            weights = None if sample_weight is None else np.asarray(sample_weight)
            if weights is not None and weights.shape == y.shape:
                # Positions with weight 0 may hold any filler (e.g. -100): make them a valid id.
                y = np.where(weights > 0, y, 0)
            check_class_ids(y, self.num_classes, "labels")
            y = y.astype("int32")
        return x, y, sample_weight

    def predict_words(self, sentences, batch_size=32, return_ids=False, verbose="auto"):
        """Predicts one tag per word.

        Args:
            sentences: list of sentences, each a list of words or a string (split on whitespace).
            batch_size: int. Defaults to `32`.
            return_ids: bool. Return class ids instead of label names. Defaults to `False`
                (names when the tagger has `labels`, else ids).
            verbose: Keras `predict` verbosity. Defaults to `"auto"`.

        Returns:
            list (per sentence) of lists (per word) of tag names or ids (`[]` for no
            sentences). Words that produce
            no WordPiece (only characters the tokenizer deletes) get `"O"` when that label
            exists, else the label with id 0.
        """
        from kbert.data.tagging import words_from_token_predictions

        if hasattr(sentences, "__len__") and len(sentences) == 0:
            return []  # No sentences, no tags (Keras' predict would fail on 0 rows).
        features = self.encode(sentences)
        logits = super().predict(features.inputs, batch_size=batch_size, verbose=verbose)
        fill = self.label_to_id.get("O", 0) if self.labels is not None else 0
        ids = words_from_token_predictions(np.asarray(logits).argmax(-1), features, fill_value=fill)
        if return_ids or self.labels is None:
            return ids
        return [[self.labels[i] for i in sentence] for sentence in ids]

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_classes": self.num_classes,
                "labels": None if self.labels is None else list(self.labels),
                "dropout": self.dropout,
            }
        )
        return config
