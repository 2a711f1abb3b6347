"""The Python side of steersman: train a recipe, load a run, act in your own loop.

::

    import steersman

    run = steersman.train("ppo", env="CartPole-v1", total_frames=50_000)
    agent = steersman.load(run.run_dir)
    action = agent.act(observation)          # NumPy in, NumPy out; batched or not
    print(agent.evaluate(episodes=10).mean)

:func:`train` runs the same recipe and config as ``steersman train`` (keyword overrides
instead of ``key=value`` strings) and writes the same run directory; :func:`load` rebuilds
the run's policy from its latest checkpoint (``torch.load(weights_only=True)``: loading
never executes code) as an :class:`Agent`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from steersman.recipes import ALGOS, config_class, get_recipe
from steersman.recipes.checkpoint import latest_checkpoint, load_checkpoint, load_entry
from steersman.recipes.config import ConfigError
from steersman.recipes.envs import action_spec_unbatched, check_env_id, make_env
from steersman.recipes.evaluation import evaluate as _evaluate
from steersman.recipes.launch import load_run_config, run_recipe
from steersman.recipes.launch import make_config as _make_config
from steersman.recipes.run import RunDirError, default_run_dir
from steersman.tensordict import TensorDict
from steersman.tensordict.nn import ExplorationType, set_exploration_type

__all__ = ["Agent", "Evaluation", "TrainedRun", "load", "make_config", "train"]


# ---------------------------------------------------------------- train
def make_config(algo: str, **overrides: Any) -> Any:
    """The config dataclass of ``algo`` with ``overrides`` applied (what :func:`train` runs).

    Overrides are config fields as keywords: top-level ones (``total_frames=50_000``),
    nested ones as a dict (``optim={"lr": 3e-4}``) or a dotted key
    (``**{"optim.lr": 3e-4}``). ``env="Pendulum-v1"`` is short for ``env={"name": ...}``.
    Values are checked against the field types (Hydra's rules: ``"3"`` becomes 3 for an
    int field, ``"abc"`` is an error).

    Raises :class:`~steersman.recipes.config.ConfigError` naming the key for an unknown
    key, a value of the wrong type or an unknown env id.

    Example:
        >>> cfg = make_config("ppo", env="Pendulum-v1", total_frames=1024, optim={"lr": 3e-4})
        >>> cfg.env.name, cfg.total_frames, cfg.optim.lr
        ('Pendulum-v1', 1024, 0.0003)
        >>> make_config("ppo", total_frame=10)
        Traceback (most recent call last):
        ...
        steersman.recipes.config.ConfigError: unknown config key 'total_frame' for ppo; valid keys: checkpoint, compile, compile_backend, distributed, env, epochs, eval, export_format, hidden_sizes, logger, loss, minibatch_size, n_steps, num_threads, optim, ortho_init, quiet, seed, seeds, sweep, total_frames
    """
    return _make_config(algo, _overrides(algo, overrides))


def _overrides(algo: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """Keyword overrides as the nested dict the recipes take; unknown keys and env ids are
    a :class:`ConfigError` that lists the valid ones."""
    if algo not in ALGOS:
        raise ConfigError(f"unknown algorithm {algo!r}; valid: {', '.join(sorted(ALGOS))}")
    cls = config_class(algo)
    nested: dict[str, Any] = {}
    for key, value in overrides.items():
        if key == "env" and isinstance(value, str):
            key, value = "env.name", value
        _check_key(algo, cls, key, value)
        _set_dotted(nested, key, value)
    env = nested.get("env")
    name = env.get("name") if isinstance(env, dict) else None
    if isinstance(name, str):
        check_env_id(name, allow_import=True)  # the caller's own id: `gym:module:Env-v0` may import
    return nested


def _fields(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _is_config(t: Any) -> bool:
    return isinstance(t, type) and dataclasses.is_dataclass(t)


def _check_key(algo: str, cls: type, key: str, value: Any) -> None:
    """ConfigError naming ``key`` and the valid keys where it is unknown."""
    node: Any = cls
    parts = key.split(".")
    for i, part in enumerate(parts):
        where = ".".join(parts[:i])
        if not _is_config(node):
            raise ConfigError(f"unknown config key {key!r} for {algo}: {where!r} is a value, not a group")
        fields = _fields(node)
        if part not in fields:
            valid = sorted(fields)
            scope = f" under {where!r}" if where else ""
            raise ConfigError(f"unknown config key {key!r} for {algo}; valid keys{scope}: {', '.join(valid)}")
        node = fields[part]
    if isinstance(value, Mapping):
        if not _is_config(node):
            raise ConfigError(f"config key {key!r} of {algo} is a value, got a dict {dict(value)!r}")
        for sub, v in value.items():
            _check_key(algo, cls, f"{key}.{sub}", v)


def _set_dotted(nested: dict[str, Any], key: str, value: Any) -> None:
    *path, last = key.split(".")
    node = nested
    for part in path:
        node = node.setdefault(part, {})
    if isinstance(value, Mapping) and isinstance(node.get(last), dict):
        node[last].update(value)
    else:
        node[last] = dict(value) if isinstance(value, Mapping) else value


@dataclass(frozen=True)
class TrainedRun:
    """A finished (or interrupted) training run: its directory and summary.

    ``os.fspath(run)`` is the run directory, so ``steersman.load(run)`` works too.
    """

    algo: str
    run_dir: Path
    config: Any = field(repr=False)
    summary: dict[str, Any] = field(repr=False)

    @property
    def final_return(self) -> float | None:
        """Mean return of the final deterministic evaluation (None when there was none)."""
        return self.summary.get("final_eval_return")

    @property
    def frames(self) -> int:
        """Environment frames the run trained on."""
        return int(self.summary["frames"])

    @property
    def paths(self) -> dict[str, Path]:
        """What the run wrote: ``run_dir``, ``metrics``, ``checkpoint``, ``policy``, ``plot``."""
        return {k: Path(v) for k, v in self.summary.get("written", {}).items()}

    def load(self) -> Agent:
        """The trained policy as an :class:`Agent` (same as ``steersman.load(run.run_dir)``)."""
        return load(self.run_dir)

    def __fspath__(self) -> str:
        return str(self.run_dir)


def train(algo: str = "ppo", *, run_dir: str | os.PathLike | None = None, **overrides: Any) -> TrainedRun:
    """Trains ``algo`` (``"ppo"``, ``"sac"``... see ``steersman train --help``) and returns the run.

    The same recipe and config as ``steersman train ALGO key=value ...``: keyword
    ``overrides`` as in :func:`make_config` (``env="CartPole-v1"``, ``total_frames=50_000``,
    ``optim={"lr": 3e-4}``, ``quiet=True``). The run directory (default
    ``runs/<algo>_<date>_<time>``) gets the config, metrics, checkpoints, exported policy
    and ``summary.json``, as from the command line.

    Raises :class:`~steersman.recipes.config.ConfigError` for a bad override (before
    anything is written) and :class:`~steersman.recipes.run.RunDirError` when ``run_dir``
    already holds a run.
    """
    nested = _overrides(algo, overrides)
    path = Path(run_dir) if run_dir is not None else _fresh_run_dir(algo)
    result = run_recipe(algo, nested, path, allow_import=True)  # checks the config before writing
    return TrainedRun(algo=result.algo, run_dir=result.dir, config=result.config, summary=result.summary)


def _fresh_run_dir(algo: str) -> Path:
    base = default_run_dir(algo)
    path, n = base, 1
    while path.exists():  # two runs in the same second
        path, n = base.with_name(f"{base.name}_{n}"), n + 1
    return path


# ---------------------------------------------------------------- load / act
@dataclass(frozen=True)
class Evaluation:
    """Returns of deterministic episodes: ``mean`` and one entry per episode."""

    mean: float
    returns: list[float]

    @property
    def std(self) -> float:
        n = len(self.returns)
        return 0.0 if n < 2 else math.sqrt(sum((r - self.mean) ** 2 for r in self.returns) / (n - 1))

    def __str__(self) -> str:
        return f"return {self.mean:.1f} ± {self.std:.1f} over {len(self.returns)} episodes"


class Agent:
    """A trained policy with the run's env: ``act`` on observations, ``evaluate``, ``env``.

    Made by :func:`load`. Attributes: ``policy`` (the TensorDict module, observation ->
    action), ``algo``, ``config`` (the run's config dataclass), ``run_dir``, ``frames``
    (frames trained), ``observation_shape`` and ``observation_dtype`` (one observation).
    """

    def __init__(self, algo: str, config: Any, policy: torch.nn.Module, run_dir: Path, frames: int,
                 observation_shape: torch.Size, observation_dtype: torch.dtype, action_spec: Any) -> None:
        self.algo = algo
        self.config = config
        self.policy = policy
        self.run_dir = run_dir
        self.frames = frames
        self.observation_shape = observation_shape
        self.observation_dtype = observation_dtype
        self.action_spec = action_spec

    def __repr__(self) -> str:
        return (f"Agent({self.algo} on {self.config.env.name}, {self.frames} frames, "
                f"observation {list(self.observation_shape)}, run_dir={str(self.run_dir)!r})")

    def act(self, observation: Any, deterministic: bool = True) -> Any:
        """The policy's action for ``observation``, in the env's action format.

        ``observation`` is one observation (shape ``observation_shape``) or a batch
        (``[B, *observation_shape]``), as a NumPy array (or list) or a tensor. The action
        comes back the same way: NumPy in, NumPy out; tensor in, tensor out (on the
        input's device); unbatched in, unbatched out. Discrete actions are integer
        indices (``int64``, shape ``[]`` or ``[B]``), continuous ones arrays
        ``[*action_shape]`` inside the env's bounds.

        ``deterministic=True`` takes the mode/mean of the policy's distribution;
        ``False`` samples (deterministic policies such as TD3's act the same either way).
        """
        as_numpy = not isinstance(observation, torch.Tensor)
        obs = torch.as_tensor(np.asarray(observation) if as_numpy else observation)
        n = len(self.observation_shape)
        if obs.ndim not in (n, n + 1) or obs.shape[obs.ndim - n:] != self.observation_shape:
            want = list(self.observation_shape)
            raise ValueError(f"Agent.act: observation has shape {list(obs.shape)}, expected {want} "
                             f"(one observation) or [B, {', '.join(map(str, want))}] (a batch)")
        batched = obs.ndim == n + 1
        device = obs.device
        obs = obs.to("cpu", self.observation_dtype)
        if not batched:
            obs = obs.unsqueeze(0)
        mode = ExplorationType.DETERMINISTIC if deterministic else ExplorationType.RANDOM
        with torch.no_grad(), set_exploration_type(mode):
            action = self.policy(TensorDict({"observation": obs}, batch_size=obs.shape[:1])).get("action")
        if not batched:
            action = action[0]
        return action.numpy() if as_numpy else action.to(device)

    def env(self, num_envs: int = 1, seed: int | None = None) -> Any:
        """The run's env (a steersman env, batch ``[num_envs]``), as training built it.

        For a Gymnasium env to step with NumPy, use :meth:`gym_env`.
        """
        cfg = self.config.env
        return make_env(cfg.name, num_envs, seed=seed, max_episode_steps=cfg.max_episode_steps)

    def gym_env(self, **kwargs: Any) -> Any:
        """``gymnasium.make`` of the run's env id (the Gymnasium twin of a built-in env:
        same dynamics and observations), for a plain NumPy loop; ``kwargs`` go to
        ``gymnasium.make`` (``render_mode="human"``...). Needs ``gymnasium``."""
        import gymnasium

        name = self.config.env.name
        gym_id = name.split(":", 1)[1] if name.startswith("gym:") else name
        if self.config.env.max_episode_steps is not None:
            kwargs.setdefault("max_episode_steps", self.config.env.max_episode_steps)
        return gymnasium.make(gym_id, **kwargs)

    def evaluate(self, episodes: int = 10, seed: int | None = None) -> Evaluation:
        """Runs ``episodes`` deterministic episodes side by side; returns their mean and each return.

        ``seed`` defaults to the one ``steersman eval`` uses (the run's seed + 10,000), so
        the numbers match the command line's.
        """
        if episodes < 1:
            raise ValueError(f"episodes must be >= 1, got {episodes}")
        env = self.env(episodes, seed=self.config.seed + 10_000 if seed is None else seed)
        try:
            returns = _evaluate(env, self.policy).float()
        finally:
            env.close()
        values = [float(r) for r in returns]
        return Evaluation(mean=sum(values) / len(values), returns=values)


def load(run_dir: str | os.PathLike, *, allow_import: bool = False) -> Agent:
    """The policy of a run directory (its latest checkpoint) as an :class:`Agent`.

    Reads ``config.yaml`` (``yaml.safe_load``) and the checkpoint's ``state.pt`` with
    ``torch.load(weights_only=True)``: no code from the files runs. An env id of the form
    ``gym:module:Env-v0`` (which imports ``module``) is refused unless ``allow_import``.
    Raises :class:`~steersman.recipes.run.RunDirError` when ``run_dir`` is not a run
    directory or has no checkpoint yet, :class:`~steersman.recipes.config.ConfigError`
    when its config is not valid, :class:`~steersman.recipes.checkpoint.CheckpointError`
    when the checkpoint's policy is missing or does not fit the config.
    """
    run_dir = Path(run_dir)
    algo, cfg = load_run_config(run_dir, allow_import=allow_import)
    root = run_dir / "checkpoints"
    if latest_checkpoint(root) is None:
        raise RunDirError(f"{run_dir} has no checkpoint yet (nothing under {root})")
    ckpt = load_checkpoint(root)
    recipe = get_recipe(algo)
    env = make_env(cfg.env.name, 1, seed=0, max_episode_steps=cfg.env.max_episode_steps)
    try:
        policy = recipe.make_policy(cfg, env)
        obs_spec = env.observation_spec["observation"]
        action_spec = action_spec_unbatched(env)
    finally:
        env.close()
    load_entry(policy, ckpt, "policy")  # one-line CheckpointError if missing or misshaped
    policy.eval().requires_grad_(False)
    return Agent(algo=algo, config=cfg, policy=policy, run_dir=run_dir, frames=int(ckpt.meta.get("frames", 0)),
                 observation_shape=obs_spec.shape[1:], observation_dtype=obs_spec.dtype, action_spec=action_spec)

