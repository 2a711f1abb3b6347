"""Noisy linear layers (NoisyNet, Fortunato et al. 2018): learned, factorized Gaussian
noise on the weights replaces epsilon-greedy exploration.

The noise is drawn at construction and by :func:`reset_noise` (call
``module.apply(reset_noise)`` after each optimizer step); the forward pass never redraws it.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..tensordict.nn import InteractionType, interaction_type

__all__ = ["NoisyLinear", "NoisyLazyLinear", "reset_noise"]


def _factorized_noise(size: int, device: Any) -> Tensor:
    x = torch.randn(size, device=device)
    return x.sign() * x.abs().sqrt()


class NoisyLinear(nn.Linear):
    """A linear layer whose weight and bias are ``mu + sigma * epsilon``.

    ``mu`` and ``sigma`` are learned; ``epsilon`` is factorized Gaussian noise
    (``f(e_out) f(e_in)^T`` with ``f(x) = sign(x) sqrt(|x|)``), kept in buffers.

    Args:
        in_features: input size.
        out_features: output size.
        bias: whether the layer has a (noisy) bias.
        device: where the parameters live.
        dtype: their dtype.
        std_init: initial ``sigma`` is ``std_init / sqrt(in_features)`` (weights) and
            ``std_init / sqrt(out_features)`` (bias).
        use_exploration_type: if ``True`` (default) the noise is used while exploring
            (outside any ``set_exploration_type`` block or under ``RANDOM``) and not under
            ``DETERMINISTIC``/``MODE``/``MEAN``; if ``False`` it is used in ``train()`` mode
            only.

    Shapes: ``[*batch, in_features] -> [*batch, out_features]``.

    Example:
        >>> import torch
        >>> from steersman.tensordict.nn import ExplorationType, set_exploration_type
        >>> layer = NoisyLinear(4, 2)
        >>> x = torch.randn(3, 4)
        >>> with set_exploration_type(ExplorationType.DETERMINISTIC):
        ...     torch.equal(layer(x), x @ layer.weight_mu.T + layer.bias_mu)
        True
        >>> layer(x).shape
        torch.Size([3, 2])
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device: Any = None,
        dtype: torch.dtype | None = None,
        std_init: float = 0.5,
        use_exploration_type: bool | None = True,
    ) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.std_init = float(std_init)
        self._use_exploration_type = bool(use_exploration_type)
        kw = {"device": device, "dtype": dtype}
        self.weight_mu = nn.Parameter(torch.empty(out_features, in_features, **kw))
        self.weight_sigma = nn.Parameter(torch.empty(out_features, in_features, **kw))
        self.register_buffer("weight_epsilon", torch.empty(out_features, in_features, **kw))
        if bias:
            self.bias_mu = nn.Parameter(torch.empty(out_features, **kw))
            self.bias_sigma = nn.Parameter(torch.empty(out_features, **kw))
            self.register_buffer("bias_epsilon", torch.empty(out_features, **kw))
        else:
            self.bias_mu = self.bias_sigma = self.bias_epsilon = None
        self.reset_parameters()
        self.reset_noise()

    def reset_parameters(self) -> None:
        bound = 1 / math.sqrt(self.in_features)
        with torch.no_grad():
            self.weight_mu.uniform_(-bound, bound)
            self.weight_sigma.fill_(self.std_init / math.sqrt(self.in_features))
            if self.bias_mu is not None:
                self.bias_mu.uniform_(-bound, bound)
                self.bias_sigma.fill_(self.std_init / math.sqrt(self.out_features))

    @torch.no_grad()
    def reset_noise(self) -> None:
        """Draws new factorized noise into ``weight_epsilon`` and ``bias_epsilon``."""
        eps_in = _factorized_noise(self.in_features, self.weight_mu.device)
        eps_out = _factorized_noise(self.out_features, self.weight_mu.device)
        self.weight_epsilon.copy_(torch.outer(eps_out, eps_in))
        if self.bias_mu is not None:
            self.bias_epsilon.copy_(eps_out)

    def _noisy(self) -> bool:
        if self._use_exploration_type:
            mode = interaction_type()
            return mode is None or mode is InteractionType.RANDOM
        return self.training

    @property
    def weight(self) -> Tensor:  # type: ignore[override]
        if self._noisy():
            return self.weight_mu + self.weight_sigma * self.weight_epsilon
        return self.weight_mu

    @property
    def bias(self) -> Tensor | None:  # type: ignore[override]
        if self.bias_mu is None:
            return None
        if self._noisy():
            return self.bias_mu + self.bias_sigma * self.bias_epsilon
        return self.bias_mu

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias_mu is not None}, std_init={self.std_init}")


class NoisyLazyLinear(nn.modules.lazy.LazyModuleMixin, NoisyLinear):
    """:class:`NoisyLinear` whose ``in_features`` is set by the first call.

    Example:
        >>> import torch
        >>> layer = NoisyLazyLinear(2)
        >>> layer(torch.randn(5, 7)).shape, layer.in_features
        (torch.Size([5, 2]), 7)
    """

    cls_to_become = NoisyLinear

    def __init__(
        self,
        out_features: int,
        bias: bool = True,
        device: Any = None,
        dtype: torch.dtype | None = None,
        std_init: float = 0.5,
        use_exploration_type: bool | None = True,
    ) -> None:
        super().__init__(0, out_features, bias, device, dtype, std_init, use_exploration_type)
        kw = {"device": device, "dtype": dtype}
        self.weight_mu = nn.UninitializedParameter(**kw)
        self.weight_sigma = nn.UninitializedParameter(**kw)
        self.weight_epsilon = nn.UninitializedBuffer(**kw)

    def reset_parameters(self) -> None:
        if not self.has_uninitialized_params() and self.in_features != 0:
            super().reset_parameters()

    def reset_noise(self) -> None:
        if not self.has_uninitialized_params() and self.in_features != 0:
            super().reset_noise()

    def initialize_parameters(self, x: Tensor) -> None:
        if self.has_uninitialized_params():
            with torch.no_grad():
                self.in_features = x.shape[-1]
                shape = (self.out_features, self.in_features)
                self.weight_mu.materialize(shape)
                self.weight_sigma.materialize(shape)
                self.weight_epsilon.materialize(shape)
                self.reset_parameters()
                self.reset_noise()


def reset_noise(layer: nn.Module) -> None:
    """Redraws the noise of ``layer`` if it has a ``reset_noise`` method (else does nothing).

    Use as ``model.apply(reset_noise)`` after each optimizer step.

    Example:
        >>> import torch
        >>> net = torch.nn.Sequential(NoisyLinear(3, 3), torch.nn.ReLU(), NoisyLinear(3, 1))
        >>> before = net[0].weight_epsilon.clone()
        >>> _ = net.apply(reset_noise)
        >>> bool((net[0].weight_epsilon != before).any())
        True
    """
    if hasattr(layer, "reset_noise"):
        layer.reset_noise()
