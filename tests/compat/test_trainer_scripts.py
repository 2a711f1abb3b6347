"""Trainer and checkpoint scripts written the way TorchRL users write them (only the imports
changed): a DQN trainer with TorchRL's hooks that checkpoints through a rotation and resumes
from it, and a checkpoint of a policy, its optimizer and the RNG state."""

from __future__ import annotations

import torch

from steersman.checkpoint import Checkpoint, CheckpointRotation, GlobalRNGState
from steersman.collectors import Collector
from steersman.data import LazyTensorStorage, TensorDictReplayBuffer
from steersman.envs import CartPoleEnv
from steersman.modules import MLP, QValueActor
from steersman.objectives import DQNLoss, SoftUpdate
from steersman.trainers import (
    CountFramesLog,
    LogScalar,
    ReplayBufferTrainer,
    TargetNetUpdaterHook,
    Trainer,
    UpdateWeights,
)


def _dqn_trainer(tmp_path, total_frames):
    env = CartPoleEnv()
    value_net = MLP(out_features=2, num_cells=[16])  # lazy input layer
    policy = QValueActor(value_net, in_keys=["observation"], spec=env.action_spec)
    loss = DQNLoss(value_network=policy, action_space=env.action_spec, delay_value=True)
    collector = Collector(lambda: CartPoleEnv(), policy, frames_per_batch=32,
                          total_frames=total_frames)
    trainer = Trainer(
        collector=collector, total_frames=total_frames, frame_skip=1, optim_steps_per_batch=2,
        loss_module=loss, optimizer=torch.optim.Adam(loss.parameters(), lr=1e-3),
        progress_bar=False, save_trainer_interval=64,
        checkpoint_rotation=CheckpointRotation(tmp_path / "ckpts", keep_last=2),
    )
    ReplayBufferTrainer(TensorDictReplayBuffer(storage=LazyTensorStorage(500)), batch_size=16,
                        flatten_tensordicts=True).register(trainer)
    TargetNetUpdaterHook(SoftUpdate(loss, eps=0.95)).register(trainer)
    UpdateWeights(collector, update_weights_interval=1).register(trainer)
    LogScalar(("next", "reward"), "r_training").register(trainer)
    CountFramesLog(frame_skip=1).register(trainer)
    return trainer, loss


def test_dqn_trainer_checkpoints_and_resumes(tmp_path):
    torch.manual_seed(0)
    trainer, loss = _dqn_trainer(tmp_path, total_frames=192)
    trainer.train()
    rotation = trainer.checkpoint_rotation
    assert trainer.collected_frames == 192 and len(rotation.checkpoints()) == 2
    assert Checkpoint.manifest(rotation.latest())["metadata"]["collected_frames"] == 192

    resumed, resumed_loss = _dqn_trainer(tmp_path, total_frames=192)
    resumed.load_from_file(rotation.latest())
    assert resumed.collected_frames == 192 and resumed._optim_count == trainer._optim_count
    for a, b in zip(loss.parameters(), resumed_loss.parameters()):
        assert torch.equal(a, b)
    assert resumed._modules["count_frames_log"].frame_count == 192


def test_policy_optimizer_and_rng_checkpoint(tmp_path):
    policy = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    optim = torch.optim.Adam(policy.parameters())
    ckpt = Checkpoint(policy=policy, optim=optim, rng=GlobalRNGState(), frames=1000)
    ckpt.save(tmp_path / "run", metadata={"reward": 12.5})
    expected = torch.randn(3)

    restored = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    result = Checkpoint(policy=restored, optim=torch.optim.Adam(restored.parameters()),
                        rng=GlobalRNGState(), frames=0).load(tmp_path / "run", map_location="cpu")
    assert result.loaded == {"policy", "optim", "rng", "frames"} and result.values["frames"] == 1000
    assert torch.equal(torch.randn(3), expected)
    assert torch.equal(restored[0].weight, policy[0].weight)
