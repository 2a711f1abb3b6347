"""Predator-prey: ``n`` cooperating predators (the agents) chase scripted, faster prey."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from ._base import MultiAgentNativeEnv, ma_fused_step
from .navigation import _others, _pairwise

__all__ = ["PredatorPreyEnv", "PredatorPreyConsts", "predator_prey_dynamics", "predator_prey_observe",
           "predator_prey_global_state", "predator_prey_init"]


class PredatorPreyConsts(NamedTuple):
    """Constants of the predator-prey functions (see :class:`PredatorPreyEnv`)."""

    n_agents: int
    n_prey: int
    dt: float
    drag: float
    accel: float
    prey_accel: float
    world: float
    capture_radius: float
    capture_reward: float
    shaping: float
    wall_margin: float
    shared_reward: bool
    others: Tensor
    rows: Tensor


def _move(pos: Tensor, vel: Tensor, force: Tensor, accel: float, c: Any) -> tuple[Tensor, Tensor]:
    vel = vel * (1.0 - c.drag) + force * (accel * c.dt)
    raw = pos + vel * c.dt
    npos = raw.clamp(-c.world, c.world)
    return npos, torch.where(raw == npos, vel, torch.zeros_like(vel))


def _prey_force(pred: Tensor, prey: Tensor, c: Any) -> Tensor:
    """The scripted prey's force ``[*B, m, 2]``: away from the predators (weighted by
    1 / distance^2), pushed back from the walls, of norm at most 1."""
    rel = prey.unsqueeze(-3) - pred.unsqueeze(-2)  # [*B, n, m, 2]: prey_k - pred_i
    flee = (rel / (rel.square().sum(-1, keepdim=True) + 1e-3)).sum(-3)
    flee = flee / (torch.linalg.vector_norm(flee, dim=-1, keepdim=True) + 1e-6)
    wall = -torch.sign(prey) * torch.relu(prey.abs() - c.wall_margin) * (1.0 / (c.world - c.wall_margin))
    f = flee + 2.0 * wall
    return f / torch.linalg.vector_norm(f, dim=-1, keepdim=True).clamp_min(1.0)


def predator_prey_dynamics(state: Tensor, force: Tensor, c: PredatorPreyConsts
                           ) -> tuple[Tensor, Tensor, Tensor]:
    """One step. ``state [*B, n + m, 4]`` = (position, velocity) of the ``n`` predators then
    the ``m`` prey; ``force [*B, n, 2]`` (the predators' actions).

    Every body moves as in navigation (drag, walls); the prey are faster and flee (see
    ``_prey_force``). Reward per predator: ``capture_reward`` per prey it touches
    (distance < ``capture_radius``) minus ``shaping`` times its distance to the nearest
    prey; with ``shared_reward`` every predator gets the mean over the predators. Never
    terminates. Returns ``(state', reward [*B, n], terminated [*B])``.
    """
    n = c.n_agents
    pred, prey = state[..., :n, :], state[..., n:, :]
    npred, pvel = _move(pred[..., 0:2], pred[..., 2:4], force, c.accel, c)
    pf = _prey_force(pred[..., 0:2], prey[..., 0:2], c)
    nprey, qvel = _move(prey[..., 0:2], prey[..., 2:4], pf, c.prey_accel, c)
    dist = torch.linalg.vector_norm(nprey.unsqueeze(-3) - npred.unsqueeze(-2), dim=-1)  # [*B, n, m]
    caught = (dist < c.capture_radius).to(state.dtype).sum(-1)
    reward = c.capture_reward * caught - c.shaping * dist.amin(-1)
    if c.shared_reward:
        reward = reward.mean(-1, keepdim=True).expand_as(reward)
    nstate = torch.cat([torch.cat([npred, pvel], -1), torch.cat([nprey, qvel], -1)], -2)
    return nstate, reward, torch.zeros(reward.shape[:-1], dtype=torch.bool, device=reward.device)


def predator_prey_observe(state: Tensor, c: PredatorPreyConsts) -> Tensor:
    """Each predator's observation ``[*B, n, 4 + 2 (n - 1) + 4 m]``: its position and
    velocity, the vectors to the other predators, then each prey's relative position and
    velocity."""
    n, m = c.n_agents, c.n_prey
    pos, vel = state[..., :n, 0:2], state[..., :n, 2:4]
    prey_pos, prey_vel = state[..., n:, 0:2], state[..., n:, 2:4]
    rel = _pairwise(pos, c).flatten(-2)
    to_prey = (prey_pos.unsqueeze(-3) - pos.unsqueeze(-2)).flatten(-2)  # [*B, n, 2 m]
    pv = prey_vel.flatten(-2).unsqueeze(-2).expand(*pos.shape[:-1], 2 * m)
    return torch.cat([pos, vel, rel, to_prey, pv], -1)


def predator_prey_global_state(state: Tensor, c: PredatorPreyConsts) -> Tensor:
    """The global state ``[*B, 4 (n + m)]``: positions and velocities of all bodies."""
    return state.flatten(-2)


def predator_prey_init(u: Tensor, c: PredatorPreyConsts) -> Tensor:
    """Reset states from ``2 (n + m)`` draws: positions uniform in the square, at rest."""
    pos = ((u * 2.0 - 1.0) * c.world).unflatten(-1, (c.n_agents + c.n_prey, 2))
    return torch.cat([pos, torch.zeros_like(pos)], -1)


def _predator_prey_kernel(state, steps, rng, offsets, force, c, max_steps, autoreset):
    return ma_fused_step(predator_prey_dynamics, predator_prey_observe, predator_prey_global_state,
                         predator_prey_init, state, steps, rng, offsets, force, c, max_steps, autoreset)


class PredatorPreyEnv(MultiAgentNativeEnv):
    """Predator-prey (VMAS/MPE ``simple_tag``-like), batched in torch: ``n_agents`` predators
    must catch ``n_prey`` faster prey that flee by a fixed rule.

    Bodies move in the square ``[-1, 1]^2`` under a force and drag (predators: the action;
    prey: 1.3x the acceleration, fleeing the predators and the walls). Reward per
    predator: ``+10`` per prey it touches, minus ``0.1`` times its distance to the nearest
    prey (the team's mean with ``shared_reward``); never terminates, ``truncated`` after
    ``max_steps``.

    Entries (``n = n_agents``, ``m = n_prey``): ``("agents", "observation")
    [*B, n, 4 + 2 (n - 1) + 4 m]``, root ``"state" [*B, 4 (n + m)]``, actions, rewards and
    flags as in :class:`NavigationEnv` (see :class:`MultiAgentNativeEnv`). ``get_state()``
    is ``[*B, n + m, 4]`` (position, velocity; predators first).

    Args:
        n_prey: the number of prey (default 1); others: see :class:`MultiAgentNativeEnv`.

    Example:
        >>> from steersman.envs import PredatorPreyEnv, check_env_specs
        >>> env = PredatorPreyEnv(num_envs=4, n_agents=3, n_prey=1, categorical_actions=True, seed=0)
        >>> check_env_specs(env)
        >>> ro = env.rollout(10)
        >>> ro["agents", "observation"].shape, ro["agents", "action"].shape, ro["state"].shape
        (torch.Size([4, 10, 3, 12]), torch.Size([4, 10, 3]), torch.Size([4, 10, 16]))
    """

    _dynamics = staticmethod(predator_prey_dynamics)
    _observe = staticmethod(predator_prey_observe)
    _global_state = staticmethod(predator_prey_global_state)
    _init = staticmethod(predator_prey_init)
    _kernel = staticmethod(_predator_prey_kernel)

    def __init__(self, num_envs: int | None = None, *, n_prey: int = 1, **kwargs: Any) -> None:
        if isinstance(n_prey, bool) or not isinstance(n_prey, int) or n_prey < 1:
            raise ValueError(f"PredatorPreyEnv: n_prey must be a positive int, got {n_prey!r}")
        self.n_prey = n_prey
        super().__init__(num_envs, **kwargs)

    def _make_consts(self) -> PredatorPreyConsts:
        others, rows = _others(self.n_agents)
        return PredatorPreyConsts(
            n_agents=self.n_agents, n_prey=self.n_prey, dt=0.1, drag=0.25, accel=2.0, prey_accel=2.6,
            world=1.0, capture_radius=0.15, capture_reward=10.0, shaping=0.1, wall_margin=0.8,
            shared_reward=self.shared_reward, others=others.to(self._device), rows=rows.to(self._device),
        )

    def _num_uniforms(self) -> int:
        return 2 * (self.n_agents + self.n_prey)

    def _obs_dim(self) -> int:
        return 4 + 2 * (self.n_agents - 1) + 4 * self.n_prey

    def _state_dim(self) -> int:
        return 4 * (self.n_agents + self.n_prey)

    def _obs_high(self) -> Tensor:
        c = self._c
        vmax, prey_vmax = (1.01 * a * c.dt / c.drag for a in (c.accel, c.prey_accel))
        n, m = self.n_agents, self.n_prey
        return torch.tensor([c.world] * 2 + [vmax] * 2 + [2 * c.world] * (2 * (n - 1) + 2 * m)
                            + [prey_vmax] * (2 * m))
