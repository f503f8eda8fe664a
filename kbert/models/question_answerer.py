"""BertQuestionAnswerer: extractive question answering (SQuAD v1.1 / v2.0) with span logits."""

import keras
import numpy as np

from kbert.backend.tensorflow import is_dataset
from kbert.layers.heads import MASKED_LOGIT, ContextSpanLogits
from kbert.models.pipeline import check_class_ids
from kbert.models.task import BertTask


def _is_example_list(x):
    return (
        isinstance(x, (list, tuple))
        and len(x) > 0
        and (isinstance(x[0], dict) or hasattr(x[0], "context"))
        and not isinstance(x[0], str)
    )


def _is_question_context_pair(x):
    if not isinstance(x, tuple) or len(x) != 2:
        return False
    first = x[0]
    if isinstance(first, str):
        return isinstance(x[1], str)
    if isinstance(first, np.ndarray):
        return first.dtype.kind in "OUS"
    return isinstance(first, list) and (not first or isinstance(first[0], str))


def _answers_for(y, count):
    """The `y` of raw `fit((questions, contexts), y)` as per-example answer lists."""
    if y is None:
        return [[] for _ in range(count)]
    if isinstance(y, dict) or len(y) != count:
        raise ValueError(
            "`y` must be a list with one answer per question: a dict "
            '{"text": str, "answer_start": int}, a list of such dicts, or None (no answer). '
            f"Received {type(y).__name__} of length {len(y) if hasattr(y, '__len__') else '?'} for "
            f"{count} questions"
        )
    out = []
    for answer in y:
        if answer is None or answer == "":
            out.append([])
        elif isinstance(answer, dict):
            out.append([answer])
        elif isinstance(answer, (list, tuple)):
            out.append(list(answer))
        else:
            raise ValueError(
                'Each answer must be a dict {"text": str, "answer_start": int}, a list of them, '
                f"or None. Received: {answer!r}"
            )
    return out


@keras.saving.register_keras_serializable(package="kbert")
class BertQuestionAnswerer(BertTask):
    """BERT for extractive question answering (SQuAD): a start and an end logit per token.

    The head is one dense layer of 2 units on the sequence output. The model returns a dict
    `{"start_logits", "end_logits"}`, each `(batch_size, sequence_length)` float32, masked to
    the context (segment 1, final `[SEP]` and padding excluded) plus `[CLS]` at position 0,
    which stands for "no answer in this window" (see `ContextSpanLogits`; `context_only=False`
    for Hugging Face's unmasked head). The default loss is
    the mean of the start and end cross-entropies; labels are
    `{"start_logits": start_index, "end_logits": end_index}`.

    Raw input (needs a tokenizer: a `preprocessor` attached, automatic with `from_preset` on a
    source with a vocabulary): `fit` / `evaluate` take SQuAD examples (dicts with `question`,
    `context`, `answers` = `[{"text", "answer_start"}]`, e.g. from `kbert.data.read_squad`) or
    `x=(questions, contexts)` with `y` = one answer dict per question; the examples are
    windowed by `kbert.data.squad.prepare_squad_features` with this model's
    `sequence_length`, `doc_stride` and `max_query_length` (answers that do not match the
    context at `answer_start` are reported and left out). `predict` on raw input returns the
    logits of every window (see `encode` for the windows). `answer(questions, contexts)` returns
    answer strings, always exact substrings of the contexts; `predict_answers(examples)` returns
    `{id: answer}` for SQuAD scoring. Decoding uses `n_best_size`, `max_answer_length`, the
    max-context window of each piece and, with `allow_no_answer` (SQuAD 2.0), the null-score
    threshold.

    The head loads from and exports to Hugging Face question-answering checkpoints and loads
    from Google `run_squad.py` ones (`kbert.checkpoints` names its weights in each format).

    Args:
        backbone: `kbert.models.BertBackbone`.
        preprocessor: `kbert.text.BertPreprocessor` or `None` (only its tokenizer is used).
            Defaults to `None`.
        sequence_length: int. Window length. Defaults to `384`, or the backbone's
            `max_sequence_length` when it has fewer positions.
        doc_stride: int. Pieces between window starts. Defaults to `128` (at most a third
            of `sequence_length`).
        max_query_length: int. Question length cap, in pieces. Defaults to `64` (at most a
            quarter of `sequence_length`).
        max_answer_length: int. Longest answer, in pieces. Defaults to `30`.
        n_best_size: int. Candidates per window in decoding. Defaults to `20`.
        allow_no_answer: bool. SQuAD 2.0 decoding (may answer `""`). Defaults to `False`.
        null_score_diff_threshold: float. Defaults to `0.0`.
        context_only: bool. Mask the logits outside the context (and `[CLS]`) to -1e9, so
            that training spends no probability on the question, `[SEP]` or padding. `False`
            gives the logits of Hugging Face's question-answering model everywhere and its
            training exactly (cross-entropy over all positions); decoding picks context
            spans either way. On the short SQuAD recipe of `BENCHMARKS.md` masking adds about
            10 F1 points. Defaults to `True`.
        learning_rate, weight_decay, warmup_ratio, total_steps: deprecated (a
            `DeprecationWarning`); pass them to `compile` (see `BertTask.compile`).

    Example:
    >>> tokenizer = kbert.text.BertTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
    ...     "who", "wrote", "it", "?", "was", "written", "by", "ann", "in", "1990", "."])
    >>> backbone = kbert.models.BertBackbone(vocabulary_size=16, num_layers=1, num_heads=2,
    ...                                      hidden_dim=16, intermediate_dim=32)
    >>> backbone.save_to_preset("my_bert", tokenizer=tokenizer)
    >>> qa = BertQuestionAnswerer.from_preset("my_bert")  # fit it on SQuAD (`read_squad`) first
    >>> context = "It was written by Ann in 1990."
    >>> answer = qa.answer(["Who wrote it?"], [context])[0]
    >>> answer in context  # the answer is a span of the context (untrained: any span)
    True

    Reference: Devlin et al., 2018, section 4.2 (SQuAD v1.1) and 4.3 (SQuAD v2.0).
    """

    default_learning_rate = 5e-5
    default_sequence_length = 384

    def __init__(
        self,
        backbone,
        preprocessor=None,
        sequence_length=None,
        doc_stride=None,
        max_query_length=None,
        max_answer_length=30,
        n_best_size=20,
        allow_no_answer=False,
        null_score_diff_threshold=0.0,
        context_only=True,
        learning_rate=None,
        weight_decay=None,
        warmup_ratio=None,
        total_steps=None,
        **kwargs,
    ):
        self._check_backbone(backbone, "BertQuestionAnswerer")
        self._check_unknown_arguments(kwargs)
        if sequence_length is None:
            sequence_length = min(self.default_sequence_length, backbone.max_sequence_length)
        if doc_stride is None and isinstance(sequence_length, int):
            doc_stride = min(128, max(1, sequence_length // 3))
        if max_query_length is None and isinstance(sequence_length, int):
            max_query_length = min(64, max(1, sequence_length // 4))
        for name, value in (
            ("sequence_length", sequence_length),
            ("doc_stride", doc_stride),
            ("max_query_length", max_query_length),
            ("max_answer_length", max_answer_length),
            ("n_best_size", n_best_size),
        ):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
        if sequence_length > backbone.max_sequence_length:
            raise ValueError(
                "`sequence_length` cannot exceed the backbone's learned positions. Received: "
                f"sequence_length={sequence_length}, backbone.max_sequence_length="
                f"{backbone.max_sequence_length}"
            )
        # === Layers ===
        span_dense = keras.layers.Dense(
            2,
            kernel_initializer=keras.initializers.TruncatedNormal(stddev=0.02),
            dtype=backbone.dtype_policy,
            name="qa_outputs",
        )
        span_logits = ContextSpanLogits(context_only=context_only, name="span_logits")

        # === Functional model ===
        inputs = dict(backbone.input)
        sequence = backbone(inputs)["sequence_output"]  # (batch, seq, hidden)
        start, end = span_logits(
            span_dense(sequence), inputs["segment_ids"], inputs["padding_mask"]
        )
        super().__init__(
            inputs=inputs,
            outputs={"start_logits": start, "end_logits": end},
            backbone=backbone,
            preprocessor=preprocessor,
            learning_rate=learning_rate,
            weight_decay=weight_decay,
            warmup_ratio=warmup_ratio,
            total_steps=total_steps,
            **kwargs,
        )
        self.span_dense = span_dense
        self.span_logits = span_logits
        # The pooler is unused by this head (Hugging Face's task class has none): frozen, so
        # the optimizer neither tracks it nor warns about its missing gradients.
        backbone.pooler.trainable = False

        # === Config ===
        self.sequence_length = int(sequence_length)
        self.doc_stride = int(doc_stride)
        self.max_query_length = int(max_query_length)
        self.max_answer_length = int(max_answer_length)
        self.n_best_size = int(n_best_size)
        self.allow_no_answer = bool(allow_no_answer)
        self.null_score_diff_threshold = float(null_score_diff_threshold)
        self.context_only = bool(context_only)

        # === Default compile ===
        self.compile()

    @property
    def prediction_fill_value(self):
        """Logit of positions past a batch's bucket in `predict`: the mask's -1e9 (what the
        full-length run gives there) with `context_only`, else 0."""
        return MASKED_LOGIT if self.context_only else 0.0

    def _lean_head_layers(self):
        return (self.span_dense, self.span_logits)

    def _lean_head(self, calls, inputs, training):
        """The graph's computation on eager torch (`kbert.backend.lean_task_outputs`)."""
        sequence = calls.backbone(self, inputs, training)["sequence_output"]
        start, end = calls.weightless(
            self.span_logits,
            calls.dense(self.span_dense, sequence),
            inputs["segment_ids"],
            inputs["padding_mask"],
        )
        return {"start_logits": start, "end_logits": end}

    def _default_loss(self):
        return {
            "start_logits": keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, name="start_loss"
            ),
            "end_logits": keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, name="end_loss"
            ),
        }

    def _default_loss_weights(self):
        return {"start_logits": 0.5, "end_logits": 0.5}

    def _default_metrics(self):
        return {
            "start_logits": [keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
            "end_logits": [keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        }

    # --------------------------------------------------------------- raw input
    def encode(self, examples, labels=False, verbose=False):
        """SQuAD examples -> `kbert.data.squad.SquadFeatures` with this model's window settings."""
        from kbert.data.squad import prepare_squad_features

        self._require_preprocessor("questions and contexts")
        return prepare_squad_features(
            examples,
            self.tokenizer,
            max_sequence_length=self.sequence_length,
            doc_stride=self.doc_stride,
            max_query_length=self.max_query_length,
            labels=labels,
            verbose=verbose,
        )

    @staticmethod
    def _examples_from(x, y=None):
        if _is_example_list(x):
            if y is not None:
                raise ValueError(
                    "Give either SQuAD examples (with their answers) or (questions, contexts) and "
                    "`y`, not both."
                )
            return list(x)
        questions, contexts = x
        if isinstance(questions, str):
            questions, contexts = [questions], [contexts]
        questions, contexts = list(questions), list(contexts)
        if len(questions) != len(contexts):
            raise ValueError(
                f"Expected as many contexts as questions. Received {len(questions)} questions "
                f"and {len(contexts)} contexts"
            )
        answers = _answers_for(y, len(questions))
        return [
            {"id": str(i), "question": q, "context": c, "answers": a, "is_impossible": not a}
            for i, (q, c, a) in enumerate(zip(questions, contexts, answers))
        ]

    def preprocess_samples(self, x, y=None, sample_weight=None, mode="fit", batch_size=None):
        """SQuAD examples or `(questions, contexts)` -> windows (`encode`) with their span
        labels; packed inputs keep their labels, checked as positions."""
        if is_dataset(x):
            return x, y, sample_weight
        if _is_example_list(x) or _is_question_context_pair(x):
            if sample_weight is not None:
                raise ValueError("`sample_weight` cannot be combined with raw SQuAD examples.")
            examples = self._examples_from(x, y)
            features = self.encode(examples, labels=mode != "predict")
            return features.inputs, features.labels, None
        if y is not None:
            if not isinstance(y, dict) or sorted(y) != ["end_logits", "start_logits"]:
                raise ValueError(
                    'Labels must be a dict {"start_logits": start indices, "end_logits": end '
                    f"indices}}. Received: {type(y).__name__}"
                    + (f" with keys {sorted(y)}" if isinstance(y, dict) else "")
                )
            length = (
                next(iter(x.values())).shape[1] if isinstance(x, dict) else self.sequence_length
            )
            y = {k: np.asarray(v).astype("int32") for k, v in y.items()}
            for key, value in y.items():
                check_class_ids(value, length, key)
        return x, y, sample_weight

    def predict_answers(self, examples, batch_size=32, return_details=False, verbose="auto"):
        """Answers SQuAD examples.

        Args:
            examples: list of dicts (or `SquadExample`) with `id`, `question`, `context`.
            batch_size: int. Windows per predict batch. Defaults to `32`.
            return_details: bool. Also return null-score differences and n-best lists (see
                `kbert.data.squad.decode_squad_predictions`). Defaults to `False`.
            verbose: Keras `predict` verbosity. Defaults to `"auto"`.

        Returns:
            `{id: answer text}` (exact substrings of the contexts; `""` for no answer).
        """
        from kbert.data.squad import decode_squad_predictions

        features = self.encode(examples)
        if len(features) == 0:
            return ({}, {}, {}) if return_details else {}
        logits = super().predict(features.inputs, batch_size=batch_size, verbose=verbose)
        start, end = np.asarray(logits["start_logits"]), np.asarray(logits["end_logits"])
        if not self.context_only:  # n-best candidates from the context only, as with the mask.
            start, end = ContextSpanLogits()(
                np.stack([start, end], axis=-1),
                features.inputs["segment_ids"],
                features.inputs["padding_mask"],
            )
            start, end = keras.ops.convert_to_numpy(start), keras.ops.convert_to_numpy(end)
        return decode_squad_predictions(
            examples,
            features,
            start,
            end,
            n_best_size=self.n_best_size,
            max_answer_length=self.max_answer_length,
            allow_no_answer=self.allow_no_answer,
            null_score_diff_threshold=self.null_score_diff_threshold,
            return_details=return_details,
        )

    def answer(self, questions, contexts, batch_size=32, verbose=0):
        """Answer strings for questions on contexts (one context per question).

        Args:
            questions: str or list of str. Empty questions raise a `ValueError`.
            contexts: str or list of str, as many as questions.
            batch_size: int. Defaults to `32`.
            verbose: Keras `predict` verbosity. Defaults to `0`.

        Returns:
            A str for a single question, else a list of str; each is an exact substring of its
            context (or `""` for no answer with `allow_no_answer`).
        """
        single = isinstance(questions, str)
        examples = self._examples_from((questions, contexts))
        answers = self.predict_answers(examples, batch_size=batch_size, verbose=verbose)
        result = [answers[e["id"]] for e in examples]
        return result[0] if single else result

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "sequence_length": self.sequence_length,
                "doc_stride": self.doc_stride,
                "max_query_length": self.max_query_length,
                "max_answer_length": self.max_answer_length,
                "n_best_size": self.n_best_size,
                "allow_no_answer": self.allow_no_answer,
                "null_score_diff_threshold": self.null_score_diff_threshold,
                "context_only": self.context_only,
            }
        )
        return config
