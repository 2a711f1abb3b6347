"""Every recipe end to end on a tiny budget through its Python entry point; PPO learns CartPole."""

from __future__ import annotations

import math
import os
import re
import signal

import pytest
import torch
import yaml

from steersman.recipes import ALGOS, get_recipe
from steersman.recipes.checkpoint import load_checkpoint
from steersman.recipes.config import ConfigError
from steersman.recipes.envs import make_env
from steersman.recipes.run import Run, RunDirError
from steersman.record import read_metrics_csv
from tests.recipes._tiny import tiny_config, tiny_config_dict

#: recipes whose tiny run also exports its policy (one discrete, one Q-value, one
#: stochastic continuous and one deterministic continuous policy); the rest skip it
EXPORTING = {"ppo", "dqn", "sac", "td3"}


@pytest.mark.parametrize("algo", sorted(ALGOS))
def test_recipe_smoke(algo, tmp_path):
    cfg = tiny_config(algo, export_format="torch-export" if algo in EXPORTING else "none")
    run_dir = tmp_path / algo
    summary = get_recipe(algo).train(cfg, run_dir)

    assert summary["algo"] == algo and not summary["interrupted"]
    assert math.isfinite(summary["final_eval_return"])
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["algo"] == algo and saved["seed"] == cfg.seed
    cols = read_metrics_csv(run_dir / "metrics.csv")
    assert cols["step"][-1] == summary["frames"] and not math.isnan(cols["eval/return"][-1])
    assert (run_dir / "plots" / "learning_curve.png").stat().st_size > 0
    ckpt = load_checkpoint(run_dir / "checkpoints")
    assert ckpt.meta["frames"] == summary["frames"] and "policy" in ckpt.state
    if algo in ("dqn", "sac", "td3", "ddpg"):
        assert ckpt.replay_buffer_path is not None
    policy_file = run_dir / "export" / "policy.pt2"
    assert policy_file.exists() == (algo in EXPORTING)
    if algo in EXPORTING:  # the file maps observations to the live policy's deterministic actions
        env = make_env(cfg.env.name, 3, seed=1)
        policy = get_recipe(algo).make_policy(cfg, env)
        policy.load_state_dict(ckpt.state["policy"])
        obs = env.reset()["observation"]
        from steersman.tensordict import TensorDict
        from steersman.tensordict.nn import ExplorationType, set_exploration_type

        with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
            want = policy(TensorDict({"observation": obs}, [3]))["action"]
        assert torch.allclose(torch.export.load(policy_file).module()(obs), want, atol=1e-6)


@pytest.mark.parametrize("algo", ["ppo", "sac"])
def test_last_batch_on_the_schedules_evaluates_and_saves_once(algo, tmp_path, monkeypatch):
    recipe = get_recipe(algo)
    total = tiny_config(algo).total_frames
    calls = []
    original = recipe.evaluate
    monkeypatch.setattr(recipe, "evaluate", lambda *a, **k: calls.append(1) or original(*a, **k))
    cfg = tiny_config(algo, export_format="none", **{"eval.interval": total // 2, "checkpoint.interval": total // 2,
                                                     "checkpoint.keep": 10})
    summary = recipe.train(cfg, tmp_path / "run")
    assert len(calls) == 2  # at total/2 and at total: the final one is the periodic one
    ckpt = load_checkpoint(tmp_path / "run" / "checkpoints")
    assert [f for f, _ in ckpt.meta["evals"]] == [total // 2, total]
    assert summary["final_eval_return"] == ckpt.meta["evals"][-1][1]
    assert len(list((tmp_path / "run" / "checkpoints").glob("ckpt-*"))) == 2


def test_fresh_run_refuses_an_existing_run_dir(tmp_path):
    cfg = tiny_config("ppo", total_frames=64, export_format="none")
    get_recipe("ppo").train(cfg, tmp_path / "run")
    with pytest.raises(RunDirError, match="already holds a run.*steersman resume"):
        get_recipe("ppo").train(cfg, tmp_path / "run")


def test_resume_extends_a_finished_run(tmp_path):
    ppo = get_recipe("ppo")
    ppo.train(tiny_config("ppo", total_frames=128, export_format="none"), tmp_path / "run")
    summary = ppo.train(tiny_config("ppo", total_frames=256, export_format="none"), tmp_path / "run", resume=True)
    assert summary["frames"] == 256
    steps = read_metrics_csv(tmp_path / "run" / "metrics.csv")["step"]
    assert steps == sorted(set(steps)) and steps[-1] == 256  # no duplicated rows after the resume
    with pytest.raises(RunDirError, match=r"changed incompatibly \(epochs: 2 -> 3\)"):
        ppo.train(tiny_config("ppo", epochs=3), tmp_path / "run", resume=True)


def test_bad_env_id_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown env id 'CartPol-v1'; built-in ids: \[.*'CartPole-v1'"):
        get_recipe("ppo").train(tiny_config("ppo", **{"env.name": "CartPol-v1"}), tmp_path / "run")
    assert not (tmp_path / "run").exists()  # nothing written


@pytest.mark.parametrize(("algo", "env", "needle"), [
    ("dqn", "Pendulum-v1", "DQN needs discrete actions"),
    ("td3", "CartPole-v1", "needs a bounded continuous action"),
])
def test_wrong_action_space_is_a_config_error(tmp_path, algo, env, needle):
    with pytest.raises(ConfigError, match=needle):
        get_recipe(algo).train(tiny_config(algo, **{"env.name": env}), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_sac_discrete_actions(tmp_path):
    cfg = tiny_config("sac", export_format="none", **{"env.name": "CartPole-v1"})
    summary = get_recipe("sac").train(cfg, tmp_path / "run")
    assert summary["final_eval_return"] >= 1


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_stop_signals_become_a_stop_request(tmp_path, sig):
    """SIGINT/SIGTERM set ``stop_requested`` (the loop then saves and leaves); a second
    SIGINT interrupts at once; ``finish`` restores the previous handlers."""
    before = signal.getsignal(sig)
    run = Run("ppo", tiny_config("ppo"), tmp_path / "run")
    run.track()
    assert not run.stop_requested
    os.kill(os.getpid(), sig)
    assert run.stop_requested and run.stop_signal == sig
    if sig == signal.SIGINT:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    summary = run.finish()
    assert summary["interrupted"] and summary["stop_signal"] == sig
    assert signal.getsignal(sig) is before


@pytest.mark.parametrize("field", ["epochs", "n_steps", "minibatch_size"])
def test_ppo_counts_below_one_are_a_config_error(field, tmp_path):
    with pytest.raises(ConfigError, match=f"{field} must be an integer >= 1, got 0"):
        get_recipe("ppo").train(tiny_config("ppo", **{field: 0}), tmp_path / "run")
    assert not (tmp_path / "run").exists()  # nothing written


def test_total_frames_round_up_to_whole_batches_without_a_warning(tmp_path):
    """250 frames in batches of 64: the run stops at 256, says so once in the summary, and
    nothing warns (the collector gets a whole number of batches)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = get_recipe("ppo").train(tiny_config("ppo", total_frames=250, export_format="none"), tmp_path / "run")
    assert [str(w.message) for w in caught if "multiple" in str(w.message)] == []
    assert summary["frames"] == 256
    assert summary["note"] == "total_frames=250 rounded up to 256: whole batches of 64 frames"
    assert Run("ppo", tiny_config("ppo", total_frames=250), tmp_path / "other", frames_per_batch=64).total_frames == 256


def test_run_recipe_takes_overrides_as_strings_or_a_dict(tmp_path):
    from steersman.recipes import make_config, run_recipe

    overrides = {**tiny_config_dict("a2c"), "export_format": "none"}
    result = run_recipe("a2c", overrides, tmp_path / "run")
    assert result.dir == tmp_path / "run" and result.algo == "a2c" and result.summary["frames"] == 200
    assert result.config == make_config("a2c", overrides)
    for bad, needle in [({"optim": {"lr": "fast"}}, "optim.lr: Value 'fast'"),
                        (["env.num_envs=3", "frames_per_batch=64"], "frames_per_batch (64) must be a multiple"),
                        (["n_steps=0"], "n_steps must be an integer >= 1, got 0")]:
        algo = "dqn" if "frames_per_batch=64" in bad else "a2c"
        with pytest.raises(ConfigError, match=re.escape(needle)):
            run_recipe(algo, bad, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_td3_update_counter_is_checkpointed(tmp_path):
    """A 0-dim tensor tracked by the run (TD3's update count, which paces the delayed actor
    updates) is saved and restored with the rest."""
    td3 = get_recipe("td3")
    td3.train(tiny_config("td3", total_frames=64, export_format="none"), tmp_path / "run")
    assert load_checkpoint(tmp_path / "run" / "checkpoints").state["num_updates"].item() == 3 * 16  # batches at 32, 48, 64
    td3.train(tiny_config("td3", total_frames=128, export_format="none"), tmp_path / "run", resume=True)
    assert load_checkpoint(tmp_path / "run" / "checkpoints").state["num_updates"].item() == 7 * 16


@pytest.mark.parametrize("algo, overrides, message", [
    ("ppo", {"env.name": "gym:NoSuchEnv-v0"}, "unknown Gymnasium env id"),
    ("ppo", {"minibatch_size": 7}, "minibatch_size (7) must divide"),
    ("dqn", {"env.name": "Pendulum-v1"}, "DQN needs discrete actions"),
])
def test_run_recipe_checks_the_config_before_writing(tmp_path, algo, overrides, message):
    """The shared entry point (the Python API's train) refuses a bad config before a run
    folder exists: the recipes build their envs and policy before writing anything."""
    from steersman.recipes import run_recipe
    from steersman.recipes.config import ConfigError

    with pytest.raises(ConfigError, match=re.escape(message)):
        run_recipe(algo, overrides, tmp_path / "run")
    assert list(tmp_path.iterdir()) == []
