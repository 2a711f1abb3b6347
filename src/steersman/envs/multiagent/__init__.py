"""Multi-agent envs: agent groups and the torch-native batched multi-agent tasks.

Data layout (see ``docs/multiagent.md``): each group of agents is a sub-TensorDict with
batch dims ``[*env_batch, n_agents]``; the root holds the global ``"state"`` and the
``done`` flags aggregating the groups.
"""

from ._base import MultiAgentNativeEnv
from .groups import MarlGroupMapType, check_marl_grouping
from .navigation import NavigationEnv
from .predator_prey import PredatorPreyEnv

__all__ = ["MarlGroupMapType", "check_marl_grouping", "MultiAgentNativeEnv", "NavigationEnv", "PredatorPreyEnv"]
