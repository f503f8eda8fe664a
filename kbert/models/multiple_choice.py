"""BertMultipleChoice: the best of several endings (SWAG, HellaSwag), one score per pair."""

import keras
import numpy as np

from kbert.backend.tensorflow import is_dataset
from kbert.layers.dropout import HashDropout
from kbert.layers.heads import ChoiceLogits, FlattenChoices
from kbert.models.backbone import BACKBONE_INPUTS
from kbert.models.pipeline import check_class_ids, dataset_has_strings, is_raw_text
from kbert.models.task import BertTask


def is_choice_rows(x):
    """True for raw multiple-choice rows: a `(contexts, choices)` tuple whose `choices` holds
    one sequence of choice strings per context (a list of lists, or a 2-D array of strings)."""
    if not isinstance(x, tuple) or len(x) != 2:
        return False
    choices = x[1]
    if isinstance(choices, np.ndarray):
        return choices.ndim == 2 or (
            choices.ndim == 1
            and choices.dtype.kind == "O"
            and any(isinstance(c, (list, tuple, np.ndarray)) for c in choices)
        )
    return isinstance(choices, (list, tuple)) and any(
        isinstance(c, (list, tuple, np.ndarray)) for c in choices
    )


def _as_string(value, where):
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    if not isinstance(value, str):
        raise ValueError(f"Expected strings. {where} is of type {type(value).__name__}: {value!r}")
    return value


def read_choice_rows(x, num_choices=None):
    """`(contexts, choices)` raw rows -> `(contexts, choices, counts)`: lists of `str`, one list
    of choice strings per row, and the number of choices of each row.

    Raises a ValueError naming the row for a non-string context or choice, an empty choice
    list, or (with `num_choices` set) a row with another number of choices.
    """
    contexts, choices = x
    if isinstance(contexts, (str, bytes)):
        raise ValueError(
            "BertMultipleChoice takes a batch of rows `(contexts, choices)`: a list of context "
            "strings and, per context, a list of choice strings. Received one string as "
            "`contexts`; wrap a single row as ([context], [[choice, ...]])."
        )
    contexts, choices = list(contexts), list(choices)
    if len(contexts) != len(choices):
        raise ValueError(
            "`contexts` and `choices` must have one entry per row. "
            f"Received: {len(contexts)} contexts and {len(choices)} choice lists"
        )
    if not contexts:
        raise ValueError("Received an empty batch of multiple-choice rows.")
    contexts = [_as_string(c, f"The context of row {i}") for i, c in enumerate(contexts)]
    rows = []
    for i, row in enumerate(choices):
        if isinstance(row, (str, bytes)) or not isinstance(row, (list, tuple, np.ndarray)):
            raise ValueError(
                f"The choices of row {i} must be a list of strings. Received "
                f"{type(row).__name__}: {row!r}"
            )
        row = [_as_string(c, f"Choice {j} of row {i}") for j, c in enumerate(list(row))]
        if not row:
            raise ValueError(f"Row {i} has an empty list of choices; every row needs at least one.")
        if num_choices is not None and len(row) != num_choices:
            raise ValueError(
                f"Row {i} has {len(row)} choices, but the model was built with "
                f"num_choices={num_choices}. Build it with num_choices=None to take rows with "
                "varying numbers of choices."
            )
        rows.append(row)
    return contexts, rows, np.array([len(row) for row in rows], "int64")


def check_choice_labels(labels, real_choices):
    """Raises a ValueError unless each label is the index of a real choice of its row.

    Args:
        labels: one integer per row.
        real_choices: bool array `(rows, width)`: which choices of each row are real.

    Returns:
        The labels as an int32 array.
    """
    labels = np.asarray(labels)
    rows, width = real_choices.shape
    if labels.shape != (rows,):
        raise ValueError(
            f"Expected one label per row: shape ({rows},). Received shape {labels.shape}"
        )
    check_class_ids(labels, width, "labels")
    labels = labels.astype("int64")
    bad = np.flatnonzero(~real_choices[np.arange(rows), labels])
    if bad.size:
        row = int(bad[0])
        count = int(real_choices[row].sum())
        raise ValueError(
            f"The label of row {row} is {int(labels[row])}, which is not one of its {count} "
            f"choices: labels must lie in [0, number of choices of the row) = [0, {count})."
        )
    return labels.astype("int32")


@keras.saving.register_keras_serializable(package="kbert")
class BertMultipleChoice(BertTask):
    """BERT for multiple choice: one score per (context, choice) pair, softmax over choices.

    Each choice is packed with its context as a sentence pair, `[CLS] context [SEP] choice
    [SEP]`, cut to the preprocessor's `sequence_length` by its `truncate` rule: by default
    the original BERT rule of `kbert.text.BertPacker` (the reference SWAG code's
    `_truncate_seq_pair`), which keeps other pieces than Hugging Face tokenizers'
    `"longest_first"` when both texts are longer than half the budget (the odd piece goes to
    the first text, not the longer). The `batch_size * num_choices` pairs go through the
    backbone as one batch, and the pooled `[CLS]` output -> dropout -> `Dense(1)` gives one
    score per pair. The model returns
    logits `(batch_size, num_choices)` in float32; the default loss is the softmax
    cross-entropy over a row's choices (`SparseCategoricalCrossentropy(from_logits=True)`),
    the metric accuracy. This is the SWAG model of the paper and Hugging Face's
    `BertForMultipleChoice`.

    Rows may have different numbers of choices (`num_choices=None`): rows are padded to the
    batch's widest with empty choices (all-zero `padding_mask`), whose logit is -1e9
    (`kbert.layers.heads.MASKED_LOGIT`; also what `predict` returns for them), so they get
    probability 0 and are never the argmax. With `num_choices` set, every row must have that
    many choices.

    Inputs: raw rows `(contexts, choices)` (with a `preprocessor`, automatic with
    `from_preset` on a source that has a vocabulary): `contexts` a list of strings,
    `choices` one list of choice strings per context; or the packed dict of `token_ids`,
    `segment_ids` and `padding_mask`, each `(batch_size, num_choices, sequence_length)`.
    Labels are the index of the right choice of each row, in `[0, number of choices of the
    row)` (checked before training). Inputs take the pipeline every task takes (length
    batching over the longest choice of each row, outputs in the caller's order).

    The head loads from and exports to Hugging Face `BertForMultipleChoice` directories
    (`kbert.checkpoints` names its weights). `export(path)` writes a SavedModel whose
    signatures take rows of strings, `serving_default(context, choices)` and
    `serve_padded(context, choices, choice_counts)` for rows with fewer choices, or packed
    `serve_ids`; `export(path, format="onnx")` ONNX with packed `(rows, choices, sequence)`
    inputs, dynamic axes (choices fixed by `num_choices`). See `kbert.export`.

    Args:
        backbone: `kbert.models.BertBackbone`.
        num_choices: int or `None`. Choices per row; `None` takes any number (padded
            choices masked). Defaults to `None`.
        dropout: float. Dropout on the pooled output before the dense layer. Defaults to `0.1`.
        preprocessor: `kbert.text.BertPreprocessor` or `None`. Defaults to `None`.

    Example:
    >>> tokenizer = kbert.text.BertTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
    ...     "the", "cat", "sat", "on", "mat", "flew", "away", "sang"])
    >>> backbone = kbert.models.BertBackbone(vocabulary_size=13, num_layers=1, num_heads=2,
    ...                                      hidden_dim=16, intermediate_dim=32)
    >>> backbone.save_to_preset("my_bert", tokenizer=tokenizer)
    >>> model = BertMultipleChoice.from_preset("my_bert")
    >>> contexts = ["the cat sat", "the cat"]
    >>> choices = [["on the mat", "flew away", "sang"], ["sat", "sang"]]  # 3 and 2 choices
    >>> history = model.fit((contexts, choices), [0, 0], batch_size=2, verbose=0)
    >>> logits = model.predict((contexts, choices), verbose=0)
    >>> logits.shape, float(logits[1, 2])  # the second row's padded third choice
    ((2, 3), -1000000000.0)

    Reference: Devlin et al., 2018, section 4.4 (SWAG).
    """

    packed_input_ndim = 3

    def __init__(self, backbone, num_choices=None, dropout=0.1, preprocessor=None, **kwargs):
        self._check_backbone(backbone, "BertMultipleChoice")
        if num_choices is not None and (
            isinstance(num_choices, bool)
            or not isinstance(num_choices, (int, np.integer))
            or num_choices < 1
        ):
            raise ValueError(
                "`num_choices` must be a positive integer or None. "
                f"Received: num_choices={num_choices!r}"
            )
        if (
            isinstance(dropout, bool)
            or not isinstance(dropout, (int, float))
            or not 0 <= dropout < 1
        ):
            raise ValueError(f"`dropout` must be a number in [0, 1). Received: dropout={dropout!r}")
        num_choices = None if num_choices is None else int(num_choices)

        # === Layers ===
        flatten_choices = FlattenChoices(name="flatten_choices")
        output_dropout = HashDropout(
            dropout, dtype=backbone.dtype_policy, name="multiple_choice_dropout"
        )
        output_dense = keras.layers.Dense(
            1,
            kernel_initializer=keras.initializers.TruncatedNormal(stddev=0.02),
            dtype=backbone.dtype_policy,
            name="classifier",
        )
        choice_logits = ChoiceLogits(name="choice_logits")

        # === Functional model ===
        inputs = {
            name: keras.Input(shape=(num_choices, None), dtype="int32", name=name)
            for name in BACKBONE_INPUTS
        }  # each (batch, choices, seq)
        pairs = flatten_choices(inputs)  # each (batch * choices, seq)
        # (batch * choices, hidden); the last block computes the [CLS] row only.
        pooled = backbone(pairs, first_token_only=True)["pooled_output"]
        scores = output_dense(output_dropout(pooled))  # (batch * choices, 1)
        logits = choice_logits(scores, inputs["padding_mask"])  # (batch, choices)
        super().__init__(
            inputs=inputs, outputs=logits, backbone=backbone, preprocessor=preprocessor, **kwargs
        )
        self.flatten_choices = flatten_choices
        self.output_dropout = output_dropout
        self.output_dense = output_dense
        self.choice_logits = choice_logits

        # === Config ===
        self.num_choices = num_choices
        self.dropout = dropout

        # === Default compile ===
        self.compile()

    def _lean_head_layers(self):
        return (self.flatten_choices, self.output_dropout, self.output_dense, self.choice_logits)

    def _lean_head(self, calls, inputs, training):
        """The graph's computation on eager torch (`kbert.backend.lean_task_outputs`)."""
        pairs = calls.weightless(self.flatten_choices, inputs)
        pooled = calls.backbone(self, pairs, training, first_token_only=True)["pooled_output"]
        scores = calls.dense(
            self.output_dense, calls.dropout(self.output_dropout, pooled, training)
        )
        return calls.weightless(self.choice_logits, scores, inputs["padding_mask"])

    def _default_loss(self):
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True, name="cross_entropy")

    def _default_metrics(self):
        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]

    def _sequence_outputs(self):
        # The logits' axis 1 is the choices, the same for every batch of one call.
        return False

    # ------------------------------------------------------------------ raw input
    def _pack_rows(self, x):
        """Raw `(contexts, choices)` rows -> packed arrays `(rows, width, seq)` and the bool
        `(rows, width)` of real choices; every pair is packed by the preprocessor's packer."""
        self._require_preprocessor("raw (contexts, choices) rows")
        contexts, choices, counts = read_choice_rows(x, self.num_choices)
        firsts = [context for context, row in zip(contexts, choices) for _ in row]
        seconds = [choice for row in choices for choice in row]
        pairs = self._preprocess_text((firsts, seconds))  # each (pairs, seq)
        width = self.num_choices or int(counts.max())
        real = np.arange(width)[None, :] < counts[:, None]  # (rows, width)
        packed = {}
        for key, values in pairs.items():
            array = np.zeros((len(contexts), width, values.shape[-1]), values.dtype)
            array[real] = values  # row-major: the pairs of row 0, then row 1, ...
            packed[key] = array
        return packed, real

    def _check_packed(self, x):
        """The bool `(rows, choices)` of real choices of packed inputs (checked in shape)."""
        mask = np.asarray(x["padding_mask"])
        if mask.ndim != 3:
            raise ValueError(
                "BertMultipleChoice takes packed inputs of shape (batch_size, num_choices, "
                f"sequence_length). Received `padding_mask` of shape {mask.shape}"
            )
        if self.num_choices is not None and mask.shape[1] != self.num_choices:
            raise ValueError(
                f"The packed inputs have {mask.shape[1]} choices per row, but the model was built "
                f"with num_choices={self.num_choices}."
            )
        real = mask.any(axis=-1)
        empty = np.flatnonzero(~real.any(axis=1))
        if empty.size:
            raise ValueError(f"Row {int(empty[0])} has no real choice (all-zero `padding_mask`).")
        return real

    def preprocess_samples(self, x, y=None, sample_weight=None, mode="fit", batch_size=None):
        """Raw `(contexts, choices)` rows or packed 3-D dicts -> packed arrays; labels checked
        against each row's real choices (see the class docstring)."""
        if is_dataset(x):
            if dataset_has_strings(x):
                raise ValueError(
                    "BertMultipleChoice cannot map a tf.data.Dataset of strings: pass the raw "
                    "rows `(contexts, choices)` as Python lists, or a dataset of packed "
                    "(batch_size, num_choices, sequence_length) inputs."
                )
            return x, y, sample_weight
        if is_choice_rows(x):
            x, real = self._pack_rows(x)
        elif is_raw_text(x):
            raise ValueError(
                "BertMultipleChoice takes raw rows `(contexts, choices)`: a list of context "
                "strings and, per context, a list of choice strings (e.g. "
                '(["A man sits."], [["He stands.", "He eats."]])). Received strings without '
                "per-row choice lists."
            )
        elif isinstance(x, dict) and "padding_mask" in x:
            real = self._check_packed(x)
        else:
            real = None
        if y is not None and not is_dataset(y) and real is not None:
            y = check_choice_labels(y, real)
        return x, y, sample_weight

    # ------------------------------------------------------------------ export
    @property
    def packed_input_axes(self):
        """The packed inputs' axes, `(name, fixed size or None)` each, for `kbert.export`'s
        serving signatures and ONNX axes: rows, choices (fixed with `num_choices`), sequence."""
        return (("batch", None), ("choices", self.num_choices), ("sequence", None))

    def get_config(self):
        config = super().get_config()
        config.update({"num_choices": self.num_choices, "dropout": self.dropout})
        return config
