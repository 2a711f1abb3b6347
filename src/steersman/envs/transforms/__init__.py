"""Transforms: modules that change what an env emits and receives, and ``TransformedEnv``.

Every transform maps data and specs consistently (``check_env_specs`` holds on the
transformed env), works on batched envs (per-sub-env state, partial resets) and
applies to a TensorDict outside any env with ``transform(td)``.
"""

from .actions import ActionDiscretizer, ActionScaling, DiscreteActionProjection, FlattenAction
from .autoreset import AutoResetEnv, AutoResetTransform, VecGymEnvTransform
from .base import Compose, ObservationTransform, Transform, TransformedEnv, _apply_to_composite  # noqa: F401
from .beliefs import MeanActionSelector, PolicyAgeFilter
from .checks import FiniteTensorDictCheck
from .control import DeviceCastTransform, Hash, PinMemoryTransform, TerminateTransform, gSDENoise
from .counters import InitTracker, StepCounter
from .crop import Crop
from .elementwise import ClipTransform, SignTransform
from .empty_specs import RemoveEmptySpecs
from .episodes import ActionChunkTransform, EndOfLifeTransform
from .image import CenterCrop, GrayScale, Resize, ToTensorImage
from .keys import (
    CatTensors,
    ExcludeTransform,
    RenameTransform,
    SelectTransform,
    SqueezeTransform,
    UnsqueezeTransform,
)
from .misc import ActionMask, BatchSizeTransform, FrameSkipTransform, NoopResetEnv
from .module import ModuleTransform
from .norm import ObservationNorm, VecNorm, VecNormV2
from .nstep import MultiStepTransform, NextObservationDelta, NextStateReconstructor
from .observation import CatFrames, DoubleToFloat, DTypeCastTransform, TimeMaxPool
from .primer import TensorDictPrimer
from .replay import BurnInTransform, RandomCropTensorDict, Reward2GoTransform
from .reward import RewardClipping, RewardScaling, RewardSum, TargetReturn
from .reward_maps import BinarizeReward, LineariseRewards
from .rnd import RNDTransform, RunningMeanStd
from .shapes import FlattenObservation, PermuteTransform
from .signals import ExpandAs, SuccessReward
from .skip import ConditionalPolicySwitch, ConditionalSkip, MultiAction
from .stack import Stack
from .timer import Timer
from .traj_counter import TrajCounter
from .truncation import RandomTruncationTransform
from .unary import UnaryTransform

__all__ = [
    "Transform",
    "ObservationTransform",
    "Compose",
    "TransformedEnv",
    "StepCounter",
    "InitTracker",
    "TensorDictPrimer",
    "RewardSum",
    "RewardScaling",
    "RewardClipping",
    "TargetReturn",
    "DoubleToFloat",
    "DTypeCastTransform",
    "ObservationNorm",
    "VecNorm",
    "CatTensors",
    "CatFrames",
    "TimeMaxPool",
    "UnsqueezeTransform",
    "SqueezeTransform",
    "RenameTransform",
    "ExcludeTransform",
    "SelectTransform",
    "ToTensorImage",
    "Resize",
    "GrayScale",
    "CenterCrop",
    "FrameSkipTransform",
    "NoopResetEnv",
    "ActionMask",
    "BatchSizeTransform",
    "ClipTransform",
    "SignTransform",
    "BinarizeReward",
    "LineariseRewards",
    "ActionScaling",
    "DiscreteActionProjection",
    "FlattenObservation",
    "PermuteTransform",
    "TrajCounter",
    "Reward2GoTransform",
    "FiniteTensorDictCheck",
    "UnaryTransform",
    "Timer",
    "Crop",
    "RandomCropTensorDict",
    "Stack",
    "FlattenAction",
    "RemoveEmptySpecs",
    "ModuleTransform",
    "BurnInTransform",
    "TerminateTransform",
    "DeviceCastTransform",
    "PinMemoryTransform",
    "Hash",
    "gSDENoise",
    "VecNormV2",
    "ActionDiscretizer",
    "ExpandAs",
    "SuccessReward",
    "RandomTruncationTransform",
    "MeanActionSelector",
    "PolicyAgeFilter",
    "RNDTransform",
    "RunningMeanStd",
    "MultiStepTransform",
    "NextStateReconstructor",
    "NextObservationDelta",
    "ConditionalSkip",
    "MultiAction",
    "ConditionalPolicySwitch",
    "AutoResetTransform",
    "AutoResetEnv",
    "VecGymEnvTransform",
    "EndOfLifeTransform",
    "ActionChunkTransform",
]
