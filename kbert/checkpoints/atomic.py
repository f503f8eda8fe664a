"""Atomic replacement of files and whole directories: kbert's one implementation, used by
every writer (presets, exports, training backups, run records, LoRA weights, data shards).

A kill at any instant of a save leaves either the previous complete version or the new
complete version under the target name, never a mix, and no staging leftovers inside it.

Directories (`atomic_directory`) are written in four steps, each a single rename or removal:

1. the new version is written into `.<name>.kbert-partial-<pid>` beside the target
   (never trusted: a kill here leaves the old version untouched);
2. it is renamed to `.<name>.kbert-new` - from now on it is a complete version;
3. the old target (if any) is renamed to `.<name>.kbert-old`;
4. `.<name>.kbert-new` is renamed to the target, and `.<name>.kbert-old` is removed.

`recover(path)` (called by every loader and by the next save) completes or rolls back an
interrupted swap: a target missing while `.kbert-new` exists is the new version, rolled
forward; a `.kbert-old` beside a present target is removed; partial directories of dead
processes are removed. Two concurrent saves to the same target are not supported.

Files the caller does not write again (e.g. a README a user put into a preset directory) are
carried over from the old version into the new one (hard links when possible).
"""

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

_PARTIAL = ".kbert-partial-"
_NEW = ".kbert-new"
_OLD = ".kbert-old"


def _sibling(path, suffix):
    return path.parent / f".{path.name}{suffix}"


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def _fsync_directory(path):
    if os.name != "posix":
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_tree(path):
    for root, _, files in os.walk(path):
        for name in files:
            try:
                with open(os.path.join(root, name), "rb+") as file:
                    os.fsync(file.fileno())
            except OSError:
                pass
        _fsync_directory(root)


def recover(path):
    """Completes or rolls back an interrupted `atomic_directory` swap of `path`.

    Returns the directory that holds the complete version to read (normally `path`; the
    `.kbert-new` sibling when it cannot be renamed, e.g. on a read-only file system), or
    `path` unchanged when there is nothing to recover.
    """
    path = Path(path)
    new, old = _sibling(path, _NEW), _sibling(path, _OLD)
    try:
        if new.is_dir():
            if not path.exists():
                os.replace(new, path)  # Killed between steps 3 and 4: roll forward.
            else:
                # Killed between steps 2 and 3: the new version is complete; finish the swap.
                if old.exists():
                    shutil.rmtree(old)
                os.replace(path, old)
                os.replace(new, path)
        if old.exists() and path.exists():
            shutil.rmtree(old, ignore_errors=True)
        elif old.is_dir() and not path.exists():
            os.replace(old, path)  # Cannot happen with the order above; be safe anyway.
        if path.parent.is_dir():
            for leftover in path.parent.glob(f".{path.name}{_PARTIAL}*"):
                pid = leftover.name.rsplit("-", 1)[-1]
                if not (pid.isdigit() and int(pid) != os.getpid() and _pid_alive(int(pid))):
                    shutil.rmtree(leftover, ignore_errors=True)
    except OSError:
        if not path.exists() and new.is_dir():
            return new
    return path


@contextlib.contextmanager
def atomic_directory(path, owned_files=()):
    """Context manager: write a directory's new version into the yielded staging `Path`.

    On a clean exit the staging directory replaces `path` atomically (see the module
    docstring); on an exception it is removed and `path` stays as it was.

    Args:
        path: str or path. The target directory.
        owned_files: names of files the caller owns: left out of the new version unless
            written again (e.g. a stale `task.weights.h5`). Other files of the old version
            that the new one does not write (a user's notes) are carried over.
    """
    path = Path(path).absolute()
    if path.exists() and not path.is_dir():
        raise ValueError(f"Cannot write a directory at {path}: a file of that name exists.")
    path.parent.mkdir(parents=True, exist_ok=True)
    recover(path)
    # Named after our pid, so that `recover` in another process knows whether it is alive.
    staging = _sibling(path, f"{_PARTIAL}{os.getpid()}")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    try:
        yield staging
        if path.is_dir():
            for item in path.iterdir():
                target = staging / item.name
                if item.name in owned_files or target.exists() or target.is_symlink():
                    continue
                if item.is_dir():
                    shutil.copytree(item, target, symlinks=True)
                else:
                    try:
                        os.link(item, target)
                    except OSError:
                        shutil.copy2(item, target)
        replace_directory(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def replace_directory(source, path):
    """Moves the complete directory `source` to `path`, replacing what is there atomically.

    Steps 2 to 4 of the module docstring: `source` becomes `.<name>.kbert-new`, the old
    `path` `.<name>.kbert-old`, then the new version takes the name and the old one is
    removed; a kill in between is completed or rolled back by `recover` (call it on `path`
    before writing `source`). `source` should be on the same file system as `path` (a
    sibling), so that each step is one rename.
    """
    source, path = Path(source), Path(path).absolute()
    os.chmod(source, 0o777 & ~_umask())
    _fsync_tree(source)
    new, old = _sibling(path, _NEW), _sibling(path, _OLD)
    if new.exists():
        shutil.rmtree(new)
    os.replace(source, new)  # Step 2: complete.
    _fsync_directory(path.parent)
    if path.exists():
        if old.exists():
            shutil.rmtree(old)
        os.replace(path, old)  # Step 3.
    os.replace(new, path)  # Step 4.
    _fsync_directory(path.parent)
    if old.exists():
        shutil.rmtree(old, ignore_errors=True)


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


class AtomicFile:
    """The new version of the file `path`, written at `temporary` (a sibling) until `commit`.

    For writers that want a path rather than a context (a `tf.io.TFRecordWriter` kept open
    across calls); otherwise use `atomic_file`. `commit()` flushes the temporary file to disk,
    gives it the usual mode of a new file (0666 minus the umask) and renames it over `path`
    (one rename: a kill leaves the old or the new complete file); `abort()` removes it and
    leaves `path` as it was.

    Args:
        path: str or path. The target file; its folder is created if missing.
    """

    def __init__(self, path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(
            dir=self.path.parent, prefix=f".{self.path.name}.kbert-tmp-"
        )
        os.close(fd)
        self.temporary = Path(temporary)

    def commit(self):
        """Replaces `path` with the temporary file; returns `path`."""
        try:
            replace_file(self.temporary, self.path)
        except BaseException:
            self.abort()
            raise
        return self.path

    def abort(self):
        """Removes the temporary file; `path` stays as it was."""
        with contextlib.suppress(OSError):
            os.unlink(self.temporary)


@contextlib.contextmanager
def atomic_file(path):
    """Context manager: write the new version of the file `path` at the yielded `Path`.

    The yielded path is a temporary sibling (an empty file); on a clean exit it replaces
    `path` in one rename (see `AtomicFile.commit`), on an exception it is removed and `path`
    stays as it was. Every kbert writer of a single file goes through this.

    Example:
    >>> with atomic_file("metrics.json") as temporary:
    ...     size = temporary.write_text('{"accuracy": 0.9}')
    >>> Path("metrics.json").read_text()
    '{"accuracy": 0.9}'
    """
    file = AtomicFile(path)
    try:
        yield file.temporary
    except BaseException:
        file.abort()
        raise
    file.commit()


def replace_file(source, path):
    """Renames the complete file `source` over `path` durably: `source` is flushed to disk and
    given the usual mode of a new file first, the folder's entry after."""
    with open(source, "rb+") as file:
        os.fsync(file.fileno())
    os.chmod(source, 0o666 & ~_umask())
    os.replace(source, path)
    _fsync_directory(Path(path).parent)
    return Path(path)


def atomic_write_bytes(path, data):
    """Writes `data` to the file `path` through a temporary sibling and one rename.

    The file gets the usual mode of a new file (0666 minus the umask), whatever the
    temporary file's mode was.
    """
    with atomic_file(path) as temporary:
        temporary.write_bytes(data)
    return Path(path)


def atomic_write_text(path, text, encoding="utf-8"):
    """`atomic_write_bytes` for text."""
    return atomic_write_bytes(path, text.encode(encoding))


def fix_file_modes(directory):
    """Gives every file under `directory` the mode of a new file (0666 minus the umask).

    Some writers (`tempfile`, `safetensors`) create files with mode 0600.
    """
    mode = 0o666 & ~_umask()
    for root, _, files in os.walk(directory):
        for name in files:
            os.chmod(os.path.join(root, name), mode)
