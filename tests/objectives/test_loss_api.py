"""Constructor API shared by the losses: the actor-critic keywords declared once and shown
in every subclass's signature, the TorchRL-compatibility keywords that are accepted and
ignored (one list, ``TORCHRL_COMPAT_IGNORED``), and the shared option checks."""

from __future__ import annotations

import inspect

import pytest
import torch

from steersman.objectives import (
    A2CLoss,
    ClipPPOLoss,
    CQLLoss,
    DiscreteSACLoss,
    IQLLoss,
    KLPENPPOLoss,
    PPOLoss,
    REDQLoss,
    SACLoss,
    TD3Loss,
)
from steersman.objectives.actor_critic import ActorCriticLoss
from steersman.objectives.common import TORCHRL_COMPAT_IGNORED
from tests.objectives import cases_onpolicy as onp
from tests.objectives import cases_sac as sac
from tests.objectives import cases_value_based as vb
from tests.objectives.test_loss_battery import CASES, _forward

ON_POLICY = {A2CLoss: {}, PPOLoss: {}, ClipPPOLoss: {"clip_epsilon": 0.2}, KLPENPPOLoss: {"dtarg": 0.01}}
BASE_KEYWORDS = [n for n, p in inspect.signature(ActorCriticLoss).parameters.items() if p.kind is p.KEYWORD_ONLY]


@pytest.mark.parametrize("cls", list(ON_POLICY), ids=lambda c: c.__name__)
def test_signature_lists_the_shared_keywords_and_its_own(cls):
    params = inspect.signature(cls).parameters
    assert list(params)[:2] == ["actor_network", "critic_network"]
    assert not any(p.kind is p.VAR_KEYWORD for p in params.values()), f"{cls.__name__} hides keywords behind **"
    missing = set(BASE_KEYWORDS) - set(params)
    assert not missing, f"{cls.__name__}'s signature lacks {sorted(missing)}"
    for own in ON_POLICY[cls]:
        assert own in params


@pytest.mark.parametrize("cls", list(ON_POLICY), ids=lambda c: c.__name__)
def test_every_listed_keyword_is_accepted_with_its_effect(cls):
    sig = inspect.signature(cls)
    for name, p in sig.parameters.items():
        if p.kind is p.KEYWORD_ONLY and name not in ("entropy_coef", "critic_coef"):
            cls(onp.actor(), onp.critic(), **{name: p.default})  # the documented default is accepted
    loss = cls(onp.actor(), onp.critic(), entropy_coef=0.3, critic_coeff=0.5, loss_critic_type="l1", reduction="sum")
    assert (loss.entropy_coeff, loss.critic_coeff, loss.loss_critic_type, loss.reduction) == (0.3, 0.5, "l1", "sum")
    with pytest.raises(TypeError, match="not_a_keyword"):
        cls(onp.actor(), onp.critic(), not_a_keyword=1)
    with pytest.raises(ValueError, match=f"{cls.__name__}: loss_critic_type must be"):
        cls(onp.actor(), onp.critic(), loss_critic_type="huber")


def test_every_compat_keyword_has_a_reason_and_a_loss_that_takes_it():
    takers = {name: [] for name in TORCHRL_COMPAT_IGNORED}
    for case in CASES:
        for name in inspect.signature(type(case.make_loss())).parameters:
            if name in takers:
                takers[name].append(type(case.make_loss()).__name__)
    for name, reason in TORCHRL_COMPAT_IGNORED.items():
        assert len(reason) > 40, f"{name}: the reason is missing"
        assert takers[name], f"{name} is listed as a TorchRL-compat keyword but no loss takes it"


_SAC_IGNORED = {"separate_losses": True, "deactivate_vmap": True}
#: (loss builder taking keywords, batch builder, the ignored TorchRL keywords it takes)
COMPAT = {
    "A2CLoss": (lambda **kw: A2CLoss(onp.discrete_actor(), onp.critic(), **kw), onp.discrete_batch, {"functional": False}),
    "ClipPPOLoss": (lambda **kw: ClipPPOLoss(onp.actor(), onp.critic(), **kw), onp.continuous_batch, {"functional": False}),
    "SACLoss": (lambda **kw: SACLoss(sac.actor(), sac.qvalue(), target_entropy=-2.0, **kw), sac.continuous_batch, _SAC_IGNORED),
    "DiscreteSACLoss": (
        lambda **kw: DiscreteSACLoss(sac.discrete_actor(), sac.discrete_qvalue(), action_space="one-hot", num_actions=4, **kw),
        sac.one_hot_batch,
        _SAC_IGNORED,
    ),
    "IQLLoss": (lambda **kw: IQLLoss(sac.actor(), sac.qvalue(), sac.value(), **kw), sac.continuous_batch, _SAC_IGNORED),
    "REDQLoss": (lambda **kw: REDQLoss(sac.actor(), sac.qvalue(), target_entropy=-2.0, **kw), sac.continuous_batch, _SAC_IGNORED),
    "CQLLoss": (
        lambda **kw: CQLLoss(sac.actor(), sac.qvalue(), target_entropy=-2.0, num_random=2, **kw),
        sac.continuous_batch,
        {"deactivate_vmap": True},
    ),
    "TD3Loss": (
        lambda **kw: TD3Loss(vb.actor(), vb.critic(), bounds=(-1.0, 1.0), **kw),
        vb.continuous_batch,
        {"deactivate_vmap": True},
    ),
}


@pytest.mark.parametrize("name", list(COMPAT))
def test_compat_keywords_are_accepted_and_change_nothing(name):
    """The ignored TorchRL keywords, given non-default values, give the same loss."""
    build, make_batch, ignored = COMPAT[name]
    for keyword in ignored:
        assert keyword in inspect.signature(build().__class__).parameters
    torch.manual_seed(0)
    plain = build()
    torch.manual_seed(0)
    compat = build(**ignored)
    batch = make_batch(plain, (6,))
    expected, got = _forward(plain, batch), _forward(compat, batch)
    for key in expected.keys():
        torch.testing.assert_close(got[key], expected[key], msg=f"{name}: {key} changed with {ignored}")


class _SharedTrunkCritic(torch.nn.Module):
    def __init__(self, trunk: torch.nn.Module) -> None:
        super().__init__()
        self.trunk, self.head = trunk, torch.nn.Linear(8 + sac.ACT, 1)

    def forward(self, observation: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.trunk(observation), action], -1))


@pytest.mark.parametrize("separate_losses", [False, True])
def test_critic_sharing_parameters_with_the_actor_is_said_to_be_copied(separate_losses):
    """Where TorchRL's semantics differ (it keeps a trunk shared by actor and critic shared;
    the stacked ensemble here copies it), the loss says so, whatever separate_losses is."""
    from steersman.tensordict.nn import (
        NormalParamExtractor,
        ProbabilisticTensorDictModule,
        ProbabilisticTensorDictSequential,
        TanhNormal,
        TensorDictModule,
    )

    trunk = torch.nn.Linear(sac.OBS, 8)
    actor = ProbabilisticTensorDictSequential(
        TensorDictModule(torch.nn.Sequential(trunk, torch.nn.Linear(8, 2 * sac.ACT), NormalParamExtractor()),
                         ["observation"], ["loc", "scale"]),
        ProbabilisticTensorDictModule(["loc", "scale"], ["action"], TanhNormal),
    )
    critic = TensorDictModule(_SharedTrunkCritic(trunk), ["observation", "action"], ["state_action_value"])
    with pytest.warns(UserWarning, match=r"shares \['module.trunk.weight', 'module.trunk.bias'\].*own copies"):
        SACLoss(actor, critic, target_entropy=-2.0, separate_losses=separate_losses)
