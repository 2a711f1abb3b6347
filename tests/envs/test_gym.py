"""GymWrapper / GymEnv on single Gymnasium envs: specs, data, seeding, frame skip,
pixels, bad input, and the no-reuse guarantee of the preallocated outputs."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

gym = pytest.importorskip("gymnasium")

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
from steersman.envs import EnvBase, InvalidActionError, check_env_specs, step_mdp  # noqa: E402
from steersman.envs.common import EnvClosedError  # noqa: E402
from steersman.envs.libs import GymDependencyError, GymEnv, GymWrapper, space_to_spec  # noqa: E402
from steersman.envs.libs.gym import _import_gymnasium  # noqa: E402
from steersman.tensordict import TensorDict  # noqa: E402

spaces = gym.spaces
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---------------------------------------------------------------------- a custom env
class RichEnv(gym.Env):
    """Dict observation (Box float64, Discrete with start, MultiDiscrete, MultiBinary,
    Tuple, nested Dict) and a Dict action (Box + Discrete + MultiDiscrete + MultiBinary).
    Deterministic given the seed; episodes end after ``horizon`` steps (terminated)."""

    metadata = {"render_modes": []}

    def __init__(self, horizon: int = 4) -> None:
        self.horizon = horizon
        self.observation_space = spaces.Dict(
            pos=spaces.Box(-10.0, 10.0, (2,), dtype=np.float64),
            mode=spaces.Discrete(3, start=-1),
            md=spaces.MultiDiscrete([2, 5]),
            bits=spaces.MultiBinary(3),
            tup=spaces.Tuple((spaces.Discrete(4), spaces.Box(0, 255, (2, 2), dtype=np.uint8))),
            inner=spaces.Dict(v=spaces.Box(-np.inf, np.inf, (1,), dtype=np.float32)),
        )
        self.action_space = spaces.Dict(
            move=spaces.Box(-1.0, 1.0, (2,), dtype=np.float32),
            pick=spaces.Discrete(3),
            md=spaces.MultiDiscrete([2, 3]),
            bits=spaces.MultiBinary(2),
        )
        self.t = 0
        self.last_action = None

    def _obs(self) -> dict:
        r = self.np_random
        return {
            "pos": r.uniform(-1, 1, 2),
            "mode": int(r.integers(-1, 2)),
            "md": np.array([r.integers(0, 2), r.integers(0, 5)], dtype=np.int64),
            "bits": r.integers(0, 2, 3).astype(np.int8),
            "tup": (int(r.integers(0, 4)), r.integers(0, 256, (2, 2)).astype(np.uint8)),
            "inner": {"v": np.array([self.t], dtype=np.float32)},
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        assert self.action_space.contains(action), action
        self.last_action = action
        self.t += 1
        reward = float(action["move"].sum()) + action["pick"]
        return self._obs(), reward, self.t >= self.horizon, False, {}


class TextEnv(gym.Env):
    def __init__(self) -> None:
        self.observation_space = spaces.Text(max_length=8)
        self.action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "start", {}

    def step(self, action):
        return "left" if action == 0 else "right", 1.0, False, False, {}


# ---------------------------------------------------------------------- spec conversion
def test_space_to_spec_kinds():
    box = space_to_spec(spaces.Box(-1.0, 2.0, (3,), dtype=np.float64))
    assert isinstance(box, Bounded) and box.dtype == torch.float64 and box.shape == (3,)
    assert isinstance(space_to_spec(spaces.Box(-np.inf, np.inf, (2,))), Unbounded)
    half = space_to_spec(spaces.Box(np.array([0.0, -np.inf], np.float32), np.array([1.0, np.inf], np.float32)))
    assert isinstance(half, Bounded)
    img = space_to_spec(spaces.Box(0, 255, (4, 4, 3), dtype=np.uint8))
    assert img.dtype == torch.uint8 and img.domain == "discrete"
    oh = space_to_spec(spaces.Discrete(5))
    assert isinstance(oh, OneHot) and oh.shape == (5,)
    cat = space_to_spec(spaces.Discrete(5), categorical_action_encoding=True)
    assert isinstance(cat, Categorical) and cat.shape == () and cat.n == 5
    moh = space_to_spec(spaces.MultiDiscrete([2, 3]))
    assert isinstance(moh, MultiOneHot) and moh.shape == (5,)
    mc = space_to_spec(spaces.MultiDiscrete([2, 3]), categorical_action_encoding=True)
    assert isinstance(mc, MultiCategorical) and mc.shape == (2,)
    mc2 = space_to_spec(spaces.MultiDiscrete([[2, 3], [4, 5]]))
    assert isinstance(mc2, MultiCategorical) and mc2.shape == (2, 2)
    b = space_to_spec(spaces.MultiBinary(4))
    assert isinstance(b, Binary) and b.shape == (4,) and b.dtype == torch.int8
    d = space_to_spec(spaces.Dict(a=spaces.Discrete(2), b=spaces.Dict(c=spaces.MultiBinary(2))))
    assert isinstance(d, Composite) and isinstance(d["b", "c"], Binary)
    t = space_to_spec(spaces.Tuple((spaces.Discrete(2), spaces.Box(0, 1, (3,)))))
    assert sorted(t.keys()) == ["0", "1"] and t["1"].shape == (3,)
    assert isinstance(space_to_spec(spaces.Text(5)), NonTensor)
    batched = space_to_spec(spaces.Box(-1, 1, (3,)), batch_size=[4])
    assert batched.shape == (4, 3)
    assert space_to_spec(spaces.Discrete(2), batch_size=[4]).shape == (4, 2)


def test_space_to_spec_unsupported_names_the_space():
    graph = spaces.Graph(node_space=spaces.Box(0, 1, (2,)), edge_space=None)
    with pytest.raises(TypeError, match=r"Graph.*'observation'.*Flatten"):
        space_to_spec(graph)
    with pytest.raises(TypeError, match=r"Sequence.*'observation.x'"):
        space_to_spec(spaces.Dict(x=spaces.Sequence(spaces.Discrete(2))))


def test_incompatible_space_in_env():
    class GraphEnv(gym.Env):
        observation_space = spaces.Graph(node_space=spaces.Box(0, 1, (2,)), edge_space=None)
        action_space = spaces.Discrete(2)

    with pytest.raises(TypeError, match="Graph"):
        GymWrapper(GraphEnv())


# ---------------------------------------------------------------------- specs vs data
@pytest.mark.parametrize("cae", [False, True])
@pytest.mark.parametrize(
    "env_id", ["CartPole-v1", "Pendulum-v1", "MountainCarContinuous-v0", "MountainCar-v0",
               "Acrobot-v1", "FrozenLake-v1"],
)
def test_check_env_specs_classic(env_id, cae):
    env = GymEnv(env_id, categorical_action_encoding=cae)
    check_env_specs(env, seed=0, max_steps=30)
    assert env.batch_size == torch.Size([])
    assert set(env.done_keys) == {"done", "terminated", "truncated"}
    assert env.reward_spec.shape == (1,) and env.reward_spec.dtype == torch.float32
    env.close()


def test_specs_cartpole():
    env = GymEnv("CartPole-v1")
    obs = env.observation_spec["observation"]
    assert isinstance(obs, Bounded) and obs.dtype == torch.float32 and obs.shape == (4,)
    assert isinstance(env.action_spec, OneHot) and env.action_spec.n == 2  # TorchRL's default
    env = GymEnv("CartPole-v1", categorical_action_encoding=True)
    assert isinstance(env.action_spec, Categorical)
    fl = GymEnv("FrozenLake-v1")
    assert isinstance(fl.observation_spec["observation"], OneHot)  # same flag as actions


def test_rich_dict_env_specs_and_values():
    env = GymWrapper(RichEnv())
    obs = env.observation_spec
    assert set(obs.keys()) == {"pos", "mode", "md", "bits", "tup", "inner"}  # Dict keys kept
    assert obs["pos"].dtype == torch.float64  # float64 kept
    assert isinstance(obs["tup"], Composite) and set(obs["tup"].keys()) == {"0", "1"}
    assert obs["tup", "1"].dtype == torch.uint8
    act = env.full_action_spec
    assert set(act["action"].keys()) == {"move", "pick", "md", "bits"}
    check_env_specs(env, seed=1, max_steps=10)
    # values match the raw env, including the Discrete start offset
    raw = RichEnv()
    o_raw, _ = raw.reset(seed=5)
    td = env.reset(seed=5)
    np.testing.assert_array_equal(td["pos"].numpy(), o_raw["pos"])
    assert int(td["mode"].to(torch.uint8).argmax()) == o_raw["mode"] + 1  # start=-1: index 0 is -1
    np.testing.assert_array_equal(MultiOneHot([2, 5]).to_categorical(td["md"]).numpy(), o_raw["md"])
    np.testing.assert_array_equal(td["bits"].numpy(), o_raw["bits"])
    assert int(td["tup", "0"].to(torch.uint8).argmax()) == o_raw["tup"][0]
    np.testing.assert_array_equal(td["tup", "1"].numpy(), o_raw["tup"][1])
    assert td["inner", "v"].dtype == torch.float32
    # a Dict action reaches the env as a dict of numpy values
    action = TensorDict(
        {"move": torch.tensor([0.5, -0.25]), "pick": torch.tensor([False, False, True]),
         "md": torch.tensor([True, False, False, False, True]),
         "bits": torch.tensor([1, 0], dtype=torch.int8)},
        batch_size=[],
    )
    td["action"] = action
    out = env.step(td)
    got = env.env.unwrapped.last_action
    # a Discrete action arrives as Gymnasium's own element type (what space.sample() returns)
    assert got["pick"] == 2 and type(got["pick"]) is np.int64
    assert env.env.action_space.contains(got)
    np.testing.assert_array_equal(got["md"], [0, 2])
    np.testing.assert_array_equal(got["bits"], [1, 0])
    assert out["next", "reward"].item() == pytest.approx(0.25 + 2)


def test_rich_env_categorical_encoding():
    env = GymWrapper(RichEnv(), categorical_action_encoding=True)
    assert isinstance(env.observation_spec["mode"], Categorical)
    assert isinstance(env.observation_spec["md"], MultiCategorical)
    check_env_specs(env, seed=2, max_steps=6)
    raw = RichEnv()
    o_raw, _ = raw.reset(seed=9)
    td = env.reset(seed=9)
    assert int(td["mode"]) == o_raw["mode"] + 1
    np.testing.assert_array_equal(td["md"].numpy(), o_raw["md"])


def test_text_observation():
    env = GymWrapper(TextEnv(), categorical_action_encoding=True)
    assert isinstance(env.observation_spec["observation"], NonTensor)
    td = env.reset()
    assert td["observation"] == "start"
    td["action"] = torch.tensor(1)
    assert env.step(td)["next", "observation"] == "right"


# ---------------------------------------------------------------------- semantics
def _reference(env_id, seed, actions, **make_kwargs):
    """Single Gymnasium env transitions: (obs, action, reward, next_obs, term, trunc)."""
    env = gym.make(env_id, **make_kwargs)
    obs, _ = env.reset(seed=seed)
    out = []
    for a in actions:
        nobs, r, te, tr, _ = env.step(a)
        out.append((obs, a, r, nobs, te, tr))
        obs = nobs
        if te or tr:
            obs, _ = env.reset()
    return out


def test_matches_gymnasium_with_resets():
    """Through step_and_maybe_reset: the same transitions as a raw env, resets included."""
    rng = np.random.default_rng(0)
    acts = rng.integers(0, 2, 120)
    ref = _reference("CartPole-v1", 7, acts, max_episode_steps=15)
    env = GymEnv("CartPole-v1", categorical_action_encoding=True, max_episode_steps=15)
    env.set_seed(7)
    td = env.reset()
    n_trunc = 0
    for (obs, _a, r, nobs, te, tr), act in zip(ref, acts):
        td["action"] = torch.tensor(int(act))
        cur, td = env.step_and_maybe_reset(td)
        np.testing.assert_array_equal(cur["observation"].numpy(), obs)
        np.testing.assert_array_equal(cur["next", "observation"].numpy(), nobs)
        assert cur["next", "reward"].item() == r
        assert cur["next", "terminated"].item() == te
        assert cur["next", "truncated"].item() == tr
        assert cur["next", "done"].item() == (te or tr)
        n_trunc += tr
    assert n_trunc > 0  # the time limit was hit: truncated kept distinct from terminated


def test_terminated_vs_truncated():
    env = GymEnv("Pendulum-v1", max_episode_steps=5)
    td = env.rollout(10)
    assert td.batch_size == (5,)
    assert td["next", "truncated"][-1].item() and not td["next", "terminated"].any()
    assert torch.equal(td["next", "done"], td["next", "truncated"] | td["next", "terminated"])


def test_seeding_reproducible_and_distinct():
    def roll(seed):
        env = GymEnv("CartPole-v1")
        torch.manual_seed(0)  # the random policy
        env.set_seed(seed)
        return env.rollout(20, break_when_any_done=False)

    a, b, c = roll(3), roll(3), roll(4)
    assert torch.equal(a["observation"], b["observation"])
    assert not torch.equal(a["observation"], c["observation"])
    first = gym.make("CartPole-v1").reset(seed=3)[0]
    np.testing.assert_array_equal(a["observation"][0].numpy(), first)
    # reset(seed=...) as in Gymnasium
    env = GymEnv("CartPole-v1")
    np.testing.assert_array_equal(env.reset(seed=3)["observation"].numpy(), first)


def test_set_seed_returns_next_seed():
    env = GymEnv("CartPole-v1")
    s1 = env.set_seed(1)
    assert isinstance(s1, int) and s1 != 1
    assert env.set_seed(None) is None


@pytest.mark.parametrize("k", [1, 3])
def test_frame_skip(k):
    rng = np.random.default_rng(1)
    acts = rng.integers(0, 2, 40)
    raw = gym.make("CartPole-v1")
    raw.reset(seed=11)
    env = GymEnv("CartPole-v1", frame_skip=k, categorical_action_encoding=True)
    td = env.reset(seed=11)
    for a in acts:
        total, done = 0.0, False
        for _ in range(k):
            obs, r, te, tr, _ = raw.step(int(a))
            total += r
            if te or tr:
                done = True
                break
        td["action"] = torch.tensor(int(a))
        cur, td = env.step_and_maybe_reset(td)
        np.testing.assert_array_equal(cur["next", "observation"].numpy(), obs)
        assert cur["next", "reward"].item() == total
        assert cur["next", "done"].item() == done
        if done:
            raw.reset()
    with pytest.raises(ValueError, match="frame_skip"):
        GymEnv("CartPole-v1", frame_skip=0)


def test_frame_skip_stops_at_done():
    env = GymEnv("Pendulum-v1", frame_skip=4, max_episode_steps=6)
    td = env.rollout(5)
    assert td.batch_size == (2,)  # 4 frames, then 2 frames and the time limit
    assert td["next", "truncated"][-1].item()


@pytest.mark.parametrize("cae", [False, True])
@pytest.mark.parametrize("extra", [False, True])
def test_step_and_maybe_reset_matches_base_class(cae, extra):
    """The fast single-env path gives what EnvBase's step + step_mdp + reset gives, with
    extra root entries (a policy output) carried to the next input."""
    def run(fn):
        env = GymEnv("CartPole-v1", categorical_action_encoding=cae, max_episode_steps=7)
        td = env.reset(seed=5)
        out = []
        for t in range(60):
            td["action"] = env.action_spec.encode(t % 2) if not cae else torch.tensor(t % 2)
            if extra:
                td["logits"] = torch.full((2,), float(t))
            cur, td = fn(env, td)
            out.append((cur.clone(), td.clone()))
        return out

    fast = run(lambda e, td: e.step_and_maybe_reset(td))
    base = run(lambda e, td: EnvBase.step_and_maybe_reset(e, td))
    n_done = 0
    for (c1, n1), (c2, n2) in zip(fast, base):
        assert set(c1.keys(include_nested=True)) == set(c2.keys(include_nested=True))
        assert set(n1.keys()) == set(n2.keys())
        assert (c1 == c2).all() and (n1 == n2).all()
        assert ("logits" in n1.keys()) == extra
        n_done += bool(c1["next", "done"])
    assert n_done >= 5  # resets happened


def test_policy_written_next_entries_are_kept():
    """A ("next", key) written by the policy before the step survives it (TorchRL semantics)."""
    env = GymEnv("CartPole-v1", categorical_action_encoding=True)
    td = env.reset(seed=0)
    for t in range(3):
        td["action"] = torch.tensor(1)
        td["next"] = TensorDict({"hidden": torch.full((3,), float(t))}, batch_size=[])
        cur, td = env.step_and_maybe_reset(td)
        assert torch.equal(cur["next", "hidden"], torch.full((3,), float(t)))
        assert cur["next", "observation"].shape == (4,)
        assert torch.equal(td["hidden"], torch.full((3,), float(t)))


def test_keeps_extra_root_entries_across_reset():
    env = GymEnv("CartPole-v1", categorical_action_encoding=True, max_episode_steps=3)
    td = env.reset(seed=0)
    td["hidden"] = torch.ones(2)
    for _ in range(4):
        td["action"] = torch.tensor(0)
        _, td = env.step_and_maybe_reset(td)
        assert "hidden" in td.keys()


KEYS = ("observation", "reward", "done", "terminated", "truncated")


def _step_and_mdp(env, td):
    from steersman.envs import step_mdp

    cur = env.step(td)
    nxt = step_mdp(cur)
    if cur["next", "done"].item():
        nxt = env.reset()
    return cur, nxt


@pytest.mark.parametrize("cae", [False, True])
@pytest.mark.parametrize("api", ["step_and_maybe_reset", "step"])
def test_outputs_are_fresh_tensors(cae, api):
    """Every step and every reset hands out tensors of its own: rows of the preallocated
    memory are never handed out twice, and an in-place edit of one stored step (a flag, an
    observation) never shows in another one."""
    env = GymEnv("CartPole-v1", categorical_action_encoding=cae, max_episode_steps=9)
    td = env.reset(seed=0)
    stepper = env.step_and_maybe_reset if api == "step_and_maybe_reset" else (
        lambda td: _step_and_mdp(env, td))
    ptrs: set[int] = set()
    kept = []
    n_done = 0
    for t in range(600):  # more than one preallocated block, with resets
        td["action"] = env.action_spec.encode(t % 2) if not cae else torch.tensor(t % 2)
        cur, td = stepper(td)
        kept.append(cur)
        n_done += bool(cur["next", "done"])
        tensors = [cur["next", k] for k in KEYS]
        if cur["next", "done"].item():  # the next input comes from a reset: also fresh
            tensors += [td[k] for k in ("observation", "done", "terminated", "truncated")]
        for x in tensors:
            assert x.data_ptr() not in ptrs
            ptrs.add(x.data_ptr())
    assert n_done >= 60
    # in-place edits of the outputs of odd steps leave the even steps' outputs alone (a
    # step's root entries are the previous step's "next" ones, shared as in step_mdp)
    snapshot = [c["next"].clone() for c in kept[:12]]
    for k in KEYS:
        for c in kept[1:12:2]:
            x = c["next", k]
            x.copy_(~x if x.dtype == torch.bool else x + 100)
    for t in range(0, 12, 2):
        assert (kept[t]["next"] == snapshot[t]).all()


def test_rollout_stacks():
    env = GymEnv("CartPole-v1")
    td = env.rollout(50, break_when_any_done=False)
    assert td.batch_size == (50,)
    assert td["action"].shape == (50, 2) and td["next", "observation"].shape == (50, 4)


# ---------------------------------------------------------------------- pixels
@pytest.fixture
def headless(monkeypatch):
    monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")
    monkeypatch.setenv("SDL_AUDIODRIVER", "dummy")
    pytest.importorskip("pygame")


@pytest.mark.parametrize("pixels_only", [True, False])
def test_from_pixels(headless, pixels_only):
    env = GymEnv("CartPole-v1", from_pixels=True, pixels_only=pixels_only)
    keys = set(env.observation_spec.keys())
    assert keys == ({"pixels"} if pixels_only else {"pixels", "observation"})
    spec = env.observation_spec["pixels"]
    assert spec.dtype == torch.uint8 and spec.shape == (400, 600, 3)
    check_env_specs(env, seed=0, max_steps=3)
    # the frames are env.render() of a reference env in the same state
    raw = gym.make("CartPole-v1", render_mode="rgb_array")
    raw.reset(seed=2)
    td = env.reset(seed=2)
    np.testing.assert_array_equal(td["pixels"].numpy(), raw.render())
    td["action"] = torch.tensor([False, True])
    raw.step(1)
    np.testing.assert_array_equal(env.step(td)["next", "pixels"].numpy(), raw.render())
    env.close()


def test_from_pixels_needs_rgb_array(headless):
    with pytest.raises(ValueError, match="rgb_array"):
        GymWrapper(gym.make("CartPole-v1"), from_pixels=True)
    with pytest.raises(ValueError, match="rgb_array"):
        GymEnv("CartPole-v1", from_pixels=True, render_mode="human")


# ---------------------------------------------------------------------- bad input
def test_missing_optional_dependency_names_the_extra(monkeypatch):
    """LunarLander needs Box2D: one ImportError naming the extra, not Gymnasium's own error."""
    import importlib.util

    if importlib.util.find_spec("Box2D") is not None:  # installed here: fail as Gymnasium does without it
        def make(*args, **kwargs):
            raise gym.error.DependencyNotInstalled("Box2D is not installed")
        monkeypatch.setattr(gym, "make", make)
    with pytest.raises(GymDependencyError, match=r"GymEnv\('LunarLander-v3'\).*pip install \"gymnasium\[box2d\]\"") as info:
        GymEnv("LunarLander-v3")
    assert isinstance(info.value, ImportError)
    assert isinstance(info.value.__cause__, gym.error.DependencyNotInstalled)


def test_unknown_id():
    with pytest.raises(ValueError) as info:
        GymEnv("CartPol-v1")
    msg = str(info.value)
    assert "CartPol-v1" in msg and "gymnasium.envs.registry.keys()" in msg
    assert "CartPole-v1" in msg  # a close match is suggested
    with pytest.raises(ValueError, match="registry"):
        GymEnv("NoSuchNamespace/Thing-v0")
    assert "CartPole-v1" in GymEnv.available_envs()


@pytest.mark.parametrize("cae,bad", [
    (False, torch.zeros(3, dtype=torch.bool)),
    (False, torch.zeros(1, 2, dtype=torch.bool)),
    (False, torch.zeros(2, 2, dtype=torch.bool)),
    (False, torch.tensor(True)),
    (True, torch.zeros(1, dtype=torch.long)),
    (True, torch.zeros(2, dtype=torch.long)),
])
@pytest.mark.parametrize("api", ["step", "step_and_maybe_reset"])
def test_wrong_action_shape(cae, bad, api):
    """A wrongly shaped action raises a ValueError naming the key, the spec and the space,
    and changes nothing: the env then steps on as an untouched one."""
    env = GymEnv("CartPole-v1", categorical_action_encoding=cae)
    ref = GymEnv("CartPole-v1", categorical_action_encoding=cae)
    td, ref_td = env.reset(seed=0), ref.reset(seed=0)
    td["action"] = bad
    with pytest.raises(ValueError, match=r"action 'action' has shape .* (OneHot|Categorical) .*Discrete\(2\)"):
        getattr(env, api)(td)
    assert "next" not in td.keys()
    good = env.action_spec.encode(1) if not cae else torch.tensor(1)
    td["action"] = good
    ref_td["action"] = good
    assert (env.step(td)["next"] == ref.step(ref_td)["next"]).all()


class DiscreteRecorder(gym.Env):
    """Records the actions it gets; ``Discrete(3, start)`` actions checked by the space."""

    def __init__(self, start: int) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, (2,), dtype=np.float32)
        self.action_space = spaces.Discrete(3, start=start)
        self.actions: list = []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        assert self.action_space.contains(action), action
        self.actions.append(action)
        return np.zeros(2, np.float32), 0.0, False, False, {}


@pytest.mark.parametrize("cae", [False, True])
@pytest.mark.parametrize("start", [0, -1, 3])
def test_discrete_actions_reach_gymnasium_as_space_elements(cae, start):
    """Index ``j`` of a ``Discrete(n, start)`` action arrives as ``start + j``, of the type
    Gymnasium's ``space.sample()`` gives (a numpy integer of ``space.dtype``); a categorical
    index out of range is refused (``check``) or, unchecked, not wrapped around (Gymnasium
    rejects it)."""
    env = GymWrapper(DiscreteRecorder(start), categorical_action_encoding=cae)
    td = env.reset(seed=0)
    for j in (2, 0, 1):
        td["action"] = env.action_spec.encode(j) if not cae else torch.tensor(j)
        _, td = env.step_and_maybe_reset(td)
    got = env.env.unwrapped.actions
    assert got == [start + 2, start, start + 1]
    assert all(type(a) is type(env.env.action_space.sample()) for a in got)
    if cae:
        for j in (-1, 3, 1.0, 1.5):
            td["action"] = torch.tensor(j)
            if j == 1.0:  # a whole float index is the int index
                env.step(td)
                assert got[-1] == start + 1
            else:
                n = len(got)
                with pytest.raises(InvalidActionError, match=rf"action 'action' = {j} is outside .*Categorical"):
                    env.step(td)
                assert len(got) == n  # nothing reached Gymnasium
                if j != 1.5:
                    env.check = False
                    with pytest.raises(AssertionError):
                        env.step(td)
                    env.check = True


def test_wrong_action_shape_continuous():
    env = GymEnv("Pendulum-v1")
    td = env.reset()
    td["action"] = torch.zeros(2)
    with pytest.raises(ValueError, match="Box"):
        env.step(td)


def test_action_out_of_spec_with_check():
    env = GymEnv("CartPole-v1", categorical_action_encoding=True)
    td = env.reset()
    td["action"] = torch.tensor(5)
    with pytest.raises(InvalidActionError, match=r"GymEnv\('CartPole-v1'\).step: action 'action' = 5 is outside"):
        env.step(td, check=True)
    unchecked = GymEnv("CartPole-v1", categorical_action_encoding=True, check=False)
    assert unchecked.check is False
    with pytest.raises(AssertionError):  # Gymnasium's own assertion, as before
        unchecked.step(unchecked.reset().set("action", torch.tensor(5)))
    pend = GymEnv("Pendulum-v1")
    td = pend.reset(seed=0)
    td["action"] = torch.tensor([3.0])
    pend.step(td)  # out of the bounds: passed on, Gymnasium's Pendulum clips it
    with pytest.raises(InvalidActionError, match=r"out of bounds.*3\.0 is not in \[-2\.0, 2\.0\]"):
        pend.step(td, check=True)  # the strict check enforces the bounds


def test_closed_env():
    env = GymEnv("CartPole-v1")
    td = env.reset()
    env.close()
    env.close()  # idempotent
    td["action"] = env.action_spec.rand()
    with pytest.raises(EnvClosedError):
        env.step(td)
    with pytest.raises(EnvClosedError):
        env.reset()


def test_not_a_gym_env():
    with pytest.raises(TypeError, match="gymnasium.Env"):
        GymWrapper("CartPole-v1")
    with pytest.raises(ValueError, match="batch_size"):
        GymWrapper(gym.make("CartPole-v1"), batch_size=[3])


def test_auto_reset_false_raises_when_stepping_a_finished_env():
    env = GymEnv("Pendulum-v1", max_episode_steps=2, auto_reset=False)
    td = env.reset()
    for _ in range(2):
        td = env._step_mdp(env.rand_step(td))
    with pytest.raises(RuntimeError, match="not reset"):
        env.rand_step(td)


def test_auto_reset_true_resets_a_finished_env():
    env = GymEnv("Pendulum-v1", max_episode_steps=2)
    td = env.reset()
    for _ in range(2):
        td = env._step_mdp(env.rand_step(td))
    assert td["done"].item()
    out = env.rand_step(td)  # a new episode starts: no truncation after 1 step
    assert not out["next", "truncated"].item()


def test_missing_gymnasium_message(monkeypatch):
    monkeypatch.setitem(sys.modules, "gymnasium", None)
    with pytest.raises(ImportError, match=r"pip install 'steersman\[gym\]'"):
        _import_gymnasium()


def test_import_without_gymnasium():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'gymnasium' or name.startswith('gymnasium.'):\n"
        "            raise ImportError('blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import steersman.envs, steersman.envs.libs\n"
        "from steersman.envs.libs import GymEnv\n"
        "try:\n"
        "    GymEnv('CartPole-v1')\n"
        "except ImportError as e:\n"
        "    assert 'steersman[gym]' in str(e), e\n"
        "else:\n"
        "    raise SystemExit('no ImportError')\n"
        "try:\n"
        "    from steersman.envs.libs import to_gymnasium\n"
        "except ImportError as e:\n"
        "    assert 'steersman[gym]' in str(e), e\n"
        "else:\n"
        "    raise SystemExit('no ImportError')\n"
        "assert 'gymnasium' not in sys.modules\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": REPO})
    assert res.returncode == 0, res.stderr


def test_device_output_path():
    """The path of non-CPU devices (outputs built on CPU, then moved), run on CPU here."""
    env = GymEnv("CartPole-v1", categorical_action_encoding=True)
    env._cpu = env._fast = False  # what .to("cuda") sets
    td = env.reset(seed=0)
    td["action"] = torch.tensor(1)
    cur, td = env.step_and_maybe_reset(td)
    assert cur["next", "observation"].shape == (4,) and cur["next", "reward"].item() == 1.0
    env = GymEnv("CartPole-v1").to("cpu")
    assert env._fast
    if torch.cuda.is_available():  # pragma: no cover - no GPU in CI
        env = GymEnv("CartPole-v1", device="cuda")
        assert env.rollout(3)["next", "observation"].device.type == "cuda"


@pytest.mark.parametrize("api", ["step_and_maybe_reset", "step"])
def test_outputs_stay_right_after_a_step_is_moved_to_shared_memory(api):
    # share_memory_() (what torch.multiprocessing does to a tensor put on a queue) moves the
    # whole preallocated block to new memory; the env must keep writing where its tensors look
    env = GymEnv("CartPole-v1", categorical_action_encoding=True)
    ref = gym.make("CartPole-v1")
    td = env.reset(seed=3)
    obs_ref, _ = ref.reset(seed=3)
    assert np.allclose(td["observation"].numpy(), obs_ref)
    shared = []
    for t in range(40):
        a = t % 2
        td["action"] = torch.tensor(a)
        if api == "step":
            cur = env.step(td)
            td = step_mdp(cur)
        else:
            cur, td = env.step_and_maybe_reset(td)
        obs_ref, r, term, trunc, _ = ref.step(a)
        got = cur["next", "observation"]
        assert np.array_equal(got.numpy(), obs_ref), t
        assert cur["next", "reward"].item() == r and cur["next", "terminated"].item() == term
        if t in (2, 17):
            got.share_memory_()
            shared.append((got, got.clone()))
        if term or trunc:
            break
    for got, want in shared:  # the moved tensors keep their values too
        assert torch.equal(got, want)
