"""Logger factory and experiment names (TorchRL's ``get_logger``/``generate_exp_name``)."""

from __future__ import annotations

import os
import uuid
from datetime import datetime
from typing import Any

from .common import Logger

__all__ = ["LOGGER_TYPES", "generate_exp_name", "get_logger"]

LOGGER_TYPES = ("csv", "tensorboard", "wandb", "mlflow")


def generate_exp_name(model_name: str, experiment_name: str) -> str:
    """A unique experiment name: ``<model>_<experiment>_<8 hex>_<yy_mm_dd-HH_MM_SS>``.

    Example:
        >>> name = generate_exp_name("PPO", "cartpole")
        >>> name.startswith("PPO_cartpole_"), len(name.split("_")[2])
        (True, 8)
    """
    stamp = datetime.now().strftime("%y_%m_%d-%H_%M_%S")
    return f"{model_name}_{experiment_name}_{uuid.uuid4().hex[:8]}_{stamp}"


def get_logger(logger_type: str, logger_name: str | os.PathLike, experiment_name: str,
               **kwargs: Any) -> Logger:
    """The logger of kind ``logger_type`` (one of :data:`LOGGER_TYPES`).

    Args:
        logger_type: ``"csv"``, ``"tensorboard"``, ``"wandb"`` or ``"mlflow"``.
        logger_name: the folder the logger writes under (wandb: ``save_dir``; mlflow:
            the tracking folder ``<logger_name>/mlruns``).
        experiment_name: the experiment's name (its folder for csv/tensorboard).
        **kwargs: the logger class's other arguments.

    Example:
        >>> import tempfile
        >>> log = get_logger("csv", tempfile.mkdtemp(), "exp")
        >>> type(log).__name__, log.path.name
        ('CSVLogger', 'metrics.csv')
        >>> get_logger("stdout", ".", "exp")
        Traceback (most recent call last):
        ...
        ValueError: unknown logger_type 'stdout': choose one of 'csv', 'tensorboard', 'wandb', 'mlflow'
    """
    if logger_type == "csv":
        from .csv import CSVLogger

        return CSVLogger(experiment_name, logger_name, **kwargs)
    if logger_type == "tensorboard":
        from .tensorboard import TensorboardLogger

        return TensorboardLogger(experiment_name, logger_name, **kwargs)
    if logger_type == "wandb":
        from .wandb import WandbLogger

        return WandbLogger(experiment_name, save_dir=logger_name, **kwargs)
    if logger_type == "mlflow":
        from pathlib import Path

        from .mlflow import MLFlowLogger

        kwargs.setdefault("tracking_uri", (Path(logger_name) / "mlruns").absolute().as_uri())
        return MLFlowLogger(experiment_name, **kwargs)
    choices = ", ".join(repr(t) for t in LOGGER_TYPES)
    raise ValueError(f"unknown logger_type {logger_type!r}: choose one of {choices}")
