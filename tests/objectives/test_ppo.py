"""PPOLoss / ClipPPOLoss / KLPENPPOLoss against a hand-written reference, PPO invariants,
the estimator path and bad input. (The loss battery covers gradient routing, compile,
state_dict and determinism over ``cases_onpolicy.CASES``.)"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributions as D
from torch import nn
from torch.nn import functional as F

from steersman.modules.distributions import IndependentNormal
from steersman.objectives import ClipPPOLoss, KLPENPPOLoss, PPOLoss, ValueEstimators, total_loss
from steersman.objectives.value import vec_generalized_advantage_estimate
from steersman.tensordict import TensorDict
from steersman.tensordict.nn import (
    NormalParamExtractor,
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
)

OBS, ACT, H = 3, 2, 8


class Nets:
    """A Gaussian actor and a critic, plus the raw modules the reference uses."""

    def __init__(self, seed: int = 0, distribution=IndependentNormal) -> None:
        torch.manual_seed(seed)
        self.pi = nn.Sequential(nn.Linear(OBS, H), nn.Tanh(), nn.Linear(H, 2 * ACT))
        self.ext = NormalParamExtractor()
        self.v = nn.Sequential(nn.Linear(OBS, H), nn.Tanh(), nn.Linear(H, 1))
        self.actor = ProbabilisticTensorDictSequential(
            TensorDictModule(nn.Sequential(self.pi, self.ext), ["observation"], ["loc", "scale"]),
            ProbabilisticTensorDictModule(["loc", "scale"], ["action"], distribution, return_log_prob=True),
        )
        self.critic = TensorDictModule(self.v, ["observation"], ["state_value"])

    def params(self) -> list[torch.Tensor]:
        return [*self.pi.parameters(), *self.v.parameters()]

    def normal(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.ext(self.pi(obs))

    def batch(self, shape=(16,), ratio_noise: float = 0.5, seed: int = 1) -> TensorDict:
        g = torch.Generator().manual_seed(seed)
        obs = torch.randn(*shape, OBS, generator=g)
        with torch.no_grad():
            loc, scale = self.normal(obs)
            action = loc + scale * torch.randn(loc.shape, generator=g)
            logp = D.Normal(loc, scale).log_prob(action).sum(-1)
        return TensorDict(
            {
                "observation": obs,
                "action": action,
                "action_log_prob": logp + ratio_noise * torch.randn(logp.shape, generator=g),
                "loc": loc + 0.2 * torch.randn(loc.shape, generator=g),
                "scale": scale * 1.2,
                "advantage": torch.randn(*shape, 1, generator=g),
                "value_target": torch.randn(*shape, 1, generator=g),
                "state_value": torch.randn(*shape, 1, generator=g),
            },
            list(shape),
        )


def grads(total: torch.Tensor, params: list[torch.Tensor]) -> list[torch.Tensor]:
    return list(torch.autograd.grad(total, params, allow_unused=True, materialize_grads=True))


def reference_terms(nets: Nets, td: TensorDict, objective, ent_coef=0.01, crit_coef=1.0, critic_type="smooth_l1"):
    """Independent, plain-torch PPO terms; ``objective(ratio, adv, loc, scale)`` is the per-sample gain."""
    obs, action = td["observation"], td["action"]
    loc, scale = nets.normal(obs)
    normal = D.Normal(loc, scale)
    logp = normal.log_prob(action).sum(-1)
    ratio = torch.exp(logp - td["action_log_prob"])
    adv = td["advantage"].squeeze(-1)
    value = nets.v(obs)
    crit = {"smooth_l1": F.smooth_l1_loss, "l2": F.mse_loss, "l1": F.l1_loss}[critic_type]
    return {
        "loss_objective": -objective(ratio, adv, loc, scale).mean(),
        "loss_entropy": -ent_coef * normal.entropy().sum(-1).mean(),
        "loss_critic": crit_coef * crit(value, td["value_target"]),
    }


def assert_matches_reference(loss, nets, td, ref):
    out = loss(td)
    for key, value in ref.items():
        torch.testing.assert_close(out[key], value, msg=key)
    for got, want in zip(grads(total_loss(out), nets.params()), grads(sum(ref.values()), nets.params())):
        torch.testing.assert_close(got, want)
    return out


# ---------------------------------------------------------------- reference comparisons
@pytest.mark.parametrize("shape", [(16,), (4, 5)])
def test_ppo_loss_matches_reference(shape):
    nets = Nets()
    td = nets.batch(shape)
    loss = PPOLoss(nets.actor, nets.critic, entropy_coeff=0.05, critic_coeff=0.7, loss_critic_type="l2")
    ref = reference_terms(nets, td, lambda r, a, *_: r * a, ent_coef=0.05, crit_coef=0.7, critic_type="l2")
    out = assert_matches_reference(loss, nets, td, ref)
    with torch.no_grad():
        loc, scale = nets.normal(td["observation"])
        logp = D.Normal(loc, scale).log_prob(td["action"]).sum(-1)
    torch.testing.assert_close(out["kl_approx"], (td["action_log_prob"] - logp).mean())
    with torch.no_grad():
        v, target = nets.v(td["observation"]), td["value_target"]
    ev = 1 - ((target - v) - (target - v).mean()).pow(2).mean() / (target - target.mean()).pow(2).mean()
    torch.testing.assert_close(out["explained_variance"], ev)


@pytest.mark.parametrize("eps", [0.1, 0.3])
def test_clip_ppo_matches_reference(eps):
    nets = Nets()
    td = nets.batch()
    loss = ClipPPOLoss(nets.actor, nets.critic, clip_epsilon=eps)

    def clipped(r, a, *_):
        return torch.min(r * a, r.clamp(1 - eps, 1 + eps) * a)

    out = assert_matches_reference(loss, nets, td, reference_terms(nets, td, clipped))
    with torch.no_grad():
        loc, scale = nets.normal(td["observation"])
        ratio = (D.Normal(loc, scale).log_prob(td["action"]).sum(-1) - td["action_log_prob"]).exp()
    frac = ((ratio < 1 - eps) | (ratio > 1 + eps)).float().mean()
    torch.testing.assert_close(out["clip_fraction"], frac)
    assert 0 < frac < 1  # the batch exercises both regions
    ess = ratio.sum() ** 2 / (ratio**2).sum() / ratio.numel()
    torch.testing.assert_close(out["ESS"], ess)


def test_klpen_matches_reference_and_uses_previous_beta():
    nets = Nets()
    td = nets.batch()
    loss = KLPENPPOLoss(nets.actor, nets.critic, beta=0.7, dtarg=0.01)

    def penalized(r, a, loc, scale):
        m0, s0 = td["loc"], td["scale"]
        kl = (torch.log(scale / s0) + (s0**2 + (m0 - loc) ** 2) / (2 * scale**2) - 0.5).sum(-1)
        return r * a - 0.7 * kl

    out = assert_matches_reference(loss, nets, td, reference_terms(nets, td, penalized))
    assert out["kl"] > 1.5 * 0.01
    torch.testing.assert_close(loss.beta, torch.tensor(1.4))  # increment=2 after this call


def test_clip_value_matches_reference():
    nets = Nets()
    td = nets.batch()
    loss = ClipPPOLoss(nets.actor, nets.critic, clip_value=0.1, entropy_bonus=False)
    out = loss(td)
    v = nets.v(td["observation"])
    old, target = td["state_value"], td["value_target"]
    clipped = old + (v - old).clamp(-0.1, 0.1)
    ref = torch.max(F.smooth_l1_loss(v, target, reduction="none"), F.smooth_l1_loss(clipped, target, reduction="none")).mean()
    torch.testing.assert_close(out["loss_critic"], ref)
    torch.testing.assert_close(out["value_clip_fraction"], ((v - old).abs() > 0.1).float().mean())
    assert ClipPPOLoss(nets.actor, nets.critic, clip_value=True).clip_value == 0.2


def test_reduction_none_and_sum():
    nets = Nets()
    td = nets.batch((4, 5))
    per_sample = ClipPPOLoss(nets.actor, nets.critic, reduction="none")(td)
    for key in ("loss_objective", "loss_entropy", "loss_critic"):
        assert per_sample[key].shape == (4, 5)
    summed = ClipPPOLoss(nets.actor, nets.critic, reduction="sum")(td)
    torch.testing.assert_close(summed["loss_objective"], per_sample["loss_objective"].sum())


# --------------------------------------------------------------------------- invariants
def on_policy(nets: Nets, td: TensorDict) -> TensorDict:
    """The batch as collected by the current policy: ratio = 1."""
    with torch.no_grad():
        loc, scale = nets.normal(td["observation"])
        td["action_log_prob"] = D.Normal(loc, scale).log_prob(td["action"]).sum(-1)
    return td


@pytest.mark.parametrize("cls", [PPOLoss, ClipPPOLoss])
def test_first_epoch_is_the_policy_gradient(cls):
    nets = Nets()
    td = on_policy(nets, nets.batch())
    out = cls(nets.actor, nets.critic)(td)
    adv = td["advantage"].squeeze(-1)
    torch.testing.assert_close(out["loss_objective"], -adv.mean())
    loc, scale = nets.normal(td["observation"])
    logp = D.Normal(loc, scale).log_prob(td["action"]).sum(-1)
    pg = -(logp * adv).mean()
    params = list(nets.pi.parameters())
    for got, want in zip(grads(out["loss_objective"], params), grads(pg, params)):
        torch.testing.assert_close(got, want)


def test_clipped_region_has_zero_gradient():
    nets = Nets()
    td = on_policy(nets, nets.batch())
    adv = td["advantage"]
    # ratio 1.5 where A > 0 and 0.5 where A < 0: all on the clipped side of ε = 0.2
    td["action_log_prob"] = td["action_log_prob"] - torch.where(adv[..., 0] > 0, math.log(1.5), math.log(0.5))
    loss = ClipPPOLoss(nets.actor, nets.critic, clip_epsilon=0.2)
    out = loss(td)
    assert out["clip_fraction"] == 1
    assert all(g.abs().max() == 0 for g in grads(out["loss_objective"], list(nets.pi.parameters())))
    # the other side (A > 0 with ratio 0.5) is not clipped by the min: gradient flows
    td2 = on_policy(nets, nets.batch())
    td2["advantage"] = td2["advantage"].abs()
    td2["action_log_prob"] = td2["action_log_prob"] - math.log(0.5)
    out2 = loss(td2)
    assert any(g.abs().max() > 0 for g in grads(out2["loss_objective"], list(nets.pi.parameters())))


@pytest.mark.parametrize(
    "shift, expected",
    [(0.0, 0.5), (0.5, 2.0)],  # no KL -> β * decrement; large KL -> β * increment
)
def test_klpen_beta_adaptation(shift, expected):
    nets = Nets()
    td = nets.batch()
    with torch.no_grad():
        loc, scale = nets.normal(td["observation"])
    td["loc"], td["scale"] = loc + shift, scale
    loss = KLPENPPOLoss(nets.actor, nets.critic, beta=1.0, dtarg=0.01, increment=2.0, decrement=0.5)
    loss(td)
    torch.testing.assert_close(loss.beta, torch.tensor(expected))


def test_klpen_beta_unchanged_within_the_band():
    nets = Nets()
    td = nets.batch()
    with torch.no_grad():
        loc, scale = nets.normal(td["observation"])
    # KL of a mean shift δ per dim (unit-free: δ²/(2σ²) summed over ACT dims) ≈ dtarg
    td["loc"], td["scale"] = loc + scale * math.sqrt(0.01 / ACT * 2), scale
    loss = KLPENPPOLoss(nets.actor, nets.critic, beta=1.0, dtarg=0.01)
    out = loss(td)
    assert 0.01 / 1.5 < out["kl"] < 0.01 * 1.5
    torch.testing.assert_close(loss.beta, torch.tensor(1.0))


def test_klpen_monte_carlo_kl_without_closed_form():
    """TanhNormal has no registered KL: samples_mc_kl draws from the old distribution."""
    from steersman.tensordict.nn import TanhNormal

    nets = Nets(distribution=TanhNormal)
    td = nets.batch()
    td["action"] = td["action"].tanh() * 0.99
    loss = KLPENPPOLoss(nets.actor, nets.critic, samples_mc_kl=64, increment=1.0, decrement=1.0)
    torch.manual_seed(0)
    out = loss(td)
    assert torch.isfinite(out["kl"]) and out["kl"] > 0
    total_loss(out).backward()


@pytest.mark.parametrize("shape", [(1,), (1, 1)])
def test_normalize_advantage_minibatch_of_one_is_finite(shape):
    nets = Nets()
    td = nets.batch(shape)
    out = ClipPPOLoss(nets.actor, nets.critic, normalize_advantage=True)(td)
    assert all(torch.isfinite(v).all() for v in out.values())


def test_normalize_advantage_exclude_dims():
    nets = Nets()
    td = on_policy(nets, nets.batch((3, 5)))
    td["advantage"] = td["advantage"] * torch.tensor([1.0, 10.0, 100.0]).view(3, 1, 1) + 7
    loss = PPOLoss(nets.actor, nets.critic, normalize_advantage=True, normalize_advantage_exclude_dims=(0,))
    out = loss(td)
    adv = td["advantage"][..., 0]
    norm = (adv - adv.mean(1, keepdim=True)) / adv.std(1, keepdim=True)
    torch.testing.assert_close(out["loss_objective"], -norm.mean())


def test_entropy_falls_back_to_monte_carlo():
    def tanh_normal(loc, scale):
        base = D.Independent(D.Normal(loc, scale, validate_args=False), 1)
        return D.TransformedDistribution(base, [D.TanhTransform(cache_size=1)], validate_args=False)

    nets = Nets(distribution=tanh_normal)
    td = nets.batch()
    td["action"] = td["action"].tanh() * 0.99
    loss = ClipPPOLoss(nets.actor, nets.critic, samples_mc_entropy=3, entropy_coeff=0.1)
    torch.manual_seed(5)
    out = loss(td)
    torch.manual_seed(5)
    loc, scale = nets.normal(td["observation"])
    dist = tanh_normal(loc, scale)
    expected = -dist.log_prob(dist.rsample((3,))).mean(0)
    torch.testing.assert_close(out["loss_entropy"], -0.1 * expected.mean())
    assert grads(out["loss_entropy"], list(nets.pi.parameters()))[0].abs().sum() > 0


# ------------------------------------------------------------------------ estimator path
def rollout_batch(nets: Nets, shape=(3, 7)) -> TensorDict:
    td = nets.batch(shape).exclude("advantage", "value_target", "state_value")
    g = torch.Generator().manual_seed(3)
    done = torch.rand(*shape, 1, generator=g) < 0.3
    term = done & (torch.rand(*shape, 1, generator=g) < 0.5)
    td["next"] = TensorDict(
        {
            "observation": torch.randn(*shape, OBS, generator=g),
            "reward": torch.randn(*shape, 1, generator=g),
            "done": done,
            "terminated": term,
            "truncated": done & ~term,
        },
        list(shape),
    )
    return td


def test_advantage_computed_by_gae_when_absent():
    nets = Nets()
    td = rollout_batch(nets)
    loss = ClipPPOLoss(nets.actor, nets.critic).make_value_estimator(ValueEstimators.GAE, gamma=0.9, lmbda=0.8)
    out = loss(td)
    assert "advantage" not in td.keys()  # the caller's batch is left alone
    with torch.no_grad():
        v, nv = nets.v(td["observation"]), nets.v(td["next", "observation"])
    nxt = td["next"]
    adv, target = vec_generalized_advantage_estimate(0.9, 0.8, v, nv, nxt["reward"], nxt["done"], nxt["terminated"])
    td_explicit = td.clone()
    td_explicit["advantage"], td_explicit["value_target"] = adv, target
    expected = loss(td_explicit)
    for key in ("loss_objective", "loss_critic", "loss_entropy"):
        torch.testing.assert_close(out[key], expected[key])
    # the estimator gives the actor no gradient through the advantage
    params = list(nets.v.parameters())
    assert all(g.abs().max() == 0 for g in grads(out["loss_objective"], params))


def test_gamma_shortcut_and_set_keys_forwarding():
    nets = Nets()
    loss = PPOLoss(nets.actor, nets.critic, gamma=0.5)
    assert loss.value_estimator.gamma == 0.5
    loss.set_keys(value="v", reward="r")
    assert loss.value_estimator.tensor_keys.value == "v"
    assert loss.value_estimator.tensor_keys.reward == "r"


def test_log_prob_key_via_set_keys():
    nets = Nets()
    td = nets.batch()
    ref = ClipPPOLoss(nets.actor, nets.critic)(td)
    td["old_log_prob"] = td.pop("action_log_prob")
    loss = ClipPPOLoss(nets.actor, nets.critic).set_keys(sample_log_prob="old_log_prob")
    torch.testing.assert_close(loss(td)["loss_objective"], ref["loss_objective"])


def test_coefficient_spellings():
    nets = Nets()
    loss = ClipPPOLoss(nets.actor, nets.critic, entropy_coef=0.3, critic_coef=0.2)
    assert (loss.entropy_coeff, loss.critic_coeff, loss.entropy_coef) == (0.3, 0.2, 0.3)
    with pytest.raises(TypeError, match="not both"):
        ClipPPOLoss(nets.actor, nets.critic, entropy_coef=0.3, entropy_coeff=0.3)
    out = ClipPPOLoss(nets.actor, None, critic_coeff=None)(nets.batch())
    assert "loss_critic" not in out.keys()
    out = ClipPPOLoss(nets.actor, nets.critic, critic_coef=None, entropy_bonus=False)(nets.batch())
    assert set(out.keys()) == {"loss_objective", "kl_approx", "clip_fraction", "ESS"}


# ------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "name,key", [("action", "action"), ("sample_log_prob", "action_log_prob"), ("value_target", "value_target")]
)
def test_missing_key_error(name, key):
    nets = Nets()
    td = nets.batch().exclude(key)
    with pytest.raises(KeyError, match=rf"ClipPPOLoss needs '{key}'.*set_keys\({name}=<your key>\)"):
        ClipPPOLoss(nets.actor, nets.critic)(td)


def test_reward_without_trailing_dim_is_an_error():
    nets = Nets()
    td = rollout_batch(nets)
    td["next", "reward"] = td["next", "reward"][..., 0]
    with pytest.raises(ValueError, match=r"'reward'\) has shape \[3, 7\].*expected \[3, 7, 1\]"):
        ClipPPOLoss(nets.actor, nets.critic)(td)


def test_advantage_without_trailing_dim_is_an_error():
    nets = Nets()
    td = nets.batch()
    td["advantage"] = td["advantage"][..., 0]
    with pytest.raises(ValueError, match=r"'advantage' has shape \[16\], expected \[16, 1\]"):
        ClipPPOLoss(nets.actor, nets.critic)(td)


def test_critic_with_wrong_output_shape_is_an_error():
    nets = Nets()
    critic = TensorDictModule(nn.Linear(OBS, 2), ["observation"], ["state_value"])
    with pytest.raises(ValueError, match=r"critic wrote 'state_value' of shape \[16, 2\], expected \[16, 1\]"):
        ClipPPOLoss(nets.actor, critic)(nets.batch())


def test_log_prob_not_summed_over_action_dims_is_an_error():
    nets = Nets(distribution=D.Normal)
    with pytest.raises(ValueError, match=r"log-probabilities must have the batch shape \[16\]; got \[16, 2\]"):
        ClipPPOLoss(nets.actor, nets.critic)(nets.batch())


def test_sample_log_prob_with_grad_is_an_error():
    nets = Nets()
    td = nets.batch()
    td["action_log_prob"] = td["action_log_prob"].requires_grad_(True)
    with pytest.raises(RuntimeError, match="requires grad"):
        ClipPPOLoss(nets.actor, nets.critic)(td)


def test_klpen_needs_stored_distribution_parameters():
    nets = Nets()
    loss = KLPENPPOLoss(nets.actor, nets.critic)
    with pytest.raises(KeyError, match="distribution parameters"):
        loss(nets.batch().exclude("loc"))
    torch.testing.assert_close(loss.beta, torch.tensor(1.0))


def test_constructor_validation():
    nets = Nets()
    with pytest.raises(ValueError, match="clip_epsilon"):
        ClipPPOLoss(nets.actor, nets.critic, clip_epsilon=1.5)
    with pytest.raises(ValueError, match="loss_critic_type"):
        PPOLoss(nets.actor, nets.critic, loss_critic_type="huber")
    with pytest.raises(TypeError, match="must build a distribution"):
        PPOLoss(nets.critic, nets.critic)
    with pytest.raises(ValueError, match="critic_network is required"):
        PPOLoss(nets.actor)


DIAGNOSTICS = {
    PPOLoss: {"entropy", "kl_approx", "explained_variance"},
    ClipPPOLoss: {"entropy", "kl_approx", "explained_variance", "clip_fraction", "ESS"},
    KLPENPPOLoss: {"entropy", "kl_approx", "explained_variance", "kl"},
}


@pytest.mark.parametrize("cls", [PPOLoss, ClipPPOLoss, KLPENPPOLoss])
def test_diagnostics_off_gives_the_same_loss_terms_and_gradients(cls):
    nets = Nets()
    td = nets.batch()
    full = cls(nets.actor, nets.critic)
    lean = cls(nets.actor, nets.critic, diagnostics=False)
    out_full, out_lean = full(td), lean(td)
    losses = {k for k in out_full.keys() if k.startswith("loss_")}
    assert set(out_lean.keys()) == losses
    assert set(out_full.keys()) == losses | DIAGNOSTICS[cls]
    for key in losses:
        torch.testing.assert_close(out_lean[key], out_full[key], msg=key)
    for got, want in zip(grads(total_loss(out_lean), nets.params()), grads(total_loss(out_full), nets.params())):
        torch.testing.assert_close(got, want)
    if cls is KLPENPPOLoss:  # beta adapts without the "kl" output too
        torch.testing.assert_close(lean.beta, full.beta)
        assert lean.beta != 1.0


@pytest.mark.parametrize("cls", [PPOLoss, ClipPPOLoss, KLPENPPOLoss])
def test_diagnose_returns_every_diagnostic_without_grad_or_state_change(cls):
    nets = Nets()
    td = nets.batch()
    loss = cls(nets.actor, nets.critic, diagnostics=False)
    before = td.clone()
    out = loss.diagnose(td)
    assert DIAGNOSTICS[cls] <= set(out.keys())
    assert not any(v.requires_grad for v in out.values())
    torch.testing.assert_close(out["kl_approx"], cls(nets.actor, nets.critic)(td)["kl_approx"])
    assert (td == before).all()
    if cls is KLPENPPOLoss:
        torch.testing.assert_close(loss.beta, torch.tensor(1.0))
