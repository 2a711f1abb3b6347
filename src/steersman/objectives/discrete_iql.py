"""``DiscreteIQLLoss``: implicit Q-learning with discrete actions.

The terms of :class:`~steersman.objectives.IQLLoss`, with critics that output one value
per action (``state_action_value``: ``[*B, n_actions]``); ``Q_i(s, a)`` is the entry of the
dataset's action (an index, or a one-hot vector). The actor is a categorical policy.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..tensordict import TensorDictBase, ensemble_call
from .common import NestedKey
from .iql import IQLLoss
from .sac import _find_action_space

__all__ = ["DiscreteIQLLoss"]


class DiscreteIQLLoss(IQLLoss):
    """TorchRL's ``DiscreteIQLLoss``.

    Args: those of :class:`~steersman.objectives.IQLLoss` plus ``action_space``
    (``"one-hot"``, ``"categorical"`` or a ``OneHot``/``Categorical`` spec; ``None``
    assumes one-hot, with a warning) and ``gamma`` (deprecated, as in TorchRL: use
    ``loss.make_value_estimator(gamma=...)``). ``qvalue_network`` writes ``"state_action_value"``
    with one entry per action.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.tensordict.nn import (OneHotCategorical, ProbabilisticTensorDictModule,
        ...     ProbabilisticTensorDictSequential, TensorDictModule)
        >>> actor = ProbabilisticTensorDictSequential(
        ...     TensorDictModule(torch.nn.Linear(3, 4), ["observation"], ["logits"]),
        ...     ProbabilisticTensorDictModule(["logits"], ["action"], OneHotCategorical))
        >>> q = TensorDictModule(torch.nn.Linear(3, 4), ["observation"], ["state_action_value"])
        >>> v = TensorDictModule(torch.nn.Linear(3, 1), ["observation"], ["state_value"])
        >>> loss = DiscreteIQLLoss(actor, q, v, action_space="one-hot")
        >>> batch = TensorDict({"observation": torch.randn(8, 3), "action": torch.eye(4)[torch.randint(4, (8,))],
        ...     "next": {"observation": torch.randn(8, 3), "reward": torch.randn(8, 1),
        ...              "done": torch.zeros(8, 1, dtype=torch.bool),
        ...              "terminated": torch.zeros(8, 1, dtype=torch.bool)}}, [8])
        >>> sorted(k for k in loss(batch).keys() if k.startswith("loss_"))
        ['loss_actor', 'loss_qvalue', 'loss_value']
    """

    def __init__(
        self,
        actor_network: nn.Module,
        qvalue_network: nn.Module,
        value_network: nn.Module,
        *,
        action_space: Any = None,
        num_qvalue_nets: int = 2,
        loss_function: str = "smooth_l1",
        temperature: float = 1.0,
        expectile: float = 0.5,
        gamma: float | None = None,
        separate_losses: bool = False,
        reduction: str = "mean",
        priority_key: NestedKey | None = None,
        scalar_output_mode: str | None = None,
    ) -> None:
        super().__init__(
            actor_network, qvalue_network, value_network, num_qvalue_nets=num_qvalue_nets,
            loss_function=loss_function, temperature=temperature, expectile=expectile,
            separate_losses=separate_losses, reduction=reduction, priority_key=priority_key,
            scalar_output_mode=scalar_output_mode,
        )
        self.action_space, self.n_actions = _find_action_space(action_space)
        if gamma is not None:
            self._deprecated_gamma(gamma)

    def _critics(self, td: TensorDictBase, action: torch.Tensor, params: TensorDictBase) -> torch.Tensor:
        """Every critic's value of the dataset's action: ``[N, *batch, 1]``."""
        inputs = td.select(*self.qvalue_network.in_keys)
        q_all = ensemble_call(self.qvalue_network, params, inputs, randomness=self.vmap_randomness).get(self.tensor_keys.state_action_value)
        if q_all.shape[1:-1] != td.batch_size:
            raise ValueError(
                f"DiscreteIQLLoss: the critic's {self.tensor_keys.state_action_value!r} has shape "
                f"{list(q_all.shape[1:])}, expected {list(td.batch_size)} + [n_actions]"
            )
        if self.action_space == "one-hot":
            if action.shape != q_all.shape[1:]:
                raise ValueError(
                    f"DiscreteIQLLoss: a one-hot {self.tensor_keys.action!r} must have shape "
                    f"{list(q_all.shape[1:])}, got {list(action.shape)}"
                )
            return (q_all * action.to(q_all.dtype)).sum(-1, keepdim=True)
        index = action.long().reshape(*td.batch_size, 1).expand(q_all.shape[0], *td.batch_size, 1)
        return q_all.gather(-1, index)
