"""IndependentNormal against torch's Independent(Normal), and the package's re-exports."""

from __future__ import annotations

import pytest
import torch
from torch import distributions as D

import steersman.modules as modules
import steersman.tensordict.nn as tdnn
from steersman.modules.distributions import IndependentNormal


@pytest.mark.parametrize("event_dim", [1, 2])
@pytest.mark.parametrize("tanh_loc", [False, True])
def test_independent_normal_matches_torch(event_dim, tanh_loc):
    g = torch.Generator().manual_seed(0)
    loc, scale = torch.randn(4, 3, 2, generator=g) * 10, torch.rand(4, 3, 2, generator=g) + 0.1
    d = IndependentNormal(loc, scale, upscale=3.0, tanh_loc=tanh_loc, event_dim=event_dim)
    mean = 3.0 * torch.tanh(loc / 3.0) if tanh_loc else loc
    ref = D.Independent(D.Normal(mean, scale), event_dim)
    x = torch.randn(4, 3, 2, generator=g)
    torch.testing.assert_close(d.log_prob(x), ref.log_prob(x))
    torch.testing.assert_close(d.entropy(), ref.entropy())
    assert d.batch_shape == ref.batch_shape and d.event_shape == ref.event_shape
    torch.testing.assert_close(d.mode, mean)
    torch.testing.assert_close(d.deterministic_sample, mean)
    assert bool(d.mode.abs().max() < 3.0) == tanh_loc
    assert d.rsample().requires_grad is False and d.has_rsample


def test_independent_normal_scalar_scale_and_gradients():
    loc = torch.zeros(5, 2, requires_grad=True)
    d = IndependentNormal(loc, 0.5)
    d.rsample().sum().backward()
    assert loc.grad is not None and torch.equal(loc.grad, torch.ones(5, 2))


def test_reexports():
    for name in modules.__all__:
        assert hasattr(modules, name), name
    for name in ["TanhNormal", "TruncatedNormal", "Delta", "OneHotCategorical", "MaskedCategorical",
                 "MaskedOneHotCategorical", "NormalParamExtractor", "ExplorationType",
                 "set_exploration_type", "exploration_type"]:
        assert getattr(modules, name) is getattr(tdnn, name), name
