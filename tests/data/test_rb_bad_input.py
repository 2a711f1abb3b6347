"""Bad input: mismatched data, empty buffers, bad checkpoints. Each leaves the buffer unchanged."""

from __future__ import annotations

import json

import pytest
import torch

from steersman.data.replay_buffers import (
    CheckpointError,
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    PrioritizedSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    SliceSampler,
    TensorDictReplayBuffer,
)
from steersman.tensordict import TensorDict


def transitions(n: int, obs_dim: int = 4) -> TensorDict:
    return TensorDict({"obs": torch.randn(n, obs_dim), "action": torch.randint(3, (n, 1)),
                       "next": {"obs": torch.randn(n, obs_dim), "reward": torch.randn(n, 1)}}, [n])


def snapshot(rb) -> dict:
    data = rb.storage._storage
    return {"len": len(rb), "count": rb.write_count, "cursor": rb.writer._cursor,
            "data": None if data is None else data.to_tensordict().clone()}


def assert_unchanged(rb, snap) -> None:
    now = snapshot(rb)
    assert now["len"] == snap["len"] and now["count"] == snap["count"] and now["cursor"] == snap["cursor"]
    a, b = now["data"], snap["data"]
    assert a.keys(True, True) == b.keys(True, True) if hasattr(a.keys(True, True), "__eq__") else True
    for key in b.keys(True, True):
        assert torch.equal(a[key], b[key]), key


@pytest.fixture(params=["lazy", "memmap"])
def rb(request, tmp_path):
    storage = LazyTensorStorage(20) if request.param == "lazy" else LazyMemmapStorage(20, scratch_dir=tmp_path / "s")
    buf = ReplayBuffer(storage=storage, batch_size=4)
    buf.extend(transitions(6))
    return buf


def test_shape_mismatch_names_key_and_both_shapes(rb):
    snap = snapshot(rb)
    bad = transitions(3, obs_dim=5)
    with pytest.raises(ValueError) as err:
        rb.extend(bad)
    msg = str(err.value)
    assert "'obs'" in msg and "[4]" in msg and "[5]" in msg and "nothing was written" in msg
    assert_unchanged(rb, snap)


def test_nested_shape_mismatch_names_nested_key(rb):
    snap = snapshot(rb)
    bad = transitions(3)
    bad["next", "reward"] = torch.randn(3, 2)
    with pytest.raises(ValueError, match=r"\('next', 'reward'\).*\[1\].*\[2\]"):
        rb.extend(bad)
    assert_unchanged(rb, snap)


def test_missing_and_extra_keys(rb):
    snap = snapshot(rb)
    with pytest.raises(KeyError, match="'action' is missing"):
        rb.extend(transitions(3).exclude("action"))
    extra = transitions(3)
    extra["surprise"] = torch.zeros(3)
    with pytest.raises(KeyError, match="'surprise' is not in the storage"):
        rb.extend(extra)
    wrong_kind = transitions(3)
    wrong_kind["next"] = torch.zeros(3)
    with pytest.raises(TypeError, match="'next'"):
        rb.extend(wrong_kind)
    with pytest.raises(TypeError):
        rb.extend(torch.zeros(3, 4))  # a tensor into a TensorDict storage
    assert_unchanged(rb, snap)


def test_mismatch_after_wrap_leaves_cursor(rb):
    rb.extend(transitions(13))  # cursor at 19
    snap = snapshot(rb)
    bad = transitions(5)
    bad["obs"] = torch.zeros(5, 7)
    with pytest.raises(ValueError):
        rb.extend(bad)  # would wrap: nothing may be written at either end
    assert_unchanged(rb, snap)


def test_add_validates_too(rb):
    snap = snapshot(rb)
    with pytest.raises(ValueError, match="'obs'"):
        rb.add(transitions(1, obs_dim=2)[0])
    assert_unchanged(rb, snap)


def test_dtype_is_cast_not_rejected(rb):
    td = transitions(2)
    td["obs"] = td["obs"].double()
    rb.extend(td)
    assert rb.storage._storage["obs"].dtype == torch.float32 and len(rb) == 8


@pytest.mark.parametrize("sampler", [None, SamplerWithoutReplacement(), PrioritizedSampler(10, 0.5, 0.5),
                                     SliceSampler(slice_len=2)])
def test_sampling_empty_buffer_is_a_clear_error(sampler):
    rb = ReplayBuffer(storage=LazyTensorStorage(10), sampler=sampler)
    with pytest.raises(RuntimeError, match="empty replay buffer"):
        rb.sample(4)
    rb2 = ReplayBuffer(storage=ListStorage(10), sampler=None if sampler is None or isinstance(sampler, SliceSampler)
                       else type(sampler)(10, 0.5, 0.5) if isinstance(sampler, PrioritizedSampler) else sampler)
    with pytest.raises(RuntimeError, match="empty replay buffer"):
        rb2.sample(4)


def test_bad_constructor_arguments():
    with pytest.raises(ValueError):
        LazyTensorStorage(0)
    with pytest.raises(ValueError):
        ReplayBuffer(storage=LazyTensorStorage(100), sampler=PrioritizedSampler(10, 0.5, 0.5))
    with pytest.raises(TypeError):
        ReplayBuffer(storage=ListStorage(10), sampler=SliceSampler(slice_len=2))
    with pytest.raises(ValueError):
        ReplayBuffer(batch_size=0)
    with pytest.raises(TypeError):
        ReplayBuffer(storage="not a storage")
    rb = ReplayBuffer(storage=LazyTensorStorage(5))
    rb.extend(torch.zeros(3, 2))
    with pytest.raises(ValueError):
        rb.sample(0)
    with pytest.raises(IndexError):
        rb[7]


def test_non_tensor_entries_point_to_list_storage():
    from steersman.tensordict import NonTensorData

    td = TensorDict({"obs": torch.zeros(2, 3)}, [2])
    td["tag"] = NonTensorData("x", batch_size=[2])
    rb = ReplayBuffer(storage=LazyTensorStorage(5))
    with pytest.raises(TypeError, match="ListStorage"):
        rb.extend(td)
    assert len(rb) == 0


# ------------------------------------------------------------------------------ checkpoints
def filled_td_buffer(tmp_path, n=8):
    rb = TensorDictReplayBuffer(storage=LazyMemmapStorage(16, scratch_dir=tmp_path / "scratch"),
                                sampler=PrioritizedSampler(16, 0.6, 0.4), batch_size=4)
    rb.extend(transitions(n))
    return rb


def test_loads_foreign_folder_raises_and_keeps_buffer(tmp_path):
    rb = filled_td_buffer(tmp_path)
    snap = snapshot(rb)
    tree = rb.sampler._tree._tensors['sum'].clone()
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("hello")
    with pytest.raises(CheckpointError, match="no replay-buffer checkpoint"):
        rb.loads(tmp_path / "foreign")
    with pytest.raises(CheckpointError):
        rb.loads(tmp_path / "does-not-exist")
    # a folder that holds something else refuses to become a checkpoint
    with pytest.raises(FileExistsError):
        rb.dumps(tmp_path / "foreign")
    assert_unchanged(rb, snap)
    assert torch.equal(rb.sampler._tree._tensors['sum'], tree)


@pytest.mark.parametrize("damage", ["pointer", "buffer_meta", "storage_meta", "truncated_file", "missing_file",
                                    "bad_dtype", "sampler_shape", "other_structure"])
def test_loads_corrupted_checkpoint_raises_and_keeps_buffer(tmp_path, damage):
    src = filled_td_buffer(tmp_path / "src", n=10)
    src.update_priority(torch.arange(10), torch.rand(10))
    src.dumps(tmp_path / "ckpt")
    ckpt = tmp_path / "ckpt"
    cur = ckpt / json.loads((ckpt / "LATEST.json").read_text())["current"]
    if damage == "pointer":
        (ckpt / "LATEST.json").write_text("{not json")
    elif damage == "buffer_meta":
        (cur / "buffer.json").write_text(json.dumps({"format": "something else"}))
    elif damage == "storage_meta":
        meta = json.loads((cur / "storage" / "meta.json").read_text())
        meta["filled_rows"] = "ten"
        (cur / "storage" / "meta.json").write_text(json.dumps(meta))
    elif damage == "truncated_file":
        f = cur / "storage" / "tensors" / "obs.memmap"
        f.write_bytes(f.read_bytes()[:7])
    elif damage == "missing_file":
        (cur / "storage" / "tensors" / "next" / "reward.memmap").unlink()
    elif damage == "bad_dtype":
        meta_f = cur / "storage" / "tensors" / "meta.json"
        meta = json.loads(meta_f.read_text())
        meta["entries"]["obs"]["dtype"] = "os.system"
        meta_f.write_text(json.dumps(meta))
    elif damage == "sampler_shape":
        meta_f = cur / "sampler" / "meta.json"
        meta = json.loads(meta_f.read_text())
        meta["max_capacity"] = 99
        meta_f.write_text(json.dumps(meta))
    elif damage == "other_structure":
        other = TensorDictReplayBuffer(storage=LazyTensorStorage(16), sampler=PrioritizedSampler(16, 0.6, 0.4))
        other.extend(TensorDict({"different": torch.zeros(3)}, [3]))
        other.dumps(tmp_path / "ckpt2")
        ckpt = tmp_path / "ckpt2"

    dst = filled_td_buffer(tmp_path / "dst", n=5)
    snap = snapshot(dst)
    tree = dst.sampler._tree._tensors['sum'].clone()
    with pytest.raises((CheckpointError, ValueError)) as err:
        dst.loads(ckpt)
    assert isinstance(err.value, ValueError)  # CheckpointError is a ValueError
    assert_unchanged(dst, snap)
    assert torch.equal(dst.sampler._tree._tensors['sum'], tree)
    assert dst.sample()["obs"].shape == (4, 4)  # still usable
