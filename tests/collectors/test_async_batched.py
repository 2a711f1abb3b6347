"""``AsyncBatchedCollector``: transitions chain per env, no barrier across envs, the
server's batching bounds, weight versions, trajectories, replay buffers and bad input."""

from __future__ import annotations

import time

import pytest
import torch

from steersman.collectors import AsyncBatchedCollector
from steersman.data import LazyTensorStorage, ReplayBuffer
from steersman.envs import CartPoleEnv
from steersman.tensordict.nn import TensorDictModule


def _policy(seen: list | None = None) -> TensorDictModule:
    def act(obs: torch.Tensor) -> torch.Tensor:
        if seen is not None:
            seen.append(obs.shape[0])
        return (obs[..., 2] > 0).long()

    return TensorDictModule(act, ["observation"], ["action"])


class _SlowCartPole(CartPoleEnv):
    def step_and_maybe_reset(self, tensordict):
        time.sleep(0.03)
        return super().step_and_maybe_reset(tensordict)


def test_transitions_chain_per_env_and_versions():
    seen: list = []
    col = AsyncBatchedCollector([CartPoleEnv] * 4, policy=_policy(seen), frames_per_batch=40, total_frames=80,
                                max_batch_size=2)
    it = iter(col)
    first = next(it)
    assert first.batch_size == (40,) and bool((first["policy_version"] == 0).all())
    assert max(seen) <= 2  # never more envs in one forward pass than max_batch_size
    col.update_policy_weights_()  # a policy without weights: nothing to push, version unchanged
    second = next(it)
    with pytest.raises(StopIteration):
        next(it)
    batch = torch.cat([first, second], 0)
    for i in range(4):
        rows = batch[batch["env_index"] == i]
        nxt, obs, done = rows["next", "observation"], rows["observation"], rows["next", "done"].squeeze(-1)
        # the next observation is the following input unless the episode ended (reset)
        cont = ~done[:-1]
        assert torch.equal(nxt[:-1][cont], obs[1:][cont])
    # each action is the policy's on its own input
    assert torch.equal(batch["action"], (batch["observation"][..., 2] > 0).long())
    col.shutdown()


def test_slow_env_does_not_hold_the_others():
    makers = [_SlowCartPole] + [CartPoleEnv] * 3
    col = AsyncBatchedCollector(makers, policy=_policy(), frames_per_batch=60, total_frames=60)
    batch = next(iter(col))
    counts = torch.bincount(batch["env_index"], minlength=4).tolist()
    assert counts[0] < min(counts[1:]), counts  # no barrier: fast envs keep stepping
    col.shutdown()


def test_weights_version_replay_buffer_and_hooks():
    net = torch.nn.Linear(4, 2)
    hooked: list = []
    rb = ReplayBuffer(storage=LazyTensorStorage(100))
    col = AsyncBatchedCollector([CartPoleEnv] * 2, policy=_Net(net), frames_per_batch=10, total_frames=20,
                                replay_buffer=rb, post_collect_hook=lambda b: hooked.append(b.numel()),
                                postproc=lambda b: b.set("tag", torch.ones(b.batch_size)), policy_version=5)
    it = iter(col)
    assert next(it) is None and len(rb) == 10 and hooked == [10]
    new = torch.nn.Linear(4, 2)
    col.update_policy_weights_(_Net(new))
    assert torch.equal(net.weight, new.weight) and col.policy_version == 6
    assert next(it) is None and len(rb) == 20
    versions = rb[:]["policy_version"].unique().tolist()
    assert set(versions) <= {5, 6} and 5 in versions and bool((rb[:]["tag"] == 1).all())
    state = col.state_dict()
    assert state["frames"] == 20 and state["policy_version"] == 6
    col.shutdown()


class _Net(torch.nn.Module):
    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, td):
        td.set("action", self.net(td.get("observation")).argmax(-1))
        return td


def test_yield_completed_trajectories():
    col = AsyncBatchedCollector([CartPoleEnv] * 3, policy_factory=lambda: _policy(), frames_per_batch=5,
                                total_frames=60, yield_completed_trajectories=True, min_batch_size=2)
    for traj in col:
        assert traj["env_index"].unique().numel() == 1
        assert bool(traj["next", "done"][-1].all()) and not bool(traj["next", "done"][:-1].any())
    col.shutdown()


def test_bad_arguments():
    envs = [CartPoleEnv] * 2
    with pytest.raises(ValueError, match="exactly one of policy and policy_factory"):
        AsyncBatchedCollector(envs, frames_per_batch=4)
    with pytest.raises(TypeError, match="list of env factories"):
        AsyncBatchedCollector(CartPoleEnv, policy=_policy(), frames_per_batch=4)
    with pytest.raises(ValueError, match="'ray' is not available"):
        AsyncBatchedCollector(envs, policy=_policy(), frames_per_batch=4, backend="ray")
    with pytest.raises(ValueError, match="transport objects are not supported"):
        AsyncBatchedCollector(envs, policy=_policy(), frames_per_batch=4, transport=object())
    with pytest.raises(ValueError, match="server_config is not supported"):
        AsyncBatchedCollector(envs, policy=_policy(), frames_per_batch=4, server_config={})
