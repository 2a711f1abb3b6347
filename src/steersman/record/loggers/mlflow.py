"""MLflow tracking (a local ``mlruns`` folder by default)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import Tensor

from .._optional import import_optional
from .common import Logger

__all__ = ["MLFlowLogger"]


class MLFlowLogger(Logger):
    """Logs to an MLflow run through ``mlflow.MlflowClient`` (no global active run).

    Needs ``pip install 'steersman[mlflow]'``.

    Args:
        exp_name: the MLflow experiment (created if missing).
        tracking_uri: where runs go (default: ``file:./mlruns``, local files; MLflow's
            file store is opted into with ``MLFLOW_ALLOW_FILE_STORE=true`` unless that
            variable is already set).
        tags: tags of the run.
        video_fps: frames per second of logged videos.
        artifact_location: where a newly created experiment stores its artifacts
            (MLflow's default when ``None``; an existing experiment keeps its own).
    """

    def __init__(self, exp_name: str, tracking_uri: str | None = None, tags: Mapping[str, str] | None = None,
                 *, video_fps: int = 30, artifact_location: str | None = None) -> None:
        mlflow = import_optional("mlflow", extra="mlflow", purpose="MLFlowLogger")
        tracking_uri = tracking_uri or Path("mlruns").absolute().as_uri()
        if tracking_uri.startswith("file:"):
            # MLflow >= 3.7 refuses its file store unless opted in; local files are the point
            # here (no server, no database). An explicit MLFLOW_ALLOW_FILE_STORE is respected.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        super().__init__(exp_name, tracking_uri)
        self.video_fps = video_fps
        self.client = mlflow.MlflowClient(tracking_uri=tracking_uri)
        exp = self.client.get_experiment_by_name(exp_name)
        exp_id = (exp.experiment_id if exp is not None
                  else self.client.create_experiment(exp_name, artifact_location=artifact_location))
        self.run_id: str = self.client.create_run(exp_id, tags=dict(tags or {})).info.run_id

    def log_scalar(self, name: str, value: float | Tensor, step: int | None = None) -> None:
        if isinstance(value, Tensor):
            value = value.item()
        self.client.log_metric(self.run_id, name, float(value), step=step or 0)

    def log_hparams(self, cfg: Mapping[str, Any]) -> None:
        for key, value in _flatten(cfg).items():
            self.client.log_param(self.run_id, key, value)

    def log_str(self, name: str, value: str, step: int | None = None) -> None:
        fname = name if step is None else f"{name}_{int(step)}"
        self.client.log_text(self.run_id, value, f"texts/{fname.replace('/', '_')}.txt")

    def log_video(self, name: str, video: Tensor, step: int | None = None, **kwargs: Any) -> None:
        from ..video import video_to_frames, write_video

        stem = name.replace("/", "_") + ("" if step is None else f"_{int(step)}")
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"{stem}.mp4"
            write_video(video_to_frames(video), path, fps=kwargs.get("fps", self.video_fps))
            self.client.log_artifact(self.run_id, str(path), artifact_path="videos")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _flatten(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in cfg.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v if isinstance(v, str) else json.dumps(v, default=str)
    return out
