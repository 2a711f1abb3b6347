"""``PersistentTensorDict``: a TensorDict whose entries live in an HDF5 file.

Leaves stay in the file until they are asked for: ``td["obs"]`` reads one dataset, and
``td[idx]`` returns a view that, when one of its leaves is read, reads only the selected
rows. Writes (``set``, ``td[idx] = other``, ``update_``, in-place arithmetic) go to the file.

``h5py`` is an optional dependency (``pip install 'steersman[h5]'``); it is imported only
when a file is opened, so importing :mod:`steersman.tensordict` never needs it.

File layout (plain HDF5, readable by any tool):

* a tensor is a dataset of shape ``[*batch_size, *feature_dims]``; dtypes numpy lacks
  (``bfloat16``, ``float8_*`` ...) are stored as same-width integers plus a
  ``steersman.dtype`` attribute;
* a nested container is a group (attribute ``steersman.batch_size`` when its batch is
  longer than its parent's); the root group also records its batch size there;
* non-tensor data are variable-length string datasets (attribute ``steersman.kind``):
  a scalar one for :class:`NonTensorData`, one element per batch element for
  :class:`NonTensorStack`; strings are stored as is, other values as JSON (never pickled).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ._utils import (
    NO_DEFAULT,
    NestedKey,
    as_size,
    expand_right,
    missing_key_error,
    normalize_index,
    unravel_key,
)
from .base import (
    TensorDictBase,
    _check_broadcast,
    _dict_view,
    _is_branch,
    _is_non_tensor,
    _update_source,
    is_tensor_collection,
)
from .files import LoadError
from .indexing import MASK, NEW, TENSOR, on_cpu, plan_index
from .td import TensorDict, _other_entry

__all__ = ["PersistentTensorDict", "to_h5"]

_BS_ATTR = "steersman.batch_size"
_KIND_ATTR = "steersman.kind"  # "non_tensor" | "metadata" | "non_tensor_stack"
_ENC_ATTR = "steersman.encoding"  # "str" | "json"
_DTYPE_ATTR = "steersman.dtype"  # torch dtype of a tensor stored as raw integers
_H5PY_MISSING = "PersistentTensorDict needs h5py: pip install 'steersman[h5]'"
_CREATE_MODES = ("w", "w-", "x", "a")


def _h5py() -> Any:
    try:
        import h5py
    except ImportError as err:
        raise ImportError(_H5PY_MISSING) from err
    return h5py


# ---------------------------------------------------------------------- dtypes
_NUMPY_DTYPES = {
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16,
    torch.uint32, torch.uint64, torch.float16, torch.float32, torch.float64, torch.complex64,
    torch.complex128,
}
_RAW_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _to_numpy(t: Tensor) -> tuple[np.ndarray, str | None]:
    """``t`` as a C-contiguous numpy array, plus the torch dtype name if stored raw."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    name = None
    if t.dtype not in _NUMPY_DTYPES:
        raw = _RAW_INT.get(t.element_size())
        if raw is None:
            raise TypeError(f"cannot store a tensor of dtype {t.dtype} in an HDF5 file")
        name = str(t.dtype).removeprefix("torch.")
        t = t.contiguous().view(raw)
    return np.asarray(t.numpy(), order="C"), name


def _ds_dtype(ds: Any) -> torch.dtype:
    name = ds.attrs.get(_DTYPE_ATTR)
    if name is not None:
        dtype = getattr(torch, _as_str(name), None)
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dataset {ds.name!r} has an unknown {_DTYPE_ATTR} attribute {name!r}")
        return dtype
    return _np_to_torch_dtype(ds.dtype, ds.name)


def _np_to_torch_dtype(dtype: np.dtype, where: str) -> torch.dtype:
    try:
        return torch.from_numpy(np.empty(0, dtype=dtype.newbyteorder("="))).dtype
    except (TypeError, ValueError) as err:
        raise TypeError(f"dataset {where!r} has dtype {dtype}, which has no torch equivalent") from err


def _to_tensor(arr: Any, ds: Any) -> Tensor:
    arr = np.asarray(arr)
    if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "<" and np.little_endian is False):
        arr = arr.astype(arr.dtype.newbyteorder("="))
    try:
        t = torch.from_numpy(np.asarray(arr, order="C"))
    except TypeError as err:
        raise TypeError(f"dataset {ds.name!r} has dtype {arr.dtype}, which has no torch equivalent") from err
    name = ds.attrs.get(_DTYPE_ATTR)
    if name is not None:
        t = t.view(_ds_dtype(ds))
    return t


def _as_str(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


# ---------------------------------------------------------------------- selections
class _Sel:
    """What a view selects over the first ``k`` stored batch dims (``sizes``).

    Outer form (``pos is None``): ``items[d]`` selects stored dim ``d`` (an ``int`` drops
    it, a ``range`` keeps it, a long tensor replaces it by the tensor's dims) and
    ``layout`` lists the visible dims in order: ``None`` for a dim added by ``None``
    indexing, ``d`` for the dims of ``items[d]``. Joint form: ``pos`` holds flat positions
    into the ``sizes`` block, shaped like the visible dims (used when several tensors
    index at once or a mask spans several dims).
    """

    __slots__ = ("items", "layout", "pos", "sizes", "_shape", "_plan")

    def __init__(self, items: tuple | None, layout: tuple | None, pos: Tensor | None, sizes: torch.Size):
        self.items = items
        self.layout = layout
        self.pos = pos
        self.sizes = torch.Size(sizes)
        self._shape: torch.Size | None = None
        self._plan: _Plan | None = None

    def __reduce__(self):
        return (_Sel, (self.items, self.layout, self.pos, self.sizes))

    @classmethod
    def full(cls, sizes: torch.Size) -> _Sel:
        return cls(tuple(range(n) for n in sizes), tuple(range(len(sizes))), None, sizes)

    @property
    def k(self) -> int:
        return len(self.sizes)

    @property
    def shape(self) -> torch.Size:
        if self._shape is None:
            if self.pos is not None:
                self._shape = self.pos.shape
            else:
                out: list[int] = []
                for tok in self.layout:
                    if tok is None:
                        out.append(1)
                    else:
                        s = self.items[tok]
                        out.extend((len(s),) if type(s) is range else tuple(s.shape))
                self._shape = torch.Size(out)
        return self._shape

    def plan(self) -> _Plan:
        if self._plan is None:
            self._plan = _Plan(self)
        return self._plan


def _item_ndim(s: Any) -> int:
    return 1 if type(s) is range else s.ndim


def _check_step(s: slice) -> None:
    if s.step is not None and s.step <= 0:
        raise ValueError("step must be greater than zero")


def _extend(sel: _Sel, stored: torch.Size) -> _Sel:
    """``sel`` widened to cover every dim of ``stored`` (the extra dims fully kept)."""
    k = sel.k
    if len(stored) == k:
        return sel
    extra = stored[k:]
    if sel.pos is None:
        return _Sel(sel.items + tuple(range(n) for n in extra),
                    sel.layout + tuple(range(k, len(stored))), None, stored)
    n = math.prod(extra)
    pos = sel.pos.reshape(sel.pos.shape + (1,) * len(extra)) * n + torch.arange(n).reshape(extra)
    return _Sel(None, None, pos, stored)


def _positions(sel: _Sel) -> Tensor:
    """Flat positions (into the ``sizes`` block) of the elements ``sel`` selects."""
    if sel.pos is not None:
        return sel.pos
    shape = sel.shape
    nv = len(shape)
    strides = _strides(sel.sizes)
    total = torch.zeros((), dtype=torch.long)
    p = 0
    for tok in sel.layout:
        if tok is None:
            p += 1
            continue
        s = sel.items[tok]
        c = torch.arange(s.start, s.stop, s.step) if type(s) is range else s
        total = total + c.reshape((1,) * p + tuple(c.shape) + (1,) * (nv - p - c.ndim)) * strides[tok]
        p += c.ndim
    for d, s in enumerate(sel.items):
        if type(s) is int:
            total = total + s * strides[d]
    return total.expand(shape)


def _strides(sizes: torch.Size) -> list[int]:
    out = [1] * len(sizes)
    for d in range(len(sizes) - 2, -1, -1):
        out[d] = out[d + 1] * sizes[d + 1]
    return out


def _compose(sel: _Sel, index: Any) -> _Sel:
    index = on_cpu(index)
    out = _compose_outer(sel, index) if sel.pos is None else None
    if out is not None:
        return out
    pos = _positions(sel)[index]
    if sel.k == 1:  # one stored dim: positions are coordinates, back to the outer form
        if pos.ndim == 0:
            return _Sel((int(pos),), (), None, sel.sizes)
        return _Sel((pos,), (0,), None, sel.sizes)
    return _Sel(None, None, pos, sel.sizes)


def _compose_outer(sel: _Sel, raw: Any) -> _Sel | None:
    """``sel`` followed by the (normalized) index ``raw``, or None if the result is not an
    outer selection (several tensor indices, a mask over several dims, a dim added inside
    the dims of an index tensor)."""
    shape = sel.shape
    plan = plan_index(raw, len(shape))
    if plan.n_advanced > 1 or any(s.kind == MASK and s.n_in != 1 for s in plan.steps):
        return None
    tokens = sel.layout
    token_of: list[int] = []  # the layout entry that shows each dim of ``shape``
    first_dim: list[int] = []  # the first dim of ``shape`` that each layout entry shows
    for ti, tok in enumerate(tokens):
        first_dim.append(len(token_of))
        token_of.extend([ti] * (1 if tok is None else _item_ndim(sel.items[tok])))
    ops: list[list] = [[] for _ in tokens]  # the index elements acting on each layout entry
    order: list = []  # the new layout: layout entries, and "new" for a dim added by None
    next_token = 0
    for step in plan.steps:
        d = step.in_dim
        if step.kind == NEW:
            if 0 < d < len(token_of) and token_of[d - 1] == token_of[d]:
                return None  # a new dim inside the dims of one index tensor
            while next_token < len(tokens) and first_dim[next_token] < d:
                order.append(next_token)
                next_token += 1
            order.append("new")
            continue
        it = step.item
        if step.kind == MASK:
            if it.shape[0] != shape[d]:
                raise IndexError(f"the mask of size {it.shape[0]} does not match batch dim {d} of size {shape[d]}")
            it = it.nonzero().squeeze(1)
        elif step.kind == TENSOR:
            it = it.long()
        ops[token_of[d]].append(it)
    order.extend(range(next_token, len(tokens)))
    new_items = list(sel.items)
    layout: list = []
    for entry in order:
        if entry == "new":
            layout.append(None)
            continue
        tok = tokens[entry]
        op = ops[entry]
        if tok is None:  # a dim of size 1 added by None
            if not op:
                layout.append(None)
                continue
            o = op[0]
            if type(o) is int:
                if o not in (0, -1):
                    raise IndexError(f"index {o} is out of bounds for a batch dim of size 1")
                continue
            if type(o) is slice:
                _check_step(o)
                if len(range(1)[o]) == 1:
                    layout.append(None)
                    continue
            return None
        s = new_items[tok]
        if type(s) is range:
            if not op:
                layout.append(tok)
                continue
            o = op[0]
            if type(o) is int:
                if not -len(s) <= o < len(s):
                    raise IndexError(f"index {o} is out of bounds for a batch dim of size {len(s)}")
                new_items[tok] = s[o]
                continue
            if type(o) is slice:
                _check_step(o)
                new_items[tok] = s[o]
                layout.append(tok)
                continue
            t = torch.arange(s.start, s.stop, s.step)[o]
        else:
            t = s[tuple(op)] if op else s
        if t.ndim == 0:
            new_items[tok] = int(t)
            continue
        new_items[tok] = t
        layout.append(tok)
    return _Sel(tuple(new_items), tuple(layout), None, sel.sizes)


class _Plan:
    """How to read/write a selection: an h5py selection, then an in-memory gather.

    ``hsel`` selects a block of the dataset with at most one (sorted, unique) index list,
    as h5py requires; ``adv`` (numpy index arrays, or None when the block already is the
    answer) picks and orders the selected elements inside the block; ``new_axes`` are the
    positions of dims added by ``None``.
    """

    __slots__ = ("hsel", "adv", "new_axes", "empty", "covered", "block")

    def __init__(self, sel: _Sel) -> None:
        if sel.pos is not None:
            self._joint(sel)
        else:
            self._outer(sel)

    def _outer(self, sel: _Sel) -> None:
        hsel: list = []
        axes: list[tuple[np.ndarray | None, tuple]] = []
        block: list[int] = []
        fancy = False
        self.empty = False
        self.covered = True
        for s in sel.items:
            if type(s) is int:
                hsel.append(s)
                continue
            if type(s) is range:
                hsel.append(slice(s.start, s.stop, s.step))
                axes.append((None, (len(s),)))
                block.append(len(s))
                self.empty |= len(s) == 0
                continue
            if s.numel() == 0:
                self.empty = True
                hsel.append(slice(0, 0))
                axes.append((None, tuple(s.shape)))
                block.append(0)
                continue
            flat = s.reshape(-1)
            if not fancy:
                u, inv = torch.unique(flat, sorted=True, return_inverse=True)
                lo, hi = int(u[0]), int(u[-1])
                if hi - lo + 1 == u.numel():
                    hsel.append(slice(lo, hi + 1))
                else:
                    hsel.append(u.numpy())
                    fancy = True
                n = u.numel()
            else:  # h5py takes one index list: read the bounding range of this dim
                lo, hi = int(flat.min()), int(flat.max())
                hsel.append(slice(lo, hi + 1))
                inv = flat - lo
                n = hi - lo + 1
                if torch.unique(flat).numel() != n:
                    self.covered = False
            identity = s.ndim == 1 and inv.numel() == n and bool((inv == torch.arange(n)).all())
            axes.append((None if identity else inv.reshape(s.shape).numpy(), tuple(s.shape)))
            block.append(n)
        self.hsel = tuple(hsel)
        self.block = tuple(block)
        if all(a is None for a, _ in axes):
            self.adv = None
        else:
            total = sum(len(shp) for _, shp in axes)
            adv = []
            off = 0
            for a, shp in axes:
                arr = np.arange(shp[0]) if a is None else a
                adv.append(arr.reshape((1,) * off + shp + (1,) * (total - off - len(shp))))
                off += len(shp)
            self.adv = tuple(adv)
        self.new_axes = []
        p = 0
        for tok in sel.layout:
            if tok is None:
                self.new_axes.append(p)
                p += 1
            else:
                p += _item_ndim(sel.items[tok])

    def _joint(self, sel: _Sel) -> None:
        pos = sel.pos
        self.new_axes = []
        self.covered = False
        self.empty = pos.numel() == 0
        strides = _strides(sel.sizes)
        hsel: list = []
        adv = []
        block = []
        for d, size in enumerate(sel.sizes):
            c = (pos // strides[d]) % size
            if self.empty:
                hsel.append(slice(0, 0))
                adv.append(c.numpy())
                block.append(0)
                continue
            if d == 0:
                u, inv = torch.unique(c.reshape(-1), sorted=True, return_inverse=True)
                lo, hi = int(u[0]), int(u[-1])
                hsel.append(slice(lo, hi + 1) if hi - lo + 1 == u.numel() else u.numpy())
                adv.append(inv.reshape(c.shape).numpy())
                block.append(u.numel())
            else:
                lo, hi = int(c.min()), int(c.max())
                hsel.append(slice(lo, hi + 1))
                adv.append((c - lo).numpy())
                block.append(hi - lo + 1)
        self.hsel = tuple(hsel)
        self.adv = tuple(adv)
        self.block = tuple(block)


def _read(ds: Any, sel: _Sel | None, is_str: bool) -> np.ndarray:
    src = ds.asstr() if is_str else ds
    if sel is None:
        return np.asarray(src[()])
    plan = sel.plan()
    if plan.empty:
        return np.empty(tuple(sel.shape) + ds.shape[sel.k:], dtype=object if is_str else ds.dtype)
    arr = np.asarray(src[plan.hsel])
    if plan.adv is not None:
        arr = arr[plan.adv]
    for p in plan.new_axes:
        arr = np.expand_dims(arr, p)
    return arr


def _write(ds: Any, sel: _Sel | None, value: np.ndarray, is_str: bool) -> None:
    """Writes ``value`` (shaped like the selection) into ``ds``."""
    if sel is None:
        ds[()] = value
        return
    plan = sel.plan()
    if plan.empty:
        return
    for p in reversed(plan.new_axes):
        value = value.reshape(value.shape[:p] + value.shape[p + 1:])
    if plan.adv is None:
        ds[plan.hsel] = value
        return
    if plan.covered:
        block = np.empty(plan.block + ds.shape[sel.k:], dtype=value.dtype)
    else:
        block = np.asarray((ds.asstr() if is_str else ds)[plan.hsel])
        if is_str:
            block = block.astype(object)
    block[plan.adv] = value
    ds[plan.hsel] = block


# ---------------------------------------------------------------------- non-tensor values
def _encode(values: list) -> tuple[list[str], str]:
    if all(isinstance(v, str) for v in values):
        return values, "str"
    out = []
    for v in values:
        try:
            out.append(json.dumps(v))
        except (TypeError, ValueError) as err:
            raise TypeError(
                f"cannot store the non-tensor value {v!r} ({type(v).__name__}) in an HDF5 file: "
                "only strings and JSON-encodable values can be stored (nothing is pickled)"
            ) from err
    return out, "json"


def _decode(value: Any, encoding: str) -> Any:
    return json.loads(value) if encoding == "json" else value


def _ds_kind(ds: Any) -> str:
    kind = ds.attrs.get(_KIND_ATTR)
    if kind is not None:
        return _as_str(kind)
    if _h5py().check_string_dtype(ds.dtype) is not None:
        return "non_tensor" if ds.ndim == 0 else "non_tensor_stack"
    return "tensor"


def _valid_key(key: Any) -> bool:
    return type(key) is str and bool(key) and "/" not in key and key not in (".", "..")


def _check_key(key: str) -> None:
    if not _valid_key(key):
        raise KeyError(f"{key!r} cannot be an HDF5 entry name (non-empty, no '/', not '.' or '..')")


def _read_bs_attr(group: Any) -> torch.Size | None:
    v = group.attrs.get(_BS_ATTR)
    if v is None:
        return None
    try:
        return as_size(json.loads(_as_str(v)))
    except (ValueError, TypeError):
        return None


def _stored_batch_size(group: Any) -> torch.Size | None:
    """The batch size recorded on ``group`` (``None`` if none is); a malformed one raises."""
    stored = _read_bs_attr(group)
    if stored is None and group.attrs.get(_BS_ATTR) is not None:
        where = group.file.filename
        raise LoadError(f"{where}: attribute {_BS_ATTR!r} of {group.name!r} is not a batch size: "
                        f"{group.attrs.get(_BS_ATTR)!r:.80}", file=where, field=_BS_ATTR)
    return stored


def _check_reads_only_this_file(group: Any, stored: torch.Size | None) -> None:
    """Refuses a file whose entries would make reading ``group`` touch other files or loop.

    A saved file is untrusted input: an external link, a dataset stored in external raw
    files or a virtual dataset (mapped from other HDF5 files) reads files elsewhere, and a
    group reachable twice (a hard or soft link back to a group) makes key walks loop; each
    raises :class:`LoadError` naming the entry. A ``stored`` batch size must be a prefix of
    every tensor dataset's shape. Runs once, when the file is opened.
    """
    h5py = _h5py()
    h5d, h5l, h5o = h5py.h5d, h5py.h5l, h5py.h5o
    gid = group.id
    nb = None if stored is None else len(stored)

    def link_problem(name: bytes, info: Any) -> tuple[bytes, str] | None:  # a result stops the walk
        if info.type == h5l.TYPE_EXTERNAL:
            return name, "is an external link to another file; only entries of this file are read"
        if info.type == h5l.TYPE_SOFT and h5o.get_info(gid, name).type == h5o.TYPE_GROUP:
            return name, "is a soft link to a group (a loop or a second path to it)"
        return None

    def object_problem(name: bytes, info: Any) -> tuple[bytes, str] | None:
        if info.type == h5o.TYPE_GROUP:
            return (name, "is a group reachable by another path (a loop)") if info.rc > 1 else None
        if info.type != h5o.TYPE_DATASET:
            return None
        ds = h5d.open(gid, name)
        plist = ds.get_create_plist()
        if plist.get_layout() == h5d.VIRTUAL or plist.get_external_count():
            return name, "is stored in other files (a virtual dataset or external storage)"
        if nb is not None and ds.shape[:nb] != tuple(stored) and _ds_kind(group[name.decode()]) in (
                "tensor", "non_tensor_stack"):
            return name, (f"has shape {list(ds.shape)}, which does not start with the stored batch size "
                          f"{list(stored)} (attribute {_BS_ATTR!r})")
        return None

    # (low-level walks: no high-level object per entry; raising inside a walk would not
    # unwind cleanly through h5py, so the first problem is returned, which stops it)
    found = gid.links.visit(link_problem, info=True) or h5o.visit(gid, object_problem, info=True)
    if found is None and h5o.get_info(gid).rc > 1:
        found = b".", "is a group reachable by another path (a loop)"
    if found is not None:
        where, name = group.file.filename, found[0].decode()
        raise LoadError(f"{where}: entry {name!r} {found[1]}", file=where, field=name)


def _auto_batch_size(group: Any) -> torch.Size:
    """The longest shape prefix shared by every tensor (and per-element string) dataset."""
    h5py = _h5py()
    shapes: list[tuple] = []

    def visit(_name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset) and _ds_kind(obj) in ("tensor", "non_tensor_stack"):
            shapes.append(obj.shape)

    group.visititems(visit)
    if not shapes:
        return torch.Size(())
    common = []
    for i in range(min(len(s) for s in shapes)):
        if all(s[i] == shapes[0][i] for s in shapes):
            common.append(shapes[0][i])
        else:
            break
    return torch.Size(common)


def _check_prefix(group: Any, bs: torch.Size) -> None:
    h5py = _h5py()

    def visit(name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset) and _ds_kind(obj) in ("tensor", "non_tensor_stack"):
            if tuple(obj.shape[: len(bs)]) != tuple(bs):
                raise ValueError(
                    f"batch_size {list(bs)} does not fit entry {name!r} of shape {list(obj.shape)}"
                )

    group.visititems(visit)


def _create_group(parent: Any, key: str, batch_size: torch.Size) -> Any:
    grp = parent.create_group(key, track_order=True)
    grp.attrs[_BS_ATTR] = json.dumps(list(batch_size))
    return grp


def _create_entry(group: Any, key: str, value: Any, ds_kwargs: dict) -> None:
    """Creates dataset/group ``key`` holding ``value`` (a tensor, non-tensor or container)."""
    h5py = _h5py()
    if isinstance(value, Tensor):
        arr, raw_name = _to_numpy(value)
        kw = ds_kwargs if arr.ndim and arr.size else {}
        ds = group.create_dataset(key, data=arr, **kw)
        if raw_name is not None:
            ds.attrs[_DTYPE_ATTR] = raw_name
    elif _is_non_tensor(value):
        if getattr(type(value), "_is_stack", False):
            arr = value.to_object_array()
            strs, enc = _encode(arr.reshape(-1).tolist())
            data = np.empty(arr.shape, dtype=object)
            data.reshape(-1)[:] = strs if strs else []
            ds = group.create_dataset(key, shape=arr.shape, dtype=h5py.string_dtype())
            if data.size:
                ds[()] = data
            kind = "non_tensor_stack"
        else:
            (s,), enc = _encode([value.data])
            ds = group.create_dataset(key, data=s, dtype=h5py.string_dtype())
            from .nontensor import MetaData

            kind = "metadata" if isinstance(value, MetaData) else "non_tensor"
        ds.attrs[_KIND_ATTR] = kind
        ds.attrs[_ENC_ATTR] = enc
    elif is_tensor_collection(value):
        if hasattr(value, "_tensordict") and not isinstance(value, TensorDictBase):
            value = value._tensordict  # a tensorclass instance
        grp = _create_group(group, key, value.batch_size)
        _write_all(grp, value, ds_kwargs)
    else:
        raise TypeError(f"cannot store entry {key!r} of type {type(value).__name__} in an HDF5 file")


def _write_all(group: Any, td: TensorDictBase, ds_kwargs: dict) -> None:
    for key in td._keys_str():
        _check_key(key)
        _create_entry(group, key, td._get_str(key, NO_DEFAULT), ds_kwargs)


def _materialize(td: TensorDict) -> TensorDict:
    """Replaces (recursively) the PersistentTensorDict entries of ``td`` by in-memory copies."""
    for k, v in list(td._tensordict.items()):
        if isinstance(v, PersistentTensorDict):
            td._tensordict[k] = v.to_tensordict()
        elif type(v) is TensorDict:
            _materialize(v)
    return td


# ---------------------------------------------------------------------- the container
class PersistentTensorDict(TensorDictBase):
    """A TensorDict backed by an HDF5 file (needs ``h5py``).

    Args:
        filename: the HDF5 file (or pass ``group``).
        group: an open ``h5py.Group``/``h5py.File`` (the file is then not closed by
            :meth:`close`), or with ``filename`` the path of a group inside the file.
        batch_size: the batch size; by default the one stored in the file (attribute
            ``steersman.batch_size``), else the longest shape prefix shared by all datasets.
            In a writable file a given batch size is stored, so reopening restores it.
        mode: ``"r"`` (read-only, default), ``"r+"`` (read/write), ``"w"`` (create or
            truncate), ``"w-"``/``"x"`` (create, fail if it exists), ``"a"`` (read/write,
            create if missing).
        device: where tensors go when they are read (default: CPU).
        **file_kwargs: passed to ``h5py.File`` (e.g. ``locking=False``).

    What is lazy and what is not:

    * reading a leaf (``td["obs"]``, ``td.get(("next", "reward"))``) reads that dataset;
      a nested group is returned as a nested ``PersistentTensorDict`` (nothing read);
    * indexing (``td[3:10]``, ``td[idx_tensor]``, ``td[mask]``, ``td[i][j]``) returns a
      lazily indexed ``PersistentTensorDict`` view; reading one of its leaves reads only
      the selected rows (index tensors are sorted and made unique for h5py, then the
      rows are put back in the asked order, duplicates included);
    * writes go to the file: ``td.set(key, value)`` creates or replaces a dataset,
      ``td[idx] = other``, ``set_``, ``update_``, ``apply_`` and in-place arithmetic
      (``td += 1``) write into the datasets; an indexed view can write into existing
      entries only. ``td["obs"][0] = x`` changes only the tensor that was read: write with
      ``td[0] = ...`` or ``td.set_at_("obs", x, 0)`` instead;
    * everything else returns an in-memory :class:`TensorDict`: shape ops (``reshape``,
      ``unbind``, ``split``, ``permute`` ...), ``apply``, arithmetic, reductions,
      ``select``/``exclude``, ``clone()``, ``to(device)``, ``to_tensordict()`` and
      ``torch.stack``/``torch.cat`` read the (selected part of the) file into memory.

    The ``steersman.batch_size`` attribute of the root group holds the batch size.
    Pickling stores the file name, group path, selection and mode (never the data), and
    unpickling reopens the file (a ``"w"`` file is reopened with ``"r+"``). HDF5 does not
    give space back when an entry is deleted or replaced by one of another shape/dtype.

    Example:
        >>> import os, tempfile, torch
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.tensordict.persistent import PersistentTensorDict
        >>> path = os.path.join(tempfile.mkdtemp(), "data.h5")
        >>> td = TensorDict({"obs": torch.arange(20.).reshape(10, 2),
        ...                  "next": {"reward": torch.ones(10, 1)}}, batch_size=[10])
        >>> PersistentTensorDict.from_dict(td, path).close()
        >>> with PersistentTensorDict.from_h5(path, mode="r+") as ptd:
        ...     view = ptd[torch.tensor([7, 2, 2])]          # nothing read yet
        ...     print(view["obs"][:, 0].tolist())           # reads rows 2 and 7 only
        ...     ptd[0] = TensorDict({"obs": torch.zeros(2), "next": {"reward": torch.zeros(1)}}, [])
        ...     print(ptd.batch_size, ptd["next", "reward"][:2, 0].tolist())
        [14.0, 4.0, 4.0]
        torch.Size([10]) [0.0, 1.0]
    """

    __slots__ = ("_file", "_group", "_owns_file", "_device", "_sel", "_stored_bs", "_is_root",
                 "_locked", "_ds_kwargs", "_file_kwargs", "__weakref__")

    def __init__(
        self,
        filename: Any = None,
        group: Any = None,
        batch_size: Any = None,
        mode: str = "r",
        device: Any = None,
        **file_kwargs: Any,
    ) -> None:
        h5py = _h5py()
        if mode not in ("r", "r+", "w", "w-", "x", "a"):
            raise ValueError(f"mode must be 'r', 'r+', 'w', 'w-', 'x' or 'a', got {mode!r}")
        if isinstance(group, h5py.Group):
            if filename is not None:
                raise ValueError("pass either filename or an open h5py group, not both")
            file, grp, owns = group.file, group, False
        else:
            if filename is None:
                raise ValueError("PersistentTensorDict needs a filename (or an open h5py group)")
            kw = dict(file_kwargs)
            if mode in _CREATE_MODES:
                kw.setdefault("track_order", True)
            file = h5py.File(os.fspath(filename), mode, **kw)
            owns = True
            grp = file
        try:
            if isinstance(group, str):
                if group not in file:
                    if file.mode == "r":
                        raise KeyError(f"group {group!r} is not in {file.filename}")
                    file.create_group(group, track_order=True)
                grp = file[group]
                if not isinstance(grp, h5py.Group):
                    raise KeyError(f"{group!r} in {file.filename} is a dataset, not a group")
            stored = _stored_batch_size(grp) if batch_size is None else _read_bs_attr(grp)
            _check_reads_only_this_file(grp, stored if batch_size is None else None)
            if batch_size is not None:
                bs = as_size(batch_size)
                if bs != stored:
                    _check_prefix(grp, bs)
                    if file.mode != "r":
                        grp.attrs[_BS_ATTR] = json.dumps(list(bs))
                stored = bs
            elif stored is None:
                stored = _auto_batch_size(grp)
                if file.mode != "r":
                    grp.attrs[_BS_ATTR] = json.dumps(list(stored))
        except BaseException:
            if owns:
                file.close()
            raise
        self._init(file, grp, owns, device, None, stored, True, False, {}, file_kwargs)

    def _init(self, file, group, owns, device, sel, stored_bs, is_root, locked, ds_kwargs, file_kwargs):
        self._file = file
        self._group = group
        self._owns_file = owns
        self._device = None if device is None else torch.device(device)
        self._sel = sel
        self._stored_bs = torch.Size(stored_bs)
        self._is_root = is_root
        self._locked = locked
        self._ds_kwargs = dict(ds_kwargs)
        self._file_kwargs = dict(file_kwargs)

    def _derive(self, group: Any, sel: _Sel | None, stored_bs: torch.Size, is_root: bool = False):
        out = PersistentTensorDict.__new__(PersistentTensorDict)
        out._init(self._file, group, self._owns_file, self._device, sel, stored_bs, is_root,
                  self._locked, self._ds_kwargs, self._file_kwargs)
        return out

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_h5(cls, filename: Any, mode: str = "r", **kwargs: Any) -> PersistentTensorDict:
        """Opens an HDF5 file (batch size: the stored one, else the shared leading dims)."""
        return cls(filename=filename, mode=mode, **kwargs)

    @classmethod
    def from_dict(
        cls,
        input_dict: Mapping | TensorDictBase,
        filename: Any,
        batch_size: Any = None,
        device: Any = None,
        compression: str | None = None,
        **dataset_kwargs: Any,
    ) -> PersistentTensorDict:
        """Writes a dict or container to a new file ``filename``; returns it opened ``"r+"``.

        ``compression`` (``"gzip"``, ``"lzf"`` ...) and ``dataset_kwargs``
        (``compression_opts``, ``chunks``, ``shuffle`` ...) go to ``h5py``'s
        ``create_dataset`` for every non-scalar tensor, now and for entries set later.
        Without ``batch_size`` a dict gets the shared leading dims of its leaves.
        """
        h5py = _h5py()
        if hasattr(input_dict, "_tensordict") and not isinstance(input_dict, TensorDictBase):
            input_dict = input_dict._tensordict  # a tensorclass instance
        if isinstance(input_dict, TensorDictBase):
            td = input_dict
            if batch_size is not None and as_size(batch_size) != td.batch_size:
                td = td.copy()
                td.batch_size = batch_size
        elif isinstance(input_dict, Mapping):
            td = TensorDict.from_dict(dict(input_dict), batch_size=batch_size)
        else:
            raise TypeError(f"from_dict expects a dict or a TensorDict, got {type(input_dict).__name__}")
        ds_kwargs = dict(dataset_kwargs)
        if compression is not None:
            ds_kwargs["compression"] = compression
        file = h5py.File(os.fspath(filename), "w", track_order=True)
        try:
            file.attrs[_BS_ATTR] = json.dumps(list(td.batch_size))
            _write_all(file, td, ds_kwargs)
            file.flush()
        except BaseException:
            file.close()
            raise
        out = cls.__new__(cls)
        out._init(file, file, True, device, None, td.batch_size, True, False, ds_kwargs, {})
        return out

    # ------------------------------------------------------------------ file handling
    @property
    def file(self) -> Any:
        """The open ``h5py.File``."""
        return self._file

    @property
    def filename(self) -> str:
        return self._file.filename

    @property
    def mode(self) -> str:
        """``"r"`` or ``"r+"`` (h5py's view of the open file)."""
        return self._file.mode

    def close(self) -> None:
        """Closes the file (also for views and nested containers that share it).

        A file opened from an ``h5py`` group passed by the caller is left open.
        """
        if self._owns_file and self._file.id.valid:
            self._file.close()

    def flush(self) -> None:
        self._file.flush()

    def __enter__(self) -> PersistentTensorDict:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _grp(self) -> Any:
        if not self._group.id.valid:
            raise RuntimeError("the HDF5 file of this PersistentTensorDict is closed")
        return self._group

    def _check_writable(self, what: Any) -> None:
        if self._grp().file.mode == "r":
            raise PermissionError(
                f"cannot write {what!r}: {self._file.filename} is open read-only (mode='r'); "
                "open it with mode='r+' or 'a' to write"
            )

    def __reduce__(self):
        mode = self._file.mode
        return (
            _rebuild,
            (self._file.filename, self._group.name, mode, self._device, self._sel, self._stored_bs,
             self._is_root, self._locked, self._ds_kwargs, self._file_kwargs),
        )

    # ------------------------------------------------------------------ properties
    @property
    def batch_size(self) -> torch.Size:
        sel = self._sel
        if sel is None:
            return self._stored_bs
        return sel.shape + self._stored_bs[sel.k:]

    @batch_size.setter
    def batch_size(self, new: Any) -> None:
        new = as_size(new)
        if new == self.batch_size:
            return
        if self._sel is not None or not self._is_root:
            raise RuntimeError(
                "only the batch size of an unindexed, top-level PersistentTensorDict can be changed"
            )
        grp = self._grp()
        _check_prefix(grp, new)
        if grp.file.mode != "r":
            grp.attrs[_BS_ATTR] = json.dumps(list(new))
        self._stored_bs = new

    @property
    def device(self) -> torch.device | None:
        return self._device

    @property
    def names(self) -> list:
        return [None] * len(self.batch_size)

    @names.setter
    def names(self, value: Any) -> None:
        if value is not None and any(n is not None for n in value):
            raise RuntimeError("PersistentTensorDict has no batch dim names; call to_tensordict() first")

    def is_shared(self) -> bool:
        return False

    def is_memmap(self) -> bool:
        return False

    # ------------------------------------------------------------------ reading
    def _child(self, grp: Any) -> PersistentTensorDict:
        stored = _read_bs_attr(grp)
        parent = self._stored_bs
        if stored is None or len(stored) < len(parent) or stored[: len(parent)] != parent:
            stored = parent
        return self._derive(grp, self._sel, stored)

    def _keys_str(self) -> list[str]:
        return list(self._grp().keys())

    def _get_str(self, key: str, default: Any) -> Any:
        grp = self._grp()
        obj = grp.get(key) if _valid_key(key) else None
        if obj is None:
            if default is NO_DEFAULT:
                raise missing_key_error(key, grp.keys())
            return default
        if isinstance(obj, _h5py().Group):
            return self._child(obj)
        return self._read_dataset(obj)

    def _leaf_shape(self, ds: Any) -> torch.Size:
        sel = self._sel
        return torch.Size(ds.shape) if sel is None else sel.shape + ds.shape[sel.k:]

    def _read_dataset(self, ds: Any) -> Any:
        kind = _ds_kind(ds)
        if kind == "tensor":
            t = _to_tensor(_read(ds, self._sel, False), ds)
            if self._device is not None and t.device != self._device:
                t = t.to(self._device)
            return t
        from .nontensor import MetaData, NonTensorData, NonTensorStack

        enc = _as_str(ds.attrs.get(_ENC_ATTR, "str"))
        if kind == "non_tensor_stack":
            arr = _read(ds, self._sel, True)
            if enc == "json":
                out = np.empty(arr.shape, dtype=object)
                flat = out.reshape(-1)
                for i, v in enumerate(arr.reshape(-1).tolist()):
                    flat[i] = json.loads(v)
                arr = out
            if arr.ndim == 0:
                return NonTensorData(arr[()], batch_size=torch.Size(()), device=self._device)
            return NonTensorStack(arr.astype(object), device=self._device)
        value = _decode(ds.asstr()[()], enc)
        cls = MetaData if kind == "metadata" else NonTensorData
        return cls(value, batch_size=self.batch_size, device=self._device)

    def get_item_shape(self, key: NestedKey) -> torch.Size:
        """The shape of the entry at ``key`` without reading it."""
        node, leaf = self._walk(unravel_key(key))
        obj = node._grp().get(leaf) if _valid_key(leaf) else None
        if obj is None:
            raise missing_key_error(leaf, node._grp().keys())
        if isinstance(obj, _h5py().Group):
            return node._child(obj).batch_size
        if _ds_kind(obj) in ("non_tensor", "metadata"):
            return node.batch_size
        return node._leaf_shape(obj)

    def _walk(self, key: NestedKey, create: bool = False) -> tuple[PersistentTensorDict, str]:
        """(the nested container holding ``key``, its last part); ``create`` adds groups."""
        if type(key) is str:
            return self, key
        node = self
        for i, k in enumerate(key[:-1]):
            grp = node._grp()
            obj = grp.get(k) if _valid_key(k) else None
            if obj is None:
                if not create:
                    raise missing_key_error(key[: i + 1], grp.keys())
                node._check_writable(key[: i + 1])
                _check_key(k)
                if node._sel is not None:
                    raise RuntimeError(f"cannot add the new key {key!r} to an indexed view of a PersistentTensorDict")
                if node._locked:
                    raise RuntimeError(f"cannot add key {key!r}: the PersistentTensorDict is locked")
                obj = _create_group(grp, k, node._stored_bs)
            elif not isinstance(obj, _h5py().Group):
                raise KeyError(f"cannot use {key!r}: {key[: i + 1]!r} is a leaf, not a nested container")
            node = node._child(obj)
        return node, key[-1]

    def __contains__(self, key: Any) -> bool:
        if type(key) is str:
            return _valid_key(key) and key in self._grp()
        if isinstance(key, tuple):
            try:
                key = unravel_key(key)
                node, leaf = self._walk(key)
            except (KeyError, TypeError):
                return False
            return _valid_key(leaf) and leaf in node._grp()
        raise TypeError("`key in td` takes a string or a tuple of strings")

    def _collect_keys(self, out, prefix, include_nested, leaves_only, is_leaf):
        h5py = _h5py()
        grp = self._grp()
        for key in grp.keys():
            obj = grp[key]
            is_group = isinstance(obj, h5py.Group)
            if is_leaf is None:
                sub = is_group
            else:
                sub = not is_leaf(self._entry_type(obj))
            full = prefix + (key,) if prefix else key
            if not sub or not leaves_only:
                out.append(full)
            if sub and include_nested and is_group:
                self._child(obj)._collect_keys(
                    out, full if type(full) is tuple else (full,), include_nested, leaves_only, is_leaf
                )

    def _entry_type(self, obj: Any) -> type:
        if isinstance(obj, _h5py().Group):
            return PersistentTensorDict
        kind = _ds_kind(obj)
        if kind == "tensor":
            return Tensor
        from .nontensor import MetaData, NonTensorData, NonTensorStack

        return {"metadata": MetaData, "non_tensor_stack": NonTensorStack}.get(kind, NonTensorData)

    def is_empty(self) -> bool:
        h5py = _h5py()
        found = []
        self._grp().visititems(lambda _n, o: found.append(1) or True if isinstance(o, h5py.Dataset) else None)
        return not found

    def to_tensordict(self) -> TensorDict:
        """Reads everything this (possibly indexed) container holds into a :class:`TensorDict`."""
        out = {}
        for key in self._keys_str():
            v = self._get_str(key, NO_DEFAULT)
            if isinstance(v, PersistentTensorDict):
                v = v.to_tensordict()
            out[key] = v
        return TensorDict._new_unsafe(out, self.batch_size, self._device, None)

    def get_at(self, key: NestedKey, index: Any, default: Any = NO_DEFAULT) -> Any:
        """``td.get(key)[index]``, reading only the selected rows when ``index`` is a batch index."""
        if key not in self:
            return self.get(key, default)
        try:
            idx = normalize_index(index, self.batch_dims)
        except (IndexError, TypeError):
            return self.get(key)[index]
        return self._index(idx).get(key)

    # ------------------------------------------------------------------ primitives
    def _index(self, index: Any) -> PersistentTensorDict:
        sel = self._sel if self._sel is not None else _Sel.full(self._stored_bs)
        sel = _extend(sel, self._stored_bs)
        return self._derive(self._group, _compose(sel, index), self._stored_bs)

    def _new_empty(self, batch_size: torch.Size) -> TensorDict:
        return TensorDict._new_unsafe({}, batch_size, self._device, None)

    def _apply_batch(self, fn: Callable, batch_size: torch.Size, names: Any) -> TensorDict:
        return self.to_tensordict()._apply_batch(fn, batch_size, names)

    def _split_batch(self, fn: Callable, batch_sizes: list) -> list[TensorDict]:
        return self.to_tensordict()._split_batch(fn, batch_sizes)

    def _map(self, fn: Callable, others: tuple, **kwargs: Any) -> TensorDict:
        return self.to_tensordict()._map(fn, others, **kwargs)

    @staticmethod
    def _stack_impl(vals: Sequence[Any], dim: int) -> TensorDictBase:
        return torch.stack([_in_memory(v) for v in vals], dim)

    @staticmethod
    def _cat_impl(vals: Sequence[Any], dim: int) -> TensorDictBase:
        return torch.cat([_in_memory(v) for v in vals], dim)

    # ------------------------------------------------------------------ writing
    def _set_str(self, key: str, value: Any, inplace: bool, validated: bool) -> None:
        self._check_writable(key)
        _check_key(key)
        grp = self._grp()
        existing = grp.get(key)
        if self._sel is not None:
            if existing is None:
                raise RuntimeError(
                    f"cannot add the new key {key!r} to an indexed view of a PersistentTensorDict; "
                    "set it on the unindexed container"
                )
            self._write_entry(key, value)
            return
        if isinstance(value, Mapping) and not is_tensor_collection(value):
            value = _dict_view(value)
        if not validated:
            bs = self.batch_size
            shape = value.shape if isinstance(value, Tensor) else value.batch_size
            if shape[: len(bs)] != bs:
                raise ValueError(
                    f"batch size mismatch for key {key!r}: the PersistentTensorDict has batch_size "
                    f"{list(bs)} but the value has shape {list(shape)}"
                )
        if existing is None:
            if self._locked:
                raise RuntimeError(f"cannot add key {key!r}: the PersistentTensorDict is locked")
            _create_entry(grp, key, value, self._ds_kwargs)
            return
        h5py = _h5py()
        if isinstance(existing, h5py.Dataset) and isinstance(value, Tensor) and _ds_kind(existing) == "tensor":
            same = tuple(existing.shape) == tuple(value.shape) and _ds_dtype(existing) == value.dtype
            if inplace or self._locked or same:
                self._write_entry(key, value)
                return
        elif isinstance(existing, h5py.Group) and _is_branch(value) and (inplace or self._locked):
            self._child(existing).update_(value)
            return
        if self._locked:
            raise RuntimeError(f"cannot replace key {key!r}: the PersistentTensorDict is locked")
        del grp[key]
        _create_entry(grp, key, value, self._ds_kwargs)

    def _write_entry(self, key: str, value: Any) -> None:
        """Writes ``value`` into the existing entry ``key`` at this view's selection."""
        grp = self._grp()
        obj = grp.get(key) if _valid_key(key) else None
        if obj is None:
            raise missing_key_error(key, grp.keys())
        if isinstance(obj, _h5py().Group):
            if isinstance(value, Mapping) and not is_tensor_collection(value):
                value = _dict_view(value)
            self._child(obj).update_(value)
            return
        kind = _ds_kind(obj)
        target = self._leaf_shape(obj)
        if kind == "tensor":
            if is_tensor_collection(value):
                raise ValueError(f"entry {key!r} is a tensor in the file but a container in the value")
            src = value if isinstance(value, Tensor) else torch.as_tensor(value)
            _check_broadcast(src.shape, target, key)
            arr, _ = _to_numpy(src.to(_ds_dtype(obj)).expand(target))
            _write(obj, self._sel, arr, False)
            return
        data = value
        if _is_non_tensor(value):
            data = value.to_object_array() if getattr(type(value), "_is_stack", False) else value.data
        if kind == "non_tensor_stack":
            if isinstance(data, (list, tuple)) and len(target) and len(data) == target[0]:
                from .nontensor import _object_array

                data = _object_array(list(data), target)
            arr = np.empty(tuple(target), dtype=object)
            if isinstance(data, np.ndarray):
                arr[...] = np.broadcast_to(data, arr.shape) if data.shape != arr.shape else data
            elif arr.ndim:
                arr.fill(data)
            else:
                arr[()] = data
            strs, enc = _encode(arr.reshape(-1).tolist())
            stored_enc = _as_str(obj.attrs.get(_ENC_ATTR, "str"))
            if enc != stored_enc:
                if stored_enc == "json":
                    strs = [json.dumps(v) for v in arr.reshape(-1).tolist()]
                elif self._sel is None:
                    obj.attrs[_ENC_ATTR] = enc
                else:
                    raise TypeError(
                        f"entry {key!r} holds strings; cannot write non-string values into part of it"
                    )
            out = np.empty(arr.shape, dtype=object)
            out.reshape(-1)[:] = strs or []
            _write(obj, self._sel, out, True)
            return
        if isinstance(data, np.ndarray):  # a stack written into a shared value
            vals = data.reshape(-1).tolist()
            if not vals or any(not _same(v, vals[0]) for v in vals):
                raise ValueError(f"cannot write different values into the shared non-tensor entry {key!r}")
            data = vals[0]
        current = _decode(obj.asstr()[()], _as_str(obj.attrs.get(_ENC_ATTR, "str")))
        if _same(current, data):
            return
        if self._sel is not None:
            raise ValueError(
                f"cannot write the non-tensor value {data!r} into part of a batch that shares "
                f"the value {current!r}; store per-element values as a NonTensorStack"
            )
        (s,), enc = _encode([data])
        obj[()] = s
        obj.attrs[_ENC_ATTR] = enc

    def set(self, key: NestedKey, item: Any, inplace: bool = False, **kwargs: Any) -> PersistentTensorDict:
        """Writes ``item`` at ``key`` into the file (creating datasets/groups as needed).

        A ``dict`` becomes a nested group; on an indexed view ``key`` must exist and the
        value is written into the selected rows.
        """
        key = unravel_key(key)
        node, leaf = self._walk(key, create=True)
        if isinstance(item, Mapping) and not is_tensor_collection(item):
            item = TensorDict(dict(item), batch_size=node.batch_size, device=node.device)
        node._set_str(leaf, node._prepare_value(leaf, item), inplace, False)
        return self

    def set_(self, key: NestedKey, item: Any, *, non_blocking: bool = False) -> PersistentTensorDict:
        """Writes ``item`` into the existing entry at ``key`` (broadcast, cast to its dtype)."""
        self._check_writable(key)
        node, leaf = self._walk(unravel_key(key))
        node._write_entry(leaf, item)
        return self

    def set_at_(self, key: NestedKey, value: Any, index: Any, *, non_blocking: bool = False) -> PersistentTensorDict:
        """``td.get(key)[index] = value``, written to the file."""
        self._check_writable(key)
        key = unravel_key(key)
        try:
            idx = normalize_index(index, self.batch_dims)
        except (IndexError, TypeError):
            idx = None
        if idx is not None:
            self._index(idx).set_(key, value)
            return self
        x = self.get(key)
        x[index] = value
        return self.set_(key, x)

    def _del_str(self, key: str) -> None:
        self._check_writable(key)
        if self._sel is not None:
            raise RuntimeError(f"cannot delete {key!r} through an indexed view of a PersistentTensorDict")
        if self._locked:
            raise RuntimeError(f"cannot delete key {key!r}: the PersistentTensorDict is locked")
        grp = self._grp()
        if not _valid_key(key) or key not in grp:
            raise missing_key_error(key, grp.keys())
        del grp[key]

    def rename_key_(self, old_key: NestedKey, new_key: NestedKey, safe: bool = False) -> PersistentTensorDict:
        old_key, new_key = unravel_key(old_key), unravel_key(new_key)
        if type(old_key) is str and type(new_key) is str and self._sel is None:
            self._check_writable(old_key)
            _check_key(new_key)
            grp = self._grp()
            if old_key not in grp:
                raise missing_key_error(old_key, grp.keys())
            if self._locked:
                raise RuntimeError("cannot rename keys of a locked PersistentTensorDict")
            if new_key in grp:
                if safe:
                    raise KeyError(f"key {new_key!r} already exists; pass safe=False to overwrite it")
                del grp[new_key]
            grp.move(old_key, new_key)
            return self
        super().rename_key_(old_key, new_key, safe)
        return self

    def update(
        self,
        input_dict_or_td: Mapping | TensorDictBase,
        clone: bool = False,
        inplace: bool = False,
        *,
        keys_to_update: Sequence[NestedKey] | None = None,
    ) -> PersistentTensorDict:
        """Sets every entry of the input into the file; nested containers are merged."""
        src = input_dict_or_td
        if keys_to_update is not None:
            if not is_tensor_collection(src):
                src = _dict_view(src)
            src = src.select(*keys_to_update, strict=False)
        if isinstance(src, TensorDictBase):
            items = [(k, src._get_str(k, NO_DEFAULT)) for k in src._keys_str()]
        else:
            items = list(src.items())
        _validate_update_items(items, self.batch_size, ())  # everything, nested too, before writing
        grp = self._grp()
        for key, value in items:
            branch = (isinstance(value, Mapping) and not is_tensor_collection(value)) or _is_branch(value)
            if type(key) is str and branch and isinstance(grp.get(key) if _valid_key(key) else None,
                                                           _h5py().Group):
                self._child(grp[key]).update(value, inplace=inplace)
            else:
                self.set(key, value, inplace=inplace)
        return self

    def view(self, *shape: Any, dtype: torch.dtype | None = None) -> TensorDictBase:
        """Refused: the leaves live in the file, so there is no storage to view (use ``reshape``)."""
        raise RuntimeError(
            "a PersistentTensorDict can't be viewed: its leaves live in an HDF5 file, so a view "
            "couldn't write through; use reshape() for an in-memory copy"
        )

    def update_(self, input_dict_or_td: Mapping | TensorDictBase | Any, clone: bool = False, *,
                non_blocking: bool = False, keys_to_update: Any = None) -> PersistentTensorDict:
        """Writes the input into the existing entries (validated first; nothing new is created).

        ``keys_to_update``: only these keys; ``non_blocking``: file writes are synchronous."""
        self._check_writable("<update_>")
        src = input_dict_or_td
        if keys_to_update is not None:
            src = _update_source(src, keys_to_update, False)
        if isinstance(src, Mapping) and not is_tensor_collection(src):
            src = _dict_view(src)
        pairs: list = []
        self._collect_pairs(src, pairs, ())
        for node, key, value in pairs:
            node._write_entry(key, value)
        return self

    def _collect_pairs(self, src: Any, pairs: list, prefix: tuple) -> None:
        h5py = _h5py()
        grp = self._grp()
        bs = self.batch_size
        if not is_tensor_collection(src):  # one value written into every tensor leaf
            for key in grp.keys():
                obj = grp[key]
                if isinstance(obj, h5py.Group):
                    self._child(obj)._collect_pairs(src, pairs, prefix + (key,))
                elif _ds_kind(obj) == "tensor":
                    target = self._leaf_shape(obj)
                    val = src
                    if isinstance(src, Tensor):
                        if src.ndim and src.ndim <= len(bs) and src.shape == bs[: src.ndim]:
                            val = expand_right(src, target)
                        _check_broadcast(val.shape, target, prefix or "<every leaf>")
                    pairs.append((self, key, val))
            return
        for key in src._keys_str():
            s = src._get_str(key, NO_DEFAULT)
            obj = grp.get(key) if _valid_key(key) else None
            full = prefix + (key,)
            name = full if len(full) > 1 else key
            if obj is None:
                raise KeyError(
                    f"key {name!r} is not in the destination; an in-place write can only "
                    f"update existing entries (existing: {sorted(grp.keys())})"
                )
            if isinstance(obj, h5py.Group):
                self._child(obj)._collect_pairs(s, pairs, full)
            elif _ds_kind(obj) == "tensor":
                if _is_branch(s):
                    raise ValueError(f"entry {name!r} is a tensor in the destination but a container in the source")
                if not isinstance(s, Tensor):
                    s = torch.as_tensor(s)
                _check_broadcast(s.shape, self._leaf_shape(obj), name)
                pairs.append((self, key, s))
            else:
                pairs.append((self, key, s))

    def _setitem_batch(self, index: Any, value: Any) -> None:
        from .base import _preallocate, _undo_preallocate

        added = _preallocate(self, value) if is_tensor_collection(value) else None
        try:
            view = self if isinstance(index, tuple) and not index else self._index(index)
            view.update_(value)
        except BaseException:
            _undo_preallocate(added)
            raise

    def _map_(self, fn: Callable, others: tuple, *, default: Any = NO_DEFAULT, assign: bool = True) -> None:
        self._check_writable("<in-place op>")
        work: list = []
        self._gather(others, default, work, ())
        for node, key, args in work:
            x = node._get_str(key, NO_DEFAULT)
            r = fn(x, *args)
            node._write_entry(key, r if assign and r is not None else x)

    def _gather(self, others: tuple, default: Any, work: list, prefix: tuple) -> None:
        h5py = _h5py()
        grp = self._grp()
        for k in grp.keys():
            obj = grp[k]
            args = tuple(_other_entry(o, k, default, prefix) for o in others)
            if isinstance(obj, h5py.Group):
                self._child(obj)._gather(args, default, work, prefix + (k,))
            elif _ds_kind(obj) == "tensor":
                target = self._leaf_shape(obj)
                for a in args:
                    if isinstance(a, Tensor) and a.shape != target:
                        _check_broadcast(a.shape, target, prefix + (k,) if prefix else k)
                work.append((self, k, args))

    def zero_(self) -> PersistentTensorDict:
        self._map_(torch.Tensor.zero_, (), assign=False)
        return self

    def fill_(self, key: NestedKey, value: float | bool) -> PersistentTensorDict:
        target = self.get(key)
        if isinstance(target, Tensor):
            return self.set_(key, torch.as_tensor(value))
        target._map_(lambda x: x.fill_(value), (), assign=False)
        return self

    def add_(self, other: Any, *, alpha: float | None = None) -> PersistentTensorDict:
        if alpha is not None:
            return self._binary_(lambda x, y: x.add_(y, alpha=alpha), other)
        return self._binary_(Tensor.add_, other)

    def mul_(self, other: Any) -> PersistentTensorDict:
        return self._binary_(Tensor.mul_, other)

    def lerp_(self, end: Any, weight: Any) -> PersistentTensorDict:
        return self._binary_(lambda x, e: x.lerp_(e, weight), end)

    def _unary_(self, name: str) -> PersistentTensorDict:
        self._map_(lambda x: getattr(x, f"{name}_")(), (), assign=False)
        return self

    # ------------------------------------------------------------------ in-memory results
    def clone(self, recurse: bool = True, **kwargs: Any) -> TensorDictBase:
        """An in-memory :class:`TensorDict` copy of this (possibly indexed) container."""
        return self.to_tensordict() if recurse else self.copy()

    def to(self, *args: Any, **kwargs: Any) -> TensorDictBase:
        """Reads into memory, then moves/casts like :meth:`TensorDict.to`."""
        return self.to_tensordict().to(*args, **kwargs)

    def select(self, *keys: NestedKey, inplace: bool = False, strict: bool = True, as_tensordict: bool = False) -> TensorDictBase:
        """An in-memory TensorDict with ``keys`` (reads only them); ``inplace`` deletes the others."""
        out = super().select(*keys, inplace=inplace, strict=strict)
        return out if inplace else _materialize(out)

    def exclude(self, *keys: NestedKey, inplace: bool = False) -> TensorDictBase:
        """An in-memory TensorDict without ``keys``; ``inplace`` deletes them from the file."""
        if inplace:
            return super().exclude(*keys, inplace=True)
        keys = [unravel_key(k) for k in keys]
        top = {k for k in keys if type(k) is str}
        out = self.select(*[k for k in self._keys_str() if k not in top])
        nested = [k for k in keys if type(k) is tuple]
        return out.exclude(*nested, inplace=True) if nested else out

    def bytes(self, *, count_duplicates: bool = False) -> int:
        """The bytes the (selected) tensor leaves take once read, from the file's metadata."""
        h5py = _h5py()
        total = 0

        def visit(node: PersistentTensorDict) -> None:
            nonlocal total
            grp = node._grp()
            for k in grp.keys():
                obj = grp[k]
                if isinstance(obj, h5py.Group):
                    visit(node._child(obj))
                elif _ds_kind(obj) == "tensor":
                    total += math.prod(node._leaf_shape(obj)) * _ds_dtype(obj).itemsize

        visit(self)
        return total

    # ------------------------------------------------------------------ locking
    def lock_(self) -> PersistentTensorDict:
        """Refuses new, replaced or deleted keys (in-place writes still go to the file)."""
        self._locked = True
        return self

    def unlock_(self) -> PersistentTensorDict:
        self._locked = False
        return self

    def _is_locked_flag(self) -> bool:
        return self._locked

    # ------------------------------------------------------------------ repr
    def __repr__(self) -> str:
        try:
            grp = self._grp()
        except RuntimeError:
            return "PersistentTensorDict(<closed file>)"
        fields = self._fields_repr(8)
        return (
            f"PersistentTensorDict(\n    fields={{{fields}}},\n    batch_size={self.batch_size},\n"
            f"    device={self.device},\n    file={grp.file.filename!r},\n    group={grp.name!r},\n"
            f"    mode={grp.file.mode!r})"
        )

    def _fields_repr(self, indent: int) -> str:
        h5py = _h5py()
        pad = " " * indent
        grp = self._grp()
        lines = []
        for key in grp.keys():
            obj = grp[key]
            if isinstance(obj, h5py.Group):
                child = self._child(obj)
                desc = (f"PersistentTensorDict(\n{pad}    fields={{{child._fields_repr(indent + 8)}}},\n"
                        f"{pad}    batch_size={child.batch_size})")
            elif _ds_kind(obj) == "tensor":
                desc = f"Tensor(shape={self._leaf_shape(obj)}, dtype={_ds_dtype(obj)}, lazy)"
            else:
                desc = f"{self._entry_type(obj).__name__}(lazy)"
            lines.append(f"\n{pad}{key}: {desc}")
        return ",".join(lines) + (f"\n{' ' * (indent - 4)}" if lines else "")


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:
        return False


def _in_memory(v: Any) -> Any:
    return v.to_tensordict() if isinstance(v, PersistentTensorDict) else v


if importlib.util.find_spec("h5py") is None:  # pragma: no cover - only without the optional h5py
    # the class example opens an HDF5 file: without h5py it is dropped from the docstring, so
    # that doctest runs (pytest --doctest-modules) do not fail on a missing optional package
    PersistentTensorDict.__doc__ = (PersistentTensorDict.__doc__ or "").split("    Example:")[0]


def _rebuild(filename, group_name, mode, device, sel, stored_bs, is_root, locked, ds_kwargs, file_kwargs):
    h5py = _h5py()
    file = h5py.File(filename, "r" if mode == "r" else "r+", **file_kwargs)
    out = PersistentTensorDict.__new__(PersistentTensorDict)
    out._init(file, file[group_name], True, device, sel, stored_bs, is_root, locked, ds_kwargs, file_kwargs)
    return out


def to_h5(td: Mapping | TensorDictBase, filename: Any, **kwargs: Any) -> PersistentTensorDict:
    """Writes ``td`` to a new HDF5 file; returns it as a :class:`PersistentTensorDict` (``"r+"``).

    Keyword arguments go to :meth:`PersistentTensorDict.from_dict` (``compression`` ...).
    """
    return PersistentTensorDict.from_dict(td, filename, **kwargs)


def _validate_update_items(items: Sequence, bs: torch.Size, prefix: tuple) -> None:
    """Checks the leading dims of every leaf of an update (nested ones too) against ``bs``."""
    for key, value in items:
        name = prefix + (key,) if prefix else key
        if isinstance(value, Tensor):
            if value.shape[: len(bs)] != bs:
                raise ValueError(
                    f"batch size mismatch for key {name!r}: expected leading dims {list(bs)}, "
                    f"got shape {list(value.shape)}"
                )
        elif isinstance(value, TensorDictBase) and _is_branch(value):
            _validate_update_items([(k, value._get_str(k, NO_DEFAULT)) for k in value._keys_str()], bs,
                                   prefix + (key,))
        elif isinstance(value, Mapping):
            _validate_update_items(list(value.items()), bs, prefix + (key,))
