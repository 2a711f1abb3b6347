"""``LazyStackedTensorDict``: a stack of containers that is never materialised.

A lazy stack keeps a list of member containers (``.tensordicts``) and the batch dim
they are stacked along (``.stack_dim``). Members share one batch size but their leaves
may differ in shape (ragged trajectories) and even their key sets may differ
(heterogeneous agents). Reading an entry stacks the members' entries on demand;
writing unbinds the value along the stack dim and writes each slice into its member,
so writes always reach the members.

What stays lazy and what densifies:

* Lazy (member-wise, no copy of the leaves): indexing that can be split into "which
  members" and "what index inside each member" (ints, slices, one long tensor or one
  1-d bool mask along the stack dim, one tensor index elsewhere), ``unsqueeze``,
  ``squeeze``, ``permute``/``transpose``, ``expand``, ``reshape``/``view`` when the
  stack dim is left alone, ``unbind``, ``split``/``chunk``, ``flip``, leafwise ops
  (``apply``, arithmetic, ``clone``, ``to`` ...), reductions over other dims,
  ``select``/``exclude``/``update``/``set``, ``torch.cat`` (see :func:`lazy_cat`).
* Dense (a :class:`TensorDict` is returned): any other batch-changing op (a reshape
  that merges the stack dim, ``roll``, ``narrow``, ``repeat``, ``gather``, ``pad``,
  indexing that mixes several tensor indices with the stack dim, reductions over the
  stack dim) when every member has the same keys and leaf shapes.
* Ragged/heterogeneous stacks: index-moving ops that can't stay lazy gather the batch
  elements they select into new (nested) lazy stacks; ops that need a dense leaf
  (reductions over the stack dim, ``to_tensordict``) raise an error naming the key
  and suggesting :meth:`LazyStackedTensorDict.densify` with ``layout=torch.jagged``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ._utils import (
    NO_DEFAULT,
    NestedKey,
    as_size,
    expand_right,
    indexed_batch_size,
    missing_key_error,
    unravel_key,
)
from .base import (
    TensorDictBase,
    _check_mask,
    _collect_write_pairs,
    _dims_tuple,
    _is_branch,
    _is_non_tensor,
    _reduced_size,
    _shape_args,
    _whole,
    expanded_batch_size,
    is_tensor_collection,
)
from .indexing import INT, MASK, SLICE, TENSOR, as_index, on_cpu, plan_index
from .td import TensorDict

__all__ = ["LazyStackedTensorDict", "lazy_stack", "lazy_cat", "RaggedStackError"]


class RaggedStackError(RuntimeError):
    """An entry of a lazy stack can't be read as one dense tensor: member shapes differ."""


def _is_lazy_td(x: Any) -> bool:
    return getattr(type(x), "_is_lazy", False)


def _ragged_error(key: Any, shapes: list, op: str | None = None) -> RaggedStackError:
    shown = [list(s) for s in shapes[:6]] + (["..."] if len(shapes) > 6 else [])
    what = f"{op}: " if op else ""
    return RaggedStackError(
        f"{what}cannot stack entry {key!r} of the lazy stack into one tensor: the members' "
        f"shapes differ ({shown}). Use td.densify(layout=torch.jagged) or "
        f"td.get_nestedtensor({key!r}) for a nested tensor, or index the stack (td[i]) to "
        "reach one member's entry"
    )


class _MemberSplit(NamedTuple):
    """An index over a lazy stack, as what it does to the member list and to each member."""

    members: list[int]
    """The members it keeps, in output order."""
    stack_dim: int | None
    """The output dim they are stacked along; None when an int picked one member."""
    member_index: Any
    """The index applied to each member (``()``: the whole member)."""


class LazyStackedTensorDict(TensorDictBase):
    """A stack of containers along ``stack_dim``, kept as a list of members.

    Args:
        *tensordicts: the members; they must share their batch size (their leaf
            shapes and key sets may differ).
        stack_dim: the batch dim along which the members are stacked.
        batch_size: only needed for an empty stack (no members).
        device: if given, members on another device are moved there.

    ``batch_size`` is the members' batch size with ``len(tensordicts)`` inserted at
    ``stack_dim``. ``keys()`` lists the keys every member has; reading a key stacks the
    members' entries (a ragged key raises, see :meth:`densify`); ``td[i]`` along the stack
    dim returns the member itself.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict, lazy_stack
        >>> a = TensorDict({"obs": torch.zeros(3, 2), "r": torch.zeros(3)}, [3])
        >>> b = TensorDict({"obs": torch.ones(3, 2), "r": torch.ones(3)}, [3])
        >>> td = lazy_stack([a, b], 0)
        >>> td.batch_size
        torch.Size([2, 3])
        >>> td[1] is b
        True
        >>> td["obs"].shape
        torch.Size([2, 3, 2])
    """

    _is_lazy = True
    __slots__ = ("tensordicts", "_stack_dim", "_batch_size", "_member_bs", "_locked", "_device_hint",
                 "_stack_name", "__weakref__")

    def __init__(
        self,
        *tensordicts: TensorDictBase,
        stack_dim: int = 0,
        batch_size: Any = None,
        device: Any = None,
        names: Any = None,
        stack_dim_name: str | None = None,
        strict_shape: bool = False,
        hook_out: Any = None,
        hook_in: Any = None,
    ) -> None:
        # strict_shape: members must always share their batch size here (True or False);
        # hook_in/hook_out (deprecated in tensordict 0.15, no replacement) are refused
        if hook_in is not None or hook_out is not None:
            raise ValueError("LazyStackedTensorDict: hook_in/hook_out (tensordict's deprecated vmap hooks) "
                             "are not supported")
        if len(tensordicts) == 1 and isinstance(tensordicts[0], (list, tuple)):
            tensordicts = tuple(tensordicts[0])
        members = list(tensordicts)
        for i, td in enumerate(members):
            if not isinstance(td, TensorDictBase) or _is_non_tensor(td):
                raise TypeError(
                    f"LazyStackedTensorDict members must be TensorDicts (or lazy stacks); member {i} "
                    f"is a {type(td).__name__}"
                )
        if members:
            mbs = members[0].batch_size
            for i, td in enumerate(members[1:], 1):
                if td.batch_size != mbs:
                    raise ValueError(
                        f"cannot lazily stack containers with different batch sizes: member 0 has "
                        f"{list(mbs)} and member {i} has {list(td.batch_size)}. Members must share "
                        "their batch size (their leaf shapes and keys may differ)"
                    )
            nd = len(mbs) + 1
        else:
            if batch_size is None:
                raise ValueError("an empty LazyStackedTensorDict needs batch_size= (it has no member)")
            full = as_size(batch_size)
            nd = len(full)
            if nd == 0:
                raise ValueError("a lazy stack has at least one batch dim (the stack dim)")
        if not -nd <= stack_dim < nd:
            raise IndexError(f"stack_dim={stack_dim} is out of range for a stack with {nd} batch dims")
        sd = stack_dim % nd
        if not members:
            if full[sd] != 0:
                raise ValueError(f"batch_size {list(full)} has {full[sd]} elements along the stack dim "
                                 "but no member was given")
            mbs = full[:sd] + full[sd + 1 :]
        if device is not None:
            dev = torch.device(device)
            members = [m if m.device == dev else m.to(dev) for m in members]
        else:
            dev = None
        self.tensordicts = members
        self._stack_dim = sd
        self._member_bs = mbs
        self._locked = False
        self._device_hint = dev
        self._stack_name = None
        self._refresh()
        if batch_size is not None and as_size(batch_size) != self._batch_size:
            raise ValueError(
                f"batch_size={list(as_size(batch_size))} does not match the members: stacking "
                f"{len(members)} members of batch {list(mbs)} along dim {sd} gives {list(self._batch_size)}"
            )
        if names is not None:
            self.names = names
        if stack_dim_name is not None:
            self._stack_name = stack_dim_name

    @classmethod
    def _new_from(cls, members: Sequence, stack_dim: int, batch_size: Any = None,
                  device: Any = None) -> LazyStackedTensorDict:
        """Builds a stack from members known to be valid (no checks)."""
        self = cls.__new__(cls)
        self.tensordicts = list(members)
        self._stack_dim = stack_dim
        self._locked = False
        self._device_hint = device
        self._stack_name = None
        if self.tensordicts:
            self._member_bs = self.tensordicts[0].batch_size
        else:
            bs = as_size(batch_size)
            self._member_bs = bs[:stack_dim] + bs[stack_dim + 1 :]
        self._refresh()
        return self

    def _like(self, members: Sequence, stack_dim: int, batch_size: Any = None) -> LazyStackedTensorDict:
        """A new stack that keeps this one's device and stack-dim name."""
        out = LazyStackedTensorDict._new_from(members, stack_dim, batch_size, self.device)
        out._stack_name = self._stack_name
        return out

    @classmethod
    def lazy_stack(cls, items: Sequence[TensorDictBase], dim: int = 0) -> LazyStackedTensorDict:
        return lazy_stack(items, dim)

    def _refresh(self) -> None:
        mbs = self._member_bs
        sd = self._stack_dim
        n = len(self.tensordicts)
        self._batch_size = torch.Size((*mbs[:sd], n, *mbs[sd:]) if sd else (n, *mbs))

    # ------------------------------------------------------------------ properties
    @property
    def stack_dim(self) -> int:
        return self._stack_dim

    @property
    def batch_size(self) -> torch.Size:
        return self._batch_size

    @batch_size.setter
    def batch_size(self, new: Any) -> None:
        new = as_size(new)
        if new == self._batch_size:
            return
        sd = self._stack_dim
        n = len(self.tensordicts)
        if len(new) <= sd or new[sd] != n:
            raise ValueError(
                f"cannot set the batch_size of a lazy stack to {list(new)}: dim {sd} (the stack dim) "
                f"must keep its size {n}"
            )
        mbs = new[:sd] + new[sd + 1 :]
        done = []
        try:
            for m in self.tensordicts:
                old = m.batch_size
                m.batch_size = mbs
                done.append((m, old))
        except (ValueError, RuntimeError) as err:
            for m, old in done:
                m.batch_size = old
            raise ValueError(f"cannot set the batch_size of the lazy stack to {list(new)}: {err}") from err
        self._member_bs = mbs
        self._refresh()

    @property
    def device(self) -> torch.device | None:
        ms = self.tensordicts
        if not ms:
            return self._device_hint
        dev = ms[0].device
        if dev is None:
            return None
        for m in ms[1:]:
            if m.device != dev:
                return None
        return dev

    @property
    def names(self) -> list:
        ms = self.tensordicts
        mn = list(ms[0].names) if ms else [None] * len(self._member_bs)
        sd = self._stack_dim
        return mn[:sd] + [self._stack_name] + mn[sd:]

    @names.setter
    def names(self, value: Any) -> None:
        """Names the batch dims: the stack dim's name is kept here, the others go to the members."""
        if value is None:
            self._stack_name = None
            for m in self.tensordicts:
                m.names = None
            return
        value = list(value)
        nd = len(self._batch_size)
        if len(value) != nd:
            raise ValueError(f"got {len(value)} names for a batch of {nd} dims: {value}")
        named = [n for n in value if n is not None]
        if len(set(named)) != len(named):
            raise ValueError(f"batch dim names must be unique, got {value}")
        sd = self._stack_dim
        rest = value[:sd] + value[sd + 1 :]
        for m in self.tensordicts:
            m.names = rest
        self._stack_name = value[sd]

    # ------------------------------------------------------------------ keys
    def _keys_str(self) -> list:
        ms = self.tensordicts
        if not ms:
            return []
        first = ms[0]._keys_str()
        if len(ms) == 1:
            return list(first)
        sets = []
        for m in ms[1:]:
            ks = m._keys_str()
            sets.append(ks if isinstance(ks, AbstractSet) else set(ks))
        return [k for k in first if all(k in s for s in sets)]

    def exclusive_keys(self) -> list[list[str]]:
        """For each member, its top-level keys that some other member lacks."""
        common = set(self._keys_str())
        return [[k for k in m._keys_str() if k not in common] for m in self.tensordicts]

    def _collect_keys(self, out, prefix, include_nested, leaves_only, is_leaf):
        ms = self.tensordicts
        if not ms:
            return
        for key in self._keys_str():
            v0 = _peek(ms[0], key)
            full = prefix + (key,) if prefix else key
            branch = _is_branch(v0)
            if is_leaf is None:
                sub = branch
            else:
                sub = not is_leaf(LazyStackedTensorDict if branch else type(v0))
            if not sub or not leaves_only:
                out.append(full)
            if sub and include_nested and branch:
                self._get_str(key, NO_DEFAULT)._collect_keys(
                    out, full if type(full) is tuple else (full,), include_nested, leaves_only, is_leaf
                )

    def __contains__(self, key: Any) -> bool:
        if type(key) is str or isinstance(key, tuple):
            ms = self.tensordicts
            return bool(ms) and all(key in m for m in ms)
        raise TypeError(
            "`key in td` takes a string or a tuple of strings; to check for a value use "
            "(td == value).any()"
        )

    def non_tensor_items(self, include_nested: bool = False) -> list:
        if not self.tensordicts:
            return []
        first = self.tensordicts[0]
        out = []
        for k in self.keys(include_nested, True):
            if _is_non_tensor(_peek_nested(first, k)):
                out.append((k, self.get(k)))
        return out

    def is_empty(self) -> bool:
        """True if no member holds a leaf."""
        return all(m.is_empty() for m in self.tensordicts)

    # ------------------------------------------------------------------ get
    def _missing(self, key: Any, missing: list[int]) -> KeyError:
        n = len(self.tensordicts)
        if len(missing) == n:
            return missing_key_error(key if type(key) is str else key, self._keys_str())
        present = [i for i in range(n) if i not in missing]
        return KeyError(
            f"key {key!r} is only in some members of the lazy stack: members {missing} lack it "
            f"(it is in {present}). keys() lists the keys every member has; index the stack "
            "(td[i]) to reach one member's own keys"
        )

    def _get_str(self, key: str, default: Any) -> Any:
        return self._gather(key, [m._get_str(key, None) for m in self.tensordicts], default)

    def get(self, key: NestedKey, default: Any = NO_DEFAULT) -> Any:
        if type(key) is not str:
            key = unravel_key(key)
        if type(key) is str:
            return self._get_str(key, default)
        return self._gather(key, [m.get(key, None) for m in self.tensordicts], default)

    def _gather(self, key: NestedKey, vals: list, default: Any) -> Any:
        """Stacks the members' values of ``key``; members lacking it give default or KeyError."""
        missing = [i for i, v in enumerate(vals) if v is None]
        if missing or not vals:
            if default is not NO_DEFAULT:
                return default
            raise self._missing(key, missing)
        return self._stack_values(key, vals)

    def _stack_values(self, key: Any, vals: list, op: str | None = None) -> Any:
        first = vals[0]
        sd = self._stack_dim
        if isinstance(first, Tensor):
            shape = first.shape
            for i, v in enumerate(vals):
                if not isinstance(v, Tensor):
                    raise TypeError(
                        f"entry {key!r} is a tensor in member 0 but a {type(v).__name__} in member {i}"
                    )
                if v.shape != shape:
                    raise _ragged_error(key, [x.shape for x in vals], op)
            return torch.stack(vals, sd)
        if _is_non_tensor(first):
            for i, v in enumerate(vals):
                if not _is_non_tensor(v):
                    raise TypeError(
                        f"entry {key!r} is non-tensor data in member 0 but a {type(v).__name__} in member {i}"
                    )
            return _stack_non_tensor(vals, sd)
        for i, v in enumerate(vals):
            if not _is_branch(v):
                raise TypeError(
                    f"entry {key!r} is a {type(first).__name__} in member 0 but a {type(v).__name__} "
                    f"in member {i}"
                )
        bs0 = first.batch_size
        for i, v in enumerate(vals):
            if v.batch_size != bs0:
                raise ValueError(
                    f"cannot stack the sub-containers at {key!r}: member 0's has batch_size "
                    f"{list(bs0)} and member {i}'s has {list(v.batch_size)}"
                )
        return self._like(vals, sd)

    def get_item_shape(self, key: NestedKey) -> torch.Size:
        """The shape of the stacked entry at ``key``, with -1 where the members differ."""
        vals = [m.get(key) if not _is_lazy_td(m) else None for m in self.tensordicts]
        shapes = []
        for m, v in zip(self.tensordicts, vals):
            if v is None:
                shapes.append(tuple(m.get_item_shape(key)))
            else:
                shapes.append(tuple(v.shape) if isinstance(v, Tensor) else tuple(v.batch_size))
        return _merge_shapes(shapes, self._stack_dim)

    def get_nestedtensor(self, key: NestedKey, default: Any = NO_DEFAULT, *,
                         layout: torch.layout = torch.jagged) -> Tensor:
        """The entry at ``key`` as a nested tensor (one component per member).

        Needs ``stack_dim=0``. ``layout=torch.jagged`` where the raggedness allows it
        (else a strided nested tensor is returned).
        """
        if self._stack_dim != 0:
            raise ValueError(
                f"get_nestedtensor needs stack_dim=0 (a nested tensor's components run along dim 0); "
                f"this stack has stack_dim={self._stack_dim}"
            )
        vals = []
        for i, m in enumerate(self.tensordicts):
            v = m.get(key, None)
            if v is None:
                if default is not NO_DEFAULT:
                    return default
                raise self._missing(key, [j for j, mm in enumerate(self.tensordicts) if key not in mm])
            if not isinstance(v, Tensor):
                raise TypeError(f"entry {key!r} of member {i} is a {type(v).__name__}, not a tensor")
            vals.append(v)
        return _nested(vals, layout, key)

    # ------------------------------------------------------------------ set / del
    def _split_value(self, key: Any, value: Any) -> list:
        """``value`` (shaped like the whole stack) cut into one piece per member."""
        ms = self.tensordicts
        n = len(ms)
        sd = self._stack_dim
        bs = self._batch_size
        if _is_lazy_td(value) and value.stack_dim == sd and len(value.tensordicts) == n and (
            value.batch_size[: len(bs)] == bs
        ):
            return list(value.tensordicts)
        if isinstance(value, Tensor):
            if value.is_nested:
                if sd != 0:
                    raise ValueError(f"a nested tensor can only be set into a lazy stack with stack_dim=0 "
                                     f"(key {key!r})")
                pieces = list(value.unbind(0))
                if len(pieces) != n:
                    raise ValueError(f"the nested tensor for {key!r} has {len(pieces)} components "
                                     f"but the stack has {n} members")
                mbs = self._member_bs
                for i, p in enumerate(pieces):
                    if p.shape[: len(mbs)] != mbs:
                        raise ValueError(
                            f"batch size mismatch for key {key!r}: component {i} has shape "
                            f"{list(p.shape)} but the members have batch_size {list(mbs)}"
                        )
                return pieces
            shape = value.shape
        elif is_tensor_collection(value):
            shape = value.batch_size
        else:
            raise TypeError(f"cannot set a {type(value).__name__} at {key!r}")
        if shape[: len(bs)] != bs:
            raise ValueError(
                f"batch size mismatch for key {key!r}: the lazy stack has batch_size {list(bs)} "
                f"but the value has shape {list(shape)}"
            )
        return list(value.unbind(sd))

    def _set_str(self, key: str, value: Any, inplace: bool, validated: bool) -> None:
        if type(key) is not str:
            raise TypeError(f"TensorDict keys must be strings, got {key!r} ({type(key).__name__})")
        ms = self.tensordicts
        pieces = self._split_value(key, value)
        # validate every member first so that a failure writes nothing
        for i, (m, p) in enumerate(zip(ms, pieces)):
            locked = m.is_locked
            if not (inplace or locked):
                continue
            if _is_lazy_td(m):
                present = key in m
                cur = None
            else:
                cur = m._get_str(key, None)
                present = cur is not None
            if not present and locked:
                raise RuntimeError(
                    f"cannot add key {key!r}: member {i} of the lazy stack is locked (unlock_() it first)"
                )
            if isinstance(cur, Tensor) and isinstance(p, Tensor) and cur.shape != p.shape:
                raise ValueError(
                    f"in-place set of {key!r}: member {i} holds shape {list(cur.shape)} but the value "
                    f"gives {list(p.shape)}"
                )
        for m, p in zip(ms, pieces):
            m._set_str(key, p, inplace, False)

    def _del_str(self, key: str) -> None:
        ms = self.tensordicts
        missing = [i for i, m in enumerate(ms) if m._get_str(key, None) is None] if not any(
            _is_lazy_td(m) for m in ms) else [i for i, m in enumerate(ms) if key not in m]
        if missing or not ms:
            raise self._missing(key, missing)
        if self.is_locked or any(m.is_locked for m in ms):
            raise RuntimeError(f"cannot delete key {key!r}: the lazy stack is locked (unlock_() it first)")
        for m in ms:
            m._del_str(key)

    def _get_or_create_parent(self, key: tuple[str, ...]) -> TensorDictBase:
        ms = self.tensordicts
        for i, m in enumerate(ms):
            node = m
            for k in key[:-1]:
                nxt = node.get(k, None) if not _is_lazy_td(node) else (node._get_str(k, None) if k in node else None)
                if nxt is None:
                    if node.is_locked:
                        raise RuntimeError(f"cannot set {key!r}: member {i} of the lazy stack is locked")
                    break
                if not _is_branch(nxt):
                    raise KeyError(f"cannot set {key!r}: {k!r} is a leaf in member {i}")
                node = nxt
        parents = [m._get_or_create_parent(key) for m in ms]
        if not parents:
            raise KeyError(f"cannot set {key!r} in a lazy stack without members")
        return self._stack_values(key[:-1] if len(key) > 2 else key[0], parents)

    def set_(self, key: NestedKey, item: Any, *, non_blocking: bool = False) -> LazyStackedTensorDict:
        """Copies ``item`` into the existing entry at ``key`` of every member (in place)."""
        key = unravel_key(key)
        if key not in self:
            raise self._missing(key, [i for i, m in enumerate(self.tensordicts) if key not in m])
        _write_pairs_lazy([(self, _one_key_source(key, item))], ())
        return self

    def set_at_(self, key: NestedKey, value: Any, index: Any, *, non_blocking: bool = False) -> LazyStackedTensorDict:
        from ._utils import normalize_index

        key = unravel_key(key)
        if key not in self:
            raise self._missing(key, [i for i, m in enumerate(self.tensordicts) if key not in m])
        _write_pairs_lazy([(self, _one_key_source(key, value))], normalize_index(index, self.batch_dims))
        return self

    def get_at(self, key: NestedKey, index: Any, default: Any = NO_DEFAULT) -> Any:
        if key not in self:
            if default is not NO_DEFAULT:
                return default
            return self.get(key)  # raises the right KeyError
        return self[index].get(key)

    def fill_(self, key: NestedKey, value: float | bool) -> LazyStackedTensorDict:
        key = unravel_key(key)
        if key not in self:
            raise self._missing(key, [i for i, m in enumerate(self.tensordicts) if key not in m])
        for m in self.tensordicts:
            m.fill_(key, value)
        return self

    def rename_key_(self, old_key: NestedKey, new_key: NestedKey, safe: bool = False) -> LazyStackedTensorDict:
        old_key, new_key = unravel_key(old_key), unravel_key(new_key)
        if old_key not in self:
            raise self._missing(old_key, [i for i, m in enumerate(self.tensordicts) if old_key not in m])
        if safe and any(new_key in m for m in self.tensordicts):
            raise KeyError(f"key {new_key!r} already exists; pass safe=False to overwrite it")
        if self.is_locked:
            raise RuntimeError("cannot rename keys of a locked TensorDict; unlock_() it first")
        for m in self.tensordicts:
            m.rename_key_(old_key, new_key, safe=safe)
        return self

    def update(self, input_dict_or_td: Any, clone: bool = False, inplace: bool = False, *,
               keys_to_update: Sequence[NestedKey] | None = None) -> LazyStackedTensorDict:
        """Sets every entry of the input into the members (the input is cut along the stack dim)."""
        ms = self.tensordicts
        pieces = self._split_source(input_dict_or_td)
        if self.is_locked or any(m.is_locked for m in ms):
            keys = input_dict_or_td.keys() if isinstance(input_dict_or_td, Mapping) else (
                input_dict_or_td._keys_str())
            for i, m in enumerate(ms):
                for k in keys:
                    if keys_to_update is not None and k not in keys_to_update:
                        continue
                    if k not in m and m.is_locked:
                        raise RuntimeError(
                            f"cannot add key {k!r}: member {i} of the lazy stack is locked (unlock_() it first)"
                        )
        for m, p in zip(ms, pieces):
            m.update(p, clone=clone, inplace=inplace, keys_to_update=keys_to_update)
        return self

    def _split_source(self, src: Any) -> list:
        """A container or dict shaped like the stack, cut into one piece per member."""
        n = len(self.tensordicts)
        bs = self._batch_size
        if is_tensor_collection(src) and not _is_non_tensor(src):
            if _is_lazy_td(src) and src.stack_dim == self._stack_dim and len(src.tensordicts) == n:
                if src.batch_size[: len(bs)] == bs:
                    return list(src.tensordicts)
            if src.batch_size[: len(bs)] == bs:
                return list(src.unbind(self._stack_dim))
            src = {k: src._get_str(k, NO_DEFAULT) for k in src._keys_str()}
        if not isinstance(src, Mapping):
            raise TypeError(f"expected a dict or a TensorDict, got {type(src).__name__}")
        out: list[dict] = [{} for _ in range(n)]
        for key, value in src.items():
            if isinstance(value, Mapping) and not is_tensor_collection(value):
                parts = self._split_source(value)
            else:
                if not isinstance(value, Tensor) and not is_tensor_collection(value):
                    value = self._prepare_value(key, value)
                parts = self._split_value(key, value)
            for o, p in zip(out, parts):
                o[key] = p
        return out

    def update_(self, input_dict_or_td: Any, clone: bool = False, *, non_blocking: bool = False,
                keys_to_update: Any = None) -> LazyStackedTensorDict:
        """Copies every entry of the input into the existing entries (validated before any write).

        ``keys_to_update``: only these keys; ``non_blocking``: the members are written one
        copy at a time, synchronously (the result is the same)."""
        src = input_dict_or_td
        if keys_to_update is not None or clone:
            from .base import _update_source

            src = _update_source(src, keys_to_update, clone)
        if isinstance(src, Mapping) and not is_tensor_collection(src):
            from .base import _dict_view

            src = _dict_view(src)
        _write_pairs_lazy([(self, src)], ())
        return self

    def _setitem_batch(self, index: Any, value: Any) -> None:
        from .base import _preallocate, _undo_preallocate

        # new keys are allocated in every member (zeros), so the stack stays homogeneous
        added = _preallocate(self, value) if is_tensor_collection(value) else None
        try:
            _write_pairs_lazy([(self, value)], index)
        except BaseException:
            _undo_preallocate(added)
            raise

    def _assign_at(self, index: Any, value: Any) -> None:
        _write_pairs_lazy([(self, value)], index)

    def _plan_assign(self, index: Any, value: Any) -> list:
        """Validates ``self[index] = value``; returns the writes, one group per member."""
        ms = self.tensordicts
        bs = self._batch_size
        sd = self._stack_dim
        if isinstance(value, Mapping) and not is_tensor_collection(value):
            from .base import _dict_view

            value = _dict_view(value)
        whole = type(index) is tuple and not index
        if whole:
            new_bs = bs
            split = _MemberSplit(list(range(len(ms))), sd, ())
        else:
            new_bs = indexed_batch_size(bs, index)
            split = self._split_index(index)
        plan = []
        if split is not None:
            out_sd, mi = split.stack_dim, split.member_index
            for p, i in enumerate(split.members):
                m = ms[i]
                piece = value if out_sd is None else _source_part(
                    value, new_bs, lambda t, d=out_sd, p=p: t.select(d, p if t.shape[d] != 1 else 0),
                    lambda c, d=out_sd, p=p: c[(slice(None),) * d + (p if c.batch_size[d] != 1 else 0,)],
                )
                mnb = m.batch_size if _whole(mi) else indexed_batch_size(m.batch_size, mi)
                pairs: list = []
                _collect_write_pairs(m, piece, pairs, (), mnb, m.batch_dims)
                plan.append((_prepare_pairs(pairs, mi), mi))
            return plan
        # advanced indexing that mixes the stack dim with other dims: element by element
        pos = torch.arange(math.prod(bs)).reshape(bs)[on_cpu(index)]
        flat = pos.reshape(-1)
        coords = torch.unravel_index(flat, bs)
        mid = coords[sd]
        mco = coords[:sd] + coords[sd + 1 :]
        nb = len(new_bs)
        for i in torch.unique(mid).tolist():
            rows = (mid == i).nonzero().squeeze(-1)
            m = ms[i]
            if m.batch_dims == 0:
                rows_idx: Any = int(rows[-1])  # one element: the last write wins, like torch
                mi = ()
            else:
                rows_idx = rows
                sub = tuple(c[rows] for c in mco)
                mi = sub[0] if len(sub) == 1 else sub

            def take(t, r=rows_idx):
                t = t.expand(new_bs + t.shape[nb:])
                t = t.reshape((-1,) + t.shape[nb:]) if nb else t.unsqueeze(0)
                return t[r]

            def take_c(c, r=rows_idx):
                c = c.expand(new_bs + c.batch_size[nb:]) if c.batch_size[:nb] != new_bs else c
                c = c.reshape((-1,) + tuple(c.batch_size[nb:])) if nb else c.unsqueeze(0)
                return c[r]

            piece = _source_part(value, new_bs, take, take_c)
            mnb = m.batch_size if _whole(mi) else indexed_batch_size(m.batch_size, mi)
            pairs = []
            _collect_write_pairs(m, piece, pairs, (), mnb, m.batch_dims)
            plan.append((_prepare_pairs(pairs, mi), mi))
        return plan

    # ------------------------------------------------------------------ indexing
    def _split_index(self, index: Any) -> _MemberSplit | None:
        """Splits a (normalized) index into the members it keeps and the index for each.

        None when the index can't be split: several tensor indices (their dims mix the
        members), or a tensor or mask of more than one dim over the stack dim.
        """
        if self._stack_dim == 0 and (type(index) is int or type(index) is slice):  # lazy[i]: no plan needed
            kind, item, out_dim, member_index = (INT if type(index) is int else SLICE), index, 0, ()
        else:
            plan = plan_index(index, len(self._batch_size))
            if plan.n_advanced > 1:
                return None
            step = plan.step_at(self._stack_dim)
            if (step.kind == TENSOR and step.item.ndim != 1) or (step.kind == MASK and step.n_in != 1):
                return None
            kind, item, out_dim = step.kind, step.item, step.out_dim
            member_index = as_index([s.item for s in plan.steps if s is not step])
        n = len(self.tensordicts)
        if kind == INT:
            if not -n <= item < n:
                raise IndexError(f"index {item} is out of range for the stack dim {self._stack_dim} of size {n}")
            return _MemberSplit([item % n], None, member_index)
        if kind == SLICE:
            ids = list(range(*item.indices(n)))
        elif kind == MASK:
            if item.shape[0] != n:
                raise IndexError(
                    f"the mask has {item.shape[0]} elements but the stack dim {self._stack_dim} has size {n}"
                )
            ids = item.nonzero().squeeze(-1).tolist()
        else:
            ids = item.tolist()
            for j, i in enumerate(ids):
                if not -n <= i < n:
                    raise IndexError(f"index {i} is out of range for the stack dim {self._stack_dim} of size {n}")
                ids[j] = i % n
        return _MemberSplit(ids, out_dim, member_index)

    def _index(self, index: Any) -> TensorDictBase:
        split = self._split_index(index)
        if split is None:
            return self._index_fallback(index)
        ms = self.tensordicts
        mi = split.member_index
        if split.stack_dim is None:  # an int picked one member
            m = ms[split.members[0]]
            return m if _whole(mi) else m._index(mi)
        parts = [ms[i] for i in split.members] if _whole(mi) else [ms[i]._index(mi) for i in split.members]
        if not parts:
            if not ms:
                return self._like([], split.stack_dim, indexed_batch_size(self._batch_size, index))
            # an empty selection keeps the structure: zero copies of the (common-keyed) first member
            first = ms[0].select(*self.keys())
            first = first if _whole(mi) else first._index(mi)
            return first.unsqueeze(split.stack_dim)[(slice(None),) * split.stack_dim + (slice(0, 0),)]
        return self._like(parts, split.stack_dim)

    def _index_fallback(self, index: Any) -> TensorDictBase:
        if self._dense_compatible():
            return self.to_tensordict()._index(index)
        pos = torch.arange(self.numel()).reshape(self._batch_size)[on_cpu(index)]
        return self._from_positions(pos)

    def _from_positions(self, pos: Tensor) -> TensorDictBase:
        """A container whose batch element at each place of ``pos`` is element ``pos`` of self.

        When the member of every output element depends on one output dim only, the
        result is a lazy stack along that dim; otherwise a nest of lazy stacks of single
        elements.
        """
        bs = self._batch_size
        sd = self._stack_dim
        ms = self.tensordicts
        S = pos.shape
        if pos.numel() == 0:
            q = next((i for i, s in enumerate(S) if s == 0), None)
            if q is None:
                raise RuntimeError("empty selection without an empty dim")  # pragma: no cover
            return LazyStackedTensorDict._new_from([], q, S, self.device)
        coords = torch.unravel_index(pos, bs)
        mid = coords[sd]
        mco = coords[:sd] + coords[sd + 1 :]
        for q in range(len(S)):
            m2 = mid.movedim(q, 0).reshape(S[q], -1)
            if bool((m2 == m2[:, :1]).all()):
                rest = S[:q] + S[q + 1 :]
                parts = [
                    _member_at(ms[i], tuple(c.select(q, j) for c in mco), rest)
                    for j, i in enumerate(m2[:, 0].tolist())
                ]
                return LazyStackedTensorDict._new_from(parts, q)
        flat_mid = mid.reshape(-1).tolist()
        flat_co = [c.reshape(-1).tolist() for c in mco]
        elems = [
            _member_at(ms[m], tuple(c[k] for c in flat_co), torch.Size(()))
            for k, m in enumerate(flat_mid)
        ]
        return _nest(elems, S)

    def _probe(self, fn: Callable, multi: bool = False) -> Any:
        """Runs an index-moving leaf function on batch positions to learn where elements go."""
        n = self.numel()
        base = torch.arange(n, dtype=torch.float64).reshape(self._batch_size) * 2 + 1
        try:
            r1 = fn(base)
            r2 = fn(base + 0.5)
        except Exception as err:
            raise RuntimeError(
                "this operation can't run on a ragged or heterogeneous lazy stack (it needs the "
                "stacked leaves); densify the stack or apply it member by member"
            ) from err
        r1s = list(r1) if multi else [r1]
        r2s = list(r2) if multi else [r2]
        out = []
        for a, b in zip(r1s, r2s):
            ok = isinstance(a, Tensor) and a.shape == b.shape and bool(((b - a) == 0.5).all())
            if ok:
                p = (a - 1) / 2
                ok = bool((p == p.round()).all()) and bool(((p >= 0) & (p < max(n, 1))).all())
            if not ok:
                raise RuntimeError(
                    "this operation creates new batch elements (e.g. padding), which a ragged or "
                    "heterogeneous lazy stack can't do; densify the stack or apply it to each member"
                )
            out.append(p.round().long())
        return out if multi else out[0]

    def _apply_batch(self, fn: Callable, batch_size: torch.Size, names: Any) -> TensorDictBase:
        if self._dense_compatible():
            return self.to_tensordict()._apply_batch(fn, batch_size, names)
        pos = self._probe(fn)
        if pos.shape != tuple(batch_size):
            raise RuntimeError(f"expected a batch of {list(batch_size)}, the operation gave {list(pos.shape)}")
        return self._from_positions(pos)

    def _split_batch(self, fn: Callable, batch_sizes: list) -> list:
        if self._dense_compatible():
            return self.to_tensordict()._split_batch(fn, batch_sizes)
        return [self._from_positions(p) for p in self._probe(fn, multi=True)]

    # ------------------------------------------------------------------ shape ops
    def _resolve_shape(self, shape: tuple) -> torch.Size:
        shape = _shape_args(shape)
        if -1 in shape:
            shape = list(shape)
            known = math.prod(s for s in shape if s != -1)
            shape[shape.index(-1)] = self.numel() // known if known else 0
        shape = torch.Size(shape)
        if math.prod(shape) != self.numel():
            raise RuntimeError(f"shape {list(shape)} is invalid for a batch of size {list(self.batch_size)}")
        return shape

    def _reshape_members(self, shape: torch.Size, how: str) -> LazyStackedTensorDict | None:
        bs = self._batch_size
        sd = self._stack_dim
        k = len(bs) - sd
        if len(shape) > sd and shape[: sd + 1] == bs[: sd + 1]:
            new_sd = sd
        elif len(shape) >= k and shape[len(shape) - k :] == bs[sd:]:
            new_sd = len(shape) - k
        else:
            return None
        mshape = shape[:new_sd] + shape[new_sd + 1 :]
        return self._like([getattr(m, how)(mshape) for m in self.tensordicts], new_sd, shape)

    def reshape(self, *shape: Any) -> TensorDictBase:
        """Stays lazy when the stack dim and every dim on one side of it are kept."""
        shape = self._resolve_shape(shape)
        if shape == self._batch_size:
            return self
        out = self._reshape_members(shape, "reshape")
        return out if out is not None else super().reshape(shape)

    def view(self, *shape: Any, dtype: torch.dtype | None = None) -> TensorDictBase:
        if dtype is not None and not shape:
            return super().view(dtype=dtype)
        shape = self._resolve_shape(shape)
        if shape == self._batch_size:
            return self
        out = self._reshape_members(shape, "view")
        if out is None:
            raise RuntimeError(
                f"view({list(shape)}) would merge or split the stack dim {self._stack_dim} of a lazy stack, "
                "whose members are separate storages, so it can't be a view; use reshape() (a copy) "
                "or to_tensordict().view()"
            )
        return out

    def unsqueeze(self, dim: int) -> LazyStackedTensorDict:
        bd = self.batch_dims
        if not -bd - 1 <= dim <= bd:
            raise IndexError(f"unsqueeze dim={dim} is out of range for a batch with {bd} dims")
        d = dim % (bd + 1) if dim < 0 else dim
        sd = self._stack_dim
        bs = self._batch_size
        new_bs = bs[:d] + (1,) + bs[d:]
        if d <= sd:
            return self._like([m.unsqueeze(d) for m in self.tensordicts], sd + 1, new_bs)
        return self._like([m.unsqueeze(d - 1) for m in self.tensordicts], sd, new_bs)

    def squeeze(self, dim: int | None = None) -> TensorDictBase:
        bs = self._batch_size
        bd = len(bs)
        if dim is None:
            dims = [i for i, s in enumerate(bs) if s == 1]
        else:
            dims = [d for d in _dims_tuple(dim, bd) if bs[d] == 1]
        if not dims:
            return self
        sd = self._stack_dim
        mdims = tuple(d - (d > sd) for d in dims if d != sd)
        if sd in dims:  # one member left: the result is that member
            m = self.tensordicts[0]
            return m.squeeze(mdims) if mdims else m
        new_sd = sd - sum(d < sd for d in dims)
        new_bs = torch.Size(s for i, s in enumerate(bs) if i not in dims)
        return self._like([m.squeeze(mdims) for m in self.tensordicts], new_sd, new_bs)

    def permute(self, *dims: Any) -> LazyStackedTensorDict:
        dims = _shape_args(dims)
        bd = self.batch_dims
        if len(dims) != bd or sorted(d % bd for d in dims) != list(range(bd)):
            raise ValueError(f"permute dims {list(dims)} do not match a batch of {bd} dims")
        dims = tuple(d % bd for d in dims)
        if dims == tuple(range(bd)):
            return self
        sd = self._stack_dim
        new_sd = dims.index(sd)
        mperm = [d - (d > sd) for d in dims if d != sd]
        bs = self._batch_size
        new_bs = torch.Size(bs[d] for d in dims)
        return self._like([m.permute(mperm) for m in self.tensordicts], new_sd, new_bs)

    def expand(self, *shape: Any) -> LazyStackedTensorDict:
        new_bs = expanded_batch_size(self._batch_size, shape)
        new_sd = len(new_bs) - len(self._batch_size) + self._stack_dim
        mshape = new_bs[:new_sd] + new_bs[new_sd + 1 :]
        ms = self.tensordicts
        k = new_bs[new_sd]
        if k != len(ms):
            one = ms[0].expand(mshape)
            members = [one] * k
        else:
            members = [m.expand(mshape) for m in ms]
        return self._like(members, new_sd, new_bs)

    def flip(self, dims: Any) -> LazyStackedTensorDict:
        dims = _dims_tuple(dims, self.batch_dims)
        sd = self._stack_dim
        mdims = tuple(d - (d > sd) for d in dims if d != sd)
        ms = self.tensordicts[::-1] if sd in dims else self.tensordicts
        return self._like([m.flip(mdims) if mdims else m for m in ms], sd, self._batch_size)

    def unbind(self, dim: int = 0) -> tuple[TensorDictBase, ...]:
        """Along the stack dim: the members themselves. Elsewhere: lazy stacks of member slices."""
        bs = self._batch_size
        d = _dims_tuple(dim, len(bs))[0]
        sd = self._stack_dim
        if d == sd:
            return tuple(self.tensordicts)
        md = d - (d > sd)
        new_sd = sd - (d < sd)
        new_bs = bs[:d] + bs[d + 1 :]
        parts = [m.unbind(md) for m in self.tensordicts]
        return tuple(self._like([p[i] for p in parts], new_sd, new_bs) for i in range(bs[d]))

    def split(self, split_size: int | Sequence[int], dim: int = 0) -> tuple[TensorDictBase, ...]:
        bs = self._batch_size
        d = _dims_tuple(dim, len(bs))[0]
        n = bs[d]
        if isinstance(split_size, int):
            if split_size <= 0:
                raise ValueError(f"split_size must be positive, got {split_size}")
            sizes = [min(split_size, n - i) for i in range(0, n, split_size)]
        else:
            sizes = list(split_size)
            if sum(sizes) != n:
                raise ValueError(f"split sizes {sizes} do not sum to the batch dim size {n}")
        sd = self._stack_dim
        ms = self.tensordicts
        if d == sd:
            out = []
            start = 0
            for s in sizes:
                out.append(self._like(ms[start : start + s], sd, bs[:sd] + (s,) + bs[sd + 1 :]))
                start += s
            return tuple(out)
        md = d - (d > sd)
        parts = [m.split(sizes, md) for m in ms]
        return tuple(self._like([p[i] for p in parts], sd, bs[:d] + (s,) + bs[d + 1 :])
                     for i, s in enumerate(sizes))

    def insert(self, index: int, td: TensorDictBase) -> None:
        """Inserts a member at ``index`` along the stack dim (in place)."""
        self._check_member(td)
        self.tensordicts.insert(index, td)
        self._refresh()

    def append(self, td: TensorDictBase) -> None:
        """Appends a member along the stack dim (in place)."""
        self._check_member(td)
        self.tensordicts.append(td)
        self._refresh()

    def extend(self, tds: Sequence[TensorDictBase]) -> None:
        tds = list(tds)
        for td in tds:
            self._check_member(td)
        self.tensordicts.extend(tds)
        self._refresh()

    def _check_member(self, td: Any) -> None:
        if not isinstance(td, TensorDictBase) or _is_non_tensor(td):
            raise TypeError(f"lazy stack members must be TensorDicts, got {type(td).__name__}")
        if self.is_locked:
            raise RuntimeError("cannot add a member to a locked lazy stack (unlock_() it first)")
        if td.batch_size != self._member_bs:
            raise ValueError(
                f"cannot add a member of batch_size {list(td.batch_size)} to a lazy stack whose "
                f"members have batch_size {list(self._member_bs)}"
            )

    # ------------------------------------------------------------------ dense export
    def _dense_compatible(self) -> bool:
        """Every member has the same keys and the same leaf shapes, at every level."""
        return bool(self.tensordicts) and _signature(self) is not None

    def to_tensordict(self, *, retain_none: Any = None) -> TensorDictBase:
        """A dense :class:`TensorDict` with the stacked entries (the keys every member has).

        Raises :class:`RaggedStackError` for a ragged entry (see :meth:`densify`).
        """
        return self._densify(None, "to_tensordict")

    def contiguous(self) -> TensorDictBase:
        """A dense, contiguous :class:`TensorDict` (see :meth:`to_tensordict`)."""
        return self._densify(None, "contiguous")

    def densify(self, *, layout: torch.layout = torch.strided) -> TensorDictBase:
        """A :class:`TensorDict` where ragged leaves become nested tensors.

        Leaves whose shapes agree across members are stacked densely; ragged leaves
        become nested tensors of ``layout`` (``torch.jagged`` where the raggedness allows
        it, else a strided nested tensor). Nested tensors need ``stack_dim=0``.
        """
        if layout not in (torch.jagged, torch.strided):
            raise ValueError(f"layout must be torch.jagged or torch.strided, got {layout}")
        return self._densify(layout, "densify")

    def _densify(self, layout: torch.layout | None, op: str, prefix: tuple = ()) -> TensorDictBase:
        from .td import TensorDict

        ms = self.tensordicts
        sd = self._stack_dim
        out = {}
        for k in self._keys_str():
            vals = [m._get_str(k, NO_DEFAULT) for m in ms]
            first = vals[0]
            full = prefix + (k,) if prefix else k
            if isinstance(first, Tensor):
                if all(isinstance(v, Tensor) and v.shape == first.shape for v in vals):
                    out[k] = torch.stack(vals, sd)
                elif layout is None:
                    raise _ragged_error(full, [getattr(v, "shape", None) for v in vals], op)
                else:
                    if sd != 0:
                        raise ValueError(
                            f"{op}: entry {full!r} is ragged and nested tensors need stack_dim=0 "
                            f"(this stack has stack_dim={sd})"
                        )
                    out[k] = _nested(vals, layout, full)
            elif _is_non_tensor(first):
                out[k] = _stack_non_tensor(vals, sd)
            else:
                sub = self._stack_values(full, vals)
                out[k] = sub._densify(layout, op, full if type(full) is tuple else (full,))
        return TensorDict.from_trusted(out, self._batch_size, self.device, None)

    def _to_dense(self, op: str) -> TensorDictBase:
        return self._densify(None, op)

    # ------------------------------------------------------------------ leafwise ops
    def _align_other(self, other: Any) -> list:
        """An argument of a leafwise op cut into one piece per member."""
        n = len(self.tensordicts)
        if other is None or not is_tensor_collection(other) or _is_non_tensor(other):
            return [other] * n
        sd = self._stack_dim
        if _is_lazy_td(other) and other.stack_dim == sd and len(other.tensordicts) == n:
            return list(other.tensordicts)
        obs = other.batch_size
        if len(obs) > sd and obs[sd] == n:
            return list(other.unbind(sd))
        if len(obs) > sd and obs[sd] == 1:
            one = other[(slice(None),) * sd + (0,)]
            return [one] * n
        raise ValueError(
            f"cannot align a container of batch_size {list(obs)} with a lazy stack of batch_size "
            f"{list(self._batch_size)} (stack dim {sd})"
        )

    def _map(self, fn: Callable, others: tuple, *, batch_size: torch.Size | None = None,
             device: Any = NO_DEFAULT, default: Any = NO_DEFAULT, named: bool = False,
             nested_keys: bool = False, call_on_nested: bool = False, filter_empty: bool | None = None,
             prefix: tuple = (), **flags: Any) -> TensorDictBase:
        if batch_size is not None and batch_size != self._batch_size:
            if flags.get("scalar_out"):
                return self._map_scalar(fn, device, named, nested_keys, prefix, flags)
            dense = self._to_dense("an op that changes the batch size")
            return dense._map(fn, others, batch_size=batch_size, device=device, default=default,
                              named=named, nested_keys=nested_keys, call_on_nested=call_on_nested,
                              filter_empty=filter_empty, prefix=prefix, **flags)
        parts = [self._align_other(o) for o in others]
        results = []
        for i, m in enumerate(self.tensordicts):
            results.append(m._map(
                fn, tuple(p[i] for p in parts), batch_size=None, device=device, default=default,
                named=named, nested_keys=nested_keys, call_on_nested=call_on_nested,
                filter_empty=filter_empty, prefix=prefix, **flags,
            ))
        dev = self.device if device is NO_DEFAULT else device
        out = LazyStackedTensorDict._new_from(results, self._stack_dim, self._batch_size, dev)
        out._stack_name = self._stack_name
        return out

    def _map_scalar(self, fn: Callable, device: Any, named: bool, nested_keys: bool, prefix: tuple,
                    flags: dict) -> TensorDictBase:
        """A full reduction of every leaf: the members' leaves are flattened and joined."""
        from .td import TensorDict

        ms = self.tensordicts
        out = {}
        for k in self._keys_str():
            vals = [m._get_str(k, NO_DEFAULT) for m in ms]
            first = vals[0]
            if isinstance(first, Tensor):
                flat = torch.cat([v.reshape(-1) for v in vals])
                if named:
                    r = fn(prefix + (k,) if nested_keys and prefix else k, flat)
                else:
                    r = fn(flat)
                if r is None:
                    continue
            elif _is_non_tensor(first):
                r = _stack_non_tensor(vals, self._stack_dim)._map(fn, (), batch_size=torch.Size(()),
                                                                 device=device, **flags)
            else:
                r = self._stack_values(k, vals)._map_scalar(fn, device, named, nested_keys,
                                                            prefix + (k,), flags)
            out[k] = r
        dev = self.device if device is NO_DEFAULT else device
        return TensorDict.from_trusted(out, torch.Size(()), dev, None)

    def _gather_inplace(self, others: tuple, default: Any, work: list, prefix: tuple) -> None:
        from .td import _gather_inplace

        parts = [self._align_other(o) for o in others]
        for i, m in enumerate(self.tensordicts):
            args = tuple(p[i] for p in parts)
            if _is_lazy_td(m):
                m._gather_inplace(args, default, work, prefix)
            else:
                _gather_inplace(m, args, default, work, prefix)

    def _map_(self, fn: Callable, others: tuple, *, default: Any = NO_DEFAULT, assign: bool = True) -> None:
        work: list = []
        self._gather_inplace(others, default, work, ())
        for v, args in work:
            r = fn(v, *args)
            if assign and r is not None and r is not v:
                v.copy_(r)

    def _matching_leaves(self, other: Any) -> list[Tensor]:
        from .base import _matching_leaves

        out: list[Tensor] = []
        for m, p in zip(self.tensordicts, self._align_other(other)):
            out.extend(_matching_leaves(m, p))
        return out

    def _tensor_leaves(self) -> list[Tensor]:
        return [t for m in self.tensordicts for t in m._tensor_leaves()]

    def _split_batch_tensor(self, t: Tensor) -> list:
        """A tensor shaped like the leading batch dims, cut into one piece per member."""
        n = len(self.tensordicts)
        return list(t.unbind(self._stack_dim)) if t.ndim > self._stack_dim else [t] * n

    def _binary(self, op: Callable, other: Any, reverse: bool = False) -> TensorDictBase:
        if isinstance(other, Tensor) and other.ndim and other.ndim <= self.batch_dims and (
            other.shape == self._batch_size[: other.ndim]
        ):
            pieces = self._split_batch_tensor(other)
            return LazyStackedTensorDict._new_from(
                [m._binary(op, p, reverse) for m, p in zip(self.tensordicts, pieces)],
                self._stack_dim, self._batch_size, self.device)
        return super()._binary(op, other, reverse)

    def _binary_(self, op_: Callable, other: Any) -> TensorDictBase:
        if isinstance(other, Tensor) and other.ndim and other.ndim <= self.batch_dims and (
            other.shape == self._batch_size[: other.ndim]
        ):
            for m, p in zip(self.tensordicts, self._split_batch_tensor(other)):
                m._binary_(op_, p)
            return self
        return super()._binary_(op_, other)

    def masked_fill(self, mask: Tensor, value: float | bool) -> LazyStackedTensorDict:
        _check_mask(self, mask)
        return LazyStackedTensorDict._new_from(
            [m.masked_fill(p, value) for m, p in zip(self.tensordicts, self._split_batch_tensor(mask))],
            self._stack_dim, self._batch_size, self.device)

    def masked_fill_(self, mask: Tensor, value: float | bool) -> LazyStackedTensorDict:
        _check_mask(self, mask)
        for m, p in zip(self.tensordicts, self._split_batch_tensor(mask)):
            m.masked_fill_(p, value)
        return self

    def where(self, condition: Tensor, other: Any, *, pad: Any = None) -> TensorDictBase:
        return _lazy_where(condition, self, other)

    def allclose(self, other: Any, rtol: float = 1e-5, atol: float = 1e-8) -> bool:
        return all(m.allclose(p, rtol, atol) for m, p in zip(self.tensordicts, self._align_other(other)))

    def cumsum(self, dim: int) -> TensorDictBase:
        return self._cum("cumsum", dim)

    def cumprod(self, dim: int) -> TensorDictBase:
        return self._cum("cumprod", dim)

    def _cum(self, name: str, dim: int) -> TensorDictBase:
        d = _dims_tuple(dim, self.batch_dims)[0]
        sd = self._stack_dim
        if d == sd:
            return getattr(self._to_dense(f"{name} over the stack dim"), name)(d)
        return LazyStackedTensorDict._new_from(
            [getattr(m, name)(d - (d > sd)) for m in self.tensordicts], sd, self._batch_size, self.device)

    def _reduce(self, fn: Callable, dim: Any, keepdim: bool = False) -> TensorDictBase:
        dims = _dims_tuple(dim, self.batch_dims)
        sd = self._stack_dim
        if sd in dims:
            return self._to_dense("a reduction over the stack dim")._reduce(fn, dim, keepdim)
        mdims = tuple(d - (d > sd) for d in dims)
        new_sd = sd if keepdim else sd - sum(d < sd for d in dims)
        new_bs = _reduced_size(self._batch_size, dims, keepdim)
        return LazyStackedTensorDict._new_from(
            [m._reduce(fn, mdims, keepdim) for m in self.tensordicts], new_sd, new_bs, self.device)

    def _reduction(self, name: str, dim: Any, keepdim: bool, reduce: bool, **kw: Any) -> Any:
        if reduce and dim is not None and dim is not NO_DEFAULT:
            return self._to_dense(f"{name}(reduce=True, dim=...)")._reduction(name, dim, keepdim, reduce, **kw)
        return super()._reduction(name, dim, keepdim, reduce, **kw)

    # ------------------------------------------------------------------ structure ops
    def _members_map(self, fn: Callable) -> LazyStackedTensorDict:
        return self._like([fn(m) for m in self.tensordicts], self._stack_dim, self._batch_size)

    def copy(self) -> LazyStackedTensorDict:
        """A shallow copy: new member containers, same leaf tensors."""
        return self._members_map(lambda m: m.copy())

    def select(self, *keys: NestedKey, inplace: bool = False, strict: bool = True, as_tensordict: bool = False) -> TensorDictBase:
        if inplace:
            for m in self.tensordicts:
                m.select(*keys, inplace=True, strict=strict)
            return self
        if strict:
            for key in keys:
                if key not in self:
                    k = unravel_key(key)
                    raise self._missing(k, [i for i, m in enumerate(self.tensordicts) if k not in m])
        return self._members_map(lambda m: m.select(*keys, strict=strict))

    def exclude(self, *keys: NestedKey, inplace: bool = False) -> TensorDictBase:
        if inplace:
            for m in self.tensordicts:
                m.exclude(*keys, inplace=True)
            return self
        return self._members_map(lambda m: m.exclude(*keys))

    def flatten_keys(self, separator: str = ".", inplace: bool = False) -> TensorDictBase:
        if inplace:
            for m in self.tensordicts:
                m.flatten_keys(separator, inplace=True)
            return self
        return self._members_map(lambda m: m.flatten_keys(separator))

    def unflatten_keys(self, separator: str = ".", inplace: bool = False) -> TensorDictBase:
        if inplace:
            for m in self.tensordicts:
                m.unflatten_keys(separator, inplace=True)
            return self
        return self._members_map(lambda m: m.unflatten_keys(separator))

    def empty(self, recurse: bool = False, *, batch_size: Any = None, device: Any = NO_DEFAULT,
              names: Any = None) -> TensorDictBase:
        out = self._new_empty(as_size(batch_size)) if batch_size is not None else self._members_map(
            lambda m: m.empty(recurse))
        if names is not None:
            out.names = names
        return out

    def _new_empty(self, batch_size: torch.Size) -> TensorDictBase:
        from .td import TensorDict

        sd = self._stack_dim
        ms = self.tensordicts
        if len(batch_size) > sd:
            mbs = batch_size[:sd] + batch_size[sd + 1 :]
            members = []
            for i in range(batch_size[sd]):
                proto = ms[i] if i < len(ms) else (ms[0] if ms else None)
                members.append(proto._new_empty(mbs) if proto is not None else
                               TensorDict.from_trusted({}, mbs, self.device, None))
            return LazyStackedTensorDict._new_from(members, sd, batch_size, self.device)
        return TensorDict.from_trusted({}, batch_size, self.device, None)

    # ------------------------------------------------------------------ locking
    def lock_(self) -> LazyStackedTensorDict:
        self._locked = True
        for m in self.tensordicts:
            m.lock_()
        return self

    def unlock_(self) -> LazyStackedTensorDict:
        self._locked = False
        for m in self.tensordicts:
            m.unlock_()
        return self

    def _is_locked_flag(self) -> bool:
        ms = self.tensordicts
        return self._locked or (bool(ms) and all(m.is_locked for m in ms))

    # ------------------------------------------------------------------ misc
    def __reduce__(self):
        return (_rebuild_lazy, (self.tensordicts, self._stack_dim, self._batch_size, self._locked,
                                self._device_hint, self._stack_name))

    def __repr__(self) -> str:
        fields = _lazy_fields_repr(self, 8)
        excl = self.exclusive_keys()
        extra = ""
        if any(excl):
            lines = ",".join(f"\n        {i} -> {ks}" for i, ks in enumerate(excl) if ks)
            extra = f"\n    exclusive_fields={{{lines}\n    }},"
        return (
            f"LazyStackedTensorDict(\n    fields={{{fields}}},{extra}\n    batch_size={self.batch_size},\n"
            f"    device={self.device},\n    is_shared={self._shared_repr()},\n"
            f"    stack_dim={self._stack_dim})"
        )


# ---------------------------------------------------------------------- stack / cat
def lazy_stack(input: Sequence[TensorDictBase], dim: int = 0, *, out: Any = None) -> LazyStackedTensorDict:
    """Stacks containers along a new batch dim ``dim`` without copying anything.

    The result is always a :class:`LazyStackedTensorDict` whose members are the inputs
    (lazy inputs become nested lazy stacks). The inputs must share their batch size;
    their leaf shapes and keys may differ.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict, lazy_stack
        >>> trajs = [TensorDict({"obs": torch.zeros(t, 3)}) for t in (5, 7)]
        >>> td = lazy_stack(trajs)
        >>> td[1]["obs"].shape
        torch.Size([7, 3])
    """
    items = list(input)
    if not items:
        raise RuntimeError("lazy_stack expects a non-empty sequence of TensorDicts")
    if out is not None:
        raise TypeError("lazy_stack does not support out=; use torch.stack(..., out=)")
    if type(items[0]) is TensorDict:  # fast path: plain TensorDicts of one batch size
        mbs = items[0]._batch_size
        nd = len(mbs) + 1
        for t in items:
            if type(t) is not TensorDict or t._batch_size != mbs:
                break
        else:
            if -nd <= dim < nd:
                return LazyStackedTensorDict._new_from(items, dim % nd)
    if all(isinstance(t, Tensor) for t in items):
        raise TypeError("lazy_stack stacks TensorDicts; for tensors use torch.stack or "
                        "torch.nested.as_nested_tensor")
    nd = items[0].batch_dims + 1
    if not -nd <= dim < nd:
        raise IndexError(f"lazy_stack: dim={dim} is out of range for a batch of {nd - 1} dims")
    return LazyStackedTensorDict(*items, stack_dim=dim % nd)


def lazy_cat(list_of_tds: Sequence[TensorDictBase], dim: int = 0, *, out: Any = None) -> LazyStackedTensorDict:
    """Concatenates containers when at least one is a lazy stack; the result is lazy.

    Along the stack dim the member lists are joined (dense inputs are unbound into
    members); along another dim the members are concatenated pairwise.
    """
    items = list(list_of_tds)
    if not items:
        raise RuntimeError("lazy_cat expects a non-empty sequence of TensorDicts")
    ref = next((t for t in items if _is_lazy_td(t)), None)
    nd = items[0].batch_dims
    if nd == 0:
        raise RuntimeError("cannot cat TensorDicts with an empty batch size; use stack")
    if not -nd <= dim < nd:
        raise IndexError(f"cat: dim={dim} is out of range for a batch of {nd} dims")
    d = dim % nd
    sd = ref.stack_dim if ref is not None else d
    for i, t in enumerate(items):
        if t.batch_dims != nd:
            raise ValueError(f"cannot cat along dim {d}: item 0 has batch_size {list(items[0].batch_size)}, "
                             f"item {i} has {list(t.batch_size)}")
    if d == sd:
        members: list = []
        for t in items:
            if _is_lazy_td(t) and t.stack_dim == sd:
                members.extend(t.tensordicts)
            else:
                members.extend(t.unbind(sd))
        result = LazyStackedTensorDict(*members, stack_dim=sd) if members else LazyStackedTensorDict._new_from(
            [], sd, items[0].batch_size[:sd] + (0,) + items[0].batch_size[sd + 1 :])
    else:
        n = items[0].batch_size[sd]
        parts = []
        for i, t in enumerate(items):
            if t.batch_size[sd] != n:
                raise ValueError(
                    f"cannot cat along dim {d}: the stack dim {sd} has size {n} in item 0 but "
                    f"{t.batch_size[sd]} in item {i}"
                )
            parts.append(t.tensordicts if _is_lazy_td(t) and t.stack_dim == sd else t.unbind(sd))
        md = d - (d > sd)
        result = LazyStackedTensorDict(*[torch.cat([p[i] for p in parts], md) for i in range(n)],
                                       stack_dim=sd)
    if out is not None:
        out.update_(result)
        return out
    return result


LazyStackedTensorDict._stack_impl = staticmethod(lambda vals, dim: lazy_stack(vals, dim))  # type: ignore[attr-defined]
LazyStackedTensorDict._cat_impl = staticmethod(lambda vals, dim: lazy_cat(vals, dim))  # type: ignore[attr-defined]


# ---------------------------------------------------------------------- writes
def _prepare_pairs(pairs: list, index: Any) -> list:
    """Plans the lazy-stack targets among ``pairs`` (validating them); tensors stay as they are."""
    return [(dst, ("__plan__", dst._plan_assign(index, src)) if _is_lazy_td(dst) else src)
            for dst, src in pairs]


def _run_steps(steps: list, index: Any) -> None:
    whole = type(index) is tuple and not index
    for dst, src in steps:
        if isinstance(dst, Tensor):
            if whole:
                dst.copy_(src)
            else:
                dst[index] = src
        elif _is_lazy_td(dst):  # planned by _prepare_pairs
            for sub_steps, mi in src[1]:
                _run_steps(sub_steps, mi)
        else:
            dst._assign_at(index, src)


def _write_pairs_lazy(pairs: list, index: Any) -> None:
    """``_write_pairs`` for pairs that include lazy stacks: every lazy target is planned
    (and so validated) before anything is written."""
    _run_steps(_prepare_pairs(pairs, index), index)


def _compatible(shape: Sequence[int], target: Sequence[int]) -> bool:
    return len(shape) == len(target) and all(s == t or s == 1 for s, t in zip(shape, target))


def _source_part(value: Any, new_bs: torch.Size, take: Callable, take_c: Callable) -> Any:
    """The part of a write source that goes to one member.

    Tensors (and containers) whose leading dims line up with ``new_bs`` are cut with
    ``take``/``take_c``; anything else (scalars, feature-shaped tensors, shared
    non-tensor values) is the same for every member.
    """
    nb = len(new_bs)
    if isinstance(value, Tensor):
        if nb == 0:
            return value
        if value.ndim and value.ndim < nb and value.shape == new_bs[: value.ndim]:
            return take(expand_right(value, new_bs))
        if value.ndim >= nb and _compatible(value.shape[:nb], new_bs):
            return take(value)
        return value
    if _is_non_tensor(value):
        if getattr(type(value), "_is_stack", False) and nb and len(value.batch_size) >= nb and _compatible(
            value.batch_size[:nb], new_bs
        ):
            return take_c(value)
        return value
    if is_tensor_collection(value):
        vbs = value.batch_size
        if nb == 0:
            return value
        if len(vbs) >= nb and _compatible(vbs[:nb], new_bs):
            return take_c(value)
        from .td import TensorDict

        out = {k: _source_part(value._get_str(k, NO_DEFAULT), new_bs, take, take_c) for k in value._keys_str()}
        return TensorDict.from_trusted(out, torch.Size(()), None, None)
    return value


def _one_key_source(key: NestedKey, item: Any) -> TensorDictBase:
    from .td import TensorDict

    keys = (key,) if type(key) is str else key
    node: Any = item
    for k in reversed(keys):
        node = TensorDict.from_trusted({k: node}, torch.Size(()), None, None)
    return node


def _lazy_where(condition: Tensor, input: Any, other: Any) -> TensorDictBase:
    """``torch.where`` when ``input`` or ``other`` is a lazy stack: member by member."""
    ref = input if _is_lazy_td(input) else other
    bs = ref.batch_size
    if condition.shape != bs[: condition.ndim]:
        raise ValueError(f"where: condition shape {list(condition.shape)} does not match the batch size {list(bs)}")
    conds = ref._split_batch_tensor(condition)

    def parts(x):
        if is_tensor_collection(x):
            return ref._align_other(x)
        if isinstance(x, Tensor) and x.ndim >= len(bs) and x.shape[: len(bs)] == bs:
            return list(x.unbind(ref.stack_dim))
        return [x] * len(ref.tensordicts)

    ins, ots = parts(input), parts(other)
    return LazyStackedTensorDict._new_from(
        [torch.where(c, a, b) for c, a, b in zip(conds, ins, ots)], ref.stack_dim, bs, ref.device)


# ---------------------------------------------------------------------- helpers
def _member_at(m: TensorDictBase, coords: tuple, rest: torch.Size) -> TensorDictBase:
    """The elements ``coords`` (index tensors shaped ``rest``) of member ``m``."""
    if m.batch_dims == 0:
        return m.expand(rest) if len(rest) else m
    if len(rest) == 0:
        idx: Any = tuple(int(c) for c in coords)
    else:
        idx = tuple(coords)
    return m._index(idx[0] if len(idx) == 1 else idx)


def _nest(elems: list, shape: torch.Size) -> TensorDictBase:
    if not len(shape):
        return elems[0]
    k = len(elems) // shape[0]
    parts = [_nest(elems[i * k : (i + 1) * k], shape[1:]) for i in range(shape[0])]
    return LazyStackedTensorDict._new_from(parts, 0, shape)


def _stack_non_tensor(vals: list, sd: int) -> TensorDictBase:
    """Stacks members' non-tensor entries; one shared value stays one ``NonTensorData``."""
    from .nontensor import NonTensorData, _same, stack_non_tensor

    first = vals[0]
    if type(first) is NonTensorData and all(
        type(v) is NonTensorData and _same(v.data, first.data) for v in vals[1:]
    ):
        bs = first.batch_size
        return NonTensorData(first.data, bs[:sd] + (len(vals),) + bs[sd:], first.device)
    return stack_non_tensor(vals, sd)


def _peek(td: TensorDictBase, key: str) -> Any:
    """A representative entry at ``key`` without stacking (member 0 of a lazy stack)."""
    while _is_lazy_td(td) and td.tensordicts:
        td = td.tensordicts[0]
    return td._get_str(key, NO_DEFAULT)


def _peek_nested(td: TensorDictBase, key: NestedKey) -> Any:
    keys = (key,) if type(key) is str else key
    node: Any = td
    for k in keys:
        node = _peek(node, k)
    return node


def _signature(td: TensorDictBase) -> Any:
    """A hashable description of keys and shapes, or None for a ragged/heterogeneous stack."""
    if _is_lazy_td(td):
        ms = td.tensordicts
        if not ms:
            return None
        s0 = _signature(ms[0])
        if s0 is None:
            return None
        for m in ms[1:]:
            if _signature(m) != s0:
                return None
        return _insert_dim(s0, td.stack_dim, len(ms))
    out = []
    for k in td._keys_str():
        v = td._get_str(k, NO_DEFAULT)
        if isinstance(v, Tensor):
            if v.is_nested:
                return None
            out.append((k, "t", tuple(v.shape)))
        elif _is_non_tensor(v):
            out.append((k, "n", tuple(v.batch_size)))
        else:
            s = _signature(v)
            if s is None:
                return None
            out.append((k, "b", s))
    out.sort(key=lambda e: e[0])
    return (tuple(td.batch_size), tuple(out))


def _insert_dim(sig: Any, d: int, n: int) -> Any:
    bs, entries = sig
    new = []
    for k, kind, s in entries:
        if kind == "b":
            new.append((k, kind, _insert_dim(s, d, n)))
        else:
            new.append((k, kind, s[:d] + (n,) + s[d:]))
    return (bs[:d] + (n,) + bs[d:], tuple(new))


def _merge_shapes(shapes: list, sd: int) -> torch.Size:
    n = len(shapes)
    if not shapes:
        return torch.Size([0])
    nd = {len(s) for s in shapes}
    if len(nd) != 1:
        return torch.Size(())  # pragma: no cover - members disagree on the number of dims
    merged = [s0 if all(s[i] == s0 for s in shapes) else -1 for i, s0 in enumerate(shapes[0])]
    return torch.Size(merged[:sd] + [n] + merged[sd:])


def _nested(vals: list, layout: torch.layout, key: Any) -> Tensor:
    nds = {v.ndim for v in vals}
    if len(nds) != 1:
        raise ValueError(f"cannot build a nested tensor for {key!r}: the members' leaves have "
                         f"different numbers of dims {sorted(nds)}")
    dtype = vals[0].dtype
    for v in vals[1:]:
        dtype = torch.promote_types(dtype, v.dtype)
    vals = [v.to(dtype) for v in vals]
    if layout is torch.jagged:
        try:
            return torch.nested.as_nested_tensor(vals, layout=torch.jagged)
        except (RuntimeError, ValueError, TypeError):
            pass  # raggedness the jagged layout can't express: fall back to strided
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.nested.as_nested_tensor(vals, layout=torch.strided)


def _lazy_fields_repr(td: LazyStackedTensorDict, indent: int) -> str:
    pad = " " * indent
    lines = []
    ms = td.tensordicts
    for key in td._keys_str():
        vals = [m._get_str(key, NO_DEFAULT) if not _is_lazy_td(m) else None for m in ms]
        v0 = _peek(ms[0], key)
        if isinstance(v0, Tensor):
            if all(v is not None for v in vals):
                shape = _merge_shapes([tuple(v.shape) for v in vals], td.stack_dim)
            else:
                shape = td.get_item_shape(key)
            desc = f"Tensor(shape={shape}, device={v0.device}, dtype={v0.dtype}, is_shared={v0.is_shared()})"
        elif _is_non_tensor(v0):
            desc = repr(td._get_str(key, NO_DEFAULT))
        else:
            sub = td._get_str(key, NO_DEFAULT)
            inner = _lazy_fields_repr(sub, indent + 8)
            desc = (f"LazyStackedTensorDict(\n{pad}    fields={{{inner}}},\n{pad}    "
                    f"batch_size={sub.batch_size},\n{pad}    device={sub.device},\n{pad}    "
                    f"stack_dim={sub.stack_dim})")
        lines.append(f"\n{pad}{key}: {desc}")
    return ",".join(lines) + (f"\n{' ' * (indent - 4)}" if lines else "")


def _rebuild_lazy(members, stack_dim, batch_size, locked, device=None, stack_name=None):
    out = LazyStackedTensorDict._new_from(members, stack_dim, batch_size, device)
    out._stack_name = stack_name
    if locked:
        out._locked = True
    return out
