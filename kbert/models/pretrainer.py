"""BertPretrainer: the backbone with BERT's masked-LM and next-sentence heads."""

import keras

from kbert.layers import MaskedLMHead, NextSentenceHead
from kbert.models.backbone import BACKBONE_INPUTS, BertBackbone
from kbert.models.task import BertTask

PRETRAINER_INPUTS = BACKBONE_INPUTS + ("mask_positions",)


def masked_lm_loss():
    """Masked-LM cross-entropy averaged over real predictions (slots weighted 1, padding 0)."""
    return keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="mean_with_sample_weight", name="mlm_loss"
    )


@keras.saving.register_keras_serializable(package="kbert")
class BertPretrainer(BertTask):
    """BERT with its pretraining heads: masked LM (tied decoder) and next-sentence prediction.

    Inputs are the backbone's dict plus `mask_positions` `(batch_size, num_predictions)`.
    Outputs are a dict: `mlm` logits `(batch_size, num_predictions, vocabulary_size)` and `nsp`
    logits `(batch_size, 2)` (0 = IsNext, 1 = NotNext). With `next_sentence=False` the model is
    masked-LM only (RoBERTa-style; the input of `kbert.data.pretraining_dataset(..., nsp=False)`
    and of the packed rows of `kbert.data.packed_pretraining_dataset`): no NSP head, no `nsp`
    output, loss and metrics; a backbone built with `packed=True` adds its `document_ids` input.

    The model is a `kbert.models.BertTask` and comes compiled with the paper's recipe
    (`compile()`): AdamW at 1e-4, beta 0.9/0.999, weight decay 0.01 (not on LayerNorm or
    biases), linear warm-up over 1 % of the steps then linear decay, and the loss `mlm`
    cross-entropy averaged over real predictions plus `nsp` cross-entropy. `fit` takes
    `(x, y, sample_weight)` with `y = {"mlm": ids at mask_positions, "nsp": labels}` and
    `sample_weight = {"mlm": 1 for real predictions / 0 for padded slots, "nsp": ...}` -
    exactly what `kbert.data.pretraining_dataset` yields.
    `compile(optimizer=...)` alone keeps the default losses and metrics (masked-LM accuracy,
    NSP accuracy).

    The recipe's settings are `compile`'s (see `BertTask.compile`): e.g.
    `compile(learning_rate=1.76e-3, update_rule="lamb")` for LAMB. With `total_steps=None`
    (the default) each `fit` call plans the schedule over the steps it runs, warming up for
    `warmup_steps` of them (or `warmup_ratio` of them), as the fine-tuning tasks do (see
    `BertTask.fit`); the paper's run is `compile(total_steps=1_000_000, warmup_steps=10_000)`.

    Args:
        backbone: `BertBackbone`.
        optimizer, learning_rate, total_steps, warmup_steps, warmup_ratio, weight_decay:
            deprecated (a `DeprecationWarning`); pass them to `compile` (`optimizer` became
            `compile(update_rule=...)`).
        next_sentence: bool. Build the next-sentence head (and its loss). `False` trains
            the masked LM alone. Defaults to `True`.

    Example:
    >>> tokenizer = kbert.text.BertTokenizer(
    ...     ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "dog", "ran", "."])
    >>> backbone = BertBackbone(vocabulary_size=11, num_layers=1, num_heads=2, hidden_dim=16,
    ...                         intermediate_dim=32, max_sequence_length=16)
    >>> pretrainer = BertPretrainer(backbone)
    >>> pretrainer.compile(learning_rate=2e-4, warmup_ratio=0.05)  # or keep the defaults
    >>> with open("corpus.txt", "w") as corpus:  # one sentence a line, documents apart
    ...     print("The cat sat.\\nThe dog ran.\\n\\nThe dog sat.\\nThe cat ran.", file=corpus)
    >>> dataset = kbert.data.pretraining_dataset(
    ...     ["corpus.txt"], tokenizer, sequence_length=16, max_predictions=2, batch_size=2)
    >>> history = pretrainer.fit(dataset, epochs=1, verbose=0)
    >>> sorted(history.history)
    ['loss', 'mlm_accuracy', 'mlm_loss', 'nsp_accuracy', 'nsp_loss']
    """

    def __init__(
        self,
        backbone,
        optimizer=None,
        learning_rate=None,
        total_steps=None,
        warmup_steps=None,
        warmup_ratio=None,
        weight_decay=None,
        next_sentence=True,
        **kwargs,
    ):
        if not isinstance(backbone, BertBackbone):
            raise ValueError(
                f"`backbone` must be a kbert BertBackbone. Received: {type(backbone).__name__}"
            )
        # === Layers ===
        masked_lm_head = MaskedLMHead(
            backbone.token_embedding,
            activation=backbone.activation,
            layer_norm_epsilon=backbone.layer_norm_epsilon,
            dtype=backbone.dtype_policy,
            name="mlm_head",
        )
        if not isinstance(next_sentence, bool):
            raise ValueError(
                f"`next_sentence` must be True or False. Received: next_sentence={next_sentence!r}"
            )
        next_sentence_head = (
            NextSentenceHead(dtype=backbone.dtype_policy, name="nsp_head")
            if next_sentence
            else None
        )

        # === Functional model ===
        backbone_inputs = tuple(backbone.input_names)
        inputs = dict(backbone.input)
        inputs["mask_positions"] = keras.Input(shape=(None,), dtype="int32", name="mask_positions")
        features = backbone({k: inputs[k] for k in backbone_inputs})
        outputs = {"mlm": masked_lm_head(features["sequence_output"], inputs["mask_positions"])}
        if next_sentence:
            outputs["nsp"] = next_sentence_head(features["pooled_output"])
        kwargs.pop("preprocessor", None)  # Pretraining inputs come from kbert.data, not strings.
        super().__init__(
            inputs=inputs,
            outputs=outputs,
            backbone=backbone,
            learning_rate=learning_rate,
            weight_decay=weight_decay,
            warmup_ratio=warmup_ratio,
            total_steps=total_steps,
            warmup_steps=warmup_steps,
            optimizer=optimizer,
            **kwargs,
        )
        self.masked_lm_head = masked_lm_head
        self.next_sentence_head = next_sentence_head
        self.input_names = backbone_inputs + ("mask_positions",)

        # === Config ===
        self.next_sentence = next_sentence

        # === Default compile ===
        self.compile()

    input_names = PRETRAINER_INPUTS
    default_learning_rate = 1e-4
    default_warmup_ratio = 0.01  # The paper's 10k warm-up steps of 1M.
    deprecated_training_arguments = {
        **BertTask.deprecated_training_arguments,
        "warmup_steps": "warmup_steps",
        "optimizer": "update_rule",
    }

    def _lean_head_layers(self):
        heads = (self.masked_lm_head, self.next_sentence_head)
        return heads if self.next_sentence else heads[:1]

    def _lean_head(self, calls, inputs, training):
        """The graph's computation on eager torch (`kbert.backend.lean_task_outputs`)."""
        features = calls.backbone(
            self, {name: inputs[name] for name in self.backbone.input_names}, training
        )
        outputs = {
            "mlm": calls.masked_lm(
                self.masked_lm_head, features["sequence_output"], inputs["mask_positions"]
            )
        }
        if self.next_sentence:
            outputs["nsp"] = calls.dense(self.next_sentence_head, features["pooled_output"])
        return outputs

    def _default_loss(self):
        loss = {"mlm": masked_lm_loss()}
        if self.next_sentence:
            loss["nsp"] = keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, name="nsp_loss"
            )
        return loss

    def _default_weighted_metrics(self):
        metrics = {"mlm": [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]}
        if self.next_sentence:
            metrics["nsp"] = [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
        return metrics

    @classmethod
    def from_preset(cls, source, load_weights=True, **kwargs):
        """Builds the pretrainer from a preset name or a checkpoint directory (see `BertTask`).

        The pretrainer takes no text preprocessor: its inputs come from
        `kbert.data.pretraining_dataset`.
        """
        kwargs.setdefault("preprocessor", None)
        return super().from_preset(source, load_weights=load_weights, **kwargs)

    @classmethod
    def from_backbone(cls, backbone, **kwargs):
        return cls(backbone, **kwargs)

    def get_config(self):
        return {
            "name": self.name,
            "trainable": self.trainable,
            "backbone": keras.layers.serialize(self.backbone),
            "next_sentence": self.next_sentence,
        }
