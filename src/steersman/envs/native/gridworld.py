"""A deterministic grid world with discrete observations (for tests and tabular methods)."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from steersman.data import Categorical, Composite, OneHot, Unbounded

from ._base import NativeEnv, fused_step

__all__ = ["GridWorldEnv", "GridWorldParams", "gridworld_dynamics", "gridworld_init", "gridworld_observe"]


class GridWorldParams(NamedTuple):
    """A ``size x size`` grid; the goal is the bottom-right cell.

    Example:
        >>> from steersman.envs import GridWorldEnv
        >>> from steersman.envs.native import GridWorldParams
        >>> env = GridWorldEnv(params=GridWorldParams(size=4, step_reward=-0.1), batch_size=[2])
        >>> env.observation_spec["observation"].n
        16
    """

    size: int = 5
    goal_reward: float = 1.0
    step_reward: float = 0.0


class GridWorldConsts(NamedTuple):
    """Constants used by the grid-world functions (see :func:`gridworld_consts`)."""

    size: int
    cells: int
    goal: int
    goal_reward: Any
    step_reward: Any
    start_cells: Any  # float: number of start cells (every cell but the goal)
    dtype: torch.dtype = torch.float32  # of the rewards


def gridworld_consts(p: GridWorldParams) -> GridWorldConsts:
    """The constants of :func:`gridworld_dynamics` for the parameters ``p``."""
    if p.size < 2:
        raise ValueError(f"GridWorldParams.size must be >= 2, got {p.size}")
    cells = p.size * p.size
    return GridWorldConsts(p.size, cells, cells - 1, float(p.goal_reward), float(p.step_reward),
                           float(cells - 1))


def gridworld_dynamics(state: tuple[Tensor, ...], action: Tensor, c: GridWorldConsts
                       ) -> tuple[tuple[Tensor, ...], Tensor, Tensor]:
    """One move: ``state`` = (cell,), the cell index ``[*batch]`` (int64); ``action [*batch]`` in
    {0: up, 1: right, 2: down, 3: left}; moves into a wall leave the agent in place.

    Returns ``(next_state, reward [*batch], terminated [*batch])``: the goal reward
    (and termination) on reaching the bottom-right cell, the step reward otherwise.

    Example:
        >>> import torch
        >>> from steersman.envs.native.gridworld import GridWorldParams, gridworld_consts, gridworld_dynamics
        >>> c = gridworld_consts(GridWorldParams(size=3))
        >>> s, r, t = gridworld_dynamics((torch.tensor([0, 5, 7]),), torch.tensor([0, 2, 1]), c)
        >>> s[0].tolist(), r.tolist(), t.tolist()
        ([0, 8, 8], [0.0, 1.0, 1.0], [False, True, True])
    """
    cell = state[0]
    row = torch.div(cell, c.size, rounding_mode="floor")
    col = cell - row * c.size
    a = action.to(cell.dtype)
    drow = (a == 2).to(cell.dtype) - (a == 0).to(cell.dtype)
    dcol = (a == 1).to(cell.dtype) - (a == 3).to(cell.dtype)
    row = torch.clamp(row + drow, 0, c.size - 1)
    col = torch.clamp(col + dcol, 0, c.size - 1)
    ncell = row * c.size + col
    terminated = ncell == c.goal
    reward = torch.where(terminated, c.goal_reward, c.step_reward).to(c.dtype)
    return (ncell,), reward, terminated


def gridworld_observe(state: Tensor, c: GridWorldConsts) -> Tensor:
    """The observation ``[*batch]``: the cell index (row-major)."""
    return state[0]


def gridworld_init(u: tuple[Tensor, ...], c: GridWorldConsts) -> tuple[Tensor, ...]:
    """Start cells from one uniform draw: uniform over every cell but the goal."""
    return ((u[0] * c.start_cells).to(torch.int64),)


def _gridworld_kernel(state: Tensor, steps: Tensor, rng: Tensor, offsets: Tensor, action: Tensor,
                      c: GridWorldConsts, one: Any, max_steps: Any, autoreset: bool, udtype: torch.dtype,
                     int_flags: bool = False):
    return fused_step(gridworld_dynamics, gridworld_observe, gridworld_init, state, steps, rng, offsets,
                      action, c, one, max_steps, autoreset, udtype, int_flags)


class GridWorldEnv(NativeEnv):
    """A ``size x size`` grid world with discrete observations, batched.

    Observation ``"observation"``: ``Categorical(size**2)`` of shape ``[*batch]``, the
    agent's cell (row-major). Action ``"action"``: ``Categorical(4)`` of shape
    ``[*batch]`` (up, right, down, left; moves into walls do nothing), or ``OneHot(4)``
    with ``categorical_action_encoding=False``. Reward ``goal_reward`` (1) on reaching
    the bottom-right cell (``terminated``), ``step_reward`` (0) otherwise; ``truncated``
    after ``max_episode_steps`` (100). Resets put the agent on a uniformly drawn
    non-goal cell. Rewards have the env's ``dtype``.

    Args:
        size: the grid side (default 5).
        batch_size, device, dtype, max_episode_steps, seed, compile, params: see
            :class:`~steersman.envs.native.NativeEnv`.

    Example:
        >>> import torch
        >>> from steersman import TensorDict
        >>> from steersman.envs import GridWorldEnv
        >>> env = GridWorldEnv(size=3, batch_size=[2], seed=0)
        >>> env.set_state({"cell": torch.tensor([5, 0])})       # the state lives in the env
        >>> td = TensorDict({"action": torch.tensor([2, 1])}, batch_size=[2])  # down, right
        >>> out = env.step(td)["next"]
        >>> out["observation"], out["reward"].squeeze(-1), out["terminated"].squeeze(-1)
        (tensor([8, 1]), tensor([1., 0.]), tensor([ True, False]))
    """

    state_names = ("cell",)
    params = GridWorldParams()
    _num_uniforms = 1
    _default_max_episode_steps = 100
    _state_dtype = torch.int64
    _dynamics = staticmethod(gridworld_dynamics)
    _observe = staticmethod(gridworld_observe)
    _init = staticmethod(gridworld_init)
    _kernel = staticmethod(_gridworld_kernel)
    _derive = staticmethod(gridworld_consts)

    def __init__(self, size: int | None = None, batch_size: Any = (), device: Any = None, *,
                 categorical_action_encoding: bool = True, **kwargs: Any) -> None:
        self._want_categorical = categorical_action_encoding
        if size is not None:
            if kwargs.get("params") is not None:
                raise TypeError("GridWorldEnv: pass either size or params, not both")
            kwargs["params"] = GridWorldParams(size=size)
        super().__init__(batch_size, device, **kwargs)

    def _make_consts(self) -> GridWorldConsts:
        return gridworld_consts(self.params)._replace(dtype=self._dtype)

    def _make_specs(self) -> None:
        bs, dev, dt = self._batch_size, self._device, self._dtype
        n = self.params.size
        self.observation_spec = Composite(observation=Categorical(n * n, shape=bs, device=dev), shape=bs)
        self._categorical = self._want_categorical
        if self._categorical:
            self.action_spec = Categorical(4, shape=bs, device=dev)
        else:
            self.action_spec = OneHot(4, shape=(*bs, 4), device=dev)
        self.reward_spec = Unbounded(shape=(*bs, 1), device=dev, dtype=dt)
