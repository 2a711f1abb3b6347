"""Element-wise numeric specs: ``Unbounded`` (any value) and ``Bounded`` (``low <= x <= high``).

Both pick their concrete class from the dtype, as in TorchRL: a floating dtype gives
the ``...Continuous`` class (domain ``"continuous"``), an integer or bool dtype the
``...Discrete`` one (domain ``"discrete"``); ``isinstance(spec, Bounded)`` holds for both.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from steersman.tensordict._utils import broadcast_shapes

from .base import (
    DEFAULT_SHAPE,
    ContinuousBox,
    ShapeLike,
    TensorSpec,
    as_shape,
    dtype_kind,
    first_index,
    fmt_tensor,
    to_tensor,
)

__all__ = [
    "Unbounded",
    "UnboundedContinuous",
    "UnboundedDiscrete",
    "Bounded",
    "BoundedContinuous",
    "BoundedDiscrete",
]

_INT_SAMPLE_HIGH = 2**62  # randint range for integer sampling by modulo (bias < 2**-31)


def _dtype_min_max(dtype: torch.dtype) -> tuple[float, float]:
    if dtype is torch.bool:
        return 0, 1
    info = torch.finfo(dtype) if dtype.is_floating_point or dtype.is_complex else torch.iinfo(dtype)
    return info.min, info.max


def _round_cast(val: Tensor, dtype: torch.dtype) -> Tensor:
    """Float values rounded and made finite, then cast to an integer or bool ``dtype``."""
    if val.is_floating_point():
        lo, hi = _dtype_min_max(dtype)
        val = torch.nan_to_num(val.round(), nan=0.0).clamp(lo, hi)
    elif val.is_complex():
        return _round_cast(val.real, dtype)
    return val.to(dtype) if dtype is not torch.bool else val != 0


class Unbounded(TensorSpec):
    """A tensor of any value: the spec of unconstrained observations, rewards, logits.

    ``Unbounded(shape, device, dtype)`` returns an :class:`UnboundedContinuous`
    (floating ``dtype``, the default) or an :class:`UnboundedDiscrete` (integer or
    bool ``dtype``). ``rand`` draws standard normal values (continuous) or uniform
    integers over the dtype's range (discrete).

    Args:
        shape: the shape of one value (default ``[1]``).
        device: default: torch's default device.
        dtype: default: torch's default floating dtype.

    Example:
        >>> import torch
        >>> from steersman.data import Unbounded, UnboundedContinuous, UnboundedDiscrete
        >>> spec = Unbounded(shape=(3,))
        >>> type(spec).__name__, spec.domain, spec.dtype
        ('UnboundedContinuous', 'continuous', torch.float32)
        >>> spec.rand((2,)).shape                 # [*rand shape, *spec shape]
        torch.Size([2, 3])
        >>> counter = Unbounded(shape=(1,), dtype=torch.int64)
        >>> isinstance(counter, UnboundedDiscrete), counter.is_in(torch.tensor([7]))
        (True, True)
        >>> counter.is_in(torch.tensor([7.0]))    # wrong dtype kind
        False
    """

    def __new__(cls, shape: ShapeLike = DEFAULT_SHAPE, device: Any = None,
                dtype: torch.dtype | None = None, **kwargs: Any) -> Unbounded:
        if cls is Unbounded:
            dt = torch.get_default_dtype() if dtype is None else dtype
            cls = UnboundedContinuous if dtype_kind(dt) in "fc" else UnboundedDiscrete
        return super().__new__(cls)

    _default_dtype: torch.dtype | None = None

    def __init__(self, shape: ShapeLike = DEFAULT_SHAPE, device: Any = None,
                 dtype: torch.dtype | None = None) -> None:
        if dtype is None:
            dtype = self._default_dtype or torch.get_default_dtype()
        if shape is None:
            shape = DEFAULT_SHAPE
        super().__init__(shape, device=device, dtype=dtype)
        self._refresh()

    def _refresh(self) -> None:
        super()._refresh()
        self.domain = "continuous" if self._kind in "fc" else "discrete"

    @property
    def space(self) -> ContinuousBox:
        """The dtype's full range, as a :class:`ContinuousBox`."""
        lo, hi = _dtype_min_max(self._dtype)
        kw = {"dtype": self._dtype, "device": self._device}
        return ContinuousBox(torch.full(self._shape, lo, **kw), torch.full(self._shape, hi, **kw))

    def _cast(self, dtype: torch.dtype) -> TensorSpec:
        return Unbounded(self._shape, self._device, dtype)

    def zero(self, shape: ShapeLike = None) -> Tensor:
        return torch.zeros(self._full_shape(shape), dtype=self._dtype, device=self._device)

    def one(self, shape: ShapeLike = None) -> Tensor:
        return torch.ones(self._full_shape(shape), dtype=self._dtype, device=self._device)


class UnboundedContinuous(Unbounded):
    """An unbounded floating-point tensor (see :class:`Unbounded`); ``rand`` is standard normal.

    Example:
        >>> from steersman.data import UnboundedContinuous
        >>> spec = UnboundedContinuous(shape=(4,))
        >>> spec.rand().shape, spec.is_in(spec.rand((3,)))
        (torch.Size([4]), True)
    """

    def __init__(self, shape: ShapeLike = DEFAULT_SHAPE, device: Any = None,
                 dtype: torch.dtype | None = None) -> None:
        if dtype is not None and dtype_kind(dtype) not in "fc":
            raise ValueError(
                f"UnboundedContinuous needs a floating dtype, got {dtype}; "
                "use Unbounded(dtype=...) or UnboundedDiscrete for integer values"
            )
        super().__init__(shape, device=device, dtype=dtype)

    def rand(self, shape: ShapeLike = None) -> Tensor:
        return torch.randn(self._full_shape(shape), dtype=self._dtype, device=self._device)


class UnboundedDiscrete(Unbounded):
    """An unbounded integer (or bool) tensor (see :class:`Unbounded`); default dtype int64.

    ``rand`` draws uniformly over the dtype's range.

    Example:
        >>> import torch
        >>> from steersman.data import UnboundedDiscrete
        >>> spec = UnboundedDiscrete(shape=(2,))
        >>> spec.dtype, spec.domain, spec.rand().dtype
        (torch.int64, 'discrete', torch.int64)
    """

    _default_dtype = torch.int64

    def __init__(self, shape: ShapeLike = DEFAULT_SHAPE, device: Any = None,
                 dtype: torch.dtype | None = None) -> None:
        if dtype is not None and dtype_kind(dtype) in "fc":
            raise ValueError(
                f"UnboundedDiscrete needs an integer or bool dtype, got {dtype}; "
                "use Unbounded(dtype=...) or UnboundedContinuous for floating values"
            )
        super().__init__(shape, device=device, dtype=dtype)

    def rand(self, shape: ShapeLike = None) -> Tensor:
        full = self._full_shape(shape)
        if self._dtype is torch.bool:
            return torch.randint(0, 2, full, dtype=torch.bool, device=self._device)
        lo, hi = _dtype_min_max(self._dtype)
        return torch.randint(lo, hi, full, dtype=self._dtype, device=self._device)

    def _project(self, val: Tensor) -> Tensor:
        return _round_cast(val, self._dtype)


def _resolve_bounded_dtype(cls: type, dtype: torch.dtype | None, domain: str | None) -> torch.dtype:
    if dtype is None:
        if cls is BoundedDiscrete or domain == "discrete":
            return torch.int64
        return torch.get_default_dtype()
    kind = dtype_kind(dtype)
    if kind == "c":
        raise ValueError(f"Bounded does not take complex dtypes, got {dtype}")
    if domain is not None and domain not in ("continuous", "discrete"):
        raise ValueError(f"domain must be 'continuous' or 'discrete', got {domain!r}")
    if domain is not None and (domain == "continuous") != (kind == "f"):
        raise ValueError(f"domain {domain!r} does not match dtype {dtype}")
    return dtype


class Bounded(TensorSpec):
    """A tensor with element-wise bounds ``low <= x <= high`` (Gymnasium's ``Box``).

    ``Bounded(low, high, shape, device, dtype)`` returns a :class:`BoundedContinuous`
    (floating ``dtype``, the default) or a :class:`BoundedDiscrete` (integer or bool
    ``dtype``, or ``domain="discrete"``). ``low`` and ``high`` are numbers, arrays or
    tensors broadcast to ``shape`` (default: their broadcast shape) and stored as
    tensors of that shape. Continuous ``rand`` is uniform in the box; a side that is
    infinite is sampled like Gymnasium's ``Box`` (exponential or normal). Discrete
    ``rand`` is uniform over the integers in ``[low, high]``.

    Args:
        low, high: the bounds (``low <= high`` everywhere).
        shape: the shape of one value; default: the broadcast shape of ``low``/``high``.
        device: default: torch's default device.
        dtype: default: torch's default floating dtype (int64 with ``domain="discrete"``).
        domain: ``"continuous"`` or ``"discrete"``; default: from the dtype.

    Example:
        >>> import torch
        >>> from steersman.data import Bounded
        >>> spec = Bounded(low=torch.tensor([-1.0, 0.0]), high=torch.tensor([1.0, 10.0]))
        >>> spec.shape, spec.low, spec.high
        (torch.Size([2]), tensor([-1.,  0.]), tensor([ 1., 10.]))
        >>> x = spec.rand((4,))                    # [4, 2]
        >>> x.shape, spec.is_in(x)
        (torch.Size([4, 2]), True)
        >>> spec.project(torch.tensor([5.0, -5.0]))
        tensor([1., 0.])
        >>> die = Bounded(1, 6, shape=(), dtype=torch.int64)
        >>> type(die).__name__, die.domain, die.is_in(torch.tensor(6)), die.is_in(torch.tensor(7))
        ('BoundedDiscrete', 'discrete', True, False)
    """

    _tensor_attrs = ("_low", "_high")

    def __new__(cls, low: Any = None, high: Any = None, shape: ShapeLike = None, device: Any = None,
                dtype: torch.dtype | None = None, domain: str | None = None,
                **kwargs: Any) -> Bounded:
        if cls is Bounded:
            dt = _resolve_bounded_dtype(cls, dtype, domain)
            cls = BoundedContinuous if dtype_kind(dt) == "f" else BoundedDiscrete
        return super().__new__(cls)

    def __init__(self, low: Any = None, high: Any = None, shape: ShapeLike = None, device: Any = None,
                 dtype: torch.dtype | None = None, domain: str | None = None) -> None:
        name = type(self).__name__
        dtype = _resolve_bounded_dtype(type(self), dtype, domain)
        if (dtype_kind(dtype) == "f") != (self.domain == "continuous"):
            raise ValueError(f"{name} does not take dtype {dtype}; use Bounded(..., dtype={dtype})")
        if low is None or high is None:
            raise TypeError(f"{name} needs both low and high")
        lo = to_tensor(low)
        hi = to_tensor(high)
        for what, t in (("low", lo), ("high", hi)):
            if t.is_floating_point() and bool(t.isnan().any()):
                raise ValueError(f"{name}: {what} contains NaN: {fmt_tensor(t)}")
        try:
            bshape = broadcast_shapes(lo.shape, hi.shape)
        except RuntimeError:
            raise ValueError(
                f"{name}: low of shape {list(lo.shape)} and high of shape {list(hi.shape)} "
                "do not broadcast together"
            ) from None
        if shape is None:
            shape = bshape
        else:
            shape = as_shape(shape)
            try:
                ok = broadcast_shapes(bshape, shape) == shape
            except RuntimeError:
                ok = False
            if not ok:
                raise ValueError(
                    f"{name}: low of shape {list(lo.shape)} and high of shape {list(hi.shape)} "
                    f"do not broadcast to the spec shape {list(shape)}"
                )
        super().__init__(shape, device=device, dtype=dtype)
        lo, hi = self._convert_bounds(lo, hi)
        self._low = lo.to(self._device).expand(self._shape).clone()
        self._high = hi.to(self._device).expand(self._shape).clone()
        if self.domain == "continuous":
            if bool((self._low == float("inf")).any()) or bool((self._high == float("-inf")).any()):
                raise ValueError(f"{name}: low must be < +inf and high must be > -inf")
        bad = self._low > self._high
        if bool(bad.any()):
            i = first_index(bad)
            raise ValueError(
                f"{name}: low > high at {int(bad.sum())} of {bad.numel()} element(s); first at "
                f"index {i}: low={self._low[i].item()}, high={self._high[i].item()}"
            )
        self._refresh()

    def _convert_bounds(self, lo: Tensor, hi: Tensor) -> tuple[Tensor, Tensor]:
        return lo.to(self._dtype), hi.to(self._dtype)

    # ------------------------------------------------------------------ properties
    @property
    def low(self) -> Tensor:
        """The lower bounds, a tensor of the spec's shape."""
        return self._low

    @property
    def high(self) -> Tensor:
        """The upper bounds, a tensor of the spec's shape."""
        return self._high

    @property
    def space(self) -> ContinuousBox:
        return ContinuousBox(self._low, self._high)

    def _repr_fields(self) -> list[str]:
        return [f"low={fmt_tensor(self._low)}", f"high={fmt_tensor(self._high)}"]

    def _cast(self, dtype: torch.dtype) -> TensorSpec:
        return Bounded(self._low, self._high, self._shape, self._device, dtype)

    def _refresh(self) -> None:
        super()._refresh()
        lo, hi = self._low, self._high
        self._zero_in = bool(((lo <= 0) & (hi >= 0)).all())

    # ------------------------------------------------------------------ membership
    def _values_in(self, val: Tensor) -> bool:
        # one clamp + one comparison; NaN != NaN, so NaN values are rejected
        return torch.equal(torch.clamp(val, self._low, self._high), val)

    def _values_report(self, val: Tensor) -> str | None:
        ok = torch.logical_and(val >= self._low, val <= self._high)
        if bool(ok.all()):
            return None
        bad = ~ok
        i = first_index(bad)
        j = i[len(i) - self.ndim :]
        return (
            f"{int(bad.sum())} of {bad.numel()} value(s) out of bounds; first at index {i}: "
            f"{val[i].item()} is not in [{self._low[j].item()}, {self._high[j].item()}]"
        )

    def zero(self, shape: ShapeLike = None) -> Tensor:
        if self._zero_in:
            return torch.zeros(self._full_shape(shape), dtype=self._dtype, device=self._device)
        return super().zero(shape)


class BoundedContinuous(Bounded):
    """A floating-point tensor in ``[low, high]`` (see :class:`Bounded`).

    Example:
        >>> from steersman.data import BoundedContinuous
        >>> spec = BoundedContinuous(-2.0, 2.0, shape=(3,))
        >>> spec.rand().shape, bool((spec.rand((100,)).abs() <= 2).all())
        (torch.Size([3]), True)
    """

    domain = "continuous"

    def _refresh(self) -> None:
        super()._refresh()
        lo, hi = self._low, self._high
        fin_lo, fin_hi = lo.isfinite(), hi.isfinite()
        self._all_finite = bool(fin_lo.all() and fin_hi.all())
        span = hi - lo
        if self._all_finite and bool(span.isfinite().all()):
            self._span: Tensor | None = span
            self._sides = None
        else:  # some infinite side, or a span too wide for the dtype
            self._span = None
            both = fin_lo & fin_hi
            self._sides = (both, fin_lo & ~fin_hi, ~fin_lo & fin_hi)

    def rand(self, shape: ShapeLike = None) -> Tensor:
        full = self._full_shape(shape)
        lo, hi = self._low, self._high
        u = torch.rand(full, dtype=self._dtype, device=self._device)
        if self._span is not None:
            # low + u * span >= low by monotone rounding; clip the rare rounding above high
            return torch.minimum(u.mul_(self._span).add_(lo), hi)
        both, lo_only, hi_only = self._sides
        boxed = torch.minimum(torch.maximum(lo * (1 - u) + hi * u, lo), hi)  # no overflow
        e = torch.empty_like(u).exponential_()
        out = torch.where(both, boxed, torch.randn_like(u))
        out = torch.where(lo_only, lo + e, out)
        return torch.where(hi_only, hi - e, out)

    def _project(self, val: Tensor) -> Tensor:
        if val.is_complex():
            val = val.real
        v = val.to(self._dtype)
        v = torch.nan_to_num(v, nan=0.0, posinf=float("inf"), neginf=float("-inf"))
        return torch.clamp(v, self._low, self._high)


class BoundedDiscrete(Bounded):
    """An integer (or bool) tensor in ``[low, high]`` (see :class:`Bounded`); default dtype int64.

    Float bounds are rounded inwards (``ceil(low)``, ``floor(high)``) and must be finite.

    Example:
        >>> import torch
        >>> from steersman.data import BoundedDiscrete
        >>> spec = BoundedDiscrete(0, 9, shape=(2,))
        >>> spec.dtype, spec.rand().dtype, spec.is_in(torch.tensor([0, 9]))
        (torch.int64, torch.int64, True)
        >>> spec.project(torch.tensor([-3.7, 12.2]))
        tensor([0, 9])
    """

    domain = "discrete"

    def _convert_bounds(self, lo: Tensor, hi: Tensor) -> tuple[Tensor, Tensor]:
        name = type(self).__name__
        for what, t in (("low", lo), ("high", hi)):
            if t.is_floating_point() and not bool(t.isfinite().all()):
                raise ValueError(f"{name} needs finite bounds, got {what}={fmt_tensor(t)}")
        if lo.is_floating_point():
            lo = lo.ceil()
        if hi.is_floating_point():
            hi = hi.floor()
        dmin, dmax = _dtype_min_max(self._dtype)
        lo64, hi64 = lo.to(torch.float64), hi.to(torch.float64)
        if bool((lo64 < dmin).any()) or bool((hi64 > dmax).any()):
            raise ValueError(
                f"{name}: bounds [{fmt_tensor(lo)}, {fmt_tensor(hi)}] exceed the range "
                f"[{dmin}, {dmax}] of dtype {self._dtype}"
            )
        if self._dtype is torch.bool:
            return lo.to(torch.int64).to(torch.bool), hi.to(torch.int64).to(torch.bool)
        return lo.to(self._dtype), hi.to(self._dtype)

    def _refresh(self) -> None:
        super()._refresh()
        self._low64 = self._low.to(torch.int64)
        self._high64 = self._high.to(torch.int64)
        self._count = self._high64 - self._low64 + 1  # number of values per element

    def rand(self, shape: ShapeLike = None) -> Tensor:
        full = self._full_shape(shape)
        r = torch.randint(0, _INT_SAMPLE_HIGH, full, dtype=torch.int64, device=self._device)
        out = r.remainder_(self._count).add_(self._low64)
        return out if self._dtype is torch.int64 else out.to(self._dtype)

    def _project(self, val: Tensor) -> Tensor:
        if val.is_complex():
            val = val.real
        if val.is_floating_point():
            v = torch.nan_to_num(val.to(torch.float64).round(), nan=0.0)
            v = torch.clamp(v, self._low64.to(torch.float64), self._high64.to(torch.float64))
        else:
            v = torch.clamp(val.to(torch.int64), self._low64, self._high64)
        return v.to(self._dtype)
