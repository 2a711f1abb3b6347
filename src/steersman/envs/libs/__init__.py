"""Wrappers of other environment libraries (optional dependencies, imported lazily).

* :class:`GymEnv` / :class:`GymWrapper`: Gymnasium envs and vector envs as steersman
  envs (``pip install 'steersman[gym]'``).
* :class:`DMControlEnv` / :class:`DMControlWrapper`: DeepMind Control Suite tasks
  (``pip install 'steersman[dm-control]'``).
* :class:`MultiThreadedEnv` / :class:`MultiThreadedEnvWrapper`: EnvPool's C++-threaded
  batched envs (``pip install 'steersman[envpool]'``).
* :class:`PettingZooWrapper` / :class:`PettingZooEnv`: PettingZoo parallel and AEC envs
  with agent groups, and :func:`to_pettingzoo` (a steersman multi-agent env as a
  PettingZoo ``ParallelEnv``) (``pip install 'steersman[pettingzoo]'``).
* :class:`VmasEnv` / :class:`VmasWrapper`: VMAS scenarios, batched in torch
  (``pip install 'steersman[vmas]'``).
* :func:`to_gymnasium` (:class:`GymnasiumExport`, :class:`GymnasiumVectorExport`): the
  other direction, any steersman env as a ``gymnasium.Env`` / ``gymnasium.vector.VectorEnv``.

Importing this package does not import Gymnasium, PettingZoo or VMAS; building a wrapper does (an
``ImportError`` naming the extra to install if it is missing).
"""

from __future__ import annotations

from typing import Any

from .dm_control import DMControlEnv, DMControlWrapper
from .envpool import MultiThreadedEnv, MultiThreadedEnvWrapper
from .gym import (
    GYM_EXTRA_HINT,
    GymDependencyError,
    GymEnv,
    GymWrapper,
    gymnasium_available,
    space_to_spec,
)
from .pettingzoo import (
    PETTINGZOO_EXTRA_HINT,
    PettingZooEnv,
    PettingZooWrapper,
    pettingzoo_available,
    to_pettingzoo,
)
from .vmas import VMAS_EXTRA_HINT, VmasEnv, VmasWrapper, vmas_available

__all__ = [
    "GymEnv",
    "GymWrapper",
    "GymDependencyError",
    "space_to_spec",
    "gymnasium_available",
    "GYM_EXTRA_HINT",
    "PettingZooWrapper",
    "PettingZooEnv",
    "pettingzoo_available",
    "to_pettingzoo",
    "PETTINGZOO_EXTRA_HINT",
    "VmasEnv",
    "VmasWrapper",
    "vmas_available",
    "VMAS_EXTRA_HINT",
    "to_gymnasium",
    "spec_to_space",
    "GymnasiumExport",
    "GymnasiumVectorExport",
    "DMControlEnv",
    "DMControlWrapper",
    "MultiThreadedEnv",
    "MultiThreadedEnvWrapper",
]

# defined in gym_export.py, which imports gymnasium at import time: loaded on first use.
_EXPORT_NAMES = ("to_gymnasium", "spec_to_space", "GymnasiumExport", "GymnasiumVectorExport")


def __getattr__(name: str) -> Any:
    if name in _EXPORT_NAMES:
        from .gym import _import_gymnasium

        _import_gymnasium()
        from . import gym_export

        return getattr(gym_export, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
