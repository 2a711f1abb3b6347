"""``RNDLoss``: the predictor loss of random network distillation (Burda et al., 2018).

A frozen, randomly initialised *target* network embeds observations; a *predictor* is
trained to match it. Its error is small on observations seen often, so it serves as an
intrinsic reward for novelty (computed during collection); this loss trains the
predictor on next observations from a replay buffer::

    loss_predictor = mean over a random ``update_fraction`` of the batch of
                     mean_d (predictor(o)_d - target(o)_d)^2

With ``obs_rms`` (any object with ``normalize(obs)``, e.g. the running statistics of the
transform computing the intrinsic reward), observations are normalized and clipped to
``[-obs_clip, obs_clip]`` first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..tensordict import TensorDict, TensorDictBase
from .common import LossModule, NestedKey, check_options

__all__ = ["RNDLoss"]


def _freeze(network: nn.Module) -> None:
    """``requires_grad=False`` on ``network``'s parameters; lazy ones once they exist (after
    its first call)."""
    lazy = [p for p in network.parameters() if nn.parameter.is_lazy(p)]
    for p in network.parameters():
        if not nn.parameter.is_lazy(p):
            p.requires_grad_(False)
    if lazy:
        def hook(module: nn.Module, *_: Any) -> None:
            module.requires_grad_(False)
            handle.remove()

        handle = network.register_forward_hook(hook)


class RNDLoss(LossModule):
    """TorchRL's ``RNDLoss``.

    Args:
        predictor_network: a plain ``nn.Module`` ``[*B, obs] -> [*B, features]`` (trained).
        target_network: same shapes; its parameters are frozen here (``requires_grad=False``).
        obs_rms: optional running statistics with ``normalize(obs)``.
        obs_clip: clip of the normalized observations (default 5.0; with ``obs_rms`` only).
        reduction: ``"mean"`` (over the selected samples; default), ``"sum"`` or
            ``"none"`` (``[*B]``, unselected samples 0).
        update_fraction: the fraction of samples, drawn at random each call, that
            contribute (default 0.25, as in the paper); 1.0 uses all.

    Reads ``("next", "observation")`` (``tensor_keys.observation``); returns ``loss_predictor``.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> loss = RNDLoss(torch.nn.Linear(4, 16), torch.nn.Linear(4, 16), update_fraction=1.0)
        >>> out = loss(TensorDict({"next": {"observation": torch.randn(32, 4)}}, [32]))
        >>> out["loss_predictor"].backward()
        >>> loss.target_network.weight.requires_grad
        False
    """

    @dataclass
    class _AcceptedKeys:
        """Batch keys: the observation the networks read."""

        observation: NestedKey = ("next", "observation")

    out_keys = ["loss_predictor"]
    networks = ("predictor_network",)

    def __init__(
        self,
        predictor_network: nn.Module,
        target_network: nn.Module,
        *,
        obs_rms: Any = None,
        obs_clip: float = 5.0,
        reduction: str = "mean",
        update_fraction: float = 0.25,
    ) -> None:
        super().__init__()
        check_options(self, reduction=reduction)
        if not 0.0 < float(update_fraction) <= 1.0:
            raise ValueError(f"RNDLoss: update_fraction must be in (0, 1], got {update_fraction}")
        if predictor_network is target_network:
            raise ValueError("RNDLoss: the predictor and the target must be two different networks")
        self.predictor_network = predictor_network
        self.target_network = target_network
        _freeze(target_network)
        self.obs_rms = obs_rms
        self.obs_clip = float(obs_clip)
        self.reduction = reduction
        self.update_fraction = float(update_fraction)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        obs = self._get(tensordict, "observation").float()
        if self.obs_rms is not None:
            obs = self.obs_rms.normalize(obs).clamp(-self.obs_clip, self.obs_clip)
        with torch.no_grad():
            target = self.target_network(obs)
        per_sample = (self.predictor_network(obs) - target).pow(2).mean(-1)      # [*B]
        if self.update_fraction < 1.0:
            mask = (torch.rand_like(per_sample) < self.update_fraction).to(per_sample.dtype)
            per_sample = per_sample * mask
            count = mask.sum().clamp_min(1.0)
        else:
            count = torch.tensor(float(per_sample.numel()))
        if self.reduction == "mean":
            loss = per_sample.sum() / count
        elif self.reduction == "sum":
            loss = per_sample.sum()
        else:
            loss = per_sample
        return TensorDict({"loss_predictor": loss}, [])
