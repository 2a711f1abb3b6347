"""Small modules for distribution heads: positive-scale mappings and ``NormalParamExtractor``.

A mapping turns an unconstrained tensor into a positive one. Names accepted by
:func:`mappings` (and by ``NormalParamExtractor(scale_mapping=...)``):

- ``"biased_softplus_X"``: ``softplus(x + b) + 0.01`` with ``b`` chosen so that
  ``mapping(0) == X`` (``"biased_softplus"`` alone means ``X = 1``).
- ``"biased_softplus_X_Y"``: the same with minimum ``Y``: ``softplus(x + b) + Y``,
  ``mapping(0) == X`` (needs ``X > Y``).
- ``"softplus"``, ``"exp"``, ``"relu"``, ``"expln"`` (``exp`` below 0, ``log1p(x) + 1``
  above), ``"none"``/``"identity"``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.nn import functional as F

__all__ = [
    "NormalParamExtractor",
    "biased_softplus",
    "inv_softplus",
    "mappings",
    "expln",
]


def inv_softplus(bias: float | Tensor) -> float | Tensor:
    """The inverse of softplus: ``inv_softplus(softplus(x)) == x`` (for ``x > 0`` inputs).

    >>> round(inv_softplus(math.log(2.0)), 6)
    0.0
    """
    if isinstance(bias, Tensor):
        return bias.expm1().clamp_min(1e-12).log()
    return math.log(math.expm1(bias))


class biased_softplus(nn.Module):
    """``softplus(x + b) + min_val``, with ``b`` such that ``f(0) == bias``.

    Args:
        bias: the value at 0; must be greater than ``min_val``.
        min_val: the lower bound the output approaches for very negative inputs.

    Shapes: any input shape; the output has the same shape.

    Example:
        >>> import torch
        >>> f = biased_softplus(2.0, min_val=0.5)
        >>> f(torch.zeros(3))
        tensor([2., 2., 2.])
        >>> bool(f(torch.full((1,), -100.0)) >= 0.5)
        True
    """

    def __init__(self, bias: float, min_val: float = 0.01) -> None:
        super().__init__()
        if not bias > min_val:
            raise ValueError(
                f"biased_softplus: the value at 0 ({bias}) must be greater than the minimum "
                f"({min_val})"
            )
        self.bias = float(inv_softplus(bias - min_val))
        self.min_val = float(min_val)

    def forward(self, x: Tensor) -> Tensor:
        return F.softplus(x + self.bias) + self.min_val

    def extra_repr(self) -> str:
        return f"bias={self.bias:.4f}, min_val={self.min_val}"


def expln(x: Tensor) -> Tensor:
    """``exp(x)`` for ``x <= 0`` and ``log1p(x) + 1`` above: positive, grows slowly.

    >>> import torch
    >>> expln(torch.tensor([0.0, 1.0]))
    tensor([1.0000, 1.6931])
    """
    return torch.where(x > 0, torch.log1p(x.clamp_min(0)) + 1.0, x.clamp_max(0).exp())


def _identity(x: Tensor) -> Tensor:
    return x


_NAMED: dict[str, Callable[[Tensor], Tensor]] = {
    "softplus": F.softplus,
    "exp": torch.exp,
    "relu": torch.relu,
    "expln": expln,
    "none": _identity,
    "identity": _identity,
}


def mappings(key: str) -> Callable[[Tensor], Tensor]:
    """The positive mapping named ``key`` (see the module docstring for the names).

    Example:
        >>> import torch
        >>> mappings("biased_softplus_1.0")(torch.zeros(2))
        tensor([1., 1.])
        >>> mappings("exp")(torch.zeros(1))
        tensor([1.])
    """
    if key in _NAMED:
        return _NAMED[key]
    if key == "biased_softplus":
        return biased_softplus(1.0)
    if key.startswith("biased_softplus_"):
        parts = key[len("biased_softplus_") :].split("_")
        try:
            values = [float(p) for p in parts]
        except ValueError:
            values = []
        if len(values) == 1:
            return biased_softplus(values[0])
        if len(values) == 2:
            return biased_softplus(values[0], min_val=values[1])
    raise ValueError(
        f"unknown scale mapping {key!r}; use one of {sorted(_NAMED)}, 'biased_softplus', "
        "'biased_softplus_<value at 0>' or 'biased_softplus_<value at 0>_<minimum>'"
    )


class NormalParamExtractor(nn.Module):
    """Splits the last dim in two halves: ``(loc, scale)``, with ``scale`` made positive.

    Args:
        scale_mapping: a mapping name (see :func:`mappings`) or a callable applied to the
            second half. Default: ``"biased_softplus_1.0"`` (``scale == 1`` for input 0).
        scale_lb: the scale is clamped from below at this value.

    Shapes: input ``[*batch, 2 * d]`` -> ``loc`` ``[*batch, d]``, ``scale`` ``[*batch, d]``.

    Example:
        >>> import torch
        >>> loc, scale = NormalParamExtractor()(torch.zeros(4, 6))
        >>> loc.shape, scale.shape
        (torch.Size([4, 3]), torch.Size([4, 3]))
        >>> scale[0]
        tensor([1., 1., 1.])
    """

    def __init__(
        self,
        scale_mapping: str | Callable[[Tensor], Tensor] = "biased_softplus_1.0",
        scale_lb: float = 1e-4,
    ) -> None:
        super().__init__()
        self.scale_mapping = mappings(scale_mapping) if isinstance(scale_mapping, str) else scale_mapping
        self.scale_lb = float(scale_lb)

    def forward(self, tensor: Tensor) -> tuple[Tensor, Tensor]:
        loc, scale = tensor.chunk(2, -1)
        return loc, self.scale_mapping(scale).clamp_min(self.scale_lb)


def add_custom_mapping(name: str, mapping: Callable[[Tensor], Tensor]) -> None:
    """Registers ``mapping`` under ``name`` for :func:`mappings` (and so for ``scale_mapping``).

    Raises:
        ValueError: ``name`` is already a mapping.
    """
    if name in _NAMED or name.startswith("biased_softplus"):
        raise ValueError(f"add_custom_mapping: {name!r} is already a mapping")
    if not callable(mapping):
        raise TypeError(f"add_custom_mapping: the mapping for {name!r} must be callable")
    _NAMED[name] = mapping
