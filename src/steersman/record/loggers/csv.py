"""``metrics.csv``: every scalar of a run in one wide CSV file."""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .common import Logger

__all__ = ["CSVLogger", "read_metrics_csv"]


class CSVLogger(Logger):
    """Writes scalars to ``<log_dir>/<exp_name>/metrics.csv`` in wide format.

    Format: a header ``step,<metric>,<metric>...`` then one row per step; a metric not
    logged at a step leaves its cell empty. All the scalars logged with the same
    ``step`` one after the other go to the same row. A metric seen for the first time
    adds a column: the file is rewritten with the longer header (to a temporary file,
    then renamed over the old one, so a crash leaves either version whole). Each call
    writes its row and flushes it to the OS, so a killed process loses nothing that a
    ``log_*`` call returned from. Values are written exactly (``repr`` of the float).

    Resume: when ``metrics.csv`` already exists, the logger keeps its columns and
    appends after its rows; with ``start_step=S`` it first drops the rows whose step is
    greater than ``S`` (those logged after the checkpoint being resumed), so the
    resumed run's curve has no duplicates. ``S`` is the last step logged before the
    checkpoint was written.

    Other records: :meth:`log_hparams` writes ``hparams.json``, :meth:`log_str`
    appends to ``texts/<name>.txt`` and :meth:`log_video` writes
    ``videos/<name>_<step>.<video_format>`` (``"mp4"``/``"gif"`` need imageio,
    ``"pt"`` is a ``torch.save``-d uint8 tensor).

    Args:
        exp_name: the experiment's folder under ``log_dir``.
        log_dir: parent folder (default ``"csv_logs"``).
        start_step: resume point (see above); None keeps every existing row.
        video_format: ``"mp4"``, ``"gif"`` or ``"pt"``.
        video_fps: frames per second of written videos.

    Example:
        >>> import tempfile
        >>> from steersman.record import CSVLogger
        >>> d = tempfile.mkdtemp()
        >>> with CSVLogger("run", d) as log:
        ...     log.log_scalar("train/return", 9.5, step=100)
        ...     log.log_scalar("loss", 0.25, step=100)       # same row
        ...     log.log_scalar("train/return", 20.0, step=200)
        >>> print(open(f"{d}/run/metrics.csv").read(), end="")
        step,train/return,loss
        100,9.5,0.25
        200,20.0,
        >>> with CSVLogger("run", d, start_step=100) as log:   # resume: drops step 200
        ...     log.log_scalar("train/return", 21.0, step=200)
        >>> read_metrics_csv(f"{d}/run/metrics.csv")["train/return"]
        [9.5, 21.0]
    """

    def __init__(
        self,
        exp_name: str,
        log_dir: str | os.PathLike | None = None,
        *,
        start_step: int | None = None,
        video_format: str = "mp4",
        video_fps: int = 30,
    ) -> None:
        if video_format not in ("mp4", "gif", "pt"):
            raise ValueError(f"CSVLogger: video_format must be 'mp4', 'gif' or 'pt', got {video_format!r}")
        log_dir = "csv_logs" if log_dir is None else os.fspath(log_dir)
        super().__init__(exp_name, log_dir)
        self.experiment_dir = Path(log_dir) / exp_name
        self.path = self.experiment_dir / "metrics.csv"
        self.video_format = video_format
        self.video_fps = video_fps
        self.experiment_dir.mkdir(parents=True, exist_ok=True)
        self._columns: list[str] = []
        self._row: dict[str, str] = {}
        self._row_step: int | None = None
        self._row_offset = 0
        self._file: Any = None
        rows: list[list[str]] = []
        if self.path.exists():
            header, rows = _read_rows(self.path)
            self._columns = header[1:]
            if start_step is not None:
                rows = [r for r in rows if int(float(r[0])) <= start_step]
        self._rewrite(rows)

    @property
    def columns(self) -> list[str]:
        """The metric columns, in file order (``"step"`` excluded)."""
        return list(self._columns)

    # ------------------------------------------------------------------ scalars
    def log_scalar(self, name: str, value: float | Tensor, step: int | None = None) -> None:
        self.log_metrics({name: value}, step)

    def log_metrics(self, metrics: Mapping[str, float | Tensor], step: int | None = None) -> None:
        if self._file is None:
            raise ValueError(f"CSVLogger({str(self.path)!r}) is closed")
        cells = {name: _cell(name, v) for name, v in metrics.items()}  # all checked first
        new = [name for name in cells if name not in self._columns]
        if step is None:
            step = 0 if self._row_step is None else self._row_step
        step = int(step)
        if new:
            header, rows = _read_rows(self.path)
            if self._row_step is not None:  # the pending row is rewritten below
                rows = rows[:-1]
            self._columns.extend(new)
            self._rewrite(rows)
        if step != self._row_step:
            self._row = {}
            self._row_step = step
            self._row_offset = self._file.seek(0, os.SEEK_END)
        self._row.update(cells)
        self._write_row()

    def _write_row(self) -> None:
        line = _csv_line([str(self._row_step)] + [self._row.get(c, "") for c in self._columns])
        f = self._file
        f.seek(self._row_offset)
        f.write(line.encode())
        f.truncate()
        f.flush()

    def _rewrite(self, rows: list[list[str]]) -> None:
        """Writes header + ``rows`` atomically (temp file + rename) and reopens the file;
        the pending row (if any) is written after them."""
        if self._file is not None:
            self._file.close()
        width = len(self._columns) + 1
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["step", *self._columns])
        for r in rows:
            w.writerow(r + [""] * (width - len(r)))
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(buf.getvalue().encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self._file = open(self.path, "r+b")  # noqa: SIM115 - kept open, closed by close()
        self._row_offset = self._file.seek(0, os.SEEK_END)
        if self._row_step is not None:
            self._write_row()

    # ------------------------------------------------------------------ others
    def log_hparams(self, cfg: Mapping[str, Any]) -> None:
        text = json.dumps(dict(cfg), indent=2, default=str)
        (self.experiment_dir / "hparams.json").write_text(text + "\n")

    def log_str(self, name: str, value: str, step: int | None = None) -> None:
        path = self.experiment_dir / "texts" / f"{_safe(name)}.txt"
        path.parent.mkdir(exist_ok=True)
        with open(path, "a") as f:
            f.write(f"[step {step}] {value}\n" if step is not None else f"{value}\n")

    def log_video(self, name: str, video: Tensor, step: int | None = None, **kwargs: Any) -> None:
        from ..video import video_to_frames, write_video

        folder = self.experiment_dir / "videos"
        folder.mkdir(exist_ok=True)
        stem = _safe(name) if step is None else f"{_safe(name)}_{int(step)}"
        path = folder / f"{stem}.{self.video_format}"
        if self.video_format == "pt":
            torch.save(torch.as_tensor(video).detach().cpu(), path)
        else:
            write_video(video_to_frames(video), path, fps=kwargs.get("fps", self.video_fps))

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __repr__(self) -> str:
        return f"CSVLogger(path={str(self.path)!r}, columns={self._columns})"


def read_metrics_csv(path: str | os.PathLike) -> dict[str, list[float]]:
    """The columns of a ``metrics.csv`` written by :class:`CSVLogger` (``"step"`` first),
    each a list of floats with ``nan`` for empty cells.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> with CSVLogger("r", d) as log:
        ...     log.log_scalar("a", 1.0, step=1); log.log_scalar("b", 2.0, step=2)
        >>> read_metrics_csv(f"{d}/r/metrics.csv")
        {'step': [1.0, 2.0], 'a': [1.0, nan], 'b': [nan, 2.0]}
    """
    header, rows = _read_rows(Path(path))
    cols: dict[str, list[float]] = {name: [] for name in header}
    for r in rows:
        r = r + [""] * (len(header) - len(r))
        for name, cell in zip(header, r):
            cols[name].append(float(cell) if cell else math.nan)
    return cols


def _read_rows(path: Path) -> tuple[list[str], list[list[str]]]:
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    if not rows or rows[0][0] != "step":
        raise ValueError(f"{str(path)!r} is not a metrics file written by CSVLogger: "
                         f"its header should start with 'step', got {rows[0] if rows else 'nothing'}")
    return rows[0], rows[1:]


def _csv_line(cells: list[str]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(cells)
    return buf.getvalue()


def _cell(name: str, value: Any) -> str:
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"CSVLogger: metric {name!r} must be a scalar, got a tensor of shape {tuple(value.shape)}")
        value = value.item()
    elif hasattr(value, "item"):  # numpy scalars
        value = value.item()
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    raise TypeError(f"CSVLogger: metric {name!r} must be a number, got {type(value).__name__}")


def _safe(name: str) -> str:
    return name.replace("/", "_").replace(os.sep, "_")
