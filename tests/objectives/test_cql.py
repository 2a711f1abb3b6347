"""CQLLoss: values and gradients against a plain-torch reference (the paper's CQL(H)), and
its invariants."""

from __future__ import annotations

import math

import pytest
import torch

from steersman.data import Bounded
from steersman.objectives import CQLLoss
from tests.objectives.cases_sac import (
    ACT,
    GAMMA,
    actor,
    continuous_batch,
    critic_ref,
    member,
    qvalue,
    smooth_l1,
    tanh_normal_log_prob_ref,
    tanh_normal_ref,
)


@pytest.fixture
def float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def repeat(x, r):
    """``[*B, F] -> [*B, r, F]``."""
    return x.unsqueeze(-2).expand(*x.shape[:-1], r, x.shape[-1])


def reference_cql(loss, batch, shape, cfg, low, high):
    """Draws the random numbers in the loss's order: next action (or ``R`` of them with
    ``max_q_backup``); uniform actions; ``R`` actions at s; ``R`` at s'; the actor's action."""
    r, temp, w_q = cfg["num_random"], cfg["temperature"], cfg["min_q_weight"]
    aw = list(loss.actor_network.parameters())
    qs = [member(loss.qvalue_network_params, i) for i in range(2)]
    targets = [member(loss.target_qvalue_network_params, i) for i in range(2)]
    alpha = loss.log_alpha.detach().exp()
    obs, act, nxt = batch["observation"], batch["action"], batch["next"]
    with torch.no_grad():
        if cfg["max_q_backup"]:
            nobs = repeat(nxt["observation"], r)
            a2, _ = tanh_normal_ref(aw, nobs, torch.randn(*shape, r, ACT))
            v2 = torch.stack([critic_ref(w, nobs, a2) for w in targets]).max(-2).values.min(0).values
        else:
            a2, logp2 = tanh_normal_ref(aw, nxt["observation"], torch.randn(*shape, ACT))
            v2 = torch.stack([critic_ref(w, nxt["observation"], a2) for w in targets]).min(0).values
            if not cfg["deterministic_backup"]:
                v2 = v2 - alpha * logp2.unsqueeze(-1)
        y = nxt["reward"] + GAMMA * (~nxt["terminated"]).double() * v2
    q = torch.stack([critic_ref(w, obs, act) for w in qs])  # [2, *B, 1]
    out = {"loss_qvalue": smooth_l1(q, y.expand_as(q)).sum(0).mean()}

    # conservative term, critic by critic
    obs_r = repeat(obs, r)
    rand_a = torch.rand(*shape, r, ACT) * (high - low) + low
    with torch.no_grad():
        a_cur, lp_cur = tanh_normal_ref(aw, obs_r, torch.randn(*shape, r, ACT))
        a_nxt, lp_nxt = tanh_normal_ref(aw, repeat(nxt["observation"], r), torch.randn(*shape, r, ACT))
    log_uniform = -ACT * math.log(high - low)
    gaps = []
    for i, wq in enumerate(qs):
        scores = torch.cat([
            critic_ref(wq, obs_r, rand_a) - log_uniform,
            critic_ref(wq, obs_r, a_nxt) - lp_nxt.unsqueeze(-1),
            critic_ref(wq, obs_r, a_cur) - lp_cur.unsqueeze(-1),
        ], -2)  # [*B, 3R, 1]
        lse = temp * torch.logsumexp(scores / temp, dim=-2)
        gaps.append(w_q * (lse - q[i]).squeeze(-1))
    if cfg["with_lagrange"]:
        alpha_prime = loss.log_alpha_prime.exp()
        thresh = cfg["lagrange_thresh"]
        out["loss_cql"] = sum((alpha_prime.detach() * (g - thresh)).mean() for g in gaps)
        out["loss_alpha_prime"] = -0.5 * sum(alpha_prime * (g.detach().mean() - thresh) for g in gaps)
    else:
        out["loss_cql"] = sum(g.mean() for g in gaps)

    a, logp = tanh_normal_ref(aw, obs, torch.randn(*shape, ACT))
    q_pi = torch.stack([critic_ref([t.detach() for t in wq], obs, a) for wq in qs]).min(0).values.squeeze(-1)
    out["loss_actor"] = (alpha * logp - q_pi).mean()
    out["loss_actor_bc"] = (alpha * logp - tanh_normal_log_prob_ref(aw, obs, act)).mean()
    out["loss_alpha"] = (-loss.log_alpha * (logp.detach() + cfg["target_entropy"])).mean()
    out["entropy"] = -logp.detach().mean()
    return out


BASE = dict(num_random=3, temperature=1.0, min_q_weight=1.0, max_q_backup=False, deterministic_backup=True,
            with_lagrange=False, lagrange_thresh=0.0, target_entropy=-2.0)
CONFIGS = {
    "default": {},
    "lagrange-maxq": dict(with_lagrange=True, lagrange_thresh=0.5, max_q_backup=True, temperature=2.0,
                          min_q_weight=5.0, num_random=2),
    "soft-backup-bounds": dict(deterministic_backup=False, num_random=4, temperature=0.5),
}


@pytest.mark.parametrize("shape", [(6,), (2, 4)])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_cql_matches_reference(float64, shape, name):
    cfg = {**BASE, **CONFIGS[name]}
    low, high = (-2.0, 2.0) if name == "soft-backup-bounds" else (-1.0, 1.0)
    torch.manual_seed(0)
    spec = Bounded(low, high, shape=(ACT,)) if name == "soft-backup-bounds" else None
    loss = CQLLoss(actor(), qvalue(), action_spec=spec, alpha_init=0.8, **cfg)
    if cfg["with_lagrange"]:
        with torch.no_grad():
            loss.log_alpha_prime.fill_(0.3)
    batch = continuous_batch(loss, shape)
    batch["action"] = batch["action"].clamp(-0.95, 0.95)
    torch.manual_seed(1)
    out = loss(batch.clone())
    torch.manual_seed(1)
    ref = reference_cql(loss, batch, shape, cfg, low, high)
    assert {k for k in out.keys() if k.startswith("loss_")} == {k for k in ref if k.startswith("loss_")}
    named = [(k, p) for k, p in loss.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    for key, value in ref.items():
        torch.testing.assert_close(out[key], value, msg=key)
        if not key.startswith("loss_"):
            continue
        got = torch.autograd.grad(out[key], params, retain_graph=True, allow_unused=True)
        want = torch.autograd.grad(value, params, retain_graph=True, allow_unused=True)
        for (pname, p), g, w in zip(named, got, want):
            g = torch.zeros_like(p) if g is None else g
            w = torch.zeros_like(p) if w is None else w
            torch.testing.assert_close(g, w, msg=f"{key}: gradient of {pname}")


def test_conservative_term_pushes_down_unseen_actions():
    """A gradient step on loss_cql lowers Q on sampled actions relative to the data's."""
    torch.manual_seed(0)
    loss = CQLLoss(actor(), qvalue(), target_entropy=-2.0, num_random=8)
    batch = continuous_batch(loss, (32,))
    torch.manual_seed(1)
    before = loss(batch.clone())["loss_cql"]
    opt = torch.optim.SGD(loss.qvalue_network_params.parameters(), lr=0.05)
    for _ in range(5):
        opt.zero_grad()
        torch.manual_seed(1)
        loss(batch.clone())["loss_cql"].backward()
        opt.step()
    torch.manual_seed(1)
    assert loss(batch.clone())["loss_cql"] < before


@pytest.mark.parametrize("thresh, direction", [(-100.0, 1), (100.0, -1)])
def test_alpha_prime_moves_towards_the_threshold(thresh, direction):
    """Gap above the threshold -> alpha' grows (stronger penalty); below -> it shrinks."""
    torch.manual_seed(0)
    loss = CQLLoss(actor(), qvalue(), target_entropy=-2.0, num_random=2, with_lagrange=True,
                   lagrange_thresh=thresh)
    out = loss(continuous_batch(loss, (6,)))
    out["loss_alpha_prime"].backward()
    assert torch.sign(loss.log_alpha_prime.grad).item() == -direction
    assert loss.log_alpha.grad is None


def test_bad_input_and_options():
    torch.manual_seed(0)
    with pytest.raises(ValueError, match="num_random"):
        CQLLoss(actor(), qvalue(), target_entropy=-2.0, num_random=0)
    with pytest.raises(ValueError, match="action_spec"):
        CQLLoss(actor(), qvalue())
    loss = CQLLoss(actor(), qvalue(), action_spec=Bounded(-1.0, 1.0, shape=(ACT,)))
    assert loss.target_entropy.item() == -ACT
    batch = continuous_batch(loss, (4,))
    with pytest.raises(KeyError) as err:
        loss(batch.exclude("action"))
    assert "CQLLoss needs 'action'" in err.value.args[0] and "set_keys(action=" in err.value.args[0]
    batch["next"] = batch["next"].exclude("reward").set("reward", torch.randn(4))
    with pytest.raises(ValueError, match=r"reward.*\[4\].*\[4, 1\]"):
        loss(batch)
