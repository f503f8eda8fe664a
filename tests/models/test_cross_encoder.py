"""BertCrossEncoder: parity with sentence-transformers' CrossEncoder, checkpoints, losses, fit.

The references are tiny random `transformers` `BertForSequenceClassification` models (one
label and three named labels), wrapped and saved by sentence-transformers' `CrossEncoder`
itself; kbert's `predict`, `rank`, export and losses are compared with sentence-transformers'
on them.
"""

import json
import shutil

import keras
import numpy as np
import pytest

from kbert.losses import BinaryCrossEntropyLoss, LambdaLoss, RerankingMultipleNegativesLoss
from kbert.models import BertCrossEncoder
from kbert.models.cross_encoder import _PairGroupBatches, truncated_pair_lengths
from kbert.text.packer import truncated_lengths
from tests.checkpoints._reference import hf_config, write_vocabulary
from tests.models.test_classifier import toy_backbone, toy_preprocessor
from tests.test_case import TestCase

st = pytest.importorskip("sentence_transformers")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

MAX_POSITIONS = 24  # max_length 24: a budget of 21 tokens for both texts of a pair


def _text(rng, length):
    return " ".join(f"tok{i}" for i in rng.integers(0, 90, length))


def _pairs():
    """Pairs of different lengths; several are cut, in the cases where Hugging Face's
    longest-first rule and the original BERT rule keep different tokens (odd budget: the
    longer text, or the second on a tie, keeps the odd token)."""
    rng = np.random.default_rng(3)
    lengths = [(1, 2), (3, 7), (15, 20), (20, 15), (11, 11), (1, 30), (30, 2), (6, 4)]
    pairs = [(_text(rng, a), _text(rng, b)) for a, b in lengths]
    pairs[0] = ("tok5 hello", "tok7")  # an unknown word: [UNK] in both
    return pairs


def _randomize(model, seed):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator) * 0.4
            parameter.copy_(1.0 + noise if "LayerNorm.weight" in name else noise)


def _write_hf(path, num_labels, kind="classification", labels=None, seed=0):
    """A Hugging Face BERT directory (weights, config, vocab.txt, tokenizer files)."""
    overrides = dict(
        max_position_embeddings=MAX_POSITIONS,
        num_labels=num_labels,
        hidden_dropout_prob=0.0,  # fit's test compares losses before and after training
        attention_probs_dropout_prob=0.0,
    )
    if labels:
        overrides["id2label"] = dict(enumerate(labels))
        overrides["label2id"] = {name: i for i, name in enumerate(labels)}
    config = hf_config(**overrides)
    cls = {
        "classification": transformers.BertForSequenceClassification,
        "tokens": transformers.BertForTokenClassification,
        "pretraining": transformers.BertForPreTraining,
    }[kind]
    torch.manual_seed(seed)
    model = cls(config).eval()
    _randomize(model, seed)
    model.save_pretrained(path)
    write_vocabulary(path / "vocab.txt", config.vocab_size)
    transformers.BertTokenizerFast(str(path / "vocab.txt")).save_pretrained(path)
    return path


def _write_st(hf_path, path):
    """The Hugging Face directory loaded and saved by sentence-transformers' CrossEncoder
    (transformers 5 writes tokenizer.json and no vocab.txt: copied, as hub cross-encoders
    have one; the one-label test also loads the directory without it)."""
    st.CrossEncoder(str(hf_path), device="cpu").save(str(path))
    shutil.copy(hf_path / "vocab.txt", path / "vocab.txt")
    return path


@pytest.fixture(scope="module")
def directories(tmp_path_factory):
    root = tmp_path_factory.mktemp("cross_encoders")
    one = _write_hf(root / "hf_one", 1, seed=0)
    three = _write_hf(root / "hf_three", 3, labels=["contradiction", "entailment", "neutral"])
    return {
        "hf_one": one,
        "st_one": _write_st(one, root / "st_one"),
        "st_three": _write_st(three, root / "st_three"),
        "root": root,
    }


def _reference(path):
    model = st.CrossEncoder(str(path), device="cpu")
    model.eval()
    return model


def _assert_close(actual, expected, tolerance=1e-5):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert np.abs(actual - expected).max() <= tolerance, np.abs(actual - expected).max()


def _assert_same_ranking(actual, expected):
    assert [r["corpus_id"] for r in actual] == [r["corpus_id"] for r in expected]
    assert [r.get("text") for r in actual] == [r.get("text") for r in expected]
    _assert_close([r["score"] for r in actual], [r["score"] for r in expected])


@pytest.mark.backend_independent
def test_truncation_is_huggingface_longest_first(tmp_path):
    """`truncated_pair_lengths` keeps what Hugging Face's fast tokenizer keeps of a pair, on
    a grid of lengths that includes the cases where the original BERT rule (the packer's)
    keeps other tokens: an odd budget shared by two long texts."""
    write_vocabulary(tmp_path / "vocab.txt", 20)
    tokenizer = transformers.BertTokenizerFast(str(tmp_path / "vocab.txt"))
    budget = 9
    lengths = [(a, b) for a in range(0, 14) for b in range(0, 14)]
    kept = truncated_pair_lengths([a for a, _ in lengths], [b for _, b in lengths], budget)
    encoded = tokenizer(
        ["tok1 " * a for a, _ in lengths],
        ["tok2 " * b for _, b in lengths],
        truncation="longest_first",
        max_length=budget + 3,
    )["input_ids"]
    for (a, b), first, second, ids in zip(lengths, *kept, encoded):
        assert (first, second) == (ids.count(6), ids.count(7)), (a, b)
    bert_rule = truncated_lengths(
        np.array(lengths)[:, 0], np.array(lengths)[:, 1], budget, "longest_first"
    )
    assert (np.asarray(bert_rule[0]) != kept[0]).sum() > 5


def test_one_label_predict_rank_and_round_trips(directories, tmp_path):
    reference = _reference(directories["st_one"])
    model = BertCrossEncoder.from_preset(directories["st_one"])
    assert (model.num_labels, model.activation) == (1, "sigmoid")
    assert model.preprocessor.sequence_length == MAX_POSITIONS
    pairs = _pairs()
    # The pairs' token lengths include cases where the packer's own rule would cut otherwise.
    firsts, seconds = model.tokenize_pairs([p[0] for p in pairs], [p[1] for p in pairs])
    raw = (
        [model.tokenizer.tokenize(p[0]) for p in pairs],
        [model.tokenizer.tokenize(p[1]) for p in pairs],
    )
    bert_rule = truncated_lengths(
        np.array([len(r) for r in raw[0]]), np.array([len(r) for r in raw[1]]), 21, "longest_first"
    )
    assert (np.asarray(bert_rule[0]) != [len(f) for f in firsts]).any()

    expected = reference.predict(pairs, batch_size=3)
    assert expected.std() > 0.05  # scores spread: a wrong weight or token shows
    _assert_close(model.predict(pairs, batch_size=3), expected)
    logits = reference.predict(pairs, activation_fn=torch.nn.Identity())
    _assert_close(model.predict(pairs, activation="identity"), logits)
    _assert_close(model.predict(pairs[2]), reference.predict(pairs[2]))  # one pair: a scalar
    assert np.ndim(model.predict(pairs[2])) == 0
    _assert_close(model.predict((list(p[0] for p in pairs), list(p[1] for p in pairs))), expected)

    query, documents = pairs[3][0], [p[1] for p in pairs]
    _assert_same_ranking(model.rank(query, documents), reference.rank(query, documents))
    _assert_same_ranking(
        model.rank(query, documents, top_k=3, return_documents=True, batch_size=2),
        reference.rank(query, documents, top_k=3, return_documents=True),
    )

    # Reranking metrics of first-stage lists, as sentence-transformers' evaluator.
    from sentence_transformers.cross_encoder.evaluation import CrossEncoderRerankingEvaluator

    samples = [
        {"query": pairs[i][0], "positive": [documents[i]], "documents": documents[::-1]}
        for i in range(4)
    ] + [{"query": pairs[5][0], "positive": documents[5:7], "negative": documents[:3]}]
    for always in (True, False):
        expected_metrics = CrossEncoderRerankingEvaluator(
            samples[:4], at_k=3, always_rerank_positives=always, write_csv=False
        )(reference)
        actual = model.evaluate_reranking(samples[:4], at_k=3, always_rerank_positives=always)
        assert set(actual) == set(expected_metrics)
        for name, value in expected_metrics.items():
            assert abs(actual[name] - value) <= 1e-6, (name, actual, expected_metrics)
    expected_metrics = CrossEncoderRerankingEvaluator(samples[4:], write_csv=False)(reference)
    actual = model.evaluate_reranking(samples[4:])
    assert actual == pytest.approx(dict(expected_metrics), abs=1e-6)

    # The directory exactly as sentence-transformers saved it: tokenizer.json, no vocab.txt.
    as_saved = tmp_path / "as_saved"
    shutil.copytree(directories["st_one"], as_saved)
    (as_saved / "vocab.txt").unlink()
    from_json = BertCrossEncoder.from_preset(as_saved)
    assert from_json.preprocessor.sequence_length == MAX_POSITIONS
    _assert_close(from_json.predict(pairs), expected)

    # A plain Hugging Face BertForSequenceClassification directory: sigmoid scores too.
    plain = BertCrossEncoder.from_preset(directories["hf_one"])
    _assert_close(plain.predict(pairs), _reference(directories["hf_one"]).predict(pairs))

    # The activation a directory stores (here tanh) is applied by both.
    tanh_dir = tmp_path / "tanh"
    shutil.copytree(directories["st_one"], tanh_dir)
    st_config = json.loads((tanh_dir / "config_sentence_transformers.json").read_text())
    st_config["activation_fn"] = "torch.nn.modules.activation.Tanh"
    (tanh_dir / "config_sentence_transformers.json").write_text(json.dumps(st_config))
    tanh_model = BertCrossEncoder.from_preset(tanh_dir, sequence_length=16)
    assert tanh_model.activation == "tanh"
    tanh_reference = st.CrossEncoder(str(tanh_dir), device="cpu", max_length=16)
    _assert_close(tanh_model.predict(pairs), tanh_reference.predict(pairs))

    # kbert writes, sentence-transformers loads: the same scores, activation and length.
    exported = tanh_model.export_to_sentence_transformers(tmp_path / "exported")
    loaded = st.CrossEncoder(str(exported), device="cpu")
    assert loaded.max_seq_length == 16
    _assert_close(loaded.predict(pairs), tanh_model.predict(pairs))
    # ... and kbert reads it back, as it reads its own presets.
    _assert_close(BertCrossEncoder.from_preset(exported).predict(pairs), tanh_model.predict(pairs))
    tanh_model.save_to_preset(tmp_path / "preset")
    again = BertCrossEncoder.from_preset(tmp_path / "preset")
    assert again.activation == "tanh" and again.preprocessor.sequence_length == 16
    _assert_close(again.predict(pairs), tanh_model.predict(pairs))


def test_three_labels_predict_softmax_and_export(directories, tmp_path):
    reference = _reference(directories["st_three"])
    model = BertCrossEncoder.from_preset(directories["st_three"])
    assert model.num_labels == 3 and model.activation == "identity"
    assert model.labels == ["contradiction", "entailment", "neutral"]
    pairs = _pairs()
    expected = reference.predict(pairs, batch_size=4)
    assert expected.shape == (len(pairs), 3) and expected.std() > 0.1
    _assert_close(model.predict(pairs, batch_size=4), expected)
    _assert_close(
        model.predict(pairs, apply_softmax=True), reference.predict(pairs, apply_softmax=True)
    )
    with pytest.raises(ValueError, match="one-label"):
        model.rank("tok1", ["tok2"])
    exported = model.export_to_sentence_transformers(tmp_path / "three")
    loaded = st.CrossEncoder(str(exported), device="cpu")
    assert loaded.model.config.id2label == {0: "contradiction", 1: "entailment", 2: "neutral"}
    _assert_close(loaded.predict(pairs), model.predict(pairs))


@pytest.mark.backend_independent
def test_bad_input(directories, tmp_path):
    model = BertCrossEncoder.from_preset(directories["st_one"])
    with pytest.raises(ValueError, match="no documents"):
        model.rank("tok1", [])
    with pytest.raises(ValueError, match="index 1 is int"):
        model.rank("tok1", ["tok2", 3])
    with pytest.raises(ValueError, match="list of strings"):
        model.rank("tok1", "tok2")
    with pytest.raises(ValueError, match="`query` must be a string"):
        model.rank(["tok1"], ["tok2"])
    for top_k in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="`top_k` must be a positive integer"):
            model.rank("tok1", ["tok2", "tok3"], top_k=top_k)
    with pytest.raises(ValueError, match="Item 1 is tuple"):
        model.predict([("tok1", "tok2"), ("tok1", "tok2", "tok3")])
    with pytest.raises(ValueError, match="Item 0 is str"):
        model.predict(["tok1", "tok2", "tok3"])
    with pytest.raises(ValueError, match="Item 0 is list"):
        model.predict([["tok1", 2]])
    with pytest.raises(ValueError, match="empty list of pairs"):
        model.predict([])
    with pytest.raises(ValueError, match="pairs"):
        model.predict("tok1")
    with pytest.raises(ValueError, match="same number of rows"):
        model.predict((["tok1", "tok2"], ["tok3"]))
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        model.fit([("tok1", "tok2")], [2.0], verbose=0)
    # Checkpoints whose head is not a sequence classifier.
    for kind, name in (("pretraining", "BertForPreTraining"), ("tokens", "TokenClassification")):
        path = _write_hf(tmp_path / kind, 2, kind=kind)
        with pytest.raises(ValueError, match=f"{name}.*not a cross-encoder.*fresh_heads=True"):
            BertCrossEncoder.from_preset(path)
    fresh = BertCrossEncoder.from_preset(tmp_path / "pretraining", fresh_heads=True)
    assert fresh.num_labels == 1
    embedder_dir = tmp_path / "embedder"
    shutil.copytree(directories["st_one"], embedder_dir)
    (embedder_dir / "modules.json").write_text(
        json.dumps(
            [
                {
                    "idx": 0,
                    "name": "0",
                    "path": "",
                    "type": "sentence_transformers.models.Transformer",
                },
                {
                    "idx": 1,
                    "name": "1",
                    "path": "1_Pooling",
                    "type": "sentence_transformers.models.Pooling",
                },
            ]
        )
    )
    with pytest.raises(ValueError, match="BertTextEmbedder"):
        BertCrossEncoder.from_preset(embedder_dir)
    with pytest.raises(ValueError, match="`activation` must be one of"):
        BertCrossEncoder(toy_backbone(), activation="softmax")
    with pytest.raises(ValueError, match="`num_labels` must be a positive integer"):
        BertCrossEncoder(toy_backbone(), num_labels=0)
    with pytest.raises(ValueError, match="`num_negatives` must be a positive integer"):
        RerankingMultipleNegativesLoss(num_negatives=0)


def _st_logits(reference, firsts, seconds):
    with torch.no_grad():
        features = reference.preprocess(list(zip(firsts, seconds)))
        return reference(features)["scores"].view(-1)


def test_losses_equal_sentence_transformers(directories):
    """Each loss's value against sentence-transformers' loss object on the same model."""
    from sentence_transformers.cross_encoder import losses as st_losses

    reference = _reference(directories["st_one"])
    model = BertCrossEncoder.from_preset(directories["st_one"])
    pairs = _pairs()
    queries, documents = [p[0] for p in pairs], [p[1] for p in pairs]
    labels = np.array([1, 0, 1, 1, 0, 0, 1, 0], "float32")

    # Binary cross-entropy with pos_weight.
    bce = st_losses.BinaryCrossEntropyLoss(reference, pos_weight=torch.tensor(3.0))
    with torch.no_grad():
        expected = float(bce([queries, documents], torch.tensor(labels)))
    logits = model.predict(pairs, activation="identity")
    actual = float(BinaryCrossEntropyLoss(pos_weight=3.0)(labels, logits))
    assert abs(actual - expected) <= 1e-5, (actual, expected)
    assert abs(float(BinaryCrossEntropyLoss()(labels, logits)) - expected) > 1e-2

    # In-batch negatives with every negative (deterministic), hard negatives included: the
    # groups kbert builds, scored by the model, against the loss on sentence-transformers'.
    columns = (queries[:4], documents[:4], documents[4:])
    mnrl = st_losses.MultipleNegativesRankingLoss(reference, num_negatives=None)
    with torch.no_grad():
        expected = float(mnrl([list(c) for c in columns], None))
    model.compile(loss=RerankingMultipleNegativesLoss(num_negatives=None))
    batches = _PairGroupBatches(model, columns, None, None, 4, "in_batch", shuffle=False)
    x, y = batches[0]
    assert x["token_ids"].shape[:2] == (4, 1 + 6 + 1)
    scores = model(x, training=False)
    actual = float(
        keras.ops.convert_to_numpy(RerankingMultipleNegativesLoss(num_negatives=None)(y, scores))
    )
    assert abs(actual - expected) <= 1e-5, (actual, expected)
    # Sampled negatives: the loss of one score matrix (positive first), any activation.
    rng = np.random.default_rng(1)
    score_columns = [torch.tensor(rng.normal(0, 2, 5).astype("float32")) for _ in range(4)]
    for activation, torch_activation, scale in (
        ("sigmoid", torch.nn.Sigmoid(), 10.0),
        (None, None, 1.0),
    ):
        loss = st_losses.MultipleNegativesRankingLoss(
            reference, num_negatives=2, scale=scale, activation_fn=torch_activation
        )
        expected = float(loss.calculate_loss(score_columns, 5))
        matrix = np.stack([c.numpy() for c in score_columns], axis=1)  # (batch, candidates)
        ours = RerankingMultipleNegativesLoss(num_negatives=2, scale=scale, activation=activation)
        assert abs(float(ours(np.zeros(5), matrix)) - expected) <= 1e-5

    # LambdaLoss (NDCG-Loss2++) on lists of different lengths, several k and log bases.
    doc_lists = [documents[:5], documents[2:4], documents[1:8]]
    list_labels = [[2, 0, 1, 0, 3], [0, 1], [1, 0, 0, 2, 0, 1, 0]]
    batches = _PairGroupBatches(
        model,
        (queries[:3], doc_lists),
        list_labels,
        None,
        3,
        "listwise",
        shuffle=False,
    )
    x, y = batches[0]
    scores = model(x, training=False)
    for settings in ({}, {"k": 3}, {"reduction_log": "natural", "sigma": 0.5}):
        st_loss = st_losses.LambdaLoss(reference, **settings)
        with torch.no_grad():
            expected = float(
                st_loss(
                    [queries[:3], doc_lists],
                    [torch.tensor(row, dtype=torch.float32) for row in list_labels],
                )
            )
        actual = float(keras.ops.convert_to_numpy(LambdaLoss(**settings)(y, scores)))
        assert abs(actual - expected) <= 1e-5 * max(1.0, abs(expected)), (
            settings,
            actual,
            expected,
        )


def test_fit_reduces_each_loss(directories):
    """Binary cross-entropy on labelled pairs, in-batch negatives on (query, positive)
    columns and LambdaLoss on document lists: each lower after a few epochs. Each batch holds
    the whole data (one step per epoch, dropout off), so an epoch's logged loss is the loss at
    the weights it started from: the first epoch's is the untrained model's."""

    def losses(x, y, batch_size):
        history = model.fit(x, y, epochs=10, batch_size=batch_size, shuffle=False, verbose=0)
        return history.history["loss"][0], history.history["loss"][-1]

    keras.utils.set_random_seed(0)
    model = BertCrossEncoder.from_preset(directories["st_one"], dropout=0.0)
    pairs = _pairs()
    queries, documents = [p[0] for p in pairs], [p[1] for p in pairs]
    labels = np.array([1, 0, 1, 1, 0, 0, 1, 0], "float32")
    model.compile(learning_rate=1e-3, warmup_ratio=0.0)
    before, after = losses(pairs, labels, 8)
    assert after < 0.7 * before, (before, after)

    columns = (queries[:6], documents[:6])
    model.compile(loss=RerankingMultipleNegativesLoss(num_negatives=None), learning_rate=1e-3)
    before, after = losses(columns, None, 6)
    assert after < 0.7 * before, (before, after)

    lists = [documents[:4], documents[3:6], documents[5:]]
    list_labels = [[1, 0, 2, 0], [0, 0, 1], [1, 0, 3]]
    model.compile(loss=LambdaLoss(k=2), learning_rate=1e-3)  # k: a mask in compiled steps
    before, after = losses((queries[:3], lists), list_labels, 6)
    assert after < 0.7 * before, (before, after)


@pytest.mark.backend_independent
def test_hub_handle_loads_the_cross_encoder(directories, tmp_path, monkeypatch):
    """`hf://` handles: the snapshot's cross-encoder settings (here a tanh activation in
    config_sentence_transformers.json) and weights give the local directory's scores."""
    pytest.importorskip("huggingface_hub")
    from huggingface_hub import constants

    from tests.checkpoints._hub_server import HubServer, Repository

    local = tmp_path / "local"
    shutil.copytree(directories["st_one"], local)
    st_config = json.loads((local / "config_sentence_transformers.json").read_text())
    st_config["activation_fn"] = "torch.nn.modules.activation.Tanh"
    (local / "config_sentence_transformers.json").write_text(json.dumps(st_config))
    files = {p.name: p.read_bytes() for p in local.iterdir() if p.is_file()}
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf_cache"))
    monkeypatch.setenv("KBERT_PRESETS_DIR", str(tmp_path / "kbert_presets"))
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    for name in ("HF_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_ETAG_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with HubServer({"kbert-test/tiny-reranker": Repository(files)}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        model = BertCrossEncoder.from_preset("hf://kbert-test/tiny-reranker")
    assert model.activation == "tanh"
    pairs = _pairs()
    np.testing.assert_array_equal(
        model.predict(pairs), BertCrossEncoder.from_preset(local).predict(pairs)
    )


class TestBertCrossEncoderModel(TestCase):
    def test_config_keras_file_and_lengths(self, tmp_path):
        """Config and `.keras` round trips (labels, activation, preprocessor kept), shorter
        inputs, and `predict` of the restored model."""
        model = BertCrossEncoder(
            toy_backbone(),
            num_labels=2,
            activation="tanh",
            labels=["no", "yes"],
            dropout=0.2,
            preprocessor=toy_preprocessor(16),
        )
        pairs = [("who wrote it ?", "ann wrote it in 1990 ."), ("a good film", "the plot")]
        packed = model.pack_pairs(*model.tokenize_pairs(*zip(*pairs)))
        self.run_task_test(model, input_data=packed, tmp_path=tmp_path, sequence_lengths=(12,))
        restored = keras.saving.load_model(tmp_path / "model.keras")
        assert isinstance(restored, BertCrossEncoder)
        assert (restored.num_labels, restored.activation, restored.labels) == (
            2,
            "tanh",
            ["no", "yes"],
        )
        scores = model.predict(pairs)
        np.testing.assert_allclose(
            scores, np.tanh(keras.ops.convert_to_numpy(model(packed))), atol=1e-6
        )
        np.testing.assert_allclose(restored.predict(pairs), scores, atol=1e-6)


@pytest.mark.backend_independent
def test_argument_and_training_input_errors_are_named():
    """The errors of the constructor, `predict`, `evaluate_reranking` and ranking-loss `fit`
    that `test_bad_input` leaves out, each raised before any computation, with its message."""
    backbone = toy_backbone()
    with pytest.raises(ValueError, match=r"`labels` must be 2 label names .* labels=\['yes'\]"):
        BertCrossEncoder(backbone, num_labels=2, labels=["yes"])
    with pytest.raises(ValueError, match=r"`labels` must be 2 label names"):
        BertCrossEncoder(backbone, num_labels=2, labels=["yes", 1])
    with pytest.raises(ValueError, match="needs a preprocessor .* raw \\(query, document\\)"):
        BertCrossEncoder(backbone).predict([("who wrote it", "ann")])
    model = BertCrossEncoder(backbone, preprocessor=toy_preprocessor(16))
    pairs = [("who wrote it", "ann wrote it"), ("a good film", "the plot")]
    for batch_size in (0, 2.0, True):
        with pytest.raises(ValueError, match="`batch_size` must be a positive integer"):
            model.predict(pairs, batch_size=batch_size)
    with pytest.raises(ValueError, match=r"`activation` must be one of .*'softmax'"):
        model.predict(pairs, activation="softmax")
    with pytest.raises(ValueError, match="must be numbers in \\[0, 1\\]. Received dtype <U3"):
        model.fit(pairs, ["yes", "no"], verbose=0)

    # evaluate_reranking's samples.
    with pytest.raises(ValueError, match='Sample 1 must be a dict with "query" and "positive"'):
        model.evaluate_reranking(
            [{"query": "who", "positive": ["ann"], "negative": ["it"]}, {"query": "who"}]
        )
    with pytest.raises(ValueError, match='Sample 0 must have exactly one of "negative" and'):
        model.evaluate_reranking(
            [{"query": "who", "positive": ["ann"], "negative": ["it"], "documents": ["ann"]}]
        )
    with pytest.raises(ValueError, match='Sample 0 must have exactly one of "negative" and'):
        model.evaluate_reranking([{"query": "who", "positive": ["ann"]}])

    # Ranking losses: the model, sample weights and in-batch columns.
    model.compile(loss=RerankingMultipleNegativesLoss())
    columns = (["who wrote it", "a good film"], ["ann wrote it", "the plot"])
    with pytest.raises(ValueError, match="Ranking losses take no `sample_weight`"):
        model.fit(columns, None, sample_weight=np.ones(2), verbose=0)
    with pytest.raises(ValueError, match=r"need \(queries, positives\[, negatives...\]\) .* 1 "):
        model.fit((columns[0],), None, verbose=0)
    three = BertCrossEncoder(backbone, num_labels=3, preprocessor=model.preprocessor)
    three.compile(loss=LambdaLoss())
    with pytest.raises(ValueError, match="train one-label cross-encoders. This one has 3"):
        three.fit((["who"], [["ann", "it"]]), [[1, 0]], verbose=0)

    # LambdaLoss document lists.
    model.compile(loss=LambdaLoss())
    lists = (["who wrote it", "a good film"], [["ann", "it"], ["the plot"]])
    cases = [
        ("who wrote it", [[1, 0]], "takes \\(queries, document lists\\) .* Received str"),
        (lists, None, "needs `y`: one list of relevance labels per query"),
        (lists, [[1, 0]], "one entry per row. Received 2, 2 and 1"),
        ((["who", 7], lists[1]), [[1, 0], [1]], "Query 1 is not a string: 7"),
        ((lists[0], [["ann"], []]), [[1], []], "Row 1: the documents must be a non-empty list"),
        ((lists[0], [["ann"], "plot"]), [[1], [1]], "Row 1: the documents must be a non-empty"),
        (lists, [[1, 0], [1, 0]], "Row 1 has 1 documents but 2 labels"),
        (lists, [[1, 0], [np.nan]], "Row 1: labels must be finite numbers"),
    ]
    for x, y, message in cases:
        with pytest.raises(ValueError, match=message):
            model.fit(x, y, verbose=0)


def _distinct_texts(rng, count, words=3):
    """`count` different short texts of the toy vocabulary's words."""
    from tests.models.test_classifier import TOY_WORDS

    texts = set()
    while len(texts) < count:
        texts.add(" ".join(rng.choice(TOY_WORDS, words, replace=False)))
    return sorted(texts)


@pytest.mark.backend_independent
def test_sampled_negative_groups():
    """In-batch groups with sampled negatives, as sentence-transformers' cross-encoder
    `MultipleNegativesRankingLoss` builds them: each query's positive first, then
    `num_negatives` different candidates (positives and hard negatives) of the other rows of
    its batch, never its own, drawn anew each epoch (all of them, column by column, when
    there are fewer), then its own hard negative; rows shuffled each epoch; a seed repeats
    the batches and another seed draws others."""
    rng = np.random.default_rng(0)
    texts = _distinct_texts(rng, 30)
    queries, positives, hard = texts[:10], texts[10:20], texts[20:]
    columns = (queries, positives, hard)
    model = BertCrossEncoder(toy_backbone(), preprocessor=toy_preprocessor(24))
    model.compile(loss=RerankingMultipleNegativesLoss(num_negatives=3))

    def epochs(seed, count=6):
        """Every batch's (rows, groups) over `count` epochs."""
        batches = _PairGroupBatches(model, columns, None, None, 4, "in_batch", seed=seed)
        result = []
        for _ in range(count):
            for index in range(len(batches)):
                rows = batches.batch_rows(index).tolist()
                result.append((rows, batches.groups(rows)[1]))
            batches.on_epoch_end()
        return result

    drawn = {row: set() for row in range(10)}
    history = epochs(seed=7)
    for epoch in range(6):
        batches = history[3 * epoch : 3 * epoch + 3]
        assert sorted(r for rows, _ in batches for r in rows) == list(range(10))
        for rows, groups in batches:
            for row, group in zip(rows, groups):
                others = [positives[r] for r in rows if r != row] + [
                    hard[r] for r in rows if r != row
                ]
                assert group[0] == positives[row] and group[-1] == hard[row], (row, group)
                negatives = group[1:-1]
                if len(others) > 3:  # Drawn: 3 different candidates of the other rows.
                    assert len(negatives) == 3 and len(set(negatives)) == 3, negatives
                    assert set(negatives) <= set(others), (row, negatives, others)
                    drawn[row].add(tuple(sorted(negatives)))
                else:  # A batch of two rows: all the other row's candidates, in order.
                    assert negatives == others, (row, negatives, others)
    assert all(len(sets) >= 2 for row, sets in drawn.items() if sets), drawn
    # In one batch, each call draws anew and every other candidate can be drawn (not the
    # first three every time).
    fixed = _PairGroupBatches(model, columns, None, None, 4, "in_batch", shuffle=False)
    rows = fixed.batch_rows(0).tolist()
    seen = [set() for _ in rows]
    for _ in range(20):
        for drawn_of_row, group in zip(seen, fixed.groups(rows)[1]):
            drawn_of_row.update(group[1:-1])
    for row, drawn_of_row in zip(rows, seen):
        others = {positives[r] for r in rows if r != row} | {hard[r] for r in rows if r != row}
        assert drawn_of_row == others, (row, drawn_of_row, others)
    assert history != epochs(seed=8)
    again = epochs(seed=7)
    assert [rows for rows, _ in again] == [rows for rows, _ in history]
    assert [groups for _, groups in again] == [groups for _, groups in history]

    # Batches under keras' global seed repeat; each row of `x` packs the query with its
    # group's documents in order (the positive first: the loss reads column 0).
    batches = []
    for _ in range(2):
        keras.utils.set_random_seed(3)
        batches.append(_PairGroupBatches(model, columns, None, None, 4, "in_batch"))
    twin = _PairGroupBatches(model, columns, None, None, 4, "in_batch", seed=11)
    reference = _PairGroupBatches(model, columns, None, None, 4, "in_batch", seed=11)
    rows = reference.batch_rows(0).tolist()
    groups = reference.groups(rows)[1]
    x, y = twin[0]
    assert x["token_ids"].shape[:2] == (4, 5) and (y == 0).all()
    for i, (row, group) in enumerate(zip(rows, groups)):
        expected = model.pack_pairs(
            *model.tokenize_pairs([queries[row]] * 5, group), length=x["token_ids"].shape[-1]
        )
        for key in ("token_ids", "segment_ids", "padding_mask"):
            np.testing.assert_array_equal(x[key][i], expected[key], err_msg=key)
    first, second = batches
    np.testing.assert_array_equal(first.order, second.order)
    for key in ("token_ids", "padding_mask"):
        np.testing.assert_array_equal(first[0][0][key], second[0][0][key])
