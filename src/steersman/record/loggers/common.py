"""The logger interface shared by every backend, and :class:`MultiLogger` (fan-out)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

__all__ = ["Logger", "MultiLogger"]


class Logger:
    """Base class of the metric loggers (TorchRL's ``Logger`` interface).

    A backend implements :meth:`log_scalar`, :meth:`log_hparams`, :meth:`log_video` and
    :meth:`log_str`; :meth:`log_metrics` (several scalars of one step), :meth:`flush`
    and :meth:`close` have defaults. Loggers are context managers (``close`` on exit).

    Args:
        exp_name: the experiment's name.
        log_dir: the folder the backend writes under (its meaning is the backend's).

    Example:
        >>> class PrintLogger(Logger):
        ...     def log_scalar(self, name, value, step=None):
        ...         print(name, float(value), step)
        >>> with PrintLogger("demo", None) as log:
        ...     log.log_metrics({"loss": 0.5, "return": 10}, step=3)
        loss 0.5 3
        return 10.0 3
    """

    def __init__(self, exp_name: str, log_dir: str | None) -> None:
        self.exp_name = exp_name
        self.log_dir = log_dir

    def log_scalar(self, name: str, value: float | Tensor, step: int | None = None) -> None:
        """Records the scalar ``value`` of the metric ``name`` at ``step``."""
        raise NotImplementedError

    def log_metrics(self, metrics: Mapping[str, float | Tensor], step: int | None = None) -> None:
        """Records several scalars of the same ``step``."""
        for name, value in metrics.items():
            self.log_scalar(name, value, step)

    def log_hparams(self, cfg: Mapping[str, Any]) -> None:
        """Records the run's configuration (a nested dict of plain values)."""
        raise NotImplementedError

    def log_video(self, name: str, video: Tensor, step: int | None = None, **kwargs: Any) -> None:
        """Records a video: uint8 ``[T, C, H, W]`` or ``[N, T, C, H, W]`` (TorchRL's layout)."""
        raise NotImplementedError

    def log_str(self, name: str, value: str, step: int | None = None) -> None:
        """Records a piece of text."""
        raise NotImplementedError

    def flush(self) -> None:
        """Pushes buffered records to their destination (no-op by default)."""

    def close(self) -> None:
        """Flushes and releases files or connections (no-op by default)."""

    def __enter__(self) -> Logger:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(exp_name={self.exp_name!r}, log_dir={self.log_dir!r})"


class MultiLogger(Logger):
    """Sends every record to each of ``loggers``, in order.

    Example:
        >>> import tempfile
        >>> from steersman.record import CSVLogger, MultiLogger
        >>> d = tempfile.mkdtemp()
        >>> log = MultiLogger(CSVLogger("a", d), CSVLogger("b", d))
        >>> log.log_scalar("loss", 1.0, step=0); log.close()
        >>> open(f"{d}/a/metrics.csv").read() == open(f"{d}/b/metrics.csv").read() == "step,loss\\n0,1.0\\n"
        True
    """

    def __init__(self, *loggers: Logger) -> None:
        for lg in loggers:
            if not isinstance(lg, Logger):
                raise TypeError(f"MultiLogger takes Logger instances, got {type(lg).__name__}")
        self.loggers: tuple[Logger, ...] = loggers
        super().__init__(loggers[0].exp_name if loggers else "", None)

    def log_scalar(self, name: str, value: float | Tensor, step: int | None = None) -> None:
        for lg in self.loggers:
            lg.log_scalar(name, value, step)

    def log_metrics(self, metrics: Mapping[str, float | Tensor], step: int | None = None) -> None:
        for lg in self.loggers:
            lg.log_metrics(metrics, step)

    def log_hparams(self, cfg: Mapping[str, Any]) -> None:
        for lg in self.loggers:
            lg.log_hparams(cfg)

    def log_video(self, name: str, video: Tensor, step: int | None = None, **kwargs: Any) -> None:
        for lg in self.loggers:
            lg.log_video(name, video, step, **kwargs)

    def log_str(self, name: str, value: str, step: int | None = None) -> None:
        for lg in self.loggers:
            lg.log_str(name, value, step)

    def flush(self) -> None:
        for lg in self.loggers:
            lg.flush()

    def close(self) -> None:
        for lg in self.loggers:
            lg.close()

    def __repr__(self) -> str:
        return f"MultiLogger({', '.join(repr(lg) for lg in self.loggers)})"
