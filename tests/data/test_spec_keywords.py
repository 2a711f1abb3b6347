"""TorchRL's spec keywords: ``TensorSpec(shape, space, device, dtype, domain)`` for
subclasses, ``OneHot``/``MultiOneHot(use_register=)``, ``MultiCategorical(remove_singleton=)``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from steersman.data import (
    Categorical,
    ContinuousBox,
    MultiCategorical,
    MultiOneHot,
    OneHot,
    TensorSpec,
)


# ------------------------------------------------------------------ TensorSpec subclasses
class _UnitDisc(TensorSpec):
    """A spec written as a TorchRL user writes one: points of the closed unit disc."""

    def rand(self, shape=None):
        x = torch.rand(self._full_shape(shape))
        return x / x.norm(dim=-1, keepdim=True).clamp_min(1.0)

    def is_in(self, val):
        return bool((val.norm(dim=-1) <= 1 + 1e-6).all())


@pytest.mark.parametrize("positional", [True, False])
def test_tensor_spec_subclass_torchrl_signature(positional):
    box = ContinuousBox(-torch.ones(2), torch.ones(2))
    if positional:
        spec = _UnitDisc((2,), box, "cpu", torch.float64, "continuous")
    else:
        spec = _UnitDisc(shape=(2,), space=box, device="cpu", dtype=torch.float64,
                         domain="continuous", _encode_memo_dict={})
    assert spec.space is box and spec.dtype is torch.float64 and spec.shape == (2,)
    assert spec.domain == "continuous" and not spec.is_discrete
    x = spec.rand((5,))
    assert x.shape == (5, 2) and spec.is_in(x) and not spec.is_in(torch.full((2,), 3.0))
    # shape ops of the base class keep the user's space and domain
    assert spec.expand(3, 2).space is box and spec.unsqueeze(0).domain == "continuous"


def test_tensor_spec_domain_follows_argument_and_defaults():
    spec = _UnitDisc((1,), domain="discrete")
    assert spec.domain == "discrete" and spec.is_discrete and spec.space is None
    assert spec.dtype is torch.float32  # TorchRL's default
    assert _UnitDisc((1,)).domain == TensorSpec.domain  # no domain: the class default
    assert Categorical(3).space.n == 3  # built-in specs still compute their space
    with pytest.raises(TypeError, match="domain must be a str"):
        _UnitDisc((1,), domain=1)
    with pytest.raises(TypeError, match="_encode_memo_dict must be a dict"):
        _UnitDisc((1,), _encode_memo_dict=[])


# ------------------------------------------------------------------ use_register
def test_one_hot_register_maps_values_in_order_of_appearance():
    spec = OneHot(3, shape=(2, 3), use_register=True)
    a = spec.encode([42, 7])
    assert a.tolist() == [[True, False, False], [False, True, False]]
    b = spec.encode(np.array([7, 42]))  # known values keep their class
    assert b.tolist() == [[False, True, False], [True, False, False]]
    assert spec.encode([-5, 42])[0].tolist() == [False, False, True]
    assert spec.register == {42: 0, 7: 1, -5: 2}
    assert spec.to_numpy(b).tolist() == [7, 42] and spec.to_numpy(spec.rand()).dtype == np.int64
    assert spec.is_in(a)


def test_one_hot_register_overflow_leaves_register_unchanged():
    spec = OneHot(2, use_register=True)
    spec.encode("left")
    wide = OneHot(2, shape=(2, 2), use_register=True)
    wide.encode(["left", "left"])
    with pytest.raises(ValueError, match=r"3 distinct values seen but the spec has n=2"):
        wide.encode(["right", "up"])
    assert wide.register == {"left": 0}  # a failed encode registers nothing
    spec.encode("right")
    with pytest.raises(ValueError, match=r"3 distinct values seen but the spec has n=2"):
        spec.encode("up")
    assert spec.register == {"left": 0, "right": 1}
    assert spec.to_numpy(spec.encode("right")).item() == "right"
    with pytest.raises(ValueError, match="class\\(es\\) \\[1\\] have no registered value"):
        OneHot(2, use_register=True).to_numpy(torch.tensor([False, True]))


def test_one_hot_register_clone_copies_indexing_shares():
    spec = OneHot(3, shape=(2, 3), use_register=True)
    spec.encode([1, 2])
    clone, row = spec.clone(), spec[0]
    clone.encode([9, 9])
    row.encode(5)
    assert spec.register == {1: 0, 2: 1, 5: 2} and clone.register == {1: 0, 2: 1, 9: 2}
    assert spec == spec.clone() and spec != OneHot(3, shape=(2, 3))
    assert OneHot(3).encode(2).tolist() == [False, False, True]  # no register: indices


def test_multi_one_hot_register_per_part():
    spec = MultiOneHot([2, 3], use_register=True)
    x = spec.encode([["b", 10], ["a", 20], ["b", 30]])
    assert x.shape == (3, 5) and spec.is_in(x)
    assert spec.to_categorical(x).tolist() == [[0, 0], [1, 1], [0, 2]]
    back = spec.to_numpy(x)
    assert back.shape == (3, 2) and back[:, 0].tolist() == ["b", "a", "b"]
    assert back[:, 1].tolist() == [10, 20, 30]
    with pytest.raises(ValueError, match="4 distinct values seen but the spec has n=3"):
        spec.encode([["a", 40]])  # part 0 fits, part 1 does not: nothing is registered
    assert spec.to_numpy(spec.encode(["a", 30])).tolist() == ["a", 30]
    assert MultiOneHot([2, 3]).encode([1, 2]).tolist() == [False, True, False, False, True]


@pytest.mark.parametrize("cls,args", [(OneHot, (3,)), (MultiOneHot, ([2, 3],))])
def test_use_register_must_be_bool(cls, args):
    with pytest.raises(TypeError, match="use_register must be a bool"):
        cls(*args, use_register=torch.ones(3, dtype=torch.bool))


# ------------------------------------------------------------------ remove_singleton
@pytest.mark.parametrize("remove_singleton", [True, False])
@pytest.mark.parametrize("extra", [None, (5,), (2, 3)])
def test_multi_categorical_remove_singleton(remove_singleton, extra):
    spec = MultiCategorical([4], remove_singleton=remove_singleton)
    x = spec.rand(extra)
    lead = tuple(extra or ())
    assert x.shape == (lead if remove_singleton else (*lead, 1))
    assert bool(((x >= 0) & (x < 4)).all())
    assert spec.is_in(x) and spec.is_in(x.reshape(*lead, 1))
    spec.assert_is_in(x)
    assert not spec.is_in(torch.full(x.shape, 4))
    assert spec.zero().shape == (1,)  # only samples are squeezed (as TorchRL)


def test_remove_singleton_only_for_shape_one():
    assert MultiCategorical([4, 2]).rand().shape == (2,)
    assert MultiCategorical([4], shape=(3, 1)).rand().shape == (3, 1)  # batched: kept
    masked = MultiCategorical([3], mask=torch.tensor([False, False, True]))
    assert masked.rand((6,)).tolist() == [2] * 6  # masks squeeze too
    assert not MultiCategorical([4], remove_singleton=False).is_in(torch.tensor(1))
    with pytest.raises(TypeError, match="remove_singleton must be a bool"):
        MultiCategorical([4], remove_singleton="yes")
