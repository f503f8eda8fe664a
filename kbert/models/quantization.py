"""`quantize` for kbert models: every Dense and Embedding, LoRA merged first, presets that keep it.

Keras' `Model.quantize(mode)` replaces the float weights of each `Dense`, `EinsumDense` and
`Embedding` layer by quantized ones (int8 or int4 with per-channel scales, or float8 with
scaling factors). On kbert models it quantizes every such layer: the backbone's embeddings (int8
and int4; Keras' `Embedding` has no float8 mode, so float8 leaves them float), the query, key,
value and output projections and both feed-forward layers of every block, the pooler and the
task's head. kbert's speed paths step aside for quantized layers, except torch's int8 kernel
(`kbert.backend.int8_dense`), which serves int8 inference on torch.

`model.quantize(...)` also:
- merges an enabled LoRA adapter into the kernels first (the adapter would otherwise stay a
  float side path over the quantized kernel, outside the int8 kernel);
- raises a clear error for a mode kbert models cannot take (`gptq` and `awq` need calibration
  data and a layer structure; kbert does not define them);
- records which layers it quantized, in which mode and with which `QuantizationConfig`, so
  `save_to_preset` writes it into `config.json` and `from_preset` builds the model quantized
  before loading the quantized weights (`quantization` in the config);
- keeps Keras' garbage collections cheap (`collections_of_new_objects_only`): Keras runs a
  full `gc.collect()` for every variable a layer deletes, and each walks every object of the
  process (seconds per call once TensorFlow, torch or transformers are imported: all-MiniLM-L6-v2
  took about 4x longer to quantize in a fresh process).
"""

import contextlib
import gc
import json
import re

import keras

#: Modes a kbert model takes: Keras' modes that need no calibration data.
MODES = ("int8", "int4", "float8")
_CONFIG_KEY = "quantization"


def _quantizable(layer, mode):
    if isinstance(layer, keras.layers.Embedding):
        return mode in ("int8", "int4")
    return isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense))


def _user_filter(filters):
    """Keras' `filters` semantics (regex on the layer name, a list of them, or a callable)."""
    if filters is None:
        return lambda layer: True
    if isinstance(filters, str):
        return lambda layer: bool(re.search(filters, layer.name))
    if isinstance(filters, (list, tuple)) and all(isinstance(f, str) for f in filters):
        return lambda layer: any(re.search(f, layer.name) for f in filters)
    if callable(filters):
        return filters
    raise ValueError(
        "`filters` must be a regex string, a list of regex strings or a callable taking a "
        f"layer. Received: {filters!r}"
    )


def _check_mode(mode, config, model):
    if config is not None:
        mode = getattr(config, "mode", mode) if mode is None else mode
    if mode not in MODES:
        raise ValueError(
            f"{type(model).__name__}.quantize takes mode 'int8', 'int4' or 'float8' (or a "
            "`keras.quantizers` config of one of them). 'gptq' and 'awq' need calibration data "
            f"and a layer structure that kbert models do not define. Received: mode={mode!r}"
        )
    return mode


@contextlib.contextmanager
def collections_of_new_objects_only():
    """Within the block, garbage collections walk only the objects the block creates.

    The objects alive on entry are frozen (`gc.freeze`), so the full collection Keras runs for
    each variable a layer deletes skips them; on exit they are unfrozen and one full collection
    reclaims whatever the deleted variables left in reference cycles, as Keras' own would have.
    A variable no cycle holds is freed when it is deleted, as before. A process that froze
    objects itself (`gc.get_freeze_count()` above zero) is left exactly as it is: its frozen
    objects are its own, and unfreezing them would undo its choice.
    """
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.collect()


def _merge_lora_in_place(model):
    """Adds every enabled LoRA adapter into its kernel and removes the adapter, in place."""
    from kbert.models.lora import lora_layers

    backbone = getattr(model, "backbone", model)
    layers = lora_layers(backbone)
    if not layers:
        return
    for dense in layers.values():
        (kernel,) = [v for v in dense.weights if v.name == "kernel"]
        merged = keras.ops.convert_to_numpy(keras.ops.cast(dense.kernel, kernel.dtype))
        # Keras' `enable_lora` made these attributes; without them the layer is a plain Dense.
        del dense.lora_kernel_a
        del dense.lora_kernel_b
        dense.lora_enabled = False
        kernel.assign(merged)
    for variable in backbone.weights:  # LoRA froze the rest; a merged model trains whole.
        variable.trainable = True


class QuantizationMixin:
    """`quantize` for `BertBackbone` and the tasks (see the module docstring)."""

    def quantize(self, mode=None, config=None, filters=None, **kwargs):
        """Quantizes the model's Dense and Embedding layers in place (Keras' `Model.quantize`).

        Args:
            mode: `"int8"`, `"int4"` or `"float8"` (optional when `config` is given).
            config: optional `keras.quantizers.QuantizationConfig` (e.g.
                `Int4QuantizationConfig(block_size=32)`), passed to every layer.
            filters: optional regex string, list of them, or callable on a layer: only the
                layers it accepts are quantized (as in Keras).

        An enabled LoRA adapter is merged into the kernels first. Layers quantized before
        (by an earlier call with `filters`) are kept as they are; a call that finds every
        layer already quantized raises a ValueError.

        Example:
        >>> backbone = kbert.models.BertBackbone(vocabulary_size=30, num_layers=1, num_heads=2,
        ...                                      hidden_dim=16, intermediate_dim=32)
        >>> backbone.quantize("int8")
        >>> backbone.get_layer("pooler").dense.quantization_mode
        'int8'
        """
        mode = _check_mode(mode, config, self)
        accept = _user_filter(filters)
        with collections_of_new_objects_only():
            self._quantize_layers(mode, config, accept, kwargs)

    def _quantize_layers(self, mode, config, accept, kwargs):
        _merge_lora_in_place(self)
        chosen, already = {}, []

        def choose(layer):
            if not (_quantizable(layer, mode) and accept(layer)):
                return False
            if layer.quantization_mode:  # Quantized before (e.g. with other filters): kept.
                already.append(f"{layer.path} ({layer.quantization_mode})")
                return False
            chosen[layer.path] = layer
            return True

        super().quantize(mode, config=config, filters=choose, **kwargs)
        if already and not chosen:
            raise ValueError(
                f"Every layer of {type(self).__name__} that quantize({mode!r}) would change is "
                f"already quantized: {already[:3]}{' ...' if len(already) > 3 else ''}. Load "
                "the float model again to quantize it another way."
            )
        record = getattr(self, "_quantization_record", None) or []
        entry = {
            "mode": mode,
            "config": None if config is None else keras.saving.serialize_keras_object(config),
            "layers": sorted(chosen),
        }
        record.append(json.loads(json.dumps(entry)))  # as config.json will hold it
        self._quantization_record = record
        backbone = getattr(self, "backbone", None)
        if backbone is not None and backbone is not self:
            # The backbone's own record: its layers among those (paths are the same in both).
            ids = {id(v) for v in backbone.weights}
            own = sorted(
                p for p, layer in chosen.items() if any(id(v) in ids for v in layer.weights)
            )
            if own:
                entry = dict(record[-1], layers=own)
                backbone._quantization_record = [
                    *(getattr(backbone, "_quantization_record", None) or []),
                    entry,
                ]

    def apply_quantization_record(self, record):
        """Quantizes the model as `record` (a `quantization_record`, e.g. from a preset's
        `config.json`) says, before quantized weights load into it.

        Layers the record names that the model lacks (a task's head when only the backbone is
        built) are skipped; the weights file then tells whether the rest matches.
        """
        if not record:
            return
        if not isinstance(record, list) or not all(
            isinstance(e, dict) and {"mode", "layers"} <= set(e) for e in record
        ):
            raise ValueError(
                f'A quantization record must be a list of {{"mode", "config", "layers"}} '
                f"entries (the `{_CONFIG_KEY}` of a preset's config.json). Received: {record!r}"
            )
        for entry in record:
            config = entry.get("config")
            if config is not None:
                config = keras.saving.deserialize_keras_object(config, safe_mode=True)
            wanted = set(entry["layers"])
            self.quantize(
                entry["mode"], config=config, filters=lambda layer, w=wanted: layer.path in w
            )

    @property
    def quantization_record(self):
        """What `quantize` did to this model, as written into a preset's `config.json`: a list
        of `{"mode", "config", "layers"}` (layer paths), or `None` for a float model.

        A task built on a backbone quantized before (e.g. loaded from another task's
        quantized preset) includes the backbone's entries, so that its own preset reloads."""
        own = getattr(self, "_quantization_record", None) or []
        backbone = getattr(self, "backbone", None)
        if backbone is not None and backbone is not self:
            covered = {path for entry in own for path in entry["layers"]}
            inherited = [
                dict(entry, layers=[p for p in entry["layers"] if p not in covered])
                for entry in getattr(backbone, "_quantization_record", None) or []
            ]
            own = [entry for entry in inherited if entry["layers"]] + own
        return own or None
