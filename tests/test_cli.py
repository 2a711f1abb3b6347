"""The ``steersman`` command as a user types it (subprocesses), and its bad-input messages.

Each subprocess starts Python, torch and Hydra (seconds), so they are few: one sweep of two
seeds that the other commands then use, in the same test (eval with video, plot, resume),
export in both formats, ``envs``, one bad input end to end, and Ctrl-C. The remaining bad inputs go
through :func:`steersman.cli.main` in-process: the same code without the start-up.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from steersman.cli import main
from steersman.recipes import get_recipe
from steersman.recipes.checkpoint import latest_checkpoint, load_checkpoint
from steersman.record import read_metrics_csv
from tests.recipes._tiny import cli_overrides, tiny_config

REPO = Path(__file__).resolve().parents[1]


def steersman(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "steersman", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def test_sweep_then_eval_plot_resume(tmp_path, capsys):
    """``train -m`` over two seeds; then the run-directory commands on the result."""
    sweep = tmp_path / "sweep"
    out = steersman("train", "ppo", "-m", "seed=0,1", *cli_overrides("ppo", **{"logger.backends": ["csv"]}),
                    "export_format=none", f"hydra.sweep.dir={sweep}")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("done: ppo on CartPole-v1: 256 frames") == 2  # the printed summaries
    for seed in (0, 1):
        run = sweep / str(seed)
        assert yaml.safe_load((run / "config.yaml").read_text())["seed"] == seed
        assert read_metrics_csv(run / "metrics.csv")["step"][-1] == 256
        assert latest_checkpoint(run / "checkpoints") is not None
        assert (run / "plots" / "learning_curve.png").exists()
        assert not (run / "cli.log").exists() and (run / ".hydra" / "overrides.yaml").exists()

    out = steersman("eval", str(sweep / "0"), "--episodes", "3", "--video")
    assert out.returncode == 0, out.stderr
    assert "ppo on CartPole-v1 (256 frames" in out.stdout and "over 3 episodes" in out.stdout
    assert (sweep / "0" / "videos" / "eval.mp4").stat().st_size > 0

    assert main(["plot", str(sweep / "0"), str(sweep / "1"), "--out", str(tmp_path / "curves.png")]) == 0
    assert (tmp_path / "curves.png").stat().st_size > 0

    before = load_checkpoint(sweep / "0" / "checkpoints").path
    assert main(["resume", str(sweep / "0"), "optim.lr=0.5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: cannot resume") and "optim.lr: 0.001 -> 0.5" in err and "\n" not in err
    assert load_checkpoint(sweep / "0" / "checkpoints").path == before  # nothing changed


def test_export_verifies_both_formats(tmp_path, capsys):
    run = tmp_path / "run"
    get_recipe("dqn").train(tiny_config("dqn", export_format="none"), run)  # a Q-value policy
    out = steersman("export", str(run), "--format", "torch-export")
    assert out.returncode == 0, out.stderr
    pt2 = run / "export" / "policy.pt2"
    assert f"exported {pt2} (torch-export" in out.stdout and "matches the live policy" in out.stdout
    # ONNX in-process (the same code without another start-up; export_policy still runs
    # the file in a fresh process without steersman)
    assert main(["export", str(run), "--format", "onnx", "--out", str(tmp_path / "policy.onnx")]) == 0
    assert "(onnx" in capsys.readouterr().out and (tmp_path / "policy.onnx").stat().st_size > 0


def test_envs_lists_builtin_and_gym():
    out = steersman("envs")
    assert out.returncode == 0
    assert "CartPole-v1" in out.stdout and "Pendulum-v1" in out.stdout and "env.name=gym:" in out.stdout


def test_bad_input_end_to_end():
    out = steersman("train", "ppo", "optim.lrr=1")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip() == (
        "error: unknown config key 'optim.lrr' for ppo; valid keys under 'optim': anneal_lr, eps, lr, "
        "max_grad_norm (`steersman train ppo --help` lists them all)"
    )


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["train", "ppoo"], "unknown algorithm 'ppoo'; valid: a2c, ddpg, dqn, iql, ppo, sac, td3"),
        (["train", "algo=ppo,xyz"], "unknown algorithm 'xyz'; valid: a2c"),
        (["train", "ppo", "foo=1"], "unknown config key 'foo' for ppo; valid keys: algo, checkpoint"),
        (["train", "sac", "env.name=CartPol-v1"], "unknown env id 'CartPol-v1'; built-in ids: ['Acrobot-v1'"),
        (["train", "ppo", "env=moon"], "unknown env option 'moon'; valid: cartpole, pendulum"),
        (["train", "ppo", "logger=print"], "unknown logger option 'print'; valid: default, csv"),
        (["train", "ppo", "seed"], "expected key=value, got 'seed'"),
        (["train", "ppo", "seed.x=1"], "'seed' is a value, not a group"),
        (["frobnicate"], "unknown command 'frobnicate'; valid commands: train, eval, resume, export, plot, envs"),
        (["envs", "x"], "takes no arguments"),
    ],
)
def test_bad_input_is_one_line(argv, needle, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and needle in err and "\n" not in err
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize("command", ["eval", "resume", "export", "plot"])
def test_not_a_run_dir(command, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("hello")
    assert main([command, str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {tmp_path} is not a run directory") and "\n" not in err
    assert main([command, str(tmp_path / "missing")]) == 2
    assert "is not a run directory" in capsys.readouterr().err


def test_train_help_lists_documented_keys(capsys):
    assert main(["train", "dqn", "--help"]) == 0
    out = capsys.readouterr().out
    assert "eps_end=0.04" in out and "Final epsilon." in out and "env.name='CartPole-v1'" in out


def test_ctrl_c_saves_a_final_checkpoint(tmp_path):
    """SIGINT: the iteration finishes, a checkpoint is saved, the exit status is 130."""
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "steersman", "train", "ppo", "total_frames=10000000", "quiet=true", "logger=csv",
         "checkpoint.interval=0", "eval.interval=0", f"hydra.run.dir={run}"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 300
    while not ((run / "metrics.csv").exists() and (run / "metrics.csv").read_text().count("\n") >= 3):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert latest_checkpoint(run / "checkpoints") is None  # checkpoint.interval=0: none yet
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    ckpt = load_checkpoint(run / "checkpoints")
    assert ckpt.meta["frames"] >= 512
    assert f"continue with: steersman resume {run}" in out
    assert "SIGINT: finishing the iteration and saving a checkpoint" in err
