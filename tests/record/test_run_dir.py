"""RunDir: unique creation, open errors, the run's loggers."""

from __future__ import annotations

import pytest

from steersman.record import NotARunDirError, RunDir, read_metrics_csv


def test_create_unique(tmp_path):
    runs = [RunDir.create(tmp_path / "runs", "ppo") for _ in range(3)]
    assert len({r.path for r in runs}) == 3 and all(r.path.is_dir() for r in runs)
    assert all(r.name.startswith("ppo_") for r in runs)


def test_layout(tmp_path):
    run = RunDir(tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in (
        run.config_path, run.metrics_csv, run.tb_dir, run.checkpoints_dir,
        run.learning_curve_png, run.export_dir, run.videos_dir)] == [
        "config.yaml", "metrics.csv", "tb", "checkpoints", "plots/learning_curve.png", "export", "videos"]


def test_open(tmp_path):
    with pytest.raises(NotARunDirError, match="does not exist"):
        RunDir.open(tmp_path / "missing")
    with pytest.raises(NotARunDirError, match="has no config.yaml"):
        RunDir.open(tmp_path)
    (tmp_path / "config.yaml").write_text("seed: 1\n")
    assert RunDir.open(tmp_path).path == tmp_path


def test_make_logger(tmp_path):
    pytest.importorskip("tensorboard")
    run = RunDir.create(tmp_path, "dqn")
    with run.make_logger() as log:
        log.log_scalar("train/return", 5.0, 100)
        log.log_scalar("train/return", 6.0, 200)
    assert read_metrics_csv(run.metrics_csv) == {"step": [100.0, 200.0], "train/return": [5.0, 6.0]}
    assert any(p.name.startswith("events.out.tfevents") for p in run.tb_dir.iterdir())
    with run.make_logger(["csv"], start_step=100) as log:  # resume
        log.log_scalar("train/return", 7.0, 200)
    assert read_metrics_csv(run.metrics_csv)["train/return"] == [5.0, 7.0]


def test_make_logger_unknown_backend(tmp_path):
    with pytest.raises(ValueError, match="unknown logger backend 'neptune': choose from 'csv'"):
        RunDir(tmp_path).make_logger(["neptune"])
