"""Lazy stacks of specs (Stacked, StackedComposite) and the spec helpers, member by member."""

from __future__ import annotations

import pytest
import torch

from steersman.data import (
    Binary,
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    OneHot,
    Stacked,
    StackedComposite,
    Unbounded,
    check_no_exclusive_keys,
    consolidate_spec,
    contains_lazy_spec,
)

PAIRS = {  # two specs of one kind that differ (bounds or shape)
    "bounded": (Bounded(0, 1, shape=(3,)), Bounded(-2, 0, shape=(3,))),
    "bounded_shapes": (Bounded(0, 1, shape=(3,)), Bounded(0, 1, shape=(5,))),
    "unbounded_shapes": (Unbounded(shape=(2,)), Unbounded(shape=(4,))),
    "categorical": (Categorical(3, shape=(2,)), Categorical(7, shape=(2,))),
    "onehot": (OneHot(3), OneHot(5)),
    "multicategorical": (MultiCategorical([2, 3]), MultiCategorical([4, 2])),
    "binary": (Binary(3), Binary(4)),
}


@pytest.mark.parametrize("kind", sorted(PAIRS))
def test_stack_draws_are_in_their_member(kind):
    a, b = PAIRS[kind]
    s = torch.stack([a, b], 0)
    assert isinstance(s, Stacked) and len(s) == 2 and s[0] == a and s[1] == b
    for how in ("rand", "zero"):
        x = getattr(s, how)()
        parts = list(x.unbind()) if x.is_nested else list(x.unbind(0))
        assert a.is_in(parts[0]) and b.is_in(parts[1]) and s.is_in(x)
    same = a.shape == b.shape
    assert s.shape == (2, *[d if d == e else -1 for d, e in zip(a.shape, b.shape)])
    if same:
        draws = s.rand((4,))
        assert draws.shape == (4, 2, *a.shape) and s.is_in(draws)


def test_is_in_and_project_are_per_member():
    a, b = PAIRS["bounded"]
    s = torch.stack([a, b], 1)
    assert s.shape == (3, 2)
    x = torch.stack([torch.full((3,), 0.5), torch.full((3,), -1.0)], 1)
    assert s.is_in(x) and not s.is_in(x.flip(1))
    proj = s.project(torch.full((6, 3, 2), 5.0))
    assert torch.equal(proj[..., 0], a.project(torch.full((6, 3), 5.0)))
    assert torch.equal(proj[..., 1], b.project(torch.full((6, 3), 5.0)))
    assert s[:, 1] == b and s.expand(4, 3, 2).shape == (4, 3, 2)
    with pytest.raises(IndexError, match="stack dim"):
        s[0]


def test_equal_specs_stack_dense_and_bad_stacks():
    dense = torch.stack([Bounded(0, 1, shape=(3,))] * 3, 0)
    assert not isinstance(dense, Stacked) and dense.shape == (3, 3) and dense.is_in(torch.zeros(3, 3))
    with pytest.raises(TypeError, match="dtypes"):
        torch.stack([Unbounded(shape=(2,)), Categorical(3, shape=(2,))], 0)
    with pytest.raises(RuntimeError, match="numbers of dims"):
        torch.stack([Unbounded(shape=(2,)), Unbounded(shape=(2, 2))], 0)
    with pytest.raises(RuntimeError, match="nested tensor"):
        torch.stack(list(PAIRS["unbounded_shapes"]), 0).rand((3,))


def composite_pair():
    a = Composite(obs=Unbounded(shape=(3,)), x=Bounded(0, 1, shape=(2,)), sub=Composite(v=Categorical(4)))
    b = Composite(obs=Unbounded(shape=(4,)), y=Categorical(3), sub=Composite(v=Categorical(2)))
    return a, b


def test_stacked_composite():
    a, b = composite_pair()
    s = torch.stack([a, b], 0)
    assert isinstance(s, StackedComposite) and s.shape == (2,)
    assert sorted(s.keys()) == ["obs", "sub"] and s.exclusive_keys() == [["x"], ["y"]]
    assert s["obs"].shape == (2, -1) and isinstance(s["sub"], StackedComposite)
    assert ("sub", "v") in s.keys(include_nested=True) and s[1] == b
    td = s.rand()
    assert s.is_in(td) and a.is_in(td[0]) and b.is_in(td[1])
    assert td[0]["x"].shape == (2,) and td[1]["y"].shape == ()
    bad = s.zero()
    bad[1]["sub", "v"] = torch.tensor(3)  # in range for member 0's Categorical(4), not member 1's
    assert not s.is_in(bad)
    assert b.is_in(s.project(bad)[1])
    with pytest.raises(KeyError, match="exclusive"):
        s["x"]
    s.set("z", torch.stack([Unbounded(shape=(1,)), Unbounded(shape=(2,))], 0))
    assert a["z"].shape == (1,) and b["z"].shape == (2,)


def test_helpers():
    a, b = composite_pair()
    s = torch.stack([a, b], 0)
    assert contains_lazy_spec(s) and contains_lazy_spec(Composite(inner=s, shape=[2]))
    assert not contains_lazy_spec(a)
    assert not check_no_exclusive_keys(s) and check_no_exclusive_keys(a)
    c = consolidate_spec(s)
    assert check_no_exclusive_keys(c) and sorted(c.keys()) == ["obs", "sub", "x", "y"]
    assert c[1]["x"].shape == (0,) and c[0]["y"] == b["y"]  # 0-shaped copy; a scalar is copied
    assert not check_no_exclusive_keys(s)  # the original is not changed
    assert c.is_in(c.zero())
