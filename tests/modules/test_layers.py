"""BatchRenorm1d (against a plain loop), consistent dropout, TanhModule/TanhDelta squash,
DistributionalDQNnet, NormalParamWrapper and set_exploration_modules_spec_from_env."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from steersman.data import Bounded, Composite
from steersman.modules import (
    AdditiveGaussianModule,
    BatchRenorm1d,
    ConsistentDropout,
    ConsistentDropoutModule,
    DistributionalDQNnet,
    NormalParamWrapper,
    TanhDelta,
    TanhModule,
    set_exploration_modules_spec_from_env,
)
from steersman.tensordict import TensorDict
from steersman.tensordict.nn import NormalParamExtractor


def _renorm_reference(batches, momentum, eps, max_r, max_d, warmup, smooth):
    """Plain per-feature loop of batch renormalization (weight 1, bias 0)."""
    n_feat = batches[0].shape[1]
    mean_run, var_run = [0.0] * n_feat, [1.0] * n_feat
    outs = []
    for step, x in enumerate(batches):
        y = torch.empty_like(x)
        ramp = min(step / warmup, 1.0) if (warmup and smooth) else (float(step >= warmup) if warmup else 1.0)
        for f in range(n_feat):
            col = x[:, f].tolist()
            m = sum(col) / len(col)
            v = sum((c - m) ** 2 for c in col) / len(col)
            s, s_run = (v + eps) ** 0.5, (var_run[f] + eps) ** 0.5
            r = min(max(s / s_run, 1 / max_r), max_r)
            d = min(max((m - mean_run[f]) / s_run, -max_d), max_d)
            r, d = 1 + (r - 1) * ramp, d * ramp
            y[:, f] = torch.tensor([(c - m) / s * r + d for c in col])
            mean_run[f] += momentum * (m - mean_run[f])
            var_run[f] += momentum * (v * len(col) / (len(col) - 1) - var_run[f])
        outs.append(y)
    return outs, mean_run, var_run


@pytest.mark.parametrize(("warmup", "smooth"), [(0, False), (2, False), (3, True)])
def test_batch_renorm_matches_plain_loop(warmup, smooth):
    torch.manual_seed(0)
    batches = [torch.randn(6, 3, dtype=torch.float64) * (1 + i) + i for i in range(5)]
    norm = BatchRenorm1d(3, momentum=0.3, max_r=1.5, max_d=0.5, warmup_steps=warmup, smooth=smooth).double()
    outs, mean_run, var_run = _renorm_reference(batches, 0.3, 1e-5, 1.5, 0.5, warmup, smooth)
    for x, expected in zip(batches, outs):
        torch.testing.assert_close(norm(x), expected)
    torch.testing.assert_close(norm.running_mean, torch.tensor(mean_run, dtype=torch.float64))
    torch.testing.assert_close(norm.running_var, torch.tensor(var_run, dtype=torch.float64))
    norm.eval()
    x = torch.randn(4, 3, dtype=torch.float64)
    torch.testing.assert_close(norm(x), (x - norm.running_mean) / (norm.running_var + 1e-5).sqrt())
    with pytest.raises(ValueError, match=r"expected \[N, 3"):
        norm(torch.randn(4, 2, dtype=torch.float64))


def test_batch_renorm_gradients_and_feature_dim_one():
    norm = BatchRenorm1d(2, warmup_steps=0)
    x = torch.randn(5, 2, 7, requires_grad=True)
    norm(x).pow(2).sum().backward()
    assert x.grad is not None and norm.weight.grad is not None


def test_consistent_dropout_mask_values_and_reuse():
    torch.manual_seed(0)
    drop = ConsistentDropout(0.25)
    x = torch.randn(200, 10)
    y, mask = drop(x)
    assert set(mask.unique().tolist()) <= {0.0, torch.tensor(1 / 0.75).item()}
    assert 0.15 < (mask == 0).float().mean() < 0.35
    torch.testing.assert_close(y, x * mask)
    torch.testing.assert_close(drop(x, mask)[0], y)  # same mask, same units dropped
    drop.eval()
    assert drop(x) is x
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\)"):
        ConsistentDropout(1.0)


def test_consistent_dropout_module_keeps_mask_in_tensordict():
    torch.manual_seed(0)
    drop = ConsistentDropoutModule(0.5, in_keys=["h", "h_mask"])
    td = drop(TensorDict({"h": torch.ones(4, 8)}, [4]))
    mask = td["h_mask"]
    torch.testing.assert_close(td["h"], mask)
    again = drop(TensorDict({"h": torch.full((4, 8), 2.0), "h_mask": mask}, [4]))
    torch.testing.assert_close(again["h"], 2 * mask)
    drop.eval()
    assert torch.equal(drop(TensorDict({"h": torch.ones(4, 8)}, [4]))["h"], torch.ones(4, 8))
    with pytest.raises(ValueError, match="2 entries"):
        ConsistentDropoutModule(0.5, in_keys=["a", "b", "c"])


@pytest.mark.parametrize("clamp", [False, True])
@pytest.mark.parametrize("bounds", ["default", "scalars", "tensor", "spec"])
def test_tanh_module_matches_formula(bounds, clamp):
    low, high = {"default": (-1.0, 1.0), "scalars": (-2.0, 5.0), "tensor": (torch.tensor([-1.0, 0.0]), 3.0),
                 "spec": (torch.tensor([-3.0, 0.0]), torch.tensor([1.0, 0.5]))}[bounds]
    if bounds == "default":
        module = TanhModule(["a"], ["b"], clamp=clamp)
    elif bounds == "spec":
        module = TanhModule("a", "b", spec=Composite(b=Bounded(low, high, (2,))), clamp=clamp)
    else:
        module = TanhModule("a", "b", low=low, high=high, clamp=clamp)
    x = torch.randn(5, 2) * 3
    out = module(TensorDict({"a": x}, [5]))["b"]
    low_t, high_t = torch.as_tensor(low), torch.as_tensor(high)
    expected = low_t + (high_t - low_t) * (torch.tanh(x) + 1) / 2
    torch.testing.assert_close(out, expected)
    assert bool((out >= low_t).all() and (out <= high_t).all())


def test_tanh_module_bad_bounds():
    with pytest.raises(ValueError, match="low must be < high"):
        TanhModule("a", low=1.0, high=0.0)
    with pytest.raises(ValueError, match="not both"):
        TanhModule("a", spec=Bounded(-1, 1, (1,)), low=0.0)


def test_tanh_delta():
    param = torch.tensor([[0.0, 2.0], [-1.0, 100.0]], requires_grad=True)
    d = TanhDelta(param, low=torch.tensor([-2.0, 0.0]), high=3.0)
    expected = torch.tensor([-2.0, 0.0]) + torch.tensor([5.0, 3.0]) * (param.detach().tanh() + 1) / 2
    torch.testing.assert_close(d.mode, expected)
    torch.testing.assert_close(d.deterministic_sample, expected)
    assert d.batch_shape == (2,) and d.event_shape == (2,)
    assert d.sample((3,)).shape == (3, 2, 2) and not d.sample().requires_grad
    d.rsample().sum().backward()
    assert param.grad is not None and param.grad.abs().sum() > 0
    other = expected.clone()
    other[1, 0] += 0.1
    torch.testing.assert_close(d.log_prob(other), torch.tensor([0.0, -float("inf")]))
    with pytest.raises(ValueError, match="low must be < high"):
        TanhDelta(param, low=1.0, high=1.0)


def test_distributional_dqn_net_log_softmax_over_atoms():
    values = torch.randn(3, 11, 4)
    out = DistributionalDQNnet()(TensorDict({"action_value": values.clone()}, [3]))["action_value"]
    expected = values - values.exp().sum(-2, keepdim=True).log()
    torch.testing.assert_close(out, expected)
    with pytest.raises(ValueError, match="n_atoms"):
        DistributionalDQNnet(in_keys=["q"])(TensorDict({"q": torch.randn(3)}, [3]))


def test_normal_param_wrapper_is_net_then_extractor():
    net = nn.Linear(3, 6)
    wrapper = NormalParamWrapper(net, scale_mapping="exp", scale_lb=0.0)
    x = torch.randn(5, 3)
    loc, scale = wrapper(x)
    ref_loc, ref_scale = NormalParamExtractor(scale_mapping="exp", scale_lb=0.0)(net(x))
    torch.testing.assert_close(loc, ref_loc)
    torch.testing.assert_close(scale, net(x)[..., 3:].exp())
    torch.testing.assert_close(scale, ref_scale)


def test_set_exploration_modules_spec_from_env_fills_missing_specs():
    class Env:
        action_spec = Composite(action=Bounded(-1.0, 1.0, (2,)))

    explore = AdditiveGaussianModule(sigma_init=100.0, safe=True)
    given = AdditiveGaussianModule(Bounded(-5.0, 5.0, (2,)), sigma_init=100.0, safe=True)
    policy = nn.Sequential(explore, given)
    set_exploration_modules_spec_from_env(policy, Env())
    assert explore.spec["action"].shape == (2,)
    assert float(given.spec["action"].space.high.max()) == 5.0  # a given spec is kept
    out = explore(TensorDict({"action": torch.zeros(64, 2)}, [64]))["action"]
    assert out.abs().max() <= 1.0 and out.abs().max() > 0.5
