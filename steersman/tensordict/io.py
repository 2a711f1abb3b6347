"""Saving, loading and memory-mapping containers.

On disk a container is a folder: ``meta.json`` (structure, batch size, dtypes,
shapes, JSON-encodable non-tensor values) plus one raw ``<key>.memmap`` file per
tensor and one sub-folder per nested container. Loading reads JSON and raw bytes
only, so it never executes code.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ._utils import NO_DEFAULT
from .base import TensorDictBase, _is_branch, _is_non_tensor
from .files import write_json_atomic
from .lazy import LazyStackedTensorDict
from .memmap import MemoryMappedTensor, _copy_to_file, _load_tensor_file, save_tensor_file
from .nontensor import MetaData, NonTensorData, NonTensorStack
from .td import TensorDict

__all__ = ["save", "load", "load_memmap", "memmap_into"]

_META = "meta.json"
_FORMAT = 1


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


_DTYPES: dict[str, torch.dtype] = {}  # name -> dtype, filled as names are met


def _dtype_from_name(name: str) -> torch.dtype:
    dtype = _DTYPES.get(name)
    if dtype is None:
        dtype = getattr(torch, name, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown dtype {name!r} in saved metadata")
        _DTYPES[name] = dtype
    return dtype


def _check_key(key: str) -> None:
    if not key or "/" in key or "\\" in key or key.startswith(".") or key == _META:
        raise ValueError(
            f"key {key!r} cannot be saved as a file name (no '/', '\\', leading '.', or {_META!r})"
        )


def _write_json_atomic(path: str, obj: Any, fsync: bool) -> None:
    """Writes JSON. With ``fsync`` (``save``, a checkpoint) it goes through a temp file,
    fsync and rename, so a crash leaves the old or the new file, never half of one; a
    memory-mapped working copy (``memmap``) is written in place."""
    text = json.dumps(obj)  # the C encoder; json.dump(obj, f) encodes in Python
    if not fsync:  # a memory-mapped working copy: no rename, which is slow on some filesystems
        # and no O_TRUNC either: truncating a file that holds data costs milliseconds on
        # ext4 (it flushes); overwrite in place, then cut to the new length
        data = text.encode()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o666)
        try:
            os.write(fd, data)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)
        return
    write_json_atomic(path, obj)


def _json_value(key: Any, value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"non-tensor entry {key!r} holds a {type(value).__name__}, which is not JSON-encodable; "
            "only JSON values can be saved (loading never unpickles code)"
        ) from err
    return value


def _container_meta(td: TensorDictBase) -> dict[str, Any]:
    return {
        "batch_size": list(td.batch_size),
        "device": None if td.device is None else str(td.device),
        "names": td.names_or_none() if hasattr(td, "names_or_none") else None,
    }


def _write(td: TensorDictBase, path: str, mode: str, existsok: bool) -> tuple[dict, dict]:
    """Writes ``td`` under the folder ``path``; returns (metadata, {key: new leaf}) for
    memmap modes.

    ``mode``: ``"save"`` (atomic raw files), ``"memmap"`` (copy into mapped files) or
    ``"like"`` (mapped files of the right shape, zero-filled).
    """
    if getattr(type(td), "_is_lazy", False):
        return _write_lazy(td, path, mode, existsok)
    os.makedirs(path, exist_ok=True)
    folder = os.path.join(path, "")
    meta: dict[str, Any] = {"_type": "TensorDict", "_format": _FORMAT, **_container_meta(td), "entries": {}}
    new_leaves: dict[str, Any] = {}
    for key in td._keys_str():
        value = td._get_str(key, NO_DEFAULT)
        _check_key(key)
        if isinstance(value, Tensor):
            name = f"{key}.memmap"
            file = folder + name
            entry = {"kind": "tensor", "dtype": _dtype_name(value.dtype), "shape": list(value.shape),
                     "file": name}
            if mode == "save":
                save_tensor_file(file, value)
            else:
                src = value.detach()
                if src.device.type != "cpu":
                    src = src.cpu()
                if mode == "memmap" and type(src) is Tensor and src.layout is torch.strided and src.numel():
                    new_leaves[key] = _copy_to_file(src, file)  # the common case, in fewer system calls
                else:
                    new_leaves[key] = MemoryMappedTensor.from_tensor(
                        src, filename=file, existsok=True, copy_data=mode == "memmap", copy_existing=True
                    )
            meta["entries"][key] = entry
        elif _is_non_tensor(value):
            if getattr(type(value), "_is_stack", False):
                meta["entries"][key] = {"kind": "non_tensor_stack", "data": _json_value(key, value.tolist()),
                                        "batch_size": list(value.batch_size)}
            else:
                meta["entries"][key] = {"kind": "non_tensor", "data": _json_value(key, value.data),
                                        "batch_size": list(value.batch_size),
                                        "metadata": type(value).__name__ == "MetaData"}
            new_leaves[key] = value
        elif _is_branch(value):
            sub_meta, sub_leaves = _write(value, folder + key, mode, existsok)
            meta["entries"][key] = {"kind": "container", "dir": key, "meta": sub_meta}
            if mode != "save":
                new_leaves[key] = _rebuild(value, sub_leaves)
        else:
            raise TypeError(f"cannot save entry {key!r} of type {type(value).__name__}")
    return meta, new_leaves


def _write_root(td: TensorDictBase, path: str, mode: str, existsok: bool) -> dict:
    """Writes the tree's files, then one ``meta.json`` for the whole tree (last)."""
    meta, leaves = _write(td, path, mode, existsok)
    _write_json_atomic(os.path.join(path, _META), meta, fsync=mode == "save")
    return leaves


def _write_lazy(td: Any, path: str, mode: str, existsok: bool) -> tuple[dict, dict]:
    os.makedirs(path, exist_ok=True)
    members = []
    metas = []
    for i, member in enumerate(td.tensordicts):
        member_meta, leaves = _write(member, os.path.join(path, str(i)), mode, existsok)
        metas.append(member_meta)
        members.append(_rebuild(member, leaves) if mode != "save" else None)
    meta = {"_type": "LazyStackedTensorDict", "_format": _FORMAT, "stack_dim": td.stack_dim,
            "n": len(td.tensordicts), **_container_meta(td), "members": metas}
    return meta, {"__lazy_members__": members}


def _rebuild(template: TensorDictBase, leaves: dict) -> TensorDictBase:
    """A container like ``template`` whose entries are ``leaves``."""
    if "__lazy_members__" in leaves:
        return LazyStackedTensorDict(*leaves["__lazy_members__"], stack_dim=template.stack_dim)
    return TensorDict._new_unsafe(leaves, template.batch_size, template.device if _all_cpu(leaves) else None,
                                  template.names_or_none())


def _all_cpu(leaves: dict) -> bool:
    return all(not isinstance(v, Tensor) or v.device.type == "cpu" for v in leaves.values())


def save(td: TensorDictBase, prefix: Any) -> None:
    """Writes ``td`` under the folder ``prefix`` (metadata as JSON, tensors as raw files).

    Example:
        >>> import tempfile, torch
        >>> from steersman import TensorDict
        >>> from steersman.tensordict import save, load
        >>> d = tempfile.mkdtemp()
        >>> save(TensorDict({"a": torch.arange(3)}, [3]), d)
        >>> load(d)["a"].tolist()
        [0, 1, 2]
    """
    if hasattr(td, "_tensordict") and not isinstance(td, TensorDictBase):  # tensorclass
        td = td._tensordict
    _write_root(td, os.fspath(prefix), "save", True)


def memmap_into(td: TensorDictBase, prefix: Any, *, inplace: bool, existsok: bool, copy_data: bool) -> TensorDictBase:
    """Memory-maps every leaf of ``td`` (files under ``prefix``, or shared memory if ``None``)."""
    if prefix is None:
        def fn(x: Tensor) -> Tensor:
            src = x.detach().cpu() if x.device.type != "cpu" else x.detach()
            return MemoryMappedTensor.from_tensor(src, filename=None, copy_data=copy_data)

        if inplace:
            _replace_leaves(td, fn)
            return td.lock_()
        out = td._map(fn, (), device=torch.device("cpu") if td.device is not None else NO_DEFAULT)
        return out.lock_()
    prefix = os.fspath(prefix)
    if not existsok and os.path.exists(os.path.join(prefix, _META)):
        raise FileExistsError(f"{prefix} already holds a saved TensorDict (pass existsok=True to overwrite)")
    leaves = _write_root(td, prefix, "memmap" if copy_data else "like", existsok)
    out = _rebuild(td, leaves)
    if inplace:
        _replace_from(td, out)
        return td.lock_()
    return out.lock_()


def _replace_leaves(td: TensorDictBase, fn: Any) -> None:
    if getattr(type(td), "_is_lazy", False):  # a lazy stack's leaves live in its members
        for member in td.tensordicts:
            _replace_leaves(member, fn)
        return
    for key in list(td._keys_str()):
        v = td._get_str(key, NO_DEFAULT)
        if isinstance(v, Tensor):
            td._tensordict[key] = fn(v) if hasattr(td, "_tensordict") else None
        elif _is_branch(v):
            _replace_leaves(v, fn)


def _replace_from(td: TensorDictBase, src: TensorDictBase) -> None:
    if getattr(type(td), "_is_lazy", False):
        for a, b in zip(td.tensordicts, src.tensordicts):
            _replace_from(a, b)
        return
    for key in list(td._keys_str()):
        v = td._get_str(key, NO_DEFAULT)
        s = src._get_str(key, NO_DEFAULT)
        if isinstance(v, Tensor):
            td._tensordict[key] = s
        elif _is_branch(v):
            _replace_from(v, s)
    if td.device is not None and td.device.type != "cpu":
        td._device = torch.device("cpu")


def load(prefix: Any, *, mmap: bool = False) -> TensorDictBase:
    """Loads a container saved with :func:`save` or ``memmap``.

    ``mmap=True`` maps the files (writes go to disk); ``mmap=False`` reads them into memory.
    Only JSON and raw tensor bytes are read: loading never executes code.
    """
    path = os.fspath(prefix)
    meta_file = os.path.join(path, _META)
    try:
        with open(meta_file) as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"no saved TensorDict at {path} ({_META} is missing)") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{meta_file} is not valid JSON (corrupted or not a saved TensorDict): {err}") from None
    if not isinstance(meta, dict) or meta.get("_type") not in ("TensorDict", "LazyStackedTensorDict"):
        kind = meta.get("_type") if isinstance(meta, dict) else type(meta).__name__
        raise ValueError(f"{meta_file}: unknown container type {kind!r} (not a saved steersman TensorDict)")
    if meta.get("_format") != _FORMAT:
        raise ValueError(f"{meta_file} has format {meta.get('_format')!r}; this steersman reads format {_FORMAT}")
    out = _build(meta, path, mmap)
    if mmap:
        out.lock_()
    return out


def _build(meta: dict, path: str, mmap: bool) -> TensorDictBase:
    kind = meta.get("_type")
    if kind == "LazyStackedTensorDict":
        members = [_build(m, os.path.join(path, str(i)), mmap) for i, m in enumerate(meta["members"])]
        return LazyStackedTensorDict(*members, stack_dim=meta["stack_dim"])
    if kind != "TensorDict":
        raise ValueError(f"{path}: unknown container type {kind!r} in the saved metadata")
    bs = torch.Size(meta["batch_size"])
    entries: dict[str, Any] = {}
    folder = os.path.join(path, "")  # with its trailing separator (none for "")
    for key, entry in meta["entries"].items():
        _check_key(key)
        k = entry["kind"]
        if k == "tensor":
            file = entry["file"]
            _check_key(file)
            entries[key] = _load_tensor_file(folder + file, _dtype_from_name(entry["dtype"]),
                                             _shape_from_json(entry["shape"]), mmap)
        elif k == "non_tensor":
            cls = MetaData if entry.get("metadata") else NonTensorData
            entries[key] = cls(entry["data"], batch_size=entry["batch_size"])
        elif k == "non_tensor_stack":
            arr = np.empty(tuple(entry["batch_size"]), dtype=object)
            _fill(arr, entry["data"])
            entries[key] = NonTensorStack(arr)
        elif k == "container":
            entries[key] = _build(entry["meta"], os.path.join(path, entry["dir"]), mmap)
        else:
            raise ValueError(f"unknown entry kind {k!r} for key {key!r} in {path}")
    device = meta.get("device")
    out = TensorDict._new_unsafe(entries, bs, torch.device("cpu") if device is not None else None,
                                 meta.get("names"))
    if device is not None and torch.device(device).type != "cpu":
        out = out.to(device)
    return out


def _shape_from_json(shape: Any) -> torch.Size:
    if type(shape) is list and all(type(s) is int and s >= 0 for s in shape):
        return torch.Size(shape)
    raise ValueError(f"invalid tensor shape {shape!r} in saved metadata")


def _fill(arr: np.ndarray, data: Any) -> None:
    if arr.ndim == 0:
        arr[()] = data
        return
    for i, x in enumerate(data):
        if arr.ndim == 1:
            arr[i] = x
        else:
            _fill(arr[i], x)


def load_memmap(prefix: Any) -> TensorDictBase:
    """Opens a saved container with every tensor memory-mapped (see :func:`load`)."""
    return load(prefix, mmap=True)
