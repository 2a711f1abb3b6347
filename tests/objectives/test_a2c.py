"""A2CLoss against a hand-written reference, the estimator path, shared trunks and bad input.
(The loss battery covers gradient routing, compile, state_dict and determinism.)"""

from __future__ import annotations

import pytest
import torch
import torch.distributions as D
from torch import nn
from torch.nn import functional as F

from steersman.objectives import A2CLoss, ValueEstimators, total_loss
from steersman.objectives.value import vec_generalized_advantage_estimate
from steersman.tensordict import TensorDict
from steersman.tensordict.nn import (
    OneHotCategorical,
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
    TensorDictSequential,
)

OBS, N, H = 3, 4, 8


def make_nets(seed: int = 0):
    torch.manual_seed(seed)
    pi = nn.Sequential(nn.Linear(OBS, H), nn.Tanh(), nn.Linear(H, N))
    v = nn.Sequential(nn.Linear(OBS, H), nn.Tanh(), nn.Linear(H, 1))
    actor = ProbabilisticTensorDictSequential(
        TensorDictModule(pi, ["observation"], ["logits"]),
        ProbabilisticTensorDictModule(["logits"], ["action"], OneHotCategorical, return_log_prob=True),
    )
    return pi, v, actor, TensorDictModule(v, ["observation"], ["state_value"])


def make_batch(shape=(12,), seed: int = 1) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    done = torch.rand(*shape, 1, generator=g) < 0.3
    term = done & (torch.rand(*shape, 1, generator=g) < 0.5)
    return TensorDict(
        {
            "observation": torch.randn(*shape, OBS, generator=g),
            "action": F.one_hot(torch.randint(N, shape, generator=g), N),
            "advantage": torch.randn(*shape, 1, generator=g),
            "value_target": torch.randn(*shape, 1, generator=g),
            "next": {
                "observation": torch.randn(*shape, OBS, generator=g),
                "reward": torch.randn(*shape, 1, generator=g),
                "done": done,
                "terminated": term,
                "truncated": done & ~term,
            },
        },
        list(shape),
    )


def reference(pi, v, td, ent_coef=0.01, crit_coef=1.0, critic_type="smooth_l1"):
    logits = pi(td["observation"])
    log_probs = logits.log_softmax(-1)
    logp = (log_probs * td["action"]).sum(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    crit = {"smooth_l1": F.smooth_l1_loss, "l2": F.mse_loss, "l1": F.l1_loss}[critic_type]
    return {
        "loss_objective": -(logp * td["advantage"][..., 0]).mean(),
        "loss_entropy": -ent_coef * entropy.mean(),
        "loss_critic": crit_coef * crit(v(td["observation"]), td["value_target"]),
    }


@pytest.mark.parametrize("shape", [(12,), (3, 4)])
@pytest.mark.parametrize("critic_type", ["smooth_l1", "l2"])
def test_matches_reference(shape, critic_type):
    pi, v, actor, critic = make_nets()
    td = make_batch(shape)
    loss = A2CLoss(actor, critic, entropy_coeff=0.05, critic_coeff=0.5, loss_critic_type=critic_type)
    out = loss(td)
    ref = reference(pi, v, td, 0.05, 0.5, critic_type)
    params = [*pi.parameters(), *v.parameters()]
    for key, value in ref.items():
        torch.testing.assert_close(out[key], value, msg=key)
    got = torch.autograd.grad(total_loss(out), params)
    want = torch.autograd.grad(sum(ref.values()), params)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(out["entropy"], -ref["loss_entropy"].detach() / 0.05)


def test_advantage_computed_by_gae_when_absent():
    pi, v, actor, critic = make_nets()
    td = make_batch((3, 6)).exclude("advantage", "value_target")
    loss = A2CLoss(actor, critic).make_value_estimator(ValueEstimators.GAE, gamma=0.9, lmbda=0.7)
    out = loss(td)
    assert "advantage" not in td.keys()
    with torch.no_grad():
        nxt = td["next"]
        adv, target = vec_generalized_advantage_estimate(
            0.9, 0.7, v(td["observation"]), v(nxt["observation"]), nxt["reward"], nxt["done"], nxt["terminated"]
        )
    td["advantage"], td["value_target"] = adv, target
    ref = reference(pi, v, td)
    for key, value in ref.items():
        torch.testing.assert_close(out[key], value, msg=key)
    # no gradient into the critic through the advantage
    assert all(g.abs().max() == 0 for g in torch.autograd.grad(out["loss_objective"], list(v.parameters()), allow_unused=True, materialize_grads=True))


def shared_trunk():
    torch.manual_seed(0)
    trunk = TensorDictModule(nn.Sequential(nn.Linear(OBS, H), nn.Tanh()), ["observation"], ["hidden"])
    actor = ProbabilisticTensorDictSequential(
        trunk,
        TensorDictModule(nn.Linear(H, N), ["hidden"], ["logits"]),
        ProbabilisticTensorDictModule(["logits"], ["action"], OneHotCategorical),
    )
    critic = TensorDictSequential(trunk, TensorDictModule(nn.Linear(H, 1), ["hidden"], ["state_value"]))
    return trunk, actor, critic


@pytest.mark.parametrize("separate_losses", [False, True])
def test_shared_trunk_gets_critic_gradient_unless_separate_losses(separate_losses):
    trunk, actor, critic = shared_trunk()
    loss = A2CLoss(actor, critic, separate_losses=separate_losses)
    out = loss(make_batch())
    trunk_grads = torch.autograd.grad(
        out["loss_critic"], list(trunk.parameters()), allow_unused=True, materialize_grads=True, retain_graph=True
    )
    reached = any(g.abs().max() > 0 for g in trunk_grads)
    assert reached != separate_losses
    head = critic[1]
    head_grads = torch.autograd.grad(out["loss_critic"], list(head.parameters()), retain_graph=True)
    assert all(g.abs().max() > 0 for g in head_grads)
    # the trunk still learns from the policy terms
    assert any(g.abs().max() > 0 for g in torch.autograd.grad(out["loss_objective"], list(trunk.parameters())))


def test_clip_value_and_reduction_none():
    pi, v, actor, critic = make_nets()
    td = make_batch((3, 4))
    td["state_value"] = td["value_target"] + 0.3
    out = A2CLoss(actor, critic, clip_value=0.05, reduction="none")(td)
    assert out["loss_objective"].shape == out["loss_critic"].shape == out["loss_entropy"].shape == (3, 4)
    assert 0 <= out["value_clip_fraction"] <= 1


def test_missing_key_and_bad_shapes():
    pi, v, actor, critic = make_nets()
    loss = A2CLoss(actor, critic)
    with pytest.raises(KeyError, match=r"A2CLoss needs .{1,3}action.*set_keys\(action=<your key>\)"):
        loss(make_batch().exclude("action"))
    td = make_batch((2, 5)).exclude("advantage")
    td["next", "done"] = td["next", "done"][..., 0]
    with pytest.raises(ValueError, match=r"'done'\) has shape \[2, 5\], expected \[2, 5, 1\]"):
        loss(td)
    bad_critic = TensorDictModule(nn.Linear(OBS, 1), ["observation"], ["state_value"])
    bad_critic.module = nn.Sequential(nn.Linear(OBS, 1), nn.Flatten(-2))
    with pytest.raises(ValueError, match="critic wrote 'state_value' of shape"):
        A2CLoss(actor, bad_critic)(make_batch())
    normal_actor = ProbabilisticTensorDictSequential(
        TensorDictModule(nn.Linear(OBS, 2 * N), ["observation"], ["loc"]),
        ProbabilisticTensorDictModule(["loc"], ["action"], lambda loc: D.Normal(loc, 1.0)),
    )
    td = make_batch()
    td["action"] = torch.randn(12, 2 * N)
    with pytest.raises(ValueError, match=r"log_prob has shape \[12, 8\], expected the batch shape \[12\]"):
        A2CLoss(normal_actor, critic)(td)
