"""VmasEnv / VmasWrapper on VMAS's navigation and balance scenarios: specs, identity with
VMAS itself, resets, group maps and bad input."""

from __future__ import annotations

import pytest
import torch

vmas = pytest.importorskip("vmas")

from steersman import TensorDict  # noqa: E402
from steersman.envs import (  # noqa: E402
    InvalidActionError,
    MarlGroupMapType,
    check_env_specs,
)
from steersman.envs.libs.vmas import VmasEnv, VmasWrapper  # noqa: E402


@pytest.mark.parametrize("scenario", ["navigation", "balance"])
@pytest.mark.parametrize("continuous", [True, False], ids=["cont", "disc"])
def test_specs_layout_and_time_limit(scenario, continuous):
    env = VmasEnv(scenario, num_envs=3, max_steps=4, seed=0, continuous_actions=continuous, n_agents=2)
    assert env.group_map == {"agents": ["agent_0", "agent_1"]}
    check_env_specs(env)
    ro = env.rollout(9, break_when_any_done=False)
    assert ro["agents", "action"].shape == ((3, 9, 2, 2) if continuous else (3, 9, 2))
    assert ro["next", "agents", "reward"].shape == (3, 9, 2, 1)
    trunc = ro["next", "truncated"].squeeze(-1)
    assert trunc[:, [3, 7]].all() and trunc.sum() == 6  # the time limit, then an auto-reset
    assert torch.equal(ro["next", "agents", "done"].all(-2), ro["next", "done"])


@pytest.mark.parametrize("inference_mode", [False, True], ids=["grad", "inference"])
def test_same_numbers_as_vmas(inference_mode):
    # VMAS keeps one RNG state for all its envs: run the wrapper, then VMAS, from the same seed
    env = VmasEnv("navigation", num_envs=4, max_steps=50, seed=3, n_agents=3, inference_mode=inference_mode)
    raw = vmas.make_env("navigation", num_envs=4, max_steps=50, seed=3, n_agents=3, terminated_truncated=True)
    g = torch.Generator().manual_seed(0)
    actions = [torch.rand(4, 3, 2, generator=g) * 2 - 1 for _ in range(5)]
    env.set_seed(7)
    td = env.reset()
    mine = [td["agents", "observation"]]
    for a in actions:
        td["agents", "action"] = a
        td = env.step(td)["next"]
        mine += [td["agents", "observation"], td["agents", "reward"].squeeze(-1)]
    raw.seed(7)
    theirs = [torch.stack(raw.reset(), 1)]
    for a in actions:
        obs, rews, term, trunc, _ = raw.step(list(a.unbind(1)))
        theirs += [torch.stack(obs, 1), torch.stack(rews, 1)]
    assert all(torch.equal(x, y) for x, y in zip(mine, theirs))
    # ordinary tensors out either way (an inference tensor cannot be saved for backward)
    assert not any(x.is_inference() for x in td.values(include_nested=True, leaves_only=True))


def test_inference_mode_resets_and_gradients():
    # inference_mode: VMAS's state becomes inference tensors; every later reset/step through
    # the wrapper still works, in or outside no_grad, and its outputs feed autograd
    env = VmasEnv("navigation", num_envs=3, max_steps=4, seed=0, n_agents=2, inference_mode=True)
    ro = env.rollout(6, break_when_any_done=False)  # the time limit: a full reset
    td = env.reset(ro[..., -1]["next"].set("_reset", torch.tensor([[True], [False], [False]])))  # reset_at
    assert env.env.steps.tolist() == [0, 2, 2]
    with torch.enable_grad():
        td["agents", "action"] = torch.zeros(3, 2, 2, requires_grad=True)
        nxt = env.step(td)["next"]
        w = torch.ones(18, requires_grad=True)
        (nxt["agents", "observation"] @ w).sum().backward()
    assert w.grad is not None and not nxt["agents", "observation"].requires_grad


def test_partial_reset_keeps_other_worlds():
    env = VmasEnv("balance", num_envs=3, seed=0, n_agents=3)
    td = env.rollout(3)[..., -1]["next"]
    old = td["agents", "observation"].clone()
    cur = env.reset(td.set("_reset", torch.tensor([[False], [True], [False]])))
    obs = cur["agents", "observation"]
    assert torch.equal(obs[0], old[0]) and torch.equal(obs[2], old[2])
    assert not torch.equal(obs[1], old[1])
    assert env.env.steps.tolist() == [3, 0, 3]


def test_group_maps_and_bad_input():
    env = VmasEnv("navigation", num_envs=2, seed=0, n_agents=2, group_map=MarlGroupMapType.ONE_GROUP_PER_AGENT)
    assert env.group_map == {"agent_0": ["agent_0"], "agent_1": ["agent_1"]}
    check_env_specs(env)
    assert env.rollout(2)["agent_1", "observation"].shape == (2, 2, 1, 18)
    raw = vmas.make_env("navigation", num_envs=2, seed=0, n_agents=2)
    with pytest.raises(ValueError, match="'agent_1'.*no group"):
        VmasWrapper(raw, group_map={"agents": ["agent_0"]})
    with pytest.raises(ValueError, match="'agent_0'.*twice"):
        VmasWrapper(raw, group_map={"a": ["agent_0", "agent_1"], "b": ["agent_0"]})
    env = VmasWrapper(raw)
    td = env.reset()
    before = torch.stack(raw.get_from_scenario(True, False, False, False)[0], 1)
    td["agents"] = TensorDict({"action": torch.zeros(2, 3, 2)}, batch_size=[2])
    with pytest.raises(InvalidActionError, match=r"group 'agents'.*\[2, 3, 2\], expected \[2, 2, 2\]"):
        env.step(td)
    assert torch.equal(before, torch.stack(raw.get_from_scenario(True, False, False, False)[0], 1))
    with pytest.raises(TypeError, match="vmas Environment"):
        VmasWrapper(object())


def test_observation_norm_after_init_stats_on_unbounded_observations():
    """VMAS observations are Unbounded: the transformed spec's shape probe must work when
    the normalisation mixes in real loc/scale tensors (it used to fail on the meta device)."""
    from steersman.envs import ObservationNorm, TransformedEnv

    env = TransformedEnv(VmasEnv("navigation", num_envs=4, seed=0, n_agents=2),
                         ObservationNorm(in_keys=[("agents", "observation")], standard_normal=True))
    env.transform.init_stats(num_iter=3, reduce_dim=(0, 1, 2), cat_dim=0)
    spec = env.observation_spec["agents", "observation"]
    obs = env.rollout(3)["agents", "observation"]
    assert spec.shape == obs.shape[:1] + obs.shape[2:] and torch.isfinite(obs).all()


@pytest.mark.parametrize("inference_mode", [False, True], ids=["grad", "inference"])
def test_vmas_runs_in_the_wrappers_mode_whatever_the_callers(inference_mode, monkeypatch):
    """VMAS's step and resets run in the mode the wrapper was built with, also when the caller
    is in inference mode already (a collector): the wrapper enters it only when it differs;
    the numbers are the same from either caller mode."""
    from vmas.simulator.environment.environment import Environment

    seen = []
    for name in ("step", "reset"):
        real = getattr(Environment, name)

        def record(self, *args, _real=real, **kwargs):
            seen.append(torch.is_inference_mode_enabled())
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(Environment, name, record)

    def rollout(caller_inference):
        env = VmasEnv("navigation", num_envs=4, max_steps=3, seed=1, n_agents=2, inference_mode=inference_mode)
        torch.manual_seed(0)
        with torch.inference_mode(caller_inference):
            return env.rollout(5, break_when_any_done=False)  # a time-limit reset on the way

    outside, inside = rollout(False), rollout(True)
    assert len(seen) == 2 * (1 + 5 + 1) and all(mode == inference_mode for mode in seen), seen
    assert outside.keys(True, True) == inside.keys(True, True)
    for key in outside.keys(True, True):
        assert torch.equal(outside.get(key), inside.get(key)), key
