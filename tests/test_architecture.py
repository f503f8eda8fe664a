"""The package's layout: subpackages import each other in one direction, foreign names stay in
checkpoints.

The import graph is read from the source with `ast` (every `import` statement, including those
inside functions, which Python only runs later but which still tie modules together), so the
test needs no backend and imports nothing from kbert.
"""

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.backend_independent

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "kbert"


def _module_name(path):
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules():
    return {_module_name(path): path for path in sorted(PACKAGE_DIR.rglob("*.py"))}


def _imported_modules(module, path):
    """The kbert modules `module` imports anywhere in its file (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            imported.add(target)
            # `from kbert.checkpoints import huggingface` imports a module, not a name.
            imported.update(f"{target}.{alias.name}" for alias in node.names)
    return {name for name in imported if name == "kbert" or name.startswith("kbert.")}


def _subpackage(module):
    """`kbert.models` for `kbert.models.task`; top-level modules (`kbert.export`) are their own
    unit."""
    parts = module.split(".")
    return ".".join(parts[:2])


def subpackage_graph():
    """`{subpackage: {subpackages it imports}}` for kbert's subpackages and top-level modules."""
    modules = _modules()
    graph = {}
    for module, path in modules.items():
        if module == "kbert":
            continue  # The package's __init__ re-exports everything: it sits above all units.
        unit = _subpackage(module)
        targets = graph.setdefault(unit, set())
        for name in _imported_modules(module, path):
            # Resolve `kbert.checkpoints.huggingface` and `kbert.checkpoints.LoadReport` alike.
            while name not in modules and "." in name:
                name = name.rpartition(".")[0]
            if name in modules and name != "kbert" and _subpackage(name) != unit:
                targets.add(_subpackage(name))
    return graph


def find_cycle(graph):
    """One cycle of `graph` as a list of nodes (first == last), or None."""
    state = {}
    stack = []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return stack[stack.index(target) :] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_find_cycle_reports_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_graph_sees_imports_inside_functions(tmp_path):
    path = tmp_path / "kbert" / "models" / "x.py"
    path.parent.mkdir(parents=True)
    path.write_text("def f():\n    from ..checkpoints import huggingface\n    import kbert.text\n")
    global PACKAGE_DIR
    saved, PACKAGE_DIR = PACKAGE_DIR, tmp_path / "kbert"
    try:
        imported = _imported_modules("kbert.models.x", path)
    finally:
        PACKAGE_DIR = saved
    assert {"kbert.checkpoints", "kbert.checkpoints.huggingface", "kbert.text"} <= imported


def test_no_import_cycle_between_subpackages():
    graph = subpackage_graph()
    assert "kbert.models" in graph and "kbert.checkpoints" in graph
    cycle = find_cycle(graph)
    assert cycle is None, "Import cycle between kbert subpackages: " + " -> ".join(cycle)


def test_models_depend_on_checkpoints_not_the_reverse():
    graph = subpackage_graph()
    assert "kbert.checkpoints" in graph["kbert.models"]
    assert "kbert.models" not in graph["kbert.checkpoints"]


# What the bottom of the package may import of kbert: the layers use the backend package only,
# and the backend package nothing outside itself.
BOTTOM_UNITS = {
    "kbert.layers": ("kbert.layers", "kbert.backend"),
    "kbert.backend": ("kbert.backend",),
}


@pytest.mark.parametrize("unit", sorted(BOTTOM_UNITS))
def test_bottom_units_import_only_what_they_may(unit):
    modules = _modules()
    found = sorted(
        f"{module} imports {name}"
        for module, path in modules.items()
        if _subpackage(module) == unit
        for name in _imported_modules(module, path)
        if _resolve(name, modules) not in (None, "kbert")
        and _subpackage(_resolve(name, modules)) not in BOTTOM_UNITS[unit]
    )
    assert not found, found


# Where a deep-learning framework may be imported (besides Keras): the multi-process train step
# drives each backend's own distributed runtime.
FRAMEWORKS = ("jax", "tensorflow", "torch")
FRAMEWORK_IMPORTS_ALLOWED = ("kbert.models.multiprocess",)


def framework_imports(module, path):
    """The frameworks (`torch`, `jax`, `tensorflow`) `module`'s file imports anywhere, inside
    functions too."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.add(node.module)
    return sorted({name.split(".")[0] for name in names} & set(FRAMEWORKS))


def test_layers_and_models_import_no_framework():
    """Backend-specific code lives in `kbert.backend`: no torch, JAX or TensorFlow import under
    kbert/layers or kbert/models (the multi-process train step excepted)."""
    found = [
        f"{module} imports {', '.join(frameworks)}"
        for module, path in _modules().items()
        if module.startswith(("kbert.layers", "kbert.models"))
        and module not in FRAMEWORK_IMPORTS_ALLOWED
        for frameworks in [framework_imports(module, path)]
        if frameworks
    ]
    assert not found, found
    multiprocess = _modules()["kbert.models.multiprocess"]
    assert framework_imports("kbert.models.multiprocess", multiprocess)  # the check can see one


def test_framework_check_sees_imports_inside_functions(tmp_path):
    path = tmp_path / "dense.py"
    path.write_text("import keras\n\ndef f():\n    import torch.nn\n    from jax import numpy\n")
    assert framework_imports("kbert.layers.dense", path) == ["jax", "torch"]


# Spellings of BERT's variables in foreign checkpoints (Hugging Face `transformers`, Google's
# TF1 `modeling.py`, keras-hub): only kbert/checkpoints may hold them.
FOREIGN_NAMES = (
    "bert/encoder/layer_",
    "bert/embeddings",
    "cls/predictions",
    "cls/seq_relationship",
    "cls/squad",
    "output_weights",
    "encoder.layer.",
    "attention.self.query",
    "cls.predictions",
    "cls.seq_relationship",
    "qa_outputs.weight",
    "classifier.weight",
    "classifier.bias",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertForQuestionAnswering",
    "BertForPreTraining",
    "feedforward_intermediate_dense",
)


@pytest.mark.parametrize("foreign", FOREIGN_NAMES)
def test_foreign_names_only_in_checkpoints(foreign):
    checkpoints = PACKAGE_DIR / "checkpoints"
    holders = [
        str(path.relative_to(PACKAGE_DIR.parent))
        for path in sorted(PACKAGE_DIR.rglob("*.py"))
        if checkpoints not in path.parents and foreign in path.read_text(encoding="utf-8")
    ]
    assert not holders, f"{foreign!r} appears outside kbert/checkpoints in {holders}"
    assert any(foreign in path.read_text(encoding="utf-8") for path in checkpoints.glob("*.py"))


def test_model_classes_have_no_checkpoint_hooks():
    """Foreign formats are the checkpoints package's business: no `huggingface_*` / `google_*`
    attribute or method on any class under kbert/models."""
    hooks = []
    for path in sorted((PACKAGE_DIR / "models").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            for item in node.body:
                names = []
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names = [item.name]
                elif isinstance(item, ast.Assign):
                    names = [t.id for t in item.targets if isinstance(t, ast.Name)]
                hooks += [
                    f"{path.name}: {node.name}.{name}"
                    for name in names
                    if name.startswith(("huggingface_", "google_"))
                ]
    assert not hooks, f"Model classes with checkpoint-format hooks: {hooks}"


# ------------------------------------------------------------------------------ module level
def _resolve(name, modules):
    """The kbert module `name` refers to: itself, or the module that holds the name."""
    while name not in modules and "." in name:
        name = name.rpartition(".")[0]
    return name if name in modules else None


def _module_imports(module, path, modules):
    """`(imported module, [names taken from it])` for every kbert import of `module`'s file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _resolve(alias.name, modules)
                if target:
                    found.append((target, []))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:  # `from kbert.data import shards`
                    found.append((f"{source}.{alias.name}", []))
                else:
                    target = _resolve(source, modules)
                    if target:
                        found.append((target, [alias.name]))
    return found


def module_graph():
    """`{module: {modules of the same package it imports}}`, anywhere in its file.

    A package's `__init__` counts as a module of that package: a module that imports its own
    package's `__init__`, which imports the module back, is a cycle too.
    """
    modules = _modules()
    graph = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets = graph.setdefault(module, set())
        for target, _ in _module_imports(module, path, modules):
            target_package = (
                target if modules[target].name == "__init__.py" else target.rpartition(".")[0]
            )
            same = target_package == package or target == package
            if same and target != module and target != "kbert":
                targets.add(target)
    return graph


def test_no_import_cycle_between_modules_of_a_package():
    graph = module_graph()
    assert "kbert.data.pretraining" in graph["kbert.data.packing"]
    cycle = find_cycle(graph)
    assert cycle is None, "Import cycle between kbert modules: " + " -> ".join(cycle)


def test_module_graph_sees_a_two_module_cycle(tmp_path):
    global PACKAGE_DIR
    package = tmp_path / "kbert" / "data"
    package.mkdir(parents=True)
    (tmp_path / "kbert" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from kbert.data.b import thing\n")
    (package / "b.py").write_text("def f():\n    from kbert.data import a\n")
    saved, PACKAGE_DIR = PACKAGE_DIR, tmp_path / "kbert"
    try:
        cycle = find_cycle(module_graph())
    finally:
        PACKAGE_DIR = saved
    assert cycle in (
        ["kbert.data.a", "kbert.data.b", "kbert.data.a"],
        ["kbert.data.b", "kbert.data.a", "kbert.data.b"],
    )


def private_name_imports():
    """`(module, imported module, name)` for every private (underscore) name a kbert module takes
    from another: `from x import _name`, or `x._name` on an imported kbert module. Private
    modules themselves (`from kbert.text import _pretokenizer`) are package-internal and allowed."""
    modules = _modules()
    found = []
    for module, path in modules.items():
        imports = _module_imports(module, path, modules)
        for source, names in imports:
            for name in names:
                if name.startswith("_") and not name.startswith("__") and source != module:
                    found.append((module, source, name))
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        bound = {}  # local name -> kbert module, for `import kbert.x as y` / `from kbert import x`
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    base = node.module if not node.level else None
                    if base and f"{base}.{alias.name}" in modules:
                        bound[alias.asname or alias.name] = f"{base}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and alias.name in modules:
                        bound[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in bound
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and f"{bound[node.value.id]}.{node.attr}" not in modules
            ):
                found.append((module, bound[node.value.id], node.attr))
    return sorted(set(found))


def test_no_module_imports_another_modules_private_names():
    found = private_name_imports()
    assert not found, "Private names imported across modules: " + "; ".join(
        f"{module} takes {source}.{name}" for module, source, name in found
    )


def test_private_name_check_sees_both_spellings(tmp_path):
    global PACKAGE_DIR
    package = tmp_path / "kbert" / "data"
    package.mkdir(parents=True)
    (tmp_path / "kbert" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("_secret = 1\n")
    (package / "b.py").write_text("from kbert.data.a import _secret\n")
    (package / "c.py").write_text("from kbert.data import a\nvalue = a._secret\n")
    saved, PACKAGE_DIR = PACKAGE_DIR, tmp_path / "kbert"
    try:
        found = private_name_imports()
    finally:
        PACKAGE_DIR = saved
    assert found == [
        ("kbert.data.b", "kbert.data.a", "_secret"),
        ("kbert.data.c", "kbert.data.a", "_secret"),
    ]
