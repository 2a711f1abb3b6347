"""``A2CLoss``: advantage actor-critic.

``loss_objective = -mean(log π(a|s) · A)``, ``loss_entropy = -entropy_coeff · mean(H(π))``,
``loss_critic = critic_coeff · mean(distance(V(s), value_target))``. If the batch has no
``"advantage"``, the loss computes it (and ``"value_target"``) with its value estimator
(GAE by default, without gradient) first. Keys and batch layout as for
:class:`~steersman.objectives.PPOLoss` (``"sample_log_prob"`` is not needed).

Example:
    >>> import torch
    >>> from steersman.tensordict import TensorDict
    >>> from steersman.tensordict.nn import (OneHotCategorical, ProbabilisticTensorDictModule,
    ...     ProbabilisticTensorDictSequential, TensorDictModule)
    >>> actor = ProbabilisticTensorDictSequential(
    ...     TensorDictModule(torch.nn.Linear(3, 2), ["observation"], ["logits"]),
    ...     ProbabilisticTensorDictModule(["logits"], ["action"], OneHotCategorical))
    >>> critic = TensorDictModule(torch.nn.Linear(3, 1), ["observation"], ["state_value"])
    >>> loss = A2CLoss(actor, critic)
    >>> batch = TensorDict({"observation": torch.randn(10, 3),                 # [B=10, 3]
    ...                     "action": torch.eye(2)[torch.randint(2, (10,))],   # one-hot [10, 2]
    ...                     "advantage": torch.randn(10, 1), "value_target": torch.randn(10, 1)}, [10])
    >>> out = loss(batch)
    >>> sorted(out.keys())
    ['entropy', 'loss_critic', 'loss_entropy', 'loss_objective']
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ..tensordict import TensorDictBase
from .common import LossModule
from .ppo import UNSET, _ActorCriticTerms, actor_distribution, pick_coeff
from .utils import ValueEstimators

__all__ = ["A2CLoss"]

NestedKey = str | tuple


class A2CLoss(_ActorCriticTerms, LossModule):
    """Advantage actor-critic loss (TorchRL's ``A2CLoss``).

    Args:
        actor_network: a probabilistic actor (``get_dist(td)``).
        critic_network: a module writing ``"state_value"`` (``[*B, 1]``).

    Keyword Args:
        entropy_bonus, samples_mc_entropy, entropy_coeff (or entropy_coef, default 0.01),
        critic_coeff (or critic_coef, default 1.0; ``None`` drops the critic loss),
        loss_critic_type (``"smooth_l1"``), gamma, separate_losses, reduction (``"mean"``),
        clip_value, functional: as for :class:`~steersman.objectives.PPOLoss`.

    Outputs: ``loss_objective``, ``loss_entropy``, ``loss_critic`` and ``entropy``.
    """

    @dataclass
    class _AcceptedKeys:
        """Batch keys; reward/done/terminated are read under ``"next"`` by the estimator."""

        advantage: NestedKey = "advantage"
        value_target: NestedKey = "value_target"
        value: NestedKey = "state_value"
        action: NestedKey = "action"
        reward: NestedKey = "reward"
        done: NestedKey = "done"
        terminated: NestedKey = "terminated"
        sample_log_prob: NestedKey = "action_log_prob"

    default_value_estimator = ValueEstimators.GAE

    def __init__(
        self,
        actor_network: nn.Module,
        critic_network: nn.Module | None = None,
        *,
        entropy_bonus: bool = True,
        samples_mc_entropy: int = 1,
        entropy_coeff: float = UNSET,
        entropy_coef: float = UNSET,
        critic_coeff: float | None = UNSET,
        critic_coef: float | None = UNSET,
        loss_critic_type: str = "smooth_l1",
        gamma: float | None = None,
        separate_losses: bool = False,
        reduction: str = "mean",
        clip_value: float | None = None,
        functional: bool = True,
    ) -> None:
        super().__init__()
        self._init_terms(
            actor_network,
            critic_network,
            entropy_bonus=entropy_bonus,
            samples_mc_entropy=samples_mc_entropy,
            entropy_coeff=pick_coeff("entropy_coeff", entropy_coeff, entropy_coef, 0.01),
            critic_coeff=pick_coeff("critic_coeff", critic_coeff, critic_coef, 1.0),
            loss_critic_type=loss_critic_type,
            separate_losses=separate_losses,
            reduction=reduction,
            clip_value=clip_value,
            gamma=gamma,
        )

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        td = td.copy()  # what the loss writes stays out of the caller's batch
        advantage = self._advantage(td)[..., 0]
        action = self._get(td, "action")
        dist = actor_distribution(self.actor_network, td)
        log_prob = dist.log_prob(action)
        if log_prob.shape != td.batch_size:
            raise ValueError(
                f"A2CLoss: the actor's log_prob has shape {list(log_prob.shape)}, expected the "
                f"batch shape {list(td.batch_size)} (use a distribution whose log_prob sums "
                "over the action dims, e.g. TanhNormal or Independent(Normal, 1))"
            )
        out = {"loss_objective": -(log_prob * advantage.detach())}
        self._add_entropy_and_critic(out, td, dist)
        return self._output(out)
