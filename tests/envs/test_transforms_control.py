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


# ---------------------------------------------------------------- TorchRL keywords
def _accepted():
    from steersman.envs import (
        BatchSizeTransform,
        CatFrames,
        EnvCreator,
        ExcludeTransform,
        RemoveEmptySpecs,
        RewardSum,
        TargetReturn,
        TimeMaxPool,
        ToTensorImage,
        UnsqueezeTransform,
    )

    return [
        lambda: RewardSum(reset_keys=["_reset", ("agents", "_reset")], reward_spec=False),
        lambda: CatFrames(2, -1, in_keys=["observation"], reset_key="_reset", as_inverse=False, future=0),
        lambda: TimeMaxPool(["observation"], T=2, reset_key="_reset"),
        lambda: TargetReturn(1.0, reset_key=None),
        lambda: UnsqueezeTransform(-1, in_keys=["x"], allow_positive_dim=True),
        lambda: RemoveEmptySpecs(in_keys=None),
        lambda: ExcludeTransform("a", inverse=False),
        lambda: ToTensorImage(unsqueeze=False),
        lambda: BatchSizeTransform([2], reset_func=None, env_kwarg=False),
        lambda: EnvCreator(CartPoleEnv, share_memory=True),
    ]


def _refused():
    from steersman.envs import (
        BatchSizeTransform,
        CatFrames,
        ExcludeTransform,
        RemoveEmptySpecs,
        RewardSum,
        TargetReturn,
        ToTensorImage,
    )

    return [
        (lambda: RewardSum(reward_spec=True), "reward_spec"),
        (lambda: RewardSum(reset_keys=["done"]), "reset_key"),
        (lambda: CatFrames(2, -1, future=1), "future"),
        (lambda: CatFrames(2, -1, as_inverse=True), "as_inverse"),
        (lambda: CatFrames(2, -1, mask_key="m"), "mask_key"),
        (lambda: TargetReturn(1.0, reset_key="foo"), "reset_key"),
        (lambda: ExcludeTransform("a", inverse=True), "inverse"),
        (lambda: ToTensorImage(unsqueeze=True), "unsqueeze"),
        (lambda: BatchSizeTransform([2], env_kwarg=True), "env_kwarg"),
        (lambda: RemoveEmptySpecs(in_keys=["a"]), "in_keys"),
    ]


@pytest.mark.parametrize("i", range(10))
def test_torchrl_keywords_accepted(i):
    _accepted()[i]()


@pytest.mark.parametrize("i", range(10))
def test_torchrl_keywords_refused_with_reason(i):
    make, name = _refused()[i]
    with pytest.raises(ValueError, match=f"{name}=.* is not supported: "):
        make()


def test_cat_tensors_unsqueeze_if_oor_is_unsqueeze_if_needed():
    from steersman.envs import CatTensors

    td = TensorDict({"a": torch.zeros(3), "b": torch.ones(3, 2)}, [3])
    assert CatTensors(["a", "b"], "c", unsqueeze_if_oor=True)(td.clone())["c"].shape == (3, 3)
    with pytest.raises((ValueError, RuntimeError)):
        CatTensors(["a", "b"], "c", unsqueeze_if_oor=False)(td.clone())


def test_check_env_specs_break_when_any_done():
    env = CartPoleEnv(batch_size=[2])
    check_env_specs(env, seed=0, max_steps=40, break_when_any_done="both")
    with pytest.raises(ValueError, match="break_when_any_done"):
        check_env_specs(env, break_when_any_done="sometimes")


@pytest.mark.parametrize("categorical", [True, False])
def test_action_discretizer_maps_intervals(categorical):
    from steersman.envs import ActionDiscretizer

    S = ActionDiscretizer.SamplingStrategy
    # Pendulum torque in [-2, 2], 4 intervals of width 1: interval i is [-2 + i, -1 + i]
    for sampling, offset in ((S.MEDIAN, 0.5), (S.LOW, 0.0), (S.HIGH, 1.0)):
        t = ActionDiscretizer(4, sampling=sampling, categorical=categorical)
        env = TransformedEnv(PendulumEnv(batch_size=[4], seed=0), t)
        td = env.reset()
        idx = torch.arange(4).unsqueeze(-1)
        td["action"] = idx if categorical else torch.nn.functional.one_hot(idx.squeeze(-1), 4).bool()
        want = -2.0 + idx.float() + offset
        torch.testing.assert_close(t.inv(td)["action"], want)
    t = ActionDiscretizer(4, sampling=S.RANDOM)
    env = TransformedEnv(PendulumEnv(batch_size=[4], seed=0), t)
    td = env.reset()
    td["action"] = torch.arange(4).unsqueeze(-1)
    got = t.inv(td)["action"]
    assert ((got >= -2.0 + td["action"]) & (got <= -1.0 + td["action"])).all()
    # forward: continuous -> interval index
    back = t(TensorDict({"action": torch.tensor([[-1.9], [0.2], [2.0]])}, [3]))["action"]
    assert back.squeeze(-1).tolist() == [0, 2, 3]
    with pytest.raises(ValueError, match="num_intervals"):
        TransformedEnv(PendulumEnv(), ActionDiscretizer(torch.tensor([3, 4])))
    with pytest.raises(ValueError, match="Bounded"):
        TransformedEnv(CartPoleEnv(), ActionDiscretizer(3))


def test_random_truncation_spreads_then_full_horizon():
    from steersman.envs import RandomTruncationTransform

    env = TransformedEnv(PendulumEnv(batch_size=[16], seed=0), StepCounter())
    env.append_transform(RandomTruncationTransform(5, 10))
    torch.manual_seed(0)
    r = env.rollout(40, break_when_any_done=False)
    count = r["next", "step_count"].squeeze(-1)
    ends = r["next", "truncated"].squeeze(-1)
    # each sub-env's episode lengths: the first in [1, 10], all later ones exactly 10 (prob=0)
    for i in range(16):
        lengths = count[i][ends[i]].tolist()
        assert 1 <= lengths[0] <= 10 and all(n == 10 for n in lengths[1:-1] + lengths[1:2])
    firsts = {count[i][ends[i]][0].item() for i in range(16)}
    assert len(firsts) > 3  # spread
    assert torch.equal(r["next", "done"], r["next", "truncated"] | r["next", "terminated"])
    env2 = TransformedEnv(PendulumEnv(batch_size=[16], seed=0), StepCounter())
    env2.append_transform(RandomTruncationTransform(2, 4, prob=1.0))
    assert env2.rollout(40, break_when_any_done=False)["next", "step_count"].max() <= 4
    with pytest.raises(ValueError, match="min_horizon"):
        RandomTruncationTransform(5, 3)
    with pytest.raises(KeyError, match="StepCounter"):
        TransformedEnv(PendulumEnv(), RandomTruncationTransform(2, 4))
