"""ReplayBufferEnsemble and its storage/sampler/writer ensembles."""

from __future__ import annotations

import pytest
import torch

from steersman.data.replay_buffers import (
    CheckpointError,
    LazyTensorStorage,
    RandomSampler,
    ReplayBuffer,
    ReplayBufferEnsemble,
    SamplerEnsemble,
    SamplerWithoutReplacement,
    StorageEnsemble,
    TensorDictReplayBuffer,
    TensorDictRoundRobinWriter,
    WriterEnsemble,
)
from steersman.tensordict import TensorDict


def member(offset: float, n: int = 10, transform=None) -> TensorDictReplayBuffer:
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(16), transform=transform)
    if n:
        rb.extend(TensorDict({"x": torch.arange(n, dtype=torch.float32) + offset}, [n]))
    return rb


def test_sample_from_all_shapes_ids_and_index():
    ens = ReplayBufferEnsemble(member(0), member(100), sample_from_all=True, batch_size=8)
    s = ens.sample()
    assert s.shape == (2, 4)
    assert s["index", "buffer_ids"].tolist() == [[0] * 4, [1] * 4]
    offsets = s["index", "buffer_ids"].float() * 100
    assert torch.equal(s["x"], s["index", "index"].float() + offsets)  # index points at the item returned
    assert len(ens) == 2 and isinstance(ens[1], TensorDictReplayBuffer)


def test_weights_are_followed():
    torch.manual_seed(0)
    ens = ReplayBufferEnsemble(member(0), member(100), p=[0.9, 0.1], num_buffer_sampled=1)
    ids = torch.cat([ens.sample(2)["index", "buffer_ids"].reshape(-1)[:1] for _ in range(400)])
    assert abs((ids == 0).float().mean().item() - 0.9) < 0.06
    ens = ReplayBufferEnsemble(member(0), member(100), member(200), p=[0, 1, 1], num_buffer_sampled=6)
    assert set(ens.sample(12)["index", "buffer_ids"].reshape(-1).tolist()) <= {1, 2}


def test_sampleable_weights_skip_empty_members():
    ens = ReplayBufferEnsemble(member(0, n=0), member(100, n=3), p="sampleable", num_buffer_sampled=4)
    assert (ens.sample(8)["index", "buffer_ids"] == 1).all()
    ens.empty()
    with pytest.raises(RuntimeError, match="every member"):
        ens.sample(8)


def test_per_member_transforms_then_ensemble_transform():
    def scale(td):
        return td.set("y", td["x"] * 2)

    def rename(td):
        return td.set("y", -td["x"])

    def add_z(td):
        return td.set("z", td["y"] + 1)

    ens = ReplayBufferEnsemble(member(0, transform=scale), member(100, transform=rename), sample_from_all=True,
                               transform=add_z)
    s = ens.sample(6)
    assert torch.equal(s["y"][0], s["x"][0] * 2) and torch.equal(s["y"][1], -s["x"][1])
    assert torch.equal(s["z"], s["y"] + 1)


def test_plain_buffers_and_info():
    a, b = ReplayBuffer(storage=LazyTensorStorage(8)), ReplayBuffer(storage=LazyTensorStorage(8))
    a.extend(torch.zeros(8))
    b.extend(torch.ones(8))
    s, info = ReplayBufferEnsemble(a, b, sample_from_all=True).sample(4, return_info=True)
    assert s.tolist() == [[0.0, 0.0], [1.0, 1.0]]
    assert info["index"]["buffer_ids"].tolist() == [[0, 0], [1, 1]] and info["index"]["index"].shape == (2, 2)


def test_writes_are_refused_or_routed():
    ens = ReplayBufferEnsemble(member(0, n=0), member(0, n=0))
    with pytest.raises(RuntimeError, match="routing_key"):
        ens.extend(TensorDict({"x": torch.zeros(2)}, [2]))
    routed = ReplayBufferEnsemble(member(0, n=0), member(0, n=0), routing_key="member")
    data = TensorDict({"x": torch.arange(5.0), "member": torch.tensor([1, 0, 1, 1, 0])}, [5])
    out = routed.extend(data)
    assert out["buffer_ids"].tolist() == [1, 0, 1, 1, 0] and out["index"].tolist() == [0, 0, 1, 2, 1]
    assert routed[1][:]["x"].tolist() == [0.0, 2.0, 3.0] and routed[0][:]["x"].tolist() == [1.0, 4.0]
    with pytest.raises(ValueError, match="member ids"):
        routed.extend(TensorDict({"x": torch.zeros(1), "member": torch.tensor([2])}, [1]))
    assert len(routed[0]) == 2  # nothing written by the refused call
    by_dim = ReplayBufferEnsemble(member(0, n=0), member(0, n=0), routing_dim=1)
    by_dim.extend(TensorDict({"x": torch.arange(6.0).reshape(3, 2)}, [3, 2]))
    assert by_dim[0][:]["x"].tolist() == [0.0, 2.0, 4.0] and by_dim[1][:]["x"].tolist() == [1.0, 3.0, 5.0]
    with pytest.raises(ValueError, match="routing_dim"):
        by_dim.extend(TensorDict({"x": torch.zeros(3, 3)}, [3, 3]))


def test_bad_arguments():
    with pytest.raises(ValueError, match="divisible"):
        ReplayBufferEnsemble(member(0), member(1), sample_from_all=True).sample(5)
    with pytest.raises(RuntimeError, match="cannot be combined"):
        ReplayBufferEnsemble(member(0), member(1), sample_from_all=True, p=[0.5, 0.5])
    with pytest.raises(ValueError, match="2 finite non-negative"):
        ReplayBufferEnsemble(member(0), member(1), p=[1.0])
    with pytest.raises(ValueError, match="not both"):
        ReplayBufferEnsemble(member(0), routing_key="a", routing_dim=0)


def test_built_from_parts_iteration_and_checkpoint(tmp_path):
    storages = StorageEnsemble(LazyTensorStorage(8), LazyTensorStorage(8))
    samplers = SamplerEnsemble(SamplerWithoutReplacement(), SamplerWithoutReplacement(), sample_from_all=True)
    writers = WriterEnsemble(TensorDictRoundRobinWriter(), TensorDictRoundRobinWriter())
    writers.register_storage(storages)
    ens = ReplayBufferEnsemble(storages=storages, samplers=samplers, writers=writers, batch_size=4)
    ens[0].extend(TensorDict({"x": torch.arange(4.0)}, [4]))
    ens[1].extend(TensorDict({"x": torch.arange(4.0) + 10}, [4]))
    seen = torch.cat([b["x"].reshape(-1) for b in ens])  # one epoch of each member
    assert sorted(seen.tolist()) == [0, 1, 2, 3, 10, 11, 12, 13]
    ens.dumps(tmp_path / "ens")
    other = ReplayBufferEnsemble(*[TensorDictReplayBuffer(storage=LazyTensorStorage(8),
                                                          sampler=SamplerWithoutReplacement()) for _ in range(2)])
    other.loads(tmp_path / "ens")
    assert other[1][:]["x"].tolist() == [10, 11, 12, 13]
    three = ReplayBufferEnsemble(member(5, n=2), member(0, n=0), member(0, n=0))
    with pytest.raises(CheckpointError, match="members"):
        three.loads(tmp_path / "ens")
    assert three[0][:]["x"].tolist() == [5, 6]
    idx, info = SamplerEnsemble(RandomSampler(), RandomSampler(), sample_from_all=True).sample(storages, 4)
    got = storages.get(idx)
    assert [b for b, _ in got] == [0, 1] and bool((got[1][1]["x"] >= 10).all())
