"""``append_memmap``: grow a saved TensorDict folder along its first batch dim."""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from torch import Tensor

from .base import TensorDictBase, _is_branch, _is_non_tensor, _unwrap
from .io import _META, _load, _write_json_atomic

__all__ = ["append_memmap"]


def _fail(where: tuple, message: str) -> ValueError:
    at = "the root" if not where else repr(where[0] if len(where) == 1 else where)
    return ValueError(f"append_memmap: {message} (at {at})")


def _same_value(saved: Any, rows: Any) -> bool:
    if getattr(type(rows), "_is_stack", False):  # a NonTensorStack: every value equal to the saved one
        return all(_flat_equal(rows.tolist(), saved))
    return _unwrap(rows) == saved


def _flat_equal(values: Any, saved: Any) -> list[bool]:
    if isinstance(values, list):
        return [b for v in values for b in _flat_equal(v, saved)]
    return [values == saved]


def _plan(rows: Any, meta: dict, folder: str, plan: list, where: tuple, m: int) -> None:
    """Checks ``rows`` against one saved level (``meta``), updates ``meta`` to the grown
    sizes and appends ``(file, bytes)`` writes to ``plan``. Writes nothing."""
    if meta.get("_type") != "TensorDict":
        raise _fail(where, f"a saved {meta.get('_type')} cannot grow (only a TensorDict can)")
    bs = meta["batch_size"]
    rbs = list(rows.batch_size)
    if len(rbs) != len(bs) or rbs[1:] != bs[1:]:
        raise _fail(where, f"rows of batch size {rbs} do not extend the saved batch size {bs} along dim 0")
    entries = meta["entries"]
    keys = set(rows._keys_str())
    if keys != set(entries):
        missing, extra = sorted(set(entries) - keys), sorted(keys - set(entries))
        raise _fail(where, f"the rows' keys differ from the saved ones (missing {missing}, extra {extra})")
    meta["batch_size"] = [bs[0] + m, *bs[1:]]
    for key, entry in entries.items():
        value = rows._get_str(key, None)
        here = (*where, key)
        kind = entry["kind"]
        if kind == "tensor":
            if not isinstance(value, Tensor):
                raise _fail(here, f"saved as a tensor, got a {type(value).__name__}")
            dtype, shape = entry["dtype"], entry["shape"]
            if str(value.dtype).removeprefix("torch.") != dtype:
                raise _fail(here, f"dtype {value.dtype} does not match the saved {dtype}")
            if list(value.shape[1:]) != shape[1:]:
                raise _fail(here, f"shape {list(value.shape)} does not extend the saved {shape} along dim 0")
            data = value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            plan.append((os.path.join(folder, entry["file"]), data))
            entry["shape"] = [shape[0] + m, *shape[1:]]
        elif kind == "non_tensor":
            if not _is_non_tensor(value) or not _same_value(entry["data"], value):
                raise _fail(here, f"a non-tensor entry stays as saved ({entry['data']!r}); the rows must hold "
                            f"the same value, got {_unwrap(value) if _is_non_tensor(value) else value!r}")
            ebs = entry["batch_size"]
            entry["batch_size"] = [ebs[0] + m, *ebs[1:]] if ebs else ebs
        elif kind == "non_tensor_stack":
            raise _fail(here, "a saved NonTensorStack cannot grow")
        elif kind == "container":
            if not _is_branch(value) or _is_non_tensor(value):
                raise _fail(here, f"saved as a TensorDict, got a {type(value).__name__}")
            _plan(value, entry["meta"], os.path.join(folder, entry["dir"]), plan, here, m)
        else:  # the loader refuses unknown kinds before this runs
            raise _fail(here, f"unknown saved entry kind {kind!r}")


def append_memmap(prefix: str | os.PathLike, rows: TensorDictBase, *, allow_pickle: bool | None = None) -> None:
    """Appends ``rows`` to a TensorDict saved in ``prefix``, along its first batch dim.

    Each leaf file grows by the bytes of the new rows; ``meta.json`` is rewritten last,
    atomically (temp file, fsync, rename). Everything is checked before the first byte is
    written: the keys, classes, dtypes and trailing shapes of ``rows`` must be those of the
    saved TensorDict, and its batch size may differ in the first dim only. A non-tensor
    entry stays as saved and ``rows`` must hold the same value. A failed write truncates
    every grown file back, so the folder holds the old rows. Readers that mapped the files
    before keep seeing the old number of rows; :func:`load_memmap` after the append sees
    the new one. Use one writer at a time, and don't read the folder while appending; a
    process killed between the data and the ``meta.json`` leaves files longer than
    ``meta.json`` says, which the loader reports (``LoadError``) rather than misreads.

    Args:
        prefix: the folder that :func:`save` or ``memmap`` wrote.
        rows: the rows to append (a TensorDict or a tensorclass).

    Keyword Args:
        allow_pickle: accepted for tensordict's signature; saved non-tensor values here are
            JSON, never pickles, so there is nothing to allow.

    Raises:
        ValueError: if ``prefix`` is not a folder, or ``rows`` cannot extend the saved data
            (a lazy stack, a NonTensorStack, or a saved TensorDict without batch dims).

    Example:
        >>> import tempfile, torch
        >>> from steersman.tensordict import TensorDict, append_memmap, load_memmap, save
        >>> td = TensorDict(a=torch.zeros(3, 2), batch_size=[3])
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     _ = save(td, tmp)
        ...     append_memmap(tmp, TensorDict(a=torch.ones(2, 2), batch_size=[2]))
        ...     print(load_memmap(tmp)["a"].sum(-1).tolist())
        [0.0, 0.0, 0.0, 2.0, 2.0]
    """
    path = os.fspath(prefix)
    if not os.path.isdir(path):
        raise ValueError(f"append_memmap: {path} is not a folder written by save() or memmap()")
    _load(path, mmap=True)  # every check of the loader (sizes, paths inside the folder, JSON)
    meta_file = os.path.join(path, _META)
    with open(meta_file, "rb") as f:
        meta = json.loads(f.read())
    if hasattr(type(rows), "_field_names"):  # a tensorclass: its fields' TensorDict
        rows = rows._tensordict
    if not isinstance(rows, TensorDictBase) or getattr(type(rows), "_is_lazy", False):
        raise ValueError(f"append_memmap: rows must be a TensorDict or a tensorclass, got {type(rows).__name__}")
    if not meta.get("batch_size"):
        raise ValueError("append_memmap: the saved TensorDict has no batch dims, so it has no rows to extend")
    plan: list = []
    _plan(rows, meta, path, plan, (), rows.batch_size[0] if rows.batch_size else 0)
    sizes = [(file, os.path.getsize(file)) for file, _ in plan]
    try:
        for file, data in plan:
            with open(file, "ab") as f:
                f.write(data)
        _write_json_atomic(meta_file, meta, fsync=True)
    except BaseException:
        for file, size in sizes:
            os.truncate(file, size)
        raise
