"""Learning curves from run directories: mean and spread over seeds, with matplotlib (Agg).

Each run directory holds a ``metrics.csv`` (:class:`~steersman.record.CSVLogger`'s
wide format) and, when made by ``steersman train``, a ``config.yaml``. Runs whose
configs are equal once their ``seed`` entries are removed form one group (one curve:
the mean over seeds, with a min-max or standard-deviation band); groups are labelled
by the config entries that tell them apart.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ._optional import import_optional
from .loggers.csv import read_metrics_csv

__all__ = ["aggregate_returns", "plot_aggregate_curve", "plot_learning_curves"]

_LABEL_KEYS = ("algo", "algorithm", "env.name", "env")


def plot_learning_curves(
    run_dirs: Sequence[str | os.PathLike],
    out_path: str | os.PathLike | None = None,
    *,
    x: str = "step",
    y: str = "eval/return",
    train_y: str | None = "train/return",
    labels: Sequence[str] | None = None,
    band: str = "minmax",
    x_label: str = "frames",
    title: str | None = None,
) -> Any:
    """Draws the learning curves of ``run_dirs`` and saves them to ``out_path`` (PNG...).

    Per group of runs: the evaluation return ``y`` (line with markers, mean over seeds,
    band over seeds) and the training return ``train_y`` (thin line, mean over seeds),
    both against the column ``x`` (``"step"``: the recipes log with the number of frames
    as step). Seeds evaluated at different ``x`` are interpolated onto the ``x`` values
    that all of them cover.

    Args:
        run_dirs: run directories, folders holding run directories (a sweep: every
            ``metrics.csv`` below it counts), or ``metrics.csv`` files.
        out_path: where to save the figure (format from the suffix); None: not saved.
        x: the x column. y: the evaluation column. train_y: the training column (None: not drawn).
        labels: one label per entry of ``run_dirs`` (the runs under a folder share it);
            runs with the same label are averaged (default: from the configs, see the
            module docstring; without configs, each run alone).
        band: ``"minmax"``, ``"std"`` (mean +- one standard deviation) or ``"none"``.
        x_label: the x axis title. title: the figure title.

    Returns: the matplotlib ``Figure``. Its lines carry ``gid`` ``"<label>:eval"`` and
    ``"<label>:train"`` and the bands ``"<label>:band"``.

    Example:
        >>> import tempfile
        >>> from steersman.record import CSVLogger
        >>> root = tempfile.mkdtemp()
        >>> for seed in range(2):
        ...     with CSVLogger(f"seed{seed}", root) as log:
        ...         for step in (100, 200):
        ...             log.log_metrics({"train/return": step / 10 + seed, "eval/return": step + seed}, step)
        >>> fig = plot_learning_curves([f"{root}/seed0", f"{root}/seed1"], f"{root}/curve.png",
        ...                            labels=["ppo", "ppo"])
        >>> line = next(ln for ln in fig.axes[0].get_lines() if ln.get_gid() == "ppo:eval")
        >>> line.get_xdata().tolist(), line.get_ydata().tolist()
        ([100.0, 200.0], [100.5, 200.5])
    """
    if band not in ("minmax", "std", "none"):
        raise ValueError(f"band must be 'minmax', 'std' or 'none', got {band!r}")
    if not run_dirs:
        raise ValueError("plot_learning_curves: no run directory given")
    if labels is not None and len(labels) != len(run_dirs):
        raise ValueError(f"plot_learning_curves: {len(labels)} labels for {len(run_dirs)} runs")
    found = [_metrics_paths(Path(d)) for d in run_dirs]
    paths = [p for ps in found for p in ps]
    if labels is None:
        labels = _default_labels([p.parent for p in paths])
    else:  # the runs found under one argument share its label
        labels = [label for label, ps in zip(labels, found) for _ in ps]
    groups: dict[str, list[dict[str, list[float]]]] = {}
    for path, label in zip(paths, labels):
        cols = read_metrics_csv(path)
        if x not in cols or (y not in cols and (train_y is None or train_y not in cols)):
            wanted = [c for c in (x, y, train_y) if c]
            raise ValueError(f"{str(path)!r} has no column {wanted}: its columns are {list(cols)}")
        groups.setdefault(label, []).append(cols)

    import_optional("matplotlib", extra=None, purpose="plot_learning_curves")
    from matplotlib import colormaps
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    fig = Figure(figsize=(7.0, 4.5), layout="constrained")
    ax = fig.add_subplot()
    palette = colormaps["tab10"]
    handles = []
    for i, (label, runs) in enumerate(groups.items()):
        color = palette(i % 10)
        n = len(runs)
        legend = f"{label} ({n} seed{'s' if n > 1 else ''})"
        ev = _aggregate([_series(r, x, y) for r in runs], band)
        tr = _aggregate([_series(r, x, train_y) for r in runs], "none") if train_y else None
        if tr is not None:
            thin = ev is not None
            (line,) = ax.plot(tr[0], tr[1], color=color, lw=1.0 if thin else 1.8,
                              alpha=0.45 if thin else 1.0, gid=f"{label}:train")
            if not thin:
                handles.append(Line2D([], [], color=color, label=legend))
        if ev is not None:
            ax.plot(ev[0], ev[1], color=color, lw=1.8, marker="o", ms=3.5, gid=f"{label}:eval")
            if band != "none" and n > 1:
                ax.fill_between(ev[0], ev[2], ev[3], color=color, alpha=0.2, lw=0, gid=f"{label}:band")
            handles.append(Line2D([], [], color=color, marker="o", ms=3.5, label=legend))
    if train_y:
        handles.append(Line2D([], [], color="grey", lw=1.0, alpha=0.6, label=f"thin: {train_y}"))
    ax.set_xlabel(x_label)
    ax.set_ylabel(y if any(_has(r, y) for runs in groups.values() for r in runs) else str(train_y))
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title)
    if handles:
        ax.legend(handles=handles, fontsize="small", loc="best")
    if out_path is not None:
        out_path = Path(out_path)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out_path, dpi=120)
    return fig


def _metrics_paths(d: Path) -> list[Path]:
    """``[d]`` for a CSV file, ``[d/metrics.csv]`` for a run directory, else the
    ``metrics.csv`` files below ``d`` (a sweep's folder)."""
    if d.suffix == ".csv" and d.is_file():
        return [d]
    if (d / "metrics.csv").is_file():
        return [d / "metrics.csv"]
    below = sorted(d.glob("**/metrics.csv")) if d.is_dir() else []
    if not below:
        raise FileNotFoundError(f"{str(d)!r} has no metrics.csv in it or below it: give run directories "
                                "written by `steersman train`, folders holding them, or metrics.csv files")
    return below


def _has(cols: dict[str, list[float]], name: str | None) -> bool:
    return name is not None and name in cols and any(not math.isnan(v) for v in cols[name])


def _series(cols: dict[str, list[float]], x: str, y: str | None) -> tuple[np.ndarray, np.ndarray] | None:
    if not _has(cols, y):
        return None
    xs, ys = np.asarray(cols[x]), np.asarray(cols[y])
    keep = ~(np.isnan(xs) | np.isnan(ys))
    order = np.argsort(xs[keep], kind="stable")
    return xs[keep][order], ys[keep][order]


def _aggregate(series: list, band: str) -> tuple[np.ndarray, ...] | None:
    """(x, mean, low, high) over the runs that have the column; None if none has it."""
    series = [s for s in series if s is not None]
    if not series:
        return None
    if len(series) == 1:
        sx, sy = series[0]
        return sx, sy, sy, sy
    lo = max(s[0][0] for s in series)
    hi = min(s[0][-1] for s in series)
    grid = np.unique(np.concatenate([s[0] for s in series]))
    if lo <= hi:  # where every seed has data
        grid = grid[(grid >= lo) & (grid <= hi)]
    ys = np.stack([np.interp(grid, sx, sy, left=np.nan, right=np.nan) for sx, sy in series])
    mean = np.nanmean(ys, axis=0)
    if band == "std":
        std = np.nanstd(ys, axis=0)
        return grid, mean, mean - std, mean + std
    return grid, mean, np.nanmin(ys, axis=0), np.nanmax(ys, axis=0)


def _default_labels(dirs: list[Path]) -> list[str]:
    """Labels from the runs' configs: the entries (seed excluded) that differ between runs."""
    configs = [_flat_config(d) for d in dirs]
    if any(c is None for c in configs):
        return [d.name for d in dirs]
    configs = [{k: v for k, v in c.items() if k.split(".")[-1] != "seed"} for c in configs]
    keys = sorted({k for c in configs for k in c},
                  key=lambda k: (_LABEL_KEYS.index(k) if k in _LABEL_KEYS else len(_LABEL_KEYS), k))
    diff = [k for k in keys if len({repr(c.get(k)) for c in configs}) > 1]
    if not diff:
        common = [str(configs[0][k]) for k in _LABEL_KEYS if k in configs[0]]
        return [" ".join(common) or dirs[0].name] * len(dirs)
    shown = diff[:3]
    more = ", ..." if len(diff) > 3 else ""
    return [", ".join(f"{k}={c.get(k)}" for k in shown) + more for c in configs]


def _flat_config(d: Path) -> dict[str, Any] | None:
    path = d / "config.yaml"
    if not path.is_file():
        return None
    yaml = import_optional("yaml", extra=None, purpose="reading config.yaml", package="PyYAML")
    data = yaml.safe_load(path.read_text())
    return _flatten(data) if isinstance(data, dict) else None


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


# ---------------------------------------------------------------- aggregates over seeds (rliable's advice)
def aggregate_returns(values: Any, *, n_boot: int = 2000, seed: int = 0) -> dict[str, float]:
    """Summary of one score per seed: ``mean``, its percentile-bootstrap 95% interval
    (``ci_low``, ``ci_high``; ``n_boot`` resamples of the seeds, a fixed ``seed``) and the
    interquartile mean ``iqm`` (the mean of the middle 50%: ``int(n / 4)`` scores cut at
    each end, as ``scipy.stats.trim_mean(x, 0.25)``). NaN scores are left out.

    Example:
        >>> s = aggregate_returns([100.0, 200.0, 300.0, 10_000.0])
        >>> s["mean"], s["iqm"]
        (2650.0, 250.0)
        >>> s["ci_low"] <= s["mean"] <= s["ci_high"]
        True
    """
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    x = x[~np.isnan(x)]
    if x.size == 0:
        return {"mean": math.nan, "ci_low": math.nan, "ci_high": math.nan, "iqm": math.nan, "n": 0}
    s = np.sort(x)
    cut = int(0.25 * s.size)
    means = np.random.default_rng(seed).choice(x, size=(n_boot, x.size), replace=True).mean(axis=1)
    return {"mean": float(x.mean()), "ci_low": float(np.percentile(means, 2.5)),
            "ci_high": float(np.percentile(means, 97.5)), "iqm": float(s[cut:s.size - cut].mean()), "n": int(x.size)}


def plot_aggregate_curve(run_dirs: Sequence[str | os.PathLike], out_path: str | os.PathLike | None = None, *,
                         x: str = "step", y: str = "eval/return", title: str | None = None) -> Any:
    """The aggregate learning curve of the seeds under ``run_dirs`` (found as
    :func:`plot_learning_curves` finds them; grouped by their configs, seed left out, or
    all in one group when some run has no ``config.yaml``): per group, the mean over seeds
    with its bootstrap 95% interval (band) and the interquartile mean (dashed), at the
    ``x`` values every seed has. Lines carry ``gid`` ``"<label>:mean"``, ``"<label>:iqm"``
    and ``"<label>:ci"``.

    Example:
        >>> import tempfile
        >>> from steersman.record import CSVLogger
        >>> root = tempfile.mkdtemp()
        >>> for seed in range(4):
        ...     with CSVLogger(f"seed_{seed}", root) as log:
        ...         log.log_metrics({"eval/return": 10.0 * seed}, 100)
        >>> fig = plot_aggregate_curve([root], f"{root}/curve.png")
        >>> [ln.get_ydata().tolist() for ln in fig.axes[0].get_lines()]
        [[15.0], [15.0]]
    """
    paths = [p for d in run_dirs for p in _metrics_paths(Path(d))]
    dirs = [p.parent for p in paths]
    with_configs = all((d / "config.yaml").is_file() for d in dirs)  # without: all runs are seeds of one group
    labels = _default_labels(dirs) if with_configs else ["runs"] * len(dirs)
    groups: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for path, label in zip(paths, labels):
        series = _series(read_metrics_csv(path), x, y)
        if series is None:
            raise ValueError(f"{str(path)!r} has no values in column {y!r}")
        groups.setdefault(label, []).append(series)
    import_optional("matplotlib", extra=None, purpose="plot_aggregate_curve")
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.0, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for i, (label, runs) in enumerate(groups.items()):
        grid = runs[0][0]
        for sx, _ in runs[1:]:
            grid = np.intersect1d(grid, sx)
        ys = np.stack([np.interp(grid, sx, sy) for sx, sy in runs])  # [seeds, len(grid)]
        stats = [aggregate_returns(ys[:, j]) for j in range(grid.size)]
        color = colormaps["tab10"](i % 10)
        ax.plot(grid, [s["mean"] for s in stats], color=color, lw=1.8, gid=f"{label}:mean",
                label=f"{label}: mean of {len(runs)} seeds")
        ax.fill_between(grid, [s["ci_low"] for s in stats], [s["ci_high"] for s in stats], color=color,
                        alpha=0.2, lw=0, gid=f"{label}:ci")
        ax.plot(grid, [s["iqm"] for s in stats], color=color, lw=1.2, ls="--", gid=f"{label}:iqm",
                label=f"{label}: IQM")
    ax.set_xlabel("frames" if x == "step" else x)
    ax.set_ylabel(f"{y} (band: bootstrap 95% CI of the mean)")
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title)
    ax.legend(fontsize="small", loc="best")
    if out_path is not None:
        out_path = Path(out_path)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out_path, dpi=120)
    return fig
