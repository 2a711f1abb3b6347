"""Cooperative navigation: ``n`` agents on a plane, each must reach its own goal."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from ._base import MultiAgentNativeEnv, ma_fused_step

__all__ = ["NavigationEnv", "NavigationConsts", "navigation_dynamics", "navigation_observe",
           "navigation_global_state", "navigation_init"]


class NavigationConsts(NamedTuple):
    """Constants of the navigation functions (see :class:`NavigationEnv`)."""

    n_agents: int
    dt: float
    drag: float
    accel: float
    world: float
    agent_radius: float
    goal_radius: float
    shaping: float
    collision_penalty: float
    final_reward: float
    shared_reward: bool
    others: Tensor  # [n, n - 1]: the other agents of each agent
    rows: Tensor  # [n, 1]: arange(n)


def _pairwise(pos: Tensor, c: Any) -> Tensor:
    """``pos_j - pos_i`` for every agent ``i`` and other agent ``j``: ``[*B, n, n - 1, 2]``."""
    rel = pos.unsqueeze(-3) - pos.unsqueeze(-2)  # [*B, i, j, 2] = pos_j - pos_i
    return rel[..., c.rows, c.others, :]


def navigation_dynamics(state: Tensor, force: Tensor, c: NavigationConsts) -> tuple[Tensor, Tensor, Tensor]:
    """One step. ``state [*B, n, 6]`` = (position, velocity, goal) per agent; ``force [*B, n, 2]``.

    Velocity ``v' = (1 - drag) v + accel dt force``, position ``p' = p + dt v'`` kept in the
    square ``[-world, world]^2`` (the velocity component into a wall is zeroed).
    Reward per agent: ``shaping * (d - d')`` (progress to its goal; with ``shared_reward``
    the mean over the agents) minus ``collision_penalty`` per other agent closer than
    ``2 agent_radius``, plus ``final_reward`` for everyone when every agent is within
    ``goal_radius`` of its goal, which terminates the episode.

    Returns ``(state', reward [*B, n], terminated [*B])``.
    """
    pos, vel, goal = state[..., 0:2], state[..., 2:4], state[..., 4:6]
    vel = vel * (1.0 - c.drag) + force * (c.accel * c.dt)
    raw = pos + vel * c.dt
    npos = raw.clamp(-c.world, c.world)
    vel = torch.where(raw == npos, vel, torch.zeros_like(vel))
    d_old = torch.linalg.vector_norm(goal - pos, dim=-1)
    d_new = torch.linalg.vector_norm(goal - npos, dim=-1)
    progress = c.shaping * (d_old - d_new)
    if c.shared_reward:
        progress = progress.mean(-1, keepdim=True).expand_as(progress)
    if c.n_agents > 1:
        dist = torch.linalg.vector_norm(_pairwise(npos, c), dim=-1)  # [*B, n, n - 1]
        hits = (dist < 2 * c.agent_radius).to(pos.dtype).sum(-1)
    else:
        hits = torch.zeros_like(progress)
    on_goal = (d_new < c.goal_radius).all(-1)
    reward = progress - c.collision_penalty * hits + c.final_reward * on_goal.to(pos.dtype).unsqueeze(-1)
    return torch.cat([npos, vel, goal], -1), reward, on_goal


def navigation_observe(state: Tensor, c: NavigationConsts) -> Tensor:
    """Each agent's observation ``[*B, n, 6 + 2 (n - 1)]``: its position, velocity, the
    vector to its goal, then the vectors to the other agents (in agent order)."""
    pos, vel, goal = state[..., 0:2], state[..., 2:4], state[..., 4:6]
    rel = _pairwise(pos, c).flatten(-2)
    return torch.cat([pos, vel, goal - pos, rel], -1)


def navigation_global_state(state: Tensor, c: NavigationConsts) -> Tensor:
    """The global state ``[*B, 6 n]``: every agent's position, velocity and goal."""
    return state.flatten(-2)


def navigation_init(u: Tensor, c: NavigationConsts) -> Tensor:
    """Reset states from ``4 n`` draws: positions and goals uniform in the square, at rest."""
    n = c.n_agents
    xy = (u * 2.0 - 1.0) * c.world
    pos, goal = xy[..., : 2 * n].unflatten(-1, (n, 2)), xy[..., 2 * n:].unflatten(-1, (n, 2))
    return torch.cat([pos, torch.zeros_like(pos), goal], -1)


def _navigation_kernel(state, steps, rng, offsets, force, c, max_steps, autoreset):
    return ma_fused_step(navigation_dynamics, navigation_observe, navigation_global_state, navigation_init,
                         state, steps, rng, offsets, force, c, max_steps, autoreset)


def _others(n: int) -> tuple[Tensor, Tensor]:
    idx = torch.arange(n)
    others = torch.stack([torch.cat([idx[:i], idx[i + 1:]]) for i in range(n)]) if n > 1 else \
        torch.zeros(1, 0, dtype=torch.int64)
    return others, idx.unsqueeze(-1)


class NavigationEnv(MultiAgentNativeEnv):
    """Cooperative navigation (VMAS-like), batched in torch: ``n`` agents, each with its own goal.

    Agents are discs (radius 0.05) in the square ``[-1, 1]^2``, pushed by a force
    (the action) against drag; positions and goals are drawn uniformly at reset.
    Reward per agent: progress toward its goal (x10; with ``shared_reward`` the team's
    mean progress), ``-1`` per agent it overlaps, ``+1`` for all when every agent is on
    its goal (within 0.1), which terminates the episode; ``truncated`` after ``max_steps``.

    Entries (``n = n_agents``): ``("agents", "observation") [*B, n, 6 + 2 (n - 1)]`` (own
    position, velocity, vector to its goal, vectors to the other agents), root ``"state"
    [*B, 6 n]``, ``("agents", "action") [*B, n, 2]`` in ``[-1, 1]`` (or int64 ``[*B, n]``
    in ``0..4`` with ``categorical_actions``), ``("agents", "reward") [*B, n, 1]``, the done
    flags per agent ``[*B, n, 1]`` and at the root ``[*B, 1]``. ``get_state()`` is the
    tensor ``[*B, n, 6]`` (position, velocity, goal). See :class:`MultiAgentNativeEnv` for
    the arguments.

    Example:
        >>> import torch
        >>> from steersman.envs import NavigationEnv, check_env_specs
        >>> env = NavigationEnv(num_envs=8, n_agents=3, max_steps=20, seed=0)
        >>> env.group_map
        {'agents': ['agent_0', 'agent_1', 'agent_2']}
        >>> check_env_specs(env)
        >>> ro = env.rollout(25, break_when_any_done=False)   # finished sub-envs auto-reset
        >>> ro["agents", "observation"].shape, ro["agents", "action"].shape, ro["state"].shape
        (torch.Size([8, 25, 3, 10]), torch.Size([8, 25, 3, 2]), torch.Size([8, 25, 18]))
        >>> ro["next", "agents", "reward"].shape, ro["next", "done"].shape
        (torch.Size([8, 25, 3, 1]), torch.Size([8, 25, 1]))
        >>> env.done_keys
        ['done', 'terminated', 'truncated', ('agents', 'done'), ('agents', 'terminated'), ('agents', 'truncated')]
    """

    _dynamics = staticmethod(navigation_dynamics)
    _observe = staticmethod(navigation_observe)
    _global_state = staticmethod(navigation_global_state)
    _init = staticmethod(navigation_init)
    _kernel = staticmethod(_navigation_kernel)

    def _make_consts(self) -> NavigationConsts:
        others, rows = _others(self.n_agents)
        return NavigationConsts(
            n_agents=self.n_agents, dt=0.1, drag=0.25, accel=2.0, world=1.0, agent_radius=0.05,
            goal_radius=0.1, shaping=10.0, collision_penalty=1.0, final_reward=1.0,
            shared_reward=self.shared_reward, others=others.to(self._device), rows=rows.to(self._device),
        )

    def _num_uniforms(self) -> int:
        return 4 * self.n_agents

    def _obs_dim(self) -> int:
        return 6 + 2 * (self.n_agents - 1)

    def _state_dim(self) -> int:
        return 6 * self.n_agents

    def _obs_high(self) -> Tensor:
        c = self._c
        vmax = 1.01 * c.accel * c.dt / c.drag  # |v| <= accel dt / drag for forces in [-1, 1]
        n = self.n_agents
        return torch.tensor([c.world] * 2 + [vmax] * 2 + [2 * c.world] * (2 + 2 * (n - 1)))
