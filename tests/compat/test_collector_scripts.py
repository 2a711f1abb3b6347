"""Collector and recording scripts as TorchRL users write them, with only the imports changed."""

from __future__ import annotations

import torch

from steersman.collectors import Collector, VanillaWeightUpdater
from steersman.envs import CartPoleEnv, TransformedEnv
from steersman.record import CSVLogger, PixelRenderTransform, VideoRecorder
from steersman.tensordict.nn import TensorDictModule


class Greedy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)

    def forward(self, obs):
        return self.lin(obs).argmax(-1)


def test_collector_training_loop_with_weight_updates_and_policy_version():
    torch.manual_seed(0)
    env = CartPoleEnv(batch_size=[2])
    policy = TensorDictModule(Greedy(), ["observation"], ["action"])
    trained = TensorDictModule(Greedy(), ["observation"], ["action"])
    collector = Collector(env, policy, frames_per_batch=8, total_frames=32, track_policy_version=True)
    assert isinstance(collector.weight_updater, VanillaWeightUpdater)
    versions = []
    for i, data in enumerate(collector):
        versions.append(data["policy_version"].unique().tolist())
        with torch.no_grad():
            trained.module.lin.bias.copy_(torch.tensor([float(i + 1), 0.0]))
        collector.update_policy_weights_(trained)
    collector.shutdown()
    assert versions == [[0], [1], [2], [3]]
    assert policy.module.lin.bias.tolist() == [4.0, 0.0]


class RenderCartPole(CartPoleEnv):
    def render(self):
        return torch.full((16, 16, 3), 128, dtype=torch.uint8)


def test_video_recorder_script(tmp_path):
    logger = CSVLogger(exp_name="cartpole", log_dir=tmp_path, video_format="pt")
    recorder = VideoRecorder(logger, tag="video", skip=1)
    env = TransformedEnv(RenderCartPole(seed=0), PixelRenderTransform())
    env.append_transform(recorder)
    env.rollout(10, break_when_any_done=False)
    recorder.dump()
    video = torch.load(tmp_path / "cartpole" / "videos" / "video_0.pt", weights_only=True)
    assert video.shape == (1, 11, 3, 16, 16) and bool((video == 128).all())
