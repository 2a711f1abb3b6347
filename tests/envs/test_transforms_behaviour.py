"""What each transform does, beyond spec consistency: counters, resets, statistics, images."""

from __future__ import annotations

import pickle

import pytest
import torch

from steersman import TensorDict
from steersman.envs import CartPoleEnv, PendulumEnv, check_env_specs
from steersman.envs.transforms import (
    ActionMask,
    BatchSizeTransform,
    CatFrames,
    CenterCrop,
    Compose,
    DoubleToFloat,
    FrameSkipTransform,
    GrayScale,
    InitTracker,
    NoopResetEnv,
    ObservationNorm,
    RenameTransform,
    Resize,
    RewardClipping,
    RewardScaling,
    RewardSum,
    StepCounter,
    TargetReturn,
    TimeMaxPool,
    ToTensorImage,
    TransformedEnv,
    UnsqueezeTransform,
    VecNorm,
)
from tests.envs._transform_envs import PixelToyEnv


def _toy(batch_size=(4,), **kw):
    return PixelToyEnv(batch_size, **kw)


# ---------------------------------------------------------------------- counters
class TestStepCounter:
    def test_truncates_at_max_steps_and_restarts(self):
        env = TransformedEnv(CartPoleEnv(batch_size=[3], seed=0, max_episode_steps=None),
                             StepCounter(max_steps=4))
        # CartPole's pole falls in >= 8 steps under any policy pushing one way half the time;
        # a constant-alternating policy keeps it up, so only the counter ends episodes
        def policy(td):
            td["action"] = (td["step_count"].squeeze(-1) % 2).long()
            return td
        td = env.rollout(10, policy, break_when_any_done=False)
        count = td["next", "step_count"].squeeze(-1)
        assert count[0].tolist() == [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
        trunc = td["next", "truncated"].squeeze(-1)
        assert torch.equal(trunc, count == 4)
        assert torch.equal(td["next", "done"].squeeze(-1), td["next", "terminated"].squeeze(-1) | trunc)
        assert td["step_count"][0].squeeze(-1).tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]

    def test_partial_reset_keeps_other_counters(self):
        env = TransformedEnv(_toy((4,)), StepCounter(max_steps=5))  # sub-env i ends after 3 + i steps
        td = env.rollout(12, break_when_any_done=False)
        count = td["next", "step_count"].squeeze(-1)
        assert count[0].tolist() == [1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3]   # terminated at 3
        assert count[1].tolist() == [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4]
        assert count[3].tolist() == [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2]   # truncated at 5
        assert not bool(td["next", "truncated"][0].any())
        assert td["next", "truncated"][3].squeeze(-1).tolist()[4] is True

    def test_adds_truncated_when_missing_and_no_max(self):
        env = TransformedEnv(CartPoleEnv(seed=0), StepCounter())
        assert env.observation_spec["step_count"].dtype == torch.int64
        check_env_specs(env)

    def test_forward_respects_max_steps(self):
        td = TensorDict({"next": {"done": torch.zeros(7, 1, dtype=torch.bool),
                                  "truncated": torch.zeros(7, 1, dtype=torch.bool)}}, batch_size=[7])
        td["next", "done"][2] = True
        out = StepCounter(max_steps=3)(td)
        assert out["step_count"].squeeze(-1).tolist() == [0, 1, 2, 0, 1, 2, 0]
        assert out["next", "truncated"].squeeze(-1).tolist() == [False, False, True, False, False, True, False]


class TestRewardSum:
    def test_partial_reset(self):
        env = TransformedEnv(_toy((4,)), RewardSum())
        td = env.rollout(10, break_when_any_done=False)
        r = td["next", "reward"].squeeze(-1)
        ep = td["next", "episode_reward"].squeeze(-1)
        done = td["next", "done"].squeeze(-1)
        for i in range(4):
            acc = 0.0
            for t in range(10):
                acc += float(r[i, t])
                assert float(ep[i, t]) == pytest.approx(acc)
                assert float(td["episode_reward"][i, t]) == pytest.approx(acc - float(r[i, t]))
                if done[i, t]:
                    acc = 0.0
        # sub-env 0 restarted after 3 steps while sub-env 3 kept summing
        assert float(ep[0, 3]) == pytest.approx(float(r[0, 3]))
        assert float(ep[3, 3]) == pytest.approx(float(r[3, :4].sum()))

    def test_custom_keys(self):
        env = TransformedEnv(CartPoleEnv(seed=0), RewardSum(out_keys=["ret"]))
        check_env_specs(env)
        assert "ret" in env.observation_spec.keys()


class TestInitTracker:
    def test_flags_first_step_per_sub_env(self):
        env = TransformedEnv(_toy((4,)), InitTracker())
        td = env.rollout(8, break_when_any_done=False)
        init = td["is_init"].squeeze(-1)
        assert init[:, 0].all()
        assert init[0].tolist() == [True, False, False, True, False, False, True, False]
        assert init[1].tolist() == [True, False, False, False, True, False, False, False]
        assert not td["next", "is_init"].any()


class TestTargetReturn:
    @pytest.mark.parametrize("mode", ["reduce", "constant"])
    def test_modes(self, mode):
        env = TransformedEnv(_toy((2,)), TargetReturn(10.0, mode=mode))
        td = env.rollout(5, break_when_any_done=False)
        tr = td["next", "target_return"].squeeze(-1)
        if mode == "constant":
            assert bool((tr == 10).all())
        else:
            r = td["next", "reward"].squeeze(-1)
            torch.testing.assert_close(tr[0, :3], 10 - r[0, :3].cumsum(0))
            torch.testing.assert_close(tr[0, 3], 10 - r[0, 3])  # new episode after 3 steps


# ---------------------------------------------------------------------- normalization
class TestObservationNorm:
    def test_init_stats_moments(self):
        env = TransformedEnv(CartPoleEnv(batch_size=[4], seed=3), ObservationNorm(standard_normal=True))
        torch.manual_seed(1)
        env.transform.init_stats(num_iter=30, reduce_dim=(0, 1), cat_dim=1)
        ref = CartPoleEnv(batch_size=[4], seed=3)
        torch.manual_seed(1)
        obs = ref.rollout(30, break_when_any_done=False)["observation"]
        torch.testing.assert_close(env.transform.loc, obs.mean((0, 1)))
        torch.testing.assert_close(env.transform.scale, obs.std((0, 1)))
        # the normalized rollout data has zero mean / unit std
        torch.manual_seed(1)
        env.set_seed(3)
        x = env.rollout(30, break_when_any_done=False)["observation"]
        torch.testing.assert_close(x.mean((0, 1)), torch.zeros(4), atol=1e-5, rtol=0)
        torch.testing.assert_close(x.std((0, 1)), torch.ones(4), atol=1e-4, rtol=0)

    def test_init_stats_not_standard_normal(self):
        env = TransformedEnv(CartPoleEnv(seed=0), ObservationNorm())
        torch.manual_seed(0)
        env.transform.init_stats(num_iter=40, reduce_dim=0)
        assert env.transform.loc.shape == (4,)
        env.set_seed(0)
        torch.manual_seed(0)
        x = env.rollout(40, break_when_any_done=False)["observation"]
        torch.testing.assert_close(x.mean(0), torch.zeros(4), atol=1e-5, rtol=0)
        check_env_specs(env)

    def test_init_stats_keep_dims(self):
        env = TransformedEnv(CartPoleEnv(batch_size=[3], seed=0), ObservationNorm(standard_normal=True))
        env.transform.init_stats(num_iter=10, reduce_dim=(0, 1), cat_dim=1, keep_dims=(1,))
        assert env.transform.loc.shape == (1, 4)
        check_env_specs(env)

    def test_init_stats_collects_num_iter_samples(self):
        env = TransformedEnv(CartPoleEnv(seed=0), Compose(StepCounter(), ObservationNorm(
            in_keys=["step_count"], standard_normal=True)))
        env.transform[1].init_stats(num_iter=7, reduce_dim=0)
        # counts 0..6 of one 7-step rollout (CartPole runs >= 7 steps)
        assert float(env.transform[1].loc) == pytest.approx(3.0)

    def test_spec_bounds_follow_the_map(self):
        env = TransformedEnv(PendulumEnv(seed=0), ObservationNorm(loc=1.0, scale=-2.0))
        spec = env.observation_spec["observation"]
        torch.testing.assert_close(spec.low, torch.tensor([-1.0, -1.0, -15.0]))
        torch.testing.assert_close(spec.high, torch.tensor([3.0, 3.0, 17.0]))
        check_env_specs(env)

    def test_inverse_on_actions(self):
        base = PendulumEnv(seed=0)
        env = TransformedEnv(base, ObservationNorm(loc=0.0, scale=2.0, in_keys=[], in_keys_inv=["action"]))
        assert float(env.action_spec.high) == 4.0
        seen = []
        orig = base._step
        base._step = lambda td: (seen.append(td["action"].clone()), orig(td))[1]
        td = env.reset()
        td["action"] = torch.tensor([4.0])
        env.step(td)
        assert float(seen[0]) == 2.0 and float(td["action"]) == 4.0  # caller's td untouched


class TestVecNorm:
    def test_matches_exact_stats_without_decay(self):
        vn = VecNorm(decay=1.0, eps=0.0)
        env = TransformedEnv(_toy((1,)), vn)  # obs [c, -c, 0] at step count c; episodes of 3 steps
        td = env.rollout(6, break_when_any_done=False)
        # seen: 3 resets (count 0: the first and two partial ones) and 6 steps (counts 1, 2, 3 twice)
        counts = torch.tensor([0.0, 1, 2, 3, 0, 1, 2, 3, 0])
        raw = torch.stack([counts, -counts, torch.zeros(9)], -1)
        sd = vn.state_dict()
        assert float(sd["vn_count_observation"]) == 9
        torch.testing.assert_close(sd["vn_sum_observation"], raw.sum(0))
        torch.testing.assert_close(sd["vn_ssq_observation"], (raw * raw).sum(0))
        # the last step was normalized with the stats including it
        mean, var = raw[:8].mean(0), raw[:8].var(0, unbiased=False)
        expected = (raw[7] - mean) / var.clamp_min(0).sqrt()
        torch.testing.assert_close(td["next", "observation"][0, -1, :2], expected[:2])

    def test_no_leakage_from_evaluation(self):
        vn = VecNorm(decay=0.99)
        train = TransformedEnv(CartPoleEnv(batch_size=[4], seed=0), vn)
        train.rollout(10, break_when_any_done=False)
        snap = {k: v.clone() for k, v in vn.state_dict().items()}

        def unchanged():
            return all(torch.equal(snap[k], v) for k, v in vn.state_dict().items())

        frozen = vn.frozen_copy()
        TransformedEnv(CartPoleEnv(batch_size=[4], seed=1), frozen).rollout(10, break_when_any_done=False)
        assert unchanged()
        obs_norm = vn.to_observation_norm()
        TransformedEnv(CartPoleEnv(batch_size=[4], seed=2), obs_norm).rollout(10, break_when_any_done=False)
        assert unchanged()
        vn.eval()
        train.rollout(10, break_when_any_done=False)
        assert unchanged()
        vn.train()
        # the frozen copy shares the statistics: it sees the new training updates
        train.rollout(5, break_when_any_done=False)
        assert not unchanged()
        assert all(torch.equal(a, b) for a, b in zip(vn.state_dict().values(), frozen.state_dict().values()))
        assert frozen.frozen and not vn.frozen

    def test_frozen_copy_and_obs_norm_agree(self):
        vn = VecNorm(decay=0.9)
        env = TransformedEnv(CartPoleEnv(batch_size=[4], seed=0), vn)
        env.rollout(10, break_when_any_done=False)
        x = TensorDict(observation=torch.randn(5, 4), batch_size=[5])
        a = vn.frozen_copy()(x.clone())["observation"]
        b = vn.to_observation_norm()(x.clone())["observation"]
        torch.testing.assert_close(a, b)

    def test_state_dict_roundtrip(self):
        vn = VecNorm()
        TransformedEnv(CartPoleEnv(batch_size=[2], seed=0), vn).rollout(5)
        fresh = VecNorm()
        fresh.load_state_dict(vn.state_dict())
        x = TensorDict(observation=torch.randn(3, 4), batch_size=[3])
        torch.testing.assert_close(fresh.eval()(x.clone())["observation"], vn.eval()(x.clone())["observation"])


# ---------------------------------------------------------------------- frames
class TestCatFrames:
    def test_reset_and_shift(self):
        env = TransformedEnv(_toy((4,)), CatFrames(3, -1, in_keys=["observation"]))
        td = env.reset()
        x = td["observation"]
        assert x.shape == (4, 9)
        assert torch.equal(x[:, :3], x[:, 6:]) and torch.equal(x[:, 3:6], x[:, 6:])
        td["action"] = torch.zeros(4, dtype=torch.long)
        td = env.step(td)
        y = td["next", "observation"]
        assert torch.equal(y[:, :6], x[:, 3:])

    def test_partial_reset_restarts_only_reset_sub_envs(self):
        base = _toy((4,))
        env = TransformedEnv(base, CatFrames(2, -1, in_keys=["observation"]))
        td = env.rollout(4, break_when_any_done=False)
        # sub-env 0 ended at step 3 (index 2): its next root stack (step index 3) restarts
        first_after = td["observation"][0, 3]
        assert torch.equal(first_after[:3], first_after[3:])
        other = td["observation"][3, 3]
        assert not torch.equal(other[:3], other[3:])
        assert torch.equal(other[:3], td["observation"][3, 2][3:])

    def test_constant_padding(self):
        env = TransformedEnv(_toy((2,)), CatFrames(3, -1, in_keys=["observation"], padding="constant",
                                                    padding_value=-5.0))
        x = env.reset()["observation"]
        assert bool((x[:, :6] == -5).all())
        check_env_specs(env)

    def test_pixels(self):
        env = TransformedEnv(_toy((2,)), Compose(ToTensorImage(), CatFrames(4, -3)))
        assert env.reset()["pixels"].shape == (2, 12, 8, 10)

    def test_step_before_reset(self):
        env = TransformedEnv(_toy((2,)), CatFrames(2, -1, in_keys=["observation"]))
        td = TensorDict(action=torch.zeros(2, dtype=torch.long), batch_size=[2])
        with pytest.raises(RuntimeError, match="reset"):
            env.step(td)


class TestTimeMaxPool:
    def test_max_of_last_frames(self):
        env = TransformedEnv(_toy((1,)), TimeMaxPool(["observation"], ["pool"], T=2))
        td = env.rollout(3, break_when_any_done=False)
        obs = td["next", "observation"][0]
        pool = td["next", "pool"][0]
        torch.testing.assert_close(pool[1], torch.maximum(obs[0], obs[1]))
        torch.testing.assert_close(pool[0], torch.maximum(td["observation"][0, 0], obs[0]))


# ---------------------------------------------------------------------- images
class TestImages:
    def test_to_tensor_image(self):
        env = TransformedEnv(_toy((2,)), ToTensorImage())
        td = env.reset()
        raw = PixelToyEnv((2,)).reset()["pixels"]
        x = td["pixels"]
        assert x.shape == (2, 3, 8, 10) and x.dtype == torch.float32
        torch.testing.assert_close(x, raw.permute(0, 3, 1, 2).float() / 255)
        spec = env.observation_spec["pixels"]
        assert spec.shape == (2, 3, 8, 10) and float(spec.high.max()) == 1.0

    @pytest.mark.parametrize("interpolation", ["bilinear", "nearest", "bicubic", "area"])
    def test_resize(self, interpolation):
        env = TransformedEnv(_toy((2,)), Compose(ToTensorImage(), Resize(4, 6, interpolation)))
        assert env.reset()["pixels"].shape == (2, 3, 4, 6)
        assert env.observation_spec["pixels"].shape == (2, 3, 4, 6)
        check_env_specs(env)

    def test_resize_nearest_values(self):
        img = torch.arange(16.0).reshape(1, 1, 4, 4)
        out = Resize(2, interpolation="nearest")(TensorDict(pixels=img, batch_size=[1]))["pixels"]
        assert out[0, 0].tolist() == [[0.0, 2.0], [8.0, 10.0]]

    def test_grayscale(self):
        img = torch.zeros(1, 3, 2, 2)
        img[0, 0] = 1.0
        out = GrayScale()(TensorDict(pixels=img, batch_size=[1]))["pixels"]
        assert out.shape == (1, 1, 2, 2)
        torch.testing.assert_close(out, torch.full((1, 1, 2, 2), 0.2989))

    def test_center_crop(self):
        env = TransformedEnv(_toy((2,)), Compose(ToTensorImage(), CenterCrop(4, 6)))
        x = env.reset()["pixels"]
        full = TransformedEnv(_toy((2,)), ToTensorImage()).reset()["pixels"]
        assert x.shape == (2, 3, 4, 6)
        torch.testing.assert_close(x, full[..., 2:6, 2:8])

    def test_image_stack_on_uint8(self):
        env = TransformedEnv(_toy((3,)), Compose(
            ToTensorImage(from_int=False, dtype=torch.uint8), GrayScale(), Resize(4, 5, "nearest")))
        x = env.reset()["pixels"]
        assert x.shape == (3, 1, 4, 5) and x.dtype == torch.uint8
        check_env_specs(env)


# ---------------------------------------------------------------------- rewards and dtypes
class TestRewardMaps:
    def test_scaling_and_clipping(self):
        env = TransformedEnv(_toy((2,)), Compose(RewardScaling(loc=-1.0, scale=2.0), RewardClipping(0.0, 0.3)))
        td = env.rollout(4, break_when_any_done=False)
        raw = TransformedEnv(_toy((2,))).rollout(4, break_when_any_done=False)["next", "reward"]
        torch.testing.assert_close(td["next", "reward"], (raw * 2 - 1).clamp(0, 0.3))
        spec = env.reward_spec
        assert float(spec.low.min()) == 0.0 and float(spec.high.max()) == pytest.approx(0.3)

    def test_standard_normal_scaling(self):
        t = RewardScaling(loc=1.0, scale=2.0, standard_normal=True)
        out = t(TensorDict(reward=torch.tensor([[3.0]]), batch_size=[1]))
        assert float(out["reward"]) == 1.0


class TestDTypes:
    def test_double_to_float_casts_actions_back(self):
        base = PixelToyEnv((2,), dtype=torch.float64, continuous=True, action_dtype=torch.float64)
        env = TransformedEnv(base, DoubleToFloat())
        assert env.action_spec.dtype == torch.float32
        assert env.observation_spec["observation"].dtype == torch.float32
        td = env.rollout(3)
        assert td["action"].dtype == torch.float32
        assert base.actions_seen[-1].dtype == torch.float64
        assert td["next", "reward"].dtype == torch.float32

    def test_explicit_keys_only(self):
        env = TransformedEnv(CartPoleEnv(seed=0, dtype=torch.float64), DoubleToFloat(in_keys=["observation"]))
        assert env.reward_spec.dtype == torch.float64
        assert env.observation_spec["observation"].dtype == torch.float32

    def test_forward_auto_keys_cast_everything(self):
        td = TensorDict(a=torch.zeros(2, dtype=torch.float64), b=torch.zeros(2, dtype=torch.int64),
                        next={"c": torch.zeros(2, dtype=torch.float64)}, batch_size=[2])
        out = DoubleToFloat()(td)
        assert out["a"].dtype == torch.float32 and out["next", "c"].dtype == torch.float32
        assert out["b"].dtype == torch.int64


# ---------------------------------------------------------------------- env-level transforms
class TestFrameSkip:
    def test_rewards_summed_and_done_kept(self):
        base = _toy((2,))  # sub-env 0 ends after 3 steps, sub-env 1 after 4
        env = TransformedEnv(base, FrameSkipTransform(2))
        td = env.reset()
        td["action"] = torch.zeros(2, dtype=torch.long)
        td = env.step(td)
        r = td["next", "reward"].squeeze(-1)
        torch.testing.assert_close(r, torch.tensor([0.6 + 0.7, 0.6 + 0.7]))
        td = env._step_mdp(td)
        td["action"] = torch.zeros(2, dtype=torch.long)
        td = env.step(td)
        # sub-env 0 terminated at its 3rd step (first repeat): its 4th is not counted
        torch.testing.assert_close(td["next", "reward"].squeeze(-1), torch.tensor([0.8, 0.8 + 0.9]))
        assert td["next", "done"].squeeze(-1).tolist() == [True, True]
        assert float(td["next", "observation"][0, 0]) == 3.0  # obs of its last counted step

    def test_reward_spec_widened(self):
        env = TransformedEnv(_toy((2,)), FrameSkipTransform(3))
        assert float(env.reward_spec.high.max()) == 6.0


class TestNoopReset:
    def test_fixed_noops(self):
        env = TransformedEnv(CartPoleEnv(batch_size=[2], seed=0), StepCounter())
        env = env.append_transform(NoopResetEnv(noops=3, random=False))
        td = env.reset()
        assert td["step_count"].squeeze(-1).tolist() == [3, 3]
        assert not td["done"].any()

    def test_random_noops_seeded(self):
        def counts(seed):
            env = TransformedEnv(CartPoleEnv(seed=0), Compose(StepCounter(), NoopResetEnv(noops=6)))
            env.set_seed(seed)
            return [int(env.reset()["step_count"]) for _ in range(6)]

        a, b = counts(5), counts(5)
        assert a == b and all(0 <= c < 6 for c in a)

    def test_episode_ending_during_noops_resets(self):
        env = TransformedEnv(_toy(()), Compose(StepCounter(), NoopResetEnv(noops=5, random=False)))
        td = env.reset()  # the toy episode ends after 3 steps: reset again, count restarts
        assert int(td["step_count"]) == 0 and not bool(td["done"])


class TestActionMask:
    def test_actions_respect_dynamic_mask(self):
        base = PixelToyEnv((3,), mask="dynamic")
        env = TransformedEnv(base, ActionMask())
        td = env.rollout(20, break_when_any_done=False)
        a = td["action"]
        m = td["action_mask"]
        allowed = m.gather(-1, a.unsqueeze(-1)).squeeze(-1)
        assert bool(allowed.all())
        assert env.action_spec.mask is not None
        assert base.full_action_spec["action"].mask is None  # the base env's spec is untouched

    def test_requires_mask_observation(self):
        with pytest.raises(KeyError, match="ActionMask.*action_mask"):
            TransformedEnv(CartPoleEnv(), ActionMask())


class TestBatchSize:
    def test_reshape_batch(self):
        env = TransformedEnv(_toy((6,)), BatchSizeTransform([2, 3]))
        assert env.batch_size == (2, 3)
        assert env.observation_spec["observation"].shape == (2, 3, 3)
        td = env.rollout(7, break_when_any_done=False)  # partial resets through [2, 3] masks
        assert td.batch_size == (2, 3, 7)
        ref = _toy((6,)).rollout(7, break_when_any_done=False)
        torch.testing.assert_close(td["next", "observation"], ref["next", "observation"].reshape(2, 3, 7, 3))

    def test_composes_with_transforms_on_both_sides(self):
        env = TransformedEnv(_toy((4,)), Compose(
            StepCounter(), BatchSizeTransform([2, 2]), RewardSum(), CatFrames(2, -1, in_keys=["observation"])))
        check_env_specs(env, max_steps=8)
        assert env.rollout(3).batch_size == (2, 2, 3)


# ---------------------------------------------------------------------- TransformedEnv API
class TestTransformedEnv:
    def test_append_insert_and_recompute_specs(self):
        env = TransformedEnv(CartPoleEnv(seed=0))
        assert isinstance(env.transform, Compose) and len(env.transform) == 0
        env.append_transform(StepCounter())
        assert "step_count" in env.observation_spec.keys()
        env.insert_transform(0, RenameTransform(["observation"], ["obs"]))
        assert sorted(env.observation_spec.keys()) == ["obs", "step_count"]
        check_env_specs(env)
        assert [type(t).__name__ for t in env.transform] == ["RenameTransform", "StepCounter"]

    def test_single_transform_kept_then_wrapped(self):
        t = StepCounter()
        env = TransformedEnv(CartPoleEnv(seed=0), t)
        assert env.transform is t and t.container is env and t.parent is not None
        env.append_transform(RewardSum())
        assert isinstance(env.transform, Compose) and env.transform[0] is t
        check_env_specs(env)

    def test_nested_transformed_envs(self):
        inner = TransformedEnv(_toy((3,)), StepCounter(max_steps=4))
        outer = TransformedEnv(inner, Compose(RewardSum(), CatFrames(2, -1, in_keys=["observation"])))
        check_env_specs(outer, max_steps=10)
        assert outer.base_env is inner
        td = outer.rollout(6, break_when_any_done=False)
        assert td["next", "step_count"].max() <= 4

    def test_base_env_attribute_fallthrough(self):
        env = TransformedEnv(CartPoleEnv(seed=0, max_episode_steps=7), StepCounter())
        assert env.max_episode_steps == 7
        with pytest.raises(AttributeError):
            env.no_such_attribute  # noqa: B018

    def test_seeding_reproducible(self):
        env = TransformedEnv(CartPoleEnv(batch_size=[3]), Compose(StepCounter(), RewardSum()))
        env.set_seed(11)
        torch.manual_seed(0)
        a = env.rollout(15, break_when_any_done=False)
        env.set_seed(11)
        torch.manual_seed(0)
        b = env.rollout(15, break_when_any_done=False)
        assert (a == b).all()

    def test_parent_is_env_up_to_transform(self):
        env = TransformedEnv(CartPoleEnv(seed=0), Compose(StepCounter(), RenameTransform(["observation"], ["o"]),
                                                          RewardSum()))
        parent = env.transform[2].parent
        assert sorted(parent.observation_spec.keys()) == ["o", "step_count"]
        assert env.transform[0].parent.observation_spec.keys() == CartPoleEnv().observation_spec.keys()

    def test_inverse_does_not_touch_callers_td(self):
        env = TransformedEnv(CartPoleEnv(seed=0), RenameTransform([], [], in_keys_inv=["action"],
                                                                  out_keys_inv=["act"]))
        td = env.reset()
        td["act"] = torch.tensor(1)
        env.step(td)
        assert "act" in td.keys() and "action" not in td.keys()

    def test_unsqueezed_actions(self):
        env = TransformedEnv(CartPoleEnv(batch_size=[2], seed=0), UnsqueezeTransform(-1, in_keys_inv=["action"]))
        assert env.action_spec.shape == (2, 1)
        assert env.rollout(3)["action"].shape == (2, 3, 1)

    def test_close_closes_base(self):
        base = CartPoleEnv()
        env = TransformedEnv(base, StepCounter())
        env.close()
        assert base.is_closed

    def test_specs_cannot_be_assigned(self):
        env = TransformedEnv(CartPoleEnv(), StepCounter())
        with pytest.raises(AttributeError, match="base env"):
            env.observation_spec = env.base_env.observation_spec

    def test_transform_pickles(self):
        env = TransformedEnv(CartPoleEnv(seed=0), Compose(StepCounter(max_steps=3), VecNorm()))
        env.rollout(3)
        t = pickle.loads(pickle.dumps(env.transform))
        assert t.container is None and t[0].container is t
        env2 = TransformedEnv(CartPoleEnv(seed=0), t)
        check_env_specs(env2)

    def test_compose_slicing(self):
        c = Compose(StepCounter(), RewardSum(), InitTracker())
        assert len(c[1:]) == 2 and c[1:][0] is c[1]
        assert c[1].container is c


# ---------------------------------------------------------------------- batched envs
def test_serial_env_of_transformed_envs():
    from steersman.envs import batched
    from tests.envs._transform_envs import make_toy

    def make():
        return TransformedEnv(make_toy(), Compose(StepCounter(max_steps=3), RewardSum(), InitTracker()))

    env = batched.SerialEnv(3, make)
    try:
        check_env_specs(env, max_steps=8)
        td = env.rollout(6, break_when_any_done=False)
        assert td["next", "step_count"].max() == 3
    finally:
        env.close()


def test_parallel_env_with_transforms():
    from steersman.envs import batched
    from tests.envs._transform_envs import make_cartpole

    base = batched.ParallelEnv(2, make_cartpole)
    try:
        env = TransformedEnv(base, Compose(StepCounter(max_steps=5), RewardSum(), CatFrames(2, -1, in_keys=["observation"])))
        check_env_specs(env, max_steps=8)
    finally:
        base.close()
