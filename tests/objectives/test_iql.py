"""IQLLoss: values and gradients against a plain-torch reference, and its invariants."""

from __future__ import annotations

import pytest
import torch

from steersman.objectives import IQLLoss, SoftUpdate
from tests.objectives.cases_sac import (
    GAMMA,
    actor,
    continuous_batch,
    critic_ref,
    member,
    mlp,
    qvalue,
    smooth_l1,
    tanh_normal_log_prob_ref,
    value,
)


@pytest.fixture
def float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def reference_iql(loss, batch, *, expectile, temperature, loss_function):
    aw, vw = list(loss.actor_network.parameters()), list(loss.value_network.parameters())
    n = loss.num_qvalue_nets
    qs = [member(loss.qvalue_network_params, i) for i in range(n)]
    targets = [member(loss.target_qvalue_network_params, i) for i in range(n)]
    obs, act, nxt = batch["observation"], batch["action"], batch["next"]
    q_target = torch.stack([critic_ref(w, obs, act) for w in targets]).min(0).values.squeeze(-1).detach()
    v = mlp(vw, obs).squeeze(-1)
    log_prob = tanh_normal_log_prob_ref(aw, obs, act)
    weight = torch.clamp(torch.exp(temperature * (q_target - v.detach())), max=100.0)
    loss_actor = -(weight * log_prob).mean()
    u = q_target - v
    loss_value = (torch.abs(expectile - (u < 0).double()) * u.pow(2)).mean()
    y = (nxt["reward"] + GAMMA * (~nxt["terminated"]).double() * mlp(vw, nxt["observation"])).detach()
    q = torch.stack([critic_ref(w, obs, act) for w in qs])
    dist = smooth_l1(q, y.expand_as(q)) if loss_function == "smooth_l1" else (q - y).pow(2)
    loss_q = dist.sum(0).mean()
    return {"loss_actor": loss_actor, "loss_value": loss_value, "loss_qvalue": loss_q,
            "entropy": -log_prob.detach().mean()}


@pytest.mark.parametrize("shape", [(8,), (3, 5)])
@pytest.mark.parametrize(
    "expectile, temperature, loss_function, n",
    [(0.5, 1.0, "smooth_l1", 2), (0.9, 3.0, "l2", 3), (0.7, 200.0, "l2", 1)],  # the last one hits the clamp
)
def test_iql_matches_reference(float64, shape, expectile, temperature, loss_function, n):
    torch.manual_seed(0)
    loss = IQLLoss(actor(), qvalue(), value(), num_qvalue_nets=n, expectile=expectile,
                   temperature=temperature, loss_function=loss_function)
    with torch.no_grad():  # targets differ from the online critics
        for t in loss.target_qvalue_network_params.values(include_nested=True, leaves_only=True):
            t.add_(0.05 * torch.randn_like(t))
    batch = continuous_batch(loss, shape)
    batch["action"] = batch["action"].clamp(-0.95, 0.95)
    out = loss(batch.clone())
    ref = reference_iql(loss, batch, expectile=expectile, temperature=temperature, loss_function=loss_function)
    named = [(k, p) for k, p in loss.named_parameters() if p.requires_grad]
    for key, value_ in ref.items():
        torch.testing.assert_close(out[key], value_, msg=key)
        if not key.startswith("loss_"):
            continue
        got = torch.autograd.grad(out[key], [p for _, p in named], retain_graph=True, allow_unused=True)
        want = torch.autograd.grad(value_, [p for _, p in named], retain_graph=True, allow_unused=True)
        for (name, p), g, w in zip(named, got, want):
            g = torch.zeros_like(p) if g is None else g
            w = torch.zeros_like(p) if w is None else w
            torch.testing.assert_close(g, w, msg=f"{key}: gradient of {name}")


def test_expectile_weights_positive_errors_more():
    """With expectile tau, V's gradient from a positive residual is tau / (1 - tau) times
    the one from an equal negative residual."""
    torch.manual_seed(0)
    loss = IQLLoss(actor(), qvalue(), value(), expectile=0.8)
    batch = continuous_batch(loss, (4,))[:1]
    bias = loss.value_network.module[2].bias
    grads = []
    for offset in (-1.0, 1.0):  # V(s) = Q'(s, a) - 1 (residual +1) and + 1 (residual -1)
        with torch.no_grad():
            q = min(critic_ref(member(loss.target_qvalue_network_params, i), batch["observation"],
                               batch["action"]).item() for i in range(2))
            bias.add_(q + offset - loss.value_network(batch.select("observation"))["state_value"].item())
        grads.append(torch.autograd.grad(loss(batch.clone())["loss_value"], bias)[0].item())
    assert grads[0] / -grads[1] == pytest.approx(0.8 / 0.2, rel=1e-5)


def test_targets_and_updates():
    torch.manual_seed(0)
    loss = IQLLoss(actor(), qvalue(), value())
    key = loss.qvalue_network_params.keys(include_nested=True, leaves_only=True)[0]
    assert torch.equal(loss.qvalue_network_params[key], loss.target_qvalue_network_params[key])
    out = loss(continuous_batch(loss, (6,)))
    (out["loss_actor"] + out["loss_qvalue"] + out["loss_value"]).backward()
    assert all(t.grad is None for t in loss.target_qvalue_network_params.values(include_nested=True, leaves_only=True))
    with torch.no_grad():
        loss.qvalue_network_params[key].add_(1.0)
    SoftUpdate(loss, eps=0.5).step()
    torch.testing.assert_close(loss.target_qvalue_network_params[key], loss.qvalue_network_params[key] - 0.5)


def test_bad_input():
    torch.manual_seed(0)
    with pytest.raises(ValueError, match="expectile"):
        IQLLoss(actor(), qvalue(), value(), expectile=1.0)
    loss = IQLLoss(actor(), qvalue(), value())
    batch = continuous_batch(loss, (4,))
    with pytest.raises(KeyError) as err:
        loss(batch.exclude("action"))
    assert "IQLLoss needs 'action'" in err.value.args[0] and "set_keys(action=" in err.value.args[0]
    batch["next"] = batch["next"].exclude("reward").set("reward", torch.randn(4))
    with pytest.raises(ValueError, match=r"reward.*\[4\].*\[4, 1\]"):
        loss(batch)
