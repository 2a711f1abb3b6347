"""TD3Loss: value and gradients against a plain-torch reference, and its invariants."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from steersman.data import Bounded, Composite, Unbounded
from steersman.objectives import SoftUpdate, TD3Loss, ValueEstimators
from steersman.tensordict import from_module
from steersman.tensordict.nn import TensorDictModule
from tests.objectives.cases_value_based import ACT, OBS, actor, critic, transitions

GAMMA = 0.99
LOW, HIGH = -0.5, 0.5
KEYS = [("module", "net", "0", "weight"), ("module", "net", "0", "bias"),
        ("module", "net", "2", "weight"), ("module", "net", "2", "bias")]


# ------------------------------------------------------------------ reference
def mu(w, s):
    """The cases file's actor with weights ``[W1, b1, W2, b2]``."""
    return torch.tanh(torch.tanh(s @ w[0].T + w[1]) @ w[2].T + w[3])


def q(w, s, a):
    """The cases file's critic with weights ``[W1, b1, W2, b2]``: ``[1]``."""
    return torch.tanh(torch.cat([s, a], -1) @ w[0].T + w[1]) @ w[2].T + w[3]


def stacked(params, requires_grad=False):
    return [params[k].detach().clone().requires_grad_(requires_grad) for k in KEYS]


def weights(module, requires_grad=False):
    return [p.detach().clone().requires_grad_(requires_grad) for p in module.parameters()]


def perturb_(tensors, scale=0.5):
    with torch.no_grad():
        for p in tensors:
            p.add_(torch.randn_like(p) * scale)


def reference_td3(actor_w, target_actor_w, critics, target_critics, td, noise, n):
    """Sample by sample; ``critics`` are stacked weights, critic ``j`` is ``[w[j] for w in critics]``."""
    value_terms, actor_terms = [], []
    for i in range(td.shape[0]):
        s, a, s2 = td["observation"][i], td["action"][i], td["next", "observation"][i]
        r, term = float(td["next", "reward"][i, 0]), bool(td["next", "terminated"][i, 0])
        a2 = torch.clamp(mu(target_actor_w, s2) + noise[i], LOW, HIGH)
        next_q = min(float(q([w[j] for w in target_critics], s2, a2)) for j in range(n))
        y = torch.tensor([r if term else r + GAMMA * next_q])
        value_terms.append(sum(F.smooth_l1_loss(q([w[j] for w in critics], s, a), y) for j in range(n)))
        actor_terms.append(-q([w[0].detach() for w in critics], s, mu(actor_w, s))[0])
    return torch.stack(actor_terms).mean(), torch.stack(value_terms).mean()


@settings(max_examples=8, deadline=None)
@given(batch=st.integers(1, 6), seed=st.integers(0, 2**16), n=st.sampled_from([2, 3]))
def test_matches_reference_value_and_gradients(batch, seed, n):
    torch.manual_seed(seed)
    loss = TD3Loss(actor(), critic(), bounds=(LOW, HIGH), num_qvalue_nets=n, policy_noise=0.4, noise_clip=0.3)
    perturb_(loss.target_actor_network.parameters())
    perturb_(loss.target_qvalue_network_params.values(True, True))
    td = transitions((batch,), torch.rand(batch, ACT) * 2 - 1)
    actor_w, target_actor_w = weights(loss.actor_network, True), weights(loss.target_actor_network)
    critics, target_critics = stacked(loss.qvalue_network_params, True), stacked(loss.target_qvalue_network_params)

    torch.manual_seed(seed + 1)
    out = loss(td)
    (out["loss_actor"] + out["loss_qvalue"]).backward()
    torch.manual_seed(seed + 1)  # the smoothing noise is the loss's first random draw
    noise = (torch.randn_like(td["action"]) * 0.4).clamp(-0.3, 0.3)
    loss_actor, loss_qvalue = reference_td3(actor_w, target_actor_w, critics, target_critics, td, noise, n)
    (loss_actor + loss_qvalue).backward()

    torch.testing.assert_close(out["loss_actor"], loss_actor)
    torch.testing.assert_close(out["loss_qvalue"], loss_qvalue)
    for p, ref in zip(loss.actor_network.parameters(), actor_w):
        torch.testing.assert_close(p.grad, ref.grad)
    for k, ref in zip(KEYS, critics):
        torch.testing.assert_close(loss.qvalue_network_params[k].grad, ref.grad)


# ------------------------------------------------------------------ invariants
def batch(n=6):
    torch.manual_seed(0)
    return transitions((n,), torch.rand(n, ACT) * 2 - 1)


def make_loss(**kwargs):
    return TD3Loss(actor(), critic(), bounds=(LOW, HIGH), **kwargs)


def test_smoothing_noise_stays_within_noise_clip_and_action_bounds():
    loss = make_loss(policy_noise=10.0, noise_clip=0.3)
    action = torch.zeros(1000, ACT)
    noise = loss._smoothing_noise(action)
    assert noise.abs().max() <= 0.3 and (noise.abs() == 0.3).float().mean() > 0.9  # saturated at the clip
    next_td = transitions((1000,), action)["next"]
    next_action = loss._next_action(next_td, noise)
    assert next_action.min() >= LOW and next_action.max() <= HIGH
    raw = loss.target_actor_network(next_td.copy())["action"]
    assert ((next_action - raw.clamp(LOW, HIGH)).abs() <= 0.3 + 1e-6).all()


def test_smoothing_noise_scale():
    noise = make_loss(policy_noise=0.1, noise_clip=10.0)._smoothing_noise(torch.zeros(20000, 1))
    assert abs(float(noise.std()) - 0.1) < 0.005


def test_ensemble_members_are_initialized_independently_and_targets_equal():
    net = critic()
    loss = TD3Loss(actor(), net, bounds=(LOW, HIGH), num_qvalue_nets=3)
    params = loss.qvalue_network_params
    own = from_module(net)
    for k in KEYS:
        assert torch.equal(params[k][0], own[k])  # member 0: the network given
        assert not torch.equal(params[k][1], params[k][0]) and not torch.equal(params[k][2], params[k][1])
        assert torch.equal(loss.target_qvalue_network_params[k], params[k])
        assert not loss.target_qvalue_network_params[k].requires_grad
    for p, t in zip(loss.actor_network.parameters(), loss.target_actor_network.parameters()):
        assert torch.equal(p, t) and not t.requires_grad
    assert all(p.device.type == "meta" for p in loss.qvalue_network.parameters())  # structure only


@pytest.mark.parametrize("term, owner", [("loss_actor", "actor_network."), ("loss_qvalue", "qvalue_network_params.")])
def test_each_term_trains_only_its_network(term, owner):
    loss = make_loss()
    loss(batch())[term].backward()
    for name, p in loss.named_parameters():
        if name.startswith(owner):
            assert p.grad is not None and p.grad.abs().sum() > 0, name
        else:
            assert p.grad is None, name
    if term == "loss_actor":  # the actor loss reads the first critic only... but every critic is frozen
        assert all(t.grad is None for t in loss.target_qvalue_network_params.values(True, True))


def test_soft_update_moves_actor_and_ensemble_targets():
    loss = make_loss()
    perturb_(loss.actor_network.parameters())
    perturb_(loss.qvalue_network_params.values(True, True))
    online = {k: loss.qvalue_network_params[k].detach().clone() for k in KEYS}
    target = {k: loss.target_qvalue_network_params[k].clone() for k in KEYS}
    actor_before = [(p.detach().clone(), t.clone()) for p, t in
                    zip(loss.actor_network.parameters(), loss.target_actor_network.parameters())]
    SoftUpdate(loss, eps=0.8).step()
    for k in KEYS:
        torch.testing.assert_close(loss.target_qvalue_network_params[k], 0.8 * target[k] + 0.2 * online[k])
    for (p, t), new in zip(actor_before, loss.target_actor_network.parameters()):
        torch.testing.assert_close(new, 0.8 * t + 0.2 * p)


def test_min_over_target_critics():
    loss = make_loss(num_qvalue_nets=3, policy_noise=0.0)
    with torch.no_grad():  # constant target critics 3, -1, 2: the next value is -1
        for j, value in enumerate([3.0, -1.0, 2.0]):
            loss.target_qvalue_network_params["module", "net", "2", "weight"][j].zero_()
            loss.target_qvalue_network_params["module", "net", "2", "bias"][j].fill_(value)
    out = loss(batch())
    torch.testing.assert_close(out["next_state_value"], torch.tensor(-1.0))


@pytest.mark.parametrize("spec", [Bounded(LOW, HIGH, shape=(ACT,)), Composite(action=Bounded(LOW, HIGH, shape=(ACT,)))])
def test_bounds_from_a_spec(spec):
    loss = TD3Loss(actor(), critic(), action_spec=spec)
    torch.testing.assert_close(loss.min_action, torch.full((ACT,), LOW))
    torch.testing.assert_close(loss.max_action, torch.full((ACT,), HIGH))


def test_td_lambda_estimator_works_on_time_batches():
    torch.manual_seed(0)
    loss = make_loss().make_value_estimator(ValueEstimators.TDLambda, gamma=0.9, lmbda=0.5)
    td = transitions((2, 5), torch.rand(2, 5, ACT) * 2 - 1)
    out = loss(td)
    assert td["td_error"].shape == (2, 5) and torch.isfinite(out["loss_qvalue"])


# ------------------------------------------------------------------ bad input
def test_missing_action_names_the_fix():
    with pytest.raises(KeyError, match=r"TD3Loss needs .*action.*set_keys\(action="):
        make_loss()(batch().exclude("action"))


def test_reward_without_trailing_dim_is_an_error():
    td = batch()
    td["next", "reward"] = td["next", "reward"][:, 0]
    with pytest.raises(ValueError, match="reward.*trailing"):
        make_loss()(td)


def test_critic_with_a_wrong_output_shape_is_an_error():
    class FlatCritic(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(OBS + ACT, 2)

        def forward(self, observation, action):
            return self.linear(torch.cat([observation, action], -1))  # [B, 2] instead of [B, 1]

    net = TensorDictModule(FlatCritic(), ["observation", "action"], ["state_action_value"])
    with pytest.raises(ValueError, match=r"state_action_value.*expected \[\*batch, 1\]"):
        TD3Loss(actor(), net, bounds=(LOW, HIGH))(batch())


def test_constructor_errors():
    with pytest.raises(ValueError, match="action bounds"):
        TD3Loss(actor(), critic())
    with pytest.raises(ValueError, match="bounded"):
        TD3Loss(actor(), critic(), action_spec=Unbounded(shape=(ACT,)))
    with pytest.raises(ValueError, match="low bound"):
        TD3Loss(actor(), critic(), bounds=(1.0, -1.0))
    with pytest.raises(ValueError, match="num_qvalue_nets must be >= 1"):
        TD3Loss(actor(), critic(), bounds=(LOW, HIGH), num_qvalue_nets=0)
    with pytest.raises(NotImplementedError, match="GAE"):
        make_loss().make_value_estimator(ValueEstimators.GAE)
