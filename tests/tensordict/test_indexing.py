"""``indexing.plan_index`` against plain tensor indexing.

Hypothesis draws a shape and an index of every element kind (ints, 0-dim int tensors,
slices with steps, ``None``, ``...``, lists, 1-2 dim long tensors, bool masks over 0-2
dims), several tensor indices apart or side by side. The plan applied to the shape
(``out_shape`` below) must give the shape torch gives; its steps must consume every
input dim exactly once and put each step's output dim where torch puts it.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from steersman.tensordict._utils import broadcast_shapes, normalize_index
from steersman.tensordict.indexing import (
    INT,
    MASK,
    NEW,
    SLICE,
    TENSOR,
    IndexPlan,
    as_index,
    plan_index,
)

SETTINGS = settings(max_examples=300, deadline=None)


def out_shape(plan: IndexPlan, shape: tuple) -> torch.Size:
    """The plan applied to a shape: each slice and None makes its output dim, the tensor
    indices and masks broadcast into the block at ``plan.block_dim``."""
    out = [0] * plan.out_ndim
    block = []
    for step in plan.steps:
        if step.kind == SLICE:
            out[step.out_dim] = len(range(*step.item.indices(shape[step.in_dim])))
        elif step.kind == NEW:
            out[step.out_dim] = 1
        elif step.kind == TENSOR:
            block.append(step.item.shape)
        elif step.kind == MASK:
            block.append((int(step.item.sum()),))
    if block:
        b = broadcast_shapes(*block)
        out[plan.block_dim : plan.block_dim + len(b)] = b
    return torch.Size(out)


@st.composite
def shapes_and_indices(draw):
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=4)))
    items: list = []
    dim = 0
    for _ in range(draw(st.integers(0, len(shape) + 2))):
        kinds = ["none", "bool"] + (["slice", "int", "int0d", "list", "tensor", "mask"] if dim < len(shape) else [])
        kind = draw(st.sampled_from(kinds))
        size = shape[dim] if dim < len(shape) else 0
        if kind == "none":
            items.append(None)
        elif kind == "bool":  # a 0-dim mask (Python bools: test_zero_dim_items)
            items.append(torch.tensor(draw(st.booleans())))
        elif kind == "slice":
            items.append(slice(draw(st.none() | st.integers(-5, 5)), draw(st.none() | st.integers(-5, 5)),
                               draw(st.none() | st.integers(1, 3))))
            dim += 1
        elif kind in ("int", "int0d"):
            if not size:
                continue
            i = draw(st.integers(-size, size - 1))
            items.append(i if kind == "int" else torch.tensor(i))
            dim += 1
        elif kind in ("list", "tensor"):
            if not size:
                continue
            # index shapes drawn from a few that mostly broadcast together ([2], [1], [2, 1] ...)
            ishape = draw(st.sampled_from([(2,), (1,), (2, 1), (1, 2), (3,)]))
            vals = draw(st.lists(st.integers(-size, size - 1), min_size=math.prod(ishape),
                                 max_size=math.prod(ishape)))
            t = torch.tensor(vals).reshape(ishape)
            items.append(t.tolist() if kind == "list" and t.ndim == 1 else t)
            dim += 1
        else:
            k = draw(st.integers(1, min(2, len(shape) - dim)))
            mshape = shape[dim : dim + k]
            bits = draw(st.lists(st.booleans(), min_size=math.prod(mshape), max_size=math.prod(mshape)))
            items.append(torch.tensor(bits, dtype=torch.bool).reshape(mshape))
            dim += k
    if draw(st.booleans()):  # "..." anywhere when it stands for no dim, else last
        items.insert(draw(st.integers(0, len(items))) if dim == len(shape) else len(items), Ellipsis)
    index = items[0] if len(items) == 1 and draw(st.booleans()) else tuple(items)
    return shape, index


@SETTINGS
@given(shapes_and_indices())
def test_plan_shape_matches_tensor_indexing(case):
    shape, index = case
    norm = normalize_index(index, len(shape))
    plan = plan_index(norm, len(shape))
    x = torch.empty(shape)
    try:
        expected = x[norm].shape
    except (IndexError, RuntimeError):  # tensor indices that don't broadcast together
        with pytest.raises(RuntimeError):
            out_shape(plan, shape)
        return
    assert out_shape(plan, shape) == expected
    assert len(expected) == plan.out_ndim
    # every input dim is consumed by exactly one step, in order
    dims = [d for s in plan.steps for d in range(s.in_dim, s.in_dim + s.n_in)]
    assert dims == list(range(len(shape)))
    for d in range(len(shape)):
        assert plan.step_at(d).in_dim <= d
    # each slice / None step's output dim is where torch puts that dim: index x with
    # an arange along the dim and read the values back at out_dim
    for step in plan.steps:
        if step.kind == SLICE and x.numel():
            marks = torch.arange(shape[step.in_dim]).reshape((-1,) + (1,) * (len(shape) - step.in_dim - 1))
            got = marks.expand(shape)[norm]
            if got.numel():
                want = torch.arange(shape[step.in_dim])[step.item]
                assert torch.equal(got.movedim(step.out_dim, 0).reshape(len(want), -1)[:, 0], want)
        elif step.kind == NEW:
            assert expected[step.out_dim] == 1
        elif step.kind == INT:
            assert step.out_dim is None
    assert plan.n_advanced == sum(s.kind in (TENSOR, MASK) for s in plan.steps)


def test_tensor_indices_apart_go_first_and_ints_do_not_separate():
    t = torch.tensor([0, 1])
    x = torch.empty(6, 7, 8, 9)
    apart = plan_index((slice(None), t, slice(None), t), 4)  # a slice between: block first
    assert apart.block_dim == 0 and out_shape(apart, x.shape) == x[:, t, :, t].shape == (2, 6, 8)
    joined = plan_index((slice(None), t, 0, t), 4)  # an int between: block stays in place
    assert joined.block_dim == 1 and out_shape(joined, x.shape) == x[:, t, 0, t].shape == (6, 2)


def test_zero_dim_items():
    plan = plan_index((True, torch.tensor(2)), 2)
    assert [s.kind for s in plan.steps] == [MASK, INT, SLICE]
    assert plan.steps[0].n_in == 0 and plan.steps[1].item == 2 and type(plan.steps[1].item) is int
    assert out_shape(plan, torch.Size([3, 4])) == torch.empty(3, 4)[True, torch.tensor(2)].shape


def test_bad_indices_raise():
    with pytest.raises(IndexError, match="too many indices"):
        plan_index((0, 0, 0), 2)
    with pytest.raises(IndexError, match="long, int or bool"):
        plan_index(torch.tensor([0.5]), 1)
    with pytest.raises(TypeError, match=r"'\.\.\.'"):
        plan_index((Ellipsis, 0), 2)


def test_as_index():
    assert as_index([]) == ()
    assert as_index([slice(None), slice(None)]) == ()
    assert as_index([0, slice(None)]) == 0
    assert as_index([None, slice(1, 2), slice(None)]) == (None, slice(1, 2))
