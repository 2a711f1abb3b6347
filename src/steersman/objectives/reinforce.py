"""``ReinforceLoss``: REINFORCE with a learned baseline (Williams, 1992).

``loss_actor = -mean(log π(a|s) · A)`` with the advantage ``A`` read from the batch or,
when absent, computed by the value estimator (GAE by default, without gradient);
``loss_value = mean(distance(V(s), value_target))``. No entropy term. Keys and batch
layout as for :class:`~steersman.objectives.A2CLoss`.

Example:
    >>> import torch
    >>> from steersman.tensordict import TensorDict
    >>> from steersman.tensordict.nn import (OneHotCategorical, ProbabilisticTensorDictModule,
    ...     ProbabilisticTensorDictSequential, TensorDictModule)
    >>> actor = ProbabilisticTensorDictSequential(
    ...     TensorDictModule(torch.nn.Linear(3, 2), ["observation"], ["logits"]),
    ...     ProbabilisticTensorDictModule(["logits"], ["action"], OneHotCategorical))
    >>> critic = TensorDictModule(torch.nn.Linear(3, 1), ["observation"], ["state_value"])
    >>> loss = ReinforceLoss(actor, critic)
    >>> batch = TensorDict({"observation": torch.randn(10, 3), "action": torch.eye(2)[torch.randint(2, (10,))],
    ...                     "advantage": torch.randn(10, 1), "value_target": torch.randn(10, 1)}, [10])
    >>> sorted(loss(batch).keys())
    ['loss_actor', 'loss_value']
"""

from __future__ import annotations

import torch
from torch import nn

from ..tensordict import TensorDictBase
from .actor_critic import ActorCriticLoss, _deprecated_alias, actor_distribution
from .common import NestedKey

__all__ = ["ReinforceLoss"]


class ReinforceLoss(ActorCriticLoss):
    """TorchRL's ``ReinforceLoss``.

    Args:
        actor_network: a probabilistic actor (``get_dist``).
        critic_network: writes ``"state_value"`` (``[*B, 1]``); ``None``: no ``loss_value``
            (the batch must then carry the advantage).
        delay_value: a target critic for the value estimator's ``V(s')`` (default ``False``);
            move it with ``SoftUpdate``/``HardUpdate``.
        loss_critic_type: ``"smooth_l1"`` (default), ``"l2"`` or ``"l1"``.
        gamma: shortcut for ``make_value_estimator(gamma=...)``.
        separate_losses: parameters the critic shares with the actor learn from
            ``loss_actor`` only.
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.
        clip_value: clip the critic's change from the batch's ``"state_value"``.
        functional: accepted for TorchRL compatibility and ignored.
        actor, critic, advantage_key, value_target_key: TorchRL's deprecated spellings, as
            for :class:`~steersman.objectives.actor_critic.ActorCriticLoss`.

    Outputs: ``loss_actor`` and ``loss_value``.
    """

    def __init__(
        self,
        actor_network: nn.Module | None = None,
        critic_network: nn.Module | None = None,
        *,
        delay_value: bool = False,
        loss_critic_type: str = "smooth_l1",
        gamma: float | None = None,
        separate_losses: bool = False,
        reduction: str = "mean",
        clip_value: float | None = None,
        functional: bool = True,
        actor: nn.Module | None = None,
        critic: nn.Module | None = None,
        advantage_key: NestedKey | None = None,
        value_target_key: NestedKey | None = None,
    ) -> None:
        critic_network = _deprecated_alias("ReinforceLoss", "critic_network", critic_network, "critic", critic)
        super().__init__(
            actor_network, critic_network, entropy_bonus=False, critic_coeff=None if critic_network is None else 1.0,
            loss_critic_type=loss_critic_type, gamma=gamma, separate_losses=separate_losses, reduction=reduction,
            clip_value=clip_value, functional=functional, actor=actor, advantage_key=advantage_key, value_target_key=value_target_key,
        )
        self.delay_value = bool(delay_value)
        if self.delay_value:
            if critic_network is None:
                raise ValueError("ReinforceLoss: delay_value=True needs a critic_network")
            self.make_target("critic_network")

    def _advantage(self, td: TensorDictBase) -> torch.Tensor:
        if self.delay_value and td.get(self.tensor_keys.advantage, None) is None:
            with torch.no_grad():  # V(s') from the target critic
                self.value_estimator(td, target_params=self.target_critic_network_params)
        return super()._advantage(td)

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        td = td.copy()  # what the loss writes stays out of the caller's batch
        advantage = self._advantage(td)[..., 0]
        action = self._get(td, "action")
        dist = actor_distribution(self.actor_network, td)
        log_prob = dist.log_prob(action)
        if log_prob.shape != td.batch_size:
            raise ValueError(
                f"ReinforceLoss: the actor's log_prob has shape {list(log_prob.shape)}, expected the "
                f"batch shape {list(td.batch_size)} (use a distribution whose log_prob sums over the "
                "action dims, e.g. TanhNormal or Independent(Normal, 1))"
            )
        out = {"loss_actor": -(log_prob * advantage.detach())}
        if self.critic_coeff is not None:
            out["loss_value"] = self.loss_critic(td)[0][..., 0]
        return self._output(out)
