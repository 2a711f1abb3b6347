"""Optional env extras (``steersman[mujoco]``, ``steersman[box2d]``) and the SAC/TD3 MuJoCo preset.

The preset tests need nothing optional; the env tests skip, naming the extra to install,
when its package is missing.
"""

from __future__ import annotations

import pytest
import torch

from steersman.recipes import sac, td3
from steersman.recipes.config import ConfigError, apply_env_defaults, is_mujoco_env
from steersman.recipes.launch import make_config, run_recipe

# ---------------------------------------------------------------- the MuJoCo preset (no extra needed)


@pytest.mark.parametrize("name, expected", [
    ("gym:HalfCheetah-v5", True), ("gym:Hopper-v4", True), ("gym:Walker2d-v5", True), ("gym:Ant-v5", True),
    ("gym:LunarLander-v3", False), ("Pendulum-v1", False), ("HalfCheetah-v5", False),
    ("gym:mymodule:HalfCheetah-v5", False),
])
def test_is_mujoco_env(name: str, expected: bool) -> None:
    assert is_mujoco_env(name) is expected


@pytest.mark.parametrize("module", [sac, td3])
def test_mujoco_env_takes_the_mujoco_defaults(module) -> None:
    cfg = make_config(module.__name__.rsplit(".", 1)[1], {"env.name": "gym:HalfCheetah-v5"})
    out = module.resolve_preset(cfg)
    assert out.optim.lr == 3e-4 and out.hidden_sizes == [256, 256] and out.batch_size == 256
    assert out.buffer_size == 1_000_000 and out.total_frames == 1_000_000 and out.tau == 0.005
    assert out.gamma == 0.99 and out.eval.interval == 10_000 and out.eval.episodes == 5
    assert out.learning_starts == (10_000 if module is sac else 25_000)
    if module is td3:
        assert (out.policy_noise, out.noise_clip, out.policy_delay) == (0.2, 0.5, 2)
    assert out.preset == "none"  # what config.yaml records: a resume reuses these values as they are
    assert module.resolve_preset(out) == out
    assert cfg.optim.lr == 1e-3 and cfg.preset == "auto"  # the input is left untouched


@pytest.mark.parametrize("module", [sac, td3])
def test_user_overrides_win_over_the_mujoco_defaults(module) -> None:
    algo = module.__name__.rsplit(".", 1)[1]
    cfg = make_config(algo, ["env.name=gym:Hopper-v5", "optim.lr=5e-4", "hidden_sizes=[64,64]",
                             "learning_starts=777", "total_frames=3000", "eval.episodes=2"])
    out = module.resolve_preset(cfg)
    assert (out.optim.lr, out.hidden_sizes, out.learning_starts, out.total_frames, out.eval.episodes) == \
        (5e-4, [64, 64], 777, 3000, 2)
    assert out.buffer_size == 1_000_000 and out.eval.interval == 10_000  # the fields left alone still change


@pytest.mark.parametrize("module", [sac, td3])
def test_preset_none_and_other_envs_keep_the_pendulum_defaults(module) -> None:
    algo = module.__name__.rsplit(".", 1)[1]
    default = make_config(algo)
    assert module.resolve_preset(default) == default  # Pendulum: nothing changes
    off = make_config(algo, ["env.name=gym:HalfCheetah-v5", "preset=none"])
    assert module.resolve_preset(off) == off
    forced = module.resolve_preset(make_config(algo, ["preset=mujoco"]))
    assert forced.optim.lr == 3e-4 and forced.env.name == "Pendulum-v1"


def test_bad_preset_is_a_one_line_error() -> None:
    with pytest.raises(ConfigError, match=r"preset must be one of auto, mujoco, none, got 'mujuco'"):
        make_config("sac", ["preset=mujuco"])


@pytest.mark.parametrize("module", [sac, td3])
def test_a_value_equal_to_the_pendulum_default_needs_preset_none(module) -> None:
    """The documented limit: a value equal to the Pendulum default reads as "not set"."""
    algo = module.__name__.rsplit(".", 1)[1]
    pinned = make_config(algo, ["env.name=gym:Ant-v5", "optim.lr=1e-3"])
    assert module.resolve_preset(pinned).optim.lr == 3e-4
    kept = make_config(algo, ["env.name=gym:Ant-v5", "optim.lr=1e-3", "preset=none"])
    assert module.resolve_preset(kept).optim.lr == 1e-3


def test_apply_env_defaults_reaches_nested_fields_and_copies() -> None:
    cfg = make_config("sac", ["eval.episodes=3"])
    table = {"eval.episodes": 5, "eval.interval": 123, "hidden_sizes": [8]}
    out = apply_env_defaults(cfg, table)
    assert (out.eval.episodes, out.eval.interval, out.hidden_sizes) == (3, 123, [8])
    out.hidden_sizes.append(1)
    assert table["hidden_sizes"] == [8] and cfg.hidden_sizes == [256, 256]


# ---------------------------------------------------------------- the envs, where installed

TINY = {"total_frames": 300, "learning_starts": 120, "batch_size": 32, "hidden_sizes": [16, 16],
        "buffer_size": 1_000, "eval.interval": 300, "eval.episodes": 1, "env.max_episode_steps": 50,
        "checkpoint.interval": 300, "quiet": True, "export_format": "none", "frames_per_batch": 50,
        "utd_ratio": 0.1}


def _gym_rollout(env_id: str, action_size: int | None) -> None:
    from steersman.envs import check_env_specs
    from steersman.envs.libs.gym import GymEnv

    env = GymEnv(env_id)
    try:
        check_env_specs(env)
        env.set_seed(0)
        td = env.rollout(20)
        assert td.batch_size[0] >= 1 and torch.isfinite(td["next", "reward"]).all()
        if action_size is not None:
            assert td["action"].shape[-1] == action_size
    finally:
        env.close()


def test_halfcheetah_gymenv_specs_and_rollout(tmp_path, monkeypatch) -> None:
    pytest.importorskip("mujoco", reason="pip install 'steersman[mujoco]'")
    monkeypatch.chdir(tmp_path)  # MuJoCo may write MUJOCO_LOG.TXT into the working folder
    _gym_rollout("HalfCheetah-v5", action_size=6)


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_tiny_run_on_halfcheetah_uses_the_mujoco_preset(algo: str, tmp_path, monkeypatch) -> None:
    pytest.importorskip("mujoco", reason="pip install 'steersman[mujoco]'")
    monkeypatch.chdir(tmp_path)
    result = run_recipe(algo, {**TINY, "env.name": "gym:HalfCheetah-v5"}, tmp_path / "run")
    assert result.summary["frames"] == 300 and result.summary["final_eval_return"] is not None
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert "lr: 0.0003" in saved and "preset: none" in saved  # the preset's lr, recorded resolved
    assert "learning_starts: 120" in saved and "buffer_size: 1000\n" in saved  # the test's own values kept


def test_lunarlander_gymenv_specs_and_rollout() -> None:
    pytest.importorskip("Box2D", reason="pip install 'steersman[box2d]'")
    _gym_rollout("LunarLander-v3", action_size=None)


def test_tiny_sac_run_on_lunarlander_continuous(tmp_path) -> None:
    pytest.importorskip("Box2D", reason="pip install 'steersman[box2d]'")
    result = run_recipe("sac", {**TINY, "env.name": "gym:LunarLanderContinuous-v3"}, tmp_path / "run")
    assert result.summary["frames"] == 300 and result.summary["final_eval_return"] is not None
    assert "lr: 0.001" in (tmp_path / "run" / "config.yaml").read_text()  # not a MuJoCo id: no preset


# ---------------------------------------------------------------- Atari, dm_control, EnvPool, where installed


def _hidden(monkeypatch, *modules: str) -> None:
    """Makes ``import <module>`` fail, as when the package is not installed."""
    import sys

    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


def test_atari_pong_steps_with_the_usual_preprocessing() -> None:
    """``ale_py:ALE/Pong-v5`` (ale-py ships the ROMs): raw frames, then the usual Atari
    stack: no-op starts, rewards clipped to [-1, 1], grayscale 84x84, 4 stacked frames."""
    pytest.importorskip("ale_py", reason="pip install 'steersman[atari]'")
    from steersman.envs import check_env_specs
    from steersman.envs.libs import GymEnv
    from steersman.envs.transforms import (
        CatFrames,
        Compose,
        GrayScale,
        NoopResetEnv,
        Resize,
        RewardClipping,
        StepCounter,
        ToTensorImage,
        TransformedEnv,
    )

    env = GymEnv("ale_py:ALE/Pong-v5", categorical_action_encoding=True)
    assert env.observation_spec["observation"].shape == (210, 160, 3)
    assert env.observation_spec["observation"].dtype == torch.uint8 and env.action_spec.n == 6
    keys = ["observation"]
    env = TransformedEnv(env, Compose(StepCounter(), NoopResetEnv(noops=5, random=False),
                                      RewardClipping(-1, 1), ToTensorImage(in_keys=keys),
                                      GrayScale(in_keys=keys), Resize(84, 84, in_keys=keys),
                                      CatFrames(4, dim=-3, in_keys=keys)))
    try:
        check_env_specs(env, seed=0)
        env.set_seed(0)
        assert int(env.reset()["step_count"]) == 5  # the no-ops were taken
        td = env.rollout(40)
        obs = td["next", "observation"]
        assert obs.shape == (40, 4, 84, 84) and obs.dtype == torch.float32
        assert 0 <= obs.min() and obs.max() <= 1 and obs.std() > 0  # real frames, scaled
        assert torch.equal(obs[10, :3], obs[9, 1:])  # the stack shifts by one frame per step
        assert td["next", "reward"].abs().max() <= 1
    finally:
        env.close()


def test_dm_control_cartpole_balance() -> None:
    pytest.importorskip("dm_control", reason="pip install 'steersman[dm-control]'")
    from steersman.envs import check_env_specs
    from steersman.envs.libs.dm_control import DMControlEnv

    env = DMControlEnv("cartpole", "balance", seed=0)
    assert sorted(env.observation_spec.keys()) == ["position", "velocity"]
    assert env.observation_spec["position"].shape == (3,) and env.observation_spec["position"].dtype == torch.float64
    assert env.action_spec.shape == (1,) and env.action_spec.space.low.item() == -1.0
    check_env_specs(env, seed=0)
    env.set_seed(1)
    first = env.reset()["position"]
    env.set_seed(1)
    assert torch.equal(env.reset()["position"], first)
    env.set_seed(2)
    assert not torch.equal(env.reset()["position"], first)
    # the suite's 1000-step limit, 10 physics steps per env step: truncated (not terminated) at step 100
    skip = DMControlEnv("cartpole", "balance", seed=0, frame_skip=10)
    td = skip.rollout(150, policy=lambda td: td.set("action", torch.zeros(1, dtype=torch.float64)))
    assert td.batch_size == (100,) and td["next", "truncated"][-1].item() and not td["next", "terminated"].any()
    assert td["next", "reward"].dtype == torch.float64 and 0 < td["next", "reward"].sum() <= 1000


def test_dm_control_bad_task_and_missing_package(monkeypatch) -> None:
    pytest.importorskip("dm_control", reason="pip install 'steersman[dm-control]'")
    from steersman.envs.libs.dm_control import DMControlEnv, DMControlWrapper

    with pytest.raises(ValueError, match=r"unknown task \('cartpole', 'run'\).*available_envs"):
        DMControlEnv("cartpole", "run")
    assert ("cheetah", "run") in DMControlEnv.available_envs()
    with pytest.raises(TypeError, match="expects a dm_control env"):
        DMControlWrapper(object())
    _hidden(monkeypatch, "dm_control", "dm_control.suite")
    with pytest.raises(ImportError, match=r"pip install 'steersman\[dm-control\]'"):
        DMControlEnv("cartpole", "balance")


def test_envpool_cartpole_batched() -> None:
    pytest.importorskip("envpool", reason="pip install 'steersman[envpool]'")
    from steersman.envs import check_env_specs
    from steersman.envs.libs.envpool import MultiThreadedEnv

    env = MultiThreadedEnv(4, "CartPole-v1", seed=0)
    try:
        assert env.batch_size == (4,) and env.action_spec.shape == (4,) and env.action_spec.n == 2
        assert env.observation_spec["observation"].shape == (4, 4)
        check_env_specs(env, seed=None)
        # always push right: every episode ends within ~10 steps and the sub-env is reset
        right = lambda td: td.set("action", torch.ones(4, dtype=torch.int64))
        td = env.rollout(60, policy=right, break_when_any_done=False)
        done = td["next", "done"].squeeze(-1)
        assert td.batch_size == (4, 60) and done.sum(1).min() >= 3
        assert td["next", "terminated"].squeeze(-1).equal(done)
        t = int(done[0].nonzero()[0])
        assert td["observation"][0, t + 1].abs().max() < 0.05  # a fresh start after the reset
        # same seed, same actions: same data
        env.set_seed(3)
        a = env.rollout(30, policy=right, break_when_any_done=False)
        env.set_seed(3)
        b = env.rollout(30, policy=right, break_when_any_done=False)
        assert torch.equal(a["next", "observation"], b["next", "observation"])
        # a partial reset leaves the other sub-envs alone
        td = env.reset()
        td["action"] = torch.zeros(4, dtype=torch.int64)
        before = env.step(td)["next"]
        mask = torch.tensor([True, False, True, False])
        after = env.reset(before.clone().set("_reset", mask))
        assert torch.equal(after["observation"][~mask], before["observation"][~mask])
        assert not torch.equal(after["observation"][mask], before["observation"][mask])
    finally:
        env.close()


def test_envpool_continuous_onehot_and_errors(monkeypatch) -> None:
    pytest.importorskip("envpool", reason="pip install 'steersman[envpool]'")
    from steersman.envs.libs.envpool import MultiThreadedEnv

    pend = MultiThreadedEnv(2, "Pendulum-v1", seed=0)
    assert pend.action_spec.shape == (2, 1) and pend.rollout(5).batch_size == (2, 5)
    onehot = MultiThreadedEnv(3, "CartPole-v1", seed=0, categorical_action_encoding=False)
    assert onehot.action_spec.shape == (3, 2) and onehot.rollout(5).batch_size == (3, 5)
    with pytest.raises(ValueError, match="unknown EnvPool task 'CartPol-v1'"):
        MultiThreadedEnv(2, "CartPol-v1")
    with pytest.raises(ValueError, match="num_workers must be >= 1, got 0"):
        MultiThreadedEnv(0, "CartPole-v1")
    _hidden(monkeypatch, "envpool")
    with pytest.raises(ImportError, match=r"pip install 'steersman\[envpool\]'"):
        MultiThreadedEnv(2, "CartPole-v1")


def test_plain_ale_ids_and_recipe_errors_on_pixels() -> None:
    """``ALE/Pong-v5`` works without the ``ale_py:`` prefix (ale-py is imported on first
    use); the recipes refuse image observations in one line instead of a dtype traceback,
    and cast integer vector observations (Atari RAM) to float32."""
    pytest.importorskip("ale_py", reason="pip install 'steersman[atari]'")
    from steersman.envs import GymEnv
    from steersman.recipes.config import ConfigError
    from steersman.recipes.envs import _gym_env

    env = GymEnv("ALE/Pong-v5")
    assert env.observation_spec["observation"].shape == (210, 160, 3)
    env.close()
    with pytest.raises(ConfigError, match=r"observations are images \[210, 160, 3\] \(torch.uint8\); the recipes'"):
        _gym_env("gym:ALE/Pong-v5", "ALE/Pong-v5", 0, {"num_envs": 2, "categorical_action_encoding": True})
    ram = _gym_env("gym:ALE/Pong-v5", "ALE/Pong-v5", 0,
                   {"num_envs": 2, "categorical_action_encoding": True, "obs_type": "ram"})
    obs = ram.reset()["observation"]
    assert obs.shape == (2, 128) and obs.dtype == torch.float32 and obs.max() > 1
    ram.close()
