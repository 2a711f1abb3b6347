"""DQN (Mnih et al., 2015): Q-learning from a replay buffer with a target network.

The defaults are rl-zoo's tuned CartPole-v1 settings (Adam lr 2.3e-3, [256, 256] MLP,
batch 64, 128 gradient steps after every 256 frames, epsilon 1 -> 0.04 over the first 16%
of the run, 1,000 random frames first, target copied after each round of updates).

Run it: ``steersman train dqn``; from Python::

    from steersman.recipes.dqn import DQNConfig, train
    summary = train(DQNConfig(total_frames=50_000), "runs/dqn")

The loop: collect ``frames_per_batch`` frames with the epsilon-greedy policy into the
replay buffer; then ``gradient_steps`` updates of the TD loss
(:class:`~steersman.objectives.DQNLoss`) on sampled minibatches; copy the target network
(:class:`~steersman.objectives.HardUpdate`); anneal epsilon; evaluate, checkpoint, log.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from steersman.collectors import SyncDataCollector
from steersman.data import Categorical, LazyTensorStorage, TensorDictReplayBuffer
from steersman.envs import EnvBase
from steersman.modules import MLP, EGreedyModule, QValueActor
from steersman.objectives import DQNLoss, HardUpdate
from steersman.objectives.functional_update import CompiledUpdate, FunctionalUpdate, OptimizerState
from steersman.tensordict.nn import TensorDictSequential, optim

from .config import (
    CheckpointConfig,
    ClippedOptimConfig,
    ConfigError,
    EnvConfig,
    EvalConfig,
    LoggerConfig,
)
from .envs import TRANSITION_KEYS, action_spec_unbatched
from .evaluation import EpisodeReturns, evaluate
from .run import EVAL_SEED_OFFSET, Run, setup

__all__ = ["DQNConfig", "make_policy", "train"]


@dataclass
class DQNConfig:
    """Configuration of the DQN recipe (defaults: rl-zoo CartPole-v1)."""

    env: EnvConfig = field(default_factory=lambda: EnvConfig(name="CartPole-v1", num_envs=1))
    """The training env (discrete actions)."""
    total_frames: int = 50_000
    """Frames (env steps summed over sub-envs) to train for."""
    frames_per_batch: int = 256
    """Frames collected between two rounds of updates."""
    gradient_steps: int = 128
    """Updates after each batch."""
    batch_size: int = 64
    """Transitions per update."""
    buffer_size: int = 100_000
    """Replay buffer capacity (transitions)."""
    learning_starts: int = 1_000
    """Random-action frames collected before the first update."""
    optim: ClippedOptimConfig = field(default_factory=lambda: ClippedOptimConfig(lr=2.3e-3, max_grad_norm=10.0))
    """Adam settings."""
    gamma: float = 0.99
    """Discount factor."""
    double_dqn: bool = False
    """Double DQN: the online network picks the next action, the target rates it."""
    loss_function: str = "smooth_l1"
    """TD error distance: smooth_l1 (Huber), l2 or l1."""
    target_update_interval: int = 1
    """Copy the online network into the target every this many batches."""
    eps_init: float = 1.0
    """Initial epsilon of the epsilon-greedy exploration."""
    eps_end: float = 0.04
    """Final epsilon."""
    exploration_fraction: float = 0.16
    """Fraction of the run over which epsilon decays."""
    hidden_sizes: list[int] = field(default_factory=lambda: [256, 256])
    """Hidden layer widths of the Q-network."""
    compile: bool = False
    """torch.compile each update as one graph (the functional update; eager, with a warning, if it cannot)."""
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
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    """Metrics loggers."""
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(interval=5_000, episodes=10))
    """Evaluation schedule."""
    checkpoint: CheckpointConfig = field(default_factory=lambda: CheckpointConfig(interval=25_000))
    """Checkpoint schedule (the replay buffer is included)."""


def make_policy(cfg: DQNConfig, env: EnvBase) -> QValueActor:
    """The greedy policy: an MLP Q-network ``"observation" -> "action_value"`` and its argmax."""
    spec = action_spec_unbatched(env)
    if not isinstance(spec, Categorical):
        raise ConfigError(f"DQN needs discrete actions; {cfg.env.name} has a {type(spec).__name__} action spec")
    obs_dim = env.observation_spec["observation"].shape[-1]
    net = MLP(in_features=obs_dim, out_features=spec.n, num_cells=cfg.hidden_sizes, activation_class=nn.ReLU)
    return QValueActor(net, in_keys=["observation"], spec=spec)


def train(cfg: DQNConfig | None = None, run_dir: str | Path | None = None, *, resume: bool = False) -> dict[str, Any]:
    """Trains DQN as configured, writing ``run_dir``; returns the run's summary."""
    cfg = cfg if cfg is not None else DQNConfig()
    if cfg.seeds != 1 or cfg.sweep:  # many agents in one process (seeds < 1 is refused there)
        from . import multiseed

        return multiseed.train_dqn(cfg, run_dir, resume=resume)
    env, eval_env = setup(cfg)
    qnet = make_policy(cfg, env)
    explore = EGreedyModule(env.action_spec, eps_init=cfg.eps_init, eps_end=cfg.eps_end,
                            annealing_num_steps=max(int(cfg.exploration_fraction * cfg.total_frames), 1))
    policy = TensorDictSequential(qnet, explore)
    loss_fn = DQNLoss(qnet, loss_function=cfg.loss_function, delay_value=True, double_dqn=cfg.double_dqn,
                      action_space=env.action_spec)
    loss_fn.make_value_estimator(gamma=cfg.gamma)
    target_updater = HardUpdate(loss_fn, value_network_update_interval=cfg.target_update_interval)
    params = [p for p in loss_fn.parameters() if p.requires_grad]  # not the target network
    if cfg.compile:  # a pure functional step (torch.func gradients, functional Adam), compiled whole
        functional = FunctionalUpdate(loss_fn, optim.Adam(lr=cfg.optim.lr), max_grad_norm=cfg.optim.max_grad_norm)
        optimizer: Any = OptimizerState(functional.optimizer.init(functional.params()))
    else:
        optimizer = torch.optim.Adam(params, lr=cfg.optim.lr, fused=True)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(cfg.buffer_size), batch_size=cfg.batch_size)
    run = Run("dqn", cfg, run_dir, resume=resume, frames_per_batch=cfg.frames_per_batch)
    collector = SyncDataCollector(env, policy, frames_per_batch=cfg.frames_per_batch,
                                  total_frames=run.total_frames, init_random_frames=cfg.learning_starts)
    episodes = EpisodeReturns()
    run.track(policy=qnet, loss=loss_fn, optim=optimizer, explore=explore, target_updater=target_updater,
              collector=collector, episodes=episodes, buffer=rb)
    # after track: it starts from the restored parameters
    compiled = CompiledUpdate(functional, optimizer, backend=cfg.compile_backend) if cfg.compile else None

    def update(sample):
        if compiled is not None:
            losses = compiled(sample)
            return losses["loss"], losses["grad_norm"]
        losses = loss_fn(sample)
        optimizer.zero_grad(set_to_none=True)
        losses["loss"].backward()
        grad_norm = nn.utils.clip_grad_norm_(params, cfg.optim.max_grad_norm, foreach=True)
        optimizer.step()
        return losses["loss"], grad_norm

    frames = run.frames
    metrics: dict[str, Any] = {}
    for batch in collector:
        frames += batch.numel()
        episodes.update(batch)
        rb.extend(batch.reshape(-1).select(*TRANSITION_KEYS))
        explore.step(batch.numel())

        if frames >= cfg.learning_starts:
            for _ in range(cfg.gradient_steps):
                loss, grad_norm = update(rb.sample())
            if compiled is not None:
                compiled.sync()  # the Q-network (collection, eval, checkpoints) gets the new parameters
            target_updater.step()
            if compiled is not None:
                compiled.pull()  # and the compiled step the copied target
            metrics = {"train/loss": loss, "train/grad_norm": grad_norm}

        run.log(frames, {"train/return": episodes.last_mean, "train/epsilon": explore.eps, **metrics})
        if run.eval_due(frames):
            run.log_eval(frames, evaluate(eval_env, qnet, seed=cfg.seed + EVAL_SEED_OFFSET))
        if run.checkpoint_due(frames):
            run.save()
        if run.stop_requested:
            break
    collector.shutdown()
    return run.wrap_up(qnet, eval_env)


if __name__ == "__main__":  # pragma: no cover
    train()
