"""MASAC: Soft Actor-Critic for a team of agents, each with a stochastic (tanh-Gaussian)
actor of its own observation and a centralised twin critic of every agent's observation
and action.

The loss is the single-agent :class:`~steersman.objectives.SACLoss` run on the group's
entries (:func:`~steersman.objectives.agent_batch`: the agents become a batch dim) with a
``MultiAgentMLP(centralized=True)`` critic; the entropy temperature is learned towards
``-action_dim`` per agent. Rewards are per agent.

Run it: ``python -m steersman.recipes.masac``; from Python::

    from steersman.recipes.masac import MASACConfig, train
    summary = train(MASACConfig(total_frames=100_000), "runs/masac")

The loop, top to bottom: collect ``frames_per_batch`` frames by sampling the policy;
store them in the replay buffer; ``gradient_steps`` updates of actor, critics and
temperature, each followed by a soft update of the critics' targets; evaluate (the
policy's mean action), checkpoint, log.
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
from steersman.modules import MultiAgentMLP, ProbabilisticActor
from steersman.objectives import SACLoss, SoftUpdate, agent_batch
from steersman.tensordict.nn import NormalParamExtractor, TanhNormal, TensorDictModule

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

__all__ = ["MASACConfig", "make_policy", "train"]

G = GROUP


@dataclass
class MASACConfig(MarlOffPolicyConfig):
    """Configuration of the MASAC recipe (defaults: the native navigation task, continuous
    forces); the replay, optimiser and run settings are :class:`MarlOffPolicyConfig`'s."""

    alpha_init: float = 0.1
    """Initial entropy temperature."""


def _actor(net: nn.Module, obs_key: Any, action_key: Any, loc: Any, scale: Any) -> ProbabilisticActor:
    module = TensorDictModule(net, [obs_key], [loc, scale])
    return ProbabilisticActor(module, in_keys={"loc": loc, "scale": scale}, out_keys=[action_key],
                              distribution_class=TanhNormal, return_log_prob=True)


def make_policy(cfg: MASACConfig, env: EnvBase) -> ProbabilisticActor:
    """The per-agent tanh-Gaussian actor ``(agents, observation) -> (agents, action)``."""
    obs_dim, act_dim, n_agents = marl_dims(env)
    net = nn.Sequential(MultiAgentMLP(obs_dim, 2 * act_dim, n_agents, centralized=False, share_params=cfg.share_params,
                                      num_cells=cfg.hidden_sizes, activation_class=nn.ReLU), NormalParamExtractor())
    return _actor(net, (G, "observation"), (G, "action"), (G, "loc"), (G, "scale"))


def train(cfg: MASACConfig | None = None, run_dir: str | Path | None = None, *, resume: bool = False) -> dict[str, Any]:
    """Trains MASAC as configured, writing ``run_dir``; returns the run's summary."""
    cfg = cfg if cfg is not None else MASACConfig()
    env, eval_env = setup_marl(cfg)
    _, act_dim, _ = marl_dims(env)
    policy = make_policy(cfg, env)
    actor = _actor(policy.module[0].module, "observation", "action", "loc", "scale")  # same network, agent batch
    loss_fn = SACLoss(actor, make_centralised_critic(cfg, env), alpha_init=cfg.alpha_init, target_entropy=-float(act_dim))
    loss_fn.make_value_estimator(gamma=cfg.gamma)
    target_updater = SoftUpdate(loss_fn, tau=cfg.tau)
    optimizer = torch.optim.Adam([p for p in loss_fn.parameters() if p.requires_grad], lr=cfg.lr)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(cfg.buffer_size), batch_size=cfg.batch_size)
    run = Run("masac", cfg, run_dir, resume=resume, frames_per_batch=cfg.frames_per_batch)
    collector = SyncDataCollector(env, policy, frames_per_batch=cfg.frames_per_batch, total_frames=run.total_frames)
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
            (losses["loss_actor"] + losses["loss_qvalue"] + losses["loss_alpha"]).backward()
            optimizer.step()
            target_updater.step()

        run.log(frames, {"train/return": returns.last_mean, f"train/return/{G}": returns.last_mean,
                         "train/loss_actor": losses["loss_actor"], "train/loss_qvalue": losses["loss_qvalue"],
                         "train/alpha": losses["alpha"]})
        if end_of_iteration(run, frames, policy, eval_env):
            break
    return wrap_up_marl(run, policy, eval_env, collector)


if __name__ == "__main__":  # pragma: no cover
    train()
