"""Torch-native batched environments: classic control (Gymnasium dynamics) and a grid world.

Every env runs any batch shape on any device with no Python loop over sub-envs, steps
as a pure function of ``(state, action)`` (``torch.compile``-able with
``fullgraph=True``; pass ``compile=True``), auto-resets finished sub-envs with
counter-based per-sub-env randomness, and reports Gymnasium's time limits as
``truncated``.
"""

from ._base import NativeEnv, draw_uniforms, fused_step, mix32
from .acrobot import AcrobotEnv, AcrobotParams
from .cartpole import CartPoleEnv, CartPoleParams
from .connect_four import ConnectFourEnv
from .gridworld import GridWorldEnv, GridWorldParams
from .mountain_car import (
    MountainCarContinuousEnv,
    MountainCarContinuousParams,
    MountainCarEnv,
    MountainCarParams,
)
from .pendulum import PendulumEnv, PendulumParams
from .tictactoe import TicTacToeEnv

__all__ = [
    "NativeEnv",
    "fused_step",
    "draw_uniforms",
    "mix32",
    "CartPoleEnv",
    "CartPoleParams",
    "PendulumEnv",
    "PendulumParams",
    "MountainCarEnv",
    "MountainCarParams",
    "MountainCarContinuousEnv",
    "MountainCarContinuousParams",
    "AcrobotEnv",
    "AcrobotParams",
    "GridWorldEnv",
    "GridWorldParams",
    "TicTacToeEnv",
    "ConnectFourEnv",
]
