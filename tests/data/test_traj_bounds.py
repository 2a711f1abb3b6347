"""find_start_stop_traj against a plain walk over the rows."""

from __future__ import annotations

import pytest
import torch

from steersman.data import find_start_stop_traj


def _walk(ends: list[bool], at_capacity: bool) -> list[tuple[int, int, int]]:
    """(start, stop, length) per trajectory of one column, by walking the rows."""
    T = len(ends)
    ends = list(ends)
    if not at_capacity:
        ends[-1] = True
    if not any(ends):
        ends[-1] = True
    idx = [t for t in range(T) if ends[t]]
    out = []
    for i, stop in enumerate(idx):
        start = idx[i - 1] + 1 if i else ((idx[-1] + 1) % T if at_capacity else 0)
        length = 0
        t = start
        while True:
            length += 1
            if t == stop:
                break
            t = (t + 1) % T
        out.append((start, stop, length))
    return out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("at_capacity", [False, True])
@pytest.mark.parametrize("batch", [(), (3,)])
def test_matches_plain_walk(seed, at_capacity, batch):
    g = torch.Generator().manual_seed(seed)
    T = 12
    end = torch.rand(T, *batch, generator=g) < 0.3
    cursor = int(torch.randint(T, (), generator=g)) if at_capacity else None
    start, stop, lengths = find_start_stop_traj(end=end, at_capacity=at_capacity, cursor=cursor)
    cols = end.reshape(T, -1)
    expected = []
    for c in range(cols.shape[1]):
        flags = cols[:, c].tolist()
        if cursor is not None:
            flags[cursor] = True
        expected += [(s, e, n, c) for s, e, n in _walk(flags, at_capacity)]
    assert start[:, 0].tolist() == [x[0] for x in expected]
    assert stop[:, 0].tolist() == [x[1] for x in expected]
    assert lengths.tolist() == [x[2] for x in expected]
    if batch:
        assert start[:, 1].tolist() == stop[:, 1].tolist() == [x[3] for x in expected]
    assert int(lengths.sum()) == T * cols.shape[1]  # the trajectories tile the storage


def test_ids_give_the_same_boundaries_as_end_flags():
    ids = torch.tensor([5, 5, 5, 0, 0, 1, 1, 1, 5, 5])
    end = torch.zeros(10, dtype=torch.bool)
    end[2] = end[4] = end[7] = True
    a = find_start_stop_traj(trajectory=ids, at_capacity=True)
    b = find_start_stop_traj(end=end, at_capacity=True)
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    assert a[0].squeeze(-1).tolist() == [8, 3, 5] and a[2].tolist() == [5, 2, 3]


def test_bad_input():
    with pytest.raises(ValueError, match="exactly one"):
        find_start_stop_traj(at_capacity=False)
    with pytest.raises(TypeError, match="boolean"):
        find_start_stop_traj(end=torch.zeros(4), at_capacity=False)
    with pytest.raises(IndexError, match="cursor 9"):
        find_start_stop_traj(end=torch.zeros(4, dtype=torch.bool), at_capacity=True, cursor=9)
