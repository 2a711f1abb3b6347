"""``DiscreteCQLLoss``: conservative Q-learning for discrete actions (Kumar et al., 2020).

A DQN regression plus a term that pushes down the soft maximum of the Q-values and up
the Q-value of the dataset's action::

    loss_qvalue = mean( 0.5 * d(Q(s, a), r + gamma * (1 - terminated) * max_a' Q_target(s', a')) )
    loss_cql    = mean( logsumexp_a' Q(s, a') - Q(s, a) )
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..tensordict import TensorDict, TensorDictBase
from .dqn import DQNLoss
from .utils import distance_loss, reduce_loss

__all__ = ["DiscreteCQLLoss"]


class DiscreteCQLLoss(DQNLoss):
    """TorchRL's ``DiscreteCQLLoss``.

    Args: ``value_network`` (writes ``"action_value"``: ``[*B, n_actions]``),
    ``loss_function`` (default ``"l2"``), ``delay_value`` (default ``True``: a target
    network), ``gamma`` (deprecated: use ``make_value_estimator``), ``action_space``
    (``"categorical"``, ``"one_hot"`` or a spec) and ``reduction``, as for
    :class:`~steersman.objectives.DQNLoss`.

    Returns ``loss_qvalue``, ``loss_cql`` and the diagnostics ``td_error`` and
    ``pred_value`` (means); writes the priority ``|Q(s, a) - target|^2`` into the batch at
    ``"td_error"`` (``[*B, 1]``).

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.tensordict.nn import TensorDictModule
        >>> q = TensorDictModule(torch.nn.Linear(4, 2), ["observation"], ["action_value"])
        >>> loss = DiscreteCQLLoss(q, action_space="categorical")
        >>> batch = TensorDict({"observation": torch.randn(8, 4), "action": torch.randint(2, (8,)),
        ...     "next": {"observation": torch.randn(8, 4), "reward": torch.randn(8, 1),
        ...              "done": torch.zeros(8, 1, dtype=torch.bool),
        ...              "terminated": torch.zeros(8, 1, dtype=torch.bool)}}, [8])
        >>> sorted(k for k in loss(batch).keys() if k.startswith("loss_"))
        ['loss_cql', 'loss_qvalue']
    """

    out_keys = ["loss_qvalue", "loss_cql"]

    def __init__(
        self,
        value_network: nn.Module,
        *,
        loss_function: str = "l2",
        delay_value: bool = True,
        gamma: float | None = None,
        action_space: Any = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(
            value_network, loss_function=loss_function, delay_value=delay_value, gamma=gamma,
            action_space=action_space, reduction=reduction,
        )

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = self._get(tensordict, "action")
        q = self._action_values(self.value_network, tensordict)             # [*B, n]
        pred = self._chosen(q, action)                                       # [*B]
        with torch.no_grad():
            next_value = self._next_value(tensordict.get("next"))            # [*B, 1]
            target = self.value_estimator.value_estimate(tensordict, next_value=next_value).squeeze(-1)
        loss_qvalue = reduce_loss(0.5 * distance_loss(pred, target, self.loss_function), self.reduction)
        loss_cql = reduce_loss(torch.logsumexp(q, -1) - pred, self.reduction)
        td_error = (pred - target).detach().pow(2)
        tensordict.set(self.tensor_keys.priority, td_error.unsqueeze(-1))
        return TensorDict(
            {"loss_qvalue": loss_qvalue, "loss_cql": loss_cql, "td_error": td_error.mean(), "pred_value": pred.detach().mean()},
            [],
        )
