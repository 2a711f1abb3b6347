"""Env ids the recipes understand: built-in torch envs, and any Gymnasium id as ``gym:<id>``.

``make_env("CartPole-v1", num_envs=8, seed=0)`` builds the native batched
:class:`~steersman.envs.CartPoleEnv` (batch ``[8]``); ``make_env("gym:LunarLander-v3",
num_envs=8)`` builds a Gymnasium vector env through :class:`~steersman.envs.GymEnv`
(needs ``gymnasium`` and the env's own extras). Both have discrete actions as integer
indices (``Categorical``) and the same keys, so every recipe runs on either.

Example:
    >>> env = make_env("Pendulum-v1", num_envs=4, seed=0)
    >>> env.batch_size, env.action_spec.shape
    (torch.Size([4]), torch.Size([4, 1]))
    >>> make_env("CartPol-v1", num_envs=1)
    Traceback (most recent call last):
    ...
    steersman.recipes.config.ConfigError: unknown env id 'CartPol-v1'; built-in ids: ['Acrobot-v1', 'CartPole-v1', 'GridWorld-v0', 'MountainCar-v0', 'MountainCarContinuous-v0', 'Pendulum-v1', 'connect4', 'tictactoe'], or any Gymnasium id as 'gym:<id>' (e.g. env.name=gym:LunarLander-v3); multi-agent recipes: navigation, predator_prey, vmas/<scenario>, pettingzoo/<task>
"""

from __future__ import annotations

import os
from typing import Any

import torch

from steersman.envs import (
    AcrobotEnv,
    CartPoleEnv,
    ConnectFourEnv,
    EnvBase,
    GridWorldEnv,
    MountainCarContinuousEnv,
    MountainCarEnv,
    PendulumEnv,
    TicTacToeEnv,
)

from .config import ConfigError

__all__ = ["NATIVE_ENVS", "BOARD_GAMES", "GYM_PREFIX", "MARL_ALGOS", "is_marl_env_id", "TRANSITION_KEYS", "action_spec_unbatched", "check_env_id", "make_env",
           "make_render_env"]

#: Built-in ids and their torch-native env classes (Gymnasium's dynamics and time limits).
NATIVE_ENVS: dict[str, type[EnvBase]] = {
    "Acrobot-v1": AcrobotEnv,
    "CartPole-v1": CartPoleEnv,
    "GridWorld-v0": GridWorldEnv,
    "MountainCar-v0": MountainCarEnv,
    "MountainCarContinuous-v0": MountainCarContinuousEnv,
    "Pendulum-v1": PendulumEnv,
}
#: Two-player board games (action masks, ``current_player``; the AlphaZero and MuZero recipes play them).
BOARD_GAMES: dict[str, type[EnvBase]] = {"tictactoe": TicTacToeEnv, "connect4": ConnectFourEnv}
GYM_PREFIX = "gym:"
#: What off-policy recipes keep of a transition in their replay buffers (``batch.select(*TRANSITION_KEYS)``):
#: random-action batches and policy batches then have the same entries.
TRANSITION_KEYS = ["observation", "action", ("next", "observation"), ("next", "reward"), ("next", "done"),
                   ("next", "terminated"), ("next", "truncated")]


def action_spec_unbatched(env: EnvBase) -> Any:
    """The action spec of one sub-env (``env.action_spec`` carries the batch dims).

    Example:
        >>> env = make_env("CartPole-v1", num_envs=4, seed=0)
        >>> env.action_spec.shape, action_spec_unbatched(env).shape
        (torch.Size([4]), torch.Size([]))
    """
    return env.action_spec[(0,) * len(env.batch_size)] if len(env.batch_size) else env.action_spec


#: the multi-agent recipes (their envs come from :func:`~steersman.recipes.marl_envs.make_marl_env`)
MARL_ALGOS = ("mappo", "ippo", "qmix", "vdn", "maddpg", "masac")


def is_marl_env_id(name: str) -> bool:
    """Whether ``name`` is a multi-agent env id (see :mod:`~steersman.recipes.marl_envs`)."""
    from .marl_envs import NATIVE_MARL_ENVS

    return name in NATIVE_MARL_ENVS or any(
        name.startswith(p) and len(name) > len(p) for p in ("vmas/", "pettingzoo/"))


def check_env_id(name: str, *, allow_import: bool = True) -> None:
    """Raises a one-line :class:`~steersman.recipes.config.ConfigError` listing the valid ids if
    ``name`` is not one.

    Gymnasium imports the Python module ``mod`` to make an id ``mod:Env-v0``. An id the
    user typed may do that; ids read from a run folder (``allow_import=False``: a shared
    folder is untrusted) may only name registered envs.

    Example:
        >>> check_env_id("gym:evilmod:X-v0", allow_import=False)
        Traceback (most recent call last):
        ...
        steersman.recipes.config.ConfigError: env.name 'gym:evilmod:X-v0' would import the Python module 'evilmod' (Gymnasium's 'module:Env' ids); env ids read from a run folder may only name registered envs: pass --allow-import (Python: allow_import=True) if you trust the folder's code
    """
    if name in NATIVE_ENVS or name in BOARD_GAMES or is_marl_env_id(name):
        return
    if name.startswith(GYM_PREFIX) and len(name) > len(GYM_PREFIX):
        module, sep, _ = name[len(GYM_PREFIX):].rpartition(":")
        if sep and not allow_import:
            raise ConfigError(
                f"env.name {name!r} would import the Python module {module!r} (Gymnasium's 'module:Env' ids); "
                "env ids read from a run folder may only name registered envs: pass --allow-import "
                "(Python: allow_import=True) if you trust the folder's code"
            )
        return
    raise ConfigError(
        f"unknown env id {name!r}; built-in ids: {sorted(NATIVE_ENVS) + sorted(BOARD_GAMES)}, or any Gymnasium id as "
        f"'{GYM_PREFIX}<id>' (e.g. env.name={GYM_PREFIX}LunarLander-v3); multi-agent recipes: navigation, "
        "predator_prey, vmas/<scenario>, pettingzoo/<task>"
    )


def make_env(
    name: str,
    num_envs: int,
    *,
    seed: int | None = None,
    max_episode_steps: int | None = None,
    compile: bool = False,
    device: Any = "cpu",
    render: bool = False,
) -> EnvBase:
    """A batched env ``[num_envs]`` for the id ``name`` (see the module docstring).

    Args:
        name: a key of :data:`NATIVE_ENVS` or ``"gym:<Gymnasium id>"``.
        num_envs: number of sub-envs (>= 1).
        seed: the env's seed (None: drawn from torch's global RNG).
        max_episode_steps: time limit (None: the env's default).
        compile: torch.compile the native env's step.
        device: where the env's tensors live.
        render: Gymnasium envs only: create them with ``render_mode="rgb_array"``.
    """
    check_env_id(name)
    if is_marl_env_id(name):
        raise ConfigError(f"env.name={name} is a multi-agent env: train it with a multi-agent recipe "
                          f"({', '.join(MARL_ALGOS)})")
    if num_envs < 1:
        raise ConfigError(f"num_envs must be >= 1, got {num_envs}")
    if name in BOARD_GAMES:  # fixed rules: no time limit, nothing to compile
        return BOARD_GAMES[name](batch_size=[num_envs], device=device, seed=seed)
    if name in NATIVE_ENVS:
        kwargs: dict[str, Any] = {"seed": seed, "compile": compile}
        if max_episode_steps is not None:
            kwargs["max_episode_steps"] = max_episode_steps
        return NATIVE_ENVS[name](batch_size=[num_envs], device=device, **kwargs)
    kwargs = {"categorical_action_encoding": True, "device": device, "num_envs": num_envs}
    if max_episode_steps is not None:
        kwargs["max_episode_steps"] = max_episode_steps
    if render:
        kwargs["render_mode"] = "rgb_array"
    return _gym_env(name, name[len(GYM_PREFIX):], seed, kwargs)


def _gym_env(name: str, gym_id: str, seed: int | None, kwargs: dict[str, Any]) -> EnvBase:
    """``GymEnv(gym_id, **kwargs)``, seeded; an id Gymnasium does not know, or an env whose
    optional dependency is missing, is a one-line ConfigError naming what to install."""
    from steersman.envs import GymEnv

    try:
        from gymnasium.error import Error as GymError
    except ImportError:  # GymEnv names the extra to install
        GymError = ImportError  # noqa: N806
    try:
        env = GymEnv(gym_id, **kwargs)
    except (ImportError, ValueError, GymError) as err:
        detail = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
        raise ConfigError(f"env.name={name}: {detail}") from None
    if seed is not None:
        env.set_seed(seed)
    obs = env.observation_spec["observation"] if "observation" in env.observation_spec.keys() else None
    per_env = obs.shape[len(env.batch_size):] if obs is not None else ()
    if obs is not None and len(per_env) >= 2:
        env.close()
        raise ConfigError(f"env.name={name}: observations are images {list(per_env)} ({obs.dtype}); the recipes' "
                          "networks are MLPs over vector observations (no pixel-based recipe yet)")
    if obs is not None and len(per_env) == 1 and not obs.dtype.is_floating_point:
        # integer vectors (Atari RAM, byte-valued sensors) feed float networks
        from steersman.envs.transforms import DTypeCastTransform, TransformedEnv

        env = TransformedEnv(env, DTypeCastTransform(obs.dtype, torch.float32, in_keys=["observation"]))
    if any(spec.dtype == torch.float64 for spec in env.observation_spec.values(True, True)):
        # MuJoCo and other Gymnasium envs observe float64; the recipes' networks are float32
        from steersman.envs.transforms import DoubleToFloat, TransformedEnv

        env = TransformedEnv(env, DoubleToFloat())
    return env


def make_render_env(name: str, *, seed: int | None = None, max_episode_steps: int | None = None) -> EnvBase:
    """A single env of id ``name`` that renders RGB frames, for recording videos.

    The torch-native envs do not draw themselves: their Gymnasium twin (same dynamics and
    observations) is used. Needs ``gymnasium`` (and ``pygame`` for classic control).
    """
    check_env_id(name)
    gym_id = name[len(GYM_PREFIX):] if name.startswith(GYM_PREFIX) else name
    if name in NATIVE_ENVS and name == "GridWorld-v0":
        raise ConfigError("GridWorld-v0 is steersman's own env and cannot render; videos need a Gymnasium id")
    if not os.environ.get("DISPLAY"):  # off-screen rendering (pygame) on headless machines
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    kwargs: dict[str, Any] = {"categorical_action_encoding": True, "render_mode": "rgb_array"}
    if max_episode_steps is not None:
        kwargs["max_episode_steps"] = max_episode_steps
    return _gym_env(name, gym_id, seed, kwargs)
