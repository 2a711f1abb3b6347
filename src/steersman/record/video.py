"""Videos of episodes: frames from ``env.render()`` or a pixel observation, to MP4 or GIF.

Frames are uint8 arrays ``[H, W, C]`` (what Gymnasium's ``render_mode="rgb_array"``
and ``GymEnv(..., from_pixels=True)`` give). Writing needs imageio
(``pip install 'steersman[record]'``; MP4 through its ffmpeg plugin, GIF through
Pillow). :class:`VideoWriter` streams frames to the encoder one at a time (an MP4 of any
length costs the memory of a frame; Pillow keeps a GIF's frames until it is closed), so
:func:`record_episode` never holds the clip.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from steersman.envs import EnvBase, step_mdp
from steersman.tensordict.nn import ExplorationType, set_exploration_type

from ._optional import import_optional

__all__ = ["EpisodeVideo", "VideoWriter", "encode_gif", "record_episode", "video_to_frames", "write_video"]

VIDEO_FORMATS = (".mp4", ".gif")


def video_to_frames(video: Tensor | np.ndarray) -> np.ndarray:
    """A logger-layout video as frames for writing: ``[T, C, H, W]`` (or ``[N, T, C, H, W]``,
    the ``N`` clips side by side) of uint8, or floats in ``[0, 1]``, to uint8 ``[T, H, W, 3]``.

    Example:
        >>> import torch
        >>> video_to_frames(torch.zeros(5, 1, 8, 6, dtype=torch.uint8)).shape   # gray -> RGB
        (5, 8, 6, 3)
        >>> video_to_frames(torch.rand(2, 5, 3, 8, 6)).shape                    # 2 clips
        (5, 8, 12, 3)
    """
    v = torch.as_tensor(video).detach().cpu()
    if v.ndim == 5:
        v = torch.cat(v.unbind(0), dim=-1)  # clips side by side along the width
    if v.ndim != 4 or v.shape[1] not in (1, 3, 4):
        raise ValueError(f"video must be [T, C, H, W] or [N, T, C, H, W] with C in (1, 3, 4), "
                         f"got shape {tuple(v.shape)}")
    if v.is_floating_point():
        v = (v.clamp(0, 1) * 255).round().to(torch.uint8)
    elif v.dtype != torch.uint8:
        raise TypeError(f"video must be uint8 or floating point, got {v.dtype}")
    if v.shape[1] == 1:
        v = v.expand(-1, 3, -1, -1)
    return v[:, :3].permute(0, 2, 3, 1).contiguous().numpy()


def write_video(frames: np.ndarray | list[np.ndarray], path: str | os.PathLike, fps: int = 30) -> Path:
    """Writes uint8 frames ``[T, H, W, C]`` to ``path``: ``.mp4`` (H.264) or ``.gif``.

    MP4 frames are padded with black to even height and width (H.264 needs it). GIF
    merges identical consecutive frames (their durations add up). To write frames as
    they come, use :class:`VideoWriter`.

    Example:
        >>> import numpy as np, tempfile
        >>> p = write_video(np.zeros((4, 9, 16, 3), np.uint8), tempfile.mkdtemp() + "/clip.gif", fps=10)
        >>> p.name, p.stat().st_size > 0
        ('clip.gif', True)
    """
    path = Path(path)
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.dtype != np.uint8 or frames.shape[-1] not in (1, 3, 4):
        raise ValueError(f"write_video: frames must be uint8 [T, H, W, C] with C in (1, 3, 4), "
                         f"got {frames.dtype} {frames.shape}")
    with VideoWriter(path, fps=fps) as writer:
        for frame in frames:
            writer.append(frame)
    return path


class VideoWriter:
    """Streams uint8 frames ``[H, W, C]`` into an ``.mp4`` (H.264) or ``.gif`` file.

    Each :meth:`append` hands one frame to the encoder (MP4: the ffmpeg process; frames
    padded with black to even height and width). The file is written under a temporary
    name and renamed into place by :meth:`close`; leaving the ``with`` block on an
    exception removes it, so a failed recording leaves no partial video behind.

    Example:
        >>> import numpy as np, tempfile
        >>> with VideoWriter(tempfile.mkdtemp() + "/clip.gif", fps=10) as w:
        ...     for t in range(3):
        ...         w.append(np.full((8, 8, 3), 80 * t, np.uint8))
        >>> w.num_frames, w.path.name, w.path.exists()
        (3, 'clip.gif', True)
    """

    def __init__(self, path: str | os.PathLike, fps: int = 30) -> None:
        path = Path(path)
        if path.suffix not in VIDEO_FORMATS:
            raise ValueError(f"unknown video format {path.suffix!r} of {str(path)!r}: use one of {VIDEO_FORMATS}")
        self._imageio = import_optional("imageio", extra="record", purpose="writing videos")
        if path.suffix == ".mp4":
            import_optional("imageio_ffmpeg", extra="record", purpose="writing MP4 videos",
                            package="imageio-ffmpeg")
        self.path = path
        self.fps = fps
        self.num_frames = 0
        self._tmp = path.with_name(f".{path.stem}.partial{path.suffix}")  # the suffix tells the format
        self._writer: Any = None
        self._shape: tuple[int, ...] | None = None

    def _open(self) -> Any:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.suffix == ".gif":
            return self._imageio.v3.imopen(self._tmp, "w", plugin="pillow")
        return self._imageio.v2.get_writer(self._tmp, fps=self.fps, macro_block_size=1)

    def append(self, frame: np.ndarray) -> None:
        """Encodes one uint8 frame ``[H, W, C]`` (C in 1, 3, 4; every frame the same shape)."""
        frame = np.asarray(frame)
        if frame.ndim != 3 or frame.dtype != np.uint8 or frame.shape[-1] not in (1, 3, 4):
            raise ValueError(f"VideoWriter: frames must be uint8 [H, W, C] with C in (1, 3, 4), "
                             f"got {frame.dtype} {frame.shape}")
        if self._shape is None:
            self._shape = frame.shape
            self._writer = self._open()
        elif frame.shape != self._shape:
            raise ValueError(f"VideoWriter: frame {self.num_frames} has shape {frame.shape}, "
                             f"the first had {self._shape}")
        if self.path.suffix == ".gif":
            self._writer.write(frame, is_batch=False, duration=1000 / self.fps, loop=0)
        else:
            h, w = frame.shape[:2]
            if frame.shape[-1] != 3:
                frame = np.repeat(frame, 3, -1) if frame.shape[-1] == 1 else frame[..., :3]
            if h % 2 or w % 2:
                frame = np.pad(frame, ((0, h % 2), (0, w % 2), (0, 0)))
            self._writer.append_data(frame)
        self.num_frames += 1

    def close(self) -> Path:
        """Finishes the file and moves it to :attr:`path`; returns the path."""
        if self._writer is None:
            raise ValueError(f"VideoWriter: no frames were appended; {str(self.path)!r} not written")
        self._writer.close()
        self._writer = None
        os.replace(self._tmp, self.path)
        return self.path

    def abort(self) -> None:
        """Stops writing and removes the partial file."""
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
            self._writer = None
        self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def encode_gif(frames: np.ndarray, fps: int = 30) -> bytes:
    """The bytes of an animated GIF of uint8 frames ``[T, H, W, C]``."""
    imageio = import_optional("imageio", extra="record", purpose="encoding GIFs")
    return imageio.v3.imwrite("<bytes>", frames, extension=".gif", duration=1000 / fps, loop=0)


@dataclass
class EpisodeVideo:
    """What :func:`record_episode` wrote."""

    path: Path
    num_frames: int
    episode_return: float
    steps: int

    def __str__(self) -> str:
        return f"{self.path} ({self.num_frames} frames, {self.steps} steps, return {self.episode_return:.1f})"


def record_episode(
    env: EnvBase,
    policy: Any,
    path: str | os.PathLike,
    *,
    fps: int = 30,
    max_steps: int = 1000,
    frame_key: str = "pixels",
) -> EpisodeVideo:
    """Plays one episode with ``policy`` (deterministic actions) and writes its video.

    Frames come from the observation ``frame_key`` when the env has it
    (``GymEnv(id, from_pixels=True, pixels_only=False)``), else from ``env.render()``
    (a Gymnasium env made with ``render_mode="rgb_array"``, e.g.
    ``GymEnv("CartPole-v1", render_mode="rgb_array")``). The torch-native envs
    (``CartPoleEnv`` ...) do not render: record their Gymnasium twin, whose dynamics
    and observations are the same.

    Args:
        env: a single (unbatched, or batch ``[1]``) env.
        policy: a TensorDict module writing the action, or None for random actions.
        path: the ``.mp4`` or ``.gif`` file to write.
        fps: frames per second of the video.
        max_steps: the episode is cut after this many steps.
        frame_key: the observation that holds frames, if any.

    Returns: an :class:`EpisodeVideo` (path, number of frames = steps + 1, return).

    Example:
        >>> import tempfile
        >>> from steersman.envs import GymEnv
        >>> env = GymEnv("CartPole-v1", render_mode="rgb_array")
        >>> out = record_episode(env, None, tempfile.mkdtemp() + "/ep.gif", max_steps=5)
        >>> out.num_frames == out.steps + 1, out.steps <= 5
        (True, True)
    """
    if env.batch_size.numel() != 1:
        raise ValueError(f"record_episode needs a single env (batch_size [] or [1]), "
                         f"got batch_size {list(env.batch_size)}")
    path = Path(path)
    if path.suffix not in VIDEO_FORMATS:
        raise ValueError(f"record_episode: unknown video format {path.suffix!r}: use one of {VIDEO_FORMATS}")
    total = 0.0
    steps = 0
    # each frame goes to the encoder as it is rendered: memory stays one frame, not the clip
    with VideoWriter(path, fps=fps) as writer, torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        td = env.reset()
        writer.append(_frame(env, td, frame_key))
        while steps < max_steps:
            td = policy(td) if policy is not None else env.rand_action(td)
            td = env.step(td)
            steps += 1
            total += float(td.get(("next", "reward")).sum())
            writer.append(_frame(env, td.get("next"), frame_key))
            if bool(td.get(("next", "done")).any()):
                break
            td = step_mdp(td)
    return EpisodeVideo(path=path, num_frames=writer.num_frames, episode_return=total, steps=steps)


def _frame(env: EnvBase, td: Any, key: str) -> np.ndarray:
    if key in td.keys():
        frame = td.get(key)
        frame = frame.reshape(frame.shape[-3:]) if frame.ndim > 3 else frame
        frame = frame.cpu().numpy()
    else:
        render = getattr(env, "render", None)
        if render is None:
            raise TypeError(
                f"record_episode: {type(env).__name__} has no render() and no {key!r} observation: "
                "use a Gymnasium env made with render_mode='rgb_array' "
                "(GymEnv('CartPole-v1', render_mode='rgb_array')) or one with pixel observations "
                "(GymEnv(id, from_pixels=True, pixels_only=False))"
            )
        frame = render()
        if frame is None:
            raise ValueError(f"record_episode: {type(env).__name__}.render() returned None: make the env "
                             "with render_mode='rgb_array'")
    frame = np.asarray(frame)
    if frame.ndim != 3 or frame.dtype != np.uint8:
        raise ValueError(f"record_episode: frames must be uint8 [H, W, C], got {frame.dtype} {frame.shape}")
    return frame
