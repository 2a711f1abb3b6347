"""Planning: batched tree search (MCTS / MuZero / Gumbel MuZero) and planners."""

from steersman.planning.adapters import (
    recurrent_fn_from_env,
    recurrent_fn_from_model,
    root_from_env,
)
from steersman.planning.policies import PolicyOutput, gumbel_muzero_policy, muzero_policy
from steersman.planning.qtransforms import (
    qtransform_by_min_max,
    qtransform_by_parent_and_siblings,
    qtransform_completed_by_mix_value,
)
from steersman.planning.search import RecurrentFnOutput, RootFnOutput, search
from steersman.planning.tree import SearchSummary, Tree

__all__ = [
    "PolicyOutput",
    "RecurrentFnOutput",
    "RootFnOutput",
    "SearchSummary",
    "Tree",
    "gumbel_muzero_policy",
    "muzero_policy",
    "qtransform_by_min_max",
    "qtransform_by_parent_and_siblings",
    "qtransform_completed_by_mix_value",
    "recurrent_fn_from_env",
    "recurrent_fn_from_model",
    "root_from_env",
    "search",
]

# planners (CEM/MPPI) below
from steersman.planning.planners import CEMPlanner, MPCPlannerBase, MPPIPlanner  # noqa: E402

__all__ += ["CEMPlanner", "MPCPlannerBase", "MPPIPlanner"]

# exact and depth-limited game solvers (opponents for evaluation)
from steersman.planning.solvers import (  # noqa: E402
    AlphaBetaPlayer,
    MinimaxPlayer,
    TicTacToeSolver,
    games_against_minimax,
)

__all__ += ["AlphaBetaPlayer", "MinimaxPlayer", "TicTacToeSolver", "games_against_minimax"]
