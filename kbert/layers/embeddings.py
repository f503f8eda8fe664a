"""Token, position and segment embeddings of BERT."""

import keras
from keras import ops

from kbert import backend
from kbert.layers.dropout import HashDropout
from kbert.layers.utils import (
    BuiltFromCheckpoint,
    KerasQuantization,
    check_index_range,
    clone_initializer,
    float32_policy,
)


@keras.saving.register_keras_serializable(package="kbert")
class DenseGradientEmbedding(BuiltFromCheckpoint, KerasQuantization, keras.layers.Embedding):
    """`keras.layers.Embedding` whose table gets a dense gradient on every backend.

    On TensorFlow a gather's gradient is an `IndexedSlices` with one row per looked-up id,
    repeated ids included. Keras' TensorFlow optimizers apply such gradients row by row, so
    Adam's second moment sees the squares of the parts instead of the square of their sum:
    a token that occurs twice in a batch moves by more than the learning rate (and
    `MirroredStrategy`, which concatenates the replicas' slices, moves even the position
    table differently from one device). Summing the rows into a dense gradient first, as
    JAX and PyTorch do, gives the same update on all three backends. Outputs are unchanged.
    `quantize` takes the modes Keras' `Embedding` takes (int8, int4).

    Args:
        input_dim, output_dim, **kwargs: as `keras.layers.Embedding`.
    """

    def call(self, inputs):
        if not backend.needs_dense_embedding_gradient():
            return super().call(inputs)
        if inputs.dtype not in ("int32", "int64"):
            inputs = ops.cast(inputs, "int32")
        # The gradient of the product is dense: its rows for repeated ids are summed.
        table = ops.multiply(self.embeddings, ops.cast(1, self.embeddings.dtype))
        return ops.cast(ops.take(table, inputs, axis=0), self.compute_dtype)


@keras.saving.register_keras_serializable(package="kbert")
class ReversibleEmbedding(DenseGradientEmbedding):
    """A token embedding that can also project hidden states back to the vocabulary.

    `call(token_ids)` looks rows up as `keras.layers.Embedding` does;
    `call(hidden_states, reverse=True)` multiplies by the transposed table, which is
    how BERT ties the masked-LM decoder to the input embedding.

    Args:
        input_dim: int. The vocabulary size.
        output_dim: int. The embedding width.
        **kwargs: passed to `keras.layers.Embedding`.

    Example:
    >>> embedding = ReversibleEmbedding(100, 16)
    >>> hidden = embedding(np.array([[1, 2, 3]]))
    >>> logits = embedding(hidden, reverse=True)  # scores against the same embedding table
    >>> tuple(hidden.shape), tuple(logits.shape)
    ((1, 3, 16), (1, 3, 100))
    """

    def call(self, inputs, reverse=False):
        if not reverse:
            return super().call(inputs)  # (..., output_dim)
        table = ops.cast(self.embeddings, self.compute_dtype)
        return ops.matmul(inputs, ops.transpose(table))  # (..., vocabulary_size)

    def quantized_call(self, inputs, reverse=False):
        if not reverse:
            return super().quantized_call(inputs)
        # The quantized table, de-quantized row by row by the layer's own lookup.
        table = super().quantized_call(ops.arange(self.input_dim, dtype="int32"))
        return ops.matmul(inputs, ops.transpose(ops.cast(table, self.compute_dtype)))

    def compute_output_spec(self, inputs, reverse=False):
        if not reverse:
            return super().compute_output_spec(inputs)
        shape = tuple(inputs.shape[:-1]) + (self.input_dim,)
        return keras.KerasTensor(shape, dtype=self.compute_dtype)


def check_sequence_length(token_ids, max_sequence_length):
    """Raises a ValueError when `token_ids` are not `(batch, seq)` or are longer than the
    position table (`max_sequence_length`); a symbolic length (`None`) passes."""
    if len(token_ids.shape) != 2:
        raise ValueError(
            "`token_ids` must have the shape (batch_size, sequence_length). Received shape "
            f"{tuple(token_ids.shape)}"
        )
    sequence_length = token_ids.shape[1]
    if sequence_length is not None and sequence_length > max_sequence_length:
        raise ValueError(
            "The input sequence is longer than `max_sequence_length`. "
            f"Received: sequence_length={sequence_length}, "
            f"max_sequence_length={max_sequence_length}"
        )


@keras.saving.register_keras_serializable(package="kbert")
class BertEmbeddings(keras.layers.Layer):
    """BERT's input embedding: token + learned absolute position + segment, then LayerNorm and
    dropout.

    Args:
        vocabulary_size: int. Size of the WordPiece vocabulary.
        hidden_dim: int. Width of the embeddings (and of the encoder).
        max_sequence_length: int. Number of learned positions. Defaults to `512`.
        num_segments: int. Number of segment (token type) embeddings. Defaults to `2`.
        layer_norm_epsilon: float. Epsilon of the LayerNorm. Defaults to `1e-12`.
        dropout: float. Dropout rate after the LayerNorm. Defaults to `0.1`.
        initializer: initializer for the three tables. Defaults to
            `TruncatedNormal(stddev=0.02)`, as in the original.
        pad_token_id: int or `None`. The token whose embedding row gets no gradient, as
            `padding_idx` in Hugging Face's `BertEmbeddings` (its embedding still enters the
            sum). Matters only where outputs at padded positions reach the loss (an unmasked
            span-QA head). `None` trains every row, as Google's original. Defaults to `0`,
            the id of `[PAD]` in BERT vocabularies.

    Call arguments:
        token_ids: int tensor of shape `(batch_size, sequence_length)`.
        segment_ids: int tensor of shape `(batch_size, sequence_length)`.
        position_ids: optional int tensor of shape `(batch_size, sequence_length)`;
            positions `0..sequence_length-1` when omitted (set it to restart positions
            for every example packed into one row).
        training: bool. Whether dropout is active.

    Example:
    >>> layer = BertEmbeddings(vocabulary_size=100, hidden_dim=16, max_sequence_length=32)
    >>> tuple(layer(np.ones((2, 8), "int32"), np.zeros((2, 8), "int32")).shape)
    (2, 8, 16)

    Reference: Devlin et al., 2018, section 3 and figure 2.
    """

    def __init__(
        self,
        vocabulary_size,
        hidden_dim,
        max_sequence_length=512,
        num_segments=2,
        layer_norm_epsilon=1e-12,
        dropout=0.1,
        initializer=None,
        pad_token_id=0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.vocabulary_size = vocabulary_size
        self.pad_token_id = None if pad_token_id is None else int(pad_token_id)
        self.hidden_dim = hidden_dim
        self.max_sequence_length = max_sequence_length
        self.num_segments = num_segments
        self.layer_norm_epsilon = layer_norm_epsilon
        self.dropout = dropout
        self.initializer = keras.initializers.get(
            initializer or keras.initializers.TruncatedNormal(stddev=0.02)
        )
        self.token_embedding = ReversibleEmbedding(
            vocabulary_size,
            hidden_dim,
            embeddings_initializer=clone_initializer(self.initializer),
            dtype=self.dtype_policy,
            name="token_embedding",
        )
        self.position_embedding = DenseGradientEmbedding(
            max_sequence_length,
            hidden_dim,
            embeddings_initializer=clone_initializer(self.initializer),
            dtype=self.dtype_policy,
            name="position_embedding",
        )
        self.segment_embedding = DenseGradientEmbedding(
            num_segments,
            hidden_dim,
            embeddings_initializer=clone_initializer(self.initializer),
            dtype=self.dtype_policy,
            name="segment_embedding",
        )
        self.layer_norm = keras.layers.LayerNormalization(
            epsilon=layer_norm_epsilon,
            dtype=float32_policy(self.dtype_policy),
            name="embeddings_layer_norm",
        )
        self.dropout_layer = HashDropout(
            dropout, dtype=self.dtype_policy, name="embeddings_dropout"
        )

    def build(self, token_ids_shape, segment_ids_shape=None, position_ids_shape=None):
        self.token_embedding.build(token_ids_shape)
        self.position_embedding.build(token_ids_shape)
        self.segment_embedding.build(token_ids_shape)
        self.layer_norm.build(tuple(token_ids_shape) + (self.hidden_dim,))
        self.built = True

    def call(self, token_ids, segment_ids, position_ids=None, training=None):
        check_sequence_length(token_ids, self.max_sequence_length)
        check_index_range(token_ids, self.vocabulary_size, "token_ids", "vocabulary_size")
        check_index_range(segment_ids, self.num_segments, "segment_ids", "num_segments")
        if position_ids is None:
            position_ids = ops.expand_dims(ops.arange(ops.shape(token_ids)[1], dtype="int32"), 0)
        else:
            check_index_range(
                position_ids, self.max_sequence_length, "position_ids", "max_sequence_length"
            )
        x = backend.call_sublayer(self.token_embedding, token_ids)  # (batch, seq, hidden)
        if self.pad_token_id is not None:
            is_pad = ops.expand_dims(ops.equal(token_ids, self.pad_token_id), -1)
            x = ops.where(is_pad, ops.stop_gradient(x), x)
        x = x + backend.call_sublayer(self.position_embedding, position_ids)  # broadcast over batch
        x = x + backend.call_sublayer(self.segment_embedding, segment_ids)
        x = ops.cast(backend.call_sublayer(self.layer_norm, x), self.compute_dtype)
        return self.dropout_layer(x, training=training) if training else x

    def compute_output_shape(self, token_ids_shape, *args, **kwargs):
        return tuple(token_ids_shape) + (self.hidden_dim,)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "hidden_dim": self.hidden_dim,
                "max_sequence_length": self.max_sequence_length,
                "num_segments": self.num_segments,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "dropout": self.dropout,
                "initializer": keras.initializers.serialize(self.initializer),
                "pad_token_id": self.pad_token_id,
            }
        )
        return config


@keras.saving.register_keras_serializable(package="kbert")
class PackedDocumentMasks(keras.layers.Layer):
    """Attention mask and restarting positions of rows that pack several documents.

    A packed row holds whole documents one after another, then padding. `document_ids` numbers
    them per row: 0 for padding, 1..k for the documents, each a contiguous run. Tokens attend
    only to tokens of their own document, and positions restart at 0 at every document, so each
    document gets the outputs it would get alone in its own row.

    Call arguments:
        document_ids: int tensor `(batch_size, sequence_length)`; 0 marks padding.
        padding_mask: optional bool/int tensor `(batch_size, sequence_length)`; a key that is
            padding there is masked too.

    Returns:
        A tuple: `attention_mask`, bool `(batch_size, sequence_length, sequence_length)`, true
        where query `q` may attend to key `k` (`doc[q] == doc[k] and doc[k] > 0`), the pairwise
        form `BertSelfAttention` takes as its `padding_mask`; and `position_ids`, int32
        `(batch_size, sequence_length)`, the index of each token inside its document (0 at
        padding).

    Example:
    >>> mask, positions = PackedDocumentMasks()(np.array([[1, 1, 1, 2, 2, 0]]))
    >>> keras.ops.convert_to_numpy(positions).tolist()  # restart at each document
    [[0, 1, 2, 0, 1, 0]]
    """

    def call(self, document_ids, padding_mask=None):
        documents = ops.cast(document_ids, "int32")
        real = ops.greater(documents, 0)
        if padding_mask is not None:
            real = ops.logical_and(real, ops.cast(padding_mask, "bool"))
        same = ops.equal(documents[:, :, None], documents[:, None, :])  # (batch, q, k)
        allowed = ops.logical_and(same, real[:, None, :])
        # Position = number of earlier keys of the same document (documents are contiguous).
        length = ops.shape(documents)[1]
        index = ops.arange(length, dtype="int32")
        earlier = ops.less(index[None, :], index[:, None])  # (q, k): k < q
        positions = ops.sum(
            ops.cast(ops.logical_and(allowed, earlier[None, :, :]), "int32"), axis=-1
        )
        return allowed, positions

    def compute_output_spec(self, document_ids, padding_mask=None):
        batch, length = document_ids.shape[0], document_ids.shape[1]
        return (
            keras.KerasTensor((batch, length, length), dtype="bool"),
            keras.KerasTensor((batch, length), dtype="int32"),
        )
