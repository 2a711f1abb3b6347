"""MountainCar and MountainCarContinuous as batched tensor code (Gymnasium dynamics)."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from steersman.data import Bounded, Categorical, Composite, OneHot, Unbounded

from ._base import NativeEnv, fused_step

__all__ = [
    "MountainCarEnv",
    "MountainCarContinuousEnv",
    "MountainCarParams",
    "MountainCarContinuousParams",
    "MountainCarConsts",
    "mountain_car_consts",
    "mountain_car_continuous_consts",
    "mountain_car_dynamics",
    "mountain_car_continuous_dynamics",
    "mountain_car_init",
    "mountain_car_observe",
]


class MountainCarParams(NamedTuple):
    """Constants of ``MountainCar-v0`` (Gymnasium's values).

    Example:
        >>> from steersman.envs.native import MountainCarParams
        >>> MountainCarParams().goal_position
        0.5
    """

    min_position: float = -1.2
    max_position: float = 0.6
    max_speed: float = 0.07
    goal_position: float = 0.5
    goal_velocity: float = 0.0
    force: float = 0.001
    gravity: float = 0.0025
    reset_low: float = -0.6
    reset_high: float = -0.4


class MountainCarContinuousParams(NamedTuple):
    """Constants of ``MountainCarContinuous-v0`` (Gymnasium's values).

    Example:
        >>> from steersman.envs.native import MountainCarContinuousParams
        >>> MountainCarContinuousParams().goal_position
        0.45
    """

    min_action: float = -1.0
    max_action: float = 1.0
    min_position: float = -1.2
    max_position: float = 0.6
    max_speed: float = 0.07
    goal_position: float = 0.45
    goal_velocity: float = 0.0
    power: float = 0.0015
    gravity: float = 0.0025
    reset_low: float = -0.6
    reset_high: float = -0.4


class MountainCarConsts(NamedTuple):
    """Constants used by the MountainCar functions (floats or 0-dim tensors)."""

    force: Any  # discrete: force per action step; continuous: power
    neg_gravity: Any
    gravity: Any
    three: Any
    one: Any
    min_action: Any
    max_action: Any
    max_speed: Any
    neg_max_speed: Any
    min_position: Any
    max_position: Any
    goal_position: Any
    goal_velocity: Any
    zero: Any
    goal_reward: Any
    action_cost: Any
    reset_low: Any
    reset_span: Any


def mountain_car_consts(p: MountainCarParams) -> MountainCarConsts:
    """The constants of :func:`mountain_car_dynamics` (Python floats)."""
    return MountainCarConsts(
        force=p.force, neg_gravity=-p.gravity, gravity=p.gravity, three=3.0, one=1.0,
        min_action=0.0, max_action=0.0, max_speed=p.max_speed, neg_max_speed=-p.max_speed,
        min_position=p.min_position, max_position=p.max_position, goal_position=p.goal_position,
        goal_velocity=p.goal_velocity, zero=0.0, goal_reward=0.0, action_cost=0.0,
        reset_low=p.reset_low, reset_span=p.reset_high - p.reset_low,
    )


def mountain_car_continuous_consts(p: MountainCarContinuousParams) -> MountainCarConsts:
    """The constants of :func:`mountain_car_continuous_dynamics` (Python floats)."""
    return MountainCarConsts(
        force=p.power, neg_gravity=-p.gravity, gravity=p.gravity, three=3.0, one=1.0,
        min_action=p.min_action, max_action=p.max_action, max_speed=p.max_speed,
        neg_max_speed=-p.max_speed, min_position=p.min_position, max_position=p.max_position,
        goal_position=p.goal_position, goal_velocity=p.goal_velocity, zero=0.0,
        goal_reward=100.0, action_cost=0.1,
        reset_low=p.reset_low, reset_span=p.reset_high - p.reset_low,
    )


def _finish(position: Tensor, velocity: Tensor, c: MountainCarConsts) -> tuple[Tensor, Tensor, Tensor]:
    """Clips, stops at the left wall, and checks the goal (shared by both variants)."""
    velocity = torch.clamp(velocity, c.neg_max_speed, c.max_speed)
    position = position + velocity
    position = torch.clamp(position, c.min_position, c.max_position)
    velocity = torch.where((position == c.min_position) & (velocity < c.zero), c.zero, velocity)
    terminated = (position >= c.goal_position) & (velocity >= c.goal_velocity)
    return position, velocity, terminated


def mountain_car_dynamics(state: tuple[Tensor, ...], action: Tensor, c: MountainCarConsts
                          ) -> tuple[tuple[Tensor, ...], Tensor, Tensor]:
    """One step: ``state`` = (position, velocity), each ``[*batch]``; ``action [*batch]`` in {0, 1, 2}.

    Returns ``(next_state, reward [*batch] (-1), terminated [*batch])``; the arithmetic
    follows Gymnasium's ``MountainCarEnv.step``.

    Example:
        >>> import torch
        >>> from steersman.envs.native.mountain_car import (
        ...     MountainCarParams, mountain_car_consts, mountain_car_dynamics)
        >>> c = mountain_car_consts(MountainCarParams())
        >>> s, r, t = mountain_car_dynamics((torch.tensor([-0.5]), torch.tensor([0.0])), torch.tensor([2]), c)
        >>> r, t
        (tensor([-1.]), tensor([False]))
    """
    position, velocity = state
    velocity = velocity + (
        (action.to(position.dtype) - c.one) * c.force + torch.cos(c.three * position) * c.neg_gravity
    )
    position, velocity, terminated = _finish(position, velocity, c)
    reward = torch.full_like(position, -1.0)
    return (position, velocity), reward, terminated


def mountain_car_continuous_dynamics(state: tuple[Tensor, ...], action: Tensor, c: MountainCarConsts
                                     ) -> tuple[tuple[Tensor, ...], Tensor, Tensor]:
    """One step: ``state`` = (position, velocity), ``action [*batch, 1]`` (the force, clipped to [-1, 1]).

    Returns ``(next_state, reward [*batch], terminated [*batch])``: reward 100 at the goal,
    minus ``0.1 * action**2`` (of the unclipped action, as in Gymnasium).
    """
    position, velocity = state
    a = action[..., 0].to(position.dtype)
    force = torch.clamp(a, c.min_action, c.max_action)
    velocity = velocity + (force * c.force - c.gravity * torch.cos(c.three * position))
    position, velocity, terminated = _finish(position, velocity, c)
    reward = torch.where(terminated, c.goal_reward, c.zero) - a.square() * c.action_cost
    return (position, velocity), reward, terminated


def mountain_car_observe(state: Tensor, c: MountainCarConsts) -> Tensor:
    """The observation ``[*batch, 2]``: position and velocity (a view of the state)."""
    return state.permute(*range(1, state.ndim), 0)


def mountain_car_init(u: tuple[Tensor, ...], c: MountainCarConsts) -> tuple[Tensor, ...]:
    """Reset states: ``position ~ U(-0.6, -0.4)`` from ``u[0]``, ``velocity = 0``."""
    return c.reset_low + c.reset_span * u[0], c.zero * u[1]


def _mountain_car_kernel(state: Tensor, steps: Tensor, rng: Tensor, offsets: Tensor, action: Tensor,
                         c: MountainCarConsts, one: Any, max_steps: Any, autoreset: bool,
                         udtype: torch.dtype, int_flags: bool = False):
    return fused_step(mountain_car_dynamics, mountain_car_observe, mountain_car_init, state, steps,
                      rng, offsets, action, c, one, max_steps, autoreset, udtype, int_flags)


def _mountain_car_continuous_kernel(state: Tensor, steps: Tensor, rng: Tensor, offsets: Tensor,
                                    action: Tensor, c: MountainCarConsts, one: Any, max_steps: Any,
                                    autoreset: bool, udtype: torch.dtype,
                     int_flags: bool = False):
    return fused_step(mountain_car_continuous_dynamics, mountain_car_observe, mountain_car_init, state,
                      steps, rng, offsets, action, c, one, max_steps, autoreset, udtype, int_flags)


class _MountainCarBase(NativeEnv):
    state_names = ("position", "velocity")
    _num_uniforms = 2
    _observe = staticmethod(mountain_car_observe)
    _init = staticmethod(mountain_car_init)

    def _affine_reset(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        p = self.params
        return (p.reset_low, 0.0), (p.reset_high, 0.0)

    def _obs_spec(self) -> Composite:
        bs, dev, dt, p = self._batch_size, self._device, self._dtype, self.params
        low = torch.tensor([p.min_position, -p.max_speed], dtype=dt)
        high = torch.tensor([p.max_position, p.max_speed], dtype=dt)
        return Composite(observation=Bounded(low, high, shape=(*bs, 2), device=dev, dtype=dt), shape=bs)


class MountainCarEnv(_MountainCarBase):
    """Batched MountainCar (Gymnasium ``MountainCar-v0``) as tensor code.

    Observation ``"observation" [*batch, 2]``: position in ``[-1.2, 0.6]``, velocity in
    ``[-0.07, 0.07]``. Action ``"action"``: ``Categorical(3)`` of shape ``[*batch]``
    (push left, none, right), or ``OneHot(3)`` with ``categorical_action_encoding=False``.
    Reward -1 per step. ``terminated`` at ``position >= 0.5``; ``truncated`` after
    ``max_episode_steps`` (200). Resets draw ``position ~ U(-0.6, -0.4)``, velocity 0.

    Example:
        >>> import torch
        >>> from steersman.envs import MountainCarEnv
        >>> env = MountainCarEnv(batch_size=[2, 3], seed=0)
        >>> env.rollout(5)["next", "reward"].shape
        torch.Size([2, 3, 5, 1])
    """

    params = MountainCarParams()
    _default_max_episode_steps = 200
    _dynamics = staticmethod(mountain_car_dynamics)
    _kernel = staticmethod(_mountain_car_kernel)
    _derive = staticmethod(mountain_car_consts)

    def __init__(self, batch_size: Any = (), device: Any = None, *,
                 categorical_action_encoding: bool = True, **kwargs: Any) -> None:
        self._want_categorical = categorical_action_encoding
        super().__init__(batch_size, device, **kwargs)

    def _make_specs(self) -> None:
        bs, dev, dt = self._batch_size, self._device, self._dtype
        self.observation_spec = self._obs_spec()
        self._categorical = self._want_categorical
        if self._categorical:
            self.action_spec = Categorical(3, shape=bs, device=dev)
        else:
            self.action_spec = OneHot(3, shape=(*bs, 3), device=dev)
        self.reward_spec = Unbounded(shape=(*bs, 1), device=dev, dtype=dt)


class MountainCarContinuousEnv(_MountainCarBase):
    """Batched continuous MountainCar (Gymnasium ``MountainCarContinuous-v0``).

    Observation as :class:`MountainCarEnv`. Action ``"action" [*batch, 1]``: the force,
    ``Bounded(-1, 1)`` (clipped). Reward 100 at the goal (``position >= 0.45``) minus
    ``0.1 * action**2`` per step. ``truncated`` after ``max_episode_steps`` (999).

    Example:
        >>> from steersman.envs import MountainCarContinuousEnv, check_env_specs
        >>> check_env_specs(MountainCarContinuousEnv(batch_size=[3], seed=0))
    """

    params = MountainCarContinuousParams()
    _default_max_episode_steps = 999
    _dynamics = staticmethod(mountain_car_continuous_dynamics)
    _kernel = staticmethod(_mountain_car_continuous_kernel)
    _derive = staticmethod(mountain_car_continuous_consts)

    def _make_specs(self) -> None:
        bs, dev, dt, p = self._batch_size, self._device, self._dtype, self.params
        self.observation_spec = self._obs_spec()
        self.action_spec = Bounded(p.min_action, p.max_action, shape=(*bs, 1), device=dev, dtype=dt)
        self.reward_spec = Unbounded(shape=(*bs, 1), device=dev, dtype=dt)
