"""BertTask: what kbert's fine-tuning models share (classifier, tagger, span QA).

A task model is a functional `keras.Model`: the backbone's input dict, the backbone, and a small
head. On top of that every task:

- is built without training settings and comes compiled with BERT's fine-tuning recipe
  (`compile()` with no arguments: AdamW, weight decay 0.01 except LayerNorm and biases,
  global-norm clipping at 1.0, 10 % linear warm-up then linear decay to 0), as keras-hub's
  tasks are. `compile(learning_rate=..., warmup_ratio=..., ...)` changes the recipe's
  settings; `compile(optimizer=...)` alone keeps the default loss and metrics. When the
  recipe's `total_steps` is left `None`, each `fit` call sets the schedule's length to exactly
  the steps it will run, as Hugging Face's `Trainer.train()` does, without recompiling (the
  length is an optimizer variable);
- may carry a `preprocessor` (a `kbert.text.BertPreprocessor`). With one attached, `fit`,
  `evaluate` and `predict` accept raw strings (and `(a, b)` pairs); without one, packed dicts of
  `token_ids`, `segment_ids` and `padding_mask`. `from_preset` attaches one whenever the source
  has a vocabulary. Inputs take one route, the pipeline of `kbert.models.pipeline`
  (`PipelineModel`, the base class): validated once, packed once, batched by length, through
  Keras' own loops, outputs in the caller's order;
- round-trips through `save_to_preset` / `from_preset` (config, weights and vocabulary) and
  through `.keras` files. Foreign checkpoints (Hugging Face, Google, keras-hub) load and export
  through `kbert.checkpoints`, whose format modules name each task's head weights.

This module uses keras.ops and NumPy only; the input pipeline lives in
`kbert.models.pipeline`, its tf.data work in `kbert.text` and `kbert.data`.
"""

import inspect
import warnings
import weakref
from pathlib import Path

import keras
import numpy as np

from kbert import backend
from kbert.checkpoints import read_preprocessor_settings
from kbert.checkpoints.vocabulary import vocabulary_directory
from kbert.models.backbone import BertBackbone
from kbert.models.pipeline import PipelineModel
from kbert.models.presets import PresetMixin
from kbert.models.quantization import QuantizationMixin
from kbert.optimizers.optimization import bert_optimizer, planned_schedule


def _user_stacklevel():
    """`stacklevel` for a `warnings.warn` called right here that names the first caller
    outside kbert and Keras (so Python's default filters show a `DeprecationWarning` raised
    for a user's own script, also through `from_preset` or `from_config`)."""
    skip = (str(Path(__file__).resolve().parents[1]), str(Path(keras.__file__).resolve().parent))
    frame = inspect.currentframe().f_back  # the frame that calls `warnings.warn`: level 1
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(skip):
        frame = frame.f_back
        level += 1
    return level


# The settings of BERT's recipe that `BertTask.compile` takes, with their defaults (the
# learning rate and warm-up ratio default to the task class' `default_*` attributes).
RECIPE_DEFAULTS = {
    "learning_rate": None,
    "weight_decay": 0.01,
    "warmup_ratio": None,
    "warmup_steps": None,
    "total_steps": None,
    "update_rule": "adamw",
    "gradient_accumulation_steps": None,
}


def _check_recipe(settings):
    """Raises a ValueError naming the first setting of BERT's recipe that is out of range."""
    learning_rate = settings.get("learning_rate")
    if learning_rate is not None and (
        isinstance(learning_rate, bool)
        or not isinstance(learning_rate, (int, float))
        or not learning_rate > 0
    ):
        raise ValueError(
            f"`learning_rate` must be a positive number. Received: learning_rate={learning_rate!r}"
        )
    weight_decay = settings.get("weight_decay")
    if weight_decay is not None and not weight_decay >= 0:
        raise ValueError(f"`weight_decay` must be >= 0. Received: weight_decay={weight_decay!r}")
    warmup_ratio = settings.get("warmup_ratio")
    if warmup_ratio is not None and not 0 <= warmup_ratio <= 1:
        raise ValueError(
            f"`warmup_ratio` must lie in [0, 1]. Received: warmup_ratio={warmup_ratio!r}"
        )
    for name, low in (("warmup_steps", 0), ("total_steps", 1)):
        value = settings.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low
        ):
            raise ValueError(
                f"`{name}` must be an integer >= {low} or None. Received: {name}={value!r}"
            )
    update_rule = settings.get("update_rule")
    if update_rule is not None and update_rule not in ("adamw", "lamb"):
        raise ValueError(
            f'`update_rule` must be "adamw" or "lamb". Received: update_rule={update_rule!r}'
        )


class BertTask(PresetMixin, QuantizationMixin, PipelineModel):
    """Base class of kbert's task models: backbone + head + optional preprocessor.

    Subclasses build their functional graph, call `super().__init__(inputs=..., outputs=...,
    backbone=..., ...)`, set their head layers and config, then call `self.compile()`. They
    implement `_default_loss` and `_default_metrics`, and may override `preprocess_samples`
    to turn their own raw input (words and word labels, questions and contexts) into packed
    arrays and `_check_labels` to check their labels. Checkpoint formats know the tasks' head
    names (`kbert.checkpoints`), not the tasks.

    Training settings belong to `compile` (see `compile`), as in keras-hub: a task is built
    without them and comes compiled with BERT's recipe, so `fit` works right away.

    `fit`, `evaluate`, `predict` and the `*_on_batch` methods share one input pipeline
    (`kbert.models.pipeline.PipelineModel`): raw input is packed once, labels are checked, the
    ids are checked once against the backbone's limits, packed NumPy data is batched by length
    (`length_batching`, `bucket_granularity`) and `predict` returns rows in the caller's order.

    **Schedule.** When the optimizer's schedule has no fixed length (the default recipe,
    `compile(total_steps=None)`), each `fit` call sets it to the steps it is about to run -
    `(epochs - initial_epoch) x steps per epoch` - with `warmup_ratio` of them warming up,
    starting from the optimizer's current step: each `fit` call warms up and decays over its
    own steps, as Hugging Face's `Trainer.train()` does. Steps per epoch come from
    `steps_per_epoch`, the data's length and `batch_size`, or a `tf.data.Dataset`'s
    cardinality. A dataset of unknown size (`cardinality() == -2`, e.g. one made with `filter`
    or `kbert.data.pretraining_dataset`) is counted once, one pass over its input pipeline,
    and every epoch then takes that many batches; give `steps_per_epoch` to skip the count.
    Nothing is recompiled: the length lives in two optimizer variables
    (`kbert.models.WarmupLinearDecay.plan`).

    Args (shared by every task):
        backbone: `kbert.models.BertBackbone`.
        preprocessor: `kbert.text.BertPreprocessor` or `None`. Maps raw strings to packed
            inputs in `fit`, `evaluate` and `predict`. Defaults to `None`.
        learning_rate, weight_decay, warmup_ratio, total_steps: deprecated, pass them to
            `compile`. Accepted for one more release with a `DeprecationWarning`; they become
            the settings of the task's default `compile()`.
    """

    backbone_cls = BertBackbone
    default_learning_rate = 5e-5
    default_warmup_ratio = 0.1
    default_sequence_length = 128
    # Constructor arguments that were training settings -> the `compile` argument each became.
    deprecated_training_arguments = {
        "learning_rate": "learning_rate",
        "weight_decay": "weight_decay",
        "warmup_ratio": "warmup_ratio",
        "total_steps": "total_steps",
    }

    def __init__(self, *, inputs, outputs, backbone, preprocessor=None, **kwargs):
        kwargs.pop("dtype", None)  # The task follows its backbone's dtype policy.
        given = {
            name: kwargs.pop(name) for name in self.deprecated_training_arguments if name in kwargs
        }
        recipe = self._recipe_from_arguments(given)
        self._check_unknown_arguments(kwargs)
        if recipe:
            warnings.warn(
                f"Passing training settings to the {type(self).__name__} constructor is "
                "deprecated and will stop working in the next release. Received: "
                f"{', '.join(f'{k}={v!r}' for k, v in given.items() if v is not None)}. "
                f"Call `model.compile({', '.join(f'{k}=...' for k in recipe)})` instead.",
                DeprecationWarning,
                stacklevel=_user_stacklevel(),
            )
        super().__init__(inputs=inputs, outputs=outputs, preprocessor=preprocessor, **kwargs)
        self.dtype_policy = backbone.dtype_policy
        self.backbone = backbone
        # Recipe settings of the deprecated constructor arguments: the default `compile()`'s.
        self._constructor_recipe = recipe
        self.recipe = None
        self.compiled_with_defaults = False

    @classmethod
    def _recipe_from_arguments(cls, arguments):
        """Deprecated constructor (or old config) training arguments -> `compile` settings.

        `None` values are dropped; the rest are checked (a ValueError names a bad one).
        """
        recipe = {
            cls.deprecated_training_arguments[name]: value
            for name, value in arguments.items()
            if value is not None
        }
        _check_recipe(recipe)
        return recipe

    @classmethod
    def split_training_config(cls, config):
        """`(config, recipe)`: a task config without the training settings that configs
        written by earlier releases carry, and those settings as `compile` arguments."""
        config = dict(config)
        names = [name for name in cls.deprecated_training_arguments if name in config]
        old = {name: config.pop(name) for name in names}
        return config, cls._recipe_from_arguments(old)

    @staticmethod
    def _check_backbone(backbone, model_name):
        """Raises a ValueError unless `backbone` is a kbert `BertBackbone`."""
        if not isinstance(backbone, BertBackbone):
            raise ValueError(
                f"{model_name} needs a kbert BertBackbone as `backbone`. "
                f"Received: {type(backbone).__name__}"
            )

    @classmethod
    def _check_unknown_arguments(cls, kwargs):
        """Raises a ValueError naming keyword arguments the task does not know."""
        unknown = sorted(set(kwargs) - {"name", "trainable", "dtype"})
        if unknown:
            known = sorted(cls._constructor_arguments() - {"self", "kwargs"})
            raise ValueError(
                f"Unknown arguments for {cls.__name__}: {unknown}. Expected some of {known}, "
                "or (in from_preset) BertBackbone arguments such as `dtype`."
            )

    # ---------------------------------------------------------------- compiling
    def _default_loss(self):
        raise NotImplementedError

    def _default_metrics(self):
        return None

    def _default_weighted_metrics(self):
        return None

    def _default_loss_weights(self):
        return None

    def compile(
        self,
        optimizer="auto",
        loss="auto",
        metrics="auto",
        weighted_metrics="auto",
        *,
        learning_rate=None,
        weight_decay=None,
        warmup_ratio=None,
        warmup_steps=None,
        total_steps=None,
        update_rule=None,
        gradient_accumulation_steps=None,
        **kwargs,
    ):
        """`keras.Model.compile` with the task's defaults for every argument left `"auto"`.

        `optimizer="auto"` is BERT's recipe, `kbert.models.bert_optimizer`: AdamW (decoupled
        weight decay, not on LayerNorm parameters and biases; epsilon after bias correction,
        as PyTorch's), gradients clipped to a global norm of 1.0, linear warm-up then linear
        decay to 0. The keyword-only arguments below set the recipe and apply to
        `optimizer="auto"` only. The loss and metrics default to the task's.

        With `total_steps=None` the schedule's length is planned at the start of each `fit`
        from what `fit` receives (see `fit`): the length lives in optimizer variables, so
        planning changes no compiled function. The task compiles itself with the defaults in
        its constructor; `fit` never compiles.

        Args:
            optimizer: `"auto"` or a Keras optimizer (instance or name). Defaults to `"auto"`.
            loss: `"auto"` (the task's loss) or a Keras loss. Defaults to `"auto"`.
            metrics: `"auto"` (the task's metrics) or Keras metrics. Defaults to `"auto"`.
            weighted_metrics: `"auto"` or Keras metrics. Defaults to `"auto"`.
            learning_rate: float. Peak learning rate. Defaults to the class'
                `default_learning_rate` (`5e-5`; `1e-4` for `BertPretrainer`).
            weight_decay: float >= 0. Decoupled weight decay. Defaults to `0.01`.
            warmup_ratio: float in [0, 1]. Warm-up as a fraction of the schedule. Defaults to
                the class' `default_warmup_ratio` (`0.1`; `0.01` for `BertPretrainer`).
            warmup_steps: int or `None`. A fixed warm-up length instead of `warmup_ratio`.
                Defaults to `None`.
            total_steps: int or `None`. A fixed length of the schedule; `None` plans it in
                each `fit` call. Defaults to `None`.
            update_rule: `"adamw"` or `"lamb"` (layer-wise trust ratio, for large-batch
                pretraining). Defaults to `"adamw"`.
            gradient_accumulation_steps: int >= 2 or `None`. Update once every this many
                batches, with their averaged gradient. Defaults to `None`.
            **kwargs: other arguments of `keras.Model.compile` (`jit_compile`,
                `steps_per_execution`, `loss_weights`, ...).

        Example:
        >>> backbone = kbert.models.BertBackbone(vocabulary_size=9, num_layers=1, num_heads=2,
        ...                                      hidden_dim=16, intermediate_dim=32)
        >>> classifier = kbert.models.BertClassifier(backbone, num_classes=2)
        >>> classifier.compile(learning_rate=2e-5, warmup_ratio=0.06)
        >>> classifier.compile(optimizer=keras.optimizers.SGD(0.01))  # task loss and metrics
        """
        given = {
            "learning_rate": learning_rate,
            "weight_decay": weight_decay,
            "warmup_ratio": warmup_ratio,
            "warmup_steps": warmup_steps,
            "total_steps": total_steps,
            "update_rule": update_rule,
            "gradient_accumulation_steps": gradient_accumulation_steps,
        }
        given = {name: value for name, value in given.items() if value is not None}
        auto_optimizer = isinstance(optimizer, str) and optimizer == "auto"
        if given and not auto_optimizer:
            raise ValueError(
                f'The recipe settings {sorted(given)} apply to `optimizer="auto"` only. '
                f"Received: optimizer={optimizer!r}. Configure that optimizer itself, or leave "
                '`optimizer="auto"`.'
            )
        _check_recipe(given)
        recipe = None
        if auto_optimizer:
            recipe = {**getattr(self, "_constructor_recipe", {}), **given}
            optimizer = self._recipe_optimizer(recipe)
        # The recipe settings of this compile (`None` with another optimizer), and whether
        # everything else is the task's default: a fresh default compile can then replace this
        # one (`kbert.models.lora.refresh_optimizer`, loading a `.keras` file).
        self.recipe = recipe
        self.compiled_with_defaults = (
            auto_optimizer
            and not kwargs
            and all(isinstance(a, str) and a == "auto" for a in (loss, metrics, weighted_metrics))
        )
        # The default loss as torch calls (`compute_loss`), where `lean_loss_spec` covers it.
        self._lean_loss = None
        if isinstance(loss, str) and loss == "auto":
            loss = self._default_loss()
            if kwargs.get("loss_weights") is None:
                kwargs["loss_weights"] = self._default_loss_weights()
            if kwargs["loss_weights"] is None:
                self._lean_loss = backend.lean_loss_spec(loss)
        if isinstance(metrics, str) and metrics == "auto":
            metrics = self._default_metrics()
        if isinstance(weighted_metrics, str) and weighted_metrics == "auto":
            weighted_metrics = self._default_weighted_metrics()
        # Whether `predict` may choose XLA on TensorFlow (see `make_predict_function`).
        self._predict_jit_auto = kwargs.get("jit_compile", "auto") == "auto" and not kwargs.get(
            "run_eagerly", False
        )
        super().compile(
            optimizer=optimizer,
            loss=loss,
            metrics=metrics,
            weighted_metrics=weighted_metrics,
            **kwargs,
        )
        # The metric each step adds its loss to (Keras lists it first), for kbert's torch
        # steps; a weak reference, which Keras' attribute tracking leaves alone.
        loss_metric = next((m for m in self.metrics if m.name == "loss"), None)
        self._loss_metric = None if loss_metric is None else weakref.ref(loss_metric)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        """Keras' `compute_loss`; on torch, for a task compiled with its default cross-entropy
        (`compile()`'s `loss="auto"`) and nothing else adding to the loss (no `add_loss`, no
        regularizer), the same loss as the torch calls Keras' path ends in
        (`kbert.backend.lean_task_loss`): one `cross_entropy`, a product with the sample
        weights and the mean, without the twenty-odd wrapped conversions and reductions around
        them (their cost: BENCHMARKS.md, "Host cost on torch"). Anything else, and inputs
        Keras would reshape first, take Keras' `compute_loss`."""
        spec = getattr(self, "_lean_loss", None)
        if spec is not None and not self.losses:
            loss = backend.lean_task_loss(spec, y, y_pred, sample_weight)
            if loss is not None:
                return loss
        return super().compute_loss(
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training
        )

    def train_step(self, *args):
        """Keras' `train_step` (`(data)`; JAX's `(state, data)`); on eager torch the same step
        with the trainable weights walked once instead of three times and only their
        gradients cleared (`kbert.backend.eager_train_step`)."""
        logs = backend.eager_train_step(self, *args) if len(args) == 1 else None
        return super().train_step(*args) if logs is None else logs

    train_step.kbert_step = True  # kbert's compiled steps replace it (`torch_step_function`)

    def make_train_function(self, force=False):
        """Keras' train function; on torch with `jit_compile=True`, kbert's compiled step.

        There the forward pass and loss are compiled with static shapes, one program per
        input shape (kbert's length buckets bound them), without a graph break; the backward
        runs the graph compiled with them and the optimizer updates every variable in one call
        after it. A partial last batch runs eagerly. See `kbert.backend.torch_steps`. On
        TensorFlow the optimizer is built first, so the step is traced once, not twice
        (`kbert.backend.build_optimizer_before_tracing`).
        """
        function = backend.torch_step_function(self, "train", force)
        if function is not None:
            return function
        # TensorFlow: the optimizer's variables exist before the step is traced (one trace).
        backend.build_optimizer_before_tracing(self)
        return super().make_train_function(force)

    def make_test_function(self, force=False):
        """Keras' test function; on torch with `jit_compile=True`, kbert's compiled step (the
        forward pass and loss compiled per input shape; see `make_train_function`)."""
        function = backend.torch_step_function(self, "test", force)
        return function if function is not None else super().make_test_function(force)

    def make_predict_function(self, force=False):
        """Keras' predict function; on TensorFlow compiled with XLA unless told otherwise; on
        torch with `jit_compile=True`, kbert's compiled forward pass (one program per input
        shape; a partial batch is padded to the full one and its padding rows dropped).

        Keras' `jit_compile="auto"` turns XLA off for TensorFlow on machines without an
        accelerator. For a BERT forward pass XLA is the faster choice there too (fused
        element-wise work around the matrix products; see BENCHMARKS.md, "Sentence
        embeddings"), so when `compile` left `jit_compile` to `"auto"`, without `run_eagerly`
        and outside a multi-replica `tf.distribute` strategy, `predict` (and
        `predict_on_batch`, `encode`) run under XLA on TensorFlow; `fit` and `evaluate` keep
        Keras' choice. `compile(jit_compile=False)` keeps XLA off everywhere. The switch is
        `kbert.backend.xla_predict_function`.
        """
        function = backend.torch_step_function(self, "predict", force)
        if function is not None:
            return function
        return backend.xla_predict_function(
            self,
            super().make_predict_function,
            force,
            allowed=getattr(self, "_predict_jit_auto", False),
        )

    def _recipe_optimizer(self, recipe):
        """BERT's optimizer for the recipe settings `recipe` (the rest take their defaults)."""
        settings = dict(RECIPE_DEFAULTS)
        settings["learning_rate"] = self.default_learning_rate
        settings["warmup_ratio"] = self.default_warmup_ratio
        settings.update(recipe)
        return bert_optimizer(
            settings["learning_rate"],
            total_steps=settings["total_steps"],
            warmup_steps=settings["warmup_steps"],
            warmup_ratio=settings["warmup_ratio"],
            weight_decay=settings["weight_decay"],
            optimizer=settings["update_rule"],
            gradient_accumulation_steps=settings["gradient_accumulation_steps"],
        )

    def get_compile_config(self):
        """Keras' compile config, plus the recipe settings of a default compile: loading a
        `.keras` file compiles the task again with them (see `compile_from_config`)."""
        config = super().get_compile_config()
        if config is not None and self.compiled_with_defaults:
            config = dict(config, kbert_recipe=dict(self.recipe or {}))
        return config

    def compile_from_config(self, config):
        """Called when a `.keras` file is loaded, before its optimizer state.

        A task saved after a default compile (`compile()` or `compile(learning_rate=...)`)
        compiles again with the same recipe settings. Otherwise the task keeps the default
        compile of its constructor. Building the optimizer lets the saved state load into it.
        """
        recipe = config.get("kbert_recipe") if isinstance(config, dict) else None
        if recipe is not None:
            self.compile(**recipe)
        if self.optimizer is not None and self.built:
            self.optimizer.build(self.trainable_variables)

    # ------------------------------------------------------------ fit's schedule
    def _plan_schedule(
        self, x, batch_size, epochs, steps_per_epoch, initial_epoch, validation_split
    ):
        """Sets a planned schedule's length to the steps `fit` is about to run (see
        "Schedule" in the class docstring); called by `fit` with its prepared data.

        Returns `(x, steps_per_epoch)` for `keras.Model.fit`: a dataset of unknown size is
        counted here and then repeated with `steps_per_epoch` set to its count.
        """
        schedule = planned_schedule(self.optimizer)
        if schedule is None:
            return x, steps_per_epoch
        x, steps_per_epoch, steps = self._count_fit_steps(
            x, batch_size, steps_per_epoch, validation_split
        )
        if steps is None:
            warnings.warn(
                f"{type(self).__name__}.fit could not count the training steps (a generator, an "
                "infinite or an empty dataset), so the learning rate stays at its peak without "
                "warm-up or decay. Pass `steps_per_epoch` to `fit`, or `total_steps` to `compile`.",
                stacklevel=3,
            )
        else:
            start = int(keras.ops.convert_to_numpy(self.optimizer.iterations))
            schedule.plan(steps * max(epochs - initial_epoch, 1), start_step=start)
        return x, steps_per_epoch

    # LoRA: see `BertBackbone.enable_lora` and kbert/models/lora.py. The head stays trainable.
    def enable_lora(self, rank, alpha=None, feedforward=False):
        """Enables LoRA on the backbone (see `BertBackbone.enable_lora`); the head keeps
        training."""
        from kbert.models import lora

        lora.enable_lora(self.backbone, rank, alpha=alpha, feedforward=feedforward)
        lora.refresh_optimizer(self)

    def save_lora_weights(self, path):
        """Writes the backbone's LoRA matrices alone (see `BertBackbone.save_lora_weights`)."""
        self.backbone.save_lora_weights(path)

    def load_lora_weights(self, path):
        """Reads LoRA matrices into the backbone (see `BertBackbone.load_lora_weights`)."""
        self.backbone.load_lora_weights(path)

    def merge_lora(self):
        """Returns a new model with the LoRA update merged into the kernels (see
        `BertBackbone.merge_lora`); the preprocessor, if any, is shared."""
        from kbert.models import lora

        return lora.merge_lora(self)

    def export(self, filepath, format="tf_saved_model", verbose=None, **kwargs):
        """Exports for serving (see `kbert.export`), from any backend.

        `format="tf_saved_model"` (default) writes a SavedModel whose signatures take raw
        strings and sentence pairs (the tokenizer in the graph; `BertMultipleChoice`:
        context and choices rows); `format="onnx"` writes ONNX with packed ids in, dynamic
        axes unless the `batch_size` / `sequence_length` keyword arguments fix them. Other
        formats go to `keras.Model.export`.
        """
        from kbert import export

        if format == "tf_saved_model":
            return export.export_saved_model(self, filepath, **kwargs)
        if format == "onnx":
            return export.export_onnx(self, filepath, **kwargs)
        return super().export(filepath, format=format, verbose=verbose, **kwargs)

    # ------------------------------------------------------------------ presets
    @classmethod
    def from_backbone(cls, backbone, **kwargs):
        return cls(backbone, **kwargs)

    @classmethod
    def from_preset(cls, source, load_weights=True, preprocessor="auto", **kwargs):
        """Builds the task from a preset name or a checkpoint directory.

        Args:
            source: str or path. A preset name or a directory (kbert preset, Hugging Face,
                Google or keras-hub checkpoint); see `kbert.checkpoints.load_model`.
            load_weights: bool. Load the weights (otherwise fresh ones). Defaults to `True`.
            preprocessor: `"auto"`, `None` or a preprocessor. `"auto"` builds a
                `kbert.text.BertPreprocessor` from the source's vocabulary when it has one
                (with the settings saved by `save_to_preset`, if any). Defaults to `"auto"`.
            **kwargs: task arguments (`num_classes`, `dropout` - the head's dropout; the
                backbone keeps the checkpoint's -, ...), `sequence_length` (of the automatic
                preprocessor; the window length for `BertQuestionAnswerer`), `fresh_heads`
                (see `kbert.checkpoints.formats`) and backbone overrides (`dtype`, ...).
                Names the task's constructor takes go to the task, other `BertBackbone`
                arguments to the backbone; anything else is a ValueError.

        Example:
        >>> tokenizer = kbert.text.BertTokenizer(
        ...     ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "good", "dull", "film"])
        >>> backbone = kbert.models.BertBackbone(vocabulary_size=9, num_layers=1, num_heads=2,
        ...                                      hidden_dim=16, intermediate_dim=32)
        >>> backbone.save_to_preset("my_bert", tokenizer=tokenizer)  # or a HF directory
        >>> classifier = kbert.models.BertClassifier.from_preset("my_bert", num_classes=2)
        >>> history = classifier.fit(["a good film", "a dull film"], [1, 0], verbose=0)
        >>> classifier.predict(["a good film"], verbose=0).shape
        (1, 2)
        """
        if "sequence_length" in cls._constructor_arguments():
            sequence_length = kwargs.get("sequence_length")
        else:
            sequence_length = kwargs.pop("sequence_length", None)
        auto = isinstance(preprocessor, str) and preprocessor == "auto"
        if not auto and preprocessor is not None:  # None is the constructors' default.
            kwargs["preprocessor"] = preprocessor
        model = super().from_preset(source, load_weights=load_weights, **kwargs)
        vocabulary_path = getattr(model, "preset_vocabulary_path", None)
        if auto and vocabulary_path is not None:
            if sequence_length is None and "sequence_length" in cls._constructor_arguments():
                sequence_length = model.sequence_length
            backbone = getattr(model, "backbone", model)
            model.preprocessor = _preprocessor_for_vocabulary(
                vocabulary_path,
                sequence_length,
                min(cls.default_sequence_length, backbone.max_sequence_length),
            )
        return model

    @classmethod
    def _constructor_arguments(cls):
        return set(inspect.signature(cls.__init__).parameters)

    def save_to_preset(self, path, tokenizer=None, include_optimizer=False):
        """Writes config, weights, vocabulary and the preprocessor settings to the directory `path`.

        See `kbert.checkpoints.save_preset` (atomic: a kill leaves the old or the new preset).
        """
        super().save_to_preset(path, tokenizer=tokenizer, include_optimizer=include_optimizer)

    # ------------------------------------------------------------------- config
    def get_config(self):
        preprocessor = None
        if self.preprocessor is not None:
            preprocessor = keras.saving.serialize_keras_object(self.preprocessor)
        return {
            "name": self.name,
            "trainable": self.trainable,
            "backbone": keras.layers.serialize(self.backbone),
            "preprocessor": preprocessor,
        }

    @classmethod
    def from_config(cls, config):
        # Configs of earlier releases carry training settings: they become the compile's.
        config, recipe = cls.split_training_config(config)
        if isinstance(config.get("backbone"), dict):
            config["backbone"] = keras.layers.deserialize(config["backbone"])
        if isinstance(config.get("preprocessor"), dict):
            config["preprocessor"] = keras.saving.deserialize_keras_object(config["preprocessor"])
        model = cls(**config)
        if recipe:
            model.compile(**recipe)
        return model


def _preprocessor_for_vocabulary(vocabulary_path, sequence_length, default_sequence_length):
    """A `kbert.text.BertPreprocessor` for a preset's vocabulary (and its saved settings, if any).

    The tokenizer comes from `BertTokenizer.from_preset` on the preset's directory, so a task
    model reads the vocabulary (`vocab.txt`, keras-hub's, or a Hugging Face `tokenizer.json`),
    casing and accents exactly as the tokenizer preset does (`tokenizer_config.json`,
    `tokenizer.json`, else the vocabulary itself); settings saved by `save_to_preset` override.
    """
    from kbert.text import BertPreprocessor, BertTokenizer

    vocabulary_path = Path(vocabulary_path)
    settings = read_preprocessor_settings(vocabulary_path.parent)
    source = vocabulary_directory(vocabulary_path) or vocabulary_path
    tokenizer = BertTokenizer.from_preset(source, **(settings.get("tokenizer") or {}))
    preprocessor_kwargs = {}
    if settings.get("truncate"):
        preprocessor_kwargs["truncate"] = settings["truncate"]
    length = sequence_length or settings.get("sequence_length") or default_sequence_length
    return BertPreprocessor(tokenizer, sequence_length=length, **preprocessor_kwargs)
