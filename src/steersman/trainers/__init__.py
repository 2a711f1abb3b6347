"""TorchRL-style trainers: :class:`Trainer` and its hooks (layer L5).

Example:
    >>> from steersman.trainers import Trainer, OptimizerHook, CountFramesLog
    >>> Trainer.__name__
    'Trainer'
"""

from .hooks import (
    BatchSubSampler,
    ClearCudaCache,
    CountFramesLog,
    EarlyStopping,
    LogScalar,
    LogTiming,
    LogValidationReward,
    LRSchedulerHook,
    OptimizerHook,
    ReplayBufferTrainer,
    RewardNormalizer,
    SelectKeys,
    TargetNetUpdaterHook,
    TrainerHookBase,
    UpdateWeights,
    UTDRHook,
    ValueEstimatorHook,
    mask_batch,
)
from .optim import (
    DefaultOptimizationStepper,
    MixedPrecisionOptimizationStepper,
    OptimizationStepper,
)
from .trainer import HOOK_POINTS, Trainer

__all__ = [
    "BatchSubSampler", "ClearCudaCache", "CountFramesLog", "DefaultOptimizationStepper",
    "EarlyStopping", "HOOK_POINTS", "LRSchedulerHook", "LogScalar", "LogTiming",
    "LogValidationReward", "MixedPrecisionOptimizationStepper", "OptimizationStepper",
    "OptimizerHook", "ReplayBufferTrainer", "RewardNormalizer", "SelectKeys",
    "TargetNetUpdaterHook", "Trainer", "TrainerHookBase", "UTDRHook", "UpdateWeights",
    "ValueEstimatorHook", "mask_batch",
]
