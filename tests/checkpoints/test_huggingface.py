"""Hugging Face BERT directories: parity with `transformers`, export, and every refusal path.

References are random `transformers` models whose parameters (biases and LayerNorm too) are
drawn at scale 0.5, so exact vs tanh GELU, a swapped or untransposed tensor all move the
outputs far beyond the 1e-4 tolerance (`test_wrong_activation_is_detected` proves it).
"""

import json
import os
import shutil

import keras
import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from safetensors.numpy import load_file, save_file  # noqa: E402

import kbert  # noqa: E402
from kbert.checkpoints import export_to_huggingface, load_huggingface_weights  # noqa: E402
from tests.checkpoints import _reference as R  # noqa: E402

# Two shapes only (JAX compiles per shape): exact GELU with 2 segments and a 50-wide
# feed-forward; tanh GELU ("gelu_new") with 16 segments, 3 heads and a 100-wide feed-forward.
CONFIGS = {
    "exact_gelu": dict(hidden_act="gelu"),
    "tanh_gelu_16_segments": dict(
        hidden_act="gelu_new",
        hidden_size=48,
        num_attention_heads=3,
        intermediate_size=100,
        type_vocab_size=16,
    ),
}
BACKBONE_KEYS = ("token_ids", "segment_ids", "padding_mask")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Lazily written HF directories: `(config_name, kind) -> (path, transformers model)`."""
    cache = {}

    def get(name, kind):
        if (name, kind) not in cache:
            config = R.hf_config(**CONFIGS[name])
            model = R.make_hf_model(config, kind)
            path = tmp_path_factory.mktemp(f"hf_{name}_{kind}")
            model.save_pretrained(path)
            R.write_vocabulary(path / "vocab.txt", config.vocab_size)
            cache[name, kind] = (path, model)
        return cache[name, kind]

    return get


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _edit_safetensors(path, edit):
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


def _edit_config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


def _weights(model):
    return [R.to_numpy(v) for v in model.weights]


def _backbone_outputs(backbone, inputs):
    return backbone({k: inputs[k] for k in BACKBONE_KEYS})


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_backbone_matches_transformers_bert_model(checkpoints, name):
    path, hf_model = checkpoints(name, "model")
    assert not any(k.startswith("bert.") for k in load_file(path / "model.safetensors"))
    backbone = kbert.models.BertBackbone.from_preset(path)
    inputs = R.random_inputs(hf_model.config)
    expected = R.hf_outputs(hf_model, inputs)
    outputs = _backbone_outputs(backbone, inputs)
    mask = inputs["padding_mask"]
    R.assert_close(outputs["sequence_output"], expected["sequence_output"], mask)
    R.assert_close(outputs["pooled_output"], expected["pooled_output"])
    assert backbone.activation == ("gelu" if name == "exact_gelu" else "gelu_approximate")
    assert backbone.num_segments == hf_model.config.type_vocab_size
    assert backbone.preset_vocabulary_path == str(path / "vocab.txt")


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_pretrainer_matches_transformers_bert_for_pretraining(checkpoints, name):
    path, hf_model = checkpoints(name, "pretraining")
    assert all(k.startswith(("bert.", "cls.")) for k in load_file(path / "model.safetensors"))
    pretrainer = kbert.models.BertPretrainer.from_preset(path, fresh_heads=False)
    inputs = R.random_inputs(hf_model.config)
    expected = R.hf_outputs(hf_model, inputs)
    outputs = pretrainer(inputs)
    R.assert_close(outputs["mlm"], expected["mlm"], scaled=True)
    R.assert_close(outputs["nsp"], expected["nsp"])
    sequence = _backbone_outputs(pretrainer.backbone, inputs)["sequence_output"]
    R.assert_close(sequence, expected["sequence_output"], inputs["padding_mask"])


def test_wrong_activation_is_detected(checkpoints, tmp_path):
    """The parity test can fail: tanh GELU on an exact-GELU checkpoint is far off."""
    path, hf_model = checkpoints("exact_gelu", "model")
    wrong = _copy(path, tmp_path / "wrong_act")
    _edit_config(wrong, hidden_act="gelu_new")
    backbone = kbert.models.BertBackbone.from_preset(wrong)
    inputs = R.random_inputs(hf_model.config)
    expected = R.hf_outputs(hf_model, inputs)
    outputs = _backbone_outputs(backbone, inputs)
    assert (
        R.max_diff(outputs["sequence_output"], expected["sequence_output"], inputs["padding_mask"])
        > 10 * R.TOLERANCE
    )
    with pytest.raises(AssertionError, match="max \\|diff\\|"):
        R.assert_close(
            outputs["sequence_output"], expected["sequence_output"], inputs["padding_mask"]
        )

    # The scale-relative check of the masked-LM logits fails as well.
    path, hf_model = checkpoints("exact_gelu", "pretraining")
    wrong = _copy(path, tmp_path / "wrong_act_pretraining")
    _edit_config(wrong, hidden_act="gelu_new")
    pretrainer = kbert.models.BertPretrainer.from_preset(wrong)
    expected = R.hf_outputs(hf_model, inputs)
    with pytest.raises(AssertionError, match="max \\|diff\\|"):
        R.assert_close(pretrainer(inputs)["mlm"], expected["mlm"], scaled=True)


def test_variants_load_the_same_weights(checkpoints, tmp_path):
    """pytorch_model.bin, sharded safetensors and TF-style gamma/beta names give identical
    weights."""
    path, hf_model = checkpoints("exact_gelu", "pretraining")
    reference = kbert.models.BertPretrainer.from_preset(path, dropout=0.0, attention_dropout=0.0)
    assert (reference.backbone.dropout, reference.backbone.attention_dropout) == (0.0, 0.0)
    expected = _weights(reference)

    torch_dir = tmp_path / "torch_bin"
    torch_dir.mkdir()
    shutil.copy(path / "config.json", torch_dir / "config.json")
    torch.save(hf_model.state_dict(), torch_dir / "pytorch_model.bin")

    sharded = tmp_path / "sharded"
    hf_model.save_pretrained(sharded, max_shard_size="40KB")
    assert (sharded / "model.safetensors.index.json").is_file()

    legacy = _copy(path, tmp_path / "legacy_names")

    def rename(tensors):
        for name in [n for n in tensors if "LayerNorm." in n]:
            leaf = {"weight": "gamma", "bias": "beta"}[name.rsplit(".", 1)[1]]
            tensors[name.rsplit(".", 1)[0] + "." + leaf] = tensors.pop(name)

    _edit_safetensors(legacy, rename)

    for variant in (torch_dir, sharded, legacy):
        model = kbert.models.BertPretrainer.from_preset(path, load_weights=False)
        load_huggingface_weights(model, variant, fresh_heads=False)
        for actual, wanted in zip(_weights(model), expected):
            np.testing.assert_array_equal(actual, wanted, err_msg=str(variant))


def test_missing_pooler_keeps_a_fresh_pooler_with_a_warning(checkpoints, tmp_path):
    path, hf_model = checkpoints("exact_gelu", "model")
    no_pooler = _copy(path, tmp_path / "no_pooler")
    _edit_safetensors(
        no_pooler, lambda t: [t.pop("pooler.dense.weight"), t.pop("pooler.dense.bias")]
    )
    with pytest.warns(UserWarning, match="no pooler weights"):
        backbone = kbert.models.BertBackbone.from_preset(no_pooler)
    inputs = R.random_inputs(hf_model.config)
    expected = R.hf_outputs(hf_model, inputs)
    outputs = _backbone_outputs(backbone, inputs)
    R.assert_close(outputs["sequence_output"], expected["sequence_output"], inputs["padding_mask"])
    # The fresh pooler is drawn from its initializer (a truncated normal of deviation 0.02),
    # not left at the zeros the checkpoint's weights were built with before loading.
    kernel = R.to_numpy(backbone.get_layer("pooler").dense.kernel)
    assert 0.015 < kernel.std() < 0.025 and np.abs(kernel).max() <= 0.04 + 1e-6, kernel.std()
    # Half a pooler is damage, not absence.
    half = _copy(path, tmp_path / "half_pooler")
    _edit_safetensors(half, lambda t: t.pop("pooler.dense.bias"))
    with pytest.raises(ValueError, match=r"missing weights \(1\): pooler.dense.bias"):
        kbert.models.BertBackbone.from_preset(half)


def test_loading_draws_no_random_value_for_a_weight_the_checkpoint_holds(
    checkpoints, tmp_path, monkeypatch
):
    """`from_preset` builds the weights it loads without drawing them first (BERT-Base: 110M
    values, seconds on a CPU): a Hugging Face directory and a kbert preset load with no draw
    of the backbone's initializer, heads new to the checkpoint are still drawn, and a load
    that fails leaves later models drawing as usual."""
    path, hf_model = checkpoints("exact_gelu", "model")
    draws = []
    draw = keras.initializers.TruncatedNormal.__call__
    monkeypatch.setattr(
        keras.initializers.TruncatedNormal,
        "__call__",
        lambda self, shape, dtype=None: draws.append(shape) or draw(self, shape, dtype),
    )
    backbone = kbert.models.BertBackbone.from_preset(path)
    assert draws == []
    inputs = R.random_inputs(hf_model.config)
    expected = R.hf_outputs(hf_model, inputs)
    R.assert_close(_backbone_outputs(backbone, inputs)["pooled_output"], expected["pooled_output"])

    preset = tmp_path / "preset"
    backbone.save_to_preset(preset)
    reloaded = kbert.models.BertBackbone.from_preset(preset)
    assert draws == []
    for actual, wanted in zip(_weights(reloaded), _weights(backbone)):
        np.testing.assert_array_equal(actual, wanted)

    classifier = kbert.models.BertClassifier.from_preset(preset, num_classes=3)
    assert draws == [(32, 3)]  # Only the new head's kernel.
    assert np.abs(R.to_numpy(classifier.get_layer("classifier").kernel)).max() > 0

    missing = _copy(path, tmp_path / "missing")
    _edit_safetensors(missing, lambda t: t.pop("encoder.layer.1.output.dense.bias"))
    with pytest.raises(ValueError, match="missing weights"):
        kbert.models.BertBackbone.from_preset(missing)
    fresh = kbert.models.BertBackbone(**backbone.get_config())
    assert len(draws) > 1  # Built after the failed load: drawn as usual.
    assert np.abs(R.to_numpy(fresh.token_embedding.embeddings)).max() > 0


def test_head_policy(checkpoints, recwarn):
    """Absent heads: warned (default), an error (fresh_heads=False) or silent (fresh_heads=True)."""
    bert_model_dir, _ = checkpoints("exact_gelu", "model")
    pretrainer = kbert.models.BertPretrainer.from_preset(bert_model_dir, load_weights=False)
    head_before = R.to_numpy(pretrainer.masked_lm_head.transform_dense.kernel)

    with pytest.raises(ValueError, match="missing head weights.*fresh_heads=True"):
        load_huggingface_weights(pretrainer, bert_model_dir, fresh_heads=False)

    recwarn.clear()
    report = load_huggingface_weights(pretrainer, bert_model_dir)
    messages = [str(w.message) for w in recwarn.list if issubclass(w.category, UserWarning)]
    assert any(
        "mlm_head/mlm_transform_dense/kernel" in m and "nsp_head/kernel" in m for m in messages
    )
    assert "nsp_head/bias" in report.fresh
    np.testing.assert_array_equal(
        R.to_numpy(pretrainer.masked_lm_head.transform_dense.kernel), head_before
    )

    recwarn.clear()
    load_huggingface_weights(pretrainer, bert_model_dir, fresh_heads=True)
    assert not [w for w in recwarn.list if "freshly initialised" in str(w.message)]

    # A backbone from a pretraining checkpoint: the heads are simply unused.
    pretraining_dir, _ = checkpoints("exact_gelu", "pretraining")
    report = load_huggingface_weights(pretrainer.backbone, pretraining_dir)
    assert "cls.seq_relationship.weight" in report.unused


def test_loading_is_all_or_nothing_and_names_the_problem(checkpoints, tmp_path):
    path, _ = checkpoints("exact_gelu", "model")
    backbone = kbert.models.BertBackbone.from_preset(path, load_weights=False)
    before = _weights(backbone)

    bad = _copy(path, tmp_path / "bad_shape")
    name = "encoder.layer.1.intermediate.dense.weight"  # Read after the embeddings.
    _edit_safetensors(bad, lambda t: t.__setitem__(name, np.zeros((51, 32), np.float32)))
    with pytest.raises(
        ValueError, match=rf"{name}: shape \[51, 32\].*expected \[50, 32\]"
    ) as error:
        load_huggingface_weights(backbone, bad)
    assert "nothing was loaded" in str(error.value)
    for actual, wanted in zip(_weights(backbone), before):
        np.testing.assert_array_equal(actual, wanted)

    missing = _copy(path, tmp_path / "missing")
    _edit_safetensors(
        missing,
        lambda t: [
            t.pop("encoder.layer.1.output.dense.bias"),
            t.pop("embeddings.LayerNorm.weight"),
        ],
    )
    with pytest.raises(
        ValueError,
        match=(
            r"missing weights \(2\): embeddings.LayerNorm.weight, "
            r"encoder.layer.1.output.dense.bias"
        ),
    ):
        load_huggingface_weights(backbone, missing)

    extra = _copy(path, tmp_path / "extra")
    _edit_safetensors(
        extra,
        lambda t: t.__setitem__("encoder.layer.2.output.dense.bias", np.zeros(32, np.float32)),
    )
    with pytest.raises(
        ValueError, match=r"unexpected weights \(1\).*encoder.layer.2.output.dense.bias"
    ):
        load_huggingface_weights(backbone, extra)
    for actual, wanted in zip(_weights(backbone), before):
        np.testing.assert_array_equal(actual, wanted)


def test_refuses_other_architectures_and_bad_files(checkpoints, tmp_path):
    path, _ = checkpoints("exact_gelu", "model")
    Backbone = kbert.models.BertBackbone

    with pytest.raises(FileNotFoundError, match="No checkpoint directory"):
        Backbone.from_preset(tmp_path / "does_not_exist")

    config_only = tmp_path / "config_only"
    config_only.mkdir()
    shutil.copy(path / "config.json", config_only / "config.json")
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        Backbone.from_preset(config_only)

    weights_only = _copy(path, tmp_path / "weights_only")
    (weights_only / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        Backbone.from_preset(weights_only)

    for model_type in ("roberta", "distilbert"):
        other = _copy(path, tmp_path / model_type)
        _edit_config(other, model_type=model_type, architectures=[f"{model_type.title()}Model"])
        with pytest.raises(ValueError, match=f"not a BERT checkpoint: model_type='{model_type}'"):
            Backbone.from_preset(other)

    silu = _copy(path, tmp_path / "silu")
    _edit_config(silu, hidden_act="silu")
    with pytest.raises(ValueError, match="hidden_act='silu' is not supported"):
        Backbone.from_preset(silu)

    relative = _copy(path, tmp_path / "relative")
    _edit_config(relative, position_embedding_type="relative_key")
    with pytest.raises(ValueError, match="position_embedding_type='relative_key'"):
        Backbone.from_preset(relative)

    truncated = _copy(path, tmp_path / "truncated")
    data = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="is truncated"):
        Backbone.from_preset(truncated)

    vocabulary = _copy(path, tmp_path / "vocabulary")
    R.write_vocabulary(vocabulary / "vocab.txt", 90)
    with pytest.raises(ValueError, match="has 90 tokens but .* vocabulary_size=97"):
        Backbone.from_preset(vocabulary)


def test_untied_decoder_is_refused(checkpoints, tmp_path):
    path, _ = checkpoints("exact_gelu", "pretraining")
    untied = _copy(path, tmp_path / "untied")
    _edit_safetensors(
        untied,
        lambda t: t.__setitem__(
            "cls.predictions.decoder.weight", t["bert.embeddings.word_embeddings.weight"] + 1.0
        ),
    )
    pretrainer = kbert.models.BertPretrainer.from_preset(path, load_weights=False)
    with pytest.raises(ValueError, match="decoder .* differs from the word embeddings"):
        load_huggingface_weights(pretrainer, untied)
    tied = _copy(path, tmp_path / "tied")
    _edit_safetensors(
        tied,
        lambda t: t.update(
            {
                "cls.predictions.decoder.weight": t["bert.embeddings.word_embeddings.weight"],
                "cls.predictions.decoder.bias": t["cls.predictions.bias"],
            }
        ),
    )
    load_huggingface_weights(pretrainer, tied, fresh_heads=False)


class _Exploit:
    """Pickles into a call of os.mkdir: loading it must not run it."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (os.mkdir, (self.target,))


def test_pickles_are_never_executed(checkpoints, tmp_path):
    path, hf_model = checkpoints("exact_gelu", "model")
    evil = tmp_path / "evil"
    evil.mkdir()
    shutil.copy(path / "config.json", evil / "config.json")
    marker = tmp_path / "pwned"
    state = dict(hf_model.state_dict())
    state["payload"] = _Exploit(str(marker))
    torch.save(state, evil / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"weights_only=True"):
        kbert.models.BertBackbone.from_preset(evil)
    assert not marker.exists()


def _randomize(model, seed=0, scale=0.3):
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        offset = 1.0 if variable.path.endswith("gamma") else 0.0
        variable.assign(
            offset + scale * rng.standard_normal(tuple(variable.shape)).astype("float32")
        )


def test_export_loads_in_transformers_with_equal_outputs(tmp_path):
    backbone = kbert.models.BertBackbone(
        vocabulary_size=97,
        num_layers=2,
        num_heads=4,
        hidden_dim=32,
        intermediate_dim=50,
        max_sequence_length=24,
        num_segments=2,
        activation="gelu_approximate",
    )
    pretrainer = kbert.models.BertPretrainer(backbone)
    _randomize(pretrainer)
    tokens = R.write_vocabulary(tmp_path / "vocab.txt", 97)
    inputs = R.random_inputs(R.hf_config())

    out = export_to_huggingface(
        pretrainer, tmp_path / "hf_pretrainer", vocabulary=tokens, lowercase=True
    )
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["BertForPreTraining"] and config["hidden_act"] == "gelu_new"
    assert (out / "vocab.txt").read_text().split("\n")[:-1] == tokens
    assert json.loads((out / "tokenizer_config.json").read_text())["do_lower_case"] is True
    hf_pretrainer = transformers.BertForPreTraining.from_pretrained(out).eval()
    expected = R.hf_outputs(hf_pretrainer, inputs)
    outputs = pretrainer(inputs)
    R.assert_close(outputs["mlm"], expected["mlm"], scaled=True)
    R.assert_close(outputs["nsp"], expected["nsp"])

    out = export_to_huggingface(backbone, tmp_path / "hf_backbone")
    assert not any(k.startswith("bert.") for k in load_file(out / "model.safetensors"))
    assert not (out / "vocab.txt").exists()
    hf_backbone = transformers.BertModel.from_pretrained(out).eval()
    expected = R.hf_outputs(hf_backbone, inputs)
    outputs = _backbone_outputs(backbone, inputs)
    R.assert_close(outputs["sequence_output"], expected["sequence_output"], inputs["padding_mask"])
    R.assert_close(outputs["pooled_output"], expected["pooled_output"])

    # And back into kbert: bit-identical.
    reloaded = kbert.models.BertPretrainer.from_preset(
        tmp_path / "hf_pretrainer", fresh_heads=False
    )
    for actual, wanted in zip(_weights(reloaded), _weights(pretrainer)):
        np.testing.assert_array_equal(actual, wanted)
    assert reloaded.preset_vocabulary_path == str(tmp_path / "hf_pretrainer" / "vocab.txt")

    with pytest.raises(ValueError, match="vocabulary has 5 tokens"):
        export_to_huggingface(backbone, tmp_path / "bad", vocabulary=tokens[:5])


def test_pretrainer_save_to_preset_round_trip(checkpoints, tmp_path):
    path, hf_model = checkpoints("exact_gelu", "pretraining")
    pretrainer = kbert.models.BertPretrainer.from_preset(path)
    pretrainer.save_to_preset(tmp_path / "kbert")
    restored = kbert.models.BertPretrainer.from_preset(tmp_path / "kbert")
    for actual, wanted in zip(_weights(restored), _weights(pretrainer)):
        np.testing.assert_array_equal(actual, wanted)
    inputs = R.random_inputs(hf_model.config)
    expected = pretrainer(inputs)
    outputs = restored(inputs)
    for key in ("mlm", "nsp"):
        np.testing.assert_array_equal(R.to_numpy(outputs[key]), R.to_numpy(expected[key]))
    # fresh_heads=True on a kbert preset of the same class loads the backbone only.
    fresh = kbert.models.BertPretrainer.from_preset(tmp_path / "kbert", fresh_heads=True)
    np.testing.assert_array_equal(
        R.to_numpy(fresh.backbone.token_embedding.embeddings),
        R.to_numpy(pretrainer.backbone.token_embedding.embeddings),
    )
    assert not np.array_equal(
        R.to_numpy(fresh.next_sentence_head.kernel),
        R.to_numpy(pretrainer.next_sentence_head.kernel),
    )
