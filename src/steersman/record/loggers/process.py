"""``ProcessLogger``: a logger that lives in its own process; the driver and any worker
(through a picklable :meth:`ProcessLogger.client`) send it ``log_*`` calls."""

from __future__ import annotations

import multiprocessing as mp
import queue
import threading
from collections.abc import Mapping
from typing import Any

from .common import Logger

__all__ = ["ProcessLogger", "ProcessLoggerClient"]

_FLUSH, _STOP = "__flush__", "__stop__"


def _serve(logger_cls: type, args: tuple, kwargs: dict, requests: Any, replies: Any) -> None:
    """The logger process: build the logger, then run the calls it is sent, in order."""
    try:
        logger = logger_cls(*args, **kwargs)
    except BaseException as err:  # report, do not hang the owner
        replies.put(("failed", f"{logger_cls.__name__}(...) raised {err!r}"))
        return
    replies.put(("ready", {"exp_name": getattr(logger, "exp_name", None),
                           "log_dir": getattr(logger, "log_dir", None)}))
    errors: list[str] = []
    while True:
        method, a, kw = requests.get()
        if method == _FLUSH:
            try:
                logger.flush()
            except Exception as err:
                errors.append(f"flush raised {err!r}")
            replies.put(("flushed", errors[:]))
            errors.clear()
            continue
        if method == _STOP:
            try:
                logger.close()
            except Exception as err:
                errors.append(f"close raised {err!r}")
            replies.put(("stopped", errors[:]))
            return
        try:
            getattr(logger, method)(*a, **kw)
        except Exception as err:  # the caller did not wait: reported at the next flush
            errors.append(f"{method} raised {err!r}")


class ProcessLoggerClient(Logger):
    """A picklable handle sending ``log_*`` calls to a :class:`ProcessLogger` (made by
    :meth:`ProcessLogger.client`). The calls are fire-and-forget; it cannot flush or
    stop the logger process (only its owner can)."""

    def __init__(self, requests: Any, exp_name: str | None, log_dir: str | None) -> None:
        super().__init__(exp_name, log_dir)  # type: ignore[arg-type]
        self._requests = requests

    def _send(self, method: str, *args: Any, **kwargs: Any) -> None:
        self._requests.put((method, args, kwargs))

    def log_scalar(self, name: str, value: Any, step: int | None = None) -> None:
        self._send("log_scalar", name, float(value), step)

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        self._send("log_metrics", {k: float(v) for k, v in metrics.items()}, step)

    def log_hparams(self, cfg: Mapping[str, Any]) -> None:
        self._send("log_hparams", dict(cfg))

    def log_video(self, name: str, video: Any, step: int | None = None, **kwargs: Any) -> None:
        self._send("log_video", name, video.detach().cpu() if hasattr(video, "detach") else video,
                   step, **kwargs)

    def log_str(self, name: str, value: str, step: int | None = None) -> None:
        self._send("log_str", name, str(value), step)

    def flush(self) -> None:
        raise RuntimeError("ProcessLoggerClient: only the ProcessLogger that owns the process can flush it")

    def close(self) -> None:
        """Does nothing: a client does not own the logger process."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(exp_name={self.exp_name!r})"


class ProcessLogger(ProcessLoggerClient):
    """Runs ``logger_cls(*args, **kwargs)`` in a dedicated process and forwards ``log_*``
    calls to it, so a slow backend (W&B, MLflow over the network) never blocks training.

    Calls run in the order they were sent. They do not wait; an error raised by one is
    re-raised by the next :meth:`flush` (or :meth:`shutdown`). :meth:`client` gives a
    picklable handle for other processes (collector workers).

    Args:
        logger_cls: the logger class (importable by the child process).
        *args: its positional arguments.

    Keyword Args:
        mp_context: a start method name or context; default ``"spawn"``.
        max_queue_size: pending calls before a caller blocks. Default ``1000``.
        startup_timeout: seconds to wait for the logger to be built. Default ``60``.
        **kwargs: the logger's keyword arguments.

    Example:
        >>> import tempfile
        >>> from steersman.record import CSVLogger, ProcessLogger
        >>> d = tempfile.mkdtemp()
        >>> logger = ProcessLogger(CSVLogger, exp_name="run", log_dir=d, mp_context="fork")
        >>> worker_logger = logger.client()       # picklable
        >>> worker_logger.log_scalar("loss", 1.0, step=0)
        >>> logger.flush()
        >>> logger.shutdown()
    """

    def __init__(self, logger_cls: type, *args: Any, mp_context: str | Any = None,
                 max_queue_size: int = 1000, startup_timeout: float = 60.0, **kwargs: Any) -> None:
        if not isinstance(logger_cls, type):
            raise TypeError(f"ProcessLogger: logger_cls must be a Logger class, got {logger_cls!r}")
        ctx = mp.get_context(mp_context or "spawn") if mp_context is None or isinstance(mp_context, str) \
            else mp_context
        self._manager = ctx.Manager()          # its queue proxies pickle into any process
        requests = self._manager.Queue(maxsize=max_queue_size)
        self._replies = ctx.Queue()
        self._proc = ctx.Process(target=_serve, args=(logger_cls, args, kwargs, requests, self._replies),
                                 name=f"ProcessLogger[{logger_cls.__name__}]", daemon=True)
        self._proc.start()
        self._lock = threading.Lock()
        self._closed = False
        try:
            kind, info = self._replies.get(timeout=startup_timeout)
        except queue.Empty:
            self._abort()
            raise TimeoutError(f"ProcessLogger: {logger_cls.__name__} was not built within "
                               f"startup_timeout={startup_timeout}s") from None
        if kind != "ready":
            self._abort()
            raise RuntimeError(f"ProcessLogger: building the logger failed: {info}")
        super().__init__(requests, info["exp_name"], info["log_dir"])

    def _abort(self) -> None:
        self._closed = True
        if self._proc.is_alive():
            self._proc.terminate()
        self._proc.join(timeout=5)
        self._manager.shutdown()

    @property
    def is_alive(self) -> bool:
        """Whether the logger process runs."""
        return self._proc.is_alive()

    @property
    def service_backend(self) -> str:
        return "process"

    def client(self) -> ProcessLoggerClient:
        """A picklable handle that can log (not flush or stop)."""
        if self._closed or not self.is_alive:
            raise RuntimeError("ProcessLogger.client: the logger process is not running")
        return ProcessLoggerClient(self._requests, self.exp_name, self.log_dir)

    def _send(self, method: str, *args: Any, **kwargs: Any) -> None:
        if self._closed:
            raise RuntimeError(f"ProcessLogger.{method}: the logger was shut down")
        super()._send(method, *args, **kwargs)

    def _round_trip(self, what: str, timeout: float | None) -> list[str]:
        with self._lock:
            self._requests.put((what, (), {}))
            while True:
                try:
                    kind, errors = self._replies.get(timeout=1.0 if timeout is None else timeout)
                except queue.Empty:
                    if timeout is None and self.is_alive:
                        continue
                    raise TimeoutError(f"ProcessLogger: no answer to {what} (process alive: "
                                       f"{self.is_alive})") from None
                return errors

    def flush(self, timeout: float | None = None) -> None:
        """Waits until every call sent so far ran; raises the errors they raised."""
        if self._closed:
            return
        errors = self._round_trip(_FLUSH, timeout)
        if errors:
            raise RuntimeError("ProcessLogger: logging calls failed in the logger process: "
                               + "; ".join(errors))

    def shutdown(self, timeout: float | None = 5.0) -> None:
        """Runs the pending calls, closes the logger and ends its process (idempotent)."""
        if self._closed:
            return
        errors: list[str] = []
        try:
            if self.is_alive:
                errors = self._round_trip(_STOP, timeout)
        finally:
            self._closed = True
            self._proc.join(timeout=timeout)
            if self._proc.is_alive():
                self._proc.terminate()
                self._proc.join(timeout=5)
            self._manager.shutdown()
        if errors:
            raise RuntimeError("ProcessLogger: logging calls failed in the logger process: "
                               + "; ".join(errors))

    def close(self, timeout: float | None = 5.0) -> None:
        """Same as :meth:`shutdown`."""
        self.shutdown(timeout)

    def __reduce__(self) -> Any:
        raise TypeError("ProcessLogger owns its process and cannot be pickled; send logger.client() instead")

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            try:
                self.shutdown(timeout=1.0)
            except Exception:
                pass
