"""What the multi-agent recipes share besides the loop: their env settings, the start of a
run, per-group returns (training and evaluation), and the end of a run (final evaluation,
checkpoint, export of the per-agent policy).

The returns are team returns: per step the mean over the group's agents of their
rewards, summed over the episode (with a shared reward, every agent's return). Episodes
end at the root ``done``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from steersman.envs import EnvBase
from steersman.modules import MultiAgentMLP
from steersman.tensordict import TensorDict, TensorDictBase
from steersman.tensordict.files import write_json_atomic
from steersman.tensordict.nn import ExplorationType, TensorDictModule, set_exploration_type

from .checkpoint import seed_everything
from .config import CheckpointConfig, ConfigError, EvalConfig, LoggerConfig, validate_config
from .evaluation import EpisodeReturns, first_episode_returns
from .marl_envs import GROUP, make_marl_env
from .run import EVAL_SEED_OFFSET, Run, export_filename

__all__ = ["REPLAY_KEYS", "MarlEnvConfig", "MarlOffPolicyConfig", "GroupReturns", "end_of_iteration", "evaluate_groups",
           "inference_batches", "make_centralised_critic", "marl_dims", "setup_marl", "team_view", "wrap_up_marl"]


@dataclass
class MarlEnvConfig:
    """Which multi-agent environment to train on, and how many copies."""

    name: str = "navigation"
    """Env id: navigation, predator_prey, vmas/<scenario> or pettingzoo/<task>."""
    num_envs: int = 32
    """Number of sub-envs stepped together (the batch size of the training env)."""
    n_agents: int = 3
    """Agents of the native tasks (and of VMAS scenarios that take n_agents)."""
    max_episode_steps: int = 50
    """Time limit per episode."""


#: what MADDPG and MASAC store per transition (per-agent rewards; the root done ends the episode)
REPLAY_KEYS = [(GROUP, "observation"), (GROUP, "action"), ("next", GROUP, "observation"), ("next", GROUP, "reward"),
               ("next", "done"), ("next", "terminated")]


@dataclass
class MarlOffPolicyConfig:
    """What the off-policy multi-agent recipes (QMIX/VDN, MADDPG, MASAC) share: the replay
    schedule, the optimiser, the networks' sizes and the run settings. Each recipe's
    config adds its own algorithm's fields."""

    env: MarlEnvConfig = field(default_factory=MarlEnvConfig)
    """The training env."""
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
    """Adam learning rate (every network of the recipe)."""
    gamma: float = 0.9
    """Discount factor."""
    tau: float = 0.01
    """Soft update rate of the target networks (after each update)."""
    hidden_sizes: list[int] = field(default_factory=lambda: [64, 64])
    """Hidden layer widths of the networks."""
    share_params: bool = True
    """One network of each kind for all agents; False: one per agent (stacked, vmapped)."""
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


def marl_dims(env: EnvBase, group: str = GROUP) -> tuple[int, int, int]:
    """``(obs_dim, action_dim, n_agents)`` of a group with flat observations and
    continuous actions ``[*B, n_agents, dim]``."""
    obs = env.observation_spec[group, "observation"]
    return obs.shape[-1], env.full_action_spec[group, "action"].shape[-1], obs.shape[-2]


def make_centralised_critic(cfg: Any, env: EnvBase) -> TensorDictModule:
    """The centralised Q critic of MADDPG and MASAC, on the agent batch
    (:func:`~steersman.objectives.agent_batch`): ``observation``, ``action`` ``[*B, n, ·]``
    -> ``state_action_value [*B, n, 1]``, each agent's value reading every agent's pair
    (``cfg.hidden_sizes``, ``cfg.share_params``)."""
    obs_dim, act_dim, n_agents = marl_dims(env)
    net = MultiAgentMLP(obs_dim + act_dim, 1, n_agents, centralized=True, share_params=cfg.share_params,
                        num_cells=cfg.hidden_sizes, activation_class=nn.ReLU)
    return TensorDictModule(net, ["observation", "action"], ["state_action_value"])


def setup_marl(cfg: Any, *, categorical_actions: bool = False) -> tuple[EnvBase, EnvBase]:
    """The start of a multi-agent recipe: checks ``cfg``, seeds, sets torch's CPU threads,
    and builds the training env (``env.num_envs`` sub-envs, seed ``cfg.seed``) and the
    evaluation env (``eval.episodes`` sub-envs, seed ``cfg.seed + EVAL_SEED_OFFSET``)."""
    validate_config(cfg)
    seed_everything(cfg.seed)
    if cfg.num_threads > 0:
        torch.set_num_threads(cfg.num_threads)
    kw = dict(n_agents=cfg.env.n_agents, max_steps=cfg.env.max_episode_steps, categorical_actions=categorical_actions)
    env = make_marl_env(cfg.env.name, cfg.env.num_envs, seed=cfg.seed, **kw)
    eval_env = make_marl_env(cfg.env.name, cfg.eval.episodes, seed=cfg.seed + EVAL_SEED_OFFSET, **kw)
    if GROUP not in env.group_map:
        raise ConfigError(f"env.name={cfg.env.name}: the recipes train the group {GROUP!r}; this env has the groups "
                          f"{sorted(env.group_map)}")
    return env, eval_env


def inference_batches(collector: Iterable[TensorDictBase]) -> Iterator[TensorDictBase]:
    """The collector's batches, each collected under :func:`torch.inference_mode` (the
    policy's, the env's and the collector's small per-step ops skip autograd's bookkeeping
    entirely: ~7% of a step here, beyond the ``no_grad`` the collector already uses), then
    copied into ordinary tensors (inference tensors cannot be saved for a backward pass).

    Example:
        >>> from steersman.collectors import SyncDataCollector
        >>> env = make_marl_env("navigation", 2, seed=0)
        >>> collector = SyncDataCollector(env, None, frames_per_batch=4, total_frames=8)
        >>> [b["agents", "observation"].is_inference() for b in inference_batches(collector)]
        [False, False]
    """
    batches, end = iter(collector), object()
    while True:
        with torch.inference_mode():
            batch = next(batches, end)
        if batch is end:
            return
        yield batch.clone()


def team_view(batch: TensorDictBase, group: str = GROUP) -> TensorDictBase:
    """``("next", "reward")`` = the mean of the group's rewards over its agents and
    ``("next", "done")`` = the root done, in a TensorDict of the batch's shape: what
    :class:`~steersman.recipes.evaluation.EpisodeReturns` reads."""
    reward = batch.get(("next", group, "reward"))
    return TensorDict({"next": {"reward": reward.mean(-2), "done": batch.get(("next", "done"))}}, batch.batch_size)


class GroupReturns:
    """:class:`~steersman.recipes.evaluation.EpisodeReturns` of a group's team reward;
    :attr:`last_mean` is the mean return of the latest finished episodes (NaN before any)."""

    def __init__(self, group: str = GROUP) -> None:
        self.group = group
        self.returns = EpisodeReturns()

    def update(self, batch: TensorDictBase) -> Tensor:
        return self.returns.update(team_view(batch, self.group))

    @property
    def last_mean(self) -> float:
        return self.returns.last_mean

    def state_dict(self) -> dict:
        return self.returns.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.returns.load_state_dict(state)


@torch.no_grad()
def evaluate_groups(env: EnvBase, policy: Callable[[TensorDictBase], TensorDictBase], seed: int | None = None,
                    max_steps: int = 10_000, group: str = GROUP) -> Tensor:
    """One deterministic episode per sub-env; returns the team returns ``[num_envs]``."""
    if seed is not None:
        env.set_seed(seed)
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        ro = env.rollout(max_steps, policy, break_when_any_done=False, break_when_all_done=True)
    return first_episode_returns(team_view(ro, group))


def end_of_iteration(run: Run, frames: int, policy: Any, eval_env: EnvBase, group: str = GROUP) -> bool:
    """The end of a training iteration at ``frames``: the evaluation and the checkpoint when
    they are due; returns whether to leave the loop (a stop was requested)."""
    if run.eval_due(frames):
        run.log_eval(frames, evaluate_groups(eval_env, policy, seed=run.cfg.seed + EVAL_SEED_OFFSET, group=group))
    if run.checkpoint_due(frames):
        run.save()
    return run.stop_requested


def wrap_up_marl(run: Run, policy: Any, eval_env: EnvBase, collector: Any = None, saved_frames: int | None = None,
                 group: str = GROUP) -> dict[str, Any]:
    """The end of a multi-agent run: the collector's shutdown; (unless a stop was requested)
    a final evaluation and checkpoint if none was made at these frames (``saved_frames``:
    those of the loop's last :meth:`Run.save`; by default the run's own record of it), the
    export of the per-agent policy (``(group, "observation")`` ``[B, n_agents, obs_dim]`` -> ``(group, "action")``), then
    :meth:`Run.finish` (plot, summary)."""
    from steersman import record

    if collector is not None:
        collector.shutdown()
    if run.stop_requested:
        return run.finish()
    if not run.evals or run.evals[-1][0] != run.frames:
        run.log_eval(run.frames, evaluate_groups(eval_env, policy, seed=run.cfg.seed + EVAL_SEED_OFFSET, group=group))
    if (run._saved_frames if saved_frames is None else saved_frames) != run.frames:
        run.save()
    fmt = run.cfg.export_format
    summary = run.finish()
    if fmt != "none":
        obs = eval_env.reset()[group, "observation"]
        path = run.paths.export_dir / export_filename(fmt)
        record.export_policy(policy, obs, path, format=fmt, in_key=(group, "observation"), out_key=(group, "action"),
                             verify=False)
        summary["written"]["policy"] = str(path)
        write_json_atomic(run.dir / "summary.json", summary, indent=1, default=str)
    return summary
