"""StreamingSliceSampler: completed windows of the stream served once, in order, against a
plain-Python cut of the stream; then uniform slices."""

from __future__ import annotations

import pytest
import torch

from steersman.data.replay_buffers import (
    LazyTensorStorage,
    StreamingSliceSampler,
    TensorDictReplayBuffer,
)
from steersman.tensordict import TensorDict

L = 3


def chunk(start: int, n: int, done_at: set[int], key: str = "done") -> TensorDict:
    steps = torch.arange(start, start + n)
    done = torch.tensor([int(s) in done_at for s in steps]).unsqueeze(-1)
    return TensorDict({"step": steps, "next": {key: done}}, [n])


def reference_windows(n: int, done_at: set[int]) -> list[list[int]]:
    out, cur = [], []
    for s in range(n):
        cur.append(s)
        if len(cur) == L:
            out.append(cur)
            cur = []
        elif s in done_at:
            cur = []
    return out


@pytest.mark.parametrize("chunks", [[14], [2, 5, 1, 6], [1] * 14])
def test_windows_in_order_never_across_ends(chunks):
    done_at = {4, 5, 9}
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(64), sampler=StreamingSliceSampler(slice_len=L))
    start, served = 0, []
    for n in chunks:
        rb.extend(chunk(start, n, done_at))
        start += n
        while rb.sampler._queue or rb.sampler._pending:
            rb.sampler._process(rb.storage)
            if not rb.sampler._queue:
                break
            s = rb.sample(L)
            served.append(s["step"].tolist())
            assert s["is_init"].reshape(-1).tolist() == [True, False, False]
            assert s["next", "truncated"].reshape(-1).tolist() == [False, False, True]
    assert served == reference_windows(start, done_at)
    fallback = rb.sample(2 * L)["step"].view(2, L)  # queue empty: uniform slices inside episodes
    assert ((fallback[:, 1:] - fallback[:, :-1]) == 1).all()


def test_overwritten_windows_are_dropped_and_mixed_batches():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(6), sampler=StreamingSliceSampler(slice_len=L))
    rb.extend(chunk(0, 6, set()))  # windows [0,1,2] and [3,4,5] queued
    rb.extend(chunk(6, 3, set()))  # overwrites slots 0..2: window [0,1,2] is gone, [6,7,8] queued
    s = rb.sample(3 * L)["step"].view(3, L)
    assert s[0].tolist() == [3, 4, 5] and s[1].tolist() == [6, 7, 8]
    assert ((s[2, 1:] - s[2, :-1]) == 1).all()  # the rest: a uniform slice


def test_traj_key_and_end_keys():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(32), sampler=StreamingSliceSampler(slice_len=L,
                                                                                              traj_key="episode"))
    ep = torch.tensor([0, 0, 1, 1, 1, 1, 2, 2, 2])
    rb.extend(TensorDict({"step": torch.arange(9), "episode": ep}, [9]))
    assert rb.sample(2 * L)["step"].tolist() == [2, 3, 4, 6, 7, 8]
    both = StreamingSliceSampler(slice_len=L, end_keys=[("next", "done"), ("next", "stop")])
    rb2 = TensorDictReplayBuffer(storage=LazyTensorStorage(32), sampler=both)
    td = chunk(0, 8, {1})
    td.set(("next", "stop"), torch.tensor([s == 4 for s in range(8)]).unsqueeze(-1))
    rb2.extend(td)
    assert rb2.sample(L)["step"].tolist() == [2, 3, 4]
    with pytest.raises(ValueError, match="not both"):
        StreamingSliceSampler(slice_len=L, end_key="a", end_keys=["b"])
    with pytest.raises(NotImplementedError, match="pad_output"):
        StreamingSliceSampler(slice_len=L, pad_output=True)
