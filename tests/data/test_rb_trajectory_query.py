"""Trajectory views, iter/filter_trajectories and the traj query language, against plain Python."""

from __future__ import annotations

import pytest
import torch

from steersman.data.replay_buffers import (
    Trajectory,
    TrajectoryPredicate,
    filter_trajectories,
    iter_trajectories,
    traj,
)
from steersman.tensordict import TensorDict


def batch(lengths: list[int], seed: int = 0, ids: bool = True) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    ep = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
    n = ep.numel()
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[torch.tensor(lengths).cumsum(0) - 1] = True
    td = TensorDict({"obs": torch.randn(n, 2, generator=g), "step": torch.arange(n),
                     "next": {"reward": torch.randint(0, 5, (n, 1), generator=g).float(), "done": done}}, [n])
    if ids:
        td.set(("collector", "traj_ids"), ep)
    return td


def reference_split(lengths: list[int]) -> list[list[int]]:
    out, start = [], 0
    for n in lengths:
        out.append(list(range(start, start + n)))
        start += n
    return out


@pytest.mark.parametrize("ids", [True, False])
def test_split_matches_reference(ids):
    lengths = [3, 1, 5, 2]
    data = batch(lengths, ids=ids)
    if ids:
        got = list(iter_trajectories(data))
    else:
        with pytest.warns(UserWarning, match="trajectory ids"):
            got = list(iter_trajectories(data))
    assert [t.step.tolist() for t in got] == reference_split(lengths)
    assert all(isinstance(t, Trajectory) for t in got)


def test_trajectory_attributes_and_slicing():
    t = next(iter_trajectories(batch([4, 2])))
    assert t.length == len(t) == 4 and t.reward.shape == (4, 1) and t.obs.shape == (4, 2)
    assert float(t.total_reward) == float(t.get(("next", "reward")).sum())
    assert isinstance(t[1:3], Trajectory) and t[1:3].length == 2
    with pytest.raises(AttributeError, match="nope"):
        _ = t.nope


@pytest.mark.parametrize("seed", range(4))
def test_query_language_matches_plain_python(seed):
    lengths = [3, 6, 2, 7, 4, 5]
    data = batch(lengths, seed)
    trajs = list(iter_trajectories(data))
    cases = [
        ((traj.reward.sum() > 8) & (traj.length >= 4),
         lambda t: t.reward.sum().item() > 8 and t.length >= 4),
        ((traj.reward > 3).any() | ~(traj.length < 5),
         lambda t: bool((t.reward > 3).any()) or not t.length < 5),
        ((traj.reward >= 1).all(), lambda t: bool((t.reward >= 1).all())),
        (traj.reward.max() == traj.reward.min(), lambda t: t.reward.max().item() == t.reward.min().item()),
        (traj.step.first() < 5, lambda t: t.step[0].item() < 5),
        (traj[("collector", "traj_ids")].last() != 2, lambda t: t.get(("collector", "traj_ids"))[-1].item() != 2),
        (traj.reward.mean() > 2, lambda t: t.reward.mean().item() > 2),
    ]
    for pred, plain in cases:
        assert isinstance(pred, TrajectoryPredicate)
        assert [pred(t) for t in trajs] == [plain(t) for t in trajs], pred
        kept = filter_trajectories(data, pred)
        assert [k.step.tolist() for k in kept] == [t.step.tolist() for t in trajs if plain(t)]
    assert (traj.reward.sum() > 8).required_keys() == frozenset({"reward"})
    assert len(filter_trajectories(data)) == len(lengths)


def test_bad_input():
    with pytest.raises(KeyError, match="trajectory id"):
        list(iter_trajectories(batch([2, 2]), trajectory_key="nope"))
    with pytest.raises(KeyError, match="end flags"):
        list(iter_trajectories(TensorDict({"x": torch.zeros(3)}, [3])))
    with pytest.raises(TypeError, match="truth value"):
        bool(traj.length > 3)
    with pytest.raises(TypeError, match="one batch dim"):
        Trajectory(TensorDict({}, []))
