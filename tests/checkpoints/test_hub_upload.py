"""Sharing on the Hub: `kbert.hub.upload_preset` and the models' `push_to_hub` through the real
`huggingface_hub` client against the loopback stand-in of the Hub (`_hub_server.py`: create
repository, branch, preupload, LFS batch and upload, commit), then `from_preset("hf://...")`
from the same server. No network.

The upload (files, commits, revisions, token, failures, bad input) does not depend on the
backend, so every test here runs once: the round trips compare the served models' outputs
with kbert's, and kbert's presets, Hugging Face and sentence-transformers exports are equal
to those libraries on every backend in tests/checkpoints/test_huggingface.py and
tests/models/test_text_embedder.py.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from kbert import hub
from kbert.models import BertBackbone, BertClassifier, BertTextEmbedder
from kbert.text import BertPreprocessor, BertTokenizer
from tests.checkpoints._hub_server import HubServer
from tests.test_case import tiny_backbone_kwargs

huggingface_hub = pytest.importorskip("huggingface_hub")

WORDS = "the quick brown fox a lazy dog jumps over".split()
TEXTS = ["the quick brown fox", "a lazy dog jumps over the fox"]
OWNER = "kbert-test"


def _vocabulary():
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
    return vocabulary + [f"w{i}" for i in range(97 - len(vocabulary))]


def _classifier(seed=0):
    import keras

    keras.utils.set_random_seed(seed)
    preprocessor = BertPreprocessor(BertTokenizer(_vocabulary()), sequence_length=12)
    return BertClassifier(
        BertBackbone(**tiny_backbone_kwargs()), num_classes=3, preprocessor=preprocessor
    )


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A loopback Hub at HF_ENDPOINT, a fresh cache, a token, LFS uploads (no Xet storage)."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf_cache"))
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    monkeypatch.setenv("HF_TOKEN", "hf_write_token")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    # The loopback Hub speaks the LFS upload protocol; huggingface_hub uses it without Xet.
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    with HubServer({}) as hub_server:
        monkeypatch.setenv("HF_ENDPOINT", hub_server.endpoint)
        yield hub_server


def _head(repository, revision="main"):
    commit = repository.revisions[revision]
    return commit, repository.commits[commit]


def _write(files, directory):
    for name, data in files.items():
        target = Path(directory) / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return Path(directory)


@pytest.mark.backend_independent
def test_push_to_hub_round_trip_serves_kbert_and_transformers(server, tmp_path):
    classifier = _classifier()
    classifier.fit(TEXTS, np.array([0, 2]), epochs=1, verbose=0)
    commit = classifier.push_to_hub(f"hf://{OWNER}/clf", private=True, commit_message="First")

    repository = server.repositories[f"{OWNER}/clf"]
    head, files = _head(repository)
    assert head == commit and repository.private and repository.messages[commit] == "First"
    # kbert's preset in kbert/, transformers' files at the top, the card for both.
    assert {"kbert/config.json", "kbert/task.weights.h5", "kbert/vocab.txt"} <= set(files)
    assert {"config.json", "model.safetensors", "vocab.txt", "README.md"} <= set(files)
    # Every upload request carried the token from HF_TOKEN.
    assert set(server.authorizations) == {"Bearer hf_write_token"}
    # Weights went through LFS, small files inside the commit.
    assert any(path.startswith("/lfs/") for method, path in server.requests if method == "PUT")

    loaded = BertClassifier.from_preset(f"hf://{OWNER}/clf")
    np.testing.assert_allclose(
        loaded.predict(TEXTS, verbose=0), classifier.predict(TEXTS, verbose=0), atol=1e-6
    )
    assert loaded.base_model == f"{OWNER}/clf"
    # What loads is kbert's own preset in kbert/, not transformers' files beside it.
    assert hub.resolve_preset_source(f"hf://{OWNER}/clf").parts[-1] == hub.KBERT_FOLDER

    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    top = _write({k: v for k, v in files.items() if "/" not in k}, tmp_path / "top")
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(top).eval()
    packed = classifier.preprocessor(TEXTS)
    with torch.no_grad():
        logits = reference(
            input_ids=torch.as_tensor(np.asarray(packed["token_ids"]), dtype=torch.long),
            token_type_ids=torch.as_tensor(np.asarray(packed["segment_ids"]), dtype=torch.long),
            attention_mask=torch.as_tensor(np.asarray(packed["padding_mask"]), dtype=torch.long),
        ).logits.numpy()
    np.testing.assert_allclose(logits, classifier.predict(TEXTS, verbose=0), atol=1e-4)


@pytest.mark.backend_independent
def test_push_embedder_serves_sentence_transformers(server, tmp_path):
    preprocessor = BertPreprocessor(BertTokenizer(_vocabulary()), sequence_length=16)
    embedder = BertTextEmbedder(
        BertBackbone(**tiny_backbone_kwargs()), preprocessor=preprocessor, normalize=True
    )
    embedder.push_to_hub(f"hf://{OWNER}/embedder")
    _, files = _head(server.repositories[f"{OWNER}/embedder"])
    assert {"modules.json", "kbert/config.json", "README.md"} <= set(files)
    card = files["README.md"].decode()
    assert 'pipeline_tag: "sentence-similarity"' in card and "SentenceTransformer(" in card

    loaded = BertTextEmbedder.from_preset(f"hf://{OWNER}/embedder")
    np.testing.assert_allclose(loaded.encode(TEXTS), embedder.encode(TEXTS), atol=1e-6)

    sentence_transformers = pytest.importorskip("sentence_transformers")
    top = _write({k: v for k, v in files.items() if not k.startswith("kbert/")}, tmp_path / "st")
    reference = sentence_transformers.SentenceTransformer(str(top), device="cpu")
    np.testing.assert_allclose(reference.encode(TEXTS), embedder.encode(TEXTS), atol=1e-5)


@pytest.mark.backend_independent
def test_failed_upload_leaves_the_repository_as_it_was(server, tmp_path):
    first = _classifier(seed=0)
    first.save_to_preset(tmp_path / "v1")
    handle = f"hf://{OWNER}/preset"
    commit = hub.upload_preset(handle, tmp_path / "v1")
    repository = server.repositories[f"{OWNER}/preset"]
    before = (dict(repository.revisions), repository.commits[commit])
    assert set(before[1]) >= {"config.json", "model.weights.h5", "task.weights.h5", "README.md"}

    second = _classifier(seed=1)  # other weights: the LFS files differ
    second.save_to_preset(tmp_path / "v2")
    server.reject_lfs = True  # the weights' upload fails after the regular files were read
    with pytest.raises(ConnectionError, match="repository is as it was"):
        hub.upload_preset(handle, tmp_path / "v2")
    assert repository.revisions == before[0] and repository.commits[commit] == before[1]

    server.reject_lfs = False
    server.reject_commit = True  # every object stored, the commit itself refused
    with pytest.raises(ConnectionError, match="repository is as it was"):
        hub.upload_preset(handle, tmp_path / "v2")
    assert repository.revisions == before[0] and len(repository.commits) == 2  # empty + v1

    server.reject_commit = False
    new = hub.upload_preset(handle, tmp_path / "v2", commit_message="Second")
    assert new != commit and repository.messages[new] == "Second"
    _, files = _head(repository)
    assert files["task.weights.h5"] == (tmp_path / "v2" / "task.weights.h5").read_bytes()


@pytest.mark.backend_independent
def test_upload_to_a_revision_keeps_main(server, tmp_path):
    _classifier().save_to_preset(tmp_path / "v1")
    (tmp_path / "v1" / ".cache" / "huggingface").mkdir(parents=True)  # a hidden folder
    (tmp_path / "v1" / ".cache" / "huggingface" / "upload.lock").write_text("")
    handle = f"hf://{OWNER}/branches"
    main = hub.upload_preset(handle, tmp_path / "v1")
    assert not [
        name for name in server.repositories[f"{OWNER}/branches"].commits[main] if ".cache" in name
    ]
    config = json.loads((tmp_path / "v1" / "config.json").read_text())
    config["task"]["dropout"] = 0.3
    (tmp_path / "v1" / "config.json").write_text(json.dumps(config))
    branch = hub.upload_preset(f"{handle}@v2", tmp_path / "v1")
    repository = server.repositories[f"{OWNER}/branches"]
    assert repository.revisions["main"] == main and repository.revisions["v2"] == branch
    assert json.loads(repository.commits[branch]["config.json"])["task"]["dropout"] == 0.3
    assert json.loads(repository.commits[main]["config.json"])["task"]["dropout"] != 0.3
    assert BertClassifier.from_preset(f"{handle}@v2", load_weights=False).dropout == 0.3


@pytest.mark.backend_independent
def test_upload_refuses_bad_input(server, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="hf://<owner>/<name> handle. Received: 'owner/name'"):
        hub.upload_preset("owner/name", tmp_path)
    with pytest.raises(ValueError, match="holding config.json or kbert/config.json"):
        hub.upload_preset(f"hf://{OWNER}/x", tmp_path / "empty")
    (tmp_path / "empty" / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="Two revisions"):
        hub.upload_preset(f"hf://{OWNER}/x@a", tmp_path / "empty", revision="b")
    with pytest.raises(ValueError, match="hf://<owner>/<name> handle"):
        _classifier().push_to_hub("not a handle")
    assert server.requests == []  # nothing was sent


@pytest.mark.backend_independent
def test_quantized_model_is_pushed_as_kbert_preset_alone(server):
    classifier = _classifier()
    classifier.quantize("int8")  # int8 kernels: no transformers format for them
    classifier.push_to_hub(f"hf://{OWNER}/int8")
    _, files = _head(server.repositories[f"{OWNER}/int8"])
    assert "kbert/config.json" in files and "config.json" not in files
    assert json.loads(files["kbert/config.json"])["quantization"]
    card = files["README.md"].decode()
    assert "from_preset(" in card and "from_pretrained(" not in card
