"""Distributions: shapes, bounds and numerics against independent references.

References: TanhNormal vs the change of variables written out in float64 and a numerical
integral of the density; TruncatedNormal vs ``scipy.stats.truncnorm`` (that single test is
skipped without scipy) and numerical integration; MaskedCategorical vs a softmax over the
allowed actions computed by hand.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributions as D

from steersman.tensordict.nn.distributions import (
    Delta,
    MaskedCategorical,
    MaskedOneHotCategorical,
    OneHotCategorical,
    ReparamGradientStrategy,
    TanhNormal,
    TruncatedNormal,
)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _trapz_1d(f, lo: float, hi: float, n: int = 200_001) -> float:
    x = torch.linspace(lo, hi, n, dtype=torch.float64)
    return torch.trapezoid(f(x), x).item()


# ----------------------------------------------------------------------------- TanhNormal
def _tanh_normal_ref(value, loc, scale, low, high):
    """log p(y) by the change of variables, float64, written from scratch."""
    value, loc, scale = (t.double() for t in (value, loc, scale))
    low, high = torch.as_tensor(low, dtype=torch.float64), torch.as_tensor(high, dtype=torch.float64)
    m, r = (high + low) / 2, (high - low) / 2
    u = (value - m) / r
    x = 0.5 * torch.log((1 + u) / (1 - u))
    normal = -0.5 * ((x - loc) / scale) ** 2 - torch.log(scale) - 0.5 * math.log(2 * math.pi)
    jac = torch.log(r * (1 - u ** 2))
    return (normal - jac).sum(-1)


class TestTanhNormal:
    def test_is_distribution_and_shapes(self):
        loc, scale = torch.randn(4, 3, 2), torch.rand(4, 3, 2) + 0.1
        d = TanhNormal(loc, scale)
        assert isinstance(d, D.Distribution)
        assert d.batch_shape == (4, 3) and d.event_shape == (2,)
        assert d.sample().shape == (4, 3, 2)
        s = d.rsample((5,))
        assert s.shape == (5, 4, 3, 2)
        assert d.log_prob(s).shape == (5, 4, 3)
        assert d.entropy().shape == (4, 3)
        d0 = TanhNormal(loc, scale, event_dims=0)
        assert d0.batch_shape == (4, 3, 2) and d0.log_prob(s).shape == (5, 4, 3, 2)
        assert TanhNormal(torch.zeros(()), torch.ones(())).log_prob(torch.tensor(0.1)).shape == ()

    @pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
    def test_log_prob_matches_change_of_variables(self, dtype, tol):
        loc, scale = torch.randn(64, 3, dtype=dtype), torch.rand(64, 3, dtype=dtype) + 0.2
        low, high = torch.tensor([-1.0, 0.0, -3.0], dtype=dtype), torch.tensor([1.0, 2.0, 5.0], dtype=dtype)
        d = TanhNormal(loc, scale, low=low, high=high)
        y = d.sample()
        ref = _tanh_normal_ref(y, loc, scale, low, high)
        torch.testing.assert_close(d.log_prob(y).double(), ref, rtol=tol, atol=tol)

    def test_density_integrates_to_one_and_mean_matches_samples(self):
        loc, scale, low, high = torch.tensor([0.3]), torch.tensor([0.8]), -2.0, 3.0
        d64 = TanhNormal(loc.double(), scale.double(), low=low, high=high)
        eps = 1e-9
        total = _trapz_1d(lambda x: d64.log_prob(x[:, None]).exp(), low + eps, high - eps)
        assert abs(total - 1) < 1e-4
        mean_quad = _trapz_1d(lambda x: x * d64.log_prob(x[:, None]).exp(), low + eps, high - eps)
        samples = TanhNormal(loc, scale, low=low, high=high).sample((200_000,))
        assert abs(samples.mean().item() - mean_quad) < 0.01

    def test_bounds_respected_even_when_saturated(self):
        low, high = torch.tensor([-1.0, 0.0]), torch.tensor([1.0, 0.5])
        loc = torch.tensor([[50.0, -50.0], [-100.0, 100.0]])
        d = TanhNormal(loc, torch.full_like(loc, 0.1), low=low, high=high)
        s = d.rsample((100,))
        assert ((s > low) & (s < high)).all()
        assert torch.isfinite(d.log_prob(s)).all()
        # the bounds themselves get a finite log-probability (clamped just inside)
        assert torch.isfinite(d.log_prob(torch.stack([low, high]))).all()

    def test_mode_and_deterministic_sample(self):
        loc, scale = torch.randn(3, 2), torch.rand(3, 2) + 0.1
        d = TanhNormal(loc, scale, low=-2.0, high=4.0)
        torch.testing.assert_close(d.mode, 1.0 + 3.0 * torch.tanh(loc))
        torch.testing.assert_close(d.deterministic_sample, d.mode)
        with pytest.raises(NotImplementedError):
            d.mean  # noqa: B018

    def test_entropy_estimate_matches_minus_log_prob(self):
        loc = torch.tensor([[0.2, -1.0], [1.5, 0.0]], dtype=torch.float64)
        scale = torch.tensor([[0.5, 1.0], [0.3, 2.0]], dtype=torch.float64)
        d = TanhNormal(loc, scale, low=-2.0, high=2.0)
        ref = -d.log_prob(d.sample((400_000,))).mean(0)
        torch.testing.assert_close(d.entropy(n_samples=100_000), ref, atol=0.01, rtol=0)

    def test_gradients(self):
        loc = torch.randn(8, 2, requires_grad=True)
        scale = (torch.rand(8, 2) + 0.1).requires_grad_()
        d = TanhNormal(loc, scale, tanh_loc=True, upscale=3.0)
        (d.log_prob(d.rsample()).sum() + d.entropy().sum()).backward()
        assert torch.isfinite(loc.grad).all() and loc.grad.abs().sum() > 0
        assert torch.isfinite(scale.grad).all()

    def test_tanh_loc(self):
        loc = torch.tensor([10.0, -10.0])
        d = TanhNormal(loc, torch.ones(2), tanh_loc=True, upscale=2.0)
        torch.testing.assert_close(d.loc, 2.0 * torch.tanh(loc / 2.0))

    def test_bad_bounds(self):
        with pytest.raises(ValueError, match="low"):
            TanhNormal(torch.zeros(2), torch.ones(2), low=1.0, high=1.0)
        with pytest.raises(ValueError, match="broadcast"):
            TanhNormal(torch.zeros(2), torch.ones(2), low=torch.zeros(3), high=torch.ones(3))

    def test_expand(self):
        d = TanhNormal(torch.zeros(2), torch.ones(2)).expand([4])
        assert d.batch_shape == (4,) and d.sample().shape == (4, 2)


# ----------------------------------------------------------------------------- TruncatedNormal
CASES = [  # loc, scale, low, high
    (0.0, 1.0, -1.0, 1.0),
    (0.5, 2.0, 0.0, 1.0),
    (0.0, 1.0, 3.0, 5.0),  # deep right tail
    (0.0, 1.0, -10.0, -8.0),  # deep left tail
    (1.0, 0.5, -math.inf, 0.5),
    (-1.0, 3.0, 0.0, math.inf),
]


def _tn(case, dtype=torch.float64):
    loc, scale, low, high = case
    return TruncatedNormal(torch.tensor([loc], dtype=dtype), torch.tensor([scale], dtype=dtype),
                           low=low, high=high)


class TestTruncatedNormal:
    @pytest.mark.parametrize("case", CASES)
    def test_against_scipy(self, case):
        stats = pytest.importorskip("scipy.stats")
        loc, scale, low, high = case
        ref = stats.truncnorm((low - loc) / scale, (high - loc) / scale, loc=loc, scale=scale)
        d = _tn(case)
        lo = max(low, ref.ppf(0.001))
        hi = min(high, ref.ppf(0.999))
        xs = torch.linspace(lo, hi, 11, dtype=torch.float64)
        torch.testing.assert_close(d.log_prob(xs[:, None]), torch.as_tensor(ref.logpdf(xs.numpy())),
                                   rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(d.cdf(xs[:, None])[:, 0], torch.as_tensor(ref.cdf(xs.numpy())),
                                   rtol=1e-6, atol=1e-9)
        assert abs(d.mean.item() - ref.mean()) < 1e-6 * max(1.0, abs(ref.mean()))
        assert abs(d.variance.item() - ref.var()) < 1e-5 * max(1.0, ref.var())
        # scipy's entropy computes inf * 0 for an infinite bound: clip the bounds at ±50 sd
        a, b = max((low - loc) / scale, -50.0), min((high - loc) / scale, 50.0)
        ref_h = stats.truncnorm(a, b, loc=loc, scale=scale).entropy()
        assert abs(d.entropy().item() - ref_h) < 1e-6

    @pytest.mark.parametrize("case", [c for c in CASES if math.isfinite(c[2]) and math.isfinite(c[3])])
    def test_against_numerical_integration(self, case):
        _, _, low, high = case
        d = _tn(case)

        def pdf(x):
            return d.log_prob(x[:, None]).exp()

        assert abs(_trapz_1d(pdf, low, high) - 1) < 1e-6
        assert abs(_trapz_1d(lambda x: x * pdf(x), low, high) - d.mean.item()) < 1e-6
        ent = _trapz_1d(lambda x: -pdf(x) * d.log_prob(x[:, None]).clamp_min(-1e300), low, high)
        assert abs(ent - d.entropy().item()) < 1e-5

    @pytest.mark.parametrize("case", CASES)
    def test_samples(self, case):
        _, _, low, high = case
        for dtype in (torch.float32, torch.float64):
            d = _tn(case, dtype)
            s = d.rsample((50_000,))
            assert s.dtype == dtype
            assert ((s >= low) & (s <= high)).all()
            assert abs(s.mean().item() - d.mean.item()) < 5 * d.variance.sqrt().item() / math.sqrt(50_000) + 1e-4
            # the CDF of the samples is uniform
            u = d.cdf(s.double()).sort(0).values[:, 0]
            assert (u - torch.linspace(0, 1, len(u), dtype=torch.float64)).abs().max() < 0.02

    def test_reparametrized_gradient(self):
        loc = torch.tensor([0.3], dtype=torch.float64, requires_grad=True)
        scale = torch.tensor([0.7], dtype=torch.float64, requires_grad=True)
        d = TruncatedNormal(loc, scale, low=-0.5, high=1.0)
        d.rsample((200_000,)).mean().backward()
        mc = (loc.grad.clone(), scale.grad.clone())
        loc.grad = scale.grad = None
        TruncatedNormal(loc, scale, low=-0.5, high=1.0).mean.sum().backward()
        torch.testing.assert_close(mc[0], loc.grad, atol=0.01, rtol=0)
        torch.testing.assert_close(mc[1], scale.grad, atol=0.01, rtol=0)

    def test_outside_mode_shapes(self):
        loc, scale = torch.tensor([[-2.0, 0.5, 3.0]]), torch.ones(1, 3)
        d = TruncatedNormal(loc, scale, low=-1.0, high=1.0)
        assert isinstance(d, D.Distribution)
        assert d.batch_shape == (1,) and d.event_shape == (3,)
        torch.testing.assert_close(d.mode, torch.tensor([[-1.0, 0.5, 1.0]]))
        torch.testing.assert_close(d.deterministic_sample, d.mode)
        assert d.log_prob(torch.tensor([[0.0, 0.0, 1.5]])).item() == -math.inf
        assert d.log_prob(d.sample((4,))).shape == (4, 1)
        assert d.entropy().shape == (1,)
        assert TruncatedNormal(loc, scale, event_dims=0).log_prob(torch.zeros(1, 3)).shape == (1, 3)
        assert torch.isfinite(d.entropy()).all()

    def test_gradients_finite_with_infinite_bounds(self):
        loc = torch.zeros(3, requires_grad=True)
        d = TruncatedNormal(loc, torch.ones(3), low=-math.inf, high=torch.tensor([0.0, 1.0, math.inf]))
        (d.log_prob(d.rsample()).sum() + d.entropy().sum() + d.mean.sum()).backward()
        assert torch.isfinite(loc.grad).all()


# ----------------------------------------------------------------------------- Delta
class TestDelta:
    def test_samples_and_properties(self):
        param = torch.randn(4, 2, requires_grad=True)
        d = Delta(param)
        assert isinstance(d, D.Distribution)
        assert d.batch_shape == (4,) and d.event_shape == (2,)
        assert torch.equal(d.sample(), param.detach()) and not d.sample().requires_grad
        assert d.sample((3,)).shape == (3, 4, 2)
        for t in (d.mean, d.mode, d.deterministic_sample):
            assert t is param
        d.rsample().sum().backward()
        assert torch.equal(param.grad, torch.ones(4, 2))
        assert torch.equal(d.variance, torch.zeros(4, 2))

    def test_log_prob(self):
        param = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
        d = Delta(param, atol=1e-3, rtol=0.0)
        value = torch.tensor([[1.0005, 2.0], [3.0, 4.1]])
        assert d.log_prob(value).tolist() == [0.0, -math.inf]
        assert Delta(param, batch_shape=[2, 2]).log_prob(value).shape == (2, 2)
        assert Delta(param, event_shape=[2, 2]).log_prob(param).shape == ()
        with pytest.raises(ValueError, match="shape"):
            Delta(param, batch_shape=[3], event_shape=[2])


# ----------------------------------------------------------------------------- one-hot
class TestOneHotCategorical:
    def test_mode_entropy_and_isinstance(self):
        logits = torch.randn(5, 4)
        d = OneHotCategorical(logits=logits)
        assert isinstance(d, D.OneHotCategorical)
        assert torch.equal(d.mode, torch.nn.functional.one_hot(logits.argmax(-1), 4).float())
        assert torch.equal(d.deterministic_sample, d.mode)
        torch.testing.assert_close(d.entropy(), D.Categorical(logits=logits).entropy())
        s = d.sample((7,))
        assert s.shape == (7, 5, 4) and torch.equal(s.sum(-1), torch.ones(7, 5))
        torch.testing.assert_close(OneHotCategorical(probs=logits.softmax(-1)).probs, d.probs)

    def test_straight_through_gradient(self):
        logits = torch.randn(3, 4, requires_grad=True)
        w = torch.randn(3, 4)
        d = OneHotCategorical(logits=logits)
        s = d.rsample()
        assert torch.equal(s.detach().sum(-1), torch.ones(3))  # a hard one-hot
        (s * w).sum().backward()
        g = logits.grad.clone()
        logits.grad = None
        (logits.softmax(-1) * w).sum().backward()  # straight-through: d sample = d probs
        torch.testing.assert_close(g, logits.grad)

    def test_relaxed(self):
        logits = torch.randn(3, 4, requires_grad=True)
        d = OneHotCategorical(logits=logits, grad_method=ReparamGradientStrategy.RelaxedOneHot,
                              temperature=0.5)
        s = d.rsample((2,))
        assert s.shape == (2, 3, 4)
        torch.testing.assert_close(s.sum(-1), torch.ones(2, 3))
        s.pow(2).sum().backward()
        assert torch.isfinite(logits.grad).all()


# ----------------------------------------------------------------------------- masked
def _manual(logits, mask):
    """The softmax over the allowed actions, by hand."""
    out = torch.zeros_like(logits)
    for idx in range(logits.shape[0]):
        allowed = mask[idx].nonzero().flatten()
        z = logits[idx, allowed]
        out[idx, allowed] = torch.exp(z - z.max()) / torch.exp(z - z.max()).sum()
    return out


class TestMaskedCategorical:
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 2.0, 0.0], [3.0, 3.0, 0.0, 1.0]])
    mask = torch.tensor([[True, True, False, False], [False, True, True, True], [False, False, False, True]])

    def test_matches_manual_softmax(self):
        d = MaskedCategorical(logits=self.logits, mask=self.mask)
        assert isinstance(d, D.Categorical)
        probs = _manual(self.logits, self.mask)
        torch.testing.assert_close(d.probs, probs)
        for a in range(4):
            lp = d.log_prob(torch.full((3,), a))
            expected = torch.where(self.mask[:, a], probs[:, a].log(), torch.tensor(-math.inf))
            torch.testing.assert_close(lp, expected)
        ent = -(probs * torch.where(probs > 0, probs.log(), torch.zeros(()))).sum(-1)
        torch.testing.assert_close(d.entropy(), ent)
        assert torch.equal(d.mode, torch.tensor([1, 2, 3]))
        assert torch.equal(d.deterministic_sample, d.mode)
        s = d.sample((2000,))
        assert self.mask.gather(-1, s.T).all()

    def test_probs_input_and_indices(self):
        probs = self.logits.softmax(-1)
        d = MaskedCategorical(probs=probs, mask=self.mask)
        torch.testing.assert_close(d.probs, _manual(self.logits, self.mask))
        idx = torch.tensor([[0, 1, -1], [1, 2, 3], [3, -1, -1]])
        d2 = MaskedCategorical(logits=self.logits, indices=idx, padding_value=-1)
        assert torch.equal(d2.mask, self.mask)
        torch.testing.assert_close(d2.probs, d.probs)

    def test_large_negative_neg_inf(self):
        d = MaskedCategorical(logits=self.logits, mask=self.mask, neg_inf=-1e9)
        torch.testing.assert_close(d.probs, _manual(self.logits, self.mask))
        lp = d.log_prob(torch.tensor([3, 0, 0]))
        assert torch.isfinite(lp).all() and (lp < -1e8).all()
        s = d.sample((2000,))
        assert self.mask.gather(-1, s.T).all()

    def test_gradients_are_finite(self):
        logits = self.logits.clone().requires_grad_()
        d = MaskedCategorical(logits=logits, mask=self.mask)
        (d.log_prob(torch.tensor([0, 1, 3])).sum() + d.entropy().sum()).backward()
        assert torch.isfinite(logits.grad).all()
        assert (logits.grad[~self.mask] == 0).all()

    def test_padding_and_rows_without_actions(self):
        mask = self.mask.clone()
        mask[1] = False
        d = MaskedCategorical(logits=self.logits, mask=mask, padding_value=-1)
        assert torch.isfinite(d.probs).all()
        assert d.sample().tolist()[1] == -1 and d.mode.tolist()[1] == -1
        lp = d.log_prob(torch.tensor([0, -1, 3]))
        assert lp[1].item() == 0.0 and torch.isfinite(lp).all()

    def test_expand(self):
        d = MaskedCategorical(logits=self.logits[0], mask=self.mask[0]).expand([5])
        assert d.batch_shape == (5,) and self.mask[0][d.sample()].all()


class TestMaskedOneHotCategorical:
    def test_masked_one_hot(self):
        logits = TestMaskedCategorical.logits.clone().requires_grad_()
        mask = TestMaskedCategorical.mask
        d = MaskedOneHotCategorical(logits=logits, mask=mask)
        assert isinstance(d, D.OneHotCategorical)
        torch.testing.assert_close(d.probs, _manual(logits.detach(), mask))
        assert torch.equal(d.mode, torch.nn.functional.one_hot(torch.tensor([1, 2, 3]), 4).float())
        s = d.sample((500,))
        assert (s * (~mask)).sum() == 0
        masked_one_hot = torch.nn.functional.one_hot(torch.tensor([2, 0, 0]), 4).float()
        assert (d.log_prob(masked_one_hot) == -math.inf).all()
        r = d.rsample()
        (r * torch.randn(3, 4)).sum().backward()
        assert torch.isfinite(logits.grad).all() and (logits.grad[~mask] == 0).all()
        assert MaskedOneHotCategorical(logits=logits, indices=torch.tensor([[0, 1], [1, 2], [3, 3]])).mask.tolist() == [
            [True, True, False, False], [False, True, True, False], [False, False, False, True]]
