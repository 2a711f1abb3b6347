"""L4: recording a run. Loggers (CSV, TensorBoard, W&B, MLflow), a progress bar, learning
curves, a ``stats()`` monitor (``LoggerMonitor``, ``Every``), a logger in its own process
(``ProcessLogger``), episode videos, standalone policy export and the run-directory layout.

Optional packages (tensorboard, matplotlib, rich, imageio, onnx, wandb, mlflow) are
imported when first used, with an error naming what to install.
"""

from .export import (
    EXPORT_FORMATS,
    ExportReport,
    ExportVerificationError,
    VerificationResult,
    export_policy,
    verify_export,
)
from .loggers import (
    LOGGER_TYPES,
    CSVLogger,
    Every,
    Logger,
    LoggerMonitor,
    MLFlowLogger,
    MultiLogger,
    ProcessLogger,
    ProcessLoggerClient,
    TensorboardLogger,
    WandbLogger,
    generate_exp_name,
    get_logger,
    read_metrics_csv,
)
from .plot import plot_learning_curves
from .progress import ProgressBar
from .recorder import PixelRenderTransform, TensorDictRecorder, VideoRecorder
from .run_dir import NotARunDirError, RunDir
from .video import EpisodeVideo, record_episode, video_to_frames, write_video

__all__ = [
    "Logger",
    "MultiLogger",
    "CSVLogger",
    "read_metrics_csv",
    "TensorboardLogger",
    "WandbLogger",
    "MLFlowLogger",
    "LOGGER_TYPES",
    "get_logger",
    "generate_exp_name",
    "Every",
    "LoggerMonitor",
    "ProcessLogger",
    "ProcessLoggerClient",
    "ProgressBar",
    "plot_learning_curves",
    "VideoRecorder",
    "PixelRenderTransform",
    "TensorDictRecorder",
    "EpisodeVideo",
    "record_episode",
    "video_to_frames",
    "write_video",
    "EXPORT_FORMATS",
    "ExportReport",
    "ExportVerificationError",
    "VerificationResult",
    "export_policy",
    "verify_export",
    "NotARunDirError",
    "RunDir",
]
