"""TorchRL-parity helpers of ``steersman.objectives``: V-trace, the TD estimators' old names,
``next_state_value``, ``hold_out_*``, ``group_optimizers``, ``KLAdaptiveLR`` and the
symlog / two-hot helpers, each against a plain reference."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from steersman.objectives import (
    AUTO_LOSS_MASK_KEYS,
    KLAdaptiveLR,
    TD0Estimate,
    TD0Estimator,
    TD1Estimate,
    TD1Estimator,
    TDLambdaEstimate,
    TDLambdaEstimator,
    VTrace,
    group_optimizers,
    hold_out_net,
    hold_out_params,
    next_state_value,
    symexp,
    symlog,
    two_hot_cross_entropy,
    two_hot_decode,
    two_hot_encode,
)
from steersman.objectives.value.functional import vtrace_advantage_estimate
from steersman.tensordict import TensorDict
from steersman.tensordict.nn import (
    OneHotCategorical,
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
)


# ------------------------------------------------------------------ V-trace
def vtrace_reference(gamma, rho, c, value, next_value, reward, done, terminated):
    """The paper's recursion, one row and one step at a time (plain floats). Inputs [B, T]."""
    B, T = reward.shape
    vs, adv = torch.zeros(B, T), torch.zeros(B, T)
    for b in range(B):
        acc = 0.0  # v_{t+1} - V(s_{t+1}) inside the episode
        for t in reversed(range(T)):
            end = bool(done[b, t]) or t == T - 1
            if end:
                acc = 0.0
            alive = 0.0 if terminated[b, t] else 1.0
            delta = float(rho[b, t]) * (float(reward[b, t]) + gamma * alive * float(next_value[b, t]) - float(value[b, t]))
            acc = delta + gamma * float(c[b, t]) * acc
            vs[b, t] = float(value[b, t]) + acc
            next_v = float(next_value[b, t]) if end else float(vs[b, t + 1])
            adv[b, t] = float(rho[b, t]) * (float(reward[b, t]) + gamma * alive * next_v - float(value[b, t]))
    return adv, vs


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), T=st.integers(1, 7), gamma=st.floats(0.0, 1.0))
def test_vtrace_matches_the_papers_recursion(seed, T, gamma):
    g = torch.Generator().manual_seed(seed)
    B = 3
    reward, value, next_value = (torch.randn(B, T, generator=g) for _ in range(3))
    ratio = torch.rand(B, T, generator=g) * 2
    done = torch.rand(B, T, generator=g) < 0.3
    terminated = done & (torch.rand(B, T, generator=g) < 0.5)
    rho, c = ratio.clamp(max=1.0), ratio.clamp(max=0.8)
    adv, vs = vtrace_advantage_estimate(
        gamma, rho[..., None], c[..., None], value[..., None], next_value[..., None],
        reward[..., None], done[..., None], terminated[..., None],
    )
    ref_adv, ref_vs = vtrace_reference(gamma, rho, c, value, next_value, reward, done, terminated)
    torch.testing.assert_close(vs[..., 0], ref_vs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(adv[..., 0], ref_adv, atol=1e-5, rtol=1e-5)


def _actor():
    return ProbabilisticTensorDictSequential(
        TensorDictModule(torch.nn.Linear(3, 2), ["obs"], ["logits"]),
        ProbabilisticTensorDictModule(["logits"], ["action"], OneHotCategorical),
    )


def _trajectory(B=2, T=6):
    done = torch.zeros(B, T, 1, dtype=torch.bool)
    done[:, 2] = True
    terminated = torch.zeros_like(done)
    terminated[0, 2] = True
    return TensorDict({
        "obs": torch.randn(B, T, 3), "action": torch.eye(2)[torch.randint(2, (B, T))],
        "state_value": torch.randn(B, T, 1),
        "next": {"state_value": torch.randn(B, T, 1), "reward": torch.randn(B, T, 1),
                 "done": done, "terminated": terminated},
    }, [B, T])


@pytest.mark.parametrize("rho_thresh,c_thresh", [(1.0, 1.0), (0.5, 2.0)])
def test_vtrace_estimator_reads_the_policies_and_clips_the_ratios(rho_thresh, c_thresh):
    torch.manual_seed(0)
    actor, td = _actor(), _trajectory()
    with torch.no_grad():
        log_pi = actor.get_dist(td.copy()).log_prob(td["action"])              # [B, T]
    td["action_log_prob"] = log_pi - torch.randn_like(log_pi)                   # an off-policy behaviour
    out = VTrace(gamma=0.9, actor_network=actor, value_network=None, rho_thresh=rho_thresh, c_thresh=c_thresh)(td.clone())
    ratio = (log_pi - td["action_log_prob"]).exp()
    ref_adv, ref_vs = vtrace_reference(
        0.9, ratio.clamp(max=rho_thresh), ratio.clamp(max=c_thresh), td["state_value"][..., 0],
        td["next", "state_value"][..., 0], td["next", "reward"][..., 0], td["next", "done"][..., 0],
        td["next", "terminated"][..., 0],
    )
    torch.testing.assert_close(out["value_target"][..., 0], ref_vs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["advantage"][..., 0], ref_adv, atol=1e-5, rtol=1e-5)
    assert not out["advantage"].requires_grad


def test_vtrace_on_policy_is_the_td1_target():
    """With π = μ and thresholds >= 1 every weight is 1: V-trace is the TD(1) return (for
    values consistent along the trajectory: V(sₜ₊₁) read at t + 1 is the next value at t)."""
    torch.manual_seed(1)
    actor, td = _actor(), _trajectory()
    td["state_value"][:, 1:] = td["next", "state_value"][:, :-1]
    with torch.no_grad():
        td["action_log_prob"] = actor.get_dist(td.copy()).log_prob(td["action"])
    vt = VTrace(gamma=0.8, actor_network=actor, value_network=None)(td.clone())
    td1 = TD1Estimator(gamma=0.8)(td.clone())
    torch.testing.assert_close(vt["value_target"], td1["value_target"], atol=1e-5, rtol=1e-5)


def test_vtrace_with_a_critic_average_adv_and_bad_input():
    torch.manual_seed(2)
    actor, td = _actor(), _trajectory().exclude("state_value", ("next", "state_value"))
    critic = TensorDictModule(torch.nn.Linear(3, 1), ["obs"], ["state_value"])
    td["next", "obs"] = torch.randn(2, 6, 3)
    td["action_log_prob"] = torch.full((2, 6), -0.7)
    out = VTrace(gamma=0.9, actor_network=actor, value_network=critic, average_adv=True)(td.clone())
    adv = out["advantage"]
    assert abs(adv.mean().item()) < 1e-5 and abs(adv.std().item() - 1) < 1e-4
    with pytest.raises(KeyError, match="action_log_prob.*set_keys"):
        VTrace(gamma=0.9, actor_network=actor, value_network=critic)(td.exclude("action_log_prob"))
    with pytest.raises(ValueError, match="rho_thresh"):
        VTrace(gamma=0.9, actor_network=actor, value_network=critic, rho_thresh=0.0)


def test_td_estimators_old_names_are_the_same_classes():
    assert (TD0Estimate, TD1Estimate, TDLambdaEstimate) == (TD0Estimator, TD1Estimator, TDLambdaEstimator)
    td = _trajectory()
    a = TDLambdaEstimate(gamma=0.9, lmbda=0.7)(td.clone())["value_target"]
    b = TDLambdaEstimator(gamma=0.9, lmbda=0.7)(td.clone())["value_target"]
    assert torch.equal(a, b)
    assert AUTO_LOSS_MASK_KEYS == (("collector", "mask"), "shifted_valid")


# ------------------------------------------------------------------ next_state_value
def test_next_state_value_bootstraps_only_non_terminal_steps():
    td = TensorDict({"next": {"reward": torch.tensor([[1.0], [2.0], [3.0]]),
                              "done": torch.tensor([[False], [True], [True]]),
                              "terminated": torch.tensor([[False], [True], [False]])},
                     "steps_to_next_obs": torch.tensor([[1], [2], [3]])}, [3])
    v = torch.tensor([10.0, 20.0, 40.0])
    expected = torch.tensor([1 + 0.5 * 10, 2.0, 3 + 0.5**3 * 40])
    torch.testing.assert_close(next_state_value(td, gamma=0.5, pred_next_val=v), expected)
    torch.testing.assert_close(next_state_value(td, gamma=0.5, pred_next_val=v[:, None]), expected)
    # through an operator on td["next"] (no gradient)
    td["next", "obs"] = torch.ones(3, 2)
    net = TensorDictModule(torch.nn.Linear(2, 1), ["obs"], ["state_action_value"])
    got = next_state_value(td.exclude("steps_to_next_obs"), operator=net, gamma=0.5)
    ref = td["next", "reward"][:, 0] + 0.5 * torch.tensor([1.0, 0.0, 1.0]) * net.module(torch.ones(3, 2))[:, 0]
    torch.testing.assert_close(got, ref.detach())
    assert not got.requires_grad
    with pytest.raises(ValueError, match="expected the batch shape"):
        next_state_value(td, pred_next_val=torch.zeros(3, 2))


# ------------------------------------------------------------------ hold_out_*, group_optimizers
def test_hold_out_net_freezes_and_restores_even_on_error():
    net = torch.nn.Linear(2, 1)
    net.bias.requires_grad_(False)
    with pytest.raises(RuntimeError, match="boom"):
        with hold_out_net(net):
            assert not any(p.requires_grad for p in net.parameters())
            assert not net(torch.ones(1, 2)).requires_grad
            raise RuntimeError("boom")
    assert net.weight.requires_grad and not net.bias.requires_grad
    with hold_out_params(net.parameters()) as (w, b):
        assert not w.requires_grad and w.data_ptr() == net.weight.data_ptr()
    td = TensorDict({"w": torch.nn.Parameter(torch.ones(2))}, [])
    with hold_out_params(td) as held:
        assert not held["w"].requires_grad


def test_group_optimizers_steps_every_group_with_its_own_settings():
    torch.manual_seed(0)
    a_net, b_net = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
    a, b = torch.optim.SGD(a_net.parameters(), lr=0.1), torch.optim.SGD(b_net.parameters(), lr=0.5, momentum=0.9)
    grouped = group_optimizers(a, b)
    before = [p.detach().clone() for p in [*a_net.parameters(), *b_net.parameters()]]
    (a_net(torch.ones(1, 2)) + b_net(torch.ones(1, 2))).sum().backward()
    grouped.step()
    after = [*a_net.parameters(), *b_net.parameters()]
    for p0, p1, lr in zip(before, after, [0.1, 0.1, 0.5, 0.5]):
        torch.testing.assert_close(p1, p0 - lr * p1.grad)  # first step: momentum buffer = grad
    with pytest.raises(ValueError, match="one type"):
        group_optimizers(a, torch.optim.Adam(b_net.parameters()))


@pytest.mark.parametrize("kl,expected", [(0.05, 1e-3 / 2), (0.001, 2e-3), (0.01, 1e-3), (0.0, 1e-3)])
def test_kl_adaptive_lr_follows_the_band(kl, expected):
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    KLAdaptiveLR(opt, target_kl=0.01, factor=2.0).step(torch.tensor(kl))
    assert math.isclose(opt.param_groups[0]["lr"], expected)


def test_kl_adaptive_lr_clamps_and_rejects_bad_settings():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    sched = KLAdaptiveLR(opt, target_kl=0.01, min_lr=4e-4, max_lr=2e-3, factor=2.0)
    for _ in range(3):
        sched.step(1.0)
    assert opt.param_groups[0]["lr"] == 4e-4
    for _ in range(5):
        sched.step(1e-4)
    assert opt.param_groups[0]["lr"] == 2e-3
    with pytest.raises(ValueError, match="factor"):
        KLAdaptiveLR(opt, target_kl=0.01, factor=1.0)


# ------------------------------------------------------------------ symlog, two-hot
@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=8))
def test_symlog_symexp_against_math(xs):
    x = torch.tensor(xs, dtype=torch.float64)
    ref = torch.tensor([math.copysign(math.log1p(abs(v)), v) for v in xs], dtype=torch.float64)
    torch.testing.assert_close(symlog(x), ref)
    torch.testing.assert_close(symexp(symlog(x)), x)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-5, 5), min_size=1, max_size=8))
def test_two_hot_interpolates_inside_and_saturates_outside(xs):
    bins = torch.tensor([-2.0, -0.5, 0.0, 1.0, 3.0], dtype=torch.float64)
    x = torch.tensor(xs, dtype=torch.float64)
    w = two_hot_encode(x, bins)
    assert w.shape == (len(xs), 5)
    torch.testing.assert_close(w.sum(-1), torch.ones(len(xs), dtype=torch.float64))
    assert ((w > 0).sum(-1) <= 2).all()
    torch.testing.assert_close((w * bins).sum(-1), x.clamp(-2.0, 3.0))  # the expectation is x itself
    logits = torch.randn(len(xs), 5, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(two_hot_decode(logits, bins), (logits.softmax(-1) * bins).sum(-1))
    ce = two_hot_cross_entropy(logits, x, bins)
    torch.testing.assert_close(ce, -(w * logits.log_softmax(-1)).sum(-1))
    ce.sum().backward()
    assert logits.grad is not None
    with pytest.raises(ValueError, match="bins"):
        two_hot_encode(x, bins[None])
