"""A training progress bar: frames, frames/s, the latest metrics and the time left."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

__all__ = ["ProgressBar"]


class ProgressBar:
    """Shows the progress of a run that collects ``total_frames`` frames.

    On a terminal it draws a live rich bar; elsewhere (CI logs, a pipe, a subprocess)
    it prints one plain line at most every ``log_interval_s`` seconds and a last one on
    :meth:`close`; ``quiet=True`` prints nothing. Lines look like::

        12,288/100,000 frames (12%) | 2,431 fps | return 103.2 | loss 0.0123 | ETA 0:00:36

    frames/s is measured from the construction of the bar (or the last resume); the
    metrics shown are the latest values passed to :meth:`update`.

    Args:
        total_frames: frames of the whole run.
        quiet: print nothing.
        initial: frames already done (a resumed run).
        log_interval_s: seconds between plain lines (not on a terminal).
        file: where to write (default ``sys.stderr``, like tqdm).
        description: a word shown before the bar.

    Example:
        >>> import io
        >>> out = io.StringIO()                       # not a terminal: plain lines
        >>> with ProgressBar(1000, file=out, log_interval_s=0) as bar:
        ...     bar.update(500, **{"return": 21.5})
        ...     bar.update(500)
        >>> bar.frames, out.getvalue().count("\\n")
        (1000, 3)
        >>> out.getvalue().splitlines()[0].split(" | ")[0], "return 21.5" in out.getvalue()
        ('train 500/1,000 frames (50%)', True)
    """

    def __init__(self, total_frames: int, quiet: bool = False, *, initial: int = 0,
                 log_interval_s: float = 30.0, file: TextIO | None = None,
                 description: str = "train") -> None:
        if total_frames <= 0:
            raise ValueError(f"ProgressBar: total_frames must be positive, got {total_frames}")
        self.total_frames = int(total_frames)
        self.frames = int(initial)
        self.metrics: dict[str, float] = {}
        self.description = description
        self.log_interval_s = log_interval_s
        self._file = file if file is not None else sys.stderr
        self._initial = int(initial)
        self._start = time.monotonic()
        self._last_print = self._start
        self._closed = False
        self._progress: Any = None
        self.mode = "quiet" if quiet else ("rich" if _is_tty(self._file) else "plain")
        if self.mode == "rich":
            try:
                self._start_rich()
            except ImportError:  # rich is a default dependency; without it: plain lines
                self.mode = "plain"

    def _start_rich(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn

        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[status]}"),
            console=Console(file=self._file), refresh_per_second=4,
        )
        self._task = self._progress.add_task(self.description, total=self.total_frames,
                                             completed=self.frames, status=self.status(bar=True))
        self._progress.start()

    @property
    def fps(self) -> float:
        """Frames per second since the bar started."""
        elapsed = time.monotonic() - self._start
        return (self.frames - self._initial) / elapsed if elapsed > 0 else 0.0

    def update(self, frames: int = 0, **metrics: Any) -> None:
        """Adds ``frames`` collected frames (an increment, as in tqdm) and records the
        latest ``metrics`` (floats or 1-element tensors), e.g. ``update(1024, loss=0.1)``."""
        self.frames += int(frames)
        for name, value in metrics.items():
            self.metrics[name] = float(value)
        if self.mode == "rich":
            self._progress.update(self._task, completed=self.frames, status=self.status(bar=True))
        elif self.mode == "plain":
            now = time.monotonic()
            if now - self._last_print >= self.log_interval_s:
                self._last_print = now
                self._print()

    def status(self, bar: bool = False) -> str:
        """The progress line (without the percentage when ``bar``: the bar shows it)."""
        fps = self.fps
        pct = 100.0 * self.frames / self.total_frames
        parts = [f"{self.frames:,}/{self.total_frames:,} frames" + ("" if bar else f" ({pct:.0f}%)"),
                 f"{fps:,.0f} fps"]
        parts += [f"{name} {value:.4g}" for name, value in self.metrics.items()]
        left = max(self.total_frames - self.frames, 0)
        parts.append("ETA " + (_hms(left / fps) if fps > 0 else "?"))
        return " | ".join(parts)

    def _print(self) -> None:
        print(f"{self.description} {self.status()}", file=self._file, flush=True)

    def close(self) -> None:
        """Stops the bar (prints the final line in plain mode); safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self.mode == "rich":
            self._progress.update(self._task, completed=self.frames, status=self.status(bar=True))
            self._progress.stop()
        elif self.mode == "plain":
            self._print()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _is_tty(file: Any) -> bool:
    isatty = getattr(file, "isatty", None)
    try:
        return bool(isatty()) if isatty is not None else False
    except ValueError:  # closed file
        return False


def _hms(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
