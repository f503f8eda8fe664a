"""BertSparseEncoder (SPLADE): parity with sentence-transformers' SparseEncoder, checkpoints,
export, the SPLADE loss, fit and bad input.

The reference is a tiny random `BertForMaskedLM` saved by `transformers` and turned into a
SparseEncoder directory (`MLMTransformer` -> `SpladePooling`) by sentence-transformers itself.
Its random weights (`R.make_hf_model`) leave most of the 97 vocabulary weights active, and
they differ between texts by far more than float error.
"""

import json
import re
import shutil

import keras
import numpy as np
import pytest
import scipy.sparse as scipy_sparse  # `dev` installs it (the `sparse` extra): no skip

from kbert.checkpoints import export_to_sparse_encoder
from kbert.layers import SpladePooling
from kbert.losses_sparse import ActiveDimensions, SpladeLoss, flops
from kbert.models import BertClassifier, BertPretrainer, BertSparseEncoder
from kbert.models.sparse_encoder import active_dimensions, keep_top_dims
from kbert.retrieval import sparse_search
from tests.checkpoints import _reference as R

st = pytest.importorskip("sentence_transformers")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TEXTS = [
    "tok1 tok2 tok3",
    "tok5",
    "tok7 tok8 tok9 tok10 tok11 tok12 tok40 tok41 tok42 tok43 tok44 tok45 tok46 tok47",
    "tok3 tok3 tok60",
    # Longer than max_seq_length (24 positions): truncated alike by both.
    " ".join(f"tok{i}" for i in range(10, 60)),
]
LEARNING_RATE, EPOCHS = 5e-4, 6
PROMPTS = {"query": "tok90 tok91 ", "document": "tok80 "}


def _st_sparse_encoder(hf_dir, target, **kwargs):
    """sentence-transformers' own SparseEncoder directory for a `BertForMaskedLM` directory
    (with transformers 5: `tokenizer.json`, no `vocab.txt`)."""
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    model = st.SparseEncoder(
        modules=[MLMTransformer(str(hf_dir)), SpladePooling("max")], device="cpu", **kwargs
    )
    model.save(str(target))
    return target


@pytest.fixture(scope="module")
def splade(tmp_path_factory):
    """Directories: `pretraining` (HF BertForPreTraining), `masked_lm` (HF BertForMaskedLM),
    `st` (SparseEncoder with prompts and max_active_dims unset) and its reference model."""
    root = tmp_path_factory.mktemp("splade")
    # A spread of 0.2: most weights active, values up to ~1.5, float error ~1e-6.
    config = R.hf_config(initializer_range=0.2)
    pretraining = root / "pretraining"
    R.make_hf_model(config, kind="pretraining").save_pretrained(pretraining)
    R.write_vocabulary(pretraining / "vocab.txt", config.vocab_size)
    masked_lm = root / "masked_lm"
    transformers.BertForMaskedLM.from_pretrained(pretraining).save_pretrained(masked_lm)
    shutil.copy(pretraining / "vocab.txt", masked_lm / "vocab.txt")
    st_dir = _st_sparse_encoder(masked_lm, root / "st", prompts=PROMPTS)
    reference = st.SparseEncoder(str(st_dir), device="cpu")
    return {
        "root": root,
        "pretraining": pretraining,
        "masked_lm": masked_lm,
        "st": st_dir,
        "reference": reference,
    }


def _dense(x):
    if hasattr(x, "to_dense"):
        return x.to_dense().cpu().numpy()
    return x.toarray() if hasattr(x, "toarray") else np.asarray(x)


def _assert_close(actual, expected, atol=1e-5):
    actual, expected = _dense(actual), _dense(expected)
    assert actual.shape == expected.shape
    assert np.abs(actual - expected).max() <= atol, np.abs(actual - expected).max()


def test_encode_decode_search_and_export_match_sentence_transformers(splade, tmp_path):
    reference = splade["reference"]
    encoder = BertSparseEncoder.from_preset(splade["st"])
    assert encoder.prompts["query"] == PROMPTS["query"] and encoder.similarity_function == "dot"

    # encode: CSR by default, equal to sentence-transformers' on every vocabulary entry.
    vectors = encoder.encode(TEXTS, batch_size=2)
    expected = _dense(reference.encode(TEXTS))
    assert isinstance(vectors, scipy_sparse.csr_matrix) and vectors.dtype == np.float32
    _assert_close(vectors, expected)
    assert (expected > 0).sum(axis=1).min() > 20  # many active weights: top-k below cuts
    assert np.abs(expected[0] - expected[1]).max() > 0.5  # texts differ far beyond tolerance
    _assert_close(encoder.encode(TEXTS[1], convert_to_sparse=False), expected[1])

    # max_active_dims: from `encode`, and from the model (as a directory's config sets it).
    k = 7
    top = _dense(reference.encode(TEXTS, max_active_dims=k))
    _assert_close(encoder.encode(TEXTS, max_active_dims=k), top)
    np.testing.assert_array_equal(active_dimensions(encoder.encode(TEXTS, max_active_dims=k)), k)
    limited = BertSparseEncoder.from_preset(splade["st"], max_active_dims=k)
    _assert_close(limited.encode(TEXTS, convert_to_sparse=False), top)

    # Query and document prompts (different on purpose) and an explicit prompt.
    queries, documents = encoder.encode_query(TEXTS), encoder.encode_document(TEXTS)
    _assert_close(queries, reference.encode_query(TEXTS))
    _assert_close(documents, reference.encode_document(TEXTS))
    assert np.abs(_dense(queries) - _dense(documents)).max() > 0.1
    _assert_close(encoder.encode(TEXTS, prompt="tok70 "), reference.encode(TEXTS, prompt="tok70 "))

    # decode: the same tokens and weights, largest first.
    ours = encoder.decode(vectors, top_k=5)
    theirs = reference.decode(reference.encode(TEXTS), top_k=5)
    for mine, other in zip(ours, theirs):
        assert [t for t, _ in mine] == [t for t, _ in other]
        np.testing.assert_allclose([w for _, w in mine], [w for _, w in other], atol=1e-5)
    assert len(encoder.decode(expected[0])) == (expected[0] > 0).sum()  # a vector: one list

    # similarity and exact sparse search against NumPy on the dense vectors.
    scores = expected[:2] @ expected.T
    np.testing.assert_allclose(
        encoder.similarity(queries[:2], vectors), _dense(queries)[:2] @ expected.T, rtol=1e-5
    )
    found_scores, found = sparse_search(vectors[:2], vectors, top_k=3, corpus_chunk_size=2)
    np.testing.assert_array_equal(found, np.argsort(-scores, axis=1, kind="stable")[:, :3])
    np.testing.assert_allclose(found_scores, np.sort(scores, axis=1)[:, ::-1][:, :3], rtol=1e-5)
    sparsity = encoder.sparsity(vectors)
    assert sparsity["active_dims"] == pytest.approx((expected != 0).sum(axis=1).mean())

    # Round trip: kbert writes, sentence-transformers loads, the vectors stay the same.
    written = export_to_sparse_encoder(limited, tmp_path / "written")
    loaded = st.SparseEncoder(str(written), device="cpu")
    assert loaded.max_active_dims == k
    _assert_close(loaded.encode(TEXTS), top)
    _assert_close(loaded.encode_query(TEXTS), limited.encode_query(TEXTS))
    # ... and kbert's own preset keeps every setting.
    limited.save_to_preset(tmp_path / "preset")
    again = BertSparseEncoder.from_preset(tmp_path / "preset")
    assert (again.max_active_dims, again.prompts) == (k, limited.prompts)
    _assert_close(again.encode(TEXTS), top)


@pytest.mark.backend_independent
def test_starts_from_masked_lm_checkpoints_only(splade, tmp_path):
    expected = _dense(splade["reference"].encode(TEXTS[:3]))
    # BertForPreTraining and BertForMaskedLM directories carry the same masked-LM head.
    for source in ("pretraining", "masked_lm"):
        encoder = BertSparseEncoder.from_preset(splade[source], sequence_length=24)
        _assert_close(encoder.encode(TEXTS[:3]), expected)
    # A kbert BertPretrainer preset: its head comes along.
    BertPretrainer.from_preset(splade["pretraining"]).save_to_preset(tmp_path / "pretrainer")
    encoder = BertSparseEncoder.from_preset(tmp_path / "pretrainer", sequence_length=24)
    _assert_close(encoder.encode(TEXTS[:3]), expected)
    # Without a masked-LM head: one clear error, unless a fresh head is asked for.
    plain = tmp_path / "plain"
    R.make_hf_model(R.hf_config(), kind="model").save_pretrained(plain)
    R.write_vocabulary(plain / "vocab.txt", 97)
    with pytest.raises(ValueError, match="no masked-LM head"):
        BertSparseEncoder.from_preset(plain)
    fresh = BertSparseEncoder.from_preset(plain, fresh_heads=True)
    assert fresh.encode(TEXTS[:1]).shape == (1, 97)
    BertClassifier.from_preset(plain, num_classes=2).save_to_preset(tmp_path / "classifier")
    with pytest.raises(ValueError, match="BertClassifier, which has no masked-LM head"):
        BertSparseEncoder.from_preset(tmp_path / "classifier")
    # A dense sentence-transformers reader points SparseEncoder directories here.
    from kbert.models import BertTextEmbedder

    with pytest.raises(ValueError, match="BertSparseEncoder"):
        BertTextEmbedder.from_preset(splade["st"])


@pytest.mark.backend_independent
def test_bad_input_gets_one_clear_error(splade, tmp_path):
    encoder = BertSparseEncoder.from_preset(splade["st"])
    with pytest.raises(ValueError, match="takes a string or a list of strings. Received NoneType"):
        encoder.encode(None)
    with pytest.raises(ValueError, match="index 1 is of type int"):
        encoder.encode(["tok1", 3])
    with pytest.raises(ValueError, match="empty list"):
        encoder.encode([])
    for bad in (0, -2, 2.5, True, "3"):
        with pytest.raises(ValueError, match="`max_active_dims` must be a positive integer"):
            encoder.encode(TEXTS, max_active_dims=bad)
        with pytest.raises(ValueError, match="`max_active_dims` must be a positive integer"):
            BertSparseEncoder(encoder.backbone, max_active_dims=bad)
    with pytest.raises(ValueError, match="`top_k` must be a positive integer"):
        encoder.decode(encoder.encode(TEXTS[:1]), top_k=0)
    with pytest.raises(ValueError, match="97 dimensions"):
        encoder.decode(np.ones((1, 5), np.float32))
    with pytest.raises(ValueError, match="`pooling_strategy` must be one of"):
        BertSparseEncoder(encoder.backbone, pooling_strategy="mean")
    # Newer saves name a fill-mask `Transformer` instead of `MLMTransformer`; another task
    # of that module gives no logits to pool.
    renamed = tmp_path / "renamed"
    shutil.copytree(splade["st"], renamed)
    modules = json.loads((renamed / "modules.json").read_text())
    modules[0]["type"] = "sentence_transformers.base.modules.Transformer"
    (renamed / "modules.json").write_text(json.dumps(modules))
    _assert_close(
        BertSparseEncoder.from_preset(renamed).encode(TEXTS[:2]), encoder.encode(TEXTS[:2])
    )
    sbert = json.loads((renamed / "sentence_bert_config.json").read_text())
    (renamed / "sentence_bert_config.json").write_text(
        json.dumps(dict(sbert, transformer_task="feature-extraction"))
    )
    with pytest.raises(ValueError, match="transformer_task='feature-extraction'"):
        BertSparseEncoder.from_preset(renamed)
    # Directories kbert cannot read exactly are refused, naming the file.
    broken = tmp_path / "broken"
    shutil.copytree(splade["st"], broken)
    (broken / "1_SpladePooling" / "config.json").write_text(
        json.dumps({"pooling_strategy": "mean", "activation_function": "relu"})
    )
    with pytest.raises(ValueError, match="1_SpladePooling/config.json asks for"):
        BertSparseEncoder.from_preset(broken)
    modules = json.loads((broken / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "", "type": "x.SparseAutoEncoder"})
    (broken / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match="modules.json describes the pipeline"):
        BertSparseEncoder.from_preset(broken)
    with pytest.raises(ValueError, match="must have the same dimension"):
        sparse_search(np.ones((1, 3)), np.ones((2, 4)))


def test_splade_loss_matches_sentence_transformers(splade):
    """The loss on fixed vectors equals sentence-transformers' SpladeLoss components (its
    SparseMultipleNegativesRankingLoss and FLOPS regularisers) summed: with and without l0
    thresholds (rows at exactly the threshold count as zero vectors), without a query term,
    and with every column regularised as documents."""
    from sentence_transformers.sparse_encoder import losses as st_losses

    rng = np.random.default_rng(0)
    vectors = rng.exponential(1.0, (4, 3, 50)).astype(np.float32)  # query, document, negative
    vectors *= rng.random((4, 3, 50)) < 0.3  # sparse, with rows of different sizes
    vectors[1, 2, :45] = 0.0  # a negative with exactly 5 active entries: the document
    vectors[1, 2, 45:] += 0.5  # threshold 5 drops it, the query threshold 8 would not
    vectors[2, 0, :42] = 0.0  # a query with exactly 8: the query threshold drops it, 5 not
    vectors[2, 0, 42:] += 0.5
    columns = [torch.tensor(vectors[:, i]) for i in range(3)]
    model = splade["reference"]
    settings = [
        dict(query_regularizer_weight=0.7),
        dict(
            query_regularizer_weight=0.7,
            document_regularizer_threshold=5,
            query_regularizer_threshold=8,
        ),
        dict(query_regularizer_weight=None),
        dict(query_regularizer_weight=None, use_document_regularizer_only=True),
        # Symmetric data has no query column: a query weight is ignored, as there.
        dict(query_regularizer_weight=0.7, use_document_regularizer_only=True),
    ]
    values = []
    for kwargs in settings:
        ours = SpladeLoss(document_regularizer_weight=0.3, **kwargs)
        theirs = st_losses.SpladeLoss(
            model,
            st_losses.SparseMultipleNegativesRankingLoss(model),
            document_regularizer_weight=0.3,
            **kwargs,
        )
        expected = theirs.loss.compute_loss_from_embeddings(columns, None)
        documents = columns if theirs.use_document_regularizer_only else columns[1:]
        document = 0.3 * theirs.document_regularizer.compute_loss_from_embeddings(
            torch.cat(documents)
        )
        assert float(document) > 0.1  # every term counts
        expected = expected + document
        if theirs.query_regularizer_weight is not None:
            query = 0.7 * theirs.query_regularizer.compute_loss_from_embeddings(columns[0])
            assert float(query) > 0.1
            expected = expected + query
        value = float(keras.ops.convert_to_numpy(ours(np.zeros(4), vectors)))
        assert value == pytest.approx(float(expected), abs=1e-5)
        values.append(value)
    # The thresholded rows and the query term move the loss by far more than float error.
    assert min(abs(a - b) for i, a in enumerate(values[:4]) for b in values[i + 1 : 4]) > 1e-3
    # FLOPS alone, written out in NumPy: float32 for any input dtype, masking at the threshold.
    flat = vectors[:, 1:].reshape(-1, 50)
    assert float(flops(flat)) == pytest.approx(np.sum(flat.mean(axis=0) ** 2), rel=1e-5)
    kept = flat * ((flat != 0).sum(-1, keepdims=True) > 5)
    assert float(flops(flat, threshold=5)) == pytest.approx(np.sum(kept.mean(0) ** 2), rel=1e-5)
    counts = np.array([[1, 0], [3, 0]])
    assert keras.backend.standardize_dtype(flops(counts).dtype) == "float32"
    assert float(flops(counts)) == 4.0
    assert keras.backend.standardize_dtype(flops(flat.astype("float64")).dtype) == "float32"
    # Active dimensions of the queries, of the documents, of all columns, and of 2-D rows.
    for columns_of, expected in (
        ("query", vectors[:, :1]),
        ("document", vectors[:, 1:]),
        ("all", vectors),
    ):
        metric = ActiveDimensions(columns=columns_of)
        metric.update_state(None, vectors)
        assert float(metric.result()) == pytest.approx((expected != 0).sum(-1).mean())
    metric = ActiveDimensions(columns="query")  # rows of one column: every row counts
    metric.update_state(None, flat)
    assert float(metric.result()) == pytest.approx((flat != 0).sum(-1).mean())
    np.testing.assert_array_equal(keep_top_dims(vectors[0], 3).astype(bool).sum(-1), 3)


def test_splade_loss_and_metric_settings_round_trip_and_bad_ones_are_refused():
    """Every setting survives serialisation (the loss gives the same value after it), the
    inner loss comes back from its config, and bad settings and shapes name what was given."""
    from kbert.losses import MultipleNegativesRankingLoss

    vectors = np.random.default_rng(1).exponential(1.0, (3, 3, 20)).astype("float32")
    vectors[0, 0, :17] = 0.0  # a query with 3 active entries: the threshold 3 drops it
    loss = SpladeLoss(
        MultipleNegativesRankingLoss(scale=7.0, similarity="cosine"),
        document_regularizer_weight=0.25,
        query_regularizer_weight=0.5,
        document_regularizer_threshold=4,
        query_regularizer_threshold=3,
        use_document_regularizer_only=False,
    )
    restored = keras.losses.deserialize(keras.losses.serialize(loss))
    assert isinstance(restored.loss, MultipleNegativesRankingLoss)
    assert (restored.loss.scale, restored.loss.similarity) == (7.0, "cosine")
    assert restored.get_config() == loss.get_config()
    for name in (
        "document_regularizer_weight",
        "query_regularizer_weight",
        "document_regularizer_threshold",
        "query_regularizer_threshold",
    ):
        assert getattr(restored, name) == getattr(loss, name) != getattr(SpladeLoss(), name)
    symmetric = SpladeLoss(use_document_regularizer_only=True)
    assert keras.losses.deserialize(keras.losses.serialize(symmetric)).use_document_regularizer_only
    assert float(restored(np.zeros(3), vectors)) == pytest.approx(
        float(loss(np.zeros(3), vectors)), abs=1e-6
    )
    # A config dict as `loss` is deserialised; the default is dot products without scaling.
    from_dict = SpladeLoss(keras.losses.serialize(MultipleNegativesRankingLoss(scale=3.0)))
    assert from_dict.loss.scale == 3.0
    assert (SpladeLoss().loss.scale, SpladeLoss().loss.similarity) == (1.0, "dot")
    metric = ActiveDimensions(columns="document", name="doc_dims")
    assert keras.metrics.deserialize(keras.metrics.serialize(metric)).columns == "document"
    # Refused settings, each naming the argument and the value.
    for kwargs, message in (
        (
            dict(document_regularizer_weight=None),
            "`document_regularizer_weight` must be a number >= 0. Received",
        ),
        (dict(document_regularizer_weight=True), "document_regularizer_weight=True"),
        (dict(document_regularizer_weight=-1.0), "document_regularizer_weight=-1.0"),
        (dict(document_regularizer_weight=float("nan")), "document_regularizer_weight=nan"),
        (dict(query_regularizer_weight="1"), "query_regularizer_weight='1'"),
        (dict(query_regularizer_weight=-0.5), "query_regularizer_weight=-0.5"),
        (dict(document_regularizer_threshold=True), "document_regularizer_threshold=True"),
        (dict(query_regularizer_threshold=-0.5), "query_regularizer_threshold=-0.5"),
        (dict(loss="mse"), "`loss` must be a Keras loss. Received: 'mse'"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            SpladeLoss(**kwargs)
    # One column, or rows without columns, are refused by SpladeLoss itself (not only by a
    # ranking loss that checks).
    message = "SpladeLoss expects sparse vectors (batch_size, columns >= 2"
    for inner in (None, keras.losses.MeanSquaredError()):
        with pytest.raises(ValueError, match=re.escape(message) + ".*shape \\(2, 1, 5\\)"):
            SpladeLoss(inner)(np.zeros((2, 1, 5)), np.ones((2, 1, 5), "float32"))
    with pytest.raises(ValueError, match=re.escape(message) + ".*shape \\(2, 5\\)"):
        SpladeLoss()(np.zeros(2), np.ones((2, 5)))
    with pytest.raises(ValueError, match="`columns` must be one of.*Received: columns='queries'"):
        ActiveDimensions(columns="queries")


def test_splade_pooling_equals_the_activation_at_every_token_then_pooled():
    """SPLADE written out in NumPy: the activation at every real token, padding as 0, then
    the maximum (or sum) over the tokens; max pooling takes the maximum first."""
    rng = np.random.default_rng(0)
    logits = rng.normal(0.0, 3.0, (3, 5, 7)).astype(np.float32)
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]])
    logits[1, 2:] = 50.0  # padding with the largest logits: must not count
    for activation, function in (
        ("relu", lambda x: np.log1p(np.maximum(x, 0.0))),
        ("log1p_relu", lambda x: np.log1p(np.log1p(np.maximum(x, 0.0)))),
    ):
        activated = function(logits) * mask[..., None]
        for strategy, pool in (("max", np.max), ("sum", np.sum)):
            layer = SpladePooling(strategy, activation)
            got = keras.ops.convert_to_numpy(layer(logits, mask))
            np.testing.assert_allclose(got, pool(activated, axis=1), rtol=1e-6)


def test_columns_of_different_lengths_encode_as_each_text_alone(splade):
    """A `(batch, columns, seq)` batch as `fit` builds it (padded to its longest text; eager
    torch cuts each column to its own longest row) gives every text the vector it has alone."""
    encoder = BertSparseEncoder.from_preset(splade["st"])
    queries = ["tok5", "tok1 tok2", "tok3 tok3 tok60"]
    documents = [TEXTS[2], "tok7 tok8 tok9 tok10 tok11", TEXTS[0]]
    rows = [encoder.tokenize_texts(column) for column in (queries, documents)]
    packed = encoder.pack_token_ids([r for pair in zip(*rows) for r in pair], 24)
    x = {k: v.reshape(3, 2, 24) for k, v in packed.items()}
    got = keras.ops.convert_to_numpy(encoder(x, training=False))
    alone = np.stack([_dense(encoder.encode(column)) for column in (queries, documents)], 1)
    assert np.abs(alone[:, 0] - alone[:, 1]).max() > 1e-1
    np.testing.assert_allclose(got, alone, atol=1e-5)


def test_fit_on_query_document_columns_lowers_the_loss(splade, tmp_path):
    encoder = BertSparseEncoder.from_preset(
        splade["masked_lm"], sequence_length=16, dropout=0.0, attention_dropout=0.0
    )
    queries = [f"tok{i} tok{i + 1}" for i in range(5, 45, 5)]
    documents = [f"tok{i + 1} tok{i + 2} tok{i + 3}" for i in range(5, 45, 5)]
    encoder.compile(
        optimizer=keras.optimizers.Adam(LEARNING_RATE),
        loss=SpladeLoss(document_regularizer_weight=1e-3, query_regularizer_weight=1e-3),
    )
    before = encoder.evaluate((queries, documents), batch_size=8, verbose=0, return_dict=True)
    history = encoder.fit((queries, documents), batch_size=8, epochs=EPOCHS, verbose=0)
    after = encoder.evaluate((queries, documents), batch_size=8, verbose=0, return_dict=True)
    assert after["loss"] < before["loss"] * 0.7, (before, after)
    # The active dimensions per text: a metric of `fit` / `evaluate`, and of `encode`'s output.
    vectors = encoder.encode(documents)
    assert after["document_active_dims"] == pytest.approx(active_dimensions(vectors).mean())
    assert history.history["query_active_dims"][0] == pytest.approx(before["query_active_dims"])
    # A `.keras` file keeps the trained model and its settings.
    encoder.save(tmp_path / "encoder.keras")
    loaded = keras.saving.load_model(tmp_path / "encoder.keras")
    assert isinstance(loaded, BertSparseEncoder) and loaded.prompts == encoder.prompts
    packed = encoder.pack_token_ids(encoder.tokenize_texts(documents))
    np.testing.assert_allclose(loaded.predict(packed, verbose=0), _dense(vectors), atol=1e-5)


def test_one_fit_step_loss_equals_sentence_transformers_splade_loss(splade):
    """The loss of `fit`'s first step (before its update) equals sentence-transformers'
    SpladeLoss on the same checkpoint and (query, document) columns: its in-batch ranking loss,
    the document regulariser on the document column and the query regulariser on the query
    column. Queries are shorter than documents, and the two weights differ tenfold, so
    swapped columns or weights change the loss by far more than the tolerance."""
    from sentence_transformers.sparse_encoder import losses as st_losses

    queries = [f"tok{i} tok{i + 1}" for i in range(5, 45, 5)]
    documents = [" ".join(f"tok{i + j}" for j in range(1, 9)) for i in range(5, 45, 5)]
    weights = dict(document_regularizer_weight=0.3, query_regularizer_weight=3.0)
    encoder = BertSparseEncoder.from_preset(
        splade["masked_lm"], sequence_length=16, dropout=0.0, attention_dropout=0.0
    )
    encoder.compile(optimizer=keras.optimizers.SGD(1e-3), loss=SpladeLoss(**weights))
    history = encoder.fit((queries, documents), batch_size=8, epochs=1, verbose=0)

    model = splade["reference"]
    model.eval()
    loss = st_losses.SpladeLoss(
        model, st_losses.SparseMultipleNegativesRankingLoss(model), **weights
    )
    with torch.no_grad():
        features = [model.tokenize(column) for column in (queries, documents)]
        parts = {k: float(v) for k, v in loss(features, None).items()}
    # Each term counts: the regularisers differ by far more than the tolerance when swapped.
    swapped = (
        parts["base_loss"]
        + parts["document_regularizer_loss"] / 0.3 * 3.0
        + parts["query_regularizer_loss"] / 3.0 * 0.3
    )
    expected = sum(parts.values())
    assert abs(swapped - expected) > 1e-2, parts
    assert history.history["loss"][0] == pytest.approx(expected, abs=1e-4)


def test_sum_pooling_cosine_and_upper_case_match_sentence_transformers(splade, tmp_path):
    """A SparseEncoder directory with sum pooling and cosine similarity, on texts in upper and
    mixed case (the tokenizer lower-cases them alike) and with a prompt."""
    from sentence_transformers.sparse_encoder.modules import MLMTransformer
    from sentence_transformers.sparse_encoder.modules import SpladePooling as StSpladePooling

    st.SparseEncoder(
        modules=[MLMTransformer(str(splade["masked_lm"])), StSpladePooling("sum")],
        device="cpu",
        prompts=PROMPTS,
        similarity_fn_name="cosine",
    ).save(str(tmp_path / "sum"))
    reference = st.SparseEncoder(str(tmp_path / "sum"), device="cpu")
    encoder = BertSparseEncoder.from_preset(tmp_path / "sum")
    assert encoder.similarity_function == "cosine"
    texts = ["TOK1 Tok2 tok3", "Tok5", TEXTS[2].upper(), TEXTS[4]]
    expected = _dense(reference.encode(texts))
    # Sums over the tokens: larger than any one token's weight (max pooling).
    maximum = _dense(splade["reference"].encode(texts, prompt=""))
    assert (expected.sum(1) > maximum.sum(1) * 1.5).all()
    scale = np.abs(expected).max()
    _assert_close(encoder.encode(texts), expected, atol=1e-6 * scale)
    lower = [t.lower() for t in texts]
    _assert_close(encoder.encode(lower), expected, atol=1e-6 * scale)  # case folded
    queries = encoder.encode_query(texts)
    _assert_close(queries, reference.encode_query(texts), atol=1e-6 * scale)
    vectors = encoder.encode(texts)
    np.testing.assert_allclose(
        encoder.similarity(queries, vectors),
        _dense(reference.similarity(reference.encode_query(texts), reference.encode(texts))),
        rtol=1e-5,
    )
    np.testing.assert_allclose(np.diag(encoder.similarity(vectors, vectors)), 1.0, rtol=1e-5)
