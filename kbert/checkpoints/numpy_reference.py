"""An independent NumPy (float64) forward pass of an original Google BERT checkpoint.

Used as the numerical reference for Google checkpoints (by `tools/convert_checkpoint.py` and
the tests), where neither TF1 BERT nor `transformers` can run the checkpoint directly. It
follows google-research/bert `modeling.py` and `run_pretraining.py` line by line on the raw
variables (`bert/encoder/layer_0/attention/self/query/kernel`, ...), sharing no code with
kbert's models or its checkpoint mapping: tanh GELU for `hidden_act: "gelu"`, LayerNorm
epsilon 1e-12, additive -10000 attention mask, masked-LM logits at `mask_positions` with
the decoder tied to the word embeddings, NSP logits from `cls/seq_relationship`.
"""

import math

import numpy as np


def gelu_tanh(x):
    """GELU in the tanh form of Google's modeling.py (and HF `gelu_new`)."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


_erf = np.vectorize(math.erf, otypes=[np.float64])


def gelu_exact(x):
    """GELU with the error function: `x * Phi(x)` (slow, element by element; reference use only)."""
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


_ACTIVATIONS = {
    "gelu": gelu_tanh,  # Google's meaning of "gelu".
    "gelu_exact": gelu_exact,
    "relu": lambda x: np.maximum(x, 0.0),
    "tanh": np.tanh,
}


def _layer_norm(x, gamma, beta, epsilon=1e-12):
    mean = x.mean(axis=-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + epsilon) * gamma + beta


def google_bert_forward(
    variables, config, token_ids, segment_ids, padding_mask, mask_positions=None
):
    """Runs Google's BERT on NumPy arrays.

    Args:
        variables: mapping of Google variable name -> array (e.g. a dict filled from
            `tf.train.load_checkpoint(prefix).get_tensor`), or a callable name -> array.
        config: dict. The `bert_config.json` contents (`hidden_act` "gelu" = tanh GELU;
            "gelu_exact" selects the erf form for comparisons).
        token_ids, segment_ids, padding_mask: int arrays `(batch_size, sequence_length)`.
        mask_positions: optional int array `(batch_size, num_predictions)`; when given and
            the checkpoint has `cls/...` heads, masked-LM and NSP logits are returned too.

    Returns:
        dict of float64 arrays: `sequence_output`, `pooled_output`, and with heads `mlm`
        `(batch_size, num_predictions, vocab_size)` and `nsp` `(batch_size, 2)`.

    For a checkpoint on disk, pass
    `tf.train.load_checkpoint("uncased_L-2_H-128_A-2/bert_model.ckpt").get_tensor`.
    """
    get = variables if callable(variables) else variables.__getitem__

    def w(name):
        return np.asarray(get(name), dtype=np.float64)

    activation = _ACTIVATIONS[config.get("hidden_act", "gelu")]
    num_heads = int(config["num_attention_heads"])
    token_ids = np.asarray(token_ids)
    batch, length = token_ids.shape

    x = w("bert/embeddings/word_embeddings")[token_ids]
    x = x + w("bert/embeddings/position_embeddings")[:length][None]
    x = x + w("bert/embeddings/token_type_embeddings")[np.asarray(segment_ids)]
    x = _layer_norm(x, w("bert/embeddings/LayerNorm/gamma"), w("bert/embeddings/LayerNorm/beta"))

    hidden = x.shape[-1]
    head_dim = hidden // num_heads
    adder = (1.0 - np.asarray(padding_mask, np.float64))[
        :, None, None, :
    ] * -10000.0  # (b, 1, 1, k)

    def dense(inputs, scope):
        return inputs @ w(f"{scope}/kernel") + w(f"{scope}/bias")

    def heads(t):  # (b, s, hidden) -> (b, heads, s, head_dim)
        return t.reshape(batch, length, num_heads, head_dim).transpose(0, 2, 1, 3)

    for i in range(int(config["num_hidden_layers"])):
        scope = f"bert/encoder/layer_{i}"
        q = heads(dense(x, f"{scope}/attention/self/query"))
        k = heads(dense(x, f"{scope}/attention/self/key"))
        v = heads(dense(x, f"{scope}/attention/self/value"))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(head_dim) + adder  # (b, h, q, k)
        scores = scores - scores.max(axis=-1, keepdims=True)
        probabilities = np.exp(scores)
        probabilities /= probabilities.sum(axis=-1, keepdims=True)
        context = (probabilities @ v).transpose(0, 2, 1, 3).reshape(batch, length, hidden)
        attention = dense(context, f"{scope}/attention/output/dense")
        x = _layer_norm(
            attention + x,
            w(f"{scope}/attention/output/LayerNorm/gamma"),
            w(f"{scope}/attention/output/LayerNorm/beta"),
        )
        intermediate = activation(dense(x, f"{scope}/intermediate/dense"))
        x = _layer_norm(
            dense(intermediate, f"{scope}/output/dense") + x,
            w(f"{scope}/output/LayerNorm/gamma"),
            w(f"{scope}/output/LayerNorm/beta"),
        )

    pooled = np.tanh(dense(x[:, 0], "bert/pooler/dense"))
    outputs = {"sequence_output": x, "pooled_output": pooled}
    if mask_positions is not None:
        positions = np.asarray(mask_positions)
        gathered = np.take_along_axis(x, positions[:, :, None], axis=1)  # (b, p, hidden)
        t = activation(dense(gathered, "cls/predictions/transform/dense"))
        t = _layer_norm(
            t,
            w("cls/predictions/transform/LayerNorm/gamma"),
            w("cls/predictions/transform/LayerNorm/beta"),
        )
        outputs["mlm"] = t @ w("bert/embeddings/word_embeddings").T + w(
            "cls/predictions/output_bias"
        )
        outputs["nsp"] = pooled @ w("cls/seq_relationship/output_weights").T + w(
            "cls/seq_relationship/output_bias"
        )
    return outputs
