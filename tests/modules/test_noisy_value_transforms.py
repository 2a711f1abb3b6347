"""NoisyLinear / NoisyLazyLinear / reset_noise and the value transforms, against plain
formulas."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from steersman.modules import (
    ComposeValueTransform,
    IdentityValueTransform,
    NoisyLazyLinear,
    NoisyLinear,
    SignedHyperbolicValueTransform,
    SymLogValueTransform,
    ValueTransform,
    reset_noise,
    signed_hyperbolic,
    signed_parabolic,
    symexp,
    symlog,
)
from steersman.tensordict.nn import ExplorationType, set_exploration_type


def test_noisy_linear_init_and_forward_matches_plain_formula():
    torch.manual_seed(0)
    layer = NoisyLinear(4, 3, std_init=0.4)
    assert {n for n, _ in layer.named_parameters()} == {"weight_mu", "weight_sigma", "bias_mu", "bias_sigma"}
    assert {n for n, _ in layer.named_buffers()} == {"weight_epsilon", "bias_epsilon"}
    torch.testing.assert_close(layer.weight_sigma, torch.full((3, 4), 0.4 / math.sqrt(4)))
    torch.testing.assert_close(layer.bias_sigma, torch.full((3,), 0.4 / math.sqrt(3)))
    assert layer.weight_mu.abs().max() <= 1 / math.sqrt(4)
    # factorized noise: weight_epsilon = f(e_out) f(e_in)^T has rank 1, bias_epsilon = f(e_out)
    assert torch.linalg.matrix_rank(layer.weight_epsilon) == 1
    ratio = layer.weight_epsilon / layer.bias_epsilon[:, None]
    torch.testing.assert_close(ratio, ratio[:1].expand_as(ratio))
    x = torch.randn(5, 4)
    w = layer.weight_mu + layer.weight_sigma * layer.weight_epsilon
    b = layer.bias_mu + layer.bias_sigma * layer.bias_epsilon
    torch.testing.assert_close(layer(x), x @ w.T + b)
    torch.testing.assert_close(layer(x), layer(x))  # forward does not redraw
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        torch.testing.assert_close(layer(x), x @ layer.weight_mu.T + layer.bias_mu)
    with set_exploration_type(ExplorationType.RANDOM):
        torch.testing.assert_close(layer(x), x @ w.T + b)


def test_noisy_linear_train_mode_switch_and_no_bias():
    layer = NoisyLinear(3, 2, bias=False, use_exploration_type=False)
    assert layer.bias is None
    x = torch.randn(2, 3)
    noisy = x @ (layer.weight_mu + layer.weight_sigma * layer.weight_epsilon).T
    torch.testing.assert_close(layer(x), noisy)
    layer.eval()
    torch.testing.assert_close(layer(x), x @ layer.weight_mu.T)


def test_noisy_gradients_reach_mu_and_sigma():
    layer = NoisyLinear(3, 2)
    layer(torch.randn(4, 3)).sum().backward()
    for p in layer.parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0


def test_reset_noise_redraws_only_noisy_layers():
    torch.manual_seed(1)
    net = nn.Sequential(NoisyLinear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    eps, w = net[0].weight_epsilon.clone(), net[2].weight.clone()
    mu = net[0].weight_mu.clone()
    net.apply(reset_noise)
    assert not torch.equal(net[0].weight_epsilon, eps)
    assert torch.equal(net[2].weight, w) and torch.equal(net[0].weight_mu, mu)


def test_noisy_lazy_linear_materializes_to_noisy_linear():
    layer = NoisyLazyLinear(2, std_init=0.3)
    y = layer(torch.randn(6, 5))
    assert y.shape == (6, 2) and type(layer) is NoisyLinear and layer.in_features == 5
    assert layer.weight_epsilon.shape == (2, 5)
    torch.testing.assert_close(layer.weight_sigma, torch.full((2, 5), 0.3 / math.sqrt(5)))
    assert torch.linalg.matrix_rank(layer.weight_epsilon) == 1


# ---- value transforms ---------------------------------------------------------------------

def _h(x: float, eps: float) -> float:
    return math.copysign(math.sqrt(abs(x) + 1) - 1, x) + eps * x


_floats = st.floats(-1e4, 1e4, allow_nan=False)


@settings(max_examples=50, deadline=None)
@given(x=_floats, eps=st.sampled_from([0.0, 1e-3, 1e-2]))
def test_functional_transforms_match_plain_formulas(x, eps):
    t = torch.tensor([x], dtype=torch.float64)
    assert symlog(t).item() == pytest.approx(math.copysign(math.log1p(abs(x)), x))
    assert symexp(symlog(t)).item() == pytest.approx(x, rel=1e-9, abs=1e-9)
    assert signed_hyperbolic(t, eps).item() == pytest.approx(_h(x, eps), rel=1e-9, abs=1e-12)
    assert signed_parabolic(signed_hyperbolic(t, eps), eps).item() == pytest.approx(x, rel=1e-6, abs=1e-6)


@pytest.mark.parametrize(
    ("transform", "reference"),
    [
        (IdentityValueTransform(), lambda x: x),
        (SymLogValueTransform(), lambda x: math.copysign(math.log1p(abs(x)), x)),
        (SignedHyperbolicValueTransform(), lambda x: _h(x, 1e-3)),
        (SignedHyperbolicValueTransform(epsilon=0.05), lambda x: _h(x, 0.05)),
        (ComposeValueTransform(SymLogValueTransform(), SignedHyperbolicValueTransform()),
         lambda x: _h(math.copysign(math.log1p(abs(x)), x), 1e-3)),
    ],
    ids=["identity", "symlog", "hyperbolic", "hyperbolic-eps", "compose"],
)
def test_value_transforms_forward_and_inverse(transform, reference):
    x = torch.tensor([-50.0, -1.0, -0.1, 0.0, 0.3, 2.0, 1000.0], dtype=torch.float64)
    expected = torch.tensor([reference(v) for v in x.tolist()], dtype=torch.float64)
    assert isinstance(transform, ValueTransform)
    torch.testing.assert_close(transform(x), expected)
    torch.testing.assert_close(transform.inverse(transform(x)), x)
    y = torch.randn(3, 4, requires_grad=True)
    transform(y).sum().backward()
    assert torch.isfinite(y.grad).all()


def test_value_transform_bad_input():
    with pytest.raises(TypeError, match="abstract"):
        ValueTransform()
    with pytest.raises(ValueError, match="epsilon"):
        SignedHyperbolicValueTransform(epsilon=-1.0)
    with pytest.raises(TypeError, match="transform 1 is a Linear"):
        ComposeValueTransform(SymLogValueTransform(), nn.Linear(1, 1))
