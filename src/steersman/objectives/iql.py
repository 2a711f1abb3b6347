"""Implicit Q-learning (Kostrikov et al. 2021, "Offline Reinforcement Learning with Implicit
Q-Learning"): offline RL that never queries actions outside the dataset.

With ``N`` critics ``Q_i``, their frozen targets ``Q'_i``, a state-value network ``V`` and
the dataset's ``(s, a, r, s')``:

* value (expectile regression): ``u = min_i Q'_i(s, a) - V(s)``,
  ``loss_value = |expectile - 1(u < 0)| * u^2``: ``V`` tracks an upper expectile of ``Q``;
* critic: ``y = r + gamma * (1 - terminated) * V(s')`` (``V`` not trained by this term),
  ``loss_qvalue = sum_i dist(Q_i(s, a), y)``;
* actor (advantage-weighted regression):
  ``loss_actor = -exp(temperature * (min_i Q'_i(s, a) - V(s))).clamp(max=100) * log pi(a|s)``
  with the weight detached.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..tensordict import TensorDictBase
from ..tensordict.nn import ExplorationType, set_exploration_type
from .common import LossModule, NestedKey, torchrl_compat
from .sac import (
    SACLoss,
    _actor_and_critics,
    _call,
    _call_critics,
    _output,
    _scalar_output_mode,
)
from .utils import Q_TARGET_ESTIMATORS, ValueEstimators, distance_loss

__all__ = ["IQLLoss"]

_MAX_WEIGHT = 100.0  # the clamp of the advantage weights (as in the paper's code)


class IQLLoss(LossModule):
    """The IQL loss: expectile value regression, TD critics, advantage-weighted actor.

    Args:
        actor_network: a policy with ``get_dist(td)`` whose ``log_prob(action)`` has shape
            ``[*batch]`` (e.g. ``TanhNormal``).
        qvalue_network: ``Q(s, a)`` writing ``state_action_value`` ``[*batch, 1]``; copied
            ``num_qvalue_nets`` times into a vmapped ensemble with target copies (see
            :class:`~steersman.objectives.SACLoss`).
        value_network: ``V(s)`` writing ``state_value`` ``[*batch, 1]``.

    Keyword Args:
        num_qvalue_nets: number of critics (default 2).
        loss_function: the critic's distance, ``"smooth_l1"`` (default), ``"l2"`` or ``"l1"``.
        temperature: the inverse temperature ``beta`` of the actor's weights (small: close
            to behaviour cloning; large: greedier).
        expectile: ``tau`` in ``(0, 1)``; 0.5 is a mean regression, larger values approach
            the max of ``Q`` over the dataset's actions.
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.
        separate_losses, deactivate_vmap: accepted for TorchRL compatibility and ignored
            (see :data:`~steersman.objectives.common.TORCHRL_COMPAT_IGNORED`).
        scalar_output_mode: with ``reduction="none"``, ``None``/``"exclude"`` leave the scalar
            diagnostics out of the per-sample output, ``"non_tensor"`` keeps ``alpha`` and
            ``entropy`` as non-tensor entries.
        gamma: deprecated (warns); the same as ``loss.make_value_estimator(gamma=...)``.
        priority_key: deprecated (warns); the same as ``loss.set_keys(priority=...)``.

    Returns ``loss_actor``, ``loss_qvalue``, ``loss_value`` and ``entropy`` (the mean of
    ``-log pi(a|s)`` over the dataset's actions); writes ``td_error`` into the batch.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from steersman.modules import MLP  # lazy input size: set by the first call
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.tensordict.nn import (NormalParamExtractor, ProbabilisticTensorDictModule,
        ...     ProbabilisticTensorDictSequential, TanhNormal, TensorDictModule)
        >>> actor = ProbabilisticTensorDictSequential(
        ...     TensorDictModule(nn.Sequential(nn.Linear(3, 4), NormalParamExtractor()),
        ...                      ["observation"], ["loc", "scale"]),
        ...     ProbabilisticTensorDictModule(["loc", "scale"], ["action"], TanhNormal))
        >>> qvalue = TensorDictModule(MLP(out_features=1, num_cells=[8]), ["observation", "action"], ["state_action_value"])
        >>> value = TensorDictModule(nn.Linear(3, 1), ["observation"], ["state_value"])
        >>> loss = IQLLoss(actor, qvalue, value, expectile=0.7, temperature=3.0)
        >>> batch = TensorDict({  # 8 dataset transitions, action dim 2
        ...     "observation": torch.randn(8, 3), "action": torch.rand(8, 2) * 2 - 1,
        ...     "next": {"observation": torch.randn(8, 3), "reward": torch.randn(8, 1),
        ...              "done": torch.zeros(8, 1, dtype=torch.bool),
        ...              "terminated": torch.zeros(8, 1, dtype=torch.bool)}}, [8])
        >>> sorted(loss(batch).keys())
        ['entropy', 'loss_actor', 'loss_qvalue', 'loss_value']
    """

    @dataclass
    class _AcceptedKeys(SACLoss._AcceptedKeys):
        """SAC's batch keys (``log_prob`` is not read: IQL scores the dataset's actions)."""

        log_prob: NestedKey = "_log_prob"

    default_value_estimator = ValueEstimators.TD0
    supported_value_estimators = Q_TARGET_ESTIMATORS
    networks = ("actor_network", "qvalue_network", "value_network")

    def __init__(
        self,
        actor_network: nn.Module,
        qvalue_network: nn.Module,
        value_network: nn.Module,
        *,
        num_qvalue_nets: int = 2,
        loss_function: str = "smooth_l1",
        temperature: float = 1.0,
        expectile: float = 0.5,
        separate_losses: bool = False,
        reduction: str = "mean",
        deactivate_vmap: bool = False,
        gamma: float | None = None,
        priority_key: NestedKey | None = None,
        scalar_output_mode: str | None = None,
    ) -> None:
        super().__init__()
        torchrl_compat(self, separate_losses=separate_losses, deactivate_vmap=deactivate_vmap)
        _scalar_output_mode(self, scalar_output_mode)
        self._prioritized_options(False, priority_key)
        if not 0.0 < expectile < 1.0:
            raise ValueError(f"IQLLoss: expectile must be in (0, 1), got {expectile}")
        if value_network is None:
            raise ValueError("IQLLoss needs a value_network (V(s) writing 'state_value')")
        _actor_and_critics(self, actor_network, qvalue_network, num_qvalue_nets, True, loss_function, reduction)
        self.value_network = value_network
        self.temperature = float(temperature)
        self.expectile = float(expectile)
        if gamma is not None:
            self._deprecated_gamma(gamma)

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        """The loss terms of one batch ``[*batch]`` (see the module docstring)."""
        action = self._get(td, "action")
        with torch.no_grad():
            target_q = self._critics(td, action, self.target_qvalue_network_params)
            target_q = target_q.min(0).values.squeeze(-1)  # [*batch]
        value = _call(self.value_network, td, self.tensor_keys.value).squeeze(-1)

        # actor: advantage-weighted log-likelihood of the dataset's actions
        with set_exploration_type(ExplorationType.RANDOM):
            dist = self.actor_network.get_dist(td.select(*self.actor_network.in_keys))
        log_prob = dist.log_prob(action)
        if log_prob.shape != td.batch_size:
            raise ValueError(
                f"IQLLoss: the actor's log_prob has shape {list(log_prob.shape)}, expected the batch "
                f"shape {list(td.batch_size)}: use a distribution that sums over the action dims"
            )
        weight = torch.exp(self.temperature * (target_q - value.detach())).clamp(max=_MAX_WEIGHT)
        loss_actor = -weight * log_prob

        # value: expectile regression towards the target critics
        diff = target_q - value
        loss_value = torch.where(diff > 0, self.expectile, 1.0 - self.expectile) * diff.pow(2)

        # critics: one-step TD towards V(s')
        with torch.no_grad():
            next_value = _call(self.value_network, td.get("next"), self.tensor_keys.value)
            self._get_next(td, "reward")  # shape-checked: [*batch, 1] like next_value
            target = self.value_estimator.value_estimate(td, next_value=next_value).squeeze(-1)
        q = self._critics(td, action, self.qvalue_network_params).squeeze(-1)  # [N, *batch]
        loss_qvalue = distance_loss(q, target.expand_as(q), self.loss_function).sum(0)

        td.set(self.tensor_keys.priority, (q - target).pow(2).max(0).values.detach())
        losses = {"loss_actor": loss_actor, "loss_qvalue": loss_qvalue, "loss_value": loss_value}
        return _output(self, td, losses, {"entropy": -log_prob.mean()})

    def _critics(self, td: TensorDictBase, action: torch.Tensor, params: TensorDictBase) -> torch.Tensor:
        """Every critic's ``Q_i(s, a)`` for the dataset's action: ``[N, *batch, 1]``."""
        return _call_critics(self, td, action, params)

    def _estimator_value_network(self) -> None:
        return None  # the loss computes V(s') itself and passes next_value=
