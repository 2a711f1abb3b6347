"""Battery over the torch-native multi-agent envs (navigation, predator-prey) x action
kinds x batch shapes: specs, group layout, seeding, auto-reset, dynamics against a plain
per-agent reference, compile, and bad input (state unchanged)."""

from __future__ import annotations

import math

import pytest
import torch

from steersman import TensorDict
from steersman.envs import (
    InvalidActionError,
    MarlGroupMapType,
    NavigationEnv,
    PredatorPreyEnv,
    check_env_specs,
    check_marl_grouping,
    step_mdp,
)
from steersman.envs.multiagent._base import CATEGORICAL_DIRECTIONS, uniforms
from steersman.envs.native._base import draw_uniforms, make_offsets

ENVS = [NavigationEnv, PredatorPreyEnv]
env_cls = pytest.mark.parametrize("cls", ENVS, ids=lambda c: c.__name__)
cat = pytest.mark.parametrize("categorical", [False, True], ids=["cont", "cat"])


def _actions(env, steps: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    spec = env.full_action_spec["agents", "action"]
    if env.categorical_actions:
        return [torch.randint(0, 5, spec.shape, generator=g) for _ in range(steps)]
    return [torch.rand(spec.shape, generator=g) * 2 - 1 for _ in range(steps)]


def _run(env, actions) -> TensorDict:
    td = env.reset()
    out = []
    for a in actions:
        td["agents", "action"] = a
        cur, td = env.step_and_maybe_reset(td)
        out.append(cur.copy())
    return torch.stack(out, len(env.batch_size))


# ---------------------------------------------------------------------- groups
def test_group_map_types():
    names = ["a", "b", "c"]
    assert MarlGroupMapType.ALL_IN_ONE_GROUP.get_group_map(names) == {"agents": names}
    assert MarlGroupMapType.ONE_GROUP_PER_AGENT.get_group_map(names) == {"a": ["a"], "b": ["b"], "c": ["c"]}
    for t in MarlGroupMapType:
        check_marl_grouping(t.get_group_map(names), names)


@pytest.mark.parametrize("gmap, words", [
    ({"red": ["a"], "blue": ["a", "b"]}, ["'a'", "twice", "'red'", "'blue'"]),
    ({"red": ["a", "a", "b"]}, ["'a'", "twice", "'red'"]),
    ({"red": ["a"]}, ["'b'", "no group"]),
    ({"red": ["a", "b"], "blue": []}, ["'blue'", "empty"]),
    ({"red": ["a", "b", "z"]}, ["'z'", "'red'", "not an agent"]),
    ({"red": "ab"}, ["'red'", "list"]),
])
def test_bad_group_maps(gmap, words):
    before = {k: list(v) if not isinstance(v, str) else v for k, v in gmap.items()}
    with pytest.raises(ValueError) as err:
        check_marl_grouping(gmap, ["a", "b"])
    for w in words:
        assert w in str(err.value), (w, str(err.value))
    assert gmap == before


# ---------------------------------------------------------------------- specs and layout
@env_cls
@cat
@pytest.mark.parametrize("bs", [(), (3,), (2, 2)], ids=lambda s: f"bs{list(s)}")
def test_specs_and_layout(cls, categorical, bs):
    env = cls(batch_size=bs, n_agents=3, max_steps=4, categorical_actions=categorical, seed=0)
    check_env_specs(env, max_steps=6)
    assert env.group_map == {"agents": ["agent_0", "agent_1", "agent_2"]}
    assert env.action_keys == [("agents", "action")]
    assert env.reward_keys == [("agents", "reward")]
    assert set(env.done_keys) == {"done", "terminated", "truncated", ("agents", "done"),
                                  ("agents", "terminated"), ("agents", "truncated")}
    assert env.full_observation_spec["agents"].shape == (*bs, 3)
    assert env.full_done_spec["agents"].shape == (*bs, 3)
    ro = env.rollout(9, break_when_any_done=False)
    assert ro["agents"].batch_size == (*bs, 9, 3)
    act = ro["agents", "action"]
    assert act.shape == ((*bs, 9, 3) if categorical else (*bs, 9, 3, 2))
    assert ro["next", "agents", "reward"].shape == (*bs, 9, 3, 1)
    # the time limit (4) truncates steps 4 and 8; every agent and the root agree
    trunc = ro["next", "truncated"]
    assert trunc.squeeze(-1).sum(-1).eq(2).all() or cls is NavigationEnv
    assert torch.equal(ro["next", "agents", "done"].any(-2), ro["next", "done"])
    assert torch.equal(ro["next", "agents", "done"].all(-2), ro["next", "done"])
    assert torch.equal(ro["next", "done"], ro["next", "terminated"] | ro["next", "truncated"])


def test_unbatched_num_envs_and_errors():
    assert NavigationEnv(5).batch_size == (5,)
    assert NavigationEnv().batch_size == ()
    for kw, word in [({"num_envs": 0}, "num_envs"), ({"n_agents": 0}, "n_agents"),
                     ({"max_steps": 0}, "max_steps"), ({"num_envs": 2, "batch_size": [2]}, "not both")]:
        with pytest.raises(ValueError, match=word):
            NavigationEnv(**kw)
    with pytest.raises(ValueError, match="n_prey"):
        PredatorPreyEnv(2, n_prey=0)


# ---------------------------------------------------------------------- seeding
@env_cls
@cat
def test_seeded_and_reproducible(cls, categorical):
    mk = lambda seed, n=4: cls(n, n_agents=2, max_steps=7, categorical_actions=categorical, seed=seed)  # noqa: E731
    a = _run(mk(3), _actions(mk(3), 20))
    b = _run(mk(3), _actions(mk(3), 20))
    c = _run(mk(4), _actions(mk(4), 20))
    assert torch.equal(a["agents", "observation"], b["agents", "observation"])
    assert torch.equal(a["next", "agents", "reward"], b["next", "agents", "reward"])
    assert not torch.equal(a["agents", "observation"], c["agents", "observation"])
    # a sub-env's stream does not depend on the batch size, nor on the other sub-envs
    small = mk(3, 2)
    assert torch.equal(small.reset()["state"], mk(3).reset()["state"][:2])
    # set_seed reproduces too
    env = mk(0)
    env.set_seed(3)
    assert torch.equal(env.reset()["state"], mk(3).reset()["state"])


def test_uniforms_match_native_draws():
    rng = torch.tensor([0, 7, -5, 2**31 - 1], dtype=torch.int32)
    u, nxt = uniforms(rng, make_offsets(5), torch.float32)
    ref, ref_nxt = draw_uniforms(rng, make_offsets(5), torch.float32)
    assert torch.equal(u, torch.stack(ref, -1)) and torch.equal(nxt, ref_nxt)


# ---------------------------------------------------------------------- resets
@env_cls
def test_autoreset_only_finished_subenvs(cls):
    env = cls(3, n_agents=2, max_steps=5, seed=0)
    td = env.reset()
    env.set_state(env.get_state())
    env._steps = torch.tensor([4, 0, 2], dtype=torch.int32)  # sub-env 0 hits the limit now
    before = env.get_state()
    td["agents", "action"] = torch.zeros(3, 2, 2)
    cur, nxt = env.step_and_maybe_reset(td)
    assert cur["next", "truncated"].squeeze(-1).tolist() == [True, False, False]
    assert cur["next", "agents", "truncated"][0].all() and not cur["next", "agents", "truncated"][1:].any()
    # sub-env 0 restarted (fresh state, all done flags cleared); 1 and 2 carry on
    assert not torch.equal(nxt["state"][0], cur["next", "state"][0])
    assert torch.equal(nxt["state"][1:], cur["next", "state"][1:])
    assert not nxt["done"].any() and not nxt["agents", "done"].any()
    assert env._steps.tolist() == [0, 1, 3]
    assert not torch.equal(before, env.get_state())


@env_cls
def test_partial_reset(cls):
    env = cls(3, n_agents=2, seed=0)
    td = env.rollout(3, break_when_any_done=False)[..., -1]
    cur = step_mdp(td, reward_keys=env.reward_keys, done_keys=env.done_keys, action_keys=env.action_keys)
    state = env.get_state()
    cur["_reset"] = torch.tensor([[False], [True], [False]])
    out = env.reset(cur)
    new = env.get_state()
    assert torch.equal(new[0], state[0]) and torch.equal(new[2], state[2])
    assert not torch.equal(new[1], state[1])
    assert torch.equal(out["state"][0], cur["state"][0]) and not torch.equal(out["state"][1], cur["state"][1])
    assert "_reset" not in out.keys()


def test_keeps_policy_entries_like_step_mdp():
    env = NavigationEnv(2, n_agents=3, seed=0)
    td = env.reset()
    td["hidden"] = torch.ones(2, 4)
    td["agents", "memory"] = torch.full((2, 3, 5), 2.0)
    td["agents", "action"] = torch.zeros(2, 3, 2)
    cur, nxt = env.step_and_maybe_reset(td)
    ref = step_mdp(cur, reward_keys=env.reward_keys, done_keys=env.done_keys, action_keys=env.action_keys)
    assert sorted(nxt.keys(include_nested=True, leaves_only=True), key=str) == \
        sorted(ref.keys(include_nested=True, leaves_only=True), key=str)
    assert torch.equal(nxt["agents", "memory"], td["agents", "memory"])
    assert ("agents", "action") not in nxt.keys(include_nested=True)


# ---------------------------------------------------------------------- dynamics vs a plain reference
def _nav_reference(state, force, shared):
    """Navigation, one agent at a time in plain Python floats."""
    n = len(state)
    dt, drag, accel, world = 0.1, 0.25, 2.0, 1.0
    new, prog = [], []
    for i in range(n):
        px, py, vx, vy, gx, gy = state[i]
        vx, vy = vx * (1 - drag) + force[i][0] * accel * dt, vy * (1 - drag) + force[i][1] * accel * dt
        rx, ry = px + vx * dt, py + vy * dt
        nx, ny = min(max(rx, -world), world), min(max(ry, -world), world)
        vx, vy = (vx if nx == rx else 0.0), (vy if ny == ry else 0.0)
        prog.append(10.0 * (math.hypot(gx - px, gy - py) - math.hypot(gx - nx, gy - ny)))
        new.append([nx, ny, vx, vy, gx, gy])
    if shared:
        prog = [sum(prog) / n] * n
    on_goal = all(math.hypot(s[4] - s[0], s[5] - s[1]) < 0.1 for s in new)
    rew = []
    for i in range(n):
        hits = sum(1 for j in range(n) if j != i and math.hypot(new[i][0] - new[j][0], new[i][1] - new[j][1]) < 0.1)
        rew.append(prog[i] - hits + (1.0 if on_goal else 0.0))
    return new, rew, on_goal


@pytest.mark.parametrize("shared", [True, False])
def test_navigation_matches_reference(shared):
    env = NavigationEnv(6, n_agents=3, seed=1, shared_reward=shared, max_steps=None)
    g = torch.Generator().manual_seed(0)
    s0 = env.get_state()
    s0[0, :, 0:2] = torch.tensor([[0.0, 0.0], [0.05, 0.02], [0.98, -0.99]])  # a collision, a wall
    s0[0, :, 2:4] = torch.tensor([[0.3, 0.0], [0.0, 0.0], [0.5, -0.5]])
    s0[1, :, 4:6] = s0[1, :, 0:2] + 0.01  # everyone on goal: terminates
    env.set_state(s0)
    td = env.rollout(1, auto_reset=False, tensordict=env._reset_td(
        NavigationEnv._observe(s0, env._c), NavigationEnv._global_state(s0, env._c)),
        policy=lambda t: t.set(("agents", "action"), torch.rand(6, 3, 2, generator=g) * 2 - 1))
    force = td["agents", "action"][:, 0]
    for b in range(6):
        new, rew, term = _nav_reference(s0[b].tolist(), force[b].tolist(), shared)
        assert torch.allclose(env.get_state()[b], torch.tensor(new), atol=1e-5)
        assert torch.allclose(td["next", "agents", "reward"][b, 0, :, 0], torch.tensor(rew), atol=1e-4)
        assert bool(td["next", "terminated"][b, 0]) == term
    assert bool(td["next", "terminated"][1, 0]) and not td["next", "truncated"].any()
    # observation = own position, velocity, goal - position, others - position
    obs = td["next", "agents", "observation"][0, 0]
    st = env.get_state()[0]
    assert torch.allclose(obs[1, :6], torch.cat([st[1, :4], st[1, 4:6] - st[1, :2]]))
    assert torch.allclose(obs[1, 6:], torch.cat([st[0, :2] - st[1, :2], st[2, :2] - st[1, :2]]))


@env_cls
def test_categorical_actions_are_unit_forces(cls):
    cont = cls(4, n_agents=2, seed=5)
    disc = cls(4, n_agents=2, seed=5, categorical_actions=True)
    g = torch.Generator().manual_seed(1)
    tc, td = cont.reset(), disc.reset()
    for _ in range(3):
        a = torch.randint(0, 5, (4, 2), generator=g)
        tc["agents", "action"] = torch.tensor(CATEGORICAL_DIRECTIONS)[a]
        td["agents", "action"] = a
        tc, td = cont.step_and_maybe_reset(tc)[1], disc.step_and_maybe_reset(td)[1]
        assert torch.equal(tc["state"], td["state"])


def test_predator_prey_capture_and_flee():
    env = PredatorPreyEnv(2, n_agents=2, n_prey=1, seed=0, shared_reward=False)
    s = env.get_state()
    s[..., :] = 0.0
    s[:, 0, 0:2] = torch.tensor([0.0, 0.0])  # predator 0 on the prey
    s[:, 1, 0:2] = torch.tensor([-0.7, 0.0])
    s[:, 2, 0:2] = torch.tensor([0.05, 0.0])  # the prey
    env.set_state(s)
    td = env._reset_td(PredatorPreyEnv._observe(s, env._c), PredatorPreyEnv._global_state(s, env._c))
    td["agents", "action"] = torch.zeros(2, 2, 2)
    out = env.step(td)
    r = out["next", "agents", "reward"][0, :, 0]
    assert r[0] > 9.0 and r[1] < 0.0  # predator 0 catches it; predator 1 only pays its distance
    assert env.get_state()[0, 2, 0] > 0.05  # the prey flees (+x, away from both)


# ---------------------------------------------------------------------- compile
@pytest.mark.parametrize("cls", [PredatorPreyEnv], ids=lambda c: c.__name__)  # same kernel code as navigation
def test_compiled_step_matches_eager(cls):
    eager = cls(4, n_agents=2, max_steps=5, seed=2)
    comp = cls(4, n_agents=2, max_steps=5, seed=2, compile={"backend": "eager"})  # fullgraph=True
    acts = _actions(eager, 8)
    a, b = _run(eager, acts), _run(comp, acts)
    assert torch.allclose(a["next", "agents", "observation"], b["next", "agents", "observation"], atol=1e-6)
    assert torch.equal(a["next", "done"], b["next", "done"])


# ---------------------------------------------------------------------- bad input
@env_cls
@cat
@pytest.mark.parametrize("how", ["agents", "features", "dtype_or_range"])
def test_bad_actions_leave_state_unchanged(cls, categorical, how):
    env = cls(3, n_agents=2, categorical_actions=categorical, seed=0)
    td = env.reset()
    state, steps, rng = env.get_state(), env._steps.clone(), env._rng.clone()
    if how == "agents":
        a = torch.zeros(3, 3, dtype=torch.int64) if categorical else torch.zeros(3, 3, 2)
        words = ["'agents'", "[3, 3", "expected [3, 2"]
    elif how == "features":
        a = torch.zeros(3, 2, 1, dtype=torch.int64) if categorical else torch.zeros(3, 2, 3)
        words = ["'agents'", "expected [3, 2"]
    else:
        a = torch.full((3, 2), 5) if categorical else torch.full((3, 2, 2), float("nan"))
        words = ["'agents'", "action"]
    # a group sub-TensorDict of batch [3] (not [3, n_agents]) can hold the wrong agent dim
    td["agents"] = TensorDict({"action": a}, batch_size=[3])
    for call in (env.step, env.step_and_maybe_reset):
        with pytest.raises(InvalidActionError) as err:
            call(td)
        for w in words:
            assert w in str(err.value), (w, str(err.value))
        assert torch.equal(env.get_state(), state) and torch.equal(env._steps, steps)
        assert torch.equal(env._rng, rng)
    del td["agents", "action"]
    with pytest.raises(KeyError, match="'agents', 'action'"):
        env.step(td)
