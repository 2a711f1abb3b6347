"""DDPG (Lillicrap et al., 2016): a deterministic actor trained through a learned Q-function.

The defaults are rl-zoo's Pendulum-v1 settings (as for TD3: Adam lr 1e-3, [400, 300]
MLPs, gamma 0.98, Gaussian exploration noise 0.1, 10,000 random frames first, one update
per frame, soft target updates with tau 0.005). The networks are TD3's
(:func:`steersman.recipes.td3.make_policy`, :func:`~steersman.recipes.td3.make_qvalue`).

Run it: ``steersman train ddpg``; from Python::

    from steersman.recipes.ddpg import DDPGConfig, train
    summary = train(DDPGConfig(total_frames=20_000), "runs/ddpg")

The loop: collect ``frames_per_batch`` frames with the noisy actor into the replay buffer;
per update, one step of the critic's TD loss and of the actor's ``-Q(s, mu(s))``
(:class:`~steersman.objectives.DDPGLoss`), then a soft update of the target networks;
evaluate, checkpoint, log.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from steersman.collectors import SyncDataCollector
from steersman.data import LazyTensorStorage, TensorDictReplayBuffer
from steersman.envs import EnvBase
from steersman.modules import AdditiveGaussianModule
from steersman.objectives import DDPGLoss, SoftUpdate
from steersman.objectives.functional_update import CompiledUpdate, FunctionalUpdate, OptimizerState
from steersman.tensordict.nn import TensorDictSequential, optim

from . import td3
from .config import CheckpointConfig, EnvConfig, EvalConfig, LoggerConfig, OptimConfig
from .envs import TRANSITION_KEYS
from .evaluation import EpisodeReturns, evaluate
from .run import EVAL_SEED_OFFSET, Run, setup

__all__ = ["DDPGConfig", "make_policy", "train"]


@dataclass
class DDPGConfig:
    """Configuration of the DDPG recipe (defaults: rl-zoo Pendulum-v1)."""

    env: EnvConfig = field(default_factory=lambda: EnvConfig(name="Pendulum-v1", num_envs=1))
    """The training env (continuous actions)."""
    total_frames: int = 20_000
    """Frames (env steps summed over sub-envs) to train for."""
    frames_per_batch: int = 1
    """Frames collected between two rounds of updates."""
    utd_ratio: float = 1.0
    """Updates per collected frame."""
    batch_size: int = 256
    """Transitions per update."""
    buffer_size: int = 200_000
    """Replay buffer capacity (transitions)."""
    learning_starts: int = 10_000
    """Random-action frames collected before the first update."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-3))
    """Adam settings (actor and critic)."""
    gamma: float = 0.98
    """Discount factor."""
    tau: float = 0.005
    """Soft target update rate."""
    exploration_noise: float = 0.1
    """Std of the Gaussian noise added to actions while collecting (in half action ranges)."""
    hidden_sizes: list[int] = field(default_factory=lambda: [400, 300])
    """Hidden layer widths of the actor and of the critic."""
    compile: bool = False
    """torch.compile each update as one graph (the functional update; eager, with a warning, if it cannot)."""
    compile_backend: str = "inductor"
    """torch.compile backend with compile=true (aot_eager: no code generation, eager kernels)."""
    seed: int = 0
    """Seed of torch, numpy, random and the envs."""
    num_threads: int = 1
    """torch CPU threads (1 is fastest for small networks; 0: torch's default)."""
    quiet: bool = False
    """No progress bar (CI, logs); the summary is still printed."""
    export_format: str = "torch-export"
    """Policy file written at the end: torch-export, onnx or none."""
    logger: LoggerConfig = field(default_factory=lambda: LoggerConfig(log_interval=200))
    """Metrics loggers."""
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(interval=2_000, episodes=10))
    """Evaluation schedule."""
    checkpoint: CheckpointConfig = field(default_factory=lambda: CheckpointConfig(interval=10_000))
    """Checkpoint schedule (the replay buffer is included)."""


def make_policy(cfg: DDPGConfig, env: EnvBase) -> nn.Module:
    """The deterministic actor (see :func:`steersman.recipes.td3.make_policy`)."""
    return td3.make_policy(cfg, env)


def train(cfg: DDPGConfig | None = None, run_dir: str | Path | None = None, *, resume: bool = False) -> dict[str, Any]:
    """Trains DDPG as configured, writing ``run_dir``; returns the run's summary."""
    cfg = cfg if cfg is not None else DDPGConfig()
    env, eval_env = setup(cfg)
    actor, critic = td3.make_policy(cfg, env), td3.make_qvalue(cfg, env)
    box = td3.action_box(env)
    sigma = cfg.exploration_noise * float((box.high - box.low).max()) / 2  # SB3: noise on the [-1, 1] scale
    policy = TensorDictSequential(actor, AdditiveGaussianModule(box, sigma_init=sigma, sigma_end=sigma,
                                                                annealing_num_steps=1))
    loss_fn = DDPGLoss(actor, critic, loss_function="l2")
    loss_fn.make_value_estimator(gamma=cfg.gamma)
    target_updater = SoftUpdate(loss_fn, tau=cfg.tau)
    if cfg.compile:  # a pure functional step (torch.func gradients, functional Adam, soft target update), compiled whole
        functional = FunctionalUpdate(loss_fn, optim.Adam(lr=cfg.optim.lr))
        optimizer: Any = OptimizerState(functional.optimizer.init(functional.params()))
    else:  # the two terms reach disjoint parameters
        optimizer = torch.optim.Adam(loss_fn.parameters(), lr=cfg.optim.lr, fused=True)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(cfg.buffer_size), batch_size=cfg.batch_size)
    updates_per_batch = max(int(cfg.frames_per_batch * cfg.utd_ratio), 1)
    run = Run("ddpg", cfg, run_dir, resume=resume, frames_per_batch=cfg.frames_per_batch)
    collector = SyncDataCollector(env, policy, frames_per_batch=cfg.frames_per_batch,
                                  total_frames=run.total_frames, init_random_frames=cfg.learning_starts)
    episodes = EpisodeReturns()
    run.track(policy=actor, loss=loss_fn, optim=optimizer, collector=collector, episodes=episodes, buffer=rb)
    # after track: it starts from the restored parameters
    compiled = CompiledUpdate(functional, optimizer, tau=cfg.tau, backend=cfg.compile_backend) if cfg.compile else None

    def update(sample):
        if compiled is not None:
            return compiled(sample)  # the step and the soft target update
        losses = loss_fn(sample)
        optimizer.zero_grad(set_to_none=True)
        (losses["loss_actor"] + losses["loss_value"]).backward()
        optimizer.step()
        target_updater.step()
        return losses

    frames = run.frames
    metrics: dict[str, Any] = {}
    for batch in collector:
        frames += batch.numel()
        episodes.update(batch)
        rb.extend(batch.reshape(-1).select(*TRANSITION_KEYS))

        if frames >= cfg.learning_starts:
            for _ in range(updates_per_batch):
                losses = update(rb.sample())
            if compiled is not None:
                compiled.sync()  # the actor (collection, eval, checkpoints) gets the new parameters
            metrics = {"train/loss_actor": losses["loss_actor"], "train/loss_value": losses["loss_value"]}

        run.log(frames, {"train/return": episodes.last_mean, **metrics})
        if run.eval_due(frames):
            run.log_eval(frames, evaluate(eval_env, actor, seed=cfg.seed + EVAL_SEED_OFFSET))
        if run.checkpoint_due(frames):
            run.save()
        if run.stop_requested:
            break
    collector.shutdown()
    return run.wrap_up(actor, eval_env)


if __name__ == "__main__":  # pragma: no cover
    train()
