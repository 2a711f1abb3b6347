"""IQL (Kostrikov et al., 2022): offline RL from a fixed dataset of transitions.

The dataset is a replay buffer saved with ``ReplayBuffer.dumps`` (a folder), or a run
directory of an off-policy recipe (the replay buffer of its latest checkpoint), e.g.::

    steersman train sac total_frames=20000 hydra.run.dir=runs/sac_data
    steersman train iql dataset=runs/sac_data

Without ``dataset``, the recipe first collects ``dataset_frames`` frames with random
actions and saves them to ``<run_dir>/dataset`` (a smoke test more than a useful
dataset). No env step happens during training; the env is only used for evaluation.

Defaults follow TorchRL's IQL example (Adam lr 3e-4, [256, 256] MLPs, batch 256,
expectile 0.7, temperature 3, soft target updates with tau 0.005, gamma 0.99).

The loop: ``num_updates`` gradient steps of the value (expectile regression), critic (TD)
and actor (advantage-weighted regression) terms of
:class:`~steersman.objectives.iql.IQLLoss` on sampled minibatches, each followed by a
soft update of the target critics; evaluate, checkpoint, log.
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
from steersman.modules import MLP, ValueOperator
from steersman.objectives import SoftUpdate
from steersman.objectives.iql import IQLLoss

from . import sac
from .checkpoint import latest_checkpoint
from .config import CheckpointConfig, ConfigError, EnvConfig, EvalConfig, LoggerConfig, OptimConfig
from .envs import TRANSITION_KEYS
from .evaluation import evaluate
from .run import EVAL_SEED_OFFSET, RUN_FILE, Run, setup

__all__ = ["IQLConfig", "dataset_path", "make_policy", "train"]


@dataclass
class IQLConfig:
    """Configuration of the IQL recipe (defaults: TorchRL's IQL example, on Pendulum-v1)."""

    env: EnvConfig = field(default_factory=lambda: EnvConfig(name="Pendulum-v1", num_envs=1))
    """The env the dataset comes from (used for evaluation only)."""
    dataset: str = ""
    """A replay-buffer folder (ReplayBuffer.dumps) or a run directory; empty: collect random data."""
    dataset_frames: int = 10_000
    """Random-action frames collected when no dataset is given."""
    num_updates: int = 20_000
    """Gradient steps to train for."""
    batch_size: int = 256
    """Transitions per update."""
    buffer_size: int = 1_000_000
    """Capacity of the buffer the dataset is loaded into."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=3e-4))
    """Adam settings (actor, critics and value)."""
    gamma: float = 0.99
    """Discount factor."""
    tau: float = 0.005
    """Soft target update rate."""
    expectile: float = 0.7
    """Expectile of the value regression (0.5: mean; towards 1: max over the data's actions)."""
    temperature: float = 3.0
    """Inverse temperature of the advantage weights of the actor."""
    hidden_sizes: list[int] = field(default_factory=lambda: [256, 256])
    """Hidden layer widths of the actor, critics and value network."""
    seed: int = 0
    """Seed of torch, numpy, random and the envs."""
    num_threads: int = 1
    """torch CPU threads (1 is fastest for small networks; 0: torch's default)."""
    quiet: bool = False
    """No progress bar (CI, logs); the summary is still printed."""
    export_format: str = "torch-export"
    """Policy file written at the end: torch-export, onnx or none."""
    logger: LoggerConfig = field(default_factory=lambda: LoggerConfig(log_interval=1))
    """Metrics loggers."""
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(interval=2_000, episodes=10))
    """Evaluation schedule (in gradient steps)."""
    checkpoint: CheckpointConfig = field(default_factory=lambda: CheckpointConfig(interval=10_000,
                                                                                  replay_buffer=False))
    """Checkpoint schedule (in gradient steps; the dataset stays where it is)."""


def make_policy(cfg: IQLConfig, env: EnvBase) -> nn.Module:
    """The actor: a tanh-Gaussian over the action box (see :func:`steersman.recipes.sac.make_policy`)."""
    return sac.make_policy(cfg, env)


def dataset_path(dataset: str | Path) -> Path:
    """The replay-buffer folder of ``dataset``: itself, or the one in a run directory's latest checkpoint."""
    path = Path(dataset)
    if (path / RUN_FILE).is_file():
        ckpt = latest_checkpoint(path / "checkpoints")
        if ckpt is None or not (ckpt / "replay_buffer").is_dir():
            raise ConfigError(f"dataset: the run directory {path} has no checkpoint with a replay buffer")
        return ckpt / "replay_buffer"
    if not path.is_dir():
        raise ConfigError(f"dataset: {path} is neither a replay-buffer folder nor a run directory")
    return path


def collect_random_dataset(cfg: IQLConfig, env: EnvBase, path: Path) -> None:
    """``cfg.dataset_frames`` random-action frames of ``env``, saved to ``path`` with ``dumps``."""
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(cfg.dataset_frames))
    collector = SyncDataCollector(env, None, frames_per_batch=env.batch_size.numel() * 100,
                                  total_frames=cfg.dataset_frames)
    for batch in collector:
        rb.extend(batch.reshape(-1).select(*TRANSITION_KEYS))
    collector.shutdown(close_env=False)
    rb.dumps(path)


def train(cfg: IQLConfig | None = None, run_dir: str | Path | None = None, *, resume: bool = False) -> dict[str, Any]:
    """Trains IQL as configured, writing ``run_dir``; returns the run's summary."""
    cfg = cfg if cfg is not None else IQLConfig()
    env, eval_env = setup(cfg)
    data = dataset_path(cfg.dataset) if cfg.dataset else None
    actor, qvalue = sac.make_policy(cfg, env), sac.make_qvalue(cfg, env)
    obs_dim = env.observation_spec["observation"].shape[-1]
    value = ValueOperator(MLP(in_features=obs_dim, out_features=1, num_cells=cfg.hidden_sizes,
                              activation_class=nn.ReLU), in_keys=["observation"])
    loss_fn = IQLLoss(actor, qvalue, value, expectile=cfg.expectile, temperature=cfg.temperature,
                      loss_function="l2")
    loss_fn.make_value_estimator(gamma=cfg.gamma)
    target_updater = SoftUpdate(loss_fn, tau=cfg.tau)
    optim = torch.optim.Adam(loss_fn.parameters(), lr=cfg.optim.lr, fused=True)
    run = Run("iql", cfg, run_dir, resume=resume, total=cfg.num_updates)
    run.track(policy=actor, loss=loss_fn, optim=optim)
    if data is None:
        data = run.dir / "dataset"
        if not data.exists():
            collect_random_dataset(cfg, env, data)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(cfg.buffer_size), batch_size=cfg.batch_size)
    rb.loads(data)

    for step in range(run.frames + 1, cfg.num_updates + 1):  # the run's "frames" count updates here
        losses = loss_fn(rb.sample())
        optim.zero_grad(set_to_none=True)
        (losses["loss_actor"] + losses["loss_qvalue"] + losses["loss_value"]).backward()
        optim.step()
        target_updater.step()

        run.log(step, {"train/loss_actor": losses["loss_actor"], "train/loss_qvalue": losses["loss_qvalue"],
                       "train/loss_value": losses["loss_value"]})
        if run.eval_due(step):
            run.log_eval(step, evaluate(eval_env, actor, seed=cfg.seed + EVAL_SEED_OFFSET))
        if run.checkpoint_due(step):
            run.save()
        if run.stop_requested:
            break
    return run.wrap_up(actor, eval_env)


if __name__ == "__main__":  # pragma: no cover
    train()
