"""Pendulum as batched tensor code, with Gymnasium's ``Pendulum-v1`` dynamics."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import Tensor

from steersman.data import Bounded, Composite, Unbounded

from ._base import NativeEnv, fused_step

__all__ = [
    "PendulumEnv",
    "PendulumParams",
    "PendulumConsts",
    "pendulum_consts",
    "pendulum_dynamics",
    "pendulum_init",
    "pendulum_observe",
]


class PendulumParams(NamedTuple):
    """Physical constants of Pendulum (Gymnasium's values).

    Example:
        >>> from steersman.envs import PendulumEnv
        >>> from steersman.envs.native import PendulumParams
        >>> PendulumEnv(batch_size=[2], params=PendulumParams(g=9.81)).params.g
        9.81
    """

    max_speed: float = 8.0
    max_torque: float = 2.0
    dt: float = 0.05
    g: float = 10.0
    m: float = 1.0
    l: float = 1.0  # noqa: E741 (Gymnasium's name)
    reset_th: float = math.pi  # th ~ U(-reset_th, reset_th)
    reset_thdot: float = 1.0  # thdot ~ U(-reset_thdot, reset_thdot)


class PendulumConsts(NamedTuple):
    """Constants used by the Pendulum functions (floats or 0-dim tensors)."""

    max_torque: Any
    neg_max_torque: Any
    max_speed: Any
    neg_max_speed: Any
    pi: Any
    two_pi: Any
    speed_cost: Any
    torque_cost: Any
    gravity_coef: Any
    torque_coef: Any
    dt: Any
    th_low: Any
    th_span: Any
    thdot_low: Any
    thdot_span: Any


def pendulum_consts(p: PendulumParams) -> PendulumConsts:
    """The constants of :func:`pendulum_dynamics` for the parameters ``p`` (Python floats)."""
    return PendulumConsts(
        max_torque=p.max_torque,
        neg_max_torque=-p.max_torque,
        max_speed=p.max_speed,
        neg_max_speed=-p.max_speed,
        pi=math.pi,
        two_pi=2 * math.pi,
        speed_cost=0.1,
        torque_cost=0.001,
        gravity_coef=3 * p.g / (2 * p.l),
        torque_coef=3.0 / (p.m * p.l**2),
        dt=p.dt,
        th_low=-p.reset_th,
        th_span=2 * p.reset_th,
        thdot_low=-p.reset_thdot,
        thdot_span=2 * p.reset_thdot,
    )


def pendulum_dynamics(state: tuple[Tensor, ...], action: Tensor, c: PendulumConsts
                      ) -> tuple[tuple[Tensor, ...], Tensor, Tensor]:
    """One step: ``state`` = (th, thdot), each ``[*batch]``; ``action [*batch, 1]`` (torque, clipped).

    Returns ``(next_state, reward [*batch], terminated [*batch])`` (never terminated).
    The arithmetic follows Gymnasium's ``PendulumEnv.step``.

    Example:
        >>> import torch
        >>> from steersman.envs.native.pendulum import PendulumParams, pendulum_consts, pendulum_dynamics
        >>> s, r, t = pendulum_dynamics((torch.zeros(1), torch.zeros(1)), torch.zeros(1, 1),
        ...                             pendulum_consts(PendulumParams()))
        >>> r, t
        (tensor([-0.]), tensor([False]))
    """
    th, thdot = state
    u = torch.clamp(action[..., 0].to(th.dtype), c.neg_max_torque, c.max_torque)
    norm = torch.remainder(th + c.pi, c.two_pi) - c.pi
    costs = norm.square() + c.speed_cost * thdot.square() + c.torque_cost * u.square()
    newthdot = thdot + (c.gravity_coef * torch.sin(th) + c.torque_coef * u) * c.dt
    newthdot = torch.clamp(newthdot, c.neg_max_speed, c.max_speed)
    newth = th + newthdot * c.dt
    return (newth, newthdot), -costs, torch.zeros_like(th, dtype=torch.bool)


def pendulum_observe(state: Tensor, c: PendulumConsts) -> Tensor:
    """The observation ``[*batch, 3]``: ``cos(th), sin(th), thdot``."""
    th, thdot = state.unbind(0)
    obs = torch.stack([torch.cos(th), torch.sin(th), thdot])
    return obs.permute(*range(1, obs.ndim), 0)


def pendulum_init(u: tuple[Tensor, ...], c: PendulumConsts) -> tuple[Tensor, ...]:
    """Reset states from 2 uniform draws: ``th ~ U(-pi, pi)``, ``thdot ~ U(-1, 1)``."""
    return c.th_low + c.th_span * u[0], c.thdot_low + c.thdot_span * u[1]


def _pendulum_kernel(state: Tensor, steps: Tensor, rng: Tensor, offsets: Tensor, action: Tensor,
                     c: PendulumConsts, one: Any, max_steps: Any, autoreset: bool, udtype: torch.dtype,
                     int_flags: bool = False):
    return fused_step(pendulum_dynamics, pendulum_observe, pendulum_init, state, steps, rng, offsets,
                      action, c, one, max_steps, autoreset, udtype, int_flags)


class PendulumEnv(NativeEnv):
    """Batched Pendulum (Gymnasium ``Pendulum-v1``) as tensor code.

    Observation ``"observation" [*batch, 3]``: ``cos(th), sin(th), thdot`` (bounds
    ``±[1, 1, 8]``). Action ``"action" [*batch, 1]``: the torque, ``Bounded(-2, 2)``
    (clipped). Reward ``-(th_normalized**2 + 0.1 thdot**2 + 0.001 u**2)`` (``[*batch, 1]``).
    Never terminates; ``truncated`` after ``max_episode_steps`` (200). Resets draw
    ``th ~ U(-pi, pi)``, ``thdot ~ U(-1, 1)``.

    Note: unlike TorchRL's stateless ``PendulumEnv``, the state lives in the env
    (``get_state``/``set_state``), as in the other native envs.

    Args: see :class:`~steersman.envs.native.NativeEnv`; also ``td_params``: TorchRL's
    TensorDict of constants (``PendulumEnv.gen_params(g=...)``, or its ``"params"`` entry),
    turned into ``params``. The constants are shared by every sub-env here: a batch of
    different constants is refused.

    Example:
        >>> import torch
        >>> from steersman.envs import PendulumEnv
        >>> env = PendulumEnv(batch_size=[4], seed=0)
        >>> ro = env.rollout(300, break_when_any_done=False)
        >>> ro["observation"].shape, ro["action"].shape
        (torch.Size([4, 300, 3]), torch.Size([4, 300, 1]))
        >>> ro["next", "truncated"].sum(-2).squeeze(-1)    # one time limit per sub-env
        tensor([1, 1, 1, 1])
    """

    state_names = ("th", "thdot")
    params = PendulumParams()
    _num_uniforms = 2
    _default_max_episode_steps = 200
    _dynamics = staticmethod(pendulum_dynamics)
    _observe = staticmethod(pendulum_observe)
    _init = staticmethod(pendulum_init)
    _kernel = staticmethod(_pendulum_kernel)
    _derive = staticmethod(pendulum_consts)

    def __init__(self, batch_size: Any = (), device: Any = None, *, td_params: Any = None, **kwargs: Any) -> None:
        if td_params is not None:
            from .pendulum_td import pendulum_params_from_td

            kwargs["params"] = pendulum_params_from_td(td_params, kwargs.get("params"))
        super().__init__(batch_size, device, **kwargs)

    @staticmethod
    def gen_params(g: float = 10.0, batch_size: Any = None, device: Any = None) -> Any:
        """TorchRL's name: the default constants with gravity ``g`` as ``TensorDict({"params": ...})``.

        Example:
            >>> env = PendulumEnv(td_params=PendulumEnv.gen_params(g=9.81))
            >>> round(env.params.g, 2)
            9.81
        """
        from .pendulum_td import gen_pendulum_params

        return gen_pendulum_params(g, batch_size, device)

    def _affine_reset(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        p = self.params
        return (-p.reset_th, -p.reset_thdot), (p.reset_th, p.reset_thdot)

    def _make_specs(self) -> None:
        bs, dev, dt, p = self._batch_size, self._device, self._dtype, self.params
        high = torch.tensor([1.0, 1.0, p.max_speed], dtype=dt)
        self.observation_spec = Composite(
            observation=Bounded(-high, high, shape=(*bs, 3), device=dev, dtype=dt), shape=bs
        )
        self.action_spec = Bounded(-p.max_torque, p.max_torque, shape=(*bs, 1), device=dev, dtype=dt)
        self.reward_spec = Unbounded(shape=(*bs, 1), device=dev, dtype=dt)
