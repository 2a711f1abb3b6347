"""ConsumingSampler, StalenessAwareSampler and sample units."""

from __future__ import annotations

import pytest
import torch

from steersman.data.replay_buffers import (
    ConsumingSampler,
    LazyTensorStorage,
    ListStorage,
    ReplayBuffer,
    SampleUnit,
    StalenessAwareSampler,
    TensorDictReplayBuffer,
    Transition,
)
from steersman.tensordict import TensorDict


@pytest.mark.parametrize("storage", ["list", "lazy"])
@pytest.mark.parametrize("max_count", [1, 3])
def test_each_item_returned_max_count_times_then_exhausted(storage, max_count):
    st = ListStorage(20) if storage == "list" else LazyTensorStorage(20)
    rb = ReplayBuffer(storage=st, sampler=ConsumingSampler(max_count), batch_size=4)
    rb.extend([torch.tensor(i) for i in range(10)] if storage == "list" else torch.arange(10))
    seen: list[int] = []
    while len(rb):
        batch = rb.sample()
        assert len(set(batch.tolist())) == len(batch)  # distinct within a batch
        seen += batch.tolist()
    assert sorted(seen) == sorted(list(range(10)) * max_count)
    assert rb.sampler.ran_out
    with pytest.raises(RuntimeError, match="consumed"):
        rb.sample()


def test_writes_refill_consumed_slots_first():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), sampler=ConsumingSampler(), batch_size=3)
    rb.extend(TensorDict({"x": torch.arange(6.0)}, [6]))
    taken = sorted(rb.sample()["index"].tolist())
    assert len(rb) == 3
    new = TensorDict({"x": torch.tensor([10.0, 11.0, 12.0, 13.0])}, [4])
    index = rb.extend(new)
    assert sorted(index[:3].tolist()) == taken and index[3].item() == 6  # then the writer's cursor
    assert new["index"].tolist() == index.tolist()
    assert len(rb) == 7 and rb.write_count == 10
    assert rb.add(TensorDict({"x": torch.tensor(99.0)}, [])) == 7
    got = sorted(rb.sample(8)["x"].tolist())
    assert got == sorted([x for i, x in enumerate(range(6)) if i not in taken] + [10, 11, 12, 13, 99])


def test_consuming_refuses_prefetch_and_checkpoints(tmp_path):
    with pytest.raises(ValueError, match="prefetch"):
        ReplayBuffer(storage=ListStorage(4), sampler=ConsumingSampler(), prefetch=2)
    rb = ReplayBuffer(storage=LazyTensorStorage(8), sampler=ConsumingSampler())
    rb.extend(torch.arange(5))
    rb.sample(2)
    rb.dumps(tmp_path / "c")
    back = ReplayBuffer(storage=LazyTensorStorage(8), sampler=ConsumingSampler())
    back.loads(tmp_path / "c")
    left = sorted(rb.sample(3).tolist())
    assert len(back) == 3 and sorted(back.sample(3).tolist()) == left


def test_staleness_cutoff_and_weights():
    sampler = StalenessAwareSampler(max_staleness=2)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), sampler=sampler)
    rb.extend(TensorDict({"policy_version": torch.tensor([0, 1, 2, 3, 3])}, [5]))
    sampler.consumer_version = 3
    torch.manual_seed(0)
    v = rb.sample(4000)["policy_version"]
    assert set(v.tolist()) == {1, 2, 3}  # version 0 is 3 updates old
    freq = torch.bincount(v, minlength=4).double() / v.numel()
    w = torch.tensor([0, 1 / 3, 1 / 2, 2.0], dtype=torch.float64)  # 1/(s+1) per item: versions 3 appear twice
    assert torch.allclose(freq, w / w.sum(), atol=0.03)
    assert sampler.increment_consumer_version(10) == 13
    with pytest.raises(RuntimeError, match="staler"):
        rb.sample(2)
    flat = StalenessAwareSampler(staleness_weight_fn=lambda s: torch.ones_like(s, dtype=torch.float))
    rb2 = TensorDictReplayBuffer(storage=LazyTensorStorage(10), sampler=flat)
    rb2.extend(TensorDict({"v": torch.zeros(3)}, [3]))
    with pytest.raises(KeyError, match="policy_version"):
        rb2.sample(2)


class Pairs(SampleUnit):
    """Each anchor and the step after it (a 2-step unit)."""

    def expand(self, index, info, storage):
        n = len(storage)
        out = torch.stack([index, (index + 1) % n], -1).reshape(-1)
        return out, {**info, "anchor": index.repeat_interleave(2)}


def test_sample_units():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), sample_unit=Pairs())
    rb.extend(TensorDict({"x": torch.arange(10)}, [10]))
    s = rb.sample(3)
    assert s.shape == (6,)
    assert torch.equal(s["x"].view(3, 2)[:, 1], (s["anchor"].view(3, 2)[:, 0] + 1) % 10)
    assert torch.equal(s["index"], s["x"])
    plain = ReplayBuffer(storage=LazyTensorStorage(10), sample_unit=Transition())
    plain.extend(torch.arange(10))
    assert plain.sample(5).shape == (5,)
