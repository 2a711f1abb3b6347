"""Tensor specs: the shape, dtype, device and valid values of what envs read and write.

New names follow TorchRL 0.6+ (``Bounded``, ``Categorical``, ``Composite`` ...); the older
TorchRL names (``BoundedTensorSpec``, ``CompositeSpec`` ...) are plain aliases.
"""

from .base import CategoricalBox, ContinuousBox, TensorSpec
from .choice import Choice
from .composite import Composite
from .continuous import (
    Bounded,
    BoundedContinuous,
    BoundedDiscrete,
    Unbounded,
    UnboundedContinuous,
    UnboundedDiscrete,
)
from .discrete import Binary, Categorical, MultiCategorical, MultiOneHot, OneHot
from .nontensor import NonTensor
from .stacked import (
    Stacked,
    StackedComposite,
    check_no_exclusive_keys,
    consolidate_spec,
    contains_lazy_spec,
    stack_specs,
)

# older TorchRL names
BoundedTensorSpec = Bounded
CompositeSpec = Composite
DiscreteTensorSpec = Categorical
OneHotDiscreteTensorSpec = OneHot
UnboundedContinuousTensorSpec = UnboundedContinuous
UnboundedDiscreteTensorSpec = UnboundedDiscrete
MultiDiscreteTensorSpec = MultiCategorical
MultiOneHotDiscreteTensorSpec = MultiOneHot
BinaryDiscreteTensorSpec = Binary
NonTensorSpec = NonTensor

__all__ = [
    "TensorSpec",
    "Unbounded",
    "UnboundedContinuous",
    "UnboundedDiscrete",
    "Bounded",
    "BoundedContinuous",
    "BoundedDiscrete",
    "Categorical",
    "OneHot",
    "MultiCategorical",
    "MultiOneHot",
    "Binary",
    "NonTensor",
    "Choice",
    "Composite",
    "ContinuousBox",
    "CategoricalBox",
    "BoundedTensorSpec",
    "CompositeSpec",
    "DiscreteTensorSpec",
    "OneHotDiscreteTensorSpec",
    "UnboundedContinuousTensorSpec",
    "UnboundedDiscreteTensorSpec",
    "MultiDiscreteTensorSpec",
    "MultiOneHotDiscreteTensorSpec",
    "BinaryDiscreteTensorSpec",
    "NonTensorSpec",
    "Stacked",
    "StackedComposite",
    "stack_specs",
    "consolidate_spec",
    "contains_lazy_spec",
    "check_no_exclusive_keys",
]
