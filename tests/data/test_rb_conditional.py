"""update_if_present with slot generations: live records patched, stale ones untouched,
version comparison, validation before any write; checked against a plain-Python model."""

from __future__ import annotations

import pytest
import torch

from steersman.data.replay_buffers import (
    ConditionalUpdateResult,
    LazyTensorStorage,
    RoundRobinWriter,
    TensorDictReplayBuffer,
    TensorDictRoundRobinWriter,
)
from steersman.tensordict import TensorDict


def buffer(cap: int = 6) -> TensorDictReplayBuffer:
    return TensorDictReplayBuffer(storage=LazyTensorStorage(cap), writer=TensorDictRoundRobinWriter(track_generations=True))


def data(n: int, start: int = 0) -> TensorDict:
    return TensorDict({"v": torch.arange(start, start + n, dtype=torch.float32), "ver": torch.zeros(n, dtype=torch.long)}, [n])


def test_stale_handles_are_skipped_like_a_plain_model():
    rb = buffer()
    idx = rb.extend(data(6))
    gen = rb.sample(6)  # handles from a sample
    handles = list(zip(gen["index"].tolist(), gen["index_generation"].tolist()))
    rb.extend(data(2, 100))  # slots 0 and 1 reused
    model_gen = {s: 1 for s in range(6)} | {0: 2, 1: 2}
    res = rb.update_if_present(index=gen["index"], generation=gen["index_generation"],
                               patch={"v": torch.full((6,), -1.0)})
    assert isinstance(res, ConditionalUpdateResult) and res.version_rejected is None
    assert res.updated.tolist() == [model_gen[s] == g for s, g in handles]
    assert res.updated_count + res.stale_count == 6
    stored = rb[:]["v"].tolist()
    sampled = {h for h, _ in handles}
    for s in range(6):
        assert stored[s] == (100 + s if s < 2 else -1.0 if s in sampled else float(s))
    assert idx.tolist() == list(range(6))
    rb.empty()
    res = rb.update_if_present(index=torch.tensor([2]), generation=torch.tensor([1]), patch={"v": torch.ones(1)})
    assert res.stale_count == 1  # emptied


def test_versions_and_duplicates():
    rb = buffer()
    rb.extend(data(4))
    g = rb.writer.generations(torch.arange(4))
    res = rb.update_if_present(index=torch.tensor([0, 0, 1, 2]), generation=g[[0, 0, 1, 2]],
                               patch={"v": torch.tensor([10.0, 11.0, 12.0, 13.0])}, version_key="ver",
                               version=torch.tensor([3, 5, 0, 0]), require_newer=True)
    assert res.updated.tolist() == [False, True, False, False]  # slot 0: highest version wins; ties rejected
    assert res.version_rejected.tolist() == [True, False, True, True] and res.stale_count == 0
    assert rb[:]["v"].tolist()[:3] == [11.0, 1.0, 2.0] and rb[:]["ver"].tolist()[:3] == [5, 0, 0]
    res = rb.update_if_present(index=torch.tensor([1]), generation=g[[1]], patch={"v": torch.tensor([7.0])},
                               version_key="ver", version=0)
    assert res.updated.tolist() == [True]  # ties accepted without require_newer


def test_validation_first_and_requirements(tmp_path):
    rb = buffer()
    rb.extend(data(4))
    g = rb.writer.generations(torch.arange(2))
    before = rb[:].clone()
    with pytest.raises(KeyError, match="nope"):
        rb.update_if_present(index=torch.arange(2), generation=g, patch={"v": torch.ones(2), "nope": torch.ones(2)})
    with pytest.raises(ValueError, match="shape"):
        rb.update_if_present(index=torch.arange(2), generation=g, patch={"v": torch.ones(3)})
    with pytest.raises(ValueError, match="together"):
        rb.update_if_present(index=torch.arange(2), generation=g, patch={"v": torch.ones(2)}, version_key="ver")
    assert (rb[:] == before).all()
    plain = TensorDictReplayBuffer(storage=LazyTensorStorage(4))
    plain.extend(data(2))
    with pytest.raises(RuntimeError, match="track"):
        plain.update_if_present(index=torch.arange(1), generation=torch.ones(1), patch={"v": torch.ones(1)})
    assert "index_generation" not in plain.sample(2).keys()
    rb.dumps(tmp_path / "g")
    back = TensorDictReplayBuffer(storage=LazyTensorStorage(6), writer=TensorDictRoundRobinWriter(track_generations=True))
    back.loads(tmp_path / "g")
    assert torch.equal(back.writer.generations(torch.arange(6)), rb.writer.generations(torch.arange(6)))
    w = RoundRobinWriter(track_generations=True)
    w.register_storage(LazyTensorStorage(3))
    w.extend(torch.arange(4))  # 4 items into 3 slots: only the last 3 are written, once each
    w.add(torch.tensor(9))
    assert w.generations(torch.arange(3)).tolist() == [1, 2, 1]
