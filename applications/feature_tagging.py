"""The feature-based approach of the BERT paper (section 5.3, Table 7) for ner.py's `--features`.

The backbone stays frozen: its hidden states are computed once for the training and dev
sentences, the first WordPiece of each word is kept (gathered on the host, so a sentence costs
`words x layers x hidden_dim` floats, not `pieces x ...`), and a two-layer bidirectional LSTM
tagger is trained on those word features with `fit`. Only the hidden states a variant uses are
kept.

Variants (the rows of Table 7; `L` is the number of transformer layers, hidden state 0 is the
embeddings' output):

- `embeddings`: hidden state 0 ("Embeddings").
- `second-to-last`: hidden state `L - 1` ("Second-to-Last Hidden").
- `last`: hidden state `L` ("Last Hidden").
- `sum-last4`: learned softmax-weighted sum of hidden states `L - 3 .. L` ("Weighted Sum Last
  Four Hidden"); the weights start equal, i.e. as the mean.
- `last4`: concatenation of hidden states `L - 3 .. L` ("Concat Last Four Hidden").
- `weighted`: learned softmax-weighted sum of hidden states `1 .. L`, the `L` transformer
  layers ("Weighted Sum All 12 Layers" for BERT-Base), times a learned scale (ELMo's scalar
  mix, Peters et al., 2018, equation 1).

Imported by ner.py only, after it has chosen the Keras backend (this module imports Keras).
"""

import math

import keras
import numpy as np

# Name -> (the paper's Table 7 row, how the chosen hidden states are combined).
FEATURES = {
    "embeddings": ("Embeddings", "select"),
    "second-to-last": ("Second-to-Last Hidden", "select"),
    "last": ("Last Hidden", "select"),
    "sum-last4": ("Weighted Sum Last Four Hidden", "mix"),
    "last4": ("Concat Last Four Hidden", "concat"),
    "weighted": ("Weighted Sum All Layers", "mix"),
}
_WORD_BUCKET = 8  # Word counts are padded to a multiple of this (few shapes to compile).


def feature_layers(name, num_layers):
    """The indices into `hidden_states` (0 = embeddings, `num_layers` = last) of a variant.

    Raises a ValueError when the backbone has too few layers for it.
    """
    needed = {"sum-last4": 4, "last4": 4, "second-to-last": 2}.get(name, 1)
    if num_layers < needed:
        raise ValueError(
            f"--features {name} needs a backbone with at least {needed} transformer layers. "
            f"Received a backbone with num_layers={num_layers}."
        )
    if name == "embeddings":
        return [0]
    if name == "second-to-last":
        return [num_layers - 1]
    if name == "last":
        return [num_layers]
    if name in ("sum-last4", "last4"):
        return list(range(num_layers - 3, num_layers + 1))
    return list(range(1, num_layers + 1))  # weighted: every transformer layer


def word_features(backbone, features, layers, batch_size):
    """Per-sentence word features from a frozen backbone, computed once.

    Args:
        backbone: a `BertBackbone` built with `output_hidden_states=True`.
        features: `kbert.data.tagging.TaggingFeatures` of the sentences (one or more windows
            per sentence).
        layers: list of int. Indices into the backbone's `hidden_states`.
        batch_size: int. Windows per backbone call.

    Returns:
        list (one per sentence) of float32 arrays `(num_words, len(layers), hidden_dim)`:
        each word's first piece; zeros for a word that produced no piece.
    """
    hidden_dim = backbone.hidden_dim
    result = [np.zeros((int(n), len(layers), hidden_dim), "float32") for n in features.num_words]
    lengths = features.inputs["padding_mask"].sum(axis=1)
    # Windows of similar length together, each batch cropped to its longest (bucketed) row.
    order = np.argsort(lengths, kind="stable")
    full_length = features.inputs["token_ids"].shape[1]
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        length = min(full_length, _WORD_BUCKET * math.ceil(lengths[rows].max() / _WORD_BUCKET))
        batch = {k: v[rows, :length] for k, v in features.inputs.items()}
        hidden_states = backbone.predict_on_batch(batch)["hidden_states"]
        chosen = np.stack([np.asarray(hidden_states[i], "float32") for i in layers], axis=2)
        first = features.sample_weight[rows, :length] > 0  # (batch, seq): first pieces
        for local, position in zip(*np.nonzero(first)):
            row = rows[local]
            word = features.word_ids[row, position]
            result[features.sentence_ids[row]][word] = chosen[local, position]
    return result


def word_batches(word_features_list, label_ids=None, batch_size=32, shuffle=False, seed=0):
    """A `keras.utils.PyDataset` of padded word-feature batches (similar sentence lengths
    together): `({"features", "word_mask"}, labels, weights)`, or the inputs alone."""

    class WordBatches(keras.utils.PyDataset):
        def __init__(self):
            super().__init__()
            order = np.argsort([len(f) for f in word_features_list], kind="stable")
            self.batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
            self.rng = np.random.default_rng(seed)
            self.order = np.arange(len(self.batches))

        def __len__(self):
            return len(self.batches)

        def on_epoch_end(self):
            if shuffle:
                self.rng.shuffle(self.order)

        def __getitem__(self, index):
            rows = self.batches[self.order[index]]
            longest = max(1, max(len(word_features_list[r]) for r in rows))
            words = _WORD_BUCKET * math.ceil(longest / _WORD_BUCKET)
            first = word_features_list[rows[0]]
            x = np.zeros((len(rows), words) + first.shape[1:], "float32")
            mask = np.zeros((len(rows), words), "bool")
            y = np.zeros((len(rows), words), "int32")
            for i, r in enumerate(rows):
                n = len(word_features_list[r])
                x[i, :n], mask[i, :n] = word_features_list[r], True
                if label_ids is not None:
                    y[i, :n] = label_ids[r]
            inputs = {"features": x, "word_mask": mask}
            if label_ids is None:
                return (inputs,)
            return inputs, y, mask.astype("float32")

    dataset = WordBatches()
    if shuffle:
        dataset.on_epoch_end()
    return dataset


def build_lstm_tagger(name, num_layers_used, hidden_dim, num_labels, units, dropout=0.0):
    """The tagger on word features: combine the hidden states (per `name`), then a 2-layer
    bidirectional LSTM of `units` per direction, then a linear layer to the tag logits.
    `dropout` > 0 adds dropout (training only) before each BiLSTM layer and before the linear
    layer."""
    features = keras.Input((None, num_layers_used, hidden_dim), name="features")
    word_mask = keras.Input((None,), dtype="bool", name="word_mask")
    combine = FEATURES[name][1]
    if combine == "mix":
        x = ScalarMix(num_layers_used, name="scalar_mix")(features)
    elif combine == "concat":
        x = keras.layers.Reshape((-1, num_layers_used * hidden_dim), name="concat")(features)
    else:
        x = keras.layers.Reshape((-1, hidden_dim), name="select")(features)
    for index in range(2):
        if dropout:
            x = keras.layers.Dropout(dropout, name=f"dropout_{index}")(x)
        lstm = keras.layers.LSTM(units, return_sequences=True)
        x = keras.layers.Bidirectional(lstm, name=f"bilstm_{index}")(x, mask=word_mask)
    if dropout:
        x = keras.layers.Dropout(dropout, name="dropout_2")(x)
    logits = keras.layers.Dense(num_labels, name="tag_logits")(x)
    return keras.Model({"features": features, "word_mask": word_mask}, logits)


class ScalarMix(keras.layers.Layer):
    """ELMo's scalar mix: `gamma * sum_j softmax(s)_j h_j`, a learned softmax-weighted sum of
    `num_inputs` layers times a learned scale (Peters et al., 2018, "Deep contextualized word
    representations", equation 1). The weights start equal (the mean), `gamma` at 1.

    Call arguments:
        inputs: float tensor `(batch_size, num_words, num_inputs, hidden_dim)`.
    """

    def __init__(self, num_inputs, **kwargs):
        super().__init__(**kwargs)
        self.num_inputs = num_inputs

    def build(self, input_shape):
        self.scalars = self.add_weight(shape=(self.num_inputs,), initializer="zeros", name="s")
        self.gamma = self.add_weight(shape=(), initializer="ones", name="gamma")

    def call(self, inputs):
        weights = keras.ops.softmax(self.scalars)  # (layers,)
        return self.gamma * keras.ops.einsum("bwlh,l->bwh", inputs, weights)  # (batch, words, h)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:2]) + tuple(input_shape[3:])

    def get_config(self):
        return {**super().get_config(), "num_inputs": self.num_inputs}


def predict_tags(model, dataset, word_counts, labels):
    """Tag names per sentence from the tagger's logits on a `word_batches` dataset (no
    shuffle): each word's argmax, cut to the sentence's length."""
    tags = [None] * len(word_counts)
    for index in range(len(dataset)):
        rows = dataset.batches[dataset.order[index]]
        (inputs,) = dataset[index]
        ids = np.asarray(model.predict_on_batch(inputs)).argmax(axis=-1)
        for i, r in enumerate(rows):
            tags[r] = [labels[t] for t in ids[i, : word_counts[r]]]
    return tags
