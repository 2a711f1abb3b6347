"""Episode videos: frame layouts, MP4/GIF writing, recording from render() or pixels."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from steersman.record import record_episode, video_to_frames, write_video

iio = pytest.importorskip("imageio.v3")


@pytest.mark.parametrize("shape, dtype, out", [
    ((4, 3, 6, 8), torch.uint8, (4, 6, 8, 3)),
    ((4, 1, 6, 8), torch.uint8, (4, 6, 8, 3)),
    ((4, 4, 6, 8), torch.uint8, (4, 6, 8, 3)),
    ((2, 4, 3, 6, 8), torch.uint8, (4, 6, 16, 3)),
    ((4, 3, 6, 8), torch.float32, (4, 6, 8, 3)),
])
def test_video_to_frames(shape, dtype, out):
    v = torch.rand(shape) if dtype.is_floating_point else torch.randint(0, 256, shape, dtype=dtype)
    frames = video_to_frames(v)
    assert frames.shape == out and frames.dtype == np.uint8
    ref = (v.clamp(0, 1) * 255).round().to(torch.uint8) if dtype.is_floating_point else v
    ref = torch.cat(ref.unbind(0), -1) if ref.ndim == 5 else ref
    ref = ref.expand(-1, 3, -1, -1) if ref.shape[1] == 1 else ref[:, :3]
    assert np.array_equal(frames, ref.permute(0, 2, 3, 1).numpy())


@pytest.mark.parametrize("shape", [(3, 6, 8), (4, 2, 6, 8)])
def test_video_to_frames_bad_shape(shape):
    with pytest.raises(ValueError, match=r"video must be \[T, C, H, W\]"):
        video_to_frames(torch.zeros(shape, dtype=torch.uint8))


@pytest.mark.parametrize("suffix", [".gif", ".mp4"])
def test_write_video_round_trip(tmp_path, suffix):
    if suffix == ".mp4":
        pytest.importorskip("imageio_ffmpeg")
    frames = np.random.default_rng(0).integers(0, 256, (6, 15, 21, 3), dtype=np.uint8)
    path = write_video(frames, tmp_path / f"clip{suffix}", fps=10)
    back = iio.imread(path, index=None) if suffix == ".gif" else None
    if suffix == ".gif":
        assert back.shape[:3] == (6, 15, 21)
    else:
        import imageio

        with imageio.v2.get_reader(path) as reader:
            assert reader.count_frames() == 6 and reader.get_meta_data()["size"] == (22, 16)  # padded to even


def test_write_video_bad_input(tmp_path):
    with pytest.raises(ValueError, match="unknown video format '.avi'"):
        write_video(np.zeros((2, 4, 4, 3), np.uint8), tmp_path / "a.avi")
    with pytest.raises(ValueError, match=r"frames must be uint8 \[T, H, W, C\]"):
        write_video(np.zeros((2, 4, 4, 3), np.float32), tmp_path / "a.gif")
    assert not list(tmp_path.iterdir())


def mp4_frames(path) -> int:
    pytest.importorskip("imageio_ffmpeg")
    import imageio

    with imageio.v2.get_reader(path) as reader:
        return reader.count_frames()


@pytest.fixture
def gym_env():
    pytest.importorskip("gymnasium")
    pytest.importorskip("pygame")
    from steersman.envs import GymEnv

    env = GymEnv("CartPole-v1", render_mode="rgb_array")
    env.set_seed(0)
    yield env
    env.close()




@pytest.mark.parametrize("suffix", [".gif", ".mp4"])
def test_record_from_render(gym_env, tmp_path, suffix):
    if suffix == ".mp4":
        pytest.importorskip("imageio_ffmpeg")
    out = record_episode(gym_env, None, tmp_path / f"ep{suffix}", max_steps=6)
    assert out.steps == 6 and out.num_frames == 7 and out.episode_return == 6.0
    assert out.path.stat().st_size > 0


def test_record_stops_at_episode_end(gym_env, tmp_path):
    """Pushing left for ever ends the episode (pole falls) well before max_steps."""
    spec = gym_env.action_spec
    left = spec.zero()
    left[..., 0] = 1 if left.dtype != torch.bool else True

    out = record_episode(gym_env, lambda td: td.set("action", left.clone()), tmp_path / "ep.mp4", max_steps=500)
    assert 5 < out.steps < 50 and out.num_frames == out.steps + 1
    assert mp4_frames(out.path) == out.num_frames


def test_record_from_pixels(tmp_path):
    pytest.importorskip("gymnasium")
    pytest.importorskip("pygame")
    from steersman.envs import GymEnv

    env = GymEnv("CartPole-v1", from_pixels=True, pixels_only=False)
    env.render = None  # frames must come from the "pixels" observation
    out = record_episode(env, None, tmp_path / "ep.mp4", max_steps=3)
    env.close()
    assert out.num_frames == 4 and mp4_frames(out.path) == 4


def test_native_env_cannot_render(tmp_path):
    from steersman.envs import CartPoleEnv

    with pytest.raises(TypeError, match=r"CartPoleEnv has no render\(\).*render_mode='rgb_array'"):
        record_episode(CartPoleEnv(), None, tmp_path / "ep.gif", max_steps=3)
    with pytest.raises(ValueError, match=r"needs a single env \(batch_size \[\] or \[1\]\), got batch_size \[4\]"):
        record_episode(CartPoleEnv(batch_size=[4]), None, tmp_path / "ep.gif")
    with pytest.raises(ValueError, match="unknown video format '.webm'"):
        record_episode(CartPoleEnv(), None, tmp_path / "ep.webm")
    assert not list(tmp_path.iterdir())


# --- streaming: frames go to the encoder one at a time ----------------------------------


class _CountingWriter:
    """Stands in for imageio's writer: at each append, counts the appended frames still
    alive (weak references). A recorder that keeps the clip keeps them all alive."""

    def __init__(self):
        self.refs = []
        self.peak_alive = 0

    def append_data(self, frame):
        import weakref

        self.refs.append(weakref.ref(frame))
        self.peak_alive = max(self.peak_alive, sum(r() is not None for r in self.refs))

    def close(self):
        pass


def test_record_episode_streams_frames(monkeypatch, tmp_path):
    """Every frame reaches the writer as it is rendered, and none is kept afterwards."""
    pytest.importorskip("imageio_ffmpeg")
    import gc

    import imageio

    from steersman.envs import PendulumEnv

    writers = []

    def fake_get_writer(path, **kwargs):
        writers.append(_CountingWriter())
        open(path, "wb").close()
        return writers[-1]

    monkeypatch.setattr(imageio.v2, "get_writer", fake_get_writer)
    env = PendulumEnv(seed=0)
    renders = []

    def render():  # a fresh 64x64 frame per step, like Gymnasium's render()
        renders.append(1)
        return np.full((64, 64, 3), len(renders) % 256, np.uint8)

    env.render = render
    gc.disable()  # a frame freed by reference counting is freed at once, not by the collector
    try:
        out = record_episode(env, None, tmp_path / "ep.mp4", max_steps=50)
    finally:
        gc.enable()
    (w,) = writers
    assert out.num_frames == len(renders) == len(w.refs) == 51
    assert w.peak_alive <= 2, f"{w.peak_alive} frames alive at once: the clip is being accumulated"
    assert out.path.exists() and not list(tmp_path.glob(".*partial*"))


def test_record_episode_memory_is_one_frame(tmp_path):
    """tracemalloc peak of a 100-step Pendulum MP4 (500 x 500 frames) stays a few frames."""
    pytest.importorskip("imageio_ffmpeg")
    pytest.importorskip("gymnasium")
    pytest.importorskip("pygame")
    import tracemalloc

    from steersman.envs import GymEnv

    env = GymEnv("Pendulum-v1", render_mode="rgb_array")
    env.set_seed(0)
    frame_bytes = 500 * 500 * 3
    tracemalloc.start()
    try:
        out = record_episode(env, None, tmp_path / "ep.mp4", max_steps=100)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        env.close()
    assert out.num_frames == 101 and mp4_frames(out.path) == 101
    assert peak < 8 * frame_bytes, f"peak {peak / 1e6:.1f} MB for {out.num_frames} frames"


def test_video_writer_errors_leave_nothing(tmp_path):
    from steersman.record.video import VideoWriter

    with pytest.raises(ValueError, match=r"frame 1 has shape \(8, 8, 3\), the first had \(6, 6, 3\)"):
        with VideoWriter(tmp_path / "a.gif") as w:
            w.append(np.zeros((6, 6, 3), np.uint8))
            w.append(np.zeros((8, 8, 3), np.uint8))
    with pytest.raises(ValueError, match=r"frames must be uint8 \[H, W, C\]"):
        with VideoWriter(tmp_path / "b.gif") as w:
            w.append(np.zeros((6, 6), np.uint8))
    with pytest.raises(ValueError, match="no frames were appended"):
        VideoWriter(tmp_path / "c.gif").close()
    assert not list(tmp_path.iterdir())
