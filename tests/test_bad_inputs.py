"""Catalogue of bad inputs: one case per line, each with the exact error type and a substring
of the message that names the offending value (and where it came from: file, line, key,
argument). Every case is cheap (tiny models, small files) and runs on every backend.

Add a case: one `_case(id, callable, ExpectedError, "substring")` line. Callables receive the
`ctx` fixture (paths of small malformed files, a tiny model) so files are written once.
"""

import json
import os
from unittest import mock

import keras
import numpy as np
import pytest

from kbert.checkpoints import export_to_huggingface
from kbert.data import read_conll, read_glue, read_squad
from kbert.data.squad import prepare_squad_features
from kbert.data.tagging import encode_tagging
from kbert.models import BertBackbone, BertClassifier, BertQuestionAnswerer
from kbert.text import BertTokenizer
from tests.test_case import tiny_backbone_kwargs

VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [
    "the",
    "a",
    "film",
    "good",
    "bad",
    "is",
    "was",
    "it",
    "and",
    "##s",
    "hello",
    "world",
]


def _backbone(**overrides):
    return BertBackbone(**tiny_backbone_kwargs(**overrides))


def _edit_json(path, **changes):
    data = json.loads(path.read_text())
    for key, value in changes.items():
        target = data
        *parents, leaf = key.split(".")
        for parent in parents:
            target = target[parent]
        target[leaf] = value
    path.write_text(json.dumps(data))
    return path.parent


class Context:
    """Small malformed inputs, written once per module."""

    def __init__(self, root):
        self.root = root
        backbone = BertBackbone(**tiny_backbone_kwargs(vocabulary_size=len(VOCABULARY)))
        tokenizer = BertTokenizer(VOCABULARY, lowercase=True)
        self.tokenizer = tokenizer
        self.classifier = BertClassifier(backbone, num_classes=2)
        self.regressor = BertClassifier(backbone, num_classes=1)
        self.preset = root / "preset"
        backbone.save_to_preset(self.preset, tokenizer=tokenizer)
        self.hf = root / "hf"
        export_to_huggingface(backbone, self.hf, vocabulary=VOCABULARY)
        self.inputs = {
            "token_ids": np.array([[2, 5, 3]], "int32"),
            "segment_ids": np.zeros((1, 3), "int32"),
            "padding_mask": np.ones((1, 3), "int32"),
        }

    def copy(self, source, name):
        import shutil

        target = self.root / name
        if not target.exists():
            shutil.copytree(source, target)
        return target

    def write(self, name, data):
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
        return path

    # --- malformed presets -------------------------------------------------
    def preset_with(self, name, **changes):
        return _edit_json(self.copy(self.preset, name) / "config.json", **changes)

    def hf_with(self, name, **changes):
        return _edit_json(self.copy(self.hf, name) / "config.json", **changes)

    def truncated_weights(self):
        path = self.copy(self.preset, "truncated")
        weights = path / "model.weights.h5"
        weights.write_bytes(weights.read_bytes()[:1000])
        return path

    def broken_json_preset(self):
        path = self.copy(self.preset, "broken_json")
        (path / "config.json").write_text('{"format": "kbert", "backbone": ')
        return path

    def google_with(self, **config):
        base = dict(
            vocab_size=30,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=48,
        )
        base.update(config)
        self.write("google/bert_config.json", base)
        return self.root / "google"

    # --- malformed data files ----------------------------------------------
    def glue(self, name, task_folder, text):
        self.write(f"glue_{name}/{task_folder}/train.tsv", text)
        return self.root / f"glue_{name}"

    def squad(self, name, data):
        return self.write(f"{name}.json", data)


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    return Context(tmp_path_factory.mktemp("bad_inputs"))


def _convert_tool(*argv):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tools" / "convert_checkpoint.py"
    spec = importlib.util.spec_from_file_location("convert_checkpoint", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(list(argv))


def _squad(paragraph):
    return {"version": "1.1", "data": [{"title": "T", "paragraphs": [paragraph]}]}


_QA_OK = {"id": "q1", "question": "What?", "answers": [{"text": "film", "answer_start": 2}]}


def _offline(c, fn, *args):
    """`fn(*args)` with huggingface_hub offline and an empty cache: no request leaves the test."""
    env = {
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_CACHE": str(c.root / "hf_cache"),
        "KBERT_PRESETS_DIR": str(c.root / "presets"),
    }
    with mock.patch.dict(os.environ, env):
        return fn(*args)


def _case(case_id, fn, error, substring):
    return pytest.param(fn, error, substring, id=case_id)


CASES = [
    # --- BertBackbone constructor -------------------------------------------------------------
    _case("backbone-num-heads-0", lambda c: _backbone(num_heads=0), ValueError, "num_heads=0"),
    _case(
        "backbone-hidden-not-divisible",
        lambda c: _backbone(hidden_dim=30, num_heads=4),
        ValueError,
        "hidden_dim=30, num_heads=4",
    ),
    _case(
        "backbone-vocab-str",
        lambda c: _backbone(vocabulary_size="abc"),
        ValueError,
        "vocabulary_size='abc'",
    ),
    _case(
        "backbone-layers-float", lambda c: _backbone(num_layers=2.5), ValueError, "num_layers=2.5"
    ),
    _case(
        "backbone-layers-bool", lambda c: _backbone(num_layers=True), ValueError, "num_layers=True"
    ),
    _case(
        "backbone-layers-negative", lambda c: _backbone(num_layers=-1), ValueError, "num_layers=-1"
    ),
    _case(
        "backbone-intermediate-0",
        lambda c: _backbone(intermediate_dim=0),
        ValueError,
        "intermediate_dim=0",
    ),
    _case(
        "backbone-positions-0",
        lambda c: _backbone(max_sequence_length=0),
        ValueError,
        "max_sequence_length=0",
    ),
    _case("backbone-dropout-1.5", lambda c: _backbone(dropout=1.5), ValueError, "dropout=1.5"),
    _case(
        "backbone-dropout-str",
        lambda c: _backbone(attention_dropout="0.1"),
        ValueError,
        "attention_dropout='0.1'",
    ),
    _case(
        "backbone-epsilon-negative",
        lambda c: _backbone(layer_norm_epsilon=-1.0),
        ValueError,
        "layer_norm_epsilon=-1.0",
    ),
    _case(
        "backbone-activation-unknown",
        lambda c: _backbone(activation="swish2"),
        ValueError,
        "activation='swish2'",
    ),
    _case(
        "backbone-activation-lambda",
        lambda c: _backbone(activation=keras.layers.Lambda(lambda x: x)),
        ValueError,
        "activation=<Lambda",
    ),
    _case(
        "backbone-activation-function",
        lambda c: _backbone(activation=lambda x: x),
        ValueError,
        "activation=<function",
    ),
    _case(
        "backbone-pad-id-out-of-range",
        lambda c: _backbone(pad_token_id=500),
        ValueError,
        "pad_token_id=500",
    ),
    _case(
        "backbone-flash-str",
        lambda c: _backbone(flash_attention="yes"),
        ValueError,
        "flash_attention='yes'",
    ),
    _case("backbone-remat-str", lambda c: _backbone(remat="no"), ValueError, "remat='no'"),
    _case(
        "backbone-hidden-states-str",
        lambda c: _backbone(output_hidden_states="yes"),
        ValueError,
        "`output_hidden_states` must be True or False. Received: output_hidden_states='yes'",
    ),
    _case(
        "backbone-attentions-int",
        lambda c: _backbone(output_attentions=1),
        ValueError,
        "`output_attentions` must be True or False. Received: output_attentions=1 (int)",
    ),
    _case("backbone-unknown-kwarg", lambda c: _backbone(hidden_size=32), ValueError, "hidden_size"),
    _case(
        "backbone-hidden-1e9",
        lambda c: _backbone(hidden_dim=10**9, num_heads=1),
        ValueError,
        "hidden_dim=1000000000",
    ),
    _case(
        "backbone-layers-1e6",
        lambda c: _backbone(num_layers=10**6),
        ValueError,
        "num_layers=1000000",
    ),
    _case(
        "backbone-vocab-huge",
        lambda c: _backbone(vocabulary_size=10**12),
        ValueError,
        "vocabulary_size=1000000000000",
    ),
    # --- task constructors ------------------------------------------------------------------
    _case(
        "classifier-backbone-wrong",
        lambda c: BertClassifier("bert", num_classes=2),
        ValueError,
        "Received: str",
    ),
    _case(
        "classifier-classes-0",
        lambda c: BertClassifier(c.classifier.backbone, num_classes=0),
        ValueError,
        "num_classes=0",
    ),
    _case(
        "classifier-classes-str",
        lambda c: BertClassifier(c.classifier.backbone, num_classes="2"),
        ValueError,
        "num_classes='2'",
    ),
    _case(
        "classifier-dropout-str",
        lambda c: BertClassifier(c.classifier.backbone, num_classes=2, dropout="x"),
        ValueError,
        "dropout='x'",
    ),
    _case(
        "classifier-multi-label-str",
        lambda c: BertClassifier(c.classifier.backbone, num_classes=2, multi_label="yes"),
        ValueError,
        "multi_label='yes'",
    ),
    _case(
        "classifier-unknown-kwarg",
        lambda c: BertClassifier(c.classifier.backbone, num_classes=2, num_labels=3),
        ValueError,
        "num_labels",
    ),
    _case(
        "classifier-learning-rate-negative",
        lambda c: c.classifier.compile(learning_rate=-1.0),
        ValueError,
        "learning_rate=-1.0",
    ),
    _case(
        "qa-sequence-too-long",
        lambda c: BertQuestionAnswerer(c.classifier.backbone, sequence_length=1000),
        ValueError,
        "sequence_length=1000",
    ),
    _case(
        "qa-unknown-kwarg",
        lambda c: BertQuestionAnswerer(c.classifier.backbone, stride=3),
        ValueError,
        "stride",
    ),
    # --- calling models ---------------------------------------------------------------------
    _case("predict-empty-list", lambda c: c.classifier.predict([]), ValueError, "empty batch"),
    _case(
        "predict-empty-array",
        lambda c: c.classifier.predict(np.array([], dtype=str)),
        ValueError,
        "empty batch",
    ),
    _case(
        "predict-text-without-preprocessor",
        lambda c: c.classifier.predict(["hello"]),
        ValueError,
        "no preprocessor",
    ),
    _case(
        "fit-label-out-of-range",
        lambda c: c.classifier.fit(c.inputs, np.array([5])),
        ValueError,
        "[5]",
    ),
    _case(
        "fit-label-float", lambda c: c.classifier.fit(c.inputs, np.array([0.5])), ValueError, "0.5"
    ),
    _case(
        "fit-regression-nan",
        lambda c: c.regressor.fit(c.inputs, np.array([np.nan])),
        ValueError,
        "nan",
    ),
    _case(
        "fit-regression-inf",
        lambda c: c.regressor.fit(c.inputs, np.array([np.inf])),
        ValueError,
        "inf",
    ),
    _case(
        "call-missing-key",
        lambda c: c.classifier.backbone({"token_ids": c.inputs["token_ids"]}),
        ValueError,
        'input "padding_mask"',
    ),
    # --- from_preset: sources and arguments -------------------------------------------------
    _case(
        "preset-name-without-weights",
        lambda c: _offline(c, BertBackbone.from_preset, "bert_tiny_en_uncased"),
        FileNotFoundError,
        "load_weights=False",
    ),
    _case(
        "preset-name-unknown",
        lambda c: BertBackbone.from_preset("bert_huge_xx"),
        ValueError,
        "'bert_huge_xx'",
    ),
    _case("preset-source-int", lambda c: BertBackbone.from_preset(123), ValueError, "int 123"),
    _case(
        "preset-load-weights-str",
        lambda c: BertBackbone.from_preset(c.preset, load_weights="no"),
        ValueError,
        "load_weights='no'",
    ),
    _case(
        "preset-dir-missing",
        lambda c: BertBackbone.from_preset(c.root / "nope"),
        FileNotFoundError,
        "nope",
    ),
    _case(
        "preset-task-unknown-kwarg",
        lambda c: BertClassifier.from_preset(c.preset, num_classes=2, num_clases=3),
        ValueError,
        "num_clases",
    ),
    _case(
        "preset-backbone-override-bad",
        lambda c: BertBackbone.from_preset(c.preset, dropout=2.0),
        ValueError,
        "dropout=2.0",
    ),
    # --- inconsistent kbert presets ---------------------------------------------------------
    _case(
        "kbert-config-not-json",
        lambda c: BertBackbone.from_preset(c.broken_json_preset()),
        ValueError,
        "broken_json/config.json",
    ),
    _case(
        "kbert-config-value-str",
        lambda c: BertBackbone.from_preset(
            c.preset_with("p_str", **{"backbone.hidden_dim": "abc"})
        ),
        ValueError,
        "hidden_dim='abc'",
    ),
    _case(
        "kbert-config-value-str-names-file",
        lambda c: BertBackbone.from_preset(
            c.preset_with("p_str2", **{"backbone.num_layers": "abc"})
        ),
        ValueError,
        "p_str2/config.json",
    ),
    _case(
        "kbert-weights-mismatch-hidden",
        lambda c: BertBackbone.from_preset(
            c.preset_with("p_hidden", **{"backbone.hidden_dim": 64})
        ),
        ValueError,
        "token_embedding/vars/0: shape [17, 32] in the file, expected [17, 64]",
    ),
    _case(
        "kbert-weights-mismatch-layers",
        lambda c: BertBackbone.from_preset(c.preset_with("p_layers", **{"backbone.num_layers": 3})),
        ValueError,
        "the file has 2 transformer layers, the config num_layers=3",
    ),
    _case(
        "kbert-hostile-hidden",
        lambda c: BertBackbone.from_preset(
            c.preset_with("p_h1e9", **{"backbone.hidden_dim": 10**9, "backbone.num_heads": 1})
        ),
        ValueError,
        "hidden_dim=1000000000",
    ),
    _case(
        "kbert-hostile-layers",
        lambda c: BertBackbone.from_preset(
            c.preset_with("p_l1e6", **{"backbone.num_layers": 10**6})
        ),
        ValueError,
        "num_layers=1000000",
    ),
    _case(
        "kbert-truncated-weights",
        lambda c: BertBackbone.from_preset(c.truncated_weights()),
        ValueError,
        "truncated/model.weights.h5",
    ),
    _case(
        "kbert-no-backbone-key",
        lambda c: BertBackbone.from_preset(c.preset_with("p_nobb", backbone=None)),
        ValueError,
        'no "backbone"',
    ),
    # --- inconsistent Hugging Face / Google checkpoints -------------------------------------
    _case(
        "hf-config-value-str",
        lambda c: BertBackbone.from_preset(c.hf_with("hf_str", hidden_size="abc")),
        ValueError,
        "'hidden_size' must be an integer. Received: hidden_size='abc'",
    ),
    _case(
        "hf-config-float-size",
        lambda c: BertBackbone.from_preset(c.hf_with("hf_float", hidden_size=1e12)),
        ValueError,
        "hidden_size=1000000000000.0 (float)",
    ),
    _case(
        "hf-hostile-hidden",
        lambda c: BertBackbone.from_preset(
            c.hf_with("hf_h1e9", hidden_size=10**9, num_attention_heads=1)
        ),
        ValueError,
        "hidden_dim=1000000000",
    ),
    _case(
        "hf-hostile-layers",
        lambda c: BertBackbone.from_preset(c.hf_with("hf_l1e6", num_hidden_layers=10**6)),
        ValueError,
        "num_layers=1000000",
    ),
    _case(
        "hf-weights-mismatch",
        lambda c: BertBackbone.from_preset(c.hf_with("hf_i", intermediate_size=64)),
        ValueError,
        "intermediate_dim=64",
    ),
    _case(
        "hf-layers-mismatch",
        lambda c: BertBackbone.from_preset(c.hf_with("hf_l3", num_hidden_layers=3)),
        ValueError,
        "the checkpoint has 2 transformer layers, the config num_layers=3",
    ),
    _case(
        "hf-dropout-str",
        lambda c: BertBackbone.from_preset(c.hf_with("hf_drop", hidden_dropout_prob="x")),
        ValueError,
        "hidden_dropout_prob='x'",
    ),
    _case(
        "google-config-value-str",
        lambda c: BertBackbone.from_preset(c.google_with(hidden_size="abc"), load_weights=False),
        ValueError,
        "bert_config.json: 'hidden_size'",
    ),
    # --- data readers -----------------------------------------------------------------------
    _case(
        "glue-invalid-utf8",
        lambda c: read_glue(
            "sst2", "train", c.glue("utf8", "SST-2", b"sentence\tlabel\ngood\t1\nbad \xff\xfe\t0\n")
        ),
        ValueError,
        "train.tsv:3",
    ),
    _case(
        "glue-stsb-nan",
        lambda c: read_glue(
            "stsb", "train", c.glue("nan", "STS-B", "sentence1\tsentence2\tscore\na\tb\tnan\n")
        ),
        ValueError,
        "train.tsv:2: the score 'nan'",
    ),
    _case(
        "glue-stsb-not-number",
        lambda c: read_glue(
            "stsb", "train", c.glue("high", "STS-B", "sentence1\tsentence2\tscore\na\tb\thigh\n")
        ),
        ValueError,
        "'high'",
    ),
    _case(
        "glue-columns",
        lambda c: read_glue("sst2", "train", c.glue("columns", "SST-2", "sentence\tlabel\ngood\n")),
        ValueError,
        "train.tsv:2",
    ),
    _case(
        "conll-invalid-utf8",
        lambda c: read_conll(c.write("bad.conll", b"EU NNP B-NP B-ORG\nrejects \xff VBZ B-VP O\n")),
        ValueError,
        "bad.conll:2",
    ),
    _case(
        "squad-not-json",
        lambda c: read_squad(c.write("bad_json.json", "{")),
        ValueError,
        "bad_json.json is not valid JSON",
    ),
    _case(
        "squad-answer-start-str",
        lambda c: read_squad(
            c.squad(
                "start_str",
                _squad(
                    {
                        "context": "a film",
                        "qas": [{**_QA_OK, "answers": [{"text": "film", "answer_start": "abc"}]}],
                    }
                ),
            )
        ),
        ValueError,
        "'answer_start': 'abc'",
    ),
    _case(
        "squad-answer-start-names-question",
        lambda c: read_squad(
            c.squad(
                "start_str2",
                _squad(
                    {
                        "context": "a film",
                        "qas": [{**_QA_OK, "answers": [{"text": "film", "answer_start": "abc"}]}],
                    }
                ),
            )
        ),
        ValueError,
        "question 'q1'",
    ),
    _case(
        "squad-paragraph-without-qas",
        lambda c: read_squad(c.squad("no_qas", _squad({"context": "a film"}))),
        ValueError,
        "article 0 ('T'), paragraph 0 has no ['qas']",
    ),
    _case(
        "squad-paragraph-without-context",
        lambda c: read_squad(c.squad("no_context", _squad({"qas": [_QA_OK]}))),
        ValueError,
        "has no ['context']",
    ),
    _case(
        "squad-question-without-id",
        lambda c: read_squad(
            c.squad("no_id", _squad({"context": "a film", "qas": [{"question": "What?"}]}))
        ),
        ValueError,
        "question 0",
    ),
    _case(
        "squad-no-data-key",
        lambda c: read_squad(c.squad("no_data", {"version": "1.1"})),
        ValueError,
        "no 'data' key",
    ),
    _case("squad-version", lambda c: read_squad({"data": []}, version="3"), ValueError, "'3'"),
    # --- feature builders -------------------------------------------------------------------
    _case(
        "squad-features-stride-0",
        lambda c: prepare_squad_features([], c.tokenizer, doc_stride=0),
        ValueError,
        "doc_stride=0",
    ),
    _case(
        "squad-features-empty-question",
        lambda c: prepare_squad_features(
            [{"id": "q9", "question": " ", "context": "a film"}], c.tokenizer
        ),
        ValueError,
        "'q9'",
    ),
    _case(
        "squad-features-context-not-str",
        lambda c: prepare_squad_features(
            [{"id": "q", "question": "What?", "context": 3}], c.tokenizer
        ),
        ValueError,
        "context of type int",
    ),
    _case(
        "tagging-sequence-length-2",
        lambda c: encode_tagging([["a"]], c.tokenizer, sequence_length=2),
        ValueError,
        "sequence_length=2",
    ),
    _case(
        "tagging-label-count",
        lambda c: encode_tagging(
            [["the", "film"]], c.tokenizer, word_labels=[["O"]], label_to_id={"O": 0}
        ),
        ValueError,
        "2 words but 1 labels",
    ),
    _case(
        "tagging-unknown-label",
        lambda c: encode_tagging(
            [["the"]], c.tokenizer, word_labels=[["B-XYZ"]], label_to_id={"O": 0}
        ),
        ValueError,
        "'B-XYZ'",
    ),
    # --- tools ----------------------------------------------------------------------------
    _case(
        "convert-missing-source",
        lambda c: _convert_tool(
            "--source", str(c.root / "no_such_dir"), "--output", str(c.root / "out")
        ),
        SystemExit,
        "no_such_dir",
    ),
    _case(
        "convert-preset-name-without-weights",
        lambda c: _offline(
            c, _convert_tool, "--source", "bert_tiny_en_uncased", "--output", str(c.root / "out")
        ),
        SystemExit,
        "load_weights=False",
    ),
    _case(
        "convert-not-a-checkpoint",
        lambda c: _convert_tool("--source", str(c.root), "--output", str(c.root / "out")),
        SystemExit,
        "is not a known BERT checkpoint",
    ),
    _case(
        "tagging-word-not-str",
        lambda c: encode_tagging([["the", 5]], c.tokenizer),
        ValueError,
        "5 (type int)",
    ),
]


@pytest.mark.parametrize("fn, error, substring", CASES)
def test_bad_input(ctx, fn, error, substring):
    with pytest.raises(error) as info:
        fn(ctx)
    assert substring in str(info.value), str(info.value)


@pytest.mark.parametrize(
    "changes",
    [{"backbone.hidden_dim": 10**9, "backbone.num_heads": 1}, {"backbone.num_layers": 10**6}],
    ids=["hidden-1e9", "layers-1e6"],
)
def test_hostile_configs_fail_fast(ctx, changes):
    """A hostile config fails before anything is allocated (Python's allocations peak under
    50 MiB; the weights of the config would take gigabytes)."""
    import tracemalloc

    name = "fast_" + "_".join(str(v) for v in changes.values())
    path = ctx.preset_with(name, **changes)
    tracemalloc.start()
    with pytest.raises(ValueError):
        BertBackbone.from_preset(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 50 * 2**20, peak
