"""Stacks of heterogeneous specs (multi-task, multi-agent): :class:`Stacked`, :class:`StackedComposite`.

``torch.stack(specs, dim)`` of specs that are all equal gives an ordinary (dense) spec
with a new dim; of specs that differ (other bounds, other shapes, other keys) it gives a
lazy stack that keeps each member: :class:`Stacked` for tensor specs,
:class:`StackedComposite` for :class:`Composite` specs. A dim where the members' shapes
differ shows as ``-1`` in the stack's shape. Indexing is allowed along the stack dim only.

Also here: :func:`consolidate_spec`, :func:`contains_lazy_spec`, :func:`check_no_exclusive_keys`.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from steersman.tensordict import NestedKey, TensorDictBase, lazy_stack, unravel_key

from .base import TensorSpec
from .composite import Composite

__all__ = ["Stacked", "StackedComposite", "stack_specs", "consolidate_spec", "contains_lazy_spec",
           "check_no_exclusive_keys"]


def _stack_shape(shapes: Sequence[torch.Size], dim: int, what: str) -> torch.Size:
    nd = {len(s) for s in shapes}
    if len(nd) != 1:
        raise RuntimeError(f"cannot stack {what} with different numbers of dims: {[list(s) for s in shapes]}")
    common = [s0 if all(s[i] == s0 for s in shapes) else -1 for i, s0 in enumerate(shapes[0])]
    return torch.Size(common[:dim] + [len(shapes)] + common[dim:])


def _norm_dim(dim: int, nd: int) -> int:
    if not -(nd + 1) <= dim <= nd:
        raise IndexError(f"stack dim {dim} is out of range for specs with {nd} dims")
    return dim + nd + 1 if dim < 0 else dim


def stack_specs(specs: Sequence[TensorSpec], dim: int = 0, *, out: Any = None) -> TensorSpec:
    """``torch.stack`` for specs: a dense spec when all members are equal, else a lazy stack.

    Example:
        >>> import torch
        >>> from steersman.data import Unbounded, Composite
        >>> torch.stack([Unbounded(shape=(3,)), Unbounded(shape=(3,))], 0).shape
        torch.Size([2, 3])
        >>> type(torch.stack([Unbounded(shape=(3,)), Unbounded(shape=(4,))], 0)).__name__
        'Stacked'
    """
    if out is not None:
        raise TypeError("torch.stack(specs, out=...) is not supported for specs")
    specs = list(specs)
    if not specs or not all(isinstance(s, TensorSpec) for s in specs):
        raise TypeError("torch.stack of specs needs a non-empty sequence of TensorSpec objects")
    first = specs[0]
    if isinstance(first, (Stacked, StackedComposite)) or any(isinstance(s, (Stacked, StackedComposite)) for s in specs):
        raise NotImplementedError("stacking lazy stacks of specs is not supported; stack their members instead")
    d = _norm_dim(dim, len(first.shape) if not isinstance(first, Composite) else len(first.shape))
    if all(s == first for s in specs[1:]):
        dense = first.unsqueeze(d)
        return dense.expand(*dense.shape[:d], len(specs), *dense.shape[d + 1:])
    if all(isinstance(s, Composite) for s in specs):
        return StackedComposite(*specs, dim=d)
    if any(isinstance(s, Composite) for s in specs):
        raise TypeError("cannot stack Composite specs with non-Composite specs")
    return Stacked(*specs, dim=d)


class _LazyStack:
    """What both lazy stacks share: members, the stack dim, indexing along it."""

    _specs: tuple
    _dim: int

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def stack_dim(self) -> int:
        return self._dim

    @property
    def specs(self) -> tuple:
        return self._specs

    def __len__(self) -> int:
        return len(self._specs)

    def unbind(self, dim: int | None = None) -> tuple:
        if dim is None or _norm_dim(dim, len(self.shape) - 1) == self._dim:
            return tuple(self._specs)
        raise ValueError(f"a lazy stack of specs unbinds along its stack dim ({self._dim}) only, got {dim}")

    def _stack_index(self, index: Any) -> Any:
        """The part of ``index`` that applies to the stack dim (the dims before it must be ``:``)."""
        if isinstance(index, tuple):
            lead = index[: self._dim]
            if len(index) <= self._dim or any(not (isinstance(i, slice) and i == slice(None)) for i in lead) \
                    or len(index) > self._dim + 1:
                raise IndexError(f"a lazy stack of specs can be indexed along its stack dim ({self._dim}) only, "
                                 f"got {index!r}")
            return index[self._dim]
        if self._dim != 0:
            raise IndexError(f"this stack dim is {self._dim}: index with (:, ..., i) to pick members")
        return index

    def _pick(self, index: Any) -> Any:
        i = self._stack_index(index)
        if isinstance(i, int):
            return self._specs[i]
        if isinstance(i, slice):
            picked = self._specs[i]
        else:
            idx = torch.as_tensor(i).reshape(-1).tolist()
            picked = tuple(self._specs[j] for j in idx)
        if not picked:
            raise IndexError("indexing a lazy stack of specs must keep at least one member")
        return type(self)(*picked, dim=self._dim)

    def _unbind_value(self, val: Any, n_lead: int) -> list:
        d = n_lead + self._dim
        if isinstance(val, (list, tuple)):
            return list(val)
        if isinstance(val, Tensor) and val.is_nested:
            return list(val.unbind())
        return list(val.unbind(d))

    def _lead(self, val: Any, own_nd: int) -> int:
        nd = len(val.batch_size) if isinstance(val, TensorDictBase) else val.dim()
        return nd - own_nd

    def __eq__(self, other: object) -> bool:
        return (type(other) is type(self) and other._dim == self._dim and len(other._specs) == len(self._specs)
                and all(a == b for a, b in zip(self._specs, other._specs)))

    __hash__ = None  # type: ignore[assignment]


class Stacked(_LazyStack, TensorSpec):
    """A lazy stack of tensor specs along ``dim`` (members may differ in bounds or shape).

    ``rand``/``zero``/``one`` stack the members' draws (a strided ``torch.nested`` tensor
    along dim 0 when their shapes differ; an error for another dim); ``is_in`` and
    ``project`` unbind the value along the stack dim and check/project each part with its
    member. ``spec[i]`` is member ``i`` (along the stack dim).

    Args:
        *specs: the members (same number of dims, same dtype).
        dim: the stack dim.

    Example:
        >>> import torch
        >>> from steersman.data import Bounded
        >>> s = torch.stack([Bounded(0, 1, shape=(3,)), Bounded(0, 2, shape=(3,))], 1)
        >>> s.shape, s.rand().shape
        (torch.Size([3, 2]), torch.Size([3, 2]))
        >>> s.is_in(torch.full((3, 2), 1.5)), s.is_in(torch.stack([torch.full((3,), 0.5), torch.full((3,), 1.5)], 1))
        (False, True)
        >>> s.project(torch.full((3, 2), 5.0))[0].tolist()
        [1.0, 2.0]
    """

    def __init__(self, *specs: TensorSpec, dim: int) -> None:
        if not specs or not all(isinstance(s, TensorSpec) and not isinstance(s, Composite) for s in specs):
            raise TypeError("Stacked takes tensor specs (use StackedComposite for Composite specs)")
        dtypes = {s.dtype for s in specs}
        if len(dtypes) != 1:
            raise TypeError(f"cannot stack specs of different dtypes: {sorted(map(str, dtypes))}")
        devices = {s.device for s in specs}
        if len(devices) != 1:
            raise ValueError(f"cannot stack specs on different devices: {sorted(map(str, devices))}")
        self._dim = _norm_dim(dim, len(specs[0].shape))
        self._specs = tuple(specs)
        self._shape = _stack_shape([s.shape for s in specs], self._dim, "specs")
        self._device = specs[0].device
        self._dtype = specs[0].dtype
        self._kind = getattr(specs[0], "_kind", None)
        self.domain = specs[0].domain

    @property
    def shape(self) -> torch.Size:
        return self._shape

    def __getitem__(self, index: Any) -> TensorSpec:
        return self._pick(index)

    def _draw(self, how: str, shape: Any) -> Tensor:
        lead = tuple(torch.Size(shape if shape is not None else ()))
        draws = [getattr(s, how)(shape) for s in self._specs]
        if len({d.shape for d in draws}) == 1:
            return torch.stack(draws, len(lead) + self._dim)
        if self._dim == 0 and not lead:
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                return torch.nested.nested_tensor(draws)
        raise RuntimeError(f"the members' shapes differ ({[list(s.shape) for s in self._specs]}): their draws "
                           f"can only be stacked as a nested tensor along dim 0 with no extra leading shape")

    def rand(self, shape: Any = None) -> Tensor:
        return self._draw("rand", shape)

    def zero(self, shape: Any = None) -> Tensor:
        return self._draw("zero", shape)

    def one(self, shape: Any = None) -> Tensor:
        return self._draw("one", shape)

    def is_in(self, val: Any) -> bool:
        lead = 0 if isinstance(val, (list, tuple)) or (isinstance(val, Tensor) and val.is_nested) \
            else self._lead(val, len(self._shape))
        if lead < 0:
            return False
        parts = self._unbind_value(val, lead)
        return len(parts) == len(self._specs) and all(s.is_in(p) for s, p in zip(self._specs, parts))

    def assert_is_in(self, val: Any) -> None:
        if not self.is_in(val):
            raise AssertionError(f"value is not in the stacked spec {self!r}")

    def type_check(self, value: Any, key: Any = None) -> None:
        if not self.is_in(value):
            raise ValueError(f"value{'' if key is None else f' at {key!r}'} is not in the stacked spec {self!r}")

    def project(self, val: Any) -> Any:
        if isinstance(val, Tensor) and val.is_nested:
            return torch.nested.nested_tensor([s.project(p) for s, p in zip(self._specs, val.unbind())])
        lead = self._lead(val, len(self._shape))
        parts = [s.project(p) for s, p in zip(self._specs, self._unbind_value(val, lead))]
        return torch.stack(parts, lead + self._dim)

    def expand(self, *shape: Any) -> Stacked:
        """New leading dims: ``expand(*lead, *self.shape)`` (``-1`` keeps a dim)."""
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)) else shape
        n_new = len(shape) - len(self._shape)
        if n_new < 0 or any(s not in (-1, o) for s, o in zip(shape[n_new:], self._shape)):
            raise ValueError(f"cannot expand a stacked spec of shape {list(self._shape)} to {list(shape)}")
        lead = tuple(shape[:n_new])
        return Stacked(*[s.expand(*lead, *s.shape) for s in self._specs], dim=self._dim + n_new)

    def to(self, dest: Any) -> Stacked:
        return Stacked(*[s.to(dest) for s in self._specs], dim=self._dim)

    def clone(self) -> Stacked:
        return Stacked(*[s.clone() for s in self._specs], dim=self._dim)

    def __repr__(self) -> str:
        return (f"Stacked{type(self._specs[0]).__name__}(shape={list(self._shape)}, dim={self._dim}, "
                f"device={self._device}, dtype={self._dtype}, domain={self.domain})")


class StackedComposite(_LazyStack, Composite):
    """A lazy stack of :class:`Composite` specs along ``dim`` (members may have different keys).

    ``keys()`` lists the keys every member has; ``spec[key]`` stacks the members' entries
    (dense when equal). Keys only some members have are *exclusive*: see
    :meth:`exclusive_keys` and :func:`consolidate_spec`. ``rand``/``zero``/``one`` return a
    ``LazyStackedTensorDict`` of the members' draws; ``is_in``/``project`` go member by
    member along the stack dim. ``spec[i]`` is member ``i``.

    Example:
        >>> import torch
        >>> from steersman.data import Composite, Unbounded, Categorical
        >>> a = Composite(obs=Unbounded(shape=(3,)), x=Unbounded(shape=(2,)))
        >>> b = Composite(obs=Unbounded(shape=(4,)), y=Categorical(3))
        >>> s = torch.stack([a, b], 0)
        >>> s.shape, list(s.keys()), s["obs"].shape, s.exclusive_keys()
        (torch.Size([2]), ['obs'], torch.Size([2, -1]), [['x'], ['y']])
        >>> td = s.rand()
        >>> s.is_in(td), td[1]["obs"].shape
        (True, torch.Size([4]))
        >>> check_no_exclusive_keys(s), check_no_exclusive_keys(consolidate_spec(s))
        (False, True)
    """

    def __init__(self, *specs: Composite, dim: int) -> None:
        if not specs or not all(isinstance(s, Composite) and not isinstance(s, StackedComposite) for s in specs):
            raise TypeError("StackedComposite takes Composite specs")
        shapes = {s.shape for s in specs}
        if len(shapes) != 1:
            raise RuntimeError(f"cannot stack Composite specs of different batch shapes: "
                               f"{sorted(list(s) for s in shapes)}")
        self._dim = _norm_dim(dim, len(specs[0].shape))
        self._specs = tuple(specs)
        bs = list(specs[0].shape)
        self._shape = torch.Size(bs[: self._dim] + [len(specs)] + bs[self._dim:])
        devices = {s.device for s in specs}
        self._device = specs[0].device if len(devices) == 1 else None
        self._dtype = None
        self._kind = None
        self._specs_dict: dict = {}
        self._locked = False

    @property
    def shape(self) -> torch.Size:
        return self._shape

    @shape.setter
    def shape(self, value: Any) -> None:
        raise RuntimeError("the shape of a StackedComposite follows its members; set their shapes instead")

    @property
    def device(self) -> torch.device | None:
        return self._device

    # ------------------------------------------------------------------ keys
    def _common(self) -> list[str]:
        first = list(self._specs[0].keys())
        return [k for k in first if all(k in s.keys() for s in self._specs[1:])]

    def keys(self, include_nested: bool = False, leaves_only: bool = False, **kwargs: Any) -> list:
        out = []
        for k in self._common():
            v = self[k]
            is_comp = isinstance(v, Composite)
            if not (leaves_only and is_comp):
                out.append(k)
            if include_nested and is_comp:
                out += [(k, *(sub if isinstance(sub, tuple) else (sub,)))
                        for sub in v.keys(include_nested=True, leaves_only=leaves_only)]
        return out

    def items(self, include_nested: bool = False, leaves_only: bool = False, **kwargs: Any) -> list:
        return [(k, self[k]) for k in self.keys(include_nested, leaves_only)]

    def values(self, include_nested: bool = False, leaves_only: bool = False, **kwargs: Any) -> list:
        return [self[k] for k in self.keys(include_nested, leaves_only)]

    def __iter__(self):
        return iter(self._common())

    def __contains__(self, key: Any) -> bool:
        try:
            key = unravel_key(key)
        except (TypeError, ValueError):
            return False
        return all(key in s.keys(include_nested=True) for s in self._specs)

    def exclusive_keys(self) -> list[list[str]]:
        """Per member, the keys it has and some other member lacks."""
        common = set(self._common())
        return [sorted(k for k in s.keys() if k not in common) for s in self._specs]

    def repr_exclusive_keys(self) -> str:
        return ", ".join(f"{i} -> {keys}" for i, keys in enumerate(self.exclusive_keys()) if keys)

    def get(self, key: NestedKey, default: Any = ...) -> Any:
        key = unravel_key(key)
        if key not in self:
            if default is not ...:
                return default
            raise KeyError(f"key {key!r} is not in every member of the StackedComposite (exclusive keys: "
                           f"{self.repr_exclusive_keys() or 'none'})")
        return stack_specs([s.get(key) for s in self._specs], self._dim)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, str) or (isinstance(index, tuple) and index and all(isinstance(k, str) for k in index)):
            return self.get(index)
        return self._pick(index)

    def set(self, key: NestedKey, spec: TensorSpec) -> StackedComposite:
        """Sets ``key`` in every member: ``spec`` must have the stack's dims (its parts along the
        stack dim go to the members)."""
        if not isinstance(spec, TensorSpec):
            raise TypeError(f"a StackedComposite entry must be a TensorSpec, got {type(spec).__name__}")
        if len(spec.shape) <= self._dim or spec.shape[self._dim] != len(self._specs):
            raise ValueError(f"the spec set under {key!r} must have {len(self._specs)} entries along dim "
                             f"{self._dim}, got shape {list(spec.shape)}")
        parts = spec.unbind(self._dim) if not isinstance(spec, _LazyStack) else spec.specs
        for s, p in zip(self._specs, parts):
            s.set(key, p)
        return self

    def __setitem__(self, key: Any, spec: Any) -> None:
        self.set(key, spec)

    def update(self, other: Any) -> StackedComposite:
        for k, v in (other.items() if hasattr(other, "items") else other):
            self.set(k, v)
        return self

    def empty(self) -> StackedComposite:
        return StackedComposite(*[s.empty() for s in self._specs], dim=self._dim)

    # ------------------------------------------------------------------ values
    def _draw(self, how: str, shape: Any) -> Any:
        lead = torch.Size(shape if shape is not None else ())
        return lazy_stack([getattr(s, how)(shape) for s in self._specs], len(lead) + self._dim)

    def rand(self, shape: Any = None) -> Any:
        return self._draw("rand", shape)

    def zero(self, shape: Any = None) -> Any:
        return self._draw("zero", shape)

    def one(self, shape: Any = None) -> Any:
        return self._draw("one", shape)

    def is_in(self, val: Any) -> bool:
        if not isinstance(val, TensorDictBase):
            return False
        lead = self._lead(val, len(self._shape))
        if lead < 0:
            return False
        parts = self._unbind_value(val, lead)
        return len(parts) == len(self._specs) and all(s.is_in(p) for s, p in zip(self._specs, parts))

    def assert_is_in(self, val: Any) -> None:
        if not self.is_in(val):
            raise AssertionError(f"value is not in the StackedComposite spec {self!r}")

    def type_check(self, value: Any, selected_keys: Any = None) -> None:
        if not self.is_in(value):
            raise ValueError(f"value is not in the StackedComposite spec {self!r}")

    def project(self, val: Any) -> Any:
        lead = self._lead(val, len(self._shape))
        return lazy_stack([s.project(p) for s, p in zip(self._specs, self._unbind_value(val, lead))],
                          lead + self._dim)

    def expand(self, *shape: Any) -> StackedComposite:
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)) else shape
        n_new = len(shape) - len(self._shape)
        if n_new < 0 or any(s not in (-1, o) for s, o in zip(shape[n_new:], self._shape)):
            raise ValueError(f"cannot expand a StackedComposite of shape {list(self._shape)} to {list(shape)}")
        lead = tuple(shape[:n_new])
        return StackedComposite(*[s.expand(*lead, *s.shape) for s in self._specs], dim=self._dim + n_new)

    def to(self, dest: Any) -> StackedComposite:
        return StackedComposite(*[s.to(dest) for s in self._specs], dim=self._dim)

    def clone(self) -> StackedComposite:
        return StackedComposite(*[s.clone() for s in self._specs], dim=self._dim)

    def lock_(self, recurse: bool = True) -> StackedComposite:
        for s in self._specs:
            s.lock_(recurse)
        return self

    def unlock_(self, recurse: bool = True) -> StackedComposite:
        for s in self._specs:
            s.unlock_(recurse)
        return self

    @property
    def is_locked(self) -> bool:
        return all(s.is_locked for s in self._specs)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}: {self[k]!r}" for k in self._common())
        excl = self.repr_exclusive_keys()
        return (f"StackedComposite(fields={{{fields}}}, exclusive_fields={{{excl}}}, shape={list(self._shape)}, "
                f"stack_dim={self._dim})")


# ---------------------------------------------------------------------- helpers
def contains_lazy_spec(spec: TensorSpec) -> bool:
    """True if ``spec`` is, or (inside Composites) holds, a lazy stack of specs.

    Example:
        >>> import torch
        >>> from steersman.data import Composite, Unbounded
        >>> lazy = torch.stack([Unbounded(shape=(1,)), Unbounded(shape=(2,))], 0)
        >>> contains_lazy_spec(Composite(a=Unbounded())), contains_lazy_spec(Composite(a=lazy, shape=[2]))
        (False, True)
    """
    if isinstance(spec, (Stacked, StackedComposite)):
        return True
    if isinstance(spec, Composite):
        return any(contains_lazy_spec(v) for v in spec.values() if v is not None)
    return False


def check_no_exclusive_keys(spec: TensorSpec, recurse: bool = True) -> bool:
    """True if no lazy stack in ``spec`` has keys some of its members lack (looking into
    nested Composites and stacks when ``recurse``)."""
    if isinstance(spec, StackedComposite):
        keysets = [set(s.keys(include_nested=recurse)) for s in spec.specs]
        if any(k != keysets[0] for k in keysets[1:]):
            return False
        return not recurse or all(check_no_exclusive_keys(s, recurse) for s in spec.specs)
    if isinstance(spec, Composite) and recurse:
        return all(check_no_exclusive_keys(v, recurse) for v in spec.values() if v is not None)
    return True


def _zero_shaped(spec: TensorSpec, batch_nd: int) -> TensorSpec:
    """A copy of ``spec`` whose dims past the first ``batch_nd`` are 0 (scalars are copied)."""
    if isinstance(spec, Composite):
        out = Composite({}, shape=spec.shape[:batch_nd] if len(spec.shape) >= batch_nd else spec.shape,
                        device=spec.device)
        inner = len(out.shape)
        for k, v in spec.items():
            out.set(k, _zero_shaped(v, inner) if v is not None else None)
        return out
    nb = spec._batch_ndim
    if nb > batch_nd:
        return spec[(slice(None),) * batch_nd + (slice(0, 0),) * (nb - batch_nd)]
    return copy.deepcopy(spec)


def consolidate_spec(spec: Composite, recurse_through_entries: bool = True,
                     recurse_through_stack: bool = True) -> Composite:
    """A copy of ``spec`` where no lazy stack has exclusive keys: a member lacking a key gets
    a copy of another member's entry with its own dims set to 0 (scalars copied as they are).

    Args:
        spec: a :class:`Composite` (or :class:`StackedComposite`).
        recurse_through_entries: also consolidate the entries of Composites.
        recurse_through_stack: also consolidate inside each member of a lazy stack.

    Example:
        >>> import torch
        >>> from steersman.data import Composite, Unbounded
        >>> s = torch.stack([Composite(a=Unbounded(shape=(2,))), Composite(b=Unbounded(shape=(3,)))], 0)
        >>> c = consolidate_spec(s)
        >>> sorted(c.keys()), c[1]["a"].shape, c[0]["b"].shape
        (['a', 'b'], torch.Size([0]), torch.Size([0]))
    """
    if isinstance(spec, StackedComposite):
        members = [m.clone() for m in spec.specs]
        if recurse_through_stack:
            members = [consolidate_spec(m, recurse_through_entries, recurse_through_stack) for m in members]
        nd = len(members[0].shape)
        keys = set().union(*[set(m.keys(include_nested=True, leaves_only=True)) for m in members])
        for key in sorted(keys, key=str):
            source = next(m.get(key) for m in members if key in m.keys(include_nested=True, leaves_only=True))
            for m in members:
                if key not in m.keys(include_nested=True, leaves_only=True):
                    m.set(key, _zero_shaped(source, nd))
        return StackedComposite(*members, dim=spec.dim)
    if isinstance(spec, Composite):
        out = spec.clone()
        if recurse_through_entries:
            for k, v in list(out.items()):
                if isinstance(v, Composite):
                    out.set(k, consolidate_spec(v, recurse_through_entries, recurse_through_stack))
        return out
    return spec

