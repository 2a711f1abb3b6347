"""``MultiAgentGAE``: GAE over batches whose values carry an agent dim.

In a multi-agent batch ``[*B, T]`` the critic writes one value per agent,
``(group, "state_value")`` ``[*B, T, n_agents, 1]``, while rewards and dones may be per
agent (``(group, "reward")`` ``[*B, T, n_agents, 1]``) or per team (the root
``("next", "done")`` ``[*B, T, 1]``). The estimator inserts the missing agent dim into
team-level rewards/dones (a broadcast, no copy) and runs the usual GAE recursion along
time; ``advantage`` and ``value_target`` get the value's shape ``[*B, T, n_agents, 1]``.

Example:
    >>> import torch
    >>> from steersman.tensordict import TensorDict
    >>> B, T, n = 2, 5, 3
    >>> td = TensorDict({
    ...     "agents": TensorDict({"state_value": torch.zeros(B, T, n, 1)}, [B, T, n]),
    ...     "next": {"agents": TensorDict({"state_value": torch.zeros(B, T, n, 1),
    ...                                    "reward": torch.ones(B, T, n, 1)}, [B, T, n]),
    ...              "done": torch.zeros(B, T, 1, dtype=torch.bool),
    ...              "terminated": torch.zeros(B, T, 1, dtype=torch.bool)}}, [B, T])
    >>> gae = MultiAgentGAE(gamma=0.5, lmbda=1.0).set_keys(
    ...     value=("agents", "state_value"), reward=("agents", "reward"),
    ...     advantage=("agents", "advantage"), value_target=("agents", "value_target"))
    >>> gae(td)["agents", "advantage"].shape
    torch.Size([2, 5, 3, 1])
    >>> td["agents", "advantage"][0, :, 0, 0]
    tensor([1.9375, 1.8750, 1.7500, 1.5000, 1.0000])
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from ...tensordict import TensorDictBase
from . import functional as F
from .advantages import GAE, _next, normalize_advantage

__all__ = ["MultiAgentGAE"]


class MultiAgentGAE(GAE):
    """GAE with per-agent values ``[*B, T, n_agents, 1]`` and per-agent or team-level
    rewards and dones (TorchRL's ``MultiAgentGAE``).

    Args:
        gamma, lmbda, value_network, average_gae, shifted, differentiable, skip_existing,
            vectorized, time_dim: as :class:`~steersman.objectives.value.GAE`.
        agent_dim: the agent dim of the value tensor (default ``-2``: ``[..., n_agents, 1]``).

    Rewards, dones and terminations either have the value's shape or lack its agent dim
    (team-level, ``[*B, T, 1]``); anything else raises a ValueError naming the key, its shape
    and the value's. ``average_gae`` standardizes the advantage over every dim, agents
    included.
    """

    def __init__(
        self,
        *,
        gamma: float | Tensor,
        lmbda: float | Tensor = 0.95,
        value_network: nn.Module | None = None,
        average_gae: bool = False,
        shifted: bool = False,
        differentiable: bool = False,
        skip_existing: bool | None = None,
        vectorized: bool = True,
        time_dim: int | None = None,
        agent_dim: int = -2,
    ) -> None:
        super().__init__(
            gamma=gamma, lmbda=lmbda, value_network=value_network, average_gae=average_gae, shifted=shifted,
            differentiable=differentiable, skip_existing=skip_existing, vectorized=vectorized, time_dim=time_dim,
        )
        self.agent_dim = int(agent_dim)

    # the parent checks rewards and values against each other; here the value decides the shape
    def _reward(self, td: TensorDictBase) -> Tensor:
        key = _next(self.tensor_keys.reward)
        reward = self._fetch(td, key, "reward")
        if reward.ndim < td.ndim + 1 or reward.shape[: td.ndim] != td.batch_size:
            raise ValueError(
                f"MultiAgentGAE: {key!r} has shape {list(reward.shape)} for a batch of size "
                f"{list(td.batch_size)}; expected [*batch, 1] or [*batch, n_agents, 1]"
            )
        return reward

    def _check_value(self, value: Tensor, reward: Tensor, where: Any) -> Tensor:
        if value.shape != reward.shape and not self._lacks_agent_dim(reward, value):
            raise ValueError(
                f"MultiAgentGAE: the value {where!r} has shape {list(value.shape)}; the reward has "
                f"{list(reward.shape)} (the value must be [*batch, n_agents, 1], and the reward either "
                "that shape or without the agent dim)"
            )
        return value

    def _lacks_agent_dim(self, x: Tensor, value: Tensor) -> bool:
        dim = self.agent_dim % value.ndim
        return x.ndim == value.ndim - 1 and x.shape == value.shape[:dim] + value.shape[dim + 1:]

    def _like_value(self, x: Tensor, value: Tensor, name: str) -> Tensor:
        if x.shape == value.shape:
            return x
        if self._lacks_agent_dim(x, value):
            return x.unsqueeze(self.agent_dim % value.ndim).expand(value.shape)
        raise ValueError(
            f"MultiAgentGAE: {name} has shape {list(x.shape)}; expected the value's shape {list(value.shape)} "
            "or that shape without the agent dim (team-level)"
        )

    def _done_terminated(self, td: TensorDictBase, reward: Tensor) -> tuple[Tensor, Tensor]:
        done = self._fetch(td, _next(self.tensor_keys.done), "done")
        terminated = td.get(_next(self.tensor_keys.terminated), done)
        return done, terminated

    def _estimate(self, td: TensorDictBase, reward: Tensor, value: Tensor, next_value: Tensor) -> tuple[Tensor, Tensor]:
        done, terminated = self._done_terminated(td, reward)
        reward = self._like_value(reward, value, repr(_next(self.tensor_keys.reward)))
        done = self._like_value(done, value, repr(_next(self.tensor_keys.done)))
        terminated = self._like_value(terminated, value, repr(_next(self.tensor_keys.terminated)))
        time_dim = (td.ndim - 1 if self.time_dim is None else self.time_dim % td.ndim) - value.ndim
        fn = F.vec_generalized_advantage_estimate if self._use_scan() else F.generalized_advantage_estimate
        advantage, target = fn(self.gamma, self.lmbda, value, next_value, reward, done, terminated, time_dim=time_dim)
        if self.average_gae:
            advantage = normalize_advantage(advantage)
        return advantage, target
