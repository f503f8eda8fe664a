"""BERT presets as data, and the `from_preset` / `save_to_preset` entry points shared by all models."""

_UNCASED_VOCABULARY_SIZE = 30522
_CASED_VOCABULARY_SIZE = 28996


def _config(vocabulary_size, num_layers, hidden_dim, num_heads):
    return {
        "vocabulary_size": vocabulary_size,
        "num_layers": num_layers,
        "num_heads": num_heads,
        "hidden_dim": hidden_dim,
        "intermediate_dim": 4 * hidden_dim,
        "max_sequence_length": 512,
        "num_segments": 2,
        "dropout": 0.1,
        "attention_dropout": 0.1,
        "activation": "gelu",
        "layer_norm_epsilon": 1e-12,
    }


def _preset(description, params, lowercase, config):
    return {
        "description": description,
        "params": params,
        "lowercase": lowercase,
        "config": config,
    }


# Parameter counts include the pooler and equal HF `BertModel` with the same configuration.
BACKBONE_PRESETS = {
    "bert_tiny_en_uncased": _preset(
        "2-layer BERT, hidden 128, 2 heads (Turc et al., 2019), lower-cased English.",
        4_385_920,
        True,
        _config(_UNCASED_VOCABULARY_SIZE, 2, 128, 2),
    ),
    "bert_mini_en_uncased": _preset(
        "4-layer BERT, hidden 256, 4 heads (Turc et al., 2019), lower-cased English.",
        11_170_560,
        True,
        _config(_UNCASED_VOCABULARY_SIZE, 4, 256, 4),
    ),
    "bert_small_en_uncased": _preset(
        "4-layer BERT, hidden 512, 8 heads (Turc et al., 2019), lower-cased English.",
        28_763_648,
        True,
        _config(_UNCASED_VOCABULARY_SIZE, 4, 512, 8),
    ),
    "bert_medium_en_uncased": _preset(
        "8-layer BERT, hidden 512, 8 heads (Turc et al., 2019), lower-cased English.",
        41_373_184,
        True,
        _config(_UNCASED_VOCABULARY_SIZE, 8, 512, 8),
    ),
    "bert_base_en_uncased": _preset(
        "12-layer BERT-Base, hidden 768, 12 heads (Devlin et al., 2018), lower-cased English.",
        109_482_240,
        True,
        _config(_UNCASED_VOCABULARY_SIZE, 12, 768, 12),
    ),
    "bert_base_en_cased": _preset(
        "12-layer BERT-Base, hidden 768, 12 heads (Devlin et al., 2018), cased English.",
        108_310_272,
        False,
        _config(_CASED_VOCABULARY_SIZE, 12, 768, 12),
    ),
    "bert_large_en_uncased": _preset(
        "24-layer BERT-Large, hidden 1024, 16 heads (Devlin et al., 2018), lower-cased English.",
        335_141_888,
        True,
        _config(_UNCASED_VOCABULARY_SIZE, 24, 1024, 16),
    ),
    "bert_large_en_cased": _preset(
        "24-layer BERT-Large, hidden 1024, 16 heads (Devlin et al., 2018), cased English.",
        333_579_264,
        False,
        _config(_CASED_VOCABULARY_SIZE, 24, 1024, 16),
    ),
}


class PresetMixin:
    """`from_preset`, `save_to_preset` and `presets` for kbert models.

    A `source` is a preset name (`bert_base_en_uncased`...) or a directory: a kbert preset, a
    Hugging Face BERT directory, an original Google BERT checkpoint directory or a keras-hub
    BERT preset. See `kbert.checkpoints.load_model`.
    """

    @classmethod
    def presets(cls):
        """The built-in preset names mapped to their description and parameter count."""
        return {
            name: {"description": p["description"], "params": p["params"]}
            for name, p in BACKBONE_PRESETS.items()
        }

    @classmethod
    def from_preset(cls, source, load_weights=True, **kwargs):
        """Builds the model from a preset name or a checkpoint directory.

        Args:
            source: str or path. A built-in preset name (the installed preset directory
                `$KBERT_PRESETS_DIR/<name>`, see `tools/convert_checkpoint.py`) or a directory.
            load_weights: bool. Load the weights; `False` builds the architecture with
                freshly initialised weights (the only way to use a preset name whose
                weights are not installed). Defaults to `True`.
            **kwargs: model arguments (e.g. `num_classes`, `dropout`, `dtype`) that
                override or complete the stored configuration.

        Example:
        >>> backbone = BertBackbone.from_preset("bert_tiny_en_uncased", load_weights=False)
        """
        from kbert.checkpoints import load_model

        return load_model(cls, source, load_weights=load_weights, **kwargs)

    def save_to_preset(self, path, tokenizer=None, include_optimizer=False):
        """Writes the model as a kbert preset directory that `from_preset` loads as it was.

        Writes `config.json`, the weights and, when the model has a tokenizer (its
        preprocessor's, the vocabulary of the preset it came from, or `tokenizer`),
        `vocab.txt`, `tokenizer_config.json` and `preprocessor.json` (tokenizer settings and
        the preprocessor's `sequence_length`). The save is atomic: a kill at any instant
        leaves the previous or the new complete preset. See `kbert.checkpoints.save_preset`.

        Args:
            path: str or path. The preset directory (created or replaced).
            tokenizer: optional `kbert.text.BertTokenizer` to store with the model, e.g.
                for a `BertPretrainer` or a backbone, which have no preprocessor.
            include_optimizer: bool. Also store the optimizer state. Defaults to `False`.

        Example:
        >>> pretrainer.save_to_preset("my_bert", tokenizer=tokenizer)
        >>> classifier = BertClassifier.from_preset("my_bert", num_classes=2)
        """
        from kbert.checkpoints import save_preset

        save_preset(self, path, tokenizer=tokenizer, include_optimizer=include_optimizer)

    @classmethod
    def from_backbone(cls, backbone, **kwargs):
        """Wraps a backbone into this model class (the backbone itself for `BertBackbone`)."""
        if kwargs:
            raise ValueError(f"Unexpected arguments for {cls.__name__}: {sorted(kwargs)}")
        return backbone
