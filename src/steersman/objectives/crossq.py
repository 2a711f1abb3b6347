"""``CrossQLoss``: soft actor-critic without target networks (Bhatt et al., ICLR 2024).

CrossQ drops SAC's target critics; instead the critics (typically with batch
normalization) are evaluated on the current and the next state-action pairs in *one*
forward pass over the concatenated batch, so that normalization statistics are shared
by both; the next-state values of that pass, detached, give the target::

    a' ~ pi(.|s')                                              (no gradient)
    [Q_i(s, a), Q_i(s', a')] = Q_i(cat([s, s'], [a, a']))        one call per critic
    y = r + gamma * (1 - terminated) * (min_i Q_i(s', a') - alpha * log pi(a'|s'))   detached
    loss_qvalue = sum_i d(Q_i(s, a), y)

The actor and temperature terms are SAC's (see :mod:`~steersman.objectives.sac`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..tensordict import TensorDictBase, cat
from .common import NestedKey
from .sac import SACLoss, _call_critics, _sample
from .utils import distance_loss

__all__ = ["CrossQLoss"]


class CrossQLoss(SACLoss):
    """TorchRL's ``CrossQLoss``.

    Args: ``actor_network``, ``qvalue_network`` and the keywords of
    :class:`~steersman.objectives.SACLoss` that apply (``num_qvalue_nets``,
    ``loss_function``, ``alpha_init``, ``min_alpha``, ``max_alpha``, ``action_spec``,
    ``fixed_alpha``, ``target_entropy``, ``reduction``, ``priority_key``,
    ``scalar_output_mode``; ``separate_losses`` and
    ``deactivate_vmap`` accepted and ignored). No target networks: there is nothing for
    ``SoftUpdate`` to move (it refuses the loss); ``target_qvalue_network_params`` is the
    online parameters, detached.

    Returns ``loss_actor``, ``loss_qvalue``, ``loss_alpha``, ``alpha`` and ``entropy``.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.tensordict.nn import (NormalParamExtractor, ProbabilisticTensorDictModule,
        ...     ProbabilisticTensorDictSequential, TanhNormal, TensorDictModule)
        >>> actor = ProbabilisticTensorDictSequential(
        ...     TensorDictModule(nn.Sequential(nn.Linear(3, 4), NormalParamExtractor()), ["observation"], ["loc", "scale"]),
        ...     ProbabilisticTensorDictModule(["loc", "scale"], ["action"], TanhNormal))
        >>> class Q(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.net = nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1))
        ...     def forward(self, observation, action):
        ...         return self.net(torch.cat([observation, action], -1))
        >>> qvalue = TensorDictModule(Q(), ["observation", "action"], ["state_action_value"])
        >>> loss = CrossQLoss(actor, qvalue, target_entropy=-2.0)
        >>> batch = TensorDict({"observation": torch.randn(8, 3), "action": torch.rand(8, 2) * 2 - 1,
        ...     "next": {"observation": torch.randn(8, 3), "reward": torch.randn(8, 1),
        ...              "done": torch.zeros(8, 1, dtype=torch.bool),
        ...              "terminated": torch.zeros(8, 1, dtype=torch.bool)}}, [8])
        >>> sorted(loss(batch).keys())
        ['alpha', 'entropy', 'loss_actor', 'loss_alpha', 'loss_qvalue']
        >>> loss.target_names
        []
    """

    def __init__(
        self,
        actor_network: nn.Module,
        qvalue_network: nn.Module,
        *,
        num_qvalue_nets: int = 2,
        loss_function: str = "smooth_l1",
        alpha_init: float = 1.0,
        min_alpha: float | None = None,
        max_alpha: float | None = None,
        action_spec: Any = None,
        fixed_alpha: bool = False,
        target_entropy: str | float = "auto",
        separate_losses: bool = False,
        reduction: str = "mean",
        deactivate_vmap: bool = False,
        priority_key: NestedKey | None = None,
        scalar_output_mode: str | None = None,
    ) -> None:
        super().__init__(
            actor_network, qvalue_network, num_qvalue_nets=num_qvalue_nets, loss_function=loss_function,
            alpha_init=alpha_init, min_alpha=min_alpha, max_alpha=max_alpha, action_spec=action_spec,
            fixed_alpha=fixed_alpha, target_entropy=target_entropy, delay_actor=False, delay_qvalue=False,
            separate_losses=separate_losses, reduction=reduction, deactivate_vmap=deactivate_vmap,
            priority_key=priority_key, scalar_output_mode=scalar_output_mode,
        )

    def _qvalue_loss(self, td: TensorDictBase, action: Tensor, alpha: Tensor) -> tuple[Tensor, Tensor]:
        next_td = td.get("next")
        with torch.no_grad():
            next_action, next_log_prob = _sample(self, self.actor_network, next_td)
        keys = [k for k in self.qvalue_network.in_keys if k != self.tensor_keys.action]
        both = cat([td.select(*keys), next_td.select(*keys)], 0)
        q_both = _call_critics(self, both, torch.cat([action, next_action], 0), self.qvalue_network_params)
        n = td.batch_size[0]
        q, next_q = q_both[:, :n], q_both[:, n:]                                      # [N, *batch, 1]
        with torch.no_grad():
            next_value = next_q.min(0).values - alpha * next_log_prob.unsqueeze(-1)
            self._get_next(td, "reward")  # shape-checked: [*batch, 1] like next_value
            target = self.value_estimator.value_estimate(td, next_value=next_value).squeeze(-1)
        q = q.squeeze(-1)
        loss = distance_loss(q, target.expand_as(q), self.loss_function).sum(0)
        return loss, (q - target).abs().max(0).values.detach()
