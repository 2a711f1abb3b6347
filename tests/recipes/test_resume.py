"""Bit-exact resume with real processes.

For each recipe tested: a ``steersman train`` process is SIGKILLed at a random point after a
checkpoint; ``steersman resume`` finishes it; the same config trained without interruption is
the reference. The final checkpoints (networks, targets, optimizer moments, collector and RNG
states) must be bit-identical. CPU, one thread: the runs are deterministic. Only the killed run
needs a process of its own; the reference and the resume run in-process through the same
entry points (``run_recipe``, ``steersman.cli.main``), which saves two interpreter start-ups.
"""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from steersman.cli import main
from steersman.recipes import run_recipe
from steersman.recipes.checkpoint import latest_checkpoint, load_checkpoint
from tests.recipes._tiny import cli_overrides

REPO = Path(__file__).resolve().parents[2]
#: frames of the runs: long enough for several checkpoints (one per batch), and PPO's for the
#: kill after checkpoint k <= 5 to land before its last (32 of them: with 8, a loaded machine
#: polled past the end once, "assert 512 < 512")
RUNS = {
    "ppo": {"total_frames": 2048, "checkpoint.interval": 64},
    "sac": {"total_frames": 160, "checkpoint.interval": 16},
}


def _train(algo: str, run_dir: Path) -> subprocess.Popen:
    args = [sys.executable, "-m", "steersman", "train", algo, *cli_overrides(algo, **RUNS[algo]),
            f"hydra.run.dir={run_dir}"]
    return subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _flat(obj, prefix=""):
    """Every tensor and number of a nested state, by path."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _flat(v, f"{prefix}/{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _flat(v, f"{prefix}/{i}")
    elif hasattr(obj, "to_dict"):
        yield from _flat(obj.to_dict(), prefix)
    else:
        yield prefix, obj


def _assert_identical(a: dict, b: dict) -> None:
    fa, fb = dict(_flat(a)), dict(_flat(b))
    assert fa.keys() == fb.keys()
    for key, va in fa.items():
        vb = fb[key]
        if isinstance(va, torch.Tensor):
            assert va.dtype == vb.dtype and va.shape == vb.shape and torch.equal(va, vb), f"{key} differs"
        elif isinstance(va, float) and math.isnan(va):
            assert isinstance(vb, float) and math.isnan(vb), f"{key}: {va!r} != {vb!r}"
        else:
            assert va == vb, f"{key}: {va!r} != {vb!r}"


@pytest.mark.slow
@pytest.mark.parametrize("algo", sorted(RUNS))
def test_sigkill_then_resume_is_bit_exact(algo, tmp_path):
    rng = random.Random(os.getpid())
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    proc = _train(algo, killed)
    # kill after the k-th checkpoint, at a random moment of the iteration that follows
    k = rng.randint(2, 5)
    deadline = time.monotonic() + 300
    while True:
        latest = latest_checkpoint(killed / "checkpoints") if (killed / "checkpoints").exists() else None
        if latest is not None and int(latest.name[5:]) >= k:
            break
        assert proc.poll() is None, f"the run ended before its checkpoint {k}:\n{proc.stdout.read()}"
        assert time.monotonic() < deadline, "no checkpoint written in time"
        time.sleep(0.005)
    time.sleep(rng.uniform(0.0, 0.05))
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    frames_at_kill = load_checkpoint(killed / "checkpoints").meta["frames"]
    assert frames_at_kill < RUNS[algo]["total_frames"]

    assert main(["resume", str(killed)]) == 0
    run_recipe(algo, cli_overrides(algo, **RUNS[algo]), reference)

    a, b = load_checkpoint(reference / "checkpoints"), load_checkpoint(killed / "checkpoints")
    assert a.meta["frames"] == b.meta["frames"] == RUNS[algo]["total_frames"]
    _assert_identical(a.state, b.state)


def test_a_run_made_before_a_config_field_existed_resumes(tmp_path):
    """A run folder written before a field was added (its config.yaml lacks the key) was
    trained with that field's default: resume takes the default instead of refusing the
    folder as changed; a field the old config has with another value still refuses."""
    import yaml

    from steersman.recipes import get_recipe
    from steersman.recipes.run import RunDirError
    from tests.recipes._tiny import tiny_config

    run = tmp_path / "run"
    get_recipe("ppo").train(tiny_config("ppo", total_frames=128, export_format="none"), run)
    saved = yaml.safe_load((run / "config.yaml").read_text())
    for key in ("seeds", "sweep"):  # fields PPO gained after such a run was made
        saved.pop(key, None)
    saved["eval"].pop("video", None)
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    summary = get_recipe("ppo").train(tiny_config("ppo", total_frames=256, export_format="none"), run, resume=True)
    assert summary["frames"] == 256
    with pytest.raises(RunDirError, match="config changed incompatibly .*hidden_sizes"):
        get_recipe("ppo").train(tiny_config("ppo", total_frames=512, export_format="none", hidden_sizes=[8]), run,
                                resume=True)
