"""Discrete specs: ``Categorical``, ``OneHot``, ``MultiCategorical``, ``MultiOneHot``, ``Binary``.

Masks (``mask=`` or ``update_mask``) mark the allowed actions: ``rand`` draws only
allowed ones, ``is_in`` rejects the others and ``project`` maps a value to the
nearest allowed one. A mask is a bool tensor laid out as the one-hot form of the
spec: ``[*shape, n]`` for ``Categorical``, ``shape`` for ``OneHot``,
``[*shape[:-1], sum(nvec)]`` for ``MultiCategorical``, ``shape`` for ``MultiOneHot``.
Masks are not validated (each row must allow at least one value); ``is_in`` rejects
every value of a row that allows none.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from steersman.tensordict._utils import broadcast_shapes

from .base import (
    CategoricalBox,
    ShapeLike,
    TensorSpec,
    as_shape,
    dtype_kind,
    ends_with,
    first_index,
    fmt_tensor,
    to_tensor,
)

__all__ = ["Categorical", "OneHot", "MultiCategorical", "MultiOneHot", "Binary"]

_INT_SAMPLE_HIGH = 2**62  # randint range for sampling by modulo (bias < 2**-31)


# ---------------------------------------------------------------------- helpers
def _check_n(n: Any, name: str) -> int:
    if isinstance(n, Tensor):
        n = n.item()
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n <= 0:
        raise ValueError(f"{name}: n must be a positive integer (the number of values), got {n!r}")
    return int(n)


def _check_index_dtype(dtype: torch.dtype, n_max: int, name: str) -> None:
    kind = dtype_kind(dtype)
    if kind == "b":
        if n_max > 2:
            raise ValueError(f"{name}: dtype torch.bool holds only 2 values, but n={n_max}")
        return
    if kind != "i":
        raise ValueError(f"{name} needs an integer or bool dtype, got {dtype}")
    if n_max - 1 > torch.iinfo(dtype).max:
        raise ValueError(f"{name}: dtype {dtype} cannot hold the values 0..{n_max - 1}")


def _check_flag(value: Any, owner: str, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{owner}: {name} must be a bool, got {type(value).__name__}")
    return bool(value)


def _check_value_dtype(dtype: torch.dtype, name: str) -> None:
    if dtype_kind(dtype) == "c":
        raise ValueError(f"{name} does not take complex dtypes, got {dtype}")


def _as_mask(mask: Any, expected: torch.Size, device: torch.device, name: str) -> Tensor | None:
    if mask is None:
        return None
    m = to_tensor(mask, device=device)
    if m.dtype is not torch.bool:
        m = m != 0
    if m.shape != expected:
        try:
            m = m.expand(expected)
        except RuntimeError:
            raise ValueError(
                f"{name}: mask of shape {list(m.shape)} does not broadcast to the expected "
                f"mask shape {list(expected)}"
            ) from None
    return m


def _masked_sample(allowed: Tensor, extra: torch.Size) -> Tensor:
    """Uniform indices among the allowed entries of the last dim: ``[*extra, *allowed.shape[:-1]]``."""
    u = torch.rand(extra + allowed.shape, device=allowed.device)
    u.masked_fill_(~allowed, -1.0)
    return u.argmax(-1)


def _nearest_allowed(idx: Tensor, allowed: Tensor) -> Tensor:
    """The allowed index nearest to ``idx`` (the lower one on ties); ``idx`` itself if allowed."""
    m = allowed.shape[-1]
    d = (torch.arange(m, device=idx.device) - idx.unsqueeze(-1)).abs().to(torch.float32)
    return d.masked_fill_(~allowed, float("inf")).argmin(-1)


def _scores(val: Tensor) -> Tensor:
    """A floating, finite copy of ``val`` for argmax (NaN counts as the lowest value)."""
    if val.is_complex():
        val = val.real
    if not val.is_floating_point():
        val = val.to(torch.float32)
    info = torch.finfo(val.dtype)
    return torch.nan_to_num(val, nan=info.min, posinf=info.max, neginf=info.min)


def _one_hot(idx: Tensor, n: int, dtype: torch.dtype) -> Tensor:
    out = torch.zeros((*idx.shape, n), dtype=dtype, device=idx.device)
    return out.scatter_(-1, idx.unsqueeze(-1), 1)


def _as_index(val: Tensor) -> Tensor:
    """One-hot values to indices (argmax over the last dim)."""
    if val.dtype is torch.bool:
        val = val.to(torch.uint8)
    return val.argmax(-1)


def _round_index(val: Tensor) -> Tensor:
    """Any numeric tensor as int64 indices (floats rounded, NaN -> 0)."""
    if val.is_complex():
        val = val.real
    if val.is_floating_point():
        val = torch.nan_to_num(val.to(torch.float64).round(), nan=0.0)
        val = val.clamp(-(2.0**62), 2.0**62)
    return val.to(torch.int64)


class _Register:
    """Raw values -> class indices in the order they first appear (``use_register=True``).

    For envs whose discrete outcomes come from a set not known in advance: the first
    distinct value seen gets class 0, the next class 1, ... up to ``n`` classes.
    """

    def __init__(self, n: int, owner: str) -> None:
        self.n = n
        self.owner = owner
        self.index: dict[Any, int] = {}
        self.values: list[Any] = []

    def copy(self) -> _Register:
        new = _Register(self.n, self.owner)
        new.index, new.values = dict(self.index), list(self.values)
        return new

    def lookup(self, flat: list) -> list[int]:
        """The class of each value of ``flat``, registering new ones; nothing is registered
        when the values do not fit (the register is left as it was)."""
        new = [v for v in dict.fromkeys(flat) if v not in self.index]
        if len(self.values) + len(new) > self.n:
            raise ValueError(
                f"{self.owner}(use_register=True): {len(self.values) + len(new)} distinct values "
                f"seen but the spec has n={self.n} classes (registered so far: {self.values}, "
                f"new: {new})"
            )
        for v in new:
            self.index[v] = len(self.values)
            self.values.append(v)
        return [self.index[v] for v in flat]

    def inverse(self, idx: np.ndarray) -> np.ndarray:
        flat = idx.reshape(-1).tolist()
        unknown = sorted({i for i in flat if i >= len(self.values)})
        if unknown:
            raise ValueError(
                f"{self.owner}(use_register=True): class(es) {unknown} have no registered value "
                f"yet (registered: {self.values})"
            )
        out = np.empty(len(flat), dtype=object)
        out[:] = [self.values[i] for i in flat]
        out = out.reshape(idx.shape)
        try:  # numbers come back as a numeric array
            return out.astype(np.asarray(self.values).dtype)
        except (TypeError, ValueError):
            return out


def _raw_values(val: Any, idx_shape: torch.Size, owner: str) -> tuple[list, tuple[int, ...]]:
    """The elements of ``val`` as hashable Python values, and the shape they fill
    (``[*any, *idx_shape]``; a value with as many elements as ``idx_shape`` is reshaped)."""
    if isinstance(val, Tensor):
        val = val.detach().cpu().numpy()
    # lists may mix kinds (strings and numbers): an object array keeps each as given
    arr = np.array(val, dtype=object) if isinstance(val, (list, tuple)) else np.asarray(val)
    shape = tuple(arr.shape)
    n = len(idx_shape)
    if len(shape) < n or shape[len(shape) - n :] != tuple(idx_shape):
        if arr.size != math.prod(idx_shape):
            raise ValueError(
                f"{owner}(use_register=True).encode: a value of shape {list(shape)} does not end "
                f"with the index shape {list(idx_shape)}"
            )
        shape = tuple(idx_shape)
    return [v.item() if isinstance(v, np.generic) else v for v in arr.reshape(-1).tolist()], shape


class _Segments:
    """Layout of ``k`` sub-actions with ``nvec`` values each in one vector of ``sum(nvec)``.

    ``gidx[i, j]`` is the position of value ``j`` of sub-action ``i`` (clamped to the
    segment, padded up to ``max(nvec)``); ``valid[i, j]`` is ``j < nvec[i]``.
    """

    def __init__(self, nvec: Tensor) -> None:
        nvec = nvec.to(torch.int64)
        self.nvec = nvec
        self.k = nvec.numel()
        self.m = int(nvec.max()) if self.k else 1
        self.size = int(nvec.sum())
        self.offsets = torch.cumsum(nvec, 0) - nvec
        ar = torch.arange(self.m, device=nvec.device)
        last = (nvec - 1).unsqueeze(-1)
        self.valid = ar < nvec.unsqueeze(-1)
        self.gidx = self.offsets.unsqueeze(-1) + torch.minimum(ar, last)
        self.seg_id = torch.repeat_interleave(torch.arange(self.k, device=nvec.device), nvec)

    def padded(self, flat: Tensor) -> Tensor:
        """``[..., size]`` -> ``[..., k, m]`` (a bool mask: padding entries are False)."""
        out = flat[..., self.gidx]
        return out & self.valid if out.dtype is torch.bool else out

    def to_one_hot(self, idx: Tensor, dtype: torch.dtype) -> Tensor:
        out = torch.zeros((*idx.shape[:-1], self.size), dtype=dtype, device=idx.device)
        return out.scatter_(-1, idx + self.offsets, 1)

    def to_index(self, scores: Tensor) -> Tensor:
        """Per-segment argmax of ``[..., size]`` float scores: ``[..., k]``."""
        return self.padded(scores).masked_fill(~self.valid, float("-inf")).argmax(-1)

    def sums(self, val: Tensor) -> Tensor:
        """Per-segment sums of ``[..., size]``: ``[..., k]``."""
        out = torch.zeros((*val.shape[:-1], self.k), dtype=torch.int64, device=val.device)
        return out.index_add_(-1, self.seg_id, val.to(torch.int64))


# ---------------------------------------------------------------------- Categorical
class Categorical(TensorSpec):
    """Integer values in ``[0, n)``: a discrete action or a class label (Gymnasium ``Discrete``).

    Args:
        n: the number of values.
        shape: the shape of one value (default ``[]``: a scalar index).
        device: default: torch's default device.
        dtype: an integer dtype (default int64), or ``torch.bool`` when ``n <= 2``
            (the ``done``/``terminated`` specs: ``Categorical(2, (1,), dtype=torch.bool)``).
        mask: bool tensor ``[*shape, n]`` of the allowed values (default: all).

    Example:
        >>> import torch
        >>> from steersman.data import Categorical
        >>> spec = Categorical(4, shape=(2,))
        >>> a = spec.rand((3,))                    # [3, 2], values in 0..3
        >>> a.shape, a.dtype, spec.is_in(a)
        (torch.Size([3, 2]), torch.int64, True)
        >>> spec.is_in(torch.tensor([0, 4]))
        False
        >>> spec.project(torch.tensor([-1.2, 7.0]))
        tensor([0, 3])
        >>> spec.update_mask(torch.tensor([False, True, False, True]))  # only 1 and 3
        >>> set(spec.rand((100,)).unique().tolist()) <= {1, 3}
        True
        >>> spec.is_in(torch.tensor([1, 3])), spec.is_in(torch.tensor([1, 2]))
        (True, False)
        >>> spec.to_one_hot(torch.tensor([1, 3])).shape
        torch.Size([2, 4])
    """

    domain = "discrete"
    _tensor_attrs = ("_mask",)
    _eq_fields = ("_n",)

    def __init__(self, n: int, shape: ShapeLike = None, device: Any = None,
                 dtype: torch.dtype | None = torch.int64, mask: Any = None) -> None:
        n = _check_n(n, "Categorical")
        dtype = torch.int64 if dtype is None else dtype
        _check_index_dtype(dtype, n, "Categorical")
        super().__init__(shape, device=device, dtype=dtype)
        self._n = n
        self._mask = _as_mask(mask, self._shape + (n,), self._device, "Categorical")
        self._refresh()

    def _refresh(self) -> None:
        super()._refresh()
        # done/terminated specs: any bool value is valid, no kernel needed
        self._always_in = self._mask is None and self._kind == "b" and self._n == 2

    @property
    def n(self) -> int:
        return self._n

    @property
    def space(self) -> CategoricalBox:
        return CategoricalBox(self._n)

    @property
    def mask(self) -> Tensor | None:
        """The bool mask ``[*shape, n]`` of allowed values, or None (all allowed)."""
        return self._mask

    def cardinality(self) -> int:
        """The number of values of one element: ``n``."""
        return self._n

    def update_mask(self, mask: Any) -> None:
        """Sets the allowed values (a bool tensor broadcast to ``[*shape, n]``); None clears it."""
        self._mask = _as_mask(mask, self._shape + (self._n,), self._device, "Categorical")
        self._refresh()

    def _repr_fields(self) -> list[str]:
        out = [f"n={self._n}"]
        return out + ([f"mask={fmt_tensor(self._mask)}"] if self._mask is not None else [])

    def _cast(self, dtype: torch.dtype) -> TensorSpec:
        _check_index_dtype(dtype, self._n, "Categorical")
        return self._replace(_dtype=dtype)

    # ------------------------------------------------------------------ sampling
    def rand(self, shape: ShapeLike = None) -> Tensor:
        full = self._full_shape(shape)
        if self._mask is None:
            return torch.randint(0, self._n, full, dtype=self._dtype, device=self._device)
        extra = full[: len(full) - len(self._shape)]
        return _masked_sample(self._mask, extra).to(self._dtype)

    def zero(self, shape: ShapeLike = None) -> Tensor:
        full = self._full_shape(shape)
        if self._mask is None:
            return torch.zeros(full, dtype=self._dtype, device=self._device)
        first = self._mask.to(torch.uint8).argmax(-1)  # the first allowed value
        return first.to(self._dtype).expand(full).clone()

    def enumerate(self) -> Tensor:
        """All ``n`` values, ``[n, *shape]`` (the mask is ignored)."""
        ar = torch.arange(self._n, device=self._device, dtype=self._dtype if self._kind == "i" else None)
        return ar.view(self._n, *(1,) * self.ndim).expand(self._n, *self._shape).to(self._dtype)

    # ------------------------------------------------------------------ membership
    def _values_in(self, val: Tensor) -> bool:
        if self._always_in or not val.numel():
            return True
        lo, hi = torch.aminmax(val)  # one kernel for the range check
        if lo.item() < 0 or hi.item() >= self._n:
            return False
        if self._mask is None:
            return True
        m = self._mask.expand(*val.shape, self._n)
        return bool(m.gather(-1, val.to(torch.int64).unsqueeze(-1)).all())

    def _values_report(self, val: Tensor) -> str | None:
        in_range = torch.logical_and(val >= 0, val < self._n)
        if not bool(in_range.all()):
            bad = ~in_range
            i = first_index(bad)
            return (
                f"{int(bad.sum())} of {bad.numel()} value(s) out of range [0, {self._n}); "
                f"first at index {i}: {val[i].item()}"
            )
        if self._mask is None:
            return None
        m = self._mask.expand(*val.shape, self._n)
        allowed = m.gather(-1, val.to(torch.int64).unsqueeze(-1)).squeeze(-1)
        if bool(allowed.all()):
            return None
        i = first_index(~allowed)
        return (
            f"{int((~allowed).sum())} value(s) not allowed by the mask; first at index {i}: "
            f"{val[i].item()}"
        )

    # ------------------------------------------------------------------ conversions
    def _project(self, val: Tensor) -> Tensor:
        v = _round_index(val).clamp(0, self._n - 1)
        if self._mask is not None:
            v = _nearest_allowed(v, self._mask)
        return v.to(self._dtype)

    def to_one_hot(self, val: Tensor, safe: bool = False) -> Tensor:
        """Indices ``[*any, *shape]`` -> bool one-hot ``[*any, *shape, n]``."""
        if safe:
            self.assert_is_in(val)
        return _one_hot(val.to(torch.int64), self._n, torch.bool)

    def to_one_hot_spec(self) -> OneHot:
        """The matching :class:`OneHot` spec (shape ``[*shape, n]``, same mask)."""
        return OneHot(self._n, self._shape + (self._n,), self._device, torch.bool, mask=self._mask)


# ---------------------------------------------------------------------- OneHot
class OneHot(TensorSpec):
    """One-hot vectors over ``n`` classes: the last dim of the shape is ``n``.

    Args:
        n: the number of classes.
        shape: ``[*batch, n]`` (default ``[n]``).
        device: default: torch's default device.
        dtype: default ``torch.bool`` (any real dtype: values are 0/1).
        use_register: ``encode`` maps raw values (any numbers or strings, shape
            ``shape[:-1]``) onto classes in the order they first appear (the first
            distinct value is class 0...), and ``to_numpy`` maps classes back to the
            values: for envs whose outcomes come from a set not known in advance. More
            than ``n`` distinct values raise ``ValueError`` (nothing is registered).
            ``clone()`` copies the register; indexing and ``expand`` share it.
        mask: bool tensor of ``shape`` marking the allowed classes.

    ``encode`` also takes indices (a Gymnasium ``Discrete`` value) and ``to_numpy``
    returns indices, so the two convert between the env's and the library's forms.
    ``zero()``/``one()`` give the one-hot of the first allowed class.

    With a register:

        >>> spec = OneHot(3, use_register=True)
        >>> spec.encode(42), spec.encode(7), spec.encode(42)
        (tensor([ True, False, False]), tensor([False,  True, False]), tensor([ True, False, False]))
        >>> spec.to_numpy(spec.encode(7))
        array(7)

    Example:
        >>> import torch
        >>> from steersman.data import OneHot
        >>> spec = OneHot(3)
        >>> x = spec.rand((5,))                    # [5, 3]
        >>> x.shape, spec.is_in(x), bool((x.sum(-1) == 1).all())
        (torch.Size([5, 3]), True, True)
        >>> spec.encode(2)
        tensor([False, False,  True])
        >>> spec.to_numpy(torch.tensor([False, True, False]))
        array(1)
        >>> spec.project(torch.tensor([0.1, 0.7, 0.2]))
        tensor([False,  True, False])
        >>> spec.to_categorical_spec()
        Categorical(shape=[], n=3, device=cpu, dtype=torch.int64, domain=discrete)
    """

    domain = "discrete"
    _event_ndim = 1
    _tensor_attrs = ("_mask",)
    _eq_fields = ("_n", "use_register")

    def __init__(self, n: int, shape: ShapeLike = None, device: Any = None,
                 dtype: torch.dtype | None = torch.bool, use_register: bool = False,
                 mask: Any = None) -> None:
        n = _check_n(n, "OneHot")
        dtype = torch.bool if dtype is None else dtype
        _check_value_dtype(dtype, "OneHot")
        shape = torch.Size((n,)) if shape is None else as_shape(shape)
        if not shape or shape[-1] != n:
            raise ValueError(f"OneHot: the last dim of shape {list(shape)} must be n={n}")
        super().__init__(shape, device=device, dtype=dtype)
        self._n = n
        self.use_register = _check_flag(use_register, "OneHot", "use_register")
        self._register = _Register(n, "OneHot") if self.use_register else None
        self._mask = _as_mask(mask, self._shape, self._device, "OneHot")
        self._refresh()

    @property
    def register(self) -> dict:
        """The registered values and their classes (``{value: class}``; empty without
        ``use_register``)."""
        return dict(self._register.index) if self._register is not None else {}

    def clone(self) -> TensorSpec:
        new = super().clone()
        if self._register is not None:
            new._register = self._register.copy()
        return new

    @property
    def n(self) -> int:
        return self._n

    @property
    def space(self) -> CategoricalBox:
        return CategoricalBox(self._n)

    @property
    def mask(self) -> Tensor | None:
        return self._mask

    def cardinality(self) -> int:
        return self._n

    def update_mask(self, mask: Any) -> None:
        """Sets the allowed classes (a bool tensor broadcast to ``shape``); None clears it."""
        self._mask = _as_mask(mask, self._shape, self._device, "OneHot")
        self._refresh()

    def _repr_fields(self) -> list[str]:
        out = [f"n={self._n}"]
        return out + ([f"mask={fmt_tensor(self._mask)}"] if self._mask is not None else [])

    def _cast(self, dtype: torch.dtype) -> TensorSpec:
        _check_value_dtype(dtype, "OneHot")
        return self._replace(_dtype=dtype)

    # ------------------------------------------------------------------ sampling
    def _refresh(self) -> None:
        super()._refresh()
        # rows of the identity: one index op gives the one-hot vectors (small n only)
        small = self._n <= 1024
        self._eye = torch.eye(self._n, dtype=self._dtype, device=self._device) if small else None

    def _encode_index(self, idx: Tensor) -> Tensor:
        return self._eye[idx] if self._eye is not None else _one_hot(idx, self._n, self._dtype)

    def rand(self, shape: ShapeLike = None) -> Tensor:
        full = self._full_shape(shape)
        if self._mask is None:
            idx = torch.randint(0, self._n, full[:-1], device=self._device)
        else:
            idx = _masked_sample(self._mask, full[: len(full) - len(self._shape)])
        return self._encode_index(idx)

    def zero(self, shape: ShapeLike = None) -> Tensor:
        full = self._full_shape(shape)
        if self._mask is None:
            out = torch.zeros(full, dtype=self._dtype, device=self._device)
            out[..., 0] = 1
            return out
        first = self._mask.to(torch.uint8).argmax(-1)  # the first allowed class
        return self._encode_index(first).expand(full).clone()

    def one(self, shape: ShapeLike = None) -> Tensor:
        return self.zero(shape)

    def enumerate(self) -> Tensor:
        """All ``n`` one-hot values, ``[n, *shape]`` (the mask is ignored)."""
        eye = torch.eye(self._n, dtype=self._dtype, device=self._device)
        return eye.view(self._n, *(1,) * (self.ndim - 1), self._n).expand(self._n, *self._shape)

    # ------------------------------------------------------------------ membership
    def _values_in(self, val: Tensor) -> bool:
        ok = (val.sum(-1) == 1).all()
        if val.dtype is not torch.bool:
            ok = ok & torch.logical_or(val == 0, val == 1).all()
        if self._mask is not None:
            ok = ok & ~(val.bool() & ~self._mask).any()
        return bool(ok)

    def _values_report(self, val: Tensor) -> str | None:
        if val.dtype is not torch.bool:
            binary = torch.logical_or(val == 0, val == 1)
            if not bool(binary.all()):
                i = first_index(~binary)
                return f"one-hot values must be 0 or 1; first other value at index {i}: {val[i].item()}"
        sums = val.sum(-1)
        if not bool((sums == 1).all()):
            i = first_index(sums != 1)
            return f"each one-hot vector must have exactly one 1; the vector at index {i} has {sums[i].item()}"
        if self._mask is not None:
            bad = (val.bool() & ~self._mask).any(-1)
            if bool(bad.any()):
                i = first_index(bad)
                return (
                    f"{int(bad.sum())} one-hot vector(s) pick a class the mask forbids; first at "
                    f"index {i}: class {int(_as_index(val[i]))}"
                )
        return None

    # ------------------------------------------------------------------ conversions
    def _project(self, val: Tensor) -> Tensor:
        s = _scores(val)
        if self._mask is not None:
            s = s.masked_fill(~self._mask, float("-inf"))
        return self._encode_index(s.argmax(-1))

    def encode(self, val: Any, *, ignore_device: bool = False) -> Tensor:
        """A one-hot tensor from one-hot values or from indices (e.g. a Gymnasium ``Discrete`` value);
        with ``use_register``, from raw values (see the class docstring)."""
        if self._register is not None:
            flat, shape = _raw_values(val, self._shape[:-1], "OneHot")
            idx = torch.tensor(self._register.lookup(flat), dtype=torch.int64).reshape(shape)
            return _one_hot(idx.to(None if ignore_device else self._device), self._n, self._dtype)
        t = to_tensor(val, device=None if ignore_device else self._device)
        if ends_with(t.shape, self._shape):
            return t.to(self._dtype)
        idx_shape = self._shape[:-1]
        if dtype_kind(t.dtype) in "ib":
            if not ends_with(t.shape, idx_shape) and t.numel() == math.prod(idx_shape):
                t = t.reshape(idx_shape)
            if ends_with(t.shape, idx_shape):
                return _one_hot(t.to(torch.int64), self._n, self._dtype)
        return self._fit_shape(t.to(self._dtype))

    def to_numpy(self, val: Tensor, safe: bool = False) -> np.ndarray:
        """The class indices of one-hot ``val`` as a numpy array (the inverse of ``encode``;
        with ``use_register``, the registered values)."""
        if safe:
            self.assert_is_in(val)
        idx = _as_index(val.detach()).cpu().numpy()
        return idx if self._register is None else self._register.inverse(idx)

    def to_categorical(self, val: Tensor, safe: bool = False) -> Tensor:
        """One-hot ``[*any, *shape]`` -> int64 indices ``[*any, *shape[:-1]]``."""
        if safe:
            self.assert_is_in(val)
        return _as_index(val)

    def to_categorical_spec(self) -> Categorical:
        """The matching :class:`Categorical` spec (shape ``shape[:-1]``, same mask)."""
        return Categorical(self._n, self._shape[:-1], self._device, torch.int64, self._mask)


# ---------------------------------------------------------------------- MultiCategorical
class MultiCategorical(TensorSpec):
    """Several categorical sub-actions in the last dim: value ``i`` is in ``[0, nvec[i])``
    (Gymnasium ``MultiDiscrete``).

    Args:
        nvec: the number of values of each sub-action (a list or tensor; broadcast to ``shape``).
        shape: ``[*batch, k]`` (default ``nvec``'s shape).
        device: default: torch's default device.
        dtype: an integer dtype (default int64).
        mask: bool tensor ``[*shape[:-1], sum(nvec)]``: the allowed values of each
            sub-action, concatenated (needs the same ``nvec`` for every batch element).
        remove_singleton: for a spec of shape exactly ``[1]`` (one sub-action, no batch
            dims), ``rand`` drops that last dim: ``rand()`` is a scalar and
            ``rand((5,))`` has shape ``[5]``; ``is_in`` then accepts values with or
            without it. Default ``True``, as in TorchRL; ``False`` keeps ``rand``'s
            shape ``[*shape_arg, 1]``. Other shapes are unaffected.

    Example:
        >>> import torch
        >>> from steersman.data import MultiCategorical
        >>> spec = MultiCategorical([2, 3, 4])
        >>> a = spec.rand((5,))                    # [5, 3]
        >>> a.shape, spec.is_in(a), bool((a < torch.tensor([2, 3, 4])).all())
        (torch.Size([5, 3]), True, True)
        >>> spec.is_in(torch.tensor([1, 3, 0]))    # 3 is out of [0, 3)
        False
        >>> spec.project(torch.tensor([5, -1, 2]))
        tensor([1, 0, 2])
        >>> spec.to_one_hot(torch.tensor([1, 0, 3]))
        tensor([False,  True,  True, False, False, False, False, False,  True])
    """

    domain = "discrete"
    _event_ndim = 1
    _tensor_attrs = ("_nvec", "_mask")

    def __init__(self, nvec: Any, shape: ShapeLike = None, device: Any = None,
                 dtype: torch.dtype | None = torch.int64, mask: Any = None,
                 remove_singleton: bool = True) -> None:
        self.remove_singleton = _check_flag(remove_singleton, "MultiCategorical", "remove_singleton")
        nv = to_tensor(nvec)
        if nv.is_floating_point() or nv.is_complex():
            raise ValueError(f"MultiCategorical: nvec must hold integers, got {fmt_tensor(nv)}")
        nv = nv.to(torch.int64)
        if nv.ndim == 0:
            nv = nv.unsqueeze(0)
        if nv.numel() and bool((nv <= 0).any()):
            raise ValueError(f"MultiCategorical: every nvec entry must be positive, got {fmt_tensor(nv)}")
        if shape is None:
            shape = nv.shape
        shape = as_shape(shape)
        try:
            ok = len(shape) >= 1 and broadcast_shapes(nv.shape, shape) == shape
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(
                f"MultiCategorical: nvec of shape {list(nv.shape)} does not broadcast to the "
                f"spec shape {list(shape)} (which needs at least one dim)"
            )
        dtype = torch.int64 if dtype is None else dtype
        _check_index_dtype(dtype, int(nv.max()) if nv.numel() else 1, "MultiCategorical")
        super().__init__(shape, device=device, dtype=dtype)
        self._nvec = nv.to(self._device).expand(self._shape).clone()
        self._mask = None
        self._refresh()
        if mask is not None:
            self.update_mask(mask)

    def _refresh(self) -> None:
        super()._refresh()
        nv = self._nvec
        k = self._shape[-1]
        rows = nv.reshape(-1, k)
        self._row = rows[0] if rows.shape[0] else torch.ones(k, dtype=torch.int64, device=nv.device)
        self._uniform = bool((rows == self._row).all())
        self._seg = _Segments(self._row) if self._uniform else None
        self._allowed = None if self._mask is None else self._seg.padded(self._mask)
        self._zeros = torch.zeros_like(nv)
        self._nvec_m1 = nv - 1
        self._squeeze = self.remove_singleton and self._shape == (1,)

    def _segments(self, what: str) -> _Segments:
        if self._seg is None:
            raise ValueError(
                f"MultiCategorical: {what} needs the same nvec for every batch element, "
                f"got nvec={fmt_tensor(self._nvec)}"
            )
        return self._seg

    @property
    def nvec(self) -> Tensor:
        """The number of values of each element, a tensor of the spec's shape."""
        return self._nvec

    @property
    def mask(self) -> Tensor | None:
        return self._mask

    def cardinality(self) -> int:
        """The number of joint values of one sub-action vector: ``prod(nvec)``."""
        return int(self._segments("cardinality").nvec.prod())

    def update_mask(self, mask: Any) -> None:
        """Sets the allowed values: a bool tensor ``[*shape[:-1], sum(nvec)]``; None clears it."""
        if mask is not None:
            seg = self._segments("a mask")
            mask = _as_mask(mask, self._shape[:-1] + (seg.size,), self._device, "MultiCategorical")
        self._mask = mask
        self._refresh()

    def _repr_fields(self) -> list[str]:
        out = [f"nvec={fmt_tensor(self._nvec)}"]
        return out + ([f"mask={fmt_tensor(self._mask)}"] if self._mask is not None else [])

    def _cast(self, dtype: torch.dtype) -> TensorSpec:
        _check_index_dtype(dtype, int(self._nvec.max()), "MultiCategorical")
        return self._replace(_dtype=dtype)

    # ------------------------------------------------------------------ sampling
    def rand(self, shape: ShapeLike = None) -> Tensor:
        full = self._full_shape(shape)
        if self._allowed is None:
            r = torch.randint(0, _INT_SAMPLE_HIGH, full, dtype=torch.int64, device=self._device)
            out = r.remainder_(self._nvec)
        else:
            out = _masked_sample(self._allowed, full[: len(full) - len(self._shape)])
        if self._squeeze:
            out = out.squeeze(-1)
        return out if self._dtype is torch.int64 else out.to(self._dtype)

    def _unsqueezed(self, val: Any) -> Any:
        if self._squeeze and isinstance(val, Tensor) and (val.ndim == 0 or val.shape[-1] != 1):
            return val.unsqueeze(-1)  # a sample whose singleton dim was removed
        return val

    def is_in(self, val: Any) -> bool:
        return super().is_in(self._unsqueezed(val))

    def _check(self, val: Any) -> str | None:
        return super()._check(self._unsqueezed(val))

    def zero(self, shape: ShapeLike = None) -> Tensor:
        if self._mask is None:
            return torch.zeros(self._full_shape(shape), dtype=self._dtype, device=self._device)
        return super().zero(shape)

    def enumerate(self) -> Tensor:
        """All ``prod(nvec)`` joint values, ``[prod(nvec), *shape]`` (the mask is ignored)."""
        seg = self._segments("enumerate")
        grids = torch.cartesian_prod(*[torch.arange(int(n), device=self._device) for n in seg.nvec])
        grids = grids.reshape(-1, seg.k)
        card = grids.shape[0]
        return grids.view(card, *(1,) * (self.ndim - 1), seg.k).expand(card, *self._shape).to(self._dtype)

    # ------------------------------------------------------------------ membership
    def _values_in(self, val: Tensor) -> bool:
        if not torch.equal(torch.clamp(val, self._zeros, self._nvec_m1), val):
            return False
        if self._allowed is None:
            return True
        m = self._allowed.expand(*val.shape, self._allowed.shape[-1])
        return bool(m.gather(-1, val.to(torch.int64).unsqueeze(-1)).all())

    def _values_report(self, val: Tensor) -> str | None:
        in_range = torch.logical_and(val >= 0, val < self._nvec)
        if not bool(in_range.all()):
            bad = ~in_range
            i = first_index(bad)
            j = i[len(i) - self.ndim :]
            return (
                f"{int(bad.sum())} of {bad.numel()} value(s) out of range; first at index {i}: "
                f"{val[i].item()} is not in [0, {self._nvec[j].item()})"
            )
        if self._allowed is None:
            return None
        m = self._allowed.expand(*val.shape, self._allowed.shape[-1])
        allowed = m.gather(-1, val.to(torch.int64).unsqueeze(-1)).squeeze(-1)
        if bool(allowed.all()):
            return None
        i = first_index(~allowed)
        return (
            f"{int((~allowed).sum())} value(s) not allowed by the mask; first at index {i}: "
            f"{val[i].item()}"
        )

    # ------------------------------------------------------------------ conversions
    def _project(self, val: Tensor) -> Tensor:
        v = torch.clamp(_round_index(val), self._zeros, self._nvec_m1)
        if self._allowed is not None:
            v = _nearest_allowed(v, self._allowed)
        return v.to(self._dtype)

    def to_one_hot(self, val: Tensor, safe: bool = False) -> Tensor:
        """Indices ``[*any, *shape]`` -> bool multi-one-hot ``[*any, *shape[:-1], sum(nvec)]``."""
        if safe:
            self.assert_is_in(val)
        return self._segments("to_one_hot").to_one_hot(val.to(torch.int64), torch.bool)

    def to_one_hot_spec(self) -> MultiOneHot:
        """The matching :class:`MultiOneHot` spec (same nvec and mask)."""
        seg = self._segments("to_one_hot_spec")
        return MultiOneHot(seg.nvec.tolist(), self._shape[:-1] + (seg.size,), self._device,
                           torch.bool, mask=self._mask)


# ---------------------------------------------------------------------- MultiOneHot
class MultiOneHot(TensorSpec):
    """Several one-hot vectors concatenated in the last dim (sizes ``nvec``).

    Args:
        nvec: the number of classes of each sub-action (a list of ints).
        shape: ``[*batch, sum(nvec)]`` (default ``[sum(nvec)]``).
        device: default: torch's default device.
        dtype: default ``torch.bool``.
        use_register: as :class:`OneHot`'s, one register per sub-action: ``encode``
            maps raw values ``[*shape[:-1], len(nvec)]`` onto classes in the order each
            part's values first appear, ``to_numpy`` maps them back.
        mask: bool tensor of ``shape`` marking the allowed classes.

    ``encode`` also takes per-sub-action indices (Gymnasium ``MultiDiscrete``) and
    ``to_numpy`` returns indices.

    Example:
        >>> import torch
        >>> from steersman.data import MultiOneHot
        >>> spec = MultiOneHot([2, 3])
        >>> x = spec.rand((4,))                    # [4, 5]
        >>> x.shape, spec.is_in(x)
        (torch.Size([4, 5]), True)
        >>> spec.encode([1, 2])
        tensor([False,  True, False, False,  True])
        >>> spec.to_categorical(spec.encode([1, 2]))
        tensor([1, 2])
        >>> spec.is_in(torch.tensor([True, True, False, False, True]))  # two 1s in the first part
        False
    """

    domain = "discrete"
    _event_ndim = 1
    _tensor_attrs = ("_mask",)
    _eq_fields = ("_nvec_list", "use_register")

    def __init__(self, nvec: Any, shape: ShapeLike = None, device: Any = None,
                 dtype: torch.dtype | None = torch.bool, use_register: bool = False,
                 mask: Any = None) -> None:
        nv = to_tensor(nvec)
        if nv.ndim != 1 or nv.numel() == 0 or nv.is_floating_point() or bool((nv <= 0).any()):
            raise ValueError(f"MultiOneHot: nvec must be a non-empty list of positive ints, got {nvec!r}")
        self._nvec_list = [int(n) for n in nv.tolist()]
        size = sum(self._nvec_list)
        shape = torch.Size((size,)) if shape is None else as_shape(shape)
        if not shape or shape[-1] != size:
            raise ValueError(f"MultiOneHot: the last dim of shape {list(shape)} must be sum(nvec)={size}")
        dtype = torch.bool if dtype is None else dtype
        _check_value_dtype(dtype, "MultiOneHot")
        super().__init__(shape, device=device, dtype=dtype)
        self.use_register = _check_flag(use_register, "MultiOneHot", "use_register")
        self._registers = ([_Register(n, "MultiOneHot") for n in self._nvec_list]
                           if self.use_register else None)
        self._mask = _as_mask(mask, self._shape, self._device, "MultiOneHot")
        self._refresh()

    def clone(self) -> TensorSpec:
        new = super().clone()
        if self._registers is not None:
            new._registers = [r.copy() for r in self._registers]
        return new

    def _refresh(self) -> None:
        super()._refresh()
        self._seg = _Segments(torch.tensor(self._nvec_list, device=self._device))
        self._allowed = None if self._mask is None else self._seg.padded(self._mask)

    @property
    def nvec(self) -> list[int]:
        return list(self._nvec_list)

    @property
    def mask(self) -> Tensor | None:
        return self._mask

    def cardinality(self) -> int:
        return math.prod(self._nvec_list)

    def update_mask(self, mask: Any) -> None:
        """Sets the allowed classes (a bool tensor broadcast to ``shape``); None clears it."""
        self._mask = _as_mask(mask, self._shape, self._device, "MultiOneHot")
        self._refresh()

    def _repr_fields(self) -> list[str]:
        out = [f"nvec={self._nvec_list}"]
        return out + ([f"mask={fmt_tensor(self._mask)}"] if self._mask is not None else [])

    def _cast(self, dtype: torch.dtype) -> TensorSpec:
        _check_value_dtype(dtype, "MultiOneHot")
        return self._replace(_dtype=dtype)

    # ------------------------------------------------------------------ sampling
    def _rand_index(self, full: torch.Size) -> Tensor:
        seg = self._seg
        if self._allowed is None:
            r = torch.randint(0, _INT_SAMPLE_HIGH, (*full[:-1], seg.k), device=self._device)
            return r.remainder_(seg.nvec)
        return _masked_sample(self._allowed, full[: len(full) - len(self._shape)])

    def rand(self, shape: ShapeLike = None) -> Tensor:
        full = self._full_shape(shape)
        return self._seg.to_one_hot(self._rand_index(full), self._dtype)

    def zero(self, shape: ShapeLike = None) -> Tensor:
        if self._mask is None:
            full = self._full_shape(shape)
            idx = torch.zeros((*full[:-1], self._seg.k), dtype=torch.int64, device=self._device)
            return self._seg.to_one_hot(idx, self._dtype)
        return super().zero(shape)

    def one(self, shape: ShapeLike = None) -> Tensor:
        return self.zero(shape)

    # ------------------------------------------------------------------ membership
    def _values_in(self, val: Tensor) -> bool:
        ok = (self._seg.sums(val) == 1).all()
        if val.dtype is not torch.bool:
            ok = ok & torch.logical_or(val == 0, val == 1).all()
        if self._mask is not None:
            ok = ok & ~(val.bool() & ~self._mask).any()
        return bool(ok)

    def _values_report(self, val: Tensor) -> str | None:
        if val.dtype is not torch.bool:
            binary = torch.logical_or(val == 0, val == 1)
            if not bool(binary.all()):
                i = first_index(~binary)
                return f"one-hot values must be 0 or 1; first other value at index {i}: {val[i].item()}"
        sums = self._seg.sums(val)
        if not bool((sums == 1).all()):
            i = first_index(sums != 1)
            return (
                f"each of the {self._seg.k} one-hot parts (sizes {self._nvec_list}) must have "
                f"exactly one 1; part {i[-1]} of the vector at index {i[:-1]} has {sums[i].item()}"
            )
        if self._mask is not None:
            bad = val.bool() & ~self._mask
            if bool(bad.any()):
                i = first_index(bad)
                return f"{int(bad.sum())} 1(s) at positions the mask forbids; first at index {i}"
        return None

    # ------------------------------------------------------------------ conversions
    def _project(self, val: Tensor) -> Tensor:
        s = _scores(val)
        if self._mask is not None:
            s = s.masked_fill(~self._mask, float("-inf"))
        return self._seg.to_one_hot(self._seg.to_index(s), self._dtype)

    def encode(self, val: Any, *, ignore_device: bool = False) -> Tensor:
        """A multi-one-hot tensor from multi-one-hot values or from per-part indices; with
        ``use_register``, from per-part raw values."""
        if self._registers is not None:
            k = self._seg.k
            flat, shape = _raw_values(val, self._shape[:-1] + (k,), "MultiOneHot")
            parts = [flat[i::k] for i in range(k)]
            fresh = [r.copy() for r in self._registers]  # all parts fit, or none is changed
            cols = [r.lookup(p) for r, p in zip(fresh, parts)]
            self._registers = fresh
            idx = torch.tensor(cols, dtype=torch.int64).T.reshape(shape)
            return self._seg.to_one_hot(idx.to(None if ignore_device else self._device), self._dtype)
        t = to_tensor(val, device=None if ignore_device else self._device)
        if ends_with(t.shape, self._shape):
            return t.to(self._dtype)
        idx_shape = self._shape[:-1] + (self._seg.k,)
        if dtype_kind(t.dtype) in "ib":
            if not ends_with(t.shape, idx_shape) and t.numel() == math.prod(idx_shape):
                t = t.reshape(idx_shape)
            if ends_with(t.shape, idx_shape):
                return self._seg.to_one_hot(t.to(torch.int64), self._dtype)
        return self._fit_shape(t.to(self._dtype))

    def to_numpy(self, val: Tensor, safe: bool = False) -> np.ndarray:
        """Per-part indices of ``val`` as a numpy array (the inverse of ``encode``; with
        ``use_register``, the registered values)."""
        idx = self.to_categorical(val.detach(), safe).cpu().numpy()
        if self._registers is None:
            return idx
        cols = [r.inverse(idx[..., i]) for i, r in enumerate(self._registers)]
        if len({c.dtype for c in cols}) > 1:  # parts of different kinds: an object array
            cols = [c.astype(object) for c in cols]
        return np.stack(cols, -1)

    def to_categorical(self, val: Tensor, safe: bool = False) -> Tensor:
        """Multi-one-hot ``[*any, *shape]`` -> int64 indices ``[*any, *shape[:-1], len(nvec)]``."""
        if safe:
            self.assert_is_in(val)
        return self._seg.to_index(_scores(val))

    def to_categorical_spec(self) -> MultiCategorical:
        """The matching :class:`MultiCategorical` spec (same nvec and mask)."""
        return MultiCategorical(self._nvec_list, self._shape[:-1] + (self._seg.k,), self._device,
                                torch.int64, self._mask)


# ---------------------------------------------------------------------- Binary
class Binary(TensorSpec):
    """``n`` independent bits in the last dim (Gymnasium ``MultiBinary``); values 0 or 1.

    Args:
        n: the number of bits (default ``shape[-1]``).
        shape: ``[*batch, n]`` (default ``[n]``).
        device: default: torch's default device.
        dtype: default ``torch.int8`` (any real dtype; bool allowed).

    Example:
        >>> import torch
        >>> from steersman.data import Binary
        >>> spec = Binary(4)
        >>> x = spec.rand((2,))                    # [2, 4]
        >>> x.shape, x.dtype, spec.is_in(x)
        (torch.Size([2, 4]), torch.int8, True)
        >>> spec.is_in(torch.tensor([0, 1, 2, 0], dtype=torch.int8))
        False
        >>> spec.project(torch.tensor([0.2, 0.9, -3.0, 7.0]))
        tensor([0, 1, 0, 1], dtype=torch.int8)
    """

    domain = "discrete"
    _event_ndim = 1
    _eq_fields = ("_n",)

    def __init__(self, n: int | None = None, shape: ShapeLike = None, device: Any = None,
                 dtype: torch.dtype | None = torch.int8) -> None:
        if n is None and shape is None:
            raise TypeError("Binary needs n or shape")
        if shape is None:
            shape = (_check_n(n, "Binary"),)
        shape = as_shape(shape)
        if not shape:
            raise ValueError("Binary: shape must have at least one dim (the bits)")
        n = shape[-1] if n is None else _check_n(n, "Binary")
        if shape[-1] != n:
            raise ValueError(f"Binary: the last dim of shape {list(shape)} must be n={n}")
        dtype = torch.int8 if dtype is None else dtype
        _check_value_dtype(dtype, "Binary")
        super().__init__(shape, device=device, dtype=dtype)
        self._n = n

    @property
    def n(self) -> int:
        return self._n

    def cardinality(self) -> int:
        """The number of values of one bit vector: ``2 ** n``."""
        return 2**self._n

    def update_mask(self, mask: Any) -> None:
        raise TypeError(
            "Binary specs have no action mask: each of the n bits is free; "
            "use Categorical or OneHot for masked actions"
        )

    def _repr_fields(self) -> list[str]:
        return [f"n={self._n}"]

    def _cast(self, dtype: torch.dtype) -> TensorSpec:
        _check_value_dtype(dtype, "Binary")
        return self._replace(_dtype=dtype)

    def rand(self, shape: ShapeLike = None) -> Tensor:
        return torch.randint(0, 2, self._full_shape(shape), dtype=self._dtype, device=self._device)

    def zero(self, shape: ShapeLike = None) -> Tensor:
        return torch.zeros(self._full_shape(shape), dtype=self._dtype, device=self._device)

    def one(self, shape: ShapeLike = None) -> Tensor:
        return torch.ones(self._full_shape(shape), dtype=self._dtype, device=self._device)

    def _values_in(self, val: Tensor) -> bool:
        if val.dtype is torch.bool or not val.numel():
            return True
        if self._kind == "i" and dtype_kind(val.dtype) == "i":
            lo, hi = torch.aminmax(val)
            return lo.item() >= 0 and hi.item() <= 1
        return bool(torch.logical_or(val == 0, val == 1).all())

    def _values_report(self, val: Tensor) -> str | None:
        if self._values_in(val):
            return None
        bad = ~torch.logical_or(val == 0, val == 1)
        i = first_index(bad)
        return f"{int(bad.sum())} value(s) are not 0 or 1; first at index {i}: {val[i].item()}"

    def _project(self, val: Tensor) -> Tensor:
        if val.dtype is torch.bool:
            return val.to(self._dtype)
        if val.is_complex():
            val = val.real
        return (val > 0.5).to(self._dtype)
