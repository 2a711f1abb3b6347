"""The ``steersman`` command as a user types it (subprocesses), and its bad-input messages.

Each subprocess starts Python, torch and Hydra (seconds of CPU), so they are few and each proves
something only a real process shows: a ``train -m`` sweep, one bad input
end to end (exit status 2, one stderr line, nothing on stdout), ``python -m`` run from inside an
untrusted run folder (its own folder first on ``sys.path``), Ctrl-C, and SIGKILL. Everything else goes
through :func:`steersman.cli.main` in-process: the same code without the start-up, with
``capfd`` checking what reaches the file descriptors.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from steersman.cli import main, version
from steersman.recipes import ALGOS, get_recipe, run_recipe
from steersman.recipes.checkpoint import latest_checkpoint, load_checkpoint
from steersman.record import read_metrics_csv
from tests.recipes._tiny import cli_overrides, tiny_config

REPO = Path(__file__).resolve().parents[1]


ENV = {**os.environ, "PYTHONPATH": str(REPO)}  # this tree's steersman, from any working directory


def steersman(*args: str, timeout: float = 600, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "steersman", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=ENV)


def one_error_line(out: subprocess.CompletedProcess) -> str:
    """The single ``error: ...`` line of a failed command (exit status 2)."""
    assert out.returncode == 2, (out.args, out.returncode, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), (out.args, out.stderr)
    return lines[0]


def cli(argv: list[str], capfd) -> subprocess.CompletedProcess:
    """``steersman *argv`` in-process; what reached stdout/stderr (file descriptors included)."""
    capfd.readouterr()
    code = main(argv)
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(argv, code, out, err)


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` and a hash of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A finished tiny PPO run (256 frames, one checkpoint), through the shared entry point."""
    path = tmp_path_factory.mktemp("tiny") / "run"
    result = run_recipe("ppo", cli_overrides("ppo", export_format="none"), path)
    assert result.dir == path and result.summary["frames"] == 256 and (path / "config.yaml").is_file()
    return path


def copy_run(run: Path, tmp_path: Path, name: str = "run") -> Path:
    return Path(shutil.copytree(run, tmp_path / name))


def test_sweep_then_eval_plot_resume(tmp_path, capsys):
    """``train -m`` over two seeds; then the run-directory commands on the result."""
    sweep = tmp_path / "sweep"
    out = steersman("train", "-m", "ppo", "seed=0,1", *cli_overrides("ppo", **{"logger.backends": ["csv"]}),
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

    capsys.readouterr()
    assert main(["eval", str(sweep / "0"), "--episodes", "3", "--video"]) == 0
    out = capsys.readouterr().out
    assert "ppo on CartPole-v1 (256 frames" in out and "over 3 episodes" in out
    assert (sweep / "0" / "videos" / "eval.mp4").stat().st_size > 0

    assert main(["plot", str(sweep / "0"), str(sweep / "1"), "--out", str(tmp_path / "curves.png")]) == 0
    assert (tmp_path / "curves.png").stat().st_size > 0
    (sweep / "0" / "plots" / "learning_curve.png").unlink()
    assert main(["plot", str(sweep / "0")]) == 0  # where training writes it
    assert (sweep / "0" / "plots" / "learning_curve.png").stat().st_size > 0
    assert not (sweep / "0" / "learning_curve.png").exists()

    before = load_checkpoint(sweep / "0" / "checkpoints").path
    hydra_files = snapshot(sweep / "0" / ".hydra")
    assert main(["train", "ppo", f"hydra.run.dir={sweep / '0'}"]) == 2
    assert "already holds a run; continue it with `steersman resume" in capsys.readouterr().err
    assert snapshot(sweep / "0" / ".hydra") == hydra_files  # Hydra did not write into it
    assert main(["resume", str(sweep / "0"), "optim.lr=0.5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: cannot resume") and "optim.lr: 0.001 -> 0.5" in err and "\n" not in err
    assert load_checkpoint(sweep / "0" / "checkpoints").path == before  # nothing changed


def test_export_verifies_both_formats(tmp_path, capsys):
    run = tmp_path / "run"
    get_recipe("dqn").train(tiny_config("dqn", export_format="none"), run)  # a Q-value policy
    # in-process: export_policy itself runs each file in a fresh process without steersman
    assert main(["export", str(run), "--format", "torch-export"]) == 0
    pt2 = run / "export" / "policy.pt2"
    out = capsys.readouterr().out
    assert f"exported {pt2} (torch-export" in out and "matches the live policy" in out
    assert main(["export", str(run), "--format", "onnx", "--out", str(tmp_path / "policy.onnx")]) == 0
    assert "(onnx" in capsys.readouterr().out and (tmp_path / "policy.onnx").stat().st_size > 0


def test_envs_lists_builtin_and_gym(capfd):
    out = cli(["envs"], capfd)
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
        (["train", "ppoo"], "unknown algorithm 'ppoo'; valid: " + ", ".join(sorted(ALGOS))),
        (["train", "algo=ppo,xyz"], "unknown algorithm 'xyz'; valid: a2c"),
        (["train", "ppo", "foo=1"], "unknown config key 'foo' for ppo; valid keys: algo, checkpoint"),
        (["train", "sac", "env.name=CartPol-v1"], "unknown env id 'CartPol-v1'; built-in ids: ['Acrobot-v1'"),
        (["train", "ppo", "env=moon"], "unknown env option 'moon'; valid: cartpole, pendulum"),
        (["train", "ppo", "logger=print"], "unknown logger option 'print'; valid: default, csv"),
        (["train", "ppo", "seed"], "expected key=value, got 'seed'"),
        (["train", "ppo", "seed.x=1"], "'seed' is a value, not a group"),
        (["frobnicate"], "unknown command 'frobnicate'; valid commands: train, eval, resume, export, plot, envs"),
        (["envs", "x"], "takes no arguments"),
        (["train", "a2c", "distributed=ray"], "a2c has no distributed option (it runs on one machine)"),
        (["train", "sac", "distributed=rayy"], "distributed.backend"),
    ],
)
def test_bad_input_is_one_line(argv, needle, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and needle in err and "\n" not in err
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize("command", ["eval", "resume", "export", "plot", "doctor"])
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


# ---------------------------------------------------------------- untrusted run folders, bad input
EVIL = "import pathlib\npathlib.Path({marker!r}).write_text('pwned')\n"


def test_run_folder_env_id_cannot_import_code(tiny_run, tmp_path, capfd, monkeypatch):
    """A run folder's config naming ``gym:evilmod:X-v0`` (Gymnasium imports ``evilmod``) with
    ``evilmod.py`` beside it: eval/resume/export refuse it in one line, nothing runs."""
    run = copy_run(tiny_run, tmp_path)
    marker = tmp_path / "pwned"
    (run / "evilmod.py").write_text(EVIL.format(marker=str(marker)))
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["env"]["name"] = "gym:evilmod:X-v0"
    (run / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    before = snapshot(run)
    # from inside the folder: `python -m` puts it first on sys.path, so the import would find evilmod.py
    line = one_error_line(steersman("eval", ".", cwd=run))
    assert "would import the Python module 'evilmod'" in line and "--allow-import" in line, line
    # the other commands in-process, with the folder first on sys.path as `python -m` puts it
    monkeypatch.chdir(run)
    monkeypatch.syspath_prepend(str(run))
    monkeypatch.delitem(sys.modules, "evilmod", raising=False)
    for command in ("resume", "export"):
        line = one_error_line(cli([command, "."], capfd))
        assert "would import the Python module 'evilmod'" in line and "--allow-import" in line, line
    assert not marker.exists() and snapshot(run) == before
    # the flag is what lets it through: the module then runs (and the id is still unknown)
    out = cli(["eval", ".", "--allow-import"], capfd)
    sys.modules.pop("evilmod", None)
    assert marker.read_text() == "pwned"
    assert "unknown Gymnasium env id" in one_error_line(out)


def test_module_env_id_typed_on_train_is_allowed(tmp_path, capfd, monkeypatch):
    """On ``train``'s command line such an id is the user's choice: the module is imported."""
    marker = tmp_path / "imported"
    (tmp_path / "mymod.py").write_text(EVIL.format(marker=str(marker)))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # as `python -m` run from this folder
    monkeypatch.delitem(sys.modules, "mymod", raising=False)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # no __pycache__ beside mymod.py
    out = cli(["train", "ppo", "env.name=gym:mymod:X-v0"], capfd)
    sys.modules.pop("mymod", None)
    assert marker.exists()
    assert "unknown Gymnasium env id 'mymod:X-v0'" in one_error_line(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["imported", "mymod.py"]  # no run folder


def test_every_config_error_is_one_line_and_makes_no_folder(tmp_path, capfd, monkeypatch):
    cases = {
        "total_frames=abc": "total_frames: Value 'abc' of type 'str' could not be converted to Integer",
        "optim.lr=fast": "optim.lr: Value 'fast' of type 'str' could not be converted to Float",
        "total_frames=-5": "total_frames must be an integer >= 1, got -5",
        "env.name=gym:NoSuchEnv-v0": "unknown Gymnasium env id 'NoSuchEnv-v0'",
        "env.num_envs=0": "env.num_envs must be an integer >= 1, got 0",
        "minibatch_size=7": "minibatch_size (7) must divide env.num_envs x n_steps (8 x 32 = 256)",
        "env.name=gym:LunarLander-v3": 'pip install "gymnasium[box2d]"',  # Box2D hidden below
        "seed=0,1": "sweeps need -m",
    }
    # Box2D may be installed (the box2d extra): hidden from the imports here, as on a machine without it
    for name in [m for m in sys.modules if m == "Box2D" or m.startswith(("Box2D.", "gymnasium.envs.box2d"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "Box2D", None)  # `import Box2D` raises ImportError
    monkeypatch.chdir(tmp_path)
    for ov, needle in cases.items():
        out = cli(["train", "ppo", ov], capfd)
        assert needle in one_error_line(out), (ov, out.stderr)
        assert out.stdout == ""
    assert list(tmp_path.iterdir()) == []  # no runs/ folder


def _tamper_meta(run: Path, change) -> None:
    ckpt = run / "checkpoints" / json.loads((run / "checkpoints" / "LATEST").read_text())["current"]
    meta = json.loads((ckpt / "meta.json").read_text())
    change(meta)
    (ckpt / "meta.json").write_text(json.dumps(meta))


def _wrong_shape(run: Path) -> None:
    path = run / "checkpoints" / "ckpt-000001" / "state.pt"
    state = torch.load(path, weights_only=True)
    first = next(iter(state["policy"]))
    state["policy"][first] = torch.zeros(3, 3)
    torch.save(state, path)


def test_tampered_checkpoints_are_one_line_and_write_nothing(tiny_run, tmp_path, capfd):
    runs = {
        "frames": (copy_run(tiny_run, tmp_path, "frames"), "resume", "'frames' must be an integer >= 0, got 'abc'"),
        "iteration": (copy_run(tiny_run, tmp_path, "iteration"), "resume", "'iteration' is missing"),
        "dotdot": (copy_run(tiny_run, tmp_path, "dotdot"), "eval", "is not a checkpoint pointer"),
        "absolute": (copy_run(tiny_run, tmp_path, "absolute"), "eval", "is not a checkpoint pointer"),
        "symlink": (copy_run(tiny_run, tmp_path, "symlink"), "eval", "leads outside"),
        "shape": (copy_run(tiny_run, tmp_path, "shape"), "eval", "entry 'policy' does not fit this run"),
    }
    _tamper_meta(runs["frames"][0], lambda m: m.update(frames="abc"))
    _tamper_meta(runs["iteration"][0], lambda m: m.pop("iteration"))
    (runs["dotdot"][0] / "checkpoints" / "LATEST").write_text('{"current": "../../victim"}')
    (runs["absolute"][0] / "checkpoints" / "LATEST").write_text(json.dumps({"current": str(tmp_path)}))
    outside = tmp_path / "elsewhere"
    shutil.move(runs["symlink"][0] / "checkpoints" / "ckpt-000001", outside)
    (runs["symlink"][0] / "checkpoints" / "ckpt-000001").symlink_to(outside)
    _wrong_shape(runs["shape"][0])
    before = {name: snapshot(run) for name, (run, _, _) in runs.items()}
    for name, (run, cmd, needle) in runs.items():
        out = cli([cmd, str(run), "total_frames=512"] if cmd == "resume" else [cmd, str(run)], capfd)
        assert needle in one_error_line(out), (name, out.stderr)
        assert snapshot(run) == before[name], name


def test_resume_of_a_finished_run_writes_nothing(tiny_run, tmp_path, capfd):
    run = copy_run(tiny_run, tmp_path)
    before = snapshot(run)
    out = cli(["resume", str(run)], capfd)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (f"{run} already finished at 256 frames; pass total_frames=512 "
                                  "(or any value above 256) to extend")
    assert snapshot(run) == before


def test_resume_of_a_run_killed_before_its_first_checkpoint(tmp_path, capfd):
    """SIGKILL before any checkpoint: ``resume`` starts the run again from scratch, saying so in
    one line, and cleans the pointer temp file a dead writer left."""
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "steersman", "train", "ppo", *cli_overrides("ppo", total_frames=10_000_000),
         f"hydra.run.dir={run}"], cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not ((run / "metrics.csv").exists() and (run / "metrics.csv").read_text().count("\n") >= 3):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert latest_checkpoint(run / "checkpoints") is None
    (run / "checkpoints").mkdir(exist_ok=True)
    leftover = run / "checkpoints" / f".LATEST.{proc.pid}.0123abcd.tmp"  # a dead writer's pointer temp file
    leftover.write_text('{"current": "ckpt-0000')
    out = cli(["resume", str(run), "total_frames=256", "quiet=false"], capfd)
    assert out.returncode == 0, out.stderr
    assert [ln for ln in out.stderr.splitlines() if "from scratch" in ln] == [
        f"{run} has no checkpoint yet (stopped before its first one): starting it from scratch"]
    assert load_checkpoint(run / "checkpoints").meta["frames"] == 256 and not leftover.exists()
    steps = read_metrics_csv(run / "metrics.csv")["step"]
    assert steps == sorted(set(steps)) and steps[-1] == 256  # the killed session's rows are gone


def test_version(capfd):
    out = cli(["--version"], capfd)
    assert out.returncode == 0 and out.stdout.strip() == f"steersman {version()}"
    from importlib.metadata import version as dist_version

    assert version() == dist_version("steersman")


def test_argparse_misuse_is_one_line(capsys):
    assert main(["eval"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: steersman eval: the following arguments are required: run_dir") and "\n" not in err


def test_tampered_replay_buffer_checkpoint_is_one_line_and_writes_nothing(tmp_path, capfd):
    """The replay buffer saved in a checkpoint is untrusted too: a damaged ``buffer.json`` or a
    tensor folder pointing outside gives one line and exit 2 on ``resume``, and writes nothing."""
    run = tmp_path / "dqn"
    run_recipe("dqn", cli_overrides("dqn", export_format="none"), run)
    buffer = run / "checkpoints" / "ckpt-000001" / "replay_buffer" / "ckpt-000001"
    runs = {"json": copy_run(run, tmp_path, "json"), "dir": copy_run(run, tmp_path, "dir")}
    (runs["json"] / buffer.relative_to(run) / "buffer.json").write_text('{"last_cursor": [3]')
    meta = runs["dir"] / buffer.relative_to(run) / "storage" / "tensors" / "meta.json"
    meta.write_text(meta.read_text().replace('"dir": "next"', '"dir": "../../../../../victim"'))
    before = {name: snapshot(path) for name, path in runs.items()}
    for (name, path), needle in zip(runs.items(), ("is not readable JSON", "not a plain folder name")):
        out = cli(["resume", str(path), "total_frames=512"], capfd)
        assert needle in one_error_line(out), (name, out.stderr)
        assert snapshot(path) == before[name], name


def test_seeds_and_sweep_from_the_command_line(tmp_path, monkeypatch):
    """`steersman train ppo sweep.optim.lr=[a,b] seeds=2` trains the 4 combinations in one
    process (keys inside the free-form `sweep` dict reach the recipe)."""
    import json

    monkeypatch.chdir(tmp_path)
    argv = ["train", "ppo", "sweep.optim.lr=[1e-3,3e-4]", "seeds=2", "total_frames=256", "n_steps=16",
            "env.num_envs=4", "minibatch_size=32", "epochs=1", "quiet=true", "eval.episodes=2",
            "export_format=none", f"hydra.run.dir={tmp_path / 'run'}"]
    assert main(argv) == 0
    members = json.loads((tmp_path / "run" / "members.json").read_text())
    assert len(members) == 4


@pytest.mark.parametrize("env_id", ["vmas/navigation", "pettingzoo/sisl/multiwalker_v9"])
def test_env_option_takes_a_family_of_multi_agent_ids(env_id, capsys):
    """``env=vmas/<scenario>`` / ``env=pettingzoo/<task>`` stand for ``env.name=...`` (the
    CLI refused them as unknown ``env=`` options)."""
    assert main(["train", "mappo", f"env={env_id}", "--cfg", "job"]) == 0
    assert f"name: {env_id}" in capsys.readouterr().out
