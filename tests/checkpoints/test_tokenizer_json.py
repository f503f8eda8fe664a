"""Directories saved by `transformers` 5: the vocabulary comes from `tokenizer.json`.

`BertTokenizerFast.save_pretrained` and `SentenceTransformer.save` write `tokenizer.json` and
`tokenizer_config.json` but no `vocab.txt`; kbert then reads the WordPiece `model` section of
`tokenizer.json`. The reference for ids and offsets is `transformers`' (or `tokenizers`') own
tokenizer loaded from the same directory.
"""

import json

import numpy as np
import pytest

from kbert.text import BertTokenizer

transformers = pytest.importorskip("transformers")

VOCABULARY = [
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<unk>",
    "the", "The", "THE", "quick", "Quick", "qu", "##ick", "##s", "fox", "Fox", ",", "!", ".",
    "café", "cafe", "Café", "naïve", "naive", "na", "##ï", "##i", "##ve", "é", "e", "##é",
    "中", "文", "and", "a", "b", "un", "##known", "##word", "ü", "u", "##ber", "über",
]  # fmt: skip

TEXTS = [
    "The quick fox.",
    "THE QUICK Fox, the quicks!",
    "Café café cafe naïve NAÏVE",
    "über Über uber",
    "中文and中 a文b",
    "a\tb  \u00a0 c\u3000the",
    "unknownword unknownwordss",
    "é É e\u0301",
    "",
]


def _save_hf_tokenizer(path, **kwargs):
    """A tokenizer directory as `transformers` saves it (`tokenizer.json`,
    `tokenizer_config.json`), without `vocab.txt`; returns the tokens in id order."""
    source = path.parent / f"{path.name}_source.txt"
    source.write_text("".join(t + "\n" for t in VOCABULARY), encoding="utf-8")
    transformers.BertTokenizerFast(str(source), **kwargs).save_pretrained(str(path))
    (path / "vocab.txt").unlink(missing_ok=True)  # Sure to read tokenizer.json alone.
    assert (path / "tokenizer.json").is_file()
    return path


def _edit_tokenizer_json(path, edit):
    file = path / "tokenizer.json"
    data = json.loads(file.read_text(encoding="utf-8"))
    edit(data)
    file.write_text(json.dumps(data), encoding="utf-8")


def _kbert_pieces(tokenizer, texts):
    result = []
    for text in texts:
        ids, starts, ends, _ = tokenizer.tokenize_with_offsets(text)
        result.append((list(ids), list(zip(starts, ends))))
    return result


def _reference_pieces(encode, texts):
    result = []
    for text in texts:
        ids, offsets = encode(text)
        result.append((list(ids), [tuple(o) for o in offsets]))
    return result


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "lowercase, strip_accents",
    [(True, None), (False, None), (True, False), (False, True)],
)
def test_tokenizer_json_directory_tokenizes_like_transformers(tmp_path, lowercase, strip_accents):
    path = _save_hf_tokenizer(tmp_path / "hf", do_lower_case=lowercase, strip_accents=strip_accents)
    hf = transformers.AutoTokenizer.from_pretrained(str(path))
    tokenizer = BertTokenizer.from_preset(path)
    assert tokenizer.vocabulary == hf.convert_ids_to_tokens(list(range(len(VOCABULARY))))

    def encode(text):
        encoded = hf(text, add_special_tokens=False, return_offsets_mapping=True)
        return encoded["input_ids"], encoded["offset_mapping"]

    expected = _reference_pieces(encode, TEXTS)
    assert _kbert_pieces(tokenizer, TEXTS) == expected
    # The settings matter on these texts: the other casing tokenizes them differently.
    other = BertTokenizer.from_preset(path, lowercase=not lowercase)
    assert _kbert_pieces(other, TEXTS) != expected
    # The tokenizer.json file itself is a preset too (with its directory's settings).
    assert _kbert_pieces(BertTokenizer.from_preset(path / "tokenizer.json"), TEXTS) == expected


@pytest.mark.backend_independent
def test_tokenizer_json_alone_gives_ids_unknown_token_and_word_limit(tmp_path):
    """Without `tokenizer_config.json` the model section (`unk_token`,
    `max_input_chars_per_word`) and the `BertNormalizer` say everything; the ids are the
    mapping's, whatever order the file lists it in."""
    tokenizers = pytest.importorskip("tokenizers")
    path = _save_hf_tokenizer(tmp_path / "hf", do_lower_case=True, unk_token="<unk>")
    (path / "tokenizer_config.json").unlink()

    def edit(data):
        data["model"]["max_input_chars_per_word"] = 5
        data["model"]["vocab"] = dict(reversed(list(data["model"]["vocab"].items())))

    _edit_tokenizer_json(path, edit)
    reference = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
    assert reference.get_vocab() == {t: i for i, t in enumerate(VOCABULARY)}
    tokenizer = BertTokenizer.from_preset(path)
    assert tokenizer.unknown_token == "<unk>"
    assert tokenizer.max_chars_per_word == 5
    # Upper-case pieces in the vocabulary would make a guess say "cased": the normalizer rules.
    assert tokenizer.lowercase is True

    def encode(text):
        encoded = reference.encode(text, add_special_tokens=False)
        return encoded.ids, encoded.offsets

    texts = TEXTS + ["quicks quickss Quick", "unknown"]
    expected = _reference_pieces(encode, texts)
    assert any(5 in ids for ids, _ in expected)  # Words over 5 characters became <unk>.
    assert _kbert_pieces(tokenizer, texts) == expected


@pytest.mark.backend_independent
def test_vocab_txt_wins_over_tokenizer_json(tmp_path):
    path = _save_hf_tokenizer(tmp_path / "hf", do_lower_case=True)
    tokens = VOCABULARY[:5] + list(reversed(VOCABULARY[5:]))
    (path / "vocab.txt").write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    assert BertTokenizer.from_preset(path).vocabulary == tokens


@pytest.mark.backend_independent
def test_tokenizer_json_errors(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    # Not WordPiece: BPE (RoBERTa, GPT-2) and Unigram (T5, ALBERT) tokenizers.
    models = {
        "BPE": tokenizers.models.BPE(vocab={"a": 0, "b": 1, "ab": 2}, merges=[("a", "b")]),
        "Unigram": tokenizers.models.Unigram([("<unk>", 0.0), ("a", -1.0), ("b", -2.0)], 0),
    }
    for kind, model in models.items():
        directory = tmp_path / kind
        directory.mkdir()
        tokenizers.Tokenizer(model).save(str(directory / "tokenizer.json"))
        with pytest.raises(ValueError, match=f"BERT needs a WordPiece vocabulary.*'{kind}'"):
            BertTokenizer.from_preset(directory)

    def remove_token(data):
        del data["model"]["vocab"]["[SEP]"]  # id 3

    def shift_ids(data):
        data["model"]["vocab"] = {t: i + 1 for t, i in data["model"]["vocab"].items()}

    def prefix(data):
        data["model"]["continuing_subword_prefix"] = "@@"

    def no_chinese(data):
        data["normalizer"]["handle_chinese_chars"] = False

    ids = r"tokenizer\.json: the ids of model\.vocab must be "
    cases = [
        (remove_token, ids + r"0\.\.41.*Id 3 is missing"),
        (shift_ids, ids + r"0\.\.42.*Id 0 is missing"),
        (prefix, r"tokenizer\.json: .*'##'.*continuing_subword_prefix='@@'"),
        (no_chinese, r"tokenizer\.json: the normalizer sets handle_chinese_chars=false"),
    ]
    for i, (edit, message) in enumerate(cases):
        path = _save_hf_tokenizer(tmp_path / f"case{i}", do_lower_case=True)
        _edit_tokenizer_json(path, edit)
        with pytest.raises(ValueError, match=message):
            BertTokenizer.from_preset(path)
    # keras-hub's tokenizer.json holds settings, not a vocabulary.
    directory = tmp_path / "keras_hub"
    directory.mkdir()
    (directory / "tokenizer.json").write_text('{"config": {"lowercase": true}}')
    with pytest.raises(ValueError, match="No vocabulary found.*tokenizer.json"):
        BertTokenizer.from_preset(directory)


def test_model_from_transformers_5_directory_loads_with_its_tokenizer(tmp_path):
    """`BertModel.save_pretrained` + the tokenizer's save, no `vocab.txt`: the embedder's
    mean-pooled embeddings of raw text equal transformers' on its own tokenizer, also after a
    kbert preset round trip (which writes the vocabulary as vocab.txt)."""
    torch = pytest.importorskip("torch")
    from kbert.models import BertTextEmbedder
    from tests.checkpoints._reference import hf_config, make_hf_model, to_numpy

    path = _save_hf_tokenizer(tmp_path / "hf", do_lower_case=False)
    model = make_hf_model(hf_config(vocab_size=len(VOCABULARY)), kind="model")
    model.save_pretrained(str(path))
    texts = ["The quick fox.", "Café naïve über 中文", "unknownword and the quicks"]
    encoded = transformers.AutoTokenizer.from_pretrained(str(path))(
        texts, padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        hidden = model(**encoded).last_hidden_state.numpy()
    mask = encoded["attention_mask"].numpy()[..., None]
    expected = (hidden * mask).sum(axis=1) / mask.sum(axis=1)

    embedder = BertTextEmbedder.from_preset(path)
    assert embedder.preprocessor.tokenizer.vocabulary == VOCABULARY
    np.testing.assert_allclose(embedder.encode(texts), expected, rtol=0, atol=1e-4)
    embedder.save_to_preset(tmp_path / "preset")
    saved = (tmp_path / "preset" / "vocab.txt").read_text(encoding="utf-8")
    assert saved == "".join(t + "\n" for t in VOCABULARY)
    again = BertTextEmbedder.from_preset(tmp_path / "preset")
    np.testing.assert_allclose(again.encode(texts), expected, rtol=0, atol=1e-4)
    # A BPE tokenizer.json holds no BERT vocabulary: the weights load, without a tokenizer.
    tokenizers = pytest.importorskip("tokenizers")
    bpe = tmp_path / "bpe"
    model.save_pretrained(str(bpe))
    bpe_model = tokenizers.models.BPE(vocab={"a": 0, "b": 1}, merges=[])
    tokenizers.Tokenizer(bpe_model).save(str(bpe / "tokenizer.json"))
    with pytest.warns(UserWarning, match="'BPE' model.*loads without a tokenizer"):
        plain = BertTextEmbedder.from_preset(bpe)
    assert plain.preprocessor is None
    np.testing.assert_array_equal(
        to_numpy(plain.backbone.token_embedding.embeddings),
        model.embeddings.word_embeddings.weight.detach().numpy(),
    )
