"""Weights & Biases (offline by default)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import Tensor

from .._optional import import_optional
from .common import Logger

__all__ = ["WandbLogger"]


class WandbLogger(Logger):
    """Logs to a Weights & Biases run (``wandb.init``); offline unless told otherwise.

    Offline runs are written under ``<save_dir>/wandb`` and uploaded later with
    ``wandb sync``. Needs ``pip install 'steersman[wandb]'``.

    Args:
        exp_name: the run's name.
        offline: write locally only (the default; no account or network needed).
        save_dir: where wandb writes its files (default: the current folder).
        id: the run id, to resume a run.
        project: the wandb project.
        video_fps: frames per second of logged videos.
        **kwargs: other ``wandb.init`` arguments (``entity``, ``tags``, ``config`` ...).
    """

    def __init__(self, exp_name: str, offline: bool = True, save_dir: str | os.PathLike | None = None,
                 id: str | None = None, project: str | None = None, *, video_fps: int = 30,
                 **kwargs: Any) -> None:
        self._wandb = import_optional("wandb", extra="wandb", purpose="WandbLogger")
        save_dir = None if save_dir is None else os.fspath(save_dir)
        super().__init__(exp_name, save_dir)
        self.video_fps = video_fps
        self.offline = offline
        self.experiment = self._wandb.init(
            name=exp_name, dir=save_dir, id=id, project=project,
            mode="offline" if offline else "online", resume="allow" if id else None, **kwargs,
        )

    def log_scalar(self, name: str, value: float | Tensor, step: int | None = None) -> None:
        if isinstance(value, Tensor):
            value = value.item()
        self.experiment.log({name: value}, step=step)

    def log_metrics(self, metrics: Mapping[str, float | Tensor], step: int | None = None) -> None:
        vals = {k: v.item() if isinstance(v, Tensor) else v for k, v in metrics.items()}
        self.experiment.log(vals, step=step)

    def log_hparams(self, cfg: Mapping[str, Any]) -> None:
        self.experiment.config.update(dict(cfg), allow_val_change=True)

    def log_str(self, name: str, value: str, step: int | None = None) -> None:
        self.experiment.log({name: self._wandb.Html(f"<pre>{value}</pre>")}, step=step)

    def log_video(self, name: str, video: Tensor, step: int | None = None, **kwargs: Any) -> None:
        from ..video import video_to_frames

        frames = video_to_frames(video).transpose(0, 3, 1, 2)  # wandb wants [T, C, H, W]
        fps = kwargs.get("fps", self.video_fps)
        self.experiment.log({name: self._wandb.Video(frames, fps=fps, format="mp4")}, step=step)

    def close(self) -> None:
        """Finishes the run; an offline run says where it went and how to upload it."""
        files = getattr(self.experiment, "dir", None)
        self.experiment.finish()
        if self.offline and files:
            run_dir = Path(files).parent
            print(f"wandb: offline run saved in {run_dir}; upload it with `wandb sync {run_dir}`",
                  file=sys.stderr, flush=True)
