"""Numbered checkpoints in one folder, keeping the last ``keep_last`` and the best one.

Example:
    >>> import tempfile, torch
    >>> from steersman.checkpoint import Checkpoint
    >>> net = torch.nn.Linear(2, 1)
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     rotation = CheckpointRotation(tmp, keep_last=2, keep_best=("reward", "max"))
    ...     for step, reward in [(1, 5.0), (2, 1.0), (3, 2.0), (4, 3.0)]:
    ...         _ = rotation.save(Checkpoint(policy=net), step=step, metadata={"reward": reward})
    ...     [p.name for p in rotation.checkpoints()], rotation.best().name
    (['checkpoint-000000001', 'checkpoint-000000003', 'checkpoint-000000004'], 'checkpoint-000000001')
"""

from __future__ import annotations

import math
import re
import shutil
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from .checkpoint import (
    Checkpoint,
    CheckpointBest,
    CheckpointLoadResult,
    CheckpointOptions,
    CheckpointStrictness,
)

__all__ = ["CheckpointRotation"]


class CheckpointRotation:
    """Saves ``<directory>/<prefix>-<step:09d>`` and prunes the older ones.

    Args:
        directory: the folder of the checkpoints.
        keep_last: how many of the latest checkpoints to keep (>= 1).
        keep_best: ``(metric, "min" | "max")``: also keep the checkpoint whose
            ``metadata[metric]`` is best (non-finite or absent values never count).
        prefix: the name prefix.
    """

    def __init__(self, directory: str | Path, *, keep_last: int,
                 keep_best: CheckpointBest | None = None, prefix: str = "checkpoint") -> None:
        if keep_last < 1:
            raise ValueError(f"CheckpointRotation: keep_last must be >= 1, got {keep_last}")
        if keep_best is not None and (len(keep_best) != 2 or keep_best[1] not in ("min", "max")):
            raise ValueError(f"CheckpointRotation: keep_best must be (metric, 'min' | 'max'), "
                             f"got {keep_best!r}")
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", prefix) or prefix.startswith("."):
            raise ValueError(f"CheckpointRotation: invalid prefix {prefix!r}")
        self.directory = Path(directory)
        self.keep_last = keep_last
        self.keep_best = keep_best
        self.prefix = prefix
        self._pattern = re.compile(rf"^{re.escape(prefix)}-(\d+)$")

    def save(self, checkpoint: Checkpoint, *, step: int, metadata: Mapping[str, Any] | None = None,
             components: Collection[str] | None = None,
             component_options: Mapping[str, CheckpointOptions] | None = None) -> Path:
        """Save ``checkpoint`` as step ``step`` (``metadata`` gets ``step``), then prune."""
        if step < 0:
            raise ValueError(f"CheckpointRotation.save: step must be >= 0, got {step}")
        metadata = {**(metadata or {}), "step": step}
        path = checkpoint.save(self.directory / f"{self.prefix}-{step:09d}", components=components,
                               component_options=component_options, metadata=metadata)
        self.prune()
        return path

    def checkpoints(self) -> tuple[Path, ...]:
        """The complete checkpoints, oldest step first (temp folders never count)."""
        if not self.directory.is_dir():
            return ()
        found = [(int(m.group(1)), p) for p in self.directory.iterdir()
                 if (m := self._pattern.match(p.name)) and Checkpoint.is_checkpoint(p)]
        return tuple(p for _, p in sorted(found))

    def latest(self) -> Path | None:
        found = self.checkpoints()
        return found[-1] if found else None

    def best(self) -> Path | None:
        """The checkpoint with the best ``keep_best`` metric (``None`` without one)."""
        if self.keep_best is None:
            return None
        metric, mode = self.keep_best
        best, best_value = None, None
        for path in self.checkpoints():
            value = Checkpoint.manifest(path).get("metadata", {}).get(metric)
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            if best_value is None or (value > best_value if mode == "max" else value < best_value):
                best, best_value = path, value
        return best

    def prune(self) -> tuple[Path, ...]:
        """Delete all but the last ``keep_last`` and the best; returns the deleted paths."""
        found = self.checkpoints()
        keep = set(found[-self.keep_last:])
        best = self.best()
        if best is not None:
            keep.add(best)
        removed = tuple(p for p in found if p not in keep)
        for path in removed:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        return removed

    def load_latest(self, checkpoint: Checkpoint, *, components: Collection[str] | None = None,
                    component_options: Mapping[str, CheckpointOptions] | None = None,
                    map_location: Any = None, tensor_load_kwargs: Mapping[str, Any] | None = None,
                    strict: CheckpointStrictness | None = None) -> CheckpointLoadResult:
        """Load the latest checkpoint into ``checkpoint``."""
        latest = self.latest()
        if latest is None:
            raise FileNotFoundError(f"no checkpoint under {self.directory}")
        return checkpoint.load(latest, components=components, component_options=component_options,
                               map_location=map_location, tensor_load_kwargs=tensor_load_kwargs,
                               strict=strict)
