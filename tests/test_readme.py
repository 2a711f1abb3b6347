"""The README's example runs as written, and its commands point at files that exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_example_runs(tmp_path, monkeypatch, capsys):
    block = re.search(r"```python\n(.*?)```", README, re.S)
    assert block, "README has no python example"
    code = block.group(1).replace("/tmp/rollout", str(tmp_path / "rollout"))
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "torch.Size([4, 1])" in out
    assert (tmp_path / "rollout" / "meta.json").exists()


def test_readme_commands_exist():
    for script in re.findall(r"`bash ([\w./-]+)`", README):
        assert (ROOT / script).is_file(), f"README names {script}, which does not exist"
    assert "bash .ci/run" in README
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pytest" in ci
