"""Value normalizers against plain references: the statistics after a stream of batches,
normalize/denormalize inverses, state_dict round trips, bad shapes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from steersman.modules.value_norm import PercentileValueNorm, PopArtValueNorm, RunningValueNorm


def _stream(seed=0, n=6, shape=(2,)):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(int(torch.randint(1, 9, (1,), generator=g)), 3, *shape, generator=g) * 4 + 2
            for _ in range(n)]


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 1000), n=st.integers(1, 6))
def test_running_equals_statistics_of_everything_seen(seed, n):
    batches = _stream(seed, n)
    vn = RunningValueNorm(shape=2, epsilon=0.0)
    for b in batches:
        vn.update(b)
    allx = torch.cat([b.reshape(-1, 2) for b in batches]).double()
    torch.testing.assert_close(vn.loc().double(), allx.mean(0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(vn.var().double(), allx.var(0, correction=0), rtol=1e-4, atol=1e-4)
    assert float(vn.count) == allx.shape[0]


@pytest.mark.parametrize("beta", [0.0, 0.9, 0.99999])
def test_popart_equals_debiased_ema_reference(beta):
    batches = _stream(1, 5, shape=(1,))
    vn = PopArtValueNorm(shape=1, beta=beta, epsilon=1e-8)
    m = m2 = d = 0.0
    for b in batches:
        vn.update(b)
        x = b.double()
        m = beta * m + (1 - beta) * x.mean().item()
        m2 = beta * m2 + (1 - beta) * x.pow(2).mean().item()
        d = beta * d + (1 - beta)
    loc, var = m / d, m2 / d - (m / d) ** 2
    assert vn.loc().item() == pytest.approx(loc, rel=1e-4)
    assert vn.scale().item() == pytest.approx(max(var, 1e-8) ** 0.5, rel=1e-3)


def test_percentile_equals_ema_of_quantiles():
    batches = _stream(2, 4, shape=(1,))
    vn = PercentileValueNorm(quantiles=(0.1, 0.9), beta=0.5, min_scale=0.0)
    lo = hi = None
    for b in batches:
        vn.update(b)
        q = torch.quantile(b.reshape(-1), torch.tensor([0.1, 0.9]))
        lo = q[0] if lo is None else 0.5 * lo + 0.5 * q[0]
        hi = q[1] if hi is None else 0.5 * hi + 0.5 * q[1]
    torch.testing.assert_close(vn.scale(), (hi - lo).view(1))
    x = torch.randn(4, 1)
    torch.testing.assert_close(vn.normalize(x), x / (hi - lo))  # scale only: not re-centred
    centred = PercentileValueNorm(quantiles=(0.1, 0.9), beta=0.5, min_scale=0.0, scale_only=False)
    for b in batches:
        centred.update(b)
    torch.testing.assert_close(centred.normalize(x), (x - lo) / (hi - lo))
    assert PercentileValueNorm(min_scale=1.0).scale().item() == 1.0  # floored span before any data


@pytest.mark.parametrize("cls", [PopArtValueNorm, RunningValueNorm, PercentileValueNorm])
def test_identity_before_updates_inverse_and_state_dict(cls):
    vn = cls(shape=1)
    x = torch.randn(5, 3, 1)
    torch.testing.assert_close(vn.normalize(x), x if cls is not RunningValueNorm else x / (1 + vn.epsilon) ** 0.5)
    for b in _stream(3, 3, shape=(1,)):
        vn.update(b)
    torch.testing.assert_close(vn.denormalize(vn.normalize(x)), x, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(vn.normalize(x), x)
    other = cls(shape=1)
    other.load_state_dict(vn.state_dict())
    torch.testing.assert_close(other.normalize(x), vn.normalize(x))


@pytest.mark.parametrize("cls", [PopArtValueNorm, RunningValueNorm, PercentileValueNorm])
def test_bad_shape_names_expected_and_actual(cls):
    vn = cls(shape=1)
    before = {k: v.clone() for k, v in vn.state_dict().items()}
    with pytest.raises(ValueError, match=r"must end with shape \[1\], got \[4, 2\]"):
        vn.update(torch.randn(4, 2))
    for k, v in vn.state_dict().items():
        assert torch.equal(v, before[k])  # state unchanged


def test_normalized_targets_are_standard():
    vn = RunningValueNorm()
    x = torch.randn(4096, 1) * 5 + 3
    vn.update(x)
    y = vn.normalize(x)
    assert abs(y.mean().item()) < 1e-4 and abs(y.std().item() - 1) < 1e-2
