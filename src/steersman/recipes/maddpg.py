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

from dataclasses import dataclass
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

from .marl_common import (
    REPLAY_KEYS,
    GroupReturns,
    MarlOffPolicyConfig,
    end_of_iteration,
    make_centralised_critic,
    marl_dims,
    setup_marl,
    wrap_up_marl,
)
from .marl_envs import GROUP
from .run import Run

__all__ = ["MADDPGConfig", "make_policy", "train"]

G = GROUP


@dataclass
class MADDPGConfig(MarlOffPolicyConfig):
    """Configuration of the MADDPG recipe (defaults: the native navigation task, continuous
    forces); the replay, optimiser and run settings are :class:`MarlOffPolicyConfig`'s."""

    exploration_noise: float = 0.3
    """Std of the Gaussian noise added to the actions while collecting."""


def make_policy(cfg: MADDPGConfig, env: EnvBase) -> TensorDictModule:
    """The deterministic per-agent actor ``(agents, observation) -> (agents, action)`` in ``[-1, 1]``."""
    obs_dim, act_dim, n_agents = marl_dims(env)
    net = nn.Sequential(MultiAgentMLP(obs_dim, act_dim, n_agents, centralized=False, share_params=cfg.share_params,
                                      num_cells=cfg.hidden_sizes, activation_class=nn.ReLU), nn.Tanh())
    return TensorDictModule(net, [(G, "observation")], [(G, "action")])


def train(cfg: MADDPGConfig | None = None, run_dir: str | Path | None = None, *, resume: bool = False) -> dict[str, Any]:
    """Trains MADDPG as configured, writing ``run_dir``; returns the run's summary."""
    cfg = cfg if cfg is not None else MADDPGConfig()
    env, eval_env = setup_marl(cfg)
    policy = make_policy(cfg, env)
    actor = TensorDictModule(policy.module, ["observation"], ["action"])  # the same network, on the agent batch
    loss_fn = DDPGLoss(actor, make_centralised_critic(cfg, env), loss_function="l2")
    loss_fn.make_value_estimator(gamma=cfg.gamma)
    target_updater = SoftUpdate(loss_fn, tau=cfg.tau)
    optimizer = torch.optim.Adam([p for p in loss_fn.parameters() if p.requires_grad], lr=cfg.lr)
    noise = AdditiveGaussianModule(env.full_action_spec, sigma_init=cfg.exploration_noise,
                                   sigma_end=cfg.exploration_noise, annealing_num_steps=1, action_key=(G, "action"))
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(cfg.buffer_size), batch_size=cfg.batch_size)
    run = Run("maddpg", cfg, run_dir, resume=resume, frames_per_batch=cfg.frames_per_batch)
    collector = SyncDataCollector(env, TensorDictSequential(policy, noise), frames_per_batch=cfg.frames_per_batch,
                                  total_frames=run.total_frames)
    returns = GroupReturns(G)
    run.track(policy=policy, loss=loss_fn, optim=optimizer, collector=collector, episodes=returns, buffer=rb)

    frames = run.frames
    for batch in collector:
        frames += batch.numel()
        returns.update(batch)
        rb.extend(batch.select(*REPLAY_KEYS).reshape(-1))
        for _ in range(cfg.gradient_steps):
            losses = loss_fn(agent_batch(rb.sample(), G))  # [batch_size, n_agents]: team dones expanded
            optimizer.zero_grad(set_to_none=True)
            (losses["loss_actor"] + losses["loss_value"]).backward()
            optimizer.step()
            target_updater.step()

        run.log(frames, {"train/return": returns.last_mean, f"train/return/{G}": returns.last_mean,
                         "train/loss_actor": losses["loss_actor"], "train/loss_value": losses["loss_value"]})
        if end_of_iteration(run, frames, policy, eval_env):
            break
    return wrap_up_marl(run, policy, eval_env, collector)


if __name__ == "__main__":  # pragma: no cover
    train()
