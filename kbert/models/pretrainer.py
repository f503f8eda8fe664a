"""BertPretrainer: the backbone with BERT's masked-LM and next-sentence heads."""

import keras

from kbert.layers import MaskedLMHead, NextSentenceHead
from kbert.models.backbone import BACKBONE_INPUTS, BertBackbone, check_input_keys
from kbert.models.input_checks import HostInputChecks, check_model_inputs
from kbert.models.optimization import bert_optimizer
from kbert.models.presets import PresetMixin

PRETRAINER_INPUTS = BACKBONE_INPUTS + ("mask_positions",)


def masked_lm_loss():
    """Masked-LM cross-entropy averaged over real predictions (slots weighted 1, padding 0)."""
    return keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="mean_with_sample_weight", name="mlm_loss"
    )


@keras.saving.register_keras_serializable(package="kbert")
class BertPretrainer(PresetMixin, HostInputChecks, keras.Model):
    """BERT with its pretraining heads: masked LM (tied decoder) and next-sentence prediction.

    Inputs are the backbone's dict plus `mask_positions` `(batch_size, num_predictions)`.
    Outputs are a dict: `mlm` logits `(batch_size, num_predictions, vocabulary_size)` and `nsp`
    logits `(batch_size, 2)` (0 = IsNext, 1 = NotNext).

    The model comes compiled with the paper's recipe: AdamW at 1e-4, beta 0.9/0.999, weight
    decay 0.01 (not on LayerNorm or biases), linear warm-up then linear decay, and the loss
    `mlm` cross-entropy averaged over real predictions plus `nsp` cross-entropy. `fit` takes
    `(x, y, sample_weight)` with `y = {"mlm": ids at mask_positions, "nsp": labels}` and
    `sample_weight = {"mlm": 1 for real predictions / 0 for padded slots, "nsp": ...}` -
    exactly what `kbert.data.pretraining_dataset` yields. `compile(optimizer=...)` alone keeps
    the default losses and metrics (masked-LM accuracy, NSP accuracy).

    Args:
        backbone: `BertBackbone`.
        optimizer: `"adamw"` or `"lamb"` for the default compile. Defaults to `"adamw"`.
        learning_rate: float. Peak rate of the default schedule. Defaults to `1e-4`.
        total_steps: int. Length of the default schedule. Defaults to `1_000_000`.
        warmup_steps: int. Warm-up of the default schedule. Defaults to `10_000`.

    Example:
    >>> backbone = BertBackbone.from_preset("bert_tiny_en_uncased")
    >>> pretrainer = BertPretrainer(backbone, total_steps=1000, warmup_steps=100)
    >>> pretrainer.fit(kbert.data.pretraining_dataset(files, tokenizer), epochs=1)
    """

    def __init__(
        self,
        backbone,
        optimizer="adamw",
        learning_rate=1e-4,
        total_steps=1_000_000,
        warmup_steps=10_000,
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
        next_sentence_head = NextSentenceHead(dtype=backbone.dtype_policy, name="nsp_head")

        # === Functional model ===
        inputs = dict(backbone.input)
        inputs["mask_positions"] = keras.Input(shape=(None,), dtype="int32", name="mask_positions")
        features = backbone({k: inputs[k] for k in BACKBONE_INPUTS})
        outputs = {
            "mlm": masked_lm_head(features["sequence_output"], inputs["mask_positions"]),
            "nsp": next_sentence_head(features["pooled_output"]),
        }
        kwargs.pop("dtype", None)
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)
        self.dtype_policy = backbone.dtype_policy  # The heads follow the backbone's policy.
        self.backbone = backbone
        self.masked_lm_head = masked_lm_head
        self.next_sentence_head = next_sentence_head

        # === Config ===
        self.optimizer_name = optimizer
        self.learning_rate = learning_rate
        self.total_steps = total_steps
        self.warmup_steps = warmup_steps

        # === Default compile ===
        self.compile()

    def call(self, inputs, training=None, mask=None):
        check_input_keys(inputs, PRETRAINER_INPUTS, "BertPretrainer")
        check_model_inputs(inputs, self.backbone)
        return super().call(inputs, training=training, mask=mask)

    def compile(
        self, optimizer="auto", loss="auto", metrics="auto", weighted_metrics="auto", **kwargs
    ):
        """`keras.Model.compile` with BERT's pretraining defaults for every argument left "auto"."""
        if optimizer == "auto":
            optimizer = bert_optimizer(
                self.learning_rate,
                total_steps=self.total_steps,
                warmup_steps=self.warmup_steps,
                optimizer=self.optimizer_name,
            )
        if loss == "auto":
            loss = {
                "mlm": masked_lm_loss(),
                "nsp": keras.losses.SparseCategoricalCrossentropy(from_logits=True, name="nsp_loss"),
            }
        if metrics == "auto":
            metrics = None
        if weighted_metrics == "auto":
            weighted_metrics = {
                "mlm": [keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
                "nsp": [keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
            }
        super().compile(
            optimizer=optimizer,
            loss=loss,
            metrics=metrics,
            weighted_metrics=weighted_metrics,
            **kwargs,
        )

    # LoRA: see `BertBackbone.enable_lora` and kbert/models/lora.py. The head stays trainable.
    def enable_lora(self, rank, alpha=None, feedforward=False):
        """Enables LoRA on the backbone (see `BertBackbone.enable_lora`); the head keeps training."""
        from kbert.models import lora

        lora.enable_lora(self.backbone, rank, alpha=alpha, feedforward=feedforward)
        lora.refresh_optimizer(self)

    def save_lora_weights(self, path):
        """Writes the backbone's LoRA matrices alone (see `BertBackbone.save_lora_weights`)."""
        self.backbone.save_lora_weights(path)

    def load_lora_weights(self, path):
        """Reads LoRA matrices into the backbone (see `BertBackbone.load_lora_weights`)."""
        self.backbone.load_lora_weights(path)

    def merge_lora(self):
        """Returns a new model with the LoRA update merged into the kernels (see
        `BertBackbone.merge_lora`); the preprocessor, if any, is shared."""
        from kbert.models import lora

        return lora.merge_lora(self)

    def get_compile_config(self):
        # The model compiles itself with its defaults when it is rebuilt from its config.
        return None

    @classmethod
    def from_backbone(cls, backbone, **kwargs):
        return cls(backbone, **kwargs)

    def get_config(self):
        return {
            "name": self.name,
            "trainable": self.trainable,
            "backbone": keras.layers.serialize(self.backbone),
            "optimizer": self.optimizer_name,
            "learning_rate": self.learning_rate,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config["backbone"], dict):
            config["backbone"] = keras.layers.deserialize(config["backbone"])
        return cls(**config)

    # === Checkpoint hooks (see kbert/checkpoints/formats.py) ===
    huggingface_architecture = "BertForPreTraining"

    def huggingface_head_weights(self):
        """`(hf_name, variable, transpose)` of the MLM and NSP heads in HF `BertForPreTraining`.

        The MLM decoder matrix is the token embedding (tied, as in HF), so only its bias
        (`cls.predictions.bias`, alias `cls.predictions.decoder.bias`) is listed.
        """
        mlm = self.masked_lm_head
        nsp = self.next_sentence_head
        return [
            ("cls.predictions.transform.dense.weight", mlm.transform_dense.kernel, True),
            ("cls.predictions.transform.dense.bias", mlm.transform_dense.bias, False),
            ("cls.predictions.transform.LayerNorm.weight", mlm.layer_norm.gamma, False),
            ("cls.predictions.transform.LayerNorm.bias", mlm.layer_norm.beta, False),
            ("cls.predictions.bias", mlm.output_bias, False),
            ("cls.seq_relationship.weight", nsp.kernel, True),
            ("cls.seq_relationship.bias", nsp.bias, False),
        ]

    def google_head_weights(self):
        """`(tf_name, variable, transpose)` of the heads in Google's `run_pretraining.py` checkpoints."""
        mlm = self.masked_lm_head
        nsp = self.next_sentence_head
        return [
            ("cls/predictions/transform/dense/kernel", mlm.transform_dense.kernel, False),
            ("cls/predictions/transform/dense/bias", mlm.transform_dense.bias, False),
            ("cls/predictions/transform/LayerNorm/gamma", mlm.layer_norm.gamma, False),
            ("cls/predictions/transform/LayerNorm/beta", mlm.layer_norm.beta, False),
            ("cls/predictions/output_bias", mlm.output_bias, False),
            ("cls/seq_relationship/output_weights", nsp.kernel, True),  # Stored [2, hidden].
            ("cls/seq_relationship/output_bias", nsp.bias, False),
        ]
