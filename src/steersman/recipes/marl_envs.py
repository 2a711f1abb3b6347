"""Env ids the multi-agent recipes understand.

* ``navigation``, ``predator_prey``: the torch-native batched tasks
  (:class:`~steersman.envs.NavigationEnv`, :class:`~steersman.envs.PredatorPreyEnv`), no
  optional dependency;
* ``vmas/<scenario>``: a VMAS scenario (``vmas/navigation``, ``vmas/balance``...), batched
  and in torch (needs ``vmas``: ``pip install steersman[vmas]``);
* ``pettingzoo/<task>``: a PettingZoo parallel env (``pettingzoo/sisl/multiwalker_v9``...),
  ``num_envs`` copies stepped in turn by a :class:`~steersman.envs.SerialEnv`, every agent
  in the group ``"agents"`` (needs ``pettingzoo`` and the task's own extras).

Every env has the layout the recipes read: one group ``"agents"`` (``env.group_map``)
holding ``("agents", "observation")`` ``[num_envs, n_agents, obs_dim]``, the actions and
per-agent rewards ``[num_envs, n_agents, 1]``; root ``"done"``/``"terminated"``/``"truncated"``
``[num_envs, 1]``; and a global ``"state"`` where the env has one.

Example:
    >>> env = make_marl_env("navigation", num_envs=4, seed=0, n_agents=2)
    >>> env.batch_size, env.group_map
    (torch.Size([4]), {'agents': ['agent_0', 'agent_1']})
    >>> make_marl_env("navigate", num_envs=1)
    Traceback (most recent call last):
    ...
    steersman.recipes.config.ConfigError: unknown multi-agent env id 'navigate'; valid: ['navigation', 'predator_prey'], 'vmas/<scenario>' or 'pettingzoo/<task>' (e.g. env.name=vmas/balance)
"""

from __future__ import annotations

import functools
from typing import Any

from steersman.envs import EnvBase

from .config import ConfigError

__all__ = ["NATIVE_MARL_ENVS", "check_marl_env_id", "make_marl_env", "GROUP"]

#: The group the recipes train (the native tasks and VMAS' default grouping put every agent in it).
GROUP = "agents"


def _native() -> dict[str, type[EnvBase]]:
    from steersman.envs.multiagent import NavigationEnv, PredatorPreyEnv

    return {"navigation": NavigationEnv, "predator_prey": PredatorPreyEnv}


#: Built-in multi-agent ids.
NATIVE_MARL_ENVS = ("navigation", "predator_prey")


def check_marl_env_id(name: str) -> None:
    """A one-line :class:`ConfigError` listing the valid ids if ``name`` is not one."""
    if name in NATIVE_MARL_ENVS:
        return
    for prefix in ("vmas/", "pettingzoo/"):
        if name.startswith(prefix) and len(name) > len(prefix):
            return
    raise ConfigError(
        f"unknown multi-agent env id {name!r}; valid: {list(NATIVE_MARL_ENVS)}, 'vmas/<scenario>' or "
        "'pettingzoo/<task>' (e.g. env.name=vmas/balance)"
    )


def make_marl_env(
    name: str,
    num_envs: int,
    seed: int | None = None,
    *,
    n_agents: int = 3,
    max_steps: int | None = 100,
    categorical_actions: bool = False,
    device: Any = "cpu",
) -> EnvBase:
    """A batched multi-agent env ``[num_envs]`` for the id ``name`` (see the module docstring).

    Args:
        name: ``navigation``, ``predator_prey``, ``vmas/<scenario>`` or ``pettingzoo/<task>``.
        num_envs: number of sub-envs (>= 1).
        seed: the env's seed.
        n_agents: agents of the native tasks (VMAS scenarios and PettingZoo tasks fix
            their own unless the scenario takes ``n_agents``).
        max_steps: episode length (time limit).
        categorical_actions: discrete actions as integer indices (the native tasks: 5
            moves; VMAS: its discrete action set) instead of continuous forces.
        device: where the env's tensors live.
    """
    check_marl_env_id(name)
    if num_envs < 1:
        raise ConfigError(f"env.num_envs must be >= 1, got {num_envs}")
    if name in NATIVE_MARL_ENVS:
        return _native()[name](num_envs=num_envs, n_agents=n_agents, max_steps=max_steps,
                               categorical_actions=categorical_actions, seed=seed, device=device)
    if name.startswith("vmas/"):
        try:
            from steersman.envs.libs.vmas import VmasEnv

            return VmasEnv(name[len("vmas/"):], num_envs=num_envs, continuous_actions=not categorical_actions,
                           max_steps=max_steps, seed=seed, device=device, n_agents=n_agents,
                           inference_mode=True)  # the recipes never differentiate through VMAS
        except ImportError as err:
            raise ConfigError(f"env.name={name}: {err}") from None
    return _pettingzoo(name, num_envs, seed, max_steps=max_steps, categorical_actions=categorical_actions,
                       device=device)


def _pettingzoo(name: str, num_envs: int, seed: int | None, *, max_steps: int | None, categorical_actions: bool,
                device: Any) -> EnvBase:
    """``num_envs`` copies of a PettingZoo parallel task in a :class:`~steersman.envs.SerialEnv`,
    every agent in the group ``"agents"``; ``max_steps`` is the task's ``max_cycles``
    where it takes one (MPE, SISL, butterfly), else the task's own episode end."""
    from steersman.envs import MarlGroupMapType, SerialEnv
    from steersman.envs.libs.pettingzoo import PettingZooEnv

    task = name[len("pettingzoo/"):]
    kw = dict(parallel=True, categorical_actions=categorical_actions, return_state=True, device=device,
              group_map=MarlGroupMapType.ALL_IN_ONE_GROUP)
    env_kwargs = {"max_cycles": max_steps} if max_steps is not None else {}
    try:
        try:
            probe = PettingZooEnv(task, env_kwargs=env_kwargs, **kw)
        except TypeError:  # a task without max_cycles (classic games)
            env_kwargs = {}
            probe = PettingZooEnv(task, **kw)
    except (ImportError, ValueError, ModuleNotFoundError) as err:  # a missing package or unknown task: one line
        raise ConfigError(f"env.name={name}: {err}") from None
    group_map = probe.group_map
    probe.close()
    env = SerialEnv(num_envs, functools.partial(PettingZooEnv, task, env_kwargs=env_kwargs, **kw))
    env.group_map = group_map  # the sub-envs' grouping (what the recipes check)
    if seed is not None:
        env.set_seed(seed)
    return env
