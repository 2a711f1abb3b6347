"""TensorBoard event files through ``torch.utils.tensorboard``."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import Tensor

from .._optional import import_optional
from .common import Logger

__all__ = ["TensorboardLogger"]


class TensorboardLogger(Logger):
    """Writes TensorBoard events to ``<log_dir>/<exp_name>``.

    Scalars go through ``SummaryWriter.add_scalar``; :meth:`log_hparams` writes the
    config as a JSON text summary (``"hparams"``); :meth:`log_video` writes an animated
    GIF image summary (encoded with imageio, so moviepy is not needed). Events are
    flushed every ``flush_secs`` seconds and on :meth:`flush`/:meth:`close`.

    Args:
        exp_name: the run's folder under ``log_dir``.
        log_dir: parent folder (default ``"tb_logs"``).
        flush_secs: how often the writer flushes pending events.
        video_fps: frames per second of logged videos.

    Example:
        >>> import tempfile
        >>> from steersman.record import TensorboardLogger
        >>> d = tempfile.mkdtemp()
        >>> with TensorboardLogger("run", d) as log:
        ...     log.log_scalar("train/return", 10.0, step=100)
        >>> any(p.name.startswith("events.out.tfevents") for p in (Path(d) / "run").iterdir())
        True
    """

    def __init__(self, exp_name: str, log_dir: str | os.PathLike | None = None, *,
                 flush_secs: int = 10, video_fps: int = 30) -> None:
        log_dir = "tb_logs" if log_dir is None else os.fspath(log_dir)
        super().__init__(exp_name, log_dir)
        import_optional("tensorboard", extra=None, purpose="TensorboardLogger")
        from torch.utils.tensorboard import SummaryWriter

        self.experiment_dir = Path(log_dir) / exp_name
        self.video_fps = video_fps
        self.experiment = SummaryWriter(log_dir=str(self.experiment_dir), flush_secs=flush_secs)

    def log_scalar(self, name: str, value: float | Tensor, step: int | None = None) -> None:
        if isinstance(value, Tensor):
            value = value.item()
        self.experiment.add_scalar(name, value, global_step=step)

    def log_hparams(self, cfg: Mapping[str, Any]) -> None:
        text = json.dumps(dict(cfg), indent=2, default=str)
        self.experiment.add_text("hparams", f"```\n{text}\n```")

    def log_str(self, name: str, value: str, step: int | None = None) -> None:
        self.experiment.add_text(name, value, global_step=step)

    def log_video(self, name: str, video: Tensor, step: int | None = None, **kwargs: Any) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        from ..video import encode_gif, video_to_frames

        frames = video_to_frames(video)  # [T, H, W, C] uint8
        t, h, w, c = frames.shape
        image = Summary.Image(height=h, width=w, colorspace=c,
                              encoded_image_string=encode_gif(frames, kwargs.get("fps", self.video_fps)))
        summary = Summary(value=[Summary.Value(tag=name, image=image)])
        self.experiment._get_file_writer().add_summary(summary, step)  # what add_video does

    def flush(self) -> None:
        self.experiment.flush()

    def close(self) -> None:
        self.experiment.close()

    def __repr__(self) -> str:
        return f"TensorboardLogger(experiment_dir={str(self.experiment_dir)!r})"
