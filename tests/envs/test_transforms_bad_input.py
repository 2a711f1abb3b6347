"""Bad input: inconsistent transforms are caught by ``check_env_specs`` (key named), wrong keys
raise ``KeyError`` naming the transform and the key, bad arguments fail at construction."""

from __future__ import annotations

import pytest
import torch

from steersman import TensorDict
from steersman.data import Unbounded
from steersman.envs import CartPoleEnv, check_env_specs
from steersman.envs.transforms import (
    ActionMask,
    BatchSizeTransform,
    CatFrames,
    CatTensors,
    CenterCrop,
    Compose,
    DTypeCastTransform,
    ExcludeTransform,
    FrameSkipTransform,
    GrayScale,
    InitTracker,
    NoopResetEnv,
    ObservationNorm,
    ObservationTransform,
    RenameTransform,
    Resize,
    RewardClipping,
    RewardScaling,
    RewardSum,
    SelectTransform,
    SqueezeTransform,
    StepCounter,
    TargetReturn,
    TimeMaxPool,
    ToTensorImage,
    Transform,
    TransformedEnv,
    UnsqueezeTransform,
    VecNorm,
)
from tests.envs._transform_envs import PixelToyEnv


# ---------------------------------------------------------------------- specs vs data
class _WrongDtype(ObservationTransform):
    """Writes int64 counts but declares them float32."""

    def _apply_transform(self, x):
        return (x * 100).long()


class _WrongShape(ObservationTransform):
    """Declares the spec unchanged but doubles the last dim."""

    def _apply_transform(self, x):
        return torch.cat([x, x], -1)


class _Undeclared(Transform):
    """Writes a new entry without declaring it."""

    def _step(self, td, next_td):
        next_td.set("secret", torch.zeros(*next_td.batch_size, 1))
        return next_td

    def _reset(self, td, td_reset):
        td_reset.set("secret", torch.zeros(*td_reset.batch_size, 1))
        return td_reset


class _DeclaredNotWritten(Transform):
    """Declares an observation it never writes."""

    def transform_observation_spec(self, observation_spec):
        observation_spec.set("ghost", Unbounded((*observation_spec.shape, 2)))
        return observation_spec


class _OutOfBounds(ObservationTransform):
    """Scales the observation but keeps the old (Bounded) spec."""

    def _apply_transform(self, x):
        return x * 1000


@pytest.mark.parametrize("batch_size", [(), (3,)])
@pytest.mark.parametrize("transform, pattern", [
    (lambda: _WrongDtype(in_keys=["observation"]), r"key (\('next', )?'observation'\)? has dtype torch.int64"),
    (lambda: _WrongShape(in_keys=["observation"]), r"key (\('next', )?'observation'\)? has shape"),
    (lambda: _Undeclared(), r"key (\('next', )?'secret'\)? is in the rollout but in no spec"),
    (lambda: _DeclaredNotWritten(), r"key (\('next', )?'ghost'\)? is declared in the specs but missing"),
    (lambda: _OutOfBounds(in_keys=["observation"]), r"key (\('next', )?'observation'\)? holds values outside its spec"),
], ids=["dtype", "shape", "undeclared", "not-written", "bounds"])
def test_check_env_specs_names_the_key(transform, pattern, batch_size):
    env = TransformedEnv(PixelToyEnv(batch_size), transform())
    with pytest.raises(AssertionError, match=pattern):
        check_env_specs(env)


def test_check_env_specs_catches_a_wrong_reward_spec():
    class HalfReward(Transform):
        def _apply_transform(self, x):
            return x.half()

    env = TransformedEnv(CartPoleEnv(seed=0), HalfReward(in_keys=["reward"]))
    with pytest.raises(AssertionError, match=r"\('next', 'reward'\) has dtype torch.float16"):
        check_env_specs(env)


# ---------------------------------------------------------------------- wrong keys
@pytest.mark.parametrize("make, key", [
    (lambda: ObservationNorm(loc=0.0, scale=1.0, in_keys=["obz"]), "obz"),
    (lambda: VecNorm(in_keys=["obz"]), "obz"),
    (lambda: RewardSum(in_keys=["rew"]), "rew"),
    (lambda: TargetReturn(1.0, in_keys=["rew"]), "rew"),
    (lambda: RewardScaling(1.0, 2.0, in_keys=["rew"]), "rew"),
    (lambda: RewardClipping(0.0, 1.0, in_keys=["rew"]), "rew"),
    (lambda: CatTensors(["observation", "nope"], "x"), "nope"),
    (lambda: CatFrames(2, -1, in_keys=["obz"]), "obz"),
    (lambda: TimeMaxPool(["obz"]), "obz"),
    (lambda: UnsqueezeTransform(-1, in_keys=["obz"]), "obz"),
    (lambda: UnsqueezeTransform(-1, in_keys_inv=["act"]), "act"),
    (lambda: SqueezeTransform(-1, in_keys=["obz"]), "obz"),
    (lambda: RenameTransform(["obz"], ["o"]), "obz"),
    (lambda: ExcludeTransform("obz"), "obz"),
    (lambda: SelectTransform("obz"), "obz"),
    (lambda: ToTensorImage(), "pixels"),
    (lambda: Resize(4), "pixels"),
    (lambda: GrayScale(), "pixels"),
    (lambda: CenterCrop(4), "pixels"),
    (lambda: DTypeCastTransform(torch.float32, torch.float64, in_keys=["obz"]), "obz"),
    (lambda: ActionMask(), "action_mask"),
    (lambda: ActionMask(action_key="act", mask_key="observation"), "act"),
])
def test_wrong_in_keys_in_env(make, key):
    t = make()
    with pytest.raises(KeyError, match=rf"{type(t).__name__}.*'{key}'"):
        TransformedEnv(CartPoleEnv(seed=0), t)


@pytest.mark.parametrize("make, key", [
    (lambda: ObservationNorm(loc=0.0, scale=1.0, in_keys=["obz"]), "obz"),
    (lambda: VecNorm(in_keys=["obz"]), "obz"),
    (lambda: RewardSum(in_keys=["rew"]), "rew"),
    (lambda: RewardScaling(1.0, 2.0, in_keys=["rew"]), "rew"),
    (lambda: CatTensors(["observation", "nope"], "x"), "nope"),
    (lambda: CatFrames(2, -1, in_keys=["obz"]), "obz"),
    (lambda: RenameTransform(["obz"], ["o"]), "obz"),
    (lambda: ToTensorImage(), "pixels"),
    (lambda: Compose(StepCounter(), Resize(4)), "pixels"),
])
def test_wrong_in_keys_in_forward(make, key):
    t = make()
    td = CartPoleEnv(batch_size=[2], seed=0).rollout(3)
    name = type(t[-1] if isinstance(t, Compose) else t).__name__
    with pytest.raises(KeyError, match=rf"{name}.*'{key}'"):
        t(td)


def test_missing_action_for_inverse_names_the_key():
    env = TransformedEnv(CartPoleEnv(seed=0), RenameTransform([], [], in_keys_inv=["action"],
                                                              out_keys_inv=["act"]))
    td = env.reset()
    td["action"] = torch.tensor(0)  # the policy must write "act"
    with pytest.raises(KeyError, match=r"RenameTransform.*'act'"):
        env.step(td)


# ---------------------------------------------------------------------- state entries
def test_cannot_exclude_a_state_entry():
    with pytest.raises(ValueError, match="'step_count' is also a state entry"):
        TransformedEnv(CartPoleEnv(), Compose(StepCounter(), ExcludeTransform("step_count")))


def test_in_place_transform_of_a_state_entry_without_inverse():
    with pytest.raises(ValueError, match=r"VecNorm: 'step_count' is also a state entry"):
        TransformedEnv(CartPoleEnv(), Compose(StepCounter(), VecNorm(in_keys=["step_count"])))


def test_in_place_transform_of_a_state_entry_with_inverse():
    env = TransformedEnv(CartPoleEnv(batch_size=[2], seed=0), Compose(
        StepCounter(max_steps=3), DTypeCastTransform(torch.int64, torch.float32, in_keys=["step_count"]),
        RenameTransform(["step_count"], ["t"])))
    check_env_specs(env, max_steps=8)
    td = env.rollout(5, break_when_any_done=False)
    assert td["next", "t"][0].squeeze(-1).tolist() == [1.0, 2.0, 3.0, 1.0, 2.0]


# ---------------------------------------------------------------------- arguments
@pytest.mark.parametrize("make, exc, pattern", [
    (lambda: CatFrames(0, -1), ValueError, "N must be a positive int"),
    (lambda: CatFrames(2, 0), ValueError, "dim must be a negative int"),
    (lambda: CatFrames(2, -1, padding="reflect"), ValueError, "padding"),
    (lambda: UnsqueezeTransform(1, in_keys=["observation"]), ValueError, "dim must be a negative int"),
    (lambda: UnsqueezeTransform(-1), ValueError, "needs in_keys"),
    (lambda: CatTensors(["a"], dim=0), ValueError, "dim must be negative"),
    (lambda: CatTensors(None), ValueError, "needs in_keys"),
    (lambda: StepCounter(max_steps=0), ValueError, "max_steps"),
    (lambda: RewardClipping(1.0, 0.0), ValueError, "clamp_min"),
    (lambda: RewardScaling(0.0, 0.0, standard_normal=True), ValueError, "nonzero"),
    (lambda: TargetReturn(1.0, mode="sum"), ValueError, "mode"),
    (lambda: FrameSkipTransform(0), ValueError, "frame_skip"),
    (lambda: NoopResetEnv(noops=0), ValueError, "noops"),
    (lambda: Resize(4, interpolation="lanczos"), ValueError, "interpolation"),
    (lambda: BatchSizeTransform(), ValueError, "exactly one"),
    (lambda: VecNorm(decay=0.0), ValueError, "decay"),
    (lambda: TimeMaxPool(T=0), ValueError, "T must be"),
    (lambda: RenameTransform(["a", "b"], ["c"]), ValueError, "different lengths"),
    (lambda: ObservationNorm(in_keys=[3]), TypeError, "not a key"),
    (lambda: DTypeCastTransform("float", torch.float32), TypeError, "torch.dtype"),
    (lambda: Compose(StepCounter(), object()), TypeError, "Compose takes Transforms"),
    (lambda: SelectTransform("a", keep_dones=False), ValueError, "done entries"),
])
def test_bad_arguments(make, exc, pattern):
    with pytest.raises(exc, match=pattern):
        make()


def test_bad_env_and_transform_types():
    with pytest.raises(TypeError, match="wraps an EnvBase"):
        TransformedEnv(object())
    with pytest.raises(TypeError, match="must be a Transform"):
        TransformedEnv(CartPoleEnv(), lambda td: td)
    env = TransformedEnv(CartPoleEnv())
    with pytest.raises(TypeError, match="takes a Transform"):
        env.append_transform("StepCounter")


def test_batch_size_mismatch():
    with pytest.raises(ValueError, match="different numbers of sub-envs"):
        TransformedEnv(CartPoleEnv(batch_size=[4]), BatchSizeTransform([3]))


def test_image_shape_errors():
    with pytest.raises(ValueError, match="expected 3 channels"):
        TransformedEnv(PixelToyEnv(), GrayScale())  # HWC, not CHW
    with pytest.raises(ValueError, match="cannot crop"):
        TransformedEnv(PixelToyEnv(), Compose(ToTensorImage(), CenterCrop(20)))
    with pytest.raises(ValueError, match="cannot squeeze dim -1"):
        TransformedEnv(CartPoleEnv(), SqueezeTransform(-1, in_keys=["observation"]))


def test_observation_norm_uninitialized():
    env = TransformedEnv(CartPoleEnv(), ObservationNorm())
    with pytest.raises(RuntimeError, match="init_stats"):
        env.reset()
    with pytest.raises(RuntimeError, match="inside a TransformedEnv"):
        ObservationNorm().init_stats(10)
    with pytest.raises(ValueError, match="cat_dim"):
        env.transform.init_stats(10, reduce_dim=(0, 1))


def test_env_level_transforms_outside_env():
    td = TensorDict(action=torch.zeros(2, dtype=torch.long), batch_size=[2])
    assert FrameSkipTransform(2)(td) is td  # forward is the identity
    with pytest.raises(RuntimeError, match="inside a TransformedEnv"):
        FrameSkipTransform(2)._step(td, td.clone())


def test_reward_sum_forward_needs_rewards():
    td = TensorDict(observation=torch.zeros(3, 4), batch_size=[3])
    with pytest.raises(KeyError, match=r"RewardSum.*\('next', 'reward'\)"):
        RewardSum()(td)


def test_init_tracker_is_not_a_key_error_on_clean_data():
    td = TensorDict(observation=torch.zeros(3, 4), batch_size=[3])
    assert InitTracker()(td)["is_init"].squeeze(-1).tolist() == [True, False, False]


def test_transform_cannot_join_two_envs():
    t = StepCounter()
    env1 = TransformedEnv(CartPoleEnv(), t)
    with pytest.raises(ValueError, match="clone"):
        TransformedEnv(CartPoleEnv(), t)
    env2 = TransformedEnv(CartPoleEnv(), t.clone())
    check_env_specs(env2)
    assert t.container is env1
