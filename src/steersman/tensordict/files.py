"""Crash-safe file writes and guarded reads shared by every checkpoint format (tensordict
``save``, replay buffer ``dumps``, recipe checkpoints).

* :func:`write_json_atomic` writes through a temp file, fsync and ``os.replace``: a crash
  leaves the old file or the new one, never half of one.
* :func:`fsync_dir` makes a rename or a new entry of a folder durable.
* :func:`temp_writer_alive` tells whether the process that named a temp folder
  ``.<name>.<pid>.<id>.tmp`` still runs, so leftovers of killed writers can be removed.
* :class:`LoadError` is what every loader raises for a malformed saved file or folder, and
  :func:`check_inside` keeps a path read from a saved folder inside that folder (symlinks
  resolved).
"""

from __future__ import annotations

import json
import os
import stat
import uuid
from typing import Any

__all__ = ["LoadError", "check_inside", "fsync_dir", "fsync_file", "temp_writer_alive",
           "write_json_atomic"]


class LoadError(ValueError):
    """A saved file or folder is malformed, or names a path outside its folder; nothing
    was loaded.

    ``file`` is the file (or folder) at fault and ``field`` the entry in it (``None`` when
    the whole file is).
    """

    def __init__(self, message: str, *, file: Any = None, field: str | None = None) -> None:
        super().__init__(message)
        self.file = None if file is None else os.fspath(file)
        self.field = field


def check_inside(folder: str, path: str | os.PathLike, *, file: Any, field: str) -> os.stat_result:
    """``os.stat(path)``, after checking that ``path`` resolves inside ``folder``.

    ``path`` is ``folder`` joined with names that hold no separator and no ``..`` (the
    callers check that), so only a symlink can lead out: one is resolved (and ``folder``
    with it) and its target must lie inside ``folder``; a path without symlinks costs one
    ``lstat``. Raises :class:`LoadError` naming ``file`` and ``field``, or
    ``FileNotFoundError``.
    """
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        root = os.path.realpath(folder)
        real = os.path.realpath(path)
        try:
            outside = os.path.commonpath([root, real]) != root
        except ValueError:  # pragma: no cover - different drives (Windows)
            outside = True
        if outside:
            raise LoadError(f"{file}: {field} is a symlink to {real}, outside the saved folder {root}",
                            file=file, field=field)
        st = os.stat(real)
    return st


def write_json_atomic(path: str | os.PathLike, obj: Any, *, indent: int | None = None,
                      default: Any = None) -> None:
    """Writes ``obj`` as JSON to ``path`` through a temp file + fsync + ``os.replace``."""
    text = json.dumps(obj, indent=indent, default=default)  # the C encoder
    folder, name = os.path.split(os.fspath(path))
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def fsync_file(path: str | os.PathLike) -> None:
    """Flushes ``path``'s data to disk."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: str | os.PathLike) -> None:
    """Flushes a folder's entries (renames, new files) to disk; a no-op where folders
    cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def temp_writer_alive(name: str) -> bool:
    """Whether the process named in a temp folder ``.<name>.<pid>.<id>.tmp`` still runs
    (another process than this one; a name without a pid counts as dead). ``<name>`` may
    hold dots itself (``.summary.json.<pid>.<id>.tmp``): the pid is read from the right."""
    try:
        pid = int(name.rsplit(".", 3)[1])
    except (IndexError, ValueError):
        return False
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - someone else's process
        return True
    return True
