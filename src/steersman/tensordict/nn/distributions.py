"""Distributions for policies: bounded continuous actions, deterministic actions, one-hot
and masked discrete actions.

Every class subclasses ``torch.distributions.Distribution`` and adds a
``deterministic_sample`` property (what a policy plays in deterministic mode). Argument
validation is off by default (``validate_args=False``): these are built on every policy
call; pass ``validate_args=True`` to check arguments and ``log_prob`` inputs.

Continuous distributions treat the last ``event_dims`` dims as the event (default: 1 for
a parameter with at least one dim), so ``log_prob``/``entropy`` return ``[*batch]``, as a
``torch.distributions.Independent`` would.
"""

from __future__ import annotations

import math
from enum import Enum
from numbers import Number
from typing import Any

import torch
import torch.distributions as D
from torch import Tensor
from torch.distributions import constraints
from torch.nn import functional as F

from .._utils import broadcast_shapes

__all__ = [
    "TanhNormal",
    "TruncatedNormal",
    "Delta",
    "OneHotCategorical",
    "MaskedCategorical",
    "MaskedOneHotCategorical",
    "ReparamGradientStrategy",
]

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
_LN2 = math.log(2.0)


def _bound(value: Any, like: Tensor) -> Tensor:
    return torch.as_tensor(value, dtype=like.dtype, device=like.device)


def _check_bounds(low: Any, high: Any, name: str) -> None:
    if isinstance(low, Number) and isinstance(high, Number) and not low < high:
        raise ValueError(f"{name}: low ({low}) must be smaller than high ({high})")


def _check_bound_shapes(low: Tensor, high: Tensor, loc: Tensor, name: str) -> None:
    try:
        ok = broadcast_shapes(low.shape, high.shape, loc.shape) == loc.shape
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"{name}: low {list(low.shape)} / high {list(high.shape)} must broadcast to "
            f"loc's shape {list(loc.shape)}"
        )


def _shapes(loc: Tensor, event_dims: int | None, name: str) -> tuple[torch.Size, torch.Size, int]:
    if event_dims is None:
        event_dims = min(1, loc.ndim)
    if not 0 <= event_dims <= loc.ndim:
        raise ValueError(f"{name}: event_dims={event_dims} for a parameter of shape {list(loc.shape)}")
    cut = loc.ndim - event_dims
    return loc.shape[:cut], loc.shape[cut:], event_dims


def _sum_event(x: Tensor, event_dims: int) -> Tensor:
    return x.sum(tuple(range(-event_dims, 0))) if event_dims else x


def tanh_normal_log_prob(x: Tensor, loc: Tensor, scale: Tensor, log_half: Tensor | float = 0.0) -> Tensor:
    """:meth:`TanhNormal.log_prob` before the event sum, at the pre-tanh value ``x``
    (``atanh`` of the value mapped to ``[-1, 1]``): the Normal's log-density minus the
    log-Jacobian ``log r + 2 * (log 2 - x - softplus(-2x))`` (``log_half`` = ``log r``)."""
    z = (x - loc) / scale
    normal = -0.5 * z * z - scale.log() - _LOG_SQRT_2PI
    return normal - (log_half + 2 * (_LN2 - x - F.softplus(-2 * x)))


class TanhNormal(D.Distribution):
    """A Normal squashed by ``tanh`` and mapped to ``[low, high]``: ``y = m + r * tanh(x)``,
    ``x ~ Normal(loc, scale)``, ``m = (high + low) / 2``, ``r = (high - low) / 2``.

    Args:
        loc, scale: the pre-tanh Normal's parameters, shape ``[*batch, *event]``.
        upscale: with ``tanh_loc=True``, ``loc`` is first mapped to
            ``upscale * tanh(loc / upscale)`` (keeps the pre-tanh mean in a range where
            tanh is not saturated).
        low, high: the bounds (floats or tensors broadcastable to ``loc``).
        event_dims: trailing dims that form the event (default ``min(1, loc.ndim)``).
        tanh_loc: see ``upscale``.
        safe_tanh: keep samples strictly inside ``(low, high)`` (``tanh`` rounds to ±1 in
            float32 beyond ``|x| ≈ 9``), with an unchanged (straight-through) gradient.

    ``log_prob`` uses the change of variables with the stable identity
    ``log(1 - tanh(x)^2) = 2 * (log 2 - x - softplus(-2x))``; values at or beyond the
    bounds are clamped just inside them (``atanh`` is infinite at ±1), so they get a
    finite log-probability. No closed forms exist for the mean, the mode or the entropy:
    ``mode``/``deterministic_sample`` is ``m + r * tanh(loc)`` (the image of the Normal's
    mode; the true mode of the squashed density moves towards the bounds when ``scale``
    is large), ``mean`` raises ``NotImplementedError``, and ``entropy(n_samples)`` is a
    Monte-Carlo estimate (see :meth:`entropy`).

    Example:
        >>> import torch
        >>> d = TanhNormal(torch.zeros(5, 2), torch.ones(5, 2), low=-2.0, high=2.0)
        >>> a = d.rsample()
        >>> a.shape, d.log_prob(a).shape, bool((a.abs() < 2).all())
        (torch.Size([5, 2]), torch.Size([5]), True)
        >>> d.deterministic_sample
        tensor([[0., 0.],
                [0., 0.],
                [0., 0.],
                [0., 0.],
                [0., 0.]])
    """

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    has_rsample = True

    def __init__(
        self,
        loc: Tensor,
        scale: Tensor,
        upscale: float | Tensor = 5.0,
        low: float | Tensor = -1.0,
        high: float | Tensor = 1.0,
        event_dims: int | None = None,
        tanh_loc: bool = False,
        safe_tanh: bool = True,
        validate_args: bool = False,
    ) -> None:
        _check_bounds(low, high, "TanhNormal")
        loc, scale = torch.broadcast_tensors(loc, scale)
        if tanh_loc:
            loc = upscale * torch.tanh(loc / upscale)
        self.loc, self.scale = loc, scale
        self.upscale, self.tanh_loc, self.safe_tanh = upscale, tanh_loc, safe_tanh
        self.low, self.high = _bound(low, loc), _bound(high, loc)
        _check_bound_shapes(self.low, self.high, loc, "TanhNormal")
        self._mid = (self.high + self.low) / 2
        self._half = (self.high - self.low) / 2
        batch_shape, event_shape, self.event_dims = _shapes(loc, event_dims, "TanhNormal")
        super().__init__(batch_shape, event_shape, validate_args=validate_args)

    @property
    def support(self) -> constraints.Constraint:
        return constraints.independent(constraints.interval(self.low, self.high), self.event_dims)

    def expand(self, batch_shape: Any, _instance: Any = None) -> TanhNormal:
        shape = torch.Size(batch_shape) + self.event_shape
        return TanhNormal(self.loc.expand(shape), self.scale.expand(shape), self.upscale,
                          self.low, self.high, self.event_dims, False, self.safe_tanh,
                          self._validate_args)

    def _squash(self, x: Tensor) -> Tensor:
        t = torch.tanh(x)
        if self.safe_tanh:
            lim = 1 - torch.finfo(t.dtype).eps
            t = t + (t.clamp(-lim, lim) - t).detach()
        return self._mid + self._half * t

    def rsample(self, sample_shape: Any = torch.Size()) -> Tensor:
        shape = self._extended_shape(sample_shape)
        eps = torch.randn(shape, dtype=self.loc.dtype, device=self.loc.device)
        return self._squash(self.loc + self.scale * eps)

    def sample(self, sample_shape: Any = torch.Size()) -> Tensor:
        with torch.no_grad():
            return self.rsample(sample_shape)

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        u = (value - self._mid) / self._half
        lim = 1 - torch.finfo(u.dtype).eps
        x = torch.atanh(u.clamp(-lim, lim))
        return _sum_event(tanh_normal_log_prob(x, self.loc, self.scale, self._half.log()), self.event_dims)

    @property
    def mode(self) -> Tensor:
        return self._mid + self._half * torch.tanh(self.loc)

    @property
    def deterministic_sample(self) -> Tensor:
        return self.mode

    @property
    def mean(self) -> Tensor:
        raise NotImplementedError(
            "TanhNormal has no closed-form mean: use deterministic_sample (tanh of loc) or "
            "a Monte-Carlo average such as dist.sample((n,)).mean(0)"
        )

    def entropy(self, n_samples: int = 16) -> Tensor:
        """A Monte-Carlo estimate of the entropy, differentiable w.r.t. ``loc``/``scale``.

        ``H(Y) = H(X) + E[log |dy/dx|]`` with the Normal's closed-form ``H(X)``; only the
        log-Jacobian term ``log r + log(1 - tanh(x)^2)`` is averaged over ``n_samples``
        reparametrized draws (lower variance than averaging ``-log_prob``). Shape
        ``[*batch]``.
        """
        eps = torch.randn((n_samples, *self.loc.shape), dtype=self.loc.dtype, device=self.loc.device)
        x = self.loc + self.scale * eps
        log_jac = (self._half.log() + 2 * (_LN2 - x - F.softplus(-2 * x))).mean(0)
        h_normal = 0.5 + _LOG_SQRT_2PI + self.scale.log()
        return _sum_event(h_normal + log_jac, self.event_dims)


def _log1mexp(x: Tensor) -> Tensor:
    """``log(1 - exp(x))`` for ``x <= 0``, accurate at both ends, NaN-free gradients."""
    near = x > -_LN2
    a = torch.where(near, x, torch.full_like(x, -1.0))
    b = torch.where(near, torch.full_like(x, -1.0), x)
    return torch.where(near, torch.log(-torch.expm1(a)), torch.log1p(-torch.exp(b)))


class TruncatedNormal(D.Distribution):
    """A Normal restricted to ``[low, high]`` (closed forms for everything).

    With ``a = (low - loc) / scale``, ``b = (high - loc) / scale``, ``Z = Φ(b) - Φ(a)``:
    ``log_prob(x) = log φ((x - loc)/scale) - log scale - log Z`` inside the bounds and
    ``-inf`` outside; ``mean = loc + scale (φ(a) - φ(b)) / Z``; ``mode = clamp(loc, low,
    high)``; ``entropy = log(√(2πe) scale Z) + (a φ(a) - b φ(b)) / (2Z)``. ``rsample``
    inverts the CDF (reparametrized: gradients flow to ``loc`` and ``scale``). Tails are
    handled by computing on the side of the mirror image where ``Φ`` is small, and in
    float64 internally; results have the dtype of ``loc``. Infinite bounds are allowed.

    Args:
        loc, scale: the parameters of the untruncated Normal, shape ``[*batch, *event]``.
        upscale, tanh_loc: with ``tanh_loc=True``, ``loc`` becomes ``upscale * tanh(loc /
            upscale)`` (as TorchRL).
        low, high: the bounds (floats or tensors broadcastable to ``loc``).
        event_dims: trailing dims that form the event (default ``min(1, loc.ndim)``).

    Example:
        >>> import torch
        >>> d = TruncatedNormal(torch.zeros(3, 2), torch.ones(3, 2), low=0.0, high=1.0)
        >>> x = d.rsample()
        >>> bool(((x >= 0) & (x <= 1)).all()), d.log_prob(x).shape
        (True, torch.Size([3]))
        >>> round(d.mean[0, 0].item(), 4)  # (φ(0) - φ(1)) / (Φ(1) - Φ(0))
        0.4599
    """

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    has_rsample = True
    _BIG = 40.0  # |a|, |b| beyond this change nothing (Φ(-40) ~ 1e-350) but break autograd

    def __init__(
        self,
        loc: Tensor,
        scale: Tensor,
        upscale: float | Tensor = 5.0,
        low: float | Tensor = -1.0,
        high: float | Tensor = 1.0,
        tanh_loc: bool = False,
        event_dims: int | None = None,
        validate_args: bool = False,
        a: float | Tensor | None = None,
        b: float | Tensor | None = None,
    ) -> None:
        if a is not None:  # tensordict's names of the bounds
            low = a
        if b is not None:
            high = b
        _check_bounds(low, high, "TruncatedNormal")
        loc, scale = torch.broadcast_tensors(loc, scale)
        if tanh_loc:
            loc = upscale * torch.tanh(loc / upscale)
        self.loc, self.scale = loc, scale
        self.upscale, self.tanh_loc = upscale, tanh_loc
        self.low, self.high = _bound(low, loc), _bound(high, loc)
        _check_bound_shapes(self.low, self.high, loc, "TruncatedNormal")
        batch_shape, event_shape, self.event_dims = _shapes(loc, event_dims, "TruncatedNormal")
        super().__init__(batch_shape, event_shape, validate_args=validate_args)
        w = torch.float64
        self._loc64, self._scale64 = loc.to(w), scale.to(w)
        big = self._BIG
        self._a = ((self.low.to(w) - self._loc64) / self._scale64).clamp(-big, big)
        self._b = ((self.high.to(w) - self._loc64) / self._scale64).clamp(-big, big)
        self._log_z = self._log_diff_ndtr(self._a, self._b)

    @staticmethod
    def _log_diff_ndtr(a: Tensor, b: Tensor) -> Tensor:
        """``log(Φ(b) - Φ(a))`` for ``a < b``: on the side where ``Φ`` is small."""
        flip = a > 0
        lo = torch.where(flip, -b, a)
        hi = torch.where(flip, -a, b)
        lhi = torch.special.log_ndtr(hi)
        llo = torch.special.log_ndtr(lo)
        return lhi + _log1mexp(llo - lhi)

    @property
    def support(self) -> constraints.Constraint:
        return constraints.independent(constraints.interval(self.low, self.high), self.event_dims)

    def expand(self, batch_shape: Any, _instance: Any = None) -> TruncatedNormal:
        shape = torch.Size(batch_shape) + self.event_shape
        return TruncatedNormal(self.loc.expand(shape), self.scale.expand(shape), self.upscale,
                               self.low, self.high, False, self.event_dims, self._validate_args)

    def _out(self, x: Tensor) -> Tensor:
        return x.to(self.loc.dtype)

    def _ratios(self) -> tuple[Tensor, Tensor]:
        """``φ(a)/Z`` and ``φ(b)/Z``."""
        pa = torch.exp(-0.5 * self._a ** 2 - _LOG_SQRT_2PI - self._log_z)
        pb = torch.exp(-0.5 * self._b ** 2 - _LOG_SQRT_2PI - self._log_z)
        return pa, pb

    @property
    def mean(self) -> Tensor:
        pa, pb = self._ratios()
        return self._out(self._loc64 + self._scale64 * (pa - pb))

    @property
    def variance(self) -> Tensor:
        pa, pb = self._ratios()
        v = 1 + self._a * pa - self._b * pb - (pa - pb) ** 2
        return self._out(self._scale64 ** 2 * v)

    @property
    def mode(self) -> Tensor:
        return torch.maximum(torch.minimum(self.loc, self.high), self.low)

    @property
    def deterministic_sample(self) -> Tensor:
        return self.mode

    def entropy(self) -> Tensor:
        pa, pb = self._ratios()
        h = 0.5 + _LOG_SQRT_2PI + self._scale64.log() + self._log_z + 0.5 * (self._a * pa - self._b * pb)
        return _sum_event(self._out(h), self.event_dims)

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        v = value.to(torch.float64)
        z = (v - self._loc64) / self._scale64
        lp = -0.5 * z * z - _LOG_SQRT_2PI - self._scale64.log() - self._log_z
        inside = (value >= self.low) & (value <= self.high)
        lp = torch.where(inside, lp, torch.full_like(lp, -math.inf))
        return _sum_event(self._out(lp), self.event_dims)

    def cdf(self, value: Tensor) -> Tensor:
        z = (value.to(torch.float64) - self._loc64) / self._scale64
        z = torch.minimum(torch.maximum(z, self._a), self._b)
        # (Φ(z) - Φ(a)) / Z in log space: torch's ndtr loses the far tails
        c = torch.exp(self._log_diff_ndtr(self._a, z) - self._log_z)
        return self._out(c.clamp(0, 1))

    def icdf(self, value: Tensor) -> Tensor:
        u = value.to(torch.float64)
        a, b = self._a, self._b
        flip = a > 0
        # Φ is small on the left: invert there; mirrored (z -> -z) when a > 0
        pa = torch.special.log_ndtr(torch.where(flip, -b, a)).exp()
        pb = torch.special.log_ndtr(torch.where(flip, -a, b)).exp()
        p = pa + torch.where(flip, 1 - u, u) * (pb - pa)
        tiny = torch.finfo(torch.float64).tiny
        z = torch.special.ndtri(p.clamp(tiny, 1 - 1e-16))
        z = torch.where(flip, -z, z)
        x = (self._loc64 + self._scale64 * z).clamp(self.low.to(torch.float64), self.high.to(torch.float64))
        return self._out(x)

    def rsample(self, sample_shape: Any = torch.Size()) -> Tensor:
        shape = self._extended_shape(sample_shape)
        u = torch.rand(shape, dtype=torch.float64, device=self.loc.device)
        return self.icdf(u)

    def sample(self, sample_shape: Any = torch.Size()) -> Tensor:
        with torch.no_grad():
            return self.rsample(sample_shape)


class Delta(D.Distribution):
    """A point mass at ``param`` (a deterministic "distribution", e.g. for DDPG/TD3 actors).

    ``sample``/``rsample``/``mean``/``mode``/``deterministic_sample`` return ``param``
    (``rsample`` keeps its gradient); ``log_prob(x)`` is ``0`` where ``x`` equals
    ``param`` within ``atol + rtol * |param|`` over the whole event, ``-inf`` elsewhere.

    Args:
        param: the point, shape ``[*batch_shape, *event_shape]``.
        atol, rtol: the tolerance of ``log_prob``'s equality test.
        batch_shape, event_shape: default: the last dim is the event (``[]`` for a scalar
            ``param``); giving one derives the other from ``param.shape``.

    Example:
        >>> import torch
        >>> d = Delta(torch.tensor([[0.5, -0.5]]))
        >>> d.sample(), d.batch_shape, d.event_shape
        (tensor([[ 0.5000, -0.5000]]), torch.Size([1]), torch.Size([2]))
        >>> d.log_prob(torch.tensor([[0.5, -0.5]])), d.log_prob(torch.tensor([[0.5, 0.0]]))
        (tensor([0.]), tensor([-inf]))
    """

    arg_constraints: dict = {}
    has_rsample = True

    def __init__(
        self,
        param: Tensor,
        atol: float = 1e-6,
        rtol: float = 1e-6,
        batch_shape: Any = None,
        event_shape: Any = None,
        validate_args: bool = False,
    ) -> None:
        if batch_shape is None and event_shape is None:
            event_shape = param.shape[-1:]
        if event_shape is None:
            event_shape = param.shape[len(batch_shape):]
        if batch_shape is None:
            batch_shape = param.shape[: param.ndim - len(event_shape)]
        batch_shape, event_shape = torch.Size(batch_shape), torch.Size(event_shape)
        if batch_shape + event_shape != param.shape:
            raise ValueError(
                f"Delta: batch_shape {list(batch_shape)} + event_shape {list(event_shape)} "
                f"must equal param's shape {list(param.shape)}"
            )
        self.param, self.atol, self.rtol = param, atol, rtol
        super().__init__(batch_shape, event_shape, validate_args=validate_args)

    @property
    def support(self) -> constraints.Constraint:
        return constraints.independent(constraints.real, len(self.event_shape))

    def expand(self, batch_shape: Any, _instance: Any = None) -> Delta:
        shape = torch.Size(batch_shape)
        return Delta(self.param.expand(shape + self.event_shape), self.atol, self.rtol, shape,
                     self.event_shape, self._validate_args)

    def rsample(self, sample_shape: Any = torch.Size()) -> Tensor:
        return self.param.expand(torch.Size(sample_shape) + self.param.shape)

    def sample(self, sample_shape: Any = torch.Size()) -> Tensor:
        return self.param.detach().expand(torch.Size(sample_shape) + self.param.shape)

    def log_prob(self, value: Tensor) -> Tensor:
        close = (value - self.param).abs() <= self.atol + self.rtol * self.param.abs()
        n = len(self.event_shape)
        if n:
            close = close.flatten(-n).all(-1)
        dtype = self.param.dtype if self.param.is_floating_point() else torch.get_default_dtype()
        zero = torch.zeros((), dtype=dtype, device=self.param.device)
        return torch.where(close, zero, zero - math.inf)

    @property
    def mean(self) -> Tensor:
        return self.param

    @property
    def mode(self) -> Tensor:
        return self.param

    @property
    def deterministic_sample(self) -> Tensor:
        return self.param

    @property
    def variance(self) -> Tensor:
        return torch.zeros_like(self.param)


class ReparamGradientStrategy(Enum):
    """How :class:`OneHotCategorical.rsample` gets a gradient.

    ``PassThrough``: a hard one-hot sample whose gradient is that of ``probs``
    (straight-through: ``sample + probs - probs.detach()``). ``RelaxedOneHot``: a soft
    sample from the Gumbel-softmax (``RelaxedOneHotCategorical``) at ``temperature``.
    """

    PassThrough = "pass_through"
    RelaxedOneHot = "relaxed_one_hot"


class OneHotCategorical(D.OneHotCategorical):
    """A categorical over one-hot vectors, with a mode and a reparametrized sample.

    Args:
        logits, probs: one of them, shape ``[*batch, n]`` (note: ``logits`` comes first,
            as in TorchRL).
        grad_method: :class:`ReparamGradientStrategy` (or its string value) used by
            ``rsample``; default straight-through.
        temperature: for ``RelaxedOneHot``.

    ``mode``/``deterministic_sample``: the one-hot of the argmax. ``entropy``: exact.

    Example:
        >>> import torch
        >>> d = OneHotCategorical(logits=torch.tensor([[0.0, 2.0, 1.0]], requires_grad=True))
        >>> d.mode
        tensor([[0., 1., 0.]])
        >>> s = d.rsample()
        >>> s.sum().item(), s.requires_grad
        (1.0, True)
    """

    has_rsample = True

    def __init__(
        self,
        logits: Tensor | None = None,
        probs: Tensor | None = None,
        grad_method: ReparamGradientStrategy | str = ReparamGradientStrategy.PassThrough,
        temperature: float = 1.0,
        validate_args: bool = False,
    ) -> None:
        super().__init__(probs=probs, logits=logits, validate_args=validate_args)
        self.grad_method = ReparamGradientStrategy(grad_method)
        self.temperature = temperature

    @property
    def mode(self) -> Tensor:
        logits = self.logits
        return F.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)

    @property
    def deterministic_sample(self) -> Tensor:
        return self.mode

    def rsample(self, sample_shape: Any = torch.Size()) -> Tensor:
        if self.grad_method is ReparamGradientStrategy.RelaxedOneHot:
            relaxed = D.RelaxedOneHotCategorical(torch.as_tensor(self.temperature, dtype=self.logits.dtype,
                                                                 device=self.logits.device),
                                                 logits=self.logits, validate_args=False)
            return relaxed.rsample(sample_shape)
        out = self.sample(sample_shape)
        probs = self.probs.expand(out.shape)
        return out + probs - probs.detach()

    def expand(self, batch_shape: Any, _instance: Any = None) -> OneHotCategorical:
        shape = torch.Size(batch_shape) + self.event_shape
        return type(self)(logits=self.logits.expand(shape), grad_method=self.grad_method,
                          temperature=self.temperature, validate_args=self._validate_args)


def _mask_from_indices(indices: Tensor, n: int, padding_value: int | None) -> Tensor:
    idx = indices.long()
    valid = torch.ones_like(idx, dtype=torch.bool) if padding_value is None else idx != padding_value
    idx = torch.where(valid, idx, torch.zeros_like(idx))
    counts = torch.zeros(*idx.shape[:-1], n, dtype=torch.int32, device=idx.device)
    counts.scatter_add_(-1, idx, valid.to(torch.int32))
    return counts > 0


def _masked_params(logits: Tensor | None, probs: Tensor | None, mask: Tensor | None,
                   indices: Tensor | None, neg_inf: float, padding_value: int | None,
                   name: str) -> tuple[Tensor | None, Tensor | None, Tensor, Tensor]:
    if (logits is None) == (probs is None):
        raise ValueError(f"{name}: pass exactly one of logits and probs")
    if (mask is None) == (indices is None):
        raise ValueError(f"{name}: pass exactly one of mask and indices")
    base = logits if logits is not None else probs
    if indices is not None:
        mask = _mask_from_indices(indices, base.shape[-1], padding_value)
    mask = mask.to(torch.bool)
    if mask.shape != base.shape:
        mask = mask.expand(base.shape)
    none_allowed = ~mask.any(-1, keepdim=True)
    keep = mask | none_allowed  # a row with no allowed action: uniform (documented)
    if logits is not None:
        logits = logits.masked_fill(~keep, neg_inf)
    else:
        probs = probs * keep
    return logits, probs, mask, none_allowed.squeeze(-1)


class MaskedCategorical(D.Categorical):
    """A categorical over the allowed actions only.

    Args:
        logits, probs: one of them, shape ``[*batch, n]`` (``logits`` first, as in TorchRL).
        mask: bool ``[*batch, n]`` (or broadcastable), ``True`` = allowed.
        indices: alternative to ``mask``: the allowed action indices ``[*batch, k]``, padded
            with ``padding_value`` when rows allow different numbers of actions.
        neg_inf: the logit given to masked actions. ``-inf`` (default): they have
            probability exactly 0 and ``log_prob`` ``-inf``. A large negative number (e.g.
            ``-1e9``) gives finite, hugely negative log-probabilities instead (useful when
            a loss must stay finite), with the same samples.
        padding_value: pads ``indices``; also, ``log_prob(value)`` is ``0`` where ``value ==
            padding_value`` (padded steps do not count), and ``sample``/``mode`` return it
            for rows where no action is allowed.
        use_cross_entropy: ``log_prob`` through ``F.cross_entropy`` (one fused kernel;
            TorchRL's default) instead of gathering from the normalized logits. Same values.
        padding_side: ``"left"`` or ``"right"``: which side the caller padded its sequences
            on (kept for the caller, as in TorchRL; the distribution itself does not use it).

    Masked actions are never sampled, ``mode`` is the argmax over allowed actions, and
    ``entropy`` sums over the allowed actions only (masked terms contribute 0). A row with
    no allowed action gets a uniform distribution over all actions instead of NaNs; its
    samples are meaningless unless ``padding_value`` is set.

    Example:
        >>> import torch
        >>> logits = torch.tensor([[3.0, 1.0, 1.0, 0.0]])
        >>> d = MaskedCategorical(logits=logits, mask=torch.tensor([[False, True, True, False]]))
        >>> d.probs
        tensor([[0.0000, 0.5000, 0.5000, 0.0000]])
        >>> d.mode, d.log_prob(torch.tensor([0]))
        (tensor([1]), tensor([-inf]))
    """

    def __init__(
        self,
        logits: Tensor | None = None,
        probs: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        indices: Tensor | None = None,
        neg_inf: float = float("-inf"),
        padding_value: int | None = None,
        validate_args: bool = False,
        use_cross_entropy: bool = True,
        padding_side: str = "left",
    ) -> None:
        if padding_side not in ("left", "right"):
            raise ValueError(f"MaskedCategorical: padding_side must be 'left' or 'right', got {padding_side!r}")
        logits, probs, mask, none = _masked_params(logits, probs, mask, indices, neg_inf,
                                                   padding_value, "MaskedCategorical")
        super().__init__(probs=probs, logits=logits, validate_args=validate_args)
        self.mask, self.neg_inf, self.padding_value, self._none_allowed = mask, neg_inf, padding_value, none
        self.use_cross_entropy, self.padding_side = bool(use_cross_entropy), padding_side

    def _pad(self, out: Tensor) -> Tensor:
        if self.padding_value is None:
            return out
        return out.masked_fill(self._none_allowed.expand(out.shape), self.padding_value)

    def sample(self, sample_shape: Any = torch.Size()) -> Tensor:
        return self._pad(super().sample(sample_shape))

    @property
    def mode(self) -> Tensor:
        return self._pad(self.logits.argmax(-1))

    @property
    def deterministic_sample(self) -> Tensor:
        return self.mode

    def _log_prob(self, value: Tensor) -> Tensor:
        if not self.use_cross_entropy:
            return super().log_prob(value)
        n = self.logits.shape[-1]
        shape = torch.broadcast_shapes(value.shape, self.logits.shape[:-1])
        logits = self.logits.expand(*shape, n).reshape(-1, n)
        lp = -F.cross_entropy(logits, value.long().expand(shape).reshape(-1), reduction="none")
        return lp.reshape(shape)

    def log_prob(self, value: Tensor) -> Tensor:
        if self.padding_value is None:
            return self._log_prob(value)
        pad = value == self.padding_value
        lp = self._log_prob(value.masked_fill(pad, 0))
        return lp.masked_fill(pad.expand(lp.shape), 0.0)

    def expand(self, batch_shape: Any, _instance: Any = None) -> MaskedCategorical:
        shape = torch.Size(batch_shape) + self.logits.shape[-1:]
        return MaskedCategorical(logits=self.logits.expand(shape), mask=self.mask.expand(shape),
                                 neg_inf=self.neg_inf, padding_value=self.padding_value,
                                 validate_args=self._validate_args, use_cross_entropy=self.use_cross_entropy,
                                 padding_side=self.padding_side)


class MaskedOneHotCategorical(OneHotCategorical):
    """:class:`OneHotCategorical` over the allowed actions only (see :class:`MaskedCategorical`
    for ``mask``, ``indices``, ``neg_inf``; ``padding_value`` here only pads ``indices``).

    Example:
        >>> import torch
        >>> d = MaskedOneHotCategorical(logits=torch.tensor([2.0, 0.0, 1.0]),
        ...                             mask=torch.tensor([False, True, True]))
        >>> d.mode
        tensor([0., 0., 1.])
        >>> d.log_prob(torch.tensor([1.0, 0.0, 0.0]))
        tensor(-inf)
    """

    def __init__(
        self,
        logits: Tensor | None = None,
        probs: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        indices: Tensor | None = None,
        neg_inf: float = float("-inf"),
        padding_value: int | None = None,
        grad_method: ReparamGradientStrategy | str = ReparamGradientStrategy.PassThrough,
        temperature: float = 1.0,
        validate_args: bool = False,
    ) -> None:
        logits, probs, mask, _ = _masked_params(logits, probs, mask, indices, neg_inf,
                                                padding_value, "MaskedOneHotCategorical")
        super().__init__(logits=logits, probs=probs, grad_method=grad_method, temperature=temperature,
                         validate_args=validate_args)
        self.mask, self.neg_inf, self.padding_value = mask, neg_inf, padding_value

    def expand(self, batch_shape: Any, _instance: Any = None) -> MaskedOneHotCategorical:
        shape = torch.Size(batch_shape) + self.event_shape
        return MaskedOneHotCategorical(logits=self.logits.expand(shape), mask=self.mask.expand(shape),
                                       neg_inf=self.neg_inf, grad_method=self.grad_method,
                                       temperature=self.temperature, validate_args=self._validate_args)

# tensordict.nn.distributions also exports these (they live in their own files here)
from .composite import AddStateIndependentNormalScale, CompositeDistribution, rand_one_hot  # noqa: E402, F401
from .utils import add_custom_mapping  # noqa: E402, F401
