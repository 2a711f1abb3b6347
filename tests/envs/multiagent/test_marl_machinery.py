"""The existing machinery on group-batched nested entries of the native multi-agent envs:
step_mdp, rollout, transforms, SerialEnv/ParallelEnv, collectors (single and
multi-process), split_trajectories and replay buffers."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from steersman.collectors import MultiSyncDataCollector, SyncDataCollector, split_trajectories
from steersman.data import LazyTensorStorage, ReplayBuffer
from steersman.envs import (
    NavigationEnv,
    ObservationNorm,
    ParallelEnv,
    PredatorPreyEnv,
    RewardSum,
    SerialEnv,
    StepCounter,
    TransformedEnv,
    VecNorm,
    check_env_specs,
    step_mdp,
)
from steersman.tensordict.nn import TensorDictModule

make_nav = functools.partial(NavigationEnv, 3, n_agents=2, max_steps=4, seed=0)
make_pp = functools.partial(PredatorPreyEnv, 2, n_agents=3, max_steps=5, seed=1, categorical_actions=True)


def _policy(n_obs: int = 8) -> TensorDictModule:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(n_obs, 2), nn.Tanh())
    return TensorDictModule(net, in_keys=[("agents", "observation")], out_keys=[("agents", "action")])


def test_step_mdp_moves_group_entries():
    env = make_nav()
    td = env.rand_step(env.reset())
    out = step_mdp(td, reward_keys=env.reward_keys, done_keys=env.done_keys, action_keys=env.action_keys)
    assert torch.equal(out["agents", "observation"], td["next", "agents", "observation"])
    assert torch.equal(out["state"], td["next", "state"])
    assert torch.equal(out["agents", "done"], td["next", "agents", "done"])
    keys = set(out.keys(include_nested=True, leaves_only=True))
    assert ("agents", "action") not in keys and ("agents", "reward") not in keys and "next" not in keys
    # the env's own step_mdp gives the same
    assert set(env._step_mdp(td).keys(include_nested=True, leaves_only=True)) == keys


def test_rollout_break_and_policy():
    env = make_nav()
    ro = env.rollout(10, policy=_policy())
    assert ro.batch_size[-1] == 4 and ro["next", "done"][:, -1].all()  # stops at the time limit
    assert torch.allclose(ro["agents", "action"], torch.tanh(_policy().module[0](ro["agents", "observation"])))


def test_reward_sum_and_step_counter():
    env = TransformedEnv(make_nav(), RewardSum(in_keys=[("agents", "reward")],
                                               out_keys=[("agents", "episode_reward")]))
    env.append_transform(StepCounter())
    check_env_specs(env)
    ro = env.rollout(9, break_when_any_done=False)
    r = ro["next", "agents", "reward"]
    ep = ro["next", "agents", "episode_reward"]
    assert ep.shape == r.shape
    # resets every 4 steps: the sum restarts with the episode
    assert torch.allclose(ep[:, 3], r[:, :4].sum(1), atol=1e-5)
    assert torch.allclose(ep[:, 4], r[:, 4], atol=1e-6)
    assert ro["next", "step_count"][0, :, 0].tolist() == [1, 2, 3, 4, 1, 2, 3, 4, 1]


def test_observation_norm_and_vecnorm_on_group_key():
    key = ("agents", "observation")
    env = TransformedEnv(make_nav(), ObservationNorm(in_keys=[key]))
    env.transform.init_stats(40, reduce_dim=(0, 1, 2), cat_dim=1)
    assert env.transform.loc.shape == (8,)
    check_env_specs(env)
    obs = env.rollout(40, break_when_any_done=False)[key]
    assert obs.mean((0, 1, 2)).abs().max() < 0.6 and (obs.std((0, 1, 2)) - 1).abs().max() < 0.6
    venv = TransformedEnv(make_nav(), VecNorm(in_keys=[key], decay=0.9))
    check_env_specs(venv)
    ro = venv.rollout(30, break_when_any_done=False)
    raw = make_nav().rollout(30, break_when_any_done=False)
    assert ro[key].shape == raw[key].shape and not torch.allclose(ro[key], raw[key])


@pytest.mark.parametrize("kind", ["serial", "parallel"])
def test_batched_envs_of_marl_envs(kind):
    cls = SerialEnv if kind == "serial" else ParallelEnv
    env = cls(2, make_pp)
    try:
        assert env.full_action_spec["agents", "action"].shape == (2, 2, 3)
        check_env_specs(env)
        ro = env.rollout(7, break_when_any_done=False)
        assert ro["agents", "observation"].shape == (2, 2, 7, 3, 12)
        assert ro["next", "agents", "reward"].shape == (2, 2, 7, 3, 1)
        assert ro["next", "truncated"][:, :, 4].all() and not ro["next", "truncated"][:, :, :4].any()
        # both workers were built with the same seed; the batched env reseeds them apart
        env.set_seed(5)
        s = env.reset()["state"]
        assert not torch.equal(s[0], s[1])
    finally:
        env.close()


def test_sync_collector_and_split_trajectories():
    col = SyncDataCollector(make_nav, _policy(), frames_per_batch=24, total_frames=48)
    batches = list(col)
    col.shutdown()
    assert len(batches) == 2
    b = batches[1]
    assert b.batch_size == (3, 8) and b["agents", "action"].shape == (3, 8, 2, 2)
    ids = b["collector", "traj_ids"]
    # a new trajectory after each done (time limit 4)
    assert torch.equal(ids[:, 1:] != ids[:, :-1], b["next", "done"][:, :-1, 0])
    split = split_trajectories(b)
    assert split["agents", "observation"].shape[1:] == (4, 2, 8)
    mask = split["collector", "mask"]
    # the real steps, row by row, are the batch in row-major order (sub-env, then time)
    assert torch.equal(split["agents", "observation"][mask], b["agents", "observation"].reshape(-1, 2, 8))
    assert torch.equal(split["collector", "traj_ids"][mask], ids.reshape(-1))


def test_multisync_collector_of_marl_env():
    col = MultiSyncDataCollector([make_nav, make_nav], _policy(), frames_per_batch=48, total_frames=96)
    try:
        batches = list(col)
    finally:
        col.shutdown()
    assert len(batches) == 2
    b = batches[0]
    assert b["agents", "observation"].shape[-2:] == (2, 8)
    assert b["next", "agents", "reward"].numel() == 48 * 2
    # the policy ran in the workers on the nested key
    flat_obs = b["agents", "observation"].reshape(-1, 2, 8)
    assert torch.allclose(b["agents", "action"].reshape(-1, 2, 2), torch.tanh(_policy().module[0](flat_obs)),
                          atol=1e-6)


def test_replay_buffer_of_group_batched_data():
    ro = make_pp().rollout(6, break_when_any_done=False).reshape(-1)
    rb = ReplayBuffer(storage=LazyTensorStorage(32))
    rb.extend(ro)
    assert len(rb) == 12
    s = rb.sample(5)
    assert s.batch_size == (5,) and s["agents"].batch_size == (5, 3)
    assert s["agents", "action"].dtype == torch.int64 and s["next", "agents", "reward"].shape == (5, 3, 1)
    # every sampled row is one of the stored transitions
    flat = ro["state"]
    assert all(any(torch.equal(row, f) for f in flat) for row in s["state"])
