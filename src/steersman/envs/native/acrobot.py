"""Acrobot as batched tensor code, with Gymnasium's ``Acrobot-v1`` dynamics (RK4, "book")."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import Tensor

from steersman.data import Bounded, Categorical, Composite, OneHot, Unbounded

from ._base import NativeEnv, fused_step

__all__ = [
    "AcrobotEnv",
    "AcrobotParams",
    "AcrobotConsts",
    "acrobot_consts",
    "acrobot_dynamics",
    "acrobot_init",
    "acrobot_observe",
]


class AcrobotParams(NamedTuple):
    """Constants of ``Acrobot-v1`` (Gymnasium's values; ``book`` dynamics, no torque noise).

    Example:
        >>> from steersman.envs.native import AcrobotParams
        >>> AcrobotParams().dt
        0.2
    """

    dt: float = 0.2
    link_length_1: float = 1.0
    link_mass_1: float = 1.0
    link_mass_2: float = 1.0
    link_com_pos_1: float = 0.5
    link_com_pos_2: float = 0.5
    link_moi: float = 1.0
    max_vel_1: float = 4 * math.pi
    max_vel_2: float = 9 * math.pi
    reset_low: float = -0.1
    reset_high: float = 0.1


class AcrobotConsts(NamedTuple):
    """Constants used by the Acrobot functions (floats or 0-dim tensors)."""

    d1_const: Any  # m1 * lc1**2 + m2 * (l1**2 + lc2**2 ...) pieces, see acrobot_consts
    l1sq_lc2sq: Any
    two_l1_lc2: Any
    m2: Any
    i1: Any
    i2: Any
    lc2sq: Any
    l1_lc2: Any
    m2_lc2_g: Any
    half_pi: Any
    neg_m2_l1_lc2: Any
    two_m2_l1_lc2: Any
    m1lc1_m2l1_g: Any
    m2_l1_lc2: Any
    m2_lc2sq_i2: Any
    dt: Any
    dt2: Any
    dt6: Any
    two: Any
    pi: Any
    two_pi: Any
    neg_pi: Any
    max_vel_1: Any
    neg_max_vel_1: Any
    max_vel_2: Any
    neg_max_vel_2: Any
    one: Any
    reset_low: Any
    reset_span: Any


def acrobot_consts(p: AcrobotParams) -> AcrobotConsts:
    """The constants of :func:`acrobot_dynamics`, grouped as Gymnasium's Python code
    evaluates them (so that float64 results match it to the last digit)."""
    m1, m2 = p.link_mass_1, p.link_mass_2
    l1, lc1, lc2 = p.link_length_1, p.link_com_pos_1, p.link_com_pos_2
    i1 = i2 = p.link_moi
    g = 9.8
    dt = p.dt - 0.0  # t = [0, dt]: dt = t[1] - t[0]
    return AcrobotConsts(
        d1_const=m1 * lc1**2,
        l1sq_lc2sq=l1**2 + lc2**2,
        two_l1_lc2=2 * l1 * lc2,
        m2=m2,
        i1=i1,
        i2=i2,
        lc2sq=lc2**2,
        l1_lc2=l1 * lc2,
        m2_lc2_g=m2 * lc2 * g,
        half_pi=math.pi / 2.0,
        neg_m2_l1_lc2=-m2 * l1 * lc2,
        two_m2_l1_lc2=2 * m2 * l1 * lc2,
        m1lc1_m2l1_g=(m1 * lc1 + m2 * l1) * g,
        m2_l1_lc2=m2 * l1 * lc2,
        m2_lc2sq_i2=m2 * lc2**2 + i2,
        dt=dt,
        dt2=dt / 2.0,
        dt6=dt / 6.0,
        two=2.0,
        pi=math.pi,
        two_pi=2 * math.pi,
        neg_pi=-math.pi,
        max_vel_1=p.max_vel_1,
        neg_max_vel_1=-p.max_vel_1,
        max_vel_2=p.max_vel_2,
        neg_max_vel_2=-p.max_vel_2,
        one=1.0,
        reset_low=p.reset_low,
        reset_span=p.reset_high - p.reset_low,
    )


def _dsdt(theta1: Tensor, theta2: Tensor, dtheta1: Tensor, dtheta2: Tensor, a: Tensor,
          c: AcrobotConsts) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gymnasium's ``AcrobotEnv._dsdt`` ("book" dynamics), operation by operation."""
    cos2 = torch.cos(theta2)
    sin2 = torch.sin(theta2)
    d1 = c.d1_const + c.m2 * (c.l1sq_lc2sq + c.two_l1_lc2 * cos2) + c.i1 + c.i2
    d2 = c.m2 * (c.lc2sq + c.l1_lc2 * cos2) + c.i2
    phi2 = c.m2_lc2_g * torch.cos(theta1 + theta2 - c.half_pi)
    phi1 = (
        c.neg_m2_l1_lc2 * dtheta2.square() * sin2
        - c.two_m2_l1_lc2 * dtheta2 * dtheta1 * sin2
        + c.m1lc1_m2l1_g * torch.cos(theta1 - c.half_pi)
        + phi2
    )
    ddtheta2 = (a + d2 / d1 * phi1 - c.m2_l1_lc2 * dtheta1.square() * sin2 - phi2) / (
        c.m2_lc2sq_i2 - d2.square() / d1
    )
    ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
    return dtheta1, dtheta2, ddtheta1, ddtheta2


def _wrap(x: Tensor, low: Any, high: Any, span: Any) -> Tensor:
    """Gymnasium's ``wrap`` (repeated ``± span`` until in ``[low, high]``), loop-free."""
    x = torch.where(x > high, x - span * torch.ceil((x - high) / span), x)
    return torch.where(x < low, x + span * torch.ceil((low - x) / span), x)


def acrobot_dynamics(state: tuple[Tensor, ...], action: Tensor, c: AcrobotConsts
                     ) -> tuple[tuple[Tensor, ...], Tensor, Tensor]:
    """One step: ``state`` = (theta1, theta2, dtheta1, dtheta2), each ``[*batch]``; ``action [*batch]``
    in {0, 1, 2} (torque -1, 0, +1). One RK4 step of ``dt`` then angle wrapping and
    velocity bounds, as Gymnasium's ``AcrobotEnv.step``.

    Returns ``(next_state, reward [*batch] (-1, or 0 when terminated), terminated)``.

    Example:
        >>> import torch
        >>> from steersman.envs.native.acrobot import AcrobotParams, acrobot_consts, acrobot_dynamics
        >>> s, r, t = acrobot_dynamics(torch.zeros(4, 2).unbind(0), torch.tensor([0, 2]),
        ...                            acrobot_consts(AcrobotParams()))
        >>> len(s), r, t
        (4, tensor([-1., -1.]), tensor([False, False]))
    """
    y = tuple(state)
    a = action.to(y[0].dtype) - c.one
    k1 = _dsdt(*y, a, c)
    k2 = _dsdt(*(yi + c.dt2 * ki for yi, ki in zip(y, k1)), a, c)
    k3 = _dsdt(*(yi + c.dt2 * ki for yi, ki in zip(y, k2)), a, c)
    k4 = _dsdt(*(yi + c.dt * ki for yi, ki in zip(y, k3)), a, c)
    ns = [
        yi + c.dt6 * (k1i + c.two * k2i + c.two * k3i + k4i)
        for yi, k1i, k2i, k3i, k4i in zip(y, k1, k2, k3, k4)
    ]
    theta1 = _wrap(ns[0], c.neg_pi, c.pi, c.two_pi)
    theta2 = _wrap(ns[1], c.neg_pi, c.pi, c.two_pi)
    dtheta1 = torch.clamp(ns[2], c.neg_max_vel_1, c.max_vel_1)
    dtheta2 = torch.clamp(ns[3], c.neg_max_vel_2, c.max_vel_2)
    terminated = -torch.cos(theta1) - torch.cos(theta2 + theta1) > c.one
    reward = terminated.to(y[0].dtype) - c.one
    return (theta1, theta2, dtheta1, dtheta2), reward, terminated


def acrobot_observe(state: Tensor, c: AcrobotConsts) -> Tensor:
    """The observation ``[*batch, 6]``: ``cos/sin(theta1), cos/sin(theta2), dtheta1, dtheta2``."""
    t1, t2, d1, d2 = state.unbind(0)
    obs = torch.stack([torch.cos(t1), torch.sin(t1), torch.cos(t2), torch.sin(t2), d1, d2])
    return obs.permute(*range(1, obs.ndim), 0)


def acrobot_init(u: tuple[Tensor, ...], c: AcrobotConsts) -> tuple[Tensor, ...]:
    """Reset states from 4 uniform draws: every component in ``[-0.1, 0.1)``."""
    return tuple(c.reset_low + c.reset_span * v for v in u)


def _acrobot_kernel(state: Tensor, steps: Tensor, rng: Tensor, offsets: Tensor, action: Tensor,
                    c: AcrobotConsts, one: Any, max_steps: Any, autoreset: bool, udtype: torch.dtype,
                     int_flags: bool = False):
    return fused_step(acrobot_dynamics, acrobot_observe, acrobot_init, state, steps, rng, offsets,
                      action, c, one, max_steps, autoreset, udtype, int_flags)


class AcrobotEnv(NativeEnv):
    """Batched Acrobot (Gymnasium ``Acrobot-v1``) as tensor code.

    Observation ``"observation" [*batch, 6]``: ``cos/sin`` of both joint angles and both
    angular velocities (bounds ``±[1, 1, 1, 1, 4 pi, 9 pi]``). Action ``"action"``:
    ``Categorical(3)`` of shape ``[*batch]`` (torque -1, 0, +1), or ``OneHot(3)`` with
    ``categorical_action_encoding=False``. Reward -1 per step, 0 on the step that
    reaches the goal (``-cos(t1) - cos(t1 + t2) > 1``: ``terminated``). ``truncated``
    after ``max_episode_steps`` (500). Resets draw every state component in
    ``[-0.1, 0.1)``.

    Example:
        >>> from steersman.envs import AcrobotEnv
        >>> env = AcrobotEnv(batch_size=[5], seed=0)
        >>> td = env.rand_step(env.reset())
        >>> td["next", "observation"].shape, td["next", "reward"][0]
        (torch.Size([5, 6]), tensor([-1.]))
    """

    state_names = ("theta1", "theta2", "dtheta1", "dtheta2")
    params = AcrobotParams()
    _num_uniforms = 4
    _default_max_episode_steps = 500
    _dynamics = staticmethod(acrobot_dynamics)
    _observe = staticmethod(acrobot_observe)
    _init = staticmethod(acrobot_init)
    _kernel = staticmethod(_acrobot_kernel)
    _derive = staticmethod(acrobot_consts)

    def __init__(self, batch_size: Any = (), device: Any = None, *,
                 categorical_action_encoding: bool = True, **kwargs: Any) -> None:
        self._want_categorical = categorical_action_encoding
        super().__init__(batch_size, device, **kwargs)

    def _affine_reset(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        p = self.params
        return (p.reset_low,) * 4, (p.reset_high,) * 4

    def _make_specs(self) -> None:
        bs, dev, dt, p = self._batch_size, self._device, self._dtype, self.params
        high = torch.tensor([1.0, 1.0, 1.0, 1.0, p.max_vel_1, p.max_vel_2], dtype=dt)
        self.observation_spec = Composite(
            observation=Bounded(-high, high, shape=(*bs, 6), device=dev, dtype=dt), shape=bs
        )
        self._categorical = self._want_categorical
        if self._categorical:
            self.action_spec = Categorical(3, shape=bs, device=dev)
        else:
            self.action_spec = OneHot(3, shape=(*bs, 3), device=dev)
        self.reward_spec = Unbounded(shape=(*bs, 1), device=dev, dtype=dt)
