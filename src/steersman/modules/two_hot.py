"""Symlog squashing and two-hot targets (DreamerV3, Hafner et al. 2023); re-exported by
:mod:`steersman.objectives.two_hot` (the losses) and used by :class:`~steersman.modules.SymExpTwoHot`.

``symlog(x) = sign(x) * log(1 + |x|)`` compresses large magnitudes and is inverted by
``symexp(y) = sign(y) * (exp(|y|) - 1)``. A scalar ``x`` is encoded on a sorted support
``bins`` (``[K]``) as the two-hot vector that puts weight on the two neighbouring bins,
linearly interpolated, so that ``sum_k w_k * bins_k = x`` inside the support (values
outside saturate at its ends). A critic predicting logits over ``bins`` is trained with
the cross-entropy to that vector and read out as the softmax expectation.

Example:
    >>> import torch
    >>> bins = torch.tensor([-1.0, 0.0, 1.0])
    >>> two_hot_encode(torch.tensor([0.25]), bins)
    tensor([[0.0000, 0.7500, 0.2500]])
    >>> symlog(torch.tensor([-3.0, 0.0]))
    tensor([-1.3863,  0.0000])
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["symlog", "symexp", "two_hot_encode", "two_hot_decode", "two_hot_cross_entropy"]


def symlog(value: Tensor) -> Tensor:
    """``sign(x) * log(1 + |x|)``, element-wise."""
    return torch.sign(value) * torch.log1p(value.abs())


def symexp(value: Tensor) -> Tensor:
    """``sign(y) * (exp(|y|) - 1)``, the inverse of :func:`symlog`."""
    return torch.sign(value) * torch.expm1(value.abs())


def _check_bins(bins: Tensor) -> None:
    if bins.ndim != 1 or bins.numel() < 2:
        raise ValueError(f"two-hot: bins must be a 1-d support of at least 2 points, got shape {list(bins.shape)}")


def two_hot_encode(x: Tensor, bins: Tensor) -> Tensor:
    """Two-hot weights of ``x`` (any shape) on the ascending ``bins`` (``[K]``): ``[*x.shape, K]``."""
    _check_bins(bins)
    bins = bins.to(device=x.device, dtype=x.dtype)
    x = x.clamp(bins[0], bins[-1])
    upper = torch.searchsorted(bins, x.contiguous(), right=True).clamp(1, bins.numel() - 1)  # bins[upper-1] <= x
    lower = upper - 1
    lo, hi = bins[lower], bins[upper]
    w_hi = ((x - lo) / (hi - lo)).clamp(0.0, 1.0)
    out = torch.zeros(*x.shape, bins.numel(), dtype=x.dtype, device=x.device)
    out.scatter_add_(-1, lower.unsqueeze(-1), (1.0 - w_hi).unsqueeze(-1))
    out.scatter_add_(-1, upper.unsqueeze(-1), w_hi.unsqueeze(-1))
    return out


def two_hot_decode(logits: Tensor, bins: Tensor) -> Tensor:
    """The expectation ``sum_k softmax(logits)_k * bins_k``: ``[*B, K] -> [*B]``."""
    _check_bins(bins)
    return (logits.softmax(-1) * bins.to(logits)).sum(-1)


def two_hot_cross_entropy(logits: Tensor, target: Tensor, bins: Tensor) -> Tensor:
    """Cross-entropy of ``logits`` (``[*B, K]``) to the two-hot encoding of ``target``
    (``[*B]``, not differentiated): ``[*B]``."""
    weights = two_hot_encode(target.detach(), bins)
    return -(weights * logits.log_softmax(-1)).sum(-1)
