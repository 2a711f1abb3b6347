"""L3: policy and value modules.

- networks: :class:`MLP`, :class:`ConvNet`, dueling Q-networks, :class:`LSTMModule` and
  :class:`GRUModule` (state kept in the TensorDict; step and recurrent modes);
- actors and critics: :class:`Actor`, :class:`ProbabilisticActor`,
  :class:`ValueOperator`, :class:`QValueActor`, actor-critic operators,
  :class:`RandomPolicy`;
- distributions (:mod:`steersman.modules.distributions`);
- exploration modules, switched off by ``set_exploration_type(DETERMINISTIC)``.

Imports ``steersman.tensordict``, ``steersman.tensordict.nn`` and ``steersman.data``.
"""

from ..tensordict.nn import (
    ExplorationType,
    InteractionType,
    exploration_type,
    interaction_type,
    set_exploration_type,
    set_interaction_type,
)
from .actor_critic import ActorCriticOperator, ActorCriticWrapper, ActorValueOperator
from .actors import (
    Actor,
    ProbabilisticActor,
    SafeModule,
    SafeProbabilisticModule,
    SafeProbabilisticTensorDictSequential,
    SafeSequential,
    ValueOperator,
)
from .conv import Conv3dNet, ConvNet, SquashDims, Squeeze2dLayer, SqueezeLayer
from .ddpg import DdpgCnnActor, DdpgCnnQNet, DdpgMlpActor, DdpgMlpQNet
from .decision_transformer import (
    DecisionTransformer,
    DecisionTransformerInferenceWrapper,
    DTActor,
    OnlineDTActor,
)
from .distributions import (
    Delta,
    IndependentNormal,
    MaskedCategorical,
    MaskedOneHotCategorical,
    NormalParamExtractor,
    OneHotCategorical,
    OneHotOrdinal,
    Ordinal,
    ReparamGradientStrategy,
    TanhDelta,
    TanhNormal,
    TruncatedNormal,
)
from .dueling import DuelingCnnDQNet, DuelingMlpDQNet
from .exploration import AdditiveGaussianModule, EGreedyModule, OrnsteinUhlenbeckProcessModule
from .exploration_wrappers import (
    AdditiveGaussianWrapper,
    EGreedyWrapper,
    OrnsteinUhlenbeckProcessWrapper,
)
from .helpers import canonicalize_rnn_subset, distributions_maps, get_env_transforms_from_module
from .layers import (
    BatchRenorm1d,
    ConsistentDropout,
    ConsistentDropoutModule,
    DistributionalDQNnet,
    NormalParamWrapper,
    TanhModule,
    set_exploration_modules_spec_from_env,
)
from .mlp import MLP
from .multiagent import (
    CrossCriticGroupSpec,
    CrossGroupCritic,
    Mixer,
    MultiAgentConvNet,
    MultiAgentMLP,
    MultiAgentNetBase,
    QMixer,
    VDNMixer,
)
from .multistep import MultiStepActorWrapper
from .noisy import NoisyLazyLinear, NoisyLinear, reset_noise
from .primers import get_primers_from_module
from .qvalue import (
    DistributionalQValueActor,
    DistributionalQValueModule,
    QValueActor,
    QValueModule,
)
from .random_policy import RandomPolicy
from .rbf_controller import RBFController
from .rnn import GRUModule, LSTMModule, recurrent_mode, set_recurrent_mode
from .rnn_precision import (
    RecurrentMatmulPrecision,
    RecurrentMatmulPrecisionUserMode,
    get_recurrent_matmul_precision,
    set_recurrent_matmul_precision,
)
from .rnn_python import GRU, LSTM, GRUCell, LSTMCell
from .value_norm import PercentileValueNorm, PopArtValueNorm, RunningValueNorm, ValueNorm
from .value_transforms import (
    ComposeValueTransform,
    IdentityValueTransform,
    SignedHyperbolicValueTransform,
    SymLogValueTransform,
    ValueTransform,
    signed_hyperbolic,
    signed_parabolic,
    symexp,
    symlog,
)
from .world_models import (
    ObsDecoder,
    ObsEncoder,
    RSSMPosterior,
    RSSMPosteriorV3,
    RSSMPrior,
    RSSMPriorV3,
    RSSMRollout,
    RSSMRolloutV3,
    RSSMStateEstimatorV3,
    SymExpTwoHot,
    WorldModel,
    WorldModelWrapper,
)
from .wrappers import DistributionalQValueHook, QValueHook, VmapModule

__all__ = [
    # networks
    "MLP",
    "ConvNet",
    "SquashDims",
    "DuelingMlpDQNet",
    "DuelingCnnDQNet",
    "LSTMModule",
    "GRUModule",
    "set_recurrent_mode",
    "recurrent_mode",
    # actors and critics
    "SafeModule",
    "SafeSequential",
    "SafeProbabilisticModule",
    "SafeProbabilisticTensorDictSequential",
    "Actor",
    "ValueOperator",
    "ProbabilisticActor",
    "QValueModule",
    "QValueActor",
    "DistributionalQValueModule",
    "DistributionalQValueActor",
    "ActorValueOperator",
    "ActorCriticOperator",
    "ActorCriticWrapper",
    "RandomPolicy",
    # distributions
    "IndependentNormal",
    "TanhNormal",
    "TruncatedNormal",
    "Delta",
    "OneHotCategorical",
    "MaskedCategorical",
    "MaskedOneHotCategorical",
    "ReparamGradientStrategy",
    "NormalParamExtractor",
    # exploration
    "EGreedyModule",
    "AdditiveGaussianModule",
    "OrnsteinUhlenbeckProcessModule",
    "ExplorationType",
    "InteractionType",
    "exploration_type",
    "interaction_type",
    "set_exploration_type",
    "set_interaction_type",
    # multi-agent networks, mixers and value normalizers
    "MultiAgentNetBase",
    "MultiAgentMLP",
    "MultiAgentConvNet",
    "Mixer",
    "VDNMixer",
    "QMixer",
    "CrossCriticGroupSpec",
    "CrossGroupCritic",
    "ValueNorm",
    "PopArtValueNorm",
    "RunningValueNorm",
    "PercentileValueNorm",
    # noisy layers and value transforms
    "NoisyLinear",
    "NoisyLazyLinear",
    "reset_noise",
    "ValueTransform",
    "IdentityValueTransform",
    "SymLogValueTransform",
    "SignedHyperbolicValueTransform",
    "ComposeValueTransform",
    "symlog",
    "symexp",
    "signed_hyperbolic",
    "signed_parabolic",
    # DDPG networks, squeeze layers, TorchRL's older exploration wrappers
    "DdpgMlpActor",
    "DdpgMlpQNet",
    "DdpgCnnActor",
    "DdpgCnnQNet",
    "SqueezeLayer",
    "Squeeze2dLayer",
    "EGreedyWrapper",
    "AdditiveGaussianWrapper",
    "OrnsteinUhlenbeckProcessWrapper",
    # layers, squashing, distributional head, helpers
    "BatchRenorm1d",
    "ConsistentDropout",
    "ConsistentDropoutModule",
    "TanhModule",
    "TanhDelta",
    "DistributionalDQNnet",
    "NormalParamWrapper",
    "set_exploration_modules_spec_from_env",
    # python LSTM/GRU (vmap/compile friendly)
    "LSTM",
    "GRU",
    "LSTMCell",
    "GRUCell",
    # ordinal distributions, vmap wrapper, Q-value hooks
    "Ordinal",
    "OneHotOrdinal",
    "VmapModule",
    "QValueHook",
    "DistributionalQValueHook",
    "get_primers_from_module",
    "Conv3dNet",
    # decision transformers
    "DecisionTransformer",
    "DTActor",
    "OnlineDTActor",
    "DecisionTransformerInferenceWrapper",
    "MultiStepActorWrapper",
    # helpers
    "distributions_maps",
    "get_env_transforms_from_module",
    "canonicalize_rnn_subset",
    "RecurrentMatmulPrecision",
    "RecurrentMatmulPrecisionUserMode",
    "get_recurrent_matmul_precision",
    "set_recurrent_matmul_precision",
    # world models
    "ObsEncoder",
    "ObsDecoder",
    "RSSMPrior",
    "RSSMPosterior",
    "RSSMRollout",
    "RSSMPriorV3",
    "RSSMPosteriorV3",
    "RSSMRolloutV3",
    "RSSMStateEstimatorV3",
    "WorldModel",
    "WorldModelWrapper",
    "SymExpTwoHot",
    "RBFController",
]

# tree-search scores (TorchRL's torchrl.modules MCTS scores)
from .mcts_scores import EXP3Score, MCTSScore, MCTSScores, PUCTScore, UCB1TunedScore, UCBScore  # noqa: E402

__all__ += ["EXP3Score", "MCTSScore", "MCTSScores", "PUCTScore", "UCB1TunedScore", "UCBScore"]
