"""``LoggerMonitor``: polls ``stats()`` snapshots of collectors and replay buffers and logs
them on a schedule (``Every``), from its own thread or from explicit :meth:`step` calls.

Nothing runs on the watched objects' hot paths: the monitor pulls a snapshot, decides
whether it is due, adds per-second rates of the cumulative counters and forwards
``"<name>/<metric>"`` scalars to one :class:`~steersman.record.Logger`.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .common import Logger

__all__ = ["Every", "LoggerMonitor"]

_log = logging.getLogger(__name__)

# cumulative counters known to the monitor, and the name of their rate
RATE_NAMES = {
    "frames": "frames_per_second",
    "batches": "batches_per_second",
    "write_count": "writes_per_second",
    "worker_frames": "worker_frames_per_second",
    "sample_calls": "samples_per_second",
    "samples_returned": "samples_returned_per_second",
}


@dataclass(frozen=True)
class Every:
    """When :class:`LoggerMonitor` logs a watched object: build it with :meth:`seconds`
    (wall clock) or :meth:`counter` (each time a cumulative ``stats()`` entry crosses a
    multiple of ``interval``).

    Counter schedules are checked at each poll: a counter that jumps over several
    thresholds between two polls logs once (the latest snapshot); a counter that goes
    down (``empty()``, a restored state) starts a new baseline and logs nothing.

    Args:
        kind: ``"seconds"`` or ``"counter"``.
        interval: seconds, or counter units; strictly positive.
        key: the ``stats()`` entry a counter schedule follows.

    Example:
        >>> Every.counter("frames", 1000)
        Every(kind='counter', interval=1000, key='frames')
        >>> Every.seconds(5).interval
        5.0
    """

    kind: Literal["seconds", "counter"]
    interval: float
    key: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("seconds", "counter"):
            raise ValueError(f"Every: kind must be 'seconds' or 'counter', got {self.kind!r}")
        if isinstance(self.interval, bool) or not isinstance(self.interval, (int, float)) \
                or not self.interval > 0 or not math.isfinite(self.interval):
            raise ValueError(f"Every: interval must be a finite number > 0, got {self.interval!r}")
        if self.kind == "counter" and not self.key:
            raise ValueError("Every: a counter schedule needs the stats() key it follows, got none")

    @classmethod
    def seconds(cls, interval: float) -> Every:
        """Logs when ``interval`` seconds have passed since the last log."""
        return cls("seconds", float(interval))

    @classmethod
    def counter(cls, key: str, interval: int) -> Every:
        """Logs when ``stats()[key]`` crosses a multiple of ``interval``."""
        return cls("counter", interval, key)


@dataclass
class _Watch:
    target: Any
    name: str
    schedule: Every | None
    step_key: str | None
    stats_fn: Callable[..., Mapping[str, Any]]
    stats_kwargs: dict[str, Any]
    rate_keys: tuple[str, ...] | None
    log_on_start: bool
    log_on_close: bool
    base: dict[str, float] = field(default_factory=dict)   # counters at the last log
    base_time: float | None = None
    last_log: float | None = None
    next_at: float | None = None        # the counter threshold that makes the next log due
    last_value: float | None = None     # the counter at the last poll
    warned: bool = False


class LoggerMonitor:
    """Logs the ``stats()`` snapshots of collectors, replay buffers (or anything with a
    ``stats()`` returning a flat mapping of numbers) to one logger, on a schedule.

    Each poll reads the snapshot, keeps its finite numeric entries (booleans as 0/1),
    and when the watch's :class:`Every` schedule says it is due logs them as
    ``"<name>/<key>"`` plus ``"<name>/<rate name>"`` per-second rates of the cumulative
    counters since the previous log (``frames`` → ``frames_per_second``,
    ``write_count`` → ``writes_per_second``, ...). A counter that went down gives no rate.
    The monitor owns neither the logger nor the watched objects: :meth:`stop` leaves
    both running.

    Args:
        logger: where the metrics go (any :class:`~steersman.record.Logger`).

    Keyword Args:
        poll_interval: seconds between polls of the background thread (the resolution
            of the counter schedules). Default ``1.0``.
        background: ``True`` (default): :meth:`start` (or ``with``) starts a daemon
            thread polling every ``poll_interval``; ``False``: nothing runs unless you
            call :meth:`step` (deterministic loops, tests).
        on_error: a failing ``stats()`` or logger call: ``"warn"`` (default; one
            warning per failure streak), ``"ignore"``, or ``"raise"`` (in the
            background thread this ends the thread).

    Example:
        >>> import tempfile, torch
        >>> from steersman.data import LazyTensorStorage, ReplayBuffer
        >>> from steersman.record import CSVLogger, Every, LoggerMonitor
        >>> logger = CSVLogger("monitor", tempfile.mkdtemp())
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(100))
        >>> monitor = LoggerMonitor(logger, background=False)
        >>> monitor.watch(rb, name="rb", schedule=Every.counter("write_count", 50),
        ...               log_on_start=False)
        'rb'
        >>> monitor.step()          # the first poll sets the baseline
        {}
        >>> _ = rb.extend(torch.arange(60))
        >>> monitor.step()["rb"]["rb/write_count"]   # crossed 50: logged at step 60
        60.0
    """

    def __init__(self, logger: Logger, *, poll_interval: float = 1.0, background: bool = True,
                 on_error: Literal["warn", "raise", "ignore"] = "warn") -> None:
        if on_error not in ("warn", "raise", "ignore"):
            raise ValueError(f"LoggerMonitor: on_error must be 'warn', 'raise' or 'ignore', got {on_error!r}")
        if isinstance(poll_interval, bool) or not isinstance(poll_interval, (int, float)) \
                or not poll_interval > 0:
            raise ValueError(f"LoggerMonitor: poll_interval must be a number > 0, got {poll_interval!r}")
        if not callable(getattr(logger, "log_metrics", None)):
            raise TypeError(f"LoggerMonitor: logger must have log_metrics(), got {type(logger).__name__}")
        self.logger = logger
        self.poll_interval = float(poll_interval)
        self.background = bool(background)
        self.on_error = on_error
        self._watches: dict[str, _Watch] = {}
        self._lock = threading.Lock()        # guards the watch table
        self._poll_lock = threading.Lock()   # one poll at a time (thread vs. step())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def watch(self, target: Any, *, name: str | None = None, schedule: Every | None = None,
              step: str | None = None, stats_fn: Callable[..., Mapping[str, Any]] | None = None,
              stats_kwargs: dict[str, Any] | None = None, rate_keys: tuple[str, ...] | None = None,
              log_on_start: bool = True, log_on_close: bool = True) -> str:
        """Adds an object to monitor; returns its name (for :meth:`unwatch`).

        Args:
            target: an object with a ``stats()`` method (or pass ``stats_fn``).

        Keyword Args:
            name: the metric prefix, unique in this monitor; default: the lower-case
                class name (``_1``, ``_2``... appended when taken).
            schedule: an :class:`Every`; ``None`` (default): log at every poll.
            step: the snapshot entry used as the logger's step (default: a counter
                schedule's key; else the logger's own step).
            stats_fn: called instead of ``target.stats`` (in the monitor's thread).
            stats_kwargs: keyword arguments for the snapshot call.
            rate_keys: the entries to derive per-second rates from (default: those
                of the snapshot that are known counters, see the class docs).
            log_on_start: the first poll logs (default); ``False``: it only records
                the baseline, so the first log carries rates.
            log_on_close: :meth:`stop` logs a last snapshot (default ``True``).
        """
        if schedule is not None and not isinstance(schedule, Every):
            raise TypeError(f"LoggerMonitor.watch: schedule must be an Every, got {type(schedule).__name__}")
        if stats_fn is None:
            stats_fn = getattr(target, "stats", None)
            if not callable(stats_fn):
                raise TypeError(f"LoggerMonitor.watch: {type(target).__name__} has no stats() method; "
                                "pass stats_fn=... to watch it")
        with self._lock:
            if name is None:
                base = name = type(target).__name__.lower()
                i = 0
                while name in self._watches:
                    i += 1
                    name = f"{base}_{i}"
            elif name in self._watches:
                raise ValueError(f"LoggerMonitor.watch: the name {name!r} is already watched")
            if step is None and schedule is not None and schedule.kind == "counter":
                step = schedule.key
            self._watches[name] = _Watch(target, name, schedule, step, stats_fn, dict(stats_kwargs or {}),
                                         None if rate_keys is None else tuple(rate_keys),
                                         bool(log_on_start), bool(log_on_close))
        return name

    def unwatch(self, name: str) -> None:
        """Stops monitoring ``name`` (the object itself is left alone)."""
        with self._lock:
            if name not in self._watches:
                raise KeyError(f"LoggerMonitor.unwatch: no watch named {name!r} "
                               f"(watched: {sorted(self._watches)})")
            del self._watches[name]

    @property
    def watched(self) -> list[str]:
        """The names being watched."""
        with self._lock:
            return list(self._watches)

    def step(self) -> dict[str, dict[str, float]]:
        """Polls every watch once; returns ``{name: logged metrics}`` for those logged."""
        out = {}
        with self._lock:
            watches = list(self._watches.values())
        for w in watches:
            logged = self._poll(w, force=False)
            if logged is not None:
                out[w.name] = logged
        return out

    def start(self) -> LoggerMonitor:
        """Starts the polling thread (nothing when ``background=False``)."""
        self._stopped = False
        if self.background and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="LoggerMonitor", daemon=True)
            self._thread.start()
        return self

    def stop(self, *, log_final: bool | None = None) -> None:
        """Stops the thread and logs a last snapshot of each watch with ``log_on_close``
        (``log_final`` overrides it). A second call without :meth:`start` does nothing."""
        self._stop.set()
        thread, self._thread = self._thread, None
        stuck = False
        if thread is not None:
            thread.join(timeout=max(5.0, 2 * self.poll_interval))
            stuck = thread.is_alive()
        if self._stopped:
            return
        self._stopped = True
        if stuck:  # a stats() call hangs: polling again would race with it
            _log.warning("LoggerMonitor: the polling thread did not stop (a stats() call hangs?); "
                         "no final snapshot logged")
            return
        with self._lock:
            watches = list(self._watches.values())
        for w in watches:
            if w.log_on_close if log_final is None else log_final:
                self._poll(w, force=True)

    def __enter__(self) -> LoggerMonitor:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_interval):
            self.step()

    def _poll(self, w: _Watch, force: bool) -> dict[str, float] | None:
        try:
            with self._poll_lock:
                out = self._poll_once(w, force)
            w.warned = False
            return out
        except Exception as err:
            if self.on_error == "raise":
                raise
            if self.on_error == "warn" and not w.warned:
                w.warned = True
                _log.warning(f"LoggerMonitor: polling or logging {w.name!r} failed: {err!r} "
                             "(silent until it works again)")
            return None

    def _poll_once(self, w: _Watch, force: bool) -> dict[str, float] | None:
        raw = w.stats_fn(**w.stats_kwargs)
        snap = {k: float(v) for k, v in raw.items()
                if isinstance(v, (int, float)) and math.isfinite(v)}
        now = time.monotonic()
        first = w.base_time is None
        if force or self._due(w, snap, now, first):
            rates = self._rates(w, snap, now)
            metrics = {f"{w.name}/{k}": v for k, v in {**snap, **rates}.items()}
            step = int(snap[w.step_key]) if w.step_key in snap else None
            self.logger.log_metrics(metrics, step=step)
            w.base, w.base_time, w.last_log = dict(snap), now, now
            return metrics
        if first:
            w.base, w.base_time = dict(snap), now
        return None

    def _arm(self, w: _Watch, snap: dict[str, float]) -> None:
        s = w.schedule
        if s is not None and s.kind == "counter" and s.key in snap:
            w.last_value = snap[s.key]
            w.next_at = (w.last_value // s.interval + 1) * s.interval

    def _due(self, w: _Watch, snap: dict[str, float], now: float, first: bool) -> bool:
        s = w.schedule
        if first and w.last_log is None:
            self._arm(w, snap)
            return w.log_on_start
        if s is None:
            return True
        if s.kind == "seconds":
            ref = w.last_log if w.last_log is not None else w.base_time
            return ref is not None and now - ref >= s.interval
        value = snap.get(s.key)
        if value is None:
            return False
        if w.next_at is None:
            self._arm(w, snap)
            return False
        if w.last_value is not None and value < w.last_value:  # reset: new baseline, no log
            w.base, w.base_time = dict(snap), now
            self._arm(w, snap)
            return False
        w.last_value = value
        if value >= w.next_at:
            w.next_at = (value // s.interval + 1) * s.interval
            return True
        return False

    def _rates(self, w: _Watch, snap: dict[str, float], now: float) -> dict[str, float]:
        if w.base_time is None or now <= w.base_time:
            return {}
        dt = now - w.base_time
        keys = w.rate_keys if w.rate_keys is not None else [k for k in snap if k in RATE_NAMES]
        out = {}
        for k in keys:
            if k in snap and k in w.base and snap[k] >= w.base[k]:
                out[RATE_NAMES.get(k, f"{k}_per_second")] = (snap[k] - w.base[k]) / dt
        return out
