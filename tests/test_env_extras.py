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
