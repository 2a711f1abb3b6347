"""``QMixerLoss``: value-decomposition Q-learning (QMIX, Rashid et al., 2018; VDN,
Sunehag et al., 2017 with a :class:`~steersman.modules.multiagent.VDNMixer`).

Each agent has Q-values ``Q_i(o_i, ·)`` (the local value network, ``[*B, n_agents,
n_actions]``); a mixer turns the chosen ones into a team value::

    pred   = mix(Q_i(o_i, a_i), s)                                  online networks
    next   = mix_target(max_a' Q_target_i(o'_i, a'), s')             target networks
    target = r + gamma * (1 - terminated) * next                    team reward / termination
    loss   = mean( d(pred, target) )

The batch ``[*B]`` holds ``(group, "observation")`` (what the local network reads),
``(group, "action")`` (an index ``[*B, n_agents]`` / ``[*B, n_agents, 1]`` or one-hot
``[*B, n_agents, n_actions]``), the mixer's other inputs (``"state"``), and team-level
``("next", "reward" | "done" | "terminated")`` ``[*B, 1]`` (average per-agent rewards
first, as TorchRL's examples do). ``(group, "action_mask")`` under ``"next"`` keeps masked
actions out of the max.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ...tensordict import TensorDict, TensorDictBase
from ..common import LossModule, NestedKey, check_options
from ..utils import Q_TARGET_ESTIMATORS, ValueEstimators, distance_loss, reduce_loss

__all__ = ["QMixerLoss"]


class QMixerLoss(LossModule):
    """The QMIX/VDN loss, TorchRL's ``QMixerLoss``.

    Args:
        local_value_network: a TensorDict module writing each agent's Q-values at
            ``action_value`` (default ``("agents", "action_value")``,
            ``[*B, n_agents, n_actions]``).
        mixer_network: a TensorDict module reading ``local_value`` (default
            ``("agents", "chosen_action_value")``, ``[*B, n_agents, 1]``) and e.g. ``"state"``,
            writing ``global_value`` (default ``"chosen_action_value"``, ``[*B, 1]``): a
            :class:`~steersman.modules.multiagent.QMixer` or ``VDNMixer`` in a
            ``TensorDictModule``.

    Keyword Args:
        loss_function: ``"l2"`` (default), ``"l1"`` or ``"smooth_l1"``.
        delay_value: target copies of both networks (default ``True``; update them with
            ``SoftUpdate``/``HardUpdate``); ``False``: the online networks, without gradient.
        gamma: deprecated; use ``loss.make_value_estimator(gamma=...)``.
        action_space: ``"categorical"`` or ``"one_hot"``; default: read from the action's shape.
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.

    Returns ``"loss"`` and ``"td_error"`` (mean squared TD error); writes the per-sample
    priority ``[*B, 1]`` into the batch at ``"td_error"``.

    Example:
        >>> import torch
        >>> from steersman.modules.multiagent import MultiAgentMLP, QMixer
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.tensordict.nn import TensorDictModule
        >>> n, obs, n_act = 3, 4, 5
        >>> local = TensorDictModule(MultiAgentMLP(obs, n_act, n, centralized=False, share_params=True, depth=1,
        ...                                        num_cells=16), [("agents", "observation")], [("agents", "action_value")])
        >>> mixer = TensorDictModule(QMixer(state_shape=(6,), mixing_embed_dim=8, n_agents=n),
        ...                          [("agents", "chosen_action_value"), "state"], ["chosen_action_value"])
        >>> loss = QMixerLoss(local, mixer)
        >>> def step(): return {"agents": TensorDict({"observation": torch.randn(8, n, obs)}, [8, n]),
        ...                     "state": torch.randn(8, 6)}
        >>> batch = TensorDict({**step(), "next": {**step(), "reward": torch.randn(8, 1),
        ...     "done": torch.zeros(8, 1, dtype=torch.bool), "terminated": torch.zeros(8, 1, dtype=torch.bool)}}, [8])
        >>> batch["agents", "action"] = torch.randint(n_act, (8, n))
        >>> out = loss(batch)
        >>> out["loss"].backward()
    """

    @dataclass
    class _AcceptedKeys:
        """Batch keys; ``reward``/``done``/``terminated``/``action_mask`` are read under ``"next"``."""

        advantage: NestedKey = "advantage"
        value_target: NestedKey = "value_target"
        value: NestedKey = "chosen_action_value"
        action_value: NestedKey = ("agents", "action_value")
        local_value: NestedKey = ("agents", "chosen_action_value")
        global_value: NestedKey = "chosen_action_value"
        action: NestedKey = ("agents", "action")
        action_mask: NestedKey = ("agents", "action_mask")
        priority: NestedKey = "td_error"
        reward: NestedKey = "reward"
        done: NestedKey = "done"
        terminated: NestedKey = "terminated"

    default_value_estimator = ValueEstimators.TD0
    supported_value_estimators = Q_TARGET_ESTIMATORS
    out_keys = ["loss"]
    networks = ("local_value_network", "mixer_network")

    def __init__(
        self,
        local_value_network: nn.Module,
        mixer_network: nn.Module,
        *,
        loss_function: str = "l2",
        delay_value: bool = True,
        gamma: float | None = None,
        action_space: str | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__()
        check_options(self, loss_function=loss_function, reduction=reduction)
        if action_space not in (None, "categorical", "one_hot"):
            raise ValueError(f"QMixerLoss: action_space must be 'categorical', 'one_hot' or None, got {action_space!r}")
        self.local_value_network = local_value_network
        self.mixer_network = mixer_network
        self.delay_value = bool(delay_value)
        if self.delay_value:
            self.make_target("local_value_network")
            self.make_target("mixer_network")
        self.loss_function = loss_function
        self.reduction = reduction
        self.action_space = action_space
        self._deprecated_gamma(gamma)

    def _estimator_value_network(self) -> None:
        return None  # the loss computes the next team value and passes it to the estimator

    def _global_value(self, local: nn.Module, mixer: nn.Module, td: TensorDictBase, chosen: Tensor) -> Tensor:
        td = td.copy()
        td.set(self.tensor_keys.local_value, chosen)
        value = mixer(td).get(self.tensor_keys.global_value, None)
        if value is None or value.shape != (*td.batch_size, 1):
            got = None if value is None else list(value.shape)
            raise ValueError(
                f"QMixerLoss: the mixer must write {self.tensor_keys.global_value!r} of shape "
                f"{[*td.batch_size, 1]}, got {got}"
            )
        return value

    def _q(self, net: nn.Module, td: TensorDictBase) -> Tensor:
        q = net(td.copy()).get(self.tensor_keys.action_value, None)
        if q is None or q.ndim != td.ndim + 2 or q.shape[: td.ndim] != td.batch_size:
            got = None if q is None else list(q.shape)
            raise ValueError(
                f"QMixerLoss: the local value network must write {self.tensor_keys.action_value!r} of shape "
                f"{[*td.batch_size, 'n_agents', 'n_actions']}, got {got}"
            )
        return q

    def _chosen(self, q: Tensor, action: Tensor) -> Tensor:
        """``Q_i(o_i, a_i)``: ``[*B, n_agents, 1]``."""
        space = self.action_space or ("one_hot" if action.shape == q.shape else "categorical")
        if space == "one_hot":
            if action.shape != q.shape:
                raise ValueError(f"QMixerLoss: a one-hot action must have the Q-values' shape {list(q.shape)}, "
                                 f"got {list(action.shape)}")
            return (q * action.to(q.dtype)).sum(-1, keepdim=True)
        index = action if action.ndim == q.ndim else action.unsqueeze(-1)
        if index.shape != q.shape[:-1] + (1,):
            raise ValueError(f"QMixerLoss: a categorical action must have shape {list(q.shape[:-1])} or "
                             f"{list(q.shape[:-1]) + [1]}, got {list(action.shape)}")
        return q.gather(-1, index.long())

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = self._get(tensordict, "action")
        q = self._q(self.local_value_network, tensordict)                                  # [*B, n, A]
        pred = self._global_value(self.local_value_network, self.mixer_network, tensordict,
                                  self._chosen(q, action))[..., 0]                         # [*B]
        with torch.no_grad():
            next_td = tensordict.get("next")
            local, mixer = ((self.target_local_value_network, self.target_mixer_network) if self.delay_value
                            else (self.local_value_network, self.mixer_network))
            next_q = self._q(local, next_td)
            mask = next_td.get(self.tensor_keys.action_mask, None)
            if mask is not None:
                next_q = torch.where(mask, next_q, torch.finfo(next_q.dtype).min)
            next_chosen = next_q.max(-1, keepdim=True).values                              # [*B, n, 1]
            next_value = self._global_value(local, mixer, next_td, next_chosen)            # [*B, 1]
            target = self.value_estimator.value_estimate(tensordict, next_value=next_value).squeeze(-1)
        loss = reduce_loss(distance_loss(pred, target, self.loss_function), self.reduction)
        td_error = (pred - target).detach().pow(2)
        tensordict.set(self.tensor_keys.priority, td_error.unsqueeze(-1))
        return TensorDict({"loss": loss, "td_error": td_error.mean()}, [])

    def extra_repr(self) -> str:
        return f"loss_function={self.loss_function!r}, delay_value={self.delay_value}"


