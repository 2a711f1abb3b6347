"""steersman envs exported to Gymnasium: spaces, check_env, numpy in/out, vector
autoreset semantics, and round trips through GymWrapper."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

gym = pytest.importorskip("gymnasium")

from gymnasium.utils.env_checker import check_env  # noqa: E402

from steersman.data import (  # noqa: E402
    Binary,
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    MultiOneHot,
    NonTensor,
    OneHot,
    Unbounded,
)
from steersman.envs import check_env_specs, native  # noqa: E402
from steersman.envs.libs import (  # noqa: E402
    GymEnv,
    GymnasiumExport,
    GymnasiumVectorExport,
    GymWrapper,
    spec_to_space,
    to_gymnasium,
)

spaces = gym.spaces

# warnings Gymnasium's checker also gives for its own CartPole / Pendulum / MountainCar
KNOWN = ("infinity", "symmetric and normalized")


def _check(genv):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(genv, skip_render_check=True)
    other = [str(w.message) for w in caught if not any(k in str(w.message) for k in KNOWN)]
    assert not other, other


# ---------------------------------------------------------------------- spaces
def test_spec_to_space_kinds():
    assert spec_to_space(OneHot(4)) == spaces.Discrete(4)
    assert spec_to_space(Categorical(4)) == spaces.Discrete(4)
    assert spec_to_space(Categorical(4, shape=(2,))) == spaces.MultiDiscrete([4, 4])
    assert spec_to_space(MultiOneHot([2, 3])) == spaces.MultiDiscrete([2, 3])
    assert spec_to_space(MultiCategorical([2, 3])) == spaces.MultiDiscrete([2, 3])
    assert spec_to_space(Binary(3)) == spaces.MultiBinary(3)
    box = spec_to_space(Bounded(-1.0, 2.0, shape=(3,), dtype=torch.float64))
    assert box == spaces.Box(-1.0, 2.0, (3,), dtype=np.float64)
    assert spec_to_space(Unbounded(shape=(2,))) == spaces.Box(-np.inf, np.inf, (2,), np.float32)
    ub = spec_to_space(Unbounded(shape=(2,), dtype=torch.int32))
    assert ub.dtype == np.int32
    d = spec_to_space(Composite(a=OneHot(2), b=Composite(c=Binary(2))))
    assert isinstance(d, spaces.Dict) and d["b"]["c"] == spaces.MultiBinary(2)
    with pytest.raises(TypeError, match="NonTensor.*'observation'"):
        spec_to_space(NonTensor(shape=()), name="observation")


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1", "MountainCar-v0", "FrozenLake-v1"])
def test_round_trip_spaces(env_id):
    raw = gym.make(env_id)
    genv = to_gymnasium(GymEnv(env_id))
    assert genv.observation_space == raw.observation_space
    assert genv.action_space == raw.action_space


# ---------------------------------------------------------------------- check_env
@pytest.mark.parametrize("cls", ["CartPoleEnv", "PendulumEnv", "MountainCarEnv",
                                 "MountainCarContinuousEnv", "AcrobotEnv"])
def test_check_env_native(cls):
    env_cls = getattr(native, cls)
    genv = to_gymnasium(env_cls())
    assert isinstance(genv, GymnasiumExport)
    _check(genv)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1", "MountainCarContinuous-v0",
                                    "FrozenLake-v1"])
@pytest.mark.parametrize("cae", [False, True])
def test_check_env_gym_round_trip(env_id, cae):
    _check(to_gymnasium(GymEnv(env_id, categorical_action_encoding=cae)))


def test_check_env_dict_observation():
    class DictEnv(gym.Env):
        observation_space = spaces.Dict(
            a=spaces.Box(-1.0, 1.0, (2,), dtype=np.float32), b=spaces.Discrete(3),
            c=spaces.MultiBinary(2), d=spaces.MultiDiscrete([2, 4]),
        )
        action_space = spaces.MultiDiscrete([3, 2])

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return self.observation_space.sample(), {}

        def step(self, action):
            obs = {"a": self.np_random.uniform(-1, 1, 2).astype(np.float32),
                   "b": int(self.np_random.integers(3)), "c": np.array([1, 0], np.int8),
                   "d": np.array([1, int(action[0])])}
            return obs, float(action.sum()), False, False, {}

    genv = to_gymnasium(GymWrapper(DictEnv()))
    assert set(genv.observation_space.spaces) == {"a", "b", "c", "d"}
    assert genv.action_space == spaces.MultiDiscrete([3, 2])
    obs, _ = genv.reset(seed=0)
    assert obs in genv.observation_space
    obs, r, *_ = genv.step(np.array([2, 1]))
    assert r == 3.0 and obs["d"][1] == 2


# ---------------------------------------------------------------------- values
def test_trajectory_matches_gymnasium():
    raw = gym.make("CartPole-v1")
    genv = to_gymnasium(GymEnv("CartPole-v1"))
    o1, _ = raw.reset(seed=4)
    o2, _ = genv.reset(seed=4)
    np.testing.assert_array_equal(o1, o2)
    for t in range(200):
        a = t % 3 % 2
        s1 = raw.step(a)
        s2 = genv.step(a)
        np.testing.assert_array_equal(s1[0], s2[0])
        assert s1[1:4] == s2[1:4]
        assert type(s2[1]) is float and type(s2[2]) is bool and type(s2[3]) is bool
        if s1[2] or s1[3]:
            o1, _ = raw.reset()
            o2, _ = genv.reset()
            np.testing.assert_array_equal(o1, o2)


def test_observations_are_copies():
    genv = to_gymnasium(native.CartPoleEnv())
    obs0, _ = genv.reset(seed=0)
    keep = obs0.copy()
    obs1, *_ = genv.step(0)
    obs0[:] = 99
    assert not np.shares_memory(obs0, obs1)
    genv.step(1)
    np.testing.assert_array_equal(obs1 != 99, True)
    assert not np.array_equal(keep, obs0)


def test_step_before_reset_and_bad_batch():
    genv = to_gymnasium(native.CartPoleEnv())
    with pytest.raises(gym.error.ResetNeeded):
        genv.step(0)
    with pytest.raises(ValueError, match="batch size"):
        to_gymnasium(native.CartPoleEnv(batch_size=[2, 3]))
    with pytest.raises(ValueError, match=r"batch size \[\]"):
        GymnasiumExport(native.CartPoleEnv(batch_size=[2]))


def test_render_passthrough(monkeypatch):
    pytest.importorskip("pygame")
    monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")
    genv = to_gymnasium(GymEnv("CartPole-v1", render_mode="rgb_array"), render_mode="rgb_array")
    genv.reset(seed=0)
    frame = genv.render()
    assert frame.shape == (400, 600, 3) and frame.dtype == np.uint8


# ---------------------------------------------------------------------- vector export
def test_vector_export_spaces():
    venv = to_gymnasium(native.CartPoleEnv(batch_size=[4]))
    assert isinstance(venv, GymnasiumVectorExport) and venv.num_envs == 4
    assert venv.single_action_space == spaces.Discrete(2)
    assert venv.observation_space.shape == (4, 4)
    assert venv.metadata["autoreset_mode"] == gym.vector.AutoresetMode.NEXT_STEP


def test_vector_export_next_step_semantics():
    venv = to_gymnasium(native.CartPoleEnv(batch_size=[3], max_episode_steps=4))
    obs, _ = venv.reset(seed=0)
    for _ in range(4):
        obs, rew, term, trunc, _ = venv.step(np.zeros(3, dtype=np.int64))
    assert trunc.all() and (rew == 1).all()
    final = obs.copy()
    obs, rew, term, trunc, _ = venv.step(np.ones(3, dtype=np.int64))  # the reset step
    assert (rew == 0).all() and not term.any() and not trunc.any()
    assert not np.array_equal(obs, final)
    assert (np.abs(obs) <= 0.05).all()  # CartPole's reset distribution
    obs, rew, *_ = venv.step(np.ones(3, dtype=np.int64))
    assert (rew == 1).all()


def test_vector_export_same_step_semantics():
    venv = to_gymnasium(native.CartPoleEnv(batch_size=[3], max_episode_steps=3),
                        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    venv.reset(seed=0)
    for _ in range(2):
        venv.step(np.zeros(3, dtype=np.int64))
    obs, rew, term, trunc, info = venv.step(np.zeros(3, dtype=np.int64))
    assert trunc.all() and info["_final_obs"].all()
    for e in range(3):
        assert not np.array_equal(info["final_obs"][e], obs[e])
        assert (np.abs(obs[e]) <= 0.05).all()
    obs, rew, *_ = venv.step(np.zeros(3, dtype=np.int64))
    assert (rew == 1).all()


def test_vector_export_disabled_and_reset_mask():
    venv = to_gymnasium(native.CartPoleEnv(batch_size=[3], max_episode_steps=50),
                        autoreset_mode="Disabled")
    obs0, _ = venv.reset(seed=1)
    obs1, *_ = venv.step(np.zeros(3, dtype=np.int64))
    obs2, _ = venv.reset(options={"reset_mask": np.array([True, False, False])})
    np.testing.assert_array_equal(obs2[1:], obs1[1:])
    assert not np.array_equal(obs2[0], obs1[0])
    with pytest.raises(TypeError, match="one int"):
        venv.reset(seed="x")


@pytest.mark.parametrize("mode", ["NextStep", "SameStep", "Disabled"])
def test_round_trip_native_vector(mode):
    """native env -> Gymnasium VectorEnv -> GymWrapper: same rollout as the native env."""
    T = 60
    actions = torch.as_tensor(np.random.default_rng(0).integers(0, 2, (3, T)))

    def policy_factory():
        state = {"t": 0}

        def policy(td):
            td["action"] = actions[:, state["t"]].clone()
            state["t"] += 1
            return td

        return policy

    base = native.CartPoleEnv(batch_size=[3], max_episode_steps=20)
    base.set_seed(3)
    ref = base.rollout(T, policy_factory(), break_when_any_done=False)
    inner = native.CartPoleEnv(batch_size=[3], max_episode_steps=20)
    wrapped = GymWrapper(to_gymnasium(inner, autoreset_mode=mode), categorical_action_encoding=True)
    assert wrapped.autoreset_mode == {"NextStep": "next_step", "SameStep": "same_step",
                                      "Disabled": "disabled"}[mode]
    check_env_specs(wrapped, seed=0, max_steps=25)
    wrapped.set_seed(3)  # Gymnasium seeds [3, 4, 5]: the export seeds the env with 3
    ro = wrapped.rollout(T, policy_factory(), break_when_any_done=False)
    assert (ro["next", "reward"] == 1).all()
    assert ref["next", "done"].any()
    for key in ("observation", ("next", "observation"), ("next", "reward"), ("next", "terminated"),
                ("next", "truncated")):
        torch.testing.assert_close(ro[key], ref[key].to(ro[key].dtype), msg=str(key))


def test_round_trip_check_env_specs_single():
    env = GymWrapper(to_gymnasium(native.PendulumEnv()))
    check_env_specs(env, seed=0, max_steps=5)
