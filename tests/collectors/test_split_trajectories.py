"""``split_trajectories`` against a plain-Python reference (hypothesis), and its options."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from steersman import TensorDict
from steersman.collectors import split_trajectories


def _batch(done: torch.Tensor, with_ids: bool) -> TensorDict:
    """``[*B, T]`` batch with an ``obs`` counting the steps, ``(next, done)`` and (optionally)
    trajectory ids numbered per sub-env in time order."""
    shape = done.shape
    n = done.numel()
    data = {"obs": torch.arange(n, dtype=torch.float32).view(*shape, 1).expand(*shape, 2).clone(),
            "next": {"done": done.unsqueeze(-1)}}
    if with_ids:
        flat = done.reshape(-1, shape[-1])
        ids, cur = [], 0
        for row in flat.tolist():
            r = []
            for d in row:
                r.append(cur)
                cur += d
            cur += 1
            ids.append(r)
        data["collector"] = {"traj_ids": torch.tensor(ids).view(shape) * 3 + 1}  # any increasing ids
    return TensorDict(data, batch_size=shape)


def _reference(td: TensorDict) -> list[list[float]]:
    """The trajectories as lists of the first obs component: cut after each done and at
    the end of each row (ids are consistent with that by construction)."""
    T = td.batch_size[-1]
    obs = td["obs"][..., 0].reshape(-1, T).tolist()
    done = td["next", "done"].reshape(-1, T).tolist()
    out = []
    for orow, drow in zip(obs, done):
        cur = []
        for o, d in zip(orow, drow):
            cur.append(o)
            if d:
                out.append(cur)
                cur = []
        if cur:
            out.append(cur)
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=0, max_size=2), st.integers(1, 7), st.booleans(),
       st.randoms(use_true_random=False))
def test_matches_python_reference(env_batch, T, with_ids, rnd):
    shape = (*env_batch, T)
    n = 1
    for s in shape:
        n *= s
    done = torch.tensor([rnd.random() < 0.3 for _ in range(n)]).view(shape)
    td = _batch(done, with_ids)
    ref = _reference(td)
    out = split_trajectories(td)
    mask_key = ("collector", "mask") if with_ids else "mask"
    assert out.batch_size == (len(ref), max(len(r) for r in ref))
    mask = out[mask_key]
    for i, traj in enumerate(ref):
        assert mask[i].sum() == len(traj) and mask[i, : len(traj)].all()
        assert out["obs"][i, : len(traj), 0].tolist() == traj
        assert (out["obs"][i, len(traj):] == 0).all()  # zero padding
    ids = out["collector", "traj_ids"] if with_ids else out["traj_ids"]
    for i in range(len(ref)):  # one id per row
        assert ids[i][mask[i]].unique().numel() == 1
    ragged = split_trajectories(td, as_nested=True)
    assert ragged.batch_size == (len(ref),)
    for i, traj in enumerate(ref):
        assert ragged[i]["obs"][:, 0].tolist() == traj


def test_keys_prefix_and_errors():
    td = _batch(torch.tensor([[False, True, False]]), with_ids=True)
    td["my_ids"] = td["collector", "traj_ids"].clone()
    out = split_trajectories(td, trajectory_key="my_ids")
    assert "mask" in out.keys() and out.batch_size == (2, 2)
    nested = TensorDict({"a": torch.zeros(1, 3), "next": {"stop": torch.tensor([[[True], [False], [False]]])}}, [1, 3])
    out = split_trajectories(nested, done_key="stop", prefix="meta")
    assert out.batch_size == (2, 2) and out["meta", "mask"].sum() == 3
    with pytest.raises(ValueError, match="time dimension"):
        split_trajectories(TensorDict({"a": torch.zeros(())}, []))
