"""TorchRL's keyword arguments of the losses, each with its documented effect.

Importance weights of prioritized replay (``use_prioritized_weights``), the deprecated
``priority_key``/``gamma``/``actor``/``critic``/``*_key`` spellings, ``scalar_output_mode``,
DDPG's ``separate_losses``, REDQ's ``gSDE``, PPO's ``delay_actor`` (PPO-EWMA),
``max_importance_ratio``, ``advantage_norm`` and ``device``, the target updaters'
``loss_module`` and ``distance_loss(strict_shape=)`` — checked against plain references.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import tests.objectives.cases_onpolicy as onp
import tests.objectives.cases_sac as sac
import tests.objectives.cases_value_based as vb
from steersman.data import Bounded
from steersman.modules import PercentileValueNorm, ProbabilisticActor
from steersman.objectives import (
    A2CLoss,
    ClipPPOLoss,
    CQLLoss,
    CrossQLoss,
    DDPGLoss,
    DiscreteIQLLoss,
    DistributionalDQNLoss,
    DQNLoss,
    HardUpdate,
    IQLLoss,
    KLPENPPOLoss,
    PPOLoss,
    REDQLoss,
    ReinforceLoss,
    SACLoss,
    SoftUpdate,
    TD3BCLoss,
    TD3Loss,
)
from steersman.objectives.utils import distance_loss
from steersman.tensordict import TensorDict
from steersman.tensordict.nn import ProbabilisticTensorDictSequential, TanhNormal, TensorDictModule

B = 6
BOUNDS = Bounded(-1.0, 1.0, shape=(vb.ACT,))
WEIGHTED = {  # loss -> (constructor taking keywords, batch maker)
    "DQNLoss": (lambda **kw: DQNLoss(vb.q_network(), action_space="categorical", **kw), vb.discrete_batch),
    "DistributionalDQNLoss": (lambda **kw: DistributionalDQNLoss(vb.c51_network(), gamma=0.9, support=vb.SUPPORT, **kw),
                              vb.discrete_batch),
    "DDPGLoss": (lambda **kw: DDPGLoss(vb.actor(), vb.critic(), **kw), vb.continuous_batch),
    "TD3Loss": (lambda **kw: TD3Loss(vb.actor(), vb.critic(), action_spec=BOUNDS, **kw), vb.continuous_batch),
    "TD3BCLoss": (lambda **kw: TD3BCLoss(vb.actor(), vb.critic(), action_spec=BOUNDS, **kw), vb.continuous_batch),
}


def _run(name: str, batch: TensorDict, **kw) -> TensorDict:
    make, _ = WEIGHTED[name]
    torch.manual_seed(0)
    loss = make(**kw)
    torch.manual_seed(1)  # TD3's smoothing noise
    return loss(batch.clone())


@pytest.mark.parametrize("name", list(WEIGHTED))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_prioritized_weights_weight_every_term(name, reduction):
    torch.manual_seed(2)
    batch = WEIGHTED[name][1](None, (B,))
    weights = torch.rand(B) + 0.1
    per_sample = _run(name, batch, reduction="none")
    out = _run(name, batch.set("priority_weight", weights), reduction=reduction)
    terms = [k for k in out.keys() if k.startswith("loss")]
    assert terms
    for k in terms:
        weighted = per_sample[k] * weights
        expected = {"mean": weighted.sum() / weights.sum(), "sum": weighted.sum(), "none": weighted}[reduction]
        torch.testing.assert_close(out[k], expected, msg=f"{name}.{k}")
    # False ignores the weights; a batch without them is the plain reduction
    off = _run(name, batch, reduction=reduction, use_prioritized_weights=False)
    plain = _run(name, batch.exclude("priority_weight"), reduction=reduction)
    for k in terms:
        torch.testing.assert_close(off[k], plain[k])
        if reduction != "none":
            assert not torch.allclose(off[k], out[k])


def test_prioritized_weights_bad_values():
    with pytest.raises(ValueError, match="use_prioritized_weights must be 'auto', True or False"):
        DQNLoss(vb.q_network(), use_prioritized_weights="yes")
    loss = DQNLoss(vb.q_network(), action_space="categorical")
    batch = vb.discrete_batch(None, (B,)).set("priority_weight", torch.ones(B + 1)[:B].reshape(B, 1)[:3].expand(3, 2)
                                               .reshape(B))
    loss(batch)  # one weight per sample, any layout: accepted
    with pytest.raises(ValueError, match="one importance weight per sample"):
        loss(vb.discrete_batch(None, (B,)).set("priority_weight", torch.ones(B, 2)))


PRIORITY_KEY = {
    "DQNLoss": (lambda **kw: DQNLoss(vb.q_network(), action_space="categorical", **kw), vb.discrete_batch),
    "DistributionalDQNLoss": WEIGHTED["DistributionalDQNLoss"],
    "TD3Loss": WEIGHTED["TD3Loss"],
    "TD3BCLoss": WEIGHTED["TD3BCLoss"],
    "IQLLoss": (lambda **kw: IQLLoss(sac.actor(), sac.qvalue(), sac.value(), **kw), sac.continuous_batch),
    "REDQLoss": (lambda **kw: REDQLoss(sac.actor(), sac.qvalue(), num_qvalue_nets=3, target_entropy=-2.0, **kw), sac.continuous_batch),
    "CrossQLoss": (lambda **kw: CrossQLoss(sac.actor(), sac.qvalue(), target_entropy=-2.0, **kw), sac.continuous_batch),
    "DiscreteIQLLoss": (lambda **kw: DiscreteIQLLoss(
        sac.discrete_actor(), TensorDictModule(sac.discrete_qvalue().module, ["observation"], ["state_action_value"]),
        sac.value(), action_space="one-hot", **kw), sac.one_hot_batch),
}


@pytest.mark.parametrize("name", list(PRIORITY_KEY))
def test_priority_key_is_set_keys_priority(name):
    make, batch_of = PRIORITY_KEY[name]
    torch.manual_seed(0)
    with pytest.warns(DeprecationWarning, match="priority_key"):
        loss = make(priority_key="my_priority")
    assert loss.tensor_keys.priority == "my_priority"
    batch = batch_of(loss, (B,))
    loss(batch)
    assert "my_priority" in batch.keys() and "td_error" not in batch.keys()


SCALAR_MODE = {
    "CQLLoss": (lambda **kw: CQLLoss(sac.actor(), sac.qvalue(), num_random=2, target_entropy=-2.0, **kw), ["alpha", "entropy"]),
    "IQLLoss": (PRIORITY_KEY["IQLLoss"][0], ["entropy"]),
    "REDQLoss": (PRIORITY_KEY["REDQLoss"][0], ["alpha", "entropy"]),
    "CrossQLoss": (PRIORITY_KEY["CrossQLoss"][0], ["alpha", "entropy"]),
}


@pytest.mark.parametrize("name", list(SCALAR_MODE))
def test_scalar_output_mode_and_deprecated_gamma(name):
    make, scalars = SCALAR_MODE[name]
    torch.manual_seed(0)
    batch = sac.continuous_batch(None, (B,))
    excluded = make(reduction="none", scalar_output_mode="exclude")(batch.clone())
    kept = make(reduction="none", scalar_output_mode="non_tensor")(batch.clone())
    for k in scalars:
        assert k not in excluded.keys()
        assert torch.as_tensor(kept.get_non_tensor(k)).numel() == 1
    assert all(excluded[k].shape == (B,) for k in excluded.keys() if k.startswith("loss_"))
    with pytest.raises(ValueError, match="scalar_output_mode must be"):
        make(scalar_output_mode="keep")
    if name != "CrossQLoss":  # TorchRL's CrossQLoss has no gamma
        with pytest.warns(DeprecationWarning, match="gamma"):
            loss = make(gamma=0.5)
        assert loss.value_estimator.gamma == 0.5


def test_ddpg_separate_losses_keeps_the_shared_trunk_out_of_the_value_loss():
    trunk = nn.Linear(vb.OBS, vb.OBS)
    actor = TensorDictModule(nn.Sequential(trunk, nn.Tanh(), nn.Linear(vb.OBS, vb.ACT), nn.Tanh()),
                             ["observation"], ["action"])

    class Q(nn.Module):
        def __init__(self):
            super().__init__()
            self.trunk, self.head = trunk, nn.Linear(vb.OBS + vb.ACT, 1)

        def forward(self, observation, action):
            return self.head(torch.cat([self.trunk(observation), action], -1))

    critic = TensorDictModule(Q(), ["observation", "action"], ["state_action_value"])
    batch = vb.continuous_batch(None, (B,))
    for separate, reaches in ((False, True), (True, False)):
        loss = DDPGLoss(actor, critic, separate_losses=separate)
        loss.zero_grad()
        loss(batch.clone())["loss_value"].backward()
        assert (trunk.weight.grad is not None and bool(trunk.weight.grad.abs().sum() > 0)) is reaches
        assert bool(critic.module.head.weight.grad.abs().sum() > 0)
        trunk.weight.grad = None


def test_redq_gsde_gives_the_actor_zero_noise_when_the_batch_has_none():
    seen = []

    class NoiseReader(nn.Module):
        def forward(self, observation, eps):
            seen.append(eps.clone())
            return observation

    def make(**kw):
        torch.manual_seed(0)
        base = sac.actor()
        actor = ProbabilisticTensorDictSequential(
            TensorDictModule(NoiseReader(), ["observation", "_eps_gSDE"], ["observation"]), *base.module)
        return REDQLoss(actor, sac.qvalue(), num_qvalue_nets=3, target_entropy=-2.0, **kw)

    batch = sac.continuous_batch(None, (B,))
    with pytest.raises(KeyError, match="_eps_gSDE"):
        make()(batch.clone())
    seen.clear()
    out = make(gSDE=True)(batch.clone())
    assert torch.isfinite(out["loss_actor"])
    assert seen and all(e.shape == (B,) and not e.any() for e in seen)


@pytest.mark.parametrize("cls", [TD3Loss, TD3BCLoss])
def test_td3_given_noise_replaces_the_smoothing_draw(cls):
    torch.manual_seed(0)
    loss = cls(vb.actor(), vb.critic(), action_spec=BOUNDS, given_noise_key=("next", "noise"))
    plain = cls(loss.actor_network, vb.critic(), action_spec=BOUNDS)
    plain.load_state_dict(loss.state_dict())
    batch = vb.continuous_batch(None, (B,))
    torch.manual_seed(5)
    eps = torch.randn_like(batch["action"])  # what plain TD3 draws first under seed 5
    batch["next", "noise"] = eps * 4  # some beyond noise_clip / policy_noise: clipped the same way
    torch.manual_seed(123)
    given = loss(batch.clone())
    ref_batch = batch.clone()
    plain.policy_noise *= 4  # clip(4 σ ε) drawn by plain TD3 = clip(σ · 4ε) given
    torch.manual_seed(5)
    ref = plain(ref_batch)
    torch.testing.assert_close(given["loss_qvalue"], ref["loss_qvalue"])
    with pytest.raises(KeyError, match="given_noise_key"):
        loss(batch.exclude(("next", "noise")))


def test_sac_given_noise_equals_an_actor_that_reads_the_noise():
    class GivenTanhNormal(TanhNormal):  # the reference: the distribution itself reads the draws
        def __init__(self, loc, scale, eps, **kw):
            super().__init__(loc, scale, **kw)
            self.eps = eps

        def rsample(self, sample_shape=torch.Size()):
            return self._squash(self.loc + self.scale * self.eps)

    def build(given: bool) -> SACLoss:
        torch.manual_seed(0)
        actor = sac.actor()
        if not given:
            actor = ProbabilisticActor(actor.module[0], in_keys={"loc": "loc", "scale": "scale", "eps": "noise"},
                                       distribution_class=GivenTanhNormal, return_log_prob=True)
        return SACLoss(actor, sac.qvalue(), target_entropy=-2.0, given_noise_key="noise" if given else None)

    batch = sac.continuous_batch(None, (B,))
    batch["noise"] = torch.randn(B, sac.ACT)
    batch["next", "noise"] = torch.randn(B, sac.ACT)
    torch.manual_seed(1)
    out = build(True)(batch.clone())
    torch.manual_seed(2)
    ref = build(False)(batch.clone())
    for k in ("loss_actor", "loss_qvalue", "loss_alpha"):
        torch.testing.assert_close(out[k], ref[k])
    with pytest.raises(KeyError, match="given_noise_key"):
        build(True)(batch.exclude("noise"))


# ------------------------------------------------------------------ actor-critic losses
@pytest.mark.parametrize("cls", [A2CLoss, PPOLoss, ClipPPOLoss, ReinforceLoss])
def test_actor_critic_deprecated_spellings(cls):
    torch.manual_seed(0)
    actor, critic = onp.discrete_actor(), onp.critic()
    batch = onp.discrete_batch(type("L", (), {"actor_network": actor})(), (B,))
    with pytest.warns(DeprecationWarning):
        loss = cls(actor=actor, critic=critic, advantage_key="adv", value_target_key="vt")
    assert loss.actor_network is actor and loss.critic_network is critic
    assert (loss.tensor_keys.advantage, loss.tensor_keys.value_target) == ("adv", "vt")
    out = loss(batch.clone())
    assert all(torch.isfinite(v) for k, v in out.items() if k.startswith("loss_"))
    with pytest.raises(TypeError, match="both given"):
        cls(actor, critic, actor=actor)


def _ppo_batch(loss, shape=(B,)):
    td = onp.continuous_batch(loss, shape)
    td["advantage"] = torch.randn(*shape, 1)
    td["value_target"] = torch.randn(*shape, 1)
    return td


@pytest.mark.parametrize("cls", [PPOLoss, ClipPPOLoss, KLPENPPOLoss])
def test_ppo_delay_actor_uses_the_proximal_policy(cls):
    torch.manual_seed(0)
    loss = cls(onp.actor(onp.IndependentNormal), onp.critic(), delay_actor=True, entropy_bonus=False)
    assert set(loss.target_actor_network_params.keys(True, True)) == set(loss.actor_network_params.keys(True, True))
    batch = _ppo_batch(loss)
    with torch.no_grad():  # the online actor moves away from its proximal copy
        for p in loss.actor_network.parameters():
            p.add_(0.2 * torch.randn_like(p))
    out = loss(batch.clone())
    action, adv = batch["action"], batch["advantage"][..., 0]
    pi = loss.actor_network.get_dist(batch.select("observation")).log_prob(action)
    prox = loss.target_actor_network.get_dist(batch.select("observation")).log_prob(action).detach()
    r, w = (pi - prox).exp(), (prox - batch["action_log_prob"]).exp()
    if cls is ClipPPOLoss:
        gain = torch.minimum(r * adv, r.clamp(0.8, 1.2) * adv)
        expected = -(w * gain).mean()
    elif cls is KLPENPPOLoss:
        prox_dist = loss.target_actor_network.get_dist(batch.select("observation"))
        kl = torch.distributions.kl_divergence(prox_dist, loss.actor_network.get_dist(batch.select("observation")))
        expected = -(w * r * adv - kl).mean()  # beta = 1
    else:
        expected = -(w * r * adv).mean()
    torch.testing.assert_close(out["loss_objective"], expected)
    torch.testing.assert_close(out["kl_approx"], (prox - pi).mean().detach())
    plain = cls(loss.actor_network, loss.critic_network, entropy_bonus=False)(batch.clone())
    # PPOLoss's surrogate (π_prox/π_behav)·(π/π_prox)·A is the plain one; its diagnostics differ
    key = "kl_approx" if cls is PPOLoss else "loss_objective"
    assert not torch.allclose(plain[key], out[key])


def test_ppo_max_importance_ratio_caps_the_behaviour_ratio_keeping_a_gradient():
    torch.manual_seed(0)
    loss = PPOLoss(onp.actor(), onp.critic(), max_importance_ratio=2.0, entropy_bonus=False)
    batch = _ppo_batch(loss)
    batch["action_log_prob"] = batch["action_log_prob"] - torch.tensor([5.0, 0, 0, 5.0, 0, 0])  # ratios e^5 > 2
    out = loss(batch.clone())
    pi = loss.actor_network.get_dist(batch.select("observation")).log_prob(batch["action"])
    ratio = (pi - batch["action_log_prob"]).exp().detach()
    expected = -(ratio.clamp(max=2.0) * batch["advantage"][..., 0]).mean()
    torch.testing.assert_close(out["loss_objective"], expected)
    out["loss_objective"].backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in loss.actor_network.parameters())
    with pytest.raises(ValueError, match="max_importance_ratio must be > 0"):
        PPOLoss(onp.actor(), onp.critic(), max_importance_ratio=0.0)


@pytest.mark.parametrize("cls", [A2CLoss, ClipPPOLoss])
def test_advantage_norm_rescales_by_the_return_statistics(cls):
    torch.manual_seed(0)
    norm = PercentileValueNorm()
    loss = cls(onp.actor(), onp.critic(), advantage_norm=norm, entropy_bonus=False)
    batch = onp.continuous_batch(loss, (4, 5))
    loss(batch.clone())  # the loss runs GAE: the statistics see the value targets
    scale = norm.scale().clone()
    assert scale != PercentileValueNorm().scale()
    given = _ppo_batch(loss)
    plain = cls(loss.actor_network, loss.critic_network, entropy_bonus=False)
    scaled = given.clone()
    scaled["advantage"] = given["advantage"] / scale
    out = loss(given.clone())  # the batch has an advantage: no update
    torch.testing.assert_close(norm.scale(), scale)
    torch.testing.assert_close(out["loss_objective"], plain(scaled)["loss_objective"])
    if cls is ClipPPOLoss:
        with pytest.raises(ValueError, match="exclusive"):
            cls(onp.actor(), onp.critic(), advantage_norm=norm, normalize_advantage=True)


@pytest.mark.parametrize("cls", [ClipPPOLoss, KLPENPPOLoss, PPOLoss])
def test_ppo_device_places_the_loss_buffers_only(cls):
    loss = cls(onp.actor(), onp.critic(), device="meta")
    assert all(b.device.type == "meta" for b in loss._buffers.values())
    assert all(p.device.type == "cpu" for p in loss.actor_network.parameters())


# ------------------------------------------------------------------ updaters, distance_loss
@pytest.mark.parametrize("updater", [SoftUpdate, HardUpdate])
def test_updaters_take_loss_module_by_name(updater):
    loss = DQNLoss(vb.q_network(), action_space="categorical")
    kw = {"eps": 0.5} if updater is SoftUpdate else {"value_network_update_interval": 1}
    up = updater(loss_module=loss, **kw)
    with torch.no_grad():
        for p in loss.value_network.parameters():
            p.add_(1.0)
    up.step()
    on, tg = loss.value_network_params, loss.target_value_network_params
    frac = 0.5 if updater is SoftUpdate else 1.0
    for key in on.keys(True, True):
        torch.testing.assert_close(tg[key], on[key] - (1 - frac))


def test_distance_loss_strict_shape():
    a, b = torch.zeros(3, 1), torch.arange(2.0)
    with pytest.raises(ValueError, match="strict_shape=False"):
        distance_loss(a, b)
    torch.testing.assert_close(distance_loss(a, b, "l1", strict_shape=False), b.expand(3, 2))
    assert math.isclose(float(distance_loss(a, b, strict_shape=False).sum()), 3.0)
