"""``DDPGLoss``: deep deterministic policy gradient (Lillicrap et al., 2016).

For a batch of transitions ``(s, a, r, s')``, a deterministic actor ``mu`` and a critic ``Q``::

    loss_value = mean( d(Q(s, a), target) )
    target     = r + gamma * (1 - terminated) * Q_target(s', mu_target(s'))    no gradient
    loss_actor = mean( -Q(s, mu(s)) )                      critic parameters frozen

``loss_actor`` sends gradient to the actor only (through the action), ``loss_value`` to
the critic only. A truncated (not terminated) step bootstraps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..tensordict import TensorDict, TensorDictBase
from .actor_critic import shared_parameter_names
from .common import LossModule, NestedKey, check_options
from .utils import Q_TARGET_ESTIMATORS, ValueEstimators, distance_loss, weighted_reduce

__all__ = ["DDPGLoss"]


class DDPGLoss(LossModule):
    """The DDPG loss, TorchRL's ``DDPGLoss``.

    Args:
        actor_network: a TensorDict module writing the action at ``"action"``.
        value_network: a TensorDict module reading the state and ``"action"`` and writing
            ``"state_action_value"``: ``[*batch, 1]``.
        loss_function: ``"l2"`` (default), ``"l1"`` or ``"smooth_l1"``.
        delay_actor: give the actor a target network (default ``False``: the online actor,
            without gradient, picks the next action).
        delay_value: give the critic a target network (default ``True``). Targets are
            frozen copies, equal to the online networks when made; move them with
            ``SoftUpdate``/``HardUpdate``.
        gamma: deprecated; use ``loss.make_value_estimator(gamma=...)``.
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.
        separate_losses: the critic's parameters shared with the actor (a common trunk)
            learn from the actor loss only: they are detached in the value loss.
        use_prioritized_weights: ``"auto"``/``True`` (default ``"auto"``): both terms are
            weighted by the batch's ``"priority_weight"`` when it has one (``"mean"``:
            ``sum(w * l) / sum(w)``); ``False``: never.

    Reads the networks' inputs at the root and under ``"next"``, ``"action"``, and
    ``("next", "reward" | "done" | "terminated")`` (``[*batch, 1]``). Returns
    ``loss_actor``, ``loss_value`` and the diagnostics ``pred_value``, ``target_value``,
    ``pred_value_max``, ``target_value_max``, ``td_error``; writes the per-sample priority
    ``(pred - target) ** 2`` (``[*batch]``) into the batch at ``"td_error"``.

    Example:
        >>> import torch
        >>> from steersman.modules import MLP  # lazy input size: set by the first call
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.tensordict.nn import TensorDictModule
        >>> actor = TensorDictModule(torch.nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
        >>> critic = TensorDictModule(MLP(out_features=1, num_cells=[8]), ["observation", "action"], ["state_action_value"])
        >>> loss = DDPGLoss(actor, critic)
        >>> batch = TensorDict({
        ...     "observation": torch.randn(8, 3), "action": torch.randn(8, 1),
        ...     "next": {"observation": torch.randn(8, 3), "reward": torch.randn(8, 1),
        ...              "done": torch.zeros(8, 1, dtype=torch.bool),
        ...              "terminated": torch.zeros(8, 1, dtype=torch.bool)}}, [8])
        >>> out = loss(batch)
        >>> sorted(k for k in out.keys() if k.startswith("loss_"))
        ['loss_actor', 'loss_value']
        >>> (out["loss_actor"] + out["loss_value"]).backward()
    """

    @dataclass
    class _AcceptedKeys:
        """Batch keys; ``reward``/``done``/``terminated`` are read under ``"next"``."""

        action: NestedKey = "action"  # what the actor writes and the critic reads
        state_action_value: NestedKey = "state_action_value"
        priority: NestedKey = "td_error"
        priority_weight: NestedKey = "priority_weight"
        reward: NestedKey = "reward"
        done: NestedKey = "done"
        terminated: NestedKey = "terminated"

    default_value_estimator = ValueEstimators.TD0
    supported_value_estimators = Q_TARGET_ESTIMATORS
    out_keys = ["loss_actor", "loss_value", "pred_value", "target_value", "pred_value_max", "target_value_max"]
    networks = ("actor_network", "value_network")

    def __init__(
        self,
        actor_network: nn.Module,
        value_network: nn.Module,
        *,
        loss_function: str = "l2",
        delay_actor: bool = False,
        delay_value: bool = True,
        gamma: float | None = None,
        reduction: str = "mean",
        separate_losses: bool = False,
        use_prioritized_weights: str | bool = "auto",
    ) -> None:
        super().__init__()
        check_options(self, loss_function=loss_function, reduction=reduction)
        self._prioritized_options(use_prioritized_weights, None)
        self.actor_network = actor_network
        self.value_network = value_network
        self.separate_losses = bool(separate_losses)
        # with separate_losses, the critic's parameters shared with the actor are detached in
        # the value loss: they learn from the actor loss only (TorchRL's behaviour)
        self._shared_in_value = shared_parameter_names(value_network, actor_network) if separate_losses else []
        self.delay_actor = bool(delay_actor)
        self.delay_value = bool(delay_value)
        if self.delay_actor:
            self.make_target("actor_network")
        if self.delay_value:
            self.make_target("value_network")
        self.loss_function = loss_function
        self.reduction = reduction
        self._deprecated_gamma(gamma)

    def _estimator_value_network(self) -> None:
        return None  # the loss computes Q_target(s', mu_target(s')) itself

    # -------------------------------------------------------------------- forward
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        loss_value, metadata = self.loss_value(tensordict)
        loss_actor = self.loss_actor(tensordict)
        return TensorDict({"loss_actor": loss_actor, "loss_value": loss_value, **metadata}, [])

    def loss_actor(self, tensordict: TensorDictBase) -> Tensor:
        """``-Q(s, mu(s))`` with the critic's parameters frozen (gradient reaches the actor only)."""
        td = self.actor_network(tensordict.copy())
        frozen = {name: p.detach() for name, p in self.value_network.named_parameters()}
        q = self._read_q(torch.func.functional_call(self.value_network, frozen, (td,)))
        loss = -q.squeeze(-1)
        return weighted_reduce(loss, self.reduction, self._priority_weights(tensordict, loss))

    def loss_value(self, tensordict: TensorDictBase) -> tuple[Tensor, dict[str, Tensor]]:
        """The critic's regression to the TD target; returns ``(loss, diagnostics)``."""
        self._get(tensordict, "action")  # the loss's KeyError (naming set_keys) if the batch has none
        if self._shared_in_value:
            params = dict(self.value_network.named_parameters())
            detached = {name: params[name].detach() for name in self._shared_in_value}
            out = torch.func.functional_call(self.value_network, detached, (tensordict.copy(),), strict=False)
        else:
            out = self.value_network(tensordict.copy())
        pred = self._read_q(out).squeeze(-1)  # [*B]
        with torch.no_grad():
            next_value = self._next_value(tensordict.get("next"))              # [*B, 1]
            target = self.value_estimator.value_estimate(tensordict, next_value=next_value).squeeze(-1)
        loss = distance_loss(pred, target, self.loss_function)
        loss = weighted_reduce(loss, self.reduction, self._priority_weights(tensordict, loss))
        td_error = (pred - target).detach().pow(2)
        tensordict.set(self.tensor_keys.priority, td_error)
        pred = pred.detach()
        metadata = {
            "td_error": td_error.mean(),
            "pred_value": pred.mean(),
            "target_value": target.mean(),
            "pred_value_max": pred.max(),
            "target_value_max": target.max(),
        }
        return loss, metadata

    # -------------------------------------------------------------------- pieces
    def _next_value(self, next_td: TensorDictBase) -> Tensor:
        """``Q_target(s', mu_target(s'))`` (online networks where there is no target): ``[*B, 1]``."""
        actor = self.target_actor_network if self.delay_actor else self.actor_network
        critic = self.target_value_network if self.delay_value else self.value_network
        return self._read_q(critic(actor(next_td.copy())))

    def _read_q(self, td: TensorDictBase) -> Tensor:
        """The critic's output in ``td``, checked to be ``[*B, 1]``."""
        q = td.get(self.tensor_keys.state_action_value, None)
        if q is None:
            raise KeyError(
                f"DDPGLoss: the value network did not write {self.tensor_keys.state_action_value!r}; set its "
                f"out_keys or call loss.set_keys(state_action_value=<its key>)"
            )
        if q.shape != td.batch_size + (1,):
            raise ValueError(
                f"DDPGLoss: the value network's {self.tensor_keys.state_action_value!r} has shape "
                f"{list(q.shape)}; expected [*batch, 1] = {[*td.batch_size, 1]}"
            )
        return q
