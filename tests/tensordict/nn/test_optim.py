"""Functional optimizers (steersman.tensordict.nn.optim) against torch.optim: 100 updates of
a small MLP on a fixed sequence of batches give bitwise-equal parameters (the same ops in
the same order), the state round-trips through ``state_dict``, inputs are never modified."""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

from steersman.tensordict import TensorDict
from steersman.tensordict.nn import from_module
from steersman.tensordict.nn.optim import SGD, Adam, AdamW, RMSprop, clip_grad_norm

STEPS = 100


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 4, generator=g), torch.randn(16, 2, generator=g)) for _ in range(STEPS)]


def _loss(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (net(x) - y).pow(2).mean()


def _torch_run(make_opt, max_norm: float | None = None) -> TensorDict:
    net = _net()
    opt = make_opt(net.parameters())
    for x, y in _batches():
        opt.zero_grad()
        _loss(net, x, y).backward()
        if max_norm is not None:
            nn.utils.clip_grad_norm_(net.parameters(), max_norm, foreach=False)
        opt.step()
    return from_module(net).detach().clone()


def _functional_run(opt, max_norm: float | None = None) -> tuple[TensorDict, TensorDict]:
    net = _net()
    params = from_module(net).detach().clone()
    state = opt.init(params)
    for x, y in _batches():
        flat = {".".join(k): v for k, v in params.items(True, True)}
        g = torch.func.grad(_loss_functional, argnums=1)(net, flat, x, y)
        grads = TensorDict({k: {kk.split(".")[1]: v for kk, v in g.items() if kk.startswith(k + ".")}
                            for k in ("0", "2")}, batch_size=[])
        if max_norm is not None:
            grads, _ = clip_grad_norm(grads, max_norm)
        params, state = opt.step(params, grads, state)
    return params, state


def _loss_functional(net: nn.Module, p: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (torch.func.functional_call(net, p, (x,)) - y).pow(2).mean()


CASES = {
    "adam": (lambda ps: torch.optim.Adam(ps, lr=1e-2, foreach=False), Adam(lr=1e-2)),
    "adam-betas-eps-wd": (lambda ps: torch.optim.Adam(ps, lr=3e-3, betas=(0.8, 0.99), eps=1e-5, weight_decay=0.1,
                                                       foreach=False),
                          Adam(lr=3e-3, betas=(0.8, 0.99), eps=1e-5, weight_decay=0.1)),
    "adam-amsgrad-maximize": (lambda ps: torch.optim.Adam(ps, lr=1e-3, amsgrad=True, maximize=True, foreach=False),
                              Adam(lr=1e-3, amsgrad=True, maximize=True)),
    "adamw": (lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=False), AdamW(lr=1e-2)),
    "adamw-amsgrad": (lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.3, amsgrad=True, foreach=False),
                      AdamW(lr=1e-2, weight_decay=0.3, amsgrad=True)),
    "sgd": (lambda ps: torch.optim.SGD(ps, lr=0.05, foreach=False), SGD(lr=0.05)),
    "sgd-momentum-dampening-wd": (lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, dampening=0.1,
                                                             weight_decay=1e-2, foreach=False),
                                  SGD(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=1e-2)),
    "sgd-nesterov-maximize": (lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.8, nesterov=True, maximize=True,
                                                         foreach=False),
                              SGD(lr=0.01, momentum=0.8, nesterov=True, maximize=True)),
    "rmsprop": (lambda ps: torch.optim.RMSprop(ps, lr=7e-4, alpha=0.99, eps=1e-5, foreach=False),
                RMSprop(lr=7e-4, alpha=0.99, eps=1e-5)),
    "rmsprop-wd-maximize": (lambda ps: torch.optim.RMSprop(ps, lr=1e-3, weight_decay=0.1, maximize=True,
                                                           foreach=False),
                            RMSprop(lr=1e-3, weight_decay=0.1, maximize=True)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_matches_torch_optim_bitwise_after_100_steps(name):
    make_torch, opt = CASES[name]
    expected = _torch_run(make_torch)
    got, state = _functional_run(opt)
    assert int(state["step"]) == STEPS
    assert got.keys(True, True) == expected.keys(True, True)
    moved = False
    for key, value in expected.items(True, True):
        assert torch.equal(got.get(key), value), (name, key, (got.get(key) - value).abs().max())
        moved |= not torch.equal(value, from_module(_net()).get(key))
    assert moved


@pytest.mark.parametrize("name", ["adam", "sgd-momentum-dampening-wd"])
def test_with_clipping_matches_torch_optim_and_clip_grad_norm_(name):
    make_torch, opt = CASES[name]
    expected = _torch_run(make_torch, max_norm=0.05)
    got, _ = _functional_run(opt, max_norm=0.05)
    for key, value in expected.items(True, True):
        assert torch.equal(got.get(key), value), key


@pytest.mark.parametrize("max_norm,norm_type", [(0.5, 2.0), (100.0, 2.0), (0.1, float("inf")), (0.3, 1.0)])
def test_clip_grad_norm_equals_torch(max_norm, norm_type):
    g = torch.Generator().manual_seed(3)
    grads = TensorDict({"a": torch.randn(5, 3, generator=g), "b": {"c": torch.randn(7, generator=g)}}, batch_size=[])
    before = grads.clone()
    holders = [nn.Parameter(torch.zeros(5, 3)), nn.Parameter(torch.zeros(7))]
    holders[0].grad, holders[1].grad = grads["a"].clone(), grads["b", "c"].clone()
    expected_norm = nn.utils.clip_grad_norm_(holders, max_norm, norm_type=norm_type, foreach=False)
    tensors = [h.grad for h in holders]
    clipped, norm = clip_grad_norm(grads, max_norm, norm_type)
    assert torch.equal(norm, expected_norm)
    assert torch.equal(clipped["a"], tensors[0]) and torch.equal(clipped["b", "c"], tensors[1])
    assert (grads == before).all()  # not modified


def test_step_is_pure_and_state_round_trips():
    opt = Adam(lr=1e-2, amsgrad=True)
    params, state = _functional_run(opt)
    grads = params.apply(torch.ones_like)
    snapshot = (params.clone(), state.clone())
    p1, s1 = opt.step(params, grads, state)
    assert (params == snapshot[0]).all() and (state == snapshot[1]).all()  # inputs untouched

    buf = io.BytesIO()
    torch.save(state.state_dict(), buf)
    buf.seek(0)
    restored = opt.init(params).load_state_dict(torch.load(buf, weights_only=True))
    assert int(restored["step"]) == STEPS
    p2, s2 = opt.step(params, grads, restored)
    assert (p2 == p1).all() and (s2 == s1).all()


def test_tensor_lr_is_read_at_each_step():
    lr = torch.tensor(0.1)
    opt = SGD(lr=lr)
    params = TensorDict({"w": torch.zeros(2)}, batch_size=[])
    grads = TensorDict({"w": torch.ones(2)}, batch_size=[])
    state = opt.init(params)
    params, state = opt.step(params, grads, state)
    lr.fill_(0.5)
    params, state = opt.step(params, grads, state)
    torch.testing.assert_close(params["w"], torch.full((2,), -0.6))


@pytest.mark.parametrize("make,match", [
    (lambda: Adam(lr=-1.0), "lr must be a float >= 0"),
    (lambda: Adam(betas=(0.9, 1.0)), r"betas must be two floats in \[0, 1\), got \(0.9, 1.0\)"),
    (lambda: AdamW(eps=-1e-8), "eps must be >= 0, got -1e-08"),
    (lambda: SGD(lr=0.1, nesterov=True), "nesterov needs momentum > 0 and dampening 0, got momentum=0.0"),
    (lambda: SGD(lr=0.1, weight_decay=-1.0), "weight_decay must be >= 0, got -1.0"),
])
def test_bad_hyper_parameters_are_named(make, match):
    with pytest.raises(ValueError, match=match):
        make()
