"""TD3 (Fujimoto et al., 2018): deterministic actor, twin critics, delayed policy updates.

The defaults are rl-zoo's Pendulum-v1 settings (Adam lr 1e-3, [400, 300] MLPs, gamma
0.98, Gaussian exploration noise 0.1, 10,000 random frames first, one update per frame,
target policy smoothing 0.2 clipped at 0.5, actor and targets updated every 2nd step).

MuJoCo (``pip install 'steersman[mujoco]'``): with ``env.name=gym:HalfCheetah-v5`` (or
Hopper, Walker2d, Ant... any Gymnasium MuJoCo id) the fields of :data:`MUJOCO_DEFAULTS`
that are still at the Pendulum defaults above take the standard MuJoCo values instead
(1M frames, Adam lr 3e-4, [256, 256] MLPs, gamma 0.99, batch 256, 1M buffer, 25k random
frames, policy noise 0.2 clipped at 0.5, delay 2); any value you set yourself wins.
``preset=none`` turns this off (keep the Pendulum values; also the way to pin a value
equal to a Pendulum default), ``preset=mujoco`` applies it to any env. The run's ``config.yaml`` holds the resolved values.

Run it: ``steersman train td3``; from Python::

    from steersman.recipes.td3 import TD3Config, train
    summary = train(TD3Config(total_frames=20_000), "runs/td3")

The loop: collect ``frames_per_batch`` frames with the noisy actor into the replay buffer;
per update, a critic step on the clipped double-Q target
(:class:`~steersman.objectives.TD3Loss`) and, every ``policy_delay`` updates, an actor
step and a soft update of the targets; evaluate, checkpoint, log.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from steersman.collectors import SyncDataCollector
from steersman.data import Bounded, LazyTensorStorage, TensorDictReplayBuffer
from steersman.envs import EnvBase
from steersman.modules import MLP, Actor, AdditiveGaussianModule, ValueOperator
from steersman.objectives import SoftUpdate, TD3Loss
from steersman.objectives.functional_update import CompiledUpdate, FunctionalUpdate, OptimizerState
from steersman.tensordict.nn import TensorDictSequential, optim

from .config import (
    CheckpointConfig,
    ConfigError,
    EnvConfig,
    EvalConfig,
    LoggerConfig,
    OptimConfig,
)
from .config import (
    resolve_preset as config_resolve_preset,
)
from .envs import TRANSITION_KEYS, action_spec_unbatched
from .evaluation import EpisodeReturns, evaluate
from .run import EVAL_SEED_OFFSET, Run, setup

__all__ = ["MUJOCO_DEFAULTS", "resolve_preset", "TD3Config", "TanhBox", "action_box", "make_policy", "make_qvalue", "train"]


@dataclass
class TD3Config:
    """Configuration of the TD3 recipe (defaults: rl-zoo Pendulum-v1)."""

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
    """Adam settings (actor and critics)."""
    gamma: float = 0.98
    """Discount factor."""
    tau: float = 0.005
    """Soft target update rate."""
    policy_delay: int = 2
    """Update the actor and the targets every this many critic updates."""
    exploration_noise: float = 0.1
    """Std of the Gaussian noise added to actions while collecting (in half action ranges)."""
    policy_noise: float = 0.2
    """Std of the target policy smoothing noise."""
    noise_clip: float = 0.5
    """Clip of the target policy smoothing noise."""
    hidden_sizes: list[int] = field(default_factory=lambda: [400, 300])
    """Hidden layer widths of the actor and of the critics."""
    compile: bool = False
    """torch.compile each update as one graph (the functional update; eager, with a warning, if it cannot)."""
    compile_backend: str = "inductor"
    """torch.compile backend with compile=true (aot_eager: no code generation, eager kernels)."""
    preset: str = "auto"
    """Env-specific defaults: auto (MuJoCo settings for gym MuJoCo ids), mujoco (always) or none."""
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
    logger: LoggerConfig = field(default_factory=lambda: LoggerConfig(log_interval=200))
    """Metrics loggers."""
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(interval=2_000, episodes=10))
    """Evaluation schedule."""
    checkpoint: CheckpointConfig = field(default_factory=lambda: CheckpointConfig(interval=10_000))
    """Checkpoint schedule (the replay buffer is included)."""


MUJOCO_DEFAULTS: dict[str, Any] = {
    "total_frames": 1_000_000, "learning_starts": 25_000, "optim.lr": 3e-4, "buffer_size": 1_000_000,
    "batch_size": 256, "hidden_sizes": [256, 256], "gamma": 0.99, "tau": 0.005, "exploration_noise": 0.1,
    "policy_noise": 0.2, "noise_clip": 0.5, "policy_delay": 2,
    "eval.interval": 10_000, "eval.episodes": 5, "checkpoint.interval": 100_000,
}
"""TD3 on Gymnasium MuJoCo tasks (Fujimoto et al.'s reference settings, as CleanRL): dotted keys."""


def resolve_preset(cfg: TD3Config) -> TD3Config:
    """``cfg`` with :data:`MUJOCO_DEFAULTS` where its preset asks for them (see :func:`~steersman.recipes.config.resolve_preset`)."""
    return config_resolve_preset(cfg, MUJOCO_DEFAULTS)


class TanhBox(nn.Module):
    """``low + (high - low) * (tanh(x) + 1) / 2``: squashes into the action box.

    Example:
        >>> box = TanhBox(torch.tensor([-2.0]), torch.tensor([2.0]))
        >>> box(torch.tensor([0.0, 100.0, -100.0]))
        tensor([ 0.,  2., -2.])
    """

    def __init__(self, low: Tensor, high: Tensor) -> None:
        super().__init__()
        self.register_buffer("loc", (high + low) / 2)
        self.register_buffer("scale", (high - low) / 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.loc + self.scale * torch.tanh(x)


def action_box(env: EnvBase) -> Bounded:
    """The bounded continuous action spec of one sub-env (a clear error otherwise)."""
    spec = action_spec_unbatched(env)
    if not isinstance(spec, Bounded) or not spec.dtype.is_floating_point:
        raise ConfigError(f"this recipe needs a bounded continuous action; the env's action spec is a "
                          f"{type(spec).__name__}")
    return spec


def make_policy(cfg: Any, env: EnvBase) -> Actor:
    """The deterministic actor: an MLP from ``"observation"``, tanh-squashed into the action box."""
    spec = action_box(env)
    obs_dim = env.observation_spec["observation"].shape[-1]
    net = MLP(in_features=obs_dim, out_features=spec.shape[-1], num_cells=cfg.hidden_sizes, activation_class=nn.ReLU)
    return Actor(nn.Sequential(net, TanhBox(spec.low, spec.high)), spec=spec)


def make_qvalue(cfg: Any, env: EnvBase) -> ValueOperator:
    """A critic ``Q(s, a)``: ``"observation"``, ``"action"`` -> ``"state_action_value"`` ``[*batch, 1]``."""
    spec = action_box(env)
    obs_dim = env.observation_spec["observation"].shape[-1]
    net = MLP(in_features=obs_dim + spec.shape[-1], out_features=1, num_cells=cfg.hidden_sizes,
              activation_class=nn.ReLU)
    return ValueOperator(net, in_keys=["observation", "action"])


def train(cfg: TD3Config | None = None, run_dir: str | Path | None = None, *, resume: bool = False) -> dict[str, Any]:
    """Trains TD3 as configured, writing ``run_dir``; returns the run's summary."""
    cfg = resolve_preset(cfg if cfg is not None else TD3Config())
    if cfg.seeds != 1 or cfg.sweep:  # many agents in one process (seeds < 1 is refused there)
        from . import multiseed

        return multiseed.train_td3(cfg, run_dir, resume=resume)
    env, eval_env = setup(cfg)
    actor, qvalue = make_policy(cfg, env), make_qvalue(cfg, env)
    box = action_box(env)
    sigma = cfg.exploration_noise * float((box.high - box.low).max()) / 2  # SB3: noise on the [-1, 1] scale
    explore = AdditiveGaussianModule(box, sigma_init=sigma, sigma_end=sigma, annealing_num_steps=1)
    policy = TensorDictSequential(actor, explore)
    loss_fn = TD3Loss(actor, qvalue, action_spec=box, policy_noise=cfg.policy_noise, noise_clip=cfg.noise_clip,
                      loss_function="l2")
    loss_fn.make_value_estimator(gamma=cfg.gamma)
    target_updater = SoftUpdate(loss_fn, tau=cfg.tau)
    if cfg.compile:  # two pure functional steps (critic; actor + soft target update), each compiled whole
        critic_step = FunctionalUpdate(loss_fn, optim.Adam(lr=cfg.optim.lr), only="qvalue_network_params",
                                       method="value_loss")
        actor_step = FunctionalUpdate(loss_fn, optim.Adam(lr=cfg.optim.lr), only="actor_network",
                                      method="actor_loss")
        optim_critic: Any = OptimizerState(critic_step.optimizer.init(critic_step.params()))
        optim_actor: Any = OptimizerState(actor_step.optimizer.init(actor_step.params()))
    else:
        optim_actor = torch.optim.Adam(loss_fn.actor_network.parameters(), lr=cfg.optim.lr, fused=True)
        optim_critic = torch.optim.Adam(loss_fn.qvalue_network_params.parameters(), lr=cfg.optim.lr, fused=True)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(cfg.buffer_size), batch_size=cfg.batch_size)
    updates_per_batch = max(int(cfg.frames_per_batch * cfg.utd_ratio), 1)
    num_updates = torch.zeros((), dtype=torch.long)  # a tensor: checkpointed with the rest
    run = Run("td3", cfg, run_dir, resume=resume, frames_per_batch=cfg.frames_per_batch)
    collector = SyncDataCollector(env, policy, frames_per_batch=cfg.frames_per_batch,
                                  total_frames=run.total_frames, init_random_frames=cfg.learning_starts)
    episodes = EpisodeReturns()
    run.track(policy=actor, loss=loss_fn, optim_actor=optim_actor, optim_critic=optim_critic,
              num_updates=num_updates, collector=collector, episodes=episodes, buffer=rb)
    compiled_critic = compiled_actor = None  # (made after track: they start from the restored parameters)
    if cfg.compile:
        compiled_critic = CompiledUpdate(critic_step, optim_critic, backend=cfg.compile_backend)
        compiled_actor = CompiledUpdate(actor_step, optim_actor, tau=cfg.tau, shared=compiled_critic,
                                        backend=cfg.compile_backend)

    def critic_update(sample):
        if compiled_critic is not None:
            return compiled_critic(sample)["loss"]
        loss_qvalue, _ = loss_fn.value_loss(sample)
        optim_critic.zero_grad(set_to_none=True)
        loss_qvalue.backward()
        optim_critic.step()
        return loss_qvalue

    def actor_update(sample):  # and the soft update of the targets
        if compiled_actor is not None:
            return compiled_actor(sample)["loss"]
        loss_actor, _ = loss_fn.actor_loss(sample)
        optim_actor.zero_grad(set_to_none=True)
        loss_actor.backward()
        optim_actor.step()
        target_updater.step()
        return loss_actor

    frames = run.frames
    metrics: dict[str, Any] = {}
    for batch in collector:
        frames += batch.numel()
        episodes.update(batch)
        rb.extend(batch.reshape(-1).select(*TRANSITION_KEYS))

        if frames >= cfg.learning_starts:
            for _ in range(updates_per_batch):
                num_updates += 1
                sample = rb.sample()
                loss_qvalue = critic_update(sample)
                if num_updates % cfg.policy_delay == 0:  # delayed actor and target updates
                    metrics["train/loss_actor"] = actor_update(sample)
            if compiled_critic is not None:
                compiled_critic.sync()  # the actor (collection, eval, checkpoints) gets the new parameters
                compiled_actor.sync()  # (both write the shared tensors; each its optimizer state)
            metrics["train/loss_qvalue"] = loss_qvalue

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
