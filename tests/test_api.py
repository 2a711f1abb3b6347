"""The Python API: steersman.train / steersman.load / Agent.act, discrete and continuous,
NumPy and torch, batched and unbatched; config errors; loading executes no code."""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import steersman
from steersman.recipes.config import ConfigError
from steersman.recipes.run import RunDirError
from steersman.tensordict import TensorDict
from steersman.tensordict.nn import ExplorationType, set_exploration_type

COMMON = {"quiet": True, "eval": {"episodes": 2, "interval": 0}, "logger": {"backends": ["csv"]},
          "checkpoint": {"interval": 0}}
TINY = {
    "ppo": {"env": {"name": "CartPole-v1", "num_envs": 4}, "total_frames": 256, "n_steps": 16, "epochs": 2,
            "minibatch_size": 64},
    "sac": {"env": {"name": "Pendulum-v1", "num_envs": 1}, "total_frames": 128, "frames_per_batch": 16,
            "learning_starts": 32, "batch_size": 32, "hidden_sizes": [32, 32]},
}


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory):
    return steersman.train("ppo", run_dir=tmp_path_factory.mktemp("api") / "ppo", **COMMON, **TINY["ppo"])


@pytest.fixture(scope="module")
def sac_run(tmp_path_factory):
    return steersman.train("sac", run_dir=tmp_path_factory.mktemp("api") / "sac", **COMMON, **TINY["sac"])


def reference_action(agent, obs: torch.Tensor) -> torch.Tensor:
    """The policy's deterministic action for a batch, called the long way."""
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        return agent.policy(TensorDict({"observation": obs}, obs.shape[:1]))["action"]


def test_import_steersman_stays_light():
    """`import steersman` loads no recipes (nor envs); the API names resolve on first access."""
    out = subprocess.run([sys.executable, "-c", "import sys, steersman; print(sorted(m for m in sys.modules "
                          "if m.startswith(('steersman.recipes', 'steersman.api', 'steersman.envs'))))"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
    assert steersman.train.__module__ == "steersman.api" and steersman.Agent.__name__ == "Agent"
    assert {"train", "load", "Agent"} <= set(dir(steersman))
    with pytest.raises(AttributeError, match="no attribute 'trian'"):
        steersman.trian  # noqa: B018


def test_train_returns_the_run(ppo_run):
    assert ppo_run.algo == "ppo" and ppo_run.run_dir.is_dir()
    assert ppo_run.frames >= 256 and ppo_run.summary["algo"] == "ppo"
    assert ppo_run.final_return is not None and ppo_run.final_return > 0
    paths = ppo_run.paths
    assert paths["policy"].is_file() and paths["metrics"].is_file() and paths["checkpoint"].is_dir()
    assert ppo_run.config.total_frames == 256 and ppo_run.config.env.num_envs == 4
    assert os.fspath(ppo_run) == str(ppo_run.run_dir)


def test_discrete_act_numpy_and_torch(ppo_run):
    agent = steersman.load(ppo_run)  # a TrainedRun is a path too
    assert agent.algo == "ppo" and agent.observation_shape == (4,) and agent.frames == ppo_run.frames
    obs = torch.randn(5, 4)
    want = reference_action(agent, obs)
    assert want.dtype == torch.int64 and want.shape == (5,)
    # NumPy in, NumPy out; float64 observations are cast to the env's dtype
    batched = agent.act(obs.double().numpy())
    assert isinstance(batched, np.ndarray) and batched.shape == (5,) and batched.dtype == np.int64
    assert np.array_equal(batched, want.numpy())
    single = agent.act(obs[2].numpy())
    assert isinstance(single, np.ndarray) and single.shape == () and single == want[2].item()
    assert agent.act(obs[2].tolist()) == want[2].item()  # a list counts as NumPy
    # tensor in, tensor out
    t = agent.act(obs)
    assert isinstance(t, torch.Tensor) and torch.equal(t, want)
    t1 = agent.act(obs[2])
    assert isinstance(t1, torch.Tensor) and t1.shape == () and t1.item() == want[2].item()


def test_act_matches_the_exported_policy(ppo_run):
    agent = ppo_run.load()
    program = torch.export.load(ppo_run.paths["policy"]).module()
    obs = torch.randn(6, 4)
    assert torch.equal(program(obs), agent.act(obs))


def test_act_in_a_gymnasium_loop(ppo_run):
    pytest.importorskip("gymnasium")
    agent = steersman.load(ppo_run.run_dir)
    env = agent.gym_env()
    obs, _ = env.reset(seed=0)
    total, done = 0.0, False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(agent.act(obs))
        total += reward
        done = terminated or truncated
    env.close()
    assert total >= 1


def test_act_bad_shape(ppo_run):
    agent = ppo_run.load()
    for shape in [(5,), (2, 3, 4), (2, 5)]:
        with pytest.raises(ValueError, match=r"observation has shape \[.*\], expected \[4\] .*\[B, 4\]"):
            agent.act(np.zeros(shape))


def test_continuous_act(sac_run):
    agent = steersman.load(sac_run.run_dir)
    assert agent.algo == "sac" and agent.observation_shape == (3,)
    obs = torch.randn(7, 3)
    want = reference_action(agent, obs)
    assert want.shape == (7, 1) and want.dtype == torch.float32
    batched = agent.act(obs.numpy())
    assert batched.shape == (7, 1) and batched.dtype == np.float32
    np.testing.assert_allclose(batched, want.numpy(), rtol=0, atol=1e-6)
    single = agent.act(obs[0].numpy())
    assert single.shape == (1,) and np.allclose(single, want[0].numpy(), atol=1e-6)
    assert agent.act(obs).shape == (7, 1) and agent.act(obs[0]).shape == (1,)
    assert float(np.abs(batched).max()) <= 2.0  # Pendulum's action bounds
    # deterministic=False samples from the policy's distribution
    draws = torch.stack([agent.act(obs[0], deterministic=False) for _ in range(8)])
    assert draws.unique().numel() > 1 and float(draws.abs().max()) <= 2.0
    assert torch.equal(agent.act(obs[0]), agent.act(obs[0]))


def test_evaluate_and_env(ppo_run, sac_run):
    agent = ppo_run.load()
    ev = agent.evaluate(episodes=3)
    assert len(ev.returns) == 3 and ev.mean == pytest.approx(sum(ev.returns) / 3)
    assert all(r >= 1 for r in ev.returns) and "over 3 episodes" in str(ev)
    assert agent.evaluate(episodes=3).returns == ev.returns  # seeded: same numbers every time
    env = agent.env(num_envs=2, seed=0)
    assert tuple(env.batch_size) == (2,)
    obs = env.reset()["observation"]
    assert agent.act(obs).shape == (2,)
    cont = sac_run.load().evaluate(episodes=2)
    assert len(cont.returns) == 2 and cont.mean < 0  # Pendulum's rewards are negative
    with pytest.raises(ValueError, match="episodes must be >= 1, got 0"):
        agent.evaluate(episodes=0)


@pytest.mark.parametrize("overrides, message", [
    ({"total_frame": 10}, r"unknown config key 'total_frame' for ppo; valid keys: checkpoint, .*total_frames"),
    ({"optim": {"lrr": 1.0}}, r"unknown config key 'optim.lrr' for ppo; valid keys under 'optim': .*lr"),
    ({"optim.lrr": 1.0}, r"unknown config key 'optim.lrr'"),
    ({"total_frames": "abc"}, r"total_frames: Value 'abc' of type 'str' could not be converted to Integer"),
    ({"total_frames": -5}, r"total_frames"),
    ({"env": {"num_envs": 0}}, r"env.num_envs"),
    ({"seed": {"a": 1}}, r"config key 'seed' of ppo is a value, got a dict"),
    ({"env": "Cartpole"}, r"unknown env id 'Cartpole'"),
])
def test_bad_overrides_write_nothing(tmp_path, monkeypatch, overrides, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=message):
        steersman.train("ppo", **overrides)
    assert not (tmp_path / "runs").exists()


def test_make_config_forms():
    cfg = steersman.make_config("ppo", env="Pendulum-v1", **{"optim.lr": 3e-4}, loss={"gamma": 0.9}, seed="3")
    assert (cfg.env.name, cfg.optim.lr, cfg.loss.gamma, cfg.seed) == ("Pendulum-v1", 3e-4, 0.9, 3)
    assert cfg.optim.max_grad_norm == 0.5  # untouched fields keep their defaults
    with pytest.raises(ConfigError, match="unknown algorithm 'ppp'; valid: a2c, alphazero, ddpg"):
        steersman.train("ppp")


def test_train_refuses_an_existing_run(ppo_run):
    with pytest.raises(RunDirError, match="already holds a run"):
        steersman.train("ppo", run_dir=ppo_run.run_dir, **COMMON, **TINY["ppo"])


def test_load_errors(tmp_path):
    with pytest.raises(RunDirError, match="is not a run directory"):
        steersman.load(tmp_path)
    (tmp_path / "config.yaml").write_text("algo: ppo\ntotal_frames: 10\n")
    with pytest.raises(RunDirError, match="has no checkpoint yet"):
        steersman.load(tmp_path)


class _Boom:
    def __reduce__(self):
        return (Path.touch, (Path(os.environ["STEERSMAN_TEST_PWNED"]),))


def test_load_executes_no_code(ppo_run, tmp_path, monkeypatch):
    """A checkpoint whose state.pt would run code when unpickled is refused, and nothing runs."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(ppo_run.run_dir, run)
    marker = tmp_path / "pwned"
    monkeypatch.setenv("STEERSMAN_TEST_PWNED", str(marker))
    state = next((run / "checkpoints").glob("ckpt-*")) / "state.pt"
    with open(state, "wb") as f:
        pickle.dump({"policy": _Boom()}, f, protocol=2)
    with pytest.raises(Exception, match="(?i)weights_only|unsupported|global"):
        steersman.load(run)
    assert not marker.exists()


def test_load_of_a_misshaped_policy_is_a_checkpoint_error(ppo_run, tmp_path):
    """A policy tensor that does not fit the run's config: a one-line CheckpointError naming
    the entry, not torch's multi-line size-mismatch RuntimeError."""
    import shutil

    from steersman.recipes.checkpoint import CheckpointError

    run = tmp_path / "run"
    shutil.copytree(ppo_run.run_dir, run)
    path = next((run / "checkpoints").glob("ckpt-*")) / "state.pt"
    state = torch.load(path, weights_only=True)
    state["policy"][next(iter(state["policy"]))] = torch.zeros(3, 3)
    torch.save(state, path)
    with pytest.raises(CheckpointError, match="'policy'") as info:
        steersman.load(run)
    assert "\n" not in str(info.value)


def test_one_version():
    """pyproject.toml reads the version from steersman.__version__; the installed metadata agrees."""
    import importlib.metadata

    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python >= 3.11")

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "steersman.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+([.-]?\w+)?", steersman.__version__)
    try:
        installed = importlib.metadata.version("steersman")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("steersman is not installed (pip install -e .)")
    assert installed == steersman.__version__, "reinstall: pip install -e ."
