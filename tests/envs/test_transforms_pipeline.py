"""Documented behaviour of the issue-13 transforms (the battery in test_transforms.py checks
specs on envs; here: values against plain references)."""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from steersman import TensorDict
from steersman.data import LazyTensorStorage, ReplayBuffer
from steersman.envs import PendulumEnv, TransformedEnv
from steersman.envs.batched import SerialEnv
from steersman.envs.transforms import (
    ActionChunkTransform,
    AutoResetEnv,
    AutoResetTransform,
    Compose,
    ConditionalPolicySwitch,
    ConditionalSkip,
    EndOfLifeTransform,
    MeanActionSelector,
    MultiAction,
    MultiStepTransform,
    NextObservationDelta,
    NextStateReconstructor,
    PolicyAgeFilter,
    RNDTransform,
    RunningMeanStd,
    StepCounter,
    VecGymEnvTransform,
)
from steersman.envs.transforms.autoreset import _CountdownEnv
from steersman.envs.transforms.episodes import _LivesEnv


# ---------------------------------------------------------------- MultiStepTransform
def _plain_n_step(reward, done, n, gamma):
    """Reference: a loop over each step of one stream [T]."""
    T = len(reward)
    ret, m_out, last_out = [], [], []
    for t in range(T):
        g, m = 0.0, 0
        for k in range(n):
            if t + k >= T:
                break
            g += gamma ** k * reward[t + k]
            m += 1
            if done[t + k]:
                break
        ret.append(g)
        m_out.append(m)
        last_out.append(t + m - 1)
    return ret, m_out, last_out


def _stream(T, dones, offset=0):
    t = torch.arange(offset, offset + T, dtype=torch.float32)
    done = torch.tensor(dones, dtype=torch.bool).unsqueeze(-1)
    return TensorDict({"obs": t.unsqueeze(-1), "next": {
        "obs": (t + 1).unsqueeze(-1), "reward": (t * 0.5 + 1).unsqueeze(-1), "done": done,
        "terminated": done.clone(), "truncated": torch.zeros_like(done)}}, [T])


@settings(max_examples=10, deadline=None)
@given(n=st.integers(1, 4), chunks=st.lists(st.integers(1, 6), min_size=1, max_size=4),
       seed=st.integers(0, 1000))
def test_multistep_matches_plain_loop_across_extend_calls(n, chunks, seed):
    g = torch.Generator().manual_seed(seed)
    T = sum(chunks)
    dones = (torch.rand(T, generator=g) < 0.25).tolist()
    full = _stream(T, dones)
    t = MultiStepTransform(n, gamma=0.9)
    outs, start = [], 0
    for c in chunks:
        out = t.inv(full[start:start + c].clone())
        start += c
        if out is not None:
            outs.append(out)
    written = torch.cat(outs, 0) if outs else None
    n_written = max(T - n, 0)
    assert (0 if written is None else written.batch_size[0]) == n_written
    if written is None:
        return
    ret, m, last = _plain_n_step(full["next", "reward"].squeeze(-1).tolist(), dones, n, 0.9)
    torch.testing.assert_close(written["next", "reward"].squeeze(-1), torch.tensor(ret[:n_written]))
    assert written["steps_to_next_obs"].tolist() == m[:n_written]
    assert written["next", "obs"].squeeze(-1).tolist() == [float(i + 1) for i in last[:n_written]]
    assert written["next", "done"].squeeze(-1).tolist() == [dones[i] for i in last[:n_written]]
    torch.testing.assert_close(written["gamma"], 0.9 ** torch.tensor(m[:n_written], dtype=torch.float32))
    torch.testing.assert_close(written["next", "original_reward"], full["next", "reward"][:n_written])


def test_multistep_in_replay_buffer_and_refused_in_env():
    rb = ReplayBuffer(storage=LazyTensorStorage(50), transform=MultiStepTransform(3, gamma=0.5))
    rb.extend(_stream(10, [False] * 10))
    rb.extend(_stream(10, [False] * 9 + [True], offset=10))
    assert len(rb) == 17
    assert rb[:]["obs"].squeeze(-1).tolist() == list(range(17))
    with pytest.raises(ValueError, match="cannot be used in an env"):
        TransformedEnv(PendulumEnv(), MultiStepTransform(2, 0.9))
    with pytest.raises(ValueError, match="n_steps"):
        MultiStepTransform(0, 0.9)
    t = MultiStepTransform(2, 0.9)
    t.inv(TensorDict({"next": {"reward": torch.zeros(2, 3, 1), "done": torch.zeros(2, 3, 1, dtype=torch.bool)}},
                     [2, 3]))
    with pytest.raises(ValueError, match="does not continue"):
        t.inv(TensorDict({"next": {"reward": torch.zeros(3, 3, 1), "done": torch.zeros(3, 3, 1, dtype=torch.bool)}},
                         [3, 3]))


# ---------------------------------------------------------------- NextStateReconstructor / NextObservationDelta
def test_next_state_reconstructor_rules():
    obs = torch.arange(8.0).unsqueeze(-1)
    data = TensorDict({"observation": obs, "sc": torch.tensor([0, 1, 2, 5, 6, 0, 1, 2]),
                       ("next", "done"): torch.tensor([0, 0, 0, 0, 1, 0, 0, 0], dtype=torch.bool).unsqueeze(-1),
                       ("collector", "traj_ids"): torch.tensor([0, 0, 0, 0, 0, 1, 1, 1])}, [8])
    out = NextStateReconstructor(step_count_key="sc")(data.clone())["next", "observation"].squeeze(-1)
    # 2->3 jumps in step count, 4 is done, 7 is the last position
    expect = [1, 2, float("nan"), 4, float("nan"), 6, 7, float("nan")]
    torch.testing.assert_close(out, torch.tensor(expect), equal_nan=True)
    out = NextStateReconstructor(traj_key=None, done_key=None)(data.clone())["next", "observation"].squeeze(-1)
    assert out[:-1].tolist() == list(range(1, 8)) and out[-1].isnan()
    with pytest.raises(KeyError, match="traj_ids"):
        NextStateReconstructor()(data.exclude("collector"))
    assert NextStateReconstructor(strict=False)(data.exclude("collector").clone())["next", "observation"].shape == (8, 1)
    with pytest.raises(ValueError, match="integer fill_value"):
        NextStateReconstructor(["sc"])(data.clone())


def test_next_observation_delta_roundtrip_and_compact_transitions():
    t = NextObservationDelta(["observation"], delta_dtype=torch.float16)
    env = TransformedEnv(PendulumEnv(batch_size=[2], seed=0), t)
    torch.manual_seed(0)
    data = env.rollout(6, break_when_any_done=False)
    assert ("next", "observation") not in data.keys(True)  # stored compact
    assert data["next", "delta", "observation"].dtype == torch.float16
    ref = TransformedEnv(PendulumEnv(batch_size=[2], seed=0))
    torch.manual_seed(0)
    full = ref.rollout(6, break_when_any_done=False)
    torch.testing.assert_close(data["observation"], full["observation"])  # the policy saw full precision
    rebuilt = NextObservationDelta(["observation"])(data.clone())
    torch.testing.assert_close(rebuilt["next", "observation"], full["next", "observation"], atol=1e-2, rtol=1e-2)
    assert ("next", "delta") not in rebuilt.keys(True)
    with pytest.raises(ValueError, match="floating"):
        NextObservationDelta(delta_dtype=torch.int8)


# ---------------------------------------------------------------- RunningMeanStd / RNDTransform
@settings(max_examples=20, deadline=None)
@given(sizes=st.lists(st.integers(1, 7), min_size=1, max_size=5), seed=st.integers(0, 10_000))
def test_running_mean_std_matches_full_batch(sizes, seed):
    g = torch.Generator().manual_seed(seed)
    batches = [torch.randn(n, 3, generator=g, dtype=torch.float64) * 3 + 1 for n in sizes]
    rms = RunningMeanStd(shape=(3,), epsilon=0.0).double()
    for b in batches:
        rms.update(b)
    allx = torch.cat(batches)
    torch.testing.assert_close(rms.mean, allx.mean(0))
    torch.testing.assert_close(rms.var, allx.var(0, unbiased=False))
    assert float(rms.count) == len(allx)
    assert set(rms.state_dict()) == {"mean", "var", "count"}
    with pytest.raises(ValueError, match="shape"):
        rms.update(torch.zeros(4, 2))


def test_rnd_bonus_is_prediction_error_and_statistics_update():
    torch.manual_seed(0)
    target = torch.nn.Linear(3, 4)
    pred = torch.nn.Linear(3, 4)
    t = RNDTransform(target, pred, normalize_obs=False, normalize_reward=False)
    assert not any(p.requires_grad for p in target.parameters())
    env = TransformedEnv(PendulumEnv(seed=0), t)
    data = env.rollout(5)
    obs = data["next", "observation"]
    expect = (pred(obs) - target(obs)).pow(2).mean(-1, keepdim=True).detach()
    torch.testing.assert_close(data["next", "intrinsic_reward"], expect)
    same = RNDTransform(target, target, normalize_obs=False, normalize_reward=False)
    out = TransformedEnv(PendulumEnv(seed=0), same).rollout(3)
    assert bool((out["next", "intrinsic_reward"] == 0).all())
    norm = RNDTransform(torch.nn.Linear(3, 4), torch.nn.Linear(3, 4))
    TransformedEnv(PendulumEnv(seed=0), norm).rollout(4)
    assert norm.obs_rms is not None and float(norm.obs_rms.count) == pytest.approx(4, abs=1e-3)
    assert float(norm.reward_rms.count) == pytest.approx(4, abs=1e-3)
    fresh = RNDTransform(torch.nn.Linear(3, 4), torch.nn.Linear(3, 4))
    fresh.load_state_dict(norm.state_dict())  # lazily created statistics load too
    torch.testing.assert_close(fresh.obs_rms.mean, norm.obs_rms.mean)


# ---------------------------------------------------------------- MeanActionSelector / PolicyAgeFilter
def test_mean_action_selector_maps_belief_policies():
    env = TransformedEnv(PendulumEnv(seed=0), MeanActionSelector())
    td = env.reset()
    assert bool((td["observation", "var"] == 0).all())
    td["action"] = TensorDict(mean=torch.tensor([0.5]), var=torch.ones(1, 1), batch_size=[])
    out = env.step(td)
    ref = PendulumEnv(seed=0)
    r = ref.reset()
    r["action"] = torch.tensor([0.5])
    torch.testing.assert_close(out["next", "observation", "mean"], ref.step(r)["next", "observation"])


def test_policy_age_filter_on_writes_and_samples():
    version = {"v": 3}
    t = PolicyAgeFilter(lambda: version["v"], max_policy_lag=1)
    rb = ReplayBuffer(storage=LazyTensorStorage(10), transform=t)
    rb.extend(TensorDict(x=torch.arange(4.0), policy_version=torch.tensor([0, 2, 2, 3]), batch_size=[4]))
    assert len(rb) == 3
    version["v"] = 4
    s = rb.sample(20)
    assert s["policy_version"].unique().tolist() == [3]
    env = TransformedEnv(PendulumEnv(seed=0), PolicyAgeFilter(0, 0))  # no-op in an env
    assert env.rollout(3).batch_size == (3,)
    with pytest.raises(KeyError, match="policy_version"):
        PolicyAgeFilter(1, 0, strict=True)(TensorDict(x=torch.zeros(2), batch_size=[2]))
    with pytest.raises(ValueError, match="max_policy_lag"):
        PolicyAgeFilter(1, -1)


# ---------------------------------------------------------------- ConditionalSkip / MultiAction / switch
def _pend(seed=0):
    return PendulumEnv(seed=seed)


def test_conditional_skip_partial_batch_on_serial_env():
    base = SerialEnv(3, functools.partial(_pend))
    try:
        inner = TransformedEnv(base, StepCounter(step_count_key="inner"))
        skip_rows = torch.tensor([True, False, False])
        env = TransformedEnv(inner, ConditionalSkip(lambda td: skip_rows))
        td = env.reset()
        td["action"] = torch.zeros(3, 1)
        out = env.step(td)
        assert out["next", "inner"].squeeze(-1).tolist() == [0, 1, 1]
        torch.testing.assert_close(out["next", "observation"][0], td["observation"][0])
        assert not torch.equal(out["next", "observation"][1], td["observation"][1])
        assert out["next", "reward"][0].item() == 0.0
    finally:
        base.close()
    vec = TransformedEnv(PendulumEnv(batch_size=[2], seed=0),
                         ConditionalSkip(lambda td: torch.tensor([True, False])))
    with pytest.raises(ValueError, match="part of its batch"):
        vec.rand_step(vec.reset())


def test_multi_action_steps_once_per_action_and_stops_at_done():
    env = TransformedEnv(_CountdownEnv(length=4), Compose(StepCounter(), MultiAction()))
    td = env.reset()
    td["action"] = torch.tensor([[0.1], [0.2], [0.3]])
    out = env.step(td)
    assert out["next", "step_count"].item() == 3
    torch.testing.assert_close(out["next", "reward"], torch.tensor([[0.1], [0.2], [0.3]]))
    nxt = env.step(env._step_mdp(out).set("action", torch.tensor([[1.0], [2.0], [3.0]])))
    # the episode ends after the 4th step: the chunk stops, the rest is zero reward
    assert bool(nxt["next", "done"].all())
    torch.testing.assert_close(nxt["next", "reward"], torch.tensor([[1.0], [0.0], [0.0]]))
    assert env.base_env.count.item() == 0  # reset itself once, not stepped past the end


def test_conditional_policy_switch_plays_the_other_turns():
    seen = []

    def other(td):
        seen.append(td["total"].item())
        return td.set("action", torch.full((1,), 2.0))

    env = TransformedEnv(PendulumEnv(seed=0), Compose(
        StepCounter(step_count_key="total"),
        ConditionalPolicySwitch(other, condition=lambda td: td["total"] % 3 != 0),
        StepCounter(step_count_key="main")))
    r = env.rollout(4, lambda td: td.set("action", torch.zeros(1)))
    assert r["total"].squeeze(-1).tolist() == [0, 3, 6, 9]
    assert r["main"].squeeze(-1).tolist() == [0, 1, 2, 3]
    assert seen == [1, 2, 4, 5, 7, 8, 10, 11]
    assert (r["action"] == 0).all()


# ---------------------------------------------------------------- AutoReset / VecGym / EndOfLife / chunks
@pytest.mark.parametrize("batch", [(), (3,)], ids=["single", "batch3"])
def test_auto_reset_matches_a_plain_env(batch):
    env = AutoResetEnv(_CountdownEnv(length=3, batch_size=batch), AutoResetTransform())
    r = env.rollout(9, break_when_any_done=False)
    obs, nxt, done = r["observation"], r["next", "observation"], r["next", "done"]
    # the step that ends an episode has NaN next obs; the following root obs is 0
    assert bool(nxt[done].isnan().all()) and not bool(nxt[~done].isnan().any())
    assert bool((obs[..., 1:, :][done[..., :-1, :]] == 0).all())
    assert env.base_env.resets == 1  # partial resets never reset the base env again
    keep = AutoResetEnv(_CountdownEnv(length=3), AutoResetTransform(replace=False)).rollout(4, break_when_any_done=False)
    assert keep["next", "observation"].squeeze(-1).tolist() == [1.0, 2.0, 0.0, 1.0]


def test_vec_gym_transform_swaps_final_observation():
    env = TransformedEnv(_CountdownEnv(length=2, final=True), VecGymEnvTransform())
    r = env.rollout(5, break_when_any_done=False)
    assert r["next", "observation"].squeeze(-1).tolist() == [1.0, 2.0, 1.0, 2.0, 1.0]
    assert r["observation"].squeeze(-1).tolist() == [0.0, 1.0, 0.0, 1.0, 0.0]
    assert "final" not in r.keys() and "final" not in r["next"].keys()


def test_end_of_life_and_loss_keys():
    t = EndOfLifeTransform(eol_attribute="lives")
    env = TransformedEnv(_LivesEnv([2]), t)
    r = env.rollout(4, break_when_any_done=False)
    assert r["next", "end-of-life"][0].squeeze(-1).tolist() == [False, True, False, True]
    assert not bool(r["next", "done"][:, :4].any())

    class Loss:
        def set_keys(self, **kw):
            self.keys = kw

    loss = Loss()
    t.register_keys(loss)
    assert loss.keys == {"done": "end-of-life", "terminated": "end-of-life"}
    with pytest.raises(AttributeError, match="ale"):
        TransformedEnv(_LivesEnv(), EndOfLifeTransform()).reset()


def test_action_chunks_against_loop_and_env_executes_first():
    torch.manual_seed(0)
    a = torch.randn(2, 6, 2)
    done = torch.rand(2, 6, 1) < 0.3
    out = ActionChunkTransform(3)(TensorDict({"action": a, ("next", "done"): done}, [2, 6]))
    chunk, pad = out["vla_action", "chunk"], out["action_is_pad"]
    for b in range(2):
        for t in range(6):
            last = t
            while last < 5 and not done[b, last, 0]:
                last += 1
            for k in range(3):
                idx = min(t + k, last)
                torch.testing.assert_close(chunk[b, t, k], a[b, idx])
                assert bool(pad[b, t, k]) == (t + k > last)
    env = TransformedEnv(PendulumEnv(seed=0), ActionChunkTransform(4))
    td = env.reset()
    td["vla_action", "chunk"] = torch.tensor([[0.3], [1.0], [1.0], [1.0]])
    ref = PendulumEnv(seed=0)
    r = ref.reset()
    r["action"] = torch.tensor([0.3])
    torch.testing.assert_close(env.step(td)["next", "observation"], ref.step(r)["next", "observation"])
