"""Original Google BERT checkpoints (TF1 `bert_model.ckpt`), written by the test with TF's own
Saver.

The weights come from a random `transformers` BertForPreTraining, laid out under Google's
variable names, so `transformers` with `hidden_act="gelu_new"` (Google's "gelu" is the tanh
form) is the reference.
"""

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
tf = pytest.importorskip("tensorflow")

import kbert  # noqa: E402
from kbert.checkpoints import load_google_weights  # noqa: E402
from kbert.checkpoints.numpy_reference import google_bert_forward  # noqa: E402
from tests.checkpoints import _reference as R  # noqa: E402

CONFIG = dict(
    hidden_act="gelu_new",
    hidden_size=48,
    num_attention_heads=3,
    intermediate_size=100,
    type_vocab_size=16,
)


@pytest.fixture(scope="module")
def google_checkpoint(tmp_path_factory):
    config = R.hf_config(**CONFIG)
    hf_model = R.make_hf_model(config, "pretraining", seed=3)
    variables = R.google_variables_from_hf(hf_model)
    path = R.write_google_checkpoint(
        tmp_path_factory.mktemp("google"),
        variables,
        R.google_bert_config(config),
        config.vocab_size,
    )
    return path, hf_model, variables


def test_written_names_and_layouts_are_googles(google_checkpoint):
    path, hf_model, _ = google_checkpoint
    shapes = dict(tf.train.list_variables(str(path / "bert_model.ckpt")))
    hidden, intermediate = hf_model.config.hidden_size, hf_model.config.intermediate_size
    expected = {
        "bert/embeddings/word_embeddings": [97, hidden],
        "bert/embeddings/token_type_embeddings": [16, hidden],
        "bert/embeddings/position_embeddings": [24, hidden],
        "bert/embeddings/LayerNorm/gamma": [hidden],
        "bert/encoder/layer_0/attention/self/query/kernel": [hidden, hidden],
        "bert/encoder/layer_1/attention/output/dense/bias": [hidden],
        "bert/encoder/layer_1/attention/output/LayerNorm/beta": [hidden],
        "bert/encoder/layer_0/intermediate/dense/kernel": [hidden, intermediate],
        "bert/encoder/layer_0/output/dense/kernel": [intermediate, hidden],
        "bert/encoder/layer_1/output/LayerNorm/gamma": [hidden],
        "bert/pooler/dense/kernel": [hidden, hidden],
        "cls/predictions/transform/dense/kernel": [hidden, hidden],
        "cls/predictions/transform/LayerNorm/beta": [hidden],
        "cls/predictions/output_bias": [97],
        "cls/seq_relationship/output_weights": [2, hidden],
        "cls/seq_relationship/output_bias": [2],
    }
    for name, shape in expected.items():
        assert shapes.get(name) == shape, name
    # 5 embedding + 16 per layer + 2 pooler + 7 head tensors; nothing else.
    assert len(shapes) == 5 + 16 * 2 + 2 + 7


def test_pretrainer_matches_the_reference(google_checkpoint):
    path, hf_model, _ = google_checkpoint
    pretrainer = kbert.models.BertPretrainer.from_preset(path, fresh_heads=False)
    assert pretrainer.backbone.activation == "gelu_approximate"
    assert pretrainer.backbone.num_segments == 16
    assert pretrainer.preset_vocabulary_path == str(path / "vocab.txt")
    inputs = R.random_inputs(hf_model.config)
    expected = R.hf_outputs(hf_model, inputs)
    outputs = pretrainer(inputs)
    R.assert_close(outputs["mlm"], expected["mlm"], scaled=True)
    R.assert_close(outputs["nsp"], expected["nsp"])
    sequence = pretrainer.backbone(R.backbone_inputs(inputs))["sequence_output"]
    R.assert_close(sequence, expected["sequence_output"], inputs["padding_mask"])

    # Google's "gelu" is not the exact GELU: the same weights with HF's exact "gelu" differ.
    exact = transformers.BertForPreTraining(R.hf_config(**{**CONFIG, "hidden_act": "gelu"})).eval()
    exact.load_state_dict(hf_model.state_dict())
    exact_outputs = R.hf_outputs(exact, inputs)
    difference = R.max_diff(sequence, exact_outputs["sequence_output"], inputs["padding_mask"])
    assert difference > 10 * R.TOLERANCE


def test_numpy_reference_matches_transformers(google_checkpoint):
    """The independent NumPy forward pass the conversion tool uses as Google's reference."""
    path, hf_model, variables = google_checkpoint
    inputs = R.random_inputs(hf_model.config, seed=1)
    expected = R.hf_outputs(hf_model, inputs)
    outputs = google_bert_forward(
        variables,
        R.google_bert_config(hf_model.config),
        inputs["token_ids"],
        inputs["segment_ids"],
        inputs["padding_mask"],
        inputs["mask_positions"],
    )
    R.assert_close(outputs["sequence_output"], expected["sequence_output"], inputs["padding_mask"])
    R.assert_close(outputs["mlm"], expected["mlm"], scaled=True)
    R.assert_close(outputs["nsp"], expected["nsp"])


def test_optimizer_state_is_skipped_and_bad_checkpoints_are_refused(google_checkpoint, tmp_path):
    path, hf_model, variables = google_checkpoint
    bert_config = R.google_bert_config(hf_model.config)
    pretrainer = kbert.models.BertPretrainer.from_preset(path, load_weights=False)
    before = [R.to_numpy(v) for v in pretrainer.weights]

    # A run_pretraining.py output: Adam slots and the step counter beside the weights.
    with_slots = dict(variables)
    for name in ("bert/pooler/dense/kernel", "cls/predictions/output_bias"):
        with_slots[name + "/adam_m"] = np.zeros_like(variables[name])
        with_slots[name + "/adam_v"] = np.zeros_like(variables[name])
    with_slots["global_step"] = np.array(1000, np.int64)
    slots_dir = R.write_google_checkpoint(tmp_path / "slots", with_slots, bert_config)
    report = load_google_weights(pretrainer, slots_dir, fresh_heads=False)
    assert report.unused == [] and len(report.loaded) == len(variables)
    np.testing.assert_array_equal(
        R.to_numpy(pretrainer.next_sentence_head.kernel),
        variables["cls/seq_relationship/output_weights"].T,
    )
    for variable, value in zip(pretrainer.weights, before):  # Back to the fresh state.
        variable.assign(value)

    bad = dict(variables)
    bad["bert/encoder/layer_1/output/dense/kernel"] = np.zeros((99, 48), np.float32)
    del bad["bert/embeddings/LayerNorm/beta"]
    bad["bert/encoder/layer_7/output/dense/bias"] = np.zeros((48,), np.float32)
    bad_dir = R.write_google_checkpoint(tmp_path / "bad", bad, bert_config)
    with pytest.raises(ValueError) as error:
        load_google_weights(pretrainer, bad_dir)
    message = str(error.value)
    assert "missing weights (1): bert/embeddings/LayerNorm/beta" in message
    assert (
        "unexpected weights (1)" in message and "bert/encoder/layer_7/output/dense/bias" in message
    )
    assert (
        "bert/encoder/layer_1/output/dense/kernel: shape [99, 48] in the checkpoint, "
        "expected [100, 48]" in message
    )
    for variable, value in zip(pretrainer.weights, before):
        np.testing.assert_array_equal(R.to_numpy(variable), value)

    no_heads = {k: v for k, v in variables.items() if not k.startswith("cls/")}
    no_heads_dir = R.write_google_checkpoint(tmp_path / "no_heads", no_heads, bert_config)
    with pytest.warns(UserWarning, match="mlm_head/output_bias"):
        load_google_weights(pretrainer, no_heads_dir)

    no_config = tmp_path / "no_config"
    no_config.mkdir()
    for file in path.glob("bert_model.ckpt*"):
        (no_config / file.name).write_bytes(file.read_bytes())
    with pytest.raises(FileNotFoundError, match="bert_config.json"):
        kbert.models.BertBackbone.from_preset(no_config)

    no_data = tmp_path / "no_data"
    no_data.mkdir()
    for name in ("bert_config.json", "bert_model.ckpt.index"):
        (no_data / name).write_bytes((path / name).read_bytes())
    with pytest.raises(FileNotFoundError, match="no .data"):
        kbert.models.BertBackbone.from_preset(no_data)

    small_vocabulary = R.write_google_checkpoint(
        tmp_path / "vocabulary", variables, bert_config, 50
    )
    with pytest.raises(ValueError, match="has 50 tokens but .* vocabulary_size=97"):
        kbert.models.BertBackbone.from_preset(small_vocabulary)
