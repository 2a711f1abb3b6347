"""TorchRL's ``ndim=2`` replay-buffer scripts, run with steersman imports.

A storage with ``ndim=2`` holds ``[time, n_envs]``: a collector batch ``[n_envs, T]`` is
transposed and written as ``T`` rows, the cursor wraps over time, ``len`` counts elements,
and sampled indices are ``(row, col)`` pairs. The expected values below are worked out by
hand from that layout (they are also what TorchRL 0.14 prints for the same script).
"""

from __future__ import annotations

import pytest
import torch

from steersman import TensorDict
from steersman.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    PrioritizedSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    SliceSampler,
    TensorDictReplayBuffer,
)
from steersman.data.replay_buffers import CheckpointError
from steersman.envs import MultiStepTransform, PendulumEnv, SerialEnv, StepCounter, TransformedEnv

STORAGES = {
    "lazy": lambda tmp, n: LazyTensorStorage(n, ndim=2),
    "memmap": lambda tmp, n: LazyMemmapStorage(n, ndim=2, scratch_dir=tmp / "mm"),
}


def batch(start: int, n_envs: int = 3, T: int = 4) -> TensorDict:
    """A collector-style ``[n_envs, T]`` batch: ``v = start + env * T + t``."""
    return TensorDict({"v": start + torch.arange(n_envs * T).view(n_envs, T)}, [n_envs, T])


@pytest.mark.parametrize("storage", sorted(STORAGES))
@pytest.mark.parametrize("max_size,rows", [(12, 4), (20, 7), (21, 7)])
def test_time_major_growth_and_wrap(tmp_path, storage, max_size, rows):
    rb = ReplayBuffer(storage=STORAGES[storage](tmp_path, max_size), batch_size=5)
    seen = []
    for k in range(4):
        rb.extend(batch(100 * k))
        seen.append((len(rb), tuple(rb.storage.shape), rb.storage.max_size, rb.writer._cursor))
    cap = rows * 3  # max_size rounded up to whole rows of n_envs=3
    written = [4 * (k + 1) for k in range(4)]  # rows (time steps) written so far
    assert seen == [(min(w, rows) * 3, (min(w, rows), 3), cap, w % rows) for w in written]
    # physical row r holds the newest time step written there; column e is env e
    stored = rb.storage[:]["v"]
    for r in range(rows):
        t = max(t for t in range(16) if t % rows == r)
        assert stored[r].tolist() == [100 * (t // 4) + e * 4 + t % 4 for e in range(3)]


def test_extend_indices_reads_and_samples():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20, ndim=2), batch_size=5)
    td = batch(0)
    index = rb.extend(td)
    assert index.tolist() == [[t, e] for t in range(4) for e in range(3)]  # (row, col) per element
    assert td["index"].tolist() == [[[t, e] for t in range(4)] for e in range(3)]  # the caller's layout
    assert rb.extend(batch(100)).tolist()[-3:] == [[0, 0], [0, 1], [0, 2]]  # time 7 wraps to row 0
    assert rb[:]["v"].tolist() == [[103, 1, 2, 3, 100, 101, 102], [107, 5, 6, 7, 104, 105, 106],
                                   [111, 9, 10, 11, 108, 109, 110]]  # [n_envs, rows]
    assert rb[1:3]["v"].shape == (2, 7) and torch.equal(rb[torch.tensor([0, 2])]["v"], rb[:]["v"][[0, 2]])
    assert rb[1]["v"].tolist() == [107, 5, 6, 7, 104, 105, 106]  # one env's series
    assert rb.storage[1]["v"].tolist() == [1, 5, 9]  # storage level: a time step
    assert rb.storage.get(torch.tensor([[0, 1], [2, 2]]))["v"].shape == (2, 2, 3)
    flat = rb.storage.flatten()  # [time * n_envs], row-major
    assert len(flat) == 21 and torch.equal(flat[:]["v"], rb.storage[:]["v"].reshape(-1))
    s, info = rb.sample(return_info=True)
    rows, cols = info["index"]
    assert torch.equal(s["index"], torch.stack([rows, cols], -1))
    assert torch.equal(s["v"], rb.storage[:]["v"][rows, cols])
    rb[1] = TensorDict({"v": torch.full((7,), -1)}, [7])  # write env 1's column
    assert rb[:]["v"][1].tolist() == [-1] * 7 and rb.storage[:]["v"][:, 1].tolist() == [-1] * 7


def test_sampler_without_replacement_and_priorities_by_pair():
    rb = ReplayBuffer(storage=LazyTensorStorage(20, ndim=2), batch_size=6, sampler=SamplerWithoutReplacement())
    rb.extend(batch(0))
    a, b = rb.sample(), rb.sample()
    assert sorted(a["v"].tolist() + b["v"].tolist()) == list(range(12)) and rb.sampler.ran_out
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(12, ndim=2),
                                sampler=PrioritizedSampler(12, alpha=1.0, beta=1.0), batch_size=64)
    td = batch(0)
    rb.extend(td)
    td["td_error"] = torch.full((3, 4), 1e-9)
    td["td_error"][2, 1] = 1.0  # env 2, time 1: v = 9
    rb.update_tensordict_priority(td)
    assert (rb.sample()["v"] == 9).float().mean() > 0.9
    prio = torch.full((3, 4), 1e-9)
    prio[0, 3] = 1.0  # in the caller's [n_envs, T] layout, with extend's indices
    rb.update_priority(rb.extend(batch(0)), prio)
    assert (rb.sample()["v"] == 3).float().mean() > 0.9


def test_slices_follow_each_env_across_writes():
    ep = torch.tensor([[0] * 3 + [1] * 5, [2] * 6 + [3] * 2])
    done = torch.zeros(2, 8, 1, dtype=torch.bool)
    done[0, 2] = done[1, 5] = True
    td = TensorDict({"episode": ep, "step": torch.arange(16).view(2, 8), "next": {"done": done}}, [2, 8])
    for key in ({"traj_key": "episode"}, {"end_key": ("next", "done")}):
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(40, ndim=2), batch_size=8,
                                    sampler=SliceSampler(slice_len=4, **key))
        rb.extend(td[:, :4])
        rb.extend(td[:, 4:])  # episodes 1 and 2 continue over the two writes
        for _ in range(10):
            s = rb.sample()
            steps, eps = s["step"].view(2, 4), s["episode"].view(2, 4)
            assert bool((steps[:, 1:] - steps[:, :-1] == 1).all()) and bool((eps == eps[:, :1]).all())
            assert set(eps[:, 0].tolist()) <= {1, 2}  # episodes 0 and 3 are shorter than 4
            assert s["next", "truncated"].view(2, 4)[:, -1].all()


def test_multistep_transform_example():
    """TorchRL's MultiStepTransform docstring example (a SerialEnv of 2, ndim=2 storage
    of 100), on Pendulum and with fewer rollouts."""
    rb = ReplayBuffer(storage=LazyTensorStorage(100, ndim=2), transform=MultiStepTransform(n_steps=3, gamma=0.95))
    base_env = SerialEnv(2, lambda: PendulumEnv())
    env = TransformedEnv(base_env, StepCounter())
    _ = env.set_seed(0)
    _ = torch.manual_seed(0)
    tdreset = env.reset()
    for _ in range(7):
        rollout = env.rollout(max_steps=10, break_when_any_done=False, tensordict=tdreset, auto_reset=False)
        rb.extend(rollout)
        tdreset = rollout[..., -1]["next"]
    env.close()
    # 70 steps per env, the last 3 held back: 67 time steps in 50 rows, wrapped
    assert len(rb) == 100 and rb.storage.shape == (50, 2)
    stored = rb[:]
    assert stored["step_count"].shape == (2, 50, 1)
    assert torch.equal(stored["next", "step_count"], stored["step_count"] + 3)  # 3 steps ahead
    assert stored["step_count"][:, :5].squeeze(-1).tolist() == [[50, 51, 52, 53, 54]] * 2  # rows 0-4: t = 50..54
    assert stored["step_count"][:, 17].squeeze(-1).tolist() == [17, 17]  # the oldest step kept


def test_checkpoints_of_the_layout(tmp_path):
    rb = ReplayBuffer(storage=LazyTensorStorage(12, ndim=2), batch_size=4)
    rb.extend(batch(0))
    rb.dumps(tmp_path / "ck")
    other = ReplayBuffer(storage=LazyTensorStorage(12, ndim=2), batch_size=4)
    other.loads(tmp_path / "ck")
    assert torch.equal(other[:]["v"], rb[:]["v"]) and other.storage.shape == (4, 3)
    # an ndim=2 checkpoint from before the layout was named ([trajectories, T] rows) is refused
    import json

    meta_file = next((tmp_path / "ck").rglob("storage/meta.json"))
    meta = json.loads(meta_file.read_text())
    meta.pop("layout")
    meta_file.write_text(json.dumps(meta))
    fresh = ReplayBuffer(storage=LazyTensorStorage(12, ndim=2), batch_size=4)
    with pytest.raises(CheckpointError, match=r"\[trajectories, T\] rows"):
        fresh.loads(tmp_path / "ck")
    assert len(fresh) == 0
    state = rb.state_dict()
    state["_storage"].pop("_layout")
    with pytest.raises(CheckpointError, match="layout"):
        fresh.load_state_dict(state)


def test_bad_input_names_the_problem_and_writes_nothing():
    rb = ReplayBuffer(storage=LazyTensorStorage(12, ndim=2))
    with pytest.raises(ValueError, match=r"more than 1 batch dims, got batch shape \[4\]"):
        rb.extend(TensorDict({"v": torch.zeros(4)}, [4]))
    rb.extend(batch(0))
    with pytest.raises(ValueError, match="shape"):
        rb.extend(batch(0, n_envs=4))  # rows of 4 envs into rows of 3
    assert len(rb) == 12 and rb.write_count == 4
    with pytest.raises(ValueError, match="tensor storage"):
        ReplayBuffer(dim_extend=1)  # a ListStorage
    rb = ReplayBuffer(storage=LazyTensorStorage(20, ndim=2), sampler=PrioritizedSampler(20, 1.0, 1.0))
    with pytest.raises(ValueError, match="max_capacity=21"):
        rb.extend(batch(0))  # 7 rows of 3 = 21 elements
    assert not rb.storage.initialized


def test_add_per_time_step_equals_extend():
    """TorchRL's ``dim_extend`` docstring: adding the time steps one by one fills the
    buffer as one ``extend`` of the ``[n_envs, T]`` batch does."""
    data = torch.arange(12.0).view(3, 4)
    a = ReplayBuffer(storage=LazyTensorStorage(10, ndim=2), dim_extend=1)
    for d in data.unbind(1):
        a.add(d)
    b = ReplayBuffer(storage=LazyTensorStorage(10, ndim=2), dim_extend=1)
    b.extend(data)
    assert torch.equal(a[:], data) and torch.equal(b[:], data) and len(a) == len(b) == 12
