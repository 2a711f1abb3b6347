"""DDPG networks (layout, output-layer init, manual recomputation), squeeze layers and
TorchRL's older exploration wrappers (same actions as policy + module)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from steersman.data import Bounded, Categorical
from steersman.modules import (
    Actor,
    AdditiveGaussianModule,
    AdditiveGaussianWrapper,
    DdpgCnnActor,
    DdpgCnnQNet,
    DdpgMlpActor,
    DdpgMlpQNet,
    EGreedyModule,
    EGreedyWrapper,
    OrnsteinUhlenbeckProcessModule,
    OrnsteinUhlenbeckProcessWrapper,
    QValueActor,
    Squeeze2dLayer,
    SqueezeLayer,
)
from steersman.tensordict import TensorDict
from steersman.tensordict.nn import ExplorationType, TensorDictSequential, set_exploration_type


def _linears(net: nn.Module) -> list[nn.Linear]:
    return [m for m in net.modules() if isinstance(m, nn.Linear)]


def test_ddpg_mlp_actor_layout_and_init():
    actor = DdpgMlpActor(action_dim=3)
    out = actor(torch.randn(2, 5, 7))
    assert out.shape == (2, 5, 3)
    assert [(m.in_features, m.out_features) for m in _linears(actor)] == [(7, 400), (400, 300), (300, 3)]
    assert all(isinstance(m, nn.ELU) for m in actor.mlp if not isinstance(m, nn.Linear))
    last = _linears(actor)[-1]
    assert last.weight.abs().max() <= 6e-3 and last.bias.abs().max() <= 6e-3
    assert _linears(actor)[1].weight.abs().max() > 6e-3  # only the output layer is shrunk


def test_ddpg_mlp_qnet_matches_manual_computation():
    torch.manual_seed(0)
    q = DdpgMlpQNet()
    obs, act = torch.randn(4, 6), torch.randn(4, 2)
    value = q(obs, act)
    l1, l2, l3 = _linears(q)
    assert (l1.in_features, l1.out_features, l2.in_features, l2.out_features, l3.out_features) == (6, 400, 402, 300, 1)
    hidden = nn.functional.elu(l1(obs))
    expected = l3(nn.functional.elu(l2(torch.cat([hidden, act], -1))))
    torch.testing.assert_close(value, expected)
    assert l3.weight.abs().max() <= 6e-3


@pytest.mark.parametrize("use_avg_pooling", [False, True])
def test_ddpg_cnn_nets_shapes_and_kwargs(use_avg_pooling):
    conv = {"num_cells": [4, 4, 4]}
    mlp = {"num_cells": 8}
    actor = DdpgCnnActor(2, conv_net_kwargs=conv, mlp_net_kwargs=mlp, use_avg_pooling=use_avg_pooling)
    q = DdpgCnnQNet(conv_net_kwargs=conv, mlp_net_kwargs=mlp, use_avg_pooling=use_avg_pooling)
    pixels = torch.randn(3, 3, 36, 36)
    action, hidden = actor(pixels)
    # 36 -> (36-8)/4+1 = 8 -> (8-4)/2+1 = 3 -> 3 (k3, p1): 4 channels of 3x3, or 4 pooled
    assert hidden.shape == (3, 4 if use_avg_pooling else 36) and action.shape == (3, 2)
    torch.testing.assert_close(action, actor.mlp(actor.convnet(pixels)))
    assert q(pixels, action).shape == (3, 1)
    assert _linears(actor)[-1].weight.abs().max() <= 6e-4


def test_squeeze_layers():
    assert SqueezeLayer()(torch.zeros(3, 1)).shape == (3,)
    assert SqueezeLayer((-1, -1))(torch.zeros(3, 1, 1)).shape == (3,)  # one after the other
    assert Squeeze2dLayer()(torch.zeros(2, 5, 1, 1)).shape == (2, 5)
    with pytest.raises(ValueError, match="not 1"):
        SqueezeLayer()(torch.zeros(3, 2))
    with pytest.raises(ValueError, match="negative"):
        SqueezeLayer((1,))


def _run(module, td, seed):
    torch.manual_seed(seed)
    return module(td.clone())


@pytest.mark.parametrize("kind", ["egreedy", "gaussian", "ou"])
def test_exploration_wrappers_match_policy_plus_module(kind):
    torch.manual_seed(0)
    if kind == "egreedy":
        spec = Categorical(4)
        policy = QValueActor(nn.Linear(3, 4), in_keys=["observation"], spec=spec)
        wrapper = EGreedyWrapper(policy, eps_init=0.5, eps_end=0.1, annealing_num_steps=4)
        module = EGreedyModule(spec, 0.5, 0.1, 4)
        factor = "eps"
    elif kind == "gaussian":
        spec = Bounded(-1.0, 1.0, (2,))
        policy = Actor(nn.Linear(3, 2), spec=spec)
        wrapper = AdditiveGaussianWrapper(policy, sigma_init=0.5, sigma_end=0.1, annealing_num_steps=4)
        module = AdditiveGaussianModule(spec, 0.5, 0.1, 4, safe=True)
        factor = "sigma"
    else:
        spec = Bounded(-1.0, 1.0, (2,))
        policy = Actor(nn.Linear(3, 2), spec=spec)
        wrapper = OrnsteinUhlenbeckProcessWrapper(policy, eps_init=0.5, eps_end=0.1, annealing_num_steps=4)
        module = OrnsteinUhlenbeckProcessModule(spec, 0.5, 0.1, 4)
        factor = "eps"
    reference = TensorDictSequential(policy, module)
    td = TensorDict({"observation": torch.randn(16, 3), "is_init": torch.ones(16, 1, dtype=torch.bool)}, [16])
    torch.testing.assert_close(_run(wrapper, td, 1)["action"], _run(reference, td, 1)["action"])
    assert wrapper.td_module is policy
    greedy = policy(td.clone())["action"]
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        torch.testing.assert_close(wrapper(td.clone())["action"], greedy)
    explored = _run(wrapper, td, 2)["action"]
    assert not torch.equal(explored, greedy)
    wrapper.step(2)
    assert float(getattr(wrapper, factor)) == pytest.approx(0.3)
    wrapper.step(10)
    assert float(getattr(wrapper, factor)) == pytest.approx(0.1)


def test_exploration_wrapper_needs_a_spec():
    policy = TensorDictSequential(Actor(nn.Linear(3, 2)))
    with pytest.raises(ValueError, match="spec"):
        EGreedyWrapper(policy)
    assert isinstance(EGreedyWrapper(policy, spec=Categorical(2)), TensorDictSequential)
