"""Distribution and memory options: sharded and replicated training equal single-device training.

* `BertBackbone.get_layout_map`: the Megatron mapping of every variable, errors for meshes
  without the named axes (all backends; no devices needed).
* JAX: `DataParallel` and `ModelParallel` `fit` on 8 virtual CPU devices (a subprocess, since
  `XLA_FLAGS=--xla_force_host_platform_device_count=8` must precede the jax import) gives the
  single-device losses, weights and predictions; weights are really sharded; a batch the
  data axis cannot split raises a clear error.
* TensorFlow: `tf.distribute.MirroredStrategy` on 2 logical CPUs (a subprocess) equals one
  device.
* Both train a `BertClassifier` with dropout on (on JAX its batches planned by length): every
  device's dropout masks are its rows of the masks of one device.
* Adam moves embedding rows by at most its learning rate on every backend.
* `remat=True` gives the same training step (same dropout masks) and, on JAX, a smaller
  compiled step; gradient accumulation over k micro-batches equals one batch k times larger.
"""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from kbert import distribution as kd
from kbert.models import BertBackbone, BertClassifier
from kbert.optimizers import WarmupLinearDecay, bert_optimizer
from tests.test_case import REPO_ROOT

CONFIG = dict(
    vocabulary_size=64,
    num_layers=2,
    num_heads=4,
    hidden_dim=16,
    intermediate_dim=32,
    max_sequence_length=16,
    dropout=0.0,
    attention_dropout=0.0,
)
RESULT_PREFIX = "@@RESULT@@"


def _data(batch=16, length=8, seed=0):
    rng = np.random.default_rng(seed)
    x = {
        "token_ids": rng.integers(0, 64, (batch, length)).astype("int32"),
        "segment_ids": np.zeros((batch, length), "int32"),
        "padding_mask": np.ones((batch, length), "int32"),
    }
    x["segment_ids"][:, length // 2 :] = 1
    x["padding_mask"][::3, length - 2 :] = 0
    y = rng.integers(0, 2, (batch,)).astype("int32")
    return x, y


def _classifier(optimizer=None, **overrides):
    """Backbone + dense on the pooled output, compiled; the model every check trains."""
    backbone = BertBackbone(**dict(CONFIG, **overrides))
    logits = keras.layers.Dense(2, name="logits")(backbone(backbone.input)["pooled_output"])
    model = keras.Model(backbone.input, logits)
    model.compile(
        optimizer=optimizer or keras.optimizers.AdamW(learning_rate=1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    # Built now, as Keras builds it before the first step on JAX and torch: on TensorFlow a
    # plain Keras model otherwise builds it inside the first trace, which TensorFlow then traces
    # a second time (kbert's own tasks do this themselves, see test_task_fit.py).
    model.optimizer.build(model.trainable_variables)
    return model


def _task_classifier(length_batching=True):
    """A `BertClassifier` with dropout on (0.1 everywhere): what the multi-device checks
    train. Its fit plans batches by length (sorted within each batch) on one device and on
    several, and each device's dropout masks must be its rows of one device's masks."""
    backbone = BertBackbone(**dict(CONFIG, dropout=0.1, attention_dropout=0.1))
    model = BertClassifier(backbone, num_classes=2, preprocessor=None)
    model.length_batching = length_batching
    model.compile(optimizer=keras.optimizers.AdamW(learning_rate=1e-2))
    return model


def _train(model, weights, batch_size=8, predict=True):
    """Sets `weights`, fits one epoch of `_data()`; returns losses, weights and (unless
    `predict=False`) predictions."""
    x, y = _data()
    model.set_weights(weights)
    history = model.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False, verbose=0)
    predictions = model.predict(x, batch_size=8, verbose=0) if predict else np.zeros(0)
    return {
        "loss": np.array(history.history["loss"]),
        "weights": [np.asarray(w) for w in model.get_weights()],
        "predictions": np.asarray(predictions),
    }


def _run_python(code, extra_env, timeout=300):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **extra_env)
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    for line in result.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])
    raise AssertionError(f"Subprocess failed ({result.returncode}):\n{result.stderr[-4000:]}")


def _differences(got, reference):
    return {
        "loss": float(np.abs(got["loss"] - reference["loss"]).max()),
        "weights": float(
            max(np.abs(a - b).max() for a, b in zip(got["weights"], reference["weights"]))
        ),
        "predictions": float(np.abs(got["predictions"] - reference["predictions"]).max())
        if got["predictions"].size
        else 0.0,
    }


def _unplanned_classifier():
    """`_task_classifier` without length batching: its batches as given."""
    return _task_classifier(length_batching=False)


def _save_reference(path, build=_task_classifier):
    keras.utils.set_random_seed(0)
    model = build()
    initial = [np.asarray(w) for w in model.get_weights()]
    reference = _train(model, initial)
    np.savez(
        path,
        loss=reference["loss"],
        predictions=reference["predictions"],
        **{f"initial_{i}": w for i, w in enumerate(initial)},
        **{f"final_{i}": w for i, w in enumerate(reference["weights"])},
    )


def _load_reference(path):
    stored = np.load(path)
    count = len([k for k in stored.files if k.startswith("initial_")])
    reference = {
        "loss": stored["loss"],
        "predictions": stored["predictions"],
        "weights": [stored[f"final_{i}"] for i in range(count)],
    }
    return [stored[f"initial_{i}"] for i in range(count)], reference


# === Layout map (any backend: meshes of device names, no devices needed) ===


def _mesh(shape=(2, 4), axis_names=("batch", "model")):
    devices = np.array([f"cpu:{i}" for i in range(int(np.prod(shape)))]).reshape(shape)
    return keras.distribution.DeviceMesh(shape, list(axis_names), devices=devices)


def test_layout_map_is_megatron_style():
    backbone = BertBackbone(**CONFIG)
    layout_map = BertBackbone.get_layout_map(_mesh())
    expected = {
        "self_attention/query/kernel": ("batch", "model"),
        "self_attention/key/kernel": ("batch", "model"),
        "self_attention/value/kernel": ("batch", "model"),
        "self_attention/value/bias": ("model",),
        "self_attention/attention_output/kernel": ("model", "batch"),
        "intermediate_dense/kernel": ("batch", "model"),
        "intermediate_dense/bias": ("model",),
        "output_dense/kernel": ("model", "batch"),
        "token_embedding/embeddings": (None, "model"),
        "position_embedding/embeddings": (None, "model"),
        "pooler_dense/kernel": ("batch", "model"),
    }
    replicated = (
        "layer_norm/gamma",
        "layer_norm/beta",
        "attention_output/bias",
        "output_dense/bias",
    )
    seen = set()
    for variable in backbone.weights:
        layout = layout_map[variable.path]
        for suffix, axes in expected.items():
            if variable.path.endswith(suffix):
                assert layout is not None and tuple(layout.axes) == axes, variable.path
                seen.add(suffix)
        if variable.path.endswith(replicated):
            assert layout is None, variable.path
    assert seen == set(expected)
    # Nested in a task model, paths keep matching; without a data axis weights are split once.
    assert layout_map["classifier/transformer_layer_11/output_dense/kernel"] is not None
    single = BertBackbone.get_layout_map(_mesh(), data_parallel_dim_name=None)
    assert tuple(single["transformer_layer_0/self_attention/query/kernel"].axes) == (None, "model")


def test_layout_map_rejects_meshes_without_the_axes():
    with pytest.raises(ValueError, match="no axis named 'model'.*'batch', 'data'"):
        BertBackbone.get_layout_map(_mesh(axis_names=("batch", "data")))
    with pytest.raises(ValueError, match="no axis named 'batch'"):
        BertBackbone.get_layout_map(_mesh(axis_names=("data", "model")))
    with pytest.raises(ValueError, match="must differ"):
        BertBackbone.get_layout_map(_mesh(), "model", "model")
    with pytest.raises(ValueError, match="DeviceMesh"):
        BertBackbone.get_layout_map(("batch", "model"))
    layout_map = BertBackbone.get_layout_map(_mesh(axis_names=("data", "tensor")), "tensor", "data")
    assert tuple(layout_map["transformer_layer_0/output_dense/kernel"].axes) == ("tensor", "data")


def test_model_parallel_and_batch_checks():
    devices = [f"cpu:{i}" for i in range(8)]
    with pytest.raises(ValueError, match="num_heads`=4 cannot be split evenly over the 8"):
        kd.check_model_parallel_config(CONFIG, 8)
    with pytest.raises(ValueError, match="divides the number of devices"):
        kd.model_parallel(3, devices=devices)
    with pytest.raises(ValueError, match="Unknown preset"):
        kd.model_parallel(2, devices=devices, config="bert_huge")
    kd.check_model_parallel_config("bert_base_en_uncased", 4, 2)  # 12 heads, 768, 3072: fine.
    distribution = kd.DataParallel(
        device_mesh=keras.distribution.DeviceMesh((8,), ["batch"], devices=devices)
    )
    kd.check_batch_size(16, distribution)
    with pytest.raises(ValueError, match="divisible by the 8 devices.*batch_size=12"):
        kd.check_batch_size(12, distribution)


@pytest.mark.backends(
    "torch", reason="Keras has no keras.distribution on torch: model_parallel is one clear error"
)
def test_model_parallel_on_torch_is_one_clear_error():
    with pytest.raises(ValueError, match="JAX and TensorFlow only.*use data_parallel"):
        kd.model_parallel(2, devices=[f"cpu:{i}" for i in range(8)])


def test_data_parallel_in_one_process_trains_as_without_it():
    """The script written for several processes runs unchanged in one, on every backend
    (torch: Keras has no distribution API there), and trains the same weights."""
    keras.utils.set_random_seed(0)
    weights = _classifier().get_weights()
    with kd.data_parallel().scope():
        model = _classifier()
    trained = _train(model, weights)
    reference = _train(_classifier(), weights)
    assert max(_differences(trained, reference).values()) < 1e-6
    moved = max(np.abs(a - b).max() for a, b in zip(trained["weights"], weights))
    assert moved > 1e-3  # the epoch moved the weights


# === JAX: 8 virtual CPU devices ===

_JAX_WORKER = """
import json, sys
import jax, keras, numpy as np
from kbert import distribution as kd
from kbert.models import BertBackbone
from tests import test_distribution as t

initial, reference = t._load_reference(sys.argv[1])
x, y = t._data()
result = {"devices": len(jax.devices())}
for name, distribution, bad_batch in (
    ("data_parallel", kd.data_parallel(), 12),
    ("model_parallel", kd.model_parallel(4, config=t.CONFIG), 7),
):
    with distribution.scope():
        keras.utils.set_random_seed(0)
        model = t._task_classifier()
        result[name] = t._differences(t._train(model, initial), reference)
        backbone = [layer for layer in model.layers if isinstance(layer, BertBackbone)][0]
        result[name + "_shards"] = {
            v.path: {
                "spec": [None if a is None else str(a) for a in v.value.sharding.spec],
                "shard_shapes": sorted({tuple(s.data.shape) for s in v.value.addressable_shards}),
                "devices": len(v.value.sharding.device_set),
            }
            for v in backbone.weights
        }
        try:
            model.fit({k: v[:bad_batch] for k, v in x.items()}, y[:bad_batch],
                      batch_size=bad_batch, verbose=0)
            result[name + "_bad_batch"] = None
        except ValueError as error:
            result[name + "_bad_batch"] = str(error)
print(t.RESULT_PREFIX + json.dumps(result))
"""


@pytest.fixture(scope="module")
def jax_distributed(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("distribution") / "reference.npz")
    _save_reference(path)
    code = _JAX_WORKER.replace("sys.argv[1]", repr(path))
    # Eight host devices, added to the XLA flags the caller set (the test legs' faster compiles).
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8".strip()
    return _run_python(code, {"KERAS_BACKEND": "jax", "XLA_FLAGS": flags})


@pytest.mark.backends("jax", reason="keras.distribution runs on JAX")
@pytest.mark.parametrize("mode", ["data_parallel", "model_parallel"])
def test_jax_distributed_fit_equals_single_device(jax_distributed, mode):
    assert jax_distributed["devices"] == 8
    differences = jax_distributed[mode]
    assert differences["loss"] < 1e-5, differences
    assert differences["weights"] < 1e-5, differences
    assert differences["predictions"] < 1e-5, differences


@pytest.mark.backends("jax", reason="keras.distribution runs on JAX")
def test_jax_weights_are_sharded(jax_distributed):
    replicated = jax_distributed["data_parallel_shards"]
    query = "transformer_layer_1/self_attention/query/kernel"
    assert replicated[query] == {"spec": [], "shard_shapes": [[16, 16]], "devices": 8} or (
        set(replicated[query]["spec"]) <= {None} and replicated[query]["shard_shapes"] == [[16, 16]]
    )
    sharded = jax_distributed["model_parallel_shards"]
    expected = {  # mesh (batch=2, model=4): hidden 16, intermediate 32
        query: (["batch", "model"], [8, 4]),
        "transformer_layer_0/self_attention/attention_output/kernel": (["model", "batch"], [4, 8]),
        "transformer_layer_0/intermediate_dense/kernel": (["batch", "model"], [8, 8]),
        "transformer_layer_0/intermediate_dense/bias": (["model"], [8]),
        "transformer_layer_1/output_dense/kernel": (["model", "batch"], [8, 8]),
        "embeddings/token_embedding/embeddings": ([None, "model"], [64, 4]),
    }
    for path, (spec, shard_shape) in expected.items():
        assert sharded[path]["spec"] == spec, path
        assert sharded[path]["shard_shapes"] == [shard_shape], path
        assert sharded[path]["devices"] == 8
    gamma = sharded["transformer_layer_0/output_layer_norm/gamma"]
    assert gamma["shard_shapes"] == [[16]] and set(gamma["spec"]) <= {None}


@pytest.mark.backends("jax", reason="keras.distribution runs on JAX")
def test_jax_batch_not_divisible_is_a_clear_error(jax_distributed):
    message = jax_distributed["data_parallel_bad_batch"]
    assert message and "divisible by the 8 devices" in message and "batch_size=12" in message
    message = jax_distributed["model_parallel_bad_batch"]
    assert message and "divisible by the 2 devices" in message and "batch_size=7" in message


# === TensorFlow: MirroredStrategy on 2 logical CPUs ===

_TF_WORKER = """
import json, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
from tests import test_distribution as t

initial, reference = t._load_reference(sys.argv[1])
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    keras.utils.set_random_seed(0)
    model = t._unplanned_classifier()
result = t._differences(t._train(model, initial), reference)
result["replicas"] = strategy.num_replicas_in_sync
print(t.RESULT_PREFIX + json.dumps(result))
"""


@pytest.mark.backends("tensorflow", reason="tf.distribute runs on TensorFlow")
def test_tf_mirrored_strategy_equals_single_device(tmp_path):
    path = str(tmp_path / "reference.npz")
    # Under a tf.distribute strategy Keras splits the batches as given (no length plan).
    _save_reference(path, _unplanned_classifier)
    result = _run_python(
        _TF_WORKER.replace("sys.argv[1]", repr(path)), {"KERAS_BACKEND": "tensorflow"}
    )
    assert result["replicas"] == 2
    assert result["loss"] < 1e-5 and result["weights"] < 1e-5 and result["predictions"] < 1e-5, (
        result
    )


# === Memory options ===


def test_remat_trains_identically():
    """Same seeds, dropout 0.1: one fit epoch with and without remat gives the same weights."""
    results, initial = {}, None
    for remat in (False, True):
        keras.utils.set_random_seed(7)  # Same seeds for the dropout layers of both models.
        model = _classifier(remat=remat, dropout=0.1, attention_dropout=0.1)
        if initial is None:
            initial = [np.asarray(w) for w in model.get_weights()]
        keras.utils.set_random_seed(8)  # Same global (torch) generator state at fit.
        results[remat] = _train(model, initial, predict=False)  # losses and weights compared
    assert results[True]["loss"][0] > 0
    differences = _differences(results[True], results[False])
    assert differences["loss"] < 1e-5 and differences["weights"] < 1e-5, differences
    # Dropout was active: without it the step differs.
    keras.utils.set_random_seed(7)
    plain = _classifier()
    plain_result = _train(plain, initial, predict=False)
    assert _differences(plain_result, results[False])["weights"] > 1e-4


def _jax_saved_activation_bytes(backbone, x):
    """Bytes JAX's autodiff keeps from the forward pass for the backward pass."""
    import jax

    trainable = [v.value for v in backbone.trainable_variables]
    non_trainable = [v.value for v in backbone.non_trainable_variables]

    def loss(weights):
        outputs, _ = backbone.stateless_call(weights, non_trainable, x, training=True)
        return keras.ops.sum(keras.ops.square(outputs["sequence_output"]))

    _, backward = jax.vjp(loss, trainable)  # The backward closure holds the residuals.
    return sum(
        leaf.size * leaf.dtype.itemsize
        for leaf in jax.tree_util.tree_leaves(backward)
        if hasattr(leaf, "dtype")
    )


def _torch_saved_activation_bytes(backbone, x):
    """Bytes torch's autograd keeps from the forward pass for the backward pass."""
    import torch

    saved = []

    def pack(tensor):
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        outputs = backbone(x, training=True)
        keras.ops.sum(keras.ops.square(outputs["sequence_output"])).backward()
    return sum(saved)


def _assert_remat_keeps_fewer_activations(saved_activation_bytes):
    x, _ = _data(batch=4, length=16)
    saved = {}
    for remat in (False, True):
        backbone = BertBackbone(**dict(CONFIG, num_layers=4, remat=remat, dropout=0.1))
        saved[remat] = saved_activation_bytes(backbone, x)
    assert saved[True] < 0.3 * saved[False], saved


# tf.recompute_grad keeps no inspectable record: remat's saving is measured on JAX and torch.
@pytest.mark.backends("jax", reason="measured with JAX's vjp residuals")
def test_remat_keeps_fewer_activations_on_jax():
    _assert_remat_keeps_fewer_activations(_jax_saved_activation_bytes)


@pytest.mark.backends("torch", reason="measured with torch's saved-tensor hooks")
def test_remat_keeps_fewer_activations_on_torch():
    _assert_remat_keeps_fewer_activations(_torch_saved_activation_bytes)


def test_gradient_accumulation_equals_a_larger_batch():
    keras.utils.set_random_seed(3)
    optimizer = bert_optimizer(1e-2, total_steps=10, warmup_steps=2, gradient_accumulation_steps=2)
    accumulated = _classifier(optimizer=optimizer)
    initial = [np.asarray(w) for w in accumulated.get_weights()]
    result = _train(accumulated, initial, batch_size=4)  # 4 micro-batches = 2 updates of 8
    reference = _train(
        _classifier(optimizer=bert_optimizer(1e-2, total_steps=10, warmup_steps=2)), initial, 8
    )
    difference = max(np.abs(a - b).max() for a, b in zip(result["weights"], reference["weights"]))
    assert difference < 2e-5
    moved = max(np.abs(a - b).max() for a, b in zip(reference["weights"], initial))
    assert moved > 1e-3  # The updates did something.
    np.testing.assert_allclose(keras.ops.convert_to_numpy(accumulated.optimizer.iterations), 2)


def test_adam_moves_embedding_rows_by_at_most_the_learning_rate():
    """Adam's first update is at most the learning rate per weight, repeated token ids included.

    Fails on TensorFlow when the embedding gradient reaches Keras' optimizer as row-wise
    `IndexedSlices` (see `DenseGradientEmbedding`).
    """
    keras.utils.set_random_seed(5)
    model = _classifier(optimizer=keras.optimizers.Adam(learning_rate=1e-2))
    initial = [np.asarray(w) for w in model.get_weights()]
    x, y = _data(batch=8)  # 8 x 8 ids from a vocabulary of 64: many repeats.
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    for variable, before in zip(model.weights, initial):
        step = np.abs(np.asarray(keras.ops.convert_to_numpy(variable.value)) - before).max()
        assert step <= 1e-2 * (1 + 1e-4), (variable.path, step)


def test_accumulating_schedule_counts_updates():
    plain = WarmupLinearDecay(1.0, total_steps=10, warmup_steps=4)
    accumulating = WarmupLinearDecay(1.0, total_steps=10, warmup_steps=4, accumulation_steps=3)
    for micro_step in range(40):
        np.testing.assert_allclose(
            float(accumulating(micro_step)), float(plain(micro_step // 3)), rtol=1e-6
        )
    config = accumulating.get_config()
    assert config["accumulation_steps"] == 3
    assert float(WarmupLinearDecay(**config)(7)) == float(accumulating(7))
    with pytest.raises(ValueError, match="gradient_accumulation_steps"):
        bert_optimizer(gradient_accumulation_steps=1)
    with pytest.raises(ValueError, match="accumulation_steps"):
        WarmupLinearDecay(1.0, 10, 1, accumulation_steps=0)
