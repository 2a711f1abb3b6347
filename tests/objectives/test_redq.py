"""REDQLoss: values and gradients against a plain-torch reference, and its invariants."""

from __future__ import annotations

import pytest
import torch

from steersman.objectives import REDQLoss
from tests.objectives.cases_sac import (
    ACT,
    GAMMA,
    actor,
    continuous_batch,
    critic_ref,
    member,
    qvalue,
    smooth_l1,
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


@pytest.mark.parametrize("shape", [(6,), (2, 4)])
@pytest.mark.parametrize("n, m", [(5, 2), (4, 3)])
def test_redq_matches_reference(float64, shape, n, m):
    torch.manual_seed(0)
    loss = REDQLoss(actor(), qvalue(), num_qvalue_nets=n, sub_sample_len=m, target_entropy=-1.0)
    with torch.no_grad():  # targets differ from the online critics, and from each other
        for t in loss.target_qvalue_network_params.values(include_nested=True, leaves_only=True):
            t.add_(0.1 * torch.randn_like(t))
    batch = continuous_batch(loss, shape)
    torch.manual_seed(1)
    out = loss(batch.clone())

    # the random draws, in the loss's order: the actor's action, the next action, the subset
    torch.manual_seed(1)
    eps_cur, eps_next = torch.randn(*shape, ACT), torch.randn(*shape, ACT)
    subset = torch.randperm(n)[:m].tolist()
    aw = list(loss.actor_network.parameters())
    qs = [member(loss.qvalue_network_params, i) for i in range(n)]
    targets = [member(loss.target_qvalue_network_params, i) for i in subset]
    alpha = loss.log_alpha.detach().exp()
    obs, act, nxt = batch["observation"], batch["action"], batch["next"]
    a, logp = tanh_normal_ref(aw, obs, eps_cur)
    q_pi = torch.stack([critic_ref([t.detach() for t in w], obs, a) for w in qs]).squeeze(-1)
    ref = {"loss_actor": (alpha * logp - q_pi).mean()}
    with torch.no_grad():
        a2, logp2 = tanh_normal_ref(aw, nxt["observation"], eps_next)
        v2 = torch.stack([critic_ref(w, nxt["observation"], a2) for w in targets]).min(0).values
        y = nxt["reward"] + GAMMA * (~nxt["terminated"]).double() * (v2 - alpha * logp2.unsqueeze(-1))
    q = torch.stack([critic_ref(w, obs, act) for w in qs])
    ref["loss_qvalue"] = smooth_l1(q, y.expand_as(q)).mean()
    ref["loss_alpha"] = (-loss.log_alpha * (torch.stack([logp.detach(), logp2]) - 1.0)).mean()
    named = [(k, p) for k, p in loss.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    for key, value in ref.items():
        torch.testing.assert_close(out[key], value, msg=key)
        got = torch.autograd.grad(out[key], params, retain_graph=True, allow_unused=True)
        want = torch.autograd.grad(value, params, retain_graph=True, allow_unused=True)
        for (pname, p), g, w in zip(named, got, want):
            g = torch.zeros_like(p) if g is None else g
            w = torch.zeros_like(p) if w is None else w
            torch.testing.assert_close(g, w, msg=f"{key}: gradient of {pname}")
    torch.testing.assert_close(out["target_value"], y.squeeze(-1))
    assert out["state_action_value_actor"].shape == (n, *shape)


def test_subsets_vary_between_calls():
    torch.manual_seed(0)
    loss = REDQLoss(actor(), qvalue(), num_qvalue_nets=6, sub_sample_len=1, target_entropy=-1.0)
    batch = continuous_batch(loss, (4,))
    targets = {tuple(loss(batch.clone())["target_value"].tolist()) for _ in range(8)}
    assert len(targets) > 1


def test_options_and_bad_input():
    with pytest.raises(ValueError, match="num_qvalue_nets"):
        REDQLoss(actor(), qvalue(), num_qvalue_nets=1, target_entropy=-1.0)
    loss = REDQLoss(actor(), qvalue(), num_qvalue_nets=3, sub_sample_len=5, target_entropy=-1.0)
    assert loss.sub_sample_len == 2  # at most N - 1
    batch = continuous_batch(loss, (4,))
    with pytest.raises(KeyError) as err:
        loss(batch.exclude("action"))
    assert "REDQLoss needs 'action'" in err.value.args[0] and "set_keys(action=" in err.value.args[0]
    with torch.no_grad():
        loss.log_alpha.fill_(10.0)
    assert loss(batch)["alpha"].item() == pytest.approx(10.0)  # max_alpha defaults to 10
