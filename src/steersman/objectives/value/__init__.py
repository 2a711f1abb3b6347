"""Value estimators (TD(0), TD(1), TD(λ), GAE) and their functional forms.

The classes read a batch and write ``advantage``/``value_target``; the functions in
:mod:`~steersman.objectives.value.functional` do the math on plain tensors.
"""

from . import functional
from .advantages import (
    GAE,
    TD0Estimate,
    TD0Estimator,
    TD1Estimate,
    TD1Estimator,
    TDLambdaEstimate,
    TDLambdaEstimator,
    ValueEstimatorBase,
    VTrace,
    normalize_advantage,
)
from .functional import (
    generalized_advantage_estimate,
    reverse_discounted_scan,
    td0_advantage_estimate,
    td0_return_estimate,
    td1_advantage_estimate,
    td1_return_estimate,
    td_lambda_advantage_estimate,
    td_lambda_return_estimate,
    vec_generalized_advantage_estimate,
    vec_td1_advantage_estimate,
    vec_td1_return_estimate,
    vec_td_lambda_advantage_estimate,
    vec_td_lambda_return_estimate,
    vtrace_advantage_estimate,
)
from .multiagent import MultiAgentGAE

__all__ = [
    "functional",
    "ValueEstimatorBase",
    "TD0Estimator",
    "TD1Estimator",
    "TDLambdaEstimator",
    "GAE",
    "normalize_advantage",
    "td0_return_estimate",
    "td0_advantage_estimate",
    "td1_return_estimate",
    "vec_td1_return_estimate",
    "td1_advantage_estimate",
    "vec_td1_advantage_estimate",
    "td_lambda_return_estimate",
    "vec_td_lambda_return_estimate",
    "td_lambda_advantage_estimate",
    "vec_td_lambda_advantage_estimate",
    "generalized_advantage_estimate",
    "vec_generalized_advantage_estimate",
    "reverse_discounted_scan",
    "MultiAgentGAE",
    "VTrace",
    "TD0Estimate",
    "TD1Estimate",
    "TDLambdaEstimate",
    "vtrace_advantage_estimate",
]
