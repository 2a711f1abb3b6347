"""HERReplayBuffer: relabelled goals checked against a plain-Python episode reference."""

from __future__ import annotations

import pytest
import torch

from steersman.data.replay_buffers import (
    HERReplayBuffer,
    HindsightStrategy,
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    SamplerWithoutReplacement,
)
from steersman.tensordict import TensorDict

EPISODES = [4, 1, 6, 3, 5]  # the last one is left unfinished (no done flag)


def stream(offset: int = 0) -> TensorDict:
    """Transitions whose achieved goal encodes their global step (next goal = step + 1000)."""
    done, n = [], sum(EPISODES)
    for i, length in enumerate(EPISODES):
        done += [t == length - 1 and i < len(EPISODES) - 1 for t in range(length)]
    step = torch.arange(n, dtype=torch.float32) + offset
    return TensorDict({
        "desired_goal": torch.full((n, 2), -1.0),
        "achieved_goal": step.unsqueeze(-1).expand(n, 2).clone(),
        "next": {"achieved_goal": (step + 1000).unsqueeze(-1).expand(n, 2).clone(),
                 "desired_goal": torch.full((n, 2), -1.0),
                 "reward": torch.full((n, 1), -5.0), "done": torch.tensor(done).unsqueeze(-1)},
    }, [n])


def reference_episodes(done: list[bool], last: int | None) -> list[tuple[int, int]]:
    """(start, stop) of each episode in storage order, by walking the flags one by one."""
    out, start = [], 0
    for i, d in enumerate(done):
        if d or i == len(done) - 1 or i == last:
            out.append((start, i))
            start = i + 1
    return out


def reward_fn(td: TensorDict) -> torch.Tensor:
    return (td["desired_goal"] - td["achieved_goal"]).abs().sum(-1)


@pytest.mark.parametrize("strategy", ["future", "final", "episode", "random"])
@pytest.mark.parametrize("storage", ["lazy", "memmap"])
def test_relabelling_matches_reference(tmp_path, strategy, storage):
    st = LazyTensorStorage(64) if storage == "lazy" else LazyMemmapStorage(64, scratch_dir=tmp_path)
    rb = HERReplayBuffer(reward_fn, her_ratio=1.0, strategy=strategy, storage=st, batch_size=200)
    data = stream()
    rb.extend(data)
    n = data.shape[0]
    episodes = reference_episodes(data["next", "done"].squeeze(-1).tolist(), None)
    torch.manual_seed(0)
    batch = rb.sample()
    chosen = set()
    for i, idx in enumerate(batch["index"].tolist()):
        goal = batch["desired_goal"][i]
        j = int(goal[0].item()) - 1000  # the step whose next achieved goal was taken
        assert goal[0] == goal[1] and 0 <= j < n
        assert torch.equal(batch["next", "desired_goal"][i], goal)
        assert batch["next", "reward"][i, 0] == (goal - batch["achieved_goal"][i]).abs().sum()
        assert batch["achieved_goal"][i, 0] == idx  # the rest of the transition is untouched
        start, stop = next(e for e in episodes if e[0] <= idx <= e[1])
        if strategy == "final":
            assert j == stop
        elif strategy == "future":
            assert idx <= j <= stop
        elif strategy == "episode":
            assert start <= j <= stop
        chosen.add((idx, j))
    if strategy in ("future", "episode"):  # a uniform choice, not always the same step
        assert len({j for idx, j in chosen if idx == 2}) > 1
    if strategy == "random":
        assert len({j for _, j in chosen}) > len(episodes)
    assert (rb[:]["desired_goal"] == -1).all()  # stored data is never changed


@pytest.mark.parametrize("ratio", [0.0, 0.25, 1.0])
def test_her_ratio_is_the_fraction_relabelled(ratio):
    rb = HERReplayBuffer(reward_fn, her_ratio=ratio, storage=LazyTensorStorage(64))
    rb.extend(stream())
    batch = rb.sample(40)
    relabelled = (batch["desired_goal"][:, 0] != -1).sum().item()
    assert relabelled == round(ratio * 40)
    assert ((batch["next", "reward"][:, 0] == -5) == (batch["desired_goal"][:, 0] == -1)).all()


def test_wrapped_storage_never_takes_goals_across_the_write_point():
    rb = HERReplayBuffer(reward_fn, her_ratio=1.0, strategy="final", storage=LazyTensorStorage(12),
                         sampler=SamplerWithoutReplacement())
    rb.extend(stream())  # 19 steps into 12 slots: slots 0..6 hold steps 12..18
    storage_done = rb[:]["next", "done"].squeeze(-1).tolist()
    last = rb.storage._last_cursor
    episodes = reference_episodes(storage_done, last)
    batch = rb.sample(12)
    step_at = rb[:]["achieved_goal"][:, 0].long().tolist()
    for i, idx in enumerate(batch["index"].tolist()):
        stop = next(e for e in episodes if e[0] <= idx <= e[1])[1]
        assert batch["desired_goal"][i, 0].item() - 1000 == step_at[stop]
    assert any(stop == last for _, stop in episodes)


def test_strategy_enum_and_bad_input():
    assert HindsightStrategy("future") is HindsightStrategy.FUTURE
    with pytest.raises(ValueError, match="strategy must be one of"):
        HERReplayBuffer(reward_fn, strategy="nearest", storage=LazyTensorStorage(4))
    with pytest.raises(ValueError, match="her_ratio"):
        HERReplayBuffer(reward_fn, her_ratio=1.5, storage=LazyTensorStorage(4))
    with pytest.raises(TypeError, match="one-dimensional tensor storage"):
        HERReplayBuffer(reward_fn, storage=ListStorage(4))
    rb = HERReplayBuffer(reward_fn, storage=LazyTensorStorage(8), end_key=("next", "finished"))
    rb.extend(stream()[:8])
    with pytest.raises(KeyError, match="finished"):
        rb.sample(4)
    bad = HERReplayBuffer(lambda td: torch.zeros(3), her_ratio=1.0, storage=LazyTensorStorage(8))
    bad.extend(stream()[:8])
    with pytest.raises(ValueError, match="reward_fn returned 3 values"):
        bad.sample(4)
