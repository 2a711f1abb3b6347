"""L6: recipes — one readable training script per algorithm, built from the library's parts.

Each recipe module (``ppo``, ``a2c``, ``dqn``, ``sac``, ``td3``, ``ddpg``, ``iql``, and the
multi-agent ``mappo``, ``ippo``, ``qmix``, ``vdn``, ``maddpg``, ``masac``, and the planning ``alphazero``
and ``muzero``) has one config dataclass (``PPOConfig``...) whose fields carry a one-line docstring, and:

* ``train(cfg=None, run_dir=None, *, resume=False) -> dict``: trains, writing a run
  directory (see :class:`~steersman.recipes.run.Run`), and returns the run's summary;
* ``make_policy(cfg, env) -> module``: the policy network the run trains, for an env
  (``steersman eval`` / ``export`` rebuild it and load ``checkpoint.state["policy"]``).

``steersman train ALGO key=value ...`` runs the same functions through Hydra.
:func:`run_recipe` (``name``, ``key=value`` strings or a dict) is the entry point the CLI
and the Python API share (see :mod:`steersman.recipes.launch`).

Example:
    >>> sorted(ALGOS)
    ['a2c', 'alphazero', 'ddpg', 'dqn', 'ippo', 'iql', 'maddpg', 'mappo', 'masac', 'muzero', 'ppo', 'qmix', 'sac', 'td3', 'vdn']
    >>> get_recipe("ppo").PPOConfig().env.name
    'CartPole-v1'
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["ALGOS", "RunResult", "config_class", "get_recipe", "load_run_config", "make_config", "run_recipe"]
_LAUNCH = ("RunResult", "check_config", "load_run_config", "make_config", "run_recipe")

#: algorithm name -> (config class name, one-line description)
ALGOS: dict[str, tuple[str, str]] = {
    "ppo": ("PPOConfig", "Proximal Policy Optimization, on-policy (default: CartPole-v1)"),
    "a2c": ("A2CConfig", "Advantage Actor-Critic, on-policy (default: CartPole-v1)"),
    "dqn": ("DQNConfig", "Deep Q-Network, off-policy, discrete actions (default: CartPole-v1)"),
    "sac": ("SACConfig", "Soft Actor-Critic, off-policy, continuous or discrete (default: Pendulum-v1)"),
    "td3": ("TD3Config", "Twin Delayed DDPG, off-policy, continuous (default: Pendulum-v1)"),
    "ddpg": ("DDPGConfig", "Deep Deterministic Policy Gradient, off-policy (default: Pendulum-v1)"),
    "iql": ("IQLConfig", "Implicit Q-Learning, offline from a replay-buffer file (default: Pendulum-v1)"),
    "alphazero": ("AlphaZeroConfig", "AlphaZero with Gumbel MuZero self-play search (default: tictactoe)"),
    "muzero": ("MuZeroConfig", "MuZero: Gumbel MuZero search on a learned model (default: tictactoe; cartpole)"),
    "mappo": ("MAPPOConfig", "Multi-agent PPO, centralised critic (default: native navigation, 3 agents)"),
    "ippo": ("IPPOConfig", "Independent PPO, per-agent critic (default: native navigation, 3 agents)"),
    "qmix": ("QMIXConfig", "QMIX, monotonic value mixing, discrete actions (default: native navigation)"),
    "vdn": ("VDNConfig", "Value Decomposition Networks, discrete actions (default: native navigation)"),
    "maddpg": ("MADDPGConfig", "Multi-agent DDPG, centralised critic (default: native navigation)"),
    "masac": ("MASACConfig", "Multi-agent SAC, centralised critic (default: native navigation)"),
}


def _check(name: str) -> None:
    if name not in ALGOS:
        raise ValueError(f"unknown algorithm {name!r}; valid: {', '.join(sorted(ALGOS))}")


def get_recipe(name: str) -> ModuleType:
    """The recipe module of algorithm ``name`` (imported on first use)."""
    _check(name)
    return importlib.import_module(f"{__name__}.{name}")


def config_class(name: str) -> type:
    """The config dataclass of algorithm ``name``."""
    _check(name)
    return getattr(get_recipe(name), ALGOS[name][0])


def __getattr__(name: str) -> object:
    if name in _LAUNCH:  # imported on first use: they pull in torch and the envs
        from . import launch

        return getattr(launch, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
