"""Short replay-buffer scripts written the way TorchRL users write them, with only steersman
imports: dict pytrees into a buffer, an offline dataset that seeds an online buffer, Atari-like
frames in a compressed buffer, variable-length items in a lazy-stack buffer, a seeded sampler."""

from __future__ import annotations

import torch

from steersman.data import (
    Bounded,
    Choice,
    CompressedListStorage,
    ImmutableDatasetWriter,
    LazyStackStorage,
    LazyTensorStorage,
    ReplayBuffer,
    SamplerWithoutReplacement,
    TensorDictReplayBuffer,
    TensorStorage,
    create_infinite_iterator,
    prefill_replay_buffer,
)
from steersman.tensordict import TensorDict


def test_dict_pytrees_into_a_buffer():
    rb = ReplayBuffer(storage=LazyTensorStorage(100), batch_size=4)
    rb.extend({"obs": torch.randn(10, 3), "reward": torch.arange(10.0)})
    batch = rb.sample()
    assert set(batch) == {"obs", "reward"} and batch["obs"].shape == (4, 3)


def test_offline_dataset_seeds_an_online_buffer():
    data = TensorDict({"obs": torch.arange(50.0).unsqueeze(-1), "action": torch.zeros(50, 1)}, [50])
    dataset = TensorDictReplayBuffer(storage=TensorStorage(data), writer=ImmutableDatasetWriter(),
                                     sampler=SamplerWithoutReplacement(), batch_size=10)
    online = TensorDictReplayBuffer(storage=LazyTensorStorage(1_000), batch_size=32)
    prefill_replay_buffer(online, dataset, n_samples=30)
    assert len(online) == 30 and online[:]["obs"].squeeze(-1).tolist() == list(map(float, range(30)))
    epochs = create_infinite_iterator(dataset)
    seen = torch.cat([next(epochs)["obs"] for _ in range(10)])  # two epochs of five batches
    assert torch.equal(seen.sort(0).values.squeeze(-1), torch.arange(50.0).repeat_interleave(2))


def test_compressed_frames_buffer():
    frames = torch.randint(0, 4, (16, 1, 84, 84), dtype=torch.uint8)
    rb = ReplayBuffer(storage=CompressedListStorage(1000, compression_level=6), batch_size=8)
    rb.extend(TensorDict({"pixels": frames, "action": torch.arange(16)}, [16]))
    sample = rb.sample()
    assert torch.equal(sample["pixels"], frames[sample["action"]])


def test_variable_length_items_and_a_seeded_sampler():
    rb = ReplayBuffer(storage=LazyStackStorage(100), batch_size=3, generator=torch.Generator().manual_seed(0))
    for n in (4, 6, 9):
        rb.add(TensorDict(tokens=torch.arange(n), length=torch.tensor(n)))
    batch = rb.sample()
    for i in range(3):
        assert batch[i]["tokens"].shape == (int(batch[i]["length"]),)
    goal = Choice([Bounded(-1.0, 0.0, shape=(2,)), Bounded(5.0, 6.0, shape=(2,))])
    assert goal.is_in(goal.rand())
