"""A2C (Mnih et al., 2016, synchronous): one policy-gradient step per short on-policy batch.

The defaults are Stable-Baselines3/rl-zoo's CartPole-v1 settings (8 envs x 5 steps per
batch, RMSprop lr 7e-4, gamma 0.99, plain n-step advantages (GAE lambda 1), no entropy
bonus); CartPole reaches a return of 500 within a few hundred thousand frames.

Run it: ``steersman train a2c``; from Python::

    from steersman.recipes.a2c import A2CConfig, train
    summary = train(A2CConfig(total_frames=200_000), "runs/a2c")

The loop: collect ``num_envs x n_steps`` frames; advantages with GAE; one gradient step of
the policy-gradient + value + entropy loss (:class:`~steersman.objectives.A2CLoss`);
evaluate, checkpoint, log. The networks are PPO's (:func:`steersman.recipes.ppo.make_policy`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from steersman.collectors import SyncDataCollector
from steersman.envs import EnvBase
from steersman.objectives import A2CLoss, ValueEstimators
from steersman.objectives.functional_update import CompiledUpdate, FunctionalUpdate, OptimizerState
from steersman.tensordict.nn import optim, shared_copy

from . import ppo
from .config import CheckpointConfig, ClippedOptimConfig, EnvConfig, EvalConfig, LoggerConfig
from .evaluation import EpisodeReturns, evaluate
from .run import EVAL_SEED_OFFSET, Run, setup

__all__ = ["A2CConfig", "make_policy", "train"]


@dataclass
class A2CConfig:
    """Configuration of the A2C recipe (defaults: SB3/rl-zoo CartPole-v1)."""

    env: EnvConfig = field(default_factory=lambda: EnvConfig(name="CartPole-v1", num_envs=8))
    """The training env."""
    total_frames: int = 500_000
    """Frames (env steps summed over sub-envs) to train for."""
    n_steps: int = 5
    """Steps per sub-env in each batch (batch = num_envs x n_steps frames, one update)."""
    optim: ClippedOptimConfig = field(default_factory=lambda: ClippedOptimConfig(lr=7e-4, max_grad_norm=0.5))
    """RMSprop settings."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 1.0
    """GAE lambda (1: n-step returns bootstrapped at the end of the batch)."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus."""
    critic_coef: float = 0.5
    """Weight of the value loss."""
    hidden_sizes: list[int] = field(default_factory=lambda: [64, 64])
    """Hidden layer widths of the actor and of the critic."""
    ortho_init: bool = True
    """Orthogonal init (gain sqrt 2; 0.01 for the policy head, 1 for the value head)."""
    compile: bool = False
    """torch.compile the whole update as one graph (eager, with a warning, if it cannot)."""
    compile_backend: str = "inductor"
    """torch.compile backend with compile=true (aot_eager: no code generation, eager kernels)."""
    seed: int = 0
    """Seed of torch, numpy, random and the envs."""
    seeds: int = 1
    """Agents trained at once in this process, seeds seed..seed+seeds-1 (> 1: recipes/multiseed.py, one vmapped update)."""
    sweep: dict[str, Any] = field(default_factory=dict)
    """Per-member values of numeric settings, e.g. sweep.optim.lr=[1e-3,3e-4]: every combination x seeds, in one process."""
    num_threads: int = 1
    """torch CPU threads (1 is fastest for small networks; 0: torch's default)."""
    quiet: bool = False
    """No progress bar (CI, logs); the summary is still printed."""
    export_format: str = "torch-export"
    """Policy file written at the end: torch-export, onnx or none."""
    logger: LoggerConfig = field(default_factory=lambda: LoggerConfig(log_interval=25))
    """Metrics loggers."""
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(interval=25_000, episodes=10))
    """Evaluation schedule."""
    checkpoint: CheckpointConfig = field(default_factory=lambda: CheckpointConfig(interval=100_000))
    """Checkpoint schedule."""


def make_policy(cfg: A2CConfig, env: EnvBase) -> nn.Module:
    """The actor (see :func:`steersman.recipes.ppo.make_policy`)."""
    return ppo.make_policy(cfg, env)


def train(cfg: A2CConfig | None = None, run_dir: str | Path | None = None, *, resume: bool = False) -> dict[str, Any]:
    """Trains A2C as configured, writing ``run_dir``; returns the run's summary."""
    cfg = cfg if cfg is not None else A2CConfig()
    if cfg.seeds != 1 or cfg.sweep:  # many agents in one process (seeds < 1 is refused there)
        from . import multiseed

        return multiseed.train_a2c(cfg, run_dir, resume=resume)
    env, eval_env = setup(cfg)
    frames_per_batch = cfg.env.num_envs * cfg.n_steps
    actor, critic = ppo.make_policy(cfg, env), ppo.make_critic(cfg, env)
    loss_fn = A2CLoss(actor, critic, entropy_coeff=cfg.entropy_coef, critic_coeff=cfg.critic_coef,
                      loss_critic_type="l2")
    loss_fn.make_value_estimator(ValueEstimators.GAE, gamma=cfg.gamma, lmbda=cfg.gae_lambda)
    params = [p for p in loss_fn.parameters() if p.requires_grad]
    if cfg.compile:  # a pure functional step (torch.func gradients, functional RMSprop), compiled whole
        functional = FunctionalUpdate(loss_fn, optim.RMSprop(lr=cfg.optim.lr, alpha=0.99, eps=1e-5),
                                      max_grad_norm=cfg.optim.max_grad_norm)
        optimizer: Any = OptimizerState(functional.optimizer.init(functional.params()))
    else:
        optimizer = torch.optim.RMSprop(params, lr=cfg.optim.lr, alpha=0.99, eps=1e-5, foreach=True)
    policy = shared_copy(actor)
    run = Run("a2c", cfg, run_dir, resume=resume, frames_per_batch=frames_per_batch)
    collector = SyncDataCollector(env, policy, frames_per_batch=frames_per_batch, total_frames=run.total_frames)
    episodes = EpisodeReturns()
    run.track(policy=actor, loss=loss_fn, optim=optimizer, collector=collector, episodes=episodes)
    # after track: it starts from the restored parameters
    compiled = CompiledUpdate(functional, optimizer, backend=cfg.compile_backend) if cfg.compile else None

    frames = run.frames
    for batch in collector:
        frames += batch.numel()
        episodes.update(batch)

        with torch.no_grad():
            loss_fn.value_estimator(batch)
        if compiled is not None:
            losses = compiled(batch.exclude("next"))
            grad_norm = losses["grad_norm"]
            compiled.sync()  # the modules (collection, eval, checkpoints, export) get the new parameters
        else:
            losses = loss_fn(batch.exclude("next"))
            total = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
            optimizer.zero_grad(set_to_none=True)
            total.backward()
            grad_norm = nn.utils.clip_grad_norm_(params, cfg.optim.max_grad_norm, foreach=True)
            optimizer.step()

        run.log(frames, {"train/return": episodes.last_mean, "train/loss_objective": losses["loss_objective"],
                         "train/loss_critic": losses["loss_critic"], "train/entropy": losses["entropy"],
                         "train/grad_norm": grad_norm})
        if run.eval_due(frames):
            run.log_eval(frames, evaluate(eval_env, policy, seed=cfg.seed + EVAL_SEED_OFFSET))
        if run.checkpoint_due(frames):
            run.save()
        if run.stop_requested:
            break
    collector.shutdown()
    return run.wrap_up(policy, eval_env)


if __name__ == "__main__":  # pragma: no cover
    train()
