"""On-disk layout of replay-buffer components: JSON metadata plus raw tensor files.

A component folder holds ``meta.json`` (``{"format": "steersman.replay_buffer", "version":
1, "type": <class name>, ...}``) and, when it has tensors, a ``tensors/`` folder written
with :func:`steersman.tensordict.save`. Nothing is pickled, so loading a folder never runs
code from it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from steersman.tensordict import TensorDictBase, load, save
from steersman.tensordict.files import write_json_atomic

FORMAT = "steersman.replay_buffer"
VERSION = 1
META = "meta.json"


class CheckpointError(ValueError):
    """A folder is not a (valid) replay-buffer checkpoint; nothing was loaded."""


def read_json(path: Path) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing: not a replay-buffer checkpoint") from None
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{path} is not readable JSON ({err})") from err


def write_component(path: Any, type_name: str, meta: dict, tensors: TensorDictBase | None = None) -> None:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if tensors is not None:
        save(tensors, path / "tensors")
    write_json_atomic(path / META, {"format": FORMAT, "version": VERSION, "type": type_name, **meta,
                             "has_tensors": tensors is not None})


def read_component(path: Any, expected: str | tuple[str, ...] | None) -> tuple[dict, TensorDictBase | None]:
    """(metadata, tensors mapped from disk) of a component folder; validates the header."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path} is not a folder: not a replay-buffer checkpoint")
    meta = read_json(path / META)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{path / META} is not replay-buffer metadata (format {FORMAT!r} expected)")
    if meta.get("version") != VERSION:
        raise CheckpointError(f"{path} has checkpoint version {meta.get('version')!r}; this build reads {VERSION}")
    if expected is not None:
        names = (expected,) if isinstance(expected, str) else expected
        if meta.get("type") not in names:
            raise CheckpointError(
                f"{path} holds a {meta.get('type')!r}, which cannot be loaded into a {names[0]}"
            )
    tensors = None
    if meta.get("has_tensors"):
        try:
            tensors = load(path / "tensors", mmap=True)
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise CheckpointError(f"the tensor files under {path / 'tensors'} are damaged: {err}") from err
    return meta, tensors


def get_field(meta: dict, key: str, kind: type | tuple[type, ...], path: Any) -> Any:
    try:
        value = meta[key]
    except KeyError:
        raise CheckpointError(f"{path}: metadata field {key!r} is missing") from None
    if not isinstance(value, kind) or isinstance(value, bool) and kind in (int, float, (int, float)):
        raise CheckpointError(f"{path}: metadata field {key!r} has an unexpected value {value!r}")
    return value
