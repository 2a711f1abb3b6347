"""TorchRL's keywords on modules: ``MLP(single_bias_last_layer=)``,
``PercentileValueNorm(rate=, center=)``, ``QValueModule``/``QValueActor(strict_shape=)``,
``RandomPolicy()`` without a spec (filled by a collector), and
``SafeProbabilisticModule(generator=, num_samples=, log_prob_keys=, n_empirical_estimate=)``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from steersman.collectors import Collector
from steersman.data import Bounded, Categorical, MultiOneHot, OneHot
from steersman.envs import CartPoleEnv
from steersman.modules import (
    MLP,
    NoisyLinear,
    QValueActor,
    QValueModule,
    RandomPolicy,
    SafeProbabilisticModule,
)
from steersman.modules.value_norm import PercentileValueNorm
from steersman.tensordict import TensorDict
from steersman.tensordict.nn import InteractionType


# ------------------------------------------------------------------ MLP
@pytest.mark.parametrize("in_features", [3, None])
@pytest.mark.parametrize("activate_last_layer", [False, True])
def test_mlp_single_bias_last_layer(in_features, activate_last_layer):
    torch.manual_seed(0)
    mlp = MLP(in_features=in_features, out_features=4, num_cells=[5], single_bias_last_layer=True,
              activate_last_layer=activate_last_layer, activation_class=nn.Identity)
    x = torch.randn(6, 3)
    mlp(x)  # materializes a lazy input layer
    shapes = {k: tuple(v.shape) for k, v in mlp.state_dict().items()}
    assert shapes["2.weight"] == (4, 5) and "2.bias" not in shapes and shapes["3.bias"] == (1,)
    with torch.no_grad():
        mlp[3].bias.fill_(2.5)
    hidden = mlp[0](x)
    # the same scalar is added to every output feature (reference: the written-out math)
    torch.testing.assert_close(mlp(x), hidden @ mlp[2].weight.T + 2.5)
    mlp(x).sum().backward()
    assert mlp[3].bias.grad.shape == (1,) and float(mlp[3].bias.grad) == pytest.approx(6 * 4)


def test_mlp_single_bias_edge_cases():
    no_bias = MLP(in_features=3, out_features=4, depth=0, bias_last_layer=False, single_bias_last_layer=True)
    assert list(no_bias.state_dict()) == ["0.weight"]  # no bias at all: nothing is shared
    plain = MLP(in_features=3, out_features=4, depth=0)
    assert tuple(plain.state_dict()["0.bias"].shape) == (4,)
    with pytest.raises(ValueError, match="incompatible with NoisyLinear"):
        MLP(in_features=3, out_features=4, num_cells=[5], layer_class=NoisyLinear, single_bias_last_layer=True)


# ------------------------------------------------------------------ PercentileValueNorm
def test_percentile_value_norm_rate_and_center():
    returns = torch.linspace(0.0, 100.0, steps=101).unsqueeze(-1)
    vn = PercentileValueNorm(shape=1, rate=1.0)  # TorchRL's documented example
    vn.update(returns)
    torch.testing.assert_close(vn.scale(), torch.tensor([90.0]))
    torch.testing.assert_close(vn.normalize(torch.tensor([[50.0]])), torch.tensor([[50.0 / 90.0]]))
    centred = PercentileValueNorm(shape=1, rate=1.0, center=True)
    centred.update(returns)
    torch.testing.assert_close(centred.normalize(torch.tensor([[5.0], [95.0]])), torch.tensor([[0.0], [1.0]]))
    # rate is 1 - beta: a second batch moves the averages by `rate` towards its quantiles
    slow = PercentileValueNorm(shape=1, quantiles=(0.0, 1.0), rate=0.25)
    slow.update(torch.tensor([[0.0], [10.0]]))
    slow.update(torch.tensor([[0.0], [30.0]]))
    torch.testing.assert_close(slow.high, torch.tensor([10.0 + 0.25 * 20.0]))
    assert slow.rate == pytest.approx(0.25) and slow.beta == pytest.approx(0.75) and not slow.center


def test_percentile_value_norm_conflicting_names():
    with pytest.raises(ValueError, match="rate=0.1 and beta=0.5 disagree"):
        PercentileValueNorm(rate=0.1, beta=0.5)
    with pytest.raises(ValueError, match="center=True and scale_only=True disagree"):
        PercentileValueNorm(center=True, scale_only=True)
    with pytest.raises(ValueError, match="rate must be in"):
        PercentileValueNorm(rate=0.0)
    assert PercentileValueNorm(rate=0.5, beta=0.5).beta == 0.5


# ------------------------------------------------------------------ strict_shape
@pytest.mark.parametrize("spec", [Categorical(3), OneHot(3), Categorical(3, shape=(1,))])
def test_qvalue_strict_shape_refuses_wrong_number_of_actions(spec):
    values = torch.randn(5, 4)  # 4 action values for a spec of 3 actions
    with pytest.raises(RuntimeError, match="expects 3 action values"):
        QValueModule(spec=spec)(action_value=values)
    with pytest.raises(RuntimeError, match="expects 3 action values"):
        QValueModule(spec=spec, strict_shape=None)(action_value=values)
    action = QValueModule(spec=spec, strict_shape=False)(action_value=values)[0]
    assert action.shape[0] == 5  # no check: the argmax of the 4 values as before
    ok = QValueModule(spec=spec)(action_value=torch.randn(5, 3))[0]
    assert spec.is_in(ok)


def test_qvalue_strict_shape_auto_and_actor():
    spec = MultiOneHot([2, 3])
    action = QValueModule(spec=spec, strict_shape="auto")(action_value=torch.randn(7, 5))[0]
    assert action.shape == (7, 5) and spec.is_in(action)
    actor = QValueActor(nn.Linear(4, 4), spec=OneHot(3), strict_shape=True)
    with pytest.raises(RuntimeError, match="strict_shape='auto' reshapes"):
        actor(TensorDict(observation=torch.randn(2, 4), batch_size=[2]))
    loose = QValueActor(nn.Linear(4, 4), spec=OneHot(3), strict_shape=False)
    assert loose(TensorDict(observation=torch.randn(2, 4), batch_size=[2]))["action"].shape == (2, 4)
    with pytest.raises(ValueError, match="strict_shape must be"):
        QValueModule(spec=OneHot(3), strict_shape="yes")


# ------------------------------------------------------------------ RandomPolicy
def test_random_policy_lazy_spec_filled_by_collector():
    policy = RandomPolicy(action_key="action")
    with pytest.raises(RuntimeError, match="no action_spec yet"):
        policy(TensorDict(batch_size=[]))
    env = CartPoleEnv(batch_size=[2])
    collector = Collector(env, policy, frames_per_batch=8, total_frames=8)
    batch = next(iter(collector))
    assert policy.action_spec == env.full_action_spec
    assert batch["action"].shape == (2, 4) and env.full_action_spec["action"][0].is_in(batch["action"])
    collector.shutdown()


def test_random_policy_action_key():
    policy = RandomPolicy(Bounded(-1.0, 1.0, (2,)), action_key=("agent", "move"))
    td = policy(TensorDict(batch_size=[3]))
    assert td["agent", "move"].shape == (3, 2) and bool(td["agent", "move"].abs().max() <= 1)
    assert policy.out_keys == [("agent", "move")]


# ------------------------------------------------------------------ SafeProbabilisticModule
def _module(**kw):
    return SafeProbabilisticModule(["loc", "scale"], ["action"], spec=Bounded(-1.0, 1.0, (2,)),
                                   distribution_class=torch.distributions.Normal, safe=True,
                                   default_interaction_type=InteractionType.RANDOM, **kw)


def test_safe_probabilistic_module_generator_and_num_samples():
    params = TensorDict(loc=torch.zeros(3, 2), scale=torch.ones(3, 2), batch_size=[3])
    a = _module(generator=7)(params.clone())["action"]
    b = _module(generator=7)(params.clone())["action"]
    c = _module(generator=8)(params.clone())["action"]
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert bool((a.abs() <= 1).all())  # still projected into the spec
    many = _module(num_samples=4, return_log_prob=True, log_prob_keys=["action_lp"])(params.clone())
    assert many["action"].shape == (4, 3, 2) and many["action_lp"].shape[:2] == (4, 3)
    assert bool((many["action"].abs() <= 1).all())
    assert _module(n_empirical_estimate=17).n_empirical_estimate == 17


# ------------------------------------------------------------------ MaskedCategorical
@pytest.mark.parametrize("padding_value", [None, -1])
@pytest.mark.parametrize("neg_inf", [float("-inf"), -1e9])
def test_masked_categorical_cross_entropy_log_prob_equals_gather(padding_value, neg_inf):
    from steersman.modules import MaskedCategorical

    torch.manual_seed(0)
    logits = torch.randn(5, 4, requires_grad=True)
    mask = torch.rand(5, 4) > 0.3
    mask[:, 1] = True
    value = torch.tensor([1, 0, 3, -1 if padding_value is not None else 2, 1])
    kw = dict(mask=mask, neg_inf=neg_inf, padding_value=padding_value)
    fast = MaskedCategorical(logits=logits, **kw)
    plain = MaskedCategorical(logits=logits, use_cross_entropy=False, **kw)
    assert fast.use_cross_entropy and not plain.use_cross_entropy
    a, b = fast.log_prob(value), plain.log_prob(value)
    assert a.shape == b.shape == (5,)
    finite = torch.isfinite(b)
    torch.testing.assert_close(a[finite], b[finite])
    assert torch.equal(torch.isfinite(a), finite)  # masked actions: -inf (or hugely negative) in both
    ga, = torch.autograd.grad(a[finite].sum(), logits)
    gb, = torch.autograd.grad(b[finite].sum(), logits)
    torch.testing.assert_close(ga, gb)
    # broadcasting a [3, 5] value against the [5] batch, as Categorical.log_prob does
    many = torch.stack([value.clamp(min=0)] * 3)
    torch.testing.assert_close(fast.log_prob(many), plain.log_prob(many))
    assert fast.expand([2, 5]).use_cross_entropy


def test_masked_categorical_padding_side():
    from steersman.modules import MaskedCategorical

    logits, mask = torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)
    assert MaskedCategorical(logits=logits, mask=mask).padding_side == "left"  # TorchRL's default
    d = MaskedCategorical(logits=logits, mask=mask, padding_side="right")
    assert d.padding_side == "right" and d.expand([4, 2]).padding_side == "right"
    with pytest.raises(ValueError, match="padding_side must be 'left' or 'right', got 'top'"):
        MaskedCategorical(logits=logits, mask=mask, padding_side="top")
