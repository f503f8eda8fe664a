"""Reference checkpoints for the checkpoint tests, written with the reference libraries themselves.

- Hugging Face: random `transformers` BERT models with EVERY parameter drawn at a large scale
  (LayerNorm gains/biases and all biases too), so a swapped tensor, a missing transpose or the
  wrong GELU form changes the outputs far beyond the 1e-4 tolerance.
- Google: the same weights written as an original TF1 BERT checkpoint (variable names of
  google-research/bert) with `tf.compat.v1.train.Saver`.
"""

import json
from pathlib import Path

import keras
import numpy as np

TOLERANCE = 1e-4


def to_numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x), dtype=np.float64)


def hf_config(**overrides):
    import transformers

    values = dict(
        vocab_size=97,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=50,  # Not 4 x hidden.
        max_position_embeddings=24,
        type_vocab_size=2,
        hidden_act="gelu",
        initializer_range=0.5,
        layer_norm_eps=1e-12,
    )
    values.update(overrides)
    return transformers.BertConfig(**values)


def make_hf_model(config, kind="pretraining", seed=0):
    """A `BertForPreTraining` ("pretraining") or `BertModel` ("model") with all parameters
    random."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cls = transformers.BertForPreTraining if kind == "pretraining" else transformers.BertModel
    model = cls(config).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    scale = config.initializer_range
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator) * scale
            # The MLM decoder is tied to the word embeddings: named_parameters lists it once.
            parameter.copy_(1.0 + noise if "LayerNorm.weight" in name else noise)
    return model


def random_inputs(config, batch_size=3, sequence_length=11, num_predictions=4, seed=0):
    """Inputs with trailing padding of different lengths, and masked-LM positions on real tokens."""
    rng = np.random.default_rng(seed)
    token_ids = rng.integers(1, config.vocab_size, (batch_size, sequence_length)).astype("int32")
    segment_ids = rng.integers(0, config.type_vocab_size, (batch_size, sequence_length)).astype(
        "int32"
    )
    lengths = [sequence_length - 3 * i for i in range(batch_size)]
    padding_mask = np.zeros((batch_size, sequence_length), "int32")
    for row, length in enumerate(lengths):
        padding_mask[row, :length] = 1
        token_ids[row, length:] = 0
        segment_ids[row, length:] = 0
    mask_positions = np.stack(
        [np.sort(rng.choice(length, num_predictions, replace=False)) for length in lengths]
    ).astype("int32")
    return {
        "token_ids": token_ids,
        "segment_ids": segment_ids,
        "padding_mask": padding_mask,
        "mask_positions": mask_positions,
    }


def hf_outputs(model, inputs, attentions=False):
    """Reference outputs of a transformers model on kbert-style inputs (numpy, float64):
    `sequence_output`, every layer's `hidden_states` (HF's order), `pooled_output`, a task
    head's `logits` and the pretraining heads' logits where the model has them, and
    (`attentions=True`, an eager-attention model) every layer's attention probabilities."""
    import torch

    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(inputs["token_ids"], dtype=torch.long),
            token_type_ids=torch.tensor(inputs["segment_ids"], dtype=torch.long),
            attention_mask=torch.tensor(inputs["padding_mask"], dtype=torch.long),
            output_hidden_states=True,
            output_attentions=attentions,
        )
    result = {
        "sequence_output": out.hidden_states[-1].double().numpy(),
        "hidden_states": [h.double().numpy() for h in out.hidden_states],
    }
    if attentions:
        result["attentions"] = [a.double().numpy() for a in out.attentions]
    if hasattr(out, "pooler_output"):
        result["pooled_output"] = out.pooler_output.double().numpy()
    if getattr(out, "logits", None) is not None:  # a task head (sequence classification, ...)
        result["logits"] = out.logits.double().numpy()
    if hasattr(out, "prediction_logits"):
        positions = inputs["mask_positions"][:, :, None].astype("int64")
        result["mlm"] = np.take_along_axis(out.prediction_logits.double().numpy(), positions, 1)
        result["nsp"] = out.seq_relationship_logits.double().numpy()
    return result


def backbone_inputs(inputs):
    return {k: inputs[k] for k in ("token_ids", "segment_ids", "padding_mask")}


def max_diff(actual, expected, padding_mask=None):
    """max |actual - expected|; for (batch, seq, ...) arrays only the real positions count,
    for (batch, heads, query, key) attention probabilities only real queries' real keys."""
    actual, expected = to_numpy(actual), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if padding_mask is not None and actual.ndim == 3:
        keep = np.asarray(padding_mask).astype(bool)
        actual, expected = actual[keep], expected[keep]
    elif padding_mask is not None and actual.ndim == 4:
        keep = np.asarray(padding_mask).astype(bool)
        pairs = np.broadcast_to(keep[:, None, :, None] & keep[:, None, None, :], actual.shape)
        actual, expected = actual[pairs], expected[pairs]
    return float(np.max(np.abs(actual - expected)))


def assert_close(actual, expected, padding_mask=None, scaled=False):
    """max |actual - expected| <= TOLERANCE, on real positions for (batch, seq, ...) outputs.

    With `scaled=True` the tolerance is relative to the output's range:
    `TOLERANCE * max(1, max |expected|)`. Used for masked-LM logits, which reach |20| in the
    scaled-up random models: a logit's round-off is that of the hidden vector times the
    decoder, so it scales with the range, not with the logit itself. (TensorFlow with oneDNN,
    whose CPU kernels sum in another order, differs from torch by ~2e-4 on such logits and
    ~7e-5 on sequence outputs; ~3e-5 / 1e-5 with TF_ENABLE_ONEDNN_OPTS=0.)
    """
    actual, expected = to_numpy(actual), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if padding_mask is not None and actual.ndim == 3:
        keep = np.asarray(padding_mask).astype(bool)
        actual, expected = actual[keep], expected[keep]
    tolerance = TOLERANCE * (max(1.0, float(np.max(np.abs(expected)))) if scaled else 1.0)
    difference = float(np.max(np.abs(actual - expected)))
    assert difference <= tolerance, f"max |diff| = {difference:.3e} > tolerance {tolerance:.3e}"


def write_vocabulary(path, size):
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"tok{i}" for i in range(size - 5)]
    Path(path).write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    return tokens


# HF state-dict name (after the `bert.` prefix is dropped) -> Google name, and transpose.
def google_name_map(config, heads=True):
    names = {
        "embeddings.word_embeddings.weight": ("bert/embeddings/word_embeddings", False),
        "embeddings.position_embeddings.weight": ("bert/embeddings/position_embeddings", False),
        "embeddings.token_type_embeddings.weight": ("bert/embeddings/token_type_embeddings", False),
        "embeddings.LayerNorm.weight": ("bert/embeddings/LayerNorm/gamma", False),
        "embeddings.LayerNorm.bias": ("bert/embeddings/LayerNorm/beta", False),
        "pooler.dense.weight": ("bert/pooler/dense/kernel", True),
        "pooler.dense.bias": ("bert/pooler/dense/bias", False),
    }
    for i in range(config.num_hidden_layers):
        hf, g = f"encoder.layer.{i}.", f"bert/encoder/layer_{i}/"
        for part in (
            "attention.self.query",
            "attention.self.key",
            "attention.self.value",
            "attention.output.dense",
            "intermediate.dense",
            "output.dense",
        ):
            names[f"{hf}{part}.weight"] = (g + part.replace(".", "/") + "/kernel", True)
            names[f"{hf}{part}.bias"] = (g + part.replace(".", "/") + "/bias", False)
        for part in ("attention.output.LayerNorm", "output.LayerNorm"):
            names[f"{hf}{part}.weight"] = (g + part.replace(".", "/") + "/gamma", False)
            names[f"{hf}{part}.bias"] = (g + part.replace(".", "/") + "/beta", False)
    if heads:
        names.update(
            {
                "cls.predictions.transform.dense.weight": (
                    "cls/predictions/transform/dense/kernel",
                    True,
                ),
                "cls.predictions.transform.dense.bias": (
                    "cls/predictions/transform/dense/bias",
                    False,
                ),
                "cls.predictions.transform.LayerNorm.weight": (
                    "cls/predictions/transform/LayerNorm/gamma",
                    False,
                ),
                "cls.predictions.transform.LayerNorm.bias": (
                    "cls/predictions/transform/LayerNorm/beta",
                    False,
                ),
                "cls.predictions.bias": ("cls/predictions/output_bias", False),
                # Google stores the NSP matrix [2, hidden], like torch: no transpose.
                "cls.seq_relationship.weight": ("cls/seq_relationship/output_weights", False),
                "cls.seq_relationship.bias": ("cls/seq_relationship/output_bias", False),
            }
        )
    return names


def google_variables_from_hf(model, heads=True):
    """`{google_name: array}` holding a transformers model's weights, laid out as Google's code
    does."""
    state = {
        k[len("bert.") :] if k.startswith("bert.") else k: v.detach().numpy()
        for k, v in model.state_dict().items()
    }
    variables = {}
    for hf_name, (google_name, transpose) in google_name_map(model.config, heads).items():
        value = state[hf_name]
        variables[google_name] = np.ascontiguousarray(value.T if transpose else value)
    return variables


def write_google_checkpoint(directory, variables, bert_config, vocabulary_size=None):
    """Writes an original-BERT directory: bert_config.json, bert_model.ckpt.* (TF1 Saver),
    vocab.txt."""
    import tensorflow as tf

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "bert_config.json").write_text(json.dumps(bert_config, indent=2))
    graph = tf.Graph()
    with graph.as_default():
        tf_variables = [
            tf.compat.v1.Variable(value, name=name, dtype=value.dtype)
            for name, value in variables.items()
        ]
        saver = tf.compat.v1.train.Saver(var_list=tf_variables)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            saver.save(session, str(directory / "bert_model.ckpt"), write_meta_graph=False)
    if vocabulary_size:
        write_vocabulary(directory / "vocab.txt", vocabulary_size)
    return directory


def google_bert_config(config):
    """Google's `bert_config.json` for a transformers config (Google "gelu" is the tanh form)."""
    return {
        "attention_probs_dropout_prob": 0.1,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": config.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": config.intermediate_size,
        "max_position_embeddings": config.max_position_embeddings,
        "num_attention_heads": config.num_attention_heads,
        "num_hidden_layers": config.num_hidden_layers,
        "type_vocab_size": config.type_vocab_size,
        "vocab_size": config.vocab_size,
    }
