"""Distributions for policies: the ones of :mod:`steersman.tensordict.nn` plus
``IndependentNormal``.

Every class has a ``deterministic_sample`` (what a policy plays under
``set_exploration_type(DETERMINISTIC)``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
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
    "TanhDelta",
    "Ordinal",
    "OneHotOrdinal",
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


class TanhDelta(D.Distribution):
    """A Dirac delta at ``low + (high - low) * (tanh(param) + 1) / 2``: a deterministic
    bounded action (DDPG/TD3 policies) behind the distribution interface.

    Args:
        param: the pre-squash value, ``[*batch, *event]``.
        low: lower bound (number or tensor broadcastable to ``param``; default -1).
        high: upper bound (default 1).
        event_dims: number of trailing event dims (default 1).
        atol, rtol: tolerance of :meth:`log_prob`'s equality test.
        safe: unused (TorchRL's flag; kept for signature compatibility).

    ``sample``/``rsample``/``mode``/``mean``/``deterministic_sample`` all give the point
    (``rsample`` keeps the gradient to ``param``). ``log_prob(x)`` is 0 where ``x`` equals
    the point (within tolerance) over the whole event, ``-inf`` elsewhere; shape
    ``[*batch]``. TorchRL 0.14 places the point elsewhere for asymmetric bounds and gives
    ``-inf`` for its own samples; this follows the documented squash.

    Example:
        >>> import torch
        >>> d = TanhDelta(torch.tensor([[0.0, 100.0]]), low=-2.0, high=3.0)
        >>> d.mode
        tensor([[0.5000, 3.0000]])
        >>> d.log_prob(d.sample())
        tensor([0.])
    """

    arg_constraints: dict = {}
    has_rsample = True

    def __init__(
        self,
        param: Tensor,
        low: Tensor | float = -1.0,
        high: Tensor | float = 1.0,
        event_dims: int = 1,
        atol: float = 1e-6,
        rtol: float = 1e-6,
        safe: bool = True,
    ) -> None:
        low_t = torch.as_tensor(low, dtype=param.dtype, device=param.device)
        high_t = torch.as_tensor(high, dtype=param.dtype, device=param.device)
        if not bool((low_t < high_t).all()):
            raise ValueError(f"TanhDelta: low must be < high, got low={low} and high={high}")
        if event_dims > param.ndim:
            raise ValueError(f"TanhDelta: event_dims={event_dims} but param has shape {list(param.shape)}")
        self.low, self.high, self.event_dims, self.atol, self.rtol = low_t, high_t, event_dims, atol, rtol
        self.param = param
        self._point = low_t + (high_t - low_t) * (param.tanh() + 1) / 2
        cut = param.ndim - event_dims
        super().__init__(param.shape[:cut], param.shape[cut:], validate_args=False)

    def rsample(self, sample_shape: torch.Size | Sequence[int] = torch.Size()) -> Tensor:
        return self._point.expand(*sample_shape, *self._point.shape)

    def sample(self, sample_shape: torch.Size | Sequence[int] = torch.Size()) -> Tensor:
        return self.rsample(sample_shape).detach()

    def log_prob(self, value: Tensor) -> Tensor:
        close = torch.isclose(value, self._point.expand_as(value), atol=self.atol, rtol=self.rtol)
        if self.event_dims:
            close = close.flatten(-self.event_dims).all(-1)
        zero = torch.zeros((), dtype=value.dtype, device=value.device)
        return torch.where(close, zero, torch.full_like(zero, -float("inf")))

    @property
    def mode(self) -> Tensor:
        return self._point

    @property
    def mean(self) -> Tensor:
        return self._point

    @property
    def deterministic_sample(self) -> Tensor:
        return self._point


def _ordinal_logits(scores: Tensor) -> Tensor:
    """Class ``k`` gets ``sum_{j<=k} log s(x_j) + sum_{j>k} log s(-x_j)``, normalized."""
    up = torch.nn.functional.logsigmoid(scores).cumsum(-1)
    down = torch.nn.functional.logsigmoid(-scores)
    down = down.flip(-1).cumsum(-1).flip(-1)  # sum over j >= k
    down = torch.cat([down[..., 1:], torch.zeros_like(down[..., :1])], -1)  # j > k
    return (up + down).log_softmax(-1)


class Ordinal(D.Categorical):
    """A categorical over ordered classes (Tang & Agrawal 2020): the score of class ``k``
    adds ``log sigmoid(s_j)`` for ``j <= k`` and ``log sigmoid(-s_j)`` for ``j > k``, so
    neighbouring classes share probability mass. Samples are class indices.

    Args:
        scores: ``[*batch, n]`` real scores.

    Example:
        >>> import torch
        >>> d = Ordinal(torch.tensor([[0.5, -1.0, 2.0]]))
        >>> d.probs
        tensor([[0.2447, 0.0900, 0.6652]])
    """

    def __init__(self, scores: Tensor) -> None:
        super().__init__(logits=_ordinal_logits(scores))


class OneHotOrdinal(OneHotCategorical):
    """:class:`Ordinal` with one-hot samples.

    Example:
        >>> import torch
        >>> sample = OneHotOrdinal(torch.tensor([0.0, -50.0, 50.0])).sample()  # random: one class
        >>> sample.shape, sample.sum().item()
        (torch.Size([3]), 1.0)
    """

    def __init__(self, scores: Tensor) -> None:
        super().__init__(logits=_ordinal_logits(scores))
