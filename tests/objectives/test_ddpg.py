"""DDPGLoss: value and gradients against a plain-torch reference, and its invariants."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from steersman.objectives import DDPGLoss, SoftUpdate, ValueEstimators
from steersman.tensordict.nn import TensorDictModule
from tests.objectives.cases_value_based import ACT, OBS, actor, critic, transitions

GAMMA = 0.99


# ------------------------------------------------------------------ reference
def mu(w, s):
    """The cases file's actor with weights ``[W1, b1, W2, b2]``."""
    return torch.tanh(torch.tanh(s @ w[0].T + w[1]) @ w[2].T + w[3])


def q(w, s, a):
    """The cases file's critic with weights ``[W1, b1, W2, b2]``: ``[..., 1]``."""
    return torch.tanh(torch.cat([s, a], -1) @ w[0].T + w[1]) @ w[2].T + w[3]


def weights(module, requires_grad=False):
    return [p.detach().clone().requires_grad_(requires_grad) for p in module.parameters()]


def perturb_(module, scale=0.5):
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * scale)


def reference_ddpg(actor_w, critic_w, target_actor_w, target_critic_w, td, gamma=GAMMA):
    """Sample by sample: y = r + gamma (1 - terminated) Q'(s', mu'(s')); loss_actor = -Q(s, mu(s))."""
    value_terms, actor_terms, targets = [], [], []
    for i in range(td.shape[0]):
        s, a, s2 = td["observation"][i], td["action"][i], td["next", "observation"][i]
        r, term = float(td["next", "reward"][i, 0]), bool(td["next", "terminated"][i, 0])
        y = r if term else r + gamma * float(q(target_critic_w, s2, mu(target_actor_w, s2)))
        targets.append(y)
        value_terms.append((q(critic_w, s, a)[0] - y) ** 2)
        frozen = [w.detach() for w in critic_w]
        actor_terms.append(-q(frozen, s, mu(actor_w, s))[0])
    return torch.stack(actor_terms).mean(), torch.stack(value_terms).mean(), torch.tensor(targets)


@settings(max_examples=8, deadline=None)
@given(batch=st.integers(1, 6), seed=st.integers(0, 2**16), delay_actor=st.booleans())
def test_matches_reference_value_and_gradients(batch, seed, delay_actor):
    torch.manual_seed(seed)
    loss = DDPGLoss(actor(), critic(), delay_actor=delay_actor)
    perturb_(loss.target_value_network)
    if delay_actor:
        perturb_(loss.target_actor_network)
    td = transitions((batch,), torch.rand(batch, ACT) * 2 - 1)
    actor_w, critic_w = weights(loss.actor_network, True), weights(loss.value_network, True)
    target_actor_w = weights(loss.target_actor_network if delay_actor else loss.actor_network)
    target_critic_w = weights(loss.target_value_network)

    out = loss(td)
    (out["loss_actor"] + out["loss_value"]).backward()
    loss_actor, loss_value, targets = reference_ddpg(actor_w, critic_w, target_actor_w, target_critic_w, td)
    (loss_actor + loss_value).backward()

    torch.testing.assert_close(out["loss_actor"], loss_actor)
    torch.testing.assert_close(out["loss_value"], loss_value)
    torch.testing.assert_close(out["target_value"], targets.mean())
    torch.testing.assert_close(out["target_value_max"], targets.max())
    for p, ref in zip([*loss.actor_network.parameters(), *loss.value_network.parameters()], actor_w + critic_w):
        torch.testing.assert_close(p.grad, ref.grad)


# ------------------------------------------------------------------ invariants
def batch(n=6):
    torch.manual_seed(0)
    return transitions((n,), torch.rand(n, ACT) * 2 - 1)


@pytest.mark.parametrize("term, owner, other", [("loss_actor", "actor_network", "value_network"),
                                                ("loss_value", "value_network", "actor_network")])
def test_each_term_trains_only_its_network(term, owner, other):
    loss = DDPGLoss(actor(), critic(), delay_actor=True)
    loss(batch())[term].backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in getattr(loss, owner).parameters())
    assert all(p.grad is None for p in getattr(loss, other).parameters())
    assert all(p.grad is None for n, p in loss.named_parameters() if n.startswith("target_"))


def test_targets_start_equal_and_frozen():
    loss = DDPGLoss(actor(), critic(), delay_actor=True)
    for name in ("actor_network", "value_network"):
        online, target = getattr(loss, name), getattr(loss, "target_" + name)
        assert all(torch.equal(p, t) and not t.requires_grad for p, t in zip(online.parameters(), target.parameters()))
    assert not hasattr(DDPGLoss(actor(), critic()), "target_actor_network")  # delay_actor=False by default


def test_soft_update_moves_both_targets():
    loss = DDPGLoss(actor(), critic(), delay_actor=True)
    perturb_(loss.actor_network)
    perturb_(loss.value_network)
    before = {n: p.clone() for n, p in loss.named_parameters()}
    SoftUpdate(loss, tau=0.1).step()
    for name in ("actor_network", "value_network"):
        for n, p in getattr(loss, "target_" + name).named_parameters():
            expected = 0.9 * before[f"target_{name}.{n}"] + 0.1 * before[f"{name}.{n}"]
            torch.testing.assert_close(p, expected)


def test_terminated_stops_bootstrap_truncated_bootstraps():
    loss = DDPGLoss(actor(), critic())
    td = batch(2)
    td["next", "terminated"] = torch.tensor([[True], [False]])
    td["next", "truncated"] = torch.tensor([[False], [True]])
    td["next", "done"] = torch.tensor([[True], [True]])
    loss(td)
    with torch.no_grad():
        pred = loss.value_network(td.copy())["state_action_value"][:, 0]
        next_q = loss.target_value_network(loss.actor_network(td["next"].copy()))["state_action_value"][:, 0]
    reward = td["next", "reward"][:, 0]
    expected_target = torch.stack([reward[0], reward[1] + GAMMA * next_q[1]])
    torch.testing.assert_close(td["td_error"], (pred - expected_target) ** 2)


def test_td_lambda_estimator_works_on_time_batches():
    torch.manual_seed(0)
    loss = DDPGLoss(actor(), critic()).make_value_estimator(ValueEstimators.TDLambda, gamma=0.9, lmbda=0.5)
    td = transitions((2, 5), torch.rand(2, 5, ACT) * 2 - 1)
    out = loss(td)
    assert td["td_error"].shape == (2, 5)
    assert torch.isfinite(out["loss_value"])


# ------------------------------------------------------------------ bad input
def test_missing_action_names_the_fix():
    td = batch().exclude("action")
    with pytest.raises(KeyError, match=r"DDPGLoss needs .*action.*set_keys\(action="):
        DDPGLoss(actor(), critic())(td)
    assert "td_error" not in td.keys()


def test_reward_without_trailing_dim_is_an_error():
    td = batch()
    td["next", "reward"] = td["next", "reward"][:, 0]
    with pytest.raises(ValueError, match="reward.*trailing"):
        DDPGLoss(actor(), critic())(td)


def test_critic_with_a_wrong_output_shape_is_an_error():
    class FlatCritic(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(OBS + ACT, 1)

        def forward(self, observation, action):
            return self.linear(torch.cat([observation, action], -1)).squeeze(-1)  # [B]: no trailing dim

    net = TensorDictModule(FlatCritic(), ["observation", "action"], ["state_action_value"])
    with pytest.raises(ValueError, match=r"state_action_value.*expected \[\*batch, 1\]"):
        DDPGLoss(actor(), net)(batch())


def test_constructor_errors():
    with pytest.raises(NotImplementedError, match="GAE"):
        DDPGLoss(actor(), critic()).make_value_estimator(ValueEstimators.GAE)
    with pytest.raises(ValueError, match="reduction"):
        DDPGLoss(actor(), critic(), reduction="max")
