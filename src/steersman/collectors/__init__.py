"""L4: collectors. An env and a policy in, batches of transitions out.

``Collector`` (alias ``SyncDataCollector``) runs in the calling process;
``MultiSyncDataCollector`` and ``MultiaSyncDataCollector`` run one ``Collector`` per
worker process; ``aSyncDataCollector`` runs one in a background process (TorchRL 0.14
names them ``MultiSyncCollector``, ``MultiAsyncCollector`` and ``AsyncCollector``: both
sets of names are here). ``split_trajectories`` cuts a batch into one row per trajectory.
``collector.stats()`` is a snapshot of its progress (for ``LoggerMonitor``); ``collector.enable_profile(...)`` (``ProfileConfig``)
profiles a few rollouts with ``torch.profiler``.
"""

from .async_batched import AsyncBatchedCollector
from .base import BaseCollector
from .collector import Collector, SyncDataCollector
from .evaluator import Evaluator
from .multi import (
    AsyncCollector,
    CollectorWorkerError,
    MultiAsyncCollector,
    MultiaSyncDataCollector,
    MultiCollector,
    MultiSyncCollector,
    MultiSyncDataCollector,
    aSyncDataCollector,
)
from .profile import ProfileConfig
from .utils import split_trajectories
from .weight_update import (
    MultiProcessedWeightUpdater,
    RemoteModuleWeightUpdater,
    VanillaWeightUpdater,
    WeightUpdaterBase,
)

__all__ = [
    "BaseCollector",
    "MultiCollector",
    "WeightUpdaterBase",
    "VanillaWeightUpdater",
    "MultiProcessedWeightUpdater",
    "RemoteModuleWeightUpdater",
    "Collector",
    "SyncDataCollector",
    "MultiSyncDataCollector",
    "MultiaSyncDataCollector",
    "aSyncDataCollector",
    "MultiSyncCollector",
    "MultiAsyncCollector",
    "AsyncCollector",
    "CollectorWorkerError",
    "split_trajectories",
    "ProfileConfig",
    "Evaluator",
    "AsyncBatchedCollector",
]
