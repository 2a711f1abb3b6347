"""``TensorDictBase``: the behaviour every container shares.

A container subclass provides a handful of primitives (listed below); everything
else — nested keys, select/exclude, shape ops, arithmetic, reductions, device and
dtype moves — is written once here on top of them.

Primitives a subclass implements::

    batch_size, device, names             properties
    _get_str(key, default)                entry at one level (tensor or sub-collection)
    _set_str(key, value, inplace, validated)
    _del_str(key)
    _keys_str()                           keys of one level
    _index(index)                         index over batch dims (index already normalized)
    _apply_batch(fn, batch_size, names)   leafwise op that changes batch dims
    _split_batch(fn, batch_sizes)         leafwise op returning one leaf per output
    _map(fn, others, ...)                 leafwise op keeping the structure
    _new_empty(batch_size)                an empty container of the same kind
    lock_/unlock_/is_locked
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from ._utils import (
    NO_DEFAULT,
    NestedKey,
    as_size,
    expand_right,
    indexed_batch_size,
    missing_key_error,
    normalize_index,
    unravel_key,
)
from .switches import PRINT_OPTIONS as _PRINT_OPTIONS
from .switches import STATE as _SWITCHES

__all__ = ["TensorDictBase", "is_tensor_collection", "HANDLED_FUNCTIONS"]

#: torch functions (``torch.stack`` ...) overridden for containers; filled by ``functional``.
HANDLED_FUNCTIONS: dict[Callable, Callable] = {}


def is_tensor_collection(datatype: Any) -> bool:
    """True for TensorDicts, lazy stacks, tensorclass instances and non-tensor entries."""
    return getattr(type(datatype), "_is_tensor_collection", False)


def _dims_tuple(dims: Any, ndim: int, name: str = "dim") -> tuple[int, ...]:
    if dims is None:
        return tuple(range(ndim))
    if isinstance(dims, int):
        if 0 <= dims < ndim:  # the common case
            return (dims,)
        dims = (dims,)
    out = []
    for d in dims:
        if not -ndim <= d < max(ndim, 1):
            raise IndexError(f"{name}={d} is out of range for a batch with {ndim} dims")
        out.append(d % ndim if ndim else 0)
    return tuple(out)


class TensorDictBase:
    """Shared behaviour of all tensor collections. See :class:`~steersman.tensordict.TensorDict`."""

    _is_tensor_collection = True
    __slots__ = ()

    # ------------------------------------------------------------------ torch dispatch
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        impl = HANDLED_FUNCTIONS.get(func)
        if impl is None:
            return NotImplemented
        return impl(*args, **kwargs) if kwargs else impl(*args)

    # ------------------------------------------------------------------ shape properties
    @property
    def shape(self) -> torch.Size:
        return self.batch_size

    def size(self, dim: int | None = None) -> torch.Size | int:
        return self.batch_size if dim is None else self.batch_size[dim]

    @property
    def batch_dims(self) -> int:
        return len(self.batch_size)

    @property
    def ndim(self) -> int:
        return len(self.batch_size)

    def ndimension(self) -> int:
        return len(self.batch_size)

    def dim(self) -> int:
        return len(self.batch_size)

    def numel(self) -> int:
        return math.prod(self.batch_size)

    def __len__(self) -> int:
        bs = self.batch_size
        return bs[0] if len(bs) else 0

    def __iter__(self) -> Iterator[TensorDictBase]:
        """Iterates over the first batch dim (like a tensor); a 0-d batch can't be iterated."""
        if not self.batch_dims:
            raise TypeError("iteration over a TensorDict with an empty batch size (like a 0-d tensor)")
        return (self[i] for i in range(self.batch_size[0]))

    def __bool__(self) -> bool:
        raise RuntimeError(
            "the truth value of a TensorDict is ambiguous: use td.is_empty(), td.all() or td.any()"
        )

    __hash__ = object.__hash__

    # ------------------------------------------------------------------ keys
    def keys(
        self,
        include_nested: bool = False,
        leaves_only: bool = False,
        *,
        is_leaf: Callable[[type], bool] | None = None,
        sort: bool = False,
    ) -> list[NestedKey]:
        """The keys, optionally with nested keys (as tuples) and only the leaves."""
        if not include_nested and not leaves_only:
            out = list(self._keys_str())
        else:
            out = []
            self._collect_keys(out, (), include_nested, leaves_only, is_leaf)
        if sort:
            out.sort(key=lambda k: k if isinstance(k, str) else ".".join(k))
        return out

    def _collect_keys(self, out, prefix, include_nested, leaves_only, is_leaf):
        for key in self._keys_str():
            value = self._get_str(key, NO_DEFAULT)
            full = prefix + (key,) if prefix else key
            sub = _is_branch(value) if is_leaf is None else not is_leaf(type(value))
            if not sub or not leaves_only:
                out.append(full)
            if sub and include_nested:
                value._collect_keys(
                    out, full if type(full) is tuple else (full,), include_nested, leaves_only, is_leaf
                )

    def values(self, include_nested: bool = False, leaves_only: bool = False, **kw) -> list:
        return [self.get(k) for k in self.keys(include_nested, leaves_only, **kw)]

    def items(self, include_nested: bool = False, leaves_only: bool = False, **kw) -> list:
        return [(k, self.get(k)) for k in self.keys(include_nested, leaves_only, **kw)]

    def non_tensor_items(self, include_nested: bool = False) -> list:
        return [(k, v) for k, v in self.items(include_nested, True) if _is_non_tensor(v)]

    def __contains__(self, key: Any) -> bool:
        if type(key) is str:
            return self._get_str(key, None) is not None
        if isinstance(key, tuple):
            try:
                return self._get_nested(unravel_key(key), None) is not None
            except (TypeError, KeyError):  # a non-string part, or a path through a leaf
                return False
        raise TypeError(
            "`key in td` takes a string or a tuple of strings; to check for a value use "
            "(td == value).any()"
        )

    def is_empty(self) -> bool:
        """True if the container holds no leaf (empty nested containers don't count)."""
        for key in self._keys_str():
            v = self._get_str(key, NO_DEFAULT)
            if not _is_branch(v) or not v.is_empty():
                return False
        return True

    # ------------------------------------------------------------------ get / set
    def _get_nested(self, key: NestedKey, default: Any) -> Any:
        if type(key) is str:
            return self._get_str(key, default)
        node = self
        for i, k in enumerate(key):
            nxt = node._get_str(k, None)
            if nxt is None:
                if default is NO_DEFAULT:  # name the full key, suggest keys of that level
                    raise missing_key_error(key, node._keys_str(), part=k)
                return default
            node = nxt
            if i < len(key) - 1 and not _is_branch(node):
                raise KeyError(f"cannot get {key!r}: {k!r} is a leaf, not a nested container")
        return node

    def get(self, key: NestedKey, default: Any = NO_DEFAULT) -> Any:
        """The entry at ``key`` (a string or a tuple of strings).

        A missing key raises KeyError naming the nearest keys, unless ``default`` is given.
        Non-tensor entries are returned as their ``NonTensorData`` wrapper
        (``td[key]`` returns the raw value).
        """
        if type(key) is not str:
            key = unravel_key(key)
        try:
            return self._get_nested(key, default)
        except KeyError:
            if default is NO_DEFAULT and _SWITCHES["get_defaults_to_none"]:
                return None
            raise

    def __getitem__(self, index: Any) -> Any:
        if type(index) is str:
            return _unwrap(self._get_str(index, NO_DEFAULT))
        if type(index) is tuple and index and isinstance(index[0], (str, tuple)):
            return _unwrap(self._get_nested(unravel_key(index), NO_DEFAULT))
        if index is Ellipsis or (type(index) is tuple and not index):
            return self
        if not self.batch_dims and index is not None:
            raise IndexError(f"cannot index a TensorDict with an empty batch size (index {index!r})")
        if isinstance(index, TensorDictBase):
            raise TypeError("indexing with a TensorDict is not supported; use a bool tensor mask")
        return self._index(normalize_index(index, self.batch_dims))

    def get_non_tensor(self, key: NestedKey, default: Any = NO_DEFAULT) -> Any:
        """The raw value of a non-tensor entry (a list for a stack of non-tensor data)."""
        v = self.get(key, default)
        return _unwrap(v)

    def get_at(self, key: NestedKey, index: Any, default: Any = NO_DEFAULT) -> Any:
        v = self.get(key, default)
        if v is default and default is not NO_DEFAULT:
            return default
        return v[index]

    def _prepare_value(self, key: str, value: Any) -> Any:
        """Converts a value to a valid entry for this container (no shape check)."""
        if isinstance(value, Tensor) or is_tensor_collection(value):
            return value
        if isinstance(value, Mapping):
            from .td import TensorDict

            return TensorDict(value, self.batch_size, self.device)
        from .nontensor import to_entry

        return to_entry(value, self.batch_size, self.device, key)

    def set(self, key: NestedKey, item: Any, inplace: bool = False, **kwargs) -> TensorDictBase:
        """Writes ``item`` at ``key``; the leading dims of ``item`` must equal ``batch_size``.

        ``inplace=True`` copies into the existing tensor when the key is present.
        A tuple key creates the missing nested TensorDicts.
        """
        if type(key) is not str:
            key = unravel_key(key)
            if type(key) is tuple:
                node = self._get_or_create_parent(key)
                node._set_str(key[-1], node._prepare_value(key[-1], item), inplace, False)
                return self
        self._set_str(key, self._prepare_value(key, item), inplace, False)
        return self

    def _get_or_create_parent(self, key: tuple[str, ...]) -> TensorDictBase:
        node = self
        for i, k in enumerate(key[:-1]):
            sub = node._get_str(k, None)
            if sub is None:
                if node.is_locked:
                    raise RuntimeError(
                        f"cannot add key {key[: i + 1]!r}: the TensorDict is locked (unlock_() it first)"
                    )
                sub = node._new_empty(node.batch_size)
                node._set_str(k, sub, False, True)
            elif not _is_branch(sub):
                raise KeyError(f"cannot set {key!r}: {key[: i + 1]!r} is a leaf")
            node = sub
        return node

    def __setitem__(self, index: Any, value: Any) -> None:
        if type(index) is str or (type(index) is tuple and index and isinstance(index[0], (str, tuple))):
            self.set(index, value)
            return
        index = normalize_index(index, self.batch_dims) if index is not Ellipsis else ()
        if isinstance(value, Mapping) and not is_tensor_collection(value):
            value = _dict_view(value)
            # a dict's leaves are shaped like the indexed batch (its batch dims lead)
            nbs = self.batch_size if _whole(index) else indexed_batch_size(self.batch_size, index)
            value = _with_batch(value, nbs)
        self._setitem_batch(index, value)

    def _setitem_batch(self, index: Any, value: Any) -> None:
        """``td[index] = value``: every leaf is validated first, then written in place.

        Keys of ``value`` that ``self`` lacks are preallocated first (zeros over the whole
        batch, see :func:`_preallocate`); a failed write removes them again.
        """
        added = _preallocate(self, value) if is_tensor_collection(value) else None
        try:
            pairs: list = []
            new_bs = self.batch_size if _whole(index) else indexed_batch_size(self.batch_size, index)
            _collect_write_pairs(self, value, pairs, (), new_bs, self.batch_dims)
            _write_pairs(pairs, index)
        except BaseException:
            _undo_preallocate(added)
            raise

    def set_(self, key: NestedKey, item: Any, *, non_blocking: bool = False) -> TensorDictBase:
        """Copies ``item`` into the existing entry at ``key`` (same shape; key must exist).

        ``non_blocking`` is passed to the copy (asynchronous between devices)."""
        dst = self.get(key)
        if isinstance(dst, Tensor):
            src = item if isinstance(item, Tensor) else torch.as_tensor(item)
            _check_broadcast(src.shape, dst.shape, key)
            dst.copy_(src, non_blocking=non_blocking)
        else:
            dst.update_(item, non_blocking=non_blocking)
        return self

    def set_at_(self, key: NestedKey, value: Any, index: Any, *, non_blocking: bool = False) -> TensorDictBase:
        """Writes ``value`` into the entry at ``key`` at ``index`` (``non_blocking``: see :meth:`set_`)."""
        dst = self.get(key)
        if non_blocking and isinstance(dst, Tensor) and isinstance(value, Tensor):
            value = value.to(dst.device, non_blocking=True)
        dst[index] = value
        return self

    def setdefault(self, key: NestedKey, default: Any, inplace: bool = False) -> Any:
        """The entry at ``key``; sets ``default`` there first if missing (``inplace``: passed to ``set``)."""
        if key not in self:
            self.set(key, default, inplace=inplace)
        return self.get(key)

    def set_non_tensor(self, key: NestedKey, value: Any) -> TensorDictBase:
        from .nontensor import NonTensorData

        return self.set(
            key, NonTensorData(value, batch_size=self.batch_size, device=self.device)
        )

    def __delitem__(self, key: NestedKey) -> None:
        self.del_(key)

    def del_(self, key: NestedKey) -> TensorDictBase:
        key = unravel_key(key)
        if type(key) is str:
            self._del_str(key)
        else:
            parent = self._get_nested(key[:-1] if len(key) > 2 else key[0], NO_DEFAULT)
            parent._del_str(key[-1])
        return self

    def pop(self, key: NestedKey, default: Any = NO_DEFAULT) -> Any:
        key = unravel_key(key)
        if key not in self:
            if default is NO_DEFAULT:
                self._get_nested(key, NO_DEFAULT)  # raises a KeyError naming the key
            return default
        value = self.get(key)
        self.del_(key)
        return value

    def rename_key_(self, old_key: NestedKey, new_key: NestedKey, safe: bool = False) -> TensorDictBase:
        old_key, new_key = unravel_key(old_key), unravel_key(new_key)
        if safe and new_key in self:
            raise KeyError(f"key {new_key!r} already exists; pass safe=False to overwrite it")
        value = self.get(old_key)
        if self.is_locked:
            raise RuntimeError("cannot rename keys of a locked TensorDict; unlock_() it first")
        self.set(new_key, value)
        self.del_(old_key)
        return self

    def update(
        self,
        input_dict_or_td: Mapping | TensorDictBase,
        clone: bool = False,
        inplace: bool = False,
        *,
        keys_to_update: Sequence[NestedKey] | None = None,
    ) -> TensorDictBase:
        """Sets every entry of ``input_dict_or_td``; nested containers are merged.

        Every entry, nested ones included, is validated before the first write, so a
        failure changes nothing.
        """
        selected = None if keys_to_update is None else [unravel_key(k) for k in keys_to_update]
        staged: list = []
        self._stage_update(input_dict_or_td, clone, inplace, selected, (), staged)
        for node, key, value in staged:
            node.set(key, value, inplace=inplace)
        return self

    def _stage_update(self, src: Any, clone: bool, inplace: bool, selected: list | None,
                      prefix: tuple, staged: list) -> None:
        """Validates ``self.update(src)`` recursively; lists the (node, key, value) writes."""
        items = src.items() if not isinstance(src, TensorDictBase) else (
            (k, src._get_str(k, NO_DEFAULT)) for k in src._keys_str()
        )
        for key, value in items:
            if selected is not None and key not in selected and not any(
                type(s) is tuple and s[0] == key for s in selected
            ):
                continue
            current = self._get_str(key, None) if type(key) is str else self.get(key, None)
            if current is not None and _is_branch(current) and (
                isinstance(value, (Mapping, TensorDictBase)) and not _is_non_tensor(value)
            ):
                sub_keys = None
                if selected is not None and key not in selected:
                    sub_keys = [unravel_key(s[1:]) for s in selected if type(s) is tuple and s[0] == key]
                current._stage_update(value, clone, inplace, sub_keys, prefix + (key,), staged)
                continue
            if clone and isinstance(value, (Tensor, TensorDictBase)):
                value = value.clone()
            if type(key) is str:
                value = self._prepare_value(key, value)
                self._check_value(key, value, inplace, prefix + (key,) if prefix else key)
            staged.append((self, key, value))

    def _check_value(self, key: str, value: Any, inplace: bool = False, name: Any = None) -> None:
        """Raises if ``value`` can't be stored at ``key`` (shape, lock, in-place shape)."""
        name = key if name is None else name
        bs = self.batch_size
        shape = value.shape if isinstance(value, Tensor) else value.batch_size
        if shape[: len(bs)] != bs:
            raise ValueError(
                f"batch size mismatch for key {name!r}: expected leading dims {list(bs)}, "
                f"got shape {list(shape)}"
            )
        current = self._get_str(key, None)
        if self.is_locked and current is None:
            raise RuntimeError(f"cannot add key {name!r}: the TensorDict is locked (unlock_() it first)")
        if (inplace or self.is_locked) and isinstance(current, Tensor) and isinstance(value, Tensor) and (
            current.shape != value.shape
        ):
            raise ValueError(
                f"in-place set of {name!r}: shape {list(value.shape)} does not match the "
                f"existing {list(current.shape)}"
            )

    def update_(self, input_dict_or_td: Mapping | TensorDictBase, clone: bool = False, *,
                non_blocking: bool = False, keys_to_update: Sequence[NestedKey] | None = None) -> TensorDictBase:
        """Copies every entry of the input into the existing entries (all keys must exist).

        Everything is validated before the first write, so a failure changes nothing.
        ``keys_to_update``: copy only these keys of the input. ``non_blocking``: the copies
        between devices may run asynchronously (on one device it changes nothing).
        """
        src = _update_source(input_dict_or_td, keys_to_update, clone)
        pairs: list = []
        _collect_write_pairs(self, src, pairs, (), self.batch_size, self.batch_dims)
        _write_pairs(pairs, ())
        return self

    def update_at_(self, input_dict_or_td: Mapping | TensorDictBase, idx: Any, clone: bool = False, *,
                   non_blocking: bool = False, keys_to_update: Sequence[NestedKey] | None = None) -> TensorDictBase:
        """``self[idx] = input`` for the input's entries (``keys_to_update``: only these;
        ``clone``: the input's tensors are cloned first; ``non_blocking``: see :meth:`update_`)."""
        if keys_to_update is not None or clone:
            input_dict_or_td = _update_source(input_dict_or_td, keys_to_update, clone)
        self[idx] = input_dict_or_td
        return self

    def select(self, *keys: NestedKey, inplace: bool = False, strict: bool = True,
               as_tensordict: bool = False) -> TensorDictBase:
        """A new container with only ``keys`` (leaves are shared, not copied).

        ``as_tensordict`` only matters for a tensorclass (which then returns a TensorDict)."""
        out = self._new_empty(self.batch_size)
        for key in keys:
            key = unravel_key(key)
            value = self.get(key, NO_DEFAULT if strict else None)
            if value is None:
                continue
            if type(key) is str:
                out._set_str(key, value, False, True)
            else:
                node = out
                src = self
                for k in key[:-1]:
                    src = src._get_str(k, NO_DEFAULT)
                    sub = node._get_str(k, None)
                    if sub is None:
                        sub = src._new_empty(src.batch_size)
                        node._set_str(k, sub, False, True)
                    node = sub
                node._set_str(key[-1], value, False, True)
        if inplace:
            for key in list(self._keys_str()):
                if key not in out._keys_str():
                    self._del_str(key)
                else:
                    self._set_str(key, out._get_str(key, NO_DEFAULT), False, True)
            return self
        return out

    def exclude(self, *keys: NestedKey, inplace: bool = False) -> TensorDictBase:
        """A new container without ``keys`` (missing keys are ignored)."""
        out = self if inplace else self.copy()
        for key in keys:
            key = unravel_key(key)
            if type(key) is str:
                if out._get_str(key, None) is not None:
                    out._del_str(key)
                continue
            parent = out._get_nested(key[:-1] if len(key) > 2 else key[0], None)
            if parent is None or parent._get_str(key[-1], None) is None:
                continue
            if not inplace:  # copy the path so the source is untouched
                node = out
                for k in key[:-1]:
                    sub = node._get_str(k, NO_DEFAULT).copy()
                    node._set_str(k, sub, False, True)
                    node = sub
                parent = node
            parent._del_str(key[-1])
        return out

    def split_keys(self, *key_sets: Sequence[NestedKey], inplace: bool = False, default: Any = NO_DEFAULT):
        """Splits into one container per key set, plus one with the remaining keys."""
        outs = []
        used = []
        for ks in key_sets:
            ks = [unravel_key(k) for k in ks]
            outs.append(self.select(*ks, strict=default is NO_DEFAULT))
            used.extend(ks)
        rest = self.exclude(*used)
        if inplace:
            self.exclude(*used, inplace=True)
        return (*outs, rest)

    def to_tensordict(self, *, retain_none: bool | None = None) -> TensorDictBase:
        """A plain in-memory ``TensorDict`` with the same values (leaves are not copied)."""
        from .td import TensorDict

        out = {}
        for key in self._keys_str():
            v = self._get_str(key, NO_DEFAULT)
            if isinstance(v, Tensor):
                out[key] = v
            elif _is_non_tensor(v):
                out[key] = v.copy()
            else:
                out[key] = v.to_tensordict()
        return TensorDict.from_trusted(out, self.batch_size, self.device, self.names_or_none())

    def copy(self) -> TensorDictBase:
        """A shallow copy: new containers, same leaf tensors."""
        return self._map(lambda x: x, (), nested_copy=True)

    def flatten_keys(self, separator: str = ".", inplace: bool = False) -> TensorDictBase:
        """Nested keys become flat keys joined by ``separator``."""
        out = self._new_empty(self.batch_size)
        for key in self.keys(include_nested=True, leaves_only=True):
            flat = key if type(key) is str else separator.join(key)
            if out._get_str(flat, None) is not None:
                raise KeyError(f"flattening would create the key {flat!r} twice")
            out._set_str(flat, self.get(key), False, True)
        if inplace:
            for k in list(self._keys_str()):
                self._del_str(k)
            for k in out._keys_str():
                self._set_str(k, out._get_str(k, NO_DEFAULT), False, True)
            return self
        return out

    def unflatten_keys(self, separator: str = ".", inplace: bool = False) -> TensorDictBase:
        """Flat keys ``"a.b"`` become nested keys ``("a", "b")``."""
        out = self._new_empty(self.batch_size)
        for key in self._keys_str():
            value = self._get_str(key, NO_DEFAULT)
            if _is_branch(value):
                value = value.unflatten_keys(separator)
            parts = tuple(key.split(separator))
            if len(parts) == 1:
                out._set_str(key, value, False, True)
            else:
                out._get_or_create_parent(parts)._set_str(parts[-1], value, False, True)
        if inplace:
            for k in list(self._keys_str()):
                self._del_str(k)
            for k in out._keys_str():
                self._set_str(k, out._get_str(k, NO_DEFAULT), False, True)
            return self
        return out

    def to_dict(self, *, retain_none: bool = True, convert_tensors: bool | str = False,
                tolist_first: bool = False) -> dict[str, Any]:
        """A nested ``dict``; non-tensor entries become their Python values.

        Args:
            retain_none: keep entries whose value is ``None`` (a tensorclass's unset fields)
                as ``None``; ``False`` drops them.
            convert_tensors: ``True``: tensors become lists; ``"numpy"``: arrays.
            tolist_first: a nested container with batch dims becomes a list of dicts (one
                per element, :meth:`tolist`) instead of a dict of batched values.

        Example:
            >>> import torch
            >>> from steersman.tensordict import TensorDict
            >>> td = TensorDict({"a": torch.zeros(2), "n": {"b": torch.arange(2)}}, batch_size=[2])
            >>> td.to_dict(tolist_first=True)["n"]
            [{'b': 0}, {'b': 1}]
        """
        out = {}
        for key in self._keys_str():
            v = self._get_str(key, NO_DEFAULT)
            if _is_non_tensor(v):
                u = _unwrap(v)
                if u is None and not retain_none:
                    continue
                out[key] = u
            elif v is None:
                if retain_none:
                    out[key] = None
            elif _is_branch(v):
                if tolist_first and v.batch_dims:
                    out[key] = v.tolist()
                else:
                    out[key] = v.to_dict(retain_none=retain_none, convert_tensors=convert_tensors,
                                         tolist_first=tolist_first)
            elif convert_tensors == "numpy":
                out[key] = v.detach().cpu().numpy()
            elif convert_tensors:
                out[key] = v.tolist()
            else:
                out[key] = v
        return out

    def consolidate(self, filename: Any = None, **kwargs: Any) -> TensorDictBase:
        """Every leaf in one contiguous storage (a file with ``filename``); see
        :func:`steersman.tensordict.consolidate.consolidate` for the keywords."""
        from .consolidate import consolidate

        return consolidate(self, filename, **kwargs)

    def is_consolidated(self) -> bool:
        """Whether every tensor leaf is a view of one storage (as :meth:`consolidate` makes)."""
        from .consolidate import is_consolidated

        return is_consolidated(self)

    def numpy(self) -> dict[str, Any]:
        return self.to_dict(convert_tensors="numpy")

    def tolist(self) -> list:
        if not self.batch_dims:
            return self.to_dict(convert_tensors=True)  # type: ignore[return-value]
        return [td.tolist() for td in self.unbind(0)]

    def empty(self, recurse: bool = False, *, batch_size: Any = None, device: Any = NO_DEFAULT,
              names: Any = None) -> TensorDictBase:
        """A container with the same batch size and no entries (``recurse``: keep nesting).

        ``names``: names of the batch dims of the result (default: none)."""
        bs = self.batch_size if batch_size is None else as_size(batch_size)
        out = self._new_empty(bs)
        if recurse:
            for key in self._keys_str():
                v = self._get_str(key, NO_DEFAULT)
                if _is_branch(v) and not _is_non_tensor(v):
                    out._set_str(key, v.empty(recurse=True), False, True)
        if names is not None:
            out.names = names
        return out

    # ------------------------------------------------------------------ leafwise ops
    def apply(
        self,
        fn: Callable,
        *others: TensorDictBase,
        batch_size: Sequence[int] | None = None,
        device: Any = NO_DEFAULT,
        names: Any = NO_DEFAULT,
        inplace: bool = False,
        default: Any = NO_DEFAULT,
        filter_empty: bool | None = None,
        call_on_nested: bool = False,
        **constructor_kwargs: Any,
    ) -> TensorDictBase | None:
        """Applies ``fn(leaf, *other_leaves)`` to every leaf; returns a new container.

        A ``None`` result drops the entry. ``batch_size=`` sets the result's batch size
        when ``fn`` changes it. ``inplace=True`` writes the results into ``self``.
        """
        if inplace:
            self._map_(fn, others, default=default)
            return self
        return self._map(
            fn,
            others,
            batch_size=None if batch_size is None else as_size(batch_size),
            device=device,
            default=default,
            call_on_nested=call_on_nested,
            filter_empty=filter_empty,
        )

    def apply_(self, fn: Callable, *others: TensorDictBase, **kwargs: Any) -> TensorDictBase:
        self._map_(fn, others, default=kwargs.get("default", NO_DEFAULT))
        return self

    def named_apply(
        self,
        fn: Callable,
        *others: TensorDictBase,
        nested_keys: bool = False,
        batch_size: Sequence[int] | None = None,
        default: Any = NO_DEFAULT,
        filter_empty: bool | None = None,
        **kwargs: Any,
    ) -> TensorDictBase | None:
        """Like :meth:`apply` but calls ``fn(key, leaf, *other_leaves)``.

        ``nested_keys=True`` passes the full tuple key instead of the last string.
        """
        return self._map(
            fn,
            others,
            batch_size=None if batch_size is None else as_size(batch_size),
            default=default,
            named=True,
            nested_keys=nested_keys,
            filter_empty=filter_empty,
        )

    def to(self, *args: Any, **kwargs: Any) -> TensorDictBase:
        """Moves/casts leaves: ``to(device)``, ``to(dtype)``, ``to(other)``, ``to(batch_size=)``.

        Device moves use ``non_blocking=True`` unless told otherwise.
        """
        non_blocking = kwargs.pop("non_blocking", None)
        batch_size = kwargs.pop("batch_size", None)
        device = kwargs.pop("device", None)
        dtype = kwargs.pop("dtype", None)
        if kwargs:
            raise TypeError(f"to() got unexpected arguments {sorted(kwargs)}")
        for a in args:
            if isinstance(a, torch.dtype):
                dtype = a
            elif isinstance(a, (str, torch.device, int)):
                device = torch.device(a) if not isinstance(a, int) else torch.device("cuda", a)
            elif isinstance(a, Tensor):
                device, dtype = a.device, a.dtype
            elif is_tensor_collection(a):
                device = a.device
            else:
                raise TypeError(f"to() does not understand {a!r}")
        out = self
        if batch_size is not None:
            out = out.clone(False)
            out.batch_size = batch_size
        if device is None and dtype is None:
            return out
        if device is not None:
            device = torch.device(device)
            if device.type == "cuda" and device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
        nb = True if non_blocking is None else non_blocking
        if device is not None and dtype is not None:
            def fn(x):
                return x.to(device=device, dtype=dtype, non_blocking=nb)
        elif device is not None:
            if out.device == device:
                return out  # every leaf is already there (device is an invariant)
            relabel = getattr(out, "_relabel_device", None)
            relabeled = relabel(device) if relabel is not None else None
            if relabeled is not None:
                return relabeled
            if all(t.device == device for t in out._tensor_leaves()):
                return out._map(_identity, (), device=device, validate=False)
            def fn(x):
                return x.to(device, non_blocking=nb)
        else:
            def fn(x):
                return x.to(dtype)
        result = out._map(fn, (), device=device if device is not None else NO_DEFAULT, validate=False)
        if device is not None and nb and device.type == "cpu" and _any_device_not(self, "cpu"):
            torch.cuda.synchronize() if torch.cuda.is_available() else None
        return result

    def cpu(self) -> TensorDictBase:
        return self.to("cpu")

    def cuda(self, device: int | None = None) -> TensorDictBase:
        return self.to(torch.device("cuda") if device is None else torch.device("cuda", device))

    def clone(self, recurse: bool = True, **kwargs: Any) -> TensorDictBase:
        """A copy; ``recurse=False`` shares the leaves (a shallow copy)."""
        if not recurse:
            return self.copy()
        return self._map(torch.clone, (), clone_non_tensor=True, validate=False)

    def detach(self) -> TensorDictBase:
        return self._map(torch.Tensor.detach, (), validate=False)

    def detach_(self) -> TensorDictBase:
        self._map_(torch.Tensor.detach_, (), assign=False)
        return self

    def contiguous(self) -> TensorDictBase:
        return self._map(torch.Tensor.contiguous, (), validate=False)

    def is_contiguous(self) -> bool:
        return all(v.is_contiguous() for v in self._tensor_leaves())

    def requires_grad_(self, requires_grad: bool = True) -> TensorDictBase:
        self._map_(lambda x: x.requires_grad_(requires_grad), (), assign=False)
        return self

    @property
    def requires_grad(self) -> bool:
        return any(v.requires_grad for v in self._tensor_leaves())

    def _cast(self, dtype: torch.dtype, cast_filter: Callable | None) -> TensorDictBase:
        if cast_filter is None:
            return self.to(dtype)
        return self._map(lambda k, v: v.to(dtype) if cast_filter(k, v) else v, (), named=True,
                         nested_keys=True, validate=False)

    def float(self, *, cast_filter: Callable | None = None) -> TensorDictBase:
        """Every tensor leaf as float32; ``cast_filter(key, leaf) -> bool`` picks the leaves
        to cast (keys are nested tuples below the top level), the others are kept as they are.

        Example:
            >>> import torch
            >>> from steersman.tensordict import TensorDict
            >>> td = TensorDict(a=torch.zeros(2, dtype=torch.int64), b=torch.zeros(2, dtype=torch.int64))
            >>> out = td.float(cast_filter=lambda key, value: key == "a")
            >>> out["a"].dtype, out["b"].dtype
            (torch.float32, torch.int64)
        """
        return self._cast(torch.float32, cast_filter)

    def double(self, *, cast_filter: Callable | None = None) -> TensorDictBase:
        """float64 leaves (``cast_filter``: as in :meth:`float`)."""
        return self._cast(torch.float64, cast_filter)

    def half(self, *, cast_filter: Callable | None = None) -> TensorDictBase:
        """float16 leaves (``cast_filter``: as in :meth:`float`)."""
        return self._cast(torch.float16, cast_filter)

    def bfloat16(self, *, cast_filter: Callable | None = None) -> TensorDictBase:
        """bfloat16 leaves (``cast_filter``: as in :meth:`float`)."""
        return self._cast(torch.bfloat16, cast_filter)

    def int(self, *, cast_filter: Callable | None = None) -> TensorDictBase:
        """int32 leaves (``cast_filter``: as in :meth:`float`)."""
        return self._cast(torch.int32, cast_filter)

    def long(self) -> TensorDictBase:
        return self.to(torch.int64)

    def bool(self, *, cast_filter: Callable | None = None) -> TensorDictBase:
        """bool leaves (``cast_filter``: as in :meth:`float`)."""
        return self._cast(torch.bool, cast_filter)

    def type(self, dst_type: torch.dtype | str, *, cast_filter: Callable | None = None) -> TensorDictBase:
        """Leaves cast to ``dst_type``: a dtype or a tensor type name (``"torch.IntTensor"``);
        ``cast_filter``: as in :meth:`float`."""
        if isinstance(dst_type, str):
            try:
                dst_type = torch.empty(0).type(dst_type).dtype
            except (TypeError, RuntimeError, ValueError) as e:
                raise ValueError(f"type(): {dst_type!r} is not a dtype or a tensor type name ({e})") from None
        return self._cast(dst_type, cast_filter)

    def zero_(self) -> TensorDictBase:
        """Fills every leaf with zeros in place (one ``_foreach`` call)."""
        torch._foreach_zero_(self._tensor_leaves())
        return self

    def fill_(self, key: NestedKey, value: float | bool) -> TensorDictBase:
        """Fills the entry at ``key`` (a leaf or a nested container) with ``value``."""
        target = self.get(key)
        if isinstance(target, Tensor):
            target.fill_(value)
        else:
            for t in target._tensor_leaves():
                t.fill_(value)
        return self

    def copy_(self, src: TensorDictBase, non_blocking: bool = False) -> TensorDictBase:
        """Copies ``src`` into ``self`` in place (same keys)."""
        return self.update_(src)

    def _tensor_leaves(self) -> list[Tensor]:
        out: list[Tensor] = []
        for key in self._keys_str():
            v = self._get_str(key, NO_DEFAULT)
            if isinstance(v, Tensor):
                out.append(v)
            elif _is_branch(v) and not _is_non_tensor(v):
                out.extend(v._tensor_leaves())
        return out

    # ------------------------------------------------------------------ arithmetic
    def _binary(self, op: Callable, other: Any, reverse: bool = False) -> TensorDictBase:
        """``op(leaf, other_leaf)`` for every leaf; ``other``: container, tensor or scalar.

        A tensor shaped like the leading batch dims is aligned with them (not with the
        trailing feature dims), so ``td * mask`` works for a ``[*batch]`` mask.
        """
        if is_tensor_collection(other):
            same = other.batch_size == self.batch_size
            if reverse:
                return self._map(lambda x, y: op(y, x), (other,), validate=not same)
            return self._map(op, (other,), validate=not same)
        if isinstance(other, Tensor):
            n = other.ndim
            if n and n <= self.batch_dims and other.shape == self.batch_size[:n]:
                def fn(x):
                    o = other.reshape(other.shape + (1,) * (x.ndim - n))
                    return op(o, x) if reverse else op(x, o)
                return self._map(fn, (), validate=False)
            if reverse:
                return self._map(lambda x: op(other, x), ())
            return self._map(lambda x: op(x, other), ())
        if reverse:
            return self._map(lambda x: op(other, x), (), validate=False)
        return self._map(lambda x: op(x, other), (), validate=False)

    def _binary_(self, op_: Callable, other: Any) -> TensorDictBase:
        # dtype (and, for containers, shape) checks run when the first leaf is about to be
        # written: after the subclass's own checks (read-only files ...), before any write
        if is_tensor_collection(other):
            if not _is_lazy(self, other) and not _is_non_tensor(other):
                op_ = _check_first(op_, lambda: _checked_leaves(self, self._tensor_leaves(), other))
            self._map_(op_, (other,), assign=False)
            return self
        if isinstance(other, (Tensor, numbers.Number)):
            op_ = _check_first(op_, lambda: _check_result_dtypes(self._tensor_leaves(), other))
        if isinstance(other, Tensor) and other.ndim and other.ndim <= self.batch_dims and (
            other.shape == self.batch_size[: other.ndim]
        ):
            n = other.ndim

            def fn(x):
                return op_(x, other.reshape(other.shape + (1,) * (x.ndim - n)))
            self._map_(fn, (), assign=False)
            return self
        self._map_(lambda x: op_(x, other), (), assign=False)
        return self

    def __add__(self, other):
        return self._binary(torch.add, other)

    def __radd__(self, other):
        return self._binary(torch.add, other, True)

    def __sub__(self, other):
        return self._binary(torch.sub, other)

    def __rsub__(self, other):
        return self._binary(torch.sub, other, True)

    def __mul__(self, other):
        return self._binary(torch.mul, other)

    def __rmul__(self, other):
        return self._binary(torch.mul, other, True)

    def __truediv__(self, other):
        return self._binary(torch.div, other)

    def __rtruediv__(self, other):
        return self._binary(torch.div, other, True)

    def __floordiv__(self, other):
        return self._binary(torch.floor_divide, other)

    def __mod__(self, other):
        return self._binary(torch.remainder, other)

    def __pow__(self, other):
        return self._binary(torch.pow, other)

    def __rpow__(self, other):
        return self._binary(torch.pow, other, True)

    def __matmul__(self, other):
        return self._binary(torch.matmul, other)

    def __and__(self, other):
        return self._binary(torch.bitwise_and, other)

    def __or__(self, other):
        return self._binary(torch.bitwise_or, other)

    def __xor__(self, other):
        return self._binary(torch.bitwise_xor, other)

    def __neg__(self):
        return self._map(torch.neg, (), validate=False)

    def __abs__(self):
        return self._map(torch.abs, (), validate=False)

    def __invert__(self):
        return self._map(torch.bitwise_not, (), validate=False)

    def __iadd__(self, other):
        return self._binary_(Tensor.add_, other)

    def __isub__(self, other):
        return self._binary_(Tensor.sub_, other)

    def __imul__(self, other):
        return self._binary_(Tensor.mul_, other)

    def __itruediv__(self, other):
        return self._binary_(Tensor.div_, other)

    def __ipow__(self, other):
        return self._binary_(Tensor.pow_, other)

    def __eq__(self, other):  # type: ignore[override]
        return self._binary(torch.eq, other)

    def __ne__(self, other):  # type: ignore[override]
        return self._binary(torch.ne, other)

    def __lt__(self, other):
        return self._binary(torch.lt, other)

    def __le__(self, other):
        return self._binary(torch.le, other)

    def __gt__(self, other):
        return self._binary(torch.gt, other)

    def __ge__(self, other):
        return self._binary(torch.ge, other)

    def _binary_default(self, op: Callable, other: Any, default: Any) -> TensorDictBase:
        """``op`` over two containers whose keys may differ (the ``default=`` keyword)."""
        if default is None or not is_tensor_collection(other):
            return self._binary(op, other)
        if not (isinstance(default, Tensor) or default == "intersection"):
            raise TypeError(f"default must be None, 'intersection' or a tensor, got {default!r}")
        from .td import TensorDict

        mine = [k for k in self.keys(True, True) if isinstance(self.get(k), Tensor)]
        theirs = [k for k in other.keys(True, True) if isinstance(other.get(k), Tensor)]
        has_mine, has_theirs = set(mine), set(theirs)
        if isinstance(default, Tensor):
            keys = mine + [k for k in theirs if k not in has_mine]
        else:
            keys = [k for k in mine if k in has_theirs]
        bs = self.batch_size if self.batch_size == other.batch_size else torch.broadcast_shapes(
            self.batch_size, other.batch_size)
        out = TensorDict({}, batch_size=bs, device=self.device if self.device == other.device else None)
        for k in keys:
            a = self.get(k) if k in has_mine else default
            b = other.get(k) if k in has_theirs else default
            out.set(k, op(a, b))
        return out

    def add(self, other, *, alpha: float | None = None, default: Any = None):
        """``self + alpha * other`` leafwise.

        ``default`` (containers with different keys): ``None`` needs the same keys;
        ``"intersection"`` keeps the keys both have; a tensor stands in for the entry the
        other side lacks, and the result has the keys of both.

        Example:
            >>> import torch
            >>> from steersman.tensordict import TensorDict
            >>> a = TensorDict(x=torch.ones(2), y=torch.ones(2), batch_size=[2])
            >>> b = TensorDict(x=torch.ones(2), z=torch.ones(2), batch_size=[2])
            >>> sorted(a.add(b, default="intersection").keys())
            ['x']
            >>> a.add(b, default=torch.zeros(()))["z"]
            tensor([1., 1.])
        """
        if alpha is not None:
            return self._binary_default(lambda x, y: torch.add(x, y, alpha=alpha), other, default)
        return self._binary_default(torch.add, other, default)

    def sub(self, other, *, alpha: float | None = None, default: Any = None):
        """``self - alpha * other`` leafwise (``default``: see :meth:`add`)."""
        if alpha is not None:
            return self._binary_default(lambda x, y: torch.sub(x, y, alpha=alpha), other, default)
        return self._binary_default(torch.sub, other, default)

    def mul(self, other, *, default: Any = None):
        """``self * other`` leafwise (``default``: see :meth:`add`)."""
        return self._binary_default(torch.mul, other, default)

    def div(self, other, *, default: Any = None):
        """``self / other`` leafwise (``default``: see :meth:`add`)."""
        return self._binary_default(torch.div, other, default)

    def pow(self, other, *, default: Any = None):
        """``self ** other`` leafwise (``default``: see :meth:`add`)."""
        return self._binary_default(torch.pow, other, default)

    def maximum(self, other, *, default: Any = None):
        """Leafwise maximum (``default``: see :meth:`add`)."""
        return self._binary_default(torch.maximum, other, default)

    def minimum(self, other, *, default: Any = None):
        """Leafwise minimum (``default``: see :meth:`add`)."""
        return self._binary_default(torch.minimum, other, default)

    def lerp(self, end, weight):
        return self._binary(lambda x, e: torch.lerp(x, e, weight), end)

    def add_(self, other, *, alpha: float | None = None):
        if alpha is None and is_tensor_collection(other) and not _is_lazy(self, other):
            dst = self._tensor_leaves()
            torch._foreach_add_(dst, _checked_leaves(self, dst, other))
            return self
        if alpha is not None:
            return self._binary_(lambda x, y: x.add_(y, alpha=alpha), other)
        return self._binary_(Tensor.add_, other)

    def sub_(self, other, *, alpha: float | None = None):
        if alpha is not None:
            return self._binary_(lambda x, y: x.sub_(y, alpha=alpha), other)
        return self._binary_(Tensor.sub_, other)

    def mul_(self, other):
        if isinstance(other, numbers.Number):
            leaves = self._tensor_leaves()
            # _foreach_mul_ checks dtypes leaf by leaf (a late failure leaves early leaves
            # written): take it only when every leaf can hold the product
            if all(_scalar_fits(dt, other) for dt in {x.dtype for x in leaves}):
                torch._foreach_mul_(leaves, other)
                return self
        return self._binary_(Tensor.mul_, other)

    def div_(self, other):
        return self._binary_(_check_first(Tensor.div_, lambda: _check_float_leaves(self, "div_")), other)

    def pow_(self, other):
        return self._binary_(Tensor.pow_, other)

    def maximum_(self, other):
        return self._binary_(lambda x, y: x.copy_(torch.maximum(x, y)), other)

    def minimum_(self, other):
        return self._binary_(lambda x, y: x.copy_(torch.minimum(x, y)), other)

    def lerp_(self, end, weight):
        if is_tensor_collection(end) and isinstance(weight, numbers.Number) and not _is_lazy(self, end):
            dst = self._tensor_leaves()
            torch._foreach_lerp_(dst, _checked_leaves(self, dst, end), weight)
            return self
        return self._binary_(lambda x, e: x.lerp_(e, weight), end)

    def addcmul_(self, tensor1, tensor2, *, value: float = 1):
        self._map_(lambda x, a, b: x.addcmul_(a, b, value=value), (tensor1, tensor2), assign=False)
        return self

    def _unary_(self, name: str) -> TensorDictBase:
        foreach = getattr(torch, f"_foreach_{name}_", None)
        leaves = self._tensor_leaves()
        if foreach is not None and leaves:
            foreach(leaves)
        else:
            for t in leaves:
                getattr(t, f"{name}_")()
        return self

    def clamp(self, min=None, max=None):
        return self._map(lambda x: x.clamp(min, max), ())

    def clamp_(self, min=None, max=None):
        self._map_(lambda x: x.clamp_(min, max), (), assign=False)
        return self

    def clamp_min(self, other: Any = None, *, default: Any = None, min: Any = None):
        """Leafwise lower bound ``other`` (a number, tensor or container; ``min=`` is torch's
        name for it); ``default``: see :meth:`add`."""
        other = min if other is None else other
        if other is None:
            raise TypeError("clamp_min() needs the bound: clamp_min(other)")
        if is_tensor_collection(other):
            return self._binary_default(torch.clamp_min, other, default)
        return self.clamp(min=other)

    def clamp_max(self, other: Any = None, *, default: Any = None, max: Any = None):
        """Leafwise upper bound ``other`` (``max=`` is torch's name); ``default``: see :meth:`add`."""
        other = max if other is None else other
        if other is None:
            raise TypeError("clamp_max() needs the bound: clamp_max(other)")
        if is_tensor_collection(other):
            return self._binary_default(torch.clamp_max, other, default)
        return self.clamp(max=other)

    def abs_(self):
        return self._unary_("abs")

    def neg_(self):
        return self._unary_("neg")

    def sqrt_(self):
        return self._unary_("sqrt")

    def exp_(self):
        return self._unary_("exp")

    def log_(self):
        return self._unary_("log")

    def sign_(self):
        return self._unary_("sign")

    def sigmoid_(self):
        return self._unary_("sigmoid")

    def tanh_(self):
        return self._unary_("tanh")

    def reciprocal_(self):
        return self._unary_("reciprocal")

    def sqrt(self):
        return self._map(torch.sqrt, (), validate=False)

    def exp(self):
        return self._map(torch.exp, (), validate=False)

    def log(self):
        return self._map(torch.log, (), validate=False)

    def abs(self):
        return self._map(torch.abs, (), validate=False)

    def neg(self):
        return self._map(torch.neg, (), validate=False)

    def sign(self):
        return self._map(torch.sign, (), validate=False)

    def sigmoid(self):
        return self._map(torch.sigmoid, (), validate=False)

    def tanh(self):
        return self._map(torch.tanh, (), validate=False)

    def reciprocal(self):
        return self._map(torch.reciprocal, (), validate=False)

    def isnan(self):
        return self._map(torch.isnan, (), validate=False)

    def isfinite(self):
        return self._map(torch.isfinite, (), validate=False)

    def logical_and(self, other, *, default: Any = None):
        """Leafwise logical and (``default``: see :meth:`add`)."""
        return self._binary_default(torch.logical_and, other, default)

    def logical_or(self, other):
        return self._binary(torch.logical_or, other)

    def logical_not(self):
        return self._map(torch.logical_not, (), validate=False)

    # ------------------------------------------------------------------ reductions
    def all(self, dim: int | None = None) -> Any:
        """``dim=None``: one bool; ``dim=d``: a container reduced over batch dim ``d``."""
        if dim is None:
            return all(bool(v.all()) for v in self._tensor_leaves())
        return self._reduce(lambda x, dims: x.all(dim=dims[0]) if len(dims) == 1 else x.all(), dim)

    def any(self, dim: int | None = None) -> Any:
        if dim is None:
            return any(bool(v.any()) for v in self._tensor_leaves())
        return self._reduce(lambda x, dims: x.any(dim=dims[0]) if len(dims) == 1 else x.any(), dim)

    def _reduce(self, fn: Callable, dim: Any, keepdim: bool = False) -> TensorDictBase:
        dims = _dims_tuple(dim, self.batch_dims)
        return self._map(lambda x: fn(x, dims), (), batch_size=_reduced_size(self.batch_size, dims, keepdim),
                         validate=False)

    def _reduction(self, name: str, dim: Any, keepdim: bool, reduce: bool, **kw: Any) -> Any:
        func = getattr(torch, name)
        if reduce:
            bd = self.batch_dims
            dims = tuple(range(bd)) if dim is None or dim is NO_DEFAULT else _dims_tuple(dim, bd)
            return _reduce_all(name, self._tensor_leaves(), dims, bd, keepdim, **kw)
        if dim is None or dim is NO_DEFAULT:
            return self._map(lambda x: func(x, **kw), (), batch_size=torch.Size(()), scalar_out=True)
        # the leaf function fn(leaf, dims) is picked once, here, not for every leaf
        if name in ("max", "min", "prod"):  # one dim at a time
            values = name != "prod"

            def fn(x, dims):
                for d in sorted(dims, reverse=True):
                    x = getattr(x, name)(dim=d, keepdim=keepdim)
                    if values:
                        x = x.values
                return x
        elif name == "norm":
            def fn(x, dims):
                return torch.linalg.vector_norm(x, dim=dims, keepdim=keepdim, **kw)
        elif keepdim or kw:
            def fn(x, dims):
                return func(x, dims[0] if len(dims) == 1 else dims, keepdim=keepdim, **kw)
        else:  # the common case: sum/mean over batch dims
            def fn(x, dims):
                return func(x, dims[0] if len(dims) == 1 else dims)
        return self._reduce(fn, dim, keepdim)

    def sum(self, dim: Any = None, keepdim: bool = False, *, reduce: bool = False, dtype=None,
            key_transform: Callable | None = None):
        """Sums over batch dims ``dim`` (``None``: each leaf entirely). ``reduce=True``: one tensor.

        ``dtype``: leaves are cast to it first. ``key_transform``: renames every key of the
        result, at every level (``lambda key: f"sum_{key}"``; ignored with ``reduce=True``).

        Example:
            >>> import torch
            >>> from steersman.tensordict import TensorDict
            >>> td = TensorDict(a=torch.ones(3), n={"b": torch.ones(3)}, batch_size=[3])
            >>> list(td.sum(key_transform=lambda k: "sum_" + k).keys(True, True))
            ['sum_a', ('sum_n', 'sum_b')]
        """
        kw = {} if dtype is None else {"dtype": dtype}
        return _rename(self._reduction("sum", dim, keepdim, reduce, **kw), key_transform, reduce)

    def nansum(self, dim: Any = None, keepdim: bool = False, *, dtype=None, reduce: bool = False):
        """:meth:`sum` ignoring NaNs (``dtype``: leaves are cast to it first)."""
        src = self if dtype is None else self.to(dtype)
        return src._reduction("nansum", dim, keepdim, reduce)

    def mean(self, dim: Any = None, keepdim: bool = False, *, reduce: bool = False, dtype=None,
             key_transform: Callable | None = None):
        """The mean over batch dims ``dim`` (``dtype``, ``key_transform``: see :meth:`sum`)."""
        kw = {} if dtype is None else {"dtype": dtype}
        return _rename(self._reduction("mean", dim, keepdim, reduce, **kw), key_transform, reduce)

    def nanmean(self, dim: Any = None, keepdim: bool = False, *, dtype=None, reduce: bool = False):
        """:meth:`mean` ignoring NaNs (``dtype``: leaves are cast to it first)."""
        src = self if dtype is None else self.to(dtype)
        return src._reduction("nanmean", dim, keepdim, reduce)

    def std(self, dim: Any = None, keepdim: bool = False, *, correction: int = 1, reduce: bool = False,
            key_transform: Callable | None = None):
        """The standard deviation over batch dims ``dim`` (``key_transform``: see :meth:`sum`)."""
        return _rename(self._reduction("std", dim, keepdim, reduce, correction=correction), key_transform, reduce)

    def var(self, dim: Any = None, keepdim: bool = False, *, correction: int = 1, reduce: bool = False,
            key_transform: Callable | None = None):
        """The variance over batch dims ``dim`` (``key_transform``: see :meth:`sum`)."""
        return _rename(self._reduction("var", dim, keepdim, reduce, correction=correction), key_transform, reduce)

    def max(self, dim: Any = None, keepdim: bool = False, *, reduce: bool = False, return_indices: bool = True):
        """The maximum over batch dim ``dim`` (``None``: of each leaf).

        With an int ``dim`` and ``return_indices=True`` (the default, as in tensordict) it
        returns ``(values, indices)`` containers, as ``torch.max`` does;
        ``return_indices=False``, or a tuple of dims, gives the values container alone.

        Example:
            >>> import torch
            >>> from steersman.tensordict import TensorDict
            >>> td = TensorDict(a=torch.tensor([1.0, 3.0, 2.0]), batch_size=[3])
            >>> td.max(0).indices["a"]
            tensor(1)
            >>> td.max(0, return_indices=False)["a"]
            tensor(3.)
        """
        return self._arg_reduction("max", dim, keepdim, reduce, return_indices)

    def min(self, dim: Any = None, keepdim: bool = False, *, reduce: bool = False, return_indices: bool = True):
        """The minimum over batch dim ``dim`` (``return_indices``: see :meth:`max`)."""
        return self._arg_reduction("min", dim, keepdim, reduce, return_indices)

    def _arg_reduction(self, name: str, dim: Any, keepdim: bool, reduce: bool, return_indices: bool) -> Any:
        if not return_indices or reduce or dim is None or dim is NO_DEFAULT:
            return self._reduction(name, dim, keepdim, reduce)
        dims = _dims_tuple(dim, self.batch_dims)
        if len(dims) != 1:  # indices into several dims at once: torch has none either
            return self._reduction(name, dim, keepdim, reduce)
        d = dims[0]
        bs = _reduced_size(self.batch_size, dims, keepdim)
        values = self._map(lambda x: getattr(x, name)(dim=d, keepdim=keepdim).values, (), batch_size=bs,
                           validate=False)
        indices = self._map(lambda x: getattr(x, name)(dim=d, keepdim=keepdim).indices, (), batch_size=bs,
                            validate=False)
        return torch.return_types.max((values, indices)) if name == "max" else torch.return_types.min(
            (values, indices))

    def amax(self, dim: Any = None, keepdim: bool = False, *, reduce: bool = False):
        return self._reduction("max", dim, keepdim, reduce)

    def amin(self, dim: Any = None, keepdim: bool = False, *, reduce: bool = False):
        return self._reduction("min", dim, keepdim, reduce)

    def prod(self, dim: Any = None, keepdim: bool = False, *, dtype=None, reduce: bool = False):
        """The product over batch dims ``dim`` (``dtype``: leaves are cast to it first)."""
        src = self if dtype is None else self.to(dtype)
        return src._reduction("prod", dim, keepdim, reduce)

    def norm(self, dim: Any = None, keepdim: bool = False, *, reduce: bool = False, ord: float = 2,
             dtype=None, key_transform: Callable | None = None):
        """The vector norm over batch dims ``dim`` (``dtype``: leaves are cast to it first;
        ``key_transform``: see :meth:`sum`)."""
        src = self if dtype is None else self.to(dtype)
        if dim is None and not reduce:
            out = src._map(lambda x: torch.linalg.vector_norm(x, ord), (), batch_size=torch.Size(()),
                           scalar_out=True)
        else:
            out = src._reduction("norm", dim, keepdim, reduce, ord=ord)
        return _rename(out, key_transform, reduce)

    def cumsum(self, dim: int) -> TensorDictBase:
        d = _dims_tuple(dim, self.batch_dims)[0]
        return self._map(lambda x: torch.cumsum(x, d), ())

    def cumprod(self, dim: int) -> TensorDictBase:
        d = _dims_tuple(dim, self.batch_dims)[0]
        return self._map(lambda x: torch.cumprod(x, d), ())

    # ------------------------------------------------------------------ masks
    def masked_fill(self, mask: Tensor, value: float | bool) -> TensorDictBase:
        """Sets ``value`` where ``mask`` (shaped like the leading batch dims) is True."""
        _check_mask(self, mask)
        return self._map(lambda x: x.masked_fill(expand_right(mask, x.shape), value), ())

    def masked_fill_(self, mask: Tensor, value: float | bool) -> TensorDictBase:
        _check_mask(self, mask)
        self._map_(lambda x: x.masked_fill_(expand_right(mask, x.shape), value), (), assign=False)
        return self

    def masked_select(self, mask: Tensor, *, inplace: bool = False) -> TensorDictBase:
        """The elements where ``mask`` (over the leading batch dims) is True
        (``inplace``: see :meth:`flatten`)."""
        _check_mask(self, mask)
        return _maybe_inplace(self, self[mask], inplace, "masked_select")

    def where(self, condition: Tensor, other: Any, *, pad: Any = None) -> TensorDictBase:
        """Keeps ``self`` where ``condition`` is True, takes ``other`` elsewhere."""
        return torch.where(condition, self, other)

    # ------------------------------------------------------------------ shape ops
    def reshape(self, *shape: Any) -> TensorDictBase:
        """Reshapes the batch dims; leaf feature dims are kept."""
        shape = _shape_args(shape)
        if -1 in shape:
            shape = list(shape)
            known = math.prod(s for s in shape if s != -1)
            shape[shape.index(-1)] = self.numel() // known if known else 0
        shape = torch.Size(shape)
        if math.prod(shape) != self.numel():
            raise RuntimeError(
                f"shape {list(shape)} is invalid for a batch of size {list(self.batch_size)}"
            )
        if shape == self.batch_size:
            return self
        bd = self.batch_dims
        t = tuple(shape)
        return self._apply_batch(lambda x: x.reshape(*t, *x.shape[bd:]), shape, None)

    def view(self, *shape: Any, dtype: torch.dtype | None = None) -> TensorDictBase:
        if dtype is not None and not shape:
            return self._map(lambda x: x.view(dtype), ())
        shape = _shape_args(shape)
        if -1 in shape:
            shape = list(shape)
            known = math.prod(s for s in shape if s != -1)
            shape[shape.index(-1)] = self.numel() // known if known else 0
        shape = torch.Size(shape)
        if math.prod(shape) != self.numel():
            raise RuntimeError(f"shape {list(shape)} is invalid for a batch of size {list(self.batch_size)}")
        if shape == self.batch_size:
            return self
        bd = self.batch_dims
        t = tuple(shape)
        return self._apply_batch(lambda x: x.view(*t, *x.shape[bd:]), shape, None)

    def flatten(self, start_dim: int = 0, end_dim: int = -1, *, inplace: bool = False) -> TensorDictBase:
        """Merges batch dims ``start_dim..end_dim``. ``inplace=True``: the container keeps
        its identity and gets the new leaves and batch size (a TensorDict only; the same for
        ``unflatten``, ``repeat``, ``repeat_interleave``, ``roll``, ``masked_select``, ``gather``)."""
        bd = self.batch_dims
        if bd == 0:
            return self
        s, e = start_dim % bd, end_dim % bd
        if e <= s:
            return self
        bs = self.batch_size
        shape = bs[:s] + (math.prod(bs[s : e + 1]),) + bs[e + 1 :]
        return _maybe_inplace(self, self.reshape(shape), inplace, "flatten")

    def unflatten(self, dim: int, unflattened_size: Sequence[int], *, inplace: bool = False) -> TensorDictBase:
        """Splits batch dim ``dim`` into ``unflattened_size`` (``inplace``: see :meth:`flatten`)."""
        if inplace:
            return _maybe_inplace(self, self.unflatten(dim, unflattened_size), True, "unflatten")
        sizes = unflattened_size
        bd = self.batch_dims
        d = _dims_tuple(dim, bd)[0]
        bs = self.batch_size
        sizes = list(sizes)
        if -1 in sizes:
            known = math.prod(s for s in sizes if s != -1)
            sizes[sizes.index(-1)] = bs[d] // known
        return self.reshape(bs[:d] + tuple(sizes) + bs[d + 1 :])

    def squeeze(self, dim: int | None = None) -> TensorDictBase:
        bs = self.batch_size
        bd = len(bs)
        if dim is None:
            dims = [i for i, s in enumerate(bs) if s == 1]
        else:
            dims = [d for d in _dims_tuple(dim, bd) if bs[d] == 1]
        if not dims:
            return self
        new_bs = torch.Size(s for i, s in enumerate(bs) if i not in dims)
        names = self._names_without(dims)

        def fn(x):
            for d in sorted(dims, reverse=True):
                x = x.squeeze(d)
            return x
        return self._apply_batch(fn, new_bs, names)

    def unsqueeze(self, dim: int) -> TensorDictBase:
        bd = self.batch_dims
        if not -bd - 1 <= dim <= bd:
            raise IndexError(f"unsqueeze dim={dim} is out of range for a batch with {bd} dims")
        d = dim % (bd + 1) if dim < 0 else dim
        bs = self.batch_size
        new_bs = torch.Size((*bs[:d], 1, *bs[d:]) if d else (1, *bs))
        names = self.names_or_none()
        if names is not None:
            names = names[:d] + [None] + names[d:]
        return self._apply_batch(lambda x: x.unsqueeze(d), new_bs, names)

    def permute(self, *dims: Any) -> TensorDictBase:
        bs = self.batch_size
        bd = len(bs)
        given = _shape_args(dims)
        dims = tuple([d % bd for d in given]) if bd else given
        if len(dims) != bd or sorted(dims) != list(range(bd)):
            raise ValueError(f"permute dims {list(given)} do not match a batch of {bd} dims")
        moved = [i for i, d in enumerate(dims) if d != i]
        if not moved:
            return self
        new_bs = torch.Size([bs[d] for d in dims])
        names = self.names_or_none()
        if names is not None:
            names = [names[d] for d in dims]
        if len(moved) == 2:  # a swap: one transpose per leaf (no full dim list to build)
            a, b = moved
            return self._apply_batch(lambda x: x.transpose(a, b), new_bs, names)
        return self._apply_batch(lambda x: x.permute(*dims, *range(bd, x.ndim)), new_bs, names)

    def transpose(self, dim0: int, dim1: int) -> TensorDictBase:
        bd = self.batch_dims
        d0, d1 = _dims_tuple((dim0, dim1), bd)
        if d0 == d1:
            return self
        perm = list(range(bd))
        perm[d0], perm[d1] = perm[d1], perm[d0]
        return self.permute(perm)

    @property
    def T(self) -> TensorDictBase:  # noqa: N802
        return self.permute(*reversed(range(self.batch_dims)))

    def expand(self, *shape: Any) -> TensorDictBase:
        """Expands the batch to ``shape`` (new leading dims allowed, -1 keeps a dim)."""
        new_bs = expanded_batch_size(self.batch_size, shape)
        bd = self.batch_dims
        t = tuple(new_bs)
        return self._apply_batch(lambda x: x.expand(*t, *x.shape[bd:]), new_bs, None)

    def expand_as(self, other: Any) -> TensorDictBase:
        return self.expand(other.shape)

    def repeat(self, *repeats: Any, inplace: bool = False) -> TensorDictBase:
        """Tiles the batch dims (``inplace``: see :meth:`flatten`)."""
        if inplace:
            return _maybe_inplace(self, self.repeat(*repeats), True, "repeat")
        repeats = _shape_args(repeats)
        bd = self.batch_dims
        if len(repeats) != bd:
            raise ValueError(f"repeat needs {bd} repeats (one per batch dim), got {list(repeats)}")
        new_bs = torch.Size(s * r for s, r in zip(self.batch_size, repeats))
        return self._apply_batch(lambda x: x.repeat(*repeats, *(1,) * (x.ndim - bd)), new_bs, None)

    def repeat_interleave(self, repeats: int | Tensor, dim: int = 0, *, output_size: int | None = None,
                          inplace: bool = False) -> TensorDictBase:
        """Repeats each element along batch dim ``dim``; ``output_size`` (the new length,
        as for ``torch.repeat_interleave``) saves a sync on a tensor ``repeats`` and is checked;
        ``inplace``: see :meth:`flatten`."""
        d = _dims_tuple(dim, self.batch_dims)[0]
        bs = list(self.batch_size)
        bs[d] = output_size if output_size is not None else (
            int(repeats.sum()) if isinstance(repeats, Tensor) else bs[d] * repeats)
        out = self._apply_batch(lambda x: x.repeat_interleave(repeats, dim=d, output_size=output_size),
                                torch.Size(bs), None)
        return _maybe_inplace(self, out, inplace, "repeat_interleave")

    def flip(self, dims: Any) -> TensorDictBase:
        dims = _dims_tuple(dims, self.batch_dims)
        return self._apply_batch(lambda x: x.flip(dims), self.batch_size, self.names_or_none())

    def roll(self, shifts: Any, dims: Any, *, inplace: bool = False) -> TensorDictBase:
        """Rolls batch dims ``dims`` by ``shifts`` (``inplace``: see :meth:`flatten`)."""
        dims = _dims_tuple(dims, self.batch_dims)
        out = self._apply_batch(lambda x: x.roll(shifts, dims), self.batch_size, self.names_or_none())
        return _maybe_inplace(self, out, inplace, "roll")

    def narrow(self, dim: int, start: int, length: int) -> TensorDictBase:
        d = _dims_tuple(dim, self.batch_dims)[0]
        bs = list(self.batch_size)
        bs[d] = length
        return self._apply_batch(lambda x: x.narrow(d, start, length), torch.Size(bs), self.names_or_none())

    def unbind(self, dim: int = 0) -> tuple[TensorDictBase, ...]:
        """Splits along batch dim ``dim`` into a tuple of containers without that dim."""
        bd = self.batch_dims
        d = _dims_tuple(dim, bd)[0]
        bs = self.batch_size
        new_bs = bs[:d] + bs[d + 1 :]
        return tuple(self._split_batch(lambda x: x.unbind(d), [new_bs] * bs[d]))

    def split(self, split_size: int | Sequence[int], dim: int = 0) -> tuple[TensorDictBase, ...]:
        """Splits along batch dim ``dim`` into chunks of ``split_size`` (or the given sizes)."""
        d = _dims_tuple(dim, self.batch_dims)[0]
        bs = self.batch_size
        n = bs[d]
        if isinstance(split_size, int):
            if split_size <= 0:
                raise ValueError(f"split_size must be positive, got {split_size}")
            # like torch.split: an empty dim still gives one (empty) piece
            sizes = [min(split_size, n - i) for i in range(0, n, split_size)] or [0]
        else:
            sizes = list(split_size)
            if sum(sizes) != n:
                raise ValueError(f"split sizes {sizes} do not sum to the batch dim size {n}")
        bss = [bs[:d] + (s,) + bs[d + 1 :] for s in sizes]
        # split_with_sizes is what Tensor.split calls, minus its Python wrapper
        return tuple(self._split_batch(lambda x: x.split_with_sizes(sizes, d), [torch.Size(b) for b in bss]))

    def chunk(self, chunks: int, dim: int = 0) -> tuple[TensorDictBase, ...]:
        n = self.batch_size[_dims_tuple(dim, self.batch_dims)[0]]
        size = -(-n // chunks) if n else 1
        return self.split(size, dim)

    def gather(self, dim: int, index: Tensor, *, out: TensorDictBase | None = None,
               inplace: bool = False) -> TensorDictBase:
        """``torch.gather`` along batch dim ``dim`` on every leaf; ``out``: written into it
        (in place, returned); ``inplace``: see :meth:`flatten`."""
        result = torch.gather(self, dim, index)
        if out is not None:
            out.update_(result)
            return out
        return _maybe_inplace(self, result, inplace, "gather")

    # ------------------------------------------------------------------ names
    def names_or_none(self) -> list | None:
        names = self.names
        return None if names is None or all(n is None for n in names) else list(names)

    def _names_without(self, dims: Sequence[int]) -> list | None:
        names = self.names_or_none()
        return None if names is None else [n for i, n in enumerate(names) if i not in dims]

    def refine_names(self, *names: Any) -> TensorDictBase:
        self.names = list(names)
        return self

    def rename(self, *names: Any, **rename_map: str) -> TensorDictBase:
        out = self.copy()
        if names:
            out.names = list(names)
        else:
            out.names = [rename_map.get(n, n) for n in self.names]
        return out

    # ------------------------------------------------------------------ memory
    def bytes(self, *, count_duplicates: bool = False) -> int:
        """The bytes held by the leaves (a storage shared by several leaves counts once)."""
        seen = set()
        total = 0
        for t in self._tensor_leaves():
            if not count_duplicates:
                key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.shape, t.dtype)
                if key in seen:
                    continue
                seen.add(key)
            total += t.numel() * t.element_size()
        return total

    def is_shared(self) -> bool:
        leaves = self._tensor_leaves()
        return bool(leaves) and all(t.is_shared() for t in leaves)

    def share_memory_(self) -> TensorDictBase:
        """Moves leaves to shared memory (so worker processes see writes) and locks."""
        for t in self._tensor_leaves():
            t.share_memory_()
        return self.lock_()

    def pin_memory(self, num_threads: int | None = None, inplace: bool = False) -> TensorDictBase:
        """Copies leaves to page-locked memory (needs an accelerator).

        Usually ``td.to(device, non_blocking=True)`` is as fast and simpler.
        """
        if not torch.cuda.is_available():
            raise RuntimeError(
                "pin_memory() needs an accelerator (none is available); "
                "use td.to(device, non_blocking=True) instead"
            )
        return self._map(lambda x: x.pin_memory(), ())

    def is_memmap(self) -> bool:
        from .memmap import MemoryMappedTensor

        leaves = self._tensor_leaves()
        return bool(leaves) and all(isinstance(t, MemoryMappedTensor) for t in leaves)

    def memmap_(self, prefix: Any = None, copy_existing: bool = False, *, num_threads: int = 0,
                existsok: bool = True) -> TensorDictBase:
        """Moves every leaf to a memory-mapped file under ``prefix`` (in place); locks."""
        from .io import memmap_into

        return memmap_into(self, prefix, inplace=True, existsok=existsok, copy_data=True)

    def memmap(self, prefix: Any = None, copy_existing: bool = False, *, num_threads: int = 0,
               existsok: bool = True) -> TensorDictBase:
        """A memory-mapped copy of this container under ``prefix``."""
        from .io import memmap_into

        return memmap_into(self, prefix, inplace=False, existsok=existsok, copy_data=True)

    def memmap_like(self, prefix: Any = None, copy_existing: bool = False, *, existsok: bool = True,
                    num_threads: int = 0) -> TensorDictBase:
        """A memory-mapped container with the same structure, filled with zeros."""
        from .io import memmap_into

        return memmap_into(self, prefix, inplace=False, existsok=existsok, copy_data=False)

    def save(self, prefix: Any, copy_existing: bool = False, *, num_threads: int = 0) -> TensorDictBase:
        """Writes the container under ``prefix`` (raw tensor files + JSON metadata)."""
        from .io import save

        save(self, prefix)
        return self

    dumps = save

    def to_h5(self, filename: Any, **kwargs: Any) -> TensorDictBase:
        """Writes this container to an HDF5 file; returns the file-backed container (needs h5py)."""
        from .persistent import to_h5

        return to_h5(self, filename, **kwargs)

    # ------------------------------------------------------------------ locking
    @property
    def is_locked(self) -> bool:
        return self._is_locked_flag()

    def _is_locked_flag(self) -> bool:
        return False

    # ------------------------------------------------------------------ state dict
    def state_dict(self, destination: dict | None = None, prefix: str = "", keep_vars: bool = False,
                   flatten: bool = False) -> dict[str, Any]:
        """A dict of tensors plus ``"__batch_size"``/``"__device"`` entries, for ``torch.save``."""
        out: dict[str, Any] = {} if destination is None else destination
        for key in self._keys_str():
            v = self._get_str(key, NO_DEFAULT)
            if isinstance(v, Tensor):
                out[prefix + key] = v if keep_vars else v.detach()
            elif _is_non_tensor(v):
                out[prefix + key] = {"__non_tensor": _unwrap(v)}
            else:
                if flatten:
                    v.state_dict(out, prefix + key + ".", keep_vars, flatten=True)
                else:
                    out[prefix + key] = v.state_dict(keep_vars=keep_vars)
        out[prefix + "__batch_size"] = self.batch_size
        out[prefix + "__device"] = self.device
        return out

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True,
                        assign: bool = False, from_flatten: bool = False) -> TensorDictBase:
        from .td import TensorDict

        sd = dict(state_dict)
        if from_flatten or any("." in k for k in sd if not k.startswith("__")):
            sd = _unflatten_state_dict(sd)
        new = TensorDict._from_state_dict(sd)
        if strict:
            mine = set(self.keys(True, True))
            theirs = set(new.keys(True, True))
            if mine and mine != theirs:
                raise KeyError(f"state_dict keys differ: missing {sorted(map(str, mine - theirs))}, "
                               f"unexpected {sorted(map(str, theirs - mine))}")
        self.batch_size = new.batch_size
        self.update(new)
        return self

    # ------------------------------------------------------------------ repr
    def __repr__(self) -> str:
        opts = _PRINT_OPTIONS
        head = type(self).__name__
        if opts["compact"]:
            return _compact_repr(self, head, opts)
        fields = _fields_repr(self, indent=8)
        out = f"{head}(\n    fields={{{fields}}}"
        if opts["show_batch_size"]:
            out += f",\n    batch_size={self.batch_size}"
        if opts["show_device"]:
            out += f",\n    device={self.device}"
        if opts["show_is_shared"]:
            out += f",\n    is_shared={self._shared_repr()}"
        return out + ")"

    def _shared_repr(self) -> bool:
        try:
            return self.is_shared()
        except Exception:  # pragma: no cover - storage without is_shared
            return False

    # ------------------------------------------------------------------ comparisons helpers
    def allclose(self, other: TensorDictBase, rtol: float = 1e-5, atol: float = 1e-8) -> bool:
        return all(torch.allclose(a, b, rtol, atol) for a, b in zip(
            self._tensor_leaves(), _matching_leaves(self, other)))

    def isclose(self, other: TensorDictBase, rtol: float = 1e-5, atol: float = 1e-8) -> TensorDictBase:
        return self._map(lambda a, b: torch.isclose(a, b, rtol, atol), (other,))

    def data_ptr(self) -> TensorDictBase:
        return self._map(lambda x: torch.tensor(x.data_ptr()), ())

    # ------------------------------------------------------------------ modules
    def to_module(self, module: Any, *, inplace: bool | None = None, return_swap: bool = True,
                  use_state_dict: bool = False, non_blocking: bool = False) -> Any:
        """Swaps the leaves into ``module``; returns the old values (a context manager).

        See :func:`steersman.tensordict.module_params.to_module`.
        """
        from .module_params import to_module

        return to_module(self, module, inplace=inplace, return_swap=return_swap,
                         use_state_dict=use_state_dict, non_blocking=non_blocking)



# ---------------------------------------------------------------------- helpers
def _is_branch(v: Any) -> bool:
    """True for nested containers we can walk into (not for non-tensor leaves)."""
    return isinstance(v, TensorDictBase) and not getattr(type(v), "_is_non_tensor", False)


def _is_non_tensor(v: Any) -> bool:
    return getattr(type(v), "_is_non_tensor", False)


def _unwrap(v: Any) -> Any:
    if getattr(type(v), "_is_non_tensor", False):
        return v.tolist() if getattr(type(v), "_is_stack", False) else v.data
    return v


def _is_lazy(*tds: Any) -> bool:
    return any(getattr(type(t), "_is_lazy", False) for t in tds)


def _identity(x: Any) -> Any:
    return x


def _any_device_not(td: TensorDictBase, dev: str) -> bool:
    return any(t.device.type != dev for t in td._tensor_leaves())


def _check_first(fn: Callable, check: Callable[[], Any]) -> Callable:
    """``fn``, running ``check()`` once, just before its first call."""
    pending = [True]

    def wrapped(*args: Any) -> Any:
        if pending:
            check()
            pending.clear()
        return fn(*args)

    return wrapped


def _scalar_fits(dtype: torch.dtype, other: numbers.Number) -> bool:
    """Whether ``leaf <op> other`` for a Python scalar can be written into ``dtype``."""
    kind = type(other)
    if kind is float:
        return dtype.is_floating_point or dtype.is_complex
    if kind is bool:
        return True
    if kind is int:
        return dtype is not torch.bool
    if isinstance(other, numbers.Integral):
        return dtype is not torch.bool
    if isinstance(other, numbers.Real):
        return dtype.is_floating_point or dtype.is_complex
    return dtype.is_complex


def _check_result_dtypes(leaves: list[Tensor], other: Any) -> None:
    scalar = isinstance(other, numbers.Number)
    seen: set = set()
    for x in leaves:
        if x.dtype in seen:
            continue
        seen.add(x.dtype)
        if scalar and _scalar_fits(x.dtype, other):
            continue
        res = torch.result_type(x, other)
        if not torch.can_cast(res, x.dtype):
            raise RuntimeError(
                f"cannot write a {res} result into a {x.dtype} leaf in place (shape {list(x.shape)})"
            )


def _check_float_leaves(td: TensorDictBase, what: str) -> None:
    for x in td._tensor_leaves():
        if not (x.is_floating_point() or x.is_complex()):
            raise RuntimeError(
                f"{what} gives floats and can't write them into a {x.dtype} leaf in place "
                f"(shape {list(x.shape)})"
            )


def _checked_leaves(td: TensorDictBase, dst: list[Tensor], other: TensorDictBase) -> list[Tensor]:
    """``_matching_leaves`` after checking every pair can be written in place.

    ``_foreach_*_`` kernels write leaf by leaf, so a bad shape or dtype half-way would
    leave the container partly updated; this check runs before the first write.
    """
    src = _matching_leaves(td, other)
    for d, o in zip(dst, src):
        if d.shape != o.shape:
            _check_broadcast(o.shape, d.shape, "<a leaf>")
        if d.dtype != o.dtype and not torch.can_cast(torch.result_type(d, o), d.dtype):
            raise RuntimeError(
                f"cannot write a {o.dtype} result into a {d.dtype} leaf in place (shape {list(d.shape)})"
            )
    return src


def _matching_leaves(td: TensorDictBase, other: TensorDictBase) -> list[Tensor]:
    """Leaves of ``other`` in the order of ``td._tensor_leaves()`` (keys must match)."""
    if _is_lazy(td):  # a lazy stack's leaves are its members' leaves
        return td._matching_leaves(other)
    out = []
    for key in td._keys_str():
        v = td._get_str(key, NO_DEFAULT)
        o = other._get_str(key, None)
        if o is None:
            raise missing_key_error(key, other._keys_str())
        if isinstance(v, Tensor):
            out.append(o)
        elif _is_branch(v):
            out.extend(_matching_leaves(v, o))
    return out


def _check_broadcast(src: Sequence[int], dst: Sequence[int], key: Any) -> None:
    if len(src) > len(dst) or any(
        s != d and s != 1 for s, d in zip(reversed(src), reversed(dst))
    ):
        raise ValueError(
            f"cannot write a value of shape {list(src)} into entry {key!r} of shape {list(dst)}"
        )


def _maybe_inplace(td: Any, result: Any, inplace: bool, name: str) -> Any:
    """``result``, or (``inplace``) ``td`` given ``result``'s entries and batch size."""
    if not inplace:
        return result
    from .td import TensorDict

    if not isinstance(td, TensorDict) or not isinstance(result, TensorDict):
        raise NotImplementedError(f"{name}(inplace=True) replaces the entries of a TensorDict; a "
                                  f"{type(td).__name__} cannot, call to_tensordict() first (or drop inplace)")
    if td.is_locked:
        raise RuntimeError(f"{name}(inplace=True): the TensorDict is locked (unlock_() it first)")
    td._tensordict = dict(result._tensordict)
    td._batch_size = result._batch_size
    td._names = result._names
    return td


def _rename(td: Any, key_transform: Callable | None, reduce: bool) -> Any:
    """``td`` with every key, at every level, passed through ``key_transform``."""
    if key_transform is None or reduce:
        return td
    out = td._new_empty(td.batch_size)
    for k in td._keys_str():
        v = td._get_str(k, NO_DEFAULT)
        if _is_branch(v) and not _is_non_tensor(v):
            v = _rename(v, key_transform, False)
        out._set_str(key_transform(k), v, False, True)
    return out


def _update_source(src: Any, keys_to_update: Sequence[NestedKey] | None, clone: bool) -> Any:
    """The input of ``update_``/``update_at_`` as a container, restricted to ``keys_to_update``
    (keys the input lacks are skipped) and cloned if asked."""
    if not is_tensor_collection(src):
        src = _dict_view(src)
    if keys_to_update is not None:
        src = src.select(*keys_to_update, strict=False)
    return src.clone() if clone else src


def _dict_view(d: Mapping) -> Any:
    from .td import TensorDict

    return TensorDict._from_dict_nocheck(d)


def _with_batch(td: Any, batch_size: torch.Size) -> Any:
    """``td`` (a fresh dict view) with ``batch_size`` when its leaves allow it, else as is."""
    if batch_size and not td.batch_size:
        try:
            td.batch_size = batch_size
        except (RuntimeError, ValueError):
            pass
    return td


def _missing_keys(dst: Any, src: Any) -> bool:
    """True when ``src`` (a container written into ``dst``) brings a key ``dst`` lacks."""
    if _is_non_tensor(src) or not _is_branch(dst) or _is_non_tensor(dst):
        return False
    keys = dst._keys_str()
    for key in src._keys_str():
        if key not in keys:
            return True
        s = src._get_str(key, NO_DEFAULT)
        if _is_branch(s) and not _is_non_tensor(s) and _missing_keys(dst._get_str(key, NO_DEFAULT), s):
            return True
    return False


def _preallocate(dst: Any, src: Any) -> list | None:
    """Creates, in ``dst``, every entry of ``src`` that ``dst`` lacks, before an indexed write.

    ``td[index] = src`` with new keys gives each new leaf the shape ``batch + feature``
    (zeros of the source's dtype), where ``batch`` is the batch size of ``dst`` and
    ``feature`` the leaf's shape past the source's batch dims; a new sub-container gets
    the source's extra batch dims likewise. Non-tensor values are set for the whole
    batch (a per-element stack starts as ``None``). Every member of a lazy stack gets the
    new entries. Returns the ``(parent, key)`` pairs created (for
    :func:`_undo_preallocate`); None when nothing was missing (the common case costs one
    walk over the keys).
    """
    if not _missing_keys(dst, src):
        return None
    added: list = []
    try:
        _allocate_into(dst, src, dst.batch_size, len(src.batch_size), dst.device, added)
    except BaseException:
        _undo_preallocate(added)
        raise
    return added


def _allocate_into(dst: Any, src: Any, rbs: torch.Size, sbd: int, device: Any, added: list) -> None:
    keys = dst._keys_str()  # of a lazy stack: the keys every member holds
    for key in src._keys_str():
        s = src._get_str(key, NO_DEFAULT)
        branch = _is_branch(s) and not _is_non_tensor(s)
        if key in keys:
            if branch:
                d = dst._get_str(key, NO_DEFAULT)
                if _missing_keys(d, s):
                    _allocate_into(d, s, rbs, sbd, device, added)
            continue
        new = _zeros_entry(key, s, rbs, sbd, device)
        if _is_lazy(dst) and any(key in m._keys_str() for m in dst.tensordicts):
            # some members hold the key already: only the others get their piece of zeros
            for m, piece in zip(dst.tensordicts, dst._split_value(key, new)):
                if key not in m._keys_str():
                    m._set_str(key, piece, False, False)
                    added.append((m, key))
        else:
            dst._set_str(key, new, False, False)
            added.append((dst, key))
        if branch:
            _allocate_into(dst._get_str(key, NO_DEFAULT), s, rbs, sbd, device, added)


def _zeros_entry(key: str, s: Any, rbs: torch.Size, sbd: int, device: Any) -> Any:
    """The empty entry a missing ``key`` gets: zeros, an empty container, or a non-tensor."""
    if isinstance(s, Tensor):
        return torch.zeros(rbs + s.shape[sbd:], dtype=s.dtype, device=device if device is not None else s.device)
    if _is_non_tensor(s):
        from .nontensor import NonTensorData, NonTensorStack

        if getattr(type(s), "_is_stack", False):
            import numpy as np

            return NonTensorStack(np.empty(tuple(rbs), dtype=object), device=device)
        return NonTensorData(s.data, batch_size=rbs, device=device)
    if is_tensor_collection(s):
        from .td import TensorDict

        return TensorDict._new_unsafe({}, rbs + s.batch_size[sbd:], device, None)
    raise TypeError(f"cannot preallocate key {key!r} from a {type(s).__name__}")


def _undo_preallocate(added: list | None) -> None:
    if added:
        for parent, key in reversed(added):
            try:
                parent._del_str(key)
            except (KeyError, RuntimeError):
                pass


def _collect_write_pairs(
    dst: Any, src: Any, pairs: list, prefix: tuple, new_bs: torch.Size, bd: int
) -> None:
    """Validates ``dst[index] <- src`` for every leaf and lists (dst_leaf, src_value) pairs.

    ``new_bs`` is the batch shape that the index selects and ``bd`` the number of batch
    dims of the root container. Nothing is written here, so a failed validation leaves
    ``dst`` unchanged.
    """
    if _is_lazy(dst):  # a lazy stack plans (and validates) its own write in _write_pairs
        pairs.append((dst, src))
        return
    if not is_tensor_collection(src):
        # one tensor or scalar written into every leaf
        leaves = _write_targets(dst) if _is_branch(dst) else [dst]
        for t in leaves:
            if _is_lazy(t):
                pairs.append((t, src))
                continue
            expected = new_bs + t.shape[bd:]
            if isinstance(src, Tensor):
                val = src
                if src.ndim and src.ndim <= len(new_bs) and src.shape == new_bs[: src.ndim]:
                    val = expand_right(src, expected)
                _check_broadcast(val.shape, expected, prefix or "<every leaf>")
                pairs.append((t, val))
            else:
                pairs.append((t, src))
        return
    for key in src._keys_str():
        s = src._get_str(key, NO_DEFAULT)
        d = dst._get_str(key, None)
        full = prefix + (key,)
        name = full if len(full) > 1 else key
        if d is None:
            raise KeyError(
                f"key {name!r} is not in the destination; an in-place write can only "
                f"update existing entries (existing: {sorted(dst._keys_str())})"
            )
        if isinstance(d, Tensor):
            if _is_branch(s):
                raise ValueError(f"entry {name!r} is a tensor in the destination but a container in the source")
            if not isinstance(s, Tensor):
                s = torch.as_tensor(s)
            _check_broadcast(s.shape, new_bs + d.shape[bd:], name)
            pairs.append((d, s))
        elif _is_non_tensor(d):
            pairs.append((d, s))
        else:
            _collect_write_pairs(d, s, pairs, full, new_bs, bd)


def _whole(index: Any) -> bool:
    """True for the empty index ``()`` that stands for "the whole batch"."""
    return type(index) is tuple and not index


def _write_targets(td: Any) -> list:
    """The tensor leaves of ``td``, with nested lazy stacks kept whole."""
    out: list = []
    for key in td._keys_str():
        v = td._get_str(key, NO_DEFAULT)
        if isinstance(v, Tensor) or _is_lazy(v):
            out.append(v)
        elif _is_branch(v):
            out.extend(_write_targets(v))
    return out


def _write_pairs(pairs: list, index: Any) -> None:
    if any(_is_lazy(dst) for dst, _ in pairs):  # lazy targets are validated before any write
        from .lazy import _write_pairs_lazy

        _write_pairs_lazy(pairs, index)
        return
    for dst, src in pairs:
        if isinstance(dst, Tensor):
            if _whole(index):
                dst.copy_(src)
            else:
                dst[index] = src
        else:
            dst._assign_at(index, src)


def _check_mask(td: TensorDictBase, mask: Tensor) -> None:
    if mask.dtype is not torch.bool:
        raise TypeError(f"mask must be a bool tensor, got {mask.dtype}")
    if mask.shape != td.batch_size[: mask.ndim]:
        raise ValueError(
            f"mask shape {list(mask.shape)} does not match the leading batch dims {list(td.batch_size)}"
        )


def expanded_batch_size(bs: torch.Size, shape: tuple) -> torch.Size:
    """The batch size ``expand(*shape)`` gives (new leading dims allowed, -1 keeps a dim)."""
    shape = list(_shape_args(shape))
    bd = len(bs)
    if len(shape) < bd:
        raise RuntimeError(f"cannot expand batch {list(bs)} to fewer dims {shape}")
    offset = len(shape) - bd
    for i, s in enumerate(bs):
        if shape[offset + i] == -1:
            shape[offset + i] = s
        elif s != 1 and shape[offset + i] != s:
            raise RuntimeError(f"cannot expand batch {list(bs)} to {shape}")
    return torch.Size(shape)


def _reduced_size(bs: torch.Size, dims: tuple[int, ...], keepdim: bool) -> torch.Size:
    """The batch size after reducing over batch dims ``dims``."""
    if keepdim:
        return torch.Size([1 if i in dims else s for i, s in enumerate(bs)])
    if len(bs) == 1 and dims == (0,):  # the only batch dim reduced
        return torch.Size(())
    return torch.Size([s for i, s in enumerate(bs) if i not in dims])


def _shape_args(shape: tuple) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (list, tuple, torch.Size)):
        return tuple(shape[0])
    return tuple(shape)


def _reduce_all(name: str, leaves: list[Tensor], dims: tuple[int, ...] | None = None,
                batch_dims: int = 0, keepdim: bool = False, **kw: Any) -> Tensor:
    """Reduces all leaves together into one tensor (``reduce=True``).

    The batch dims in ``dims`` (all of them if ``None``), every feature dim and all the
    leaves are reduced together; the other batch dims are kept (as size 1 too with
    ``keepdim``). Leaves may have any feature shape.
    """
    float_op = name in ("mean", "std", "var", "norm", "nanmean")
    kept = [] if dims is None else [d for d in range(batch_dims) if d not in dims]

    def prep(x: Tensor) -> Tensor:
        if float_op and not (x.is_floating_point() or x.is_complex()):
            x = x.to(torch.get_default_dtype())
        if not kept:
            return x.reshape(-1)
        x = x.movedim(kept, list(range(len(kept))))
        return x.reshape(*x.shape[: len(kept)], -1)

    flat = torch.cat([prep(x) for x in leaves], -1)
    if name in ("max", "min"):
        out = flat.amax(dim=-1) if name == "max" else flat.amin(dim=-1)
    elif name == "norm":
        out = torch.linalg.vector_norm(flat, kw.get("ord", 2), dim=-1)
    else:
        out = getattr(torch, name)(flat, dim=-1, **kw)
    if keepdim and leaves:
        sizes = leaves[0].shape[:batch_dims]
        out = out.reshape([1 if dims is None or i in dims else s for i, s in enumerate(sizes)])
    return out


def _unflatten_state_dict(sd: dict) -> dict:
    out: dict = {}
    for k, v in sd.items():
        parts = k.split(".")
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = v
    return out


def _sorted_keys(td: Any, opts: dict) -> list:
    keys = list(td._keys_str())
    return sorted(keys) if opts["sort_keys"] == "alphabetical" else keys


def _tensor_desc(v: Tensor, opts: dict) -> str:
    parts = []
    if opts["show_shape"]:
        parts.append(f"shape={v.shape}")
    if opts["show_field_device"]:
        parts.append(f"device={v.device}")
    if opts["show_dtype"]:
        parts.append(f"dtype={v.dtype}")
    if opts["show_field_is_shared"]:
        parts.append(f"is_shared={v.is_shared()}")
    if opts["show_grad"]:
        parts.append(f"requires_grad={v.requires_grad}")
    if opts["show_is_contiguous"]:
        parts.append(f"is_contiguous={v.is_contiguous()}")
    if opts["show_is_view"]:
        parts.append(f"is_view={v._base is not None}")
    if opts["show_storage_size"]:
        parts.append(f"storage_size={v.untyped_storage().nbytes()}")
    return f"Tensor({', '.join(parts)})"


def _fields_repr(td: TensorDictBase, indent: int) -> str:
    opts = _PRINT_OPTIONS
    pad = " " * indent
    lines = []
    for key in _sorted_keys(td, opts):
        v = td._get_str(key, NO_DEFAULT)
        if isinstance(v, Tensor):
            desc = _tensor_desc(v, opts)
        elif _is_non_tensor(v):
            desc = repr(v)
        else:
            inner = _fields_repr(v, indent + 8)
            desc = (f"{type(v).__name__}(\n{pad}    fields={{{inner}}},\n{pad}    "
                    f"batch_size={v.batch_size},\n{pad}    device={v.device})")
        lines.append(f"\n{pad}{key}: {desc}")
    return ",".join(lines) + (f"\n{' ' * (indent - 4)}" if lines else "")


_SHORT_DTYPES = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
                 torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
                 torch.uint8: "u8", torch.bool: "bool", torch.complex64: "c64", torch.complex128: "c128"}


def _compact_fields(td: Any, bd: int, opts: dict) -> str:
    parts = []
    for key in _sorted_keys(td, opts):
        v = td._get_str(key, NO_DEFAULT)
        if isinstance(v, Tensor):
            feat = ",".join(str(d) for d in v.shape[bd:])
            parts.append(f"{key}: {_SHORT_DTYPES.get(v.dtype, str(v.dtype).replace('torch.', ''))}[{feat}]")
        elif _is_non_tensor(v):
            data = getattr(v, "data", None)
            parts.append(f"{key}: {type(data).__name__ if not getattr(type(v), '_is_stack', False) else 'stack'}")
        else:
            parts.append(f"{key}: {{{_compact_fields(v, bd, opts)}}}")
    return ", ".join(parts)


def _compact_repr(td: Any, head: str, opts: dict) -> str:
    """``TensorDict(batch_size=[3], fields={a: f32[2]})``: dtype and feature dims per entry."""
    out = f"{head}("
    if opts["show_batch_size"]:
        out += f"batch_size={list(td.batch_size)}, "
    if opts["show_device"] and td.device is not None:
        out += f"device={td.device}, "
    return out + f"fields={{{_compact_fields(td, td.batch_dims, opts)}}})"
