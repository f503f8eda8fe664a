"""Original Google BERT checkpoints (google-research/bert): `bert_config.json` + TF1 checkpoint.

A Google BERT directory holds `bert_config.json`, `bert_model.ckpt.index` +
`bert_model.ckpt.data-*` and `vocab.txt`. Variables are named as in Google's `modeling.py`
and `run_pretraining.py` (`bert/embeddings/word_embeddings`,
`bert/encoder/layer_0/attention/self/query/kernel`, `bert/pooler/dense/kernel`,
`cls/predictions/transform/dense/kernel`, `cls/predictions/output_bias`,
`cls/seq_relationship/output_weights`, ...). Dense kernels are stored `(in, out)` like Keras'
except `cls/seq_relationship/output_weights`, which is `[2, hidden]`.

In Google's code `hidden_act: "gelu"` is the tanh approximation of GELU, so it maps to kbert
`"gelu_approximate"`; LayerNorm epsilon is 1e-12. Checkpoints are read with
`tf.train.load_checkpoint` (TensorFlow is a kbert dependency); optimizer slots
(`.../adam_m`, `.../adam_v`) and `global_step` are skipped.
"""

from pathlib import Path

from kbert.backend import tensorflow
from kbert.checkpoints import _weights
from kbert.checkpoints._config import config_float, config_int, read_json
from kbert.checkpoints.vocabulary import find_vocabulary

CONFIG_FILE = "bert_config.json"
CHECKPOINT_PREFIX = "bert_model.ckpt"
PREFIX = "bert/"

_ACTIVATIONS = {"gelu": "gelu_approximate", "relu": "relu", "tanh": "tanh"}
_REQUIRED_KEYS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
)
_OPTIMIZER_LEAVES = {"adam_m", "adam_v", "Adam", "Adam_1", "Momentum", "lamb_m", "lamb_v"}
_TRAINING_STATE = {"global_step", "beta1_power", "beta2_power", "good_steps", "loss_scale"}

# === The one table of BERT's Google names ===
# The backbone's names are in `backbone_entries`. kbert class -> `(TF variable name, kbert
# variable's attribute path, transposed)` of every head variable, as google-research/bert's
# `run_pretraining.py`, `run_classifier.py` and `run_squad.py` name them. Their output weights
# are stored `[num_outputs, hidden]`, hence transposed; the masked-LM decoder is the token
# embedding (tied), so only its bias is a head tensor.
HEAD_WEIGHTS = {
    "BertBackbone": (),
    "BertPretrainer": (
        ("cls/predictions/transform/dense/kernel", "masked_lm_head.transform_dense.kernel", False),
        ("cls/predictions/transform/dense/bias", "masked_lm_head.transform_dense.bias", False),
        ("cls/predictions/transform/LayerNorm/gamma", "masked_lm_head.layer_norm.gamma", False),
        ("cls/predictions/transform/LayerNorm/beta", "masked_lm_head.layer_norm.beta", False),
        ("cls/predictions/output_bias", "masked_lm_head.output_bias", False),
        ("cls/seq_relationship/output_weights", "next_sentence_head.kernel", True),
        ("cls/seq_relationship/output_bias", "next_sentence_head.bias", False),
    ),
    "BertSparseEncoder": (
        ("cls/predictions/transform/dense/kernel", "masked_lm_head.transform_dense.kernel", False),
        ("cls/predictions/transform/dense/bias", "masked_lm_head.transform_dense.bias", False),
        ("cls/predictions/transform/LayerNorm/gamma", "masked_lm_head.layer_norm.gamma", False),
        ("cls/predictions/transform/LayerNorm/beta", "masked_lm_head.layer_norm.beta", False),
        ("cls/predictions/output_bias", "masked_lm_head.output_bias", False),
    ),
    "BertClassifier": (
        ("output_weights", "output_dense.kernel", True),
        ("output_bias", "output_dense.bias", False),
    ),
    "BertQuestionAnswerer": (
        ("cls/squad/output_weights", "span_dense.kernel", True),
        ("cls/squad/output_bias", "span_dense.bias", False),
    ),
}


def is_google_dir(path):
    path = Path(path)
    return (path / CONFIG_FILE).is_file() or (path / f"{CHECKPOINT_PREFIX}.index").is_file()


def backbone_config_from_google(config, source=CONFIG_FILE):
    """Translates a Google `bert_config.json` dict into `BertBackbone` arguments."""
    missing = [k for k in _REQUIRED_KEYS if k not in config]
    if missing:
        raise ValueError(f"{source} lacks {missing}; it is not a BERT config.")
    hidden_act = config.get("hidden_act", "gelu")
    if hidden_act not in _ACTIVATIONS:
        raise ValueError(
            f"{source}: hidden_act={hidden_act!r} is not supported. Expected one of "
            f"{sorted(_ACTIVATIONS)} (Google's 'gelu' is the tanh approximation)."
        )
    return {
        "vocabulary_size": config_int(config, "vocab_size", source),
        "num_layers": config_int(config, "num_hidden_layers", source),
        "num_heads": config_int(config, "num_attention_heads", source),
        "hidden_dim": config_int(config, "hidden_size", source),
        "intermediate_dim": config_int(config, "intermediate_size", source),
        "max_sequence_length": config_int(config, "max_position_embeddings", source, 512),
        "num_segments": config_int(config, "type_vocab_size", source, 16),
        "dropout": config_float(config, "hidden_dropout_prob", source, 0.1),
        "attention_dropout": config_float(config, "attention_probs_dropout_prob", source, 0.1),
        "activation": _ACTIVATIONS[hidden_act],
        "layer_norm_epsilon": 1e-12,
    }


def checkpoint_prefix(path):
    """The TF checkpoint prefix in a Google directory (`bert_model.ckpt`, or the latest/only
    one)."""
    path = Path(path)
    if (path / f"{CHECKPOINT_PREFIX}.index").is_file():
        return path / CHECKPOINT_PREFIX
    indexes = sorted(path.glob("*.index"))
    if (path / "checkpoint").is_file():
        tf = tensorflow.tensorflow("Reading a Google TF checkpoint")

        latest = tf.train.latest_checkpoint(str(path))
        if latest and Path(latest + ".index").is_file():
            return Path(latest)
    if len(indexes) == 1:
        return indexes[0].with_suffix("")
    if not indexes:
        raise FileNotFoundError(
            f"No TensorFlow checkpoint in {path}: expected {CHECKPOINT_PREFIX}.index and "
            f"{CHECKPOINT_PREFIX}.data-00000-of-00001. Found: "
            f"{sorted(p.name for p in path.iterdir())}"
        )
    raise ValueError(
        f"{path} holds several checkpoints {[p.name for p in indexes]} and no 'checkpoint' "
        f"file naming the latest; keep one, or name it {CHECKPOINT_PREFIX}."
    )


def read_config(path, require_weights=True):
    """`(backbone_config, vocabulary_path, raw_config)` of a Google BERT directory."""
    path = Path(path)
    raw = read_json(path / CONFIG_FILE)
    if not isinstance(raw, dict):
        raise ValueError(f"{path / CONFIG_FILE} must hold a JSON object")
    config = backbone_config_from_google(raw, source=str(path / CONFIG_FILE))
    if require_weights:
        prefix = checkpoint_prefix(path)
        if not list(prefix.parent.glob(prefix.name + ".data-*")):
            raise FileNotFoundError(f"The checkpoint {prefix} has an index but no .data-* file")
    return config, find_vocabulary(path), raw


def open_weights(path):
    """A `TensorSource` over a Google checkpoint, read with `tf.train.load_checkpoint`."""
    tf = tensorflow.tensorflow("Reading a Google TF checkpoint")

    prefix = checkpoint_prefix(path)
    try:
        reader = tf.train.load_checkpoint(str(prefix))
        shapes = reader.get_variable_to_shape_map()
    except (tf.errors.OpError, ValueError) as error:
        raise ValueError(f"Cannot read the TensorFlow checkpoint {prefix}: {error}") from None

    def read(name):
        try:
            return reader.get_tensor(name)
        except tf.errors.OpError as error:  # A cut .data file fails here.
            raise ValueError(
                f"Cannot read {name!r} from {prefix} (damaged file?): {error}"
            ) from None

    source = _weights.TensorSource(f"the Google checkpoint {prefix}", shapes, read)
    source.shapes = dict(shapes)
    return source


SIZE_TENSORS = {
    "word": PREFIX + "embeddings/word_embeddings",
    "position": PREFIX + "embeddings/position_embeddings",
    "segment": PREFIX + "embeddings/token_type_embeddings",
    "intermediate": (PREFIX + "encoder/layer_0/intermediate/dense/kernel", False),
    "layer": r"^bert/encoder/layer_(\d+)/",
}


def header_shapes(path):
    """`{variable name: shape}` from the checkpoint's index file (no tensor data read)."""
    return open_weights(path).shapes


def backbone_entries(backbone):
    """`WeightEntry`s of a kbert `BertBackbone` under Google's variable names."""
    variables = _weights.variables_by_path(backbone)

    def entry(name, kbert_path, part=_weights.BACKBONE):
        return _weights.WeightEntry(
            PREFIX + name, _weights.find_variable(variables, kbert_path), _weights.IDENTITY, part
        )

    entries = [
        entry("embeddings/word_embeddings", "embeddings/token_embedding/embeddings"),
        entry("embeddings/position_embeddings", "embeddings/position_embedding/embeddings"),
        entry("embeddings/token_type_embeddings", "embeddings/segment_embedding/embeddings"),
        entry("embeddings/LayerNorm/gamma", "embeddings/embeddings_layer_norm/gamma"),
        entry("embeddings/LayerNorm/beta", "embeddings/embeddings_layer_norm/beta"),
    ]
    for i in range(backbone.num_layers):
        g, kb = f"encoder/layer_{i}/", f"transformer_layer_{i}/"
        for g_dense, kb_dense in (
            ("attention/self/query", "self_attention/query"),
            ("attention/self/key", "self_attention/key"),
            ("attention/self/value", "self_attention/value"),
            ("attention/output/dense", "self_attention/attention_output"),
            ("intermediate/dense", "intermediate_dense"),
            ("output/dense", "output_dense"),
        ):
            entries.append(entry(f"{g}{g_dense}/kernel", f"{kb}{kb_dense}/kernel"))
            entries.append(entry(f"{g}{g_dense}/bias", f"{kb}{kb_dense}/bias"))
        for g_norm, kb_norm in (
            ("attention/output/LayerNorm", "self_attention_layer_norm"),
            ("output/LayerNorm", "output_layer_norm"),
        ):
            entries.append(entry(f"{g}{g_norm}/gamma", f"{kb}{kb_norm}/gamma"))
            entries.append(entry(f"{g}{g_norm}/beta", f"{kb}{kb_norm}/beta"))
    entries.append(entry("pooler/dense/kernel", "pooler/pooler_dense/kernel", _weights.POOLER))
    entries.append(entry("pooler/dense/bias", "pooler/pooler_dense/bias", _weights.POOLER))
    return entries


def is_training_state(name):
    """Optimizer slots and counters, which a model load skips."""
    return name in _TRAINING_STATE or name.rsplit("/", 1)[-1] in _OPTIMIZER_LEAVES


def load_weights(model, path, fresh_heads=None):
    """Loads an original Google BERT checkpoint's weights into an existing kbert model.

    Args:
        model: a kbert model with the checkpoint's architecture (`BertBackbone`,
            `BertPretrainer`, or a task model; heads named in `HEAD_WEIGHTS`).
        path: str or path. The Google BERT directory.
        fresh_heads: `None`, `True` or `False`; see `kbert.checkpoints.formats`.

    Returns:
        A `LoadReport`.

    `from_preset` of a Google directory calls it, e.g.
    `BertPretrainer.from_preset("uncased_L-2_H-128_A-2")`.
    """
    backbone = getattr(model, "backbone", model)
    entries = backbone_entries(backbone) + _weights.head_entries(model, HEAD_WEIGHTS)
    return _weights.assign_checked(
        type(model).__name__,
        entries,
        open_weights(path),
        fresh_heads=fresh_heads,
        is_backbone_tensor=lambda name: name.startswith(PREFIX),
        ignorable=is_training_state,
    )
