"""LazyStackStorage, CompressedListStorage, ImmutableDatasetWriter, prefill_replay_buffer and
the small torchrl.data helpers (create_infinite_iterator, DEVICE_TYPING)."""

from __future__ import annotations

import typing
import zlib
from itertools import islice

import pytest
import torch

from steersman.data import (
    DEVICE_TYPING,
    CheckpointError,
    CompressedListStorage,
    ImmutableDatasetWriter,
    LazyStackStorage,
    LazyTensorStorage,
    ListStorage,
    ReplayBuffer,
    SamplerWithoutReplacement,
    create_infinite_iterator,
    prefill_replay_buffer,
)
from steersman.tensordict import LazyStackedTensorDict, TensorDict

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int8, torch.uint8,
          torch.bool]


def _rand(shape, dtype, g):
    x = torch.randn(shape, generator=g) * 50
    return (x > 0) if dtype is torch.bool else x.to(dtype)


# ---------------------------------------------------------------- CompressedListStorage
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (5,), (2, 3, 4)])
def test_compressed_round_trips_values_shapes_dtypes(dtype, shape):
    g = torch.Generator().manual_seed(0)
    items = [_rand(shape, dtype, g) for _ in range(3)]
    s = CompressedListStorage(4)
    s.set([0, 1, 2], items)
    for i, x in enumerate(items):
        y = s.get(i)
        assert y.dtype == x.dtype and y.shape == x.shape and torch.equal(y, x)
    # stored blobs are zlib streams of the raw bytes (an independent decode)
    rec = s._storage[1]["tensor"]
    raw = zlib.decompress(rec["blob"].numpy().tobytes())
    assert raw == items[1].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def test_compressed_nested_tensordict_and_buffer_sampling():
    torch.manual_seed(0)
    frames = torch.zeros(10, 3, 16, 16, dtype=torch.uint8)
    frames[:, 0] = torch.arange(10, dtype=torch.uint8).view(10, 1, 1)
    data = TensorDict({"obs": frames, "next": {"reward": torch.arange(10.0).unsqueeze(-1)}}, [10])
    rb = ReplayBuffer(storage=CompressedListStorage(20), batch_size=4)
    rb.extend(data)
    assert len(rb) == 10
    batch = rb.sample()
    assert batch["obs"].shape == (4, 3, 16, 16) and batch["obs"].dtype == torch.uint8
    ids = batch["obs"][:, 0, 0, 0].long()
    assert torch.equal(batch["next", "reward"].squeeze(-1), ids.float())  # rows stay together
    assert rb.storage.nbytes_compressed() < frames.numel() // 4  # redundant frames shrink


def test_compressed_custom_codec_is_used():
    calls = []

    def comp(t):
        calls.append("c")
        return t.detach().contiguous().reshape(-1).view(torch.uint8).clone()

    def decomp(b):
        calls.append("d")
        return b

    s = CompressedListStorage(3, compression_fn=comp, decompression_fn=decomp)
    s.set(0, torch.arange(6.0).view(2, 3))
    assert torch.equal(s.get(0), torch.arange(6.0).view(2, 3))
    assert calls == ["c", "d"]


def test_compressed_bad_input_leaves_storage_unchanged():
    with pytest.raises(ValueError, match="compression_level"):
        CompressedListStorage(3, compression_level=12)
    s = CompressedListStorage(3)
    s.set(0, torch.ones(2))
    with pytest.raises(TypeError, match="item 1 is a str"):
        s.set([1, 2], [torch.zeros(2), "frame"])
    assert len(s) == 1 and torch.equal(s.get(0), torch.ones(2))


def test_compressed_dumps_loads_and_state_dict(tmp_path):
    s = CompressedListStorage(5)
    s.set([0, 1], [torch.arange(4), TensorDict({"a": torch.ones(2, 3)}, [2])])
    s.dumps(tmp_path / "c")
    t = CompressedListStorage(5)
    t.loads(tmp_path / "c")
    assert torch.equal(t.get(0), torch.arange(4)) and torch.equal(t.get(1)["a"], torch.ones(2, 3))
    assert isinstance(t._storage[0]["tensor"]["blob"], torch.Tensor)  # held compressed after load
    # a plain ListStorage checkpoint of tensors loads too; one with strings is refused, nothing changed
    plain = ListStorage(5)
    plain.set([0, 1], [torch.zeros(3), "not a tensor"])
    plain.dumps(tmp_path / "p")
    with pytest.raises(CheckpointError, match="str"):
        t.loads(tmp_path / "p")
    assert len(t) == 2 and torch.equal(t.get(0), torch.arange(4))
    # state_dict holds only tensors and plain values: loadable with weights_only=True
    torch.save(t.state_dict(), tmp_path / "sd.pt")
    u = CompressedListStorage(5)
    u.load_state_dict(torch.load(tmp_path / "sd.pt", weights_only=True))
    assert torch.equal(u.get(1)["a"], torch.ones(2, 3))


# ---------------------------------------------------------------- LazyStackStorage
@pytest.mark.parametrize("stack_dim", [0, -1])
def test_lazy_stack_heterogeneous_items(stack_dim):
    torch.manual_seed(0)
    lengths = [3, 5, 8]
    rb = ReplayBuffer(storage=LazyStackStorage(stack_dim=stack_dim), batch_size=6)
    for n in lengths:
        rb.add(TensorDict({"tokens": torch.full((2, n), float(n)), "len": torch.tensor([n, n])}, [2]))
    batch = rb.sample()
    assert isinstance(batch, LazyStackedTensorDict)
    if stack_dim == 0:
        assert batch.batch_size == (6, 2)
        members = [batch[i] for i in range(6)]
    else:
        assert batch.batch_size == (2, 6)
        members = [batch[:, i] for i in range(6)]
    for m in members:
        n = int(m["len"][0])
        assert n in lengths and torch.equal(m["tokens"], torch.full((2, n), float(n)))
    assert rb[1]["tokens"].shape == (2, 5)


def test_lazy_stack_refuses_non_tensordicts_and_unbounded_default():
    s = LazyStackStorage()
    assert s.max_size > 10**9
    s.set(0, TensorDict(a=torch.zeros(1)))
    with pytest.raises(TypeError, match="item 1 is a Tensor"):
        s.set([1, 2], [TensorDict(a=torch.zeros(1)), torch.zeros(1)])
    with pytest.raises(TypeError, match="LazyStackStorage holds TensorDicts"):
        s.set(1, torch.zeros(1))
    assert len(s) == 1


# ---------------------------------------------------------------- ImmutableDatasetWriter
def test_immutable_writer_refuses_writes_and_keeps_state():
    storage = LazyTensorStorage(10)
    storage.set(torch.arange(6), TensorDict(x=torch.arange(6.0), batch_size=[6]))
    rb = ReplayBuffer(storage=storage, writer=ImmutableDatasetWriter(), sampler=SamplerWithoutReplacement(),
                      batch_size=3)
    for call in (lambda: rb.add(TensorDict(x=torch.zeros(()))),
                 lambda: rb.extend(TensorDict(x=torch.zeros(2), batch_size=[2])), rb.empty):
        with pytest.raises(RuntimeError, match="doesn't allow writing"):
            call()
        assert len(rb) == 6 and torch.equal(rb[:]["x"], torch.arange(6.0))
    seen = torch.cat([rb.sample()["x"] for _ in range(2)])
    assert sorted(seen.tolist()) == list(map(float, range(6)))


# ---------------------------------------------------------------- prefill_replay_buffer
@pytest.mark.parametrize("n_samples,chunk", [(None, 1000), (7, 3), (50, 4), (0, 2)])
def test_prefill_copies_each_item_once_in_order(n_samples, chunk):
    data = TensorDict(obs=torch.arange(20.0).unsqueeze(-1), batch_size=[20])
    dataset = ReplayBuffer(storage=LazyTensorStorage(20))
    dataset.extend(data)
    online = ReplayBuffer(storage=LazyTensorStorage(100))
    online.extend(TensorDict(obs=torch.full((2, 1), -1.0), batch_size=[2]))
    assert prefill_replay_buffer(online, dataset, n_samples=n_samples, chunk_size=chunk) is online
    k = 20 if n_samples is None else min(n_samples, 20)
    assert len(online) == 2 + k
    assert online[:]["obs"].squeeze(-1).tolist() == [-1.0, -1.0] + [float(i) for i in range(k)]


def test_prefill_bad_input():
    rb = ReplayBuffer(storage=ListStorage(10))
    with pytest.raises(ValueError, match="downloader"):
        prefill_replay_buffer(rb, "d4rl:hopper-medium-v2")
    with pytest.raises(ValueError, match="chunk_size"):
        prefill_replay_buffer(rb, [1, 2], chunk_size=0)
    assert len(rb) == 0


# ---------------------------------------------------------------- helpers
def test_create_infinite_iterator_cycles_and_refuses_empty():
    assert list(islice(create_infinite_iterator(range(3)), 8)) == [0, 1, 2, 0, 1, 2, 0, 1]
    with pytest.raises(ValueError, match="yielded nothing"):
        next(create_infinite_iterator([]))
    it = create_infinite_iterator(iter([1, 2]))  # one-shot: one pass, then a clear error
    assert [next(it), next(it)] == [1, 2]
    with pytest.raises(ValueError, match="one-shot"):
        next(it)


def test_device_typing_members():
    assert set(typing.get_args(DEVICE_TYPING)) == {torch.device, str, int}
    assert isinstance(torch.device("cpu"), DEVICE_TYPING) and not isinstance(1.5, DEVICE_TYPING)


@pytest.mark.parametrize("make", [ListStorage, LazyStackStorage], ids=["list", "lazy-stack"])
@pytest.mark.parametrize("first", [0, 5])
def test_list_storages_extend_past_capacity_keeps_the_newest(make, first):
    """One extend of more items than the storage holds keeps the last ``max_size`` of them
    at the ring positions a TensorStorage would use (it failed on an empty storage: the
    wrapped write started past the filled prefix)."""
    data = [TensorDict({"x": torch.tensor(i)}, []) for i in range(first + 20)]
    ref = ReplayBuffer(storage=LazyTensorStorage(16), batch_size=4)
    rb = ReplayBuffer(storage=make(16), batch_size=4)
    for buffer in (ref, rb):
        if first:
            buffer.extend(torch.stack(data[:first]) if buffer is ref else data[:first])
        buffer.extend(torch.stack(data[first:]) if buffer is ref else data[first:])
    assert len(rb) == len(ref) == 16
    assert [int(rb.storage.get(i)["x"]) for i in range(16)] == ref.storage.get(torch.arange(16))["x"].tolist()
