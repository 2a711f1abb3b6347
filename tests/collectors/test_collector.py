"""``Collector`` (in-process) over the env battery: shapes, exact frame counts, trajectory
ids, policy weights, resumption from ``state_dict``, and every option; bad input."""

from __future__ import annotations

import io
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from steersman.collectors import Collector, SyncDataCollector
from steersman.collectors.collector import assign_traj_ids
from steersman.data import LazyTensorStorage, ReplayBuffer
from steersman.envs import CartPoleEnv, PendulumEnv, StepCounter, TransformedEnv
from steersman.tensordict.nn import TensorDictModule
from tests.collectors._helpers import (
    ENV_FNS,
    check_traj_ids,
    constant_weights,
    make_policy,
    make_scoring_policy,
    td_equal,
)

KINDS = list(ENV_FNS)
FPB = {"native": 40, "gym": 20, "serial": 20, "parallel": 20}  # 10 steps per sub-env


@pytest.fixture(scope="module", params=KINDS)
def kind_env(request):
    """One env per kind for the module (a ParallelEnv costs process starts)."""
    env = ENV_FNS[request.param]()
    yield request.param, env
    env.close()


def _collector(env, kind, **kw):
    env.set_seed(0)
    kw.setdefault("frames_per_batch", FPB[kind])
    return Collector(env, kw.pop("policy", make_policy()), **kw)


# ---------------------------------------------------------------------- battery
def test_frames_shapes_and_traj_ids(kind_env):
    kind, env = kind_env
    fpb = FPB[kind]
    c = _collector(env, kind, total_frames=5 * fpb)
    T = fpb // env.batch_size.numel()
    batches = list(c)
    assert len(batches) == len(c) == 5
    assert sum(b.numel() for b in batches) == 5 * fpb == c._frames
    prev = None
    for b in batches:
        assert b.batch_size == (*env.batch_size, T)
        assert b["next", "reward"].shape == (*env.batch_size, T, 1)
        assert b["collector", "traj_ids"].dtype == torch.int64
        prev = check_traj_ids(b, prev)
    assert any(b["next", "done"].any() for b in batches)  # the ids were exercised
    # the yielded batches are independent copies
    assert batches[0]["observation"].data_ptr() != batches[1]["observation"].data_ptr()


def test_policy_weight_updates_reach_the_policy(kind_env):
    kind, env = kind_env
    policy = make_policy()
    c = _collector(env, kind, policy=policy)
    it = iter(c)
    for action in (1, 0):
        c.update_policy_weights_(constant_weights(action))
        assert (next(it)["action"] == action).all()
    c.update_policy_weights_(weights=make_policy(3))  # a module: its weights
    assert torch.equal(policy.module.lin.weight, make_policy(3).module.lin.weight)


def test_resume_from_state_dict_continues_the_stream(kind_env):
    kind, env = kind_env
    c = _collector(env, kind, max_frames_per_traj=7)
    it = iter(c)
    next(it)
    next(it)
    sd = c.state_dict()
    buf = io.BytesIO()
    torch.save(sd, buf)  # plain data: a weights-only load reads it
    buf.seek(0)
    sd = torch.load(buf, weights_only=True)
    ref = [next(it), next(it)]
    # a fresh collector, another env of the same kind, another seed and other weights
    env2 = ENV_FNS[kind]()
    try:
        env2.set_seed(123)
        c2 = Collector(env2, make_policy(7), frames_per_batch=FPB[kind], max_frames_per_traj=7)
        if kind == "parallel":  # ParallelEnv has no state to save: counters resume, not the stream
            with pytest.warns(UserWarning, match="was not saved"):
                c2.load_state_dict(sd)
            got = next(iter(c2))
            assert c2._frames == 3 * FPB[kind]
            assert got["collector", "traj_ids"].min() >= sd["traj_counter"]  # new trajectories
            return
        c2.load_state_dict(sd)
        it2 = iter(c2)
        for r in ref:
            assert td_equal(next(it2), r)
        assert c2._frames == c._frames and c2._iter == c._iter
    finally:
        env2.close()


# ---------------------------------------------------------------------- options
def test_random_policy_and_init_random_frames():
    env = CartPoleEnv(batch_size=[4], seed=0)
    c = Collector(env, None, frames_per_batch=40, total_frames=80)
    assert all(set(b["action"].unique().tolist()) <= {0, 1} for b in c)
    policy = make_scoring_policy()
    policy.load_state_dict(constant_weights(1))
    c = Collector(env, policy, frames_per_batch=400, total_frames=1200, init_random_frames=800)
    batches = list(c)
    assert all((b["action"] == 0).any() and "score" not in b.keys() for b in batches[:2])  # random
    assert (batches[2]["action"] == 1).all() and batches[2]["score"].shape == (4, 100)  # the policy


def test_max_frames_per_traj_truncates_and_resets():
    env = CartPoleEnv(batch_size=[3], seed=0, max_episode_steps=None)
    policy = TensorDictModule(lambda obs: (obs[..., 2] > 0).long(), ["observation"], ["action"])
    c = Collector(env, policy, frames_per_batch=3 * 25, total_frames=3 * 25 * 2, max_frames_per_traj=5)
    prev = None
    for b in c:
        prev = check_traj_ids(b, prev)
        ids = b["collector", "traj_ids"]
        trunc = b["next", "truncated"].squeeze(-1)
        assert (b["next", "done"].squeeze(-1) >= trunc).all()
        for i in ids.unique():
            assert (ids == i).sum() <= 5  # no trajectory longer than 5 steps
        assert trunc.any()
    # the balancing policy keeps CartPole up: every trajectory ends by truncation at 5 steps
    assert not b["next", "terminated"].any()


def test_reset_at_each_iter_starts_new_trajectories():
    env = CartPoleEnv(batch_size=[2], seed=0)
    c = Collector(env, make_policy(), frames_per_batch=10, total_frames=30, reset_at_each_iter=True)
    ids = [b["collector", "traj_ids"] for b in c]
    for a, b in zip(ids, ids[1:]):
        assert b.min() > a.max()


def test_split_trajs_postproc_and_replay_buffer():
    env = CartPoleEnv(batch_size=[2], seed=0)
    seen = []
    c = Collector(env, make_policy(), frames_per_batch=200, total_frames=400, split_trajs=True,
                  postproc=lambda td: seen.append(td.batch_size) or td)
    for b in c:
        assert b["collector", "mask"].sum() == 200
        assert b.batch_size[0] >= 2
    assert len(seen) == 2
    rb = ReplayBuffer(storage=LazyTensorStorage(1000, ndim=2))
    c = Collector(env, make_policy(), frames_per_batch=20, total_frames=60, replay_buffer=rb)
    assert list(c) == [None, None, None]
    assert len(rb) == 60 and c._frames == 60


def test_set_truncated_marks_the_last_step():
    env = CartPoleEnv(batch_size=[3], seed=0)
    for b in Collector(env, make_policy(), frames_per_batch=30, total_frames=60, set_truncated=True):
        assert b["next", "truncated"][:, -1].all() and b["next", "done"][:, -1].all()
        assert not b["next", "truncated"][:, :-1].any()  # only the last step


def test_return_same_td_and_rollout():
    env = CartPoleEnv(batch_size=[2], seed=0)
    c = Collector(env, make_policy(), frames_per_batch=20, total_frames=40, return_same_td=True)
    a, b = list(c)
    assert a["observation"].data_ptr() == b["observation"].data_ptr()
    assert c.rollout().batch_size == (2, 10) and c._frames == 40


def test_transformed_env_and_env_factory_with_kwargs():
    c = SyncDataCollector(lambda seed: TransformedEnv(CartPoleEnv(batch_size=[2], seed=seed), StepCounter()),
                          make_policy(), frames_per_batch=20, create_env_kwargs={"seed": 1})
    it = iter(c)
    b = next(it)
    assert ("next", "step_count") in b.keys(include_nested=True)
    sd = c.state_dict()
    ref = next(it)
    c.load_state_dict(sd)
    assert td_equal(next(it), ref)
    c.shutdown()
    c.shutdown()
    assert c.env.is_closed
    with pytest.raises(RuntimeError, match="shut down"):
        c.rollout()


def test_exploration_type_and_no_grad_around_the_policy():
    from steersman.tensordict.nn import ExplorationType, interaction_type

    seen = []

    def policy(td):
        seen.append((interaction_type(), torch.is_grad_enabled()))
        td["action"] = torch.zeros(2, dtype=torch.int64)
        return td

    env = CartPoleEnv(batch_size=[2], seed=0)
    c = Collector(env, policy, frames_per_batch=4, total_frames=4,
                  exploration_type=ExplorationType.DETERMINISTIC)
    list(c)
    assert seen == [(ExplorationType.DETERMINISTIC, False)] * 2
    assert interaction_type() is None


def test_continuous_actions_and_infinite_collector():
    env = PendulumEnv(batch_size=[3], seed=0)
    c = Collector(env, None, frames_per_batch=30)
    assert c.total_frames == math.inf
    with pytest.raises(RuntimeError, match="no length"):
        len(c)
    it = iter(c)
    for _ in range(3):
        assert next(it)["action"].shape == (3, 10, 1)


# ---------------------------------------------------------------------- trajectory ids
@settings(max_examples=50, deadline=None)
@given(st.integers(1, 6), st.integers(1, 5), st.integers(0, 10), st.integers(1, 3), st.integers(0, 2),
       st.randoms(use_true_random=False))
def test_assign_traj_ids_matches_a_python_reference(T, N, counter, stride, offset, rnd):
    offset = offset % stride
    done = torch.tensor([[rnd.random() < 0.3 for _ in range(N)] for _ in range(T)])
    first = torch.tensor([(counter - N + n) * stride + offset for n in range(N)]) if counter >= N else \
        torch.tensor([n * stride + offset for n in range(N)])
    counter = max(counter, N)
    ids, nxt, c2 = assign_traj_ids(done, first, counter, stride, offset)
    cur, c = first.tolist(), counter
    for t in range(T):
        assert ids[t].tolist() == cur
        for n in range(N):  # new ids in time-major order
            if done[t, n]:
                cur[n] = c * stride + offset
                c += 1
    assert nxt.tolist() == cur and c2 == c


# ---------------------------------------------------------------------- bad input
def test_bad_input_is_reported_clearly():
    env = CartPoleEnv(batch_size=[4])
    with pytest.raises(ValueError, match=r"frames_per_batch=10 is not a multiple of the number of sub-envs 4"):
        Collector(env, None, frames_per_batch=10)
    with pytest.raises(ValueError, match="frames_per_batch must be a positive int"):
        Collector(env, None, frames_per_batch=0)
    with pytest.raises(TypeError, match="policy must be callable"):
        Collector(env, "policy", frames_per_batch=4)
    with pytest.raises(TypeError, match="not a steersman EnvBase"):
        Collector(lambda: object(), None, frames_per_batch=4)
    with pytest.warns(UserWarning, match="12 frames will be collected"):
        assert Collector(env, None, frames_per_batch=4, total_frames=10).total_frames == 12
    wrong = TensorDictModule(lambda obs: obs[..., :1], ["observation"], ["action"])  # [4, 1] float
    c = Collector(env, wrong, frames_per_batch=4)
    with pytest.raises(ValueError, match=r"the policy's action 'action' has shape \[4, 1\].*expects \[4\]"):
        c.rollout()
    silent = TensorDictModule(lambda obs: obs, ["observation"], ["other"])
    with pytest.raises(KeyError, match="wrote no action entry 'action'"):
        Collector(env, silent, frames_per_batch=4).rollout()
    c = Collector(env, make_policy(), frames_per_batch=4)
    with pytest.raises(KeyError, match="no weight 'module.nope'"):
        c.update_policy_weights_({"module.nope": torch.zeros(1)})
    with pytest.raises(ValueError, match=r"'module.lin.bias' has shape \[3\]"):
        c.update_policy_weights_({"module.lin.bias": torch.zeros(3)})
    with pytest.raises(KeyError, match="missing entries"):
        c.load_state_dict({"frames": 0})


class _Exploit:
    """Unpickling this would call os.system (what a tampered checkpoint could carry)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_loading_a_tampered_gym_env_state_executes_no_code(tmp_path):
    import pickle

    pytest.importorskip("gymnasium")
    from steersman.collectors._env_state import env_state, load_env_state
    from steersman.envs import GymEnv

    env = GymEnv("CartPole-v1")
    env.set_seed(0)
    env.reset()
    state = env_state(env)
    assert state is not None and state["kind"] == "gym"
    before = env.env.unwrapped.state.copy()
    marker = tmp_path / "pwned"
    tampered = {"kind": "gym", "blob": pickle.dumps({"layers": {"x": _Exploit(marker)}, "wrapper": {}})}
    with pytest.raises(pickle.UnpicklingError, match="posix.system|nt.system|refusing to load"):
        load_env_state(env, tampered)
    assert not marker.exists()
    assert (env.env.unwrapped.state == before).all()  # nothing changed
    load_env_state(env, state)  # the genuine state still loads


def _navigation(n_agents: int = 3):
    from steersman.envs import NavigationEnv

    return NavigationEnv(batch_size=[2], n_agents=n_agents, seed=0)


@pytest.mark.parametrize("n_agents", [1, 3])
def test_groups_keep_their_own_batch_dims(n_agents):
    """A multi-agent group (``"agents"``, ``[B, n_agents]`` in the env) comes out
    ``[B, T, n_agents]``, at the root and under ``"next"``, as in ``env.rollout``."""
    from steersman.collectors import split_trajectories

    env = _navigation(n_agents)
    ref = env.rollout(4)
    c = Collector(env, None, frames_per_batch=8, total_frames=16)
    for batch in c:
        assert batch.batch_size == (2, 4)
        for group in (("agents",), ("next", "agents")):
            assert batch.get(group).batch_size == (2, 4, n_agents) == ref.get(group).batch_size
            for key, val in batch.get(group).items(True, True):
                assert val.shape == ref.get(group).get(key).shape, key
        assert batch["agents"][1, 2].batch_size == (n_agents,)
        assert split_trajectories(batch)["agents"].batch_size[-1] == n_agents


def test_resume_keeps_a_groups_batch_dims():
    """A multi-agent group's carried data comes back ``[B, n_agents]`` after a weights-only
    round trip (it came back ``[B]`` before, which shifted the exploration RNG stream of a
    resumed QMIX run: one coin per env instead of one per agent)."""
    from steersman.envs import NavigationEnv

    def make():
        env = NavigationEnv(num_envs=4, n_agents=3, max_steps=5, seed=0)
        return Collector(env, None, frames_per_batch=8)

    c = make()
    next(iter(c))
    buf = io.BytesIO()
    torch.save(c.state_dict(), buf)
    buf.seek(0)
    c2 = make()
    c2.load_state_dict(torch.load(buf, weights_only=True))
    assert c._carried["agents"].batch_size == (4, 3)
    assert c2._carried["agents"].batch_size == (4, 3)
    assert td_equal(c2._carried, c._carried)
