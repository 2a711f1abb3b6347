"""The README's example runs as written, and its commands point at files that exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_tour_runs(tmp_path, monkeypatch, capsys):
    """Every python block of the README, in order, in one namespace (as a reader would)."""
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert len(blocks) >= 4, "README lost its tour"
    namespace: dict = {}
    for i, block in enumerate(blocks):
        code = block.replace("/tmp/rollout", str(tmp_path / "rollout"))
        exec(compile(code, f"README.md block {i}", "exec"), namespace)
    out = capsys.readouterr().out
    assert "torch.Size([4, 1])" in out
    assert "torch.Size([8, 16, 1])" in out
    assert "['loss_critic', 'loss_entropy', 'loss_objective']" in out
    assert "1024 torch.Size([64])" in out
    assert (tmp_path / "rollout" / "meta.json").exists()


def test_readme_commands_exist():
    for script in re.findall(r"`bash ([\w./-]+)`", README):
        assert (ROOT / script).is_file(), f"README names {script}, which does not exist"
    assert "bash .ci/run" in README
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pytest" in ci
