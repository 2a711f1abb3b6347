"""L4: losses and value estimators.

Every loss is a :class:`LossModule` from a batch to a TensorDict whose ``loss_*`` entries
are summed for the backward pass. Target networks are updated with :class:`SoftUpdate`
or :class:`HardUpdate`.
"""

from .a2c import A2CLoss
from .bc import BCLoss
from .common import LossModule, add_random_module, total_loss
from .cql import CQLLoss
from .crossq import CrossQLoss
from .ddpg import DDPGLoss
from .decision_transformer import DTLoss, OnlineDTLoss
from .discrete_cql import DiscreteCQLLoss
from .discrete_iql import DiscreteIQLLoss
from .dqn import DistributionalDQNLoss, DQNLoss
from .functional_update import CompiledUpdate, FunctionalUpdate, OptimizerState
from .gail import GAILLoss
from .iql import IQLLoss
from .multiagent import IPPOLoss, MAPPOLoss, QMixerLoss, agent_batch
from .pilco import ExponentialQuadraticCost
from .ppo import ClipPPOLoss, KLPENPPOLoss, PPOLoss
from .redq import REDQLoss
from .reinforce import ReinforceLoss
from .rnd import RNDLoss
from .sac import DiscreteSACLoss, SACLoss
from .td3 import TD3Loss
from .td3_bc import TD3BCLoss
from .tqc import TQCLoss
from .two_hot import symexp, symlog, two_hot_cross_entropy, two_hot_decode, two_hot_encode
from .utils import (
    AUTO_LOSS_MASK_KEYS,
    HardUpdate,
    KLAdaptiveLR,
    SoftUpdate,
    TargetNetUpdater,
    ValueEstimators,
    default_value_kwargs,
    distance_loss,
    group_optimizers,
    hold_out_net,
    hold_out_params,
    next_state_value,
    reduce_loss,
)
from .value import (
    GAE,
    MultiAgentGAE,
    TD0Estimate,
    TD0Estimator,
    TD1Estimate,
    TD1Estimator,
    TDLambdaEstimate,
    TDLambdaEstimator,
    ValueEstimatorBase,
    VTrace,
)
from .world_model import WorldModelLoss, categorical_kl_balanced, categorical_kl_terms

__all__ = [
    "A2CLoss",
    "PPOLoss",
    "ClipPPOLoss",
    "KLPENPPOLoss",
    "ValueEstimatorBase",
    "TD0Estimator",
    "TD1Estimator",
    "TDLambdaEstimator",
    "GAE",
    "LossModule",
    "total_loss",
    "ValueEstimators",
    "default_value_kwargs",
    "SoftUpdate",
    "HardUpdate",
    "TargetNetUpdater",
    "distance_loss",
    "reduce_loss",
    "DQNLoss",
    "DistributionalDQNLoss",
    "DDPGLoss",
    "TD3Loss",
    "SACLoss",
    "DiscreteSACLoss",
    "IQLLoss",
    "CQLLoss",
    "REDQLoss",
    "FunctionalUpdate",
    "CompiledUpdate",
    "OptimizerState",
    "MAPPOLoss",
    "IPPOLoss",
    "QMixerLoss",
    "agent_batch",
    "MultiAgentGAE",
    "AUTO_LOSS_MASK_KEYS",
    "KLAdaptiveLR",
    "group_optimizers",
    "hold_out_net",
    "hold_out_params",
    "next_state_value",
    "symlog",
    "symexp",
    "two_hot_encode",
    "two_hot_decode",
    "two_hot_cross_entropy",
    "VTrace",
    "TD0Estimate",
    "TD1Estimate",
    "TDLambdaEstimate",
    "BCLoss",
    "DiscreteCQLLoss",
    "ReinforceLoss",
    "TD3BCLoss",
    "GAILLoss",
    "RNDLoss",
    "CrossQLoss",
    "DiscreteIQLLoss",
    "TQCLoss",
    "DTLoss",
    "OnlineDTLoss",
    "add_random_module",
    "WorldModelLoss",
    "categorical_kl_terms",
    "categorical_kl_balanced",
    "ExponentialQuadraticCost",
]
