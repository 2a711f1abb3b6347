"""``DQNLoss``: deep Q-learning (Mnih et al., 2015), optionally double DQN (van Hasselt et al.,
2016); ``DistributionalDQNLoss``: its categorical (C51) version (Bellemare et al., 2017).

For a batch of transitions ``(s, a, r, s')``::

    pred   = Q(s, a)                                     online network, with gradient
    a*     = argmax_a' Q_target(s', a')                  DQN
           = argmax_a' Q(s', a')                         double DQN: the online net picks...
    next   = Q_target(s', a*)                            ...the target net rates
    target = r + gamma * (1 - terminated) * next         TD(0) (default value estimator)
    loss   = mean( d(pred, target) )                     d: l2 / l1 / smooth_l1

``target`` carries no gradient. A truncated (not terminated) step bootstraps from
``next``. With ``action_mask`` in the batch (under ``"next"``), masked actions are never
picked by the ``argmax``.

C51 learns a distribution over ``n_atoms`` fixed returns (the ``support`` z) instead of
``Q``; see :class:`DistributionalDQNLoss`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..data import Categorical, Composite, OneHot
from ..tensordict import TensorDict, TensorDictBase
from .common import LossModule, NestedKey, check_options
from .utils import Q_TARGET_ESTIMATORS, ValueEstimators, distance_loss, weighted_reduce

__all__ = ["DQNLoss", "DistributionalDQNLoss"]

_SPACES = {"categorical": "categorical", "one_hot": "one_hot", "one-hot": "one_hot"}


def _action_space(action_space: Any, value_network: nn.Module, action_key: NestedKey) -> tuple[str | None, int | None]:
    """``("categorical" | "one_hot" | None, n_actions | None)`` from a string, a spec or the network's spec."""
    if action_space is None:
        action_space = getattr(value_network, "spec", None)
    if action_space is None:
        action_space = getattr(value_network, "action_space", None)
    if action_space is None:
        return None, None  # inferred from the action's shape at each call
    if isinstance(action_space, str):
        if action_space not in _SPACES:
            raise ValueError(f"DQNLoss: action_space must be one of {sorted(_SPACES)} or a spec, got {action_space!r}")
        return _SPACES[action_space], None
    if isinstance(action_space, Composite):
        action_space = action_space[action_key]
    if isinstance(action_space, Categorical):
        return "categorical", action_space.n
    if isinstance(action_space, OneHot):
        return "one_hot", action_space.n
    raise ValueError(
        f"DQNLoss: action_space must be 'categorical', 'one_hot', a Categorical/OneHot spec (or a "
        f"Composite holding one), got {type(action_space).__name__}"
    )


class DQNLoss(LossModule):
    """The DQN loss, TorchRL's ``DQNLoss``.

    Args:
        value_network: a TensorDict module writing the Q-values of every action at
            ``"action_value"``: ``[*batch, n_actions]``.
        loss_function: ``"l2"`` (default), ``"l1"`` or ``"smooth_l1"`` (Huber).
        delay_value: use a target network (a frozen copy made now, equal to the online
            network; move it with ``SoftUpdate``/``HardUpdate``). ``False``: the online
            network, without gradient, computes the target.
        double_dqn: the online network picks the next action, the target network rates it.
        gamma: deprecated; use ``loss.make_value_estimator(gamma=...)``.
        action_space: how the batch stores ``"action"``: ``"categorical"`` (an index,
            ``[*batch]`` or ``[*batch, 1]``), ``"one_hot"`` (``[*batch, n_actions]``), or a
            ``Categorical``/``OneHot`` spec. Default: the network's ``spec`` if it has
            one, else read from the action's shape (one-hot when it matches the Q-values').
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.
        priority_key: deprecated (warns); the same as ``loss.set_keys(priority=...)``.
        use_prioritized_weights: ``"auto"``/``True`` (default ``"auto"``): when the batch has
            ``"priority_weight"`` (a prioritized buffer's importance weights, one per sample)
            the per-sample losses are weighted by it (``"mean"``: ``sum(w * l) / sum(w)``);
            ``False``: never.

    Reads ``"action"`` and the network's inputs, ``("next", "reward")``,
    ``("next", "done")``, ``("next", "terminated")`` (shaped ``[*batch, 1]``) and the
    network's inputs under ``"next"``; optionally ``("next", "action_mask")`` (bool
    ``[*batch, n_actions]``, ``True`` = allowed). Returns ``"loss"`` (TorchRL's name) and
    the diagnostic ``"td_error"`` (the mean squared TD error). Writes the per-sample
    priority ``(pred - target) ** 2``, ``[*batch, 1]``, into the batch at ``"td_error"``
    for prioritized replay (``rb.update_tensordict_priority(batch)``).

    The default estimator is TD(0) with ``gamma=0.99``;
    ``loss.make_value_estimator(ValueEstimators.TDLambda, gamma=..., lmbda=...)`` gives
    TD(λ) targets over ``[*batch, time]`` batches.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.tensordict.nn import TensorDictModule
        >>> net = TensorDictModule(torch.nn.Linear(4, 2), in_keys=["observation"], out_keys=["action_value"])
        >>> loss = DQNLoss(net, action_space="categorical")
        >>> batch = TensorDict({
        ...     "observation": torch.randn(8, 4), "action": torch.randint(2, (8,)),
        ...     "next": {"observation": torch.randn(8, 4), "reward": torch.randn(8, 1),
        ...              "done": torch.zeros(8, 1, dtype=torch.bool),
        ...              "terminated": torch.zeros(8, 1, dtype=torch.bool)}}, [8])
        >>> out = loss(batch)
        >>> out["loss"].shape, batch["td_error"].shape
        (torch.Size([]), torch.Size([8, 1]))
        >>> out["loss"].backward()
    """

    @dataclass
    class _AcceptedKeys:
        """Batch keys; ``reward``/``done``/``terminated``/``action_mask`` are read under ``"next"``."""

        advantage: NestedKey = "advantage"
        value_target: NestedKey = "value_target"
        value: NestedKey = "chosen_action_value"  # TorchRL's name; the estimator is given the next value
        action_value: NestedKey = "action_value"
        action: NestedKey = "action"
        action_mask: NestedKey = "action_mask"
        priority: NestedKey = "td_error"
        priority_weight: NestedKey = "priority_weight"
        reward: NestedKey = "reward"
        done: NestedKey = "done"
        terminated: NestedKey = "terminated"

    default_value_estimator = ValueEstimators.TD0
    supported_value_estimators = Q_TARGET_ESTIMATORS
    out_keys = ["loss"]
    networks = ("value_network",)

    def __init__(
        self,
        value_network: nn.Module,
        *,
        loss_function: str = "l2",
        delay_value: bool = True,
        double_dqn: bool = False,
        gamma: float | None = None,
        action_space: Any = None,
        reduction: str = "mean",
        priority_key: NestedKey | None = None,
        use_prioritized_weights: str | bool = "auto",
    ) -> None:
        super().__init__()
        check_options(self, loss_function=loss_function, reduction=reduction)
        self._prioritized_options(use_prioritized_weights, priority_key)
        self.value_network = value_network
        self.delay_value = bool(delay_value)
        if self.delay_value:
            self.make_target("value_network")
        self.double_dqn = bool(double_dqn)
        self.loss_function = loss_function
        self.reduction = reduction
        self.action_space, self.n_actions = _action_space(action_space, value_network, self.tensor_keys.action)
        self._deprecated_gamma(gamma)

    def _estimator_value_network(self) -> None:
        return None  # the loss computes the next value itself and passes it to the estimator

    # -------------------------------------------------------------------- forward
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = self._get(tensordict, "action")
        next_td = tensordict.get("next")

        q = self._action_values(self.value_network, tensordict)             # [*B, n]
        pred = self._chosen(q, action)                                       # [*B]

        with torch.no_grad():
            next_value = self._next_value(next_td)                           # [*B, 1]
            target = self.value_estimator.value_estimate(tensordict, next_value=next_value).squeeze(-1)

        loss = distance_loss(pred, target, self.loss_function)
        loss = weighted_reduce(loss, self.reduction, self._priority_weights(tensordict, loss))
        td_error = (pred - target).detach().pow(2)
        tensordict.set(self.tensor_keys.priority, td_error.unsqueeze(-1))
        return TensorDict({"loss": loss, "td_error": td_error.mean()}, [])

    # -------------------------------------------------------------------- pieces
    def _action_values(self, net: nn.Module, td: TensorDictBase) -> Tensor:
        """``net``'s Q-values on a shallow copy of ``td`` (the batch is not written to)."""
        q = net(td.copy()).get(self.tensor_keys.action_value, None)
        if q is None:
            raise KeyError(
                f"DQNLoss: the value network did not write {self.tensor_keys.action_value!r}; set its "
                f"out_keys or call loss.set_keys(action_value=<its key>)"
            )
        if q.shape[:-1] != td.batch_size or (self.n_actions is not None and q.shape[-1] != self.n_actions):
            n = self.n_actions if self.n_actions is not None else "n_actions"
            raise ValueError(
                f"DQNLoss: the value network's {self.tensor_keys.action_value!r} has shape {list(q.shape)}; "
                f"expected [*batch, n_actions] = {[*td.batch_size, n]}"
            )
        return q

    def _chosen(self, q: Tensor, action: Tensor) -> Tensor:
        """``Q(s, a)`` for the taken action, from an index or a one-hot action: ``[*B]``."""
        space = self.action_space
        if space is None:
            space = "one_hot" if action.shape == q.shape else "categorical"
        if space == "one_hot":
            if action.shape != q.shape:
                raise ValueError(
                    f"DQNLoss: a one-hot {self.tensor_keys.action!r} must have the Q-values' shape "
                    f"{list(q.shape)}, got {list(action.shape)}"
                )
            return (q * action.to(q.dtype)).sum(-1)
        index = action if action.ndim == q.ndim else action.unsqueeze(-1)
        if index.shape != q.shape[:-1] + (1,):
            raise ValueError(
                f"DQNLoss: a categorical {self.tensor_keys.action!r} must have shape {list(q.shape[:-1])} "
                f"or {list(q.shape[:-1]) + [1]}, got {list(action.shape)}"
            )
        return q.gather(-1, index.long()).squeeze(-1)

    def _masked(self, q: Tensor, mask: Tensor | None) -> Tensor:
        return q if mask is None else torch.where(mask, q, torch.finfo(q.dtype).min)

    def _next_value(self, next_td: TensorDictBase) -> Tensor:
        """``Q_target(s', a*)`` with ``a*`` the (masked) argmax of the target or online net: ``[*B, 1]``."""
        target_net = self.target_value_network if self.delay_value else self.value_network
        next_q = self._action_values(target_net, next_td)
        mask = next_td.get(self.tensor_keys.action_mask, None)
        if self.double_dqn:
            online_q = self._masked(self._action_values(self.value_network, next_td), mask)
            return next_q.gather(-1, online_q.argmax(-1, keepdim=True))
        return self._masked(next_q, mask).max(-1, keepdim=True).values


class DistributionalDQNLoss(LossModule):
    """The categorical distributional DQN (C51) loss, TorchRL's ``DistributionalDQNLoss``.

    The network gives, per action, log-probabilities over the fixed returns ``support``
    (``z_0 < ... < z_{K-1}``, evenly spaced). For a batch of transitions::

        a*     = argmax_a' sum_k z_k p(s', a')_k              online network (as TorchRL)
        Tz_k   = clip(r + gamma * (1 - terminated) * z_k, z_0, z_{K-1})
        m_i    = sum_k p_target(s', a*)_k * max(0, 1 - |Tz_k - z_i| / dz)   projection on z
        loss   = mean( -sum_i m_i * log p(s, a)_i )             cross-entropy

    Args:
        value_network: a TensorDict module writing log-probabilities at ``"action_value"``:
            ``[*batch, n_atoms, n_actions]`` (log-softmax over the atoms).
        gamma: the discount.
        support: the returns ``[n_atoms]``; default ``value_network.support``.
        delay_value: use a target network for ``p_target`` (default ``True``).
        action_space: ``"categorical"``, ``"one_hot"`` or a spec, as for :class:`DQNLoss`.
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.
        priority_key, use_prioritized_weights: as for :class:`DQNLoss`.

    Reads and writes the keys :class:`DQNLoss` does (``"action"``, ``("next", "reward")``,
    ``("next", "terminated")``, optional ``("next", "action_mask")``); returns ``"loss"``;
    writes the per-sample cross-entropy (``[*batch, 1]``) at ``"td_error"``.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.tensordict.nn import TensorDictModule
        >>> class C51Head(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.linear = torch.nn.Linear(4, 11 * 2)
        ...     def forward(self, observation):
        ...         return self.linear(observation).unflatten(-1, (11, 2)).log_softmax(-2)
        >>> net = TensorDictModule(C51Head(), in_keys=["observation"], out_keys=["action_value"])
        >>> loss = DistributionalDQNLoss(net, gamma=0.99, support=torch.linspace(-5, 5, 11))
        >>> batch = TensorDict({
        ...     "observation": torch.randn(8, 4), "action": torch.randint(2, (8,)),
        ...     "next": {"observation": torch.randn(8, 4), "reward": torch.randn(8, 1),
        ...              "done": torch.zeros(8, 1, dtype=torch.bool),
        ...              "terminated": torch.zeros(8, 1, dtype=torch.bool)}}, [8])
        >>> loss(batch)["loss"].backward()
    """

    @dataclass
    class _AcceptedKeys:
        """Batch keys; ``reward``/``done``/``terminated``/``action_mask`` are read under ``"next"``."""

        action_value: NestedKey = "action_value"
        action: NestedKey = "action"
        action_mask: NestedKey = "action_mask"
        priority: NestedKey = "td_error"
        priority_weight: NestedKey = "priority_weight"
        reward: NestedKey = "reward"
        done: NestedKey = "done"
        terminated: NestedKey = "terminated"

    out_keys = ["loss"]
    networks = ("value_network",)

    def __init__(
        self,
        value_network: nn.Module,
        *,
        gamma: float,
        support: Tensor | None = None,
        delay_value: bool = True,
        action_space: Any = None,
        reduction: str = "mean",
        priority_key: NestedKey | None = None,
        use_prioritized_weights: str | bool = "auto",
    ) -> None:
        super().__init__()
        check_options(self, reduction=reduction)
        self._prioritized_options(use_prioritized_weights, priority_key)
        support = support if support is not None else getattr(value_network, "support", None)
        if support is None or support.ndim != 1 or support.numel() < 2:
            raise ValueError("DistributionalDQNLoss needs a 1-d support of >= 2 atoms (support=... or value_network.support)")
        step = support.diff()
        if not bool((step > 0).all()) or not torch.allclose(step, step[0].expand_as(step)):
            raise ValueError(f"DistributionalDQNLoss: the support must be increasing and evenly spaced, got {support}")
        self.register_buffer("support", support.detach().clone())
        self.gamma = float(gamma)
        self.value_network = value_network
        self.delay_value = bool(delay_value)
        if self.delay_value:
            self.make_target("value_network")
        self.reduction = reduction
        self.action_space, self.n_actions = _action_space(action_space, value_network, self.tensor_keys.action)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = self._get(tensordict, "action")
        reward = self._get_next(tensordict, "reward")                       # [*B, 1]
        terminated = self._get_next(tensordict, "terminated")               # [*B, 1]
        next_td = tensordict.get("next")

        log_p = self._log_probs(self.value_network, tensordict)               # [*B, K, n]
        log_p_a = (log_p * self._one_hot(action, log_p).unsqueeze(-2)).sum(-1)  # [*B, K]

        with torch.no_grad():
            z = self.support
            p_next = self._log_probs(self.value_network, next_td).exp()
            q_next = (p_next * z.unsqueeze(-1)).sum(-2)                       # [*B, n]
            mask = next_td.get(self.tensor_keys.action_mask, None)
            if mask is not None:
                q_next = torch.where(mask, q_next, torch.finfo(q_next.dtype).min)
            best = torch.nn.functional.one_hot(q_next.argmax(-1), q_next.shape[-1]).to(p_next.dtype)
            target_net = self.target_value_network if self.delay_value else self.value_network
            p_best = (self._log_probs(target_net, next_td).exp() * best.unsqueeze(-2)).sum(-1)  # [*B, K]
            tz = (reward + self.gamma * (1 - terminated.to(reward.dtype)) * z).clamp(z[0], z[-1])  # [*B, K]
            dz = z[1] - z[0]
            # projection: atom i gets p_k * (1 - |Tz_k - z_i| / dz) from each Tz_k within dz of it
            weight = (1 - (tz.unsqueeze(-2) - z.unsqueeze(-1)).abs() / dz).clamp(min=0)  # [*B, K_i, K_k]
            m = (weight * p_best.unsqueeze(-2)).sum(-1)                         # [*B, K]

        loss = -(m * log_p_a).sum(-1)                                          # [*B]
        tensordict.set(self.tensor_keys.priority, loss.detach().unsqueeze(-1))
        return TensorDict({"loss": weighted_reduce(loss, self.reduction, self._priority_weights(tensordict, loss))}, [])

    def _log_probs(self, net: nn.Module, td: TensorDictBase) -> Tensor:
        """``net``'s log-probabilities on a shallow copy of ``td``: ``[*B, n_atoms, n_actions]``."""
        log_p = net(td.copy()).get(self.tensor_keys.action_value)
        atoms = self.support.shape[0]
        if log_p.shape[:-2] != td.batch_size or log_p.shape[-2] != atoms or (
            self.n_actions is not None and log_p.shape[-1] != self.n_actions
        ):
            raise ValueError(
                f"DistributionalDQNLoss: the value network's {self.tensor_keys.action_value!r} has shape "
                f"{list(log_p.shape)}; expected [*batch, n_atoms, n_actions] = {[*td.batch_size, atoms, 'n_actions']}"
            )
        return log_p

    def _one_hot(self, action: Tensor, log_p: Tensor) -> Tensor:
        """The taken action as a one-hot ``[*B, n_actions]`` (from an index or a one-hot)."""
        n = log_p.shape[-1]
        one_hot_shape = log_p.shape[:-2] + (n,)
        space = self.action_space
        if space is None:
            space = "one_hot" if action.shape == one_hot_shape else "categorical"
        if space == "one_hot":
            if action.shape != one_hot_shape:
                raise ValueError(
                    f"DistributionalDQNLoss: a one-hot {self.tensor_keys.action!r} must have shape "
                    f"{list(one_hot_shape)}, got {list(action.shape)}"
                )
            return action.to(log_p.dtype)
        index = action.squeeze(-1) if action.shape == one_hot_shape[:-1] + (1,) else action
        if index.shape != one_hot_shape[:-1]:
            raise ValueError(
                f"DistributionalDQNLoss: a categorical {self.tensor_keys.action!r} must have shape "
                f"{list(one_hot_shape[:-1])} or {list(one_hot_shape[:-1]) + [1]}, got {list(action.shape)}"
            )
        return torch.nn.functional.one_hot(index.long(), n).to(log_p.dtype)
