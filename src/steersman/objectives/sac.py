"""Soft actor-critic: ``SACLoss`` (continuous actions) and ``DiscreteSACLoss``.

The math of SAC v2 (Haarnoja et al. 2018, "Soft Actor-Critic Algorithms and Applications"),
with ``N`` critics ``Q_i``, their frozen targets ``Q'_i`` and ``alpha = exp(log_alpha)``:

* critic: ``a' ~ pi(.|s')``, ``V'(s') = min_i Q'_i(s', a') - alpha * log pi(a'|s')``,
  ``y = r + gamma * (1 - terminated) * V'(s')`` (the value estimator; truncated steps
  bootstrap), ``loss_qvalue = sum_i dist(Q_i(s, a), y)``;
* actor: ``a~ ~ pi(.|s)`` reparametrized, ``loss_actor = alpha * log pi(a~|s) - min_i Q_i(s, a~)``
  with the critics' parameters detached (the actor term never trains the critics);
* temperature: ``loss_alpha = -log_alpha * (log pi(a~|s) + target_entropy)`` with the
  log-probability detached: when the entropy ``-log pi`` is below the target, the gradient
  on ``log_alpha`` is negative and gradient descent raises alpha.

The ``N`` critics are one vmapped ensemble: the stacked parameters of ``N`` independently
initialised copies of ``qvalue_network`` (the first keeps its current weights) live in
``loss.qvalue_network_params`` (a :class:`~steersman.tensordict.TensorDictParams`, batch
``[N]``) and are called in one :func:`~steersman.tensordict.ensemble_call`. The module
given as ``qvalue_network`` is only a template afterwards: optimize ``loss.parameters()``.

The building blocks at the end of this file (critic ensemble, temperature, ``"next"``
entries) are shared with :mod:`~steersman.objectives.iql`, :mod:`~steersman.objectives.cql`
and :mod:`~steersman.objectives.redq`.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributions as D
from torch import Tensor, nn

from ..data import Categorical as CategoricalSpec
from ..data import OneHot as OneHotSpec
from ..tensordict import TensorDict, TensorDictBase, ensemble_call
from ..tensordict.nn import ExplorationType, set_exploration_type
from .actor_critic import shared_parameter_names
from .common import (
    LossModule,
    NestedKey,
    _norm_key,
    check_options,
    register_critics,
    torchrl_compat,
)
from .utils import Q_TARGET_ESTIMATORS, ValueEstimators, distance_loss, reduce_loss

__all__ = ["SACLoss", "DiscreteSACLoss"]


class SACLoss(LossModule):
    """The soft actor-critic loss (continuous actions), v2 by default and v1 with a value network.

    Args:
        actor_network: a stochastic policy with ``get_dist(td)`` (e.g. a
            ``ProbabilisticTensorDictSequential`` ending in a ``TanhNormal``) whose
            distribution has ``rsample`` and a ``log_prob`` of shape ``[*batch]``.
        qvalue_network: ``Q(s, a)``: reads the observation keys and ``action``, writes
            ``state_action_value`` ``[*batch, 1]``. Copied ``num_qvalue_nets`` times.
        value_network: ``V(s)`` writing ``state_value`` ``[*batch, 1]``: gives SAC v1, whose
            critic target is ``r + gamma * (1 - terminated) * V'(s')`` and whose ``loss_value``
            regresses ``V(s)`` on ``min_i Q'_i(s, a~) - alpha * log pi(a~|s)`` (``a~`` from the
            target actor with ``delay_actor``). Every critic is trained on the whole batch, as
            in the paper (TorchRL splits the batch between critics). ``None``: v2.

    Keyword Args:
        num_qvalue_nets: the number of critics (default 2).
        loss_function: ``"smooth_l1"`` (default), ``"l2"`` or ``"l1"`` for the critic(s).
        alpha_init: the initial temperature.
        min_alpha, max_alpha: bounds of alpha (``log_alpha`` is clamped into them, in
            place, at the start of each call).
        action_spec: the (unbatched) action spec, for ``target_entropy="auto"``; defaults
            to ``actor_network.spec``.
        fixed_alpha: keep alpha at ``alpha_init`` (``log_alpha`` becomes a buffer).
        target_entropy: a number, or ``"auto"``: ``-prod(action_spec.shape)``.
        delay_actor: a target actor (v1's value target samples from it).
        delay_qvalue: target critics for the critic target (default ``True``).
        delay_value: a target value network for v1's critic target (default ``True``).
        separate_losses, deactivate_vmap: accepted for TorchRL compatibility and ignored
            (see :data:`~steersman.objectives.common.TORCHRL_COMPAT_IGNORED`).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"`` (per-sample losses in a
            TensorDict with the batch's shape; no ``alpha``/``entropy`` entries).
        use_prioritized_weights: ``"auto"``/``True`` (default ``"auto"``): when the batch has
            ``priority_weight`` (a prioritized buffer's importance weights, ``[*batch]``),
            every term is weighted by it (``"mean"``: ``sum(w * l) / sum(w)``); ``False``: never.
        scalar_output_mode: with ``reduction="none"``, ``None``/``"exclude"`` leave ``alpha``
            and ``entropy`` out; ``"non_tensor"`` adds them as non-tensor entries.
        skip_done_states: TorchRL's option to run the actor only on non-terminal next
            states; their value is multiplied by zero either way, so the loss is the same
            (accepted, no effect).
        priority_key, gamma: TorchRL's deprecated keywords (warn): ``set_keys(priority=...)``
            and ``make_value_estimator(gamma=...)``.
        given_noise_key: steersman's own option (not TorchRL's): a key, read in the batch
            for actions at ``s`` and under ``"next"`` for actions at ``s'``, of standard
            normal draws shaped like the action; the reparametrized actions are then
            ``squash(loc + scale * eps)`` from them instead of fresh ``randn`` draws (a seed
            population's own random streams). Needs a (Tanh)Normal-family actor.

    Reads ``observation`` keys, ``action``, ``("next", <obs keys>)``, ``("next", "reward")``,
    ``("next", "done")`` and ``("next", "terminated")`` (``[*batch, 1]``); writes
    ``td_error`` (``[*batch]``, for prioritized replay) into the batch. Returns
    ``loss_actor``, ``loss_qvalue``, ``loss_alpha`` (``loss_value`` in v1) and the
    detached diagnostics ``alpha`` and ``entropy`` (mean of ``-log pi``).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from steersman.modules import MLP  # lazy input size: set by the first call
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.tensordict.nn import (NormalParamExtractor, ProbabilisticTensorDictModule,
        ...     ProbabilisticTensorDictSequential, TanhNormal, TensorDictModule)
        >>> _ = torch.manual_seed(0)
        >>> actor = ProbabilisticTensorDictSequential(
        ...     TensorDictModule(nn.Sequential(nn.Linear(3, 4), NormalParamExtractor()),
        ...                      ["observation"], ["loc", "scale"]),
        ...     ProbabilisticTensorDictModule(["loc", "scale"], ["action"], TanhNormal))
        >>> qvalue = TensorDictModule(MLP(out_features=1, num_cells=[8]), ["observation", "action"], ["state_action_value"])
        >>> loss = SACLoss(actor, qvalue, target_entropy=-2.0)
        >>> batch = TensorDict({  # a batch of 8 transitions, action dim 2
        ...     "observation": torch.randn(8, 3), "action": torch.rand(8, 2) * 2 - 1,
        ...     "next": {"observation": torch.randn(8, 3), "reward": torch.randn(8, 1),
        ...              "done": torch.zeros(8, 1, dtype=torch.bool),
        ...              "terminated": torch.zeros(8, 1, dtype=torch.bool)}}, [8])
        >>> out = loss(batch)
        >>> sorted(out.keys())
        ['alpha', 'entropy', 'loss_actor', 'loss_alpha', 'loss_qvalue']
        >>> loss.qvalue_network_params.batch_size  # the stacked critics
        torch.Size([2])
        >>> (out["loss_actor"] + out["loss_qvalue"] + out["loss_alpha"]).backward()
    """

    @dataclass
    class _AcceptedKeys:
        """Batch keys (TorchRL names); reward/done/terminated are read under ``"next"``."""

        action: NestedKey = "action"
        value: NestedKey = "state_value"
        state_action_value: NestedKey = "state_action_value"
        log_prob: NestedKey = "action_log_prob"
        priority: NestedKey = "td_error"
        priority_weight: NestedKey = "priority_weight"
        reward: NestedKey = "reward"
        done: NestedKey = "done"
        terminated: NestedKey = "terminated"

    default_value_estimator = ValueEstimators.TD0
    supported_value_estimators = Q_TARGET_ESTIMATORS
    networks = ("actor_network", "qvalue_network", "value_network")

    def __init__(
        self,
        actor_network: nn.Module,
        qvalue_network: nn.Module,
        value_network: nn.Module | None = None,
        *,
        num_qvalue_nets: int = 2,
        loss_function: str = "smooth_l1",
        alpha_init: float = 1.0,
        min_alpha: float | None = None,
        max_alpha: float | None = None,
        action_spec: Any = None,
        fixed_alpha: bool = False,
        target_entropy: str | float = "auto",
        delay_actor: bool = False,
        delay_qvalue: bool = True,
        delay_value: bool = True,
        separate_losses: bool = False,
        reduction: str = "mean",
        deactivate_vmap: bool = False,
        skip_done_states: bool = False,
        use_prioritized_weights: str | bool = "auto",
        scalar_output_mode: str | None = None,
        priority_key: NestedKey | None = None,
        gamma: float | None = None,
        given_noise_key: NestedKey | None = None,
    ) -> None:
        super().__init__()
        torchrl_compat(self, separate_losses=separate_losses, deactivate_vmap=deactivate_vmap)
        self.given_noise_key = None if given_noise_key is None else _norm_key(given_noise_key)
        _actor_and_critics(self, actor_network, qvalue_network, num_qvalue_nets, delay_qvalue, loss_function, reduction)
        _sac_options(self, skip_done_states, use_prioritized_weights, scalar_output_mode, priority_key, gamma)
        if delay_actor:
            self.make_target("actor_network")
        self._version = 1 if value_network is not None else 2
        if value_network is not None:
            self.value_network = value_network
            if delay_value:
                self.make_target("value_network")
        self.delay_actor, self.delay_value = delay_actor, delay_value
        entropy = _auto_target_entropy(self, target_entropy, action_spec, actor_network)
        _register_alpha(self, alpha_init, min_alpha, max_alpha, fixed_alpha, entropy)

    # ------------------------------------------------------------------ forward
    def forward(self, td: TensorDictBase) -> TensorDictBase:
        """The loss terms of one batch ``[*batch]`` (see the class docstring)."""
        action = self._get(td, "action")  # a missing action is reported before any work
        _clamp_log_alpha(self)
        alpha = _alpha(self)
        loss_qvalue, td_error = self._qvalue_loss(td, action, alpha)
        losses = {"loss_qvalue": loss_qvalue}
        if self._version == 1:
            losses["loss_value"] = self._value_loss(td, alpha)
        loss_actor, log_prob = self._actor_loss(td, alpha)
        losses["loss_actor"] = loss_actor
        losses["loss_alpha"] = -self.log_alpha * (log_prob + self.target_entropy)
        td.set(self.tensor_keys.priority, td_error)
        return _output(self, td, losses, {"alpha": alpha, "entropy": -log_prob.mean()})

    def _qvalue_loss(self, td: TensorDictBase, action: Tensor, alpha: Tensor) -> tuple[Tensor, Tensor]:
        with torch.no_grad():
            if self._version == 2:
                next_value = self._soft_next_value(td, alpha)
            else:
                value_net = self.target_value_network if self.delay_value else self.value_network
                next_value = _call(value_net, td.get("next"), self.tensor_keys.value)
            self._get_next(td, "reward")  # shape-checked: [*batch, 1] like next_value
            target = self.value_estimator.value_estimate(td, next_value=next_value).squeeze(-1)
        q = _call_critics(self, td, action, self.qvalue_network_params).squeeze(-1)  # [N, *batch]
        loss = distance_loss(q, target.expand_as(q), self.loss_function).sum(0)
        return loss, (q - target).abs().max(0).values.detach()

    def _soft_next_value(self, td: TensorDictBase, alpha: Tensor) -> Tensor:
        """``min_i Q'_i(s', a') - alpha * log pi(a'|s')`` with ``a' ~ pi(.|s')``: ``[*batch, 1]``."""
        next_td = td.get("next")
        next_action, next_log_prob = _sample(self, self.actor_network, next_td)
        params = self.target_qvalue_network_params if self.delay_qvalue else self.qvalue_network_params
        next_q = _call_critics(self, next_td, next_action, params).min(0).values
        return next_q - alpha * next_log_prob.unsqueeze(-1)

    def _value_loss(self, td: TensorDictBase, alpha: Tensor) -> Tensor:
        """v1: ``V(s)`` regressed on ``min_i Q'_i(s, a~) - alpha * log pi(a~|s)``."""
        value = _call(self.value_network, td, self.tensor_keys.value).squeeze(-1)
        with torch.no_grad():
            actor = self.target_actor_network if self.delay_actor else self.actor_network
            action, log_prob = _sample(self, actor, td)
            params = self.target_qvalue_network_params if self.delay_qvalue else self.qvalue_network_params
            q = _call_critics(self, td, action, params).min(0).values.squeeze(-1)
            target = q - alpha * log_prob
        return distance_loss(value, target, self.loss_function)

    def _actor_loss(self, td: TensorDictBase, alpha: Tensor) -> tuple[Tensor, Tensor]:
        action, log_prob = _sample(self, self.actor_network, td)
        q = _call_critics(self, td, action, self.qvalue_network_params.detach())
        loss = alpha * log_prob - q.min(0).values.squeeze(-1)
        return loss, log_prob.detach()

    # -------------------------------------------------------- value estimator
    def _estimator_value_network(self) -> None:
        return None  # the loss computes the next value itself and passes next_value=


class DiscreteSACLoss(LossModule):
    """Soft actor-critic for discrete actions (Christodoulou 2019): expectations over actions.

    With ``p = pi(.|s)`` a categorical over ``A`` actions and critics ``Q_i(s) in R^A``:
    ``V'(s') = sum_a p'(a) * (min_i Q'_i(s', a) - alpha * log p'(a))`` (no sampling),
    ``loss_qvalue = sum_i dist(Q_i(s, a_data), r + gamma * (1 - terminated) * V'(s'))``,
    ``loss_actor = sum_a p(a) * (alpha * log p(a) - min_i Q_i(s, a))`` (critics detached),
    ``loss_alpha = -log_alpha * (target_entropy - H(p))`` with ``H(p)`` detached.

    Args:
        actor_network: a policy with ``get_dist(td)`` returning a categorical distribution
            with ``probs``/``logits`` ``[*batch, A]`` (``OneHotCategorical``, ``Categorical``,
            ``MaskedCategorical``: masked actions have probability 0 and contribute 0).
        qvalue_network: writes ``action_value`` ``[*batch, A]`` from the observation keys.

    Keyword Args:
        action_space: ``"one-hot"`` or ``"categorical"``, or a ``OneHot``/``Categorical``
            spec: how ``action`` is stored in the batch (one-hot ``[*batch, A]`` or indices
            ``[*batch]``/``[*batch, 1]``). ``None``: one-hot, with a warning.
        num_actions: ``A``, for ``target_entropy="auto"`` (read from a spec if given).
        num_qvalue_nets, loss_function, alpha_init, min_alpha, max_alpha, fixed_alpha,
        delay_qvalue, separate_losses, reduction, deactivate_vmap: as for :class:`SACLoss`.
        target_entropy_weight: ``"auto"`` target is ``target_entropy_weight * log(A)``.
        target_entropy: a number or ``"auto"``.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.tensordict.nn import (OneHotCategorical, ProbabilisticTensorDictModule,
        ...     ProbabilisticTensorDictSequential, TensorDictModule)
        >>> actor = ProbabilisticTensorDictSequential(
        ...     TensorDictModule(nn.Linear(3, 4), ["observation"], ["logits"]),
        ...     ProbabilisticTensorDictModule(["logits"], ["action"], OneHotCategorical))
        >>> qvalue = TensorDictModule(nn.Linear(3, 4), ["observation"], ["action_value"])
        >>> loss = DiscreteSACLoss(actor, qvalue, action_space="one-hot", num_actions=4)
        >>> batch = TensorDict({  # 8 transitions, 4 actions stored one-hot
        ...     "observation": torch.randn(8, 3),
        ...     "action": nn.functional.one_hot(torch.randint(4, (8,)), 4),
        ...     "next": {"observation": torch.randn(8, 3), "reward": torch.randn(8, 1),
        ...              "done": torch.zeros(8, 1, dtype=torch.bool),
        ...              "terminated": torch.zeros(8, 1, dtype=torch.bool)}}, [8])
        >>> out = loss(batch)
        >>> sorted(out.keys())
        ['alpha', 'entropy', 'loss_actor', 'loss_alpha', 'loss_qvalue']
    """

    @dataclass
    class _AcceptedKeys:
        """Batch keys (TorchRL names); reward/done/terminated are read under ``"next"``."""

        action: NestedKey = "action"
        value: NestedKey = "state_value"
        action_value: NestedKey = "action_value"
        log_prob: NestedKey = "log_prob"
        priority: NestedKey = "td_error"
        priority_weight: NestedKey = "priority_weight"
        reward: NestedKey = "reward"
        done: NestedKey = "done"
        terminated: NestedKey = "terminated"

    default_value_estimator = ValueEstimators.TD0
    supported_value_estimators = Q_TARGET_ESTIMATORS
    networks = ("actor_network", "qvalue_network")

    def __init__(
        self,
        actor_network: nn.Module,
        qvalue_network: nn.Module,
        *,
        action_space: str | Any = None,
        num_actions: int | None = None,
        num_qvalue_nets: int = 2,
        loss_function: str = "smooth_l1",
        alpha_init: float = 1.0,
        min_alpha: float | None = None,
        max_alpha: float | None = None,
        fixed_alpha: bool = False,
        target_entropy_weight: float = 0.98,
        target_entropy: str | float = "auto",
        delay_qvalue: bool = True,
        separate_losses: bool = False,
        reduction: str = "mean",
        deactivate_vmap: bool = False,
        skip_done_states: bool = False,
        use_prioritized_weights: str | bool = "auto",
        scalar_output_mode: str | None = None,
        priority_key: NestedKey | None = None,
    ) -> None:
        super().__init__()
        torchrl_compat(self, separate_losses=separate_losses, deactivate_vmap=deactivate_vmap)
        _actor_and_critics(self, actor_network, qvalue_network, num_qvalue_nets, delay_qvalue, loss_function, reduction)
        _sac_options(self, skip_done_states, use_prioritized_weights, scalar_output_mode, priority_key, None)
        self.action_space, spec_n = _find_action_space(action_space)
        num_actions = num_actions if num_actions is not None else spec_n
        if target_entropy == "auto":
            if num_actions is None:
                raise ValueError(
                    "DiscreteSACLoss: target_entropy='auto' needs num_actions (or an action_space "
                    "spec with n); pass num_actions=A or a numeric target_entropy"
                )
            target_entropy = float(target_entropy_weight) * math.log(num_actions)
        _register_alpha(self, alpha_init, min_alpha, max_alpha, fixed_alpha, float(target_entropy))

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        """The loss terms of one batch ``[*batch]`` (see the class docstring)."""
        action = self._get(td, "action")
        _clamp_log_alpha(self)
        alpha = _alpha(self)
        loss_qvalue, td_error = self._qvalue_loss(td, action, alpha)
        loss_actor, neg_entropy = self._actor_loss(td, alpha)
        losses = {
            "loss_actor": loss_actor,
            "loss_qvalue": loss_qvalue,
            "loss_alpha": -self.log_alpha * (neg_entropy + self.target_entropy),
        }
        td.set(self.tensor_keys.priority, td_error)
        return _output(self, td, losses, {"alpha": alpha, "entropy": -neg_entropy.mean()})

    def _probs(self, td: TensorDictBase) -> tuple[Tensor, Tensor]:
        """``p`` and ``log p`` ``[*batch, A]``; ``log p`` is 0 where ``p`` is 0 (masked actions)."""
        with set_exploration_type(ExplorationType.RANDOM):
            dist = self.actor_network.get_dist(td.select(*self.actor_network.in_keys))
        probs = dist.probs
        return probs, torch.where(probs > 0, dist.logits, torch.zeros_like(probs))

    def _action_values(self, td: TensorDictBase, params: TensorDictBase) -> Tensor:
        inputs = td.select(*self.qvalue_network.in_keys)
        return ensemble_call(self.qvalue_network, params, inputs, randomness=self.vmap_randomness).get(self.tensor_keys.action_value)

    def _qvalue_loss(self, td: TensorDictBase, action: Tensor, alpha: Tensor) -> tuple[Tensor, Tensor]:
        with torch.no_grad():
            next_td = td.get("next")
            next_p, next_log_p = self._probs(next_td)
            params = self.target_qvalue_network_params if self.delay_qvalue else self.qvalue_network_params
            next_q = self._action_values(next_td, params).min(0).values
            next_value = (next_p * (next_q - alpha * next_log_p)).sum(-1, keepdim=True)
            self._get_next(td, "reward")  # shape-checked: [*batch, 1] like next_value
            target = self.value_estimator.value_estimate(td, next_value=next_value).squeeze(-1)
        q_all = self._action_values(td, self.qvalue_network_params)  # [N, *batch, A]
        q = self._chosen(q_all, action)  # [N, *batch]
        loss = distance_loss(q, target.expand_as(q), self.loss_function).sum(0)
        return loss, (q - target).abs().max(0).values.detach()

    def _chosen(self, q_all: Tensor, action: Tensor) -> Tensor:
        if self.action_space == "one-hot":
            if action.shape != q_all.shape[1:]:
                raise ValueError(
                    f"DiscreteSACLoss: one-hot action {self.tensor_keys.action!r} has shape "
                    f"{list(action.shape)}, expected {list(q_all.shape[1:])} (batch + num_actions)"
                )
            return (q_all * action.to(q_all.dtype)).sum(-1)
        index = action if action.shape == q_all.shape[1:-1] else action.squeeze(-1)
        if index.shape != q_all.shape[1:-1]:
            raise ValueError(
                f"DiscreteSACLoss: categorical action {self.tensor_keys.action!r} has shape "
                f"{list(action.shape)}, expected {list(q_all.shape[1:-1])} or with a trailing 1"
            )
        index = index.long().unsqueeze(-1).expand(q_all.shape[0], *index.shape, 1)
        return q_all.gather(-1, index).squeeze(-1)

    def _actor_loss(self, td: TensorDictBase, alpha: Tensor) -> tuple[Tensor, Tensor]:
        p, log_p = self._probs(td)
        q = self._action_values(td, self.qvalue_network_params.detach()).min(0).values
        loss = (p * (alpha * log_p - q)).sum(-1)
        return loss, (p * log_p).sum(-1).detach()

    def _estimator_value_network(self) -> None:
        return None


# ============================================================ shared building blocks
def _call_critics(loss: LossModule, td: TensorDictBase, action: Tensor, params: TensorDictBase) -> Tensor:
    """Every critic on ``(td's observations, action)``: ``[N, *batch, 1]`` (one vmapped call)."""
    keys = loss.tensor_keys
    inputs = td.select(*(k for k in loss.qvalue_network.in_keys if k != keys.action))
    inputs.set(keys.action, action)
    q = ensemble_call(loss.qvalue_network, params, inputs, randomness=loss.vmap_randomness).get(keys.state_action_value)
    if q.shape[-1:] != (1,):
        raise ValueError(
            f"{type(loss).__name__}: the critic's {keys.state_action_value!r} has shape "
            f"{list(q.shape[1:])}, expected {list(td.batch_size)} + [1] (one value per state-action pair)"
        )
    return q


def _call(module: nn.Module, td: TensorDictBase, out_key: NestedKey) -> Tensor:
    """``module``'s output ``out_key`` on a fresh selection of its inputs (``td`` unchanged)."""
    return module(td.select(*module.in_keys)).get(out_key)


def rsample_from_noise(dist: D.Distribution, eps: Tensor) -> Tensor:
    """The reparametrized sample of ``dist`` at the standard normal draws ``eps``:
    ``loc + scale * eps`` through the distribution's transforms (TanhNormal's squash,
    ``Independent``, ``TransformedDistribution``), for the Normal family.

    Example:
        >>> from steersman.tensordict.nn import TanhNormal
        >>> d = TanhNormal(torch.zeros(2), torch.ones(2))
        >>> rsample_from_noise(d, torch.tensor([0.0, 100.0])).round(decimals=3)
        tensor([0., 1.])
    """
    if hasattr(dist, "_squash") and hasattr(dist, "loc") and hasattr(dist, "scale"):
        return dist._squash(dist.loc + dist.scale * eps)
    if isinstance(dist, D.Independent):
        return rsample_from_noise(dist.base_dist, eps)
    if isinstance(dist, D.Normal):
        return dist.loc + dist.scale * eps
    if isinstance(dist, D.TransformedDistribution):
        x = rsample_from_noise(dist.base_dist, eps)
        for t in dist.transforms:
            x = t(x)
        return x
    raise TypeError(f"given noise drives Normal-family distributions (Normal, Independent, TanhNormal, "
                    f"TransformedDistribution of those), got {type(dist).__name__}")


def _sample(loss: LossModule, actor: nn.Module, td: TensorDictBase) -> tuple[Tensor, Tensor]:
    """A reparametrized action ``[*batch, *action]`` and its log-probability ``[*batch]``."""
    # an explicit interaction type: get_dist then sets none of its own (keeps it compilable)
    with set_exploration_type(ExplorationType.RANDOM):
        dist = actor.get_dist(td.select(*actor.in_keys))
    key = getattr(loss, "given_noise_key", None)
    if key is None:
        action = dist.rsample()
    else:
        eps = td.get(key, None)
        if eps is None:
            raise KeyError(f"{type(loss).__name__}: given_noise_key={key!r} is not in the batch (nor under "
                           "'next' for the next actions); it holds standard normal draws shaped like the action")
        action = rsample_from_noise(dist, eps)
    log_prob = dist.log_prob(action)
    if log_prob.shape != td.batch_size:
        raise ValueError(
            f"{type(loss).__name__}: the actor's log_prob has shape {list(log_prob.shape)}, expected the "
            f"batch shape {list(td.batch_size)}: use a distribution that sums over the action dims "
            "(TanhNormal, or torch.distributions.Independent)"
        )
    return action, log_prob


def _actor_and_critics(loss: LossModule, actor_network: nn.Module, qvalue_network: nn.Module, num_qvalue_nets: int,
                       delay_qvalue: bool, loss_function: str, reduction: str) -> None:
    """What every soft actor-critic loss (SAC, DiscreteSAC, IQL, CQL, REDQ) sets up first:
    its option checks, the actor and the vmapped critic ensemble (see :func:`register_critics`)."""
    check_options(loss, loss_function=loss_function, reduction=reduction, num_qvalue_nets=num_qvalue_nets)
    shared = shared_parameter_names(qvalue_network, actor_network)
    if shared:  # TorchRL keeps them shared with the actor; the stacked ensemble here copies them
        warnings.warn(
            f"{type(loss).__name__}: qvalue_network shares {shared[:3]} with actor_network; the critic "
            "ensemble holds its own copies of them, so the actor and the critics no longer share them",
            stacklevel=3,
        )
    loss.actor_network = actor_network
    loss.num_qvalue_nets = int(num_qvalue_nets)
    loss.delay_qvalue = delay_qvalue
    register_critics(loss, qvalue_network, loss.num_qvalue_nets, delay_qvalue)
    loss.loss_function = loss_function
    loss.reduction = reduction


def _register_alpha(loss: LossModule, alpha_init: float, min_alpha: float | None,
                    max_alpha: float | None, fixed_alpha: bool, target_entropy: float) -> None:
    """``log_alpha`` (a parameter, or a buffer with ``fixed_alpha``), ``alpha_init``, the
    bounds of ``log_alpha`` (python floats or None: ``min_log_alpha``/``max_log_alpha``) and
    the ``target_entropy`` buffer."""
    name = type(loss).__name__
    if not alpha_init > 0:
        raise ValueError(f"{name}: alpha_init must be > 0, got {alpha_init}")
    for bound, value in (("min_alpha", min_alpha), ("max_alpha", max_alpha)):
        if value is not None and not value > 0:
            raise ValueError(f"{name}: {bound} must be > 0 or None, got {value}")
    if min_alpha is not None and max_alpha is not None and not min_alpha <= max_alpha:
        raise ValueError(f"{name}: min_alpha ({min_alpha}) must be <= max_alpha ({max_alpha})")
    loss.register_buffer("alpha_init", torch.tensor(float(alpha_init)))
    log_alpha = torch.tensor(math.log(alpha_init))
    if fixed_alpha:
        loss.register_buffer("log_alpha", log_alpha)
    else:
        loss.log_alpha = nn.Parameter(log_alpha)
    loss.fixed_alpha = fixed_alpha
    loss.min_log_alpha = math.log(min_alpha) if min_alpha is not None else None
    loss.max_log_alpha = math.log(max_alpha) if max_alpha is not None else None
    loss.register_buffer("target_entropy", torch.tensor(float(target_entropy)))


def _clamp_log_alpha(loss: LossModule) -> None:
    """Keeps ``log_alpha`` inside its bounds (in place, no gradient; only when bounded)."""
    if loss.min_log_alpha is not None or loss.max_log_alpha is not None:
        with torch.no_grad():
            loss.log_alpha.clamp_(loss.min_log_alpha, loss.max_log_alpha)


def _alpha(loss: LossModule) -> Tensor:
    """The current temperature, detached: what the actor and critic terms use."""
    return loss.log_alpha.detach().exp()


def _auto_target_entropy(loss: LossModule, target_entropy: str | float, action_spec: Any,
                         actor: nn.Module) -> float:
    if target_entropy != "auto":
        return float(target_entropy)
    spec = action_spec if action_spec is not None else getattr(actor, "spec", None)
    if spec is not None and hasattr(spec, "get") and hasattr(spec, "keys"):  # a Composite
        spec = spec.get(loss.tensor_keys.action, None)
    if spec is None:
        raise ValueError(
            f"{type(loss).__name__}: target_entropy='auto' needs the action's shape: pass "
            "action_spec=<the unbatched action spec>, an actor with a .spec, or a numeric "
            "target_entropy (e.g. -action_dim)"
        )
    return -float(math.prod(spec.shape))


def _find_action_space(action_space: Any) -> tuple[str, int | None]:
    """``("one-hot" | "categorical", n or None)`` from a string or a spec (``None``: one-hot,
    with a warning, as in TorchRL)."""
    if action_space is None:
        warnings.warn(
            "DiscreteSACLoss: action_space was not given; assuming 'one-hot' actions. Pass "
            "action_space='one-hot' | 'categorical' (or the action spec) to silence this.",
            stacklevel=3,
        )
        return "one-hot", None
    if isinstance(action_space, OneHotSpec):
        return "one-hot", action_space.n
    if isinstance(action_space, CategoricalSpec):
        return "categorical", action_space.n
    names = {"one-hot": "one-hot", "one_hot": "one-hot", "onehot": "one-hot", "categorical": "categorical"}
    if isinstance(action_space, str) and action_space.lower() in names:
        return names[action_space.lower()], None
    raise ValueError(
        f"action_space must be 'one-hot', 'categorical', a OneHot or a Categorical spec, got {action_space!r}"
    )


def _scalar_output_mode(loss: LossModule, scalar_output_mode: str | None) -> None:
    """TorchRL's ``scalar_output_mode``: with ``reduction="none"``, ``None``/``"exclude"``
    leave the scalar diagnostics (``alpha``, ``entropy``) out of the per-sample output,
    ``"non_tensor"`` keeps them as non-tensor entries."""
    if scalar_output_mode not in (None, "exclude", "non_tensor"):
        raise ValueError(f"{type(loss).__name__}: scalar_output_mode must be None, 'exclude' or 'non_tensor', "
                         f"got {scalar_output_mode!r}")
    loss.scalar_output_mode = scalar_output_mode


def _sac_options(loss: LossModule, skip_done_states: bool, use_prioritized_weights: str | bool,
                 scalar_output_mode: str | None, priority_key: NestedKey | None, gamma: float | None) -> None:
    """TorchRL's SAC-family keywords (see :class:`SACLoss`), checked and stored."""
    name = type(loss).__name__
    if use_prioritized_weights not in ("auto", True, False):
        raise ValueError(f"{name}: use_prioritized_weights must be 'auto', True or False, got {use_prioritized_weights!r}")
    _scalar_output_mode(loss, scalar_output_mode)
    loss.skip_done_states = skip_done_states
    loss.use_prioritized_weights = use_prioritized_weights
    if priority_key is not None:
        warnings.warn(f"{name}(priority_key=...) is deprecated; use loss.set_keys(priority=...)",
                      DeprecationWarning, stacklevel=3)
        loss.set_keys(priority=priority_key)
    if gamma is not None:
        warnings.warn(f"{name}(gamma=...) is deprecated; use loss.make_value_estimator(gamma=...)",
                      DeprecationWarning, stacklevel=3)
        loss.make_value_estimator(gamma=gamma)


def _output(loss: LossModule, td: TensorDictBase, losses: dict[str, Tensor],
            diagnostics: dict[str, Tensor]) -> TensorDictBase:
    """The loss TensorDict: reduced ``loss_*`` terms plus detached scalar diagnostics, or,
    with ``reduction="none"``, the per-sample terms with the batch's shape. Losses with
    ``use_prioritized_weights`` weight every term by the batch's ``priority_weight``."""
    weights = None
    if getattr(loss, "use_prioritized_weights", False) in ("auto", True):
        key = getattr(loss.tensor_keys, "priority_weight", None)
        weights = td.get(key, None) if key is not None else None
    if weights is not None:
        weights = weights.detach().reshape(td.batch_size).to(next(iter(losses.values())).dtype)
        losses = {k: v * weights for k, v in losses.items()}
    if loss.reduction == "none":
        out_none = TensorDict(losses, td.batch_size)
        if getattr(loss, "scalar_output_mode", None) == "non_tensor":
            for k, v in diagnostics.items():
                if k in ("alpha", "entropy"):
                    out_none.set_non_tensor(k, v.detach())
        return out_none
    if weights is not None and loss.reduction == "mean":
        total = weights.sum()
        out = {k: v.sum() / total for k, v in losses.items()}
        out.update({k: v.detach() for k, v in diagnostics.items()})
        return TensorDict(out, [])
    out = {k: reduce_loss(v, loss.reduction) for k, v in losses.items()}
    out.update({k: v.detach() for k, v in diagnostics.items()})
    return TensorDict(out, [])
