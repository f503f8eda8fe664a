"""BertBackbone: the BERT encoder as a functional Keras model."""

import keras

from kbert import backend
from kbert.layers import BertEmbeddings, BertPooler, TransformerEncoder
from kbert.layers.embeddings import PackedDocumentMasks, check_sequence_length
from kbert.models.input_checks import HostInputChecks, check_model_inputs
from kbert.models.presets import PresetMixin
from kbert.models.quantization import QuantizationMixin

BACKBONE_INPUTS = ("token_ids", "segment_ids", "padding_mask")
# Inputs of a backbone built with `packed=True` (several documents per row).
PACKED_BACKBONE_INPUTS = BACKBONE_INPUTS + ("document_ids",)


def resolve_dtype_policy(dtype):
    """`dtype` (a name, config dict, policy or `None` for the global policy) as a DTypePolicy.

    Raises a ValueError naming the received value when it is not a dtype policy.
    """
    if dtype is None:
        return keras.dtype_policies.get(keras.config.dtype_policy())
    try:
        return keras.dtype_policies.get(dtype)
    except (ValueError, TypeError) as error:
        raise ValueError(
            f"Unknown dtype policy: dtype={dtype!r}. Expected a float dtype name such as "
            '"float32" or "bfloat16", "mixed_bfloat16", "mixed_float16", or a '
            f"`keras.DTypePolicy`. ({error})"
        ) from None


def check_input_keys(inputs, expected, model_name):
    """Raises a ValueError when a dict input lacks keys the model needs or has keys it does not
    use."""
    if not isinstance(inputs, dict):
        raise ValueError(
            f"{model_name} expects a dict with keys {sorted(expected)}. "
            f"Received: {type(inputs).__name__}"
        )
    missing = sorted(set(expected) - set(inputs))
    extra = sorted(set(inputs) - set(expected))
    if missing or extra:
        raise ValueError(
            f"{model_name} expects exactly the input keys {sorted(expected)}. "
            f"Received keys {sorted(inputs)} (missing: {missing}, unexpected: {extra})"
        )


_ACTIVATION_NAMES = ("gelu", "gelu_approximate", "relu", "tanh")
_SIZE_ARGUMENTS = (
    "vocabulary_size",
    "num_layers",
    "num_heads",
    "hidden_dim",
    "intermediate_dim",
    "max_sequence_length",
    "num_segments",
)
_REQUIRED_ARGUMENTS = _SIZE_ARGUMENTS[:5]
# Far beyond any published BERT (48 layers): a bound so that a mistaken or hostile config
# (`num_hidden_layers: 1e6`) fails at once instead of building layers until killed.
MAX_LAYERS = 1024
_BACKBONE_ARGUMENTS = _SIZE_ARGUMENTS + (
    "dropout",
    "attention_dropout",
    "activation",
    "layer_norm_epsilon",
    "pad_token_id",
    "flash_attention",
    "attention_implementation",
    "remat",
    "packed",
    "output_hidden_states",
    "output_attentions",
    "dtype",
    "name",
    "trainable",
)


def _is_int(value):
    return (
        isinstance(value, int)
        and not isinstance(value, bool)
        or (
            type(value).__module__ == "numpy"
            and getattr(value, "dtype", None) is not None
            and value.dtype.kind in "iu"
        )
    )


def _host_memory_bytes():
    try:
        import os

        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def backbone_parameter_count(
    vocabulary_size,
    num_layers,
    hidden_dim,
    intermediate_dim,
    max_sequence_length=512,
    num_segments=2,
    **unused,
):
    """The number of weights of a `BertBackbone` configuration, computed without building it."""
    h, i = hidden_dim, intermediate_dim
    embeddings = (vocabulary_size + max_sequence_length + num_segments) * h + 2 * h
    layer = 4 * (h * h + h) + 2 * h * i + i + h + 4 * h
    return embeddings + num_layers * layer + h * h + h


def validate_backbone_config(config, source=None):
    """Raises a ValueError for a `BertBackbone` configuration that cannot be built.

    Checks, before any layer is created: required and unknown arguments, types (sizes are
    integers, rates floats), ranges (positive sizes, dropout in [0, 1), epsilon > 0,
    `pad_token_id` a valid id), `hidden_dim % num_heads == 0`, a known activation name, and
    that the weights fit in the host's memory (a hostile `hidden_dim` or `num_layers` fails
    here in microseconds instead of exhausting the host).

    Args:
        config: dict of `BertBackbone` arguments.
        source: optional str naming where the config came from (a file), used in messages.
    """
    where = f" (in {source})" if source else ""
    if not isinstance(config, dict):
        raise ValueError(
            f"A backbone config must be a dict{where}. Received: {type(config).__name__}"
        )
    missing = [k for k in _REQUIRED_ARGUMENTS if k not in config]
    if missing:
        raise ValueError(f"The backbone config lacks required arguments {missing}{where}.")
    unknown = sorted(k for k in config if k not in _BACKBONE_ARGUMENTS)
    if unknown:
        raise ValueError(
            f"Unknown BertBackbone arguments {unknown}{where}. Expected some of "
            f"{sorted(_BACKBONE_ARGUMENTS)}."
        )
    for name in _SIZE_ARGUMENTS:
        value = config.get(name, 1)
        if not _is_int(value) or value < 1:
            raise ValueError(
                f"`{name}` must be a positive integer. Received: {name}={value!r}"
                f" ({type(value).__name__}){where}"
            )
    if config["num_layers"] > MAX_LAYERS:
        raise ValueError(
            f"`num_layers` must be at most {MAX_LAYERS}. Received: "
            f"num_layers={config['num_layers']}{where}"
        )
    if config["hidden_dim"] % config["num_heads"]:
        raise ValueError(
            "`hidden_dim` must be divisible by `num_heads`. Received: "
            f"hidden_dim={config['hidden_dim']}, num_heads={config['num_heads']}{where}"
        )
    for name in ("dropout", "attention_dropout"):
        value = config.get(name, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise ValueError(
                f"`{name}` must be a number in [0, 1). Received: {name}={value!r}{where}"
            )
    epsilon = config.get("layer_norm_epsilon", 1e-12)
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not 0 < epsilon < 1:
        raise ValueError(
            "`layer_norm_epsilon` must be a number in (0, 1). Received: "
            f"layer_norm_epsilon={epsilon!r}{where}"
        )
    activation = config.get("activation", "gelu")
    if not isinstance(activation, str) or activation not in _ACTIVATION_NAMES:
        raise ValueError(
            f"Unknown `activation`: it must be one of {list(_ACTIVATION_NAMES)} (a name, so that "
            f"the config can be saved and loaded). Received: activation={activation!r}{where}"
        )
    pad = config.get("pad_token_id", 0)
    if pad is not None and (not _is_int(pad) or not 0 <= pad < config["vocabulary_size"]):
        raise ValueError(
            "`pad_token_id` must be None or a token id in [0, "
            f"vocabulary_size={config['vocabulary_size']}). "
            f"Received: pad_token_id={pad!r}{where}"
        )
    for name in ("flash_attention",):
        if config.get(name) not in (None, True, False):
            raise ValueError(
                f"`{name}` must be None, True or False. Received: {name}={config[name]!r}{where}"
            )
    implementation = config.get("attention_implementation", "auto")
    if implementation not in backend.ATTENTION_IMPLEMENTATIONS:
        raise ValueError(
            "`attention_implementation` must be one of "
            f"{list(backend.ATTENTION_IMPLEMENTATIONS)}. "
            f"Received: attention_implementation={implementation!r}{where}"
        )
    if not isinstance(config.get("remat", False), bool):
        raise ValueError(
            f"`remat` must be True or False. Received: remat={config['remat']!r}{where}"
        )
    for name in ("packed", "output_hidden_states", "output_attentions"):
        if not isinstance(config.get(name, False), bool):
            raise ValueError(
                f"`{name}` must be True or False. Received: {name}={config[name]!r} "
                f"({type(config[name]).__name__}){where}"
            )
    count = backbone_parameter_count(**{k: config[k] for k in config if k in _SIZE_ARGUMENTS})
    memory = _host_memory_bytes()
    if memory and count * 4 > memory:
        raise ValueError(
            f"This backbone config has {count:,} weights ({count * 4 / 2**30:,.1f} GiB in "
            "float32), "
            f"more than this machine's memory ({memory / 2**30:,.1f} GiB){where}. Received: "
            + ", ".join(f"{k}={config[k]}" for k in _SIZE_ARGUMENTS if k in config)
        )


@keras.saving.register_keras_serializable(package="kbert")
class BertBackbone(PresetMixin, QuantizationMixin, HostInputChecks, keras.Model):
    """The BERT encoder: embeddings, `num_layers` post-LayerNorm transformer blocks, pooler.

    A functional `keras.Model` that runs unchanged on TensorFlow, JAX and PyTorch. Inputs are a
    dict of `token_ids`, `segment_ids` and `padding_mask` (1/True for real tokens), each of
    shape `(batch_size, sequence_length)` with `sequence_length <= max_sequence_length`.
    Outputs are a dict of `sequence_output` `(batch_size, sequence_length, hidden_dim)` and
    `pooled_output` `(batch_size, hidden_dim)` (dense + tanh on [CLS]); with
    `output_hidden_states=True` also `hidden_states`, and with `output_attentions=True`
    also `attentions` (see Args), as Hugging Face's `BertModel` returns them.

    Token ids outside `[0, vocabulary_size)`, segment ids outside `[0, num_segments)`, float
    ids and sequences longer than `max_sequence_length` raise a `ValueError` on every backend.
    Ids are checked on the host, before they reach the device: NumPy and list inputs of
    `model(x)`, `fit`, `evaluate`, `predict` and `*_on_batch` once per call, and every batch
    of a `tf.data.Dataset` inside its pipeline (see `kbert.models.input_checks`). No step
    reads a device tensor back. Backend tensors passed to `model(x)` directly and batches
    from Python generators are not range-checked: on JAX an out-of-range id there gives a
    NaN row, on TensorFlow-XLA the last row, on torch an index error.

    Args:
        vocabulary_size: int. Size of the WordPiece vocabulary.
        num_layers: int. Number of transformer blocks.
        num_heads: int. Attention heads per block.
        hidden_dim: int. Model width; divisible by `num_heads`.
        intermediate_dim: int. Feed-forward width.
        max_sequence_length: int. Number of learned positions. Defaults to `512`.
        num_segments: int. Number of segment (token type) ids. Defaults to `2`.
        dropout: float. Dropout on embeddings and block outputs. Defaults to `0.1`.
        attention_dropout: float. Dropout on attention probabilities. Defaults to `0.1`.
        activation: str. Feed-forward activation: `"gelu"` (exact), `"gelu_approximate"`
            (tanh form of the original TensorFlow code), `"relu"` or `"tanh"`; a name, so
            that the config can be saved. Defaults to `"gelu"`.
        layer_norm_epsilon: float. Defaults to `1e-12`.
        pad_token_id: int or `None`. Token id whose embedding row is not trained (Hugging
            Face's `padding_idx`; see `BertEmbeddings`). Defaults to `0`.
        flash_attention: `None` (backend decides), `True` or `False`. Defaults to `None`.
        attention_implementation: `"auto"` (the backend's fused attention), `"plain"`
            (kbert's softmax-matmul in `keras.ops`, the same program on every backend),
            `"fused"` (`keras.ops.dot_product_attention`) or `"torch_sdpa"` (torch only);
            see `kbert.layers.BertSelfAttention`. It changes no weight, only how attention
            is computed. Defaults to `"auto"`.
        remat: bool. Rematerialise (recompute) each transformer block in the backward pass
            instead of keeping its activations: training memory grows with the number of
            blocks' inputs only, at the cost of about one more forward pass. For long
            sequences and large batches. Defaults to `False`.
        packed: bool. Take a fourth input, `document_ids` `(batch_size, sequence_length)`,
            for rows that pack several documents (see `kbert.data.packed_pretraining_dataset`):
            0 marks padding and 1..k the documents of the row, each a contiguous run. Tokens
            then attend only inside their own document and positions restart at 0 for every
            document, so each document's outputs equal those it gets alone in its own row.
            Adds no weights: a preset loads with `packed=True` or `False` alike. Defaults to
            `False`.
        output_hidden_states: bool. Add `"hidden_states"` to the outputs: a tuple of
            `num_layers + 1` tensors `(batch_size, sequence_length, hidden_dim)`, the
            embeddings' output and then every transformer block's output (the last is
            `sequence_output`), in the compute dtype; Hugging Face's `hidden_states`, in its
            order. For feature-based use (the paper's section 5.3). Adds no weights.
            Defaults to `False`.
        output_attentions: bool. Add `"attentions"` to the outputs: a tuple of `num_layers`
            tensors `(batch_size, num_heads, sequence_length, sequence_length)`, every
            block's attention probabilities (keys that are padding, or in another document
            of a packed row, get 0), in the compute dtype; Hugging Face's `attentions`. The
            attention then takes its explicit softmax route (see
            `kbert.layers.BertSelfAttention`), which is slower than the fused kernels.
            Adds no weights. Defaults to `False`.
        dtype: dtype policy, e.g. `"float32"`, `"mixed_bfloat16"`. Defaults to the global policy.

    Example:
    >>> backbone = BertBackbone(vocabulary_size=1000, num_layers=2, num_heads=2,
    ...                         hidden_dim=64, intermediate_dim=128)
    >>> outputs = backbone({
    ...     "token_ids": np.array([[101, 7, 8, 102, 0]]),
    ...     "segment_ids": np.zeros((1, 5), "int32"),
    ...     "padding_mask": np.array([[1, 1, 1, 1, 0]]),
    ... })
    >>> tuple(outputs["sequence_output"].shape), tuple(outputs["pooled_output"].shape)
    ((1, 5, 64), (1, 64))

    Every layer's output and attention probabilities, e.g. for feature-based tagging:
    >>> backbone = BertBackbone(vocabulary_size=1000, num_layers=2, num_heads=2,
    ...                         hidden_dim=64, intermediate_dim=128,
    ...                         output_hidden_states=True, output_attentions=True)
    >>> outputs = backbone({
    ...     "token_ids": np.array([[101, 7, 8, 102, 0]]),
    ...     "segment_ids": np.zeros((1, 5), "int32"),
    ...     "padding_mask": np.array([[1, 1, 1, 1, 0]]),
    ... })
    >>> len(outputs["hidden_states"]), tuple(outputs["attentions"][0].shape)
    (3, (1, 2, 5, 5))

    Reference: Devlin et al., 2018, "BERT: Pre-training of Deep Bidirectional Transformers
    for Language Understanding", arXiv:1810.04805.
    """

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim,
        max_sequence_length=512,
        num_segments=2,
        dropout=0.1,
        attention_dropout=0.1,
        activation="gelu",
        layer_norm_epsilon=1e-12,
        pad_token_id=0,
        flash_attention=None,
        remat=False,
        packed=False,
        dtype=None,
        attention_implementation="auto",
        output_hidden_states=False,
        output_attentions=False,
        **kwargs,
    ):
        config = {
            "vocabulary_size": vocabulary_size,
            "num_layers": num_layers,
            "num_heads": num_heads,
            "hidden_dim": hidden_dim,
            "intermediate_dim": intermediate_dim,
            "max_sequence_length": max_sequence_length,
            "num_segments": num_segments,
            "dropout": dropout,
            "attention_dropout": attention_dropout,
            "activation": activation,
            "layer_norm_epsilon": layer_norm_epsilon,
            "pad_token_id": pad_token_id,
            "flash_attention": flash_attention,
            "attention_implementation": attention_implementation,
            "remat": remat,
            "packed": packed,
            "output_hidden_states": output_hidden_states,
            "output_attentions": output_attentions,
        }
        validate_backbone_config(config)
        unknown = sorted(set(kwargs) - {"name", "trainable"})
        if unknown:
            raise ValueError(
                f"Unknown BertBackbone arguments {unknown}. Expected some of "
                f"{sorted(_BACKBONE_ARGUMENTS)}."
            )
        dtype = resolve_dtype_policy(dtype)
        embeddings, transformer_layers, pooler = self._build_layers(config, dtype)
        inputs, outputs = self._connect(
            embeddings, transformer_layers, pooler, packed, output_hidden_states, output_attentions
        )
        super().__init__(inputs=inputs, outputs=outputs, dtype=dtype, **kwargs)
        # A functional `keras.Model` drops `dtype`: keep the policy on the model itself, so
        # that heads built from `backbone.dtype_policy` and the saved config follow it.
        self.dtype_policy = dtype
        # Layer attributes are set after `Model.__init__` (torch modules require it).
        self.embeddings = embeddings
        self.transformer_layers = transformer_layers
        self.pooler = pooler
        # The config, one attribute per argument.
        for name, value in config.items():
            setattr(self, name, value)
        self.input_names = PACKED_BACKBONE_INPUTS if packed else BACKBONE_INPUTS
        backend.prepare_lean_backbone(self)

    @staticmethod
    def _build_layers(config, dtype):
        """The embeddings, the `num_layers` encoder blocks and the pooler of `config`."""
        embeddings = BertEmbeddings(
            vocabulary_size=config["vocabulary_size"],
            hidden_dim=config["hidden_dim"],
            max_sequence_length=config["max_sequence_length"],
            num_segments=config["num_segments"],
            layer_norm_epsilon=config["layer_norm_epsilon"],
            dropout=config["dropout"],
            pad_token_id=config["pad_token_id"],
            dtype=dtype,
            name="embeddings",
        )
        transformer_layers = [
            TransformerEncoder(
                num_heads=config["num_heads"],
                intermediate_dim=config["intermediate_dim"],
                activation=config["activation"],
                dropout=config["dropout"],
                attention_dropout=config["attention_dropout"],
                layer_norm_epsilon=config["layer_norm_epsilon"],
                flash_attention=config["flash_attention"],
                attention_implementation=config["attention_implementation"],
                remat=config["remat"],
                dtype=dtype,
                name=f"transformer_layer_{i}",
            )
            for i in range(config["num_layers"])
        ]
        pooler = BertPooler(config["hidden_dim"], dtype=dtype, name="pooler")
        return embeddings, transformer_layers, pooler

    @staticmethod
    def _connect(
        embeddings,
        transformer_layers,
        pooler,
        packed,
        output_hidden_states=False,
        output_attentions=False,
    ):
        """The functional graph: the `keras.Input`s and the outputs of the layers on them."""
        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        segment_ids = keras.Input(shape=(None,), dtype="int32", name="segment_ids")
        padding_mask = keras.Input(shape=(None,), dtype="int32", name="padding_mask")
        inputs = {
            "token_ids": token_ids,
            "segment_ids": segment_ids,
            "padding_mask": padding_mask,
        }
        if packed:
            document_ids = keras.Input(shape=(None,), dtype="int32", name="document_ids")
            inputs["document_ids"] = document_ids
            # A (batch, seq, seq) mask of same-document pairs replaces the key padding mask.
            attention_mask, position_ids = PackedDocumentMasks(name="packed_document_masks")(
                document_ids, padding_mask
            )
            x = embeddings(token_ids, segment_ids, position_ids)
        else:
            attention_mask = padding_mask
            x = embeddings(token_ids, segment_ids)  # (batch, seq, hidden)
        hidden_states, attentions = [x], []
        for layer in transformer_layers:
            if output_attentions:
                x, probabilities = layer(
                    x, padding_mask=attention_mask, return_attention_scores=True
                )
                attentions.append(probabilities)  # (batch, heads, seq, seq)
            else:
                x = layer(x, padding_mask=attention_mask)
            hidden_states.append(x)
        outputs = {"sequence_output": x, "pooled_output": pooler(x)}
        if output_hidden_states:
            outputs["hidden_states"] = tuple(hidden_states)
        if output_attentions:
            outputs["attentions"] = tuple(attentions)
        return inputs, outputs

    @classmethod
    def get_layout_map(
        cls,
        device_mesh,
        model_parallel_dim_name="model",
        data_parallel_dim_name="batch",
    ):
        """A `keras.distribution.LayoutMap` that shards the backbone Megatron-style.

        Within every transformer block the query, key, value and intermediate kernels are
        split by output column over the model-parallel axis (each device holds whole heads
        and a slice of the feed-forward width) and the attention-output and output kernels
        by input row, so each block needs one all-reduce after attention and one after the
        feed-forward layer (Shoeybi et al., 2019, "Megatron-LM", section 3). Biases of
        column-split layers are split with them. The embedding tables and the pooler are
        split along the hidden dimension. The other dimension of every kernel is split over
        the data-parallel axis (weights fully sharded and gathered when used, as keras-hub
        does); pass `data_parallel_dim_name=None` to replicate weights along it. LayerNorm
        parameters and the remaining biases are replicated.

        Hidden and intermediate widths must be divisible by the size of the model axis
        (and the hidden width by the data axis when weights are split over it), and
        `num_heads` by the model axis so that heads stay whole; `kbert.distribution.
        model_parallel(...)` checks this for a given configuration.

        Use it with `keras.distribution.ModelParallel` (JAX), creating the model inside the
        distribution's scope so that variables are created sharded.

        Args:
            device_mesh: `keras.distribution.DeviceMesh`.
            model_parallel_dim_name: str. Mesh axis that splits the weights. Defaults to
                `"model"`.
            data_parallel_dim_name: str or None. Mesh axis that splits the batch (and the
                other weight dimension). Defaults to `"batch"`.

        Returns:
            `keras.distribution.LayoutMap` keyed by regular expressions over variable paths.

        Example, on JAX with 8 devices:

            mesh = keras.distribution.DeviceMesh((2, 4), ["batch", "model"])
            layout_map = BertBackbone.get_layout_map(mesh)
            distribution = keras.distribution.ModelParallel(
                layout_map=layout_map, batch_dim_name="batch")
            with distribution.scope():
                backbone = BertBackbone.from_preset("bert_base_en_uncased")
        """
        if not isinstance(device_mesh, keras.distribution.DeviceMesh):
            raise ValueError(
                "`device_mesh` must be a `keras.distribution.DeviceMesh`. "
                f"Received: {type(device_mesh).__name__}"
            )
        axis_names = list(device_mesh.axis_names)
        if model_parallel_dim_name not in axis_names:
            raise ValueError(
                f"The device mesh has no axis named {model_parallel_dim_name!r} "
                "(`model_parallel_dim_name`) to split the weights over. "
                f"Received a mesh with axes {axis_names} and shape {tuple(device_mesh.shape)}."
            )
        if data_parallel_dim_name is not None and data_parallel_dim_name not in axis_names:
            raise ValueError(
                f"The device mesh has no axis named {data_parallel_dim_name!r} "
                "(`data_parallel_dim_name`; pass None for a model-parallel-only layout). "
                f"Received a mesh with axes {axis_names} and shape {tuple(device_mesh.shape)}."
            )
        if data_parallel_dim_name == model_parallel_dim_name:
            raise ValueError(
                "`model_parallel_dim_name` and `data_parallel_dim_name` must differ. "
                f"Received: both {model_parallel_dim_name!r}"
            )
        model, data = model_parallel_dim_name, data_parallel_dim_name
        prefix = r"(.*/)?"  # The backbone may be nested in a task model.
        block = prefix + r"transformer_layer_\d+/"
        layout_map = keras.distribution.LayoutMap(device_mesh)
        # Embeddings: the vocabulary size (30,522) rarely divides a mesh axis; split hidden.
        layout_map[prefix + "embeddings/(token|position|segment)_embedding/embeddings"] = (
            None,
            model,
        )
        # Column-parallel: output features (whole heads) over the model axis.
        layout_map[block + "self_attention/(query|key|value)/kernel"] = (data, model)
        layout_map[block + "self_attention/(query|key|value)/bias"] = (model,)
        layout_map[block + "intermediate_dense/kernel"] = (data, model)
        layout_map[block + "intermediate_dense/bias"] = (model,)
        # Row-parallel: input features over the model axis; the sum is all-reduced.
        layout_map[block + "self_attention/attention_output/kernel"] = (model, data)
        layout_map[block + "output_dense/kernel"] = (model, data)
        layout_map[prefix + "pooler/pooler_dense/kernel"] = (data, model)
        layout_map[prefix + "pooler/pooler_dense/bias"] = (model,)
        return layout_map

    @property
    def token_embedding(self):
        """The `ReversibleEmbedding` holding the token table (tied to the MLM decoder)."""
        return self.embeddings.token_embedding

    def call(self, inputs, training=None, mask=None, first_token_only=False):
        """The outputs dict (see the class docstring) of `inputs`.

        `first_token_only=True` is for heads that read only the [CLS] position (through
        `pooled_output`): the last block then computes that position alone, its attention
        still reading every position, so `pooled_output` equals the full call's and
        `sequence_output` is its first row, `(batch_size, 1, hidden_dim)`; the last block's
        feed-forward and attention output run on one row instead of `sequence_length`. A
        backbone with `packed`, `output_hidden_states` or `output_attentions` runs in full.
        """
        check_input_keys(inputs, self.input_names, "BertBackbone")
        check_model_inputs(inputs, self)
        # Here too, not only in the embeddings: the lean path (torch) does not call them.
        check_sequence_length(inputs["token_ids"], self.max_sequence_length)
        outputs = backend.lean_backbone_outputs(self, inputs, training, first_token_only)
        if outputs is not None:
            return outputs
        if not (first_token_only and self._computes_first_token_only()):
            return super().call(inputs, training=training, mask=mask)
        token_ids, segment_ids, padding_mask = (
            _int32_tensor(inputs[name]) for name in ("token_ids", "segment_ids", "padding_mask")
        )
        x = self.embeddings(token_ids, segment_ids, training=training)
        last = len(self.transformer_layers) - 1
        for index, layer in enumerate(self.transformer_layers):
            query_length = 1 if index == last else None
            x = layer(x, padding_mask=padding_mask, training=training, query_length=query_length)
        return {"pooled_output": self.pooler(x), "sequence_output": x}

    def predict_step(self, *args):
        """Keras' predict step (`predict`, `predict_on_batch`); on eager torch, where the lean
        path computes the call, that path directly, without Keras' `__call__` around it.

        Takes Keras' arguments of the backend: `(data)`, or `(state, data)` on JAX, where
        Keras' own step runs.

        For a forward pass without gradients the `__call__` machinery changes nothing there
        (input conversion, call context, autocast scope, the clearing of every sublayer's
        losses: the lean path converts its inputs and casts its own weights, and `predict`
        reads no losses) but costs about a quarter of a small backbone's call on the host
        (BENCHMARKS.md, "Host cost on torch"). A torch forward hook on the backbone therefore
        does not run in `predict`; it does in `backbone(inputs)`.
        """
        if keras.backend.backend() != "torch" or len(args) != 1:
            return super().predict_step(*args)
        x, _, _ = keras.utils.unpack_x_y_sample_weight(args[0])
        if isinstance(x, dict) and all(name in x for name in self.input_names):
            check_model_inputs(x, self)  # (`predict_on_batch` hands NumPy arrays through)
            x = {name: keras.ops.convert_to_tensor(value) for name, value in x.items()}
            outputs = backend.lean_backbone_outputs(self, x, training=False)
            if outputs is not None:
                return outputs
        return super().predict_step(*args)

    def compute_output_spec(self, inputs, training=None, mask=None, first_token_only=False):
        spec = super().compute_output_spec(inputs, training=training, mask=mask)
        if first_token_only and self._computes_first_token_only():
            batch, _, hidden = spec["sequence_output"].shape
            first = keras.KerasTensor((batch, 1, hidden), dtype=spec["sequence_output"].dtype)
            spec = {**spec, "sequence_output": first}
        return spec

    def _computes_first_token_only(self):
        """Whether `call(first_token_only=True)` can skip the last block's other rows."""
        return not (self.packed or self.output_hidden_states or self.output_attentions)

    def get_config(self):
        return {
            "name": self.name,
            "trainable": self.trainable,
            "dtype": keras.dtype_policies.serialize(self.dtype_policy),
            "vocabulary_size": self.vocabulary_size,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "hidden_dim": self.hidden_dim,
            "intermediate_dim": self.intermediate_dim,
            "max_sequence_length": self.max_sequence_length,
            "num_segments": self.num_segments,
            "dropout": self.dropout,
            "attention_dropout": self.attention_dropout,
            "activation": self.activation,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "pad_token_id": self.pad_token_id,
            "flash_attention": self.flash_attention,
            "attention_implementation": self.attention_implementation,
            "remat": self.remat,
            "packed": self.packed,
            "output_hidden_states": self.output_hidden_states,
            "output_attentions": self.output_attentions,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    # === LoRA (see kbert/models/lora.py) ===
    def enable_lora(self, rank, alpha=None, feedforward=False):
        """Enables LoRA (Keras' `Dense.enable_lora`) and freezes every other backbone weight.

        Adapts the query, key, value and attention-output projections of every block (and
        the two feed-forward layers with `feedforward=True`); embeddings, LayerNorms, biases
        and the pooler are frozen. Full saves (`save_weights`, `.keras`, `save_to_preset`)
        store the adapter merged into the kernels; `save_lora_weights` stores it alone.

        Args:
            rank: int. Rank of the update, in `[1, min(kernel dimensions)]`.
            alpha: float or `None`. The update is scaled by `alpha / rank`. Defaults to
                `None`, i.e. `rank` (a scale of 1).
            feedforward: bool. Also adapt `intermediate_dense` and `output_dense`.
                Defaults to `False`.

        Example:
        >>> backbone = BertBackbone(vocabulary_size=100, num_layers=1, num_heads=2,
        ...                         hidden_dim=16, intermediate_dim=32)
        >>> backbone.enable_lora(rank=4)
        >>> # A (16 x 4) and B (4 x 16) for the query, key, value and output projections:
        >>> sum(int(np.prod(v.shape)) for v in backbone.trainable_weights)
        512
        """
        from kbert.models.lora import enable_lora

        enable_lora(self, rank, alpha=alpha, feedforward=feedforward)

    def save_lora_weights(self, path):
        """Writes the LoRA matrices alone to the `.safetensors` file `path` (atomically)."""
        from kbert.models.lora import save_lora_weights

        save_lora_weights(self, path)

    def load_lora_weights(self, path):
        """Reads LoRA matrices written by `save_lora_weights`; LoRA must be enabled with the
        same rank, alpha and layers (a mismatch names the tensor and both shapes)."""
        from kbert.models.lora import load_lora_weights

        load_lora_weights(self, path)

    def merge_lora(self):
        """Returns a new model of this class with the LoRA update merged into the kernels and
        no LoRA variables (same outputs up to float rounding; for export and serving)."""
        from kbert.models.lora import merge_lora

        return merge_lora(self)

    @staticmethod
    def validate_config(config, source=None):
        """Raises a ValueError for a config that cannot be built (see `validate_backbone_config`).

        The checkpoint loaders call it on a checkpoint's translated config before they
        compare it with the weights' shapes and build anything.
        """
        validate_backbone_config(config, source=source)


def _int32_tensor(x):
    """`x` as an int32 backend tensor (the dtype of the backbone's `keras.Input`s)."""
    x = keras.ops.convert_to_tensor(x)
    if keras.backend.standardize_dtype(x.dtype) != "int32":
        x = keras.ops.cast(x, "int32")
    return x


# A backbone is its own preset class (`PresetMixin.from_preset` builds `backbone_cls`).
BertBackbone.backbone_cls = BertBackbone
