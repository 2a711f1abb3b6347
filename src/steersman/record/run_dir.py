"""The layout of a run directory, as written by ``steersman train``::

    <root>/<name>_<YYYY-mm-dd_HH-MM-SS>/
        config.yaml                 the resolved config (what marks a run directory)
        metrics.csv                 every scalar, wide format (CSVLogger)
        tb/                         TensorBoard events
        checkpoints/                periodic checkpoints
        plots/learning_curve.png    return vs frames, with evaluation points
        export/                     the exported policy (policy.pt2 / policy.onnx)
        videos/                     recorded episodes
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from .loggers.common import Logger, MultiLogger
from .loggers.utils import LOGGER_TYPES

__all__ = ["NotARunDirError", "RunDir"]


class NotARunDirError(FileNotFoundError):
    """A path given as a run directory has no ``config.yaml``."""


class RunDir:
    """Paths of one run directory (see the module docstring for the layout).

    Sub-folders are made by whoever writes into them (``mkdir(parents=True, exist_ok=True)``).

    Example:
        >>> import tempfile
        >>> run = RunDir.create(tempfile.mkdtemp(), "ppo_CartPole-v1")
        >>> run.path.name.startswith("ppo_CartPole-v1_"), run.metrics_csv.name, run.learning_curve_png.parent.name
        (True, 'metrics.csv', 'plots')
        >>> _ = run.config_path.write_text("seed: 0\\n")
        >>> RunDir.open(run.path).path == run.path
        True
        >>> RunDir.open(run.path.parent)
        Traceback (most recent call last):
        ...
        steersman.record.run_dir.NotARunDirError: ... is not a run directory: it has no config.yaml (run directories are made by `steersman train`)
    """

    CONFIG = "config.yaml"

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    @classmethod
    def create(cls, root: str | os.PathLike, name: str) -> RunDir:
        """Makes ``<root>/<name>_<timestamp>`` (``_1``, ``_2``... appended if taken)."""
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        base = f"{name}_{datetime.now():%Y-%m-%d_%H-%M-%S}"
        for i in range(10_000):
            path = root / (base if i == 0 else f"{base}_{i}")
            try:
                path.mkdir()
            except FileExistsError:
                continue
            return cls(path)
        raise FileExistsError(f"no free run directory name under {str(root)!r} for {base!r}")

    @classmethod
    def open(cls, path: str | os.PathLike) -> RunDir:
        """The run directory at ``path``; :class:`NotARunDirError` if it has no config."""
        run = cls(path)
        if not run.config_path.is_file():
            what = "does not exist" if not run.path.exists() else f"has no {cls.CONFIG}"
            raise NotARunDirError(f"{str(run.path)!r} is not a run directory: it {what} "
                                  "(run directories are made by `steersman train`)")
        return run

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def config_path(self) -> Path:
        return self.path / self.CONFIG

    @property
    def metrics_csv(self) -> Path:
        return self.path / "metrics.csv"

    @property
    def tb_dir(self) -> Path:
        return self.path / "tb"

    @property
    def checkpoints_dir(self) -> Path:
        return self.path / "checkpoints"

    @property
    def plots_dir(self) -> Path:
        return self.path / "plots"

    @property
    def learning_curve_png(self) -> Path:
        return self.plots_dir / "learning_curve.png"

    @property
    def export_dir(self) -> Path:
        return self.path / "export"

    @property
    def videos_dir(self) -> Path:
        return self.path / "videos"

    def make_logger(self, backends: Sequence[str] = ("csv", "tensorboard"), *,
                    start_step: int | None = None, project: str = "steersman") -> MultiLogger:
        """The run's loggers as one :class:`MultiLogger`: ``"csv"`` writes
        ``metrics.csv`` (``start_step``: resume point, see :class:`CSVLogger`),
        ``"tensorboard"`` writes ``tb/``, ``"wandb"`` an offline run under the run
        directory (project ``project``), ``"mlflow"`` a ``mlruns/`` folder in it."""
        unknown = [kind for kind in backends if kind not in LOGGER_TYPES]
        if unknown:
            raise ValueError(f"unknown logger backend {unknown[0]!r}: choose from {', '.join(map(repr, LOGGER_TYPES))}")
        loggers: list[Logger] = []
        for kind in backends:
            if kind == "csv":
                from .loggers.csv import CSVLogger

                loggers.append(CSVLogger(self.path.name, self.path.parent, start_step=start_step))
            elif kind == "tensorboard":
                from .loggers.tensorboard import TensorboardLogger

                loggers.append(TensorboardLogger(self.tb_dir.name, self.path))
            elif kind == "wandb":
                from .loggers.wandb import WandbLogger

                loggers.append(WandbLogger(self.name, save_dir=self.path, project=project,
                                           id=self.name.replace(".", "-")))
            elif kind == "mlflow":
                from .loggers.mlflow import MLFlowLogger

                loggers.append(MLFlowLogger(project, tracking_uri=(self.path / "mlruns").absolute().as_uri(),
                                            tags={"run_dir": str(self.path)}))
        return MultiLogger(*loggers)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"
