"""L1: modules from TensorDict to TensorDict.

``TensorDictModule`` wraps a plain module; ``TensorDictSequential`` chains modules;
``ProbabilisticTensorDictModule``/``ProbabilisticTensorDictSequential`` build a
distribution and draw a value according to the interaction type set by
``set_interaction_type`` (aliases ``set_exploration_type``/``ExplorationType`` for
TorchRL code). Imports only ``steersman.tensordict`` (L0) and torch.
"""

from ..constructors import make_tensordict
from ..module_params import ensemble_call, from_module, from_modules, shared_copy, to_module
from ..params import TensorDictParams
from . import optim
from .common import (
    TensorDictModule,
    TensorDictModuleBase,
    WrapModule,
    as_tensordict_module,
    dispatch,
)
from .composite import AddStateIndependentNormalScale, CompositeDistribution, rand_one_hot
from .cudagraphs import CudaGraphModule
from .distributions import (
    Delta,
    MaskedCategorical,
    MaskedOneHotCategorical,
    OneHotCategorical,
    ReparamGradientStrategy,
    TanhNormal,
    TruncatedNormal,
)
from .ensemble import EnsembleModule
from .interaction import (
    ExplorationType,
    InteractionType,
    exploration_type,
    interaction_type,
    set_exploration_type,
    set_interaction_type,
)
from .probabilistic import ProbabilisticTensorDictModule, ProbabilisticTensorDictSequential
from .sequence import TensorDictSequential
from .switches import (
    composite_lp_aggregate,
    set_composite_lp_aggregate,
    set_skip_existing,
    skip_existing,
)
from .tensorclass_module import TensorClassModuleBase, TensorClassModuleWrapper
from .utils import (
    NormalParamExtractor,
    add_custom_mapping,
    biased_softplus,
    expln,
    inv_softplus,
    mappings,
)
from .wrapper import TensorDictModuleWrapper

__all__ = [
    "TensorDictModuleBase",
    "TensorDictModule",
    "WrapModule",
    "dispatch",
    "TensorDictSequential",
    "ProbabilisticTensorDictModule",
    "ProbabilisticTensorDictSequential",
    "InteractionType",
    "interaction_type",
    "set_interaction_type",
    "ExplorationType",
    "exploration_type",
    "set_exploration_type",
    "NormalParamExtractor",
    "biased_softplus",
    "inv_softplus",
    "mappings",
    "expln",
    "TensorDictParams",
    "from_module",
    "from_modules",
    "to_module",
    "ensemble_call",
    "shared_copy",
    "TanhNormal",
    "TruncatedNormal",
    "Delta",
    "OneHotCategorical",
    "MaskedCategorical",
    "MaskedOneHotCategorical",
    "ReparamGradientStrategy",
    "optim",
    "set_skip_existing",
    "skip_existing",
    "set_composite_lp_aggregate",
    "composite_lp_aggregate",
    "CompositeDistribution",
    "AddStateIndependentNormalScale",
    "rand_one_hot",
    "CudaGraphModule",
    "EnsembleModule",
    "TensorDictModuleWrapper",
    "make_tensordict",
    "add_custom_mapping",
    "as_tensordict_module",
    "TensorClassModuleBase",
    "TensorClassModuleWrapper",
]
