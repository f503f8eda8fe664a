"""Token-id checks at the host input boundary of kbert models.

Out-of-range ids must be refused on every backend, inside compiled steps too, without a
device-to-host transfer in any step. A gather with an out-of-range index has no error path
inside a compiled XLA program (JAX gives NaN rows, TensorFlow-XLA clamps) and reading a device
tensor's values to check them stalls the accelerator. So kbert checks the ids where they are
still on the host, before Keras converts them:

- `model(x)` with NumPy arrays or lists: in the model's `call`, before the functional graph
  converts them (`check_model_inputs`);
- `fit`, `evaluate`, `predict` and the `*_on_batch` methods: NumPy inputs are checked once,
  whole, before the first step (one pass over host memory, no per-step cost); a
  `tf.data.Dataset` gets a `map` that asserts the range of every batch inside the tf.data
  pipeline (host CPU, outside any XLA program), so the error names the range received;
- float ids are refused from their dtype alone, which is known even for traced tensors.

Python generators and `keras.utils.PyDataset` inputs are not checked (their batches are only
seen inside Keras' epoch loop); neither are backend tensors that already live on a device.
"""

from kbert.backend import tensorflow
from kbert.backend.tensorflow import is_dataset
from kbert.layers.utils import check_integer_dtype, host_values, index_range_message

# Integer inputs and the backbone attribute bounding them (None: the sequence length).
_ID_LIMITS = {
    "token_ids": "vocabulary_size",
    "segment_ids": "num_segments",
    "mask_positions": None,
}


def _limits(backbone, inputs):
    limits = {}
    for key, attribute in _ID_LIMITS.items():
        if key not in inputs:
            continue
        if attribute is None:
            token_ids = inputs.get("token_ids")
            shape = getattr(token_ids, "shape", None)
            if shape is None or len(shape) < 2 or shape[1] is None:
                continue
            limits[key] = ("sequence_length", int(shape[1]))
        else:
            limits[key] = (attribute, int(getattr(backbone, attribute)))
    return limits


def check_model_inputs(inputs, backbone):
    """Checks the id inputs of a dict for a model built on `backbone`.

    Dtypes are checked for any array or tensor (a static check); values only for NumPy
    arrays and lists. Raises a ValueError naming the input, the range received and the
    allowed range.
    """
    if not isinstance(inputs, dict):
        return
    for key, (upper_name, upper) in _limits(backbone, inputs).items():
        ids = inputs[key]
        check_integer_dtype(ids, key)
        values = host_values(ids)
        if values is None or values.size == 0:
            continue
        if values.dtype.kind not in "iu":
            check_integer_dtype(values, key)
        low, high = int(values.min()), int(values.max())
        if low < 0 or high >= upper:
            raise ValueError(index_range_message(key, upper_name, upper, low, high))


def _checked_dataset(dataset, backbone):
    """`dataset` with an in-pipeline assertion on the ids of every element."""
    tf = tensorflow.tensorflow("Checking the ids of a tf.data.Dataset")

    def features_of(element):  # The features dict of `x` or of an `(x, y, ...)` tuple.
        if isinstance(element, dict):
            return element
        if isinstance(element, (tuple, list)) and element and isinstance(element[0], dict):
            return element[0]
        return None

    spec = features_of(dataset.element_spec)
    if spec is None or not any(key in spec for key in _ID_LIMITS):
        return dataset
    for key in _ID_LIMITS:
        if key in spec:
            check_integer_dtype(spec[key], key)  # The dtype is static: refuse floats now.

    def check(*element):
        features = features_of(element[0] if len(element) == 1 else element)
        limits = _limits(backbone, features)
        assertions = []
        for key, (upper_name, upper) in limits.items():
            if upper_name == "sequence_length":
                upper = tf.shape(features["token_ids"], out_type=tf.int64)[-1]
            flat = tf.reshape(tf.cast(features[key], tf.int64), [-1])
            # Empty batches give (int64 max, int64 min), which pass.
            low, high = tf.reduce_min(flat), tf.reduce_max(flat)
            ok = tf.logical_and(low >= 0, high < tf.cast(upper, tf.int64))
            message = tf.strings.format(
                "`" + key + "` must lie in [0, " + upper_name + ") = [0, {}). "
                "Received values in [{}, {}].",
                (upper, low, high),
            )
            assertions.append(tf.debugging.Assert(ok, [message]))
        with tf.control_dependencies(assertions):
            element = tf.nest.map_structure(tf.identity, element)
        return element[0] if len(element) == 1 else element

    return dataset.map(check)


def check_data(x, backbone):
    """`x` for `fit`/`evaluate`/`predict`, with its ids checked (NumPy) or to be checked
    (tf.data)."""
    if is_dataset(x):
        return _checked_dataset(x, backbone)
    if isinstance(x, dict):
        check_model_inputs(x, backbone)
    elif isinstance(x, (tuple, list)) and x and isinstance(x[0], dict):
        check_model_inputs(x[0], backbone)
    return x


class HostInputChecks:
    """Mixin of `BertBackbone`: checks token, segment and mask-position ids before each run.

    The limits come from `self.backbone` if the model has one, else from the model itself.
    Task models (`kbert.models.BertTask`) call `check_data` in their own input route
    instead, so that their `fit` is overridden once. See the module docstring for what is
    checked where.
    """

    def _input_check_backbone(self):
        return getattr(self, "backbone", self)

    def _checked_x(self, x):
        return check_data(x, self._input_check_backbone())

    def fit(self, x=None, *args, validation_data=None, **kwargs):
        x = self._checked_x(x)
        if validation_data is not None:
            if is_dataset(validation_data):
                validation_data = self._checked_x(validation_data)
            elif isinstance(validation_data, (tuple, list)) and validation_data:
                self._checked_x(validation_data[0])
        return super().fit(x, *args, validation_data=validation_data, **kwargs)

    def evaluate(self, x=None, *args, **kwargs):
        return super().evaluate(self._checked_x(x), *args, **kwargs)

    def predict(self, x, *args, **kwargs):
        return super().predict(self._checked_x(x), *args, **kwargs)

    def train_on_batch(self, x, *args, **kwargs):
        return super().train_on_batch(self._checked_x(x), *args, **kwargs)

    def test_on_batch(self, x, *args, **kwargs):
        return super().test_on_batch(self._checked_x(x), *args, **kwargs)

    def predict_on_batch(self, x):
        return super().predict_on_batch(self._checked_x(x))
