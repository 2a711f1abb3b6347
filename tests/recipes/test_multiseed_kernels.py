"""The compiled on-policy population's kernel choices (recipes/multiseed.py): the decomposed
tanh and the policy head as products and sums, each within float rounding of the plain ops."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from steersman.recipes import fused, multiseed, precompiled
from steersman.recipes.config import EnvConfig, LoggerConfig
from steersman.recipes.ppo import PPOConfig


def tiny(**kw) -> PPOConfig:
    base = dict(
        env=EnvConfig(name="CartPole-v1", num_envs=2),
        n_steps=8,
        epochs=2,
        minibatch_size=8,
        total_frames=48,
        quiet=True,
        logger=LoggerConfig(backends=["csv"]),
        export_format="none",
    )
    base.update(kw)
    return PPOConfig(**base)


def mlp(outputs: int, seed: int) -> tuple[list[tuple], tuple]:
    """A CartPole-shaped tanh MLP (4 -> 64 -> 64 -> outputs) as a program and its leaves."""
    torch.manual_seed(seed)
    net = nn.Sequential(
        nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, outputs)
    )
    names = [n for n, _ in net.named_parameters()]
    return multiseed._program(net, names), tuple(
        p.detach().requires_grad_() for p in net.parameters()
    )


@pytest.mark.parametrize("outputs", [1, 2, 3])
def test_narrow_heads_equal_the_linear_layers_within_rounding(outputs):
    """Heads of at most two outputs run as a product and a sum: outputs and gradients of every
    leaf within float rounding of ``F.linear``'s; a wider head, and ``narrow_heads=False``,
    run the plain layers (bit for bit)."""
    program, leaves = mlp(outputs, seed=outputs)
    x = torch.randn(3, 256, 4, generator=torch.Generator().manual_seed(0))
    ref = multiseed._run_program(program, leaves, x)
    out = multiseed._run_layers(program, leaves, x, narrow_heads=True)
    assert torch.equal(multiseed._run_layers(program, leaves, x), ref)
    if outputs > 2:
        assert torch.equal(out, ref)
        return
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    g = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1))
    for a, b in zip(torch.autograd.grad(out, leaves, g), torch.autograd.grad(ref, leaves, g)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_pure_ppo_loss_with_narrow_heads_is_within_rounding():
    """The PPO loss and its gradients with the narrow heads: within float rounding of the
    plain layers' (which equal ClipPPOLoss bit for bit, test_multiseed.py)."""
    actor, a_leaves = mlp(2, seed=0)
    critic, c_leaves = mlp(1, seed=1)
    n = len(a_leaves)
    critic = [
        (s[0], s[1] + n, None if s[2] is None else s[2] + n) if s[0] == "linear" else s
        for s in critic
    ]
    leaves = a_leaves + c_leaves
    g = torch.Generator().manual_seed(2)
    obs, action = torch.randn(64, 4, generator=g), torch.randint(0, 2, (64,), generator=g)
    logp, adv, target = (
        -torch.rand(64, generator=g) - 0.3,
        torch.randn(64, 1, generator=g),
        torch.randn(64, 1, generator=g),
    )
    args = (obs, action, logp, adv, target, torch.tensor(0.2), 0.01, 0.5, True)
    ref = multiseed._pure_ppo_loss(actor, critic, leaves, *args)
    out = multiseed._pure_ppo_loss(actor, critic, leaves, *args, narrow_heads=True)
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(torch.autograd.grad(out[0], leaves), torch.autograd.grad(ref[0], leaves)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("backend", ["inductor", "eager"])
def test_on_policy_graphs_compile_with_the_decomposed_tanh(monkeypatch, tmp_path, backend):
    """Under inductor the PPO population's three graphs (update, collection step, advantages)
    get :data:`fused.INDUCTOR_OPTIONS` plus :data:`multiseed.ON_POLICY_OPTIONS`, and the
    update runs the narrow heads; other backends get no inductor options and the plain layers
    (so dynamo's eager backend still equals the eager run bit for bit)."""
    seen, heads = [], []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.append(kw) or fn)
    monkeypatch.setattr(precompiled, "remember_vec_isa", lambda: True)
    real = multiseed._pure_ppo_loss
    monkeypatch.setattr(
        multiseed, "_pure_ppo_loss", lambda *a, **kw: heads.append(a[-1]) or real(*a, **kw)
    )
    pop = multiseed.Population(
        "ppo",
        tiny(seeds=2, compile=True, compile_backend=backend),
        tmp_path / "run",
        resume=False,
        batch_frames=16,
    )
    model = multiseed._OnPolicyModel("ppo", pop)
    assert model.step_fn is not None and model.gae_fn is not None and len(seen) == 3
    want = (
        {**fused.INDUCTOR_OPTIONS, **multiseed.ON_POLICY_OPTIONS} if backend == "inductor" else None
    )
    assert [kw["options"] for kw in seen] == [want] * 3
    if backend == "inductor":
        assert want["cpp.use_decompose_tanh"] is True and want["cpp_wrapper"] is True
    data = (
        torch.randn(2, 16, 4),
        torch.randint(0, 2, (2, 16)),
        -torch.rand(2, 16),
        torch.randn(2, 16, 1),
        torch.randn(2, 16, 1),
    )
    idx = torch.stack([torch.randperm(16) for _ in range(2)])[:, :8]
    model.v_update(
        model.params, model.opt_state, data, idx, model.base["lr"], model.base["max_grad_norm"]
    )
    assert heads and all(h is (backend == "inductor") for h in heads)


def test_decomposed_tanh_is_tanh_within_float_rounding():
    """Inductor's ``cpp.use_decompose_tanh`` (``2 / (1 + exp(-2x)) - 1``) with the population's
    options: within 2.5e-7 of ``tanh`` (absolute) over [-20, 20], exactly +-1 where tanh
    rounds to +-1, no NaN at large inputs, and not ATen's bits (the option is in effect)."""
    x = torch.cat(
        [torch.linspace(-20, 20, 40_001), torch.tensor([-1e30, -88.0, 0.0, 1e-30, 88.0, 1e30])]
    )
    f = torch.compile(
        torch.tanh,
        fullgraph=True,
        dynamic=False,
        options={**fused.INDUCTOR_OPTIONS, **multiseed.ON_POLICY_OPTIONS},
    )
    y, ref = f(x), torch.tanh(x)
    assert not y.isnan().any()
    assert (y.double() - torch.tanh(x.double())).abs().max().item() <= 2.5e-7
    assert torch.equal(y[ref.abs() == 1], ref[ref.abs() == 1])
    assert not torch.equal(y, ref)
