"""Storage checkpointers and TED conversions: round trips per storage kind, compaction,
refusal of folders that do not fit (storage unchanged)."""

from __future__ import annotations

import pytest
import torch

from steersman.data.replay_buffers import (
    CheckpointError,
    CompressedListStorage,
    CompressedListStorageCheckpointer,
    Flat2TED,
    FlatStorageCheckpointer,
    H5Combine,
    H5Split,
    H5StorageCheckpointer,
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    ListStorageCheckpointer,
    Nested2TED,
    NestedStorageCheckpointer,
    RandomSampler,
    StorageEnsemble,
    TED2Flat,
    TED2Nested,
    TensorDictReplayBuffer,
    TensorStorage,
    TensorStorageCheckpointer,
)
from steersman.tensordict import TensorDict
from tests.data.test_replay_buffers import make_stream

CAP = 24

STORAGES = {
    "list": lambda tmp: ListStorage(CAP),
    "compressed": lambda tmp: CompressedListStorage(CAP),
    "lazy": lambda tmp: LazyTensorStorage(CAP),
    "memmap": lambda tmp: LazyMemmapStorage(CAP, scratch_dir=tmp / "scratch"),
    "tensor": lambda tmp: TensorStorage(_zeros()),
}


def _zeros() -> TensorDict:
    td = make_stream(CAP).zero_()
    td.set("index", torch.zeros(CAP, dtype=torch.long))
    return td
CHECKPOINTERS = {
    "list": ListStorageCheckpointer,
    "compressed": CompressedListStorageCheckpointer,
    "tensor": TensorStorageCheckpointer,
    "flat": FlatStorageCheckpointer,
    "nested": NestedStorageCheckpointer,
    "h5": H5StorageCheckpointer,
}
PAIRS = [("list", "list"), ("compressed", "compressed")] + [
    (s, c) for s in ("lazy", "memmap", "tensor") for c in ("tensor", "flat", "nested", "h5")]


def _buffer(tmp, storage: str, checkpointer: str) -> TensorDictReplayBuffer:
    st = STORAGES[storage](tmp)
    st.checkpointer = CHECKPOINTERS[checkpointer]()
    return TensorDictReplayBuffer(storage=st, sampler=RandomSampler(), batch_size=8)


@pytest.mark.parametrize("storage,checkpointer", PAIRS)
def test_round_trip_per_storage_kind(tmp_path, storage, checkpointer):
    rb = _buffer(tmp_path / "a", storage, checkpointer)
    data = make_stream(40)  # wraps the 24 slots
    for part in (data[:20], data[20:]):
        rb.extend([part[i] for i in range(20)] if storage in ("list", "compressed") else part)
    rb.dumps(tmp_path / "ckpt")
    back = _buffer(tmp_path / "b", storage, checkpointer)
    back.loads(tmp_path / "ckpt")
    assert len(back) == len(rb) and back.write_count == rb.write_count
    assert (back[:] == rb[:]).all()
    torch.manual_seed(1)
    s1 = rb.sample()
    torch.manual_seed(1)
    s2 = back.sample()
    assert (s1 == s2).all()
    back.extend(data[:3] if storage not in ("list", "compressed") else [data[i] for i in range(3)])
    assert back.storage._last_cursor == (rb.storage._last_cursor + 3) % CAP


def test_flat_checkpointer_stores_next_copies_only_at_ends(tmp_path):
    st = LazyTensorStorage(CAP)
    st.checkpointer = FlatStorageCheckpointer()
    data = make_stream(CAP)
    st.set(torch.arange(CAP), data)
    st.dumps(tmp_path / "flat")
    from steersman.tensordict import load

    flat = load(tmp_path / "flat" / "tensors")
    ends = int(data["next", "done"].sum()) + 1  # + the last step (an unfinished episode)
    assert flat["next_at_ends", "obs"].shape == (ends, 3)
    assert "obs" not in flat["next"].keys() and "reward" in flat["next"].keys()
    assert flat["is_end"].sum() == ends


def test_folder_of_another_checkpointer_is_refused_and_storage_unchanged(tmp_path):
    a = LazyTensorStorage(8)
    a.checkpointer = FlatStorageCheckpointer()
    a.set(torch.arange(8), make_stream(8))
    a.dumps(tmp_path / "flat")
    b = LazyTensorStorage(8)
    b.set(torch.arange(2), make_stream(2))
    before = b.get(torch.arange(2)).clone()
    with pytest.raises(CheckpointError, match="FlatStorageCheckpointer"):
        b.loads(tmp_path / "flat")  # the default checkpointer cannot read the flat form
    assert len(b) == 2 and (b.get(torch.arange(2)) == before).all()


def test_damaged_h5_and_compressed_blobs_are_refused(tmp_path):
    st = LazyTensorStorage(8)
    st.checkpointer = H5StorageCheckpointer()
    st.set(torch.arange(8), make_stream(8))
    st.dumps(tmp_path / "h5")
    (tmp_path / "h5" / "checkpoint.h5").write_bytes(b"not hdf5 at all")
    fresh = LazyTensorStorage(8)
    fresh.checkpointer = H5StorageCheckpointer()
    with pytest.raises(CheckpointError, match="HDF5"):
        fresh.loads(tmp_path / "h5")
    assert len(fresh) == 0

    c = CompressedListStorage(4)
    c.checkpointer = CompressedListStorageCheckpointer()
    c.set(range(2), [torch.arange(100), torch.zeros(3)])
    c.dumps(tmp_path / "c")
    other = CompressedListStorage(4, compression_level=1)
    other.checkpointer = CompressedListStorageCheckpointer()
    other.decompression_fn = lambda blob: blob[:5]  # a codec that does not give the recorded size
    with pytest.raises(CheckpointError, match="bytes"):
        other.loads(tmp_path / "c")
    assert len(other) == 0
    with pytest.raises(TypeError, match="checkpoints CompressedListStorage"):
        CompressedListStorageCheckpointer().dumps(LazyTensorStorage(2), tmp_path / "x")


def test_storage_ensemble_checkpointer(tmp_path):
    a, b = LazyTensorStorage(6), ListStorage(6)
    a.set(torch.arange(4), make_stream(4))
    b.set(range(2), ["x", torch.ones(2)])
    StorageEnsemble(a, b).dumps(tmp_path / "ens")
    c, d = LazyTensorStorage(6), ListStorage(6)
    StorageEnsemble(c, d).loads(tmp_path / "ens")
    assert (c.get(torch.arange(4)) == a.get(torch.arange(4))).all() and d.get(0) == "x"
    with pytest.raises(CheckpointError, match="3 storages"):
        StorageEnsemble(c, d, LazyTensorStorage(2)).loads(tmp_path / "ens")


def _random_ted(n: int, seed: int) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    done = torch.rand(n, 1, generator=g) < 0.25
    obs = torch.randn(n, 2, generator=g)
    nxt = torch.cat([obs[1:], torch.randn(1, 2, generator=g)])
    nxt[done.squeeze(-1)] = torch.randn(int(done.sum()), 2, generator=g)  # a reset after each end
    other = torch.randn(n, generator=g)
    return TensorDict({"obs": obs, "pos": {"x": other}, "action": torch.randint(3, (n,), generator=g),
                       "next": {"obs": nxt, "pos": {"x": other + 1},  # next pos is not the root's shifted
                                "reward": torch.randn(n, 1, generator=g), "done": done,
                                "terminated": done.clone()}}, [n])


@pytest.mark.parametrize("seed", range(6))
def test_ted_conversions_round_trip(seed):
    n = 5 + 7 * seed
    ted = _random_ted(n, seed)
    last = None if seed % 2 else n // 2
    flat = TED2Flat()(ted, last_cursor=last)
    assert (Flat2TED()(flat) == ted).all()
    assert "obs" in flat["next_at_ends"].keys() and ("pos", "x") in flat["next"].keys(include_nested=True)
    if seed > 1:
        return  # nested tensors: two cases are enough (the first jagged tensor costs seconds of set-up)
    nested = TED2Nested()(ted, last_cursor=last)
    ends = ted["next", "done"].squeeze(-1).clone()
    ends[-1] = True
    if last is not None:
        ends[last] = True
    assert nested.batch_size[0] == int(ends.sum())
    assert (Nested2TED()(nested) == ted).all()


def test_flat2ted_refuses_parts_that_do_not_fit():
    flat = TED2Flat()(_random_ted(10, 0))
    flat.set("is_end", flat["is_end"][:-1])
    with pytest.raises(ValueError, match="rows"):
        Flat2TED()(flat)
    with pytest.raises(ValueError, match="is_end"):
        Flat2TED()(TensorDict({"obs": torch.zeros(3)}, []))


def test_h5_split_and_combine_through_an_hdf5_file(tmp_path):
    from steersman.tensordict import from_h5, to_h5

    ted = _random_ted(12, 3)
    split = H5Split()(TED2Nested()(ted))
    assert sorted(split.keys(), key=lambda k: int(k[5:])) == [f"traj_{i}" for i in range(len(split.keys()))]
    to_h5(split, tmp_path / "trajs.h5").close()
    stored = from_h5(tmp_path / "trajs.h5")
    try:
        assert (H5Combine()(stored) == ted).all()
    finally:
        stored.close()
    with pytest.raises(ValueError, match="traj_<i>"):
        H5Combine()(TensorDict({"other": TensorDict({}, [])}, []))
