"""Trainer and hooks: each hook does what TorchRL documents (counts, logged values, sub-batch
shapes, target updates every step, early stop), and DQN/PPO trainers assembled the TorchRL way
train on CartPole."""

from __future__ import annotations

import math

import pytest
import torch

from steersman.collectors import Collector
from steersman.data import LazyTensorStorage, SamplerWithoutReplacement, TensorDictReplayBuffer
from steersman.envs import CartPoleEnv
from steersman.modules import MLP, ProbabilisticActor, QValueActor, ValueOperator
from steersman.objectives import GAE, ClipPPOLoss, DQNLoss, HardUpdate
from steersman.tensordict import TensorDict
from steersman.tensordict.nn import TensorDictModule
from steersman.trainers import (
    HOOK_POINTS,
    BatchSubSampler,
    ClearCudaCache,
    CountFramesLog,
    DefaultOptimizationStepper,
    EarlyStopping,
    LogScalar,
    LogTiming,
    LogValidationReward,
    LRSchedulerHook,
    MixedPrecisionOptimizationStepper,
    OptimizerHook,
    ReplayBufferTrainer,
    RewardNormalizer,
    SelectKeys,
    TargetNetUpdaterHook,
    Trainer,
    UpdateWeights,
    UTDRHook,
    ValueEstimatorHook,
    mask_batch,
)


def _batch(b: int = 4, t: int = 10) -> TensorDict:
    x = torch.arange(b * t, dtype=torch.float32).view(b, t, 1)
    return TensorDict({"obs": x, ("next", "reward"): x.clone(), "other": torch.zeros(b, t),
                       ("collector", "mask"): torch.ones(b, t, dtype=torch.bool)}, [b, t])


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(1, 1)

    def forward(self, td: TensorDict) -> TensorDict:
        return TensorDict({"loss_mse": self.lin(td["obs"]).pow(2).mean()}, [])


def _trainer(batches, **kw) -> tuple[Trainer, _Net]:
    net = _Net()
    kw.setdefault("optimizer", torch.optim.SGD(net.parameters(), lr=1e-4))
    trainer = Trainer(collector=batches, total_frames=kw.pop("total_frames", 10**9), frame_skip=1,
                      optim_steps_per_batch=kw.pop("optim_steps_per_batch", 2), loss_module=net,
                      progress_bar=False, **kw)
    return trainer, net


# --------------------------------------------------------------------- hooks, one by one
@pytest.mark.parametrize("batch_size,sub_traj_len,shape", [(20, 0, (2, 10)), (20, 5, (4, 5)),
                                                          (8, 2, (4, 2)), (9, 3, (3, 3))])
def test_batch_subsampler_shapes_and_contiguous_windows(batch_size, sub_traj_len, shape):
    out = BatchSubSampler(batch_size, sub_traj_len)(_batch())
    assert tuple(out.shape) == shape
    obs = out["obs"].squeeze(-1)
    assert torch.equal(obs[:, 1:] - obs[:, :-1], torch.ones(shape[0], shape[1] - 1))  # windows
    assert torch.equal(obs // 10, (obs[:, :1] // 10).expand_as(obs))  # inside one trajectory


def test_batch_subsampler_bad_input():
    with pytest.raises(ValueError, match="sub_traj_len=20 exceeds"):
        BatchSubSampler(40, 20)(_batch())
    with pytest.raises(ValueError, match="batch_size"):
        BatchSubSampler(0)


def test_count_frames_log_counts_valid_frames_times_skip():
    td = _batch()
    td["collector", "mask"][:, 7:] = False
    hook = CountFramesLog(frame_skip=3)
    assert hook(td)["n_frames"] == 28 * 3
    assert hook(td)["n_frames"] == 2 * 28 * 3
    fresh = CountFramesLog(frame_skip=3)
    fresh.load_state_dict(hook.state_dict())
    assert fresh.frame_count == hook.frame_count


@pytest.mark.parametrize("reduction", ["mean", "sum", "max", "min"])
def test_log_scalar_matches_plain_reduction(reduction):
    td = _batch()
    td["collector", "mask"][0] = False
    out = LogScalar(("next", "reward"), logname="r", reduction=reduction)(td)
    ref = td["next", "reward"][1:].flatten()
    assert out["r"] == pytest.approx(getattr(ref, reduction)().item())
    assert out["r_std"] == pytest.approx(ref.std().item())
    assert "r_std" not in LogScalar(logname="r", include_std=False)(td)
    with pytest.raises(ValueError, match="reduction='median'"):
        LogScalar(reduction="median")


def test_select_keys_and_mask_batch():
    td = _batch()
    assert set(SelectKeys(["obs"])(td).keys()) == {"obs"}
    td["collector", "mask"][:, 5:] = False
    masked = mask_batch(td)
    assert masked.shape == (20,) and masked["obs"].squeeze(-1).remainder(10).max() == 4
    with pytest.raises(TypeError, match="string"):
        SelectKeys("obs")


def test_reward_normalizer_against_plain_statistics():
    hook = RewardNormalizer(decay=0.5, scale=2.0)
    first, second = _batch(), _batch()
    second["next", "reward"] = second["next", "reward"] * 3 - 7
    hook.update_reward_stats(first)
    hook.update_reward_stats(second)
    r1, r2 = first["next", "reward"].flatten(), second["next", "reward"].flatten()
    s = 0.5 * r1.sum() + r2.sum()
    ssq = 0.5 * r1.pow(2).sum() + r2.pow(2).sum()
    n = 0.5 * 40 + 40
    mean = s / n
    std = math.sqrt((ssq - n * mean**2) / (n - 1))
    out = hook.normalize_reward(first)
    assert torch.allclose(out["next", "reward"], (r1.view(4, 10, 1) - mean) / std * 2.0, atol=1e-5)
    assert torch.equal(first["next", "reward"], _batch()["next", "reward"])  # input untouched
    with pytest.raises(RuntimeError, match="before any update"):
        RewardNormalizer().normalize_reward(first)


def test_optimizer_hook_steps_sum_of_loss_terms_and_clips():
    w = torch.nn.Parameter(torch.tensor([3.0, 4.0]))
    opt = torch.optim.SGD([w], lr=1.0)
    losses = TensorDict({"loss_a": (w * 10).sum(), "loss_b": w.sum(), "other": w.sum()}, [])
    out = OptimizerHook(opt)(losses, True, 1.0, 0)
    # grad = 11 on both entries (other is not a loss term), clipped to total norm 1
    assert out["grad_norm_0"].item() == pytest.approx(11 * math.sqrt(2))
    assert torch.allclose(w.detach(), torch.tensor([3.0, 4.0]) - 1 / math.sqrt(2))
    assert w.grad is None
    with pytest.raises(KeyError, match="loss_c"):
        OptimizerHook(opt, ["loss_c"])(TensorDict({"loss_a": w.sum()}, []), True, None, 0)


def test_lr_scheduler_hook_steps_per_batch_or_optim_step():
    for interval, expected in [("batch", 3), ("optim", 6)]:
        trainer, net = _trainer([_batch() for _ in range(3)])
        sched = torch.optim.lr_scheduler.StepLR(trainer.optimizer, step_size=1, gamma=0.5)
        LRSchedulerHook(sched, interval=interval).register(trainer)
        trainer.train()
        assert sched.last_epoch == expected
        assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(1e-4 * 0.5**expected)


def test_target_net_updater_hook_and_update_weights_intervals():
    calls = {"target": 0, "weights": 0}

    class Updater:
        def step(self):
            calls["target"] += 1

    class Batches(list):
        def update_policy_weights_(self, weights=None):
            calls["weights"] += 1

    trainer, _ = _trainer(Batches(_batch() for _ in range(4)), optim_steps_per_batch=3)
    TargetNetUpdaterHook(Updater()).register(trainer)
    UpdateWeights(trainer.collector, update_weights_interval=2).register(trainer)
    trainer.train()
    assert calls == {"target": 12, "weights": 2}
    with pytest.raises(TypeError, match="no step"):
        TargetNetUpdaterHook(object())


def test_every_hook_point_fires_in_order():
    order = []
    trainer, _ = _trainer([_batch()], optim_steps_per_batch=1)
    for dest in HOOK_POINTS:
        if dest in ("optimizer", "process_loss", "post_optim_complete_log"):
            continue
        trainer.register_op(dest, (lambda d: (lambda *a: order.append(d)))(dest))
    trainer.train()
    assert order == ["setup", "batch_process", "pre_steps_log", "pre_optim_steps", "pre_epoch_log",
                     "pre_epoch", "process_optim_batch", "post_loss", "post_optim",
                     "post_optim_log", "post_epoch_log", "post_epoch", "post_steps",
                     "post_steps_log", "shutdown"]
    with pytest.raises(ValueError, match="unknown hook point 'nowhere'"):
        trainer.register_op("nowhere", print)


def test_early_stopping_after_patience_and_on_nan():
    trainer, _ = _trainer([_batch() for _ in range(50)])
    values = iter([1.0, 2.0, 2.0, 1.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0] * 5)
    trainer.register_op("pre_steps_log", lambda b: {"score": next(values)})
    EarlyStopping(monitor="score", patience=80, wait_for=0).register(trainer)
    trainer.train()
    # best at 80 frames; stop once more than 80 frames passed without improvement
    assert trainer.collected_frames == 200 and trainer._stop_training
    trainer, _ = _trainer([_batch() for _ in range(50)])
    trainer.register_op("pre_steps_log", lambda b: {"score": float("nan")})
    EarlyStopping(monitor="score").register(trainer)
    trainer.train()
    assert trainer.collected_frames == 40 and "nan" in trainer._stop_reason


def test_replay_buffer_trainer_extends_flat_and_samples_batch_size():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100))
    trainer, _ = _trainer([_batch() for _ in range(2)], optim_steps_per_batch=1)
    seen = []
    ReplayBufferTrainer(rb, batch_size=16, flatten_tensordicts=True).register(trainer)
    trainer.register_op("post_loss", lambda b: seen.append(b.shape))
    trainer.train()
    assert len(rb) == 80 and seen == [torch.Size([16])] * 2


def test_replay_buffer_trainer_iterate_ends_the_pass():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100),
                                sampler=SamplerWithoutReplacement(), batch_size=10)
    trainer, _ = _trainer([_batch()], optim_steps_per_batch=None)
    ReplayBufferTrainer(rb, flatten_tensordicts=True, iterate=True).register(trainer)
    trainer.train()
    assert trainer._optim_count == 4  # 40 items, batches of 10


def test_log_timing_utdr_clear_cuda_and_logger_calls():
    class Logger:
        def __init__(self):
            self.calls = []

        def log_scalar(self, name, value, step=None):
            self.calls.append((name, value, step))

    logger = Logger()
    trainer, _ = _trainer([_batch() for _ in range(3)], logger=logger, log_interval=0,
                          log_timings=True)
    UTDRHook(trainer).register(trainer)
    CountFramesLog(frame_skip=1).register(trainer)
    ClearCudaCache(1).register(trainer)
    trainer.train()
    names = {c[0] for c in logger.calls}
    assert {"utd_ratio", "n_frames", "loss_mse", "optim_steps", "time/iteration"} <= names
    assert [v for n, v, _ in logger.calls if n == "n_frames"] == [40, 80, 120]
    assert [v for n, v, _ in logger.calls if n == "utd_ratio"][-1] == pytest.approx(6 / 120)
    assert isinstance(LogTiming()(None), dict)


def test_optimization_steppers_replace_the_optimizer_hooks():
    for make in (lambda opt: DefaultOptimizationStepper(),
                 lambda opt: MixedPrecisionOptimizationStepper(opt, gradient_accumulation_steps=2,
                                                               mixed_precision=True)):
        net = _Net()
        opt = torch.optim.SGD(net.parameters(), lr=1e-3)
        before = net.lin.weight.detach().clone()
        stepper = make(opt)
        trainer = Trainer(collector=[_batch()] * 2, total_frames=80, optim_steps_per_batch=2,
                          loss_module=net, optimizer=opt, optimization_stepper=stepper)
        assert trainer._ops["optimizer"] == []
        trainer.train()
        assert not torch.equal(before, net.lin.weight)
        if isinstance(stepper, MixedPrecisionOptimizationStepper):
            assert stepper.optimizer_step_count == 2  # 4 micro-steps, accumulated in pairs


def test_trainer_refuses_unsupported_backends():
    with pytest.raises(ValueError, match="learner_backend='ray'"):
        _trainer([], learner_backend="ray")
    with pytest.raises(ValueError, match="async_collection"):
        _trainer([], async_collection=True)


def test_trainer_state_dict_roundtrip_through_checkpoint(tmp_path):
    trainer, net = _trainer([_batch() for _ in range(2)], save_trainer_file=tmp_path / "t",
                            save_trainer_interval=1)
    counter = CountFramesLog(frame_skip=1)
    counter.register(trainer)
    trainer.train()
    fresh, fresh_net = _trainer([])
    CountFramesLog(frame_skip=1).register(fresh)
    fresh.load_from_file(tmp_path / "t")
    assert torch.equal(fresh_net.lin.weight, net.lin.weight)
    assert fresh.collected_frames == 80 and fresh._modules["count_frames_log"].frame_count == 80
    assert fresh.optimizer.state_dict()["state"].keys() == trainer.optimizer.state_dict()["state"].keys()


def test_trainer_saves_through_a_user_checkpoint(tmp_path):
    from steersman.checkpoint import Checkpoint

    net = _Net()
    trainer = Trainer(collector=[_batch()] * 2, total_frames=80, optim_steps_per_batch=1,
                      loss_module=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
                      checkpoint=Checkpoint(policy=net), save_trainer_file=tmp_path / "c")
    trainer.train()
    manifest = Checkpoint.manifest(tmp_path / "c")
    assert set(manifest["components"]) == {"policy"}
    assert manifest["metadata"] == {"collected_frames": 80, "optim_steps": 2}
    other = _Net()
    Checkpoint(policy=other).load(tmp_path / "c")
    assert torch.equal(other.lin.weight, net.lin.weight)


# --------------------------------------------------------------------- the TorchRL way
def test_dqn_trainer_on_cartpole():
    torch.manual_seed(0)
    env = CartPoleEnv()
    value_net = MLP(out_features=2, num_cells=[32])
    actor = QValueActor(value_net, in_keys=["observation"], spec=env.action_spec)
    actor(env.reset())  # initialise the lazy layers
    collector = Collector(env, actor, frames_per_batch=50, total_frames=300)
    loss = DQNLoss(actor, action_space=env.action_spec, delay_value=True)
    loss.make_value_estimator(gamma=0.99)
    target = HardUpdate(loss, value_network_update_interval=5)
    optim = torch.optim.Adam(loss.parameters(), lr=1e-3)
    trainer = Trainer(collector=collector, total_frames=300, frame_skip=1,
                      optim_steps_per_batch=4, loss_module=loss, optimizer=optim,
                      progress_bar=False)
    ReplayBufferTrainer(TensorDictReplayBuffer(storage=LazyTensorStorage(1000)), batch_size=32,
                        flatten_tensordicts=True).register(trainer)
    TargetNetUpdaterHook(target).register(trainer)
    UpdateWeights(collector, 1).register(trainer)
    LogScalar(("next", "reward"), "r_training").register(trainer)
    before = [p.clone() for p in loss.target_value_network_params.values(True, True)]
    trainer.train()
    assert trainer.collected_frames == 300 and trainer._optim_count == 24
    after = list(loss.target_value_network_params.values(True, True))
    assert any(not torch.equal(a, b) for a, b in zip(before, after))  # hard updates happened
    assert len(trainer._log_dict["r_training"]) == 6


def test_ppo_trainer_on_cartpole():
    torch.manual_seed(0)
    env = CartPoleEnv()
    actor = ProbabilisticActor(
        TensorDictModule(MLP(in_features=4, out_features=2, num_cells=[32]),
                         in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"], distribution_class=torch.distributions.Categorical,
        spec=env.action_spec, return_log_prob=True)
    critic = ValueOperator(MLP(in_features=4, out_features=1, num_cells=[32]),
                           in_keys=["observation"])
    collector = Collector(env, actor, frames_per_batch=100, total_frames=300)
    loss = ClipPPOLoss(actor, critic, entropy_coeff=0.01)
    advantage = GAE(gamma=0.99, lmbda=0.95, value_network=critic)
    optim = torch.optim.Adam(loss.parameters(), lr=3e-4)
    trainer = Trainer(collector=collector, total_frames=300, frame_skip=1,
                      optim_steps_per_batch=4, loss_module=loss, optimizer=optim,
                      clip_norm=1.0, progress_bar=False)
    ValueEstimatorHook(advantage).register(trainer)
    BatchSubSampler(batch_size=50, sub_traj_len=10).register(trainer)
    UpdateWeights(collector, 1).register(trainer)
    seen = []
    trainer.register_op("post_loss", lambda b: seen.append((b.shape, "advantage" in b.keys())))
    before = [p.detach().clone() for p in actor.parameters()]
    trainer.train()
    assert trainer.collected_frames == 300 and trainer._optim_count == 12
    assert seen == [(torch.Size([5, 10]), True)] * 12
    assert any(not torch.equal(a, b) for a, b in zip(before, actor.parameters()))
    assert {"loss_objective", "loss_critic", "grad_norm_0"} <= set(trainer._log_dict)


def test_log_validation_reward_rolls_out_every_interval():
    env = CartPoleEnv()
    calls = []

    def policy(td):
        calls.append(1)
        td.set("action", torch.zeros((), dtype=torch.int64))
        return td

    hook = LogValidationReward(record_interval=2, record_frames=20, policy_exploration=policy,
                               environment=env)
    outs = [hook(None) for _ in range(3)]
    assert outs[1] is None and len(calls) == 40
    # constant action: CartPole gives reward 1 per step, episodes restart: sum over 20 steps
    assert outs[0]["r_evaluation"] == pytest.approx(20.0)
