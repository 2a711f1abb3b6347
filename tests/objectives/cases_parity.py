"""Loss-battery cases (see ``_cases.py``) for the TorchRL-parity losses: REINFORCE,
behaviour cloning, TD3+BC and discrete CQL (networks and batches from the other cases)."""

from __future__ import annotations

import torch
from torch import nn

from steersman.data import Bounded
from steersman.objectives import (
    BCLoss,
    CrossQLoss,
    DiscreteCQLLoss,
    DiscreteIQLLoss,
    GAILLoss,
    ReinforceLoss,
    RNDLoss,
    TD3BCLoss,
)
from steersman.tensordict.nn import TensorDictModule
from tests.objectives import cases_onpolicy as onp
from tests.objectives import cases_sac as sac
from tests.objectives import cases_value_based as vb
from tests.objectives._cases import LossCase, input_layer


def deterministic_actor() -> TensorDictModule:
    """``observation [*B, OBS] -> action [*B, ACT]`` (no distribution: BC by distance)."""
    net = nn.Sequential(input_layer(onp.OBS, onp.HIDDEN), nn.Tanh(), nn.Linear(onp.HIDDEN, onp.ACT))
    return TensorDictModule(net, ["observation"], ["action"])


def demonstrations(loss, shape):
    return onp.transitions(shape, torch.rand(*shape, onp.ACT) * 1.8 - 0.9)


def td3_bc() -> TD3BCLoss:
    return TD3BCLoss(vb.actor(), vb.critic(), action_spec=Bounded(-1.0, 1.0, shape=(vb.ACT,)), alpha=2.5)


class Discriminator(nn.Module):
    """``D(s, a)``: ``[*B, OBS], [*B, ACT] -> [*B, 1]`` in ``(0, 1)``."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(input_layer(onp.OBS + onp.ACT, onp.HIDDEN), nn.Tanh(), nn.Linear(onp.HIDDEN, 1))

    def forward(self, observation: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([observation, action], -1)).sigmoid()


def gail(**kwargs) -> GAILLoss:
    return GAILLoss(TensorDictModule(Discriminator(), ["observation", "action"], ["d_logits"]), **kwargs)


def expert_and_collected(loss, shape):
    td = demonstrations(loss, shape)
    td["collector_observation"] = torch.randn(*shape, onp.OBS) + 1.0
    td["collector_action"] = torch.rand(*shape, onp.ACT)
    return td


def rnd(update_fraction: float) -> RNDLoss:
    def net() -> nn.Module:
        return nn.Sequential(input_layer(onp.OBS, onp.HIDDEN), nn.Tanh(), nn.Linear(onp.HIDDEN, 5))

    return RNDLoss(net(), net(), update_fraction=update_fraction)


def discrete_iql(action_space: str) -> DiscreteIQLLoss:
    q = TensorDictModule(sac.discrete_qvalue().module, ["observation"], ["state_action_value"])
    dist = torch.distributions.OneHotCategorical if action_space == "one-hot" else torch.distributions.Categorical
    return DiscreteIQLLoss(sac.discrete_actor(dist), q, sac.value(), action_space=action_space, expectile=0.7)


REINFORCE_GRADS = {"loss_actor": {"actor_network."}, "loss_value": {"critic_network."}}

CASES = [
    LossCase("ReinforceLoss-gae", lambda: ReinforceLoss(onp.discrete_actor(), onp.critic()), onp.discrete_batch,
             REINFORCE_GRADS),
    LossCase("ReinforceLoss-delay-value", lambda: ReinforceLoss(onp.actor(), onp.critic(), delay_value=True),
             onp.continuous_batch, REINFORCE_GRADS),
    LossCase("BCLoss-nll", lambda: BCLoss(onp.actor()), demonstrations, {"loss_bc": {"actor_network."}}),
    LossCase("BCLoss-l2", lambda: BCLoss(deterministic_actor()), demonstrations, {"loss_bc": {"actor_network."}}),
    LossCase("TD3BCLoss", td3_bc, vb.continuous_batch,
             {"loss_actor": {"actor_network."}, "loss_qvalue": {"qvalue_network_params."}}),
    LossCase("DiscreteCQLLoss", lambda: DiscreteCQLLoss(vb.q_network(), action_space="categorical"), vb.discrete_batch,
             {"loss_qvalue": {"value_network."}, "loss_cql": {"value_network."}}),
    LossCase("GAILLoss", gail, expert_and_collected, {"loss": {"discriminator_network."}}, required_key="expert_action"),
    LossCase("GAILLoss-grad-penalty", lambda: gail(use_grad_penalty=True, gp_lambda=5.0), expert_and_collected,
             {"loss": {"discriminator_network."}}, required_key="collector_observation"),
    LossCase("RNDLoss", lambda: rnd(1.0), demonstrations, {"loss_predictor": {"predictor_network."}},
             required_key="observation"),
    LossCase("RNDLoss-fraction", lambda: rnd(0.5), demonstrations, {"loss_predictor": {"predictor_network."}},
             required_key="observation"),
    LossCase("CrossQLoss", lambda: CrossQLoss(sac.actor(), sac.qvalue(), target_entropy=-float(sac.ACT)),
             sac.continuous_batch, sac.SAC_GRADS),
    LossCase("DiscreteIQLLoss", lambda: discrete_iql("one-hot"), sac.one_hot_batch,
             {"loss_actor": sac.ACTOR, "loss_qvalue": sac.CRITICS, "loss_value": {"value_network."}}),
    LossCase("DiscreteIQLLoss-categorical", lambda: discrete_iql("categorical"), sac.categorical_batch,
             {"loss_actor": sac.ACTOR, "loss_qvalue": sac.CRITICS, "loss_value": {"value_network."}}),
]
