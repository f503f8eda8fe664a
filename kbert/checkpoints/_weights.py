"""Checked, all-or-nothing assignment of checkpoint tensors to Keras variables (shared by the
readers).

Every reader turns its format into the same two things: a `TensorSource` (names and a way to
read each tensor as NumPy) and a list of `WeightEntry` (checkpoint name -> kbert variable, how
to lay the tensor out, which part of the model it belongs to). `assign_checked` then reads and
validates everything first - missing, unexpected and mis-shaped tensors, collected into one
error - and only when all checks passed assigns the variables.
"""

import warnings
from dataclasses import dataclass, field

import numpy as np

# Parts of a model. Backbone tensors are required; the pooler may be absent (sentence
# embedding checkpoints drop it: a fresh pooler is kept with a warning); heads follow
# `fresh_heads`.
BACKBONE = "backbone"
POOLER = "pooler"
HEAD = "head"

IDENTITY = "identity"
TRANSPOSE = "transpose"
RESHAPE = "reshape"


@dataclass(frozen=True)
class WeightEntry:
    """One checkpoint tensor and the kbert variable it fills.

    Attributes:
        name: str. The tensor's name in the checkpoint.
        variable: the `keras.Variable` to assign.
        layout: `"identity"`, `"transpose"` (a 2-D tensor stored (out, in), as torch `Linear`)
            or `"reshape"` (same values in another shape, e.g. keras-hub's per-head kernels).
        part: `"backbone"`, `"pooler"` or `"head"`.
    """

    name: str
    variable: object
    layout: str = IDENTITY
    part: str = BACKBONE


@dataclass
class LoadReport:
    """What a checkpoint load did: tensors loaded, variables left fresh, tensors not used."""

    source: str
    loaded: list = field(default_factory=list)
    fresh: list = field(default_factory=list)
    unused: list = field(default_factory=list)


class TensorSource:
    """Tensors of a checkpoint: `names` (a set) and `read(name)` -> `np.ndarray`.

    `display(name)` gives the name as the user's file spells it (used in messages).
    """

    def __init__(self, description, names, read, display=None):
        self.description = description
        self.names = set(names)
        self._read = read
        self._display = display or (lambda name: name)

    def read(self, name):
        return np.asarray(self._read(name))

    def display(self, name):
        return self._display(name)


def expected_source_shape(entry):
    """The shape the checkpoint tensor must have for `entry`'s variable."""
    shape = tuple(int(d) for d in entry.variable.shape)
    if entry.layout == TRANSPOSE:
        return shape[::-1]
    return shape


def to_variable_layout(array, entry):
    """Lays a checkpoint tensor out as the variable's value (or returns None on a shape
    mismatch)."""
    target = tuple(int(d) for d in entry.variable.shape)
    if entry.layout == TRANSPOSE:
        if array.ndim != 2 or array.shape[::-1] != target:
            return None
        return array.T
    if entry.layout == RESHAPE:
        if array.size != int(np.prod(target, dtype=np.int64)):
            return None
        return array.reshape(target)
    if tuple(array.shape) != target:
        return None
    return array


def from_variable_layout(array, entry):
    """The inverse of `to_variable_layout` for a `TRANSPOSE` or `IDENTITY` entry (export)."""
    return np.ascontiguousarray(array.T if entry.layout == TRANSPOSE else array)


def variables_by_path(model):
    """`{variable.path: variable}` of a model, failing loudly on duplicates."""
    result = {}
    for variable in model.weights:
        result.setdefault(variable.path, variable)
    return result


def find_variable(variables, path):
    """The variable at `path` (a `/`-joined layer path), also when the model sits in a name
    scope."""
    if path in variables:
        return variables[path]
    matches = [v for p, v in variables.items() if p.endswith("/" + path)]
    if len(matches) != 1:
        raise ValueError(
            f"The model has no unique variable {path!r} (found {len(matches)}). kbert's "
            "checkpoint mapping expects the layer names of kbert.models.BertBackbone."
        )
    return matches[0]


def _as_float(array, name, source):
    if array.dtype.kind not in "fiub":
        raise ValueError(
            f"{source}: tensor {name!r} has dtype {array.dtype}, expected a number type"
        )
    return array


def _short_list(names, limit=40):
    names = sorted(names)
    text = ", ".join(names[:limit])
    if len(names) > limit:
        text += f", ... ({len(names) - limit} more)"
    return text


def assign_checked(
    model_name,
    entries,
    source,
    fresh_heads=None,
    is_backbone_tensor=lambda name: True,
    ignorable=lambda name: False,
    consumed_extra=(),
):
    """Validates every tensor for `entries` against `source`, then assigns them all.

    Args:
        model_name: str. Used in messages.
        entries: list of `WeightEntry`.
        source: `TensorSource`.
        fresh_heads: `None`, `True` or `False`. `None` (default): head tensors the source has
            are loaded, absent ones stay freshly initialised with a warning. `False`: absent
            head tensors are an error. `True`: heads are not loaded at all (fresh heads).
        is_backbone_tensor: callable name -> bool. A source tensor in the backbone's namespace
            that no entry consumes is an error ("unexpected"); others (heads of another
            architecture, optimizer state) are left unused.
        ignorable: callable name -> bool. Tensors that are never reported (buffers, optimizer
            slots).
        consumed_extra: names the caller handled itself (aliases, tied copies).

    Returns:
        A `LoadReport`.

    Raises:
        ValueError: listing every missing, unexpected or mis-shaped tensor; nothing is
            assigned then.
    """
    if fresh_heads not in (None, True, False):
        raise ValueError(f"`fresh_heads` must be None, True or False. Received: {fresh_heads!r}")
    report = LoadReport(source=source.description)
    if fresh_heads:
        report.fresh.extend(e.variable.path for e in entries if e.part == HEAD)
        entries = [e for e in entries if e.part != HEAD]

    missing = {BACKBONE: [], POOLER: [], HEAD: []}
    mismatched = []
    values = []
    for entry in entries:
        if entry.name not in source.names:
            missing[entry.part].append(entry)
            continue
        array = _as_float(source.read(entry.name), entry.name, source.description)
        laid_out = to_variable_layout(array, entry)
        if laid_out is None:
            mismatched.append(
                f"{source.display(entry.name)}: shape {list(array.shape)} in the checkpoint, "
                f"expected {list(expected_source_shape(entry))} for kbert variable "
                f"{entry.variable.path} {list(entry.variable.shape)}"
                + (" (stored transposed)" if entry.layout == TRANSPOSE else "")
            )
            continue
        values.append((entry, laid_out))

    consumed = {e.name for e in entries} | set(consumed_extra)
    leftover = sorted(n for n in source.names - consumed if not ignorable(n))
    unexpected = [n for n in leftover if is_backbone_tensor(n)]
    unused = [n for n in leftover if not is_backbone_tensor(n)]

    # A pooler with one of its two tensors is damaged, not absent.
    pooler_entries = [e for e in entries if e.part == POOLER]
    partial_pooler = missing[POOLER] and len(missing[POOLER]) != len(pooler_entries)

    problems = []
    if missing[BACKBONE] or partial_pooler:
        names = [
            source.display(e.name)
            for e in missing[BACKBONE] + (missing[POOLER] if partial_pooler else [])
        ]
        problems.append(f"missing weights ({len(names)}): {_short_list(names)}")
    if missing[HEAD] and fresh_heads is False:
        names = [source.display(e.name) for e in missing[HEAD]]
        problems.append(
            f"missing head weights ({len(names)}): {_short_list(names)} (pass fresh_heads=True "
            "to start from freshly initialised heads)"
        )
    if unexpected:
        problems.append(
            f"unexpected weights ({len(unexpected)}), which the kbert architecture has no place "
            f"for: {_short_list(source.display(n) for n in unexpected)}"
        )
    if mismatched:
        problems.append(
            f"weights with the wrong shape ({len(mismatched)}):\n  " + "\n  ".join(mismatched)
        )
    if problems:
        raise ValueError(
            f"Cannot load {source.description} into {model_name}; nothing was loaded:\n- "
            + "\n- ".join(problems)
        )

    if missing[POOLER]:
        warnings.warn(
            f"{source.description} has no pooler weights "
            f"({', '.join(source.display(e.name) for e in missing[POOLER])}); the pooler keeps "
            "freshly initialised weights, so `pooled_output` is not pretrained. "
            "`sequence_output` is unaffected.",
            stacklevel=4,
        )
        report.fresh.extend(e.variable.path for e in missing[POOLER])
    if missing[HEAD]:
        hint = f" Unused tensors in the checkpoint: {_short_list(unused, 10)}." if unused else ""
        warnings.warn(
            f"{source.description} has no weights for these {model_name} head variables, which "
            f"stay freshly initialised: {_short_list(e.variable.path for e in missing[HEAD])}."
            f"{hint} Train the model before use, or pass fresh_heads=True to silence this.",
            stacklevel=4,
        )
        report.fresh.extend(e.variable.path for e in missing[HEAD])

    for entry, array in values:
        entry.variable.assign(np.asarray(array, dtype=_numpy_dtype(entry.variable)))
        report.loaded.append(entry.name)
    report.unused = unused
    return report


def _numpy_dtype(variable):
    dtype = str(variable.dtype)
    return np.float32 if dtype in ("bfloat16", "float16") else dtype


def table_row(table, model_or_class):
    """The row of a per-class table (kbert class name -> value) for a model or model class.

    The class and then its bases are looked up by name, so a subclass of `BertClassifier`
    uses the classifier's row. Returns `None` when no class in the hierarchy has a row.
    """
    cls = model_or_class if isinstance(model_or_class, type) else type(model_or_class)
    for klass in cls.__mro__:
        if klass.__name__ in table:
            return table[klass.__name__]
    return None


def attribute(model, path):
    """The object at a dotted attribute path of `model` (`"masked_lm_head.layer_norm.gamma"`).

    `None` when a step of the path is `None`: an optional head the model was built without
    (e.g. a pretrainer with no next-sentence head).
    """
    value = model
    for name in path.split("."):
        value = getattr(value, name)
        if value is None:
            return None
    return value


def head_entries(model, table):
    """`WeightEntry`s (part "head") for the variables a model has beyond its backbone.

    `table` maps kbert class names to head rows `(checkpoint_name, attribute path of the
    variable, transposed)` (one table per checkpoint format, in that format's module); rows of
    an optional head the model lacks are skipped. Head variables no row names (every head variable,
    when the class has no row) get entries whose name no checkpoint holds, so they are
    reported as absent heads.
    """
    backbone = getattr(model, "backbone", model)
    if backbone is model:
        return []
    backbone_ids = {id(v) for v in backbone.weights}
    entries = []
    for name, path, transposed in table_row(table, model) or ():
        variable = attribute(model, path)
        if variable is None:
            continue  # An optional head this model does not have.
        entries.append(WeightEntry(name, variable, TRANSPOSE if transposed else IDENTITY, HEAD))
    covered = {id(e.variable) for e in entries}
    for variable in model.weights:
        if id(variable) not in backbone_ids and id(variable) not in covered:
            entries.append(
                WeightEntry(f"<no checkpoint name: {variable.path}>", variable, IDENTITY, HEAD)
            )
            covered.add(id(variable))
    return entries


def check_config_sizes(config, shapes, names, source, config_file):
    """Compares a backbone config's sizes with the tensor shapes of a checkpoint's header.

    Called before the model is built, so a config that does not match its weights (or a
    hostile one: `hidden_size: 1e9`, `num_hidden_layers: 1e6`) fails with a clear error
    instead of allocating a model of the wrong size.

    Args:
        config: dict of `BertBackbone` arguments.
        shapes: `{tensor name: shape}` from the checkpoint's header/index (no data read).
        names: dict with the checkpoint names of `"word"`, `"position"` and `"segment"`
            embeddings (each `(rows, hidden)`), `"intermediate"`: `(name, transposed)` of
            layer 0's intermediate kernel, and `"layer"`: a regex whose group 1 is a layer index.
        source: str. The checkpoint, for messages.
        config_file: str. The config file, for messages.
    """
    import re

    shapes = {name: tuple(int(d) for d in shape) for name, shape in shapes.items()}
    problems = []

    def compare(tensor, want, meaning):
        have = shapes.get(tensor)
        if have is None:
            return  # Reported as a missing tensor by the full load.
        if have != tuple(want):
            problems.append(
                f"{tensor}: shape {list(have)} in the checkpoint, expected {list(want)} from "
                f"{meaning}"
            )

    h, v = config["hidden_dim"], config["vocabulary_size"]
    compare(names["word"], (v, h), f"vocabulary_size={v}, hidden_dim={h}")
    p, s = config["max_sequence_length"], config["num_segments"]
    compare(names["position"], (p, h), f"max_sequence_length={p}, hidden_dim={h}")
    compare(names["segment"], (s, h), f"num_segments={s}, hidden_dim={h}")
    intermediate, transposed = names["intermediate"]
    i = config["intermediate_dim"]
    compare(intermediate, (i, h) if transposed else (h, i), f"hidden_dim={h}, intermediate_dim={i}")
    pattern = re.compile(names["layer"])
    indices = {int(m.group(1)) for m in map(pattern.search, shapes) if m}
    if indices and len(indices) != config["num_layers"]:
        problems.append(
            f"the checkpoint has {len(indices)} transformer layers, the config num_layers="
            f"{config['num_layers']}"
        )
    if problems:
        raise ValueError(
            f"The config {config_file} does not match the weights of {source}; nothing was "
            "built or loaded:\n  " + "\n  ".join(problems)
        )
