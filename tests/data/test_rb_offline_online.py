"""OfflineToOnlineReplayBuffer: exact offline/online split per batch, annealing, bad input."""

from __future__ import annotations

import pytest
import torch

from steersman.data.replay_buffers import (
    LazyTensorStorage,
    ListStorage,
    OfflineToOnlineReplayBuffer,
    ReplayBuffer,
    TensorDictReplayBuffer,
)
from steersman.tensordict import TensorDict


def offline() -> TensorDictReplayBuffer:
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(50))
    rb.extend(TensorDict({"obs": torch.zeros(50, 2), "src": torch.zeros(50)}, [50]))
    return rb


@pytest.mark.parametrize("fraction,batch", [(0.5, 10), (0.3, 7), (0.9, 4)])
def test_exact_split_every_batch(fraction, batch):
    rb = OfflineToOnlineReplayBuffer(offline(), online_capacity=20, offline_fraction=fraction)
    assert (rb.sample(batch)["src"] == 0).all()  # no online data yet: offline only
    rb.extend(TensorDict({"obs": torch.ones(5, 2), "src": torch.ones(5)}, [5]))
    for _ in range(5):
        s = rb.sample(batch)
        k = round(fraction * batch)
        assert s.shape == (batch,) and s["src"].tolist() == [0.0] * k + [1.0] * (batch - k)
        assert "index" not in s.keys()
    rb.anneal(0)
    assert (rb.sample(batch)["src"] == 1).all()
    assert len(rb.offline_buffer) == 50 and len(rb.online_buffer) == 5 and len(rb) == 55


def test_tensors_transform_and_bad_input():
    off = ReplayBuffer(storage=LazyTensorStorage(10))
    off.extend(torch.zeros(10))
    rb = OfflineToOnlineReplayBuffer(off, online_storage=ListStorage(10), batch_size=4, transform=lambda x: x + 1)
    rb.extend([torch.tensor(5.0)] * 3)
    assert rb.sample().tolist() == [1.0, 1.0, 6.0, 6.0]
    with pytest.raises(NotImplementedError, match="dataset ids"):
        OfflineToOnlineReplayBuffer("d4rl:hopper-medium-v2", online_capacity=4)
    with pytest.raises(ValueError, match="exactly one"):
        OfflineToOnlineReplayBuffer(off)
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        OfflineToOnlineReplayBuffer(off, online_capacity=4, offline_fraction=1.0)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        rb.anneal(-0.1)
    assert rb.offline_fraction == 0.5
