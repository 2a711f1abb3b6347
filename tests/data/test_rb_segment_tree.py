"""Segment trees against plain numpy references (hypothesis property tests + edge cases)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from steersman.data.replay_buffers import MaxSegmentTree, MinSegmentTree, SumSegmentTree
from steersman.data.replay_buffers.segment_tree import PriorityTree

sizes = st.integers(min_value=1, max_value=300)


@st.composite
def update_batches(draw):
    size = draw(sizes)
    batches = []
    for _ in range(draw(st.integers(1, 6))):
        k = draw(st.integers(1, 40))
        # few distinct indices, so batches often hold duplicates
        idx = draw(st.lists(st.integers(0, size - 1), min_size=k, max_size=k))
        # zeros and realistic priorities (a subnormal next to 100 has no mass in float64)
        value = st.one_of(st.just(0.0), st.floats(1e-6, 100.0))
        vals = draw(st.lists(value, min_size=k, max_size=k))
        batches.append((idx, vals))
    queries = draw(st.lists(st.floats(0.0, 1.0, exclude_max=True), min_size=1, max_size=30))
    return size, batches, queries


def apply_reference(ref: np.ndarray, idx: list, vals: list) -> None:
    for i, v in zip(idx, vals):  # sequential: the last duplicate wins
        ref[i] = v


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(update_batches())
def test_sum_tree_matches_numpy_cumsum(case):
    size, batches, queries = case
    tree = SumSegmentTree(size)
    ref = np.zeros(size)
    for idx, vals in batches:
        tree[torch.tensor(idx)] = torch.tensor(vals, dtype=torch.float64)
        apply_reference(ref, idx, vals)
        np.testing.assert_array_equal(tree.leaves().numpy(), ref)
        assert tree.total().item() == pytest.approx(ref.sum(), rel=1e-12, abs=1e-9)
    # every internal node equals a fresh rebuild from the leaves
    again = tree._tree.clone()
    tree.rebuild()
    torch.testing.assert_close(again, tree._tree, rtol=1e-12, atol=1e-9)
    total = ref.sum()
    if total == 0:
        return
    cs = np.cumsum(ref)
    mass = np.array(queries) * total
    got = tree._search(torch.tensor(mass), right=True).clamp(max=size - 1).numpy()
    want = np.minimum(np.searchsorted(cs, mass, side="right"), size - 1)
    # float rounding may move a query that sits on a boundary to a neighbouring leaf:
    # allowed only when the mass is within rounding of that boundary
    for g, w, m in zip(got, want, mass):
        if g != w:
            assert abs(cs[min(g, w, size - 1)] - m) <= 1e-9 * total, (g, w, m)
    index, value = tree.draw(torch.tensor(queries, dtype=torch.float64))
    assert (ref[index.numpy()] > 0).all(), "a draw must never land on a zero-valued leaf"
    assert torch.equal(value, torch.tensor(ref[index.numpy()]))
    lb = tree.scan_lower_bound(torch.tensor(mass)).numpy()
    want_lb = np.minimum(np.searchsorted(cs, mass, side="left"), size - 1)
    assert (np.abs(lb - want_lb) <= 1).all()
    # range queries
    for lo, hi in [(0, size), (0, max(1, size // 2)), (size // 3, size)]:
        assert tree.query(lo, hi).item() == pytest.approx(ref[lo:hi].sum(), rel=1e-12, abs=1e-9)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(update_batches())
def test_min_max_trees_match_numpy(case):
    size, batches, _ = case
    mn, mx = MinSegmentTree(size), MaxSegmentTree(size)
    ref = np.full(size, np.inf)
    for idx, vals in batches:
        t_idx = torch.tensor(idx)
        t_val = torch.tensor(vals, dtype=torch.float64)
        mn[t_idx] = t_val
        mx[t_idx] = t_val
        apply_reference(ref, idx, vals)
        assert mn.total().item() == ref.min()
        assert mx.total().item() == np.where(np.isinf(ref), -np.inf, ref).max()
    for tree in (mn, mx):
        again = tree._tree.clone()
        tree.rebuild()
        assert torch.equal(again, tree._tree), "every internal node must equal the rebuilt value"
    lo, hi = size // 4, max(size // 4 + 1, 3 * size // 4)
    assert mn.query(lo, hi).item() == ref[lo:hi].min()


def test_sum_tree_many_updates_stay_exact_enough():
    """Delta updates are float64 and the tree is rebuilt periodically: no visible drift."""
    torch.manual_seed(0)
    size = 1000
    tree = SumSegmentTree(size)
    ref = torch.zeros(size, dtype=torch.float64)
    for _ in range(300):
        idx = torch.randint(size, (50,))
        val = torch.rand(50, dtype=torch.float64) * torch.rand(()) * 1e3
        tree[idx] = val
        ref[idx] = val  # torch CPU index_put: last duplicate wins, like the tree
    assert torch.equal(tree.leaves(), ref)
    assert tree.total().item() == pytest.approx(ref.sum().item(), rel=1e-12)
    tree[torch.arange(size)] = 0.0
    assert abs(tree.total().item()) < 1e-9


def test_tree_index_errors_and_sizes():
    tree = SumSegmentTree(5)
    with pytest.raises(IndexError):
        tree[torch.tensor([5])] = 1.0
    with pytest.raises(IndexError):
        tree[torch.tensor([-1])] = 1.0
    with pytest.raises(ValueError):
        SumSegmentTree(0)
    with pytest.raises(TypeError):
        tree[torch.tensor([0.5])] = 1.0
    one = SumSegmentTree(1)
    one[torch.tensor([0])] = 2.0
    assert one.total().item() == 2.0 and one.scan_lower_bound(torch.tensor([1.0])).tolist() == [0]
    assert one.scan_lower_bound(torch.tensor([3.0])).tolist() == [1]  # above the total: size


def test_large_tree_search_uses_several_steps():
    """Capacity 2**20: the search runs a top step and two jumps; compare with numpy."""
    torch.manual_seed(1)
    size = 1_000_000
    tree = SumSegmentTree(size)
    assert tree._search_steps == [5, 5]
    vals = torch.rand(size, dtype=torch.float64)
    vals[torch.randint(size, (size // 2,))] = 0.0
    tree[torch.arange(size)] = vals
    cs = np.cumsum(vals.numpy())
    mass = torch.rand(1000, dtype=torch.float64) * cs[-1]
    got = tree._search(mass, right=True).numpy()
    want = np.searchsorted(cs, mass.numpy(), side="right")
    assert (got == want).mean() > 0.999
    assert (vals.numpy()[got] > 0).all()


@st.composite
def big_update_batches(draw):
    """Like update_batches but over sizes that give the priority tree one or two sum levels
    and several 1024-leaf min/max blocks."""
    size = draw(st.sampled_from([1, 31, 33, 1024, 1025, 5000, 40_000]))
    batches = []
    for _ in range(draw(st.integers(1, 6))):
        k = draw(st.integers(1, 60))
        hot = draw(st.lists(st.integers(0, size - 1), min_size=1, max_size=8))  # duplicates
        idx = draw(st.lists(st.one_of(st.sampled_from(hot), st.integers(0, size - 1)), min_size=k, max_size=k))
        value = st.one_of(st.just(0.0), st.floats(1e-6, 100.0))
        vals = draw(st.lists(value, min_size=k, max_size=k))
        span = draw(st.none() | st.tuples(st.integers(0, size - 1), st.integers(1, 200), st.floats(0.0, 10.0)))
        batches.append((idx, vals, span))
    queries = draw(st.lists(st.floats(0.0, 1.0, exclude_max=True), min_size=1, max_size=40))
    return size, batches, queries


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(big_update_batches())
def test_priority_tree_matches_numpy(case):
    size, batches, queries = case
    tree = PriorityTree(size, track_max=True)
    ref = np.zeros(size)
    is_set = np.zeros(size, dtype=bool)
    for idx, vals, span in batches:
        tree.update(torch.tensor(idx), torch.tensor(vals, dtype=torch.float64))
        apply_reference(ref, idx, vals)
        is_set[idx] = True
        if span is not None:
            lo, n, v = span
            hi = min(size, lo + n)
            tree.fill_range(lo, hi, v)
            ref[lo:hi] = v
            is_set[lo:hi] = True
        np.testing.assert_array_equal(tree.leaves().numpy(), ref)
        assert tree.total() == pytest.approx(ref.sum(), rel=1e-12, abs=1e-12)
        assert tree.min() == ref[is_set].min()
        assert tree.max() == ref[is_set].max()
    before = {k: t.clone() for k, t in tree._tensors.items()}
    tree.rebuild()  # min/max levels are exact; sums carry at most float64 rounding
    for k, t in tree._tensors.items():
        if k == "sum":
            torch.testing.assert_close(t, before[k], rtol=1e-12, atol=1e-9)
        else:
            assert torch.equal(t, before[k]), k
    if ref.sum() == 0:
        return
    u = torch.tensor(queries, dtype=torch.float64)
    index, value = tree.draw(u.clone())
    got = index.numpy()
    assert (ref[got] > 0).all(), "a draw never lands on a zero leaf"
    assert np.array_equal(value.numpy(), ref[got])
    cs = np.cumsum(ref)
    want = np.minimum(np.searchsorted(cs, u.numpy() * cs[-1], side="right"), size - 1)
    for g, w, q in zip(got, want, u.numpy() * cs[-1]):
        if g != w:  # only a query within rounding of a boundary may land next door
            assert abs(cs[min(g, w)] - q) <= 1e-9 * cs[-1], (g, w, q)


def test_priority_tree_levels_for_one_million():
    tree = PriorityTree(1_000_000)
    assert tree._level_sizes == [1_000_000, 31_250]  # leaves, then block sums searched by their cumsum
    tree.fill_range(0, 1_000_000, 1.0)
    assert tree.total() == 1_000_000 and tree.min() == 1.0
    tree.update(torch.tensor([999_999]), torch.tensor([1e6], dtype=torch.float64))
    idx, val = tree.draw(torch.full((100,), 0.75, dtype=torch.float64))
    assert (idx == 999_999).all() and (val == 1e6).all()


@pytest.mark.parametrize("kind", ["min", "max"])
def test_priority_tree_extremum_recovers_when_its_leaf_gets_worse(kind):
    # blocks of 1024 leaves keep one extremum each; raising a min (lowering a max) leaf,
    # alone or as the last of duplicates in one batch, makes the block recompute it
    tree = PriorityTree(5000, track_max=True)
    ref = np.linspace(1.0, 2.0, 5000)
    tree.update(torch.arange(5000), torch.from_numpy(ref.copy()))
    best, worse = (0, 3.0) if kind == "min" else (4999, 0.5)
    for idx, vals in [([best], [worse]), ([1, 1], [0.1, 5.0]), ([4998, 4998], [9.0, 0.2]), ([1023, 1024], [0.0, 0.0])]:
        tree.update(torch.tensor(idx), torch.tensor(vals, dtype=torch.float64))
        apply_reference(ref, idx, vals)
        assert tree.min() == ref.min() and tree.max() == ref.max()
        assert tree.total() == pytest.approx(ref.sum(), rel=1e-12)


def test_priority_tree_draw_at_the_top_edge_stays_on_positive_leaves():
    # u just below 1 (u * total may round up to the total) must still land on a set leaf
    for size in (10, 33_000, 70_000):
        tree = PriorityTree(size)
        n = size // 2 + 1
        tree.update(torch.arange(n), torch.rand(n, dtype=torch.float64) + 0.5)
        u = torch.tensor([np.nextafter(1.0, 0.0), 0.0, 0.5], dtype=torch.float64)
        index, value = tree.draw(u, n, check=False)
        assert index.tolist()[0] == n - 1 and index.tolist()[1] == 0
        assert (index < n).all() and (value > 0).all()


def test_priority_tree_multi_level_sums_match_leaves():
    # above 32 768 leaves the sums get levels of 32-node blocks; they follow every update
    tree = PriorityTree(70_000)
    assert tree._level_sizes == [70_016, 2_188]
    rng = np.random.default_rng(0)
    ref = np.zeros(70_000)
    for _ in range(20):
        idx = rng.integers(0, 70_000, 300)
        vals = rng.random(300)
        tree.update(torch.from_numpy(idx), torch.from_numpy(vals))
        apply_reference(ref, idx.tolist(), vals.tolist())
    block_sums = np.zeros(70_016)
    block_sums[:70_000] = ref
    np.testing.assert_allclose(tree._levels["sum"][1], block_sums.reshape(-1, 32).sum(1), rtol=1e-12, atol=1e-12)
    u = torch.rand(500, dtype=torch.float64)
    index, _ = tree.draw(u.clone())
    cs = np.cumsum(ref)
    want = np.searchsorted(cs, u.numpy() * cs[-1], side="right")
    close = np.abs(cs[np.minimum(index.numpy(), want)] - u.numpy() * cs[-1]) <= 1e-9 * cs[-1]
    assert ((index.numpy() == want) | close).all()
