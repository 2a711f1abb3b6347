"""Loss-battery cases (see ``_cases.py``) for the value-based losses: DQN, C51, DDPG, TD3.

Also the small networks and random batches their own test files use.
"""

from __future__ import annotations

import torch
from torch import nn

from steersman.data import Bounded
from steersman.objectives import DDPGLoss, DistributionalDQNLoss, DQNLoss, TD3Loss, ValueEstimators
from steersman.tensordict import TensorDict
from steersman.tensordict.nn import TensorDictModule
from tests.objectives._cases import LossCase, input_layer

OBS, N_ACTIONS, ACT, HIDDEN = 4, 3, 2, 8
N_ATOMS, SUPPORT = 7, torch.linspace(-3.0, 3.0, 7)


class Critic(nn.Module):
    """``Q(s, a)`` from the concatenated observation and action: ``[*B, OBS], [*B, ACT] -> [*B, 1]``."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(input_layer(OBS + ACT, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))

    def forward(self, observation: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([observation, action], -1))


def q_network() -> TensorDictModule:
    """``observation [*B, OBS] -> action_value [*B, N_ACTIONS]``."""
    net = nn.Sequential(input_layer(OBS, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, N_ACTIONS))
    return TensorDictModule(net, in_keys=["observation"], out_keys=["action_value"])


class C51Head(nn.Module):
    """``[*B, OBS] -> [*B, N_ATOMS, N_ACTIONS]`` log-probabilities over the atoms."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(input_layer(OBS, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, N_ATOMS * N_ACTIONS))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.net(observation).unflatten(-1, (N_ATOMS, N_ACTIONS)).log_softmax(-2)


def c51_network() -> TensorDictModule:
    return TensorDictModule(C51Head(), in_keys=["observation"], out_keys=["action_value"])


def actor() -> TensorDictModule:
    """``observation [*B, OBS] -> action [*B, ACT]`` in ``[-1, 1]``."""
    net = nn.Sequential(input_layer(OBS, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, ACT), nn.Tanh())
    return TensorDictModule(net, in_keys=["observation"], out_keys=["action"])


def critic() -> TensorDictModule:
    return TensorDictModule(Critic(), in_keys=["observation", "action"], out_keys=["state_action_value"])


def transitions(shape: tuple[int, ...], action: torch.Tensor) -> TensorDict:
    """Random transitions of batch ``shape`` with ``action``. Some steps end an episode: with a
    time dim (last), one terminated and one truncated step inside every row; without, the
    second and third samples (fewer for a tiny batch)."""
    shape = tuple(shape)
    terminated = torch.zeros(*shape, 1, dtype=torch.bool)
    truncated = torch.zeros(*shape, 1, dtype=torch.bool)
    if len(shape) > 1:
        t = shape[-1]
        terminated[..., t // 3, :] = True
        truncated[..., (2 * t) // 3, :] = True
    else:
        terminated[1 % shape[0]] = True
        truncated[2 % shape[0]] = True
    return TensorDict(
        {
            "observation": torch.randn(*shape, OBS),
            "action": action,
            "next": {
                "observation": torch.randn(*shape, OBS),
                "reward": torch.randn(*shape, 1),
                "done": terminated | truncated,
                "terminated": terminated,
                "truncated": truncated,
            },
        },
        list(shape),
    )


def discrete_batch(loss: DQNLoss, shape: tuple[int, ...]) -> TensorDict:
    return transitions(shape, torch.randint(N_ACTIONS, shape))


def continuous_batch(loss: DDPGLoss | TD3Loss, shape: tuple[int, ...]) -> TensorDict:
    return transitions(shape, torch.rand(*shape, ACT) * 2 - 1)


def dqn_tdlambda() -> DQNLoss:
    return DQNLoss(q_network(), action_space="categorical").make_value_estimator(
        ValueEstimators.TDLambda, gamma=0.9, lmbda=0.8
    )


CASES = [
    LossCase(
        name="DQNLoss",
        make_loss=lambda: DQNLoss(q_network(), action_space="categorical"),
        make_batch=discrete_batch,
        grad_map={"loss": {"value_network."}},
    ),
    LossCase(
        name="DQNLoss-double",
        make_loss=lambda: DQNLoss(q_network(), double_dqn=True),
        make_batch=discrete_batch,
        grad_map={"loss": {"value_network."}},
    ),
    LossCase(
        name="DQNLoss-tdlambda",
        make_loss=dqn_tdlambda,
        make_batch=discrete_batch,
        grad_map={"loss": {"value_network."}},
        batch_shapes=[(4, 6)],
    ),
    LossCase(
        name="DistributionalDQNLoss",
        make_loss=lambda: DistributionalDQNLoss(c51_network(), gamma=0.9, support=SUPPORT),
        make_batch=discrete_batch,
        grad_map={"loss": {"value_network."}},
    ),
    LossCase(
        name="DDPGLoss",
        make_loss=lambda: DDPGLoss(actor(), critic(), delay_actor=True),
        make_batch=continuous_batch,
        grad_map={"loss_actor": {"actor_network."}, "loss_value": {"value_network."}},
    ),
    LossCase(
        name="TD3Loss",
        make_loss=lambda: TD3Loss(actor(), critic(), action_spec=Bounded(-1.0, 1.0, shape=(ACT,))),
        make_batch=continuous_batch,
        grad_map={"loss_actor": {"actor_network."}, "loss_qvalue": {"qvalue_network_params."}},
    ),
]
