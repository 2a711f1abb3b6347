"""Behaviour specific to each spec kind: constructors and their errors, dtype dispatch,
aliases, spaces, masks, conversions between categorical and one-hot forms, encoding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import steersman.data as data
from steersman.data import (
    Binary,
    Bounded,
    BoundedContinuous,
    BoundedDiscrete,
    Categorical,
    CategoricalBox,
    Composite,
    ContinuousBox,
    MultiCategorical,
    MultiOneHot,
    NonTensor,
    OneHot,
    TensorSpec,
    Unbounded,
    UnboundedContinuous,
    UnboundedDiscrete,
)

INF = float("inf")


# ---------------------------------------------------------------------- names
@pytest.mark.parametrize(
    ("alias", "target"),
    [
        ("BoundedTensorSpec", "Bounded"),
        ("CompositeSpec", "Composite"),
        ("DiscreteTensorSpec", "Categorical"),
        ("OneHotDiscreteTensorSpec", "OneHot"),
        ("UnboundedContinuousTensorSpec", "UnboundedContinuous"),
        ("UnboundedDiscreteTensorSpec", "UnboundedDiscrete"),
        ("MultiDiscreteTensorSpec", "MultiCategorical"),
        ("MultiOneHotDiscreteTensorSpec", "MultiOneHot"),
        ("BinaryDiscreteTensorSpec", "Binary"),
        ("NonTensorSpec", "NonTensor"),
    ],
)
def test_old_names_are_aliases(alias, target):
    assert getattr(data, alias) is getattr(data, target)
    assert alias in data.__all__ and target in data.__all__


def test_every_spec_is_a_tensor_spec():
    specs = [Unbounded(), Bounded(0, 1), Categorical(2), OneHot(2), MultiCategorical([2]),
             MultiOneHot([2]), Binary(2), NonTensor(), Composite()]
    assert all(isinstance(s, TensorSpec) for s in specs)


def test_alias_constructors_keep_their_defaults():
    assert data.UnboundedContinuousTensorSpec(3).dtype == torch.float32
    assert data.UnboundedDiscreteTensorSpec(3).dtype == torch.int64
    assert data.DiscreteTensorSpec(4).shape == torch.Size([])
    assert data.BoundedTensorSpec(-1, 1, (2,)).shape == torch.Size([2])
    assert data.CompositeSpec(a=Unbounded(2)).keys() == ["a"]


# ---------------------------------------------------------------------- dispatch, domain
def test_unbounded_dispatches_on_dtype():
    cont = Unbounded(shape=(2,))
    disc = Unbounded(shape=(2,), dtype=torch.int32)
    boolean = Unbounded(dtype=torch.bool)
    assert type(cont) is UnboundedContinuous and cont.domain == "continuous" and not cont.is_discrete
    assert type(disc) is UnboundedDiscrete and disc.domain == "discrete" and disc.is_discrete
    assert type(boolean) is UnboundedDiscrete and boolean.rand().dtype is torch.bool
    assert all(isinstance(s, Unbounded) for s in (cont, disc, boolean))
    assert Unbounded().shape == torch.Size([1])  # the TorchRL default
    assert Unbounded(4).shape == torch.Size([4])


def test_unbounded_subclasses_check_dtype():
    with pytest.raises(ValueError, match="floating dtype"):
        UnboundedContinuous(dtype=torch.int64)
    with pytest.raises(ValueError, match="integer or bool dtype"):
        UnboundedDiscrete(dtype=torch.float32)


def test_bounded_dispatches_on_dtype_and_domain():
    assert type(Bounded(0.0, 1.0)) is BoundedContinuous
    assert type(Bounded(0, 5, dtype=torch.int32)) is BoundedDiscrete
    disc = Bounded(0, 5, domain="discrete")
    assert type(disc) is BoundedDiscrete and disc.dtype == torch.int64
    assert isinstance(disc, Bounded) and disc.is_discrete
    with pytest.raises(ValueError, match="does not match"):
        Bounded(0, 1, dtype=torch.float32, domain="discrete")
    with pytest.raises(ValueError, match="complex"):
        Bounded(0, 1, dtype=torch.complex64)


def test_unbounded_rand_is_standard_normal_and_discrete_covers_the_range():
    x = Unbounded(shape=(20000,)).rand()
    assert abs(x.mean().item()) < 0.05 and abs(x.std().item() - 1) < 0.05
    ints = Unbounded(shape=(2000,), dtype=torch.int8).rand()
    assert ints.min() < -100 and ints.max() > 100


def test_unbounded_space_is_the_dtype_range():
    space = Unbounded(shape=(2,), dtype=torch.int16).space
    assert isinstance(space, ContinuousBox)
    assert torch.equal(space.low, torch.full((2,), -(2**15), dtype=torch.int16))
    assert torch.equal(space.high, torch.full((2,), 2**15 - 1, dtype=torch.int16))


# ---------------------------------------------------------------------- Bounded
def test_bounded_broadcasts_scalars_and_tensors():
    spec = Bounded(-1.0, torch.tensor([1.0, 2.0]), shape=(3, 2))
    assert spec.shape == (3, 2) and spec.low.shape == (3, 2) and spec.high.shape == (3, 2)
    assert torch.equal(spec.high[2], torch.tensor([1.0, 2.0]))
    assert Bounded(np.zeros(3), np.ones(3)).shape == (3,)  # shape from the bounds
    assert Bounded(0.0, 1.0).shape == ()
    assert spec.space == ContinuousBox(spec.low, spec.high)
    low, high = spec.space
    assert torch.equal(low, spec.low) and torch.equal(high, spec.high)


def test_bounded_bounds_do_not_alias_the_inputs():
    low = torch.zeros(2)
    spec = Bounded(low, 1.0)
    low.fill_(5.0)
    assert torch.equal(spec.low, torch.zeros(2))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"low": 1.0, "high": 0.0}, r"low > high .* index \(\): low=1.0, high=0.0"),
        ({"low": torch.tensor([0.0, 3.0]), "high": 2.0}, r"low > high at 1 of 2 .* index \(1,\)"),
        ({"low": torch.zeros(3), "high": torch.ones(3), "shape": (4,)}, "do not broadcast to the spec shape"),
        ({"low": torch.zeros(3), "high": torch.ones(2)}, "do not broadcast together"),
        ({"low": float("nan"), "high": 1.0}, "NaN"),
        ({"low": -INF, "high": -INF}, "high must be > -inf"),
        ({"low": 0, "high": INF, "dtype": torch.int64}, "finite bounds"),
        ({"low": 0, "high": 300, "dtype": torch.uint8}, "exceed the range"),
    ],
)
def test_bounded_constructor_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Bounded(**kwargs)


def test_bounded_needs_both_bounds():
    with pytest.raises(TypeError, match="both low and high"):
        Bounded(low=0.0)


def test_bounded_half_infinite_and_huge_ranges_sample_finite_values():
    spec = Bounded(torch.tensor([0.0, -INF, -INF, 5.0]), torch.tensor([INF, -3.0, INF, 5.0]))
    x = spec.rand((1000,))
    assert bool(x.isfinite().all()) and spec.is_in(x)
    assert bool((x[:, 0] >= 0).all()) and bool((x[:, 1] <= -3).all()) and bool((x[:, 3] == 5).all())
    f = torch.finfo(torch.float32)
    huge = Bounded(f.min, f.max, shape=(1000,))
    y = huge.rand()
    assert bool(y.isfinite().all()) and huge.is_in(y) and y.abs().max() > 1e37


def test_bounded_rand_is_uniform():
    x = Bounded(2.0, 4.0, shape=(50000,)).rand()
    assert x.min() >= 2 and x.max() <= 4
    assert abs(x.mean().item() - 3.0) < 0.02
    hist = torch.histc(x, bins=4, min=2, max=4) / x.numel()
    assert bool(((hist - 0.25).abs() < 0.01).all()), hist


def test_bounded_float16_and_float64():
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        spec = Bounded(-1, 1, shape=(100,), dtype=dtype)
        x = spec.rand((3,))
        assert x.dtype == dtype and spec.is_in(x)
        assert spec.project(torch.full((100,), 3.0)).dtype == dtype


def test_bounded_discrete_samples_every_integer_and_rounds_bounds():
    spec = Bounded(-2.5, 3.7, shape=(5000,), domain="discrete")  # -> [-2, 3]
    assert spec.low[0].item() == -2 and spec.high[0].item() == 3
    x = spec.rand()
    assert x.dtype == torch.int64 and set(x.unique().tolist()) == set(range(-2, 4))
    assert torch.equal(spec.project(torch.full((5000,), 2.6)), torch.full((5000,), 3))
    assert not spec.is_in(torch.full((5000,), 4))


def test_bounded_is_in_rejects_nan_and_project_fixes_it():
    spec = Bounded(-1.0, 1.0, shape=(2,))
    bad = torch.tensor([0.0, float("nan")])
    assert not spec.is_in(bad)
    assert torch.equal(spec.project(bad), torch.zeros(2))
    assert torch.equal(spec.project(torch.tensor([-INF, INF])), torch.tensor([-1.0, 1.0]))


def test_bounded_is_in_accepts_other_float_dtypes():
    spec = Bounded(-1.0, 1.0, shape=(2,))
    assert spec.is_in(torch.zeros(2, dtype=torch.float64))
    assert not spec.is_in(torch.full((2,), 1.5, dtype=torch.float64))
    assert not spec.is_in(torch.zeros(2, dtype=torch.int64))  # another dtype kind


def test_to_dtype_switches_the_class():
    spec = Bounded(-1.5, 2.5, shape=(2,))
    disc = spec.to(torch.int32)
    assert type(disc) is BoundedDiscrete and disc.dtype == torch.int32
    assert torch.equal(disc.low, torch.full((2,), -1, dtype=torch.int32))
    assert type(Unbounded(2).to(torch.int64)) is UnboundedDiscrete
    assert Categorical(3).to(torch.int8).rand().dtype == torch.int8
    with pytest.raises(ValueError, match="integer or bool dtype"):
        Categorical(3).to(torch.float32)


# ---------------------------------------------------------------------- Categorical
@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: Categorical(0), "n must be a positive integer"),
        (lambda: Categorical(-2), "n must be a positive integer"),
        (lambda: Categorical(2.5), "n must be a positive integer"),
        (lambda: Categorical(3, dtype=torch.bool), "only 2 values"),
        (lambda: Categorical(3, dtype=torch.float32), "integer or bool dtype"),
        (lambda: Categorical(300, dtype=torch.int8), "cannot hold"),
        (lambda: Categorical(3, shape=(2,), mask=torch.ones(2, 4, dtype=torch.bool)), "mask of shape"),
        (lambda: OneHot(0), "n must be a positive integer"),
        (lambda: OneHot(3, shape=(2, 4)), "last dim of shape"),
        (lambda: OneHot(3, dtype=torch.complex64), "complex"),
        (lambda: MultiCategorical([2, 0]), "positive"),
        (lambda: MultiCategorical([2.0, 3.0]), "integers"),
        (lambda: MultiCategorical([2, 3], shape=(4,)), "does not broadcast"),
        (lambda: MultiOneHot([2, 3], shape=(4,)), "sum"),
        (lambda: MultiOneHot([]), "non-empty"),
        (lambda: Binary(3, shape=(4,)), "must be n=3"),
        (lambda: Binary(shape=()), "at least one dim"),
        (lambda: Binary(0), "positive"),
    ],
)
def test_discrete_constructor_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_binary_needs_n_or_shape():
    with pytest.raises(TypeError, match="n or shape"):
        Binary()
    assert Binary(shape=(2, 5)).n == 5


def test_categorical_n_space_cardinality():
    spec = Categorical(6, shape=(2,))
    assert spec.n == 6 and spec.cardinality() == 6 and spec.space == CategoricalBox(6)
    assert OneHot(4).cardinality() == 4 and OneHot(4).n == 4
    assert MultiCategorical([2, 3, 4]).cardinality() == 24
    assert MultiOneHot([2, 5]).cardinality() == 10
    assert Binary(3).cardinality() == 8


def test_categorical_rand_is_uniform():
    x = Categorical(4, shape=(40000,)).rand()
    counts = torch.bincount(x, minlength=4) / x.numel()
    assert bool(((counts - 0.25).abs() < 0.01).all()), counts


def test_done_spec_accepts_any_bool():
    done = Categorical(2, shape=(1,), dtype=torch.bool)
    assert done.is_in(torch.tensor([True])) and done.is_in(torch.zeros(5, 1, dtype=torch.bool))
    assert not done.is_in(torch.tensor([1]))  # an integer is another dtype kind
    assert not Categorical(1, dtype=torch.bool).is_in(torch.tensor(True))


def test_enumerate():
    cat = Categorical(3, shape=(2,))
    e = cat.enumerate()
    assert e.shape == (3, 2) and cat.is_in(e) and torch.equal(e[:, 0], torch.arange(3))
    oh = OneHot(3, shape=(2, 3))
    e = oh.enumerate()
    assert e.shape == (3, 2, 3) and oh.is_in(e) and torch.equal(oh.to_categorical(e)[:, 1], torch.arange(3))
    mc = MultiCategorical([2, 3])
    e = mc.enumerate()
    assert e.shape == (6, 2) and mc.is_in(e) and len({tuple(r) for r in e.tolist()}) == 6


# ---------------------------------------------------------------------- masks
def test_masked_categorical_draws_only_and_all_allowed_values():
    mask = torch.tensor([[True, False, True, False, False], [False, False, False, False, True]])
    spec = Categorical(5, shape=(2,), mask=mask)
    x = spec.rand((2000,))
    assert set(x[:, 0].unique().tolist()) == {0, 2}
    assert set(x[:, 1].unique().tolist()) == {4}
    assert spec.is_in(torch.tensor([2, 4])) and not spec.is_in(torch.tensor([1, 4]))
    with pytest.raises(ValueError, match="not allowed by the mask; first at index \\(0,\\): 1"):
        spec.assert_is_in(torch.tensor([1, 4]))
    # nearest allowed value (the lower one on ties); allowed values stay
    assert torch.equal(spec.project(torch.tensor([1, 0])), torch.tensor([0, 4]))
    assert torch.equal(spec.project(torch.tensor([4, 4])), torch.tensor([2, 4]))
    assert torch.equal(spec.project(torch.tensor([2, 4])), torch.tensor([2, 4]))
    assert torch.equal(spec.zero(), torch.tensor([0, 4]))


def test_update_mask_broadcasts_and_clears():
    spec = Categorical(3, shape=(4,))
    spec.update_mask(torch.tensor([False, True, False]))  # broadcast to [4, 3]
    assert spec.mask.shape == (4, 3)
    assert bool((spec.rand((50,)) == 1).all())
    assert not spec.is_in(torch.zeros(4, dtype=torch.int64))
    spec.update_mask(None)
    assert spec.mask is None and spec.is_in(torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="mask of shape"):
        spec.update_mask(torch.ones(5, dtype=torch.bool))


def test_update_mask_does_not_leak_into_derived_specs():
    spec = Categorical(3, shape=(2,))
    expanded = spec.expand(4, 2)
    spec.update_mask(torch.tensor([True, False, False]))
    assert expanded.mask is None and expanded.is_in(torch.full((4, 2), 2))
    assert spec != Categorical(3, shape=(2,))  # masks take part in ==


def test_mask_follows_shape_ops():
    mask = torch.tensor([[True, False, False], [False, False, True]])
    spec = Categorical(3, shape=(2,), mask=mask)
    assert torch.equal(spec[1].rand((10,)), torch.full((10,), 2))
    assert spec.expand(5, 2).mask.shape == (5, 2, 3)
    assert bool((spec.unsqueeze(0).rand((10,))[..., 0, 0] == 0).all())


def test_masked_onehot():
    spec = OneHot(4, mask=torch.tensor([False, True, False, True]))
    x = spec.rand((2000,))
    assert set(spec.to_categorical(x).unique().tolist()) == {1, 3}
    assert not spec.is_in(torch.tensor([True, False, False, False]))
    with pytest.raises(ValueError, match="mask forbids.*class 0"):
        spec.assert_is_in(torch.tensor([True, False, False, False]))
    assert torch.equal(spec.project(torch.tensor([9.0, 1.0, 5.0, 0.0])), torch.tensor([False, True, False, False]))
    assert torch.equal(spec.zero(), torch.tensor([False, True, False, False]))


def test_masked_multicategorical_and_multionehot():
    nvec = [2, 3]
    mask = torch.tensor([True, False, False, True, True])  # part 0: {0}; part 1: {1, 2}
    mc = MultiCategorical(nvec, mask=mask)
    x = mc.rand((2000,))
    assert set(x[:, 0].unique().tolist()) == {0} and set(x[:, 1].unique().tolist()) == {1, 2}
    assert not mc.is_in(torch.tensor([1, 1])) and not mc.is_in(torch.tensor([0, 0]))
    assert torch.equal(mc.project(torch.tensor([1, 0])), torch.tensor([0, 1]))
    moh = MultiOneHot(nvec, mask=mask)
    y = moh.rand((2000,))
    assert moh.is_in(y) and set(moh.to_categorical(y)[:, 1].unique().tolist()) == {1, 2}
    assert not moh.is_in(torch.tensor([False, True, False, True, False]))
    assert torch.equal(moh.project(torch.tensor([0.0, 5.0, 3.0, 1.0, 0.0])),
                       torch.tensor([True, False, False, True, False]))


def test_multicategorical_mask_needs_uniform_nvec():
    spec = MultiCategorical(torch.tensor([[2, 3], [3, 2]]))
    assert spec.is_in(torch.tensor([[1, 2], [2, 1]])) and not spec.is_in(torch.tensor([[2, 2], [2, 1]]))
    with pytest.raises(ValueError, match="same nvec for every batch element"):
        spec.update_mask(torch.ones(2, 5, dtype=torch.bool))


def test_binary_has_no_mask():
    with pytest.raises(TypeError, match="no action mask"):
        Binary(3).update_mask(torch.ones(3, dtype=torch.bool))


# ---------------------------------------------------------------------- conversions
def test_categorical_one_hot_round_trip():
    mask = torch.tensor([[True, True, False], [False, True, True]])
    cat = Categorical(3, shape=(2,), mask=mask)
    oh = cat.to_one_hot_spec()
    assert oh == OneHot(3, shape=(2, 3), mask=mask)
    assert oh.to_categorical_spec() == cat
    x = cat.rand((7,))
    y = cat.to_one_hot(x)
    assert y.shape == (7, 2, 3) and y.dtype == torch.bool and oh.is_in(y)
    assert torch.equal(oh.to_categorical(y), x)
    assert torch.equal(cat.to_one_hot(torch.tensor([0, 2])), torch.tensor([[1, 0, 0], [0, 0, 1]]).bool())
    with pytest.raises(ValueError, match="not allowed by the mask"):
        cat.to_one_hot(torch.tensor([2, 0]), safe=True)


def test_multicategorical_multionehot_round_trip():
    mc = MultiCategorical([2, 3, 4], shape=(5, 3))
    moh = mc.to_one_hot_spec()
    assert moh == MultiOneHot([2, 3, 4], shape=(5, 9))
    assert moh.to_categorical_spec() == mc
    x = mc.rand((2,))
    y = mc.to_one_hot(x)
    assert y.shape == (2, 5, 9) and moh.is_in(y)
    assert torch.equal(moh.to_categorical(y), x)


def test_onehot_encode_and_to_numpy_convert_indices():
    spec = OneHot(4, shape=(3, 4))
    idx = np.array([0, 3, 1])
    y = spec.encode(idx)
    assert y.shape == (3, 4) and spec.is_in(y)
    assert np.array_equal(spec.to_numpy(y), idx)
    assert torch.equal(spec.encode(y.numpy()), y)  # one-hot input is kept
    moh = MultiOneHot([2, 3])
    assert np.array_equal(moh.to_numpy(moh.encode(np.array([1, 2]))), [1, 2])


def test_to_numpy_safe_checks_values():
    spec = Bounded(0.0, 1.0, shape=(2,))
    assert np.array_equal(spec.to_numpy(torch.tensor([0.5, 0.25])), np.array([0.5, 0.25], dtype=np.float32))
    with pytest.raises(ValueError, match="out of bounds"):
        spec.to_numpy(torch.tensor([2.0, 0.0]), safe=True)


# ---------------------------------------------------------------------- encode
def test_encode_converts_dtype_device_and_shape():
    spec = Bounded(-1.0, 1.0, shape=(3,))
    out = spec.encode(np.array([0.1, 0.2, 0.3], dtype=np.float64))
    assert out.dtype == torch.float32 and out.device == spec.device and out.shape == (3,)
    assert spec.encode(np.zeros((1, 3))).shape == (1, 3)  # leading batch dims kept
    assert spec.encode(np.arange(3)[::-1].astype(np.float32)).tolist() == [2.0, 1.0, 0.0]
    with pytest.raises(ValueError, match=r"cannot encode a value of shape \[4\] into BoundedContinuous of shape \[3\]"):
        spec.encode([1.0, 2.0, 3.0, 4.0])


def test_encode_list_of_arrays():
    spec = Unbounded(shape=(2, 3))
    out = spec.encode([np.zeros(3), np.ones(3)])
    assert out.shape == (2, 3) and out.dtype == torch.float32 and out[1].sum() == 3


# ---------------------------------------------------------------------- NonTensor
def test_nontensor():
    spec = NonTensor(shape=(2,), example_data={"goal": 3})
    v = spec.zero((3,))
    assert v.batch_size == (3, 2) and v.data == {"goal": 3} and spec.is_in(v)
    assert not spec.is_in(torch.zeros(2))
    with pytest.raises(ValueError, match="expected non-tensor data, got Tensor"):
        spec.assert_is_in(torch.zeros(2))
    assert spec.to_numpy(spec.encode("x")) == "x"
    assert spec == NonTensor(shape=(2,), example_data={"goal": 3})
    assert spec != NonTensor(shape=(2,), example_data={"goal": 4})
    assert NonTensor().shape == (1,)


# ---------------------------------------------------------------------- shape ops errors
def test_event_dims_cannot_be_indexed_or_squeezed():
    spec = OneHot(3, shape=(2, 3))
    with pytest.raises(IndexError, match="last 1 dim"):
        spec[0, 1]
    with pytest.raises(ValueError, match="form one value"):
        spec.unsqueeze(-1)
    with pytest.raises(ValueError, match="must stay unchanged"):
        spec.expand(2, 4)
    with pytest.raises(ValueError, match="form one value"):
        OneHot(1, shape=(2, 1)).squeeze(-1)
    assert OneHot(1, shape=(2, 1)).squeeze().shape == (2, 1)  # the event dim stays
    assert spec.unsqueeze(1).shape == (2, 1, 3)
    with pytest.raises(ValueError, match="must stay"):
        spec.reshape(6)


def test_expand_with_minus_one_and_errors():
    spec = Bounded(0.0, 1.0, shape=(1, 3))
    assert spec.expand(4, -1, -1).shape == (4, 1, 3)
    assert spec.expand(2, 5, 3).shape == (2, 5, 3)
    with pytest.raises(ValueError, match="-1 for a new leading dim"):
        spec.expand(-1, 1, 3)
    with pytest.raises(ValueError, match="dim 1 has size 3"):
        spec.expand(1, 4)


def test_squeeze_noop_and_type_check():
    spec = Bounded(0.0, 1.0, shape=(2, 3))
    assert spec.squeeze(0) is spec and spec.squeeze() is spec
    with pytest.raises(IndexError, match="out of range"):
        spec.squeeze(5)
    spec.type_check(torch.zeros(2, 3))
    with pytest.raises(TypeError, match="float32 for key 'obs', got torch.float64"):
        spec.type_check(torch.zeros(2, 3, dtype=torch.float64), "obs")
