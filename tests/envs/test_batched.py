"""SerialEnv / ParallelEnv / EnvCreator: specs, equality step for step, partial resets,
seeding, nested batches, bad input. Reliability (failures, leaks, parent death) is in
``test_batched_reliability.py``."""

from __future__ import annotations

import functools
import pickle

import pytest
import torch

from steersman.envs import CartPoleEnv, EnvClosedError, check_env_specs
from steersman.envs.batched import EnvCreator, EnvMetaData, ParallelEnv, SerialEnv
from steersman.envs.utils import next_seed
from steersman.tensordict import TensorDict
from tests.envs._batched_helpers import (
    NullEnv,
    ToyEnv,
    Unpicklable,
    make_not_an_env,
    make_toy,
)

toy2 = functools.partial(ToyEnv, batch_size=[2])
cartpole3 = functools.partial(CartPoleEnv, batch_size=[3])

# (factory, sub batch) pairs used across the module
FACTORIES = {
    "toy": (ToyEnv, ()),
    "toy_batched": (toy2, (2,)),
    "cartpole": (CartPoleEnv, ()),
    "cartpole_batched": (cartpole3, (3,)),
}


def _rollout(env, seed, steps=40, **kwargs):
    env.set_seed(seed)
    torch.manual_seed(seed)
    return env.rollout(steps, **kwargs)


def assert_td_equal(a, b):
    assert a.batch_size == b.batch_size
    ka = set(a.keys(include_nested=True, leaves_only=True))
    kb = set(b.keys(include_nested=True, leaves_only=True))
    assert ka == kb
    for k in ka:
        assert torch.equal(a.get(k), b.get(k)), k


@pytest.fixture(scope="module")
def parallel_toy():
    env = ParallelEnv(3, toy2)
    yield env
    env.close()


# ---------------------------------------------------------------------- specs and shapes
@pytest.mark.parametrize("cls", [SerialEnv, ParallelEnv])
@pytest.mark.parametrize("name", ["toy", "cartpole_batched"])
def test_specs_batch_size_and_check_env_specs(cls, name):
    fn, sub = FACTORIES[name]
    with cls(2, fn) as env:
        ref = fn()
        assert env.batch_size == torch.Size([2, *sub])
        assert env.num_workers == 2 and env.sub_batch_size == torch.Size(sub)
        assert env.full_observation_spec == ref.full_observation_spec.expand(2, *sub).to(env.device)
        assert env.full_action_spec == ref.full_action_spec.expand(2, *sub).to(env.device)
        assert env.full_done_spec == ref.full_done_spec.expand(2, *sub).to(env.device)
        assert env.full_reward_spec == ref.full_reward_spec.expand(2, *sub).to(env.device)
        check_env_specs(env, seed=0)
        td = env.reset()
        assert td.batch_size == env.batch_size
        assert not td["done"].any()
        ref.close()


def test_serial_matches_independent_envs():
    """SerialEnv == its sub-envs stepped by hand with the chained seeds."""
    env = SerialEnv(3, toy2)
    out = _rollout(env, 11, steps=30, break_when_any_done=False)
    subs = [ToyEnv(batch_size=[2]) for _ in range(3)]
    s = 11
    for e in subs:
        s = e.set_seed(s)
    torch.manual_seed(11)
    tds = [e.reset() for e in subs]
    for t in range(30):
        action = env.action_spec.rand()  # the same draws as the rollout's rand_action
        for i, e in enumerate(subs):
            tds[i]["action"] = action[i]
            cur, tds[i] = e.step_and_maybe_reset(tds[i])
            assert_td_equal(out[i][:, t], cur)
    assert out["next", "done"].any()  # partial resets did happen
    env.close()


# ---------------------------------------------------------------------- parallel == serial
@pytest.mark.parametrize("name", list(FACTORIES))
def test_parallel_equals_serial(name):
    fn, _ = FACTORIES[name]
    serial = SerialEnv(2, fn)
    par = ParallelEnv(2, fn)
    try:
        for kwargs in ({"break_when_any_done": False}, {}):
            a = _rollout(serial, 3, **kwargs)
            b = _rollout(par, 3, **kwargs)
            assert_td_equal(a, b)
        # and twice on the same instance: reseeding reproduces
        assert_td_equal(_rollout(par, 3, break_when_any_done=False), a_first := _rollout(
            serial, 3, break_when_any_done=False))
        assert a_first.batch_size[-1] == 40
    finally:
        serial.close()
        par.close()


def test_parallel_without_shared_memory_equals_serial():
    serial = SerialEnv(2, toy2)
    par = ParallelEnv(2, toy2, shared_memory=False)
    try:
        assert_td_equal(_rollout(serial, 4, break_when_any_done=False),
                        _rollout(par, 4, break_when_any_done=False))
        td = serial.reset()
        td["_reset"] = torch.tensor([[True, False], [False, False]])
        td2 = par.reset()
        td2["_reset"] = td["_reset"].clone()
        assert_td_equal(serial.reset(td), par.reset(td2))
    finally:
        serial.close()
        par.close()


def test_two_parallel_envs_same_seed_identical(parallel_toy):
    other = ParallelEnv(3, toy2)
    try:
        a = _rollout(parallel_toy, 21, break_when_any_done=False)
        b = _rollout(other, 21, break_when_any_done=False)
        assert_td_equal(a, b)
        c = _rollout(other, 22, break_when_any_done=False)
        assert not torch.equal(a["observation"], c["observation"])
    finally:
        other.close()


def test_step_and_maybe_reset_matches_step_then_reset(parallel_toy):
    """The one-round-trip step_and_maybe_reset == EnvBase's step + partial reset."""
    env = parallel_toy
    env.set_seed(1)
    torch.manual_seed(0)
    td = env.reset()
    serial = SerialEnv(3, toy2)
    serial.set_seed(1)
    td_s = serial.reset()
    for _ in range(12):
        action = env.action_spec.rand()
        td["action"] = action
        td_s["action"] = action.clone()
        cur, td = env.step_and_maybe_reset(td)
        # reference: EnvBase's generic implementation on the serial env
        cur_s = serial.step(td_s)
        td_s = serial._step_mdp(cur_s)
        done = td_s["done"]
        if done.any():
            td_s = td_s.copy()
            td_s["_reset"] = done
            td_s = serial.reset(td_s)
        assert_td_equal(cur, cur_s)
        assert_td_equal(td, td_s)
    serial.close()


# ---------------------------------------------------------------------- partial resets
@pytest.mark.parametrize("mask_shape", ["with_1", "without_1"])
def test_partial_reset_reaches_only_flagged_sub_envs(parallel_toy, mask_shape):
    env = parallel_toy
    env.set_seed(0)
    td = env.reset()
    td["action"] = torch.ones(3, 2, 1)
    td = env._step_mdp(env.step(td))
    mask = torch.tensor([[True, False], [False, False], [False, True]])
    td["_reset"] = mask.unsqueeze(-1) if mask_shape == "with_1" else mask
    out = env.reset(td)
    assert "_reset" not in out.keys()
    count = out["nested", "count"].squeeze(-1)
    assert (count[mask] == 0).all() and (count[~mask] == 1).all()
    assert torch.equal(out["observation"][~mask], td["observation"][~mask])
    assert not torch.equal(out["observation"][mask], td["observation"][mask])
    # the same on a SerialEnv
    serial = SerialEnv(3, toy2)
    serial.set_seed(0)
    td_s = serial.reset()
    td_s["action"] = torch.ones(3, 2, 1)
    td_s = serial._step_mdp(serial.step(td_s))
    td_s["_reset"] = td["_reset"].clone()
    assert_td_equal(serial.reset(td_s), out)
    # an untouched worker is not even woken up: its env counts no reset
    n_resets = [e.n_resets for e in serial._envs]
    td_s["_reset"] = torch.tensor([[True, False], [False, False], [False, False]])
    serial.reset(td_s)
    assert [e.n_resets for e in serial._envs] == [n_resets[0] + 1, n_resets[1], n_resets[2]]
    serial.close()


def test_partial_reset_unbatched_sub_envs():
    with ParallelEnv(3, ToyEnv) as env:
        env.set_seed(0)
        td = env.reset()
        td["action"] = torch.ones(3, 1)
        td = env._step_mdp(env.step(td))
        td["_reset"] = torch.tensor([False, True, False])
        out = env.reset(td)
        assert out["nested", "count"].squeeze(-1).tolist() == [1, 0, 1]
        td["_reset"] = torch.zeros(3, dtype=torch.bool)  # nothing to reset: nothing changes
        assert torch.equal(env.reset(td)["observation"], td["observation"])


# ---------------------------------------------------------------------- seeding
@pytest.mark.parametrize("cls", [SerialEnv, ParallelEnv])
def test_set_seed_chains_distinct_seeds(cls):
    with cls(3, ToyEnv) as env:
        last = env.set_seed(7)
        assert last == next_seed(next_seed(next_seed(7)))
        obs = env.reset()["observation"]
        assert len({tuple(o.tolist()) for o in obs}) == 3  # distinct per worker
        env.set_seed(7)
        assert torch.equal(env.reset()["observation"], obs)
        assert env.set_seed(7, static_seed=True) == 7
        obs_static = env.reset()["observation"]
        assert torch.equal(obs_static[0], obs_static[1])


def test_unseeded_parallel_workers_differ():
    """Without set_seed, workers still get distinct global RNG streams."""
    torch.manual_seed(0)
    with ParallelEnv(2, CartPoleEnv) as env:  # CartPoleEnv seeds itself from torch's RNG
        obs = env.reset()["observation"]
        assert not torch.equal(obs[0], obs[1])


# ---------------------------------------------------------------------- rollouts
def test_rollout_with_policy_and_nested_batch(parallel_toy):
    def policy(td):
        td["action"] = td["observation"][..., :1].clamp(-1, 1) * 0 + 0.5
        return td

    out = parallel_toy.rollout(7, policy, break_when_any_done=False)
    assert out.batch_size == torch.Size([3, 2, 7])
    assert (out["action"] == 0.5).all()
    assert out["next", "reward"].shape == (3, 2, 7, 1)
    short = parallel_toy.rollout(50, policy)  # stops at the first done
    assert short.batch_size[-1] < 50 and short["next", "done"][..., -1, :].any()


def test_parallel_of_serial_envs():
    """Sub-envs that are batched envs themselves: [2 workers] x SerialEnv(2) x ToyEnv."""
    fn = functools.partial(SerialEnv, 2, ToyEnv)
    with ParallelEnv(2, fn) as par, SerialEnv(2, fn) as ser:
        assert par.batch_size == torch.Size([2, 2])
        assert_td_equal(_rollout(par, 5, steps=15, break_when_any_done=False),
                        _rollout(ser, 5, steps=15, break_when_any_done=False))


def test_list_of_create_env_fn_and_kwargs():
    with SerialEnv(2, [make_toy, make_toy], [{"seed": 1}, {"seed": 2}]) as env:
        assert env.batch_size == torch.Size([2])
    with pytest.raises(ValueError, match="2 create_env_fn for num_workers=3"):
        SerialEnv(3, [make_toy, make_toy])
    with pytest.raises(ValueError, match="list of 3 dicts"):
        SerialEnv(3, make_toy, [{}])


# ---------------------------------------------------------------------- EnvCreator
def test_env_creator_probe_is_closed_and_pickles():
    made = []

    def factory(**kwargs):  # records the envs it makes (runs in this process)
        env = ToyEnv(**kwargs)
        made.append(env)
        return env

    creator = EnvCreator(factory, {"batch_size": [4]})
    meta = creator.meta_data
    assert isinstance(meta, EnvMetaData) and meta.batch_size == torch.Size([4])
    assert len(made) == 1 and made[0].is_closed  # the probe was closed
    assert creator.meta_data is meta and len(made) == 1  # built once
    env = creator(obs_dim=3)
    assert env.batch_size == torch.Size([4]) and not env.is_closed
    pick = pickle.loads(pickle.dumps(EnvCreator(make_toy, {"obs_dim": 5})))
    assert pick().observation_spec["observation"].shape == (5,)
    assert "make_toy" in repr(pick)


# ---------------------------------------------------------------------- bad input
@pytest.mark.parametrize("cls", [SerialEnv, ParallelEnv, EnvCreator])
def test_create_env_fn_returning_non_env(cls):
    with pytest.raises(TypeError, match=r"make_not_an_env returned a builtins.dict, not a steersman EnvBase"):
        if cls is EnvCreator:
            EnvCreator(make_not_an_env)()
        else:
            cls(2, make_not_an_env)


@pytest.mark.parametrize("cls", [SerialEnv, ParallelEnv])
def test_env_instance_or_non_callable_rejected(cls):
    with pytest.raises(TypeError, match="env instance.*pass its class"):
        cls(2, ToyEnv())
    with pytest.raises(TypeError, match="must be a callable"):
        cls(2, "CartPole-v1")
    with pytest.raises(ValueError, match="num_workers must be a positive int"):
        cls(0, ToyEnv)


@pytest.mark.parametrize("cls", [SerialEnv, ParallelEnv])
def test_sub_envs_with_different_specs(cls):
    with pytest.raises(ValueError, match=r"worker 1 .*observation_spec\['observation'\].*same specs"):
        cls(2, make_toy, [{"obs_dim": 3}, {"obs_dim": 4}])
    with pytest.raises(ValueError, match=r"worker 2 .*batch_size \[2\] instead of \[\]"):
        cls(3, make_toy, [{}, {}, {"batch_size": [2]}])


@pytest.mark.parametrize("cls", [SerialEnv, ParallelEnv])
def test_use_after_close(cls):
    env = cls(2, ToyEnv)
    td = env.reset()
    env.close()
    env.close()  # idempotent
    assert env.is_closed
    td["action"] = torch.zeros(2, 1)
    for call in (lambda: env.step(td), lambda: env.reset(), lambda: env.step_and_maybe_reset(td),
                 lambda: env.set_seed(0), lambda: env.rollout(3)):
        with pytest.raises(EnvClosedError):
            call()


def test_missing_or_misshaped_action(parallel_toy):
    td = parallel_toy.reset()
    with pytest.raises(KeyError, match="no entry 'action'"):
        parallel_toy.step(td)
    td["action"] = torch.zeros(3, 2, 4)
    with pytest.raises(ValueError, match=r"'action' has shape \[3, 2, 4\], expected \[3, 2, 1\]"):
        parallel_toy.step(td)
    td["action"] = torch.zeros(3, 2, 1)
    parallel_toy.step(td)  # the env is still usable after a rejected input


def test_unpicklable_create_env_fn():
    with pytest.raises(TypeError, match=r"create_env_fn .*Unpicklable.* cannot be pickled .*not even by cloudpickle"):
        ParallelEnv(2, Unpicklable(), mp_start_method="forkserver")


def test_lambdas_closures_local_functions_and_partials_are_factories():
    """What plain pickle refuses travels with cloudpickle (default start method)."""
    obs_dim = 2

    def closure():
        return ToyEnv(obs_dim=obs_dim)

    def local(obs_dim):
        return ToyEnv(obs_dim=obs_dim)

    for fn in (lambda: ToyEnv(obs_dim=obs_dim), closure, functools.partial(local, obs_dim=2)):
        with pytest.raises((pickle.PicklingError, AttributeError)):
            pickle.dumps(fn)  # what the test is about: plain pickle cannot
        with ParallelEnv(2, fn) as env, SerialEnv(2, fn) as ser:
            assert env.observation_spec["observation"].shape == (2, 2)
            assert_td_equal(_rollout(env, 0, steps=10), _rollout(ser, 0, steps=10))


def test_lambda_and_closure_work_with_fork():
    obs_dim = 2

    def closure():
        return ToyEnv(obs_dim=obs_dim)

    with ParallelEnv(2, closure, mp_start_method="fork") as env, SerialEnv(2, closure) as ser:
        assert_td_equal(_rollout(env, 0, steps=10), _rollout(ser, 0, steps=10))


def test_bad_start_method_and_pickling_the_env(parallel_toy):
    with pytest.raises(ValueError, match="mp_start_method must be one of"):
        ParallelEnv(2, ToyEnv, mp_start_method="thread")
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(parallel_toy)


def test_reset_kwargs_and_state_free_envs_forwarded():
    """NullEnv has no state: its reset input carries nothing but still round-trips."""
    with ParallelEnv(2, NullEnv) as env:
        td = env.reset()
        assert td["observation"].shape == (2, 4)
        td["action"] = torch.zeros(2, dtype=torch.int64)
        cur, nxt = env.step_and_maybe_reset(td)
        assert (cur["next", "reward"] == 1).all()
        assert isinstance(nxt, TensorDict)


def test_parallel_env_of_a_gym_lambda():
    """TorchRL's canonical example: ``ParallelEnv(4, lambda: GymEnv("CartPole-v1"))``."""
    pytest.importorskip("gymnasium")
    from steersman.envs.libs import GymEnv

    with ParallelEnv(4, lambda: GymEnv("CartPole-v1")) as env:
        env.set_seed(0)
        td = env.rollout(20, break_when_any_done=False)
        assert td.batch_size == (4, 20) and td["next", "done"].any()


def test_parallel_gym_env_equals_serial():
    pytest.importorskip("gymnasium")
    from steersman.envs.libs import GymEnv

    fn = functools.partial(GymEnv, "CartPole-v1", categorical_action_encoding=True)
    with ParallelEnv(2, fn) as par, SerialEnv(2, fn) as ser:
        a = _rollout(par, 9, steps=60, break_when_any_done=False)
        b = _rollout(ser, 9, steps=60, break_when_any_done=False)
        assert_td_equal(a, b)
        assert a["next", "done"].any()  # CartPole episodes ended and were reset
