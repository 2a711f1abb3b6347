"""``Composite``: a (nested) dict of specs sharing leading batch dims; its values are TensorDicts."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from steersman.tensordict import TensorDict, is_tensor_collection
from steersman.tensordict._utils import (
    NO_DEFAULT,
    NestedKey,
    indexed_batch_size,
    missing_key_error,
    normalize_index,
    unravel_key,
)

from .base import ShapeLike, TensorSpec, as_device, as_shape, shape_args

__all__ = ["Composite"]


def _default_is_leaf(cls: type) -> bool:
    return not issubclass(cls, Composite)


def _fmt_key(key: Any) -> str:
    if type(key) is tuple and len(key) == 1:
        key = key[0]
    return repr(key)


def _entry(val: Any, key: str) -> Any:
    """``val[key]`` for a TensorDict (the non-tensor wrapper, not its data) or a dict; None if missing."""
    if is_tensor_collection(val):
        return val.get(key, None)
    return val.get(key)


def _is_key(index: Any) -> bool:
    if type(index) is str:
        return True
    return type(index) is tuple and bool(index) and all(isinstance(k, (str, tuple)) for k in index)


class _CompositeKeys:
    """The keys of a :class:`Composite` (``spec.keys(...)``): iterable, sized, ``in`` takes nested keys."""

    def __init__(self, spec: Composite, include_nested: bool, leaves_only: bool,
                 is_leaf: Callable[[type], bool]) -> None:
        self._spec = spec
        self._nested = include_nested
        self._leaves = leaves_only
        self._is_leaf = is_leaf

    def __iter__(self) -> Iterator[NestedKey]:
        for key, _ in self._spec._items(self._nested, self._leaves, self._is_leaf):
            yield key

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, key: Any) -> bool:
        try:
            key = unravel_key(key)
        except (TypeError, KeyError):
            return False
        if type(key) is tuple and not self._nested:
            return False
        spec = self._spec.get(key, None)
        if spec is None:
            return False
        return not self._leaves or self._is_leaf(type(spec))

    def __eq__(self, other: object) -> bool:
        try:
            return list(self) == list(other)  # type: ignore[call-overload]
        except TypeError:
            return False

    def __repr__(self) -> str:
        return f"keys({list(self)})"


class Composite(TensorSpec):
    """A dict of specs (nested ``Composite`` s allowed) whose values are TensorDicts.

    Every entry's shape starts with the Composite's batch ``shape``. ``rand``/``zero``/
    ``one`` return a :class:`~steersman.tensordict.TensorDict` of ``batch_size =
    [*rand shape, *shape]``; ``is_in`` checks every entry of a TensorDict (extra
    entries are ignored) and ``assert_is_in`` names the first failing nested key.
    Keys are strings; nested keys are tuples of strings. Indexing with a key gives
    the spec at that key; any other index applies to the batch dims of every entry.

    Args:
        dict_of_specs: a dict (or Composite) of specs; nested dicts become Composites.
        shape: the batch shape (default ``[]``).
        device: if given, every entry is moved there; None allows mixed devices.
        **kwargs: more entries.

    Example:
        >>> import torch
        >>> from steersman.data import Bounded, Categorical, Composite, Unbounded
        >>> spec = Composite(
        ...     observation=Bounded(-1.0, 1.0, shape=(4, 3)),
        ...     next=Composite(reward=Unbounded(shape=(4, 1)), shape=(4,)),
        ...     shape=(4,),
        ... )
        >>> td = spec.rand()
        >>> td.batch_size, td["observation"].shape, td["next", "reward"].shape
        (torch.Size([4]), torch.Size([4, 3]), torch.Size([4, 1]))
        >>> spec.is_in(td)
        True
        >>> spec["next", "reward"].shape
        torch.Size([4, 1])
        >>> list(spec.keys(include_nested=True, leaves_only=True))
        ['observation', ('next', 'reward')]
        >>> spec[0].shape, spec[0]["observation"].shape    # index the batch dims
        (torch.Size([]), torch.Size([3]))
        >>> spec.zero((2,)).batch_size
        torch.Size([2, 4])
        >>> spec["action"] = Categorical(2, shape=(4,))
        >>> "action" in spec.keys()
        True
    """

    domain = "composite"

    def __init__(self, dict_of_specs: Mapping | None = None, shape: ShapeLike = None,
                 device: Any = None, **kwargs: Any) -> None:
        self._shape = as_shape(shape)
        self._device = None if device is None else as_device(device)
        self._dtype = None
        self._kind = None
        self._specs: dict[str, TensorSpec] = {}
        self._locked = False
        if dict_of_specs is not None:
            if isinstance(dict_of_specs, Composite):
                dict_of_specs = dict_of_specs._specs
            elif not isinstance(dict_of_specs, Mapping):
                raise TypeError(
                    f"Composite takes a dict of specs, got {type(dict_of_specs).__name__}"
                )
            for key, spec in dict_of_specs.items():
                self.set(key, spec)
        for key, spec in kwargs.items():
            self.set(key, spec)

    @classmethod
    def _new_unchecked(cls, specs: dict, shape: torch.Size, device: torch.device | None) -> Composite:
        out = cls.__new__(cls)
        out._shape = shape
        out._device = device
        out._dtype = None
        out._kind = None
        out._specs = specs
        out._locked = False
        return out

    # ------------------------------------------------------------------ properties
    @property
    def shape(self) -> torch.Size:
        """The batch shape shared by every entry (settable if every entry starts with it)."""
        return self._shape

    @shape.setter
    def shape(self, value: ShapeLike) -> None:
        value = as_shape(value)
        for key, spec in self._specs.items():
            if spec.shape[: len(value)] != value:
                raise ValueError(
                    f"cannot set the shape of Composite to {list(value)}: the spec at key "
                    f"{key!r} has shape {list(spec.shape)}"
                )
        self._shape = value

    @property
    def is_locked(self) -> bool:
        return self._locked

    def lock_(self, recurse: bool = True) -> Composite:
        """Forbids adding, replacing or deleting entries (in place)."""
        self._locked = True
        if recurse:
            for spec in self._specs.values():
                if isinstance(spec, Composite):
                    spec.lock_(recurse)
        return self

    def unlock_(self, recurse: bool = True) -> Composite:
        self._locked = False
        if recurse:
            for spec in self._specs.values():
                if isinstance(spec, Composite):
                    spec.unlock_(recurse)
        return self

    def _check_unlocked(self, key: Any, what: str) -> None:
        if self._locked:
            raise RuntimeError(f"cannot {what} key {key!r}: the Composite is locked (unlock_() it first)")

    # ------------------------------------------------------------------ keys and entries
    def _items(self, include_nested: bool, leaves_only: bool, is_leaf: Callable[[type], bool] | None,
               prefix: tuple = ()) -> Iterator[tuple[NestedKey, TensorSpec]]:
        is_leaf = is_leaf or _default_is_leaf
        for k, spec in self._specs.items():
            key = prefix + (k,) if prefix else k
            leaf = is_leaf(type(spec))
            if not leaves_only or leaf:
                yield key, spec
            if include_nested and not leaf and isinstance(spec, Composite):
                yield from spec._items(True, leaves_only, is_leaf, prefix + (k,))

    def keys(self, include_nested: bool = False, leaves_only: bool = False, *,
             is_leaf: Callable[[type], bool] | None = None) -> _CompositeKeys:
        """The keys; ``include_nested`` adds nested keys (tuples), ``leaves_only`` drops Composites."""
        return _CompositeKeys(self, include_nested, leaves_only, is_leaf or _default_is_leaf)

    def items(self, include_nested: bool = False, leaves_only: bool = False, *,
              is_leaf: Callable[[type], bool] | None = None) -> list[tuple[NestedKey, TensorSpec]]:
        """``(key, spec)`` pairs, with the options of :meth:`keys`."""
        return list(self._items(include_nested, leaves_only, is_leaf))

    def values(self, include_nested: bool = False, leaves_only: bool = False, *,
               is_leaf: Callable[[type], bool] | None = None) -> list[TensorSpec]:
        """The specs, with the options of :meth:`keys`."""
        return [spec for _, spec in self._items(include_nested, leaves_only, is_leaf)]

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def __contains__(self, key: Any) -> bool:
        return key in self.keys(include_nested=True)

    def get(self, key: NestedKey, default: Any = NO_DEFAULT) -> Any:
        """The spec at ``key`` (a string or a tuple of strings); KeyError unless ``default`` is given."""
        key = unravel_key(key)
        if type(key) is str:
            try:
                return self._specs[key]
            except KeyError:
                if default is NO_DEFAULT:
                    raise missing_key_error(key, self._specs) from None
                return default
        node: TensorSpec = self
        for i, k in enumerate(key):
            if not isinstance(node, Composite):
                if default is not NO_DEFAULT:
                    return default
                raise KeyError(f"key {key!r} not found: {key[:i]!r} is a {type(node).__name__}, not a Composite")
            try:
                node = node._specs[k]
            except KeyError:
                if default is NO_DEFAULT:
                    raise missing_key_error(key, node._specs, part=k) from None
                return default
        return node

    def _set_str(self, key: str, spec: Any) -> None:
        if type(key) is not str:
            raise TypeError(f"Composite keys must be strings (tuples for nested keys), got {key!r}")
        self._check_unlocked(key, "set")
        if isinstance(spec, Mapping) and not isinstance(spec, TensorSpec):
            spec = Composite(spec, shape=self._shape, device=self._device)
        elif not isinstance(spec, TensorSpec):
            raise TypeError(f"Composite entries must be specs, got {type(spec).__name__} for key {key!r}")
        nb = len(self._shape)
        if spec.shape[:nb] != self._shape:
            raise ValueError(
                f"Composite: the spec for key {key!r} has shape {list(spec.shape)}, which does not "
                f"start with the Composite's batch shape {list(self._shape)}"
            )
        if self._device is not None and spec.device != self._device:
            spec = spec.to(self._device)
        self._specs[key] = spec

    def set(self, key: NestedKey, spec: Any) -> Composite:
        """Sets the spec at ``key``; a tuple key creates the missing Composites on the way."""
        key = unravel_key(key)
        if type(key) is str:
            self._set_str(key, spec)
            return self
        node = self
        for i, k in enumerate(key[:-1]):
            sub = node._specs.get(k)
            if sub is None:
                node._check_unlocked(key[: i + 1], "add")
                sub = Composite(shape=node._shape, device=node._device)
                node._specs[k] = sub
            elif not isinstance(sub, Composite):
                raise KeyError(f"cannot set {key!r}: {key[: i + 1]!r} is a {type(sub).__name__}, not a Composite")
            node = sub
        node._set_str(key[-1], spec)
        return self

    def __getitem__(self, index: Any) -> Any:
        """``spec[key]`` -> the spec at ``key``; ``spec[idx]`` -> the Composite indexed on its batch dims."""
        if _is_key(index):
            return self.get(index)
        return self._index(index)

    def __setitem__(self, key: Any, spec: Any) -> None:
        if not _is_key(key):
            raise TypeError(f"Composite keys must be strings or tuples of strings, got {key!r}")
        self.set(key, spec)

    def del_(self, key: NestedKey) -> Composite:
        """Deletes the entry at ``key`` (in place)."""
        key = unravel_key(key)
        parent = self if type(key) is str else self.get(key[:-1])
        last = key if type(key) is str else key[-1]
        if not isinstance(parent, Composite):
            raise KeyError(f"key {key!r} not found: its parent is not a Composite")
        parent._check_unlocked(key, "delete")
        if last not in parent._specs:
            raise missing_key_error(key, parent._specs, part=last)
        del parent._specs[last]
        return self

    def __delitem__(self, key: NestedKey) -> None:
        self.del_(key)

    def pop(self, key: NestedKey, default: Any = NO_DEFAULT) -> Any:
        """Removes the entry at ``key`` and returns it (``default`` if missing and given)."""
        spec = self.get(key, None)
        if spec is None:
            if default is NO_DEFAULT:
                self.get(key)  # raises the KeyError
            return default
        self.del_(key)
        return spec

    def empty(self) -> Composite:
        """A Composite with the same shape and device and no entries."""
        return Composite(shape=self._shape, device=self._device)

    def is_empty(self, recurse: bool = False) -> bool:
        """True without entries (``recurse``: without leaf specs anywhere below)."""
        if not recurse:
            return not self._specs
        return not any(True for _ in self._items(True, True, None))

    def _structure_copy(self) -> Composite:
        """A copy of the tree of Composites; the leaf specs are shared."""
        specs = {k: v._structure_copy() if isinstance(v, Composite) else v for k, v in self._specs.items()}
        return Composite._new_unchecked(specs, self._shape, self._device)

    def select(self, *keys: NestedKey, strict: bool = True) -> Composite:
        """A Composite with only ``keys`` (nested keys keep their path)."""
        out = self.empty()
        for key in keys:
            key = unravel_key(key)
            spec = self.get(key, None)
            if spec is None:
                if strict:
                    self.get(key)  # raises the KeyError naming the key
                continue
            spec = spec._structure_copy() if isinstance(spec, Composite) else spec
            if type(key) is str:
                out._specs[key] = spec
                continue
            node, src = out, self
            for k in key[:-1]:
                src = src._specs[k]
                if k not in node._specs:
                    node._specs[k] = Composite._new_unchecked({}, src._shape, src._device)
                node = node._specs[k]
            node._specs[key[-1]] = spec
        return out

    def exclude(self, *keys: NestedKey) -> Composite:
        """A Composite without ``keys`` (missing keys are ignored)."""
        out = self._structure_copy()
        for key in keys:
            if out.get(key, None) is not None:
                out.del_(key)
        return out

    def update(self, dict_or_spec: Mapping | Composite) -> Composite:
        """Sets every entry of ``dict_or_spec`` (in place); nested Composites are updated, not replaced."""
        items = dict_or_spec._specs.items() if isinstance(dict_or_spec, Composite) else dict_or_spec.items()
        for key, spec in items:
            current = self.get(key, None)
            if isinstance(current, Composite) and isinstance(spec, (Composite, Mapping)):
                current.update(spec)
            else:
                self.set(key, spec)
        return self

    def flatten_keys(self, separator: str = ".") -> Composite:
        """A flat Composite whose keys join the nested keys with ``separator``."""
        out = self.empty()
        for key, spec in self._items(True, True, None):
            out._specs[key if type(key) is str else separator.join(key)] = spec
        return out

    def unflatten_keys(self, separator: str = ".") -> Composite:
        """The inverse of :meth:`flatten_keys`: ``"a.b"`` becomes the nested key ``("a", "b")``."""
        out = self.empty()
        for key, spec in self._specs.items():
            if isinstance(spec, Composite):
                spec = spec.unflatten_keys(separator)
            out.set(tuple(key.split(separator)), spec)
        return out

    # ------------------------------------------------------------------ values
    def rand(self, shape: ShapeLike = None) -> TensorDict:
        full = self._full_shape(shape)
        return TensorDict.from_trusted({k: s.rand(shape) for k, s in self._specs.items()}, full, self._device)

    def zero(self, shape: ShapeLike = None) -> TensorDict:
        full = self._full_shape(shape)
        return TensorDict.from_trusted({k: s.zero(shape) for k, s in self._specs.items()}, full, self._device)

    def one(self, shape: ShapeLike = None) -> TensorDict:
        full = self._full_shape(shape)
        return TensorDict.from_trusted({k: s.one(shape) for k, s in self._specs.items()}, full, self._device)

    def is_in(self, val: Any) -> bool:
        if not (is_tensor_collection(val) or isinstance(val, Mapping)):
            return False
        for key, spec in self._specs.items():
            v = _entry(val, key)
            if v is None or not spec.is_in(v):
                return False
        return True

    def _check(self, val: Any, prefix: tuple = ()) -> str | None:
        if not (is_tensor_collection(val) or isinstance(val, Mapping)):
            where = f"key {_fmt_key(prefix)}: " if prefix else ""
            return f"{where}expected a TensorDict (or a dict), got {type(val).__name__}"
        for k, spec in self._specs.items():
            key = prefix + (k,)
            v = _entry(val, k)
            if v is None:
                return f"key {_fmt_key(key)} is missing"
            if isinstance(spec, Composite):
                reason = spec._check(v, key)
            else:
                reason = spec._check(v)
                if reason is not None:
                    reason = f"key {_fmt_key(key)}: value is not in {spec!r}: {reason}"
            if reason is not None:
                return reason
        return None

    def type_check(self, value: Any, selected_keys: Any = None) -> None:
        """Raises ``TypeError`` if an entry of ``value`` does not have its spec's dtype."""
        for key in self._specs if selected_keys is None else selected_keys:
            spec = self.get(key)
            entry = value.get(key)
            if isinstance(spec, Composite):
                spec.type_check(entry)
            elif spec.dtype is not None:
                spec.type_check(entry, key)

    def assert_is_in(self, val: Any) -> None:
        reason = self._check(val)
        if reason is not None:
            raise ValueError(f"value is not in the Composite spec: {reason}")

    def project(self, val: Any) -> Any:
        """Projects every entry of the TensorDict ``val`` that is not in its spec (in place); returns ``val``."""
        for key, spec in self._specs.items():
            v = val.get(key) if is_tensor_collection(val) else val[key]
            if isinstance(spec, Composite):
                spec.project(v)
            elif not spec.is_in(v):
                if is_tensor_collection(val):
                    val.set(key, spec.project(v))
                else:
                    val[key] = spec.project(v)
        return val

    def encode(self, vals: Any, *, ignore_device: bool = False) -> TensorDict:
        """A TensorDict of batch size ``shape`` from a dict of numpy arrays / lists / numbers."""
        if is_tensor_collection(vals):
            return vals
        out = {}
        for key, v in vals.items():
            spec = self._specs.get(key)
            if spec is None:
                raise missing_key_error(key, self._specs)
            out[key] = spec.encode(v, ignore_device=ignore_device)
        return TensorDict(out, batch_size=self._shape, device=None if ignore_device else self._device)

    def to_numpy(self, val: Any, safe: bool = False) -> dict:
        """A dict of numpy arrays (nested dicts for nested Composites)."""
        if safe:
            self.assert_is_in(val)
        return {k: spec.to_numpy(_entry(val, k)) for k, spec in self._specs.items()}

    # ------------------------------------------------------------------ shape ops
    def _index(self, index: Any) -> Composite:
        nb = len(self._shape)
        try:
            index = normalize_index(index, nb)
        except IndexError as err:
            raise IndexError(f"cannot index Composite of shape {list(self._shape)}: {err}") from None
        shape = indexed_batch_size(self._shape, index)
        specs = {k: s[index] for k, s in self._specs.items()}
        return Composite._new_unchecked(specs, shape, self._device)

    def expand(self, *shape: Any) -> Composite:
        new = self._resolve_expand(shape_args(shape), self._shape)
        nb = len(self._shape)
        specs = {k: s.expand(*new, *s.shape[nb:]) for k, s in self._specs.items()}
        return Composite._new_unchecked(specs, new, self._device)

    def _batch_dim(self, dim: int, extra: int = 0, op: str = "index") -> int:
        n = len(self._shape) + extra
        if not -n <= dim < n:
            raise IndexError(f"dim {dim} is out of range for {op} of a Composite of shape {list(self._shape)}")
        return dim % n

    def squeeze(self, dim: int | None = None) -> Composite:
        if dim is None:
            dims = [i for i, s in enumerate(self._shape) if s == 1]
        else:
            d = self._batch_dim(dim, op="squeeze")
            dims = [d] if self._shape[d] == 1 else []
        if not dims:
            return self
        specs = {}
        for k, s in self._specs.items():
            for d in reversed(dims):
                s = s.squeeze(d)
            specs[k] = s
        shape = torch.Size([s for i, s in enumerate(self._shape) if i not in dims])
        return Composite._new_unchecked(specs, shape, self._device)

    def unsqueeze(self, dim: int) -> Composite:
        d = self._batch_dim(dim, extra=1, op="unsqueeze")
        specs = {k: s.unsqueeze(d) for k, s in self._specs.items()}
        return Composite._new_unchecked(specs, self._shape[:d] + (1,) + self._shape[d:], self._device)

    def reshape(self, *shape: Any) -> Composite:
        nb = len(self._shape)
        new = torch.empty(self._shape, device="meta").reshape(shape_args(shape)).shape
        specs = {k: s.reshape(*new, *s.shape[nb:]) for k, s in self._specs.items()}
        return Composite._new_unchecked(specs, new, self._device)

    view = reshape

    def unbind(self, dim: int = 0) -> tuple[Composite, ...]:
        d = self._batch_dim(dim, op="unbind")
        return tuple(self._index((slice(None),) * d + (i,)) for i in range(self._shape[d]))

    # ------------------------------------------------------------------ device / dtype / copies
    def to(self, dest: Any) -> Composite:
        if isinstance(dest, torch.dtype):
            specs = {k: s.to(dest) if s.dtype is not None or isinstance(s, Composite) else s
                     for k, s in self._specs.items()}
            return Composite._new_unchecked(specs, self._shape, self._device)
        dev = as_device(dest)
        specs = {k: s.to(dev) for k, s in self._specs.items()}
        return Composite._new_unchecked(specs, self._shape, dev)

    def clone(self) -> Composite:
        specs = {k: s.clone() for k, s in self._specs.items()}
        return Composite._new_unchecked(specs, self._shape, self._device)

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is type(self)
            and self._shape == other._shape
            and self._device == other._device
            and self._specs.keys() == other._specs.keys()
            and all(s == other._specs[k] for k, s in self._specs.items())
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        lines = [f"{k}: {s!r}" for k, s in self._specs.items()]
        lines += [f"device={self._device}", f"shape={list(self._shape)}"]
        return "Composite(\n" + textwrap.indent(",\n".join(lines), "    ") + ")"
