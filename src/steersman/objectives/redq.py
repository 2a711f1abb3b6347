"""Randomized ensembled double Q-learning (Chen et al. 2021, "Randomized Ensembled Double
Q-Learning: Learning Fast Without a Model"): SAC with a large critic ensemble.

With ``N`` critics ``Q_i`` and targets ``Q'_i``, each call draws a random subset ``M`` of
``sub_sample_len`` target critics:

* critic: ``a' ~ pi(.|s')``, ``y = r + gamma * (1 - terminated) * (min_{i in M} Q'_i(s', a')
  - alpha * log pi(a'|s'))``, ``loss_qvalue = mean_i dist(Q_i(s, a), y)``;
* actor: ``loss_actor = mean_i (alpha * log pi(a~|s) - Q_i(s, a~))`` over *all* critics
  (their parameters detached);
* temperature: ``loss_alpha = -log_alpha * (log pi + target_entropy)`` over the actions
  sampled at ``s`` and at ``s'`` (log-probabilities detached).

The update-to-data ratio (several critic steps per environment step) belongs to the
training loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..tensordict import TensorDictBase
from .common import LossModule, NestedKey, torchrl_compat
from .sac import (
    SACLoss,
    _actor_and_critics,
    _alpha,
    _auto_target_entropy,
    _call_critics,
    _clamp_log_alpha,
    _output,
    _register_alpha,
    _sample,
    _scalar_output_mode,
)
from .utils import Q_TARGET_ESTIMATORS, ValueEstimators, distance_loss

__all__ = ["REDQLoss"]


class REDQLoss(LossModule):
    """The REDQ loss: ``N`` vmapped critics, a random subset of ``sub_sample_len`` targets.

    Args:
        actor_network: a stochastic policy with ``get_dist(td)`` (``rsample`` and a
            ``log_prob`` of shape ``[*batch]``, e.g. ``TanhNormal``).
        qvalue_network: ``Q(s, a)`` writing ``state_action_value`` ``[*batch, 1]``; copied
            ``num_qvalue_nets`` times (independently initialised) into the ensemble.

    Keyword Args:
        num_qvalue_nets: ``N`` (default 10).
        sub_sample_len: ``M``, the target subset size (default 2; at most ``N - 1``).
        loss_function, alpha_init, action_spec, fixed_alpha, target_entropy, delay_qvalue,
        separate_losses, reduction, deactivate_vmap, priority_key, scalar_output_mode, gamma:
            as for :class:`~steersman.objectives.SACLoss`.
        gSDE: the actor explores with generalized state-dependent noise: when a batch has
            no ``"_eps_gSDE"`` entry, the actor is given zeros ``[*batch]`` there (TorchRL's
            signal to a gSDE module to draw fresh noise) instead of failing on the missing key.
        min_alpha, max_alpha: bounds of alpha (default 0.1 and 10, as in TorchRL).

    Returns ``loss_actor``, ``loss_qvalue``, ``loss_alpha``, and the detached ``alpha``,
    ``entropy``, ``state_action_value_actor`` ``[N, *batch]``, ``action_log_prob_actor``,
    ``next.state_value`` and ``target_value`` (``[*batch]``); writes ``td_error`` into the batch.

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
        >>> loss = REDQLoss(actor, qvalue, num_qvalue_nets=5, sub_sample_len=2, target_entropy=-2.0)
        >>> batch = TensorDict({  # 8 transitions, action dim 2
        ...     "observation": torch.randn(8, 3), "action": torch.rand(8, 2) * 2 - 1,
        ...     "next": {"observation": torch.randn(8, 3), "reward": torch.randn(8, 1),
        ...              "done": torch.zeros(8, 1, dtype=torch.bool),
        ...              "terminated": torch.zeros(8, 1, dtype=torch.bool)}}, [8])
        >>> out = loss(batch)
        >>> out["state_action_value_actor"].shape  # [N, batch]
        torch.Size([5, 8])
    """

    @dataclass
    class _AcceptedKeys(SACLoss._AcceptedKeys):
        """SAC's batch keys, plus TorchRL REDQ's name for the log-probability."""

        sample_log_prob: NestedKey = "action_log_prob"

    default_value_estimator = ValueEstimators.TD0
    supported_value_estimators = Q_TARGET_ESTIMATORS
    networks = ("actor_network", "qvalue_network")

    def __init__(
        self,
        actor_network: nn.Module,
        qvalue_network: nn.Module,
        *,
        num_qvalue_nets: int = 10,
        sub_sample_len: int = 2,
        loss_function: str = "smooth_l1",
        alpha_init: float = 1.0,
        min_alpha: float | None = 0.1,
        max_alpha: float | None = 10.0,
        action_spec: Any = None,
        fixed_alpha: bool = False,
        target_entropy: str | float = "auto",
        delay_qvalue: bool = True,
        separate_losses: bool = False,
        reduction: str = "mean",
        deactivate_vmap: bool = False,
        gSDE: bool = False,
        gamma: float | None = None,
        priority_key: NestedKey | None = None,
        scalar_output_mode: str | None = None,
    ) -> None:
        super().__init__()
        torchrl_compat(self, separate_losses=separate_losses, deactivate_vmap=deactivate_vmap)
        _scalar_output_mode(self, scalar_output_mode)
        self._prioritized_options(False, priority_key)
        self.gSDE = bool(gSDE)
        if num_qvalue_nets < 2:
            raise ValueError(f"REDQLoss: num_qvalue_nets must be >= 2, got {num_qvalue_nets}")
        _actor_and_critics(self, actor_network, qvalue_network, num_qvalue_nets, delay_qvalue, loss_function, reduction)
        self.sub_sample_len = max(1, min(int(sub_sample_len), self.num_qvalue_nets - 1))
        entropy = _auto_target_entropy(self, target_entropy, action_spec, actor_network)
        _register_alpha(self, alpha_init, min_alpha, max_alpha, fixed_alpha, entropy)
        if gamma is not None:
            self._deprecated_gamma(gamma)

    def _actor_input(self, td: TensorDictBase) -> TensorDictBase:
        """With ``gSDE``: the actor's inputs plus a zero ``"_eps_gSDE"`` ``[*batch]`` when the
        batch has none (TorchRL's signal to a gSDE module to draw fresh noise)."""
        if not self.gSDE or td.get("_eps_gSDE", None) is not None:
            return td
        keys = [k for k in self.actor_network.in_keys if k != "_eps_gSDE"]
        out = td.select(*keys)
        out.set("_eps_gSDE", torch.zeros(td.batch_size, device=td.device))
        return out

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        """The loss terms of one batch ``[*batch]`` (see the module docstring)."""
        action = self._get(td, "action")
        _clamp_log_alpha(self)
        alpha = _alpha(self)

        # actor: all N critics (detached) on a reparametrized action
        new_action, log_prob = _sample(self, self.actor_network, self._actor_input(td))
        q_actor = _call_critics(self, td, new_action, self.qvalue_network_params.detach()).squeeze(-1)
        loss_actor = (alpha * log_prob - q_actor).mean(0)

        # critics: target from a random subset of the target critics
        with torch.no_grad():
            next_td = td.get("next")
            next_action, next_log_prob = _sample(self, self.actor_network, self._actor_input(next_td))
            subset = torch.randperm(self.num_qvalue_nets, device=log_prob.device)[: self.sub_sample_len]
            params = self.target_qvalue_network_params if self.delay_qvalue else self.qvalue_network_params
            next_q = _call_critics(self, next_td, next_action, params[subset]).min(0).values
            next_value = next_q - alpha * next_log_prob.unsqueeze(-1)  # [*batch, 1]
            self._get_next(td, "reward")  # shape-checked: [*batch, 1] like next_value
            target = self.value_estimator.value_estimate(td, next_value=next_value).squeeze(-1)
        q = _call_critics(self, td, action, self.qvalue_network_params).squeeze(-1)  # [N, *batch]
        loss_qvalue = distance_loss(q, target.expand_as(q), self.loss_function).mean(0)

        both_log_probs = torch.stack([log_prob.detach(), next_log_prob])
        loss_alpha = (-self.log_alpha * (both_log_probs + self.target_entropy)).mean(0)
        td.set(self.tensor_keys.priority, (q - target).pow(2).max(0).values.detach())
        losses = {"loss_actor": loss_actor, "loss_qvalue": loss_qvalue, "loss_alpha": loss_alpha}
        diagnostics = {
            "alpha": alpha,
            "entropy": -both_log_probs.mean(),
            "state_action_value_actor": q_actor,
            "action_log_prob_actor": log_prob,
            "next.state_value": next_value.squeeze(-1),
            "target_value": target,
        }
        return _output(self, td, losses, diagnostics)

    def _estimator_value_network(self) -> None:
        return None  # the loss computes the next value itself and passes next_value=
