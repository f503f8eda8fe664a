import keras
import numpy as np
import pytest

from kbert.models import BACKBONE_PRESETS, BertBackbone
from tests.test_case import (
    BACKENDS,
    TestCase,
    assert_all_close,
    random_backbone_inputs,
    run_in_backend,
    tiny_backbone_kwargs,
    to_numpy,
)


def _hf_parameter_count(config):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf_config = transformers.BertConfig(
        vocab_size=config["vocabulary_size"],
        hidden_size=config["hidden_dim"],
        num_hidden_layers=config["num_layers"],
        num_attention_heads=config["num_heads"],
        intermediate_size=config["intermediate_dim"],
        max_position_embeddings=config["max_sequence_length"],
        type_vocab_size=config["num_segments"],
    )
    with torch.device("meta"):
        model = transformers.BertModel(hf_config)
    return sum(p.numel() for p in model.parameters())


class TestBertBackbone(TestCase):
    def test_backbone_checks(self, tmp_path):
        """Config and `.keras` round-trips, variable lengths, a fit step (mixed precision:
        test_precision.py)."""
        self.run_backbone_test(
            BertBackbone, tiny_backbone_kwargs(), random_backbone_inputs(), tmp_path
        )

    @pytest.mark.parametrize("name", sorted(BACKBONE_PRESETS))
    def test_preset_parameter_counts_equal_hf(self, name, tmp_path, monkeypatch):
        preset = BACKBONE_PRESETS[name]
        expected = _hf_parameter_count(preset["config"])
        assert preset["params"] == expected
        if preset["config"]["num_layers"] <= 4:  # Building the large ones here would be slow.
            # Weights come from the Hub (tests/checkpoints/test_hub.py); offline with an empty
            # cache, the name is an error naming its repository.
            monkeypatch.setenv("HF_HUB_OFFLINE", "1")
            monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
            monkeypatch.setenv("KBERT_PRESETS_DIR", str(tmp_path / "presets"))
            with pytest.raises(FileNotFoundError, match="hf://google/bert_uncased_L-.*OFFLINE"):
                BertBackbone.from_preset(name)
            backbone = BertBackbone.from_preset(name, load_weights=False)
            assert backbone.count_params() == expected

    def test_documented_parameter_counts(self):
        assert BACKBONE_PRESETS["bert_tiny_en_uncased"]["params"] == 4_385_920
        assert BACKBONE_PRESETS["bert_base_en_uncased"]["params"] == 109_482_240
        assert BACKBONE_PRESETS["bert_large_en_uncased"]["params"] == 335_141_888
        listing = BertBackbone.presets()
        assert set(listing) == set(BACKBONE_PRESETS)
        assert all(entry["description"] for entry in listing.values())

    def test_padding_never_leaks_into_real_positions(self):
        backbone = BertBackbone(**tiny_backbone_kwargs())
        inputs = random_backbone_inputs(batch_size=3, sequence_length=12)
        reference = to_numpy(backbone(inputs))
        mask = inputs["padding_mask"].astype(bool)

        # Other token and segment ids at padded positions change nothing at real positions.
        noisy = {k: v.copy() for k, v in inputs.items()}
        rng = np.random.default_rng(1)
        noisy["token_ids"][~mask] = rng.integers(1, 97, size=(~mask).sum())
        noisy["segment_ids"][~mask] = 1
        outputs = to_numpy(backbone(noisy))
        assert_all_close(
            outputs["sequence_output"], reference["sequence_output"], atol=1e-5, mask=mask
        )
        assert_all_close(outputs["pooled_output"], reference["pooled_output"], atol=1e-5)

        # Appending more padding changes nothing either.
        longer = {k: np.pad(v, ((0, 0), (0, 6))) for k, v in inputs.items()}
        outputs = to_numpy(backbone(longer))
        assert_all_close(
            outputs["sequence_output"][:, :12], reference["sequence_output"], atol=1e-5, mask=mask
        )

        # And the padding does matter when it is not masked (the test can fail).
        unmasked = dict(noisy, padding_mask=np.ones_like(inputs["padding_mask"]))
        leaked = to_numpy(backbone(unmasked))["sequence_output"]
        assert np.abs(leaked[mask] - reference["sequence_output"][mask]).max() > 1e-3

    def test_first_token_only_computes_the_pooled_output_from_one_row(self, monkeypatch):
        """`first_token_only=True` (what the [CLS] heads call): the same `pooled_output`, the
        first row of `sequence_output`, and the last block's feed-forward on that row alone."""
        keras.utils.set_random_seed(3)
        backbone = BertBackbone(**tiny_backbone_kwargs(num_layers=3))
        # Large weights, so that attention over the other positions moves [CLS] far.
        backbone.set_weights([w * 20 if w.ndim == 2 else w for w in backbone.get_weights()])
        inputs = random_backbone_inputs(batch_size=3, sequence_length=10)
        full = to_numpy(backbone(inputs))
        rows = []
        for layer in backbone.transformer_layers:
            dense = layer.intermediate_dense
            monkeypatch.setattr(
                dense, "call", lambda x, call=dense.call: rows.append(x.shape[1]) or call(x)
            )
        first = to_numpy(backbone(inputs, first_token_only=True))
        assert rows == [10, 10, 1]
        assert first["sequence_output"].shape == (3, 1, 32)
        assert_all_close(first["pooled_output"], full["pooled_output"], atol=1e-5)
        assert_all_close(first["sequence_output"][:, 0], full["sequence_output"][:, 0], atol=1e-5)
        # The comparison can fail: the last block on [CLS] alone (no other keys) is far off.
        last = backbone.transformer_layers[-1]
        hidden = backbone.transformer_layers[-2](
            backbone.transformer_layers[0](
                backbone.embeddings(inputs["token_ids"], inputs["segment_ids"]),
                padding_mask=inputs["padding_mask"],
            ),
            padding_mask=inputs["padding_mask"],
        )
        alone = to_numpy(
            backbone.pooler(last(hidden[:, :1], padding_mask=inputs["padding_mask"][:, :1]))
        )
        assert np.abs(alone - full["pooled_output"]).max() > 1e-2
        # Backbones whose outputs need every row of every block run in full.
        for option in ("output_hidden_states", "output_attentions"):
            other = BertBackbone(**tiny_backbone_kwargs(num_layers=3, **{option: True}))
            other.set_weights(backbone.get_weights())
            outputs = to_numpy(other(inputs, first_token_only=True))
            assert outputs["sequence_output"].shape == (3, 10, 32), option
            assert_all_close(outputs["pooled_output"], full["pooled_output"], atol=1e-5)

    def test_all_padding_rows_are_finite(self):
        backbone = BertBackbone(**tiny_backbone_kwargs())
        inputs = random_backbone_inputs(batch_size=2, sequence_length=8)
        inputs["padding_mask"][1] = 0
        for training in (False, True):
            outputs = to_numpy(backbone(inputs, training=training))
            assert np.isfinite(outputs["sequence_output"]).all()
            assert np.isfinite(outputs["pooled_output"]).all()
        # Also with attention dropout active (the explicit softmax path).
        dropout_backbone = BertBackbone(**tiny_backbone_kwargs(attention_dropout=0.1))
        outputs = to_numpy(dropout_backbone(inputs, training=True))
        assert np.isfinite(outputs["sequence_output"]).all()

    def test_padding_mask_accepts_bool_and_int(self):
        backbone = BertBackbone(**tiny_backbone_kwargs())
        inputs = random_backbone_inputs()
        as_bool = dict(inputs, padding_mask=inputs["padding_mask"].astype(bool))
        assert_all_close(backbone(as_bool), backbone(inputs), atol=1e-6)

    def test_activation_changes_outputs(self):
        # Exact and tanh GELU differ measurably once weights are large (guards the plumbing).
        inputs = random_backbone_inputs()
        outputs = {}
        for activation in ("gelu", "gelu_approximate", "relu"):
            keras.utils.set_random_seed(3)
            backbone = BertBackbone(**tiny_backbone_kwargs(activation=activation))
            backbone.set_weights([w * 20 if w.ndim == 2 else w for w in backbone.get_weights()])
            outputs[activation] = to_numpy(backbone(inputs))["sequence_output"]
        assert np.abs(outputs["gelu"] - outputs["gelu_approximate"]).max() > 1e-3
        assert np.abs(outputs["gelu"] - outputs["relu"]).max() > 1e-3

    def test_hidden_dim_not_divisible_by_heads(self):
        with pytest.raises(
            ValueError, match=r"divisible by `num_heads`.*hidden_dim=100, num_heads=12"
        ):
            BertBackbone(**tiny_backbone_kwargs(hidden_dim=100, num_heads=12))

    def test_unknown_activation(self):
        with pytest.raises(ValueError, match="Unknown `activation`.*swish2"):
            BertBackbone(**tiny_backbone_kwargs(activation="swish2"))

    def test_sequence_longer_than_max_sequence_length_or_without_a_batch_axis(self):
        """NumPy arrays and backend tensors alike (eager torch computes tensors on its lean
        path, without the embedding layer's call)."""
        backbone = BertBackbone(**tiny_backbone_kwargs(max_sequence_length=16))
        inputs = random_backbone_inputs(sequence_length=20, pad=False)
        tensors = {key: keras.ops.convert_to_tensor(value) for key, value in inputs.items()}
        for given in (inputs, tensors):
            with pytest.raises(ValueError, match="sequence_length=20, max_sequence_length=16"):
                backbone(given)
            one_row = {key: value[0] for key, value in given.items()}  # (seq,): no batch axis
            with pytest.raises(ValueError, match=r"shape \(batch_size, sequence_length\)"):
                backbone(one_row)

    def test_ids_out_of_range(self):
        backbone = BertBackbone(**tiny_backbone_kwargs())
        inputs = random_backbone_inputs()
        with pytest.raises(
            ValueError, match=r"`token_ids` must lie in \[0, vocabulary_size\) = \[0, 97\)"
        ):
            backbone(dict(inputs, token_ids=inputs["token_ids"] + 97))
        with pytest.raises(ValueError, match=r"`token_ids`.*Received values in \[-1,"):
            backbone(dict(inputs, token_ids=inputs["token_ids"] - 1))
        with pytest.raises(
            ValueError, match=r"`segment_ids` must lie in \[0, num_segments\) = \[0, 2\)"
        ):
            backbone(dict(inputs, segment_ids=inputs["segment_ids"] + 2))

    def test_missing_and_extra_input_keys(self):
        backbone = BertBackbone(**tiny_backbone_kwargs())
        inputs = random_backbone_inputs()
        with pytest.raises(ValueError, match=r"(?i)missing.*segment_ids"):
            backbone({k: v for k, v in inputs.items() if k != "segment_ids"})
        with pytest.raises(ValueError, match=r"unexpected: \['labels'\]"):
            backbone(dict(inputs, labels=inputs["token_ids"]))

    def test_unknown_preset_lists_known_ones(self):
        with pytest.raises(ValueError, match="Unknown preset 'bert_huge'.*bert_base_en_uncased"):
            BertBackbone.from_preset("bert_huge")

    def test_missing_checkpoint_directory(self, tmp_path):
        with pytest.raises(FileNotFoundError, match="No checkpoint directory"):
            BertBackbone.from_preset(str(tmp_path / "nowhere"))

    def test_save_to_preset_round_trip_is_exact(self, tmp_path):
        self.run_preset_test(
            BertBackbone(**tiny_backbone_kwargs()), random_backbone_inputs(), tmp_path
        )

    def test_installed_named_preset_is_found(self, tmp_path, monkeypatch):
        backbone = BertBackbone(**tiny_backbone_kwargs())
        backbone.save_to_preset(tmp_path / "bert_tiny_en_uncased")
        monkeypatch.setenv("KBERT_PRESETS_DIR", str(tmp_path))
        restored = BertBackbone.from_preset("bert_tiny_en_uncased")
        assert (
            restored.vocabulary_size == 97
        )  # The installed preset, not the built-in architecture.
        inputs = random_backbone_inputs()
        assert_all_close(restored(inputs), backbone(inputs), atol=0, rtol=0)

    def test_weights_cross_backends(self, tmp_path):
        """Weights saved under this backend load under the next one with equal outputs."""
        current = keras.backend.backend()
        other = BACKENDS[(BACKENDS.index(current) + 1) % len(BACKENDS)]
        backbone = BertBackbone(**tiny_backbone_kwargs())
        inputs = random_backbone_inputs()
        backbone.save_to_preset(tmp_path / "preset")
        np.savez(
            tmp_path / "io.npz",
            **inputs,
            **{"out_" + k: v for k, v in to_numpy(backbone(inputs)).items()},
        )
        code = f"""
    import keras
    import numpy as np
    from kbert.models import BertBackbone
    data = np.load({str(tmp_path / "io.npz")!r})
    model = BertBackbone.from_preset({str(tmp_path / "preset")!r})
    inputs = {{k: data[k] for k in ("token_ids", "segment_ids", "padding_mask")}}
    outputs = model(inputs)
    for key in ("sequence_output", "pooled_output"):
        diff = np.abs(keras.ops.convert_to_numpy(outputs[key]) - data["out_" + key])
        mask = data["padding_mask"].astype(bool)
        diff = diff[mask] if key == "sequence_output" else diff
        print(key, float(diff.max()))
    """
        stdout = run_in_backend(other, code)
        diffs = dict(line.split() for line in stdout.strip().splitlines()[-2:])
        assert float(diffs["sequence_output"]) < 1e-5 and float(diffs["pooled_output"]) < 1e-5, (
            other,
            diffs,
        )
