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

from ..tensordict import TensorDictBase
from .actor_critic import ActorCriticLoss, actor_distribution

__all__ = ["A2CLoss"]


class A2CLoss(ActorCriticLoss):
    """Advantage actor-critic loss (TorchRL's ``A2CLoss``).

    Args: ``actor_network``, ``critic_network`` and the keywords of
    :class:`~steersman.objectives.actor_critic.ActorCriticLoss` (``entropy_coeff``,
    ``critic_coeff``, ``loss_critic_type``, ``gamma``, ``separate_losses``, ``reduction``,
    ``clip_value``, ``functional``...); A2C adds none.

    Outputs: ``loss_objective``, ``loss_entropy``, ``loss_critic`` and ``entropy``.
    """

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
