"""Truncated quantile critics (Kuznetsov et al. 2020, "Controlling Overestimation Bias with
Truncated Mixture of Continuous Distributional Quantile Critics").

Each of the ``N`` critics predicts ``M`` quantiles ``theta_i^m(s, a)`` of the return at the
fractions ``tau_m = (2m + 1) / (2M)``. With ``alpha = exp(log_alpha)``:

* target: ``a' ~ pi(.|s')``; the ``N * M`` atoms of the *target* critics at ``(s', a')`` are
  pooled and sorted, the top ``k = top_quantiles_to_drop_per_net * N`` are dropped, and each
  kept atom ``z_j`` gives ``y_j = r + gamma * (1 - terminated) * (z_j - alpha * log pi(a'|s'))``
  (``N * M - k`` targets per sample);
* critics: the quantile Huber loss of every predicted quantile against every target,
  ``rho_tau(u) = |tau - 1{u < 0}| * huber(u)`` with ``u = y_j - theta_i^m``, averaged over
  ``m`` and ``j`` and summed over the critics;
* actor: ``loss_actor = alpha * log pi(a~|s) - mean_{i, m} theta_i^m(s, a~)`` (the whole
  mixture, critics' parameters detached; only the targets are truncated);
* temperature: as in :class:`~steersman.objectives.SACLoss`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..tensordict import TensorDictBase, ensemble_call
from .common import LossModule, NestedKey, torchrl_compat
from .sac import (
    SACLoss,
    _actor_and_critics,
    _alpha,
    _auto_target_entropy,
    _clamp_log_alpha,
    _output,
    _register_alpha,
    _sac_options,
    _sample,
)
from .utils import ValueEstimators

__all__ = ["TQCLoss", "quantile_huber_loss"]


def quantile_huber_loss(quantiles: Tensor, target: Tensor) -> Tensor:
    """The quantile Huber loss (QR-DQN, kappa = 1) of ``quantiles [..., M]`` at the fractions
    ``(2m + 1) / (2M)`` against the samples ``target [..., J]``, averaged over ``M`` and ``J``:
    ``[...]``.

    Example:
        >>> quantile_huber_loss(torch.zeros(4, 5), torch.zeros(4, 7))  # 5 quantiles, 7 samples
        tensor([0., 0., 0., 0.])
        >>> quantile_huber_loss(torch.zeros(1, 1), torch.ones(1, 1))  # tau = 0.5, huber(1) = 0.5
        tensor([0.2500])
    """
    m = quantiles.shape[-1]
    tau = (torch.arange(m, device=quantiles.device, dtype=quantiles.dtype) + 0.5) / m
    u = target.unsqueeze(-2) - quantiles.unsqueeze(-1)  # [..., M, J]
    huber = torch.where(u.abs() <= 1.0, 0.5 * u.pow(2), u.abs() - 0.5)
    weight = (tau.unsqueeze(-1) - (u.detach() < 0).to(u.dtype)).abs()
    return (weight * huber).mean((-1, -2))


class TQCLoss(LossModule):
    """The TQC loss: ``N`` vmapped quantile critics, targets without their top atoms.

    Args:
        actor_network: a stochastic policy with ``get_dist(td)`` (``rsample`` and a
            ``log_prob`` of shape ``[*batch]``, e.g. ``TanhNormal``).
        qvalue_network: ``Z(s, a)`` writing ``state_action_value`` ``[*batch, M]`` (``M``
            quantiles); copied ``num_qvalue_nets`` times (independently initialised).

    Keyword Args:
        num_qvalue_nets: ``N`` (default 5).
        top_quantiles_to_drop_per_net: atoms dropped from the pooled target per critic
            (default 2; ``N`` times this must be below ``N * M``).
        alpha_init, min_alpha, max_alpha, action_spec, fixed_alpha, target_entropy,
        delay_qvalue, separate_losses, reduction, deactivate_vmap, skip_done_states,
        use_prioritized_weights, scalar_output_mode: as for :class:`~steersman.objectives.SACLoss`.

    Only the TD(0) target exists (as in TorchRL). Returns ``loss_actor``, ``loss_qvalue``,
    ``loss_alpha`` and the detached ``alpha`` and ``entropy``; writes ``td_error``
    ``[*batch]`` (the largest mean absolute quantile error over the critics) into the batch.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from steersman.modules import MLP
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.tensordict.nn import (NormalParamExtractor, ProbabilisticTensorDictModule,
        ...     ProbabilisticTensorDictSequential, TanhNormal, TensorDictModule)
        >>> actor = ProbabilisticTensorDictSequential(
        ...     TensorDictModule(nn.Sequential(nn.Linear(3, 4), NormalParamExtractor()),
        ...                      ["observation"], ["loc", "scale"]),
        ...     ProbabilisticTensorDictModule(["loc", "scale"], ["action"], TanhNormal))
        >>> critic = TensorDictModule(MLP(out_features=25, num_cells=[8]),  # 25 quantiles
        ...                           ["observation", "action"], ["state_action_value"])
        >>> loss = TQCLoss(actor, critic, num_qvalue_nets=3, target_entropy=-2.0)
        >>> loss.make_value_estimator(gamma=0.99)  # doctest: +ELLIPSIS
        TQCLoss(...)
        >>> batch = TensorDict({  # 8 transitions, action dim 2
        ...     "observation": torch.randn(8, 3), "action": torch.rand(8, 2) * 2 - 1,
        ...     "next": {"observation": torch.randn(8, 3), "reward": torch.randn(8, 1),
        ...              "done": torch.zeros(8, 1, dtype=torch.bool),
        ...              "terminated": torch.zeros(8, 1, dtype=torch.bool)}}, [8])
        >>> out = loss(batch)
        >>> sorted(out.keys())
        ['alpha', 'entropy', 'loss_actor', 'loss_alpha', 'loss_qvalue']
        >>> batch["td_error"].shape
        torch.Size([8])
    """

    @dataclass
    class _AcceptedKeys(SACLoss._AcceptedKeys):
        """SAC's batch keys; ``state_action_value`` holds the ``M`` quantiles."""

        priority: NestedKey = "td_error"

    default_value_estimator = ValueEstimators.TD0
    supported_value_estimators = (ValueEstimators.TD0,)
    networks = ("actor_network", "qvalue_network")

    def __init__(
        self,
        actor_network: nn.Module,
        qvalue_network: nn.Module,
        *,
        num_qvalue_nets: int = 5,
        top_quantiles_to_drop_per_net: int = 2,
        alpha_init: float = 1.0,
        min_alpha: float | None = None,
        max_alpha: float | None = None,
        action_spec: Any = None,
        fixed_alpha: bool = False,
        target_entropy: str | float = "auto",
        delay_qvalue: bool = True,
        separate_losses: bool = False,
        reduction: str | None = None,
        deactivate_vmap: bool = False,
        skip_done_states: bool = False,
        use_prioritized_weights: str | bool = "auto",
        scalar_output_mode: str | None = None,
    ) -> None:
        super().__init__()
        torchrl_compat(self, separate_losses=separate_losses, deactivate_vmap=deactivate_vmap)
        if int(top_quantiles_to_drop_per_net) < 0:
            raise ValueError(
                f"TQCLoss: top_quantiles_to_drop_per_net must be >= 0, got {top_quantiles_to_drop_per_net}"
            )
        _actor_and_critics(self, actor_network, qvalue_network, num_qvalue_nets, delay_qvalue, "smooth_l1",
                           reduction or "mean")
        self.top_quantiles_to_drop_per_net = int(top_quantiles_to_drop_per_net)
        _sac_options(self, skip_done_states, use_prioritized_weights, scalar_output_mode, None, None)
        entropy = _auto_target_entropy(self, target_entropy, action_spec, actor_network)
        _register_alpha(self, alpha_init, min_alpha, max_alpha, fixed_alpha, entropy)

    def _quantiles(self, td: TensorDictBase, action: Tensor, params: TensorDictBase) -> Tensor:
        """Every critic's quantiles at ``(td's observations, action)``: ``[N, *batch, M]``."""
        keys = self.tensor_keys
        inputs = td.select(*(k for k in self.qvalue_network.in_keys if k != keys.action))
        inputs.set(keys.action, action)
        z = ensemble_call(self.qvalue_network, params, inputs, randomness=self.vmap_randomness).get(keys.state_action_value)
        if z.dim() != td.batch_dims + 2:
            raise ValueError(
                f"TQCLoss: the critic's {keys.state_action_value!r} has shape {list(z.shape[1:])}, expected "
                f"{list(td.batch_size)} + [num_quantiles] (one quantile dim after the batch dims)"
            )
        return z

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        """The loss terms of one batch ``[*batch]`` (see the module docstring)."""
        action = self._get(td, "action")
        _clamp_log_alpha(self)
        alpha = _alpha(self)

        with torch.no_grad():
            next_td = td.get("next")
            next_action, next_log_prob = _sample(self, self.actor_network, next_td)
            params = self.target_qvalue_network_params if self.delay_qvalue else self.qvalue_network_params
            atoms = self._quantiles(next_td, next_action, params).movedim(0, -2).flatten(-2)  # [*batch, N*M]
            keep = atoms.shape[-1] - self.top_quantiles_to_drop_per_net * self.num_qvalue_nets
            if keep < 1:
                raise ValueError(
                    f"TQCLoss: top_quantiles_to_drop_per_net={self.top_quantiles_to_drop_per_net} drops every "
                    f"atom of {self.num_qvalue_nets} critics with {atoms.shape[-1] // self.num_qvalue_nets} "
                    "quantiles each; it must be below the number of quantiles"
                )
            kept = atoms.sort(-1).values[..., :keep]
            next_value = kept - alpha * next_log_prob.unsqueeze(-1)  # [*batch, keep]
            reward = self._get_next(td, "reward")  # [*batch, 1], checked
            gamma = self.value_estimator.gamma
            not_terminal = 1.0 - self._get_next(td, "terminated").to(reward.dtype)
            target = reward + gamma * not_terminal * next_value  # TD(0) on every kept atom

        z = self._quantiles(td, action, self.qvalue_network_params)  # [N, *batch, M]
        loss_qvalue = quantile_huber_loss(z, target.expand(z.shape[0], *target.shape)).sum(0)

        new_action, log_prob = _sample(self, self.actor_network, td)
        z_actor = self._quantiles(td, new_action, self.qvalue_network_params.detach())
        loss_actor = alpha * log_prob - z_actor.mean(-1).mean(0)
        loss_alpha = -self.log_alpha * (log_prob.detach() + self.target_entropy)

        with torch.no_grad():
            error = (target.unsqueeze(0).unsqueeze(-2) - z.unsqueeze(-1)).abs().mean((-1, -2))
            td.set(self.tensor_keys.priority, error.max(0).values)
        losses = {"loss_actor": loss_actor, "loss_qvalue": loss_qvalue, "loss_alpha": loss_alpha}
        return _output(self, td, losses, {"alpha": alpha, "entropy": -log_prob.detach().mean()})

    def _estimator_value_network(self) -> None:
        return None  # the target is computed per atom here; the estimator gives gamma
