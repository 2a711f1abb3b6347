"""Tiny configs of every recipe: a few hundred frames, for smoke and resume tests."""

from __future__ import annotations

from typing import Any

from steersman.recipes import config_class

#: per algorithm: overrides that make a run take a few hundred frames / updates
TINY: dict[str, dict[str, Any]] = {
    "ppo": {"total_frames": 256, "n_steps": 16, "epochs": 2, "minibatch_size": 64, "env.num_envs": 4},
    "a2c": {"total_frames": 200, "n_steps": 5, "env.num_envs": 4},
    "dqn": {"total_frames": 256, "frames_per_batch": 64, "gradient_steps": 4, "learning_starts": 64,
            "batch_size": 32, "hidden_sizes": [32, 32]},
    "sac": {"total_frames": 128, "frames_per_batch": 16, "learning_starts": 32, "batch_size": 32,
            "hidden_sizes": [32, 32]},
    "td3": {"total_frames": 128, "frames_per_batch": 16, "learning_starts": 32, "batch_size": 32,
            "hidden_sizes": [32, 32]},
    "ddpg": {"total_frames": 128, "frames_per_batch": 16, "learning_starts": 32, "batch_size": 32,
             "hidden_sizes": [32, 32]},
    "iql": {"num_updates": 40, "dataset_frames": 200, "batch_size": 32, "hidden_sizes": [32, 32]},
}
TINY["alphazero"] = {"total_frames": 64, "frames_per_batch": 32, "updates_per_batch": 2, "batch_size": 16,
                     "learning_starts": 16, "num_simulations": 4, "eval_simulations": 4, "hidden_sizes": [16],
                     "env.num_envs": 8}
TINY["muzero"] = {"total_frames": 64, "frames_per_batch": 32, "updates_per_batch": 2, "batch_size": 16,
                  "learning_starts": 16, "num_simulations": 4, "eval_simulations": 4, "hidden_sizes": [16],
                  "latent_size": 8, "env.num_envs": 8}
_MARL = {"env.num_envs": 4, "env.max_episode_steps": 10, "hidden_sizes": [16]}
TINY["mappo"] = TINY["ippo"] = {**_MARL, "total_frames": 64, "n_steps": 8, "epochs": 2, "minibatch_size": 16}
TINY["qmix"] = TINY["vdn"] = TINY["maddpg"] = TINY["masac"] = {
    **_MARL, "total_frames": 64, "frames_per_batch": 16, "gradient_steps": 2, "batch_size": 16}
COMMON = {"quiet": True, "eval.episodes": 2, "eval.interval": 0, "logger.backends": ["csv"],
          "checkpoint.interval": 0}


def tiny_config(algo: str, **overrides: Any) -> Any:
    """The algorithm's default config with :data:`TINY` and :data:`COMMON` applied, then ``overrides``
    (dotted keys as in the command line)."""
    cfg = config_class(algo)()
    for key, value in {**COMMON, **TINY[algo], **overrides}.items():
        obj = cfg
        *path, last = key.split(".")
        for part in path:
            obj = getattr(obj, part)
        if not hasattr(obj, last):
            raise KeyError(key)
        setattr(obj, last, value)
    return cfg


def tiny_config_dict(algo: str, **overrides: Any) -> dict[str, Any]:
    """The same settings as a dict of dotted keys (what ``run_recipe`` takes)."""
    return {**COMMON, **TINY[algo], **overrides}


def cli_overrides(algo: str, **overrides: Any) -> list[str]:
    """The same settings as ``key=value`` command-line overrides."""
    out = []
    for key, value in {**COMMON, **TINY[algo], **overrides}.items():
        if isinstance(value, list):
            value = "[" + ",".join(map(str, value)) + "]"
        elif isinstance(value, bool):
            value = str(value).lower()
        out.append(f"{key}={value}")
    return out
