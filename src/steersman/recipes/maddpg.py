"""MADDPG (Lowe et al., 2017): DDPG for a team of agents, each with a deterministic actor
of its own observation and a centralised critic of every agent's observation and action.

The loss is the single-agent :class:`~steersman.objectives.DDPGLoss` run on the group's
entries (:func:`~steersman.objectives.agent_batch`: the agents become a batch dim) with a
``MultiAgentMLP(centralized=True)`` critic, so each agent's Q-value sees the whole team.
Rewards are per agent (the env's ``("agents", "reward")``).

Run it: ``python -m steersman.recipes.maddpg``; from Python::

    from steersman.recipes.maddpg import MADDPGConfig, train
    summary = train(MADDPGConfig(total_frames=100_000), "runs/maddpg")

The loop, top to bottom: collect ``frames_per_batch`` frames with Gaussian exploration
noise; store them in the replay buffer; ``gradient_steps`` updates of actor and critic,
each followed by a soft update of the critic's target; evaluate, checkpoint, log.
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
from steersman.modules import AdditiveGaussianModule, MultiAgentMLP
from steersman.objectives import DDPGLoss, SoftUpdate, agent_batch
from steersman.tensordict.nn import TensorDictModule, TensorDictSequential

from .config import CheckpointConfig, EvalConfig, LoggerConfig
from .marl_common import GroupReturns, MarlEnvConfig, evaluate_groups, setup_marl, wrap_up_marl
from .marl_envs import GROUP
from .run import EVAL_SEED_OFFSET, Run

__all__ = ["MADDPGConfig", "make_policy", "train"]

G = GROUP


@dataclass
class MADDPGConfig:
    """Configuration of the MADDPG recipe (defaults: the native navigation task, continuous forces)."""

    env: MarlEnvConfig = field(default_factory=MarlEnvConfig)
    """The training env (continuous actions)."""
    total_frames: int = 200_000
    """Frames (env steps summed over sub-envs) to train for."""
    frames_per_batch: int = 1_600
    """Frames collected between two rounds of updates."""
    gradient_steps: int = 40
    """Updates after each batch."""
    batch_size: int = 256
    """Transitions per update."""
    buffer_size: int = 100_000
    """Replay buffer capacity (transitions)."""
    lr: float = 1e-3
    """Adam learning rate (actor and critic)."""
    gamma: float = 0.9
    """Discount factor."""
    tau: float = 0.01
    """Soft update rate of the critic's target (after each update)."""
    exploration_noise: float = 0.3
    """Std of the Gaussian noise added to the actions while collecting."""
    hidden_sizes: list[int] = field(default_factory=lambda: [64, 64])
    """Hidden layer widths of the actor and of the critic."""
    share_params: bool = True
    """One actor (and one critic) for all agents; False: one per agent (stacked, vmapped)."""
    seed: int = 0
    """Seed of torch, numpy, random and the envs."""
    num_threads: int = 1
    """torch CPU threads (1 is fastest for small networks; 0: torch's default)."""
    quiet: bool = False
    """No progress bar (CI, logs); the summary is still printed."""
    export_format: str = "torch-export"
    """Per-agent policy file written at the end: torch-export, onnx or none."""
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    """Metrics loggers."""
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(interval=20_000, episodes=16))
    """Evaluation schedule."""
    checkpoint: CheckpointConfig = field(default_factory=lambda: CheckpointConfig(interval=100_000))
    """Checkpoint schedule (the replay buffer is included)."""


def _dims(env: EnvBase) -> tuple[int, int, int]:
    obs = env.observation_spec[G, "observation"]
    return obs.shape[-1], env.full_action_spec[G, "action"].shape[-1], obs.shape[-2]


def make_policy(cfg: MADDPGConfig, env: EnvBase) -> TensorDictModule:
    """The deterministic per-agent actor ``(agents, observation) -> (agents, action)`` in ``[-1, 1]``."""
    obs_dim, act_dim, n_agents = _dims(env)
    net = nn.Sequential(MultiAgentMLP(obs_dim, act_dim, n_agents, centralized=False, share_params=cfg.share_params,
                                      num_cells=cfg.hidden_sizes, activation_class=nn.ReLU), nn.Tanh())
    return TensorDictModule(net, [(G, "observation")], [(G, "action")])


def make_critic(cfg: MADDPGConfig, env: EnvBase) -> TensorDictModule:
    """The centralised critic on the agent batch: ``observation``, ``action`` ``[*B, n, ·]``
    -> ``state_action_value [*B, n, 1]``, each agent's value reading every agent's pair."""
    obs_dim, act_dim, n_agents = _dims(env)
    net = MultiAgentMLP(obs_dim + act_dim, 1, n_agents, centralized=True, share_params=cfg.share_params,
                        num_cells=cfg.hidden_sizes, activation_class=nn.ReLU)
    return TensorDictModule(net, ["observation", "action"], ["state_action_value"])


def train(cfg: MADDPGConfig | None = None, run_dir: str | Path | None = None, *, resume: bool = False) -> dict[str, Any]:
    """Trains MADDPG as configured, writing ``run_dir``; returns the run's summary."""
    cfg = cfg if cfg is not None else MADDPGConfig()
    env, eval_env = setup_marl(cfg)
    policy = make_policy(cfg, env)
    actor = TensorDictModule(policy.module, ["observation"], ["action"])  # the same network, on the agent batch
    loss_fn = DDPGLoss(actor, make_critic(cfg, env), loss_function="l2")
    loss_fn.make_value_estimator(gamma=cfg.gamma)
    target_updater = SoftUpdate(loss_fn, tau=cfg.tau)
    optimizer = torch.optim.Adam([p for p in loss_fn.parameters() if p.requires_grad], lr=cfg.lr)
    noise = AdditiveGaussianModule(env.full_action_spec, sigma_init=cfg.exploration_noise,
                                   sigma_end=cfg.exploration_noise, annealing_num_steps=1, action_key=(G, "action"))
    keep = [(G, "observation"), (G, "action"), ("next", G, "observation"), ("next", G, "reward"), ("next", "done"),
            ("next", "terminated")]
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(cfg.buffer_size), batch_size=cfg.batch_size)
    run = Run("maddpg", cfg, run_dir, resume=resume, frames_per_batch=cfg.frames_per_batch)
    collector = SyncDataCollector(env, TensorDictSequential(policy, noise), frames_per_batch=cfg.frames_per_batch,
                                  total_frames=run.total_frames)
    returns = GroupReturns(G)
    run.track(policy=policy, loss=loss_fn, optim=optimizer, collector=collector, episodes=returns, buffer=rb)

    frames, saved_frames = run.frames, -1
    for batch in collector:
        frames += batch.numel()
        returns.update(batch)
        rb.extend(batch.select(*keep).reshape(-1))
        for _ in range(cfg.gradient_steps):
            losses = loss_fn(agent_batch(rb.sample(), G))  # [batch_size, n_agents]: team dones expanded
            optimizer.zero_grad(set_to_none=True)
            (losses["loss_actor"] + losses["loss_value"]).backward()
            optimizer.step()
            target_updater.step()

        run.log(frames, {"train/return": returns.last_mean, f"train/return/{G}": returns.last_mean,
                         "train/loss_actor": losses["loss_actor"], "train/loss_value": losses["loss_value"]})
        if run.eval_due(frames):
            run.log_eval(frames, evaluate_groups(eval_env, policy, seed=cfg.seed + EVAL_SEED_OFFSET))
        if run.checkpoint_due(frames):
            run.save()
            saved_frames = frames
        if run.stop_requested:
            break
    collector.shutdown()
    return wrap_up_marl(run, policy, eval_env, saved_frames)


if __name__ == "__main__":  # pragma: no cover
    train()
