"""Checkpoints of a training run: one folder per checkpoint, written atomically.

A run keeps its checkpoints under ``<run_dir>/checkpoints/``::

    checkpoints/
      LATEST                 JSON pointer {"current": "ckpt-000007"}, replaced atomically
      ckpt-000006/           older ones (the last ``keep`` are kept)
      ckpt-000007/
        state.pt             torch.save of plain containers of tensors and Python numbers:
                             networks, targets, optimizer, scheduler, collector, RNG states
        meta.json            frames, iteration, wall time, algorithm, the resolved config
        replay_buffer/       the replay buffer, via ``ReplayBuffer.dumps`` (off-policy runs)

A checkpoint is first written to a hidden temp folder next to its final place, every file
and folder fsynced, then renamed into place; only then does ``LATEST`` move to it. A
process killed at any moment leaves the previous checkpoint loadable. Loading never
executes code: ``torch.load(weights_only=True)``, JSON and the replay buffer's own raw
tensor files.

Example:
    >>> import tempfile, torch
    >>> root = tempfile.mkdtemp()
    >>> net = torch.nn.Linear(2, 1)
    >>> path = save_checkpoint(root, {"model": net.state_dict(), "rng": rng_state()},
    ...                        meta={"frames": 256})
    >>> path.name
    'ckpt-000001'
    >>> ckpt = load_checkpoint(root)
    >>> ckpt.meta["frames"], torch.equal(ckpt.state["model"]["weight"], net.weight)
    (256, True)
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from steersman.tensordict import TensorDict, TensorDictBase
from steersman.tensordict.files import fsync_dir, fsync_file, temp_writer_alive, write_json_atomic

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "clean_dead_temps",
    "latest_checkpoint",
    "load_checkpoint",
    "load_entry",
    "rng_state",
    "save_checkpoint",
    "seed_everything",
    "set_rng_state",
]

FORMAT = "steersman.checkpoint"
VERSION = 1
POINTER = "LATEST"
_NAME = re.compile(r"^ckpt-(\d{6,})$")
_TD_TAG = "__tensordict__"


class CheckpointError(RuntimeError):
    """A folder holds no (valid) checkpoint; nothing was loaded."""


@dataclass
class Checkpoint:
    """A loaded checkpoint: ``state`` (what was saved), ``meta`` (JSON) and its ``path``."""

    state: dict[str, Any]
    meta: dict[str, Any]
    path: Path

    @property
    def replay_buffer_path(self) -> Path | None:
        """The folder to pass to ``ReplayBuffer.loads``, or None if none was saved."""
        p = self.path / "replay_buffer"
        return p if p.is_dir() else None


# ---------------------------------------------------------------- RNG states
def seed_everything(seed: int) -> None:
    """Seeds torch's, numpy's (legacy global) and Python's global RNGs.

    Example:
        >>> seed_everything(0); a = torch.rand(2)
        >>> seed_everything(0); torch.equal(a, torch.rand(2))
        True
    """
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def rng_state() -> dict[str, Any]:
    """The states of torch's, numpy's (legacy global) and Python's global RNGs, as tensors
    and Python numbers (what ``torch.load(weights_only=True)`` accepts)."""
    np_state = np.random.get_state(legacy=False)
    py_version, py_internal, py_gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "python": {"version": py_version, "internal": list(py_internal), "gauss": py_gauss},
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restores the RNG states returned by :func:`rng_state`.

    Example:
        >>> s = rng_state()
        >>> a = torch.rand(3)
        >>> set_rng_state(s)
        >>> torch.equal(a, torch.rand(3))
        True
    """
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state({
        "bit_generator": "MT19937",
        "state": {"key": n["key"].numpy().astype(np.uint32), "pos": n["pos"]},
        "has_gauss": n["has_gauss"], "gauss": n["gauss"],
    })
    p = state["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss"]))


# ---------------------------------------------------------------- plain containers
def _to_plain(obj: Any) -> Any:
    """TensorDicts as tagged dicts (``torch.load(weights_only=True)`` loads no classes)."""
    if isinstance(obj, TensorDictBase):
        return {_TD_TAG: {k: _to_plain(v) for k, v in obj.items()},
                "batch_size": list(obj.batch_size),
                "device": None if obj.device is None else str(obj.device)}
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_plain(v) for v in obj)
    return obj


def _from_plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        if _TD_TAG in obj:
            return TensorDict({k: _from_plain(v) for k, v in obj[_TD_TAG].items()},
                              batch_size=obj["batch_size"], device=obj["device"])
        return {k: _from_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_from_plain(v) for v in obj)
    return obj


# ---------------------------------------------------------------- files
def _read_json(path: Path) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing: not a checkpoint") from None
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{path} is not readable JSON ({err})") from err


def _checkpoints(root: Path) -> list[Path]:
    """The checkpoint folders under ``root``, oldest first."""
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if _NAME.match(p.name)), key=lambda p: int(p.name[5:]))


# ---------------------------------------------------------------- save / load
def save_checkpoint(
    root: str | os.PathLike,
    state: dict[str, Any],
    *,
    meta: dict[str, Any] | None = None,
    replay_buffer: Any = None,
    keep: int = 3,
) -> Path:
    """Writes a new checkpoint folder under ``root`` atomically and points ``LATEST`` at it.

    Args:
        root: the checkpoints folder (created if needed).
        state: nested dicts/lists of tensors, Python numbers, strings and TensorDicts
            (state dicts of modules, optimizers, schedulers; :func:`rng_state`...).
        meta: JSON-able facts (frames, iteration, config...); ``format``, ``version``
            and ``time`` are added.
        replay_buffer: a replay buffer to save with its ``dumps`` (or None).
        keep: how many checkpoints to keep (the oldest are removed after the write).

    Returns: the new checkpoint's folder.
    """
    if keep < 1:
        raise ValueError(f"save_checkpoint: keep must be >= 1, got {keep}")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    existing = _checkpoints(root)
    gen = int(existing[-1].name[5:]) + 1 if existing else 1
    name = f"ckpt-{gen:06d}"
    tmp = root / f".{name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        tmp.mkdir()
        torch.save(_to_plain(state), tmp / "state.pt")
        fsync_file(tmp / "state.pt")
        if replay_buffer is not None:
            replay_buffer.dumps(tmp / "replay_buffer")
        full_meta = {"format": FORMAT, "version": VERSION, "time": time.time(), **(meta or {})}
        write_json_atomic(tmp / "meta.json", full_meta, indent=1, default=str)
        for dirpath, _, _ in os.walk(tmp, topdown=False):
            fsync_dir(Path(dirpath))
        os.rename(tmp, root / name)
        fsync_dir(root)
        write_json_atomic(root / POINTER, {"format": FORMAT, "current": name})
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in _checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    clean_dead_temps(root)
    return root / name


def clean_dead_temps(root: str | os.PathLike) -> None:
    """Removes what writers killed mid-write left under ``root``: ``.ckpt-*.<pid>.<id>.tmp``
    folders and ``.LATEST.<pid>.<id>.tmp`` files whose process no longer runs."""
    root = Path(root)
    if not root.is_dir():
        return
    for p in root.iterdir():
        if p.name.startswith((".ckpt-", f".{POINTER}.")) and p.name.endswith(".tmp") and not temp_writer_alive(p.name):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    """The folder ``LATEST`` points at, or None when ``root`` holds no checkpoint yet.

    A pointer to a missing folder (it cannot happen with :func:`save_checkpoint`, but a
    user may delete folders) falls back to the newest complete folder.
    """
    root = Path(root)
    pointer = root / POINTER
    if pointer.exists():
        ptr = _read_json(pointer)
        current = ptr.get("current") if isinstance(ptr, dict) else None
        if not isinstance(current, str) or not _NAME.match(current):
            raise CheckpointError(f"{pointer} is not a checkpoint pointer: {ptr!r} (expected a ckpt-NNNNNN "
                                  "folder name inside it)")
        if (root / current / "meta.json").exists():
            return _inside(root / current, root)
    complete = [p for p in _checkpoints(root) if (p / "meta.json").exists()]
    return _inside(complete[-1], root) if complete else None


def _inside(path: Path, root: Path) -> Path:
    """``path``, if it resolves (symlinks followed) inside ``root``; else a CheckpointError."""
    if not path.resolve().is_relative_to(root.resolve()):
        raise CheckpointError(f"{path} leads outside {root} (a symlink?); checkpoints are read only from "
                              "inside their folder")
    return path


def load_entry(obj: Any, ckpt: Checkpoint, key: str) -> None:
    """Loads ``ckpt.state[key]`` into ``obj`` (``load_state_dict``; a 0-dim tensor is copied;
    ``obj=None`` with ``key="rng"`` sets the RNG states). Raises a one-line
    :class:`CheckpointError` naming the file and the entry if it is missing or does not fit."""
    where = ckpt.path / "state.pt"
    if not isinstance(ckpt.state, dict) or key not in ckpt.state:
        raise CheckpointError(f"{where} has no entry {key!r} (written by another recipe or config?)")
    value = ckpt.state[key]
    try:
        if key == "rng" and obj is None:
            set_rng_state(value)
        elif isinstance(obj, torch.Tensor):
            if not isinstance(value, torch.Tensor) or value.shape != obj.shape or value.dtype != obj.dtype:
                raise ValueError(f"expected a {obj.dtype} tensor of shape {list(obj.shape)}, got {value!r}")
            obj.copy_(value)
        else:
            obj.load_state_dict(value)
    except Exception as err:  # shape mismatches, missing keys, wrong types: a tampered or foreign file
        detail = " ".join(line.strip() for line in str(err).splitlines() if line.strip()) or type(err).__name__
        raise CheckpointError(f"{where}: entry {key!r} does not fit this run ({detail[:300]})") from None


def load_checkpoint(root: str | os.PathLike, path: str | os.PathLike | None = None) -> Checkpoint:
    """Loads the latest checkpoint under ``root`` (or the folder ``path``).

    Reads ``state.pt`` with ``torch.load(weights_only=True)`` onto the CPU and
    ``meta.json``; the replay buffer stays on disk (see
    :attr:`Checkpoint.replay_buffer_path`). Raises :class:`CheckpointError` when there is
    no checkpoint or it is not one of ours.
    """
    folder = Path(path) if path is not None else latest_checkpoint(root)
    if folder is None:
        raise CheckpointError(f"{root} holds no checkpoint (no {POINTER} and no ckpt-* folder)")
    for name in ("meta.json", "state.pt", "replay_buffer"):
        if (folder / name).exists():
            _inside(folder / name, folder)
    meta = _read_json(folder / "meta.json")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{folder / 'meta.json'} is not steersman checkpoint metadata")
    if meta.get("version") != VERSION:
        raise CheckpointError(
            f"{folder} was written by checkpoint format version {meta.get('version')}; "
            f"this steersman reads version {VERSION}"
        )
    try:
        state = torch.load(folder / "state.pt", map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{folder / 'state.pt'} is missing") from None
    except Exception as err:  # unpickling errors: corrupted or foreign file
        raise CheckpointError(f"{folder / 'state.pt'} cannot be loaded safely: {err}") from err
    return Checkpoint(state=_from_plain(state), meta=meta, path=folder)
