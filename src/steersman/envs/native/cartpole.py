"""CartPole as batched tensor code, with Gymnasium's ``CartPole-v1`` dynamics."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import Tensor

from steersman.data import Bounded, Categorical, Composite, OneHot, Unbounded

from ._base import NativeEnv, fused_step

__all__ = [
    "CartPoleEnv",
    "CartPoleParams",
    "CartPoleConsts",
    "cartpole_consts",
    "cartpole_dynamics",
    "cartpole_init",
    "cartpole_observe",
]


class CartPoleParams(NamedTuple):
    """Physical constants of CartPole (Gymnasium's values).

    Example:
        >>> from steersman.envs import CartPoleEnv
        >>> from steersman.envs.native import CartPoleParams
        >>> env = CartPoleEnv(batch_size=[2], params=CartPoleParams(gravity=3.7))  # on Mars
        >>> env.params.gravity, CartPoleParams().force_mag
        (3.7, 10.0)
    """

    gravity: float = 9.8
    masscart: float = 1.0
    masspole: float = 0.1
    length: float = 0.5  # half the pole's length
    force_mag: float = 10.0
    tau: float = 0.02  # seconds between state updates
    theta_threshold_radians: float = 12 * 2 * math.pi / 360
    x_threshold: float = 2.4
    reset_low: float = -0.05
    reset_high: float = 0.05
    euler: bool = True  # False: semi-implicit Euler
    sutton_barto_reward: bool = False


class CartPoleConsts(NamedTuple):
    """The constants used by the CartPole functions (derived from :class:`CartPoleParams`).

    Floats may be Python floats or 0-dim tensors (the env uses tensors in eager mode).
    """

    two_force_mag: Any
    force_mag: Any
    polemass_length: Any
    total_mass: Any
    gravity: Any
    length: Any
    four_thirds: Any
    masspole: Any
    tau: Any
    x_threshold: Any
    neg_x_threshold: Any
    theta_threshold: Any
    neg_theta_threshold: Any
    reset_low: Any
    reset_span: Any
    euler: bool
    sutton_barto_reward: bool


def cartpole_consts(p: CartPoleParams) -> CartPoleConsts:
    """The constants of :func:`cartpole_dynamics` for the parameters ``p`` (Python floats)."""
    return CartPoleConsts(
        two_force_mag=2.0 * p.force_mag,
        force_mag=p.force_mag,
        polemass_length=p.masspole * p.length,
        total_mass=p.masspole + p.masscart,
        gravity=p.gravity,
        length=p.length,
        four_thirds=4.0 / 3.0,
        masspole=p.masspole,
        tau=p.tau,
        x_threshold=p.x_threshold,
        neg_x_threshold=-p.x_threshold,
        theta_threshold=p.theta_threshold_radians,
        neg_theta_threshold=-p.theta_threshold_radians,
        reset_low=p.reset_low,
        reset_span=p.reset_high - p.reset_low,
        euler=p.euler,
        sutton_barto_reward=p.sutton_barto_reward,
    )


def cartpole_dynamics(state: tuple[Tensor, ...], action: Tensor, c: CartPoleConsts
                      ) -> tuple[tuple[Tensor, ...], Tensor, Tensor]:
    """One step: ``state`` = (x, x_dot, theta, theta_dot), each ``[*batch]``; ``action
    [*batch]`` in {0, 1}.

    Returns ``(next_state, reward [*batch], terminated [*batch] bool)``.
    The arithmetic follows Gymnasium's ``CartPoleEnv.step`` operation by operation.

    Example:
        >>> import torch
        >>> from steersman.envs.native.cartpole import CartPoleParams, cartpole_consts, cartpole_dynamics
        >>> c = cartpole_consts(CartPoleParams())
        >>> s, r, t = cartpole_dynamics(torch.zeros(4, 3), torch.tensor([0, 1, 1]), c)
        >>> s[1]    # cart velocity after one push left / right
        tensor([-0.1951,  0.1951,  0.1951])
    """
    x, x_dot, theta, theta_dot = state
    force = action.to(x.dtype) * c.two_force_mag - c.force_mag
    costheta = torch.cos(theta)
    sintheta = torch.sin(theta)
    temp = (force + c.polemass_length * theta_dot.square() * sintheta) / c.total_mass
    thetaacc = (c.gravity * sintheta - costheta * temp) / (
        c.length * (c.four_thirds - c.masspole * costheta.square() / c.total_mass)
    )
    xacc = temp - c.polemass_length * thetaacc * costheta / c.total_mass
    if c.euler:
        x = x + c.tau * x_dot
        x_dot = x_dot + c.tau * xacc
        theta = theta + c.tau * theta_dot
        theta_dot = theta_dot + c.tau * thetaacc
    else:
        x_dot = x_dot + c.tau * xacc
        x = x + c.tau * x_dot
        theta_dot = theta_dot + c.tau * thetaacc
        theta = theta + c.tau * theta_dot
    terminated = (
        (x < c.neg_x_threshold)
        | (x > c.x_threshold)
        | (theta < c.neg_theta_threshold)
        | (theta > c.theta_threshold)
    )
    if c.sutton_barto_reward:
        reward = -terminated.to(x.dtype)
    else:
        reward = torch.ones_like(x)
    return (x, x_dot, theta, theta_dot), reward, terminated


def cartpole_observe(state: Tensor, c: CartPoleConsts) -> Tensor:
    """The observation ``[*batch, 4]``: the state itself (a view)."""
    return state.permute(*range(1, state.ndim), 0)


def cartpole_init(u: tuple[Tensor, ...], c: CartPoleConsts) -> tuple[Tensor, ...]:
    """Reset states from 4 uniform draws: each component in ``[reset_low, reset_high)``."""
    return tuple(c.reset_low + c.reset_span * v for v in u)


def _cartpole_kernel(state: Tensor, steps: Tensor, rng: Tensor, offsets: Tensor, action: Tensor,
                     c: CartPoleConsts, one: Any, max_steps: Any, autoreset: bool, udtype: torch.dtype,
                     int_flags: bool = False):
    return fused_step(cartpole_dynamics, cartpole_observe, cartpole_init, state, steps, rng, offsets,
                      action, c, one, max_steps, autoreset, udtype, int_flags)


class CartPoleEnv(NativeEnv):
    """Batched CartPole (Gymnasium ``CartPole-v1``) as tensor code.

    Observation ``"observation" [*batch, 4]``: cart position, cart velocity, pole angle,
    pole angular velocity (bounds ``±[4.8, inf, 0.419, inf]``). Action ``"action"``:
    ``Categorical(2)`` of shape ``[*batch]`` (0 pushes left, 1 right), or ``OneHot(2)``
    of shape ``[*batch, 2]`` with ``categorical_action_encoding=False``. Reward 1 per
    step (``[*batch, 1]``). ``terminated`` when ``|x| > 2.4`` or ``|theta| > 12°``;
    ``truncated`` after ``max_episode_steps`` (500) steps. Resets draw every state
    component uniformly in ``[-0.05, 0.05)``.

    Args:
        batch_size, device, dtype, max_episode_steps, seed, compile, params: see
            :class:`~steersman.envs.native.NativeEnv`.
        categorical_action_encoding: ``Categorical`` (default) or ``OneHot`` actions.

    Example:
        >>> import torch
        >>> from steersman.envs import CartPoleEnv
        >>> env = CartPoleEnv(batch_size=[8], seed=0)
        >>> td = env.reset()
        >>> td["observation"].shape, td["done"].shape
        (torch.Size([8, 4]), torch.Size([8, 1]))
        >>> td["action"] = torch.ones(8, dtype=torch.int64)
        >>> td, td_next = env.step_and_maybe_reset(td)   # finished sub-envs are reset
        >>> td["next", "reward"].shape
        torch.Size([8, 1])
        >>> env.rollout(1000, break_when_any_done=False).batch_size
        torch.Size([8, 1000])
    """

    state_names = ("x", "x_dot", "theta", "theta_dot")
    params = CartPoleParams()
    _num_uniforms = 4
    _default_max_episode_steps = 500
    _dynamics = staticmethod(cartpole_dynamics)
    _observe = staticmethod(cartpole_observe)
    _init = staticmethod(cartpole_init)
    _kernel = staticmethod(_cartpole_kernel)
    _derive = staticmethod(cartpole_consts)

    def __init__(self, batch_size: Any = (), device: Any = None, *,
                 categorical_action_encoding: bool = True, **kwargs: Any) -> None:
        self._want_categorical = categorical_action_encoding
        super().__init__(batch_size, device, **kwargs)

    def _affine_reset(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        p = self.params
        return (p.reset_low,) * 4, (p.reset_high,) * 4

    def _make_specs(self) -> None:
        bs, dev, dt, p = self._batch_size, self._device, self._dtype, self.params
        high = torch.tensor(
            [p.x_threshold * 2, math.inf, p.theta_threshold_radians * 2, math.inf], dtype=dt
        )
        self.observation_spec = Composite(
            observation=Bounded(-high, high, shape=(*bs, 4), device=dev, dtype=dt), shape=bs
        )
        self._categorical = self._want_categorical
        if self._categorical:
            self.action_spec = Categorical(2, shape=bs, device=dev)
        else:
            self.action_spec = OneHot(2, shape=(*bs, 2), device=dev)
        self.reward_spec = Unbounded(shape=(*bs, 1), device=dev, dtype=dt)
