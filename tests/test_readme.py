"""The README's examples run as written, and its commands point at files that exist."""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)
#: what makes the README's training call a test-sized one (the rest of the block as written)
TRAIN_CALL = "total_frames=50_000)"
TINY_TRAIN_CALL = "total_frames=256, quiet=True)"


def export_block() -> str:
    (block,) = [b for b in BLOCKS if "onnxruntime.InferenceSession" in b]
    return block


def test_readme_tour_runs(tmp_path, monkeypatch, capsys):
    """Every python block of the README, in order, in one namespace (as a reader would),
    with the training call shortened and `steersman export --format onnx` run where the
    README says to."""
    pytest.importorskip("gymnasium")
    pytest.importorskip("onnxruntime")
    from steersman import cli

    monkeypatch.chdir(tmp_path)
    assert len(BLOCKS) >= 6, "README lost its examples"
    assert sum(TRAIN_CALL in b for b in BLOCKS) == 1
    namespace: dict = {}
    for i, block in enumerate(BLOCKS):
        code = block.replace("/tmp/rollout", str(tmp_path / "rollout")).replace(TRAIN_CALL, TINY_TRAIN_CALL)
        if block is export_block():  # the README's shell step before it
            assert cli.main(["export", str(namespace["run"].run_dir), "--format", "onnx"]) == 0
        exec(compile(code, f"README.md block {i}", "exec"), namespace)
    out = capsys.readouterr().out
    assert re.search(r"return \d+\.\d ± \d+\.\d over 10 episodes", out)
    assert "torch.Size([3])\ntorch.Size([])\n(3,)\n()\n" in out
    assert "torch.Size([4, 1])" in out
    assert "torch.Size([8, 16, 1])" in out
    assert "['loss_critic', 'loss_entropy', 'loss_objective']" in out
    assert "1024 torch.Size([64])" in out
    assert (tmp_path / "rollout" / "meta.json").exists()


def test_readme_exported_policy_runs_without_steersman(tmp_path):
    """The README's exported-policy block, run by a Python that cannot import steersman:
    isolated (-I), no site processing (-S: the editable install's path hook is not
    loaded), only the environment's site-packages on sys.path, cwd elsewhere."""
    pytest.importorskip("onnxruntime")
    import torch

    import steersman
    from steersman.record import export_policy

    run = steersman.train("ppo", run_dir=tmp_path / "run", total_frames=256, quiet=True,
                          logger={"backends": ["csv"]}, eval={"episodes": 2})
    agent = steersman.load(run)
    export_policy(agent.policy, torch.zeros(2, 4), run.run_dir / "export" / "policy.onnx", "onnx", verify=False)
    site = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    script = (
        "import sys\n"
        f"sys.path[:] = [p for p in sys.path if 'site-packages' not in p] + {site!r}\n"
        "try:\n    import steersman\nexcept ModuleNotFoundError:\n    print('no steersman here')\n"
        "else:\n    raise SystemExit('steersman is importable: ' + steersman.__file__)\n"
        "from pathlib import Path\nfrom types import SimpleNamespace\n"
        f"run = SimpleNamespace(run_dir=Path({str(run.run_dir)!r}))\n" + export_block()
    )
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", script], cwd=cwd, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["no steersman here", "torch.Size([3])", "torch.Size([])", "(3,)", "()"]
    # the README's shapes are the agent's: observations [3, 4] -> actions [3], one observation -> one action
    assert agent.act(torch.zeros(3, 4)).shape == (3,) and agent.act(torch.zeros(4)).shape == ()


def test_readme_commands_exist():
    for script in re.findall(r"`bash ([\w./-]+)`", README):
        assert (ROOT / script).is_file(), f"README names {script}, which does not exist"
    assert "bash .ci/run" in README
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pytest" in ci


def test_readme_stands_alone():
    """Every relative link of the README points at a file of the repository."""
    links = re.findall(r"\]\((?!https?://|#)([^)]+)\)", README)
    assert "docs/architecture.md" in links
    for link in links:
        assert (ROOT / link).exists(), f"README links {link}, which a clone does not have"
    for command in ["tensorboard --logdir runs", "steersman --version", "steersman train -m ppo seed=0,1,2"]:
        assert command in README
