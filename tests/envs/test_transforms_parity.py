"""TorchRL-parity transforms: each one's documented behaviour against a hand-computed reference,
and its bad input (a clear error naming the key/value, the transform left usable).

ClipTransform, SignTransform, BinarizeReward, LineariseRewards, ActionScaling,
DiscreteActionProjection, FlattenObservation, PermuteTransform, TrajCounter,
Reward2GoTransform, FiniteTensorDictCheck, UnaryTransform, Timer, Crop,
RandomCropTensorDict, Stack, FlattenAction, RemoveEmptySpecs, ModuleTransform,
BurnInTransform. The transform battery
(``test_transforms.py``) runs the generic checks (specs, batched/serial envs, forward).
"""

from __future__ import annotations

import pytest
import torch

from steersman import TensorDict
from steersman.data import Binary, Bounded, Composite, OneHot, Unbounded
from steersman.envs import PendulumEnv, check_env_specs
from steersman.envs.transforms import (
    ActionScaling,
    BinarizeReward,
    BurnInTransform,
    ClipTransform,
    Compose,
    Crop,
    DiscreteActionProjection,
    FiniteTensorDictCheck,
    FlattenAction,
    FlattenObservation,
    LineariseRewards,
    ModuleTransform,
    PermuteTransform,
    RandomCropTensorDict,
    RemoveEmptySpecs,
    Reward2GoTransform,
    SignTransform,
    Stack,
    StepCounter,
    Timer,
    ToTensorImage,
    TrajCounter,
    TransformedEnv,
    UnaryTransform,
)
from tests.envs._transform_envs import EmptySpecsEnv, PixelToyEnv, TwoAgentEnv


# ---------------------------------------------------------------------- ClipTransform
def test_clip_outputs_reference_and_spec():
    base = PendulumEnv(batch_size=[2], seed=0)
    env = TransformedEnv(base, ClipTransform(in_keys=["observation", "reward"], out_keys=["obs_c", "r_c"],
                                             low=-1.0, high=0.1))
    td = env.rollout(6)
    torch.testing.assert_close(td["obs_c"], td["observation"].clamp(-1.0, 0.1))
    torch.testing.assert_close(td["next", "obs_c"], td["next", "observation"].clamp(-1.0, 0.1))
    torch.testing.assert_close(td["next", "r_c"], td["next", "reward"].clamp(-1.0, 0.1))
    assert bool((td["observation"] > 0.1).any())  # the clip did something
    assert "r_c" not in td.keys()  # rewards are not reset outputs
    env = TransformedEnv(PendulumEnv(batch_size=[2], seed=0), ClipTransform(in_keys=["observation"], low=-1.0,
                                                                           high=0.1))
    spec = env.observation_spec["observation"]
    # pendulum's bounds [-1, -1, -8] .. [1, 1, 8] intersected with [-1, 0.1]
    torch.testing.assert_close(spec.low, torch.full((2, 3), -1.0))
    torch.testing.assert_close(spec.high, torch.full((2, 3), 0.1))


def test_clip_inverse_clips_the_env_action_only():
    base = PixelToyEnv(continuous=True)
    env = TransformedEnv(base, ClipTransform(in_keys_inv=["action"], low=-0.25, high=0.5))
    env.reset()
    td = env.reset()
    td["action"] = torch.tensor([-0.9, 0.7])
    out = env.step(td)
    torch.testing.assert_close(base.actions_seen[-1], torch.tensor([-0.25, 0.5]))
    torch.testing.assert_close(out["action"], torch.tensor([-0.9, 0.7]))  # the policy's value is kept
    # the policy-facing spec is the env's
    assert env.action_spec == base.action_spec
    # inv on a plain TensorDict
    inv = env.transform.inv(TensorDict(action=torch.tensor([3.0, -3.0]), batch_size=[]))
    torch.testing.assert_close(inv["action"], torch.tensor([0.5, -0.25]))


def test_clip_one_sided_and_int_spec():
    t = ClipTransform(in_keys=["x"], high=2)
    td = TensorDict(x=torch.tensor([-5, 1, 7]), batch_size=[3])
    assert t(td)["x"].tolist() == [-5, 1, 2]
    env = TransformedEnv(PixelToyEnv(), ClipTransform(in_keys=["pixels"], high=100))
    spec = env.observation_spec["pixels"]
    assert spec.dtype == torch.uint8 and int(spec.high.max()) == 100 and int(spec.low.min()) == 0
    assert int(env.rollout(3)["next", "pixels"].max()) <= 100


@pytest.mark.parametrize("kwargs, match", [
    ({}, "low and/or high"),
    ({"low": 1.0, "high": 1.0}, "strictly lower"),
    ({"low": 2.0, "high": -1.0}, "low=2.0, high=-1.0"),
    ({"low": "a"}, "low must be a number"),
    ({"high": float("nan")}, "high must be a number"),
])
def test_clip_bad_parameters(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        ClipTransform(in_keys=["observation"], **kwargs)


def test_clip_missing_key_named():
    with pytest.raises(KeyError, match="'obs'"):
        TransformedEnv(PendulumEnv(seed=0), ClipTransform(in_keys=["obs"], low=0.0))
    t = ClipTransform(in_keys=["obs"], low=0.0)
    td = TensorDict(observation=torch.ones(2, 3), batch_size=[2])
    with pytest.raises(KeyError, match="ClipTransform.*'obs'"):
        t(td)
    assert td["observation"].eq(1).all()


# ---------------------------------------------------------------------- SignTransform
def test_sign_reference_spec_and_inverse():
    x = torch.tensor([[-2.5, 0.0, 3.0], [0.1, -0.0, -7.0]])
    out = SignTransform(in_keys=["x"], out_keys=["s"])(TensorDict(x=x, batch_size=[2]))
    assert out["s"].tolist() == [[-1.0, 0.0, 1.0], [1.0, 0.0, -1.0]]
    assert out["x"] is x
    base = PixelToyEnv(continuous=True)
    env = TransformedEnv(base, SignTransform(in_keys=["observation"], in_keys_inv=["action"]))
    spec = env.observation_spec["observation"]
    assert spec.low.eq(-1).all() and spec.high.eq(1).all() and spec.dtype == torch.float32
    td = env.reset()
    td["action"] = torch.tensor([-0.3, 0.6])
    out = env.step(td)
    torch.testing.assert_close(base.actions_seen[-1], torch.tensor([-1.0, 1.0]))
    # toy observation after one step: [count, -count, index / 2] = [1, -1, 0]
    assert out["next", "observation"].tolist() == [1.0, -1.0, 0.0]


def test_sign_needs_keys():
    with pytest.raises(ValueError, match="in_keys and/or in_keys_inv"):
        SignTransform()


# ---------------------------------------------------------------------- BinarizeReward
def test_binarize_reward_reference():
    r = torch.tensor([[-2.0], [0.0], [1e-6], [3.0]])
    td = TensorDict(reward=r, misc=r.clone(), batch_size=[4])
    out = BinarizeReward()(td)
    assert out["reward"].dtype == torch.int8
    assert out["reward"].squeeze(-1).tolist() == [0, 0, 1, 1]
    assert out["misc"].equal(r)
    out = BinarizeReward(dtype=torch.float32)(TensorDict(reward=r, batch_size=[4]))
    assert out["reward"].squeeze(-1).tolist() == [0.0, 0.0, 1.0, 1.0]


def test_binarize_reward_in_env():
    env = TransformedEnv(PendulumEnv(batch_size=[3], seed=0), BinarizeReward())
    assert isinstance(env.full_reward_spec["reward"], Binary)
    td = env.rollout(4)
    # pendulum rewards are <= 0: all map to 0
    assert td["next", "reward"].dtype == torch.int8 and not td["next", "reward"].any()
    env = TransformedEnv(PixelToyEnv(batch_size=[2]), BinarizeReward())  # toy rewards > 0
    assert env.rollout(3)["next", "reward"].eq(1).all()


def test_binarize_reward_bad_shape():
    with pytest.raises(ValueError, match=r"'reward' must have a last dim of size 1.*\[2, 3\]"):
        BinarizeReward()(TensorDict(reward=torch.ones(2, 3), batch_size=[2]))
    with pytest.raises(ValueError, match="last dim of size 1"):
        TransformedEnv(PixelToyEnv(reward_dim=3), BinarizeReward())
    with pytest.raises(TypeError, match="dtype"):
        BinarizeReward(dtype="int8")


# ---------------------------------------------------------------------- LineariseRewards
def test_linearise_rewards_reference_and_spec():
    base = PixelToyEnv(batch_size=[2], reward_dim=3)
    w = [1.0, -0.5, 2.0]
    env = TransformedEnv(base, LineariseRewards(["reward"], ["r"], weights=w))
    td = env.rollout(3, break_when_any_done=False)
    raw = td["next", "reward"]  # [2, 3, 3] kept
    expected = raw[..., 0:1] * 1.0 + raw[..., 1:2] * -0.5 + raw[..., 2:3] * 2.0
    torch.testing.assert_close(td["next", "r"], expected)
    spec = env.reward_spec["r"]
    # reward bounds [0, 2] per objective: low = -0.5 * 2, high = 1 * 2 + 2 * 2
    assert spec.shape == (2, 1)
    torch.testing.assert_close(spec.low, torch.full((2, 1), -1.0))
    torch.testing.assert_close(spec.high, torch.full((2, 1), 6.0))
    # default weights: plain sum; in place
    out = LineariseRewards(["reward"])(TensorDict(reward=torch.tensor([[1.0, 2.0, 3.0]]), batch_size=[1]))
    assert out["reward"].tolist() == [[6.0]]


def test_linearise_rewards_unbounded_and_int():
    t = LineariseRewards(["reward"], weights=torch.tensor([2, 3]))
    out = t(TensorDict(reward=torch.tensor([[1, 1]]), batch_size=[1]))
    assert out["reward"].dtype == torch.get_default_dtype() and out["reward"].tolist() == [[5.0]]
    s = t._transform_spec_leaf(Unbounded(shape=(4, 2)), "reward")
    assert isinstance(s, Unbounded) and s.shape == (4, 1)


def test_linearise_rewards_bad_input():
    with pytest.raises(ValueError, match="needs in_keys"):
        LineariseRewards([])
    with pytest.raises(ValueError, match="1-D"):
        LineariseRewards(["reward"], weights=[[1.0, 2.0]])
    with pytest.raises(ValueError, match="finite"):
        LineariseRewards(["reward"], weights=[1.0, float("inf")])
    t = LineariseRewards(["reward"], weights=[1.0, 2.0])
    td = TensorDict(reward=torch.ones(2, 3), batch_size=[2])
    with pytest.raises(ValueError, match=r"'reward' has 3 objectives.*2 weights"):
        t(td)
    assert td["reward"].shape == (2, 3)  # unchanged
    with pytest.raises(ValueError, match=r"'reward' has 3 objectives.*2 weights"):
        TransformedEnv(PixelToyEnv(reward_dim=3), t)


# ---------------------------------------------------------------------- ActionScaling
def test_action_scaling_maps_to_env_bounds():
    base = PixelToyEnv(continuous=True)
    base.action_spec = Bounded(torch.tensor([-1.0, 0.0]), torch.tensor([3.0, 10.0]), shape=(2,))
    env = TransformedEnv(base, ActionScaling())
    assert env.action_spec.low.tolist() == [-1.0, -1.0] and env.action_spec.high.tolist() == [1.0, 1.0]
    td = env.reset()
    td["action"] = torch.tensor([-1.0, 0.5])
    env.step(td)
    # loc = [1, 5], scale = [2, 5]: a * scale + loc
    torch.testing.assert_close(base.actions_seen[-1], torch.tensor([-1.0, 7.5]))
    # forward (env -> normalized) is the inverse, on a replay-like sample
    sample = TensorDict(action=torch.tensor([[3.0, 0.0], [1.0, 5.0]]), batch_size=[2])
    torch.testing.assert_close(env.transform.clone()(sample)["action"], torch.tensor([[1.0, -1.0], [0.0, 0.0]]))
    check_env_specs(env)


def test_action_scaling_unit_interval_and_explicit():
    base = PixelToyEnv(continuous=True)
    base.action_spec = Bounded(-2.0, 6.0, shape=(2,))
    env = TransformedEnv(base, ActionScaling(standard_normal=False))
    assert env.action_spec.low.eq(0).all() and env.action_spec.high.eq(1).all()
    td = env.reset()
    td["action"] = torch.tensor([0.0, 0.75])
    env.step(td)
    torch.testing.assert_close(base.actions_seen[-1], torch.tensor([-2.0, 4.0]))  # 0 -> low, 1 -> high
    t = ActionScaling(loc=1.0, scale=0.5)
    out = t.inv(TensorDict(action=torch.tensor([2.0]), batch_size=[]))
    torch.testing.assert_close(out["action"], torch.tensor([2.0]))
    torch.testing.assert_close(t(TensorDict(action=torch.tensor([2.0]), batch_size=[]))["action"],
                               torch.tensor([2.0]))
    out = ActionScaling(loc=1.0, scale=0.5).inv(TensorDict(action=torch.tensor([-1.0]), batch_size=[]))
    torch.testing.assert_close(out["action"], torch.tensor([0.5]))


def test_action_scaling_other_key_and_state_dict():
    env = TransformedEnv(PendulumEnv(seed=0), ActionScaling(out_keys_inv=["a_norm"]))
    assert "a_norm" in env.full_action_spec.keys() and "action" not in env.full_action_spec.keys()
    td = env.rollout(3)
    assert td["a_norm"].abs().max() <= 1.0
    sd = env.transform.state_dict()
    torch.testing.assert_close(sd["loc"], torch.tensor([0.0]))
    torch.testing.assert_close(sd["scale"], torch.tensor([2.0]))


def test_action_scaling_bad_input():
    with pytest.raises(ValueError, match="both loc and scale"):
        ActionScaling(loc=0.0)
    with pytest.raises(ValueError, match="nonzero"):
        ActionScaling(loc=0.0, scale=0.0)
    with pytest.raises(ValueError, match="one action entry"):
        ActionScaling(in_keys_inv=["a", "b"])
    with pytest.raises(TypeError, match=r"'action' needs a continuous Bounded spec.*Categorical"):
        TransformedEnv(PixelToyEnv(), ActionScaling())
    with pytest.raises(KeyError, match="'act'"):
        TransformedEnv(PendulumEnv(seed=0), ActionScaling(["act"]))
    with pytest.raises(RuntimeError, match="loc and scale are not known"):
        ActionScaling()(TensorDict(action=torch.ones(1), batch_size=[]))
    base = PixelToyEnv(continuous=True)
    base.action_spec = Bounded(-float("inf"), 1.0, shape=(2,))
    with pytest.raises(ValueError, match="finite"):
        TransformedEnv(base, ActionScaling())


# ---------------------------------------------------------------------- DiscreteActionProjection
def test_discrete_action_projection_inverse_and_forward():
    base = PixelToyEnv(onehot=True)
    env = TransformedEnv(base, DiscreteActionProjection(4, 7))
    assert env.action_spec.n == 7 and env.action_spec.shape == (7,)
    td = env.reset()
    td["action"] = torch.nn.functional.one_hot(torch.tensor(2), 7).bool()
    out = env.step(td)
    assert base.actions_seen[-1].tolist() == [False, False, True, False]
    assert out["action"].shape == (7,)  # the policy's action is recorded
    # out-of-range indices become a valid random one
    env.set_seed(3)
    seen = []
    for _ in range(30):
        td = env.reset()
        td["action"] = torch.nn.functional.one_hot(torch.tensor(6), 7).bool()
        env.step(td)
        a = base.actions_seen[-1]
        assert a.shape == (4,) and int(a.sum()) == 1
        seen.append(int(a.long().argmax()))
    assert set(seen) == {0, 1, 2, 3}
    # forward: padded with zeros (replay sample of env actions)
    sample = TensorDict(action=torch.eye(4)[[1, 3]], batch_size=[2])
    out = DiscreteActionProjection(4, 7)(sample)["action"]
    assert out.tolist() == [[0, 1, 0, 0, 0, 0, 0], [0, 0, 0, 1, 0, 0, 0]]
    assert DiscreteActionProjection(4, 7, include_forward=False)(
        TensorDict(action=torch.eye(4)[[1]], batch_size=[1]))["action"].shape == (1, 4)


def test_discrete_action_projection_seeded():
    def draws(seed):
        t = DiscreteActionProjection(3, 5)
        t._set_seed(seed)
        a = torch.nn.functional.one_hot(torch.full((50,), 4), 5)
        return t.inv(TensorDict(action=a, batch_size=[50]))["action"].argmax(-1)

    assert draws(1).equal(draws(1)) and not draws(1).equal(draws(2))


def test_discrete_action_projection_bad_input():
    with pytest.raises(ValueError, match="larger than max_actions"):
        DiscreteActionProjection(5, 3)
    with pytest.raises(ValueError, match="max_actions must be a positive int"):
        DiscreteActionProjection(2, 0)
    with pytest.raises(TypeError, match=r"'action' must have a OneHot\(4\) spec.*Categorical"):
        TransformedEnv(PixelToyEnv(), DiscreteActionProjection(4, 6))
    with pytest.raises(TypeError, match=r"OneHot\(3\)"):
        TransformedEnv(PixelToyEnv(onehot=True), DiscreteActionProjection(3, 6))
    t = DiscreteActionProjection(3, 5)
    with pytest.raises(ValueError, match="has 4 entries.*max_actions=5"):
        t.inv(TensorDict(action=torch.eye(4)[0], batch_size=[]))


# ---------------------------------------------------------------------- FlattenObservation
def test_flatten_observation_reference_and_spec():
    env = TransformedEnv(PixelToyEnv(batch_size=[2]), FlattenObservation(-3, -2, in_keys=["pixels"]))
    spec = env.observation_spec["pixels"]
    assert spec.shape == (2, 80, 3) and spec.dtype == torch.uint8
    td = env.rollout(3)
    raw = PixelToyEnv(batch_size=[2]).rollout(3)["pixels"]
    assert td["pixels"].equal(raw.reshape(2, 3, 80, 3))
    check_env_specs(env)


def test_flatten_observation_positive_dims_follow_batch():
    t = FlattenObservation(0, 1, allow_positive_dim=True)
    x = torch.arange(2 * 5 * 4 * 3 * 2).reshape(2, 5, 4, 3, 2)
    td = TensorDict(pixels=x, batch_size=[2, 5])
    assert t(td)["pixels"].equal(x.reshape(2, 5, 12, 2))


def test_flatten_observation_bad_input():
    with pytest.raises(ValueError, match="must be negative"):
        FlattenObservation(0, -1)
    with pytest.raises(ValueError, match="comes after"):
        FlattenObservation(-1, -3)
    with pytest.raises(ValueError, match="must both be negative or both non-negative"):
        FlattenObservation(-2, 1, allow_positive_dim=True)
    t = FlattenObservation(-5, -1, in_keys=["observation"])
    td = TensorDict(observation=torch.ones(2, 3), batch_size=[2])
    with pytest.raises(ValueError, match=r"'observation' \(shape \[2, 3\], 1 batch dims\)"):
        t(td)
    assert td["observation"].shape == (2, 3)


# ---------------------------------------------------------------------- PermuteTransform
def test_permute_reference_spec_and_inverse():
    env = TransformedEnv(PixelToyEnv(batch_size=[2]), PermuteTransform([-1, -3, -2], in_keys=["pixels"]))
    spec = env.observation_spec["pixels"]
    assert spec.shape == (2, 3, 8, 10)
    td = env.rollout(2)
    raw = PixelToyEnv(batch_size=[2]).rollout(2)["pixels"]
    assert td["pixels"].equal(raw.permute(0, 1, 4, 2, 3))
    t = PermuteTransform([-2, -3, -1], in_keys_inv=["x"])
    y = torch.arange(24.0).reshape(2, 3, 4)
    back = t.inv(TensorDict(x=y, batch_size=[]))["x"]
    assert back.equal(y.permute(1, 0, 2))
    # inverse of a 3-cycle: forward then inverse is the identity
    t = PermuteTransform([-1, -3, -2], in_keys=["x"], in_keys_inv=["x"])
    z = torch.randn(5, 2, 3, 4)
    assert t._inv_apply_transform(t._apply_transform(z)).equal(z)


def test_permute_bad_input():
    with pytest.raises(ValueError, match=r"reordering of \[-3, -2, -1\], got \[-1, -2, 0\]"):
        PermuteTransform([-1, -2, 0], in_keys=["x"])
    with pytest.raises(TypeError, match="sequence of ints"):
        PermuteTransform(3, in_keys=["x"])
    with pytest.raises(ValueError, match="in_keys and/or in_keys_inv"):
        PermuteTransform([-2, -1])


# ---------------------------------------------------------------------- TrajCounter
def test_traj_counter_documented_example():
    env = TransformedEnv(PendulumEnv(seed=0), StepCounter(6))
    env.append_transform(TrajCounter())
    r = env.rollout(18, break_when_any_done=False)  # 18 // 6 = 3 trajectories
    assert r["next", "traj_count"].squeeze(-1).tolist() == [0] * 6 + [1] * 6 + [2] * 6
    assert r["traj_count"].equal(r["next", "traj_count"])


def test_traj_counter_partial_resets_in_order():
    # toy sub-env i ends after 3 + i steps: ids are handed out in the order of the resets
    env = TransformedEnv(PixelToyEnv(batch_size=[3]), TrajCounter())
    td = env.rollout(8, break_when_any_done=False)
    assert td["traj_count"].squeeze(-1).tolist() == [[0, 0, 0, 3, 3, 3, 6, 6],
                                                     [1, 1, 1, 1, 4, 4, 4, 4],
                                                     [2, 2, 2, 2, 2, 5, 5, 5]]
    # sub-env 1 ends at the last step: the rollout's auto-reset hands it id 7
    assert int(env.transform.state_dict()["count"]) == 8
    env.reset()  # a full reset: three new ids
    assert int(env.transform.count) == 11


def test_traj_counter_bad_input():
    with pytest.raises(ValueError, match="repeats=2 is not supported"):
        TrajCounter(repeats=2)
    env = TransformedEnv(PendulumEnv(seed=0), TrajCounter())
    env.reset()
    td = TensorDict(observation=torch.zeros(3), action=torch.zeros(1), batch_size=[])
    with pytest.raises(KeyError, match="'traj_count'"):
        env.step(td)


# ---------------------------------------------------------------------- Reward2GoTransform
def _reference_r2g(r, done, gamma):
    out = [0.0] * len(r)
    acc = 0.0
    for t in range(len(r) - 1, -1, -1):
        acc = r[t] + (0.0 if done[t] else gamma * acc)
        out[t] = acc
    return out


def test_reward2go_reference_and_replay_buffer():
    from steersman.data import LazyTensorStorage, ReplayBuffer

    torch.manual_seed(0)
    r = torch.randn(2, 6, 1)
    done = torch.zeros(2, 6, 1, dtype=torch.bool)
    done[0, 2] = True
    trunc = torch.zeros(2, 6, 1, dtype=torch.bool)
    trunc[1, 3] = True
    data = TensorDict({"next": {"reward": r, "done": done, "truncated": trunc}}, batch_size=[2, 6])
    t = Reward2GoTransform(gamma=0.9, out_keys=["reward_to_go"])
    out = t.inv(data)
    assert "reward_to_go" not in data.keys()  # inv works on a copy
    for b in range(2):
        ends = (done[b] | trunc[b]).squeeze(-1).tolist()
        ref = _reference_r2g(r[b].squeeze(-1).tolist(), ends, 0.9)
        torch.testing.assert_close(out["reward_to_go"][b].squeeze(-1), torch.tensor(ref))
    rb = ReplayBuffer(storage=LazyTensorStorage(10), transform=Reward2GoTransform(gamma=0.9,
                                                                                   out_keys=["reward_to_go"]))
    rb.extend(data)
    stored = rb.storage[:]
    torch.testing.assert_close(stored["reward_to_go"], out["reward_to_go"])
    # in place by default (in_keys = out_keys = ("next", "reward")), gamma 1: plain sums
    out = Reward2GoTransform().inv(data)
    assert out["next", "reward"][0, :3].squeeze(-1).tolist() == pytest.approx(
        r[0, :3].flip(0).cumsum(0).flip(0).squeeze(-1).tolist())


def test_reward2go_bad_input():
    with pytest.raises(ValueError, match="cannot be used in an env"):
        TransformedEnv(PendulumEnv(seed=0), Reward2GoTransform())
    with pytest.raises(ValueError, match="gamma must be one finite number"):
        Reward2GoTransform(gamma=[0.9, 0.8])
    t = Reward2GoTransform()
    with pytest.raises(KeyError, match=r"\('next', 'done'\)"):
        t.inv(TensorDict({"next": {"reward": torch.ones(3, 1)}}, batch_size=[3]))
    with pytest.raises(ValueError, match="needs a trajectory"):
        t.inv(TensorDict({"next": {"reward": torch.ones(1), "done": torch.zeros(1, dtype=torch.bool)}},
                         batch_size=[]))
    # the transform is still usable after the failed env wrap
    out = t.inv(TensorDict({"next": {"reward": torch.ones(2, 1), "done": torch.zeros(2, 1, dtype=torch.bool)}},
                           batch_size=[2]))
    assert out["next", "reward"].squeeze(-1).tolist() == [2.0, 1.0]


# ---------------------------------------------------------------------- FiniteTensorDictCheck
class _NaNAfter(PixelToyEnv):
    """The toy env whose observation becomes NaN at step ``k``."""

    def __init__(self, k: int) -> None:
        super().__init__()
        self.k = k

    def _step(self, tensordict):
        out = super()._step(tensordict)
        if int(self.count.max()) >= self.k:
            out["observation"] = torch.full_like(out["observation"], float("nan"))
        return out


def test_finite_check_in_env_names_the_entry():
    env = TransformedEnv(_NaNAfter(2), FiniteTensorDictCheck())
    assert env.rollout(1)["next", "observation"].isfinite().all()  # step 1: finite
    with pytest.raises(ValueError, match=r"'observation' holds non-finite values \(3 of 3"):
        env.rollout(3)
    # finite data passes unchanged, and forward checks nested entries
    data = PixelToyEnv().rollout(3)
    assert (FiniteTensorDictCheck()(data.clone()) == data).all()
    data["next", "reward"][1] = float("inf")
    with pytest.raises(ValueError, match=r"\('next', 'reward'\)"):
        FiniteTensorDictCheck()(data)


# ---------------------------------------------------------------------- UnaryTransform
def test_unary_reference_spec_and_inverse():
    env = TransformedEnv(PendulumEnv(batch_size=[2], seed=0),
                         UnaryTransform(["observation"], ["obs_sum"], fn=lambda x: x.sum(-1, keepdim=True)))
    spec = env.observation_spec["obs_sum"]
    assert isinstance(spec, Unbounded) and spec.shape == (2, 1)
    td = env.rollout(4)
    torch.testing.assert_close(td["obs_sum"], td["observation"].sum(-1, keepdim=True))
    torch.testing.assert_close(td["next", "obs_sum"], td["next", "observation"].sum(-1, keepdim=True))
    base = PixelToyEnv(continuous=True)
    env = TransformedEnv(base, UnaryTransform([], [], ["action"], ["action_big"], fn=lambda a: a * 10,
                                              inv_fn=lambda a: a / 10))
    assert "action_big" in env.full_action_spec.keys()
    td = env.reset()
    td["action_big"] = torch.tensor([5.0, -2.5])
    env.step(td)
    torch.testing.assert_close(base.actions_seen[-1], torch.tensor([0.5, -0.25]))
    # without inv_fn, fn maps both ways
    t = UnaryTransform(["x"], ["x"], ["y"], ["y"], fn=torch.neg)
    assert t.inv(TensorDict(y=torch.tensor([2.0]), batch_size=[]))["y"].tolist() == [-2.0]


def test_unary_bad_input():
    with pytest.raises(TypeError, match="fn must be callable"):
        UnaryTransform(["x"], ["y"], fn=3)
    with pytest.raises(ValueError, match="different lengths"):
        UnaryTransform(["x", "z"], ["y"], fn=torch.neg)
    with pytest.raises(ValueError, match=r"fn fails on the spec of 'observation'"):
        TransformedEnv(PendulumEnv(seed=0), UnaryTransform(["observation"], ["o"], fn=lambda x: x.reshape(7)))
    with pytest.raises(TypeError, match="fn must return a tensor"):
        TransformedEnv(PendulumEnv(seed=0), UnaryTransform(["observation"], ["o"], fn=lambda x: 1.0))


# ---------------------------------------------------------------------- Timer
def test_timer_records_step_policy_and_reset_times():
    import time

    env = TransformedEnv(PixelToyEnv(batch_size=[2]), Timer())
    assert set(env.observation_spec.keys()) >= {"time_step", "time_policy", "time_reset"}

    def slow_policy(td):
        time.sleep(0.02)
        td["action"] = env.action_spec.rand()
        return td

    td = env.rollout(4, policy=slow_policy, break_when_any_done=False)
    assert td["time_reset"].shape == (2, 4)
    assert bool((td["next", "time_policy"] >= 0.015).all())  # the policy's sleep
    assert bool((td["next", "time_step"] > 0).all()) and bool((td["next", "time_step"] < 0.015).all())
    assert bool((td["next", "time_reset"] == 0).all())
    assert bool((td["time_step"][:, 0] == 0).all()) and bool((td["time_policy"][:, 0] == 0).all())
    out = env.reset(TensorDict({}, batch_size=[2]))  # a reset with an input is timed
    assert bool((out["time_reset"] > 0).all())


def test_timer_bad_input():
    with pytest.raises(ValueError, match="three keys"):
        Timer(out_keys=["a", "b"])
    with pytest.raises(TypeError, match="time_key must be a string"):
        Timer(time_key=3)


# ---------------------------------------------------------------------- Crop
def test_crop_reference_in_env_and_padding():
    env = TransformedEnv(PixelToyEnv(batch_size=[2]), Compose(ToTensorImage(), Crop(4, 3, top=2, left=5)))
    assert env.observation_spec["pixels"].shape == (2, 3, 3, 4)
    td = env.rollout(3)
    raw = PixelToyEnv(batch_size=[2]).rollout(3)["pixels"]  # [2, 3, H=8, W=10, 3]
    expected = raw.permute(0, 1, 4, 2, 3)[..., 2:5, 5:9].float() / 255
    torch.testing.assert_close(td["pixels"], expected)
    # a window that leaves the image is zero-filled (as torchvision's crop)
    img = torch.arange(1.0, 17.0).reshape(1, 4, 4)
    out = Crop(3, 2, top=3, left=2)(TensorDict(pixels=img, batch_size=[]))["pixels"]
    assert out.tolist() == [[[15.0, 16.0, 0.0], [0.0, 0.0, 0.0]]]
    spec = TransformedEnv(PixelToyEnv(), Compose(ToTensorImage(from_int=False, dtype=torch.uint8),
                                                 Crop(6, top=5, left=7))).observation_spec["pixels"]
    assert spec.shape == (3, 6, 6) and int(spec.high[:, 3:, :].max()) == 0 and int(spec.high.max()) == 255


def test_crop_bad_input():
    with pytest.raises(ValueError, match="w must be an int >= 1"):
        Crop(0)
    with pytest.raises(ValueError, match="top must be an int >= 0"):
        Crop(3, top=-1)
    with pytest.raises(ValueError, match=r"'reward' has shape \[1\]"):
        TransformedEnv(PendulumEnv(seed=0), Crop(2, in_keys=["reward"]))


# ---------------------------------------------------------------------- RandomCropTensorDict
def test_random_crop_tensordict_windows():
    torch.manual_seed(0)
    T, L = 10, 4
    t = torch.arange(T).expand(5, T)
    td = TensorDict({"t": t, "next": {"x": t.unsqueeze(-1).float()}}, batch_size=[5, T])
    out = RandomCropTensorDict(L)(td)
    assert out.batch_size == (5, L)
    starts = out["t"][:, 0]
    assert out["t"].equal(starts.unsqueeze(-1) + torch.arange(L))  # contiguous windows
    assert out["next", "x"].squeeze(-1).long().equal(out["t"])  # the same window for every entry
    assert bool((starts >= 0).all() & (starts <= T - L).all())
    seen = set()
    for _ in range(40):
        seen |= set(RandomCropTensorDict(L)(td)["t"][:, 0].tolist())
    assert seen == set(range(T - L + 1))  # every start is drawn
    # the time dim elsewhere
    out = RandomCropTensorDict(3, sample_dim=0)(TensorDict(t=torch.arange(6).unsqueeze(-1).expand(6, 2),
                                                           batch_size=[6, 2]))
    assert out.batch_size == (3, 2) and out["t"][1:].sub(out["t"][:-1]).eq(1).all()


def test_random_crop_tensordict_mask():
    torch.manual_seed(1)
    valid = torch.tensor([5, 10, 2])
    mask = torch.arange(10).expand(3, 10) < valid.unsqueeze(-1)
    td = TensorDict(t=torch.arange(10).expand(3, 10), mask=mask, batch_size=[3, 10])
    for _ in range(20):
        out = RandomCropTensorDict(4, mask_key="mask")(td)
        s = out["t"][:, 0]
        assert int(s[0]) <= 1 and int(s[2]) == 0  # inside the valid steps (row 2 is too short: 0)


def test_random_crop_tensordict_bad_input():
    with pytest.raises(ValueError, match="sub_seq_len must be a positive int"):
        RandomCropTensorDict(0)
    td = TensorDict(t=torch.zeros(2, 3), batch_size=[2, 3])
    with pytest.raises(ValueError, match="3 steps.*sub_seq_len=5"):
        RandomCropTensorDict(5)(td)
    with pytest.raises(ValueError, match="sample_dim=-3 is not a batch dim"):
        RandomCropTensorDict(2, sample_dim=-3)(td)
    with pytest.raises(KeyError, match="'m'"):
        RandomCropTensorDict(2, mask_key="m")(td)
    with pytest.raises(ValueError, match="cannot be used in an env"):
        TransformedEnv(PendulumEnv(seed=0), RandomCropTensorDict(2))


# ---------------------------------------------------------------------- Stack
def test_stack_observations_and_unstack_actions():
    base = TwoAgentEnv([2])
    env = TransformedEnv(base, Stack([("agent_0", "obs"), ("agent_1", "obs")], "obs_all",
                                     in_key_inv="acts", out_keys_inv=["act_0", "act_1"], dim=-2))
    assert env.observation_spec["obs_all"].shape == (2, 2, 2)
    assert ("agent_0", "obs") not in env.observation_spec.keys(include_nested=True)
    assert set(env.full_action_spec.keys()) == {"acts"} and env.full_action_spec["acts"].shape == (2, 2, 1)
    td = env.reset()
    acts = torch.tensor([[[0.5], [-0.25]], [[1.0], [0.0]]])  # [batch, agent, 1]
    td["acts"] = acts
    out = env.step(td)
    a0, a1 = base.actions_seen[-1]
    assert a0.equal(acts[:, 0]) and a1.equal(acts[:, 1])
    # obs of agent i after one step: [count, its action]
    expected = torch.stack([torch.cat([torch.ones(2, 1), acts[:, i]], -1) for i in (0, 1)], -2)
    assert out["next", "obs_all"].equal(expected)
    torch.testing.assert_close(out["next", "reward"], acts[:, 0] + acts[:, 1])


def test_stack_tensordicts_keep_keys_and_forward():
    env = TransformedEnv(TwoAgentEnv([3]), Stack(["agent_0", "agent_1"], "agents", del_keys=False))
    td = env.rollout(2)
    assert td["agents", "obs"].shape == (3, 2, 2, 2)  # [batch, time, agent, 2]
    assert td["agents", "obs"][..., 1, :].equal(td["agent_1", "obs"])
    data = TwoAgentEnv([3]).rollout(2)
    before = data.clone()
    out = Stack([("agent_0", "obs"), ("agent_1", "obs")], "o", dim=-1)(data)  # root and "next"
    assert out["o"].shape == (3, 2, 2, 2)
    assert out["next", "o"][..., 0].equal(before["next", "agent_0", "obs"])
    assert out["o"][..., 1].equal(before["agent_1", "obs"])
    assert ("agent_0", "obs") not in out.keys(include_nested=True)


def test_stack_bad_input():
    with pytest.raises(ValueError, match="dim=0 must be negative"):
        Stack(["a", "b"], "ab", dim=0)
    with pytest.raises(ValueError, match="in_key_inv and out_keys_inv together"):
        Stack(["a", "b"], "ab", in_key_inv="x")
    with pytest.raises(ValueError, match="specs of .* differ"):
        TransformedEnv(PixelToyEnv(), Stack(["observation", "pixels"], "both"))
    with pytest.raises(KeyError, match="'agent_2'"):
        TransformedEnv(TwoAgentEnv(), Stack(["agent_0", "agent_2"], "agents"))
    td = TensorDict(a=torch.zeros(2, 3), b=torch.ones(2, 4), batch_size=[2])
    with pytest.raises(ValueError, match="cannot be stacked"):
        Stack(["a", "b"], "ab")(td)
    assert set(td.keys()) == {"a", "b"}  # unchanged
    t = Stack(["a"], "s", in_key_inv="acts", out_keys_inv=["x", "y"])
    with pytest.raises(ValueError, match="has 3 entries along dim -1, expected 2"):
        t.inv(TensorDict(acts=torch.zeros(2, 3), batch_size=[2]))


# ---------------------------------------------------------------------- FlattenAction
def test_flatten_action_inverse_and_forward():
    base = PixelToyEnv(batch_size=[2], continuous=True)
    base.action_spec = Bounded(torch.linspace(-6, -1, 6).reshape(2, 3), 1.0, shape=(2, 2, 3))
    env = TransformedEnv(base, FlattenAction())
    spec = env.action_spec
    assert spec.shape == (2, 6) and spec.low[0].tolist() == torch.linspace(-6, -1, 6).tolist()
    td = env.reset()
    flat = torch.arange(12.0).reshape(2, 6) / 20 - 0.3
    td["action"] = flat
    env.step(td)
    assert base.actions_seen[-1].equal(flat.reshape(2, 2, 3))
    sample = TensorDict(action=torch.arange(24.0).reshape(4, 2, 3), batch_size=[4])
    assert env.transform.clone()(sample)["action"].equal(torch.arange(24.0).reshape(4, 6))


def test_flatten_action_bad_input():
    with pytest.raises(ValueError, match="must be negative"):
        FlattenAction(0, 1)
    with pytest.raises(ValueError, match="must come before"):
        FlattenAction(-1, -2)
    with pytest.raises(ValueError, match=r"action_shape must be 2 positive sizes"):
        FlattenAction(action_shape=[6])
    with pytest.raises(RuntimeError, match="action shape is not known"):
        FlattenAction().inv(TensorDict(action=torch.zeros(6), batch_size=[]))
    with pytest.raises(ValueError, match=r"'action' of shape \[5\] must have 6 entries"):
        FlattenAction(action_shape=[2, 3]).inv(TensorDict(action=torch.zeros(5), batch_size=[]))
    with pytest.raises(ValueError, match=r"do not fit the action 'action' of shape \[1\]"):
        TransformedEnv(PendulumEnv(seed=0), FlattenAction())
    base = PixelToyEnv(onehot=True)
    base.action_spec = OneHot(3, shape=(2, 3))
    with pytest.raises(TypeError, match="OneHot spec; only Bounded and Unbounded"):
        TransformedEnv(base, FlattenAction())


# ---------------------------------------------------------------------- RemoveEmptySpecs
class _EmptyRewardEnv(EmptySpecsEnv):
    """Also an empty reward Composite: the bare env cannot even be rolled out."""

    def __init__(self, batch_size=()):
        super().__init__(batch_size)
        bs = self.batch_size
        self.reward_spec = Composite(reward=self.reward_spec.clone(), other_reward=Composite(shape=bs), shape=bs)

    def _step(self, tensordict):
        out = super()._step(tensordict)
        out["other_reward"] = TensorDict({}, batch_size=self.batch_size)
        return out


def test_remove_empty_specs_specs_data_and_inputs():
    base = _EmptyRewardEnv([2])
    env = TransformedEnv(base, RemoveEmptySpecs())
    assert "other" not in env.observation_spec.keys()
    assert list(env.full_reward_spec.keys()) == ["reward"]
    assert list(env.full_state_spec.keys()) == []
    check_env_specs(env)
    td = env.rollout(4)
    assert "other" not in td.keys() and "other_reward" not in td["next"].keys()
    assert base.memory_seen and all(base.memory_seen)  # the empty input is put back for the env
    # forward removes empty sub-TensorDicts at any depth and keeps the rest
    data = TensorDict({"a": torch.zeros(2), "b": {"c": {}}, "d": {"e": torch.ones(2), "f": {}}}, batch_size=[2])
    out = RemoveEmptySpecs()(data)
    assert set(out.keys(include_nested=True, leaves_only=True)) == {"a", ("d", "e")}
    assert "b" not in out.keys() and "f" not in out["d"].keys()


# ---------------------------------------------------------------------- ModuleTransform
def _embed_spec(spec):
    spec["embed"] = Unbounded(shape=(*spec.shape, 5))
    return spec


def test_module_transform_outputs_and_grad():
    from steersman.tensordict.nn import TensorDictModule

    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 5)
    t = ModuleTransform(module=TensorDictModule(lin, in_keys=["observation"], out_keys=["embed"]), no_grad=True,
                        observation_spec_transform=_embed_spec)
    env = TransformedEnv(PendulumEnv(batch_size=[2], seed=0), t)
    check_env_specs(env)
    td = env.rollout(3)
    torch.testing.assert_close(td["next", "embed"], lin(td["next", "observation"]).detach())
    torch.testing.assert_close(td["embed"], lin(td["observation"]).detach())  # reset outputs too
    assert not td["next", "embed"].requires_grad
    # without no_grad the module's graph is kept; forward applies it on a TensorDict
    t2 = ModuleTransform(module_factory=lambda: TensorDictModule(lin, in_keys=["x"], out_keys=["y"]))
    out = t2(TensorDict(x=torch.ones(4, 3), batch_size=[4]))
    assert out["y"].requires_grad


def test_module_transform_inverse_and_spec_replacement():
    from steersman.tensordict.nn import TensorDictModule

    base = PixelToyEnv(continuous=True)
    halve = TensorDictModule(lambda a: a * 0.5, in_keys=["action"], out_keys=["action"])
    new_action = Composite(action=Bounded(-2.0, 2.0, shape=(2,)), shape=())
    env = TransformedEnv(base, ModuleTransform(module=halve, inverse=True, action_spec_transform=new_action))
    assert env.action_spec.high.tolist() == [2.0, 2.0]
    td = env.reset()
    td["action"] = torch.tensor([2.0, -1.0])
    env.step(td)
    assert base.actions_seen[-1].tolist() == [1.0, -0.5]
    check_env_specs(env)


def test_module_transform_bad_input():
    from steersman.tensordict.nn import TensorDictModule

    mod = TensorDictModule(torch.nn.Linear(3, 5), in_keys=["observation"], out_keys=["embed"])
    with pytest.raises(ValueError, match="exactly one of module and module_factory"):
        ModuleTransform()
    with pytest.raises(ValueError, match="use_ray_service=True"):
        ModuleTransform(module=mod, use_ray_service=True)
    with pytest.raises(TypeError, match="observation_spec_transform must be a Composite or a callable"):
        ModuleTransform(module=mod, observation_spec_transform=3)
    with pytest.raises(ValueError, match=r"observation_spec_transform must give a Composite of shape \[2\]"):
        TransformedEnv(PendulumEnv(batch_size=[2], seed=0),
                       ModuleTransform(module=mod, observation_spec_transform=lambda s: Composite()))


# ---------------------------------------------------------------------- BurnInTransform
def _accumulator():
    from steersman.tensordict.nn import TensorDictModule

    # a sequence module: h_{t+1} = 0.5 * h_t + o_t from the stored first state, plus a feature
    def step(h, o):
        out, cur = [], h[..., 0, :]
        for t in range(o.shape[-2]):
            cur = 0.5 * cur + o[..., t, :]
            out.append(cur)
        return torch.stack(out, -2), o * 2

    return TensorDictModule(step, in_keys=["hidden", "observation"], out_keys=[("next", "hidden"), "feature"])


def test_burn_in_reference():
    torch.manual_seed(0)
    obs = torch.randn(3, 7, 2)
    stale = torch.randn(3, 7, 2)
    td = TensorDict(observation=obs, hidden=stale, batch_size=[3, 7])
    t = BurnInTransform([_accumulator()], burn_in=4)
    assert t.out_keys == ["hidden"]
    out = t(td)
    assert out.batch_size == (3, 3)
    h = stale[:, 0]
    for s in range(4):
        h = 0.5 * h + obs[:, s]
    torch.testing.assert_close(out["hidden"][:, 0], h)
    assert out["hidden"][:, 1:].equal(stale[:, 5:])  # later steps keep their stored states
    assert out["observation"].equal(obs[:, 4:])
    assert "feature" not in out.keys()  # only the carried states are written
    assert td["hidden"].equal(stale)  # the sample itself is untouched


def test_burn_in_bad_input():
    with pytest.raises(ValueError, match="burn_in must be a positive int"):
        BurnInTransform([_accumulator()], burn_in=0)
    from steersman.tensordict.nn import TensorDictModule

    with pytest.raises(ValueError, match="write no \\('next', key\\) entry"):
        BurnInTransform([TensorDictModule(torch.neg, in_keys=["a"], out_keys=["b"])], burn_in=2)
    td = TensorDict(observation=torch.zeros(2, 3, 2), hidden=torch.zeros(2, 3, 2), batch_size=[2, 3])
    with pytest.raises(ValueError, match="burn_in=3 leaves no step of sequences of length 3"):
        BurnInTransform([_accumulator()], burn_in=3)(td)
    with pytest.raises(ValueError, match="cannot be used in an env"):
        TransformedEnv(PendulumEnv(seed=0), BurnInTransform([_accumulator()], burn_in=2))
