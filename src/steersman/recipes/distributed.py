"""Distributed collection for the recipes: ``distributed.backend=ray`` (the ``distributed``
settings of a recipe's config) swaps the local collector and replay buffer for
:class:`~steersman.distributed.RayCollector` actors writing into a
:class:`~steersman.distributed.RayReplayBuffer`; with ``backend=none`` (the default) the
helpers return the local ones, so a recipe reads the same either way::

    steersman train sac distributed.backend=ray distributed.num_collectors=4 frames_per_batch=64
    steersman train ppo distributed=ray distributed.num_collectors=2     # on-policy: always sync

The run directory, metrics, checkpoints and ``steersman resume`` are those of a local
run. ``distributed.address=auto`` joins a cluster started with ``ray start --head``
(see ``docs/distributed.md``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from steersman.collectors import SyncDataCollector
from steersman.data import LazyTensorStorage, TensorDictReplayBuffer

from .config import ConfigError
from .envs import TRANSITION_KEYS, make_env

__all__ = ["DistributedConfig", "check_distributed", "make_collector", "make_replay_buffer", "shutdown"]

BACKENDS = ("none", "ray")
PREFETCH = 2
"""Samples the learner requests ahead from a remote buffer (hides the round trip of each update)."""


@dataclass
class DistributedConfig:
    """Where collection runs: in this process (``none``) or in Ray actors (``ray``)."""

    backend: str = "none"
    """none (local collector and buffer) or ray (collector actors and a buffer actor)."""
    num_collectors: int = 2
    """Collector actors (each runs env.num_envs sub-envs)."""
    address: str | None = None
    """Ray cluster to join: None starts a local Ray, auto joins `ray start --head` on this machine, or host:port."""
    sync: bool = False
    """Gather one batch from every actor per step (true), or take batches as they come (false)."""
    cpus_per_collector: float = 1.0
    """CPUs Ray reserves per collector actor."""
    max_restarts: int = 3
    """Times a dead collector or buffer actor is restarted before the run fails."""
    checkpoint_interval: int = 0
    """Transitions between two checkpoints of the buffer actor (0: none; a restarted actor loses what came after)."""


def check_distributed(d: DistributedConfig) -> None:
    """One-line ConfigError for a value that cannot work."""
    if d.backend not in BACKENDS:
        raise ConfigError(f"distributed.backend must be one of {', '.join(BACKENDS)}, got {d.backend!r}")
    for name in ("num_collectors", "max_restarts", "checkpoint_interval"):
        low = 1 if name == "num_collectors" else 0
        if getattr(d, name) < low:
            raise ConfigError(f"distributed.{name} must be an integer >= {low}, got {getattr(d, name)!r}")
    if not d.cpus_per_collector >= 0:
        raise ConfigError(f"distributed.cpus_per_collector must be a number >= 0, got {d.cpus_per_collector!r}")


class SelectTransitions:
    """Keeps the transition entries of a batch (what the off-policy recipes store)."""

    def __call__(self, batch: Any) -> Any:
        return batch.select(*TRANSITION_KEYS)


def make_replay_buffer(d: DistributedConfig, size: int, batch_size: int, run_dir: Path) -> Any:
    """A local ``TensorDictReplayBuffer`` of ``size`` transitions, or the same in a Ray actor
    (checkpointed under ``run_dir/replay_actor`` every ``checkpoint_interval`` transitions;
    the learner's samples are requested :data:`PREFETCH` ahead)."""
    check_distributed(d)
    if d.backend == "none":
        return TensorDictReplayBuffer(storage=LazyTensorStorage(size), batch_size=batch_size)
    from steersman.distributed import RayReplayBuffer

    ckpt = (Path(run_dir) / "replay_actor") if d.checkpoint_interval else None
    return RayReplayBuffer(storage=LazyTensorStorage(size), batch_size=batch_size, checkpoint_dir=ckpt,
                           checkpoint_interval=d.checkpoint_interval, max_restarts=d.max_restarts,
                           ray_init_config=_ray_init(d), prefetch=PREFETCH)


def _ray_init(d: DistributedConfig) -> dict:
    return {"address": d.address} if d.address else {"num_cpus": max(d.num_collectors, 1)}


def make_collector(d: DistributedConfig, cfg: Any, env: Any, policy: Any, *, frames_per_batch: int, total_frames: int,
                   init_random_frames: int = 0, replay_buffer: Any = None, on_policy: bool = False) -> Any:
    """The recipe's collector of ``frames_per_batch`` frames per batch: a local
    ``SyncDataCollector`` over ``env``, or a :class:`~steersman.distributed.RayCollector`
    with ``num_collectors`` actors, each building ``cfg.env`` itself (seeded
    ``cfg.seed + 1000 * actor``). With ``sync`` a batch gathers ``frames_per_batch //
    num_collectors`` frames of every actor (``[num_collectors, num_envs, T]``); otherwise
    each batch comes from one actor. With a remote ``replay_buffer`` the actors write into
    it (the random frames are shared out among them) and batches are ``None``.

    ``on_policy=True`` (PPO): always sync, whatever ``distributed.sync`` says (every batch
    is collected with the weights of the last update), and the ``env.num_envs`` sub-envs
    are shared out among the actors (``num_envs / num_collectors`` each, ``T`` steps as
    locally): a batch is ``[num_collectors, num_envs / num_collectors, T]``, the same
    frames and trajectory length as a local batch ``[num_envs, T]`` (reshape it so)."""
    check_distributed(d)
    if d.backend == "none":
        return SyncDataCollector(env, policy, frames_per_batch=frames_per_batch, total_frames=total_frames,
                                 init_random_frames=init_random_frames)
    from steersman.distributed import RayCollector

    sync = d.sync or on_policy
    num_envs = cfg.env.num_envs
    if on_policy:
        if num_envs % d.num_collectors:
            raise ConfigError(f"an on-policy recipe shares env.num_envs ({num_envs}) out among "
                              f"distributed.num_collectors ({d.num_collectors}): it must be a multiple of it")
        num_envs //= d.num_collectors
    per_actor = frames_per_batch // d.num_collectors if sync else frames_per_batch
    if sync and (frames_per_batch % d.num_collectors or per_actor % num_envs):
        raise ConfigError(f"with distributed.sync, frames per batch ({frames_per_batch}) must be a multiple of "
                          f"distributed.num_collectors x env.num_envs ({d.num_collectors} x {cfg.env.num_envs})")
    env_fn = functools.partial(make_env, cfg.env.name, num_envs, max_episode_steps=cfg.env.max_episode_steps)
    kwargs: dict[str, Any] = {"init_random_frames": math.ceil(init_random_frames / d.num_collectors)}
    if replay_buffer is not None:
        kwargs["postproc"] = SelectTransitions()
    return RayCollector(env_fn, policy, frames_per_batch=frames_per_batch, total_frames=total_frames,
                        collector_kwargs=kwargs, num_collectors=d.num_collectors, sync=sync,
                        remote_configs={"num_cpus": d.cpus_per_collector}, max_restarts=d.max_restarts,
                        replay_buffer=replay_buffer, seed=cfg.seed, ray_init_config=_ray_init(d))


def shutdown(collector: Any, buffer: Any = None) -> None:
    """Stops the collector (and its actors), the buffer actor and a Ray started here."""
    collector.shutdown()
    if buffer is not None and hasattr(buffer, "shutdown"):
        buffer.shutdown()
    if not isinstance(collector, SyncDataCollector):
        from steersman.distributed import shutdown_ray

        shutdown_ray()
