"""Dueling Q-networks (Wang et al. 2016): ``Q = V + A - mean(A)`` over a shared trunk."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .conv import ConvNet
from .mlp import MLP

__all__ = ["DuelingMlpDQNet", "DuelingCnnDQNet"]


def _zero_biases(module: nn.Module) -> None:
    with torch.no_grad():
        for layer in module.modules():
            bias = getattr(layer, "bias", None)
            if isinstance(layer, (nn.Linear, nn.Conv2d)) and bias is not None and not isinstance(
                bias, nn.parameter.UninitializedParameter  # lazy layers keep their own init
            ):
                bias.zero_()


def _dueling(features: Tensor, advantage: nn.Module, value: nn.Module) -> Tensor:
    adv = advantage(features)
    return value(features) + adv - adv.mean(-1, keepdim=True)


class DuelingMlpDQNet(nn.Module):
    """A dueling Q-network on vector observations.

    Args:
        out_features: number of actions (size of the advantage head).
        out_features_value: size of the value head (default 1).
        mlp_kwargs_feature: :class:`MLP` arguments of the trunk (default: 2 hidden
            layers of 256, 256 outputs, ELU, last layer activated).
        mlp_kwargs_output: :class:`MLP` arguments of both heads (default: 1 hidden
            layer of 512, ELU).
        device: where the parameters are created.

    Biases start at zero (except in lazy layers). Shapes: ``[*batch, obs] -> [*batch, out_features]``.

    Example:
        >>> import torch
        >>> net = DuelingMlpDQNet(3, mlp_kwargs_feature={"num_cells": [16], "out_features": 16},
        ...                       mlp_kwargs_output={"num_cells": 8})
        >>> net(torch.randn(5, 4)).shape
        torch.Size([5, 3])
    """

    def __init__(
        self,
        out_features: int,
        out_features_value: int = 1,
        mlp_kwargs_feature: dict | None = None,
        mlp_kwargs_output: dict | None = None,
        device: Any = None,
    ) -> None:
        super().__init__()
        feature_kw = {
            "num_cells": [256, 256],
            "out_features": 256,
            "activation_class": nn.ELU,
            "activate_last_layer": True,
        }
        feature_kw.update(mlp_kwargs_feature or {})
        output_kw = {"depth": 1, "num_cells": 512, "activation_class": nn.ELU}
        output_kw.setdefault("in_features", feature_kw["out_features"])
        output_kw.update(mlp_kwargs_output or {})
        self.features = MLP(device=device, **feature_kw)
        self.advantage = MLP(out_features=out_features, device=device, **output_kw)
        self.value = MLP(out_features=out_features_value, device=device, **output_kw)
        self.out_features = out_features
        self.out_features_value = out_features_value
        _zero_biases(self)

    def forward(self, x: Tensor) -> Tensor:
        return _dueling(self.features(x), self.advantage, self.value)


class DuelingCnnDQNet(nn.Module):
    """A dueling Q-network on image observations (the Atari DQN trunk by default).

    Args:
        out_features: number of actions.
        out_features_value: size of the value head (default 1).
        cnn_kwargs: :class:`ConvNet` arguments of the trunk (default: channels
            ``[32, 64, 64]``, kernels ``[8, 4, 3]``, strides ``[4, 2, 1]``).
        mlp_kwargs: :class:`MLP` arguments of both heads (default: 1 hidden layer of
            512, ELU).
        device: where the parameters are created.

    Biases start at zero (except in lazy layers). Shapes: ``[*batch, C, H, W] -> [*batch, out_features]``.

    Example:
        >>> import torch
        >>> net = DuelingCnnDQNet(4, cnn_kwargs={"num_cells": [8], "kernel_sizes": 3, "strides": 1},
        ...                       mlp_kwargs={"num_cells": 16})
        >>> net(torch.randn(2, 3, 8, 8)).shape
        torch.Size([2, 4])
    """

    def __init__(
        self,
        out_features: int,
        out_features_value: int = 1,
        cnn_kwargs: dict | None = None,
        mlp_kwargs: dict | None = None,
        device: Any = None,
    ) -> None:
        super().__init__()
        cnn_kw = {"num_cells": [32, 64, 64], "strides": [4, 2, 1], "kernel_sizes": [8, 4, 3]}
        cnn_kw.update(cnn_kwargs or {})
        output_kw = {"depth": 1, "num_cells": 512, "activation_class": nn.ELU}
        output_kw.update(mlp_kwargs or {})
        self.features = ConvNet(device=device, **cnn_kw)
        self.advantage = MLP(out_features=out_features, device=device, **output_kw)
        self.value = MLP(out_features=out_features_value, device=device, **output_kw)
        self.out_features = out_features
        self.out_features_value = out_features_value
        _zero_biases(self)

    def forward(self, x: Tensor) -> Tensor:
        return _dueling(self.features(x), self.advantage, self.value)
