"""QMIX (Rashid et al., 2018): value decomposition for a team of agents with discrete actions.

Each agent has Q-values ``Q_i(o_i, ·)`` (one network, shared by the agents by default);
agents act greedily on them (epsilon-greedy while training). A mixing network, whose
weights are functions of the global state (hypernetworks, kept non-negative so that each
agent's argmax is the team's), turns the chosen ``Q_i`` into a team value trained
towards ``r + gamma Q_tot_target(s')``, with the team reward (the mean of the agents'
rewards): :class:`~steersman.objectives.QMixerLoss` with a
:class:`~steersman.modules.QMixer`. ``mixer=vdn`` sums the ``Q_i`` instead (VDN, see
:mod:`~steersman.recipes.vdn`). Envs without a global ``"state"`` (VMAS) give the mixer
every agent's observation.

Run it: ``steersman train qmix`` (or ``python -m steersman.recipes.qmix``); from Python::

    from steersman.recipes.qmix import QMIXConfig, train
    summary = train(QMIXConfig(total_frames=100_000), "runs/qmix")

The loop, top to bottom: collect ``frames_per_batch`` frames epsilon-greedily; store them
(with the team reward) in the replay buffer; ``gradient_steps`` updates on sampled
minibatches, each followed by a soft update of the target networks; evaluate,
checkpoint, log.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from steersman.collectors import SyncDataCollector
from steersman.data import Categorical, LazyTensorStorage, TensorDictReplayBuffer
from steersman.envs import EnvBase
from steersman.modules import EGreedyModule, MultiAgentMLP, QMixer, QValueModule, VDNMixer
from steersman.objectives import QMixerLoss, SoftUpdate
from steersman.tensordict.nn import TensorDictModule, TensorDictSequential

from .config import ConfigError
from .marl_common import (
    GroupReturns,
    MarlOffPolicyConfig,
    end_of_iteration,
    setup_marl,
    wrap_up_marl,
)
from .marl_envs import GROUP
from .run import Run

__all__ = ["QMIXConfig", "make_mixer", "make_policy", "train"]

G = GROUP


#: the recipe trains on discrete actions (integer indices): its env is built with ``categorical_actions=True``
CATEGORICAL_ACTIONS = True

@dataclass
class QMIXConfig(MarlOffPolicyConfig):
    """Configuration of the QMIX recipe (defaults: the native navigation task, 5 discrete
    moves); the replay, optimiser and run settings are :class:`MarlOffPolicyConfig`'s."""

    max_grad_norm: float = 10.0
    """Clip the global gradient norm to this value."""
    eps_init: float = 1.0
    """Initial epsilon of the epsilon-greedy exploration."""
    eps_end: float = 0.05
    """Final epsilon."""
    exploration_fraction: float = 0.3
    """Fraction of the run over which epsilon decays."""
    mixer: str = "qmix"
    """Value mixer: qmix (state-conditioned monotonic mixing) or vdn (sum)."""
    mixing_embed_dim: int = 32
    """Width of QMIX's mixing layer."""


# ---------------------------------------------------------------- networks
def _action_spec(cfg: QMIXConfig, env: EnvBase) -> Categorical:
    spec = env.full_action_spec[G, "action"]
    if not isinstance(spec, Categorical):
        raise ConfigError(f"QMIX needs discrete actions; {cfg.env.name} has a {type(spec).__name__} action spec")
    return spec


def make_policy(cfg: QMIXConfig, env: EnvBase) -> TensorDictSequential:
    """The greedy team policy: each agent's Q-values ``(agents, action_value) [*B, n, moves]``
    from its observation, and their argmax at ``(agents, action)``."""
    spec = _action_spec(cfg, env)
    obs = env.observation_spec[G, "observation"]
    net = MultiAgentMLP(obs.shape[-1], spec.n, obs.shape[-2], centralized=False, share_params=cfg.share_params,
                        num_cells=cfg.hidden_sizes, activation_class=nn.ReLU)
    qnet = TensorDictModule(net, [(G, "observation")], [(G, "action_value")])
    head = QValueModule(spec=spec, action_value_key=(G, "action_value"),
                        out_keys=[(G, "action"), (G, "action_value"), (G, "chosen_action_value")])
    return TensorDictSequential(qnet, head)


def state_key(env: EnvBase) -> Any:
    """What the mixer conditions on: the global ``"state"``, else every agent's observation."""
    return "state" if "state" in env.observation_spec.keys() else (G, "observation")


def make_mixer(cfg: QMIXConfig, env: EnvBase) -> TensorDictModule:
    """``(agents, chosen_action_value) [*B, n, 1]`` (and the state) -> ``chosen_action_value [*B, 1]``."""
    n_agents = env.observation_spec[G, "observation"].shape[-2]
    if cfg.mixer == "vdn":
        return TensorDictModule(VDNMixer(n_agents), [(G, "chosen_action_value")], ["chosen_action_value"])
    if cfg.mixer != "qmix":
        raise ConfigError(f"mixer must be qmix or vdn, got {cfg.mixer!r}")
    key = state_key(env)
    shape = env.observation_spec[key].shape[len(env.batch_size):]
    return TensorDictModule(QMixer(state_shape=shape, mixing_embed_dim=cfg.mixing_embed_dim, n_agents=n_agents),
                            [(G, "chosen_action_value"), key], ["chosen_action_value"])


# ---------------------------------------------------------------- training
def train(cfg: QMIXConfig | None = None, run_dir: str | Path | None = None, *, resume: bool = False,
          algo: str = "qmix") -> dict[str, Any]:
    """Trains QMIX (or VDN, with ``mixer="vdn"``) as configured, writing ``run_dir``; returns
    the run's summary."""
    cfg = cfg if cfg is not None else QMIXConfig()
    env, eval_env = setup_marl(cfg, categorical_actions=True)
    policy = make_policy(cfg, env)
    qnet, mixer = policy[0], make_mixer(cfg, env)
    explore = EGreedyModule(env.full_action_spec, eps_init=cfg.eps_init, eps_end=cfg.eps_end, action_key=(G, "action"),
                            annealing_num_steps=max(int(cfg.exploration_fraction * cfg.total_frames), 1))
    collect_policy = TensorDictSequential(policy, explore)
    loss_fn = QMixerLoss(qnet, mixer, loss_function="l2", delay_value=True)
    loss_fn.make_value_estimator(gamma=cfg.gamma)
    target_updater = SoftUpdate(loss_fn, tau=cfg.tau)
    params = [p for p in loss_fn.parameters() if p.requires_grad]  # not the targets
    optimizer = torch.optim.Adam(params, lr=cfg.lr)
    keep = [(G, "observation"), (G, "action"), ("next", G, "observation"), ("next", "done"), ("next", "terminated")]
    if state_key(env) == "state":
        keep += ["state", ("next", "state")]
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(cfg.buffer_size), batch_size=cfg.batch_size)
    run = Run(algo, cfg, run_dir, resume=resume, frames_per_batch=cfg.frames_per_batch)
    collector = SyncDataCollector(env, collect_policy, frames_per_batch=cfg.frames_per_batch,
                                  total_frames=run.total_frames)
    returns = GroupReturns(G)
    run.track(policy=policy, loss=loss_fn, optim=optimizer, explore=explore, collector=collector, episodes=returns,
              buffer=rb)

    frames = run.frames
    for batch in collector:
        frames += batch.numel()
        returns.update(batch)
        data = batch.select(*keep)  # (not written into the collector's batch)
        data.set(("next", "reward"), batch.get(("next", G, "reward")).mean(-2))  # the team reward [*B, 1]
        rb.extend(data.reshape(-1))
        explore.step(batch.numel())

        for _ in range(cfg.gradient_steps):
            losses = loss_fn(rb.sample())
            optimizer.zero_grad(set_to_none=True)
            losses["loss"].backward()
            grad_norm = nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            optimizer.step()
            target_updater.step()

        run.log(frames, {"train/return": returns.last_mean, f"train/return/{G}": returns.last_mean,
                         "train/loss": losses["loss"], "train/grad_norm": grad_norm, "train/epsilon": explore.eps})
        if end_of_iteration(run, frames, policy, eval_env):
            break
    return wrap_up_marl(run, policy, eval_env, collector)


if __name__ == "__main__":  # pragma: no cover
    train()
