"""Running a recipe by name: configs from overrides, checks before anything is written.

:func:`run_recipe` is the one entry point the CLI and the Python API share::

    result = run_recipe("ppo", ["total_frames=50000", "env.name=Pendulum-v1"])   # or a dict
    result.dir, result.summary["final_eval_return"]

Every bad value is a one-line :class:`~steersman.recipes.config.ConfigError` raised before
the run folder exists (:func:`make_config` checks types and ranges, :func:`check_config`
also builds the env and the policy once). A run folder's own ``config.yaml`` is read by
:func:`load_run_config`, which refuses env ids that would import code unless told otherwise.

Example:
    >>> make_config("ppo", {"total_frames": 512, "optim.lr": 3e-4}).optim.lr
    0.0003
    >>> make_config("ppo", ["total_frames=abc"])
    Traceback (most recent call last):
    ...
    steersman.recipes.config.ConfigError: total_frames: Value 'abc' of type 'str' could not be converted to Integer
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import ALGOS, config_class, get_recipe
from .config import ConfigError, config_from_dict, validate_config
from .envs import MARL_ALGOS, check_env_id, make_env

__all__ = ["RunResult", "check_config", "load_run_config", "make_config", "run_recipe"]


@dataclass
class RunResult:
    """What :func:`run_recipe` returns: the algorithm, the run folder, the config it ran
    with and the run's summary (as in ``summary.json``)."""

    algo: str
    dir: Path
    config: Any
    summary: dict[str, Any]


def _nested(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``{"optim.lr": 1}`` as ``{"optim": {"lr": 1}}`` (nested dicts pass through)."""
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        *path, last = str(key).split(".")
        node = out
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return out


def make_config(algo: str, overrides: Sequence[str] | Mapping[str, Any] | None = None, base: Any = None) -> Any:
    """The config of ``algo`` (its defaults, or ``base``) with ``overrides`` applied and checked.

    ``overrides``: ``["key=value", ...]`` as typed on the command line, or a dict of
    (dotted or nested) keys to values. Raises a one-line :class:`ConfigError` naming the key
    for an unknown key, a value of the wrong type or out of range.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if algo not in ALGOS:
        raise ConfigError(f"unknown algorithm {algo!r}; valid: {', '.join(sorted(ALGOS))}")
    cfg = base if base is not None else config_class(algo)()
    if overrides:
        try:
            extra = (OmegaConf.create(_nested(overrides)) if isinstance(overrides, Mapping)
                     else OmegaConf.from_dotlist(list(overrides)))
            cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cfg), extra))
        except OmegaConfBaseException as err:
            key = getattr(err, "full_key", None)
            msg = str(getattr(err, "msg", None) or err).splitlines()[0]
            raise ConfigError(f"{key}: {msg}" if key else msg) from None
    validate_config(cfg)
    return cfg


def check_config(algo: str, cfg: Any) -> None:
    """Everything that can be checked before a run starts: types and ranges, the env id,
    and that the env and the policy can be built (a missing optional dependency, a
    discrete-action recipe on a continuous env...). One-line :class:`ConfigError`."""
    validate_config(cfg)
    env = make_run_env(algo, cfg, 1, seed=0)
    try:
        get_recipe(algo).make_policy(cfg, env)
    finally:
        env.close()


def make_run_env(algo: str, cfg: Any, num_envs: int, seed: int | None) -> Any:
    """The env ``algo``'s run trains on (``num_envs`` copies): the multi-agent recipes'
    through :func:`~steersman.recipes.marl_envs.make_marl_env` (discrete actions where the
    recipe needs them), the others' through :func:`~steersman.recipes.envs.make_env`."""
    if algo in MARL_ALGOS:
        from .marl_envs import make_marl_env

        categorical = (getattr(get_recipe(algo), "CATEGORICAL_ACTIONS", False)
                       or getattr(cfg, "categorical_actions", False))
        return make_marl_env(cfg.env.name, num_envs, seed=seed, n_agents=cfg.env.n_agents,
                             max_steps=cfg.env.max_episode_steps, categorical_actions=categorical)
    return make_env(cfg.env.name, num_envs, seed=seed, max_episode_steps=cfg.env.max_episode_steps)


def load_run_config(run_dir: str | os.PathLike, *, allow_import: bool = False) -> tuple[str, Any]:
    """``(algo, config)`` of a run folder, checked like a command line.

    A run folder may come from someone else: its env id may not import a module
    (``gym:module:Env-v0``) unless ``allow_import`` (the ``--allow-import`` flag).
    """
    from .run import RUN_FILE, RunDirError, read_run_config

    algo, data = read_run_config(run_dir)
    where = Path(run_dir) / RUN_FILE
    if algo not in ALGOS:
        raise RunDirError(f"{where}: unknown algorithm {algo!r}; valid: {', '.join(sorted(ALGOS))}")
    try:
        cfg = config_from_dict(config_class(algo), data)
        validate_config(cfg)
        check_env_id(cfg.env.name, allow_import=allow_import)
    except (KeyError, TypeError, ConfigError) as err:
        msg = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
        raise ConfigError(f"{where}: {msg}") from None
    return algo, cfg


def run_recipe(algo: str, overrides: Sequence[str] | Mapping[str, Any] | None = None,
               run_dir: str | os.PathLike | None = None, *, resume: bool = False,
               allow_import: bool = False) -> RunResult:
    """Trains ``algo`` with ``overrides`` into ``run_dir`` (default ``runs/<algo>_<date>_<time>``).

    ``resume=True`` continues the run in ``run_dir`` with its saved config (``overrides``
    may change :data:`~steersman.recipes.run.RESUMABLE_KEYS` such as ``total_frames``);
    a finished run raises :class:`~steersman.recipes.run.RunFinished` and writes nothing.
    ``allow_import``: trust a ``module:`` env id read from that folder.
    """
    from .run import RunDirError, default_run_dir

    if resume:
        if run_dir is None:
            raise RunDirError("resume needs the run folder to continue")
        saved_algo, base = load_run_config(run_dir, allow_import=allow_import)
        if saved_algo != algo:
            raise RunDirError(f"{run_dir} is a {saved_algo} run; it cannot be resumed as {algo}")
        cfg = make_config(algo, overrides, base=base)
    else:
        cfg = make_config(algo, overrides)
    path = Path(run_dir) if run_dir is not None else default_run_dir(algo)
    summary = get_recipe(algo).train(cfg, path, resume=resume)
    return RunResult(algo=algo, dir=path, config=cfg, summary=summary)
