"""TorchRL's Checkpoint API (layer L4): components, adapters, rotation, RNG state.

Example:
    >>> from steersman.checkpoint import Checkpoint, CheckpointRotation, GlobalRNGState
    >>> sorted(Checkpoint(rng=GlobalRNGState(), step=3).components)
    ['rng', 'step']
"""

from .checkpoint import (
    Checkpoint,
    CheckpointAdapter,
    CheckpointBest,
    CheckpointError,
    CheckpointFormat,
    CheckpointLoadResult,
    CheckpointMetricMode,
    CheckpointOptions,
    CheckpointStrictness,
    DumpLoadCheckpointAdapter,
    GlobalRNGState,
    JSONCheckpointAdapter,
    LoadError,
    StateDictCheckpointAdapter,
    StateDictFormat,
)
from .rotation import CheckpointRotation

__all__ = [
    "Checkpoint", "CheckpointAdapter", "CheckpointBest", "CheckpointError", "CheckpointFormat",
    "CheckpointLoadResult", "CheckpointMetricMode", "CheckpointOptions", "CheckpointRotation",
    "CheckpointStrictness", "DumpLoadCheckpointAdapter", "GlobalRNGState",
    "JSONCheckpointAdapter", "LoadError", "StateDictCheckpointAdapter", "StateDictFormat",
]
