"""Small helpers tensordict exports: dtype predicates, key helpers, ``group_by``,
``assert_close``, and memmap archives (``pack_memmap``/``unpack_memmap``).

Example:
    >>> import torch
    >>> from steersman.tensordict import TensorDict, assert_close, group_by
    >>> td = TensorDict({"g": torch.tensor([1, 0, 1]), "x": torch.arange(3)}, [3])
    >>> values, groups = group_by(td, "g")
    >>> values.tolist(), [g["x"].tolist() for g in groups]
    ([0, 1], [[1], [0, 2]])
    >>> assert_close(td, td.clone())
    True
"""

from __future__ import annotations

import abc
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ._utils import NO_DEFAULT, NestedKey, unravel_key
from .base import TensorDictBase, _is_non_tensor, is_tensor_collection
from .switches import set_lazy_legacy

__all__ = [
    "KEY_SEPARATOR", "unravel_key_to_tuple", "is_bool", "is_floating", "is_integer", "is_inexact",
    "default_is_leaf", "is_leaf_nontensor", "group_by", "dense_stack_tds", "assert_close",
    "assert_allclose_td", "pack_memmap", "unpack_memmap", "is_memmap_archive", "unpad_sequence",
    "collate", "TensorCollection", "NonTensorDataBase",
]

#: the separator ``flatten_keys`` uses by default
KEY_SEPARATOR = "."


def unravel_key_to_tuple(key: NestedKey) -> tuple[str, ...]:
    """A key as a flat tuple: ``"a"`` -> ``("a",)``, ``("a", ("b",))`` -> ``("a", "b")``."""
    k = unravel_key(key)
    return (k,) if isinstance(k, str) else k


def _dtype(args: tuple) -> torch.dtype:
    if not args:
        raise TypeError("a dtype predicate needs a value (its last argument)")
    return args[-1].dtype


def is_bool(*args: Any) -> bool:
    """Whether the last argument (``fn(value)`` or ``fn(key, value)``) is a bool tensor."""
    return _dtype(args) is torch.bool


def is_floating(*args: Any) -> bool:
    """Whether the last argument is a floating-point tensor."""
    return _dtype(args).is_floating_point


def is_integer(*args: Any) -> bool:
    """Whether the last argument is an integer (not bool) tensor."""
    d = _dtype(args)
    return not d.is_floating_point and not d.is_complex and d is not torch.bool


def is_inexact(*args: Any) -> bool:
    """Whether the last argument is a floating-point or complex tensor."""
    d = _dtype(args)
    return d.is_floating_point or d.is_complex


def default_is_leaf(cls: type) -> bool:
    """Whether values of type ``cls`` are leaves of a TensorDict (anything not a container)."""
    return not getattr(cls, "_is_tensor_collection", False)


def is_leaf_nontensor(cls: type) -> bool:
    """Like :func:`default_is_leaf`, with non-tensor entries counted as leaves too."""
    return default_is_leaf(cls) or bool(getattr(cls, "_is_non_tensor", False))


def group_by(tensordict: TensorDictBase, key: NestedKey) -> tuple[Tensor, tuple[TensorDictBase, ...]]:
    """Splits ``tensordict`` (1-D batch) by the values of the entry ``key``.

    Returns the sorted unique values and one container per value (its rows, in order).
    """
    if tensordict.batch_dims != 1:
        raise ValueError(f"group_by needs a 1-D batch, got batch_size {list(tensordict.batch_size)}")
    values = tensordict.get(key)
    if not isinstance(values, Tensor):
        raise TypeError(f"group_by: the entry {key!r} must be a tensor, got {type(values).__name__}")
    flat = values.reshape(values.shape[0], -1)[:, 0] if values.ndim > 1 else values
    uniq = torch.unique(flat, sorted=True)
    return uniq, tuple(tensordict[(flat == u).nonzero().squeeze(-1)] for u in uniq)


def dense_stack_tds(td_list: Sequence[TensorDictBase] | TensorDictBase, dim: int | None = None) -> TensorDictBase:
    """A dense (not lazy) stack of containers; a lazy stack is densified along its stack dim."""
    if is_tensor_collection(td_list):
        if dim is None:
            dim = getattr(td_list, "stack_dim", 0)
        td_list = list(td_list.tensordicts) if hasattr(td_list, "tensordicts") else list(td_list.unbind(dim))
    if dim is None:
        dim = 0
    with set_lazy_legacy(False):
        out = torch.stack(list(td_list), dim)
    if getattr(type(out), "_is_lazy", False):
        out = out.to_tensordict() if hasattr(out, "to_tensordict") else out.contiguous()
    return out


# ----------------------------------------------------------------------------- comparison
def assert_close(actual: Any, expected: Any, rtol: float | None = None, atol: float | None = None,
                 equal_nan: bool = True, intersection: bool = False, msg: str = "",
                 prefix: NestedKey = ()) -> bool:
    """Raises AssertionError naming the first entry where ``actual`` and ``expected`` differ.

    Keys must match (``intersection=True`` compares the common keys only); tensors are
    compared with :func:`torch.testing.assert_close` (``rtol``/``atol`` as there),
    non-tensor entries with ``==``. Returns True.
    """
    if not is_tensor_collection(actual) or not is_tensor_collection(expected):
        raise TypeError(f"assert_close compares two containers, got {type(actual).__name__} and "
                        f"{type(expected).__name__}")
    prefix = unravel_key_to_tuple(prefix) if prefix else ()
    if actual.batch_size != expected.batch_size:
        raise AssertionError(f"{msg}batch sizes differ: {list(actual.batch_size)} != {list(expected.batch_size)}")
    ka, kb = set(actual._keys_str()), set(expected._keys_str())
    if ka != kb and not intersection:
        raise AssertionError(f"{msg}keys differ at {prefix or '<root>'}: only in actual {sorted(ka - kb)}, "
                             f"only in expected {sorted(kb - ka)}")
    for k in sorted(ka & kb):
        a, b = actual._get_str(k, NO_DEFAULT), expected._get_str(k, NO_DEFAULT)
        full = prefix + (k,)
        if isinstance(a, Tensor) and isinstance(b, Tensor):
            try:
                torch.testing.assert_close(a.as_subclass(Tensor), b.as_subclass(Tensor), rtol=rtol, atol=atol,
                                           equal_nan=equal_nan, check_device=False)
            except AssertionError as err:
                raise AssertionError(f"{msg}entry {full if len(full) > 1 else full[0]!r} differs: {err}") from None
        elif _is_non_tensor(a) or _is_non_tensor(b):
            va = a.tolist() if hasattr(a, "tolist") else a
            vb = b.tolist() if hasattr(b, "tolist") else b
            if va != vb:
                raise AssertionError(f"{msg}entry {full!r} differs: {va!r} != {vb!r}")
        elif is_tensor_collection(a) and is_tensor_collection(b):
            assert_close(a, b, rtol, atol, equal_nan, intersection, msg, full)
        else:
            raise AssertionError(f"{msg}entry {full!r}: {type(a).__name__} vs {type(b).__name__}")
    return True


#: the older name of :func:`assert_close`
assert_allclose_td = assert_close


# ----------------------------------------------------------------------------- memmap archives
_COMPRESSIONS = {None: "", "gz": "gz", "gzip": "gz", "bz2": "bz2", "xz": "xz", "lzma": "xz"}


def pack_memmap(prefix: str | Path, archive_path: str | Path, *, compression: str | int | None = None,
                compresslevel: int | None = None) -> Path:
    """Packs a memory-mapped TensorDict folder (``td.memmap(prefix)``) into one tar archive.

    ``compression``: None (plain tar), ``"gz"``, ``"bz2"`` or ``"xz"``. Returns the path.
    :func:`unpack_memmap` restores the folder.
    """
    prefix = Path(prefix)
    if not (prefix / "meta.json").is_file():
        raise FileNotFoundError(f"pack_memmap: {prefix} is not a memmap folder (no meta.json)")
    if compression not in _COMPRESSIONS:
        raise ValueError(f"pack_memmap: compression must be one of {sorted(k for k in _COMPRESSIONS if k)}, "
                         f"got {compression!r}")
    mode = "w:" + _COMPRESSIONS[compression]
    kwargs = {"compresslevel": compresslevel} if compresslevel is not None and mode != "w:" and mode != "w:xz" else {}
    archive_path = Path(archive_path)
    with tarfile.open(archive_path, mode, **kwargs) as tar:
        for p in sorted(prefix.rglob("*")):
            if p.is_symlink():
                raise ValueError(f"pack_memmap: {p} is a symlink; a memmap archive holds plain files only")
            tar.add(p, arcname=str(p.relative_to(prefix)), recursive=False)
    return archive_path


def is_memmap_archive(path: str | Path) -> bool:
    """Whether ``path`` is a tar archive holding a memmap folder (a ``meta.json`` at its root)."""
    try:
        with tarfile.open(path, "r:*") as tar:
            return "meta.json" in tar.getnames()
    except (tarfile.TarError, OSError):
        return False


def unpack_memmap(archive_path: str | Path, prefix: str | Path) -> Path:
    """Extracts an archive from :func:`pack_memmap` into ``prefix`` (returned).

    Only regular files and folders inside ``prefix`` are extracted: links, devices and
    paths that leave the folder are refused (tarfile's ``data`` filter).
    """
    prefix = Path(prefix)
    if not is_memmap_archive(archive_path):
        raise ValueError(f"unpack_memmap: {archive_path} is not a memmap archive (no meta.json at its root)")
    prefix.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive_path, "r:*") as tar:
        for m in tar.getmembers():
            if not (m.isfile() or m.isdir()):
                raise ValueError(f"unpack_memmap: {m.name!r} in {archive_path} is not a plain file")
        tar.extractall(prefix, filter="data")
    return prefix


# ----------------------------------------------------------------------------- padding and batching
def unpad_sequence(padded: TensorDictBase, mask: Any = None, *, pad_dim: int = 0) -> TensorDictBase:
    """Splits a batch from ``pad_sequence(..., return_mask=True)`` back into its samples.

    Row ``i`` keeps the positions ``mask[i]`` marks along its batch dim ``pad_dim``; the
    rows are returned as a lazy stack of batch ``[len(padded), *batch[1:pad_dim + 1]]``
    (the ragged dim and those after it become feature dims of each member). ``mask``: a bool tensor
    ``[len(padded), max_len, ...]``, a TensorDict of masks (its first leaf is used), or
    None to read (and drop) the ``"masks"`` entry of ``padded``.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict, pad_sequence
        >>> seqs = [TensorDict(x=torch.arange(n), batch_size=[n]) for n in (2, 3)]
        >>> rows = unpad_sequence(pad_sequence(seqs, return_mask=True))
        >>> [r["x"].tolist() for r in rows.tensordicts]
        [[0, 1], [0, 1, 2]]
    """
    from .lazy import lazy_stack

    if mask is None:
        mask = padded.get("masks", None)
        if mask is None:
            raise KeyError("unpad_sequence: no mask given and no 'masks' entry in the padded batch")
        padded = padded.exclude("masks")
    if is_tensor_collection(mask):
        leaves = [v for v in mask.values(include_nested=True, leaves_only=True)]
        if not leaves:
            raise ValueError("unpad_sequence: the mask TensorDict has no entries")
        mask = leaves[0]
    if mask.dtype is not torch.bool or mask.shape[0] != padded.batch_size[0]:
        raise ValueError(f"unpad_sequence: the mask must be bool with {padded.batch_size[0]} rows, got "
                         f"{mask.dtype} {list(mask.shape)}")
    rows = []
    for i in range(padded.batch_size[0]):
        m = mask[i]
        m = m.movedim(pad_dim, 0).reshape(m.shape[pad_dim], -1)[:, 0] if m.ndim > 1 else m
        idx = m.nonzero().squeeze(-1)
        row = padded[i][(slice(None),) * pad_dim + (idx,)]
        row.batch_size = row.batch_size[:pad_dim]  # the ragged dim leaves the batch
        rows.append(row)
    return lazy_stack(rows, 0)


def collate(batch: Any, *, pad_keys: Any = None, nested_keys: Any = None, mask_key: NestedKey | None = None) -> Any:
    """A ``collate_fn`` for ``torch.utils.data.DataLoader`` over containers.

    Containers are stacked (densely when they match, lazily otherwise), tensors with
    ``torch.stack``, dicts and tuples entry by entry (a namedtuple keeps its type); other
    values go to ``default_collate``. ``pad_keys={key: value}`` pads those entries of
    the samples along their first dim to the longest (with ``value``); with
    ``mask_key``, the valid positions of each padded key are written at
    ``(mask_key, *key)``. ``nested_keys`` (nested tensors) is not supported here and
    raises ``NotImplementedError``. Anything but a non-empty list is returned as is.
    """
    from .functional import maybe_dense_stack

    if nested_keys:
        raise NotImplementedError("collate(nested_keys=...): nested (jagged) tensors are not supported; "
                                  "use pad_keys to pad the entries instead")
    if not isinstance(batch, list) or not batch:
        return batch
    first = batch[0]
    if is_tensor_collection(first):
        if pad_keys:
            batch, masks = _pad_entries(batch, pad_keys)
            out = maybe_dense_stack(batch, 0)
            if mask_key is not None:
                for key, m in masks.items():
                    out.set(unravel_key_to_tuple(mask_key) + unravel_key_to_tuple(key), m)
            return out
        return maybe_dense_stack(batch, 0)
    if isinstance(first, Tensor):
        return torch.stack(batch)
    kw = dict(pad_keys=pad_keys, mask_key=mask_key)
    if isinstance(first, dict):
        return {k: collate([b[k] for b in batch], **kw) for k in first}
    if isinstance(first, tuple):
        items = [collate([b[i] for b in batch], **kw) for i in range(len(first))]
        return type(first)(*items) if hasattr(type(first), "_fields") else tuple(items)
    from torch.utils.data import default_collate

    return default_collate(batch)


def _pad_entries(batch: list, pad_keys: Any) -> tuple[list, dict]:
    batch = [b.clone(False) for b in batch]
    masks = {}
    for key, value in dict(pad_keys).items():
        key = unravel_key(key)
        vals = [b.get(key) for b in batch]
        longest = max(v.shape[0] for v in vals)
        m = torch.zeros(len(vals), longest, dtype=torch.bool)
        for i, (b, v) in enumerate(zip(batch, vals)):
            m[i, : v.shape[0]] = True
            if v.shape[0] < longest:
                fill = torch.full((longest - v.shape[0], *v.shape[1:]), value, dtype=v.dtype, device=v.device)
                b.set(key, torch.cat([v, fill]))
        masks[key] = m
    return batch, masks


# ----------------------------------------------------------------------------- base-type names
#: the base of every container here (TensorDict, lazy stacks, tensorclasses, non-tensor
#: entries); tensordict's ``TensorCollection`` is that role
TensorCollection = TensorDictBase


class NonTensorDataBase(abc.ABC):  # noqa: B024 (a type for isinstance checks only)
    """``isinstance(x, NonTensorDataBase)``: ``x`` is a non-tensor entry (a
    ``NonTensorData``, ``MetaData`` or ``NonTensorStack``)."""

    @classmethod
    def __subclasshook__(cls, sub: type) -> bool:
        return bool(getattr(sub, "_is_non_tensor", False)) or NotImplemented
