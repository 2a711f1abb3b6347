"""Distributions for policies: the ones of :mod:`steersman.tensordict.nn` plus
``IndependentNormal``.

Every class has a ``deterministic_sample`` (what a policy plays under
``set_exploration_type(DETERMINISTIC)``).
"""

from __future__ import annotations

from torch import Tensor
from torch import distributions as D

from ..tensordict.nn import (
    Delta,
    MaskedCategorical,
    MaskedOneHotCategorical,
    NormalParamExtractor,
    OneHotCategorical,
    ReparamGradientStrategy,
    TanhNormal,
    TruncatedNormal,
)

__all__ = [
    "IndependentNormal",
    "TanhNormal",
    "TruncatedNormal",
    "Delta",
    "OneHotCategorical",
    "MaskedCategorical",
    "MaskedOneHotCategorical",
    "ReparamGradientStrategy",
    "NormalParamExtractor",
]


class IndependentNormal(D.Independent):
    """A diagonal Normal whose last ``event_dim`` dims form the event.

    Args:
        loc: the mean, ``[*batch, *event]``.
        scale: the standard deviation (a tensor broadcastable to ``loc``, or a number).
        upscale: with ``tanh_loc=True``, ``loc`` becomes ``upscale * tanh(loc / upscale)``
            (keeps the mean in ``(-upscale, upscale)``).
        tanh_loc: see ``upscale`` (default ``False``: ``loc`` as given).
        event_dim: number of trailing event dims (default 1).

    ``log_prob``/``entropy`` sum over the event: shape ``[*batch]``. ``mode`` and
    ``deterministic_sample`` are the mean.

    Example:
        >>> import torch
        >>> d = IndependentNormal(torch.zeros(4, 2), torch.ones(4, 2))
        >>> d.sample().shape, d.log_prob(torch.zeros(4, 2)).shape
        (torch.Size([4, 2]), torch.Size([4]))
        >>> IndependentNormal(torch.full((2,), 100.0), 1.0, tanh_loc=True).deterministic_sample
        tensor([5., 5.])
    """

    def __init__(
        self,
        loc: Tensor,
        scale: Tensor | float,
        upscale: float = 5.0,
        tanh_loc: bool = False,
        event_dim: int = 1,
        validate_args: bool | None = None,
    ) -> None:
        if tanh_loc:
            loc = upscale * (loc / upscale).tanh()
        self.upscale, self.tanh_loc = upscale, tanh_loc
        super().__init__(D.Normal(loc, scale, validate_args=validate_args), event_dim,
                         validate_args=validate_args)

    @property
    def mode(self) -> Tensor:
        return self.base_dist.mean

    @property
    def deterministic_sample(self) -> Tensor:
        return self.base_dist.mean
