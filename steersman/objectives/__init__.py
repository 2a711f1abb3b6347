"""L4: losses and value estimators.

Every loss is a :class:`LossModule` from a batch to a TensorDict whose ``loss_*`` entries
are summed for the backward pass. Target networks are updated with :class:`SoftUpdate`
or :class:`HardUpdate`.
"""

from .common import LossModule, total_loss
from .utils import (
    HardUpdate,
    SoftUpdate,
    TargetNetUpdater,
    ValueEstimators,
    default_value_kwargs,
    distance_loss,
    reduce_loss,
)

__all__ = [
    "LossModule",
    "total_loss",
    "ValueEstimators",
    "default_value_kwargs",
    "SoftUpdate",
    "HardUpdate",
    "TargetNetUpdater",
    "distance_loss",
    "reduce_loss",
]
