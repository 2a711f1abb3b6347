"""``TensorDict``: a dict of tensors sharing leading batch dims, used like one tensor.

Storage is a plain ``dict`` from string keys to tensors, nested ``TensorDict``s or
non-tensor entries. Shapes are validated when an entry is set, never when it is read,
so reads cost little more than a dict lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from ._utils import (
    NO_DEFAULT,
    NestedKey,
    as_size,
    indexed_batch_size,
    missing_key_error,
)
from .base import TensorDictBase, _is_branch, _is_non_tensor, is_tensor_collection
from .indexing import INT, SLICE, plan_index
from .switches import STATE
from .unbatched import UnbatchedTensor as _UT
from .unbatched import _WholeWrite

__all__ = ["TensorDict"]

_new_object = object.__new__
_LONG = torch.long
_BOOL = torch.bool
_SCALAR = torch.Size(())


class TensorDict(TensorDictBase):
    """A dictionary of tensors that share leading batch dimensions.

    Args:
        source: a dict (nested dicts become nested TensorDicts) or ``None``.
        batch_size: the leading dims every entry shares (default: ``[]``).
        device: if given, every entry is moved there; ``None`` allows mixed devices.
        names: optional names of the batch dims.
        **kwargs: more entries, as keyword arguments.

    Shapes: each entry has shape ``[*batch_size, *feature_dims]``.

    Attributes:
        entries: the live dict of this level's entries (key -> tensor, nested TensorDict
            or non-tensor entry), for code on hot paths. Reading it costs what a slot read
            costs. Writing to it bypasses every check (batch shape, device, lock): only
            for code that guarantees them itself, as for :meth:`from_trusted`.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> td = TensorDict({"obs": torch.zeros(4, 3), "next": {"reward": torch.ones(4, 1)}},
        ...                 batch_size=[4])
        >>> td["next", "reward"].shape
        torch.Size([4, 1])
        >>> td[1:3].batch_size
        torch.Size([2])
        >>> torch.stack([td, td]).batch_size
        torch.Size([2, 4])
    """

    __slots__ = ("_tensordict", "_batch_size", "_device", "_names", "_locked", "__weakref__")
    entries: dict  # the ``_tensordict`` slot under a public name (set after the class)

    def __init__(
        self,
        source: Mapping | None = None,
        batch_size: Any = None,
        device: Any = None,
        names: Any = None,
        non_blocking: bool | None = None,
        lock: bool = False,
        **kwargs: Any,
    ) -> None:
        self._batch_size = as_size(batch_size)
        self._device = None if device is None else _as_device(device)
        self._tensordict = {}
        self._locked = False
        self._names = None
        if source is not None:
            if type(source) is dict:
                pass
            elif isinstance(source, TensorDictBase):
                source = {k: source._get_str(k, NO_DEFAULT) for k in source._keys_str()}
            elif not isinstance(source, Mapping):
                raise TypeError(f"source must be a dict or a TensorDict, got {type(source).__name__}")
            self._init_entries(source)
        if kwargs:
            self._init_entries(kwargs)
        if names is not None:
            self.names = names
        if lock:
            self.lock_()

    def _init_entries(self, source: Mapping) -> None:
        """Validates and stores every entry of ``source`` (the constructor's loop)."""
        td = self._tensordict
        bs = self._batch_size
        n = len(bs)
        b0 = bs[0] if n == 1 else None
        dev = self._device
        for key, value in source.items():
            if type(key) is tuple and key and all(type(k) is str for k in key):
                if len(key) == 1:
                    key = key[0]
                else:  # a nested key: goes through set(), which makes the sub-TensorDicts
                    self.set(key, value)
                    continue
            if type(key) is not str:
                raise TypeError(
                    f"TensorDict keys must be strings (tuples of strings for nested keys), "
                    f"got {key!r} of type {type(key).__name__}"
                )
            if isinstance(value, Tensor):  # the common case, inlined (_bad_batch too)
                shape = value.shape
                if type(value) is _UT:
                    value = value._with_batch(bs)
                elif (not shape or shape[0] != b0) if n == 1 else _bad_batch(shape, bs, n):
                    raise _batch_error(key, bs, shape)
                if dev is not None and value.device != dev:
                    value = value.to(dev, non_blocking=True)
                td[key] = value
            elif type(value) is dict or (isinstance(value, Mapping) and not is_tensor_collection(value)):
                sub = _td({}, bs, dev, None)  # a nested dict: the same loop, without __init__
                sub._init_entries(value)
                td[key] = sub
            else:
                self._set_str(key, self._prepare_value(key, value), False, False)

    @classmethod
    def from_trusted(
        cls, entries: dict, batch_size: torch.Size, device: torch.device | None = None, names: Any = None
    ) -> TensorDict:
        """Wraps ``entries`` as a TensorDict with no checks and no copies: the fast path for
        code that builds its entries itself (envs, storages, buffers).

        The caller guarantees what the constructor would check: ``entries`` is a plain
        ``dict`` from string keys to tensors, TensorDicts or non-tensor entries, each of
        shape ``[*batch_size, ...]``; ``batch_size`` is a ``torch.Size``; if ``device`` is
        given, every tensor is on it; ``names`` is ``None`` or one name per batch dim.
        The dict is used as is (it becomes :attr:`entries`), not copied.

        Example:
            >>> import torch
            >>> td = TensorDict.from_trusted({"obs": torch.zeros(4, 3)}, torch.Size([4]))
            >>> td["obs"].shape, td.batch_size
            (torch.Size([4, 3]), torch.Size([4]))
        """
        self = _new_object(cls)
        self._tensordict = entries
        self._batch_size = batch_size
        self._device = device
        self._names = names
        self._locked = False
        return self

    _new_unsafe = from_trusted  # the older, private name (inside this module: :func:`_td`)

    @classmethod
    def from_dict(
        cls,
        input_dict: Mapping,
        batch_size: Any = None,
        device: Any = None,
        batch_dims: int | None = None,
        names: Any = None,
        auto_batch_size: bool | None = None,
    ) -> TensorDict:
        """Builds a TensorDict from a nested dict.

        Without ``batch_size`` the batch size is found automatically: the longest
        shape prefix shared by every leaf (at most ``batch_dims`` dims).
        """
        if auto_batch_size is False and batch_size is None and batch_dims is None:
            batch_size = torch.Size(())
        if batch_size is not None:
            return cls(input_dict, batch_size=batch_size, device=device, names=names)
        td = cls._from_dict_nocheck(input_dict, device)
        td.auto_batch_size_(batch_dims)
        if names is not None:
            td.names = names
        return td

    @classmethod
    def _from_dict_nocheck(cls, d: Mapping, device: Any = None) -> TensorDict:
        out = {}
        dev = None if device is None else _as_device(device)
        for k, v in d.items():
            if type(k) is not str:
                raise TypeError(f"TensorDict keys must be strings, got {k!r}")
            if isinstance(v, Mapping) and not is_tensor_collection(v):
                v = cls._from_dict_nocheck(v, dev)
            elif not isinstance(v, Tensor) and not is_tensor_collection(v):
                from .nontensor import to_entry

                v = to_entry(v, torch.Size(()), dev, k)
            if dev is not None and isinstance(v, Tensor) and v.device != dev:
                v = v.to(dev, non_blocking=True)
            out[k] = v
        return cls.from_trusted(out, torch.Size(()), dev)

    def auto_batch_size_(self, batch_dims: int | None = None, keep_compliant_size: bool = False) -> TensorDict:
        """Sets the batch size to the longest shape prefix shared by all leaves (in place).

        Args:
            batch_dims: at most this many batch dims, here and in every nested TensorDict.
            keep_compliant_size: with ``batch_dims``, a nested TensorDict that already has
                ``batch_dims`` batch dims or more keeps its batch size.

        Example:
            >>> import torch
            >>> from steersman.tensordict import TensorDict
            >>> def make():
            ...     n = TensorDict(b=torch.zeros(2, 3, 4), batch_size=[2, 3, 4])
            ...     return TensorDict({"a": torch.zeros(2, 3, 4), "n": n})
            >>> make().auto_batch_size_(batch_dims=2)["n"].batch_size
            torch.Size([2, 3])
            >>> make().auto_batch_size_(batch_dims=2, keep_compliant_size=True)["n"].batch_size
            torch.Size([2, 3, 4])
        """
        shapes = [t.shape for t in self._tensor_leaves() if type(t) is not _UT]
        for k in self._keys_str():
            v = self._tensordict[k]
            if _is_non_tensor(v) and getattr(type(v), "_is_stack", False):
                shapes.append(v.batch_size)
        if not shapes:
            bs = torch.Size(())
        else:
            n = min(len(s) for s in shapes)
            if batch_dims is not None:
                n = min(n, batch_dims)
            common = []
            for i in range(n):
                d = shapes[0][i]
                if all(s[i] == d for s in shapes):
                    common.append(d)
                else:
                    break
            bs = torch.Size(common)
        keep = keep_compliant_size and batch_dims is not None
        for v in self._tensordict.values():
            if isinstance(v, TensorDict):
                if keep and len(v._batch_size) >= batch_dims:
                    continue
                v._batch_size = bs
                v.auto_batch_size_(batch_dims, keep_compliant_size)
            elif _is_non_tensor(v) and not getattr(type(v), "_is_stack", False):
                v.batch_size = bs
        self._batch_size = bs
        return self

    @classmethod
    def _from_state_dict(cls, sd: Mapping) -> TensorDict:
        bs = as_size(sd.get("__batch_size"))
        dev = sd.get("__device")
        out = {}
        for k, v in sd.items():
            if k.startswith("__"):
                continue
            if isinstance(v, Mapping) and "__non_tensor" in v:
                from .nontensor import NonTensorData

                v = NonTensorData(v["__non_tensor"], batch_size=bs)
            elif isinstance(v, Mapping):
                v = cls._from_state_dict(v)
            out[k] = v
        return cls(out, batch_size=bs, device=dev)

    # ------------------------------------------------------------------ properties
    @property
    def batch_size(self) -> torch.Size:
        return self._batch_size

    @batch_size.setter
    def batch_size(self, new: Any) -> None:
        new = as_size(new)
        if new == self._batch_size:
            return
        nd = len(new)
        for key, v in self._tensordict.items():
            shape = v.shape if isinstance(v, Tensor) else v.batch_size
            if (_is_non_tensor(v) and not getattr(type(v), "_is_stack", False)) or type(v) is _UT:
                continue
            if len(shape) < nd or shape[:nd] != new:
                if _is_branch(v) and len(shape) <= nd and new[: len(shape)] == shape:
                    continue  # a nested container that will grow with us
                raise ValueError(
                    f"cannot set batch_size to {list(new)}: entry {key!r} has shape {list(shape)}"
                )
        for v in self._tensordict.values():
            if _is_branch(v) and len(v.batch_size) < nd:
                v.batch_size = new
            elif _is_non_tensor(v) and not getattr(type(v), "_is_stack", False):
                v.batch_size = new
        self._batch_size = new
        if self._names is not None and len(self._names) != nd:
            self._names = None

    @property
    def device(self) -> torch.device | None:
        return self._device

    @device.setter
    def device(self, value: Any) -> None:
        raise RuntimeError("set the device with td.to(device) (leaves must move with it)")

    def clear_device_(self) -> TensorDict:
        self._device = None
        for v in self._tensordict.values():
            if isinstance(v, TensorDict):
                v.clear_device_()
        return self

    def names_or_none(self) -> list | None:
        names = self._names
        return None if names is None or all(n is None for n in names) else list(names)

    @property
    def names(self) -> list:
        if self._names is None:
            return [None] * len(self._batch_size)
        return list(self._names)

    @names.setter
    def names(self, value: Any) -> None:
        if value is None:
            self._names = None
            return
        value = list(value)
        if len(value) != len(self._batch_size):
            raise ValueError(
                f"got {len(value)} names for a batch of {len(self._batch_size)} dims: {value}"
            )
        named = [n for n in value if n is not None]
        if len(set(named)) != len(named):
            raise ValueError(f"batch dim names must be unique, got {value}")
        self._names = None if all(n is None for n in value) else value
        for v in self._tensordict.values():
            if isinstance(v, TensorDict):
                extra = len(v._batch_size) - len(value)
                sub = (v._names or [None] * len(v._batch_size))[len(value):] if extra else []
                v.names = value + sub

    # ------------------------------------------------------------------ primitives
    def _keys_str(self):
        return self._tensordict.keys()

    def _get_str(self, key: str, default: Any) -> Any:
        try:
            return self._tensordict[key]
        except KeyError:
            if default is NO_DEFAULT:
                raise missing_key_error(key, self._tensordict) from None
            return default

    def _set_str(self, key: str, value: Any, inplace: bool, validated: bool) -> None:
        td = self._tensordict
        if not validated:
            if type(key) is not str:
                raise TypeError(f"TensorDict keys must be strings, got {key!r} ({type(key).__name__})")
            bs = self._batch_size
            shape = value.shape if isinstance(value, Tensor) else value.batch_size
            if type(value) is _UT:
                value = value._with_batch(bs)
            elif _bad_batch(shape, bs, len(bs)):
                raise _batch_error(key, bs, shape)
            dev = self._device
            if dev is not None:
                if isinstance(value, Tensor):
                    if value.device != dev:
                        value = value.to(dev, non_blocking=True)
                elif value.device != dev and not _is_non_tensor(value):
                    value = value.to(dev)
            if (inplace or self._locked) and key in td:
                current = td[key]
                if isinstance(current, Tensor) and isinstance(value, Tensor):
                    if current.shape != value.shape:
                        raise ValueError(
                            f"in-place set of {key!r}: shape {list(value.shape)} does not match "
                            f"the existing {list(current.shape)}"
                        )
                    current.copy_(value)
                    return
                if _is_branch(current) and _is_branch(value):
                    current.update_(value)
                    return
            if self._locked and key not in td:
                raise RuntimeError(
                    f"cannot add key {key!r}: the TensorDict is locked (call td.unlock_() first)"
                )
            if self._locked and not isinstance(value, Tensor):
                value.lock_()
        td[key] = value

    def _del_str(self, key: str) -> None:
        if self._locked:
            raise RuntimeError(f"cannot delete key {key!r}: the TensorDict is locked (unlock_() it first)")
        try:
            del self._tensordict[key]
        except KeyError:
            raise missing_key_error(key, self._tensordict) from None

    def _new_empty(self, batch_size: torch.Size) -> TensorDict:
        return _td({}, batch_size, self._device, None)

    # ------------------------------------------------------------------ fast paths
    def keys(self, include_nested: bool = False, leaves_only: bool = False, *,
             is_leaf: Callable | None = None, sort: bool = False) -> Any:
        """The keys; without options, a live view of the top-level keys (like ``dict.keys``)."""
        if not (include_nested or leaves_only or sort or is_leaf):
            return self._tensordict.keys()
        if include_nested and is_leaf is None and not sort:
            out: list = []
            _nested_keys(self._tensordict, (), out, leaves_only)
            return out
        return super().keys(include_nested, leaves_only, is_leaf=is_leaf, sort=sort)

    def get(self, key: NestedKey, default: Any = NO_DEFAULT) -> Any:
        if type(key) is str:
            try:
                return self._tensordict[key]
            except KeyError:
                if default is NO_DEFAULT:
                    if STATE["get_defaults_to_none"]:
                        return None
                    raise missing_key_error(key, self._tensordict) from None
                return default
        try:  # nested key through plain TensorDicts
            node = self
            for k in key:
                node = node._tensordict[k]
            return node
        except (KeyError, AttributeError, TypeError):
            return super().get(key, default)

    def __getitem__(self, index: Any) -> Any:
        if type(index) is str:
            try:
                v = self._tensordict[index]
            except KeyError:
                raise missing_key_error(index, self._tensordict) from None
            if isinstance(v, Tensor) or not _is_non_tensor(v):
                return v
            return v.tolist() if getattr(type(v), "_is_stack", False) else v.data
        if type(index) is tuple and index and type(index[0]) is str:
            try:
                node = self
                for k in index:
                    node = node._tensordict[k]
                if isinstance(node, Tensor):
                    return node
            except (KeyError, AttributeError, TypeError):
                pass
            return super().__getitem__(index)
        if type(index) is int:
            bs = self._batch_size
            if bs:  # (_index, inlined)
                return _index_tree(self, index, bs[1:] if len(bs) > 1 else _SCALAR)
        elif type(index) is slice and self._batch_size:
            return self._index(index)
        if type(index) is Tensor and index.ndim == 1 and self._batch_size and self._names is None:
            out = self._take(index)
            if out is not None:
                return out
        return super().__getitem__(index)

    def set(self, key: NestedKey, item: Any, inplace: bool = False, **kwargs: Any) -> TensorDict:
        if type(key) is str and isinstance(item, Tensor) and not (inplace or self._locked) and type(item) is not _UT:
            bs = self._batch_size
            if _bad_batch(item.shape, bs, len(bs)):
                raise _batch_error(key, bs, item.shape)
            dev = self._device
            if dev is not None and item.device != dev:
                item = item.to(dev, non_blocking=kwargs.get("non_blocking", True))
            self._tensordict[key] = item
            return self
        return super().set(key, item, inplace, **kwargs)

    def __setitem__(self, index: Any, value: Any) -> None:
        if type(index) is str and type(value) is Tensor and not self._locked:
            # the hottest write: the batch check of _bad_batch, inlined (a call costs as much)
            bs = self._batch_size
            n = len(bs)
            if n:
                shape = value.shape
                if (not shape or shape[0] != bs[0]) if n == 1 else shape[:n] != bs:
                    raise _batch_error(index, bs, shape)
            dev = self._device
            if dev is not None and value.device != dev:
                value = value.to(dev, non_blocking=True)
            self._tensordict[index] = value
            return
        if type(value) is TensorDict and self._batch_size and (
            type(index) is int or type(index) is slice or (type(index) is Tensor and index.dtype is _LONG)
        ):  # td[i] = other: an index with nothing to normalize
            self._setitem_batch(index, value)
            return
        super().__setitem__(index, value)

    def _setitem_batch(self, index: Any, value: Any) -> None:
        # fast path: a TensorDict with the same structure (the replay-buffer/rollout case)
        if type(value) is TensorDict and not (type(index) is tuple and not index):
            pairs: list = []
            bd = len(self._batch_size)
            if _same_structure(self, value, pairs, bd, len(value._batch_size)):
                new_bs = _fast_indexed_batch_size(self._batch_size, index)
                vbs = value._batch_size
                if vbs != new_bs and (len(vbs) > len(new_bs) or any(
                    a != b and a != 1 for a, b in zip(reversed(vbs), reversed(new_bs))
                )):
                    raise ValueError(
                        f"cannot write a TensorDict of batch_size {list(vbs)} into td[{index!r}], "
                        f"whose batch_size is {list(new_bs)}"
                    )
                for dst, src in pairs:
                    dst[index] = src
                return
        super()._setitem_batch(index, value)

    def _index(self, index: Any) -> TensorDict:
        bs = self._batch_size
        if type(index) is int:  # the common cases: the new batch size is known up front
            return _index_tree(self, index, bs[1:] if len(bs) > 1 else _SCALAR)
        if type(index) is slice:
            return _index_tree(self, index, torch.Size((len(range(*index.indices(bs[0]))), *bs[1:])))
        out = {}
        batched = None  # the first entry with batch dims (not an UnbatchedTensor)
        unbatched = []
        for k, v in self._tensordict.items():
            if type(v) is _UT:
                unbatched.append(k)
                continue
            out[k] = v[index] if isinstance(v, Tensor) else v._index(index)
            if batched is None:
                batched = k
        if batched is None:
            new_bs = indexed_batch_size(bs, index)
        else:  # read it off the first entry: the leading dims it gained or lost
            k, v = batched, self._tensordict[batched]
            r = out[k]
            if isinstance(v, Tensor):
                new_bs = r.shape[: r.ndim - v.ndim + len(bs)]
            else:
                rb = r.batch_size
                new_bs = rb[: len(rb) - len(v.batch_size) + len(bs)]
        for k in unbatched:
            out[k] = self._tensordict[k]._with_batch(new_bs)
        names = None if self._names is None else _names_after_index(self._names, index)
        return _td(out, new_bs, self._device, names)

    def _take(self, index: Tensor) -> TensorDict | None:
        """``td[index]`` for a 1-D long index or bool mask over batch dim 0, as one
        ``index_select`` per leaf (a mask becomes row numbers once, where ``leaf[mask]``
        would redo it for every leaf). None where the general path must decide: nested
        containers other than TensorDict, a mask of the wrong length, an index
        ``index_select`` refuses (negative or out of range, another device)."""
        if index.dtype is _BOOL:
            if index.shape[0] != self._batch_size[0]:
                return None
            index = index.nonzero().squeeze(1)
        elif index.dtype is not _LONG:
            return None
        try:
            return _take_rows(self, index, torch.Size((index.shape[0],)))
        except (RuntimeError, IndexError, _NotDense):
            return None

    def _apply_batch(self, fn: Callable, batch_size: torch.Size, names: Any) -> TensorDict:
        bd = len(self._batch_size)
        out = {}
        for k, v in self._tensordict.items():
            if isinstance(v, Tensor):
                out[k] = fn(v) if type(v) is not _UT else v._with_batch(batch_size)
            else:
                vbs = v.batch_size  # a nested container with no extra dims shares batch_size
                out[k] = v._apply_batch(fn, batch_size + vbs[bd:] if len(vbs) > bd else batch_size, None)
        return _td(out, batch_size, self._device, names)

    def _split_batch(self, fn: Callable, batch_sizes: list) -> list[TensorDict]:
        bd = len(self._batch_size)
        keys = list(self._tensordict)
        cols = []  # one sequence of parts per key
        for v in self._tensordict.values():
            if isinstance(v, Tensor):
                cols.append(fn(v) if type(v) is not _UT else [v._with_batch(b) for b in batch_sizes])
            else:
                extra = v.batch_size[bd:]
                cols.append(v._split_batch(fn, [b + extra for b in batch_sizes] if extra else batch_sizes))
        dev = self._device
        if not cols:
            return [_td({}, b, dev, None) for b in batch_sizes]
        # regroup the columns into rows with C-level zips
        return [_td(dict(zip(keys, row)), b, dev, None) for row, b in zip(zip(*cols), batch_sizes)]

    def _map(
        self,
        fn: Callable,
        others: tuple,
        *,
        batch_size: torch.Size | None = None,
        device: Any = NO_DEFAULT,
        default: Any = NO_DEFAULT,
        named: bool = False,
        nested_keys: bool = False,
        call_on_nested: bool = False,
        filter_empty: bool | None = None,
        prefix: tuple = (),
        **flags: Any,
    ) -> TensorDict:
        if not (named or call_on_nested) and (
            not others or (len(others) == 1 and type(others[0]) is TensorDict and default is NO_DEFAULT
                           and len(others[0]._tensordict) == len(self._tensordict))
        ):
            out = self._map_leaves(fn, others[0]._tensordict if others else None, batch_size, device,
                                   filter_empty, prefix, flags)
            if out is not None:
                return self._finish_map(out, batch_size, device, flags)
        bd = len(self._batch_size)
        out = {}
        for k, v in self._tensordict.items():
            args = [_other_entry(o, k, default, prefix) for o in others] if others else ()
            if isinstance(v, Tensor):
                if named:
                    r = fn(prefix + (k,) if nested_keys and prefix else k, v, *args)
                else:
                    r = fn(v, *args)
                if r is None:
                    continue
            elif _is_non_tensor(v):
                r = v._map(fn, (), batch_size=None if batch_size is None else batch_size + v.batch_size[bd:],
                           device=device, **flags)
            elif call_on_nested:
                r = fn(prefix + (k,) if nested_keys else k, v, *args) if named else fn(v, *args)
                if r is None:
                    continue
            else:
                sub_bs = None
                if batch_size is not None:
                    sub_bs = batch_size if flags.get("scalar_out") else batch_size + v.batch_size[bd:]
                r = v._map(
                    fn,
                    tuple(args),
                    batch_size=sub_bs,
                    device=device,
                    default=default,
                    named=named,
                    nested_keys=nested_keys,
                    call_on_nested=call_on_nested,
                    filter_empty=filter_empty,
                    prefix=prefix + (k,),
                    **flags,
                )
                if filter_empty is not False and (type(r) is not TensorDict or not r._tensordict) and r.is_empty() and not v.is_empty():
                    continue
            out[k] = r
        return self._finish_map(out, batch_size, device, flags)

    def _map_leaves(self, fn: Callable, other: dict | None, batch_size: Any, device: Any,
                    filter_empty: Any, prefix: tuple, flags: dict) -> dict | None:
        """The common ``_map``: ``fn(leaf)`` or ``fn(leaf, other_leaf)`` with another
        TensorDict of the same keys. Returns None (use the general path) on a mismatch."""
        out = {}
        bd = len(self._batch_size)
        for k, v in self._tensordict.items():
            if other is None:
                if isinstance(v, Tensor):
                    r = fn(v)
                    if r is not None:
                        out[k] = r
                    continue
                o = ()
            else:
                o = other.get(k, NO_DEFAULT)
                if o is NO_DEFAULT:
                    return None
                if isinstance(v, Tensor):
                    r = fn(v, o)
                    if r is not None:
                        out[k] = r
                    continue
                o = (o,)
            if _is_non_tensor(v):
                out[k] = v._map(fn, (), batch_size=None if batch_size is None else batch_size + v.batch_size[bd:],
                                device=device, **flags)
                continue
            sub_bs = None
            if batch_size is not None:
                vbs = v.batch_size
                sub_bs = batch_size if flags.get("scalar_out") or len(vbs) == bd else batch_size + vbs[bd:]
            r = None
            if type(v) is TensorDict and (other is None or (
                type(o[0]) is TensorDict and len(o[0]._tensordict) == len(v._tensordict)
            )):
                # a plain nested TensorDict: straight to its own _map_leaves
                sub = v._map_leaves(fn, None if other is None else o[0]._tensordict, sub_bs, device,
                                    filter_empty, prefix + (k,), flags)
                if sub is not None:
                    r = v._finish_map(sub, sub_bs, device, flags)
            if r is None:
                r = v._map(fn, o, batch_size=sub_bs, device=device, filter_empty=filter_empty,
                           prefix=prefix + (k,), **flags)
            if filter_empty is not False and (type(r) is not TensorDict or not r._tensordict) and r.is_empty() and not v.is_empty():
                continue
            out[k] = r
        return out

    def _finish_map(self, out: dict, batch_size: Any, device: Any, flags: dict) -> TensorDict:
        if device is NO_DEFAULT:
            device = self._device
        if batch_size is None:
            result = _td(out, self._batch_size, device, self._names)
        else:
            result = _td(out, batch_size, device, None)
        if flags.get("validate", True):
            _check_mapped(result)
        return result

    def _map_(self, fn: Callable, others: tuple, *, default: Any = NO_DEFAULT, assign: bool = True) -> None:
        # gather first so that a missing key fails before anything is written
        work: list = []
        _gather_inplace(self, others, default, work, ())
        for v, args in work:
            r = fn(v, *args)
            if assign and r is not None and r is not v:
                v.copy_(r)

    def _relabel_device(self, device: torch.device) -> TensorDict | None:
        """A shallow copy with ``device`` set if every leaf is already there, else None."""
        out = {}
        for k, v in self._tensordict.items():
            if isinstance(v, Tensor):
                if v.device != device:
                    return None
                out[k] = v
            elif type(v) is TensorDict:
                r = v._relabel_device(device)
                if r is None:
                    return None
                out[k] = r
            else:
                return None
        return _td(out, self._batch_size, device, self._names)

    # ------------------------------------------------------------------ locking
    def lock_(self) -> TensorDict:
        """Refuses new or removed keys from now on (in-place writes are still allowed)."""
        self._locked = True
        for v in self._tensordict.values():
            if isinstance(v, TensorDictBase):
                v.lock_()
        return self

    def unlock_(self) -> TensorDict:
        self._locked = False
        for v in self._tensordict.values():
            if isinstance(v, TensorDictBase):
                v.unlock_()
        return self

    def _is_locked_flag(self) -> bool:
        return self._locked

    def clone(self, recurse: bool = True, **kwargs: Any) -> TensorDict:
        """A copy; ``recurse=False`` shares the leaves (a shallow copy)."""
        if recurse:
            try:  # fast path: a tree of plain TensorDicts and tensors
                return _clone_tree(self)
            except _NotDense:
                pass
        return super().clone(recurse, **kwargs)

    def add_(self, other: Any, *, alpha: float | None = None) -> TensorDict:
        if type(other) is TensorDict:  # fast path: the leaves of two plain trees, paired in one walk
            pairs = _same_leaves(self, other)
            if pairs is not None:
                if alpha is None:
                    torch._foreach_add_(*pairs)
                else:
                    torch._foreach_add_(*pairs, alpha=alpha)
                return self
        return super().add_(other, alpha=alpha)

    def lerp_(self, end: Any, weight: Any) -> TensorDict:
        if type(end) is TensorDict and isinstance(weight, (int, float)):  # as in add_
            pairs = _same_leaves(self, end)
            if pairs is not None:
                torch._foreach_lerp_(*pairs, weight)
                return self
        return super().lerp_(end, weight)

    def copy(self) -> TensorDict:
        """A shallow copy: new containers, same leaf tensors."""
        out = {}
        for k, v in self._tensordict.items():
            out[k] = v if isinstance(v, Tensor) else v.copy()
        return _td(out, self._batch_size, self._device, self._names)

    def select(self, *keys: NestedKey, inplace: bool = False, strict: bool = True, as_tensordict: bool = False) -> TensorDict:
        if not inplace:
            src = self._tensordict
            out = {}
            try:  # string keys that exist; anything else takes the general path
                for k in keys:
                    out[k] = src[k]
            except (KeyError, TypeError):
                pass
            else:
                return _td(out, self._batch_size, self._device, self._names)
        return super().select(*keys, inplace=inplace, strict=strict)

    def exclude(self, *keys: NestedKey, inplace: bool = False) -> TensorDict:
        if not inplace:  # fast path: string keys, a C-level dict copy then pops
            out = dict(self._tensordict)
            for k in keys:
                if type(k) is not str:
                    break
                out.pop(k, None)
            else:
                return _td(out, self._batch_size, self._device, self._names)
        return super().exclude(*keys, inplace=inplace)

    def flatten_keys(self, separator: str = ".", inplace: bool = False) -> TensorDict:
        """Nested keys become flat keys joined by ``separator``."""
        if not inplace:
            out: dict = {}
            try:  # fast path: a tree of plain TensorDicts and tensors
                _flatten_into(self, separator, "", out)
            except _NotDense:
                pass
            else:
                return _td(out, self._batch_size, self._device, None)
        return super().flatten_keys(separator, inplace)

    def update(self, input_dict_or_td: Any, clone: bool = False, inplace: bool = False, *,
               keys_to_update: Any = None) -> TensorDict:
        if (
            not clone and not inplace and keys_to_update is None and not self._locked
            and type(input_dict_or_td) is dict
        ):
            td = self._tensordict
            bs = self._batch_size
            n = len(bs)
            dev = self._device
            ok = True
            for k, v in input_dict_or_td.items():
                if type(k) is not str or not isinstance(v, Tensor) or _bad_batch(v.shape, bs, n) or (
                    dev is not None and v.device != dev
                ):
                    ok = False
                    break
            if ok:
                td.update(input_dict_or_td)
                return self
        elif type(input_dict_or_td) is TensorDict and not (clone or inplace or self._locked) and (
            keys_to_update is None and input_dict_or_td._batch_size[: len(self._batch_size)] == self._batch_size
        ) and (self._device is None or self._device == input_dict_or_td._device):
            td = self._tensordict
            src = input_dict_or_td._tensordict
            if not any(k in td and isinstance(td[k], TensorDictBase) for k in src):
                if input_dict_or_td._batch_size == self._batch_size or all(
                    isinstance(v, Tensor) for v in src.values()
                ):
                    td.update(src)
                    return self
        return super().update(input_dict_or_td, clone, inplace, keys_to_update=keys_to_update)

    def __reduce__(self):
        return (_rebuild, (self._tensordict, self._batch_size, self._device, self._names, self._locked))

    def __deepcopy__(self, memo: dict) -> TensorDict:
        import copy

        return _td(
            {k: copy.deepcopy(v, memo) for k, v in self._tensordict.items()},
            self._batch_size, self._device, None if self._names is None else list(self._names),
        )

    @classmethod
    def from_module(cls, module: Any, as_module: bool = False, lock: bool = False,
                    use_state_dict: bool = False, filter_empty: bool = True) -> TensorDictBase:
        """The parameters and buffers of ``module`` as a nested TensorDict.

        See :func:`steersman.tensordict.module_params.from_module`.
        """
        from .module_params import from_module

        return from_module(module, as_module=as_module, lock=lock, use_state_dict=use_state_dict,
                           filter_empty=filter_empty)

    @classmethod
    def from_modules(cls, *modules: Any, as_module: bool = False, lock: bool = True,
                     use_state_dict: bool = False, lazy_stack: bool = False,
                     expand_identical: bool = False) -> TensorDictBase:
        """The stacked parameters of several identical modules (batch ``[N]``).

        See :func:`steersman.tensordict.module_params.from_modules`.
        """
        from .module_params import from_modules

        return from_modules(*modules, as_module=as_module, lock=lock, use_state_dict=use_state_dict,
                            lazy_stack=lazy_stack, expand_identical=expand_identical)

    @classmethod
    def from_consolidated(cls, filename: Any) -> TensorDict:
        """Rebuilds a TensorDict from a file written by ``consolidate(filename=...)``
        (see :func:`steersman.tensordict.from_consolidated`)."""
        from .consolidate import from_consolidated

        return from_consolidated(filename)

    @classmethod
    def load_memmap(cls, prefix: Any, device: Any = None, non_blocking: bool = False) -> TensorDict:
        """Opens a TensorDict saved by ``memmap``/``save`` (tensors stay memory-mapped)."""
        from .io import load

        out = load(prefix, mmap=True)
        return out if device is None else out.to(device)

    @classmethod
    def load(cls, prefix: Any, device: Any = None, *, mmap: bool = False) -> TensorDict:
        """Loads a TensorDict saved with ``save`` (no code is executed)."""
        from .io import load

        out = load(prefix, mmap=mmap)
        return out if device is None else out.to(device)


# ``td.entries`` reads the ``_tensordict`` slot itself: a slot descriptor under a second
# name costs nothing, where a property would cost a Python call on every env step.
TensorDict.entries = TensorDict.__dict__["_tensordict"]


def _nested_keys(d: dict, prefix: tuple, out: list, leaves_only: bool) -> None:
    for k, v in d.items():
        if type(v) is TensorDict:
            full = prefix + (k,)
            if not leaves_only:
                out.append(full if prefix else k)
            _nested_keys(v._tensordict, full, out, leaves_only)
        elif isinstance(v, Tensor) or _is_non_tensor(v) or not _is_branch(v):
            out.append(prefix + (k,) if prefix else k)
        else:  # another kind of container (lazy stack, tensorclass...)
            full = prefix + (k,)
            if not leaves_only:
                out.append(full if prefix else k)
            v._collect_keys(out, full, True, leaves_only, None)


def _same_structure(dst: TensorDict, src: TensorDict, pairs: list, bd: int, vbd: int) -> bool:
    """Lists (dst_leaf, src_leaf) pairs if both trees have the same keys, kinds and feature shapes."""
    d, s = dst._tensordict, src._tensordict
    if len(d) != len(s):
        return False
    for k, sv in s.items():
        dv = d.get(k)
        if isinstance(dv, Tensor):
            if not isinstance(sv, Tensor):
                return False
            if type(dv) is _UT:  # the payload is written whole, whatever the index
                if dv.shape != sv.shape:
                    raise ValueError(f"cannot write an entry of shape {list(sv.shape)} into the unbatched "
                                     f"entry {k!r} of shape {list(dv.shape)}")
                pairs.append((_WholeWrite(dv), sv))
                continue
            ds, ss = dv.shape, sv.shape
            nf = len(ds) - bd  # feature dims; one, the common case, is compared without slicing
            if nf != len(ss) - vbd or (ds[-1] != ss[-1] if nf == 1 else nf and ds[bd:] != ss[vbd:]):
                return False
            pairs.append((dv, sv))
        elif type(dv) is TensorDict and type(sv) is TensorDict:
            if not _same_structure(dv, sv, pairs, bd, vbd):
                return False
        else:
            return False
    return True


def _fast_indexed_batch_size(bs: torch.Size, index: Any) -> torch.Size:
    if isinstance(index, Tensor) and index.ndim == 1 and index.dtype is torch.long:
        return torch.Size((index.shape[0],)) + bs[1:]
    return indexed_batch_size(bs, index)


def _td(source: dict, batch_size: torch.Size, device: torch.device | None, names: Any) -> TensorDict:
    """:meth:`TensorDict.from_trusted` as a plain function (no checks): the hot paths' constructor."""
    self = _new_object(TensorDict)
    self._tensordict = source
    self._batch_size = batch_size
    self._device = device
    self._names = names
    self._locked = False
    return self


def _index_tree(td: TensorDict, index: int | slice, new_bs: torch.Size) -> TensorDict:
    """``td[index]`` for an int or a slice over batch dim 0, whose result has batch size
    ``new_bs``; nested TensorDicts of the same batch size share it."""
    bs = td._batch_size
    out = {}
    for k, v in td._tensordict.items():
        if isinstance(v, Tensor):
            out[k] = v[index] if type(v) is not _UT else v._with_batch(new_bs)  # an int out of range raises
        elif type(v) is TensorDict and v._batch_size == bs:
            out[k] = _index_tree(v, index, new_bs)
        else:
            out[k] = v._index(index)
    if not out:
        indexed_batch_size(bs, index)  # no leaf checked the index: raises if out of range
    names = None if td._names is None else _names_after_index(td._names, index)
    return _td(out, new_bs, td._device, names)


class _NotDense(Exception):
    """A fast path met an entry it does not handle (the caller takes the general path)."""


def _take_rows(td: TensorDict, rows: Tensor, n: torch.Size) -> TensorDict:
    """``index_select(0, rows)`` on every leaf of a tree of plain TensorDicts."""
    out = {}
    new_bs = n + td._batch_size[1:] if len(td._batch_size) > 1 else n
    for k, v in td._tensordict.items():
        if isinstance(v, Tensor):
            out[k] = v.index_select(0, rows) if type(v) is not _UT else v._with_batch(new_bs)
        elif type(v) is TensorDict and v._names is None:
            out[k] = _take_rows(v, rows, n)
        else:
            raise _NotDense
    return _td(out, new_bs, td._device, None)


def _flatten_into(td: TensorDict, sep: str, prefix: str, out: dict) -> None:
    for k, v in td._tensordict.items():
        if isinstance(v, Tensor):
            flat = prefix + k
            if flat in out:
                raise KeyError(f"flattening would create the key {flat!r} twice")
            out[flat] = v
        elif type(v) is TensorDict:
            _flatten_into(v, sep, prefix + k + sep, out)
        else:
            raise _NotDense


def _clone_tree(td: TensorDict) -> TensorDict:
    out = {}
    for k, v in td._tensordict.items():
        if isinstance(v, Tensor):
            out[k] = v.clone()
        elif type(v) is TensorDict:
            out[k] = _clone_tree(v)
        else:
            raise _NotDense
    return _td(out, td._batch_size, td._device, td._names)


def _pair_leaves(a: dict, b: dict, dst: list, src: list) -> bool:
    """Appends the leaves of ``a`` to ``dst`` and the leaves of ``b`` at the same keys to
    ``src``; False if the two trees of plain TensorDicts differ in keys or kinds."""
    if len(a) != len(b):
        return False
    for k, v in a.items():
        o = b.get(k)
        if isinstance(v, Tensor) and isinstance(o, Tensor):
            dst.append(v)
            src.append(o)
        elif not (type(v) is TensorDict and type(o) is TensorDict and _pair_leaves(
            v._tensordict, o._tensordict, dst, src
        )):
            return False
    return True


def _same_leaves(td: TensorDict, other: TensorDict) -> tuple[list, list] | None:
    """The leaves of ``td`` and ``other`` in matching order, when the trees match in keys,
    leaf shapes and dtypes: then a ``torch._foreach_*_`` call can't fail half-way. None
    otherwise (the general path checks broadcasting and casting, and explains errors)."""
    dst: list = []
    src: list = []
    if not _pair_leaves(td._tensordict, other._tensordict, dst, src):
        return None
    if [x.shape for x in dst] != [x.shape for x in src] or [x.dtype for x in dst] != [x.dtype for x in src]:
        return None
    return dst, src


def _bad_batch(shape: torch.Size, bs: torch.Size, n: int) -> bool:
    """Whether ``shape`` does not start with the ``n``-dim batch size ``bs``.

    ``shape[:n] != bs`` builds a new ``torch.Size`` (slow); one batch dim, the common
    case, needs none.
    """
    if n == 1:
        return not shape or shape[0] != bs[0]
    return n > 0 and shape[:n] != bs


def _batch_error(key: Any, bs: torch.Size, shape: torch.Size) -> ValueError:
    return ValueError(
        f"batch size mismatch for key {key!r}: the TensorDict has batch_size "
        f"{list(bs)} but the value has shape {list(shape)}"
    )


def _rebuild(source, batch_size, device, names, locked):
    td = _td(source, batch_size, device, names)
    if locked:
        td.lock_()
    return td


def _as_device(device: Any) -> torch.device:
    if isinstance(device, int):
        return torch.device("cuda", device)
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _other_entry(other: Any, key: str, default: Any, prefix: tuple) -> Any:
    if other is None:
        return None
    try:
        return other._get_str(key, NO_DEFAULT)
    except KeyError:
        if default is NO_DEFAULT:
            raise KeyError(
                f"key {prefix + (key,) if prefix else key!r} is missing from an argument "
                "of apply/arithmetic; pass default= to fill it"
            ) from None
        return default
    except AttributeError:
        raise TypeError(f"expected a TensorDict argument, got {type(other).__name__}") from None


def _gather_inplace(td: TensorDictBase, others: tuple, default: Any, work: list, prefix: tuple) -> None:
    for k in td._keys_str():
        v = td._get_str(k, NO_DEFAULT)
        args = [_other_entry(o, k, default, prefix) for o in others]
        if isinstance(v, Tensor):
            for a in args:
                if isinstance(a, Tensor) and a.shape != v.shape:
                    from .base import _check_broadcast

                    _check_broadcast(a.shape, v.shape, prefix + (k,) if prefix else k)
            work.append((v, args))
        elif getattr(type(v), "_is_lazy", False):  # in-place ops must reach the members' leaves
            v._gather_inplace(tuple(args), default, work, prefix + (k,))
        elif _is_branch(v):
            _gather_inplace(v, tuple(args), default, work, prefix + (k,))


def _check_mapped(td: TensorDict) -> None:
    bs = td._batch_size
    n = len(bs)
    b0 = bs[0] if n == 1 else None
    dev = td._device
    for k, v in td._tensordict.items():
        shape = v.shape if isinstance(v, Tensor) else v.batch_size
        if ((not shape or shape[0] != b0) if n == 1 else _bad_batch(shape, bs, n)) and type(v) is not _UT:
            raise ValueError(
                f"the function changed the batch dims of {k!r} (shape {list(shape)}, batch_size "
                f"{list(bs)}); pass batch_size= to apply() for the new batch size"
            )
        if dev is not None and isinstance(v, Tensor) and v.device != dev:
            td._device = None
            dev = None


def _names_after_index(names: list, index: Any) -> list | None:
    """The dim names after ``index``: a slice keeps its dim's name, an int drops it, None
    adds an unnamed dim; tensor indices drop all names."""
    plan = plan_index(index, len(names))
    if plan.n_advanced:
        return None
    out = [names[s.in_dim] if s.kind == SLICE else None for s in plan.steps if s.kind != INT]
    return None if all(n is None for n in out) else out
