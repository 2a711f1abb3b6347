"""GymLikeEnv and info readers, gym spec registration, library/metadata helpers, and the
model-based envs (driven by known models)."""

from __future__ import annotations

import pytest
import torch

from steersman import TensorDict
from steersman.data import Composite, Unbounded
from steersman.envs import (
    CartPoleEnv,
    GymLikeEnv,
    GymWrapper,
    ImaginedEnv,
    ModelBasedEnvBase,
    PendulumEnv,
    WorldModelEnv,
    check_env_specs,
    default_info_dict_reader,
    get_available_libraries,
    get_env_metadata,
    register_gym_spec_conversion,
    space_to_spec,
)
from steersman.envs.batched import EnvCreator
from steersman.tensordict.nn import TensorDictModule, TensorDictSequential

gym = pytest.importorskip("gymnasium")


class _InfoWrapper(gym.Wrapper):
    """Adds ``info["x"]`` (the cart position) and a private ``"_mask"``."""

    def _info(self, obs, info):
        info = dict(info)
        info["x"] = float(obs[0])
        info["_mask"] = True
        return info

    def step(self, action):
        obs, r, te, tr, info = self.env.step(action)
        return obs, r, te, tr, self._info(obs, info)

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return obs, self._info(obs, info)


class _OldApi:
    """A gym<0.26-style object: ``reset() -> obs``, ``step -> (obs, reward, done, info)``."""

    def __init__(self):
        self.t = 0

    def reset(self):
        self.t = 0
        return [0.0, 0.0]

    def step(self, action):
        self.t += 1
        return [float(self.t), float(action)], 1.0, self.t >= 3, {"TimeLimit.truncated": False}


class _OldApiEnv(GymLikeEnv):
    def __init__(self):
        super().__init__(env=_OldApi())
        self.observation_spec = Composite(observation=Unbounded((2,)))
        self.action_spec = Unbounded(())
        self.reward_spec = Unbounded((1,))


@pytest.mark.parametrize("vector", [False, True], ids=["single", "vector3"])
def test_info_dict_reader_on_gym_wrapper(vector):
    if vector:
        env = GymWrapper(gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync",
                                      wrappers=[_InfoWrapper]))
    else:
        env = GymWrapper(_InfoWrapper(gym.make("CartPole-v1")))
    env.set_info_dict_reader(default_info_dict_reader(["x"]))
    assert "x" in env.observation_spec.keys()
    r = env.rollout(30, break_when_any_done=False)  # episodes end and restart inside
    torch.testing.assert_close(r["next", "x"], r["next", "observation"][..., 0])
    torch.testing.assert_close(r["x"], r["observation"][..., 0])
    check_env_specs(env, seed=0)


def test_auto_register_reads_every_public_key_and_gym_like_env():
    env = GymWrapper(_InfoWrapper(gym.make("CartPole-v1")))
    env.auto_register_info_dict()
    assert set(env.observation_spec.keys()) == {"observation", "x"}  # "_mask" is private
    like = GymLikeEnv(env=_InfoWrapper(gym.make("CartPole-v1")), categorical_action_encoding=True)
    like.set_info_dict_reader(default_info_dict_reader(["x"], spec=[Unbounded(())]))
    check_env_specs(like, seed=0)
    r = like.rollout(5)
    torch.testing.assert_close(r["next", "x"], r["next", "observation"][:, 0])
    old = _OldApiEnv()
    r = old.rollout(5, lambda td: td.set("action", torch.tensor(0.5)))
    assert r["next", "observation"][:, 0].tolist() == [1.0, 2.0, 3.0]
    assert r["next", "done"].squeeze(-1).tolist() == [False, False, True]
    with pytest.raises(TypeError, match="env="):
        GymLikeEnv()
    with pytest.raises(ValueError, match="same length"):
        default_info_dict_reader(["a", "b"], spec=[Unbounded(())])


def test_register_gym_spec_conversion_also_inside_dict_spaces():
    calls = []

    @register_gym_spec_conversion(gym.spaces.Graph)
    def graph(space, batch_size=(), device=None, **kwargs):
        calls.append(kwargs["categorical_action_encoding"])
        return Unbounded(shape=(*batch_size, 7), device=device)

    try:
        space = gym.spaces.Dict(g=gym.spaces.Graph(gym.spaces.Box(0, 1, (3,)), None), b=gym.spaces.Discrete(2))
        spec = space_to_spec(space, batch_size=[4], categorical_action_encoding=True)
        assert spec["g"].shape == (4, 7) and spec["b"].shape == (4,)
        assert calls == [True]
    finally:
        from steersman.envs.libs import gym as G
        G._SPEC_CONVERSIONS.clear()
    with pytest.raises(TypeError, match="Graph"):
        space_to_spec(gym.spaces.Graph(gym.spaces.Box(0, 1, (3,)), None))
    with pytest.raises(TypeError, match="space class"):
        register_gym_spec_conversion(3)


def test_available_libraries_and_env_metadata():
    libs = get_available_libraries()
    assert libs["gymnasium"] is True and all(isinstance(v, bool) for v in libs.values())
    closed = []

    def make(batch_size=()):
        env = CartPoleEnv(batch_size=batch_size)
        closed.append(env)
        return env

    meta = get_env_metadata(make, {"batch_size": [2]})
    assert meta.batch_size == (2,) and closed[-1].is_closed  # the probe env is closed
    assert get_env_metadata(EnvCreator(make)).batch_size == ()
    seen = []
    get_env_metadata(CartPoleEnv(), env_validator=seen.append)
    assert len(seen) == 1

    def refuse(env):
        raise ValueError("worker-incompatible")

    with pytest.raises(ValueError, match="worker-incompatible"):
        get_env_metadata(make, env_validator=refuse)
    assert closed[-1].is_closed
    with pytest.raises(TypeError, match="EnvBase"):
        get_env_metadata(lambda: 3)


# ---------------------------------------------------------------- model-based envs
class _LinearEnv(ModelBasedEnvBase):
    """s' = A s + B a, reward = -|s|^2 (a known model)."""

    def __init__(self, model):
        super().__init__(model, batch_size=[2])
        self.observation_spec = Composite(state=Unbounded((2, 2)), shape=[2])
        self.state_spec = Composite(state=Unbounded((2, 2)), shape=[2])
        self.action_spec = Unbounded((2, 1))
        self.reward_spec = Unbounded((2, 1))

    def _reset(self, tensordict=None, **kwargs):
        return TensorDict(state=torch.tensor([[1.0, 0.0], [0.0, 2.0]]), batch_size=[2])


A = torch.tensor([[0.9, 0.1], [0.0, 0.8]])
B = torch.tensor([[0.0], [1.0]])


def _model():
    return TensorDictModule(lambda s, a: (s @ A.T + a @ B.T, -(s @ A.T + a @ B.T).pow(2).sum(-1, keepdim=True)),
                            in_keys=["state", "action"], out_keys=["state", "reward"])


def test_model_based_env_matches_the_model():
    env = _LinearEnv(_model())
    check_env_specs(env)
    acts = torch.randn(5, 2, 1)
    it = iter(acts)
    r = env.rollout(5, lambda td: td.set("action", next(it)))
    s = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    for t in range(5):
        s = s @ A.T + acts[t] @ B.T
        torch.testing.assert_close(r["next", "state"][:, t], s)
        torch.testing.assert_close(r["next", "reward"][:, t], -s.pow(2).sum(-1, keepdim=True))
    assert not bool(r["next", "done"].any())
    with pytest.raises(TypeError, match="world_model"):
        _LinearEnv(3)


def test_world_model_env_rolls_latents_with_base_specs():
    base = PendulumEnv()
    dyn = TensorDictSequential(
        TensorDictModule(lambda z, a: torch.cat([z, a], -1), in_keys=["latent", "action"], out_keys=["za"]),
        TensorDictModule(torch.nn.Linear(5, 4), in_keys=["za"], out_keys=[("next", "latent")]),
        TensorDictModule(lambda z: z.sum(-1, keepdim=True), in_keys=[("next", "latent")],
                         out_keys=[("next", "reward")]))
    env = WorldModelEnv(dyn, base, batch_size=[3])
    assert env.observation_spec["latent"].shape == (3, 4)  # inferred from the model
    assert env.action_spec.shape == (3, 1) and env.reward_spec.shape == (3, 1)
    check_env_specs(env)
    start = TensorDict(latent=torch.randn(3, 4), batch_size=[3])
    r = env.rollout(4, tensordict=start)
    with torch.no_grad():
        z = start["latent"]
        for t in range(4):
            z = dyn[1].module(torch.cat([z, r["action"][:, t]], -1))
            torch.testing.assert_close(r["next", "latent"][:, t], z)
            torch.testing.assert_close(r["next", "reward"][:, t], z.sum(-1, keepdim=True))


def test_imagined_env_beliefs_and_never_done():
    def model(action, observation):
        return observation["mean"] * 0.5 + action, observation["var"] * 0.25 + 1.0

    wm = TensorDictModule(model, in_keys=["action", "observation"],
                          out_keys=[("next", "observation", "mean"), ("next", "observation", "var")])
    env = ImaginedEnv(wm, PendulumEnv())
    assert env.batch_size == (1,)
    check_env_specs(env)
    r = env.rollout(30, lambda td: td.set("action", torch.zeros(1, 1)),
                    tensordict=TensorDict(observation=torch.full((1, 3), 8.0), batch_size=[1]))
    assert r.batch_size == (1, 30) and not bool(r["next", "done"].any())
    assert r["next", "observation", "mean"][0, :3, 0].tolist() == [4.0, 2.0, 1.0]
    torch.testing.assert_close(r["next", "observation", "var"][0, -1], torch.full((3, 3), 4.0 / 3), atol=1e-4,
                               rtol=1e-4)
    with pytest.raises(KeyError, match="'var'"):
        env.reset(TensorDict(observation=TensorDict(mean=torch.zeros(1, 3), batch_size=[1]), batch_size=[1]))
