"""PPO (Schulman et al., 2017): clipped policy-gradient updates on fresh on-policy batches.

The defaults are rl-zoo's tuned CartPole-v1 settings (8 envs x 32 steps per batch, 20
epochs of one 256-sample minibatch, GAE(0.98, 0.8), linearly decaying lr 1e-3 and clip
0.2, no entropy bonus); they solve CartPole (return 500) in about 20k-40k frames.
Continuous actions get a tanh-squashed Gaussian policy (``env=pendulum``...).

Run it: ``steersman train ppo`` (or ``python -m steersman.recipes.ppo``); from Python::

    from steersman.recipes.ppo import PPOConfig, train
    summary = train(PPOConfig(total_frames=50_000), "runs/ppo")

Distributed (``steersman train ppo distributed=ray distributed.num_collectors=N``, see
:mod:`steersman.recipes.distributed`): N Ray collector actors share the ``env.num_envs``
sub-envs out among them and collect in sync; each batch gathers all of theirs (the same
``num_envs x n_steps`` frames as locally) and the new weights reach every actor before
the next batch, so every batch is on-policy.

The loop, top to bottom: collect ``num_envs x n_steps`` frames with the current policy;
compute advantages once (GAE); run ``epochs`` passes of minibatch updates of the clipped
surrogate + value loss (:class:`~steersman.objectives.ClipPPOLoss`); evaluate,
checkpoint, log.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from steersman.data import Categorical
from steersman.envs import EnvBase
from steersman.modules import MLP, ProbabilisticActor, ValueOperator
from steersman.objectives import ClipPPOLoss, ValueEstimators
from steersman.objectives.functional_update import CompiledUpdate, FunctionalUpdate, OptimizerState
from steersman.tensordict.nn import (
    NormalParamExtractor,
    TanhNormal,
    TensorDictModule,
    optim,
    shared_copy,
)

from .config import CheckpointConfig, ConfigError, EnvConfig, EvalConfig, LoggerConfig
from .distributed import DistributedConfig, check_distributed, make_collector, shutdown
from .envs import action_spec_unbatched
from .evaluation import EpisodeReturns, evaluate
from .fused import FusedCollector, FusedGAE, fusable
from .fused_ppo import FusedPPOUpdate, fusable_update
from .run import EVAL_SEED_OFFSET, Run, setup

__all__ = ["PPOConfig", "PPOLossConfig", "PPOOptimConfig", "make_critic", "make_policy", "train"]


@dataclass
class PPOOptimConfig:
    """Adam settings."""

    lr: float = 1e-3
    """Learning rate (start value when annealed)."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to 0 over the run."""
    eps: float = 1e-5
    """Adam epsilon."""
    max_grad_norm: float = 0.5
    """Clip the global gradient norm to this value."""


@dataclass
class PPOLossConfig:
    """The PPO objective and its advantage estimate."""

    gamma: float = 0.98
    """Discount factor."""
    gae_lambda: float = 0.8
    """GAE lambda (bias/variance trade-off of the advantage)."""
    clip_epsilon: float = 0.2
    """Clip range of the probability ratio (start value when annealed)."""
    anneal_clip: bool = True
    """Decay the clip range linearly to 0 over the run (rl-zoo's lin_0.2)."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus."""
    critic_coef: float = 0.5
    """Weight of the value loss."""
    normalize_advantage: bool = True
    """Normalize advantages within each minibatch."""


@dataclass
class PPOConfig:
    """Configuration of the PPO recipe (defaults: rl-zoo's CartPole-v1 settings)."""

    env: EnvConfig = field(default_factory=lambda: EnvConfig(name="CartPole-v1", num_envs=8))
    """The training env."""
    total_frames: int = 100_000
    """Frames (env steps summed over sub-envs) to train for."""
    n_steps: int = 32
    """Steps per sub-env in each collected batch (batch = num_envs x n_steps frames)."""
    epochs: int = 20
    """Passes over each batch."""
    minibatch_size: int = 256
    """Transitions per gradient step."""
    hidden_sizes: list[int] = field(default_factory=lambda: [64, 64])
    """Hidden layer widths of the actor and of the critic (separate networks)."""
    ortho_init: bool = True
    """Orthogonal init (gain sqrt 2; 0.01 for the policy head, 1 for the value head)."""
    optim: PPOOptimConfig = field(default_factory=PPOOptimConfig)
    """Optimizer."""
    loss: PPOLossConfig = field(default_factory=PPOLossConfig)
    """Objective."""
    compile: bool = False
    """torch.compile the minibatch update as one graph (eager, with a warning, if not); native discrete envs: also rollout and GAE."""
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
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(interval=10_000, episodes=10))
    """Evaluation schedule."""
    checkpoint: CheckpointConfig = field(default_factory=lambda: CheckpointConfig(interval=50_000))
    """Checkpoint schedule."""
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    """Collection in Ray actors (backend=ray; always sync, env.num_envs shared out among them; docs/distributed.md)."""


# ---------------------------------------------------------------- networks
def _init(net: nn.Sequential, head_gain: float) -> None:
    linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
    for i, layer in enumerate(linears):
        nn.init.orthogonal_(layer.weight, head_gain if i == len(linears) - 1 else math.sqrt(2))
        nn.init.zeros_(layer.bias)


def make_policy(cfg: PPOConfig, env: EnvBase) -> ProbabilisticActor:
    """The actor: an MLP from ``"observation"`` to a categorical (discrete actions) or a
    tanh-Gaussian (continuous actions) distribution; writes ``"action"`` and its log-prob."""
    obs_dim = env.observation_spec["observation"].shape[-1]
    spec = action_spec_unbatched(env)
    if isinstance(spec, Categorical):
        net = MLP(in_features=obs_dim, out_features=spec.n, num_cells=cfg.hidden_sizes, activation_class=nn.Tanh)
        if cfg.ortho_init:
            _init(net, 0.01)
        module = TensorDictModule(net, in_keys=["observation"], out_keys=["logits"])
        return ProbabilisticActor(module, in_keys=["logits"], spec=spec,
                                  distribution_class=torch.distributions.Categorical,
                                  distribution_kwargs={"validate_args": False}, return_log_prob=True)
    act_dim = spec.shape[-1]
    net = MLP(in_features=obs_dim, out_features=2 * act_dim, num_cells=cfg.hidden_sizes, activation_class=nn.Tanh)
    if cfg.ortho_init:
        _init(net, 0.01)
    module = TensorDictModule(nn.Sequential(net, NormalParamExtractor()), in_keys=["observation"],
                              out_keys=["loc", "scale"])
    return ProbabilisticActor(module, in_keys=["loc", "scale"], spec=spec, distribution_class=TanhNormal,
                              return_log_prob=True)


def make_critic(cfg: PPOConfig, env: EnvBase) -> ValueOperator:
    """The critic: an MLP from ``"observation"`` to ``"state_value"`` ``[*batch, 1]``."""
    obs_dim = env.observation_spec["observation"].shape[-1]
    net = MLP(in_features=obs_dim, out_features=1, num_cells=cfg.hidden_sizes, activation_class=nn.Tanh)
    if cfg.ortho_init:
        _init(net, 1.0)
    return ValueOperator(net, in_keys=["observation"])


def set_clip_epsilon(loss_fn: ClipPPOLoss, eps: float) -> None:
    """Sets the clip range of ``loss_fn`` in place (a buffer: a compiled update does not
    recompile when it changes)."""
    loss_fn.clip_epsilon.fill_(eps)


# ---------------------------------------------------------------- training
def train(cfg: PPOConfig | None = None, run_dir: str | Path | None = None, *, resume: bool = False) -> dict[str, Any]:
    """Trains PPO as configured, writing ``run_dir``; returns the run's summary."""
    cfg = cfg if cfg is not None else PPOConfig()
    check_distributed(cfg.distributed)
    if cfg.distributed.backend != "none" and (cfg.seeds != 1 or cfg.sweep):
        raise ConfigError("distributed.backend=ray trains one agent: it cannot be combined with seeds > 1 or sweep")
    if cfg.seeds != 1 or cfg.sweep:  # many agents in one process (seeds < 1 is refused there)
        from . import multiseed

        return multiseed.train_ppo(cfg, run_dir, resume=resume)
    env, eval_env = setup(cfg)
    frames_per_batch = cfg.env.num_envs * cfg.n_steps
    actor, critic = make_policy(cfg, env), make_critic(cfg, env)
    loss_fn = ClipPPOLoss(actor, critic, clip_epsilon=cfg.loss.clip_epsilon, entropy_coeff=cfg.loss.entropy_coef,
                          critic_coeff=cfg.loss.critic_coef, loss_critic_type="l2",
                          normalize_advantage=cfg.loss.normalize_advantage,
                          diagnostics=False)  # logged once per batch below (loss_fn.diagnose)
    loss_fn.make_value_estimator(ValueEstimators.GAE, gamma=cfg.loss.gamma, lmbda=cfg.loss.gae_lambda)
    params = [p for p in loss_fn.parameters() if p.requires_grad]
    lr = torch.tensor(cfg.optim.lr)  # annealed in place: a compiled update reads it, never recompiles
    if cfg.compile:  # a pure functional step (torch.func gradients, functional Adam), compiled whole
        functional = FunctionalUpdate(loss_fn, optim.Adam(lr=lr, eps=cfg.optim.eps),
                                      max_grad_norm=cfg.optim.max_grad_norm)
        optimizer: Any = OptimizerState(functional.optimizer.init(functional.params()))
    else:
        optimizer = torch.optim.Adam(params, lr=lr, eps=cfg.optim.eps, fused=True)
    keys = loss_fn.tensor_keys  # what the loss reads (GAE writes the last two)
    minibatch_keys = ("observation", keys.action, keys.sample_log_prob, keys.advantage, keys.value_target)
    policy = shared_copy(actor)  # collection/eval twin: same parameters, never toggled
    run = Run("ppo", cfg, run_dir, resume=resume, frames_per_batch=frames_per_batch)
    gae: Any = loss_fn.value_estimator
    if cfg.compile and cfg.distributed.backend == "none" and fusable(env, policy, loss_fn.critic_network) is None:
        # the whole iteration compiled: the step (policy + env) and GAE as graphs (recipes/fused.py)
        collector: Any = FusedCollector(env, policy, frames_per_batch=frames_per_batch,
                                        total_frames=run.total_frames, backend=cfg.compile_backend)
        gae = FusedGAE(loss_fn.critic_network, gamma=cfg.loss.gamma, lmbda=cfg.loss.gae_lambda,
                       backend=cfg.compile_backend)
    else:
        collector = make_collector(cfg.distributed, cfg, env, policy, frames_per_batch=frames_per_batch,
                                   total_frames=run.total_frames, on_policy=True)
    try:
        _loop(cfg, run, collector, actor, policy, loss_fn, optimizer, params, lr, eval_env,
              functional if cfg.compile else None, minibatch_keys, frames_per_batch, gae)
        return run.wrap_up(policy, eval_env)  # the final checkpoint still holds the collectors' state
    finally:
        shutdown(collector)  # the actors and a Ray started here, also on errors and Ctrl-C


def _loop(cfg: PPOConfig, run: Run, collector: Any, actor: nn.Module, policy: nn.Module, loss_fn: ClipPPOLoss,
          optimizer: Any, params: list, lr: torch.Tensor, eval_env: EnvBase, functional: FunctionalUpdate | None,
          minibatch_keys: tuple, frames_per_batch: int, gae: Any) -> None:
    remote = cfg.distributed.backend != "none"
    episodes = EpisodeReturns()
    run.track(policy=actor, loss=loss_fn, optim=optimizer, collector=collector, episodes=episodes)

    compiled: Any = None  # (made after track: it starts from the restored parameters)
    fused = False
    if functional is not None:  # all epochs x minibatches in one graph where the loss allows it (fused_ppo.py)
        fused = frames_per_batch % cfg.minibatch_size == 0 and fusable_update(loss_fn, functional) is None
        compiled = FusedPPOUpdate(loss_fn, functional, optimizer, backend=cfg.compile_backend) if fused \
            else CompiledUpdate(functional, optimizer, backend=cfg.compile_backend)  # one call per minibatch
    else:
        lr = optimizer.param_groups[0]["lr"]  # the group's own tensor (a restored one on resume)
    if fused and isinstance(collector, FusedCollector):  # a cold cache: the update compiles beside the rollout
        # and GAE, in a child that collects a first batch eagerly (a native env: in this process, nothing shared)
        compiled.compile_ahead(functools.partial(_first_update, cfg, collector, gae, compiled, minibatch_keys,
                                                 frames_per_batch), when=collector.graph)

    def update(flat, idx):
        if compiled is not None:  # flat[idx] is gathered inside the compiled graph
            return compiled(flat, idx)["grad_norm"]
        mb = flat[idx]
        losses = loss_fn(mb)
        total = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        grad_norm = nn.utils.clip_grad_norm_(params, cfg.optim.max_grad_norm, foreach=True)
        optimizer.step()
        return grad_norm

    frames = run.frames
    for batch in collector:
        batch = batch.reshape(-1, batch.shape[-1])  # remote: [actors, envs, T] -> [num_envs, T], as locally
        frames += batch.numel()
        episodes.update(batch)
        progress_left = max(1.0 - frames / collector.total_frames, 0.0)  # as SB3's linear schedules
        if cfg.optim.anneal_lr:
            lr.fill_(cfg.optim.lr * progress_left)
        if cfg.loss.anneal_clip:
            set_clip_epsilon(loss_fn, max(cfg.loss.clip_epsilon * progress_left, 1e-8))

        with torch.no_grad():
            gae(batch)
        flat = batch.select(*minibatch_keys).reshape(-1)  # only what the loss reads: cheaper indexing
        if fused:  # the same shuffles as the loop below, drawn up front: one compiled call for all updates
            indices = _shuffles(cfg, frames_per_batch)
            grad_norm, idx = compiled(flat, indices)[-1], indices[-1]
        else:
            for _ in range(cfg.epochs):
                for idx in torch.randperm(frames_per_batch).split(cfg.minibatch_size):
                    grad_norm = update(flat, idx)
        if compiled is not None:
            compiled.sync()  # the modules (collection, eval, checkpoints, export) get the new parameters
        if remote:  # one object-store put; every actor collects the next batch with these weights
            collector.update_policy_weights_(policy)
        # the last minibatch, after the epochs (the fused update computes it in its graph)
        losses = compiled.diagnostics if fused else loss_fn.diagnose(flat[idx])

        run.log(frames, {"train/return": episodes.last_mean, "train/loss_objective": losses["loss_objective"],
                         "train/loss_critic": losses["loss_critic"], "train/entropy": losses["entropy"],
                         "train/kl_approx": losses["kl_approx"], "train/clip_fraction": losses["clip_fraction"],
                         "train/grad_norm": grad_norm, "train/lr": lr})
        if run.eval_due(frames):
            run.log_eval(frames, evaluate(eval_env, policy, seed=cfg.seed + EVAL_SEED_OFFSET))
        if run.checkpoint_due(frames):
            run.save()
        if run.stop_requested:
            break


def _shuffles(cfg: PPOConfig, frames_per_batch: int) -> torch.Tensor:
    """Every epoch's shuffle of the batch, as minibatch index rows ``[updates, minibatch]``."""
    indices = torch.stack([torch.randperm(frames_per_batch) for _ in range(cfg.epochs)])
    return indices.reshape(-1, cfg.minibatch_size)


def _first_update(cfg: PPOConfig, collector: FusedCollector, gae: Any, update: FusedPPOUpdate, minibatch_keys: tuple,
                  frames_per_batch: int) -> None:
    """(In a :func:`~steersman.recipes.precompiled.compile_ahead` child.) The loop's first
    fused update on an eagerly collected first batch: its graph compiles and is saved, on
    inputs laid out as the loop's."""
    collector.use_eager()
    if isinstance(gae, FusedGAE):
        gae.use_eager()
    batch = next(iter(collector))
    batch = batch.reshape(-1, batch.shape[-1])
    with torch.no_grad():
        gae(batch)
    update(batch.select(*minibatch_keys).reshape(-1), _shuffles(cfg, frames_per_batch))


if __name__ == "__main__":  # pragma: no cover
    train()
