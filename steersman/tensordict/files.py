"""Crash-safe file writes shared by every checkpoint format (tensordict ``save``, replay
buffer ``dumps``, recipe checkpoints).

* :func:`write_json_atomic` writes through a temp file, fsync and ``os.replace``: a crash
  leaves the old file or the new one, never half of one.
* :func:`fsync_dir` makes a rename or a new entry of a folder durable.
* :func:`temp_writer_alive` tells whether the process that named a temp folder
  ``.<name>.<pid>.<id>.tmp`` still runs, so leftovers of killed writers can be removed.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

__all__ = ["fsync_dir", "fsync_file", "temp_writer_alive", "write_json_atomic"]


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
    (another process than this one; a name without a pid counts as dead)."""
    try:
        pid = int(name.split(".")[2])
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
