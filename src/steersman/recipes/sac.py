"""SAC (Haarnoja et al., 2018): off-policy maximum-entropy actor-critic, continuous or discrete.

The defaults are rl-zoo's Pendulum-v1 settings (Adam lr 1e-3 for actor, twin critics and
temperature, [256, 256] MLPs, batch 256, one update per frame, 100 random frames first,
soft target updates with tau 0.005, automatic temperature with target entropy -dim(A));
Pendulum reaches a return around -150 in about 10k-20k frames. With discrete actions
(``env=cartpole``) the recipe uses discrete SAC (a categorical policy and Q(s, .)
critics, :class:`~steersman.objectives.sac.DiscreteSACLoss`).

MuJoCo (``pip install 'steersman[mujoco]'``): with ``env.name=gym:HalfCheetah-v5`` (or
Hopper, Walker2d, Ant... any Gymnasium MuJoCo id) the fields of :data:`MUJOCO_DEFAULTS`
that are still at the Pendulum defaults above take the standard MuJoCo values instead
(1M frames, Adam lr 3e-4, [256, 256] MLPs, batch 256, 1M buffer, 10k random frames, tau 0.005); any value you set yourself wins. ``preset=none`` turns this off (keep
the Pendulum values; also the way to pin a value equal to a Pendulum default),
``preset=mujoco`` applies it to any env. The run's ``config.yaml`` holds the resolved values.

Run it: ``steersman train sac``; from Python::

    from steersman.recipes.sac import SACConfig, train
    summary = train(SACConfig(total_frames=20_000), "runs/sac")

The loop: collect ``frames_per_batch`` frames with the stochastic policy into the replay
buffer; ``frames_per_batch x utd_ratio`` updates of actor, critics and temperature on
sampled minibatches (:class:`~steersman.objectives.sac.SACLoss`), each followed by a soft
update of the target critics; evaluate, checkpoint, log.

Distributed (``distributed.backend=ray distributed.num_collectors=N``, see
:mod:`steersman.recipes.distributed`): N collector actors write straight into a replay
buffer actor, the loop samples from it and pushes the actor's weights to the collectors
after each round of updates; give ``frames_per_batch`` well above 1 (a round trip per batch).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from steersman.data import Categorical
from steersman.envs import EnvBase
from steersman.modules import MLP, ProbabilisticActor, ValueOperator
from steersman.objectives import SoftUpdate
from steersman.objectives.functional_update import CompiledUpdate, FunctionalUpdate, OptimizerState
from steersman.objectives.sac import DiscreteSACLoss, SACLoss
from steersman.tensordict.nn import NormalParamExtractor, TanhNormal, TensorDictModule
from steersman.tensordict.nn import optim as functional_optim

from .config import (
    CheckpointConfig,
    EnvConfig,
    EvalConfig,
    LoggerConfig,
    OptimConfig,
)
from .config import (
    resolve_preset as config_resolve_preset,
)
from .distributed import (
    DistributedConfig,
    check_distributed,
    make_collector,
    make_replay_buffer,
    shutdown,
)
from .envs import TRANSITION_KEYS, action_spec_unbatched
from .evaluation import EpisodeReturns, evaluate
from .run import EVAL_SEED_OFFSET, Run, setup

__all__ = ["MUJOCO_DEFAULTS", "resolve_preset", "SACConfig", "make_policy", "make_qvalue", "train"]


@dataclass
class SACConfig:
    """Configuration of the SAC recipe (defaults: rl-zoo Pendulum-v1)."""

    env: EnvConfig = field(default_factory=lambda: EnvConfig(name="Pendulum-v1", num_envs=1))
    """The training env (continuous or discrete actions)."""
    total_frames: int = 20_000
    """Frames (env steps summed over sub-envs) to train for."""
    frames_per_batch: int = 1
    """Frames collected between two rounds of updates."""
    utd_ratio: float = 1.0
    """Updates per collected frame."""
    batch_size: int = 256
    """Transitions per update."""
    buffer_size: int = 1_000_000
    """Replay buffer capacity (transitions; memory is taken as the buffer fills)."""
    learning_starts: int = 100
    """Random-action frames collected before the first update."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-3))
    """Adam settings (actor, critics and temperature)."""
    gamma: float = 0.99
    """Discount factor."""
    tau: float = 0.005
    """Soft target update rate."""
    alpha_init: float = 1.0
    """Initial temperature."""
    target_entropy: str = "auto"
    """Target entropy: auto (-dim(A); 0.98 log(n) for discrete actions) or a number."""
    loss_function: str = "l2"
    """Critic regression distance: l2, smooth_l1 or l1."""
    hidden_sizes: list[int] = field(default_factory=lambda: [256, 256])
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
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    """Collection in Ray actors writing into a remote replay buffer (backend=ray; see docs/distributed.md)."""


MUJOCO_DEFAULTS: dict[str, Any] = {
    "total_frames": 1_000_000, "learning_starts": 10_000, "optim.lr": 3e-4, "buffer_size": 1_000_000,
    "batch_size": 256, "hidden_sizes": [256, 256], "gamma": 0.99, "tau": 0.005,
    "eval.interval": 10_000, "eval.episodes": 5, "checkpoint.interval": 100_000,
}
"""SAC on Gymnasium MuJoCo tasks (rl-zoo / SB3 settings, as in Haarnoja et al.): dotted keys."""


def resolve_preset(cfg: SACConfig) -> SACConfig:
    """``cfg`` with :data:`MUJOCO_DEFAULTS` where its preset asks for them (see :func:`~steersman.recipes.config.resolve_preset`)."""
    return config_resolve_preset(cfg, MUJOCO_DEFAULTS)


def _discrete(env: EnvBase) -> bool:
    return isinstance(env.action_spec, Categorical)


def make_policy(cfg: SACConfig, env: EnvBase) -> ProbabilisticActor:
    """The actor: a tanh-Gaussian over the action box, or a categorical over discrete actions."""
    obs_dim = env.observation_spec["observation"].shape[-1]
    spec = action_spec_unbatched(env)
    if _discrete(env):
        net = MLP(in_features=obs_dim, out_features=spec.n, num_cells=cfg.hidden_sizes, activation_class=nn.ReLU)
        return ProbabilisticActor(TensorDictModule(net, ["observation"], ["logits"]), in_keys=["logits"], spec=spec,
                                  distribution_class=torch.distributions.Categorical,
                                  distribution_kwargs={"validate_args": False})
    net = MLP(in_features=obs_dim, out_features=2 * spec.shape[-1], num_cells=cfg.hidden_sizes,
              activation_class=nn.ReLU)
    module = TensorDictModule(nn.Sequential(net, NormalParamExtractor()), ["observation"], ["loc", "scale"])
    return ProbabilisticActor(module, in_keys=["loc", "scale"], spec=spec, distribution_class=TanhNormal)


def make_qvalue(cfg: SACConfig, env: EnvBase) -> nn.Module:
    """A critic: ``Q(s, a)`` ``[*batch, 1]``, or ``Q(s, .)`` ``[*batch, n]`` for discrete actions."""
    obs_dim = env.observation_spec["observation"].shape[-1]
    spec = action_spec_unbatched(env)
    if _discrete(env):
        net = MLP(in_features=obs_dim, out_features=spec.n, num_cells=cfg.hidden_sizes, activation_class=nn.ReLU)
        return TensorDictModule(net, ["observation"], ["action_value"])
    net = MLP(in_features=obs_dim + spec.shape[-1], out_features=1, num_cells=cfg.hidden_sizes,
              activation_class=nn.ReLU)
    return ValueOperator(net, in_keys=["observation", "action"])


def train(cfg: SACConfig | None = None, run_dir: str | Path | None = None, *, resume: bool = False) -> dict[str, Any]:
    """Trains SAC as configured, writing ``run_dir``; returns the run's summary."""
    cfg = resolve_preset(cfg if cfg is not None else SACConfig())
    if cfg.seeds != 1 or cfg.sweep:  # many agents in one process (seeds < 1 is refused there)
        from . import multiseed

        return multiseed.train_sac(cfg, run_dir, resume=resume)
    env, eval_env = setup(cfg)
    actor, qvalue = make_policy(cfg, env), make_qvalue(cfg, env)
    target_entropy = cfg.target_entropy if cfg.target_entropy == "auto" else float(cfg.target_entropy)
    if _discrete(env):
        loss_fn = DiscreteSACLoss(actor, qvalue, action_space=action_spec_unbatched(env), loss_function=cfg.loss_function,
                                  alpha_init=cfg.alpha_init, target_entropy=target_entropy)
    else:
        loss_fn = SACLoss(actor, qvalue, action_spec=action_spec_unbatched(env), loss_function=cfg.loss_function,
                          alpha_init=cfg.alpha_init, target_entropy=target_entropy)
    loss_fn.make_value_estimator(gamma=cfg.gamma)
    target_updater = SoftUpdate(loss_fn, tau=cfg.tau)
    if cfg.compile:  # a pure functional step (torch.func gradients, functional Adam, soft target update), compiled whole
        functional = FunctionalUpdate(loss_fn, functional_optim.Adam(lr=cfg.optim.lr))
        optim: Any = OptimizerState(functional.optimizer.init(functional.params()))
    else:
        optim = torch.optim.Adam(loss_fn.parameters(), lr=cfg.optim.lr, fused=True)
    check_distributed(cfg.distributed)
    updates_per_batch = max(int(cfg.frames_per_batch * cfg.utd_ratio), 1)
    run = Run("sac", cfg, run_dir, resume=resume, frames_per_batch=cfg.frames_per_batch)
    # distributed.backend=ray: collector actors write straight into a buffer actor; batches are None here
    rb = make_replay_buffer(cfg.distributed, cfg.buffer_size, cfg.batch_size, run.dir)
    collector = make_collector(cfg.distributed, cfg, env, actor, frames_per_batch=cfg.frames_per_batch,
                               total_frames=run.total_frames, init_random_frames=cfg.learning_starts, replay_buffer=rb)
    episodes = EpisodeReturns()
    try:
        run.track(policy=actor, loss=loss_fn, optim=optim, collector=collector, episodes=episodes, buffer=rb)
        # after track: it starts from the restored parameters
        compiled = CompiledUpdate(functional, optim, tau=cfg.tau, backend=cfg.compile_backend) if cfg.compile else None
        _loop(cfg, run, collector, rb, episodes, loss_fn, optim, target_updater, actor, eval_env, updates_per_batch,
              compiled)
        return run.wrap_up(actor, eval_env)  # the final checkpoint still holds the buffer and collectors
    finally:
        shutdown(collector, rb)


def _loop(cfg: SACConfig, run: Run, collector: Any, rb: Any, episodes: EpisodeReturns, loss_fn: nn.Module,
          optim: Any, target_updater: SoftUpdate, actor: nn.Module, eval_env: EnvBase,
          updates_per_batch: int, compiled: CompiledUpdate | None) -> None:
    frames = run.frames
    remote = cfg.distributed.backend != "none"
    metrics: dict[str, Any] = {}
    for batch in collector:
        if remote:  # the actors wrote the batch into the buffer and computed the episode returns
            frames = collector.frames
            returns = collector.pop_episode_returns()
            if returns:
                episodes.last_mean = sum(returns) / len(returns)
        else:
            frames += batch.numel()
            episodes.update(batch)
            rb.extend(batch.reshape(-1).select(*TRANSITION_KEYS))

        if frames >= cfg.learning_starts:
            for _ in range(updates_per_batch):
                if compiled is not None:
                    losses = compiled(rb.sample())  # the step and the soft target update, one graph
                else:
                    losses = loss_fn(rb.sample())
                    total = losses["loss_actor"] + losses["loss_qvalue"] + losses["loss_alpha"]
                    optim.zero_grad(set_to_none=True)
                    total.backward()
                    optim.step()
                    target_updater.step()
            if compiled is not None:
                compiled.sync()  # the actor (collection, eval, checkpoints) gets the new parameters
            metrics = {"train/loss_actor": losses["loss_actor"], "train/loss_qvalue": losses["loss_qvalue"],
                       "train/alpha": losses["alpha"], "train/entropy": losses["entropy"]}
            if remote:
                collector.update_policy_weights_(actor)

        run.log(frames, {"train/return": episodes.last_mean, **metrics})
        if run.eval_due(frames):
            run.log_eval(frames, evaluate(eval_env, actor, seed=cfg.seed + EVAL_SEED_OFFSET))
        if run.checkpoint_due(frames):
            run.save()
        if run.stop_requested:
            break


if __name__ == "__main__":  # pragma: no cover
    train()
