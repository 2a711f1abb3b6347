"""``@tensorclass``: dataclasses whose fields live in a :class:`TensorDict`.

A tensorclass is a type-annotated class turned into a dataclass-like container. Its
fields are stored in a ``TensorDict`` (``self._tensordict``), so an instance has a batch
size, a device and every TensorDict operation: indexing, shape ops, stacking,
arithmetic, ``to``/``clone``, memory mapping, saving. Results that are containers come
back as the same tensorclass type.

How it is built: the decorated class is processed by :func:`dataclasses.dataclass`
(fields, defaults) and a new class is created that inherits from it first (so the
user's own methods and properties win) and from :class:`_TensorClass` second, a
:class:`TensorDictBase` whose primitives delegate to ``self._tensordict`` and wrap
the results. Each field becomes a property reading ``self._tensordict`` directly (the
hot path: one dict lookup). Non-tensor values (strings, objects) are stored as
``NonTensorData`` and read back as the raw value.

Example:
    >>> import torch
    >>> from steersman.tensordict import tensorclass
    >>> @tensorclass
    ... class Transition:
    ...     obs: torch.Tensor
    ...     reward: torch.Tensor
    ...     info: str = "none"
    ...
    ...     def total(self) -> torch.Tensor:
    ...         return self.reward.sum()
    >>> t = Transition(obs=torch.zeros(4, 3), reward=torch.ones(4), batch_size=[4])
    >>> t[1:3].obs.shape, type(t[0]).__name__, t.info
    (torch.Size([2, 3]), 'Transition', 'none')
    >>> torch.stack([t, t]).batch_size, t.total().item()
    (torch.Size([2, 4]), 4.0)
"""

from __future__ import annotations

import copy as _copy
import dataclasses
import inspect
import numbers
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor

from ._utils import NO_DEFAULT, NestedKey, as_size
from .base import TensorDictBase, _is_branch, _is_non_tensor, _unwrap, is_tensor_collection
from .nontensor import NonTensorData, to_entry
from .td import TensorDict

__all__ = ["tensorclass", "is_tensorclass", "from_dataclass"]

T = TypeVar("T")

#: names a field can never take (constructor keywords and the storage attribute)
_RESERVED = frozenset({"batch_size", "device", "names", "_tensordict"})
#: attributes set through ``object.__setattr__`` (properties of the container)
_SETTABLE = frozenset({"batch_size", "names", "device"})


def is_tensorclass(obj: Any) -> bool:
    """True if ``obj`` is a tensorclass type or an instance of one.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict, tensorclass, is_tensorclass
        >>> @tensorclass
        ... class P:
        ...     x: torch.Tensor
        >>> is_tensorclass(P), is_tensorclass(P(x=torch.zeros(2), batch_size=[2]))
        (True, True)
        >>> is_tensorclass(TensorDict())
        False
    """
    cls = obj if isinstance(obj, type) else type(obj)
    return getattr(cls, "_is_tensorclass", False) is True


# ---------------------------------------------------------------------- the shared base
class _TensorClass(TensorDictBase):
    """What every tensorclass inherits after the user's class: a TensorDictBase that
    delegates its primitives to ``self._tensordict`` and wraps container results."""

    _is_tensorclass = True
    _field_names: tuple[str, ...] = ()
    _field_set: frozenset[str] = frozenset()
    __expected_keys__: frozenset[str] = frozenset()
    _autocast = False
    _nocast = False
    _frozen = False
    _tc_localns: dict | None = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def _wrap(cls: type[T], td: TensorDictBase) -> T:
        """An instance around ``td`` (no copy, no checks, no ``__post_init__``)."""
        obj = object.__new__(cls)
        obj.__dict__["_tensordict"] = td
        if cls._frozen:
            td.lock_()
        return obj

    @classmethod
    def from_tensordict(cls: type[T], tensordict: TensorDictBase, non_tensordict: Mapping | None = None,
                        safe: bool = True) -> T:
        """Wraps ``tensordict`` (not copied: writes to fields go to it).

        Its keys must be fields of the class; ``non_tensordict`` adds more field values.

        Example:
            >>> import torch
            >>> from steersman.tensordict import TensorDict, tensorclass
            >>> @tensorclass
            ... class P:
            ...     x: torch.Tensor
            >>> P.from_tensordict(TensorDict({"x": torch.ones(3)}, [3])).x.tolist()
            [1.0, 1.0, 1.0]
        """
        if is_tensorclass(tensordict):
            tensordict = tensordict._tensordict
        if not isinstance(tensordict, TensorDictBase):
            raise TypeError(f"from_tensordict expects a TensorDict, got {type(tensordict).__name__}")
        extra = [k for k in tensordict._keys_str() if k not in cls._field_set]
        if extra:
            raise ValueError(
                f"keys {sorted(extra)} of the TensorDict are not fields of {cls.__name__} "
                f"(fields: {list(cls._field_names)})"
            )
        retype = cls._retype_plan(tensordict)
        if retype or non_tensordict:
            tensordict = tensordict.copy()
            for key, sub_cls in retype.items():
                tensordict._set_str(key, sub_cls.from_tensordict(tensordict._get_str(key, NO_DEFAULT)),
                                    False, True)
        out = cls._wrap(tensordict)
        for key, value in (non_tensordict or {}).items():
            out.set(key, value)
        return out

    @classmethod
    def _retype_plan(cls, td: TensorDictBase) -> dict[str, type]:
        """Entries of ``td`` that are plain containers but annotated as a tensorclass."""
        plan = {}
        for name, hint in cls._field_hints().items():
            if isinstance(hint, type) and is_tensorclass(hint):
                v = td._get_str(name, None)
                if v is not None and _is_branch(v) and not is_tensorclass(v):
                    plan[name] = hint
        return plan

    @classmethod
    def from_dict(cls: type[T], input_dict: Mapping, batch_size: Any = None, device: Any = None,
                  batch_dims: int | None = None, names: Any = None) -> T:
        """Builds an instance from a (nested) dict; the batch size is found if not given."""
        td = TensorDict.from_dict(input_dict, batch_size=batch_size, device=device,
                                  batch_dims=batch_dims, names=names)
        return cls.from_tensordict(td)

    @classmethod
    def _field_hints(cls) -> dict[str, Any]:
        """Resolved annotations of the fields (``None`` where unknown), cached per class."""
        hints = cls.__dict__.get("_tc_hints")
        if hints is None:
            hints = _resolve_hints(cls)
            type.__setattr__(cls, "_tc_hints", hints)
        return hints

    # ------------------------------------------------------------------ properties
    @property
    def batch_size(self) -> torch.Size:
        return self._tensordict.batch_size

    @batch_size.setter
    def batch_size(self, value: Any) -> None:
        self._tensordict.batch_size = value

    @property
    def device(self) -> torch.device | None:
        return self._tensordict.device

    @device.setter
    def device(self, value: Any) -> None:
        self._tensordict.device = value

    @property
    def names(self) -> list:
        return self._tensordict.names

    @names.setter
    def names(self, value: Any) -> None:
        self._tensordict.names = value

    # ------------------------------------------------------------------ attributes
    def __setattr__(self, name: str, value: Any) -> None:
        cls = type(self)
        if name in cls._field_set:
            if cls._frozen:
                raise dataclasses.FrozenInstanceError(
                    f"cannot assign to field {name!r}: {cls.__name__} is frozen"
                )
            self._set_field(name, value)
        elif name in _SETTABLE or name[:1] == "_":
            object.__setattr__(self, name, value)
        else:
            attr = getattr(cls, name, None)
            if attr is not None and hasattr(type(attr), "__set__"):
                object.__setattr__(self, name, value)
                return
            raise AttributeError(
                f"cannot set attribute {name!r}: {cls.__name__} has no field of that name "
                f"(fields: {list(cls._field_names)})"
            )

    def __getattr__(self, name: str) -> Any:
        # only called when normal lookup fails: forward to the TensorDict and wrap
        if name[:2] == "__" or name == "_tensordict":
            raise AttributeError(name)
        try:
            td = self.__dict__["_tensordict"]
        except KeyError:
            raise AttributeError(name) from None
        try:
            attr = getattr(td, name)
        except AttributeError:
            raise AttributeError(
                f"{type(self).__name__!r} object has no attribute {name!r} "
                f"(fields: {list(type(self)._field_names)})"
            ) from None
        if not callable(attr):
            return attr

        def forwarded(*args: Any, **kwargs: Any) -> Any:
            return self._rewrap_result(attr(*args, **kwargs))

        forwarded.__name__ = name
        forwarded.__doc__ = getattr(attr, "__doc__", None)
        return forwarded

    def _rewrap_result(self, out: Any) -> Any:
        td = self._tensordict
        if out is td:
            return self
        if type(out) is TensorDict and all(k in self._field_set for k in out._keys_str()):
            return type(self)._wrap(out)
        return out

    def _check_field(self, key: str) -> None:
        cls = type(self)
        if key not in cls._field_set:
            if self._tensordict._is_locked_flag():
                raise RuntimeError(f"cannot add key {key!r}: {cls.__name__} is locked (unlock_() it first)")
            raise AttributeError(
                f"cannot set {key!r}: {cls.__name__} has no field of that name "
                f"(fields: {list(cls._field_names)})"
            )

    def _set_field(self, name: str, value: Any, inplace: bool = False) -> None:
        td = self._tensordict
        if value is None:
            if td._get_str(name, None) is not None:
                td._del_str(name)
            return
        value = self._prepare_value(name, value)
        try:
            td._set_str(name, value, inplace, False)
        except ValueError as err:
            raise ValueError(f"{type(self).__name__}.{name}: {err}") from None

    def _prepare_value(self, key: str, value: Any) -> Any:
        """Applies the class's casting rules, then TensorDict's conversion of raw values."""
        if isinstance(value, Tensor):
            return value
        cls = type(self)
        if is_tensor_collection(value):
            if cls._autocast:
                hint = cls._field_hints().get(key)
                if (isinstance(hint, type) and is_tensorclass(hint) and not isinstance(value, hint)
                        and _is_branch(value)):
                    value = hint.from_tensordict(value)
            return value
        td = self._tensordict
        if isinstance(value, Mapping):
            value = TensorDict(value, batch_size=td.batch_size, device=td.device)
            if cls._autocast:
                hint = cls._field_hints().get(key)
                if isinstance(hint, type) and is_tensorclass(hint):
                    value = hint.from_tensordict(value)
            return value
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return from_dataclass(value, batch_size=td.batch_size, device=td.device)
        if cls._nocast:
            return NonTensorData(value, td.batch_size, td.device)
        if cls._autocast:
            value = _autocast(value, cls._field_hints().get(key), td)
            if isinstance(value, Tensor) or is_tensor_collection(value):
                return value
        return to_entry(value, td.batch_size, td.device, key)

    # ------------------------------------------------------------------ primitives
    def _keys_str(self):
        return self._tensordict._keys_str()

    def _get_str(self, key: str, default: Any) -> Any:
        return self._tensordict._get_str(key, default)

    def _set_str(self, key: str, value: Any, inplace: bool, validated: bool) -> None:
        self._check_field(key)
        if value is None:
            self._set_field(key, None)
            return
        if not (isinstance(value, Tensor) or is_tensor_collection(value)):
            value = self._prepare_value(key, value)
        self._tensordict._set_str(key, value, inplace, validated)

    def _del_str(self, key: str) -> None:
        self._tensordict._del_str(key)

    def _index(self, index: Any) -> Any:
        return type(self)._wrap(self._tensordict._index(index))

    def _apply_batch(self, fn: Callable, batch_size: torch.Size, names: Any) -> Any:
        return type(self)._wrap(self._tensordict._apply_batch(fn, batch_size, names))

    def _split_batch(self, fn: Callable, batch_sizes: list) -> list:
        cls = type(self)
        return [cls._wrap(td) for td in self._tensordict._split_batch(fn, batch_sizes)]

    def _map(self, fn: Callable, others: tuple, **kwargs: Any) -> Any:
        return type(self)._wrap(self._tensordict._map(fn, others, **kwargs))

    def _map_(self, fn: Callable, others: tuple, **kwargs: Any) -> None:
        self._tensordict._map_(fn, others, **kwargs)

    def _assign_at(self, index: Any, value: Any) -> None:
        self._tensordict._setitem_batch(index, value)

    def _new_empty(self, batch_size: torch.Size) -> TensorDictBase:
        # a plain TensorDict: base code uses it for sub-containers under any key
        return self._tensordict._new_empty(batch_size)

    def _tensor_leaves(self) -> list[Tensor]:
        return self._tensordict._tensor_leaves()

    def lock_(self) -> Any:
        self._tensordict.lock_()
        return self

    def unlock_(self) -> Any:
        self._tensordict.unlock_()
        return self

    def _is_locked_flag(self) -> bool:
        return self._tensordict._is_locked_flag()

    def _get_or_create_parent(self, key: tuple[str, ...]) -> TensorDictBase:
        node: Any = self
        for i, k in enumerate(key[:-1]):
            sub = node._get_str(k, None)
            if sub is None:
                hint = type(node)._field_hints().get(k) if is_tensorclass(node) else None
                empty = TensorDict.from_trusted({}, node.batch_size, node.device)
                sub = hint._wrap(empty) if isinstance(hint, type) and is_tensorclass(hint) else empty
                node._set_str(k, sub, False, True)
            elif not _is_branch(sub):
                raise KeyError(f"cannot set {key!r}: {key[: i + 1]!r} is a leaf")
            node = sub
        return node

    # ------------------------------------------------------------------ get / set / index
    def get(self, key: NestedKey, default: Any = NO_DEFAULT) -> Any:
        """The entry at ``key``; a field that is not set gives ``None`` (non-tensor
        entries come back as their ``NonTensorData`` wrapper, like ``TensorDict.get``).

        ``tc["key"]`` is not supported: a tensorclass is indexed over its batch only.
        """
        if type(key) is str and key in self._field_set and default is NO_DEFAULT:
            default = None
        return TensorDictBase.get(self, key, default)

    def set(self, key: NestedKey, item: Any, inplace: bool = False, **kwargs: Any) -> Any:
        """Sets a field (``tc.set("obs", x)`` is ``tc.obs = x``); tuple keys set nested entries.

        Only fields can be set: another key raises ``AttributeError`` (``RuntimeError``
        when the instance is locked).
        """
        if type(key) is str:
            self._check_field(key)
            if type(self)._frozen:
                raise dataclasses.FrozenInstanceError(f"cannot set {key!r}: {type(self).__name__} is frozen")
            self._set_field(key, item, inplace)
            return self
        return TensorDictBase.set(self, key, item, inplace, **kwargs)

    def __getitem__(self, index: Any) -> Any:
        if type(index) is str or (type(index) is tuple and index and isinstance(index[0], (str, tuple))):
            raise ValueError(
                f"{type(self).__name__} is indexed over its batch dims only; read {index!r} "
                "with an attribute or .get()"
            )
        td = self._tensordict
        out = td[index]
        return self if out is td else type(self)._wrap(out)

    def __setitem__(self, index: Any, value: Any) -> None:
        if type(index) is str or (type(index) is tuple and index and isinstance(index[0], (str, tuple))):
            raise ValueError(
                f"{type(self).__name__} is indexed over its batch dims only; write {index!r} "
                "with an attribute or .set()"
            )
        self._tensordict[index] = value

    def __delitem__(self, key: Any) -> None:
        raise TypeError(
            f"del on {type(self).__name__}[{key!r}] is not supported; set the field to None "
            "(or use .del_(key))"
        )

    # ------------------------------------------------------------------ containers
    def copy(self) -> Any:
        """A shallow copy: a new container around the same leaf tensors."""
        return type(self)._wrap(self._tensordict.copy())

    def select(self, *keys: NestedKey, inplace: bool = False, strict: bool = True,
               as_tensordict: bool = False) -> Any:
        """The instance with only ``keys`` (other fields ``None``); ``as_tensordict=True``
        returns the selected entries as a plain TensorDict instead."""
        out = self._tensordict.select(*keys, inplace=inplace, strict=strict)
        if inplace:
            return self
        return out if as_tensordict else type(self)._wrap(out)

    def to_dict(self, *, retain_none: bool = True, convert_tensors: bool | str = False,
                tolist_first: bool = False) -> dict[str, Any]:
        """The fields as a nested dict; a ``None`` field is kept as ``None`` unless
        ``retain_none=False`` (the other keywords: see ``TensorDictBase.to_dict``)."""
        out = self._tensordict.to_dict(retain_none=retain_none, convert_tensors=convert_tensors,
                                       tolist_first=tolist_first)
        if not retain_none:
            return out
        return {**{name: out.get(name) for name in type(self)._field_names}, **out}

    def exclude(self, *keys: NestedKey, inplace: bool = False) -> Any:
        out = self._tensordict.exclude(*keys, inplace=inplace)
        return self if inplace else type(self)._wrap(out)

    def empty(self, recurse: bool = False, *, batch_size: Any = None, device: Any = NO_DEFAULT,
              names: Any = None) -> Any:
        return type(self)._wrap(self._tensordict.empty(recurse, batch_size=batch_size, device=device, names=names))

    def flatten_keys(self, separator: str = ".", inplace: bool = False) -> TensorDictBase:
        """Nested keys joined by ``separator``; returns a plain TensorDict (the keys are
        no longer fields)."""
        if inplace:
            raise RuntimeError(f"flatten_keys(inplace=True) would create keys that are not fields of "
                               f"{type(self).__name__}; use flatten_keys() on a copy")
        return self._tensordict.flatten_keys(separator)

    def unflatten_keys(self, separator: str = ".", inplace: bool = False) -> TensorDictBase:
        if inplace:
            raise RuntimeError(f"unflatten_keys(inplace=True) is not supported on {type(self).__name__}")
        return self._tensordict.unflatten_keys(separator)

    def to_tensordict(self) -> TensorDict:
        """A ``TensorDict`` copy of the data (nested tensorclasses become TensorDicts too)."""
        return _untype(self._tensordict.clone())

    # ------------------------------------------------------------------ stacking
    @classmethod
    def _stack_impl(cls, vals: Sequence[Any], dim: int) -> Any:
        from .functional import stack

        out_cls = _common_class(vals, "stack")
        return out_cls._wrap(stack([_inner(v) for v in vals], dim))

    @classmethod
    def _cat_impl(cls, vals: Sequence[Any], dim: int) -> Any:
        from .functional import cat

        out_cls = _common_class(vals, "cat")
        return out_cls._wrap(cat([_inner(v) for v in vals], dim))

    # ------------------------------------------------------------------ io
    def memmap_(self, prefix: Any = None, copy_existing: bool = False, *, num_threads: int = 0,
                existsok: bool = True) -> Any:
        """Moves every leaf to a memory-mapped file under ``prefix`` (in place); locks."""
        self._tensordict.memmap_(prefix, copy_existing, num_threads=num_threads, existsok=existsok)
        return self

    def memmap(self, prefix: Any = None, copy_existing: bool = False, *, num_threads: int = 0,
               existsok: bool = True) -> Any:
        """A memory-mapped copy under ``prefix``, of the same tensorclass type."""
        td = self._tensordict
        out = td.memmap(prefix, copy_existing, num_threads=num_threads, existsok=existsok)
        return type(self)._wrap(_retype_like(td, out))

    def memmap_like(self, prefix: Any = None, copy_existing: bool = False, *, existsok: bool = True,
                    num_threads: int = 0) -> Any:
        """A memory-mapped instance with the same structure, filled with zeros."""
        td = self._tensordict
        out = td.memmap_like(prefix, copy_existing, existsok=existsok, num_threads=num_threads)
        return type(self)._wrap(_retype_like(td, out))

    def save(self, prefix: Any, copy_existing: bool = False, *, num_threads: int = 0) -> Any:
        """Writes the data under ``prefix`` (see ``TensorDict.save``); reload with ``Cls.load``."""
        self._tensordict.save(prefix)
        return self

    dumps = save

    @classmethod
    def load(cls: type[T], prefix: Any, device: Any = None, *, mmap: bool = False) -> T:
        """Loads data saved with ``save``/``memmap`` as an instance of this class.

        Only JSON metadata and raw tensor bytes are read: no code from the files is
        imported or run. Nested fields annotated with a tensorclass get that type back.
        """
        from .io import load

        out = cls._from_loaded(load(prefix, mmap=mmap))
        return out if device is None else out.to(device)

    @classmethod
    def load_memmap(cls: type[T], prefix: Any, device: Any = None, non_blocking: bool = False) -> T:
        """Opens saved data with every tensor memory-mapped."""
        return cls.load(prefix, device, mmap=True)

    @classmethod
    def _from_loaded(cls: type[T], td: TensorDictBase) -> T:
        extra = [k for k in td._keys_str() if k not in cls._field_set]
        if extra:
            raise ValueError(f"saved keys {sorted(extra)} are not fields of {cls.__name__}")
        for key, sub_cls in cls._retype_plan(td).items():
            td._tensordict[key] = sub_cls._from_loaded(td._get_str(key, NO_DEFAULT))
        return cls._wrap(td)

    # ------------------------------------------------------------------ dunder
    def __eq__(self, other: Any) -> Any:  # type: ignore[override]
        if not _comparable(other):
            return False
        return TensorDictBase.__eq__(self, other)

    def __ne__(self, other: Any) -> Any:  # type: ignore[override]
        if not _comparable(other):
            return True
        return TensorDictBase.__ne__(self, other)

    __hash__ = TensorDictBase.__hash__

    def __repr__(self) -> str:
        td = self._tensordict
        parts = [f"{name}={_value_repr(td._get_str(name, None))}" for name in self._field_names]
        parts += [f"batch_size={self.batch_size}", f"device={self.device}",
                  f"is_shared={td._shared_repr()}"]
        body = ",\n".join(parts).replace("\n", "\n    ")
        return f"{type(self).__name__}(\n    {body})"

    def __getstate__(self) -> dict:
        return dict(self.__dict__)

    def __reduce_ex__(self, protocol: Any) -> tuple:
        cls = type(self)
        if _importable(cls):
            return (_new_instance, (cls,), self.__getstate__())
        # a class defined in a function: rebuild a tensorclass with the same name and
        # fields on load (its methods cannot travel without pickling code)
        spec = (cls.__name__, cls._field_names, cls._autocast, cls._nocast, cls._frozen)
        return (_new_dynamic_instance, spec, self.__getstate__())

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def __copy__(self) -> Any:
        out = self.copy()
        for k, v in self.__dict__.items():
            if k != "_tensordict":
                out.__dict__[k] = v
        return out

    def __deepcopy__(self, memo: dict) -> Any:
        out = object.__new__(type(self))
        memo[id(self)] = out
        for k, v in self.__dict__.items():
            out.__dict__[k] = _copy.deepcopy(v, memo)
        return out


# ---------------------------------------------------------------------- helpers
def _importable(cls: type) -> bool:
    """True if pickle can find ``cls`` by its module and qualified name."""
    obj: Any = sys.modules.get(cls.__module__)
    for part in cls.__qualname__.split("."):
        obj = getattr(obj, part, None)
    return obj is cls


def _new_instance(cls: type) -> Any:
    return object.__new__(cls)


_DYNAMIC: dict[tuple, type] = {}


def _new_dynamic_instance(name: str, fields: tuple, autocast: bool, nocast: bool, frozen: bool) -> Any:
    key = (name, tuple(fields), autocast, nocast, frozen)
    cls = _DYNAMIC.get(key)
    if cls is None:
        ns = {"__annotations__": {f: Any for f in fields}, "__module__": __name__, "__qualname__": name}
        cls = _build(type(name, (), ns), autocast, nocast, frozen, True, None)
        _DYNAMIC[key] = cls
    return object.__new__(cls)


def _inner(v: Any) -> Any:
    return v._tensordict if is_tensorclass(v) else v


def _common_class(vals: Sequence[Any], op: str) -> type:
    out_cls = None
    for v in vals:
        if is_tensorclass(v):
            if out_cls is None:
                out_cls = type(v)
            elif type(v) is not out_cls:
                raise TypeError(
                    f"cannot {op} instances of different tensorclasses "
                    f"({out_cls.__name__} and {type(v).__name__})"
                )
        elif not isinstance(v, TensorDictBase):
            raise TypeError(f"cannot {op} a tensorclass with a {type(v).__name__}")
    assert out_cls is not None
    return out_cls


def _comparable(other: Any) -> bool:
    return isinstance(other, (Tensor, numbers.Number, np.ndarray, np.number, np.bool_)) or (
        is_tensor_collection(other)
    )


def _value_repr(v: Any) -> str:
    if v is None:
        return "None"
    if isinstance(v, Tensor):
        return (f"Tensor(shape={v.shape}, device={v.device}, dtype={v.dtype}, "
                f"is_shared={v.is_shared()})")
    if _is_non_tensor(v):
        return repr(_unwrap(v))
    return repr(v)


def _untype(td: TensorDictBase) -> TensorDictBase:
    """Replaces tensorclass entries (at any depth) by their TensorDicts, in place."""
    if type(td) is not TensorDict:
        return td
    d = td._tensordict
    for k, v in d.items():
        if is_tensorclass(v):
            d[k] = _untype(v._tensordict)
        elif type(v) is TensorDict:
            _untype(v)
    return td


def _retype_like(template: TensorDictBase, out: TensorDictBase) -> TensorDictBase:
    """Restores the tensorclass entries of ``template`` in ``out`` (same structure)."""
    if type(out) is not TensorDict:
        return out
    d = out._tensordict
    for k in list(d):
        t = template._get_str(k, None)
        o = d[k]
        if t is None or not _is_branch(t) or not _is_branch(o):
            continue
        if is_tensorclass(t):
            inner = o._tensordict if is_tensorclass(o) else o
            d[k] = type(t)._wrap(_retype_like(t._tensordict, inner))
        else:
            _retype_like(t, o)
    return out


def _autocast(value: Any, hint: Any, td: TensorDictBase) -> Any:
    """Casts a raw (non-tensor, non-container) value to the field's annotated type."""
    if not isinstance(hint, type):
        return value
    if issubclass(hint, Tensor):
        if isinstance(value, (numbers.Number, np.number, np.bool_, list, tuple)) or (
            isinstance(value, np.ndarray) and value.dtype != object
        ):
            return torch.as_tensor(value, device=td.device)
        return value
    if hint in (int, float, bool, complex, str):
        if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
            try:
                value = hint(value.item() if isinstance(value, (np.number, np.bool_)) else value)
            except (TypeError, ValueError):
                return value
        return NonTensorData(value, td.batch_size, td.device)
    if hint is np.ndarray:
        return NonTensorData(np.asarray(value), td.batch_size, td.device)
    if isinstance(value, hint):
        return NonTensorData(value, td.batch_size, td.device)
    return value


def _strip_optional(hint: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin is typing.Union or (hasattr(types, "UnionType") and origin is types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return _strip_optional(args[0]) if len(args) == 1 else None
    if hint is typing.Any:
        return None
    if origin is not None:  # list[int], dict[...]: the container type
        return origin if isinstance(origin, type) else None
    return hint


def _lookup_name(text: str, globalns: dict, localns: dict) -> Any:
    """A dotted name from the annotation string, without evaluating anything."""
    text = text.strip()
    for suffix in ("| None", "|None"):
        if text.endswith(suffix):
            text = text[: -len(suffix)].strip()
    if text.startswith("None |") or text.startswith("None|"):
        text = text.split("|", 1)[1].strip()
    if text.startswith("Optional[") and text.endswith("]"):
        text = text[len("Optional["):-1]
    if text in ("Tensor", "torch.Tensor"):
        return Tensor
    parts = text.split(".")
    if not all(p.isidentifier() for p in parts):
        return None
    import builtins

    ns = {**vars(builtins), **globalns, **localns}
    obj = ns.get(parts[0])
    for p in parts[1:]:
        obj = getattr(obj, p, None)
    return obj if isinstance(obj, type) else None


def _resolve_hints(cls: type) -> dict[str, Any]:
    module = sys.modules.get(cls.__module__)
    globalns = dict(vars(module)) if module is not None else {}
    localns = dict(cls._tc_localns or {})
    localns.setdefault(cls.__name__, cls)
    try:
        raw = typing.get_type_hints(cls, globalns=globalns, localns=localns)
    except Exception:
        raw = {}
    out = {}
    for f in dataclasses.fields(cls):
        hint = raw.get(f.name, f.type)
        if isinstance(hint, str):
            hint = _lookup_name(hint, globalns, localns)
        out[f.name] = _strip_optional(hint)
    return out


def _field_property(name: str) -> property:
    def fget(self: Any) -> Any:
        # hot path: the TensorDict's own dict; other backings go through ``_get_str``
        try:
            v = self._tensordict._tensordict[name]
        except KeyError:
            return None
        except (AttributeError, TypeError):
            v = self._tensordict._get_str(name, None)
        if isinstance(v, Tensor) or v is None:
            return v
        if getattr(type(v), "_is_non_tensor", False):
            return _unwrap(v)
        return v

    def fset(self: Any, value: Any) -> None:
        type(self).__setattr__(self, name, value)

    def fdel(self: Any) -> None:
        type(self).__setattr__(self, name, None)

    return property(fget, fset, fdel, doc=f"The {name!r} field (stored in ``self._tensordict``).")


def _make_init(fields: tuple[dataclasses.Field, ...], user_init: Callable | None) -> Callable:
    field_names = tuple(f.name for f in fields)
    defaults = {}
    for f in fields:
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = (False, f.default)
        elif f.default_factory is not dataclasses.MISSING:
            defaults[f.name] = (True, f.default_factory)

    def _setup(self: Any, batch_size: Any, device: Any) -> TensorDict:
        td = TensorDict(batch_size=as_size(batch_size), device=device)
        self.__dict__["_tensordict"] = td
        return td

    def _finish(self: Any, td: TensorDict, names: Any) -> None:
        if names is not None:
            td.names = names
        post = getattr(self, "__post_init__", None)
        if post is not None:
            post()
        if type(self)._frozen:
            td.lock_()

    if user_init is not None:
        def __init__(self, *args: Any, batch_size: Any = None, device: Any = None, names: Any = None,
                     non_blocking: bool | None = None, **kwargs: Any) -> None:
            td = _setup(self, batch_size, device)
            user_init(self, *args, **kwargs)
            if names is not None:
                td.names = names
            if type(self)._frozen:
                td.lock_()

        return __init__

    def __init__(self, *args: Any, batch_size: Any = None, device: Any = None, names: Any = None,
                 non_blocking: bool | None = None, **kwargs: Any) -> None:
        cls = type(self)
        if len(args) > len(field_names):
            raise TypeError(
                f"{cls.__name__}() takes {len(field_names)} positional field values but "
                f"{len(args)} were given"
            )
        values = dict(zip(field_names, args))
        for k, v in kwargs.items():
            if k not in cls._field_set:
                raise TypeError(
                    f"{cls.__name__}() got an unexpected keyword argument {k!r} "
                    f"(fields: {list(field_names)})"
                )
            if k in values:
                raise TypeError(f"{cls.__name__}() got multiple values for field {k!r}")
            values[k] = v
        td = _setup(self, batch_size, device)
        for name in field_names:
            if name in values:
                value = values[name]
            elif name in defaults:
                is_factory, d = defaults[name]
                value = d() if is_factory else d
            else:
                value = None
            if value is not None:
                self._set_field(name, value)
        _finish(self, td, names)

    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for f in fields:
        default = None
        if f.default is not dataclasses.MISSING:
            default = f.default
        params.append(inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                        default=default, annotation=f.type))
    for kw in ("batch_size", "device", "names"):
        params.append(inspect.Parameter(kw, inspect.Parameter.KEYWORD_ONLY, default=None))
    __init__.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    return __init__


def _caller_locals() -> dict | None:
    """Locals of the frame that applied the decorator, when it is a function body
    (so that annotations naming local classes can be resolved later)."""
    frame = sys._getframe(1)
    here = __name__
    while frame is not None and frame.f_globals.get("__name__") == here:
        frame = frame.f_back
    if frame is None or frame.f_locals is frame.f_globals:
        return None
    return dict(frame.f_locals)


def _build(cls: type, autocast: bool, nocast: bool, frozen: bool, shadow: bool,
           localns: dict | None) -> type:
    if autocast and nocast:
        raise ValueError("autocast and nocast cannot both be True")
    if not isinstance(cls, type):
        raise TypeError(f"@tensorclass decorates a class, got {cls!r}")
    if "_tc_fields_done" in cls.__dict__:
        return cls
    user_init = cls.__dict__.get("__init__")
    dataclasses.dataclass(cls, init=False, repr=False, eq=False)
    fields = dataclasses.fields(cls)
    td_attrs = set(dir(TensorDict))
    for f in fields:
        if f.name in _RESERVED:
            raise AttributeError(f"{cls.__name__}: {f.name!r} cannot be a field name of a tensorclass")
        if not shadow and f.name in td_attrs:
            raise AttributeError(
                f"{cls.__name__}: the field {f.name!r} would shadow the TensorDict attribute of "
                "the same name; rename it or use @tensorclass(shadow=True)"
            )
    names = tuple(f.name for f in fields)
    ns: dict[str, Any] = {
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__,
        "_tc_fields_done": True,
        "_field_names": names,
        "_field_set": frozenset(names),
        "__expected_keys__": frozenset(names),
        "_autocast": autocast,
        "_nocast": nocast,
        "_frozen": frozen,
        "_tc_localns": localns,
        "__init__": _make_init(fields, user_init),
    }
    for name in names:
        ns[name] = _field_property(name)
    bases = (cls,) if issubclass(cls, _TensorClass) else (cls, _TensorClass)
    return type(cls)(cls.__name__, bases, ns)


def tensorclass(cls: type | None = None, *, autocast: bool = False, nocast: bool = False,
                frozen: bool = False, shadow: bool = False, tensor_only: bool = False,
                kw_only: bool = False, cast_filter: Any = None, skip_post_init_on_rebuild: bool = False) -> Any:
    """Turns a type-annotated class into a dataclass backed by a TensorDict.

    Use as ``@tensorclass`` or ``@tensorclass(autocast=..., nocast=..., frozen=...)``.

    Args:
        autocast: cast values to the annotated type when set (``torch.Tensor`` fields
            turn numbers, lists and numpy arrays into tensors; ``int``/``float``/``str``
            fields keep Python values; tensorclass fields wrap dicts and TensorDicts).
        nocast: keep numbers and numpy arrays as they are (by default they become
            tensors, like in a TensorDict).
        frozen: fields cannot be assigned after construction (the data is locked).
        shadow: allow field names that are also TensorDict attributes (``values``...).
        tensor_only, skip_post_init_on_rebuild: accepted for tensordict's signature (fields
            are stored as with no flag; ``__post_init__`` runs on construction only).
        kw_only: ``True`` (keyword-only fields) is refused with ``NotImplementedError``.
        cast_filter: with ``autocast``, tensordict's filter of the fields to cast; only
            ``None`` is supported here (``NotImplementedError`` otherwise).

    The constructor takes the fields (positionally or by name; a missing field without
    a default is ``None``) plus ``batch_size=``, ``device=`` and ``names=``.

    Example:
        >>> import torch
        >>> from steersman.tensordict import tensorclass
        >>> @tensorclass
        ... class Obs:
        ...     pixels: torch.Tensor
        ...     mask: torch.Tensor | None = None
        >>> o = Obs(torch.zeros(8, 3, 4), batch_size=[8])
        >>> o.mask is None, o.reshape(2, 4).pixels.shape
        (True, torch.Size([2, 4, 3, 4]))
        >>> (o + 1).pixels.mean().item()
        1.0
    """
    localns = _caller_locals()
    if kw_only:
        raise NotImplementedError("tensorclass(kw_only=True) is not supported: fields are positional or keyword")
    if cast_filter is not None:
        raise NotImplementedError("tensorclass(cast_filter=...) is not supported: autocast casts every field")

    def wrap(c: type) -> type:
        return _build(c, autocast, nocast, frozen, shadow, localns)

    if cls is None:
        return wrap
    return wrap(cls)


# ---------------------------------------------------------------------- from_dataclass
_DC_SKIP = frozenset({
    "__init__", "__repr__", "__eq__", "__ne__", "__hash__", "__setattr__", "__delattr__",
    "__dataclass_fields__", "__dataclass_params__", "__match_args__", "__dict__", "__weakref__",
    "__annotations__", "__getstate__", "__setstate__", "__slots__", "__lt__", "__le__", "__gt__",
    "__ge__", "__module__", "__qualname__",
})
_DC_CACHE: dict[tuple, type] = {}


def _tc_from_dataclass_cls(dc_cls: type, autocast: bool, nocast: bool, frozen: bool | None) -> type:
    if is_tensorclass(dc_cls):
        return dc_cls
    if not dataclasses.is_dataclass(dc_cls):
        raise TypeError(f"from_dataclass expects a dataclass, got {dc_cls!r}")
    if frozen is None:
        frozen = bool(dc_cls.__dataclass_params__.frozen)
    key = (dc_cls, autocast, nocast, frozen)
    if key in _DC_CACHE:
        return _DC_CACHE[key]
    fields = dataclasses.fields(dc_cls)
    ns: dict[str, Any] = {}
    for klass in reversed(dc_cls.__mro__[:-1]):
        for k, v in vars(klass).items():
            if k not in _DC_SKIP:
                ns[k] = v
    annotations = {}
    for f in fields:
        ns.pop(f.name, None)
        hint = f.type
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            hint = _tc_from_dataclass_cls(hint, autocast, nocast, None)
        annotations[f.name] = hint
        if f.default is not dataclasses.MISSING:
            ns[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            ns[f.name] = dataclasses.field(default_factory=f.default_factory)
    ns["__annotations__"] = annotations
    ns["__module__"] = dc_cls.__module__
    ns["__qualname__"] = dc_cls.__qualname__
    plain = type(dc_cls.__name__, (), ns)
    out = _build(plain, autocast, nocast, frozen, True, None)
    _DC_CACHE[key] = out
    return out


def from_dataclass(obj: Any, *, batch_size: Any = None, auto_batch_size: bool = False,
                   batch_dims: int | None = None, device: Any = None, autocast: bool = False,
                   nocast: bool = False, frozen: bool | None = None, dest_cls: type | None = None,
                   inplace: bool = False, shadow: bool = False, tensor_only: bool = False) -> Any:
    """The tensorclass equivalent of a dataclass (for a class) or of a dataclass instance.

    For an instance, its field values are copied into a new tensorclass instance with
    ``batch_size`` (or, with ``auto_batch_size=True``, the longest leading shape shared by
    its tensors, at most ``batch_dims`` dims). Nested dataclass instances are converted too. The methods of the
    dataclass are kept (those generated by ``@dataclass`` are replaced).

    ``dest_cls``: for an instance, the tensorclass to build (the flags are then unused).
    ``shadow`` and ``tensor_only`` are accepted for tensordict's signature (field names
    are checked against the tensorclass's own attributes either way, and fields are
    stored as with no flag). ``inplace=True`` (turning the dataclass itself into a
    tensorclass) is refused with ``NotImplementedError``: a new class is always made.

    Example:
        >>> import dataclasses, torch
        >>> from steersman.tensordict import from_dataclass, is_tensorclass
        >>> @dataclasses.dataclass
        ... class Point:
        ...     xy: torch.Tensor
        ...     label: str = "p"
        >>> p = from_dataclass(Point(torch.zeros(5, 2)), auto_batch_size=True, batch_dims=1)
        >>> is_tensorclass(p), p.batch_size, p[0].label
        (True, torch.Size([5]), 'p')
    """
    if inplace:
        raise NotImplementedError("from_dataclass(inplace=True): steersman always builds a new tensorclass; "
                                  "use the returned class")
    if isinstance(obj, type):
        return _tc_from_dataclass_cls(obj, autocast, nocast, frozen)
    if is_tensorclass(obj):
        return obj
    if not dataclasses.is_dataclass(obj):
        raise TypeError(f"from_dataclass expects a dataclass or an instance of one, got {type(obj).__name__}")
    if dest_cls is not None and not is_tensorclass(dest_cls):
        raise TypeError(f"from_dataclass: dest_cls must be a tensorclass, got {dest_cls!r}")
    tc_cls = dest_cls or _tc_from_dataclass_cls(type(obj), autocast, nocast, frozen)
    values = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            v = from_dataclass(v, batch_size=batch_size, auto_batch_size=auto_batch_size,
                               batch_dims=batch_dims, device=device, autocast=autocast, nocast=nocast)
        values[f.name] = v
    if not auto_batch_size or batch_size is not None:
        return tc_cls(**values, batch_size=batch_size, device=device)
    out = tc_cls(**values, batch_size=[], device=device)
    shapes = [t.shape for t in out._tensor_leaves()]
    if shapes:
        common: list[int] = []
        for dims in zip(*shapes):
            if batch_dims is not None and len(common) >= batch_dims:
                break
            if all(d == dims[0] for d in dims):
                common.append(dims[0])
            else:
                break
        out.batch_size = common
    return out


# ----------------------------------------------------------------------------- subclassing form
_TC_FLAGS = ("autocast", "nocast", "frozen", "shadow", "tensor_only")


class _TensorClassMeta(type):
    """Builds every subclass of :class:`TensorClass` as ``@tensorclass`` would."""

    def __new__(mcs, name: str, bases: tuple, ns: dict, **flags: Any) -> type:
        unknown = sorted(set(flags) - set(_TC_FLAGS))
        if unknown:
            raise TypeError(f"class {name}: unknown TensorClass flag(s) {unknown}; known: {list(_TC_FLAGS)}")
        cls = super().__new__(mcs, name, bases, ns)
        if ns.get("_tc_fields_done") or ns.get("_tc_root"):
            return cls
        opts = {**getattr(cls, "_tc_flags", {}), **flags}
        return _build(cls, bool(opts.get("autocast")), bool(opts.get("nocast")), bool(opts.get("frozen")),
                      bool(opts.get("shadow")), _caller_locals())

    def __init__(cls, name: str, bases: tuple, ns: dict, **flags: Any) -> None:
        super().__init__(name, bases, ns)


class TensorClass(_TensorClass, metaclass=_TensorClassMeta):
    """The subclassing form of :func:`tensorclass`: ``class Foo(TensorClass): x: torch.Tensor``.

    Flags go in brackets or as class keywords: ``TensorClass["nocast", "frozen"]`` or
    ``class Foo(TensorClass, autocast=True)``; they are the options of
    :func:`tensorclass` (``autocast``, ``nocast``, ``frozen``, ``shadow``).
    ``tensor_only`` is accepted: its fields are stored as tensors as with no flag (the
    lookup speed-up it gives in tensordict does not apply here). Subclasses of a
    TensorClass inherit its fields and flags.

    Example:
        >>> import torch
        >>> class Obs(TensorClass):
        ...     pixels: torch.Tensor
        ...     step: torch.Tensor
        >>> o = Obs(pixels=torch.zeros(4, 3), step=torch.arange(4), batch_size=[4])
        >>> o[1:3].step
        tensor([1, 2])
        >>> class Count(TensorClass["nocast"]):
        ...     n: int
        >>> Count(n=1).n
        1
    """

    _tc_root = True
    _tc_flags: dict = {}

    def __class_getitem__(cls, item: Any) -> type:
        items = (item,) if isinstance(item, str) else tuple(item)
        unknown = sorted(i for i in items if i not in _TC_FLAGS)
        if unknown:
            raise ValueError(f"TensorClass[...]: unknown flag(s) {unknown}; known: {list(_TC_FLAGS)}")
        flags = {**cls._tc_flags, **dict.fromkeys(items, True)}
        return _TensorClassMeta(f"TensorClass[{', '.join(items)}]", (cls,), {"_tc_root": True, "_tc_flags": flags,
                                                                         "__module__": cls.__module__})
