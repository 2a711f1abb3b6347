"""Loss-battery cases (see ``_cases.py``) for TQC and the decision-transformer losses.

Also the small networks and batches of their own test files."""

from __future__ import annotations

import torch
from torch import nn

from steersman.data import Bounded
from steersman.modules import (
    DTActor,
    OnlineDTActor,
    ProbabilisticActor,
    TanhDelta,
    TanhNormal,
    WorldModel,
)
from steersman.objectives import DTLoss, OnlineDTLoss, TQCLoss, WorldModelLoss
from steersman.tensordict import TensorDict
from steersman.tensordict.nn import TensorDictModule, TensorDictSequential
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


# ------------------------------------------------------------ decision transformers
#: a tiny transformer: one layer, two heads, width 16 (dropout on: the battery seeds it)
DT_CONFIG = dict(n_embd=16, n_layer=1, n_head=2, n_inner=32, activation="relu", n_positions=30,
                 resid_pdrop=0.1, attn_pdrop=0.1)
DT_OBS, DT_ACT, DT_EMB = 3, 2, 6
WINDOWS = ["obs_embed", "action", "return_to_go"]


def _encoder() -> TensorDictModule:
    """``observation [*B, L, DT_OBS] -> obs_embed [*B, L, DT_EMB]`` (lazy in the battery's lazy run)."""
    return TensorDictModule(input_layer(DT_OBS, DT_EMB), ["observation"], ["obs_embed"])


def dt_actor() -> ProbabilisticActor:
    """Windows -> the deterministic action ``[*B, L, DT_ACT]`` in ``[-1, 1]`` (TanhDelta)."""
    net = TensorDictSequential(_encoder(), TensorDictModule(DTActor(DT_EMB, DT_ACT, DT_CONFIG), WINDOWS, ["param"]))
    return ProbabilisticActor(net, in_keys=["param"], distribution_class=TanhDelta)


def online_dt_actor() -> ProbabilisticActor:
    """Windows -> a TanhNormal over ``[-1, 1]^DT_ACT`` per step (log-prob ``[*B, L]``)."""
    net = TensorDictSequential(_encoder(),
                               TensorDictModule(OnlineDTActor(DT_EMB, DT_ACT, DT_CONFIG), WINDOWS, ["loc", "scale"]))
    return ProbabilisticActor(net, in_keys=["loc", "scale"], spec=Bounded(-1.0, 1.0, shape=(DT_ACT,)),
                              distribution_class=TanhNormal)


def windows(loss=None, shape: tuple[int, ...] = (3, 4)) -> TensorDict:
    """Context windows with the step dim last in ``shape``; actions inside ``(-0.9, 0.9)``."""
    return TensorDict({
        "observation": torch.randn(*shape, DT_OBS),
        "action": torch.rand(*shape, DT_ACT) * 1.8 - 0.9,
        "return_to_go": torch.randn(*shape, 1),
    }, list(shape))


DT_SHAPES = [(3, 4), (2, 2, 3)]


# ------------------------------------------------------------ world model
WM_OBS, WM_LATENT, WM_ACT = 5, 4, 2


class _Dynamics(nn.Module):
    """``(latent, action) -> (next latent, the same prediction as "predicted_latent")``."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(WM_LATENT + WM_ACT, WM_LATENT)

    def forward(self, latent: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        nxt = self.net(torch.cat([latent, action], -1))
        return nxt, nxt


def world_model() -> WorldModel:
    """Encoder, dynamics, reward and done heads, a decoder and a latent target from the
    next observation (all linear)."""
    encoder = TensorDictModule(input_layer(WM_OBS, WM_LATENT), ["observation"], ["latent"])
    dynamics = TensorDictSequential(
        TensorDictModule(_Dynamics(), ["latent", "action"], [("next", "latent"), "predicted_latent"]),
        TensorDictModule(nn.Linear(WM_OBS, WM_LATENT), [("next", "observation")], ["target_latent"]),
    )
    reward = TensorDictModule(nn.Linear(WM_LATENT, 1), [("next", "latent")], [("next", "reward")])
    done = TensorDictModule(nn.Sequential(nn.Linear(WM_LATENT, 1), nn.Sigmoid()), [("next", "latent")],
                            [("next", "done")])
    decoder = TensorDictModule(nn.Linear(WM_LATENT, WM_OBS), ["latent"], ["reconstructed_observation"])
    return WorldModel(encoder, dynamics, reward, done_head=done, decoder=decoder)


def world_model_batch(loss=None, shape: tuple[int, ...] = (8,)) -> TensorDict:
    done = torch.zeros(*shape, 1, dtype=torch.bool)
    done.view(-1)[1] = True
    return TensorDict({
        "observation": torch.randn(*shape, WM_OBS), "action": torch.randn(*shape, WM_ACT),
        "next": {"observation": torch.randn(*shape, WM_OBS), "reward": torch.randn(*shape, 1), "done": done,
                 "terminated": done.clone()},
    }, list(shape))

CASES = [
    LossCase("TQCLoss", tqc, sac.continuous_batch, sac.SAC_GRADS),
    LossCase("DTLoss", lambda: DTLoss(dt_actor()), windows, {"loss": {"actor_network."}}, batch_shapes=DT_SHAPES,
             required_key="action_target"),
    LossCase("OnlineDTLoss", lambda: OnlineDTLoss(online_dt_actor(), samples_mc_entropy=2), windows,
             {"loss_log_likelihood": {"actor_network."}, "loss_entropy": {"actor_network."},
              "loss_alpha": {"log_alpha"}}, batch_shapes=DT_SHAPES[:1], required_key="action_target"),
    LossCase("WorldModelLoss", lambda: WorldModelLoss(world_model(), losses=["reward", "done", "reconstruction"]),
             world_model_batch,
             {"loss_reward": {"world_model.encoder.", "world_model.dynamics.", "world_model.reward_head."},
              "loss_done": {"world_model.encoder.", "world_model.dynamics.", "world_model.done_head."},
              "loss_reconstruction": {"world_model.encoder.", "world_model.decoder."}},
             required_key="observation"),
]
