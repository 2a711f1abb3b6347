"""Config pieces shared by the recipes: env, logger, evaluation and checkpoint settings.

Each recipe has one config dataclass (``PPOConfig``, ``SACConfig``...) that nests these
next to its own algorithm settings. Every field has a one-line docstring (the string
under it): :func:`field_docs` reads them, and ``steersman train ALGO --cfg job`` shows
the resolved values. The same dataclasses are Hydra's structured configs, so the command
line overrides any field as ``key=value`` (``env.num_envs=16``, ``optim.lr=3e-4``).

Example:
    >>> cfg = EnvConfig(name="Pendulum-v1", num_envs=4)
    >>> cfg.name, cfg.num_envs
    ('Pendulum-v1', 4)
    >>> field_docs(EnvConfig)["num_envs"]
    'Number of sub-envs stepped together (the batch size of the training env).'
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import functools
import inspect
import json
import math
import textwrap
import types
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CheckpointConfig",
    "ConfigError",
    "EnvConfig",
    "EvalConfig",
    "LoggerConfig",
    "OptimConfig",
    "ClippedOptimConfig",
    "MUJOCO_TASKS",
    "apply_env_defaults",
    "config_from_dict",
    "config_to_dict",
    "diff_configs",
    "with_defaults",
    "field_docs",
    "is_mujoco_env",
    "validate_config",
]


class ConfigError(ValueError):
    """A config value that cannot work (unknown env id, incompatible sizes...): nothing ran."""


@dataclass
class EnvConfig:
    """Which environment to train on, and how many copies."""

    name: str = "CartPole-v1"
    """Env id: a built-in torch env (`steersman envs`) or `gym:<Gymnasium id>`."""
    num_envs: int = 8
    """Number of sub-envs stepped together (the batch size of the training env)."""
    max_episode_steps: int | None = None
    """Time limit per episode (None: the env's own default)."""
    compile: bool = False
    """Run the native env's step through torch.compile (faster with many sub-envs)."""


@dataclass
class OptimConfig:
    """Optimizer settings (Adam unless the recipe says otherwise)."""

    lr: float = 1e-3
    """Learning rate."""


@dataclass
class ClippedOptimConfig:
    """Optimizer settings with gradient-norm clipping."""

    lr: float = 1e-3
    """Learning rate."""
    max_grad_norm: float = 0.5
    """Clip the global gradient norm to this value."""


@dataclass
class LoggerConfig:
    """Where metrics go. `metrics.csv` is always written in the run directory."""

    backends: list[str] = field(default_factory=lambda: ["csv", "tensorboard"])
    """Loggers to write to: csv, tensorboard, wandb, mlflow (the last two when installed)."""
    project: str = "steersman"
    """Project name for wandb/mlflow."""
    log_interval: int = 1
    """Log training metrics every this many iterations."""


@dataclass
class EvalConfig:
    """Deterministic evaluation during and after training."""

    interval: int = 10_000
    """Evaluate every this many frames (0: only at the end)."""
    episodes: int = 10
    """Episodes per evaluation (run side by side as one batched env)."""
    video: bool = False
    """Record a video of one episode at the end (envs that render)."""


@dataclass
class CheckpointConfig:
    """Periodic checkpoints under `<run_dir>/checkpoints`."""

    interval: int = 50_000
    """Save a checkpoint every this many frames (0: only at the end)."""
    keep: int = 3
    """How many checkpoints to keep."""
    replay_buffer: bool = True
    """Include the replay buffer (off-policy runs) so that a resume is exact."""


# ---------------------------------------------------------------- helpers
@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The one-line docstrings of a dataclass's fields (the string under each field); a
    subclass inherits its bases' and may override them."""
    docs: dict[str, str] = {}
    for base in reversed(cls.__mro__[1:]):
        if dataclasses.is_dataclass(base):
            docs.update(_own_field_docs(base))
    docs.update(_own_field_docs(cls))
    return docs


def _own_field_docs(cls: type) -> dict[str, str]:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):  # pragma: no cover - no source (frozen apps)
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for node, nxt in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            docs[node.target.id] = nxt.value.value.strip()
    return docs


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """A (nested) config dataclass as plain JSON-able dicts.

    Example:
        >>> config_to_dict(EvalConfig(episodes=3))
        {'interval': 10000, 'episodes': 3, 'video': False}
    """
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def config_from_dict(cls: type, data: dict[str, Any]) -> Any:
    """Builds the config dataclass ``cls`` from plain dicts (as :func:`config_to_dict` wrote).

    Unknown keys raise a ``KeyError`` that lists the valid ones.

    Example:
        >>> config_from_dict(EvalConfig, {"episodes": 3}).episodes
        3
        >>> config_from_dict(EvalConfig, {"episode": 3})
        Traceback (most recent call last):
        ...
        KeyError: "unknown config key 'episode' in EvalConfig; valid keys: ['interval', 'episodes', 'video']"
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key not in fields:
            raise KeyError(f"unknown config key {key!r} in {cls.__name__}; valid keys: {list(fields)}")
        sub = _dataclass_type(cls, fields[key])
        kwargs[key] = config_from_dict(sub, value) if sub is not None and isinstance(value, dict) else value
    return cls(**kwargs)


def _dataclass_type(cls: type, f: dataclasses.Field) -> type | None:
    """The dataclass type of field ``f`` of ``cls`` (annotations may be strings), or None."""
    hints = _type_hints(cls)
    t = hints.get(f.name)
    return t if isinstance(t, type) and dataclasses.is_dataclass(t) else None


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    import typing

    return typing.get_type_hints(cls)


def diff_configs(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[tuple[str, Any, Any]]:
    """``(dotted key, old value, new value)`` for every leaf that differs.

    Example:
        >>> diff_configs({"a": 1, "b": {"c": 2}}, {"a": 1, "b": {"c": 3}})
        [('b.c', 2, 3)]
    """
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        name = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += diff_configs(a, b, name + ".")
        elif a != b:
            out.append((name, a, b))
    return out


def with_defaults(old: dict[str, Any], cls: type) -> dict[str, Any]:
    """``old`` (a saved config dict) with the defaults of ``cls`` for keys it lacks: a run
    folder written before a field existed was trained with that field's default.

    Example:
        >>> with_defaults({"interval": 5}, EvalConfig)
        {'interval': 5, 'episodes': 10, 'video': False}
    """
    return _fill(old, config_to_dict(cls()))


def _fill(old: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    out = dict(old)
    for key, value in defaults.items():
        if key not in out:
            out[key] = value
        elif isinstance(out[key], dict) and isinstance(value, dict):
            out[key] = _fill(out[key], value)
    return out


# ---------------------------------------------------------------- validation
#: Range rules by field name (any recipe, any nesting): (lowest allowed, lowest is allowed).
_AT_LEAST = {
    **dict.fromkeys(["total_frames", "num_updates", "num_envs", "n_steps", "epochs", "minibatch_size",
                     "frames_per_batch", "gradient_steps", "batch_size", "buffer_size", "dataset_frames",
                     "episodes", "keep", "log_interval", "policy_delay", "target_update_interval",
                     "max_episode_steps"], 1),
    **dict.fromkeys(["interval", "learning_starts", "num_threads", "alpha_init", "entropy_coef",
                     "critic_coef", "exploration_noise", "policy_noise", "noise_clip", "temperature"], 0),
}
_POSITIVE = {"lr", "max_grad_norm", "eps", "utd_ratio"}
_UNIT = {"gamma", "gae_lambda", "tau", "exploration_fraction", "eps_init", "eps_end", "expectile", "clip_epsilon"}
_CHOICES = {"export_format": ("torch-export", "onnx", "none"), "loss_function": ("l2", "smooth_l1", "l1"),
            "preset": ("auto", "mujoco", "none"), "backend": ("none", "ray")}


def validate_config(cfg: Any, prefix: str = "") -> None:
    """Checks every field of a (nested) config dataclass: its type, and its range for the
    counts and rates every recipe shares (``total_frames >= 1``, ``0 <= gamma <= 1``...).

    Raises a one-line :class:`ConfigError` naming the dotted key, what it must be and
    what it is. Values from YAML or the command line are checked the same way.

    Example:
        >>> validate_config(EvalConfig(episodes=0))
        Traceback (most recent call last):
        ...
        steersman.recipes.config.ConfigError: episodes must be an integer >= 1, got 0
    """
    hints = _type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        key, value, want = prefix + f.name, getattr(cfg, f.name), hints[f.name]
        if isinstance(want, type) and dataclasses.is_dataclass(want):
            if not isinstance(value, want):
                raise ConfigError(f"{key} must be a group of settings ({want.__name__}), got {value!r}")
            validate_config(value, key + ".")
            continue
        _check_value(key, f.name, value, want)
    if not prefix:
        _check_sizes(cfg)


def _check_value(key: str, name: str, value: Any, want: Any) -> None:
    import typing

    args = typing.get_args(want)
    if value is None and type(None) in args:
        return
    base = typing.get_origin(want) or want
    if base in (typing.Union, types.UnionType):
        base = next(a for a in args if a is not type(None))
    if base is list:
        item = typing.get_args(want)[0] if typing.get_args(want) else Any
        if not isinstance(value, list) or not all(_is(v, item) for v in value):
            raise ConfigError(f"{key} must be a list of {_type_name(item)}, got {value!r}")
        if name == "backends":
            from steersman.record import LOGGER_TYPES

            bad = [v for v in value if v not in LOGGER_TYPES]
            if bad:
                raise ConfigError(f"{key}: unknown logger {bad[0]!r}; valid: {', '.join(LOGGER_TYPES)}")
        elif name == "hidden_sizes" and any(v < 1 for v in value):
            raise ConfigError(f"{key} must be layer widths >= 1, got {value!r}")
        return
    if not _is(value, base):
        raise ConfigError(f"{key} must be {_type_name(base, article=True)}, got {value!r}")
    if name in _AT_LEAST and value < _AT_LEAST[name]:
        raise ConfigError(f"{key} must be {_type_name(base, article=True)} >= {_AT_LEAST[name]}, got {value!r}")
    if name in _POSITIVE and not value > 0:
        raise ConfigError(f"{key} must be a number > 0, got {value!r}")
    if name in _UNIT and not 0 <= value <= 1:
        raise ConfigError(f"{key} must be a number in [0, 1], got {value!r}")
    if name in _CHOICES and value not in _CHOICES[name]:
        raise ConfigError(f"{key} must be one of {', '.join(_CHOICES[name])}, got {value!r}")
    if name == "target_entropy" and value != "auto":
        try:
            float(value)
        except ValueError:
            raise ConfigError(f"{key} must be 'auto' or a number, got {value!r}") from None


def _is(value: Any, t: Any) -> bool:
    if t is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if t is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return t is Any or isinstance(value, t)


def _type_name(t: Any, article: bool = False) -> str:
    names = {int: ("integers", "an integer"), float: ("numbers", "a number"), str: ("strings", "a string"),
             bool: ("booleans", "true or false")}
    plural, single = names.get(t, (getattr(t, "__name__", str(t)), getattr(t, "__name__", str(t))))
    return single if article else plural


def _check_sizes(cfg: Any) -> None:
    """Sizes that must fit each other (whole steps per sub-env, whole minibatches)."""
    num_envs = cfg.env.num_envs
    per_batch = getattr(cfg, "frames_per_batch", None)
    if per_batch is not None and per_batch % num_envs:
        raise ConfigError(f"frames_per_batch ({per_batch}) must be a multiple of env.num_envs ({num_envs}): "
                          "each batch holds the same number of steps of every sub-env")
    if hasattr(cfg, "n_steps") and hasattr(cfg, "minibatch_size"):
        per_batch = num_envs * cfg.n_steps
        if per_batch % cfg.minibatch_size:
            raise ConfigError(f"minibatch_size ({cfg.minibatch_size}) must divide env.num_envs x n_steps "
                              f"({num_envs} x {cfg.n_steps} = {per_batch})")


MUJOCO_TASKS = frozenset({"Ant", "HalfCheetah", "Hopper", "Humanoid", "HumanoidStandup", "InvertedDoublePendulum",
                          "InvertedPendulum", "Pusher", "Reacher", "Swimmer", "Walker2d"})
"""Gymnasium MuJoCo task names (any version): ``gym:HalfCheetah-v5`` is one."""


def is_mujoco_env(name: str) -> bool:
    """Whether the env id ``name`` is a Gymnasium MuJoCo task (``gym:<task>-v<N>``).

    Example:
        >>> is_mujoco_env("gym:HalfCheetah-v5"), is_mujoco_env("Pendulum-v1")
        (True, False)
    """
    if not name.startswith("gym:"):
        return False
    return name[len("gym:"):].rsplit("-v", 1)[0] in MUJOCO_TASKS


def apply_env_defaults(cfg: Any, defaults: dict[str, Any]) -> Any:
    """A copy of ``cfg`` where each dotted key of ``defaults`` whose value is still the
    config class's own default takes the value from ``defaults``; keys set to anything
    else (the user's overrides) are kept. ``cfg`` itself is not changed.

    Example:
        >>> cfg = EvalConfig(episodes=3)
        >>> out = apply_env_defaults(cfg, {"interval": 50_000, "episodes": 5})
        >>> out.interval, out.episodes, cfg.interval
        (50000, 3, 10000)
    """
    out = copy.deepcopy(cfg)
    reference = type(cfg)()
    for key, value in defaults.items():
        *path, last = key.split(".")
        node, ref = out, reference
        for part in path:
            node, ref = getattr(node, part), getattr(ref, part)
        if getattr(node, last) == getattr(ref, last):
            setattr(node, last, copy.deepcopy(value))
    return out


def resolve_preset(cfg: Any, mujoco_defaults: dict[str, Any]) -> Any:
    """``cfg`` with ``mujoco_defaults`` applied to the fields still at their class default
    when ``cfg.preset`` is mujoco, or auto with a Gymnasium MuJoCo env id; that result has
    ``preset="none"`` (the run's ``config.yaml`` holds it, so a resume reuses exactly these
    values). Otherwise ``cfg`` as is; ``cfg`` itself is never changed."""
    if cfg.preset == "mujoco" or (cfg.preset == "auto" and is_mujoco_env(cfg.env.name)):
        return dataclasses.replace(apply_env_defaults(cfg, mujoco_defaults), preset="none")
    return cfg
