"""``BaseCollector``: what every collector shares (weight updates, policy version, hooks),
and the checks of TorchRL keyword arguments that have no effect here or are refused."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

from steersman.tensordict import TensorDictBase

from .weight_update import WeightUpdaterBase

__all__ = ["BaseCollector", "check_unsupported"]


class BaseCollector:
    """The base class of the collectors (``Collector``, the multi-process ones).

    Gives every collector :meth:`update_policy_weights_` (through its
    :attr:`weight_updater`), :attr:`policy_version` (the number of weight updates so
    far), ``iter(collector)`` and :meth:`next`. Subclasses implement ``iterator()`` and
    ``_default_weight_updater()``.

    Example:
        >>> from steersman.collectors import BaseCollector, Collector
        >>> from steersman.envs import CartPoleEnv
        >>> isinstance(Collector(CartPoleEnv(), frames_per_batch=4), BaseCollector)
        True
    """

    weight_updater: WeightUpdaterBase

    def _init_weight_updater(self, weight_updater: Any) -> None:
        """``weight_updater``: an updater, a class/callable building one, or ``None`` (default)."""
        if weight_updater is None:
            updater = self._default_weight_updater()
        elif isinstance(weight_updater, WeightUpdaterBase):
            updater = weight_updater
        elif callable(weight_updater):
            updater = weight_updater()
        else:
            updater = None
        if not isinstance(updater, WeightUpdaterBase):
            raise TypeError(f"{type(self).__name__}: weight_updater must be a WeightUpdaterBase or a callable "
                            f"returning one, got {type(weight_updater).__name__}")
        updater.register_collector(self)
        self.weight_updater = updater
        self._policy_version = 0

    def _default_weight_updater(self) -> WeightUpdaterBase:
        raise NotImplementedError

    def _transport_weight_updater(self) -> WeightUpdaterBase:
        """The updater that moves weights into the policy copies this collector runs."""
        raise NotImplementedError

    @property
    def policy_version(self) -> int:
        """The number of :meth:`update_policy_weights_` calls that pushed weights."""
        return self._policy_version

    def update_policy_weights_(self, policy_or_weights: Any = None, *, weights: Any = None,
                               policy: Any = None, worker_ids: Any = None) -> None:
        """Pushes new weights to the collector's policy (through :attr:`weight_updater`).

        Args:
            policy_or_weights: a module, a TensorDict of weights or a ``state_dict``;
                ``None``: the updater's default source (see the collector's docs).
            weights, policy: keyword forms of ``policy_or_weights`` (TorchRL's names).
            worker_ids: the workers to update (multi-process collectors update all).
        """
        src = next((s for s in (policy_or_weights, weights, policy) if s is not None), None)
        before = self.weight_updater.version
        self.weight_updater.push_weights(src, worker_ids=worker_ids)
        if self.weight_updater.version != before:
            self._policy_version += 1

    def stats(self) -> dict[str, int | float | bool]:
        """A cheap snapshot of the collector's progress, for monitoring (TorchRL's ``stats()``).

        Keys: ``frames`` (frames collected so far), ``batches`` (batches delivered),
        ``total_frames`` (the budget; absent for an endless collector), ``completed``
        (the budget is reached; absent when endless), ``requested_frames_per_batch`` and
        ``policy_version``. Reads counters only (no worker round trip), so a
        :class:`~steersman.record.LoggerMonitor` may poll it from another thread.

        Example:
            >>> from steersman.collectors import Collector
            >>> from steersman.envs import CartPoleEnv
            >>> c = Collector(CartPoleEnv(), frames_per_batch=4, total_frames=8)
            >>> _ = c.next()
            >>> s = c.stats()
            >>> s["frames"], s["batches"], s["total_frames"], s["completed"]
            (4, 1, 8, False)
        """
        frames = int(getattr(self, "_frames", 0))
        out: dict[str, int | float | bool] = {"frames": frames,
                                              "batches": int(getattr(self, "_iter", -1)) + 1}
        total = getattr(self, "total_frames", math.inf)
        if total != math.inf and total is not None and total > 0:
            out["total_frames"] = int(total)
            out["completed"] = frames >= total
        requested = getattr(self, "requested_frames_per_batch", None)
        if requested is not None:
            out["requested_frames_per_batch"] = int(requested)
        out["policy_version"] = int(getattr(self, "_policy_version", 0))
        return out

    def enable_profile(self, *, workers: list[int] | None = None, num_rollouts: int = 3,
                       warmup_rollouts: int = 1, save_path: Any = None, activities: list[str] | None = None,
                       record_shapes: bool = True, profile_memory: bool = False, with_stack: bool = True,
                       with_flops: bool = False, on_trace_ready: Callable | None = None) -> None:
        """Profiles the next ``num_rollouts`` rollouts with :mod:`torch.profiler` (the
        first ``warmup_rollouts`` are left out of the trace); the arguments are those of
        :class:`~steersman.collectors.ProfileConfig`. A multi-process collector profiles
        in the ``workers`` listed (default ``[0]``), one trace file per worker
        (``{worker_idx}`` in ``save_path``).

        Example:
            >>> import json, tempfile
            >>> from steersman.collectors import Collector
            >>> from steersman.envs import CartPoleEnv
            >>> path = tempfile.mkdtemp() + "/trace_{worker_idx}.json"
            >>> c = Collector(CartPoleEnv(), frames_per_batch=8, total_frames=32)
            >>> c.enable_profile(num_rollouts=2, warmup_rollouts=1, save_path=path, with_stack=False)
            >>> for _ in c:
            ...     pass
            >>> "traceEvents" in json.load(open(path.format(worker_idx=0)))
            True
        """
        from .profile import ProfileConfig
        kwargs: dict[str, Any] = dict(num_rollouts=num_rollouts, warmup_rollouts=warmup_rollouts,
                                      save_path=save_path, record_shapes=record_shapes,
                                      profile_memory=profile_memory, with_stack=with_stack,
                                      with_flops=with_flops, on_trace_ready=on_trace_ready)
        if workers is not None:
            kwargs["workers"] = list(workers)
        if activities is not None:
            kwargs["activities"] = list(activities)
        self._enable_profile(ProfileConfig(**kwargs))

    def _enable_profile(self, config: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not support profiling")

    def iterator(self) -> Iterator[TensorDictBase | None]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[TensorDictBase | None]:
        return self.iterator()

    def next(self) -> TensorDictBase | None:
        """The next batch (``None`` once ``total_frames`` are collected)."""
        if getattr(self, "_it", None) is None:
            self._it = self.iterator()
        try:
            return next(self._it)
        except StopIteration:
            self._it = None
            return None


def check_unsupported(owner: str, **kwargs: Any) -> None:
    """Refuses TorchRL keyword arguments that steersman's collectors do not implement (with
    the reason); each is allowed at its default value."""
    reasons = {
        "trajs_per_batch": "batches are frame-counted; use split_trajs=True (or split_trajectories) "
                           "for one row per trajectory",
        "trajs_per_write": "needs trajs_per_batch (not supported)",
        "compact_obs": "next observations are always stored (the replay buffers and losses read them)",
        "extend_buffer": "replay buffers are always extended with whole batches (TorchRL deprecates False)",
        "auto_register_policy_transforms": "add InitTracker/TensorDictPrimer transforms to the env yourself",
        "interruptor": "collection cannot be pre-empted",
        "preemptive_threshold": "collection cannot be pre-empted",
        "weight_sync_schemes": "weight sync schemes are not implemented; use weight_updater",
        "weight_recv_schemes": "weight sync schemes are not implemented; use weight_updater",
        "backend_options": "only the 'direct' and 'process' backends exist",
    }
    for name, value in kwargs.items():
        refused = value is False if name == "extend_buffer" else value is not None and value is not False
        if not refused:
            continue
        raise NotImplementedError(f"{owner}: {name}={value!r} is not supported: {reasons[name]}")


def run_hook(hook: Callable | None, *args: Any) -> None:
    if hook is not None:
        hook(*args)
