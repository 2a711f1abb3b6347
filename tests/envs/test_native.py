"""Battery over the torch-native batched envs x batch shapes.

Each test asserts a property that can fail: specs match data, seeding, partial and
automatic resets, rollout layout, done/terminated/truncated semantics, time limits,
Gymnasium-identical dynamics, compile equivalence, and bad-input errors.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from steersman import TensorDict
from steersman.envs import (
    AcrobotEnv,
    CartPoleEnv,
    EnvClosedError,
    GridWorldEnv,
    InvalidActionError,
    MountainCarContinuousEnv,
    MountainCarEnv,
    NativeEnv,
    PendulumEnv,
    check_env_specs,
    step_mdp,
)
from steersman.envs.native._base import draw_uniforms, lane_keys, make_offsets

ENVS = [CartPoleEnv, PendulumEnv, MountainCarEnv, MountainCarContinuousEnv, AcrobotEnv, GridWorldEnv]
SHAPES = [(), (4,), (2, 3)]
GYM_IDS = {
    CartPoleEnv: "CartPole-v1",
    PendulumEnv: "Pendulum-v1",
    MountainCarEnv: "MountainCar-v0",
    MountainCarContinuousEnv: "MountainCarContinuous-v0",
    AcrobotEnv: "Acrobot-v1",
}
TIME_LIMITS = {CartPoleEnv: 500, PendulumEnv: 200, MountainCarEnv: 200,
               MountainCarContinuousEnv: 999, AcrobotEnv: 500, GridWorldEnv: 100}

env_cls = pytest.mark.parametrize("cls", ENVS, ids=lambda c: c.__name__)
batch = pytest.mark.parametrize("bs", SHAPES, ids=lambda s: f"bs{list(s)}")


def _rollout_actions(env: NativeEnv, steps: int, seed: int = 0) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    return [env.action_spec.rand() for _ in range(steps)]


def _run(env: NativeEnv, actions: list[torch.Tensor]) -> TensorDict:
    """Steps with auto-reset through the given actions; returns the stacked transitions."""
    td = env.reset()
    out = []
    for a in actions:
        td["action"] = a
        cur, td = env.step_and_maybe_reset(td)
        out.append(cur.copy())
    return torch.stack(out, dim=len(env.batch_size))


# ----------------------------------------------------------------------------- specs
@env_cls
@batch
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_check_env_specs(cls, bs, dtype):
    env = cls(batch_size=bs, seed=0, dtype=dtype)
    check_env_specs(env, seed=1)
    check_env_specs(env, return_contiguous=False)
    assert env.observation_spec["observation"].dtype == (
        torch.int64 if cls is GridWorldEnv else dtype
    )
    assert env.reward_spec.dtype == dtype
    assert env.full_done_spec.keys() == ["done", "terminated", "truncated"]


@env_cls
@batch
def test_specs_shapes_and_keys(cls, bs):
    env = cls(batch_size=bs, seed=0)
    assert env.batch_size == torch.Size(bs)
    assert env.observation_spec.shape == torch.Size(bs)
    assert env.reward_spec.shape == torch.Size((*bs, 1))
    assert env.action_key == "action" and env.reward_key == "reward"
    assert env.done_keys == ["done", "terminated", "truncated"]
    assert env.observation_keys == ["observation"]
    assert env.state_keys == []
    fake = env.fake_tensordict()
    assert fake.batch_size == torch.Size(bs)
    assert env.observation_spec.is_in(fake) and env.full_action_spec.is_in(fake)
    assert env.input_spec["full_action_spec"] is env.full_action_spec
    assert "full_done_spec" in env.output_spec.keys()


@pytest.mark.parametrize("cls", [CartPoleEnv, MountainCarEnv, AcrobotEnv, GridWorldEnv],
                         ids=lambda c: c.__name__)
def test_one_hot_actions(cls):
    env = cls(batch_size=[5], seed=0, categorical_action_encoding=False)
    assert env.action_spec.shape == (5, env.action_spec.n)
    check_env_specs(env)
    env.set_seed(0)
    ref = cls(batch_size=[5], seed=0)
    torch.manual_seed(0)
    idx = ref.action_spec.rand()
    one_hot = torch.nn.functional.one_hot(idx, env.action_spec.n)
    a = ref.step(ref.reset().set("action", idx))["next", "observation"]
    b = env.step(env.reset().set("action", one_hot))["next", "observation"]
    assert torch.equal(a, b)


# ----------------------------------------------------------------------------- seeding
@env_cls
@batch
def test_same_seed_same_rollout(cls, bs):
    env = cls(batch_size=bs)
    actions = _rollout_actions(env, 40)
    env.set_seed(7)
    first = _run(env, actions)
    env.set_seed(7)
    second = _run(env, actions)
    assert (first == second).all()
    env.set_seed(8)
    third = _run(env, actions)
    assert not torch.equal(first["observation"], third["observation"])


@env_cls
def test_sub_envs_get_distinct_initial_states(cls):
    env = cls(batch_size=[16], seed=3)
    obs = env.reset()["observation"]
    flat = obs.reshape(16, -1)
    distinct = len({tuple(row.tolist()) for row in flat})
    # the grid world has only 24 start cells: allow a few collisions there
    assert distinct >= (10 if cls is GridWorldEnv else 16)


def test_seed_streams_do_not_depend_on_batch_size():
    small = CartPoleEnv(batch_size=[3], seed=11)
    large = CartPoleEnv(batch_size=[8], seed=11).reset()["observation"]
    assert torch.equal(small.reset()["observation"], large[:3])
    grid = CartPoleEnv(batch_size=[2, 4], seed=11)
    assert torch.equal(grid.reset()["observation"].reshape(8, 4), large)


def test_set_seed_returns_next_seed_and_construction_seed_matches():
    env = CartPoleEnv(batch_size=[4], seed=5)
    s1 = env.reset()["observation"]
    nxt = env.set_seed(5)
    assert isinstance(nxt, int) and nxt != 5
    assert env.set_seed(5, static_seed=True) == 5
    assert torch.equal(env.reset()["observation"], s1)
    torch.manual_seed(0)
    a = CartPoleEnv(batch_size=[4]).reset()["observation"]
    torch.manual_seed(0)
    b = CartPoleEnv(batch_size=[4]).reset()["observation"]
    assert torch.equal(a, b)


def test_reset_distribution_matches_gymnasium_bounds():
    env = CartPoleEnv(batch_size=[4000], seed=0)
    obs = env.reset()["observation"]
    assert obs.min() >= -0.05 and obs.max() < 0.05
    assert abs(obs.mean().item()) < 0.002
    assert abs(obs.std().item() - 0.1 / math.sqrt(12)) < 0.002  # uniform on [-0.05, 0.05)
    pend = PendulumEnv(batch_size=[4000], seed=0)
    th = pend.get_state()["th"]
    assert th.min() >= -math.pi and th.max() < math.pi and th.std() > 1.5
    mc = MountainCarEnv(batch_size=[100], seed=0).get_state()
    assert (mc["velocity"] == 0).all() and mc["position"].min() >= -0.6 and mc["position"].max() < -0.4


def test_counter_rng_is_uniform_and_uncorrelated():
    u, nxt = draw_uniforms(lane_keys(0, torch.Size([20000])), make_offsets(2), torch.float64)
    a, b = u
    assert abs(a.mean().item() - 0.5) < 0.01 and abs(a.var().item() - 1 / 12) < 0.005
    assert abs(torch.corrcoef(torch.stack([a, b]))[0, 1].item()) < 0.03
    hist = torch.histc(a.float(), bins=10, min=0, max=1)
    assert (hist - 2000).abs().max() < 200
    u2, _ = draw_uniforms(nxt, make_offsets(2), torch.float64)
    assert abs(torch.corrcoef(torch.stack([a, u2[0]]))[0, 1].item()) < 0.03


# ----------------------------------------------------------------------------- resets
@env_cls
@batch
def test_partial_reset_keeps_other_sub_envs(cls, bs):
    env = cls(batch_size=bs, seed=0)
    td = env.reset()
    for a in _rollout_actions(env, 3):
        td["action"] = a
        td = step_mdp(env.step(td))
    before = env.get_state()
    n = max(1, math.prod(bs))
    mask = (torch.arange(n) % 2 == 0).reshape(bs) if bs else torch.tensor(True)
    td["_reset"] = mask.unsqueeze(-1)
    out = env.reset(td)
    after = env.get_state()
    assert "_reset" not in out.keys()
    keep = ~mask
    for name in env.state_names:
        assert torch.equal(after[name][keep], before[name][keep])
    assert (after["step_count"][mask] == 0).all()
    assert (after["step_count"][keep] == 3).all()
    assert torch.equal(out["observation"][keep], td["observation"][keep])
    if cls is not GridWorldEnv:  # continuous states: a reset state differs from the old one
        moved = [not torch.equal(after[s][mask], before[s][mask]) for s in env.state_names]
        assert any(moved)
    assert not out["done"][mask].any()


@env_cls
def test_reset_mask_of_shape_batch_is_accepted(cls):
    env = cls(batch_size=[4], seed=0)
    td = env.reset()
    td["_reset"] = torch.tensor([True, False, False, True])
    before = env.get_state()
    env.reset(td)
    after = env.get_state()
    assert torch.equal(after[env.state_names[0]][1:3], before[env.state_names[0]][1:3])


@pytest.mark.parametrize("shape", [(3, 1), (4, 2), (1,), (4, 1, 1)])
def test_reset_mask_of_wrong_shape_raises(shape):
    env = CartPoleEnv(batch_size=[4], seed=0)
    td = env.reset()
    td.set("_reset", torch.zeros(shape, dtype=torch.bool)) if shape[0] == 4 else None
    if shape[0] != 4:
        bad = TensorDict({"_reset": torch.zeros(shape, dtype=torch.bool)}, batch_size=[])
        with pytest.raises(ValueError, match="_reset"):
            env.reset(bad)
        return
    with pytest.raises(ValueError, match=r"'_reset' mask has shape"):
        env.reset(td)


def test_reset_mask_must_be_bool():
    env = CartPoleEnv(batch_size=[4], seed=0)
    td = env.reset().set("_reset", torch.ones(4, 1, dtype=torch.int64))
    with pytest.raises(ValueError, match="bool tensor"):
        env.reset(td)


@env_cls
@batch
def test_step_and_maybe_reset_auto_resets_finished_sub_envs(cls, bs):
    env = cls(batch_size=bs, seed=0, max_episode_steps=7)
    td = env.reset()
    seen_done = False
    for a in _rollout_actions(env, 20):
        td["action"] = a
        cur, td = env.step_and_maybe_reset(td)
        done = cur["next", "done"]
        steps = env.get_state()["step_count"]
        assert (steps[done.squeeze(-1)] == 0).all()  # finished sub-envs restarted
        assert (steps[~done.squeeze(-1)] > 0).all()
        assert not td["done"].any() and not td["terminated"].any() and not td["truncated"].any()
        assert "action" not in td.keys() and "reward" not in td.keys()
        unchanged = ~done.squeeze(-1)
        assert torch.equal(td["observation"][unchanged], cur["next", "observation"][unchanged])
        if done.any():
            seen_done = True
            assert torch.equal(td["observation"], env.reset(td.copy().set(
                "_reset", torch.zeros(*bs, 1, dtype=torch.bool)))["observation"])
    assert seen_done


def test_step_and_maybe_reset_carries_other_entries():
    env = CartPoleEnv(batch_size=[3], seed=0)
    td = env.reset()
    td["hidden"] = torch.ones(3, 5)
    td["action"] = torch.ones(3, dtype=torch.int64)
    _, nxt = env.step_and_maybe_reset(td)
    assert torch.equal(nxt["hidden"], torch.ones(3, 5))


@env_cls
def test_eager_subset_resets_equal_full_resets(cls):
    """The CPU eager path (numpy, finished sub-envs only) draws what the all-sub-envs
    ``torch.where`` path draws (used on other devices and when compiled)."""
    a = cls(batch_size=[6], seed=2, max_episode_steps=5)
    b = cls(batch_size=[6], seed=2, max_episode_steps=5)
    b._subset_resets = False
    actions = _rollout_actions(a, 23)
    ra, rb = _run(a, actions), _run(b, actions)
    assert torch.equal(ra["observation"], rb["observation"])
    assert torch.equal(ra["next", "observation"], rb["next", "observation"])
    for name in a.state_names:
        assert torch.equal(a.get_state()[name], b.get_state()[name])


# ----------------------------------------------------------------------------- rollouts
@env_cls
@batch
def test_rollout_layout_time_last(cls, bs):
    env = cls(batch_size=bs, seed=0)
    ro = env.rollout(12, break_when_any_done=False)
    assert ro.batch_size == torch.Size((*bs, 12))
    obs_shape = env.observation_spec["observation"].shape[len(bs):]
    assert ro["observation"].shape == torch.Size((*bs, 12, *obs_shape))
    assert ro["next", "reward"].shape == torch.Size((*bs, 12, 1))
    assert ro["next", "done"].dtype is torch.bool
    # step t's next observation is step t+1's observation unless the sub-env was reset
    nb = len(bs)
    nxt = ro["next", "observation"].narrow(nb, 0, 11)
    cur = ro["observation"].narrow(nb, 1, 11)
    not_done = ~ro["next", "done"].narrow(nb, 0, 11).squeeze(-1)
    assert torch.equal(nxt[not_done], cur[not_done])


@env_cls
@batch
def test_done_is_terminated_or_truncated(cls, bs):
    env = cls(batch_size=bs, seed=0, max_episode_steps=9)
    ro = env.rollout(30, break_when_any_done=False)
    nxt = ro["next"]
    assert torch.equal(nxt["done"], nxt["terminated"] | nxt["truncated"])
    assert nxt["truncated"].any()  # 30 steps > the 9-step limit


@env_cls
def test_truncation_at_gymnasium_time_limit(cls):
    env = cls(batch_size=[3], seed=0)
    limit = TIME_LIMITS[cls]
    assert env.max_episode_steps == limit
    td = env.reset()
    env.set_state({"step_count": limit - 2})
    flags = []
    for a in _rollout_actions(env, 3):
        td["action"] = a
        cur, td = env.step_and_maybe_reset(td)
        flags.append(cur["next", "truncated"].squeeze(-1))
    assert not flags[0].any()
    assert flags[1].all()  # the limit-th step
    assert not flags[2].any()  # restarted


def test_truncation_can_be_disabled():
    env = PendulumEnv(batch_size=[2], seed=0, max_episode_steps=None)
    ro = env.rollout(250, break_when_any_done=False)
    assert not ro["next", "done"].any()
    with pytest.raises(ValueError, match="max_episode_steps"):
        PendulumEnv(max_episode_steps=0)


def test_rollout_breaks_when_any_done_and_marks_truncated():
    env = CartPoleEnv(batch_size=[4], seed=0)
    ro = env.rollout(1000)
    steps = ro.batch_size[-1]
    assert steps < 1000
    assert ro["next", "done"][:, -1].any() and not ro["next", "done"][:, :-1].any()
    ro = env.rollout(5, set_truncated=True, break_when_any_done=False)
    assert ro["next", "truncated"][:, -1].all() and ro["next", "done"][:, -1].all()


def test_rollout_break_when_all_done_freezes_finished_sub_envs():
    env = CartPoleEnv(batch_size=[3], seed=0)
    ro = env.rollout(1000, break_when_any_done=False, break_when_all_done=True)
    done = ro["next", "done"].squeeze(-1)
    assert done[:, -1].all()  # every sub-env ended
    first = done.float().argmax(-1)
    assert len(set(first.tolist())) > 1  # they ended at different steps
    for i, t in enumerate(first.tolist()):
        tail = ro["next", "observation"][i, t:]
        assert (tail == tail[0]).all()  # repeated last transition after the end


def test_rollout_with_policy_and_callback():
    env = CartPoleEnv(batch_size=[2], seed=0)
    calls = []

    def policy(td):
        td["action"] = (td["observation"][..., 2] > 0).long()  # push towards the lean
        return td

    ro = env.rollout(50, policy, callback=lambda e, td: calls.append(td.batch_size))
    assert len(calls) == ro.batch_size[-1]
    assert torch.equal(ro["action"], (ro["observation"][..., 2] > 0).long())
    assert ro.batch_size[-1] > 30  # the simple controller balances for a while


def test_rollout_without_auto_reset_needs_a_tensordict():
    env = CartPoleEnv(batch_size=[2], seed=0)
    with pytest.raises(ValueError, match="auto_reset"):
        env.rollout(3, auto_reset=False)
    td = env.reset()
    ro = env.rollout(3, auto_reset=False, tensordict=td, break_when_any_done=False)
    assert torch.equal(ro["observation"][:, 0], td["observation"])


# ----------------------------------------------------------------------------- dynamics
def _gym_state(cls, state: dict, i: int) -> np.ndarray:
    return np.array([state[name].reshape(-1)[i].item() for name in cls.state_names], dtype=np.float64)


def _gym_action(cls, a: torch.Tensor, i: int):
    v = a.reshape(a.shape[0], -1)[i] if a.ndim > 1 else a[i]
    if cls in (PendulumEnv, MountainCarContinuousEnv):
        return v.numpy().astype(np.float32)
    return int(v.item())


@pytest.mark.parametrize("cls", list(GYM_IDS), ids=lambda c: c.__name__)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_trajectories_match_gymnasium(cls, dtype):
    """Same initial states and actions: observations, rewards and flags equal Gymnasium's
    (``gymnasium.make(id)``, whose ``TimeLimit`` gives ``truncated``) over several episodes."""
    gym = pytest.importorskip("gymnasium")
    n = 3
    steps = {CartPoleEnv: 300, PendulumEnv: 230, MountainCarEnv: 230,
             MountainCarContinuousEnv: 400, AcrobotEnv: 150}[cls]
    if cls is MountainCarContinuousEnv:
        steps = 1050
    env = cls(batch_size=[n], seed=0, dtype=dtype)
    genvs = [gym.make(GYM_IDS[cls]) for _ in range(n)]
    td = env.reset()

    def sync(i):  # start gym sub-env i where ours starts: reset (time limit) + state
        genvs[i].reset(seed=i)
        genvs[i].unwrapped.state = _gym_state(cls, env.get_state(), i)

    for i in range(n):
        sync(i)
    torch.manual_seed(0)
    spec = env.action_spec
    if cls in (PendulumEnv, MountainCarContinuousEnv):  # out-of-range actions are clipped
        actions = [(torch.rand(n, 1) * 2 - 1) * spec.high * 1.3 for _ in range(steps)]
    else:
        actions = [spec.rand() for _ in range(steps)]
    atol = 1e-5 if dtype is torch.float64 else 2e-4
    if cls is PendulumEnv:  # Gymnasium computes the torque terms in float32 (NumPy 2 rules)
        atol *= 10
    if cls is AcrobotEnv and dtype is torch.float32:
        atol = 2e-2  # chaotic: float32 rounding grows over the episode
    episodes = 0
    for t, a in enumerate(actions):
        td["action"] = a.to(spec.dtype)
        cur, td = env.step_and_maybe_reset(td)
        nxt = cur["next"]
        for i in range(n):
            obs, rew, term, trunc, _ = genvs[i].step(_gym_action(cls, a, i))
            np.testing.assert_allclose(nxt["observation"][i].double().numpy(), obs, atol=atol,
                                       err_msg=f"step {t} sub-env {i}")
            assert nxt["reward"][i].item() == pytest.approx(rew, abs=atol * 10)
            assert bool(nxt["terminated"][i]) == term, f"terminated differs at step {t} sub-env {i}"
            assert bool(nxt["truncated"][i]) == trunc, f"truncated differs at step {t} sub-env {i}"
            if term or trunc:
                episodes += 1
                sync(i)
    if cls is not AcrobotEnv:
        assert episodes >= 1  # the comparison crossed episode boundaries


def test_cartpole_reaches_the_time_limit_like_gymnasium():
    gym = pytest.importorskip("gymnasium")
    env = CartPoleEnv(batch_size=[1], seed=0, dtype=torch.float64)
    genv = gym.make("CartPole-v1")
    td = env.reset()
    genv.reset(seed=0)
    genv.unwrapped.state = _gym_state(CartPoleEnv, env.get_state(), 0)
    for t in range(500):
        obs = td["observation"][0]
        a = int((obs[2] + 0.1 * obs[3]).item() > 0)  # a balancing controller
        td["action"] = torch.tensor([a])
        cur, td = env.step_and_maybe_reset(td)
        gobs, _, term, trunc, _ = genv.step(a)
        np.testing.assert_allclose(cur["next", "observation"][0].numpy(), gobs, atol=1e-5)
        assert not term
        assert bool(cur["next", "truncated"][0]) == trunc == (t == 499)


def test_gridworld_moves():
    env = GridWorldEnv(size=3, batch_size=[4], seed=0)
    env.set_state({"cell": torch.tensor([0, 4, 2, 7])})
    td = TensorDict({"action": torch.tensor([0, 1, 1, 1])}, batch_size=[4])  # up at the top wall, right, right into wall, right to goal
    out = env.step(td)["next"]
    assert out["observation"].tolist() == [0, 5, 2, 8]
    assert out["terminated"].squeeze(-1).tolist() == [False, False, False, True]
    assert out["reward"].squeeze(-1).tolist() == [0.0, 0.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="size"):
        GridWorldEnv(size=1)


# ----------------------------------------------------------------------------- compile
@env_cls
@pytest.mark.parametrize("autoreset", [False, True])
def test_kernel_compiles_fullgraph(cls, autoreset):
    from torch._dynamo.testing import CompileCounter

    env = cls(batch_size=[4], seed=0)
    counter = CompileCounter()
    kernel = torch.compile(type(env)._kernel, backend=counter, fullgraph=True)
    torch._dynamo.reset()
    a = env.action_spec.rand()
    if not env._categorical:
        a = a.argmax(-1)
    out = kernel(env._state, env._steps, env._rng, env._offsets, a, env._c_float, 1,
                 env.max_episode_steps, autoreset, env._udtype, True)
    assert counter.frame_count == 1
    ref = type(env)._kernel(env._state, env._steps, env._rng, env._offsets, a, env._c_float, 1,
                            env.max_episode_steps, autoreset, env._udtype, True)
    assert torch.equal(out[0], ref[0]) and torch.equal(out[3][2], ref[3][2])


@env_cls
def test_env_methods_compile_fullgraph(cls):
    """``torch.compile(env.step)`` / ``torch.compile(env.step_and_maybe_reset)`` with
    ``fullgraph=True``: one graph (TensorDicts in and out), same results as eager."""
    from torch._dynamo.testing import CompileCounter

    eager = cls(batch_size=[3], seed=1, max_episode_steps=4)
    traced = cls(batch_size=[3], seed=1, max_episode_steps=4)
    counter = CompileCounter()
    step_reset = torch.compile(traced.step_and_maybe_reset, backend=counter, fullgraph=True)
    te, tt = eager.reset(), traced.reset()
    for a in _rollout_actions(eager, 9):
        te["action"], tt["action"] = a, a.clone()
        oe, te = eager.step_and_maybe_reset(te)
        ot, tt = step_reset(tt)
        assert (oe == ot).all() and (te == tt).all()
    assert counter.frame_count == 1  # one graph, no recompilation across steps
    counter = CompileCounter()
    step = torch.compile(traced.step, backend=counter, fullgraph=True)
    te["action"], tt["action"] = a, a.clone()
    assert (eager.step(te) == step(tt)).all()
    assert counter.frame_count == 1


@env_cls
@batch
def test_compiled_env_equals_eager(cls, bs):
    """``compile=True`` (here the ``aot_eager`` backend: the traced graph, run by eager
    kernels) gives bit-identical rollouts, resets included."""
    eager = cls(batch_size=bs, seed=4, max_episode_steps=6)
    compiled = cls(batch_size=bs, seed=4, max_episode_steps=6, compile={"backend": "aot_eager"})
    actions = _rollout_actions(eager, 15)
    a, b = _run(eager, actions), _run(compiled, actions)
    assert (a == b).all()
    assert a["next", "done"].any()  # resets happened inside the compiled step


# inductor's generated code for one discrete and, through aot_eager (the traced, functionalized
# graph; no code generation: ~9 s less of CI), one continuous env
@pytest.mark.parametrize("cls, compile", [(CartPoleEnv, True), (PendulumEnv, {"backend": "aot_eager"})],
                         ids=["CartPoleEnv-inductor", "PendulumEnv-aot_eager"])
def test_inductor_compiled_env_matches_eager(cls, compile):
    eager = cls(batch_size=[64], seed=4, max_episode_steps=20, dtype=torch.float64)
    compiled = cls(batch_size=[64], seed=4, max_episode_steps=20, dtype=torch.float64, compile=compile)
    actions = _rollout_actions(eager, 30)
    a, b = _run(eager, actions), _run(compiled, actions)
    torch.testing.assert_close(a["next", "observation"], b["next", "observation"], atol=1e-9, rtol=0)
    torch.testing.assert_close(a["observation"], b["observation"], atol=1e-9, rtol=0)
    assert torch.equal(a["next", "done"], b["next", "done"])
    assert torch.equal(a["next", "truncated"], b["next", "truncated"])
    assert a["next", "done"].any()
    # step() (no auto-reset) goes through the compiled kernel too
    td = compiled.reset()
    td["action"] = actions[0]
    assert compiled.step(td)["next", "observation"].shape == (64, compiled.observation_spec["observation"].shape[-1])


# ----------------------------------------------------------------------------- bad input
def test_wrong_action_shape_or_dtype_raises():
    env = CartPoleEnv(batch_size=[4], seed=0)
    td = env.reset()
    td["action"] = torch.ones(4, 1, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"action has shape \[4, 1\].*expected shape \[4\]"):
        env.step(td)
    td["action"] = torch.ones(4)
    with pytest.raises(ValueError, match="dtype torch.float32"):
        env.step_and_maybe_reset(td)
    pend = PendulumEnv(batch_size=[2], seed=0)
    td = pend.reset()
    td["action"] = torch.zeros(2, 1, dtype=torch.int64)
    with pytest.raises(ValueError, match="Bounded"):
        pend.step(td)
    with pytest.raises(KeyError, match="no 'action' entry"):
        pend.step(pend.reset())


def test_out_of_spec_actions_refused_unless_check_is_off():
    """Action 5 on CartPole used to push with 90 N; now refused, unless ``check=False``."""
    def x_dot_after(action, check):
        env = CartPoleEnv(seed=0, check=check)
        td = env.reset()
        env.set_state({"x": 0.0, "x_dot": 0.0, "theta": 0.0, "theta_dot": 0.0})
        td["action"] = torch.tensor(action)
        return float(env.step(td)["next", "observation"][1])

    with pytest.raises(InvalidActionError, match=r"CartPoleEnv.step: action 'action' = 5 is outside .*Categorical"):
        x_dot_after(5, True)
    assert CartPoleEnv(check=False).check is False
    assert x_dot_after(5, False) > 8 * x_dot_after(1, True) > 0  # 90 N against 10 N: unchecked, as asked


def test_check_flag_validates_action_values():
    env = PendulumEnv(batch_size=[3], seed=0)
    td = env.reset()
    td["action"] = torch.tensor([[0.5], [3.0], [-1.0]])
    env.step(td)  # out-of-range torques pass the default check: the dynamics clip them
    with pytest.raises(InvalidActionError, match=r"outside the action spec Bounded.*3\.0 is not in"):
        env.step(td, check=True)
    td["action"] = env.action_spec.project(td["action"])
    env.step(td, check=True)
    cp = CartPoleEnv(batch_size=[2], seed=0)
    with pytest.raises(ValueError, match="Categorical"):
        cp.step(cp.reset().set("action", torch.tensor([0, 2])), check=True)


def test_closed_env_raises():
    env = CartPoleEnv(batch_size=[2], seed=0)
    td = env.reset()
    td["action"] = torch.zeros(2, dtype=torch.int64)
    with env:
        env.step(td)
    assert env.is_closed
    env.close()  # idempotent
    for call in (lambda: env.step(td), lambda: env.reset(), lambda: env.step_and_maybe_reset(td),
                 lambda: env.rollout(2)):
        with pytest.raises(EnvClosedError, match="closed"):
            call()


def test_set_state_validates_names():
    env = CartPoleEnv(batch_size=[2], seed=0)
    with pytest.raises(KeyError, match="unknown state entries"):
        env.set_state({"angle": 0.0})
    with pytest.raises(ValueError, match="components"):
        env.set_state(torch.zeros(2, 3))
    env.set_state(torch.arange(8.0).reshape(2, 4))
    assert env.get_state()["theta"].tolist() == [2.0, 6.0]
    with pytest.raises(TypeError, match="floating"):
        CartPoleEnv(dtype=torch.int64)
    with pytest.raises(TypeError, match="params"):
        CartPoleEnv(params=object())


def test_params_change_the_dynamics():
    from steersman.envs.native import CartPoleParams

    light = CartPoleEnv(batch_size=[1], seed=0, params=CartPoleParams(gravity=1.0))
    std = CartPoleEnv(batch_size=[1], seed=0)
    td = TensorDict({"action": torch.zeros(1, dtype=torch.int64)}, batch_size=[1])
    outs = []
    for e in (light, std):
        e.set_state(torch.tensor([[0.0, 0.0, 0.1, 0.0]]))
        outs.append(e.step(td.copy())["next", "observation"])
    assert outs[0][0, 3] < outs[1][0, 3]  # weaker gravity: the pole falls slower


def test_to_same_device_is_a_no_op_and_repr():
    env = CartPoleEnv(batch_size=[2], seed=0)
    assert env.to("cpu") is env
    assert "CartPoleEnv" in repr(env) and "max_episode_steps=500" in repr(env)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@env_cls
def test_cuda_matches_cpu(cls):
    cpu = cls(batch_size=[8], seed=1, max_episode_steps=5)
    gpu = cls(batch_size=[8], seed=1, max_episode_steps=5, device="cuda")
    actions = _rollout_actions(cpu, 12)
    a = _run(cpu, actions)
    b = _run(gpu, [x.cuda() for x in actions]).cpu()
    assert torch.equal(a["next", "done"], b["next", "done"])
    torch.testing.assert_close(a["next", "observation"], b["next", "observation"], atol=1e-4, rtol=0)
    moved = cls(batch_size=[8], seed=1).to("cuda")
    assert moved.reset()["observation"].device.type == "cuda"


# ---------------------------------------------------------------- public per-row seeding (many seeds in one env)
@env_cls
def test_set_seed_per_row_equals_each_seed_alone(cls):
    """Row k of a [3, 2] env seeded per row draws the resets and auto-resets of a [2] env
    seeded seeds[k], over a rollout with episode ends; rng_state round-trips."""
    seeds = [5, 11, 2**40 + 3]
    many = cls(batch_size=[3, 2])
    many.set_seed_per_row(seeds)
    alone = [cls(batch_size=[2], seed=s) for s in seeds]
    saved = many.rng_state
    first = many.reset()["observation"]
    for k, env in enumerate(alone):
        assert torch.equal(first[k], env.reset()["observation"])
    td = TensorDict({"observation": first}, [3, 2])
    singles = [TensorDict({"observation": first[k]}, [2]) for k in range(3)]
    for _ in range(60):
        action = many.action_spec.rand()
        td["action"] = action
        td, nxt = many.step_and_maybe_reset(td)
        for k, env in enumerate(alone):
            singles[k]["action"] = action[k]
            out, singles[k] = env.step_and_maybe_reset(singles[k])
            assert torch.equal(out["next", "observation"], td["next", "observation"][k])
            assert torch.equal(out["next", "done"], td["next", "done"][k])
        td = nxt
    many.set_rng_state(saved)
    assert torch.equal(many.reset()["observation"], first)


def test_per_row_seeding_refuses_bad_input():
    env = CartPoleEnv(batch_size=[2, 3], seed=0)
    before = env.rng_state
    with pytest.raises(ValueError, match=r"one seed per row.*got 3 seeds for batch_size \[2, 3\]"):
        env.set_seed_per_row([1, 2, 3])
    with pytest.raises(ValueError, match="at least 2 dims"):
        CartPoleEnv(batch_size=[4]).set_seed_per_row([1, 2, 3, 4])
    with pytest.raises(ValueError, match=r"expected an int32 tensor of shape \[2, 3\], got torch.int64 \[2, 3\]"):
        env.set_rng_state(torch.zeros(2, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"shape \[2, 3\], got torch.int32 \[3\]"):
        env.set_rng_state(torch.zeros(3, dtype=torch.int32))
    assert torch.equal(env.rng_state, before)
