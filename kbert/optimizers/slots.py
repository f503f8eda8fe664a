"""Where a variable's slots are: kbert's optimizers (`BertAdamW`, `Lamb`) index their slot
variables by the position of each trainable variable, found with `SlotIndex`."""

import keras


def variable_keys(variable):
    """The identities under which Keras may hand `variable` to an optimizer's `update_step`.

    The variable itself on every backend; on TensorFlow also its `tf.Variable` (`.value`) and,
    under a `tf.distribute` strategy, that variable's per-replica components (`.values`): what
    TensorFlow's update loop passes.
    """
    keys = [id(variable)]
    if keras.config.backend() == "tensorflow" and isinstance(variable, keras.Variable):
        value = variable.value
        keys.append(id(value))
        keys.extend(id(component) for component in getattr(value, "values", None) or ())
    return keys


class SlotIndex:
    """The position of a trainable variable in the list an optimizer was built with.

    kbert's optimizers create their slot variables themselves (the public
    `Optimizer.add_optimizer_variables`, one list per slot in the order of the built variables)
    and find a variable's slots with this index, not with Keras' private bookkeeping. A plain
    object, so Keras' attribute tracking does not count the variables it holds as optimizer
    variables.

    Args:
        variables: list of `keras.Variable`. The variables the optimizer is built with.
    """

    def __init__(self, variables):
        self.variables = list(variables)
        self.positions = {}
        for position, variable in enumerate(self.variables):
            for key in variable_keys(variable):
                self.positions[key] = position

    def __call__(self, variable):
        position = self.positions.get(id(variable))
        if position is None:
            name = getattr(variable, "path", None) or getattr(variable, "name", None)
            raise ValueError(
                f"The optimizer was not built with the variable {name!r}: it updates only the "
                "variables it was built with (by `build` or its first `apply`)."
            )
        return position
