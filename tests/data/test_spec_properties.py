"""Property tests (hypothesis): for random bounds, n, nvec, masks and shapes, samples are
in the spec, projections land in it and keep valid values, and ``is_in`` agrees with
``assert_is_in``."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from steersman.data import Bounded, Categorical, MultiCategorical, MultiOneHot, OneHot, TensorSpec

SETTINGS = settings(max_examples=60, deadline=None)

shapes = st.lists(st.integers(1, 3), min_size=0, max_size=3).map(tuple)
extra_shapes = st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple)
seeds = st.integers(0, 2**31 - 1)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _check_contract(spec: TensorSpec, extra: tuple, seed: int) -> None:
    x = spec.rand(extra)
    assert x.shape == extra + tuple(spec.shape)
    assert spec.is_in(x), (spec, x)
    assert torch.equal(spec.project(x), x)
    wild = torch.randn(extra + tuple(spec.shape), generator=_gen(seed), dtype=torch.float64) * 20
    p = spec.project(wild)
    assert spec.is_in(p), (spec, wild, p)
    assert spec.is_in(wild) == (spec._check(wild) is None)
    assert spec.is_in(spec.zero(extra)) and spec.is_in(spec.one(extra))


def _mask(shape: tuple, n: int, seed: int) -> torch.Tensor:
    m = torch.rand(*shape, n, generator=_gen(seed)) < 0.4
    first = torch.randint(0, n, shape, generator=_gen(seed + 1))
    return m | torch.nn.functional.one_hot(first, n).bool()  # >= 1 allowed per row


@st.composite
def bounds(draw):
    shape = draw(shapes)
    seed = draw(seeds)
    lo = torch.randn(shape, generator=_gen(seed), dtype=torch.float64) * draw(st.sampled_from([1e-3, 1.0, 1e3]))
    width = torch.rand(shape, generator=_gen(seed + 1), dtype=torch.float64) * draw(st.sampled_from([0.0, 1.0, 1e4]))
    hi = lo + width
    if draw(st.booleans()) and lo.numel():  # some infinite sides
        lo.view(-1)[0] = -float("inf")
    if draw(st.booleans()) and lo.numel():
        hi.view(-1)[-1] = float("inf")
    return lo, hi, shape


@given(b=bounds(), extra=extra_shapes, seed=seeds,
       dtype=st.sampled_from([torch.float32, torch.float64, torch.float16]))
@SETTINGS
def test_bounded_continuous(b, extra, seed, dtype):
    lo, hi, shape = b
    if dtype is torch.float16:  # keep bounds inside float16's range
        lo, hi = lo.clamp(-6e4, 6e4), hi.clamp(-6e4, 6e4)
        lo = torch.minimum(lo, hi)
        lo, hi = lo.to(dtype), hi.to(dtype)
    spec = Bounded(lo, hi, shape=shape, dtype=dtype)
    _check_contract(spec, extra, seed)
    x = spec.rand(extra)
    assert bool(x.isfinite().all())


@given(shape=shapes, extra=extra_shapes, seed=seeds,
       low=st.integers(-1000, 1000), width=st.integers(0, 50),
       dtype=st.sampled_from([torch.int64, torch.int32, torch.int16]))
@SETTINGS
def test_bounded_discrete(shape, extra, seed, low, width, dtype):
    spec = Bounded(low, low + width, shape=shape, dtype=dtype)
    _check_contract(spec, extra, seed)


@given(n=st.integers(1, 12), shape=shapes, extra=extra_shapes, seed=seeds, masked=st.booleans())
@SETTINGS
def test_categorical(n, shape, extra, seed, masked):
    mask = _mask(shape, n, seed) if masked else None
    spec = Categorical(n, shape=shape, mask=mask)
    _check_contract(spec, extra, seed)
    if mask is not None:
        x = spec.rand(extra)
        assert bool(mask.expand(*x.shape, n).gather(-1, x.unsqueeze(-1)).all())
        disallowed = (~mask).nonzero()
        if len(disallowed):
            v = spec.rand()
            v[tuple(disallowed[0, :-1].tolist())] = disallowed[0, -1]
            assert not spec.is_in(v)
    oh = spec.to_one_hot_spec()
    assert oh.is_in(spec.to_one_hot(spec.rand(extra)))


@given(n=st.integers(1, 8), shape=shapes, extra=extra_shapes, seed=seeds, masked=st.booleans())
@SETTINGS
def test_one_hot(n, shape, extra, seed, masked):
    mask = _mask(shape, n, seed) if masked else None
    spec = OneHot(n, shape=(*shape, n), mask=mask)
    _check_contract(spec, extra, seed)
    x = spec.rand(extra)
    assert spec.to_categorical_spec().is_in(spec.to_categorical(x))


@given(nvec=st.lists(st.integers(1, 5), min_size=1, max_size=4), shape=shapes, extra=extra_shapes,
       seed=seeds, masked=st.booleans())
@SETTINGS
def test_multi_categorical_and_multi_one_hot(nvec, shape, extra, seed, masked):
    mask = None
    if masked:
        mask = torch.cat([_mask(shape, n, seed + i) for i, n in enumerate(nvec)], -1)
    # remove_singleton=False: rand keeps the spec shape also for a [1] spec (the default
    # squeeze of TorchRL is tested in test_spec_keywords.py)
    mc = MultiCategorical(nvec, shape=(*shape, len(nvec)), mask=mask, remove_singleton=False)
    _check_contract(mc, extra, seed)
    moh = MultiOneHot(nvec, shape=(*shape, sum(nvec)), mask=mask)
    _check_contract(moh, extra, seed)
    x = mc.rand(extra)
    assert moh.is_in(mc.to_one_hot(x)) and torch.equal(moh.to_categorical(mc.to_one_hot(x)), x)


@given(shape=st.lists(st.integers(1, 3), min_size=1, max_size=3).map(tuple), seed=seeds)
@SETTINGS
def test_shape_ops_follow_values(shape, seed):
    lo = torch.randn(shape, generator=_gen(seed))
    spec = Bounded(lo, lo + 1)
    x = spec.rand()
    for d in range(len(shape)):
        idx = (slice(None),) * d + (shape[d] - 1,)
        assert spec[idx].is_in(x[idx])
        assert spec.unsqueeze(d).is_in(x.unsqueeze(d))
    assert spec.expand(2, *shape).is_in(x.expand(2, *shape))
