"""DDPG's actor and Q-networks (Lillicrap et al. 2016), as TorchRL ships them.

- :class:`DdpgMlpActor`: observation -> action (MLP 400-300, ELU);
- :class:`DdpgMlpQNet`: observation -> 400 units, concatenated with the action -> 300 -> 1;
- :class:`DdpgCnnActor` / :class:`DdpgCnnQNet`: the same from pixels (a :class:`ConvNet`
  before the MLP).

The output layer starts with small uniform weights (``U(-6e-3, 6e-3)`` for the MLP nets,
``U(-6e-4, 6e-4)`` after a ConvNet), so the first actions and values are near zero.
Every default can be overridden by the ``*_kwargs`` dicts (merged into the defaults).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .conv import ConvNet, SquashDims
from .mlp import MLP

__all__ = ["DdpgMlpActor", "DdpgMlpQNet", "DdpgCnnActor", "DdpgCnnQNet"]


def _init_last_layer(net: nn.Sequential, scale: float) -> None:
    last = [m for m in net if isinstance(m, nn.Linear)][-1]
    with torch.no_grad():
        last.weight.uniform_(-scale, scale)
        if last.bias is not None:
            last.bias.uniform_(-scale, scale)


def _conv_defaults(num_cells: list[int], use_avg_pooling: bool) -> dict:
    return {
        "in_features": None,
        "num_cells": num_cells,
        "kernel_sizes": [8, 4, 3],
        "strides": [4, 2, 1],
        "paddings": [0, 0, 1],
        "activation_class": nn.ELU,
        "aggregator_class": nn.AdaptiveAvgPool2d if use_avg_pooling else SquashDims,
        "aggregator_kwargs": {"output_size": (1, 1)} if use_avg_pooling else {"ndims_in": 3},
        "squeeze_output": use_avg_pooling,
    }


class DdpgMlpActor(nn.Module):
    """DDPG actor: ``MLP(out_features=action_dim, num_cells=[400, 300], activation ELU)``.

    Args:
        action_dim: size of the action.
        mlp_net_kwargs: :class:`MLP` arguments overriding the defaults (lazy input size,
            ``num_cells=[400, 300]``, ``nn.ELU``).
        device: where the parameters are created.

    Shapes: ``[*batch, obs_dim] -> [*batch, action_dim]``.

    Example:
        >>> import torch
        >>> actor = DdpgMlpActor(action_dim=2, mlp_net_kwargs={"num_cells": [16, 16]})
        >>> actor(torch.randn(5, 3)).shape
        torch.Size([5, 2])
    """

    def __init__(self, action_dim: int, mlp_net_kwargs: dict | None = None, device: Any = None) -> None:
        super().__init__()
        kwargs = {"in_features": None, "out_features": action_dim, "depth": 2, "num_cells": [400, 300],
                  "activation_class": nn.ELU, "bias_last_layer": True}
        kwargs.update(mlp_net_kwargs or {})
        if "num_cells" in (mlp_net_kwargs or {}) and "depth" not in (mlp_net_kwargs or {}):
            kwargs.pop("depth")
        self.mlp = MLP(device=device, **kwargs)
        _init_last_layer(self.mlp, 6e-3)

    def forward(self, observation: Tensor) -> Tensor:
        return self.mlp(observation)


class DdpgMlpQNet(nn.Module):
    """DDPG Q-network: ``mlp2(cat(mlp1(observation), action))``.

    Args:
        mlp_net_kwargs_net1: :class:`MLP` arguments of the observation net (default: one
            lazy linear layer to 400 units, followed by ELU).
        mlp_net_kwargs_net2: arguments of the head (default: ``num_cells=[300]``, ELU,
            output 1).
        device: where the parameters are created.

    Shapes: ``[*batch, obs_dim], [*batch, action_dim] -> [*batch, 1]``.

    Example:
        >>> import torch
        >>> q = DdpgMlpQNet(mlp_net_kwargs_net1={"out_features": 8}, mlp_net_kwargs_net2={"num_cells": [8]})
        >>> q(torch.randn(5, 3), torch.randn(5, 2)).shape
        torch.Size([5, 1])
    """

    def __init__(
        self,
        mlp_net_kwargs_net1: dict | None = None,
        mlp_net_kwargs_net2: dict | None = None,
        device: Any = None,
    ) -> None:
        super().__init__()
        kw1 = {"in_features": None, "out_features": 400, "depth": 0, "num_cells": [],
               "activation_class": nn.ELU, "bias_last_layer": True, "activate_last_layer": True}
        kw1.update(mlp_net_kwargs_net1 or {})
        kw2 = {"in_features": None, "out_features": 1, "num_cells": [300], "activation_class": nn.ELU,
               "bias_last_layer": True}
        kw2.update(mlp_net_kwargs_net2 or {})
        self.mlp1 = MLP(device=device, **kw1)
        self.mlp2 = MLP(device=device, **kw2)
        _init_last_layer(self.mlp2, 6e-3)

    def forward(self, observation: Tensor, action: Tensor) -> Tensor:
        return self.mlp2(torch.cat([self.mlp1(observation), action], -1))


class DdpgCnnActor(nn.Module):
    """DDPG actor from pixels: ``ConvNet`` (32-64-64 channels, kernels 8-4-3, strides
    4-2-1) then an MLP (two layers of 200, ELU).

    Args:
        action_dim: size of the action.
        conv_net_kwargs: :class:`ConvNet` arguments overriding the defaults.
        mlp_net_kwargs: :class:`MLP` arguments overriding the defaults.
        use_avg_pooling: end the ConvNet with a global average pool instead of flattening.
        device: where the parameters are created.

    ``forward`` returns ``(action, hidden)``, the ConvNet features being ``hidden``.

    Shapes: ``[*batch, C, H, W] -> ([*batch, action_dim], [*batch, features])``.

    Example:
        >>> import torch
        >>> actor = DdpgCnnActor(action_dim=2, use_avg_pooling=True)
        >>> action, hidden = actor(torch.randn(4, 3, 32, 32))
        >>> action.shape, hidden.shape
        (torch.Size([4, 2]), torch.Size([4, 64]))
    """

    def __init__(
        self,
        action_dim: int,
        conv_net_kwargs: dict | None = None,
        mlp_net_kwargs: dict | None = None,
        use_avg_pooling: bool = False,
        device: Any = None,
    ) -> None:
        super().__init__()
        conv = _conv_defaults([32, 64, 64], use_avg_pooling)
        conv.update(conv_net_kwargs or {})
        mlp = {"in_features": None, "out_features": action_dim, "depth": 2, "num_cells": 200,
               "activation_class": nn.ELU, "bias_last_layer": True}
        mlp.update(mlp_net_kwargs or {})
        self.convnet = ConvNet(device=device, **conv)
        self.mlp = MLP(device=device, **mlp)
        _init_last_layer(self.mlp, 6e-4)

    def forward(self, observation: Tensor) -> tuple[Tensor, Tensor]:
        hidden = self.convnet(observation)
        return self.mlp(hidden), hidden


class DdpgCnnQNet(nn.Module):
    """DDPG Q-network from pixels: ``mlp(cat(convnet(observation), action))``.

    Args:
        conv_net_kwargs: :class:`ConvNet` arguments overriding the defaults (32-64-128
            channels, kernels 8-4-3, strides 4-2-1).
        mlp_net_kwargs: :class:`MLP` arguments overriding the defaults (two layers of 200,
            output 1).
        use_avg_pooling: end the ConvNet with a global average pool (default ``True``).
        device: where the parameters are created.

    Shapes: ``[*batch, C, H, W], [*batch, action_dim] -> [*batch, 1]``.

    Example:
        >>> import torch
        >>> q = DdpgCnnQNet()
        >>> q(torch.randn(4, 3, 32, 32), torch.randn(4, 2)).shape
        torch.Size([4, 1])
    """

    def __init__(
        self,
        conv_net_kwargs: dict | None = None,
        mlp_net_kwargs: dict | None = None,
        use_avg_pooling: bool = True,
        device: Any = None,
    ) -> None:
        super().__init__()
        conv = _conv_defaults([32, 64, 128], use_avg_pooling)
        conv.update(conv_net_kwargs or {})
        mlp = {"in_features": None, "out_features": 1, "depth": 2, "num_cells": 200,
               "activation_class": nn.ELU, "bias_last_layer": True}
        mlp.update(mlp_net_kwargs or {})
        self.convnet = ConvNet(device=device, **conv)
        self.mlp = MLP(device=device, **mlp)
        _init_last_layer(self.mlp, 6e-4)

    def forward(self, observation: Tensor, action: Tensor) -> Tensor:
        return self.mlp(torch.cat([self.convnet(observation), action], -1))
