"""On-disk layout of replay-buffer components: JSON metadata plus raw tensor files.

A component folder holds ``meta.json`` (``{"format": "steersman.replay_buffer", "version":
1, "type": <class name>, ...}``) and, when it has tensors, a ``tensors/`` folder written
with :func:`steersman.tensordict.save`. Nothing is pickled, so loading a folder never runs
code from it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from steersman.tensordict import LoadError, TensorDictBase, load, save
from steersman.tensordict.files import check_inside, write_json_atomic

FORMAT = "steersman.replay_buffer"
VERSION = 1
META = "meta.json"


class CheckpointError(LoadError):
    """A folder is not a (valid) replay-buffer checkpoint; nothing was loaded.

    A :class:`~steersman.tensordict.LoadError` (so a ``ValueError``); a damaged tensor
    folder inside the checkpoint raises this too, chained to the ``LoadError`` it caused.
    """


def inside(root: Path, path: Path) -> Path:
    """``path`` after checking that it exists and resolves inside ``root`` (symlinks
    resolved); ``path`` is ``root`` joined with plain names, each checked in turn."""
    try:
        check_inside(str(root), path, file=path, field=path.name)
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing: not a (complete) replay-buffer checkpoint",
                              file=path) from None
    except LoadError as err:
        raise CheckpointError(str(err), file=path) from None
    return path


def read_json(path: Path, root: Path | None = None) -> Any:
    """The JSON in ``path`` (inside ``root`` when given); any failure is a CheckpointError."""
    if root is not None:
        inside(root, path)
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing: not a replay-buffer checkpoint", file=path) from None
    except (OSError, ValueError, RecursionError) as err:  # unreadable, not UTF-8, not JSON, too deep
        raise CheckpointError(f"{path} is not readable JSON ({type(err).__name__}: {err})", file=path) from None


def write_component(path: Any, type_name: str, meta: dict, tensors: TensorDictBase | None = None) -> None:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if tensors is not None:
        save(tensors, path / "tensors")
    write_json_atomic(path / META, {"format": FORMAT, "version": VERSION, "type": type_name, **meta,
                             "has_tensors": tensors is not None})


def read_component(path: Any, expected: str | tuple[str, ...] | None,
                   root: Path | None = None) -> tuple[dict, TensorDictBase | None]:
    """(metadata, tensors mapped from disk) of a component folder; validates the header.

    Every path read resolves inside ``root`` (default: the component folder itself).
    """
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path} is not a folder: not a replay-buffer checkpoint", file=path)
    root = path if root is None else root
    inside(root, path)
    meta = read_json(path / META, root)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{path / META} is not replay-buffer metadata (format {FORMAT!r} expected)",
                              file=path / META, field="format")
    if meta.get("version") != VERSION:
        raise CheckpointError(f"{path} has checkpoint version {_short(meta.get('version'))}; this build reads "
                              f"{VERSION}", file=path / META, field="version")
    if expected is not None:
        names = (expected,) if isinstance(expected, str) else expected
        if meta.get("type") not in names:
            raise CheckpointError(
                f"{path} holds a {_short(meta.get('type'))}, which cannot be loaded into a {names[0]}",
                file=path / META, field="type")
    tensors = None
    has = meta.get("has_tensors", False)
    if type(has) is not bool:
        raise CheckpointError(f"{path / META}: metadata field 'has_tensors' has an unexpected value {_short(has)}",
                              file=path / META, field="has_tensors")
    if has:
        try:
            tensors = load(inside(root, path / "tensors"), mmap=True)
        except (OSError, LoadError) as err:
            raise CheckpointError(f"the tensor files under {path / 'tensors'} are damaged: {err}",
                                  file=getattr(err, "file", None) or path / "tensors",
                                  field=getattr(err, "field", None)) from err
    return meta, tensors


def get_field(meta: dict, key: str, kind: type | tuple[type, ...], path: Any) -> Any:
    """``meta[key]``, which must be a ``kind`` (never a bool for a number; a float is finite)."""
    try:
        value = meta[key]
    except KeyError:
        raise CheckpointError(f"{path}: metadata field {key!r} is missing", file=path, field=key) from None
    numeric = kind in (int, float, (int, float))
    if (not isinstance(value, kind) or (isinstance(value, bool) and numeric)
            or (isinstance(value, float) and not math.isfinite(value))):
        raise CheckpointError(f"{path}: metadata field {key!r} has an unexpected value {_short(value)}",
                              file=path, field=key)
    return value


def get_cursor(meta: dict, key: str, size: int, path: Any) -> int | None:
    """``meta[key]``: ``None`` or an int slot in ``[0, size)``."""
    value = meta.get(key)
    if value is not None and (type(value) is not int or not 0 <= value < size):
        raise CheckpointError(f"{path}: metadata field {key!r} is {_short(value)}, not null or a slot below {size}",
                              file=path, field=key)
    return value


def prepared(path: Any, fn: Any, *args: Any) -> Any:
    """``fn(*args)`` (a component's ``_prepare_load``), with any error it raises on data it
    did not expect turned into a CheckpointError naming the folder: the checks in the
    components name fields; this catches what they did not foresee."""
    try:
        return fn(*args)
    except CheckpointError:
        raise
    except (LoadError, KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError,
            RecursionError) as err:
        raise CheckpointError(f"{path}: the checkpoint does not fit this component "
                              f"({type(err).__name__}: {err})", file=path) from err


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
