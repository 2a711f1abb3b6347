"""``ProfileConfig``: what :meth:`BaseCollector.enable_profile` profiles (which workers, how
many rollouts, where the trace goes), and the per-collector runner that applies it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

__all__ = ["ProfileConfig"]

_ACTIVITIES = {"cpu": "CPU", "cuda": "CUDA", "xpu": "XPU", "mtia": "MTIA"}


@dataclass
class ProfileConfig:
    """Settings for profiling collector rollouts with :mod:`torch.profiler`.

    The profiler runs over the first ``num_rollouts`` rollouts after
    :meth:`~steersman.collectors.BaseCollector.enable_profile`: the first
    ``warmup_rollouts`` are recorded and discarded (compilation, allocator warmup), the
    rest end up in one trace. After that the collector runs unprofiled.

    Attributes:
        workers: the worker indices to profile (multi-process collectors; ignored by
            ``Collector``). Default ``[0]``.
        num_rollouts: rollouts under the profiler, warmup included. Default ``3``.
        warmup_rollouts: of those, the first ones left out of the trace. Default ``1``.
        save_path: the Chrome trace file; ``{worker_idx}`` is replaced by the worker's
            index. Default ``"./collector_profile_{worker_idx}.json"``.
        activities: ``"cpu"``, ``"cuda"``... (those this machine lacks are dropped).
            Default ``["cpu", "cuda"]``.
        record_shapes, profile_memory, with_stack, with_flops: passed to
            :class:`torch.profiler.profile`.
        on_trace_ready: called with the profiler instead of writing ``save_path``
            (must pickle for a multi-process collector).

    Example:
        >>> cfg = ProfileConfig(num_rollouts=4, warmup_rollouts=1, save_path="/tmp/w{worker_idx}.json")
        >>> str(cfg.get_save_path(2))
        '/tmp/w2.json'
        >>> ProfileConfig(num_rollouts=1, warmup_rollouts=1)
        Traceback (most recent call last):
        ...
        ValueError: ProfileConfig: num_rollouts (1) must be greater than warmup_rollouts (1)
    """

    workers: list[int] = field(default_factory=lambda: [0])
    num_rollouts: int = 3
    warmup_rollouts: int = 1
    save_path: str | Path | None = None
    activities: list[str] = field(default_factory=lambda: ["cpu", "cuda"])
    record_shapes: bool = True
    profile_memory: bool = False
    with_stack: bool = True
    with_flops: bool = False
    on_trace_ready: Callable | None = None

    def __post_init__(self) -> None:
        if self.warmup_rollouts < 0:
            raise ValueError(f"ProfileConfig: warmup_rollouts must be >= 0, got {self.warmup_rollouts}")
        if self.num_rollouts <= self.warmup_rollouts:
            raise ValueError(f"ProfileConfig: num_rollouts ({self.num_rollouts}) must be greater than "
                             f"warmup_rollouts ({self.warmup_rollouts})")
        unknown = [a for a in self.activities if str(a).lower() not in _ACTIVITIES]
        if unknown:
            raise ValueError(f"ProfileConfig: unknown activities {unknown}; expected some of {list(_ACTIVITIES)}")
        self.workers = [int(w) for w in self.workers]

    def get_save_path(self, worker_idx: int) -> Path:
        """The trace file of worker ``worker_idx``."""
        if self.save_path is None:
            return Path(f"./collector_profile_{worker_idx}.json")
        return Path(str(self.save_path).format(worker_idx=worker_idx))

    def get_activities(self) -> list:
        """The :class:`torch.profiler.ProfilerActivity` values available here."""
        out = []
        for name in self.activities:
            name = str(name).lower()
            if name != "cpu" and not getattr(torch, name).is_available():
                continue
            out.append(getattr(torch.profiler.ProfilerActivity, _ACTIVITIES[name]))
        return out


class Profiling:
    """Runs a collector's rollouts under the profiler until ``num_rollouts`` are done."""

    def __init__(self, config: ProfileConfig, worker_idx: int = 0) -> None:
        self.config = config
        self.worker_idx = worker_idx
        self.count = 0
        self.prof: Any = None
        self.done = False

    def _trace_ready(self, prof: Any) -> None:
        path = self.config.get_save_path(self.worker_idx)
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))

    def run(self, fn: Callable[[], Any]) -> Any:
        cfg = self.config
        if self.prof is None:
            active = cfg.num_rollouts - cfg.warmup_rollouts
            self.prof = torch.profiler.profile(
                activities=cfg.get_activities(),
                schedule=torch.profiler.schedule(wait=0, warmup=cfg.warmup_rollouts, active=active, repeat=1),
                on_trace_ready=cfg.on_trace_ready or self._trace_ready,
                record_shapes=cfg.record_shapes, profile_memory=cfg.profile_memory,
                with_stack=cfg.with_stack, with_flops=cfg.with_flops)
            self.prof.__enter__()
        try:
            with torch.profiler.record_function(f"collector_rollout_{self.count}"):
                out = fn()
        except BaseException:
            self.close()
            raise
        self.prof.step()
        self.count += 1
        if self.count >= cfg.num_rollouts:
            self.close()
        return out

    def close(self) -> None:
        if self.prof is not None and not self.done:
            self.done = True
            self.prof.__exit__(None, None, None)
