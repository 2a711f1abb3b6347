"""TorchRL's keywords of the slice samplers, each with its documented effect: ``end_keys``,
``init_key``, ``pad_output``, ``fragmented``/``step_key`` and ``span``."""

from __future__ import annotations

import pytest
import torch

from steersman import TensorDict
from steersman.data.replay_buffers import (
    LazyTensorStorage,
    PrioritizedSliceSampler,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    TensorDictReplayBuffer,
)

LENGTHS = [5, 1, 3, 7, 2]  # episodes, stored one after the other


def episodes(lengths=LENGTHS) -> TensorDict:
    ep = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
    step = torch.cat([torch.arange(n) for n in lengths])
    done = torch.zeros(len(ep), 1, dtype=torch.bool)
    done[torch.tensor(lengths).cumsum(0) - 1] = True
    return TensorDict({"episode": ep, "step_count": step, "pos": torch.arange(len(ep)),
                       "next": {"done": done}}, [len(ep)])


def buffer(sampler, data: TensorDict, batch_size: int) -> TensorDictReplayBuffer:
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(64), sampler=sampler, batch_size=batch_size)
    rb.extend(data)
    return rb


def slices(sample: TensorDict) -> list[TensorDict]:
    """Splits a flat batch at its slice ends (the ``truncated`` flags)."""
    ends = (sample["next", "truncated"].reshape(-1).nonzero().squeeze(1) + 1).tolist()
    return [sample[a:b] for a, b in zip([0, *ends[:-1]], ends)]


def assert_inside_episodes(sample: TensorDict) -> list[int]:
    lengths = []
    for piece in slices(sample):
        assert piece["episode"].unique().numel() == 1
        assert (piece["step_count"].diff() == 1).all()
        lengths.append(piece.shape[0])
    return lengths


def test_end_keys_or_the_flags_together():
    data = episodes([4, 4, 4])
    # the second episode ends with a truncation only: a single end_key merges it with the third
    data["next", "truncated"] = torch.zeros(12, 1, dtype=torch.bool)
    data["next", "truncated"][7] = True
    data["next", "done"][7] = False
    torch.manual_seed(0)
    merged = buffer(SliceSampler(slice_len=2, end_key=("next", "done"), truncated_key=None), data, 64).sample()
    union = SliceSampler(slice_len=2, end_keys=[("next", "done"), ("next", "truncated"), ("next", "terminated")],
                         truncated_key=None)
    split = buffer(union, data, 64).sample()
    crossing = lambda s: bool(((s["pos"].view(-1, 2)[:, 0] == 7)).any())  # noqa: E731
    assert crossing(merged) and not crossing(split)
    with pytest.raises(ValueError, match="exclusive"):
        SliceSampler(slice_len=2, end_key="a", end_keys=["b"])
    with pytest.raises(KeyError, match="none of the end_keys"):
        buffer(SliceSampler(slice_len=2, end_keys=[("next", "nope")]), data, 4).sample()


@pytest.mark.parametrize("cls", [SliceSampler, SliceSamplerWithoutReplacement, PrioritizedSliceSampler])
def test_init_key_flags_each_slice_start(cls):
    kw = {"max_capacity": 64, "alpha": 1.0, "beta": 1.0} if cls is PrioritizedSliceSampler else {}
    data = episodes([6, 6, 6, 6])
    data["is_init"] = torch.zeros(24, 1, dtype=torch.bool)
    data["is_init"][3] = True  # a stored flag inside a slice survives (OR)
    torch.manual_seed(0)
    sample = buffer(cls(slice_len=6, traj_key="episode", **kw), data, 12).sample()
    flags = sample["is_init"].view(2, 6)
    assert flags[:, 0].all()
    assert (flags[:, 1:] == (sample["pos"].view(2, 6)[:, 1:] == 3)).all()
    plain = buffer(cls(slice_len=6, traj_key="episode", init_key=None, **kw), episodes([6, 6]), 12).sample()
    assert "is_init" not in plain.keys()


def test_pad_output_repeats_the_last_step_and_masks_it():
    torch.manual_seed(0)
    sampler = SliceSampler(slice_len=4, traj_key="episode", strict_length=False, pad_output=True)
    sample = buffer(sampler, episodes(), 4 * 20).sample()
    assert sample.shape == (80,)
    mask = sample["collector", "mask"].view(20, 4)
    pos = sample["pos"].view(20, 4)
    for row_mask, row_pos, ep in zip(mask, pos, sample["episode"].view(20, 4)):
        n = int(row_mask.sum())
        assert row_mask[:n].all() and not row_mask[n:].any()
        assert (row_pos[n:] == row_pos[n - 1]).all() and (row_pos[:n].diff() == 1).all()
        assert ep.unique().numel() == 1
    assert not mask.all()  # short episodes were padded
    with pytest.raises(ValueError, match="strict_length=False"):
        SliceSampler(slice_len=4, pad_output=True)


def test_fragmented_rebuilds_interleaved_episodes():
    # two writers: episodes 0 and 1 interleaved step by step, then episode 2 with a gap
    ep = torch.tensor([0, 1] * 6 + [2] * 5)
    step = torch.cat([torch.arange(6).repeat_interleave(2), torch.tensor([0, 1, 2, 4, 5])])
    data = TensorDict({"episode": ep, "step_count": step, "pos": torch.arange(17)}, [17])
    torch.manual_seed(0)
    sample = buffer(SliceSampler(slice_len=3, fragmented=True), data, 3 * 40).sample()
    assert_inside_episodes(sample)
    rows = sample["pos"].view(40, 3)
    assert (rows[:, 1:] - rows[:, :-1] == 2).any()  # non-adjacent storage slots
    # the gap splits episode 2 into [0, 1, 2] and [4, 5]: no 3-step slice of it crosses the gap
    ep2 = rows[sample["episode"].view(40, 3)[:, 0] == 2]
    assert all(data["step_count"][r].tolist() == [0, 1, 2] for r in ep2)
    # without fragmented, the interleaved episodes look like runs of one step
    plain = buffer(SliceSampler(slice_len=3, traj_key="episode", strict_length=False), data, 3 * 40).sample()
    assert all(p.shape[0] == 1 for p in slices(plain) if p["episode"][0] < 2)
    dup = data.clone()
    dup["step_count"][2] = 0  # episode 0 has step 0 twice
    with pytest.raises(ValueError, match="pairs appear twice"):
        buffer(SliceSampler(slice_len=3, fragmented=True), dup, 3).sample()
    with pytest.raises(ValueError, match="neither"):
        SliceSampler(slice_len=3, fragmented=True, span=True)


@pytest.mark.parametrize(("span", "min_len"), [(True, 1), ((0, 2), 2), ((1, 0), 3), (1, 2)])
def test_span_lets_slices_hang_over_the_episode_ends(span, min_len):
    torch.manual_seed(0)
    sampler = SliceSampler(slice_len=4, traj_key="episode", span=span)
    sample = buffer(sampler, episodes(), 4 * 200).sample()
    lengths = assert_inside_episodes(sample)
    assert min(lengths) >= min_len and max(lengths) == 4
    assert min(lengths) < 4  # some slices were cut at an episode boundary
    starts = [p["step_count"][0].item() for p in slices(sample)]
    ends_at_last = [p["step_count"][-1].item() == LENGTHS[p["episode"][0].item()] - 1 for p in slices(sample)]
    left, right = (span, span) if not isinstance(span, tuple) else span
    if left:  # hanging over the start: short slices that begin at step 0 and stop early
        assert any(s == 0 and not e and n < 4 for s, e, n in zip(starts, ends_at_last, lengths))
    if not right:  # never past the end: a slice shorter than 4 starts at step 0
        assert all(s == 0 for s, n in zip(starts, lengths) if n < 4)
    episodes_seen = set(sample["episode"].tolist())
    assert (1 in episodes_seen) is (min_len == 1)  # the 1-step episode only when one step is enough
    with pytest.raises(ValueError, match="span"):
        SliceSampler(slice_len=4, span=(1, 2, 3))
    PrioritizedSliceSampler(8, 1.0, 1.0, slice_len=4, span=False)  # the default is accepted
    with pytest.raises(ValueError, match="span=True is not supported here"):
        PrioritizedSliceSampler(8, 1.0, 1.0, slice_len=4, span=True)


@pytest.mark.parametrize("slices_too", [False, True])
def test_prioritized_samples_carry_torchrl_priority_weight_that_losses_use(slices_too):
    from steersman.data.replay_buffers import PrioritizedSampler
    from steersman.objectives import DQNLoss
    from steersman.tensordict.nn import TensorDictModule

    data = episodes([8, 8])
    n = data.shape[0]
    data["observation"] = torch.randn(n, 3)
    data["action"] = torch.randint(2, (n,))
    data["next"].update({"observation": torch.randn(n, 3), "reward": torch.randn(n, 1),
                         "terminated": data["next", "done"].clone()})
    sampler = (PrioritizedSliceSampler(64, 1.0, 1.0, slice_len=4, traj_key="episode") if slices_too
               else PrioritizedSampler(64, 1.0, 1.0))
    rb = buffer(sampler, data, 8)
    rb.update_priority(torch.arange(n), torch.linspace(0.1, 3.0, n))
    torch.manual_seed(0)
    sample = rb.sample()
    assert torch.equal(sample["priority_weight"], sample["_weight"])
    assert not torch.allclose(sample["priority_weight"], torch.ones(8))
    torch.manual_seed(0)
    net = TensorDictModule(torch.nn.Linear(3, 2), ["observation"], ["action_value"])
    weighted = DQNLoss(net, action_space="categorical", reduction="none")(sample.clone())
    plain = DQNLoss(net, action_space="categorical", reduction="none", use_prioritized_weights=False)(sample.clone())
    torch.testing.assert_close(weighted["loss"], plain["loss"] * sample["priority_weight"])
