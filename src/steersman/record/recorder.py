"""Recording transforms (TorchRL's ``torchrl.record`` names): :class:`VideoRecorder` keeps
frames seen by an env and logs them as a video, :class:`PixelRenderTransform` adds
``env.render()`` frames to the env's outputs, :class:`TensorDictRecorder` saves the
TensorDicts seen by an env to files."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from steersman.data import Composite, Unbounded
from steersman.envs.transforms import Transform
from steersman.tensordict import TensorDictBase

__all__ = ["VideoRecorder", "PixelRenderTransform", "TensorDictRecorder", "to_chw_uint8"]


def to_chw_uint8(frame: Any, what: str = "frame") -> Tensor:
    """A frame (or a batch of frames) as uint8 ``[*batch, C, H, W]`` with ``C`` = 3.

    Accepts ``[..., H, W, C]`` or ``[..., C, H, W]`` with ``C`` in (1, 3) and grey
    ``[H, W]``; floating frames are read as values in ``[0, 1]`` (scaled by 255: TorchRL
    casts them to uint8 as they are, which turns such images black).

    Example:
        >>> import torch
        >>> to_chw_uint8(torch.zeros(6, 8, 3)).shape, to_chw_uint8(torch.ones(2, 1, 6, 8)).shape
        (torch.Size([3, 6, 8]), torch.Size([2, 3, 6, 8]))
    """
    x = torch.as_tensor(np.asarray(frame) if not isinstance(frame, Tensor) else frame).detach().cpu()
    if x.ndim == 2:
        x = x.unsqueeze(0)
    elif x.ndim >= 3 and x.shape[-1] in (1, 3) and x.shape[-3] not in (1, 3):
        x = x.movedim(-1, -3)  # channels last -> first
    elif x.ndim >= 3 and x.shape[-1] in (1, 3) and x.shape[-3] in (1, 3):
        x = x.movedim(-1, -3) if x.shape[-2] <= 3 else x  # ambiguous: a tiny image is HWC
    if x.ndim < 3 or x.shape[-3] not in (1, 3):
        raise ValueError(f"{what}: expected an image [..., H, W, C] or [..., C, H, W] with C in (1, 3) "
                         f"or [H, W], got shape {tuple(x.shape)}")
    if x.is_floating_point():
        x = (x.clamp(0, 1) * 255).round()
    x = x.clamp(0, 255).to(torch.uint8)
    if x.shape[-3] == 1:
        x = x.expand(*x.shape[:-3], 3, *x.shape[-2:])
    return x


def _center_crop(x: Tensor, size: int) -> Tensor:
    h, w = x.shape[-2:]
    if size > h or size > w:
        raise ValueError(f"VideoRecorder: center_crop={size} is larger than the frames ({h}x{w})")
    top, left = (h - size) // 2, (w - size) // 2
    return x[..., top: top + size, left: left + size]


def _grid(frames: Tensor) -> Tensor:
    """``[N, C, H, W]`` tiled into one ``[C, rows * H, cols * W]`` frame (``cols = ceil(sqrt N)``)."""
    n, c, h, w = frames.shape
    cols = math.ceil(math.sqrt(n))
    rows = math.ceil(n / cols)
    out = torch.zeros(c, rows * h, cols * w, dtype=frames.dtype)
    for i in range(n):
        r, q = divmod(i, cols)
        out[:, r * h: (r + 1) * h, q * w: (q + 1) * w] = frames[i]
    return out


class VideoRecorder(Transform):
    """Keeps every ``skip``-th frame the env outputs and logs them as a video with :meth:`dump`.

    Frames are read from ``in_keys`` (default ``"pixels"``) at each reset and step (and in
    ``forward``), converted to uint8 ``[3, H, W]`` (see :func:`to_chw_uint8`) and kept on
    the CPU; the env's outputs are unchanged. :meth:`dump` calls
    ``logger.log_video(tag, video, step=..., fps=fps, **kwargs)`` with ``video`` uint8
    ``[1, T, 3, H, W]`` and clears the frames.

    Args:
        logger: a :class:`~steersman.record.Logger` (or anything with ``log_video``);
            ``None``: frames are kept but not logged.
        tag: the video's name.
        in_keys: the frame entries (default ``["pixels"]``).
        skip: keep one frame in ``skip`` (default 2).
        center_crop: crop frames to their central ``center_crop x center_crop`` square.
        make_grid: tile the frames of a batched env into one frame per step (default: the
            frames of the sub-envs follow one another in the video, as in TorchRL).
        out_keys: accepted for TorchRL compatibility (the outputs are not changed).
        fps: frames per second of the logged video.
        max_frames: keep at most that many frames until the next :meth:`dump`.
        dump_on_done: :meth:`dump` when every sub-env is done.
        **kwargs: passed to ``logger.log_video``.

    Example:
        >>> import torch
        >>> from steersman.record import VideoRecorder
        >>> from steersman.tensordict import TensorDict
        >>> class Printer:
        ...     def log_video(self, name, video, step=None, **kwargs):
        ...         print(name, tuple(video.shape), video.dtype, step, kwargs)
        >>> recorder = VideoRecorder(Printer(), "episode", skip=1, fps=4)
        >>> for _ in range(3):
        ...     _ = recorder(TensorDict(pixels=torch.zeros(6, 8, 3, dtype=torch.uint8)))
        >>> recorder.dump()
        episode (1, 3, 3, 6, 8) torch.uint8 0 {'fps': 4}
    """

    def __init__(self, logger: Any, tag: str | None, in_keys: Sequence[Any] | None = None, skip: int | None = None,
                 center_crop: int | None = None, make_grid: bool | None = None, out_keys: Sequence[Any] | None = None,
                 fps: int | None = None, max_frames: int | None = None, dump_on_done: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(in_keys=["pixels"] if in_keys is None else in_keys,
                         out_keys=None if out_keys is None else out_keys)
        skip = 2 if skip is None else skip
        for name, value in (("skip", skip), ("center_crop", center_crop), ("max_frames", max_frames)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"VideoRecorder: {name} must be a positive int, got {value!r}")
        self.logger = logger
        self.tag = tag
        self.skip = skip
        self.center_crop = center_crop
        self.make_grid = bool(make_grid)
        self.max_frames = max_frames
        self.dump_on_done = bool(dump_on_done)
        self.video_kwargs = dict(kwargs)
        if fps is not None:
            self.video_kwargs["fps"] = fps
        self.obs: list[Tensor] = []
        self.count = 0
        self.iter = 0

    def _record(self, frame: Any, key: Any) -> None:
        self.count += 1
        if self.count % self.skip or (self.max_frames is not None and len(self.obs) >= self.max_frames):
            return
        x = to_chw_uint8(frame, f"VideoRecorder: entry {key!r}")
        if self.center_crop:
            x = _center_crop(x, self.center_crop)
        if x.ndim == 3:
            self.obs.append(x.clone())
        elif self.make_grid:
            self.obs.append(_grid(x.reshape(-1, *x.shape[-3:])))
        else:
            frames = list(x.reshape(-1, *x.shape[-3:]).clone().unbind(0))
            if self.max_frames is not None:
                frames = frames[: self.max_frames - len(self.obs)]
            self.obs.extend(frames)

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        for key in self.in_keys:
            frame = tensordict.get(key, None)
            if frame is not None:
                self._record(frame, key)
        return tensordict

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        self._call(next_tensordict)
        if self.dump_on_done:
            done = next_tensordict.get("done", None)
            if done is not None and bool(done.all()):
                self.dump()
        return next_tensordict

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        return self._call(tensordict_reset)

    def dump(self, suffix: str | None = None, step: int | None = None) -> None:
        """Logs the kept frames (nothing if there are none) as ``tag`` (``tag_suffix`` with
        a ``suffix``) at ``step`` (default: the number of dumps so far), then clears them."""
        if self.obs and self.logger is not None:
            video = torch.stack(self.obs, 0).unsqueeze(0)
            tag = self.tag if suffix is None else f"{self.tag}_{suffix}"
            self.logger.log_video(name=tag, video=video, step=self.iter if step is None else step,
                                  **self.video_kwargs)
        self.obs = []
        self.count = 0
        self.iter += 1


class PixelRenderTransform(Transform):
    """Adds the frames of the base env's ``render()`` to its outputs (at reset and step).

    Args:
        out_keys: where the frame goes (default ``["pixels"]``).
        preproc: applied to each rendered frame (a numpy array or a tensor) first.
        as_non_tensor: accepted for TorchRL compatibility; frames are stored as tensors.
        render_method: the name of the base env's render method (default ``"render"``).
        pass_tensordict: call ``render(tensordict)`` with the step's output.

    The frame's shape and dtype (for the observation spec) come from one call of the
    render method (the base env is reset first if it cannot render yet). With
    ``GymEnv``, build the env with ``render_mode="rgb_array"``.

    Example:
        >>> import torch
        >>> from steersman.envs import CartPoleEnv
        >>> from steersman.envs.transforms import TransformedEnv
        >>> from steersman.record import PixelRenderTransform
        >>> class Drawn(CartPoleEnv):
        ...     def render(self):
        ...         return torch.full((6, 8, 3), 7, dtype=torch.uint8)
        >>> env = TransformedEnv(Drawn(), PixelRenderTransform())
        >>> env.rollout(3)["next", "pixels"].shape
        torch.Size([3, 6, 8, 3])
    """

    _check_spec_in_keys = False

    def __init__(self, out_keys: list[Any] | None = None, preproc: Callable[[Any], Any] | None = None,
                 as_non_tensor: bool | None = None, render_method: str = "render", pass_tensordict: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(in_keys=[], out_keys=["pixels"] if out_keys is None else out_keys)
        if len(self.out_keys) != 1:
            raise ValueError(f"PixelRenderTransform: expected one out_key, got {self.out_keys}")
        self.preproc = preproc
        self.as_non_tensor = as_non_tensor
        self.render_method = render_method
        self.pass_tensordict = bool(pass_tensordict)
        self.render_kwargs = kwargs
        self.enabled = True

    def switch(self, mode: bool | None = None) -> None:
        """Turns rendering on/off (``None``: toggles)."""
        self.enabled = (not self.enabled) if mode is None else bool(mode)

    def _render(self, tensordict: TensorDictBase | None) -> Tensor:
        parent = self.parent
        if parent is None:
            raise RuntimeError("PixelRenderTransform: not inside an env (use it in a TransformedEnv)")
        base = parent.base_env
        method = getattr(base, self.render_method, None)
        if method is None:
            raise AttributeError(f"PixelRenderTransform: {type(base).__name__} has no method {self.render_method!r}")
        frame = method(tensordict, **self.render_kwargs) if self.pass_tensordict else method(**self.render_kwargs)
        if self.preproc is not None:
            frame = self.preproc(frame)
        if frame is None:
            raise RuntimeError(f"PixelRenderTransform: {type(base).__name__}.{self.render_method}() returned None "
                               "(for Gymnasium envs, make them with render_mode='rgb_array')")
        return torch.as_tensor(np.asarray(frame) if not isinstance(frame, Tensor) else frame)

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        if self.enabled:
            tensordict.set(self.out_keys[0], self._render(tensordict).to(tensordict.device or "cpu"))
        return tensordict

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        return self._call(tensordict_reset)

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        # no in_keys: the frame comes from the env's render method, not from an entry
        output_spec["full_observation_spec"] = self.transform_observation_spec(output_spec["full_observation_spec"])
        return output_spec

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        try:
            frame = self._render(None)
        except Exception:  # noqa: BLE001 - the env may need a reset before it can render
            self.parent.base_env.reset()
            frame = self._render(None)
        observation_spec[self.out_keys[0]] = Unbounded(shape=frame.shape, dtype=frame.dtype,
                                                       device=observation_spec.device)
        return observation_spec


class TensorDictRecorder(Transform):
    """Keeps every ``skip``-th TensorDict the env outputs and saves them with :meth:`dump`.

    Args:
        out_file_base: the file stem: :meth:`dump` writes ``{out_file_base}_{i}.pt``
            (``i``: the number of dumps so far).
        skip_reset: do not keep the outputs of resets (they lack the step's entries, e.g.
            the reward: with ``skip_reset=False`` select common ``in_keys``).
        skip: keep one step output in ``skip`` (default 4).
        in_keys: the entries kept (default: all).

    The file holds plain data (``{"batch_size": [T, *env_batch], "data": nested dict of
    tensors}``, stacked along a new first dim): ``torch.load(path, weights_only=True)``
    reads it, and :meth:`load` gives the TensorDict back.

    Example:
        >>> import tempfile, torch
        >>> from steersman.record import TensorDictRecorder
        >>> from steersman.tensordict import TensorDict
        >>> base = tempfile.mkdtemp() + "/steps"
        >>> recorder = TensorDictRecorder(base, skip=1)
        >>> for t in range(3):
        ...     _ = recorder(TensorDict(obs=torch.full((2,), float(t))))
        >>> path = recorder.dump()
        >>> TensorDictRecorder.load(path)["obs"][:, 0].tolist()
        [0.0, 1.0, 2.0]
    """

    def __init__(self, out_file_base: str | os.PathLike, skip_reset: bool = True, skip: int = 4,
                 in_keys: Sequence[Any] | None = None) -> None:
        super().__init__(in_keys=in_keys)
        if isinstance(skip, bool) or not isinstance(skip, int) or skip < 1:
            raise ValueError(f"TensorDictRecorder: skip must be a positive int, got {skip!r}")
        self.out_file_base = str(out_file_base)
        self.skip_reset = bool(skip_reset)
        self.skip = skip
        self.td: list[TensorDictBase] = []
        self.count = 0
        self.iter = 0

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        self.count += 1
        if self.count % self.skip == 0:
            keep = tensordict.select(*self.in_keys) if self.in_keys else tensordict
            self.td.append(keep.clone())
        return tensordict

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        return tensordict_reset if self.skip_reset else self._call(tensordict_reset)

    def dump(self, suffix: str | None = None) -> Path | None:
        """Saves the kept TensorDicts (stacked) to ``{out_file_base}_{i}.pt`` (``suffix``
        replaces ``i``); returns the path, or ``None`` if there was nothing to save."""
        path = None
        if self.td:
            td = torch.stack(self.td, 0)
            path = Path(f"{self.out_file_base}_{self.iter if suffix is None else suffix}.pt")
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"batch_size": list(td.batch_size), "data": td.to_dict()}, path)
        self.td = []
        self.count = 0
        self.iter += 1
        return path

    @staticmethod
    def load(path: str | os.PathLike) -> TensorDictBase:
        """The TensorDict saved by :meth:`dump` (no code is executed while loading)."""
        from steersman.tensordict import TensorDict

        state = torch.load(path, weights_only=True)
        return TensorDict(state["data"], batch_size=state["batch_size"])
