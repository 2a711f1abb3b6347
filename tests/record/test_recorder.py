"""VideoRecorder, PixelRenderTransform and TensorDictRecorder (TorchRL's recording
transforms), against plain numpy references."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from steersman.envs import CartPoleEnv, check_env_specs
from steersman.envs.transforms import TransformedEnv
from steersman.record import CSVLogger, PixelRenderTransform, TensorDictRecorder, VideoRecorder
from steersman.tensordict import TensorDict

H, W = 6, 8


class ListLogger:
    def __init__(self):
        self.calls = []

    def log_video(self, name, video, step=None, **kwargs):
        self.calls.append((name, video, step, kwargs))


def _frame(t: int, layout: str, dtype: torch.dtype) -> torch.Tensor:
    """Frame ``t``: a distinct value per pixel and channel, in the given layout/dtype."""
    hwc = (torch.arange(H * W * 3).reshape(H, W, 3) + 7 * t) % 200
    if layout == "grey":
        hwc = hwc[..., :1].expand(H, W, 3).clone()
    x = hwc.to(torch.uint8) if dtype == torch.uint8 else hwc.to(dtype) / 255
    return {"hwc": x, "chw": x.permute(2, 0, 1), "grey": x[..., 0]}[layout]


def _expected(t: int, layout: str) -> np.ndarray:
    """The plain reference: [3, H, W] uint8 with numpy."""
    hwc = (np.arange(H * W * 3).reshape(H, W, 3) + 7 * t) % 200
    if layout == "grey":
        hwc = np.repeat(hwc[..., :1], 3, axis=-1)
    return hwc.transpose(2, 0, 1).astype(np.uint8)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
@pytest.mark.parametrize("layout", ["hwc", "chw", "grey"])
@pytest.mark.parametrize("skip", [1, 2, 3])
def test_video_recorder_keeps_every_skip_th_frame(skip, layout, dtype):
    logger = ListLogger()
    rec = VideoRecorder(logger, "ep", skip=skip, fps=5, extra="x")
    n = 7
    for t in range(n):
        td = TensorDict(pixels=_frame(t, layout, dtype))
        assert rec(td) is td and td["pixels"].dtype == dtype  # the data passes unchanged
    kept = [t for t in range(n) if (t + 1) % skip == 0]
    rec.dump()
    (name, video, step, kwargs), = logger.calls
    assert name == "ep" and step == 0 and kwargs == {"fps": 5, "extra": "x"}
    assert video.dtype == torch.uint8 and tuple(video.shape) == (1, len(kept), 3, H, W)
    np.testing.assert_array_equal(video[0].numpy(), np.stack([_expected(t, layout) for t in kept]))


def test_video_recorder_crop_grid_dump_and_limits():
    logger = ListLogger()
    batch = torch.stack([_frame(t, "hwc", torch.uint8) for t in range(3)])  # 3 sub-envs
    crop = VideoRecorder(logger, "c", skip=1, center_crop=4)
    crop(TensorDict(pixels=batch[0]))
    grid = VideoRecorder(logger, "g", skip=1, make_grid=True)
    grid(TensorDict(pixels=batch, batch_size=[3]))
    flat = VideoRecorder(logger, "f", skip=1, max_frames=2)
    flat(TensorDict(pixels=batch, batch_size=[3]))
    crop.dump(suffix="s")
    grid.dump(step=11)
    flat.dump()
    (n1, v1, s1, _), (n2, v2, s2, _), (n3, v3, _, _) = logger.calls
    assert (n1, s1, n2, s2) == ("c_s", 0, "g", 11)
    np.testing.assert_array_equal(v1[0, 0].numpy(), _expected(0, "hwc")[:, 1:5, 2:6])  # central 4x4
    assert tuple(v2.shape) == (1, 1, 3, 2 * H, 2 * W)  # 3 frames tiled 2x2, the 4th tile black
    g = v2[0, 0].numpy()
    for i, (r, c) in enumerate([(0, 0), (0, 1), (1, 0)]):
        np.testing.assert_array_equal(g[:, r * H:(r + 1) * H, c * W:(c + 1) * W], _expected(i, "hwc"))
    assert (g[:, H:, W:] == 0).all()
    assert tuple(v3.shape) == (1, 2, 3, H, W)  # sub-envs one after another, cut at max_frames
    flat.dump()  # nothing kept: nothing logged, the dump still counts
    assert len(logger.calls) == 3 and flat.iter == 2
    with pytest.raises(ValueError, match="expected an image"):
        VideoRecorder(logger, "bad", skip=1)(TensorDict(pixels=torch.zeros(5, 5, 5)))
    with pytest.raises(ValueError, match="center_crop=9 is larger"):
        VideoRecorder(logger, "big", skip=1, center_crop=9)(TensorDict(pixels=batch[0]))
    with pytest.raises(ValueError, match="skip must be a positive int"):
        VideoRecorder(logger, "s", skip=0)


class DrawnCartPole(CartPoleEnv):
    """CartPole whose ``render()`` draws the step count (uint8 [H, W, 3])."""

    def _reset(self, td):
        self.frames = 0
        return super()._reset(td)

    def _step(self, td):
        self.frames += 1
        return super()._step(td)

    def render(self, td=None):
        return np.full((H, W, 3), self.frames, dtype=np.uint8)


def test_pixel_render_and_video_recorder_in_an_env(tmp_path):
    logger = ListLogger()
    env = TransformedEnv(DrawnCartPole(seed=0), PixelRenderTransform())
    env.append_transform(VideoRecorder(logger, "rollout", skip=1, dump_on_done=False))
    assert env.observation_spec["pixels"].shape == (H, W, 3) and env.observation_spec["pixels"].dtype == torch.uint8
    check_env_specs(env)
    env.transform[-1].dump()  # drops the frames of check_env_specs
    td = env.rollout(4, break_when_any_done=False)
    assert td["next", "pixels"][:, 0, 0, 0].tolist() == [1, 2, 3, 4]
    assert td["pixels"][:, 0, 0, 0].tolist() == [0, 1, 2, 3]
    env.transform[-1].dump()
    video = logger.calls[-1][1]
    assert video[0, :, 0, 0, 0].tolist() == [0, 1, 2, 3, 4]  # reset frame, then each step

    env.transform[0].switch(False)
    assert "pixels" not in env.reset().keys()

    csv = CSVLogger("exp", tmp_path, video_format="pt")
    env2 = TransformedEnv(DrawnCartPole(seed=0), PixelRenderTransform(out_keys=["frame"], preproc=lambda f: f * 2))
    env2.append_transform(VideoRecorder(csv, "ep", in_keys=["frame"], skip=2))
    env2.rollout(5, break_when_any_done=False)
    env2.transform[-1].dump()
    saved = torch.load(next((tmp_path / "exp" / "videos").glob("ep_0.pt")), weights_only=True)
    assert saved[0, :, 0, 0, 0].tolist() == [2, 6, 10]  # frames 1, 3, 5 (every 2nd call), doubled
    with pytest.raises(AttributeError, match="no method 'draw'"):
        _ = TransformedEnv(DrawnCartPole(), PixelRenderTransform(render_method="draw")).observation_spec


def test_tensordict_recorder_saves_plain_data(tmp_path):
    rec = TensorDictRecorder(tmp_path / "run", skip=2, in_keys=["observation"])
    env = TransformedEnv(CartPoleEnv(seed=0), rec)
    td = env.rollout(6, break_when_any_done=False)
    path = rec.dump()
    assert path == tmp_path / "run_0.pt"
    raw = torch.load(path, weights_only=True)
    assert set(raw) == {"batch_size", "data"} and list(raw["data"]) == ["observation"]
    saved = TensorDictRecorder.load(path)
    torch.testing.assert_close(saved["observation"], td["next", "observation"][1::2])  # steps 2, 4, 6
    assert rec.dump() is None and rec.iter == 2

    keep_reset = TensorDictRecorder(tmp_path / "r", skip=1, skip_reset=False, in_keys=["observation"])
    env2 = TransformedEnv(CartPoleEnv(seed=0), keep_reset)
    td2 = env2.rollout(2, break_when_any_done=False)
    saved2 = TensorDictRecorder.load(keep_reset.dump(suffix="x"))
    assert saved2.batch_size == torch.Size([3])
    torch.testing.assert_close(saved2["observation"][0], td2["observation"][0])  # the reset output
    with pytest.raises(ValueError, match="skip must be a positive int"):
        TensorDictRecorder(tmp_path / "x", skip=0)
