"""Training kbert models on several devices.

* **JAX** - `keras.distribution`. `data_parallel()` replicates the model on every device and
  splits each batch; `model_parallel(model_parallel_size)` arranges the devices in a
  `(batch, model)` mesh and shards every transformer block Megatron-style with
  `BertBackbone.get_layout_map` (heads and feed-forward columns over `model`, the batch over
  `batch`). Both return a distribution whose scope the model is created in and trained in:

      distribution = kbert.distribution.model_parallel(2, config=backbone_config)
      with distribution.scope():
          model = kbert.models.BertClassifier.from_preset("bert_base_en_uncased", num_classes=2)
          model.fit(dataset)

  They are `keras.distribution.DataParallel` / `ModelParallel` that also reject, with a
  clear error, a batch that the data-parallel axis cannot split evenly (use a batch size
  that is a multiple of the number of replicas, and `drop_remainder=True` in tf.data).
* **TensorFlow** - `tf.distribute` strategies (e.g. `tf.distribute.MirroredStrategy()`):
  create and compile the model inside `strategy.scope()`, then `fit` as usual; Keras splits
  each global batch over the replicas.
* **PyTorch** - the Keras torch backend has no `keras.distribution`; wrap the training loop
  in `torch.nn.parallel.DistributedDataParallel` (one process per device, launched with
  `torchrun`), or train on JAX for multi-device runs.

Example:
>>> distribution = data_parallel()
>>> with distribution.scope():
...     backbone = BertBackbone.from_preset("bert_tiny_en_uncased", load_weights=False)
"""

import keras
import numpy as np

from kbert.models.backbone import BertBackbone


def _data_parallel_size(distribution):
    mesh = distribution.device_mesh
    axis = distribution.batch_dim_name
    if axis not in mesh.axis_names:
        return 1
    return int(mesh.shape[list(mesh.axis_names).index(axis)])


def check_batch_size(batch_size, distribution=None):
    """Raises a ValueError when `batch_size` does not split evenly over the data-parallel axis.

    Args:
        batch_size: int. The global batch size (examples per step over all devices).
        distribution: a `keras.distribution.Distribution`, or None for the current one
            (nothing is checked when none is set).

    Example:
    >>> check_batch_size(32, data_parallel())  # fine on 1, 2, 4, 8... devices
    """
    distribution = distribution or keras.distribution.distribution()
    if distribution is None or batch_size is None:
        return
    replicas = _data_parallel_size(distribution)
    if int(batch_size) % replicas:
        raise ValueError(
            f"The batch size must be divisible by the {replicas} devices of the data-parallel "
            f"mesh axis {distribution.batch_dim_name!r}, which each take an equal share. "
            f"Received: batch_size={int(batch_size)}. Use a multiple of {replicas} "
            "(and `drop_remainder=True` when batching a tf.data.Dataset, so that the last "
            "batch is not smaller)."
        )


class DataParallel(keras.distribution.DataParallel):
    """`keras.distribution.DataParallel` that rejects batches the devices cannot share evenly.

    Args:
        device_mesh: optional 1-D `keras.distribution.DeviceMesh`.
        devices: optional list of devices (default: all of them).
        **kwargs: passed to `keras.distribution.DataParallel`.

    Example:
    >>> with DataParallel().scope():
    ...     model = build_model()
    ...     model.fit(x, y, batch_size=64)
    """

    def get_data_layout(self, data_shape):
        check_batch_size(data_shape[0], self)
        return super().get_data_layout(data_shape)


class ModelParallel(keras.distribution.ModelParallel):
    """`keras.distribution.ModelParallel` that rejects batches the data axis cannot split evenly.

    Args:
        layout_map: `keras.distribution.LayoutMap`, e.g. `BertBackbone.get_layout_map(mesh)`.
        batch_dim_name: str. The mesh axis that splits the batch. Defaults to the mesh's
            first axis.
        **kwargs: passed to `keras.distribution.ModelParallel`.

    Example:
    >>> mesh = keras.distribution.DeviceMesh((2, 4), ["batch", "model"])
    >>> distribution = ModelParallel(
    ...     layout_map=BertBackbone.get_layout_map(mesh), batch_dim_name="batch")
    """

    def get_data_layout(self, data_shape):
        check_batch_size(data_shape[0], self)
        return super().get_data_layout(data_shape)


def data_parallel(devices=None):
    """A `DataParallel` distribution over `devices` (default: all devices of the backend).

    Args:
        devices: optional list of device names (`keras.distribution.list_devices()`).

    Returns:
        `kbert.distribution.DataParallel`.
    """
    return DataParallel(devices=devices or keras.distribution.list_devices())


def _backbone_config(config):
    if config is None:
        return None
    if isinstance(config, BertBackbone):
        return config.get_config()
    if isinstance(config, str):
        from kbert.models.presets import BACKBONE_PRESETS

        if config not in BACKBONE_PRESETS:
            raise ValueError(
                f"Unknown preset {config!r}. Expected one of {sorted(BACKBONE_PRESETS)}, a "
                "BertBackbone or its config dict."
            )
        return BACKBONE_PRESETS[config]["config"]
    if isinstance(config, dict):
        return config
    raise ValueError(
        "`config` must be a preset name, a BertBackbone or a BertBackbone config dict. "
        f"Received: {type(config).__name__}"
    )


def check_model_parallel_config(config, model_parallel_size, data_parallel_size=1):
    """Raises a ValueError when a backbone cannot be split over the given axis sizes.

    Heads must stay whole on a device (`num_heads` divisible by the model axis) and the
    hidden and intermediate widths must split evenly.

    Args:
        config: a preset name, a `BertBackbone` or its config dict.
        model_parallel_size: int. Size of the model-parallel axis.
        data_parallel_size: int. Size of the data-parallel axis when weights are also split
            over it (0 or 1 when they are not). Defaults to `1`.
    """
    config = _backbone_config(config)
    checks = [
        ("num_heads", config["num_heads"], model_parallel_size, "model-parallel"),
        ("hidden_dim", config["hidden_dim"], model_parallel_size, "model-parallel"),
        ("intermediate_dim", config["intermediate_dim"], model_parallel_size, "model-parallel"),
    ]
    if data_parallel_size and data_parallel_size > 1:
        checks += [
            ("hidden_dim", config["hidden_dim"], data_parallel_size, "data-parallel"),
            ("intermediate_dim", config["intermediate_dim"], data_parallel_size, "data-parallel"),
        ]
    for name, value, size, axis in checks:
        if value % size:
            raise ValueError(
                f"`{name}`={value} cannot be split evenly over the {size} devices of the "
                f"{axis} axis. Choose an axis size that divides {value}."
            )


def model_parallel(
    model_parallel_size,
    devices=None,
    config=None,
    model_parallel_dim_name="model",
    data_parallel_dim_name="batch",
    shard_weights_over_batch=True,
):
    """A `(batch, model)` mesh over `devices` with BERT's Megatron layout, as a `ModelParallel`.

    Args:
        model_parallel_size: int. Devices that share one copy of the model (the size of the
            model axis). The rest form the data-parallel axis:
            `len(devices) // model_parallel_size` replicas.
        devices: optional list of device names. Defaults to all devices.
        config: optional preset name, `BertBackbone` or config dict; when given, the split
            is checked against its widths and head count before any variable exists.
        model_parallel_dim_name: str. Defaults to `"model"`.
        data_parallel_dim_name: str. Defaults to `"batch"`.
        shard_weights_over_batch: bool. Also split each kernel's other dimension over the
            data axis (fully sharded weights). Defaults to `True`.

    Returns:
        `kbert.distribution.ModelParallel`.

    Example:
    >>> distribution = model_parallel(4, config="bert_base_en_uncased")  # 8 devices: 2 x 4
    >>> with distribution.scope():
    ...     backbone = BertBackbone.from_preset("bert_base_en_uncased", load_weights=False)
    """
    devices = list(devices or keras.distribution.list_devices())
    if (
        not isinstance(model_parallel_size, int)
        or model_parallel_size < 1
        or len(devices) % model_parallel_size
    ):
        raise ValueError(
            "`model_parallel_size` must be a positive integer that divides the number of "
            f"devices ({len(devices)}). Received: model_parallel_size={model_parallel_size!r}"
        )
    data_size = len(devices) // model_parallel_size
    if config is not None:
        check_model_parallel_config(
            config, model_parallel_size, data_size if shard_weights_over_batch else 1
        )
    mesh = keras.distribution.DeviceMesh(
        shape=(data_size, model_parallel_size),
        axis_names=[data_parallel_dim_name, model_parallel_dim_name],
        devices=np.array(devices).reshape(data_size, model_parallel_size),
    )
    layout_map = BertBackbone.get_layout_map(
        mesh,
        model_parallel_dim_name=model_parallel_dim_name,
        data_parallel_dim_name=data_parallel_dim_name if shard_weights_over_batch else None,
    )
    return ModelParallel(layout_map=layout_map, batch_dim_name=data_parallel_dim_name)
