"""Transform battery: every transform on an env, on batched envs and on a TensorDict.

Each case is a transform factory and a base env. For every case:

* ``check_env_specs`` passes on the transformed env, unbatched, batched ``[4]`` (with
  partial resets: the toy env's sub-envs end at different steps) and on a ``SerialEnv``;
* the transform, taken out of the env (``clone()``), works in ``forward`` on a
  TensorDict (a rollout of the base env, as a replay sample would be) and its outputs are
  in the transformed env's specs;
* where the transform's inputs stay in the data (distinct ``out_keys``), ``forward`` on
  the transformed env's rollout, with the transform's outputs removed, reproduces them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch

from steersman.data import Unbounded
from steersman.envs import check_env_specs
from steersman.envs.batched import SerialEnv
from steersman.envs.transforms import (
    ActionChunkTransform,
    ActionDiscretizer,
    ActionMask,
    ActionScaling,
    AutoResetTransform,
    BatchSizeTransform,
    BinarizeReward,
    CatFrames,
    CatTensors,
    CenterCrop,
    ClipTransform,
    Compose,
    ConditionalPolicySwitch,
    ConditionalSkip,
    Crop,
    DeviceCastTransform,
    DiscreteActionProjection,
    DoubleToFloat,
    DTypeCastTransform,
    EndOfLifeTransform,
    ExcludeTransform,
    ExpandAs,
    FiniteTensorDictCheck,
    FlattenAction,
    FlattenObservation,
    FrameSkipTransform,
    GrayScale,
    Hash,
    InitTracker,
    LineariseRewards,
    MeanActionSelector,
    ModuleTransform,
    MultiAction,
    NextObservationDelta,
    NoopResetEnv,
    ObservationNorm,
    PermuteTransform,
    PinMemoryTransform,
    PolicyAgeFilter,
    RandomTruncationTransform,
    RemoveEmptySpecs,
    RenameTransform,
    Resize,
    RewardClipping,
    RewardScaling,
    RewardSum,
    RNDTransform,
    SelectTransform,
    SignTransform,
    SqueezeTransform,
    Stack,
    StepCounter,
    SuccessReward,
    TargetReturn,
    TensorDictPrimer,
    TerminateTransform,
    TimeMaxPool,
    Timer,
    ToTensorImage,
    TrajCounter,
    Transform,
    TransformedEnv,
    UnaryTransform,
    UnsqueezeTransform,
    VecGymEnvTransform,
    VecNorm,
    VecNormV2,
    gSDENoise,
)
from tests.envs._transform_envs import make_env


@dataclasses.dataclass
class Case:
    id: str
    env: str
    make: Callable[[], Transform]
    setup: Callable[[TransformedEnv], None] | None = None
    # forward reproduction: (transform in the env, transform for forward, keys compared)
    repro: tuple[Callable[[], Transform], Callable[[], Transform], list] | None = None
    identity_forward: bool = False  # env-level transforms: forward returns the data as is
    env_only: bool = False  # forward on a TensorDict raises a ValueError (the transform reads its env)


def _embed_spec(spec):
    spec["embed"] = Unbounded(shape=(*spec.shape, 5))
    return spec


def _encoder() -> ModuleTransform:
    from steersman.tensordict.nn import TensorDictModule

    torch.manual_seed(0)
    enc = TensorDictModule(torch.nn.Linear(3, 5), in_keys=["observation"], out_keys=["embed"])
    return ModuleTransform(module=enc, no_grad=True, observation_spec_transform=_embed_spec)


def _action_halver() -> ModuleTransform:
    from steersman.tensordict.nn import TensorDictModule

    return ModuleTransform(module=TensorDictModule(lambda a: a * 0.5, in_keys=["action"], out_keys=["action"]),
                           inverse=True)


def _init_stats(env: TransformedEnv) -> None:
    torch.manual_seed(0)
    norm = env.transform
    nb = len(env.base_env.batch_size)
    dims = tuple(range(nb + 1))
    norm.init_stats(num_iter=20, reduce_dim=dims, cat_dim=nb)


def _rnd() -> RNDTransform:
    torch.manual_seed(0)
    return RNDTransform(torch.nn.Linear(4, 6), torch.nn.Linear(4, 6))


def _skip_cond(td):  # one decision for the whole batch (a vectorized env steps all or none)
    return bool(td["action"].mean() > 0.3)


def _zero_action(td):
    return td.set("action", torch.zeros(*td.batch_size, 1))


def _fast(td):  # the switch policy acts while the pendulum turns fast (one decision per batch)
    return bool(td["observation"][..., 2].mean() > 0.5)


def _both(k: str) -> list:
    return [k, ("next", k)]


CASES = [
    Case("step_counter", "cartpole", lambda: StepCounter(max_steps=5),
         repro=(lambda: StepCounter(max_steps=5), lambda: StepCounter(max_steps=5),
                [*_both("step_count"), ("next", "truncated"), ("next", "done")])),
    Case("reward_sum", "toy", lambda: RewardSum(),
         repro=(RewardSum, RewardSum, _both("episode_reward"))),
    Case("primer", "cartpole", lambda: TensorDictPrimer(h=Unbounded(shape=(2, 3)))),
    Case("init_tracker", "toy", lambda: InitTracker(),
         repro=(InitTracker, InitTracker, _both("is_init"))),
    Case("target_return", "toy", lambda: TargetReturn(5.0),
         repro=(lambda: TargetReturn(5.0), lambda: TargetReturn(5.0), _both("target_return"))),
    Case("target_return_constant", "cartpole", lambda: TargetReturn(5.0, mode="constant")),
    Case("double_to_float", "cartpole64", lambda: DoubleToFloat(),
         repro=(lambda: DoubleToFloat(in_keys=["observation"], out_keys=["obs32"]),
                lambda: DoubleToFloat(in_keys=_both("observation"), out_keys=_both("obs32")),
                _both("obs32"))),
    Case("double_to_float_actions", "toy64", lambda: DoubleToFloat()),
    Case("dtype_cast", "cartpole", lambda: DTypeCastTransform(torch.float32, torch.float64,
                                                               in_keys=["observation"])),
    Case("observation_norm", "cartpole", lambda: ObservationNorm(loc=0.5, scale=2.0),
         repro=(lambda: ObservationNorm(loc=0.5, scale=2.0, out_keys=["obs_n"]),
                lambda: ObservationNorm(loc=0.5, scale=2.0, in_keys=_both("observation"),
                                        out_keys=_both("obs_n")),
                _both("obs_n"))),
    Case("observation_norm_init_stats", "cartpole", lambda: ObservationNorm(standard_normal=True),
         setup=_init_stats),
    Case("observation_norm_actions", "pendulum",
         lambda: ObservationNorm(loc=0.0, scale=2.0, in_keys=["observation"], in_keys_inv=["action"])),
    Case("vecnorm", "cartpole", lambda: VecNorm(decay=0.99)),
    Case("reward_scaling", "toy", lambda: RewardScaling(loc=0.5, scale=2.0),
         repro=(lambda: RewardScaling(0.5, 2.0, out_keys=["r2"]),
                lambda: RewardScaling(0.5, 2.0, in_keys=[("next", "reward")], out_keys=[("next", "r2")]),
                [("next", "r2")])),
    Case("reward_clipping", "toy", lambda: RewardClipping(0.0, 0.7)),
    Case("cat_tensors", "cartpole", lambda: Compose(
        StepCounter(), DTypeCastTransform(torch.int64, torch.float32, in_keys=["step_count"]),
        CatTensors(["observation", "step_count"], "state"))),
    Case("cat_frames", "cartpole", lambda: CatFrames(3, -1, in_keys=["observation"]),
         repro=(lambda: CatFrames(3, -1, in_keys=["observation"], out_keys=["stack"]),
                lambda: CatFrames(3, -1, in_keys=["observation"], out_keys=["stack"]),
                _both("stack"))),
    Case("cat_frames_constant", "toy", lambda: CatFrames(2, -1, in_keys=["observation"], padding="constant",
                                                        padding_value=-20.0),
         repro=(lambda: CatFrames(2, -1, in_keys=["observation"], out_keys=["stack"], padding="constant"),
                lambda: CatFrames(2, -1, in_keys=["observation"], out_keys=["stack"], padding="constant"),
                _both("stack"))),
    Case("cat_frames_pixels", "toy", lambda: Compose(ToTensorImage(), CatFrames(2, -3))),
    Case("time_max_pool", "toy", lambda: TimeMaxPool(["observation"], T=3),
         repro=(lambda: TimeMaxPool(["observation"], ["pooled"], T=3),
                lambda: TimeMaxPool(["observation"], ["pooled"], T=3), _both("pooled"))),
    Case("unsqueeze", "cartpole", lambda: UnsqueezeTransform(-2, in_keys=["observation"])),
    Case("unsqueeze_actions", "cartpole", lambda: UnsqueezeTransform(-1, in_keys_inv=["action"])),
    Case("squeeze", "cartpole", lambda: SqueezeTransform(-1, in_keys=["reward"])),
    Case("rename", "cartpole", lambda: RenameTransform(["observation"], ["obs"], in_keys_inv=["action"],
                                                       out_keys_inv=["act"])),
    Case("rename_copy", "toy", lambda: RenameTransform(["observation"], ["obs"], create_copy=True)),
    Case("exclude", "toy", lambda: ExcludeTransform("pixels")),
    Case("select", "toy", lambda: SelectTransform("observation")),
    Case("to_tensor_image", "toy", lambda: ToTensorImage()),
    Case("resize", "toy", lambda: Compose(ToTensorImage(), Resize(4, 6))),
    Case("resize_uint8_nearest", "toy", lambda: Compose(
        ToTensorImage(from_int=False, dtype=torch.uint8), Resize(5, interpolation="nearest"))),
    Case("grayscale", "toy", lambda: Compose(ToTensorImage(), GrayScale())),
    Case("center_crop", "toy", lambda: Compose(ToTensorImage(), CenterCrop(4, 6))),
    Case("frame_skip", "toy", lambda: FrameSkipTransform(2), identity_forward=True),
    Case("noop_reset", "toy", lambda: NoopResetEnv(noops=4), identity_forward=True),
    Case("action_mask", "toy_mask", lambda: ActionMask(), identity_forward=True),
    Case("batch_size", "cartpole", lambda: BatchSizeTransform(reshape_fn=lambda td: td.unsqueeze(-1))),
    Case("clip", "pendulum", lambda: ClipTransform(in_keys=["observation", "reward"], low=-1.0, high=0.1),
         repro=(lambda: ClipTransform(in_keys=["observation"], out_keys=["obs_c"], low=-1.0, high=0.1),
                lambda: ClipTransform(in_keys=["observation"], out_keys=["obs_c"], low=-1.0, high=0.1),
                _both("obs_c"))),
    Case("clip_actions", "pendulum", lambda: ClipTransform(in_keys_inv=["action"], low=-0.5)),
    Case("clip_pixels_int", "toy", lambda: ClipTransform(in_keys=["pixels"], high=100)),
    Case("sign", "pendulum", lambda: SignTransform(in_keys=["observation"], in_keys_inv=["action"]),
         repro=(lambda: SignTransform(in_keys=["observation"], out_keys=["obs_s"]),
                lambda: SignTransform(in_keys=["observation"], out_keys=["obs_s"]), _both("obs_s"))),
    Case("binarize_reward", "pendulum", lambda: BinarizeReward(),
         repro=(lambda: BinarizeReward(out_keys=["r01"]), lambda: BinarizeReward(out_keys=["r01"]),
                [("next", "r01")])),
    Case("linearise_rewards", "toy_mo", lambda: LineariseRewards(["reward"], weights=[1.0, -0.5, 2.0]),
         repro=(lambda: LineariseRewards(["reward"], ["r1"], weights=[1.0, -0.5, 2.0]),
                lambda: LineariseRewards(["reward"], ["r1"], weights=[1.0, -0.5, 2.0]), [("next", "r1")])),
    Case("action_scaling", "pendulum", lambda: ActionScaling()),
    Case("action_scaling_unit", "toy64", lambda: ActionScaling(standard_normal=False)),
    Case("discrete_action_projection", "toy_onehot", lambda: DiscreteActionProjection(4, 7)),
    Case("flatten_observation", "toy", lambda: Compose(ToTensorImage(), FlattenObservation(-2, -1))),
    Case("flatten_observation_positive", "toy", lambda: FlattenObservation(0, 1, allow_positive_dim=True),
         repro=(lambda: FlattenObservation(0, 1, out_keys=["flat"], allow_positive_dim=True),
                lambda: FlattenObservation(0, 1, out_keys=["flat"], allow_positive_dim=True), _both("flat"))),
    Case("permute", "toy", lambda: PermuteTransform([-1, -3, -2], in_keys=["pixels"]),
         repro=(lambda: PermuteTransform([-1, -3, -2], in_keys=["pixels"], out_keys=["chw"]),
                lambda: PermuteTransform([-1, -3, -2], in_keys=["pixels"], out_keys=["chw"]), _both("chw"))),
    Case("permute_actions", "toy64", lambda: Compose(UnsqueezeTransform(-1, in_keys_inv=["action"]),
                                                     PermuteTransform([-1, -2], in_keys_inv=["action"]))),
    Case("traj_counter", "toy", lambda: TrajCounter(), identity_forward=True),
    Case("traj_counter_step_limit", "pendulum", lambda: Compose(StepCounter(3), TrajCounter("tid"))),
    Case("finite_check", "toy", lambda: FiniteTensorDictCheck(), identity_forward=True),
    Case("unary", "pendulum", lambda: UnaryTransform(["observation"], ["obs_sum"],
                                                     fn=lambda x: x.sum(-1, keepdim=True)),
         repro=(lambda: UnaryTransform(["observation"], ["obs_sum"], fn=lambda x: x.sum(-1, keepdim=True)),
                lambda: UnaryTransform(["observation"], ["obs_sum"], fn=lambda x: x.sum(-1, keepdim=True)),
                _both("obs_sum"))),
    Case("unary_actions", "toy64", lambda: UnaryTransform([], [], ["action"], ["action"], fn=lambda a: a * 0.5,
                                                           inv_fn=lambda a: a.clamp(-1, 1))),
    Case("timer", "toy", lambda: Timer(), identity_forward=True),
    Case("crop", "toy", lambda: Compose(ToTensorImage(), Crop(4, 3, top=2, left=5))),
    Case("crop_padded", "toy", lambda: Compose(ToTensorImage(from_int=False, dtype=torch.uint8),
                                               Crop(6, top=5, left=7))),
    Case("stack", "agents", lambda: Stack([("agent_0", "obs"), ("agent_1", "obs")], "obs_all",
                                          in_key_inv="acts", out_keys_inv=["act_0", "act_1"], dim=-2)),
    Case("stack_tensordicts", "agents", lambda: Stack(["agent_0", "agent_1"], "agents", del_keys=False)),
    Case("flatten_action", "toy_matrix_action", lambda: FlattenAction()),
    Case("flatten_action_renamed", "toy_matrix_action",
         lambda: FlattenAction(0, 1, out_keys_inv=["flat_action"], allow_positive_dim=True)),
    Case("remove_empty_specs", "toy_empty", lambda: RemoveEmptySpecs()),
    Case("module", "pendulum", _encoder,
         repro=(_encoder, _encoder, ["embed"])),
    Case("module_inverse", "pendulum", _action_halver, identity_forward=True),
    Case("terminate", "pendulum", lambda: TerminateTransform(lambda td: td["observation"][..., 2] > 1.0),
         identity_forward=True),
    Case("device_cast", "cartpole", lambda: DeviceCastTransform("cpu"), identity_forward=True),
    Case("device_cast_keys", "pendulum",
         lambda: DeviceCastTransform("cpu", "cpu", in_keys=["observation"], in_keys_inv=["action"])),
    Case("pin_memory", "toy", lambda: PinMemoryTransform(), identity_forward=True),
    Case("hash", "cartpole", lambda: Hash(["observation"], ["obs_hash"]),
         repro=(lambda: Hash(["observation"], ["h"]), lambda: Hash(["observation"], ["h"]), _both("h"))),
    Case("gsde_noise", "pendulum", lambda: gSDENoise(state_dim=3, action_dim=1)),
    Case("vecnorm_v2", "cartpole", lambda: VecNormV2(in_keys=["observation"], decay=0.99)),
    Case("action_discretizer", "pendulum", lambda: ActionDiscretizer(5)),
    Case("random_truncation", "pendulum", lambda: Compose(StepCounter(), RandomTruncationTransform(2, 5, prob=0.5))),
    Case("expand_as", "toy", lambda: ExpandAs("terminated", "observation", "term_obs"),
         repro=(lambda: ExpandAs("terminated", "observation", "term_obs"),
                lambda: ExpandAs("terminated", "observation", "term_obs"), _both("term_obs"))),
    Case("success_reward", "toy", lambda: SuccessReward("terminated", scale=2.0),
         repro=(lambda: SuccessReward("terminated", "r_succ", scale=2.0),
                lambda: SuccessReward("terminated", "r_succ", scale=2.0), [("next", "r_succ")])),
    Case("action_discretizer_onehot_renamed", "pendulum",
         lambda: ActionDiscretizer(3, out_action_key="action_disc", categorical=False,
                                   sampling=ActionDiscretizer.SamplingStrategy.RANDOM)),
    Case("rnd", "cartpole", lambda: _rnd()),
    Case("mean_action_selector", "pendulum", lambda: MeanActionSelector()),
    Case("policy_age_filter", "toy", lambda: PolicyAgeFilter(3, 1), identity_forward=True),
    Case("next_observation_delta", "pendulum", lambda: NextObservationDelta(["observation"], drop_delta=False)),
    Case("conditional_skip", "pendulum", lambda: ConditionalSkip(_skip_cond), identity_forward=True),
    Case("multi_action", "pendulum", lambda: MultiAction(chunk_size=2), identity_forward=True),
    Case("multi_action_stack_obs", "pendulum", lambda: MultiAction(
        chunk_size=3, stack_rewards=False, stack_observations=True), identity_forward=True),
    Case("conditional_policy_switch", "pendulum", lambda: ConditionalPolicySwitch(_zero_action, _fast),
         identity_forward=True),
    Case("auto_reset", "countdown", lambda: AutoResetTransform(), identity_forward=True),
    Case("auto_reset_keep", "countdown", lambda: AutoResetTransform(replace=False), identity_forward=True),
    Case("vec_gym", "countdown_final", lambda: VecGymEnvTransform(), identity_forward=True),
    Case("end_of_life", "lives", lambda: EndOfLifeTransform(eol_attribute="lives"), env_only=True),
    Case("action_chunk", "pendulum", lambda: ActionChunkTransform(4)),
    Case("compose_mixed", "cartpole64", lambda: Compose(
        StepCounter(max_steps=4), RewardSum(), InitTracker(), DoubleToFloat(),
        ObservationNorm(loc=0.0, scale=0.5), CatFrames(2, -1, in_keys=["observation"]))),
]
IDS = [c.id for c in CASES]


def _tenv(case: Case, batch_size: Any = (), base: Any = None) -> TransformedEnv:
    env = TransformedEnv(make_env(case.env, batch_size) if base is None else base, case.make())
    if case.setup is not None:
        case.setup(env)
    return env


# replay-buffer-only transforms (refused in an env): tested in test_transforms_parity.py
REPLAY_ONLY = ("Reward2GoTransform", "RandomCropTensorDict", "BurnInTransform", "MultiStepTransform",
               "NextStateReconstructor")
NOT_TRANSFORMS = ("RunningMeanStd", "AutoResetEnv")  # a statistics module, an env (test_transforms_new.py)


def test_every_transform_is_covered():
    import steersman.envs.transforms as T

    names = {n for n in T.__all__ if n not in ("Transform", "ObservationTransform", "Compose",
                                                "TransformedEnv", *REPLAY_ONLY, *NOT_TRANSFORMS)}
    covered = set()
    for case in CASES:
        t = case.make()
        for sub in (t.transforms if isinstance(t, Compose) else [t]):
            covered.add(type(sub).__name__)
    assert names <= covered, sorted(names - covered)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_on_env(case):
    env = _tenv(case)
    check_env_specs(env, seed=0)
    td = env.rollout(5)
    assert td.batch_size[-1] >= 1
    assert env.full_observation_spec.shape == env.batch_size


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_on_batched_env(case):
    env = _tenv(case, [4])
    check_env_specs(env, seed=0, max_steps=12)
    check_env_specs(env, seed=0, max_steps=4, return_contiguous=False)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_on_serial_env(case):
    from functools import partial

    base = SerialEnv(2, partial(make_env, case.env))
    try:
        env = _tenv(case, base=base)
        check_env_specs(env, seed=0, max_steps=8)
    finally:
        base.close()


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_on_tensordict(case):
    """The transform, out of its env, applies to a rollout of the base env (a replay sample)."""
    env = _tenv(case, [3])
    t = env.transform.clone()
    assert t.parent is None and t.container is None
    base = make_env(case.env, [3])
    torch.manual_seed(0)
    data = base.rollout(6, break_when_any_done=False)
    before = data.clone()
    if case.env_only:
        with pytest.raises(ValueError, match="env"):
            t(data)
        return
    out = t(data)
    if case.identity_forward:
        assert (out == before).all()
        return
    nb = len(env.batch_size)
    if tuple(out.batch_size[:nb]) != tuple(env.batch_size):
        assert isinstance(t, BatchSizeTransform)
        assert tuple(out.batch_size[:nb]) == tuple(env.batch_size)[:nb] or out.numel() == data.numel()
        return
    checked = 0
    for key, spec in env.full_observation_spec.items(include_nested=True, leaves_only=True):
        val = out.get(key, None)
        if val is None:
            continue
        per_step = val.movedim(nb, 0)
        assert spec.is_in(per_step), (key, spec._check(per_step))
        checked += 1
    assert checked


@pytest.mark.parametrize("case", [c for c in CASES if c.repro is not None],
                         ids=[c.id for c in CASES if c.repro is not None])
@pytest.mark.parametrize("batch_size", [(), (4,)], ids=["unbatched", "batch4"])
def test_forward_reproduces_env(case, batch_size):
    """``forward`` on the env's rollout (its outputs removed) gives what the env wrote."""
    in_env, fwd, keys = case.repro
    env = TransformedEnv(make_env(case.env, batch_size), in_env())
    torch.manual_seed(0)
    data = env.rollout(15, break_when_any_done=False)
    flags = [("next", "truncated"), ("next", "done")]  # updated in place, not created
    raw = data.exclude(*[k for k in keys if k not in flags])
    out = fwd()(raw.clone())
    for key in keys:
        torch.testing.assert_close(out.get(key), data.get(key), msg=f"{case.id}: {key}")


def test_forward_reproduces_env_with_episode_boundaries():
    """The toy env's sub-envs end at different steps: forward restarts episodes at the same steps."""
    env = TransformedEnv(make_env("toy", [4]), Compose(
        StepCounter(), RewardSum(), InitTracker(),
        CatFrames(3, -1, in_keys=["observation"], out_keys=["stack"])))
    data = env.rollout(14, break_when_any_done=False)
    assert bool(data["next", "done"].any()) and not bool(data["next", "done"].all())
    outs = [*_both("step_count"), *_both("episode_reward"), *_both("is_init"), *_both("stack")]
    fwd = Compose(StepCounter(), RewardSum(), InitTracker(),
                  CatFrames(3, -1, in_keys=["observation"], out_keys=["stack"]))
    out = fwd(data.exclude(*outs))
    for key in outs:
        torch.testing.assert_close(out.get(key), data.get(key), msg=str(key))
