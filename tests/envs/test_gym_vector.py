"""Gymnasium vector envs wrapped as one batched env: every autoreset mode must give the
exact transition stream of independent single envs (no junk transition, no lost final
observation, identical episode returns)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

gym = pytest.importorskip("gymnasium")

from steersman.envs import check_env_specs  # noqa: E402
from steersman.envs.libs import GymEnv, GymWrapper  # noqa: E402

spaces = gym.spaces
MODES = {
    "next_step": gym.vector.AutoresetMode.NEXT_STEP,
    "same_step": gym.vector.AutoresetMode.SAME_STEP,
    "disabled": gym.vector.AutoresetMode.DISABLED,
}
N_ENVS = 3
SEED = 17


class DictObsEnv(gym.Env):
    """Dict observation (Box + Discrete + nested Box); random-length episodes; the
    reward is the step index, so a junk step (reward 0) is visible."""

    def __init__(self, max_len: int = 6) -> None:
        self.observation_space = spaces.Dict(
            pos=spaces.Box(-5.0, 5.0, (2,), dtype=np.float32),
            phase=spaces.Discrete(4),
            md=spaces.MultiDiscrete([3, 2]),
            deep=spaces.Dict(t=spaces.Box(0.0, 100.0, (1,), dtype=np.float64)),
        )
        self.action_space = spaces.Discrete(3)
        self.max_len = max_len

    def _obs(self):
        return {
            "pos": self.np_random.uniform(-1, 1, 2).astype(np.float32) + self.acc,
            "phase": int(self.t % 4),
            "md": np.array([self.t % 3, int(self.acc[0]) % 2], dtype=np.int64),
            "deep": {"t": np.array([self.t], dtype=np.float64)},
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.acc = np.zeros(2, dtype=np.float32)
        self.length = int(self.np_random.integers(2, self.max_len + 1))
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        self.acc = self.acc + float(action)
        return self._obs(), float(self.t), self.t >= self.length, False, {}


gym.register("SteersmanTestDictObs-v0", entry_point=DictObsEnv)


def _make_ref(env_id, **kw):
    return gym.make(env_id, **kw)


def _reference_streams(env_id, actions, seed, **kw):
    """Per sub-env: the transitions of a single env seeded ``seed + i``."""
    streams = []
    for i in range(actions.shape[0]):
        env = _make_ref(env_id, **kw)
        obs, _ = env.reset(seed=seed + i)
        trans = []
        for a in actions[i]:
            nobs, r, te, tr, _ = env.step(int(a))
            trans.append((obs, int(a), r, nobs, te, tr))
            obs = nobs
            if te or tr:
                obs, _ = env.reset()
        streams.append(trans)
    return streams


def _flat(o):
    if isinstance(o, dict):
        return {k: _flat(v) for k, v in o.items()}
    return np.asarray(o)


def _assert_obs_equal(td_obs, ref_obs, key_prefix=()):
    """td entries (categorical encoding) vs a Gymnasium observation (array or dict)."""
    if isinstance(ref_obs, dict):
        for k, v in ref_obs.items():
            _assert_obs_equal(td_obs.get(k), v, (*key_prefix, k))
    else:
        np.testing.assert_array_equal(td_obs.numpy(), np.asarray(ref_obs), err_msg=str(key_prefix))


def _obs_of(td, obs_keys):
    if obs_keys == ("observation",):
        return td["observation"]
    return td.select(*obs_keys)


def _check_against_reference(rollout, streams, obs_is_dict):
    n, T = rollout.batch_size
    returns_env, returns_ref = [], []
    for i in range(n):
        ep_env = ep_ref = 0.0
        for t in range(T):
            obs, a, r, nobs, te, tr = streams[i][t]
            step = rollout[i, t]
            assert int(step["action"]) == a
            if obs_is_dict:
                _assert_obs_equal(step.exclude("action", "next", "done", "terminated", "truncated"), obs)
                _assert_obs_equal(step["next"].exclude("reward", "done", "terminated", "truncated"), nobs)
            else:
                np.testing.assert_array_equal(step["observation"].numpy(), obs, err_msg=f"env {i} t {t}")
                # the final observation of an episode is never lost
                np.testing.assert_array_equal(step["next", "observation"].numpy(), nobs,
                                              err_msg=f"env {i} t {t} (next)")
            assert step["next", "reward"].item() == r, (i, t)
            assert step["next", "terminated"].item() == te, (i, t)
            assert step["next", "truncated"].item() == tr, (i, t)
            assert step["next", "done"].item() == (te or tr)
            ep_env += step["next", "reward"].item()
            ep_ref += r
            if te or tr:
                returns_env.append(ep_env)
                returns_ref.append(ep_ref)
                ep_env = ep_ref = 0.0
    assert returns_env == returns_ref and len(returns_ref) >= n  # episodes ended in every sub-env


def _table_policy(actions):
    """A policy writing ``actions[:, t]`` (categorical) at its t-th call."""
    state = {"t": 0}

    def policy(td):
        td["action"] = torch.as_tensor(actions[:, state["t"]])
        state["t"] += 1
        return td

    return policy


@pytest.mark.parametrize("mode", list(MODES))
def test_cartpole_stream_matches_single_envs(mode):
    T = 70
    actions = np.random.default_rng(3).integers(0, 2, (N_ENVS, T))
    env = GymEnv(
        "CartPole-v1", num_envs=N_ENVS, categorical_action_encoding=True,
        vector_kwargs={"autoreset_mode": MODES[mode]}, max_episode_steps=12,
    )
    assert env.autoreset_mode == mode and env.batch_size == (N_ENVS,)
    env.set_seed(SEED)
    ro = env.rollout(T, _table_policy(actions), break_when_any_done=False)
    assert ro.batch_size == (N_ENVS, T)
    # CartPole pays 1 for every real step: a junk step (reward 0) would show here
    assert (ro["next", "reward"] == 1).all()
    streams = _reference_streams("CartPole-v1", actions, SEED, max_episode_steps=12)
    _check_against_reference(ro, streams, obs_is_dict=False)
    assert ro["next", "truncated"].any() and ro["next", "terminated"].any()
    env.close()


@pytest.mark.parametrize("mode", list(MODES))
def test_dict_obs_stream_matches_single_envs(mode):
    T = 25
    actions = np.random.default_rng(4).integers(0, 3, (N_ENVS, T))
    env = GymEnv(
        "SteersmanTestDictObs-v0", num_envs=N_ENVS, categorical_action_encoding=True,
        vector_kwargs={"autoreset_mode": MODES[mode]},
    )
    assert set(env.observation_spec.keys()) == {"pos", "phase", "md", "deep"}
    env.set_seed(SEED)
    ro = env.rollout(T, _table_policy(actions), break_when_any_done=False)
    assert (ro["next", "reward"] > 0).all()  # rewards are 1, 2, ...: no junk step
    streams = _reference_streams("SteersmanTestDictObs-v0", actions, SEED)
    _check_against_reference(ro, streams, obs_is_dict=True)


@pytest.mark.parametrize("mode", list(MODES))
def test_one_hot_encodings_match_categorical(mode):
    """Default (one-hot) encodings of Discrete / MultiDiscrete observations and actions give
    the same stream as the categorical ones (exercises the one-hot and encode paths of the
    final-observation and partial-reset merges)."""
    T = 25
    actions = np.random.default_rng(6).integers(0, 3, (N_ENVS, T))

    def run(cae):
        env = GymEnv("SteersmanTestDictObs-v0", num_envs=N_ENVS, categorical_action_encoding=cae,
                     vector_kwargs={"autoreset_mode": MODES[mode]})
        env.set_seed(SEED)
        if cae:
            return env, env.rollout(T, _table_policy(actions), break_when_any_done=False)
        eye = torch.eye(3, dtype=torch.bool)
        return env, env.rollout(T, _table_policy(eye[actions].numpy()), break_when_any_done=False)

    env_c, cat = run(True)
    env_o, oh = run(False)
    assert env_o.observation_spec["md"].shape == (N_ENVS, 5)  # MultiOneHot
    for prefix in ((), ("next",)):
        torch.testing.assert_close(oh[(*prefix, "pos")], cat[(*prefix, "pos")])
        assert torch.equal(oh[(*prefix, "phase")].to(torch.uint8).argmax(-1), cat[(*prefix, "phase")])
        spec = env_o.observation_spec["md"][0]
        assert torch.equal(spec.to_categorical(oh[(*prefix, "md")]), cat[(*prefix, "md")])
    assert torch.equal(oh["next", "reward"], cat["next", "reward"])


@pytest.mark.parametrize("mode", list(MODES))
def test_manual_step_and_maybe_reset_loop(mode):
    """The collector's loop: every transition starts from the state the previous one ended
    in, or from the reset observation after an episode end."""
    env = GymEnv("CartPole-v1", num_envs=4, vector_kwargs={"autoreset_mode": MODES[mode]},
                 max_episode_steps=25)
    td = env.reset(seed=1)
    prev = None
    partial = 0
    for _ in range(80):
        td = env.rand_action(td)
        cur, td = env.step_and_maybe_reset(td)
        if prev is not None:
            cont = ~prev["next", "done"].squeeze(-1)
            assert torch.equal(cur["observation"][cont], prev["next", "observation"][cont])
            ended = ~cont
            if ended.any():  # a reset observation, not the final one
                assert not torch.equal(cur["observation"][ended], prev["next", "observation"][ended])
                partial += bool(cont.any())
        assert (cur["next", "reward"] == 1).all()
        prev = cur
    assert partial > 0  # some sub-envs were reset while others carried on


@pytest.mark.parametrize("mode", list(MODES))
def test_check_env_specs_vector(mode):
    env = GymEnv("CartPole-v1", num_envs=3, vector_kwargs={"autoreset_mode": MODES[mode]},
                 max_episode_steps=5)
    check_env_specs(env, seed=0, max_steps=12)
    env = GymEnv("Pendulum-v1", num_envs=2, vector_kwargs={"autoreset_mode": MODES[mode]})
    check_env_specs(env, seed=0, max_steps=4)


def test_async_vector_env():
    T = 30
    actions = np.random.default_rng(5).integers(0, 2, (2, T))
    env = GymEnv("CartPole-v1", num_envs=2, vectorization_mode="async",
                 categorical_action_encoding=True, max_episode_steps=10)
    try:
        env.set_seed(SEED)
        ro = env.rollout(T, _table_policy(actions), break_when_any_done=False)
        streams = _reference_streams("CartPole-v1", actions, SEED, max_episode_steps=10)
        _check_against_reference(ro, streams, obs_is_dict=False)
    finally:
        env.close()


def test_vector_seeding():
    def first(seed):
        env = GymEnv("CartPole-v1", num_envs=3)
        env.set_seed(seed)
        return env.reset()["observation"]

    a, b, c = first(5), first(5), first(6)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert len({tuple(row.tolist()) for row in a}) == 3  # distinct per sub-env
    ref = np.stack([gym.make("CartPole-v1").reset(seed=5 + i)[0] for i in range(3)])
    np.testing.assert_array_equal(a.numpy(), ref)


def test_break_when_any_done_then_continue():
    env = GymEnv("CartPole-v1", num_envs=3, max_episode_steps=6)
    ro = env.rollout(20)
    assert ro.batch_size == (3, 6) and ro["next", "done"][:, -1].any()
    ro2 = env.rollout(4)  # a fresh full reset
    assert (ro2["next", "reward"] == 1).all()


@pytest.mark.parametrize("mode", list(MODES))
def test_break_when_all_done_steps_finished_envs(mode):
    """rollout(break_when_all_done) keeps stepping finished sub-envs (auto_reset resets
    them first; DISABLED would otherwise fail) and masks those steps out."""
    env = GymEnv("CartPole-v1", num_envs=3, vector_kwargs={"autoreset_mode": MODES[mode]},
                 max_episode_steps=30)
    env.set_seed(0)
    ro = env.rollout(100, break_when_any_done=False, break_when_all_done=True)
    done = ro["next", "done"].squeeze(-1)
    assert done.any(-1).all()
    assert (ro["next", "reward"] == 1).all()


def test_auto_reset_false_vector():
    env = GymEnv("CartPole-v1", num_envs=2, max_episode_steps=2, auto_reset=False)
    td = env.reset()
    for _ in range(2):
        td = env._step_mdp(env.rand_step(td))
    with pytest.raises(RuntimeError, match=r"sub-envs \[0, 1\]"):
        env.rand_step(td)


def test_vector_entry_point_env_without_partial_resets():
    env = GymEnv("CartPole-v1", num_envs=3, vectorization_mode="vector_entry_point",
                 max_episode_steps=8)
    assert env.autoreset_mode == "next_step"
    ro = env.rollout(50)  # break_when_any_done: full resets only, fine
    assert (ro["next", "reward"] == 1).all()
    ro = env.rollout(8)  # all sub-envs truncate together: a full reset
    td = env.reset()
    td = env.rand_action(td)
    # a partial reset is impossible without a junk step: a clear error
    td = env._step_mdp(env.step(td))
    td["_reset"] = torch.tensor([[True], [False], [False]])
    with pytest.raises(RuntimeError, match="reset_mask.*vectorization_mode='sync'"):
        env.reset(td)


def test_vector_frame_skip_wraps_sub_envs():
    env = GymEnv("Pendulum-v1", num_envs=2, frame_skip=3, max_episode_steps=7)
    ro = env.rollout(3, break_when_any_done=False)
    assert ro["next", "truncated"][:, 2].all()  # 3 + 3 + 1 frames
    with pytest.raises(ValueError, match="frame_skip"):
        GymWrapper(gym.make_vec("Pendulum-v1", num_envs=2, vectorization_mode="sync"), frame_skip=2)


def test_vector_onehot_actions_reach_sub_envs():
    env = GymEnv("CartPole-v1", num_envs=2)
    td = env.reset(seed=0)
    td["action"] = torch.tensor([[True, False], [False, True]])
    out = env.step(td)
    ref = [gym.make("CartPole-v1") for _ in range(2)]
    for i, r in enumerate(ref):
        r.reset(seed=i)
        obs, *_ = r.step(i)
        np.testing.assert_array_equal(out["next", "observation"][i].numpy(), obs)


def test_vector_wrong_action_shape():
    env = GymEnv("CartPole-v1", num_envs=2, categorical_action_encoding=True)
    td = env.reset()
    td["action"] = torch.zeros(2, 3, dtype=torch.int64)
    with pytest.raises(ValueError, match="shape"):
        env.step(td)


def test_vector_pixels(monkeypatch):
    pytest.importorskip("pygame")
    monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")
    env = GymEnv("CartPole-v1", num_envs=2, from_pixels=True)
    assert env.observation_spec["pixels"].shape == (2, 400, 600, 3)
    td = env.rollout(2)
    assert td["next", "pixels"].shape == (2, 2, 400, 600, 3)
    with pytest.raises(ValueError, match="SAME_STEP"):
        GymEnv("CartPole-v1", num_envs=2, from_pixels=True,
               vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
