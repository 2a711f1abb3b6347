"""``TD3Loss``: twin delayed DDPG (Fujimoto et al., 2018).

For a batch of transitions ``(s, a, r, s')``, a deterministic actor ``mu`` and ``N``
critics ``Q_1..Q_N`` (an ensemble called through ``torch.vmap``)::

    eps         = clip(noise * randn, -noise_clip, noise_clip)     target policy smoothing
    a'          = clip(mu_target(s') + eps, low, high)              the action bounds
    target      = r + gamma * (1 - terminated) * min_i Q_target_i(s', a')      no gradient
    loss_qvalue = mean( sum_i d(Q_i(s, a), target) )
    loss_actor  = mean( -Q_1(s, mu(s)) )                            critics frozen

"Delayed" policy updates are the training loop's job, as in TorchRL: the loss computes
both terms on every call (their graphs are separate), and the loop steps the actor and
the targets every ``policy_delay`` critic steps::

    out = loss(batch)
    out["loss_qvalue"].backward(); critic_optim.step(); critic_optim.zero_grad()
    if step % policy_delay == 0:
        out["loss_actor"].backward(); actor_optim.step(); actor_optim.zero_grad()
        target_updater.step()   # SoftUpdate(loss, tau=0.005)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..data import Composite
from ..tensordict import TensorDict, TensorDictBase, ensemble_call
from .common import (
    LossModule,
    NestedKey,
    _norm_key,
    check_options,
    register_critics,
    torchrl_compat,
)
from .utils import Q_TARGET_ESTIMATORS, ValueEstimators, distance_loss, weighted_reduce

__all__ = ["TD3Loss"]


def _bounds(action_spec: Any, bounds: Any, action_key: NestedKey) -> tuple[Tensor, Tensor]:
    """``(low, high)`` tensors from a bounded spec or a ``(low, high)`` pair."""
    if action_spec is not None:
        if isinstance(action_spec, Composite):
            action_spec = action_spec[action_key]
        low, high = getattr(action_spec, "low", None), getattr(action_spec, "high", None)
        if low is None or high is None:
            raise ValueError(
                f"TD3Loss: the action spec must be bounded (have low/high, e.g. Bounded), got "
                f"{type(action_spec).__name__}"
            )
    elif bounds is not None:
        low, high = bounds
    else:
        raise ValueError("TD3Loss needs the action bounds: pass action_spec=<a Bounded spec> or bounds=(low, high)")
    low, high = torch.as_tensor(low, dtype=torch.get_default_dtype()), torch.as_tensor(high, dtype=torch.get_default_dtype())
    if bool((low > high).any()):
        raise ValueError(f"TD3Loss: a low bound is above its high bound (low={low}, high={high})")
    return low.clone(), high.clone()


class TD3Loss(LossModule):
    """The TD3 loss, TorchRL's ``TD3Loss``.

    Args:
        actor_network: a TensorDict module writing the action at ``"action"``.
        qvalue_network: a TensorDict module reading the state and ``"action"`` and writing
            ``"state_action_value"``: ``[*batch, 1]``. It is the first member of the
            ensemble; the other ``num_qvalue_nets - 1`` members are copies re-initialized
            with ``reset_parameters()`` (a lazy critic: on the first call). The members' stacked parameters are the
            :class:`~steersman.tensordict.TensorDictParams` ``loss.qvalue_network_params``
            (optimize these); ``loss.qvalue_network`` keeps only the structure (meta device).
        action_spec: a bounded spec (``Bounded``, or a ``Composite`` holding the action)
            giving the bounds the smoothed target action is clamped to; or
        bounds: ``(low, high)`` numbers or tensors.
        num_qvalue_nets: number of critics (default 2; the target takes their minimum).
        policy_noise: std of the target policy smoothing noise (default 0.2).
        noise_clip: the noise is clamped to ``[-noise_clip, noise_clip]`` (default 0.5).
        loss_function: ``"smooth_l1"`` (default), ``"l2"`` or ``"l1"``.
        delay_actor, delay_qvalue: use target networks (default ``True``): frozen copies
            equal to the online ones when made; move them with ``SoftUpdate``/``HardUpdate``.
        gamma: deprecated; use ``loss.make_value_estimator(gamma=...)``.
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.
        deactivate_vmap, separate_losses: accepted for TorchRL compatibility and ignored
            (see :data:`~steersman.objectives.common.TORCHRL_COMPAT_IGNORED`: the stacked
            critic ensemble holds its own parameters, so the terms never share any).
        priority_key: deprecated (warns); the same as ``loss.set_keys(priority=...)``.
        use_prioritized_weights: ``"auto"``/``True`` (default ``"auto"``): both terms are
            weighted by the batch's ``"priority_weight"`` when it has one (``"mean"``:
            ``sum(w * l) / sum(w)``); ``False``: never.
        given_noise_key: steersman's own option (not TorchRL's): a batch key holding the
            standard normal draws of the target smoothing noise, shaped like the action,
            used instead of ``torch.randn`` (e.g. a seed population's own random streams:
            the noise becomes ``clip(policy_noise * eps, ±noise_clip)``). Default ``None``.

    Reads the networks' inputs at the root and under ``"next"``, ``"action"``, and
    ``("next", "reward" | "done" | "terminated")`` (``[*batch, 1]``). Returns
    ``loss_actor``, ``loss_qvalue`` and the diagnostics ``pred_value``,
    ``state_action_value_actor``, ``next_state_value``, ``target_value`` (means). Writes
    the per-sample priority ``max_i |Q_i(s, a) - target|`` (``[*batch]``) into the batch
    at ``"td_error"``. The smoothing noise is the first random draw of a call (seed it
    with ``torch.manual_seed`` for reproducible losses).

    Example:
        >>> import torch
        >>> from steersman.data import Bounded
        >>> from steersman.modules import MLP  # lazy input size: set by the first call
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.tensordict.nn import TensorDictModule
        >>> actor = TensorDictModule(torch.nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
        >>> critic = TensorDictModule(MLP(out_features=1, num_cells=[8]), ["observation", "action"], ["state_action_value"])
        >>> loss = TD3Loss(actor, critic, action_spec=Bounded(-1.0, 1.0, shape=(1,)))
        >>> batch = TensorDict({
        ...     "observation": torch.randn(8, 3), "action": torch.rand(8, 1) * 2 - 1,
        ...     "next": {"observation": torch.randn(8, 3), "reward": torch.randn(8, 1),
        ...              "done": torch.zeros(8, 1, dtype=torch.bool),
        ...              "terminated": torch.zeros(8, 1, dtype=torch.bool)}}, [8])
        >>> out = loss(batch)
        >>> sorted(k for k in out.keys() if k.startswith("loss_"))
        ['loss_actor', 'loss_qvalue']
        >>> (out["loss_actor"] + out["loss_qvalue"]).backward()
        >>> loss.qvalue_network_params["module", "0", "weight"].shape  # stacked on the first call: [2, 8, 3 + 1]
        torch.Size([2, 8, 4])
    """

    @dataclass
    class _AcceptedKeys:
        """Batch keys; ``reward``/``done``/``terminated`` are read under ``"next"``."""

        action: NestedKey = "action"  # what the actor writes and the critics read
        state_action_value: NestedKey = "state_action_value"
        priority: NestedKey = "td_error"
        priority_weight: NestedKey = "priority_weight"
        reward: NestedKey = "reward"
        done: NestedKey = "done"
        terminated: NestedKey = "terminated"

    default_value_estimator = ValueEstimators.TD0
    supported_value_estimators = Q_TARGET_ESTIMATORS
    out_keys = ["loss_actor", "loss_qvalue", "pred_value", "state_action_value_actor", "next_state_value", "target_value"]
    networks = ("actor_network", "qvalue_network")

    def __init__(
        self,
        actor_network: nn.Module,
        qvalue_network: nn.Module,
        *,
        action_spec: Any = None,
        bounds: tuple[Any, Any] | None = None,
        num_qvalue_nets: int = 2,
        policy_noise: float = 0.2,
        noise_clip: float = 0.5,
        loss_function: str = "smooth_l1",
        delay_actor: bool = True,
        delay_qvalue: bool = True,
        gamma: float | None = None,
        reduction: str = "mean",
        deactivate_vmap: bool = False,
        separate_losses: bool = False,
        priority_key: NestedKey | None = None,
        use_prioritized_weights: str | bool = "auto",
        given_noise_key: NestedKey | None = None,
    ) -> None:
        super().__init__()
        self.given_noise_key = None if given_noise_key is None else _norm_key(given_noise_key)
        check_options(self, loss_function=loss_function, reduction=reduction, num_qvalue_nets=num_qvalue_nets)
        torchrl_compat(self, deactivate_vmap=deactivate_vmap, separate_losses=separate_losses)
        self._prioritized_options(use_prioritized_weights, priority_key)
        low, high = _bounds(action_spec, bounds, self.tensor_keys.action)
        self.register_buffer("min_action", low)
        self.register_buffer("max_action", high)

        self.actor_network = actor_network
        self.num_qvalue_nets = int(num_qvalue_nets)
        self.delay_actor = bool(delay_actor)
        self.delay_qvalue = bool(delay_qvalue)
        if self.delay_actor:
            self.make_target("actor_network")
        register_critics(self, qvalue_network, self.num_qvalue_nets, self.delay_qvalue)
        self.policy_noise = float(policy_noise)
        self.noise_clip = float(noise_clip)
        self.loss_function = loss_function
        self.reduction = reduction
        self._deprecated_gamma(gamma)

    def _estimator_value_network(self) -> None:
        return None  # the loss computes min_i Q_target_i(s', a') itself

    # -------------------------------------------------------------------- forward
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        loss_actor, actor_metadata = self.actor_loss(tensordict)
        loss_qvalue, value_metadata = self.value_loss(tensordict)
        return TensorDict({"loss_actor": loss_actor, "loss_qvalue": loss_qvalue, **actor_metadata, **value_metadata}, [])

    def actor_loss(self, tensordict: TensorDictBase) -> tuple[Tensor, dict[str, Tensor]]:
        """``-Q_1(s, mu(s))`` with the critics frozen (gradient reaches the actor only)."""
        td = self.actor_network(tensordict.copy())
        q = self._qvalues(td, self.qvalue_network_params.detach()).squeeze(-1)  # [N, *B]
        loss = weighted_reduce(-q[0], self.reduction, self._priority_weights(tensordict, q[0]))
        return loss, {"state_action_value_actor": q.detach().mean()}

    def value_loss(self, tensordict: TensorDictBase) -> tuple[Tensor, dict[str, Tensor]]:
        """Every critic's regression to the clipped double-Q target; returns ``(loss, diagnostics)``."""
        action = self._get(tensordict, "action")
        noise = self._smoothing_noise(action) if self.given_noise_key is None else self._given_noise(tensordict, action)
        with torch.no_grad():
            next_td = tensordict.get("next").copy()
            next_td.set(self.tensor_keys.action, self._next_action(next_td, noise))
            target_params = self.target_qvalue_network_params if self.delay_qvalue else self.qvalue_network_params
            next_value = self._qvalues(next_td, target_params).min(0).values           # [*B, 1]
            target = self.value_estimator.value_estimate(tensordict, next_value=next_value).squeeze(-1)

        pred = self._qvalues(tensordict, self.qvalue_network_params).squeeze(-1)       # [N, *B]
        loss = distance_loss(pred, target.expand_as(pred), self.loss_function).sum(0)  # [*B]
        loss = weighted_reduce(loss, self.reduction, self._priority_weights(tensordict, loss))
        tensordict.set(self.tensor_keys.priority, (pred.detach() - target).abs().max(0).values)
        metadata = {
            "pred_value": pred.detach().mean(),
            "next_state_value": next_value.mean(),
            "target_value": target.mean(),
        }
        return loss, metadata

    # -------------------------------------------------------------------- pieces
    def _smoothing_noise(self, action: Tensor) -> Tensor:
        """``clip(policy_noise * randn, -noise_clip, noise_clip)``, shaped like ``action``."""
        return (torch.randn_like(action) * self.policy_noise).clamp(-self.noise_clip, self.noise_clip)

    def _given_noise(self, td: TensorDictBase, action: Tensor) -> Tensor:
        """``clip(policy_noise * eps, -noise_clip, noise_clip)`` from the batch's standard
        normal draws ``eps`` at ``given_noise_key`` (shaped like the action)."""
        eps = td.get(self.given_noise_key, None)
        if eps is None:
            raise KeyError(f"TD3Loss: given_noise_key={self.given_noise_key!r} is not in the batch; it holds the "
                           "standard normal draws of the target smoothing noise, shaped like the action")
        if eps.shape != action.shape:
            raise ValueError(f"TD3Loss: {self.given_noise_key!r} has shape {list(eps.shape)}, expected the action's "
                             f"{list(action.shape)}")
        return (eps * self.policy_noise).clamp(-self.noise_clip, self.noise_clip)

    def _next_action(self, next_td: TensorDictBase, noise: Tensor) -> Tensor:
        """The smoothed target action ``clip(mu_target(s') + noise, low, high)``: ``[*B, *action]``."""
        actor = self.target_actor_network if self.delay_actor else self.actor_network
        action = actor(next_td.copy()).get(self.tensor_keys.action)
        return torch.clamp(action + noise, self.min_action, self.max_action)

    def _qvalues(self, td: TensorDictBase, params: TensorDictBase) -> Tensor:
        """Every critic's ``Q_i(s, a)`` with stacked ``params``: ``[N, *B, 1]`` (``td`` is not written to)."""
        inputs = td.select(*self.qvalue_network.in_keys, strict=False)
        q = ensemble_call(self.qvalue_network, params, inputs, randomness=self.vmap_randomness).get(self.tensor_keys.state_action_value, None)
        if q is None:
            raise KeyError(
                f"TD3Loss: the qvalue network did not write {self.tensor_keys.state_action_value!r}; set its "
                f"out_keys or call loss.set_keys(state_action_value=<its key>)"
            )
        if q.shape != (self.num_qvalue_nets, *td.batch_size, 1):
            raise ValueError(
                f"TD3Loss: the qvalue network's {self.tensor_keys.state_action_value!r} has shape "
                f"{list(q.shape[1:])} per critic; expected [*batch, 1] = {[*td.batch_size, 1]}"
            )
        return q
