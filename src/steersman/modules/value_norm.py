"""Value normalizers: running statistics of the value targets, for the critic loss.

A critic regressing returns whose scale drifts (rewards growing as the policy learns) is
easier to train on a fixed scale. A value normalizer keeps running statistics of the
value targets and gives

* ``update(value_target)``: folds a batch of targets into the statistics (every dim but
  the trailing ``shape`` dims is reduced: batch, time, agents);
* ``normalize(x) = (x - loc) / scale`` and ``denormalize(y) = y * scale + loc``;
* ``scale()``: the divisor alone (for quantities that must not be re-centred, such as
  advantages).

The statistics are buffers: they move with ``.to()``, and are saved and restored by
``state_dict``. Implementations (TorchRL's names):

* :class:`PopArtValueNorm` — exponential moving averages of the mean and of the mean of
  squares, debiased (as the MAPPO reference implementation; van Hasselt et al., 2016);
* :class:`RunningValueNorm` — the exact running mean and variance of every target seen
  (Chan et al.'s parallel form of Welford's algorithm), no decay;
* :class:`PercentileValueNorm` — moving averages of a low and a high quantile; divides by
  their span, floored at ``min_scale`` (DreamerV3's return normalization; scale only by
  default).

Example:
    >>> import torch
    >>> vn = RunningValueNorm(shape=1)
    >>> vn.update(torch.tensor([[1.0], [3.0]]))
    >>> vn.normalize(torch.tensor([[3.0]]))
    tensor([[1.0000]])
    >>> vn.denormalize(vn.normalize(torch.tensor([[5.0]])))
    tensor([[5.]])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["ValueNorm", "PopArtValueNorm", "RunningValueNorm", "PercentileValueNorm"]


def _shape(shape: int | Sequence[int]) -> torch.Size:
    return torch.Size([shape] if isinstance(shape, int) else shape)


class ValueNorm(nn.Module):
    """Base class: running location/scale of value targets with trailing dims ``shape``.

    Keyword Args:
        shape: the per-element shape of the values (default ``1``: values ``[*dims, 1]``).
        epsilon: numerical floor of the variance (default ``1e-5``).
        device: where the statistics live.

    Subclasses implement :meth:`update`, :meth:`loc` and :meth:`scale`.
    """

    def __init__(self, *, shape: int | Sequence[int] = 1, epsilon: float = 1e-5, device: Any = None) -> None:
        super().__init__()
        self.shape = _shape(shape)
        self.epsilon = float(epsilon)
        self.device = device

    def _reduce_dims(self, x: Tensor) -> tuple[int, ...]:
        n = len(self.shape)
        if tuple(x.shape[x.ndim - n:]) != tuple(self.shape) or x.ndim < n:
            raise ValueError(
                f"{type(self).__name__}: values must end with shape {list(self.shape)}, got {list(x.shape)}"
            )
        return tuple(range(x.ndim - n))

    def update(self, value_target: Tensor) -> None:  # pragma: no cover - abstract
        """Folds a batch of value targets into the running statistics."""
        raise NotImplementedError

    def loc(self) -> Tensor:  # pragma: no cover - abstract
        """The current location (``shape``)."""
        raise NotImplementedError

    def scale(self) -> Tensor:  # pragma: no cover - abstract
        """The current scale (``shape``), the divisor of :meth:`normalize`."""
        raise NotImplementedError

    def normalize(self, value_target: Tensor) -> Tensor:
        """``(value_target - loc) / scale``."""
        return (value_target - self.loc()) / self.scale()

    def denormalize(self, normalized_value: Tensor) -> Tensor:
        """The inverse of :meth:`normalize`: ``normalized_value * scale + loc``."""
        return normalized_value * self.scale() + self.loc()

    def extra_repr(self) -> str:
        return f"shape={list(self.shape)}, epsilon={self.epsilon}"


class PopArtValueNorm(ValueNorm):
    """Exponential moving averages of the mean and mean of squares, debiased.

    ``m <- beta m + (1 - beta) mean(x)``, ``m2 <- beta m2 + (1 - beta) mean(x²)``,
    ``d <- beta d + (1 - beta)``; ``loc = m / d``, ``scale = sqrt(max(m2 / d - loc², epsilon))``
    (``d`` floored at ``epsilon``). Before any update: ``loc = 0``, ``scale = 1``.

    Keyword Args:
        shape: per-element shape (default 1).
        beta: decay of the averages (default 0.99999, MAPPO's).
        epsilon: floor of the variance and of the debiasing term (default 1e-5).
        device: where the statistics live.

    Example:
        >>> import torch
        >>> vn = PopArtValueNorm(shape=1, beta=0.0)   # beta 0: the last batch's statistics
        >>> vn.update(torch.tensor([[1.0], [3.0]]))
        >>> vn.loc(), vn.scale()
        (tensor([2.]), tensor([1.]))
    """

    def __init__(self, *, shape: int | Sequence[int] = 1, beta: float = 0.99999, epsilon: float = 1e-5,
                 device: Any = None) -> None:
        super().__init__(shape=shape, epsilon=epsilon, device=device)
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"PopArtValueNorm: beta must be in [0, 1), got {beta}")
        self.beta = float(beta)
        self.register_buffer("running_mean", torch.zeros(self.shape, device=device))
        self.register_buffer("running_mean_sq", torch.zeros(self.shape, device=device))
        self.register_buffer("debiasing_term", torch.zeros((), device=device))

    @torch.no_grad()
    def update(self, value_target: Tensor) -> None:
        dims = self._reduce_dims(value_target)
        x = value_target.detach().to(self.running_mean.dtype)
        b = self.beta
        self.running_mean.mul_(b).add_(x.mean(dims), alpha=1 - b)
        self.running_mean_sq.mul_(b).add_(x.pow(2).mean(dims), alpha=1 - b)
        self.debiasing_term.mul_(b).add_(1 - b)

    def loc(self) -> Tensor:
        return self.running_mean / self.debiasing_term.clamp_min(self.epsilon)

    def scale(self) -> Tensor:
        d = self.debiasing_term.clamp_min(self.epsilon)
        var = self.running_mean_sq / d - (self.running_mean / d).pow(2)
        return torch.where(self.debiasing_term > 0, var.clamp_min(self.epsilon).sqrt(), 1.0)


class RunningValueNorm(ValueNorm):
    """The exact mean and (population) variance of every value target seen.

    ``loc = mean``, ``scale = sqrt(var + epsilon)``; before any update ``loc = 0`` and
    ``scale = 1``. Batches are merged with Chan et al.'s update, so the statistics equal
    those of all targets concatenated (up to rounding).

    Keyword Args:
        shape: per-element shape (default 1).
        epsilon: added to the variance (default 1e-5).
        device: where the statistics live.
    """

    def __init__(self, *, shape: int | Sequence[int] = 1, epsilon: float = 1e-5, device: Any = None) -> None:
        super().__init__(shape=shape, epsilon=epsilon, device=device)
        self.register_buffer("mean", torch.zeros(self.shape, device=device))
        self.register_buffer("m2", torch.zeros(self.shape, device=device))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64, device=device))

    @torch.no_grad()
    def update(self, value_target: Tensor) -> None:
        dims = self._reduce_dims(value_target)
        x = value_target.detach().to(self.mean.dtype)
        n_b = x.numel() // self.shape.numel()
        if n_b == 0:
            return
        mean_b = x.mean(dims)
        m2_b = (x - mean_b).pow(2).sum(dims)
        n_a = self.count
        n = n_a + n_b
        delta = mean_b - self.mean
        self.mean.add_(delta * (n_b / n).to(x.dtype))
        self.m2.add_(m2_b + delta.pow(2) * (n_a * n_b / n).to(x.dtype))
        self.count.copy_(n)

    def var(self) -> Tensor:
        """The running population variance (1 before any update)."""
        return torch.where(self.count > 0, self.m2 / self.count.clamp_min(1).to(self.m2.dtype), 1.0)

    def loc(self) -> Tensor:
        return self.mean

    def scale(self) -> Tensor:
        return (self.var() + self.epsilon).sqrt()


class PercentileValueNorm(ValueNorm):
    """Moving averages of a low and a high quantile of the targets; divides by their span.

    ``low <- beta low + (1 - beta) q_lo(x)``, ``high <- beta high + (1 - beta) q_hi(x)``
    (the first update sets them); ``scale = max(high - low, min_scale)``; ``loc = 0`` with
    ``scale_only=True`` (default, DreamerV3's return normalization), else ``low``.

    Keyword Args:
        shape: per-element shape (default 1).
        quantiles: the (low, high) quantiles (default ``(0.05, 0.95)``).
        beta: decay of the averages (default 0.99).
        rate: TorchRL's name for ``1 - beta``: how fast the averages move towards the
            batch quantiles (default 0.01; ``1.0`` keeps only the last batch's).
        min_scale: floor of the scale (default 1.0: small returns are not blown up).
        scale_only: do not re-centre (default ``True``).
        center: TorchRL's name for ``not scale_only``: also subtract ``low``, mapping the
            tracked quantile range onto ``[0, 1]`` (default ``False``).
        epsilon: unused floor kept for the common signature (default 1e-5).
        device: where the statistics live.

    Example:
        >>> import torch
        >>> vn = PercentileValueNorm(quantiles=(0.0, 1.0))
        >>> vn.update(torch.tensor([[0.0], [10.0]]))
        >>> vn.normalize(torch.tensor([[5.0]]))
        tensor([[0.5000]])
    """

    def __init__(self, *, shape: int | Sequence[int] = 1, quantiles: tuple[float, float] = (0.05, 0.95),
                 beta: float | None = None, min_scale: float = 1.0, scale_only: bool | None = None,
                 epsilon: float = 1e-5, device: Any = None, rate: float | None = None,
                 center: bool | None = None) -> None:
        super().__init__(shape=shape, epsilon=epsilon, device=device)
        if rate is not None:
            if beta is not None and abs((1.0 - float(rate)) - float(beta)) > 1e-12:
                raise ValueError(
                    f"PercentileValueNorm: rate={rate} and beta={beta} disagree (rate is 1 - beta); give one"
                )
            if not 0.0 < float(rate) <= 1.0:
                raise ValueError(f"PercentileValueNorm: rate must be in (0, 1], got {rate}")
            beta = 1.0 - float(rate)
        beta = 0.99 if beta is None else beta
        if center is not None:
            if scale_only is not None and bool(scale_only) == bool(center):
                raise ValueError(
                    f"PercentileValueNorm: center={center} and scale_only={scale_only} disagree "
                    "(center is not scale_only); give one"
                )
            scale_only = not center
        scale_only = True if scale_only is None else scale_only
        lo, hi = (float(q) for q in quantiles)
        if not 0.0 <= lo < hi <= 1.0:
            raise ValueError(f"PercentileValueNorm: quantiles must satisfy 0 <= low < high <= 1, got {quantiles}")
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"PercentileValueNorm: beta must be in [0, 1), got {beta}")
        self.quantiles = (lo, hi)
        self.beta = float(beta)
        self.min_scale = float(min_scale)
        self.scale_only = bool(scale_only)
        self.rate = 1.0 - self.beta
        self.center = not self.scale_only
        self.register_buffer("low", torch.zeros(self.shape, device=device))
        self.register_buffer("high", torch.zeros(self.shape, device=device))
        self.register_buffer("initialized", torch.zeros((), dtype=torch.bool, device=device))

    @torch.no_grad()
    def update(self, value_target: Tensor) -> None:
        self._reduce_dims(value_target)
        x = value_target.detach().to(self.low.dtype).reshape(-1, *self.shape)
        q = torch.quantile(x.flatten(1), torch.tensor(self.quantiles, dtype=x.dtype, device=x.device), dim=0)
        q_lo, q_hi = q[0].view(self.shape), q[1].view(self.shape)
        beta = torch.where(self.initialized, self.beta, 0.0)  # the first update sets them
        self.low.lerp_(q_lo, 1 - beta)
        self.high.lerp_(q_hi, 1 - beta)
        self.initialized.fill_(True)

    def loc(self) -> Tensor:
        return torch.zeros_like(self.low) if self.scale_only else self.low

    def scale(self) -> Tensor:
        return (self.high - self.low).clamp_min(self.min_scale)
