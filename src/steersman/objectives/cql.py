"""Conservative Q-learning (Kumar et al. 2020, "Conservative Q-Learning for Offline
Reinforcement Learning"), the CQL(H) variant on top of SAC.

With two critics ``Q_i``, targets ``Q'_i``, the policy ``pi`` and ``alpha = exp(log_alpha)``:

* critic (TD): ``a' ~ pi(.|s')``, ``y = r + gamma * (1 - terminated) * V'(s')`` with
  ``V'(s') = min_i Q'_i(s', a')`` (``deterministic_backup=True``, the default), or
  ``- alpha * log pi(a'|s')`` added (``False``), or the max over ``num_random`` sampled
  ``a'`` (``max_q_backup``); ``loss_qvalue = sum_i dist(Q_i(s, a), y)``;
* conservative term: ``num_random`` actions from each of ``Uniform(low, high)``, ``pi(.|s)``
  and ``pi(.|s')``, all evaluated at ``s`` and importance-corrected by their (detached)
  log-densities; ``gap_i = T * logsumexp_j((Q_i(s, a_j) - log q(a_j)) / T) - Q_i(s, a)``
  (the logsumexp runs over the ``3 * num_random`` actions of each state);
  ``loss_cql = min_q_weight * sum_i gap_i``. With ``with_lagrange``:
  ``loss_cql = sum_i alpha' * (min_q_weight * gap_i - lagrange_thresh)`` with ``alpha'``
  detached, and ``loss_alpha_prime = -alpha' * mean_i(min_q_weight * gap_i - lagrange_thresh)``
  with the gaps detached (``alpha' = exp(log_alpha_prime)``, at most 1e6);
* actor and temperature: as in SAC (``loss_actor``, ``loss_alpha``), plus the behaviour
  cloning warm-up term ``loss_actor_bc = alpha * log pi(a~|s) - log pi(a|s)`` that
  offline recipes use instead of ``loss_actor`` for the first steps.

Two points follow the paper (and its reference code) where TorchRL's ``CQLLoss`` differs:
the logsumexp runs over all ``3 * num_random`` actions of a state (TorchRL takes it over
the three sources of each sample), and with ``with_lagrange`` the tuned ``alpha'`` scales
the conservative term while ``loss_alpha_prime`` trains ``alpha'`` only (in TorchRL,
``alpha'`` does not enter ``loss_cql`` and ``loss_alpha_prime`` also reaches the critics).

The ``loss_*`` terms are meant to be used per optimizer (critic: ``loss_qvalue + loss_cql``;
actor: ``loss_actor`` or ``loss_actor_bc``; ``loss_alpha``; ``loss_alpha_prime``), as in
TorchRL's recipes: their plain sum counts the actor twice.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from ..tensordict import TensorDictBase
from ..tensordict.nn import ExplorationType, set_exploration_type
from .common import LossModule, torchrl_compat
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

__all__ = ["CQLLoss"]

_MAX_ALPHA_PRIME = 1e6


class CQLLoss(LossModule):
    """The continuous CQL loss (SAC + a conservative penalty on out-of-data actions).

    Args:
        actor_network: a stochastic policy with ``get_dist(td)`` (``rsample`` and a
            ``log_prob`` of shape ``[*batch]``, e.g. ``TanhNormal``).
        qvalue_network: ``Q(s, a)`` writing ``state_action_value`` ``[*batch, 1]``; two
            independently initialised copies form the vmapped ensemble.

    Keyword Args:
        loss_function, alpha_init, min_alpha, max_alpha, fixed_alpha, target_entropy,
        delay_qvalue, reduction: as for :class:`~steersman.objectives.SACLoss`.
        action_spec: the (unbatched) action spec: its shape gives ``target_entropy="auto"``
            and its ``low``/``high`` (default ``-1``/``1``) the range of the random actions.
        delay_actor: sample the TD target's next actions from a target actor.
        temperature: ``T`` of the logsumexp.
        min_q_weight: the weight of the conservative term.
        max_q_backup: TD target from the max over ``num_random`` next actions.
        deterministic_backup: no entropy bonus in the TD target (default ``True``).
        num_random: actions sampled per state and per source for the conservative term.
        with_lagrange: tune the conservative weight ``alpha'`` so that the gap stays near
            ``lagrange_thresh`` (adds ``log_alpha_prime`` and ``loss_alpha_prime``).
        lagrange_thresh: the target gap.
        deactivate_vmap: accepted for TorchRL compatibility and ignored (see
            :data:`~steersman.objectives.common.TORCHRL_COMPAT_IGNORED`).
        scalar_output_mode: with ``reduction="none"``, ``None``/``"exclude"`` leave the scalar
            diagnostics out of the per-sample output, ``"non_tensor"`` keeps ``alpha`` and
            ``entropy`` as non-tensor entries.
        gamma: deprecated (warns); the same as ``loss.make_value_estimator(gamma=...)``.

    Returns ``loss_actor``, ``loss_actor_bc``, ``loss_qvalue``, ``loss_cql``, ``loss_alpha``
    (and ``loss_alpha_prime``), and the detached ``alpha`` and ``entropy``; writes ``td_error``
    into the batch.

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
        >>> loss = CQLLoss(actor, qvalue, target_entropy=-2.0, num_random=4, with_lagrange=True)
        >>> batch = TensorDict({  # 8 dataset transitions, action dim 2
        ...     "observation": torch.randn(8, 3), "action": torch.rand(8, 2) * 2 - 1,
        ...     "next": {"observation": torch.randn(8, 3), "reward": torch.randn(8, 1),
        ...              "done": torch.zeros(8, 1, dtype=torch.bool),
        ...              "terminated": torch.zeros(8, 1, dtype=torch.bool)}}, [8])
        >>> sorted(k for k in loss(batch).keys() if k.startswith("loss_"))
        ['loss_actor', 'loss_actor_bc', 'loss_alpha', 'loss_alpha_prime', 'loss_cql', 'loss_qvalue']
    """

    _AcceptedKeys = SACLoss._AcceptedKeys  # the batch keys of SAC

    default_value_estimator = ValueEstimators.TD0
    supported_value_estimators = Q_TARGET_ESTIMATORS
    networks = ("actor_network", "qvalue_network")

    def __init__(
        self,
        actor_network: nn.Module,
        qvalue_network: nn.Module,
        *,
        loss_function: str = "smooth_l1",
        alpha_init: float = 1.0,
        min_alpha: float | None = None,
        max_alpha: float | None = None,
        action_spec: Any = None,
        fixed_alpha: bool = False,
        target_entropy: str | float = "auto",
        delay_actor: bool = False,
        delay_qvalue: bool = True,
        temperature: float = 1.0,
        min_q_weight: float = 1.0,
        max_q_backup: bool = False,
        deterministic_backup: bool = True,
        num_random: int = 10,
        with_lagrange: bool = False,
        lagrange_thresh: float = 0.0,
        reduction: str = "mean",
        deactivate_vmap: bool = False,
        gamma: float | None = None,
        scalar_output_mode: str | None = None,
    ) -> None:
        super().__init__()
        torchrl_compat(self, deactivate_vmap=deactivate_vmap)
        _scalar_output_mode(self, scalar_output_mode)
        if num_random < 1:
            raise ValueError(f"CQLLoss: num_random must be >= 1, got {num_random}")
        if not temperature > 0:
            raise ValueError(f"CQLLoss: temperature must be > 0, got {temperature}")
        _actor_and_critics(self, actor_network, qvalue_network, 2, delay_qvalue, loss_function, reduction)
        self.delay_actor = delay_actor
        if delay_actor:
            self.make_target("actor_network")
        entropy = _auto_target_entropy(self, target_entropy, action_spec, actor_network)
        _register_alpha(self, alpha_init, min_alpha, max_alpha, fixed_alpha, entropy)
        low, high = _action_bounds(action_spec if action_spec is not None else getattr(actor_network, "spec", None))
        self.register_buffer("action_low", low, persistent=False)
        self.register_buffer("action_high", high, persistent=False)
        self.temperature = float(temperature)
        self.min_q_weight = float(min_q_weight)
        self.max_q_backup = max_q_backup
        self.deterministic_backup = deterministic_backup
        self.num_random = int(num_random)
        self.with_lagrange = with_lagrange
        self.target_action_gap = float(lagrange_thresh)
        if with_lagrange:
            self.log_alpha_prime = nn.Parameter(torch.tensor(0.0))

    # ------------------------------------------------------------------ forward
        if gamma is not None:
            self._deprecated_gamma(gamma)

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        """The loss terms of one batch ``[*batch]`` (see the module docstring)."""
        action = self._get(td, "action")
        _clamp_log_alpha(self)
        alpha = _alpha(self)

        # critics: TD term, then the conservative term on the same predictions
        with torch.no_grad():
            next_value = self._next_value(td, alpha)
            self._get_next(td, "reward")  # shape-checked: [*batch, 1] like next_value
            target = self.value_estimator.value_estimate(td, next_value=next_value).squeeze(-1)
        q = _call_critics(self, td, action, self.qvalue_network_params).squeeze(-1)  # [N, *batch]
        loss_qvalue = distance_loss(q, target.expand_as(q), self.loss_function).sum(0)
        gap = self.min_q_weight * self._conservative_gap(td, q)  # [N, *batch]
        losses = {"loss_qvalue": loss_qvalue}
        if self.with_lagrange:
            alpha_prime = self.log_alpha_prime.exp().clamp(max=_MAX_ALPHA_PRIME)
            losses["loss_cql"] = (alpha_prime.detach() * (gap - self.target_action_gap)).sum(0)
            losses["loss_alpha_prime"] = -(alpha_prime * (gap.detach() - self.target_action_gap)).mean(0)
        else:
            losses["loss_cql"] = gap.sum(0)

        # actor (SAC and behaviour-cloning forms share one sample) and temperature
        with set_exploration_type(ExplorationType.RANDOM):  # also keeps get_dist compilable
            dist = self.actor_network.get_dist(td.select(*self.actor_network.in_keys))
        new_action = dist.rsample()
        log_prob = dist.log_prob(new_action)
        q_new = _call_critics(self, td, new_action, self.qvalue_network_params.detach())
        losses["loss_actor"] = alpha * log_prob - q_new.min(0).values.squeeze(-1)
        losses["loss_actor_bc"] = alpha * log_prob - dist.log_prob(action)
        losses["loss_alpha"] = -self.log_alpha * (log_prob.detach() + self.target_entropy)

        td.set(self.tensor_keys.priority, (q - target).pow(2).max(0).values.detach())
        return _output(self, td, losses, {"alpha": alpha, "entropy": -log_prob.mean()})

    def _next_value(self, td: TensorDictBase, alpha: Tensor) -> Tensor:
        """The bootstrap value ``V'(s')`` ``[*batch, 1]`` (no gradient)."""
        next_td = td.get("next")
        actor = self.target_actor_network if self.delay_actor else self.actor_network
        params = self.target_qvalue_network_params if self.delay_qvalue else self.qvalue_network_params
        if self.max_q_backup:
            repeated = _repeat(next_td, self.num_random)  # [*batch, R]
            actions, _ = _sample(self, actor, repeated)
            q = _call_critics(self, repeated, actions, params).max(-2).values  # [N, *batch, 1]
            return q.min(0).values
        next_action, next_log_prob = _sample(self, actor, next_td)
        value = _call_critics(self, next_td, next_action, params).min(0).values
        if not self.deterministic_backup:
            value = value - alpha * next_log_prob.unsqueeze(-1)
        return value

    def _conservative_gap(self, td: TensorDictBase, q_data: Tensor) -> Tensor:
        """``T * logsumexp((Q_i(s, a_j) - log q(a_j)) / T) - Q_i(s, a)``: ``[N, *batch]``."""
        r = self.num_random
        repeated = _repeat(td, r)  # [*batch, R]
        action_dim = self._get(td, "action").shape[-1]
        low, high = self.action_low, self.action_high
        random_actions = torch.rand(*repeated.batch_size, action_dim, dtype=q_data.dtype,
                                    device=q_data.device) * (high - low) + low
        log_volume = torch.broadcast_to((high - low).log(), (action_dim,)).sum()
        random_log_density = (-log_volume).expand(repeated.batch_size)
        with torch.no_grad():  # the sampled actions and their densities are constants here
            current_actions, current_log_prob = _sample(self, self.actor_network, repeated)
            next_repeated = _repeat(td.get("next"), r)
            next_actions, next_log_prob = _sample(self, self.actor_network, next_repeated)
        # all 3R actions at s, one vmapped call: [*batch, 3R, A]
        actions = torch.cat([random_actions, next_actions, current_actions], -2)
        log_density = torch.cat([random_log_density, next_log_prob, current_log_prob], -1)
        q = _call_critics(self, _repeat(td, 3 * r), actions, self.qvalue_network_params)
        scores = (q.squeeze(-1) - log_density) / self.temperature  # [N, *batch, 3R]
        return self.temperature * torch.logsumexp(scores, -1) - q_data

    def _estimator_value_network(self) -> None:
        return None  # the loss computes V'(s') itself and passes next_value=


def _repeat(td: TensorDictBase, n: int) -> TensorDictBase:
    """``td`` ``[*batch]`` seen ``n`` times along a new last batch dim: ``[*batch, n]`` (no copy)."""
    return td.unsqueeze(td.ndim).expand(*td.batch_size, n)


def _action_bounds(spec: Any) -> tuple[Tensor, Tensor]:
    """The action range of the random actions: the spec's ``low``/``high``, else ``[-1, 1]``."""
    if spec is not None and hasattr(spec, "get") and hasattr(spec, "keys"):  # a Composite
        spec = spec.get("action", None)
    low, high = getattr(spec, "low", None), getattr(spec, "high", None)
    if low is None or high is None:
        return torch.tensor(-1.0), torch.tensor(1.0)
    low = torch.as_tensor(low, dtype=torch.get_default_dtype())
    high = torch.as_tensor(high, dtype=torch.get_default_dtype())
    if not bool((high > low).all()) or not math.isfinite(float((high - low).sum())):
        raise ValueError(f"CQLLoss: the action spec needs finite bounds with low < high, got {low} / {high}")
    return low, high
