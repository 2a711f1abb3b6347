"""Loss-battery cases (see ``_cases.py``) for the on-policy losses: A2C, PPO, ClipPPO, KLPEN-PPO.

Also the small networks and random batches their own test files use.
"""

from __future__ import annotations

import torch
from torch import nn

from steersman.modules.distributions import IndependentNormal
from steersman.objectives import A2CLoss, ClipPPOLoss, KLPENPPOLoss, PPOLoss
from steersman.tensordict import TensorDict
from steersman.tensordict.nn import (
    NormalParamExtractor,
    OneHotCategorical,
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TanhNormal,
    TensorDictModule,
    TensorDictSequential,
)
from tests.objectives._cases import LossCase, input_layer

OBS, ACT, N_ACTIONS, HIDDEN = 3, 2, 4, 8


# ------------------------------------------------------------------ networks
def actor(distribution=TanhNormal) -> ProbabilisticTensorDictSequential:
    """``observation [*B, OBS] -> loc, scale [*B, ACT]`` and ``distribution`` over them."""
    net = nn.Sequential(input_layer(OBS, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 2 * ACT), NormalParamExtractor())
    return ProbabilisticTensorDictSequential(
        TensorDictModule(net, ["observation"], ["loc", "scale"]),
        _prob_module(distribution),
    )


def _prob_module(distribution) -> ProbabilisticTensorDictModule:
    # no argument validation (data-dependent checks do not compile)
    kwargs = {"validate_args": False} if distribution is IndependentNormal else None
    return ProbabilisticTensorDictModule(
        ["loc", "scale"], ["action"], distribution, distribution_kwargs=kwargs, return_log_prob=True
    )


def discrete_actor() -> ProbabilisticTensorDictSequential:
    """``observation [*B, OBS] -> logits [*B, N_ACTIONS]``, one-hot categorical actions."""
    net = nn.Sequential(input_layer(OBS, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, N_ACTIONS))
    return ProbabilisticTensorDictSequential(
        TensorDictModule(net, ["observation"], ["logits"]),
        ProbabilisticTensorDictModule(["logits"], ["action"], OneHotCategorical, return_log_prob=True),
    )


def critic() -> TensorDictModule:
    """``V(s)``: ``observation [*B, OBS] -> state_value [*B, 1]``."""
    net = nn.Sequential(input_layer(OBS, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))
    return TensorDictModule(net, ["observation"], ["state_value"])


def shared_trunk() -> tuple[ProbabilisticTensorDictSequential, TensorDictSequential]:
    """An actor and a critic sharing ``observation -> hidden`` (module ``0`` of both)."""
    trunk = TensorDictModule(nn.Sequential(input_layer(OBS, HIDDEN), nn.Tanh()), ["observation"], ["hidden"])
    head = TensorDictModule(nn.Sequential(nn.Linear(HIDDEN, 2 * ACT), NormalParamExtractor()), ["hidden"], ["loc", "scale"])
    pi = ProbabilisticTensorDictSequential(trunk, head, _prob_module(IndependentNormal))
    v = TensorDictSequential(trunk, TensorDictModule(nn.Linear(HIDDEN, 1), ["hidden"], ["state_value"]))
    return pi, v


# ------------------------------------------------------------------ batches
def transitions(shape: tuple[int, ...], action: torch.Tensor) -> TensorDict:
    """Random transitions of batch ``shape``. With a time dim (last), one terminated and one
    truncated step inside every row; without, the second and third samples."""
    shape = tuple(shape)
    terminated = torch.zeros(*shape, 1, dtype=torch.bool)
    truncated = torch.zeros(*shape, 1, dtype=torch.bool)
    if len(shape) > 1:
        terminated[..., shape[-1] // 3, :] = True
        truncated[..., (2 * shape[-1]) // 3, :] = True
    else:
        terminated[1] = True
        truncated[2] = True
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


def collected(loss, shape: tuple[int, ...], action: torch.Tensor) -> TensorDict:
    """Transitions as a slightly older policy would have collected them: ``action_log_prob``
    and the distribution parameters come from the current actor, perturbed (ratios ≠ 1,
    some clipped; KL ≠ 0)."""
    td = transitions(shape, action)
    with torch.no_grad():
        params = loss.actor_network.get_dist_params(td.select("observation"))
        for key in loss.actor_network.dist_params_keys:
            value = params[key]
            td[key] = value * (1 + 0.3 * torch.rand_like(value)) if key == "scale" else value + 0.3 * torch.randn_like(value)
        log_prob = loss.actor_network.build_dist_from_params(td).log_prob(action)
    td["action_log_prob"] = log_prob
    return td


def continuous_batch(loss, shape: tuple[int, ...] = (8,)) -> TensorDict:
    """Actions in ``(-0.9, 0.9)^ACT`` (inside TanhNormal's support)."""
    return collected(loss, shape, torch.rand(*shape, ACT) * 1.8 - 0.9)


def discrete_batch(loss, shape: tuple[int, ...] = (8,)) -> TensorDict:
    action = nn.functional.one_hot(torch.randint(N_ACTIONS, tuple(shape)), N_ACTIONS)
    return collected(loss, shape, action)


def with_advantage(make_batch):
    """``make_batch`` plus a given ``advantage``/``value_target`` (the estimator is not run)."""

    def make(loss, shape):
        td = make_batch(loss, shape)
        td["advantage"] = torch.randn(*shape, 1)
        td["value_target"] = torch.randn(*shape, 1)
        td["state_value"] = td["value_target"] + 0.5 * torch.randn(*shape, 1)
        return td

    return make


# ------------------------------------------------------------------ cases
ACTOR, CRITIC = {"actor_network."}, {"critic_network."}
GRADS = {"loss_objective": ACTOR, "loss_entropy": ACTOR, "loss_critic": CRITIC}


def _shared(cls, separate_losses: bool, **kw):
    def make():
        pi, v = shared_trunk()
        return cls(pi, v, separate_losses=separate_losses, **kw)

    return make


CASES = [
    LossCase("A2CLoss-gae", lambda: A2CLoss(discrete_actor(), critic()), discrete_batch, GRADS),
    LossCase("PPOLoss-gae", lambda: PPOLoss(actor(IndependentNormal), critic()), continuous_batch, GRADS),
    LossCase("ClipPPOLoss-gae", lambda: ClipPPOLoss(actor(), critic()), continuous_batch, GRADS),
    LossCase(
        "ClipPPOLoss-discrete-clipvalue",
        lambda: ClipPPOLoss(discrete_actor(), critic(), clip_value=True, normalize_advantage=True),
        with_advantage(discrete_batch),
        GRADS,
    ),
    LossCase(
        "ClipPPOLoss-shared-trunk",
        _shared(ClipPPOLoss, separate_losses=False),
        continuous_batch,
        {"loss_objective": ACTOR, "loss_entropy": ACTOR, "loss_critic": {"critic_network.", "actor_network.module.0."}},
    ),
    LossCase("ClipPPOLoss-separate-losses", _shared(ClipPPOLoss, separate_losses=True), continuous_batch, GRADS),
    # increment = decrement = 1: β stays put, so two calls give the same output (determinism checks)
    LossCase(
        "KLPENPPOLoss-closed-form-kl",
        lambda: KLPENPPOLoss(actor(IndependentNormal), critic(), increment=1.0, decrement=1.0),
        continuous_batch,
        GRADS,
    ),
    LossCase(
        "KLPENPPOLoss-mc-kl",
        lambda: KLPENPPOLoss(actor(), critic(), increment=1.0, decrement=1.0, samples_mc_kl=4),
        with_advantage(continuous_batch),
        GRADS,
    ),
]
