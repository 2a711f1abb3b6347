"""Short replay-buffer scripts written the way TorchRL users write them, with only steersman
imports: dict pytrees into a buffer, an offline dataset that seeds an online buffer, Atari-like
frames in a compressed buffer, variable-length items in a lazy-stack buffer, a seeded sampler."""

from __future__ import annotations

import pytest
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


def test_her_ensemble_and_checkpointed_storage_script(tmp_path):
    # the way TorchRL's docs write them, imports changed only
    from steersman.data import (
        FlatStorageCheckpointer,
        HERReplayBuffer,
        LazyMemmapStorage,
        ReplayBufferEnsemble,
        filter_trajectories,
        traj,
    )

    def reward_fn(td):
        dist = (td["achieved_goal"] - td["desired_goal"]).norm(dim=-1, keepdim=True)
        return (dist < 0.05).float()

    rb = HERReplayBuffer(reward_fn=reward_fn, storage=LazyMemmapStorage(10_000, scratch_dir=tmp_path / "her"),
                         batch_size=256)
    for i in range(4):
        td = TensorDict({"observation": torch.randn(4), "desired_goal": torch.zeros(3),
                         "achieved_goal": torch.randn(3), "action": torch.randn(2),
                         "next": {"observation": torch.randn(4), "desired_goal": torch.zeros(3),
                                  "achieved_goal": torch.randn(3), "reward": torch.zeros(1),
                                  "done": torch.tensor([i == 3])}}, batch_size=[])
        rb.add(td)
    batch = rb.sample(4)
    assert batch["desired_goal"].shape == (4, 3) and batch["next", "reward"].shape == (4, 1)

    rb0 = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
    rb1 = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
    ens = ReplayBufferEnsemble(rb0, rb1, p=[0.5, 0.5], num_buffer_sampled=2)
    ens[0].extend(TensorDict({"a": torch.arange(10.0)}, [10]))
    ens[1].extend(TensorDict({"a": torch.arange(10.0) + 100}, [10]))
    sample = ens.sample(10)
    assert sample.shape == (2, 5) and sample["index", "buffer_ids"].shape == (2, 5)

    storage = LazyTensorStorage(100)
    storage.checkpointer = FlatStorageCheckpointer()
    flat_rb = ReplayBuffer(storage=storage)
    obs = torch.arange(20.0).unsqueeze(-1)
    flat_rb.extend(TensorDict({"obs": obs, "next": {"obs": obs + 1, "reward": torch.ones(20, 1),
                                                    "done": (obs % 5 == 4)}}, [20]))
    flat_rb.dumps(tmp_path / "flat")
    restored = ReplayBuffer(storage=LazyTensorStorage(100))
    restored.storage.checkpointer = FlatStorageCheckpointer()
    restored.loads(tmp_path / "flat")
    assert (restored[:] == flat_rb[:]).all()
    with pytest.warns(UserWarning, match="trajectory ids"):  # split at done flags: TorchRL warns too
        good = filter_trajectories(restored[:], traj.reward.sum() >= 5)
    assert [t.length for t in good] == [5, 5, 5, 5]
