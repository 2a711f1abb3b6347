"""Behaviour of TerminateTransform, DeviceCastTransform, PinMemoryTransform, Hash,
gSDENoise, VecNormV2 (and VecNorm's TorchRL keywords), set_gym_backend / gym_backend."""

from __future__ import annotations

import pytest
import torch

from steersman.envs import (
    CartPoleEnv,
    DeviceCastTransform,
    Hash,
    PendulumEnv,
    PinMemoryTransform,
    StepCounter,
    TerminateTransform,
    TransformedEnv,
    VecNorm,
    VecNormV2,
    check_env_specs,
    gSDENoise,
)
from steersman.tensordict import TensorDict


@pytest.mark.parametrize("batch_size", [(), (3,)])
def test_terminate_flags_exactly_where_the_predicate_holds(batch_size):
    env = TransformedEnv(PendulumEnv(batch_size=batch_size, seed=0),
                         TerminateTransform(lambda td: td["observation"][..., 2] > 0.5))
    r = env.rollout(30, break_when_any_done=False)
    want = (r["next", "observation"][..., 2:] > 0.5)
    assert want.any() and not want.all()
    assert torch.equal(r["next", "terminated"], want)
    assert torch.equal(r["next", "done"], want | r["next", "truncated"])


def test_terminate_ends_rollout_and_write_done_false():
    pred = lambda td: td["step_count"] >= 4  # noqa: E731
    env = TransformedEnv(PendulumEnv(seed=0), StepCounter())
    env.append_transform(TerminateTransform(pred))
    assert env.rollout(50).batch_size == (4,)
    env2 = TransformedEnv(PendulumEnv(seed=0), StepCounter())
    env2.append_transform(TerminateTransform(pred, write_done=False))
    r = env2.rollout(6)
    assert r.batch_size == (6,)  # done untouched: the rollout goes on
    assert r["next", "terminated"][3:].all() and not r["next", "done"].any()
    with pytest.raises(TypeError, match="callable"):
        TerminateTransform(3)


def test_device_cast_moves_data_and_specs():
    td = TensorDict({"obs": torch.ones(2, 3)}, [2])
    out = DeviceCastTransform("meta")(td)
    assert out["obs"].device.type == "meta" and td["obs"].device.type == "cpu"
    env = TransformedEnv(CartPoleEnv(batch_size=[2], seed=0), DeviceCastTransform("cpu"))
    assert env.device == torch.device("cpu")
    check_env_specs(env)
    t = DeviceCastTransform("cpu", in_keys=["observation"], in_keys_inv=["action"])
    assert t.transform_env_device(torch.device("meta")) == torch.device("meta")  # keys only: env device kept
    assert DeviceCastTransform("meta").transform_env_device(torch.device("cpu")) == torch.device("meta")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_device_cast_cuda():
    env = TransformedEnv(CartPoleEnv(batch_size=[2], seed=0), DeviceCastTransform("cuda"))
    r = env.rollout(3)
    assert r["next", "observation"].is_cuda and env.base_env.device.type == "cpu"


def test_pin_memory_is_noop_without_cuda():
    env = TransformedEnv(CartPoleEnv(seed=0), PinMemoryTransform())
    td = env.reset()
    assert td["observation"].is_pinned() == torch.cuda.is_available()


def test_hash_reproducible_seeded_and_invertible():
    obs = torch.tensor([[1.0, 2.0], [1.0, 2.0], [3.0, 4.0]])
    td = TensorDict({"obs": obs}, [3])
    h1 = Hash(["obs"], ["h"])(td.clone())["h"]
    h2 = Hash(["obs"], ["h"])(td.clone())["h"]
    hs = Hash(["obs"], ["h"], seed=1)(td.clone())["h"]
    assert h1.dtype is torch.int64 and torch.equal(h1, h2)
    assert h1[0] == h1[1] and h1[0] != h1[2] and not torch.equal(h1, hs)
    # same bytes, other dtype: another hash
    assert Hash(["obs"], ["h"])(TensorDict({"obs": obs.double()}, [3]))["h"][0] != h1[0]
    rep: dict = {}
    t = Hash(["obs"], ["h"], ["obs"], ["h"], repertoire=rep)
    out = t(td.clone())
    assert len(rep) == 2
    back = t.inv(TensorDict({"h": out["h"]}, [3]))
    assert torch.equal(back["obs"], obs)
    assert t.get_input_from_hash(torch.tensor(12345)) is None
    # strings through a custom hash_fn
    th = Hash(["s"], ["h"], hash_fn=lambda v, seed: torch.tensor(len(v)))
    assert th(TensorDict({"s": "abcd"}, []))["h"] == 4
    with pytest.raises(ValueError, match="repertoire"):
        Hash(["obs"], ["h"], ["obs"], ["h"])
    with pytest.raises(ValueError, match="out_keys"):
        Hash(["obs"], None)


def test_gsde_noise_drawn_per_reset_and_kept_during_episode():
    env = TransformedEnv(PendulumEnv(batch_size=[2], seed=0), gSDENoise(state_dim=3, action_dim=1))
    torch.manual_seed(0)
    r = env.rollout(4)
    eps = r["_eps_gSDE"]
    assert eps.shape == (2, 4, 1, 3)
    assert torch.equal(eps[:, 0], eps[:, -1])  # one matrix per episode
    assert eps.std() > 0.1
    assert not torch.equal(env.reset()["_eps_gSDE"], env.reset()["_eps_gSDE"])
    assert TransformedEnv(PendulumEnv(seed=0), gSDENoise()).reset()["_eps_gSDE"].shape == (1,)
    with pytest.raises(ValueError, match="both"):
        gSDENoise(state_dim=3)


def test_vecnorm_v2_and_keywords():
    torch.manual_seed(0)
    a = TransformedEnv(CartPoleEnv(batch_size=[4], seed=0), VecNormV2(in_keys=["observation"], decay=0.9,
                                                                       lock=object(), reduce_batch_dims=True))
    b = TransformedEnv(CartPoleEnv(batch_size=[4], seed=0), VecNorm(decay=0.9, new_api=True, lock=None))
    torch.manual_seed(1)
    ra = a.rollout(6, break_when_any_done=False)
    torch.manual_seed(1)
    rb = b.rollout(6, break_when_any_done=False)
    assert torch.allclose(ra["next", "observation"], rb["next", "observation"])
    with pytest.raises(ValueError, match="stateful"):
        VecNormV2(in_keys=["observation"], stateful=False)
    with pytest.raises(ValueError, match="shared"):
        VecNorm(shared_td=TensorDict({}, []))


def test_set_gym_backend():
    gymnasium = pytest.importorskip("gymnasium")
    from steersman.envs import gym_backend, set_gym_backend

    with set_gym_backend("gymnasium"):
        assert gym_backend() is gymnasium
    with set_gym_backend(lambda: gymnasium):
        assert gym_backend("spaces") is gymnasium.spaces

    @set_gym_backend(gymnasium)
    def f():
        return 1

    assert f() == 1
    for other in ("gym", "stable_baselines3"):
        with pytest.raises(ValueError, match="gymnasium backend only"):
            set_gym_backend(other).set()
