"""A kill at any step of `save_to_preset` / `export_to_huggingface` leaves a consistent directory.

The kill is simulated in-process: every rename and removal the save makes (`os.replace`,
`os.rename`, `shutil.rmtree`, `os.unlink`) is counted; at step `k` the process "dies": the
call raises, and every later file-system change of the save is dropped (a dead process runs
no cleanup). Then `BertBackbone.from_preset` and `BertClassifier.from_preset` must load the
old or the new version, the same one, and no staging folder may remain inside the preset.
"""

import contextlib
import os
import shutil
import stat
import warnings

import numpy as np
import pytest

from kbert.checkpoints import atomic, export_to_huggingface
from kbert.models import BertBackbone, BertClassifier
from tests.test_case import tiny_backbone_kwargs


class _Killed(BaseException):
    pass


@contextlib.contextmanager
def _kill_at(step):
    """Makes the `step`-th file-system change raise `_Killed`, and the later ones no-ops."""
    real = {
        "replace": os.replace,
        "rename": os.rename,
        "unlink": os.unlink,
        "rmtree": shutil.rmtree,
    }
    state = {"count": 0, "dead": False}

    def wrap(name):
        def call(*args, **kwargs):
            if state["dead"]:
                return None
            state["count"] += 1
            if state["count"] == step:
                state["dead"] = True
                raise _Killed(f"killed at step {step} ({name})")
            return real[name](*args, **kwargs)

        return call

    os.replace, os.rename, os.unlink = wrap("replace"), wrap("rename"), wrap("unlink")
    shutil.rmtree = wrap("rmtree")
    try:
        yield state
    finally:
        os.replace, os.rename, os.unlink = real["replace"], real["rename"], real["unlink"]
        shutil.rmtree = real["rmtree"]


def _classifier(seed):
    backbone = BertBackbone(**tiny_backbone_kwargs())
    model = BertClassifier(backbone, num_classes=2)
    rng = np.random.default_rng(seed)
    model.set_weights([rng.normal(size=w.shape).astype("float32") for w in model.get_weights()])
    return model


def _signature(model):
    """One number that tells the old and the new weights apart."""
    backbone = getattr(model, "backbone", model)
    return float(np.asarray(backbone.embeddings.token_embedding.embeddings)[1, 0])


@pytest.mark.backend_independent  # File operations: the same steps whatever computes the weights.
def test_kill_at_every_step_of_save_to_preset_leaves_old_or_new(tmp_path):
    path = tmp_path / "preset"
    old, new = _classifier(0), _classifier(1)
    old.save_to_preset(path)
    (path / "NOTES.txt").write_text("mine")  # A user's file survives every save.
    old.save_to_preset(tmp_path / "count")
    with _kill_at(10**9) as state:
        new.save_to_preset(tmp_path / "count")
    steps = state["count"]
    assert steps >= 4
    outcomes = set()
    for step in range(1, steps + 2):
        old.save_to_preset(path)  # Start each round from the complete old version.
        with _kill_at(step):
            try:
                new.save_to_preset(path)
            except _Killed:
                pass
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            backbone = BertBackbone.from_preset(path)
            classifier = BertClassifier.from_preset(path)
        assert _signature(backbone) == _signature(classifier)
        assert _signature(backbone) in (_signature(old), _signature(new)), step
        task_weights = [np.asarray(w) for w in classifier.get_weights()]
        reference = old if _signature(backbone) == _signature(old) else new
        for a, b in zip(task_weights, reference.get_weights()):
            np.testing.assert_array_equal(a, b)
        outcomes.add("old" if reference is old else "new")
        assert (path / "NOTES.txt").read_text() == "mine"
        assert not [p.name for p in path.iterdir() if p.name.startswith(".")], step
        siblings = [p.name for p in tmp_path.iterdir() if p.name.startswith(".preset")]
        assert siblings == [], (step, siblings)
    assert outcomes == {"old", "new"}


def test_failed_save_keeps_the_old_preset_and_leaves_nothing(tmp_path):
    path = tmp_path / "preset"
    old = _classifier(0)
    old.save_to_preset(path)
    before = sorted(p.name for p in path.iterdir())

    class Unserialisable:
        pass

    broken = _classifier(1)
    broken.preset_vocabulary_path = str(tmp_path / "missing" / "vocab.txt")
    broken.get_config = lambda: {"bad": Unserialisable()}
    with pytest.raises(TypeError):
        broken.save_to_preset(path)
    assert sorted(p.name for p in path.iterdir()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["preset"]
    assert _signature(BertBackbone.from_preset(path)) == _signature(old)


def test_stale_task_weights_are_not_kept(tmp_path):
    path = tmp_path / "preset"
    _classifier(0).save_to_preset(path)
    backbone = BertBackbone(**tiny_backbone_kwargs())
    backbone.save_to_preset(path)
    assert not (path / "task.weights.h5").exists()


def test_interrupted_export_to_huggingface_leaves_old_or_new(tmp_path):
    path = tmp_path / "hf"
    old, new = _classifier(0).backbone, _classifier(1).backbone
    export_to_huggingface(old, path)
    export_to_huggingface(old, tmp_path / "count")
    with _kill_at(10**9) as state:
        export_to_huggingface(new, tmp_path / "count")
    for step in range(1, state["count"] + 2):
        export_to_huggingface(old, path)
        with _kill_at(step):
            try:
                export_to_huggingface(new, path)
            except _Killed:
                pass
        loaded = BertBackbone.from_preset(path)
        assert _signature(loaded) in (_signature(old), _signature(new))
        assert sorted(p.name for p in tmp_path.iterdir()) in (["count", "hf"],)


def test_exported_files_have_the_mode_of_new_files(tmp_path):
    export_to_huggingface(BertBackbone(**tiny_backbone_kwargs()), tmp_path / "hf")
    umask = os.umask(0)
    os.umask(umask)
    for file in (tmp_path / "hf").iterdir():
        assert stat.S_IMODE(file.stat().st_mode) == 0o666 & ~umask, file.name


def test_atomic_write_text_replaces_whole_file(tmp_path):
    target = tmp_path / "metrics.json"
    atomic.atomic_write_text(target, "old")
    with _kill_at(1):
        with pytest.raises(_Killed):
            atomic.atomic_write_text(target, "new")
    assert target.read_text() == "old"
    atomic.atomic_write_text(target, "new")
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) in (["metrics.json"],) or all(
        ".kbert-tmp-" in p.name or p.name == "metrics.json" for p in tmp_path.iterdir()
    )


def test_atomic_file_keeps_the_old_file_when_the_writer_fails(tmp_path):
    target = tmp_path / "curve.png"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="disk full"):
        with atomic.atomic_file(target) as temporary:
            temporary.write_bytes(b"half")
            raise RuntimeError("disk full")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["curve.png"]  # The temporary is gone.
    with atomic.atomic_file(target) as temporary:
        assert temporary.parent == tmp_path and temporary.name.startswith(".curve.png.")
        temporary.write_bytes(b"new")
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~_umask()
    assert [p.name for p in tmp_path.iterdir()] == ["curve.png"]


def test_atomic_file_for_an_open_writer_commits_or_aborts(tmp_path):
    target = tmp_path / "sub" / "shard.tfrecord"
    file = atomic.AtomicFile(target)  # Creates the folder.
    file.temporary.write_bytes(b"records")
    assert not target.exists()
    file.abort()
    assert not target.exists() and not file.temporary.exists()
    file = atomic.AtomicFile(target)
    file.temporary.write_bytes(b"records")
    assert file.commit() == target and target.read_bytes() == b"records"
    assert sorted(p.name for p in target.parent.iterdir()) == ["shard.tfrecord"]


def test_replace_directory_killed_at_every_step_leaves_old_or_new(tmp_path):
    target = tmp_path / "exported"
    for step in range(1, 6):
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir()
        (target / "version").write_text("old")
        source = tmp_path / f".exported.staging-{step}"
        source.mkdir()
        (source / "version").write_text("new")
        with _kill_at(step):
            with contextlib.suppress(_Killed):
                atomic.replace_directory(source, target)
        atomic.recover(target)
        assert (target / "version").read_text() in ("old", "new"), step
        # Recovered: no half-swapped sibling is left beside the target.
        assert not any(p.name.startswith(".exported.kbert") for p in tmp_path.iterdir()), step


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask
