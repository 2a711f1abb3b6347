"""Metric loggers: CSV (``metrics.csv``), TensorBoard, W&B, MLflow, and a fan-out.

The optional backends import their package when constructed, so importing this module
needs none of them.
"""

from .common import Logger, MultiLogger
from .csv import CSVLogger, read_metrics_csv
from .mlflow import MLFlowLogger
from .monitoring import Every, LoggerMonitor
from .process import ProcessLogger, ProcessLoggerClient
from .tensorboard import TensorboardLogger
from .utils import LOGGER_TYPES, generate_exp_name, get_logger
from .wandb import WandbLogger

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
]
