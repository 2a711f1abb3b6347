"""``MAPPOLoss`` and ``IPPOLoss``: clipped PPO on agent groups (TorchRL's names).

Both are :class:`~steersman.objectives.ClipPPOLoss` on group keys: the batch ``[*B]``
(or ``[*B, T]``) holds per-agent entries ``(group, "observation")``,
``(group, "action")``, ``(group, "action_log_prob")`` ``[*B, n_agents]`` and values,
advantages and targets ``[*B, n_agents, 1]``. What they change:

* shapes: log-probabilities are ``[*batch, n_agents]`` and advantages
  ``[*batch, n_agents, 1]`` (the plain loss wants the batch shape);
* the default value estimator is :class:`~steersman.objectives.value.MultiAgentGAE`
  (team-level rewards/dones are broadcast along the agents);
* ``normalize_advantage=True`` with ``normalize_advantage_exclude_dims=(-2,)``: the
  advantage is standardized per agent, over the batch;
* ``value_norm``: an optional :class:`~steersman.modules.value_norm.ValueNorm`. Each
  training call folds the minibatch's value targets into it, then the critic loss is
  ``distance(normalize(V(s)), normalize(value_target))``: the critic keeps predicting
  real-scale values (GAE needs no change) while its loss stays on a fixed scale.

MAPPO's critic is centralised (e.g. ``MultiAgentMLP(centralized=True)`` over all agents'
observations, or a critic of the global ``"state"``), IPPO's reads each agent's own
observation: the classes differ only in the critic they are given; they exist so that a
script says which algorithm it runs.

Example:
    >>> import torch
    >>> from steersman.modules import ProbabilisticActor, ValueOperator
    >>> from steersman.modules.multiagent import MultiAgentMLP
    >>> from steersman.tensordict import TensorDict
    >>> from steersman.tensordict.nn import NormalParamExtractor, TanhNormal, TensorDictModule
    >>> n, obs, act = 3, 4, 2
    >>> actor_net = torch.nn.Sequential(MultiAgentMLP(obs, 2 * act, n, centralized=False, share_params=True,
    ...                                               depth=1, num_cells=16), NormalParamExtractor())
    >>> actor = ProbabilisticActor(TensorDictModule(actor_net, [("agents", "observation")],
    ...                                             [("agents", "loc"), ("agents", "scale")]),
    ...                            in_keys={"loc": ("agents", "loc"), "scale": ("agents", "scale")},
    ...                            out_keys=[("agents", "action")], distribution_class=TanhNormal,
    ...                            return_log_prob=True, log_prob_key=("agents", "action_log_prob"))
    >>> critic = ValueOperator(MultiAgentMLP(obs, 1, n, centralized=True, share_params=True, depth=1, num_cells=16),
    ...                        in_keys=[("agents", "observation")], out_keys=[("agents", "state_value")])
    >>> loss = MAPPOLoss(actor, critic)
    >>> _ = loss.set_keys(action=("agents", "action"), sample_log_prob=("agents", "action_log_prob"),
    ...                   value=("agents", "state_value"), advantage=("agents", "advantage"),
    ...                   value_target=("agents", "value_target"))
    >>> batch = TensorDict({"agents": TensorDict({
    ...     "observation": torch.randn(8, n, obs), "action": torch.rand(8, n, act) * 2 - 1,
    ...     "action_log_prob": torch.randn(8, n), "advantage": torch.randn(8, n, 1),
    ...     "value_target": torch.randn(8, n, 1)}, [8, n])}, [8])
    >>> out = loss(batch)
    >>> (out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]).backward()
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributions as D
from torch import Tensor, nn

from ...modules.value_norm import ValueNorm
from ...tensordict import TensorDictBase
from ..actor_critic import actor_distribution, clip_value_loss
from ..ppo import ClipPPOLoss
from ..utils import ValueEstimators, default_value_kwargs, distance_loss
from ..value.multiagent import MultiAgentGAE

__all__ = ["MAPPOLoss", "IPPOLoss"]


class MAPPOLoss(ClipPPOLoss):
    """Multi-agent PPO with a centralised critic (Yu et al., 2022).

    Args:
        actor_network: the per-agent policy (a probabilistic actor writing
            ``(group, "action")`` and its log-prob ``[*B, n_agents]``).
        critic_network: a module writing per-agent values ``[*B, n_agents, 1]`` from all
            agents' inputs (centralised).

    Keyword Args:
        value_norm: an optional :class:`~steersman.modules.value_norm.ValueNorm` for the
            critic loss (see the module docstring).
        normalize_advantage: standardize the advantage (default ``True``).
        normalize_advantage_exclude_dims: dims kept apart when standardizing (default
            ``(-2,)``: per agent).
        others: those of :class:`~steersman.objectives.ClipPPOLoss` (``clip_epsilon``,
            ``entropy_coeff``, ``critic_coeff``, ``loss_critic_type``...).

    Call :meth:`set_keys` with the group's keys (see the module example); the value
    estimator gets the shared names. Outputs: those of ``ClipPPOLoss``.
    """

    def __init__(
        self,
        actor_network: nn.Module,
        critic_network: nn.Module | None = None,
        *,
        value_norm: ValueNorm | None = None,
        normalize_advantage: bool = True,
        normalize_advantage_exclude_dims: tuple[int, ...] = (-2,),
        **common: Any,
    ) -> None:
        super().__init__(actor_network, critic_network, normalize_advantage=normalize_advantage,
                         normalize_advantage_exclude_dims=normalize_advantage_exclude_dims, **common)
        if value_norm is not None and not isinstance(value_norm, ValueNorm):
            raise TypeError(f"{type(self).__name__}: value_norm must be a ValueNorm, got {type(value_norm).__name__}")
        self.value_norm = value_norm

    def make_value_estimator(self, value_type: ValueEstimators | None = None, **hyperparams: Any) -> MAPPOLoss:
        """As the base class, but GAE (the default) is :class:`MultiAgentGAE`."""
        value_type = self.default_value_estimator if value_type is None else value_type
        if value_type is not ValueEstimators.GAE:
            return super().make_value_estimator(value_type, **hyperparams)
        kwargs = {**default_value_kwargs(value_type), **hyperparams}
        kwargs.setdefault("value_network", self._estimator_value_network())
        object.__setattr__(self, "_value_estimator", MultiAgentGAE(**kwargs))
        self._forward_keys_to_estimator()
        return self

    # ------------------------------------------------ shapes with an agent dim
    def _advantage(self, td: TensorDictBase) -> Tensor:
        advantage = td.get(self.tensor_keys.advantage, None)
        if advantage is None:
            with torch.no_grad():
                self.value_estimator(td)
            advantage = self._get(td, "advantage")
        if advantage.ndim < td.ndim + 1 or advantage.shape[: td.ndim] != td.batch_size or advantage.shape[-1] != 1:
            raise ValueError(
                f"{type(self).__name__}: {self.tensor_keys.advantage!r} has shape {list(advantage.shape)}, "
                f"expected {[*td.batch_size, 'n_agents', 1]} (batch dims, agents and a trailing 1)"
            )
        return advantage

    def _log_prob(self, td: TensorDictBase) -> tuple[Tensor, Tensor, D.Distribution]:
        action = self._get(td, "action")
        prev_log_prob = self._get(td, "sample_log_prob")
        if prev_log_prob.requires_grad:
            raise RuntimeError(
                f"{type(self).__name__}: {self.tensor_keys.sample_log_prob!r} requires grad; it must "
                "come from the collecting policy (detached)"
            )
        dist = actor_distribution(self.actor_network, td)
        log_prob = dist.log_prob(action)
        if log_prob.shape != prev_log_prob.shape or log_prob.shape[: td.ndim] != td.batch_size:
            raise ValueError(
                f"{type(self).__name__}: log-probabilities must be [*batch, n_agents] = "
                f"{[*td.batch_size, 'n_agents']}; got {list(log_prob.shape)} from the actor's distribution "
                f"and {list(prev_log_prob.shape)} for {self.tensor_keys.sample_log_prob!r}"
            )
        return log_prob, prev_log_prob, dist

    # ------------------------------------------------------------ value norm
    def _terms(self, td: TensorDictBase, diagnostics: bool, update_state: bool) -> TensorDictBase:
        if update_state and self.value_norm is not None and self.critic_coeff is not None:
            for name in ("action", "sample_log_prob"):  # a batch missing them fails before any state change
                self._get(td, name)
            if td.get(self.tensor_keys.value_target, None) is None:  # the estimator writes it (into a copy)
                td = td.copy()
                self._advantage(td)
            self.value_norm.update(self._get(td, "value_target"))
        return super()._terms(td, diagnostics, update_state)

    def _critic_terms(self, td: TensorDictBase) -> tuple[Tensor, Tensor | None, Tensor, Tensor]:
        if self.value_norm is None:
            return super()._critic_terms(td)
        target = self._get(td, "value_target")
        old_value = self._get(td, "value") if self.clip_value is not None else None
        value = self._critic_value(td)
        if value.shape != target.shape:
            raise ValueError(
                f"{type(self).__name__}: the critic wrote {self.tensor_keys.value!r} of shape "
                f"{list(value.shape)}, expected {list(target.shape)} like {self.tensor_keys.value_target!r}"
            )
        norm = self.value_norm.normalize
        loss = distance_loss(norm(target), norm(value), self.loss_critic_type)
        fraction = None
        if old_value is not None:
            scale = self.value_norm.scale()
            loss, fraction = clip_value_loss(norm(old_value), norm(value), self.clip_value / scale, norm(target),
                                             loss, self.loss_critic_type)
        return self.critic_coeff * loss, fraction, value, target


class IPPOLoss(MAPPOLoss):
    """Independent PPO (de Witt et al., 2020): :class:`MAPPOLoss` with a decentralised
    critic (each agent's value reads only its own observation, e.g.
    ``MultiAgentMLP(centralized=False)``). Same keywords and outputs."""
