"""Replay buffers: storages own memory, samplers own indices, writers own placement.

``ReplayBuffer(storage=, sampler=, writer=)`` composes them; the TensorDict and
prioritized variants follow TorchRL's names and semantics.
"""

from ._checkpoint import CheckpointError
from .checkpointers import (
    CompressedListStorageCheckpointer,
    FlatStorageCheckpointer,
    H5StorageCheckpointer,
    ListStorageCheckpointer,
    NestedStorageCheckpointer,
    StorageCheckpointerBase,
    StorageEnsembleCheckpointer,
    TensorStorageCheckpointer,
)
from .conditional import ConditionalUpdateResult
from .consuming import ConsumingSampler, StalenessAwareSampler
from .ensemble import ReplayBufferEnsemble, SamplerEnsemble, StorageEnsemble, WriterEnsemble
from .her import HERReplayBuffer, HindsightStrategy
from .list_storages import CompressedListStorage, LazyStackStorage
from .offline import OfflineToOnlineReplayBuffer, prefill_replay_buffer
from .replay_buffers import (
    PrioritizedReplayBuffer,
    ReplayBuffer,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
    stack_anything,
)
from .sample_units import SampleUnit, Transition
from .samplers import (
    PrioritizedSampler,
    PrioritizedSliceSampler,
    RandomSampler,
    Sampler,
    SamplerWithoutReplacement,
    SliceSampler,
    SliceSamplerWithoutReplacement,
)
from .segment_tree import MaxSegmentTree, MinSegmentTree, PriorityTree, SumSegmentTree
from .storages import LazyMemmapStorage, LazyTensorStorage, ListStorage, Storage, TensorStorage
from .streaming import StreamingSliceSampler
from .ted import Flat2TED, H5Combine, H5Split, Nested2TED, TED2Flat, TED2Nested
from .trajectories import find_start_stop_traj
from .trajectory_query import (
    Trajectory,
    TrajectoryPredicate,
    filter_trajectories,
    iter_trajectories,
    traj,
)
from .writers import (
    ImmutableDatasetWriter,
    RoundRobinWriter,
    TensorDictMaxValueWriter,
    TensorDictRoundRobinWriter,
    Writer,
)

__all__ = [
    "ReplayBuffer",
    "TensorDictReplayBuffer",
    "PrioritizedReplayBuffer",
    "TensorDictPrioritizedReplayBuffer",
    "Storage",
    "ListStorage",
    "TensorStorage",
    "LazyTensorStorage",
    "LazyMemmapStorage",
    "Sampler",
    "RandomSampler",
    "SamplerWithoutReplacement",
    "PrioritizedSampler",
    "SliceSampler",
    "SliceSamplerWithoutReplacement",
    "PrioritizedSliceSampler",
    "Writer",
    "RoundRobinWriter",
    "TensorDictRoundRobinWriter",
    "TensorDictMaxValueWriter",
    "SumSegmentTree",
    "MinSegmentTree",
    "MaxSegmentTree",
    "PriorityTree",
    "CheckpointError",
    "stack_anything",
    "LazyStackStorage",
    "CompressedListStorage",
    "ImmutableDatasetWriter",
    "prefill_replay_buffer",
    "find_start_stop_traj",
    "HERReplayBuffer",
    "HindsightStrategy",
    "ReplayBufferEnsemble",
    "StorageEnsemble",
    "SamplerEnsemble",
    "WriterEnsemble",
    "StorageCheckpointerBase",
    "ListStorageCheckpointer",
    "TensorStorageCheckpointer",
    "CompressedListStorageCheckpointer",
    "FlatStorageCheckpointer",
    "NestedStorageCheckpointer",
    "H5StorageCheckpointer",
    "StorageEnsembleCheckpointer",
    "TED2Flat",
    "Flat2TED",
    "TED2Nested",
    "Nested2TED",
    "ConsumingSampler",
    "StalenessAwareSampler",
    "SampleUnit",
    "Transition",
    "OfflineToOnlineReplayBuffer",
    "Trajectory",
    "TrajectoryPredicate",
    "iter_trajectories",
    "filter_trajectories",
    "traj",
    "StreamingSliceSampler",
    "H5Split",
    "H5Combine",
    "ConditionalUpdateResult",
]
