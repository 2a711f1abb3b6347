"""L3: environments. ``EnvBase``, ``step_mdp``, ``check_env_specs``, the native envs,
Gymnasium wrappers, vectorized envs and transforms."""

from typing import Any

from . import libs as _libs
from .batched import (
    AsyncEnvPool,
    EnvCreator,
    EnvWorkerError,
    ParallelEnv,
    ProcessorAsyncEnvPool,
    SerialEnv,
    ThreadingAsyncEnvPool,
    get_env_metadata,
)
from .common import EnvBase, EnvClosedError, InvalidActionError, action_problem
from .gym_like import BaseInfoDictReader, GymLikeEnv, default_info_dict_reader
from .libs import (
    DMControlEnv,
    DMControlWrapper,
    GymDependencyError,
    GymEnv,
    GymWrapper,
    MultiThreadedEnv,
    MultiThreadedEnvWrapper,
    PettingZooEnv,
    PettingZooWrapper,
    VmasEnv,
    VmasWrapper,
    space_to_spec,
    to_pettingzoo,
)
from .libs._available import get_available_libraries
from .libs.gym import gym_backend, register_gym_spec_conversion, set_gym_backend
from .model_based import ImaginedEnv, ModelBasedEnvBase, WorldModelEnv
from .mujoco import AntEnv, HopperEnv, HumanoidEnv, MujocoEnv, Walker2dEnv
from .multiagent import (
    MarlGroupMapType,
    MultiAgentNativeEnv,
    NavigationEnv,
    PredatorPreyEnv,
    check_marl_grouping,
)
from .native import (
    AcrobotEnv,
    CartPoleEnv,
    ConnectFourEnv,
    GridWorldEnv,
    MountainCarContinuousEnv,
    MountainCarEnv,
    NativeEnv,
    PendulumEnv,
    TicTacToeEnv,
)
from .transforms import *  # noqa: F403
from .transforms import __all__ as _transforms_all
from .utils import (
    check_env_specs,
    make_composite_from_td,
    next_seed,
    step_mdp,
    terminated_or_truncated,
)

__all__ = [
    "EnvBase",
    "EnvClosedError",
    "InvalidActionError",
    "action_problem",
    "step_mdp",
    "check_env_specs",
    "next_seed",
    "NativeEnv",
    "CartPoleEnv",
    "PendulumEnv",
    "MountainCarEnv",
    "MountainCarContinuousEnv",
    "AcrobotEnv",
    "GridWorldEnv",
    "TicTacToeEnv",
    "ConnectFourEnv",
    "GymEnv",
    "GymWrapper",
    "GymDependencyError",
    "space_to_spec",
    "PettingZooWrapper",
    "PettingZooEnv",
    "VmasEnv",
    "VmasWrapper",
    "to_pettingzoo",
    "DMControlEnv",
    "DMControlWrapper",
    "MultiThreadedEnv",
    "MultiThreadedEnvWrapper",
    "SerialEnv",
    "ParallelEnv",
    "EnvCreator",
    "EnvWorkerError",
    "MarlGroupMapType",
    "check_marl_grouping",
    "MultiAgentNativeEnv",
    "NavigationEnv",
    "PredatorPreyEnv",
    "make_composite_from_td",
    "terminated_or_truncated",
    "set_gym_backend",
    "gym_backend",
    "GymLikeEnv",
    "BaseInfoDictReader",
    "default_info_dict_reader",
    "get_env_metadata",
    "get_available_libraries",
    "register_gym_spec_conversion",
    "ModelBasedEnvBase",
    "MujocoEnv",
    "AntEnv",
    "HopperEnv",
    "HumanoidEnv",
    "Walker2dEnv",
    "AsyncEnvPool",
    "ThreadingAsyncEnvPool",
    "ProcessorAsyncEnvPool",
    "WorldModelEnv",
    "ImaginedEnv",
    *_transforms_all,
]


def __getattr__(name: str) -> Any:
    # to_gymnasium, spec_to_space, GymnasiumExport, GymnasiumVectorExport need gymnasium
    # at import time: loaded on first use only (and so not listed in __all__)
    if name in _libs._EXPORT_NAMES:
        return getattr(_libs, name)
    raise AttributeError(f"module 'steersman.envs' has no attribute {name!r}")
