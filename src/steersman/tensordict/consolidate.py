"""Consolidation: every leaf of a TensorDict in one contiguous storage, optionally a file.

``td.consolidate()`` copies the leaves into one ``uint8`` block and returns a locked
TensorDict of views into it (one block pickles and moves in one copy). With ``filename``
the block is a memory map of that file, and a JSON description of the structure (keys,
dtypes, shapes, offsets, batch sizes, names, non-tensor values) follows the data, so
:func:`from_consolidated` rebuilds the TensorDict from the file alone. Loading reads JSON
and raw bytes: it never runs code.

File layout: ``[data, 16-byte aligned leaves][metadata JSON][8-byte JSON length][b"STMCONS1"]``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .base import TensorDictBase, _is_branch, _is_non_tensor, _unwrap
from .files import LoadError
from .unbatched import UnbatchedTensor

__all__ = ["consolidate", "from_consolidated", "is_consolidated"]

_MAGIC = b"STMCONS1"
_ALIGN = 16
_DTYPES = {str(d).replace("torch.", ""): d for d in (
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int16,
    torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128)}


def _describe(td: Any, prefix: tuple, leaves: list, offset: list) -> dict:
    """The JSON tree of ``td``; appends ``(tensor, offset)`` for every tensor leaf."""
    fields: dict = {}
    for key in td._keys_str():
        v = td._get_str(key, None)
        if isinstance(v, Tensor):
            name = str(v.dtype).replace("torch.", "")
            if name not in _DTYPES:
                raise TypeError(f"consolidate: the dtype of {prefix + (key,)!r} ({v.dtype}) is not supported")
            nbytes = v.numel() * v.element_size()
            fields[key] = {"kind": "tensor", "dtype": name, "shape": list(v.shape), "offset": offset[0],
                           "nbytes": nbytes, "unbatched": type(v) is UnbatchedTensor}
            leaves.append((v, offset[0]))
            offset[0] += -(-nbytes // _ALIGN) * _ALIGN
        elif _is_non_tensor(v):
            value = _unwrap(v)
            try:
                json.dumps(value)
            except (TypeError, ValueError):
                raise TypeError(
                    f"consolidate: the non-tensor entry {prefix + (key,)!r} ({type(value).__name__}) has no "
                    "JSON form; a consolidated TensorDict keeps non-tensor values as JSON"
                ) from None
            fields[key] = {"kind": "non_tensor", "value": value, "batch_size": list(v.batch_size)}
        elif _is_branch(v):
            fields[key] = _describe(v, prefix + (key,), leaves, offset)
        else:
            raise TypeError(f"consolidate: the entry {prefix + (key,)!r} is a {type(v).__name__}")
    return {"kind": "td", "batch_size": list(td.batch_size), "names": td.names_or_none(), "fields": fields}


def _rebuild(tree: dict, storage: Tensor, device: torch.device | None, file: Any, prefix: tuple = ()) -> Any:
    from .nontensor import NonTensorData
    from .td import TensorDict

    if not isinstance(tree, dict) or tree.get("kind") != "td" or not isinstance(tree.get("fields"), dict):
        raise LoadError(f"malformed consolidated metadata at {prefix!r}", file=file, field="fields")
    try:
        bs = torch.Size([int(x) for x in tree["batch_size"]])
    except (KeyError, TypeError, ValueError):
        raise LoadError(f"bad batch_size at {prefix!r}", file=file, field="batch_size") from None
    out = TensorDict({}, batch_size=bs, device=device)
    n = storage.numel()
    for key, node in tree["fields"].items():
        kind = node.get("kind") if isinstance(node, dict) else None
        if kind == "tensor":
            dtype = _DTYPES.get(node.get("dtype"))
            try:
                shape = [int(s) for s in node["shape"]]
                off, nbytes = int(node["offset"]), int(node["nbytes"])
            except (KeyError, TypeError, ValueError):
                raise LoadError(f"bad tensor entry {prefix + (key,)!r}", file=file, field=str(key)) from None
            numel = 1
            for s in shape:
                numel *= s
            if dtype is None or min(shape, default=0) < 0 or off < 0 or off % _ALIGN or off + nbytes > n or (
                nbytes != numel * torch.empty((), dtype=dtype).element_size()
            ):
                raise LoadError(f"tensor entry {prefix + (key,)!r} does not fit the file (dtype "
                                f"{node.get('dtype')!r}, shape {shape}, offset {off}, {nbytes} bytes of {n})",
                                file=file, field=str(key))
            view = storage[off:off + nbytes].view(dtype).view(shape)
            out._set_str(key, UnbatchedTensor(view) if node.get("unbatched") is True else view, False, False)
        elif kind == "non_tensor":
            out._set_str(key, NonTensorData(node.get("value"), batch_size=node.get("batch_size", list(bs))),
                         False, False)
        elif kind == "td":
            out._set_str(key, _rebuild(node, storage, device, file, prefix + (key,)), False, False)
        else:
            raise LoadError(f"unknown entry kind {kind!r} for {prefix + (key,)!r}", file=file, field=str(key))
    names = tree.get("names")
    if names is not None:
        out.names = names
    return out


def consolidate(td: TensorDictBase, filename: str | os.PathLike | None = None, *, num_threads: int = 0,
                device: Any = None, non_blocking: bool = False, inplace: bool = False,
                return_early: bool = False, use_buffer: bool = False, share_memory: bool = False,
                pin_memory: bool = False, metadata: bool = False) -> TensorDictBase:
    """Copies every leaf of ``td`` into one contiguous storage; returns a locked TensorDict
    of views into it (``td.consolidate(...)`` is the method form).

    Args:
        td: the container (nested containers, tensorclasses and lazy stacks are read
            through their leaves; the result is a TensorDict).
        filename: a file to hold the storage: the leaves are views of a memory map of it,
            and the structure is written after the data, for :func:`from_consolidated`.

    Keyword Args:
        num_threads: accepted; the leaves are copied by the calling thread (one copy per
            leaf into the block).
        device: the storage's device (default: ``td``'s, or CPU). With ``filename`` only
            the CPU.
        non_blocking: passed to the copies between devices.
        inplace: ``td`` itself gets the views as its leaves (and is returned, unlocked).
        return_early: ``True`` is refused: the copies here finish before the call returns.
        use_buffer: accepted; an existing file is always rewritten whole.
        share_memory: the in-memory storage is moved to shared memory (for processes).
        pin_memory: the in-memory storage is pinned (needs an accelerator).
        metadata: accepted; the structure is always written to ``filename``.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> td = TensorDict(a=torch.zeros(3), b={"c": torch.ones(3, 2)}, batch_size=[3])
        >>> c = td.consolidate()
        >>> c["b", "c"].untyped_storage().data_ptr() == c["a"].untyped_storage().data_ptr()
        True
        >>> c.is_locked, c.is_consolidated(), td.is_consolidated()
        (True, True, False)
    """
    if return_early:
        raise ValueError("consolidate(return_early=True): the copies here are synchronous, there is no "
                         "future to return; call it without return_early")
    dev = torch.device(device) if device is not None else (td.device or torch.device("cpu"))
    if filename is not None and dev.type != "cpu":
        raise ValueError(f"consolidate: a file-backed storage lives on the CPU, got device={dev}")
    leaves: list = []
    offset = [0]
    tree = _describe(td, (), leaves, offset)
    total = offset[0]
    if filename is None:
        storage = torch.empty(total, dtype=torch.uint8, device=dev)
        if pin_memory:
            if not torch.cuda.is_available():
                raise ValueError("consolidate(pin_memory=True) needs an accelerator; none is available here")
            storage = storage.pin_memory()
        if share_memory:
            storage.share_memory_()
    else:
        path = Path(filename)
        meta = json.dumps(tree).encode()
        with open(path, "wb") as f:
            f.truncate(total)
            f.seek(total)
            f.write(meta)
            f.write(len(meta).to_bytes(8, "little"))
            f.write(_MAGIC)
        storage = torch.from_file(str(path), shared=True, size=total, dtype=torch.uint8) if total else (
            torch.empty(0, dtype=torch.uint8))
    for leaf, off in leaves:
        n = leaf.numel() * leaf.element_size()
        storage[off:off + n].view(leaf.dtype).view(leaf.shape).copy_(leaf, non_blocking=non_blocking)
    out = _rebuild(tree, storage, td.device if device is None else dev, filename)
    if inplace:
        for key, value in out.items(True, True):
            if isinstance(value, Tensor):
                td.set(key, value)
        return td
    return out.lock_()


def from_consolidated(filename: str | os.PathLike) -> TensorDictBase:
    """Rebuilds a TensorDict from a file written by ``consolidate(filename=...)``.

    The entries are views into one storage read from the file (a private memory map: later
    writes to the result do not reach the file); batch sizes and names are as saved. Only
    JSON and raw bytes are read, so a file from anywhere runs no code.

    Raises:
        LoadError: (a ``ValueError``) if the file is not a consolidated TensorDict or its
            description does not fit its data.

    Example:
        >>> import tempfile, torch
        >>> from steersman.tensordict import TensorDict, from_consolidated
        >>> td = TensorDict(a=torch.zeros(3), b={"c": torch.ones(3)}, batch_size=[3])
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     _ = td.consolidate(filename=f"{tmp}/td.bin")
        ...     print(from_consolidated(f"{tmp}/td.bin")["b", "c"])
        tensor([1., 1., 1.])
    """
    path = Path(filename)
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size < 16:
            raise LoadError("too small to be a consolidated TensorDict", file=path)
        f.seek(size - 16)
        tail = f.read(16)
        if tail[8:] != _MAGIC:
            raise LoadError("not a consolidated TensorDict (no STMCONS1 trailer)", file=path)
        n_meta = int.from_bytes(tail[:8], "little")
        total = size - 16 - n_meta
        if n_meta <= 0 or total < 0:
            raise LoadError(f"metadata length {n_meta} does not fit the file ({size} bytes)", file=path)
        f.seek(total)
        try:
            tree = json.loads(f.read(n_meta))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise LoadError(f"the metadata is not JSON ({e})", file=path) from None
    storage = torch.from_file(str(path), shared=False, size=total, dtype=torch.uint8) if total else (
        torch.empty(0, dtype=torch.uint8))
    return _rebuild(tree, storage, None, path)


def is_consolidated(td: TensorDictBase) -> bool:
    """Whether every tensor leaf of ``td`` is a view of one storage (as ``consolidate`` makes)."""
    ptrs = {v.untyped_storage().data_ptr() for v in td._tensor_leaves()}
    return len(ptrs) == 1
