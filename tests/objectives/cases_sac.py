"""Loss-battery cases (see ``_cases.py``) for the soft actor-critic family: SAC (v1, v2,
TD(lambda)), discrete SAC (one-hot and categorical actions), IQL, CQL and REDQ.

Also the small networks and random batches their own test files use.
"""

from __future__ import annotations

import torch
from torch import nn

from steersman.objectives import (
    CQLLoss,
    DiscreteSACLoss,
    IQLLoss,
    REDQLoss,
    SACLoss,
    ValueEstimators,
)
from steersman.tensordict import TensorDict
from steersman.tensordict.nn import (
    NormalParamExtractor,
    OneHotCategorical,
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TanhNormal,
    TensorDictModule,
)
from tests.objectives._cases import LossCase, input_layer

OBS, ACT, N_ACTIONS, HIDDEN = 3, 2, 4, 8


# ------------------------------------------------------------------ networks
def actor() -> ProbabilisticTensorDictSequential:
    """``observation [*B, OBS] -> TanhNormal`` over ``[-1, 1]^ACT`` (loc, scale ``[*B, ACT]``)."""
    net = nn.Sequential(input_layer(OBS, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 2 * ACT), NormalParamExtractor())
    return ProbabilisticTensorDictSequential(
        TensorDictModule(net, ["observation"], ["loc", "scale"]),
        ProbabilisticTensorDictModule(["loc", "scale"], ["action"], TanhNormal, return_log_prob=True),
    )


class Critic(nn.Module):
    """``Q(s, a)`` from the concatenated observation and action: ``[*B, OBS], [*B, ACT] -> [*B, 1]``."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(input_layer(OBS + ACT, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))

    def forward(self, observation: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([observation, action], -1))


def qvalue() -> TensorDictModule:
    return TensorDictModule(Critic(), ["observation", "action"], ["state_action_value"])


def value() -> TensorDictModule:
    """``V(s)``: ``observation [*B, OBS] -> state_value [*B, 1]``."""
    net = nn.Sequential(input_layer(OBS, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))
    return TensorDictModule(net, ["observation"], ["state_value"])


def discrete_actor(distribution=OneHotCategorical) -> ProbabilisticTensorDictSequential:
    """``observation [*B, OBS] -> logits [*B, N_ACTIONS]`` and a categorical over them."""
    net = nn.Sequential(input_layer(OBS, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, N_ACTIONS))
    return ProbabilisticTensorDictSequential(
        TensorDictModule(net, ["observation"], ["logits"]),
        ProbabilisticTensorDictModule(["logits"], ["action"], distribution),
    )


def discrete_qvalue() -> TensorDictModule:
    """``observation [*B, OBS] -> action_value [*B, N_ACTIONS]``."""
    net = nn.Sequential(input_layer(OBS, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, N_ACTIONS))
    return TensorDictModule(net, ["observation"], ["action_value"])


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


def continuous_batch(loss=None, shape: tuple[int, ...] = (8,)) -> TensorDict:
    """Actions uniform in ``(-1, 1)^ACT``."""
    return transitions(shape, torch.rand(*shape, ACT) * 2 - 1)


def one_hot_batch(loss=None, shape: tuple[int, ...] = (8,)) -> TensorDict:
    return transitions(shape, nn.functional.one_hot(torch.randint(N_ACTIONS, tuple(shape)), N_ACTIONS))


def categorical_batch(loss=None, shape: tuple[int, ...] = (8,)) -> TensorDict:
    return transitions(shape, torch.randint(N_ACTIONS, tuple(shape)))


# ------------------------------------------------------------------ cases
ACTOR, CRITICS, ALPHA = {"actor_network."}, {"qvalue_network_params."}, {"log_alpha"}
SAC_GRADS = {"loss_actor": ACTOR, "loss_qvalue": CRITICS, "loss_alpha": ALPHA}


def _sac_v1_td_lambda() -> SACLoss:
    loss = SACLoss(actor(), qvalue(), value(), num_qvalue_nets=3, target_entropy=-1.0, delay_actor=True,
                   min_alpha=0.1, max_alpha=5.0)
    return loss.make_value_estimator(ValueEstimators.TDLambda, gamma=0.9, lmbda=0.8)


# one case per loss and code path (each compile costs seconds); the variants not listed here
# (discrete actions as indices, CQL's max-backup, ...) are covered by the losses' own tests
CASES = [
    LossCase("SACLoss", lambda: SACLoss(actor(), qvalue(), target_entropy=-float(ACT)), continuous_batch, SAC_GRADS),
    LossCase("SACLoss-v1-tdlambda", _sac_v1_td_lambda, continuous_batch, {**SAC_GRADS, "loss_value": {"value_network."}}),
    LossCase(
        "DiscreteSACLoss",
        lambda: DiscreteSACLoss(discrete_actor(), discrete_qvalue(), action_space="one-hot", num_actions=N_ACTIONS),
        one_hot_batch,
        SAC_GRADS,
    ),
    LossCase(
        "IQLLoss",
        lambda: IQLLoss(actor(), qvalue(), value(), expectile=0.7, temperature=3.0),
        continuous_batch,
        {"loss_actor": ACTOR, "loss_qvalue": CRITICS, "loss_value": {"value_network."}},
    ),
    LossCase(
        "CQLLoss-lagrange",
        lambda: CQLLoss(actor(), qvalue(), target_entropy=-float(ACT), num_random=3, with_lagrange=True,
                        lagrange_thresh=1.0, temperature=2.0),
        continuous_batch,
        {**SAC_GRADS, "loss_actor_bc": ACTOR, "loss_cql": CRITICS, "loss_alpha_prime": {"log_alpha_prime"}},
    ),
    LossCase(
        "REDQLoss",
        lambda: REDQLoss(actor(), qvalue(), num_qvalue_nets=5, sub_sample_len=2, target_entropy=-float(ACT)),
        continuous_batch,
        SAC_GRADS,
    ),
]


# ------------------------------------------------------------------ plain-torch references
GAMMA = 0.99  # the default TD(0) discount


def mlp(w: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """The two-layer tanh MLP of this file with weights ``[W1, b1, W2, b2]``."""
    return torch.tanh(x @ w[0].T + w[1]) @ w[2].T + w[3]


def member(params, i: int) -> list[torch.Tensor]:
    """Critic ``i``'s weights ``[W1, b1, W2, b2]`` from stacked ``qvalue_network_params``
    (of :func:`qvalue` or :func:`discrete_qvalue`)."""
    root = ("module", "net") if "net" in params["module"].keys() else ("module",)
    return [params[(*root, layer, kind)][i] for layer in ("0", "2") for kind in ("weight", "bias")]


def critic_ref(w: list[torch.Tensor], obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    return mlp(w, torch.cat([obs, action], -1))


def tanh_normal_ref(w: list[torch.Tensor], obs: torch.Tensor, eps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tanh(x), log pi)`` with ``x = loc + scale * eps``, by the change of variables."""
    loc, scale = NormalParamExtractor()(mlp(w, obs))
    x = loc + scale * eps
    normal = -0.5 * eps.pow(2) - scale.log() - 0.5 * torch.log(torch.tensor(2 * torch.pi, dtype=x.dtype))
    log_det = 2 * (torch.log(torch.tensor(2.0, dtype=x.dtype)) - x - nn.functional.softplus(-2 * x))
    return torch.tanh(x), (normal - log_det).sum(-1)


def smooth_l1(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    d = (x - y).abs()
    return torch.where(d < 1, 0.5 * d * d, d - 0.5)


def tanh_normal_log_prob_ref(w: list[torch.Tensor], obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """``log pi(a|s)`` of a given action in ``(-1, 1)^ACT`` (no sampling)."""
    loc, scale = NormalParamExtractor()(mlp(w, obs))
    x = torch.atanh(action)
    return (torch.distributions.Normal(loc, scale).log_prob(x) - torch.log1p(-action.pow(2))).sum(-1)
