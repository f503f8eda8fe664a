"""Special-token strings written in text follow the checkpoint's source.

A tokenizer from a Hugging Face / sentence-transformers directory treats `[MASK]`, `[CLS]`, ...
written in a text as Hugging Face's own tokenizer does (its ids and offsets are the reference
here, read from a `BertTokenizerFast` saved into the directory); `split_special_tokens=True`, a
Google directory and a kbert preset keep them plain text, as the original BERT.
"""

import json

import numpy as np
import pytest

from kbert.backend import tensorflow
from kbert.text import BertTokenizer

transformers = pytest.importorskip("transformers")

VOCABULARY = [
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<m>",
    "a", "b", "x", "mask", "cls", "sep", "[", "]", "<", ">", "m", ".", "_",
    "é", "e", "中", "文", "##b", "##x", "ma", "##sk",
]  # fmt: skip

TEXTS = [
    "a [MASK] b",
    "a[MASK]b",
    "[CLS] x [SEP]",
    "[CLS]x[SEP]",
    "[MASK]",
    "[MASK][MASK]",
    "[MASK] [MASK]  [MASK]",
    " [MASK] ",
    "a  [MASK]\t b",
    "a\u3000[MASK]\u00a0b",
    "[mask]",
    "[Mask] [MASK]",
    "[ MASK ]",
    "[[MASK]]",
    "a.[MASK].b",
    "_[MASK]_",
    "x[MASK]",
    "[MASK]x",
    "é[MASK]中",
    "É[MASK]文 [MÁSK]",
    "[UNK][PAD] [SEP]",
    "ma[MASK]sk [CLS",
    "[MA\u200bSK]",
    "<m> a<m>b",
    "",
]


def _hf_directory(tmp_path, name="hf", lowercase=True, mask_flags=None, **kwargs):
    """A Hugging Face tokenizer directory written by `transformers` itself (vocab.txt,
    tokenizer.json, tokenizer_config.json), and the tokenizer."""
    path = tmp_path / name
    path.mkdir()
    (path / "vocab.txt").write_text("".join(t + "\n" for t in VOCABULARY), encoding="utf-8")
    if mask_flags is not None:
        from tokenizers import AddedToken

        kwargs["mask_token"] = AddedToken("[MASK]", special=True, **mask_flags)
    hf = transformers.BertTokenizerFast(str(path / "vocab.txt"), do_lower_case=lowercase, **kwargs)
    hf.save_pretrained(str(path))
    return path, transformers.AutoTokenizer.from_pretrained(str(path))


def _hf_pieces(hf, texts):
    result = []
    for text in texts:
        encoded = hf(text, add_special_tokens=False, return_offsets_mapping=True)
        result.append((list(encoded["input_ids"]), [tuple(o) for o in encoded["offset_mapping"]]))
    return result


def _kbert_pieces(tokenizer, texts):
    result = []
    for text in texts:
        ids, starts, ends, _ = tokenizer.tokenize_with_offsets(text)
        result.append((list(ids), list(zip(starts, ends))))
    return result


def _graph_pieces(tokenizer, texts):
    tf = tensorflow.tensorflow()
    ids, starts, ends, _ = tokenizer.tokenize_with_offsets(tf.constant(texts))
    return [
        (list(i), list(zip(s, e)))
        for i, s, e in zip(ids.to_list(), starts.to_list(), ends.to_list())
    ]


def _plain(texts):
    """The original BERT's pieces: special-token strings as plain text."""
    return _kbert_pieces(BertTokenizer(VOCABULARY), texts)


def _graph_available():
    try:
        tensorflow.tensorflow_text()
    except tensorflow.MissingTensorFlowError:
        return False
    return True


@pytest.mark.backend_independent
@pytest.mark.parametrize("lowercase", [True, False])
def test_hugging_face_directory_honours_special_tokens_like_hugging_face(tmp_path, lowercase):
    path, hf = _hf_directory(tmp_path, lowercase=lowercase)
    tokenizer = BertTokenizer.from_preset(path)
    assert tokenizer.special_tokens_in_strings and tokenizer.special_tokens is None
    expected = _hf_pieces(hf, TEXTS)
    assert _kbert_pieces(tokenizer, TEXTS) == expected
    # Not vacuous: the original splits them.
    assert _plain(TEXTS[:4]) != expected[:4]
    if _graph_available():
        assert _graph_pieces(tokenizer, TEXTS) == expected
        ids = tokenizer.tokenize(tensorflow.tensorflow().constant(TEXTS)).to_list()
        assert ids == [i for i, _ in expected]


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "flags",
    [
        {"lstrip": True},
        {"rstrip": True},
        {"lstrip": True, "rstrip": True},
        {"single_word": True},
        {"normalized": True},
        {"normalized": True, "lstrip": True, "rstrip": True},
    ],
    ids=lambda flags: "+".join(flags),
)
def test_added_token_settings_match_hugging_face(tmp_path, flags):
    path, hf = _hf_directory(tmp_path, mask_flags=flags)
    tokenizer = BertTokenizer.from_preset(path)
    assert tokenizer.special_tokens_in_strings
    (mask,) = [t for t in tokenizer.special_tokens if t["content"] == "[MASK]"]
    assert all(mask[name] == flags.get(name, False) for name in flags)
    expected = _hf_pieces(hf, TEXTS)
    assert _kbert_pieces(tokenizer, TEXTS) == expected
    # Each setting changes something against verbatim matching.
    verbatim = BertTokenizer(VOCABULARY, special_tokens_in_strings=True)
    assert _kbert_pieces(verbatim, TEXTS) != expected
    if _graph_available():
        with pytest.raises(ValueError, match=r"\[MASK\].*=True.*Python strings"):
            tokenizer.tokenize(tensorflow.tensorflow().constant(["a [MASK] b"]))
    # A preset written by kbert keeps the settings, for kbert and for Hugging Face.
    tokenizer.save_to_preset(tmp_path / "saved")
    again = BertTokenizer.from_preset(tmp_path / "saved")
    assert again.special_tokens_in_strings and again.get_config() == tokenizer.get_config()
    hf_again = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "saved"))
    assert _hf_pieces(hf_again, TEXTS) == expected


@pytest.mark.backend_independent
def test_split_special_tokens_keeps_them_plain_text(tmp_path):
    path, hf = _hf_directory(tmp_path, split_special_tokens=True)
    assert json.loads((path / "tokenizer_config.json").read_text())["split_special_tokens"]
    tokenizer = BertTokenizer.from_preset(path)
    assert not tokenizer.special_tokens_in_strings
    expected = _hf_pieces(hf, TEXTS)
    assert _kbert_pieces(tokenizer, TEXTS) == expected == _plain(TEXTS)
    if _graph_available():
        assert _graph_pieces(tokenizer, TEXTS) == expected


@pytest.mark.backend_independent
def test_declared_special_tokens_and_older_hugging_face_files(tmp_path):
    # An extra special token declared in tokenizer.json's added_tokens.
    path, hf = _hf_directory(tmp_path, additional_special_tokens=["<m>"])
    tokenizer = BertTokenizer.from_preset(path)
    assert "<m>" in [t["content"] for t in tokenizer.special_tokens]
    expected = _hf_pieces(hf, TEXTS)
    assert expected[-2][0][0] == VOCABULARY.index("<m>")
    assert _kbert_pieces(tokenizer, TEXTS) == expected
    if _graph_available():
        assert _graph_pieces(tokenizer, TEXTS) == expected

    # Files of an older transformers: vocab.txt, tokenizer_config.json and
    # special_tokens_map.json only (no tokenizer.json); the flags come from the map.
    old = tmp_path / "old"
    old.mkdir()
    (old / "vocab.txt").write_text("".join(t + "\n" for t in VOCABULARY), encoding="utf-8")
    (old / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "BertTokenizer", "do_lower_case": True})
    )
    mask = {"content": "[MASK]", "lstrip": True, "rstrip": False, "normalized": False}
    (old / "special_tokens_map.json").write_text(
        json.dumps({"mask_token": mask, "additional_special_tokens": ["<m>"]})
    )
    tokenizer = BertTokenizer.from_preset(old)
    (declared,) = [t for t in tokenizer.special_tokens if t["content"] == "[MASK]"]
    assert declared["lstrip"] and not declared["rstrip"]
    assert "<m>" in [t["content"] for t in tokenizer.special_tokens]
    reference = transformers.AutoTokenizer.from_pretrained(str(old))
    assert _kbert_pieces(tokenizer, TEXTS) == _hf_pieces(reference, TEXTS)


@pytest.mark.backend_independent
def test_google_and_kbert_presets_keep_plain_text(tmp_path):
    google = tmp_path / "google"
    google.mkdir()
    (google / "vocab.txt").write_text("".join(t + "\n" for t in VOCABULARY), encoding="utf-8")
    (google / "bert_config.json").write_text(json.dumps({"vocab_size": len(VOCABULARY)}))
    tokenizer = BertTokenizer.from_preset(google)
    assert not tokenizer.special_tokens_in_strings
    assert _kbert_pieces(tokenizer, TEXTS) == _plain(TEXTS)

    # A kbert tokenizer saved with the default records it: kbert and Hugging Face both keep
    # the strings plain text.
    BertTokenizer(VOCABULARY).save_to_preset(tmp_path / "kbert")
    config = json.loads((tmp_path / "kbert" / "tokenizer_config.json").read_text())
    assert config["split_special_tokens"] is True
    assert not BertTokenizer.from_preset(tmp_path / "kbert").special_tokens_in_strings
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "kbert"))
    assert _hf_pieces(hf, TEXTS) == _plain(TEXTS)

    # A kbert preset written before `split_special_tokens` was recorded stays plain text.
    del config["split_special_tokens"]
    (tmp_path / "kbert" / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "kbert" / "config.json").write_text(json.dumps({"format": "kbert"}))
    assert not BertTokenizer.from_preset(tmp_path / "kbert").special_tokens_in_strings


@pytest.mark.backend_independent
def test_special_tokens_argument_errors():
    with pytest.raises(ValueError, match=r"'<q>'.*not in the vocabulary"):
        BertTokenizer(VOCABULARY, special_tokens=["<q>"])
    with pytest.raises(ValueError, match=r"special_tokens\[0\].*Received: \{'content'"):
        BertTokenizer(VOCABULARY, special_tokens=[{"content": "[MASK]", "strip": True}])
    with pytest.raises(ValueError, match="must be a str or a dict"):
        BertTokenizer(VOCABULARY, special_tokens=[3])
    with pytest.raises(ValueError, match="must be None or a list"):
        BertTokenizer(VOCABULARY, special_tokens="[MASK]")
    for bad in ({"content": 3}, {"lstrip": True}):
        with pytest.raises(ValueError, match=r"with a str `content`.*index 0: \{'"):
            BertTokenizer(VOCABULARY, special_tokens=[bad])
    with pytest.raises(ValueError, match=r"special_tokens\[1\].*flags bool.*'lstrip': 'yes'"):
        BertTokenizer(VOCABULARY, special_tokens=["<m>", {"content": "[MASK]", "lstrip": "yes"}])
    # Written verbatim, every listed token (and only those) is honoured.
    tokenizer = BertTokenizer(VOCABULARY, special_tokens_in_strings=True, special_tokens=["<m>"])
    assert tokenizer("<m>[MASK]") == [VOCABULARY.index("<m>")] + tokenizer("[ mask ]")
    assert tokenizer.get_config()["special_tokens"][0] == {
        "content": "<m>",
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "single_word": False,
    }


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "tokens, message",
    [
        (["<a>", "<a"], "contain one another. Received '<a>' containing '<a'"),
        (["<a>", ">b"], "can overlap in text. Received '<a>' and '>b'"),  # one character
        (["<a>", "a>x"], "can overlap in text. Received '<a>' and 'a>x'"),  # two
    ],
)
def test_in_graph_tokenizer_refuses_special_tokens_that_can_overlap(tokens, message):
    """String tensors match special tokens in parallel, so tokens that contain one another or
    can overlap in text are refused there; Python strings honour them."""
    tf = pytest.importorskip("tensorflow")
    vocabulary = [*VOCABULARY, "<a>", "<a", ">b", "a>x"]
    overlapping = BertTokenizer(vocabulary, special_tokens_in_strings=True, special_tokens=tokens)
    assert overlapping("x" + tokens[0]) == [vocabulary.index("x"), vocabulary.index(tokens[0])]
    with pytest.raises(ValueError, match=message):
        overlapping(tf.constant(["x" + tokens[0]]))
    apart = BertTokenizer(vocabulary, special_tokens_in_strings=True, special_tokens=["<a>", "<m>"])
    text = "x<a>b <m>a>x"
    assert apart(tf.constant([text])).to_list() == [apart(text)]


# The tokenizer's special tokens, once; the embedder's numerics on every backend are tested in
# tests/models/test_text_embedder.py.
@pytest.mark.backend_independent
def test_sentence_transformers_embedder_embeds_special_token_strings_alike(tmp_path):
    """A BertTextEmbedder from a sentence-transformers directory embeds text with `[MASK]` in it
    as sentence-transformers does, also after a kbert preset round trip."""
    st = pytest.importorskip("sentence_transformers")
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    from kbert.models import BertTextEmbedder
    from tests.checkpoints._reference import hf_config, make_hf_model

    path, _ = _hf_directory(tmp_path, name="transformer")
    make_hf_model(hf_config(vocab_size=len(VOCABULARY)), kind="model").save_pretrained(path)
    transformer = Transformer(str(path))
    reference = st.SentenceTransformer(
        modules=[transformer, Pooling(transformer.get_embedding_dimension(), "mean")],
        device="cpu",
    )
    reference.save(str(tmp_path / "st"))  # transformers 5 saves tokenizer.json, no vocab.txt
    reference = st.SentenceTransformer(str(tmp_path / "st"), device="cpu")
    texts = ["a [MASK] b", "x[CLS]b", "[mask] a"]
    expected = reference.encode(texts)
    embedder = BertTextEmbedder.from_preset(tmp_path / "st")
    np.testing.assert_allclose(embedder.encode(texts), expected, rtol=0, atol=1e-5)
    plain = BertTextEmbedder.from_preset(tmp_path / "st")
    plain.preprocessor.tokenizer = BertTokenizer(VOCABULARY)
    assert np.abs(plain.encode(texts[:1]) - expected[:1]).max() > 1e-2
    embedder.save_to_preset(tmp_path / "preset")
    again = BertTextEmbedder.from_preset(tmp_path / "preset")
    assert again.preprocessor.tokenizer.special_tokens_in_strings
    np.testing.assert_allclose(again.encode(texts), expected, rtol=0, atol=1e-5)
    # The sentence-transformers writer records the choice for sentence-transformers itself.
    from kbert.checkpoints import export_to_sentence_transformers

    for model, name in ((embedder, "honoured"), (plain, "plain")):
        out = export_to_sentence_transformers(model, tmp_path / name)
        exported = st.SentenceTransformer(str(out), device="cpu")
        np.testing.assert_allclose(model.encode(texts), exported.encode(texts), rtol=0, atol=1e-5)
