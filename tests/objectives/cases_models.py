"""Loss-battery cases (see ``_cases.py``) for TQC and the decision-transformer losses."""

from __future__ import annotations

import torch
from torch import nn

from steersman.objectives import TQCLoss
from steersman.tensordict.nn import TensorDictModule
from tests.objectives import cases_sac as sac
from tests.objectives._cases import LossCase, input_layer

QUANTILES = 5


class QuantileCritic(nn.Module):
    """``Z(s, a)``: ``[*B, OBS], [*B, ACT] -> [*B, QUANTILES]``."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(input_layer(sac.OBS + sac.ACT, sac.HIDDEN), nn.Tanh(),
                                 nn.Linear(sac.HIDDEN, QUANTILES))

    def forward(self, observation: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([observation, action], -1))


def quantile_critic() -> TensorDictModule:
    return TensorDictModule(QuantileCritic(), ["observation", "action"], ["state_action_value"])


def tqc(**kwargs) -> TQCLoss:
    kwargs = {"num_qvalue_nets": 3, "top_quantiles_to_drop_per_net": 2, "target_entropy": -float(sac.ACT), **kwargs}
    return TQCLoss(sac.actor(), quantile_critic(), **kwargs)


CASES = [
    LossCase("TQCLoss", tqc, sac.continuous_batch, sac.SAC_GRADS),
]
