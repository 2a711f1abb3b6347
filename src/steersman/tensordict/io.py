"""Saving, loading and memory-mapping containers.

On disk a container is a folder: ``meta.json`` (structure, batch size, dtypes,
shapes, JSON-encodable non-tensor values) plus one raw ``<key>.memmap`` file per
tensor and one sub-folder per nested container. Loading reads JSON and raw bytes
only, so it never executes code.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ._utils import NO_DEFAULT, write_into_out
from .base import TensorDictBase, _is_branch, _is_non_tensor
from .files import LoadError, check_inside, write_json_atomic
from .lazy import LazyStackedTensorDict
from .memmap import MemoryMappedTensor, _copy_to_file, _open_sized, save_tensor_file
from .nontensor import MetaData, NonTensorData, NonTensorStack
from .td import TensorDict

__all__ = ["LoadError", "save", "load", "load_memmap", "memmap_into"]

_META = "meta.json"
_FORMAT = 1


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# the dtypes a saved tensor may have (a name in meta.json is looked up here, never with getattr)
_DTYPES: dict[str, torch.dtype] = {
    _dtype_name(d): d for d in vars(torch).values()
    if isinstance(d, torch.dtype) and not _dtype_name(d).startswith(("qint", "quint"))
}


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


def save(data: TensorDictBase, prefix: Any, copy_existing: bool = False, *, num_threads: int = 0,
         return_early: bool = False, share_non_tensor: bool = False, robust_key: bool | None = True,
         archive: bool | None = None, compression: Any = None, atomic: bool = False) -> None:
    """Writes ``data`` under the folder ``prefix`` (metadata as JSON, tensors as raw files).

    ``atomic=True`` writes a sibling folder and renames it into place, so an error during
    the write leaves ``prefix`` as it was. ``copy_existing``, ``num_threads`` and
    ``return_early`` have no effect (every leaf is always copied into ``prefix``, by the
    calling thread, before returning). Refused with the reason: ``archive`` (a ``.tdz``
    file), ``compression`` (archives only), ``share_non_tensor=True`` and
    ``robust_key=False`` (steersman writes one layout).

    Example:
        >>> import tempfile, torch
        >>> from steersman import TensorDict
        >>> from steersman.tensordict import save, load
        >>> d = tempfile.mkdtemp()
        >>> save(TensorDict({"a": torch.arange(3)}, [3]), d)
        >>> load(d)["a"].tolist()
        [0, 1, 2]
    """
    refused = {"archive": (archive is True or (archive is None and str(prefix).endswith(".tdz")),
                           "steersman saves folders, not .tdz archives"),
               "compression": (compression is not None, "only tensordict's .tdz archives are compressed"),
               "share_non_tensor": (share_non_tensor, "non-tensor entries are saved as JSON values"),
               "robust_key": (robust_key is False, "steersman writes one file layout")}
    for name, (bad, why) in refused.items():
        if bad:
            raise ValueError(f"save: {name} is not supported: {why}")
    td = data
    if hasattr(td, "_tensordict") and not isinstance(td, TensorDictBase):  # tensorclass
        td = td._tensordict
    path = os.path.abspath(os.fspath(prefix))
    if not atomic:
        _write_root(td, path, "save", True)
        return
    parent, name = os.path.split(path)
    tmp = os.path.join(parent, f".{name}.saving-{os.getpid()}")
    old = os.path.join(parent, f".{name}.old-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _write_root(td, tmp, "save", True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if os.path.exists(path):
        os.rename(path, old)
    os.rename(tmp, path)
    shutil.rmtree(old, ignore_errors=True)


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


def _load(prefix: Any, *, mmap: bool = False) -> TensorDictBase:
    """Loads a container saved with :func:`save` or ``memmap``.

    ``mmap=True`` maps the files (writes go to disk); ``mmap=False`` reads them into memory.
    Only JSON and raw tensor bytes are read: loading never executes code.

    A saved folder is untrusted input. Everything in ``meta.json`` is checked before
    anything is allocated or mapped: every file and sub-folder it names must resolve
    inside ``prefix`` (symlinks included), the batch size must be a prefix of every
    entry's shape, ``names`` must have one name per batch dim, each tensor file must hold
    exactly ``dtype * shape`` bytes and a non-tensor stack must hold as many values as its
    batch size says. Any violation raises :class:`~steersman.tensordict.files.LoadError`
    (a ``ValueError``) naming the file and the field; a missing ``meta.json`` raises
    ``FileNotFoundError``.
    """
    path = os.fspath(prefix)
    meta_file = os.path.join(path, _META)
    try:
        check_inside(path, meta_file, file=meta_file, field=_META)
        with open(meta_file, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"no saved TensorDict at {path} ({_META} is missing)") from None
    except IsADirectoryError:
        raise LoadError(f"{meta_file} is a folder, not a file", file=meta_file) from None
    try:
        meta = json.loads(raw)
    except (ValueError, RecursionError) as err:  # not UTF-8, not JSON, nested too deep
        raise LoadError(f"{meta_file} is not valid JSON (corrupted or not a saved TensorDict): "
                        f"{type(err).__name__}: {err}", file=meta_file) from None
    if not isinstance(meta, dict) or meta.get("_type") not in _KINDS:
        kind = meta.get("_type") if isinstance(meta, dict) else type(meta).__name__
        raise LoadError(f"{meta_file}: unknown container type {_short(kind)} (not a saved steersman TensorDict)",
                        file=meta_file, field="_type")
    if meta.get("_format") != _FORMAT:
        raise LoadError(f"{meta_file} has format {_short(meta.get('_format'))}; this steersman reads format {_FORMAT}",
                        file=meta_file, field="_format")
    out = _Reader(meta_file, path, mmap).build(meta, path, (), None)
    if mmap:
        out.lock_()
    return out


_KINDS = ("TensorDict", "LazyStackedTensorDict")
_MAX_DEPTH = 100  # nested containers; deeper trees are refused, not a RecursionError
_MAX_DIMS = 64  # batch dims (numpy's limit, far beyond any real batch)
_MAX_DIM = 2**62  # one dim (torch.Size holds int64; the product is bounded by file sizes)


def _is_size(v: Any) -> bool:
    return type(v) is list and len(v) <= _MAX_DIMS and all(type(s) is int and 0 <= s < _MAX_DIM for s in v)


class _Reader:
    """Builds a container from validated metadata; every error names ``meta.json`` and the
    field (the entry's key path, then the field)."""

    def __init__(self, meta_file: str, root: str, mmap: bool) -> None:
        self.meta_file = meta_file
        self.root = root  # the saved folder: everything read must resolve inside it
        self.mmap = mmap

    def fail(self, where: tuple, field: str, message: str) -> LoadError:
        name = f"entry {'.'.join(where)!r} field {field!r}" if where else f"field {field!r}"
        return LoadError(f"{self.meta_file}: {name}: {message}", file=self.meta_file,
                         field=".".join((*where, field)))

    def get(self, meta: Any, where: tuple, field: str) -> Any:
        if not isinstance(meta, dict):
            raise self.fail(where, field, f"expected a JSON object holding it, got {type(meta).__name__}")
        try:
            return meta[field]
        except KeyError:
            raise self.fail(where, field, "is missing") from None

    def size(self, meta: dict, where: tuple, field: str) -> list:
        value = self.get(meta, where, field)
        if not _is_size(value):
            raise self.fail(where, field, f"expected a list of at most {_MAX_DIMS} non-negative ints, got "
                            f"{_short(value)}")
        return value

    def stat(self, path: str, where: tuple, field: str) -> os.stat_result:
        """``os.stat(path)`` of a file or folder named by ``field``, which must exist and
        resolve inside the saved folder (a symlink is resolved and checked)."""
        try:
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                st = check_inside(self.root, path, file=self.meta_file, field=".".join((*where, field)))
        except FileNotFoundError:
            raise self.fail(where, field, f"{path} is missing") from None
        return st

    def folder(self, path: str, where: tuple, field: str) -> None:
        if not stat.S_ISDIR(self.stat(path, where, field).st_mode):
            raise self.fail(where, field, f"{path} is not a folder")

    def build(self, meta: Any, path: str, where: tuple, parent_bs: list | None) -> TensorDictBase:
        if len(where) > _MAX_DEPTH:
            raise self.fail(where, "entries", f"containers nested deeper than {_MAX_DEPTH} levels")
        kind = self.get(meta, where, "_type")
        if kind not in _KINDS:
            raise self.fail(where, "_type", f"unknown container type {_short(kind)}")
        bs = self.size(meta, where, "batch_size")
        if parent_bs is not None and bs[: len(parent_bs)] != parent_bs:
            raise self.fail(where, "batch_size", f"{bs} does not start with the parent's batch size {parent_bs}")
        if kind == "LazyStackedTensorDict":
            return self.build_lazy(meta, path, where, bs)
        entries = self.get(meta, where, "entries")
        if not isinstance(entries, dict):
            raise self.fail(where, "entries", f"expected a JSON object, got {type(entries).__name__}")
        nb = len(bs)
        out: dict[str, Any] = {}
        folder = os.path.join(path, "")  # with its trailing separator (none for "")
        for key, entry in entries.items():
            if not _valid_name(key):
                raise self.fail(where, "entries", f"{key!r} cannot be a key of a saved container")
            k = entry.get("kind") if type(entry) is dict else None
            if k == "tensor":
                out[key] = self.tensor(entry, folder, where, key, bs)
                continue
            here = (*where, key)
            if k is None:
                self.get(entry, here, "kind")  # raises: the entry or its kind is missing
            if k == "non_tensor":
                ebs = self.size(entry, here, "batch_size")
                if ebs[:nb] != bs:
                    raise self.fail(here, "batch_size", f"{ebs} does not start with the batch size {bs}")
                cls = MetaData if entry.get("metadata") is True else NonTensorData
                out[key] = cls(self.get(entry, here, "data"), batch_size=ebs)
            elif k == "non_tensor_stack":
                out[key] = self.stack(entry, here, bs)
            elif k == "container":
                name = self.get(entry, here, "dir")
                if not _valid_name(name):
                    raise self.fail(here, "dir", f"{_short(name)} is not a plain folder name (no '/', '\\', "
                                    "leading '.'): it must name a sub-folder of the saved folder")
                sub = folder + name
                self.folder(sub, here, "dir")
                out[key] = self.build(self.get(entry, here, "meta"), sub, here, bs)
            else:
                raise self.fail(here, "kind", f"unknown entry kind {_short(k)}")
        names = meta.get("names")
        if names is not None:
            named = [n for n in names if n is not None] if type(names) is list else None
            if (named is None or len(names) != nb or not all(type(n) is str for n in named)
                    or len(set(named)) != len(named)):
                raise self.fail(where, "names", f"expected null or {nb} unique names (strings or null), "
                                f"got {_short(names)}")
            if not named:
                names = None
        device = meta.get("device")
        if device is not None:
            try:
                if type(device) is not str:
                    raise TypeError("not a string")
                device = torch.device(device)
            except (RuntimeError, TypeError, ValueError) as err:
                raise self.fail(where, "device", f"{_short(device)} is not a device ({err})") from None
        td = TensorDict._new_unsafe(out, torch.Size(bs), None if device is None else torch.device("cpu"), names)
        if device is not None and device.type != "cpu":
            try:
                td = td.to(device)
            except (RuntimeError, AssertionError) as err:  # e.g. cuda on a machine without it
                raise self.fail(where, "device", f"cannot move the loaded data to {device}: {err}") from None
        return td

    def tensor(self, entry: dict, folder: str, where: tuple, key: str, bs: list) -> Tensor:
        try:  # the common case in one go; on a failure, diagnose() names the field at fault
            dtype = _DTYPES[entry["dtype"]]
            shape = entry["shape"]
            name = folder + entry["file"]
        except (KeyError, TypeError):
            dtype = shape = name = None
        if dtype is None or not _is_size(shape) or shape[: len(bs)] != bs or not _valid_name(entry["file"]):
            raise self.diagnose(entry, (*where, key), bs)
        try:
            st = os.lstat(name)
        except FileNotFoundError:
            st = None
        if st is None or stat.S_ISLNK(st.st_mode):  # (a symlink is resolved and checked)
            st = self.stat(name, (*where, key), "file")
        numel = 1
        for s in shape:
            numel *= s
        needed = numel * dtype.itemsize
        if st.st_size != needed or not stat.S_ISREG(st.st_mode):
            what = f"{st.st_size} bytes" if stat.S_ISREG(st.st_mode) else "not a regular file"
            raise self.fail((*where, key), "file", f"{name} has {what}, expected {needed} bytes for "
                            f"shape {shape} and dtype {dtype}")
        return _open_sized(name, dtype, torch.Size(shape), numel, self.mmap)

    def diagnose(self, entry: Any, where: tuple, bs: list) -> LoadError:
        """The error for a tensor entry that failed :meth:`tensor`'s checks."""
        name = self.get(entry, where, "dtype")
        if type(name) is not str or name not in _DTYPES:
            return self.fail(where, "dtype", f"unknown dtype {_short(name)}")
        shape = self.size(entry, where, "shape")
        if shape[: len(bs)] != bs:
            return self.fail(where, "shape", f"{shape} does not start with the batch size {bs}")
        name = self.get(entry, where, "file")
        return self.fail(where, "file", f"{_short(name)} is not a plain file name (no '/', '\\', leading '.')")

    def stack(self, entry: dict, where: tuple, bs: list) -> NonTensorStack:
        ebs = self.size(entry, where, "batch_size")
        if ebs[: len(bs)] != bs:
            raise self.fail(where, "batch_size", f"{ebs} does not start with the batch size {bs}")
        data = self.get(entry, where, "data")
        if not _nests_as(data, ebs):  # checked before allocating: the count comes from the data
            raise self.fail(where, "data", f"the values do not nest as lists of the batch size {ebs}")
        try:
            arr = np.empty(tuple(ebs), dtype=object)
        except ValueError as err:  # a 0-sized dim next to a huge one
            raise self.fail(where, "batch_size", str(err)) from None
        _fill(arr, data)
        return NonTensorStack(arr)

    def build_lazy(self, meta: dict, path: str, where: tuple, bs: list) -> TensorDictBase:
        members = self.get(meta, where, "members")
        stack_dim = self.get(meta, where, "stack_dim")
        if type(members) is not list or type(stack_dim) is not int:
            raise self.fail(where, "members", "expected a list of members and an int stack_dim")
        built = []
        for i, m in enumerate(members):
            sub = os.path.join(path, str(i))
            self.folder(sub, (*where, str(i)), "members")
            built.append(self.build(m, sub, (*where, str(i)), None))
        try:
            out = LazyStackedTensorDict(*built, stack_dim=stack_dim, batch_size=None if built else bs)
        except (ValueError, TypeError, IndexError) as err:
            raise self.fail(where, "members", f"the members do not stack: {err}") from None
        if list(out.batch_size) != bs:
            raise self.fail(where, "batch_size", f"{bs} but the members stack to {list(out.batch_size)}")
        return out


def _valid_name(name: Any) -> bool:
    """A key or file name that stays in its folder: no separator, no leading ``.``."""
    return (type(name) is str and bool(name) and "/" not in name and "\\" not in name
            and not name.startswith(".") and name != _META and "\0" not in name)


def _nests_as(data: Any, shape: list) -> bool:
    """Whether ``data`` is lists nested ``len(shape)`` deep with lengths ``shape``."""
    if not shape:
        return True
    if type(data) is not list or len(data) != shape[0]:
        return False
    rest = shape[1:]
    return not rest or all(_nests_as(x, rest) for x in data)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _fill(arr: np.ndarray, data: Any) -> None:
    if arr.ndim == 0:
        arr[()] = data
        return
    for i, x in enumerate(data):
        if arr.ndim == 1:
            arr[i] = x
        else:
            _fill(arr[i], x)


def load(prefix: Any, device: Any = None, non_blocking: bool = False, *, mmap: bool = False,
         out: TensorDictBase | None = None, robust_key: bool | None = True, subpath: Any = None,
         mode: str | None = None, num_threads: int = 0, allow_pickle: bool | None = None) -> TensorDictBase:
    """Loads a container saved with :func:`save` or ``memmap`` (see :func:`_load` for the
    checks done on the untrusted folder; loading never executes code).

    Args:
        prefix: the saved folder.
        device: move the result there (``non_blocking`` passed to ``.to``).

    Keyword Args:
        mmap: ``True`` maps the files (in-place writes reach them); ``False`` (default)
            reads them into memory.
        mode: TensorDict's spelling of the same choice: ``"r+"`` maps the files (writes
            reach them), ``"r"`` keeps writes in memory (read into memory here).
        out: a container to copy the result into (in place; same batch size); returned.
        subpath: load only this nested entry (a nested key or ``"a/b"``).
        robust_key: ``True``/``None`` (steersman has one file layout); ``False`` (the
            legacy tensordict layout) is refused.
        num_threads, allow_pickle: no effect: steersman's folders are never compressed
            and never hold pickles (a pickle is never read, whatever ``allow_pickle``).

    Example:
        >>> import tempfile, torch
        >>> from steersman.tensordict import TensorDict, load, save
        >>> d = tempfile.mkdtemp()
        >>> save(TensorDict(a=torch.zeros(3), b={"c": torch.ones(3, 2)}, batch_size=[3]), d)
        >>> load(d, subpath="b")["c"].shape
        torch.Size([3, 2])
    """
    if robust_key is False:
        raise ValueError("load: robust_key=False reads tensordict's legacy file names; steersman "
                         "writes one layout only (robust_key=True or None)")
    if mode is not None:
        if mode not in ("r", "r+"):
            raise ValueError(f"load: mode must be 'r' or 'r+', got {mode!r}")
        mmap = mode == "r+"
    td = _load(prefix, mmap=mmap)
    if subpath is not None:
        key = tuple(subpath.split("/")) if isinstance(subpath, str) else subpath
        try:
            td = td.get(key)
        except KeyError:
            raise KeyError(f"load: subpath {subpath!r} is not in {os.fspath(prefix)!r} "
                           f"(top-level keys: {sorted(td.keys())})") from None
    if device is not None:
        td = td.to(device, non_blocking=non_blocking)
    return write_into_out("load", out, td)


def load_memmap(prefix: Any, device: Any = None, non_blocking: bool = False, *, out: TensorDictBase | None = None,
                robust_key: bool | None = True, subpath: Any = None, mode: str | None = None,
                num_threads: int = 0, allow_pickle: bool | None = None) -> TensorDictBase:
    """Opens a saved container with every tensor memory-mapped (``mode="r+"``, the default)
    or read into memory (``mode="r"``); the other arguments are :func:`load`'s."""
    return load(prefix, device, non_blocking, mmap=True, out=out, robust_key=robust_key, subpath=subpath,
                mode=mode, num_threads=num_threads, allow_pickle=allow_pickle)
