"""Learning curves: PNG output, seed grouping from configs, mean and band values."""

from __future__ import annotations

import numpy as np
import pytest

from steersman.record import CSVLogger, plot_learning_curves

pytest.importorskip("matplotlib")


def make_run(root, name, evals, trains=None, config=None):
    with CSVLogger(name, root) as log:
        for step, value in (trains or {}).items():
            log.log_scalar("train/return", value, step)
        for step, value in evals.items():
            log.log_scalar("eval/return", value, step)
    if config is not None:
        (root / name / "config.yaml").write_text(config)
    return root / name


def line(fig, gid):
    (ln,) = [ln for ln in fig.axes[0].get_lines() if ln.get_gid() == gid]
    return ln.get_xdata().tolist(), ln.get_ydata().tolist()


def band_at(fig, gid, x):
    (coll,) = [c for c in fig.axes[0].collections if c.get_gid() == gid]
    verts = coll.get_paths()[0].vertices
    return sorted({float(y) for vx, y in verts if vx == x})


def test_single_run_png(tmp_path):
    run = make_run(tmp_path, "run", {1000: 20.0, 2000: 60.0}, {500: 10.0, 1000: 15.0, 1500: 30.0})
    out = tmp_path / "plots" / "learning_curve.png"
    fig = plot_learning_curves([run], out, labels=["ppo"])
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    assert line(fig, "ppo:eval") == ([1000.0, 2000.0], [20.0, 60.0])
    assert line(fig, "ppo:train") == ([500.0, 1000.0, 1500.0], [10.0, 15.0, 30.0])
    assert fig.axes[0].get_xlabel() == "frames" and fig.axes[0].get_ylabel() == "eval/return"
    assert not fig.axes[0].collections  # no band for one seed


def test_train_only_run(tmp_path):
    run = make_run(tmp_path, "run", {}, {100: 1.0, 200: 2.0})
    fig = plot_learning_curves([run], labels=["a2c"])
    assert line(fig, "a2c:train") == ([100.0, 200.0], [1.0, 2.0])
    assert fig.axes[0].get_ylabel() == "train/return"


@pytest.mark.parametrize("band", ["minmax", "std"])
def test_seeds_grouped_by_config(tmp_path, band):
    """A sweep lr x seed: one curve per lr, mean over seeds, band over seeds."""
    runs, values = [], {}
    for lr in ("0.001", "0.0003"):
        for seed in range(3):
            ev = {1000: float(seed) + (100 if lr == "0.001" else 0), 2000: 2.0 * seed}
            values.setdefault(lr, []).append(ev)
            runs.append(make_run(tmp_path, f"r{lr}_{seed}", ev,
                                 config=f"algo: ppo\nseed: {seed}\noptim:\n  lr: {lr}\n"))
    fig = plot_learning_curves(runs, tmp_path / "c.png", band=band)
    for lr, evs in values.items():
        gid = f"optim.lr={float(lr)}"
        xs, ys = line(fig, f"{gid}:eval")
        at1000 = np.array([e[1000] for e in evs])
        assert xs == [1000.0, 2000.0]
        assert ys == pytest.approx([at1000.mean(), np.mean([e[2000] for e in evs])])
        lo, hi = (at1000.min(), at1000.max()) if band == "minmax" else (
            at1000.mean() - at1000.std(), at1000.mean() + at1000.std())
        assert band_at(fig, f"{gid}:band", 1000.0) == pytest.approx([lo, hi])
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "optim.lr=0.001 (3 seeds)" in legend and "optim.lr=0.0003 (3 seeds)" in legend


def test_same_config_one_group_named_by_algo(tmp_path):
    runs = [make_run(tmp_path, f"s{s}", {10: float(s)}, config=f"algo: sac\nseed: {s}\nenv:\n  name: Pendulum-v1\n")
            for s in range(2)]
    fig = plot_learning_curves(runs)
    assert line(fig, "sac Pendulum-v1:eval") == ([10.0], [0.5])


def test_seeds_evaluated_at_different_frames_are_interpolated(tmp_path):
    a = make_run(tmp_path, "a", {0: 0.0, 100: 10.0, 200: 20.0})
    b = make_run(tmp_path, "b", {50: 0.0, 150: 0.0, 250: 0.0})
    fig = plot_learning_curves([a, b], labels=["x", "x"])
    xs, ys = line(fig, "x:eval")
    assert xs == [50.0, 100.0, 150.0, 200.0]  # the x values both seeds cover
    assert ys == pytest.approx([2.5, 5.0, 7.5, 10.0])


def test_without_configs_each_run_is_its_own_curve(tmp_path):
    runs = [make_run(tmp_path, n, {1: 1.0}) for n in ("one", "two")]
    fig = plot_learning_curves(runs)
    assert {ln.get_gid() for ln in fig.axes[0].get_lines()} == {"one:eval", "two:eval"}


def test_errors(tmp_path):
    run = make_run(tmp_path, "run", {1: 1.0})
    with pytest.raises(FileNotFoundError, match="has no metrics.csv in it or below it"):
        plot_learning_curves([tmp_path / "nope"])
    with pytest.raises(ValueError, match=r"has no column \['step', 'eval/q'\]: its columns are \['step', 'eval/return'\]"):
        plot_learning_curves([run], y="eval/q", train_y=None)
    with pytest.raises(ValueError, match="2 labels for 1 runs"):
        plot_learning_curves([run], labels=["a", "b"])
    with pytest.raises(ValueError, match="band must be"):
        plot_learning_curves([run], band="iqr")
    with pytest.raises(ValueError, match="no run directory"):
        plot_learning_curves([])


def test_sweep_folders_expand_to_their_runs(tmp_path):
    """A folder of run directories (a Hydra multirun) counts as all the runs below it."""
    for sweep, base in (("a", 0.0), ("b", 10.0)):
        (tmp_path / sweep).mkdir()
        for seed in range(2):
            make_run(tmp_path / sweep, str(seed), {5: base + seed})
    fig = plot_learning_curves([tmp_path / "a", tmp_path / "b"], labels=["A", "B"])
    assert line(fig, "A:eval") == ([5.0], [0.5]) and line(fig, "B:eval") == ([5.0], [10.5])
    assert band_at(fig, "B:band", 5.0) == [10.0, 11.0]
