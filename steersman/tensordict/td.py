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

__all__ = ["TensorDict"]

_new_object = object.__new__


class TensorDict(TensorDictBase):
    """A dictionary of tensors that share leading batch dimensions.

    Args:
        source: a dict (nested dicts become nested TensorDicts) or ``None``.
        batch_size: the leading dims every entry shares (default: ``[]``).
        device: if given, every entry is moved there; ``None`` allows mixed devices.
        names: optional names of the batch dims.
        **kwargs: more entries, as keyword arguments.

    Shapes: each entry has shape ``[*batch_size, *feature_dims]``.

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
            if isinstance(source, TensorDictBase):
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
            if isinstance(value, Tensor):  # the common case, inlined
                if value.shape[:n] != bs:
                    raise ValueError(
                        f"batch size mismatch for key {key!r}: the TensorDict has batch_size "
                        f"{list(bs)} but the value has shape {list(value.shape)}"
                    )
                if dev is not None and value.device != dev:
                    value = value.to(dev, non_blocking=True)
                td[key] = value
            elif type(value) is dict or (isinstance(value, Mapping) and not is_tensor_collection(value)):
                td[key] = TensorDict(value, bs, dev)
            else:
                self._set_str(key, self._prepare_value(key, value), False, False)

    @classmethod
    def _new_unsafe(
        cls, source: dict, batch_size: torch.Size, device: torch.device | None = None, names: Any = None
    ) -> TensorDict:
        """Builds a TensorDict from already-valid entries (no checks, no copies)."""
        self = _new_object(cls)
        self._tensordict = source
        self._batch_size = batch_size
        self._device = device
        self._names = names
        self._locked = False
        return self

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
        return cls._new_unsafe(out, torch.Size(()), dev)

    def auto_batch_size_(self, batch_dims: int | None = None) -> TensorDict:
        """Sets the batch size to the longest shape prefix shared by all leaves (in place)."""
        shapes = [t.shape for t in self._tensor_leaves()]
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
        for v in self._tensordict.values():
            if isinstance(v, TensorDict):
                v._batch_size = bs
                v.auto_batch_size_()
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
            if _is_non_tensor(v) and not getattr(type(v), "_is_stack", False):
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
            if shape[: len(bs)] != bs:
                raise ValueError(
                    f"batch size mismatch for key {key!r}: the TensorDict has batch_size "
                    f"{list(bs)} but the value has shape {list(shape)}"
                )
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
        return TensorDict._new_unsafe({}, batch_size, self._device, None)

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
        if type(index) is int and self._batch_size:
            return self._index(index)
        if type(index) is slice and self._batch_size:
            return self._index(index)
        return super().__getitem__(index)

    def set(self, key: NestedKey, item: Any, inplace: bool = False, **kwargs: Any) -> TensorDict:
        if type(key) is str and isinstance(item, Tensor) and not (inplace or self._locked):
            bs = self._batch_size
            if item.shape[: len(bs)] != bs:
                raise ValueError(
                    f"batch size mismatch for key {key!r}: the TensorDict has batch_size "
                    f"{list(bs)} but the value has shape {list(item.shape)}"
                )
            dev = self._device
            if dev is not None and item.device != dev:
                item = item.to(dev, non_blocking=kwargs.get("non_blocking", True))
            self._tensordict[key] = item
            return self
        return super().set(key, item, inplace, **kwargs)

    def __setitem__(self, index: Any, value: Any) -> None:
        if type(index) is str and type(value) is Tensor and not self._locked:
            bs = self._batch_size
            if value.shape[: len(bs)] != bs:
                raise ValueError(
                    f"batch size mismatch for key {index!r}: the TensorDict has batch_size "
                    f"{list(bs)} but the value has shape {list(value.shape)}"
                )
            dev = self._device
            if dev is not None and value.device != dev:
                value = value.to(dev, non_blocking=True)
            self._tensordict[index] = value
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
        bd = len(self._batch_size)
        out = {}
        new_bs = None
        for k, v in self._tensordict.items():
            if isinstance(v, Tensor):
                r = v[index]
                if new_bs is None:
                    new_bs = r.shape[: r.ndim - v.ndim + bd]
            else:
                r = v._index(index)
                if new_bs is None:
                    rb = r.batch_size
                    new_bs = rb[: len(rb) - len(v.batch_size) + bd]
            out[k] = r
        if new_bs is None:
            new_bs = indexed_batch_size(self._batch_size, index)
        names = None if self._names is None else _names_after_index(self._names, index)
        return TensorDict._new_unsafe(out, new_bs, self._device, names)

    def _apply_batch(self, fn: Callable, batch_size: torch.Size, names: Any) -> TensorDict:
        bd = len(self._batch_size)
        out = {}
        for k, v in self._tensordict.items():
            if isinstance(v, Tensor):
                out[k] = fn(v)
            else:
                out[k] = v._apply_batch(fn, batch_size + v.batch_size[bd:], None)
        return TensorDict._new_unsafe(out, batch_size, self._device, names)

    def _split_batch(self, fn: Callable, batch_sizes: list) -> list[TensorDict]:
        bd = len(self._batch_size)
        outs: list[dict] = [{} for _ in batch_sizes]
        for k, v in self._tensordict.items():
            if isinstance(v, Tensor):
                parts = fn(v)
            else:
                extra = v.batch_size[bd:]
                parts = v._split_batch(fn, [b + extra for b in batch_sizes])
            for o, p in zip(outs, parts):
                o[k] = p
        dev = self._device
        return [TensorDict._new_unsafe(o, b, dev, None) for o, b in zip(outs, batch_sizes)]

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
                sub_bs = batch_size if flags.get("scalar_out") else batch_size + v.batch_size[bd:]
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
            result = TensorDict._new_unsafe(out, self._batch_size, device, self._names)
        else:
            result = TensorDict._new_unsafe(out, batch_size, device, None)
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
        return TensorDict._new_unsafe(out, self._batch_size, device, self._names)

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

    def copy(self) -> TensorDict:
        """A shallow copy: new containers, same leaf tensors."""
        out = {}
        for k, v in self._tensordict.items():
            out[k] = v if isinstance(v, Tensor) else v.copy()
        return TensorDict._new_unsafe(out, self._batch_size, self._device, self._names)

    def select(self, *keys: NestedKey, inplace: bool = False, strict: bool = True) -> TensorDict:
        if not inplace:
            src = self._tensordict
            out = {}
            try:  # string keys that exist; anything else takes the general path
                for k in keys:
                    out[k] = src[k]
            except (KeyError, TypeError):
                pass
            else:
                return TensorDict._new_unsafe(out, self._batch_size, self._device, self._names)
        return super().select(*keys, inplace=inplace, strict=strict)

    def exclude(self, *keys: NestedKey, inplace: bool = False) -> TensorDict:
        if not inplace and all(type(k) is str for k in keys):
            out = {k: v for k, v in self._tensordict.items() if k not in keys}
            return TensorDict._new_unsafe(out, self._batch_size, self._device, self._names)
        return super().exclude(*keys, inplace=inplace)

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
                if type(k) is not str or not isinstance(v, Tensor) or v.shape[:n] != bs or (
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

        return TensorDict._new_unsafe(
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
            if not isinstance(sv, Tensor) or sv.shape[vbd:] != dv.shape[bd:]:
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


def _rebuild(source, batch_size, device, names, locked):
    td = TensorDict._new_unsafe(source, batch_size, device, names)
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
    dev = td._device
    for k, v in td._tensordict.items():
        shape = v.shape if isinstance(v, Tensor) else v.batch_size
        if shape[: len(bs)] != bs:
            raise ValueError(
                f"the function changed the batch dims of {k!r} (shape {list(shape)}, batch_size "
                f"{list(bs)}); pass batch_size= to apply() for the new batch size"
            )
        if dev is not None and isinstance(v, Tensor) and v.device != dev:
            td._device = None
            dev = None


def _names_after_index(names: list, index: Any) -> list | None:
    items = index if type(index) is tuple else (index,)
    out = []
    pos = 0
    for it in items:
        if it is None:
            out.append(None)
        elif type(it) is int:
            pos += 1
        elif type(it) is slice:
            out.append(names[pos])
            pos += 1
        else:
            return None
    out.extend(names[pos:])
    return None if all(n is None for n in out) else out
