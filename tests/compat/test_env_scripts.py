"""Short scripts in the style TorchRL users write, run with only steersman imports:
ParallelEnv with lambdas and TorchRL's keyword arguments, a custom EnvBase, a transform
stack; and EnvBase's TorchRL keywords (run_type_checks, spec_locked, auto_reset ...)."""

from __future__ import annotations

import pytest
import torch

from steersman.data import Bounded, Composite, Unbounded
from steersman.envs import (
    CartPoleEnv,
    Compose,
    DoubleToFloat,
    EnvBase,
    ObservationNorm,
    ParallelEnv,
    PendulumEnv,
    RewardSum,
    SerialEnv,
    StepCounter,
    TransformedEnv,
    check_env_specs,
)
from steersman.tensordict import TensorDict


def test_parallel_env_with_lambda_and_torchrl_keywords():
    # TorchRL's canonical example, with the keywords its scripts pass
    env = ParallelEnv(
        2, lambda: CartPoleEnv(), serial_for_single=True, pin_memory=False, use_buffers=True,
        num_threads=torch.get_num_threads(), consolidate=True, daemon=False, memmap=False,
        metadata_from_workers=False, non_blocking=False, policy_proof=None, share_individual_td=None,
        shutdown_timeout=5.0, allow_step_when_done=False, mp_start_method="fork",
    )
    serial = SerialEnv(2, lambda: CartPoleEnv(), num_sub_threads=1, shared_memory=True, use_buffers=True,
                       mp_start_method="fork")
    try:
        env.set_seed(0)
        serial.set_seed(0)
        torch.manual_seed(0)
        a = env.rollout(5, break_when_any_done=False)
        torch.manual_seed(0)
        b = serial.rollout(5, break_when_any_done=False)
        assert a.batch_size == (2, 5)
        assert torch.equal(a["next", "observation"], b["next", "observation"])
    finally:
        env.close()
        serial.close()
    single = ParallelEnv(1, lambda: CartPoleEnv(), serial_for_single=True)
    assert isinstance(single, SerialEnv)  # no process for one env
    single.close()
    with pytest.raises(ValueError, match="num_threads"):
        SerialEnv(1, CartPoleEnv, num_threads=0)


class CounterEnv(EnvBase):
    """A user's env: specs from shapes, _reset returning only the observation."""

    def __init__(self, batch_size=(), **kwargs):
        super().__init__(batch_size=batch_size, **kwargs)
        self.observation_spec = Composite(count=Unbounded((*self.batch_size, 1)), shape=self.batch_size)
        self.action_spec = Bounded(0.0, 1.0, shape=(*self.batch_size, 1))
        self.reward_spec = Unbounded(shape=(*self.batch_size, 1))

    def _reset(self, tensordict):
        self.count = torch.zeros(*self.batch_size, 1)
        return TensorDict({"count": self.count.clone()}, self.batch_size)

    def _step(self, tensordict):
        self.count = self.count + tensordict["action"]
        done = self.count > 2
        return TensorDict({"count": self.count.clone(), "reward": tensordict["action"].clone(), "done": done},
                          self.batch_size)

    def _set_seed(self, seed):
        torch.manual_seed(seed)


def test_custom_env_with_transform_stack():
    env = TransformedEnv(CounterEnv(batch_size=[3]), Compose(StepCounter(max_steps=10), RewardSum()))
    check_env_specs(env)
    td = env.rollout(20, lambda td: td.set("action", torch.ones(3, 1)))
    assert td.batch_size == (3, 3)  # done after 3 steps of +1
    assert td["next", "episode_reward"][:, -1].squeeze(-1).tolist() == [3.0, 3.0, 3.0]
    assert td["next", "terminated"][:, -1].all()
    env2 = TransformedEnv(PendulumEnv(seed=0, batch_size=[2]))
    env2.append_transform(DoubleToFloat())
    env2.append_transform(ObservationNorm(loc=0.0, scale=2.0, in_keys=["observation"]))
    check_env_specs(env2)


def test_envbase_torchrl_keywords():
    env = CounterEnv(run_type_checks=True, allow_done_after_reset=False, spec_locked=True)
    check_env_specs(env)

    class Bad(CounterEnv):
        def _step(self, tensordict):
            out = super()._step(tensordict)
            out["count"] = out["count"].double()
            return out

    bad = Bad(run_type_checks=True)
    td = bad.reset()
    td["action"] = torch.ones(1)
    with pytest.raises(ValueError, match="'count' has dtype torch.float64"):
        bad.step(td)
    unchecked = Bad()
    unchecked.reset()
    assert unchecked.step(td)["next", "count"].dtype is torch.float64  # unchecked by default

    class DoneAtReset(CounterEnv):
        def _reset(self, tensordict):
            out = super()._reset(tensordict)
            out["done"] = torch.ones(1, dtype=torch.bool)
            out["terminated"] = torch.ones(1, dtype=torch.bool)
            return out

    with pytest.raises(RuntimeError, match="allow_done_after_reset"):
        DoneAtReset(run_type_checks=True).reset()
    assert DoneAtReset(run_type_checks=True, allow_done_after_reset=True).reset()["done"].all()

    unlocked = CounterEnv(spec_locked=False)
    unlocked.observation_spec["extra"] = Unbounded((1,))  # edit in place
    assert "extra" in unlocked.observation_spec.keys()
    with pytest.raises(ValueError, match="auto_reset"):
        CounterEnv(auto_reset=True)


def test_torchrl_pipeline_scripts_for_the_newer_transforms():
    """TorchRL's documented examples of MultiStepTransform (a replay buffer fed with
    successive rollouts of a SerialEnv), ConditionalSkip (nested TransformedEnvs) and
    AsyncEnvPool, with steersman imports."""
    from steersman.data import LazyTensorStorage, ReplayBuffer
    from steersman.envs import AsyncEnvPool, ConditionalSkip, MultiStepTransform

    rb = ReplayBuffer(storage=LazyTensorStorage(100), transform=MultiStepTransform(n_steps=3, gamma=0.95))
    env = TransformedEnv(PendulumEnv(), StepCounter())
    env.set_seed(0)
    tdreset = env.reset()
    for _ in range(3):
        rollout = env.rollout(max_steps=10, break_when_any_done=False, tensordict=tdreset, auto_reset=False)
        rb.extend(rollout)
        tdreset = rollout[..., -1]["next"]
    stored = rb[:]
    assert stored.batch_size == (27,)  # 30 steps, the last 3 wait for their future
    assert torch.equal(stored["next", "step_count"], stored["step_count"] + 3)

    base_env = TransformedEnv(PendulumEnv(), StepCounter(step_count_key="inner_count"))
    middle_env = TransformedEnv(base_env, Compose(StepCounter(step_count_key="middle_count"),
                                                  ConditionalSkip(cond=lambda td: td["step_count"] % 2 == 1)))
    env = TransformedEnv(middle_env, StepCounter(step_count_key="step_count"))
    env.set_seed(0)
    r = env.rollout(10)
    assert r["inner_count"].squeeze(-1).tolist() == [0, 1, 1, 2, 2, 3, 3, 4, 4, 5]
    assert torch.equal(r["observation"][1], r["observation"][2])

    pool = AsyncEnvPool([lambda: PendulumEnv(), lambda: PendulumEnv()], stack="lazy", backend="threading")
    s = pool.rand_step(pool.reset())
    s = pool._step_mdp(s)
    s0 = s[0]
    s0["action"] = torch.randn(1).clamp(-1, 1)
    s0["env_index"] = 0
    pool.async_step_send(s0)
    s0_result = pool.async_step_recv()
    assert s0_result["env_index"].tolist() == [0] and s0_result["next", "observation"].shape == (1, 3)
    pool.close()
