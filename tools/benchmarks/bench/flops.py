"""Model shapes and analytic matmul FLOPs of each workload (no framework needed)."""

import re


def resolve_preset(name):
    """Returns the backbone shape (a dict of BertBackbone arguments) of a preset name or shape.

    A shape is `L<layers>-H<hidden>-A<heads>` (the uncased vocabulary of 30,522 tokens) or
    `L<layers>-H<hidden>-A<heads>-V<vocabulary>`; the intermediate width is 4 x hidden.
    """
    match = re.fullmatch(r"L(\d+)-H(\d+)-A(\d+)(?:-V(\d+))?", name)
    if match:
        layers, hidden, heads = (int(g) for g in match.groups()[:3])
        return {
            "vocabulary_size": int(match.group(4) or 30522),
            "num_layers": layers,
            "num_heads": heads,
            "hidden_dim": hidden,
            "intermediate_dim": 4 * hidden,
            "max_sequence_length": 512,
        }
    from kbert.models.presets import BACKBONE_PRESETS

    if name not in BACKBONE_PRESETS:
        raise ValueError(
            "`--preset` must be a kbert preset name or a shape "
            "`L<layers>-H<hidden>-A<heads>[-V<vocabulary>]`. "
            f"Received: {name!r}; presets: {sorted(BACKBONE_PRESETS)}"
        )
    config = BACKBONE_PRESETS[name]["config"]
    keys = (
        "vocabulary_size",
        "num_layers",
        "num_heads",
        "hidden_dim",
        "intermediate_dim",
        "max_sequence_length",
    )
    return {key: config[key] for key in keys}


def forward_flops(shape, sequence_length, workload, num_masks=20, num_classes=2):
    """Matmul FLOPs of one forward pass of one sequence (2 x multiply-adds).

    Encoder: the four attention projections and the two feed-forward matmuls per token, plus
    the two attention products (scores and context) per layer; the pooler. Heads: the
    classifier, or the masked-LM transform and tied decoder at `num_masks` positions plus the
    next-sentence classifier. Embedding lookups, LayerNorm, softmax and GELU are not counted
    (the usual model-FLOPs convention).
    """
    h, i, n = shape["hidden_dim"], shape["intermediate_dim"], shape["num_layers"]
    s = sequence_length
    per_layer = 2 * s * (4 * h * h + 2 * h * i) + 2 * 2 * s * s * h
    flops = n * per_layer + 2 * h * h  # + pooler on [CLS]
    if workload == "finetune":
        flops += 2 * h * num_classes
    elif workload == "pretrain":
        flops += 2 * num_masks * (h * h + h * shape["vocabulary_size"]) + 2 * h * 2
    return flops


def encoder_matmuls(shape, batch_size, sequence_length):
    """The matmuls of the encoder's forward pass as `(count, batch, m, k, n)` (a `batch` of
    `m x k` by `k x n` products, `count` times): the shapes `forward_flops` counts for the
    encoder, at the batch's size (the pooler's one small product is left out)."""
    h, i, n = shape["hidden_dim"], shape["intermediate_dim"], shape["num_layers"]
    heads = shape["num_heads"]
    tokens, d = batch_size * sequence_length, h // heads
    return [
        (4 * n, 1, tokens, h, h),  # query, key, value, attention output
        (n, 1, tokens, h, i),  # feed-forward in
        (n, 1, tokens, i, h),  # feed-forward out
        (n, batch_size * heads, sequence_length, d, sequence_length),  # scores
        (n, batch_size * heads, sequence_length, sequence_length, d),  # context
    ]


def step_flops(shape, sequence_length, workload, num_masks=20):
    """FLOPs per sequence of the workload: forward only for inference, 3 x forward when training."""
    multiplier = 1 if workload == "inference" else 3
    return multiplier * forward_flops(shape, sequence_length, workload, num_masks)
