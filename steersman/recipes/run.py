"""``Run``: everything a recipe does besides learning, so that its file shows only the loop.

A :class:`Run` owns one run directory (the layout of :class:`steersman.record.RunDir`)::

    <run_dir>/
      config.yaml                the algorithm and its resolved config (what `resume` reads)
      metrics.csv                one row per logged step (step = frames): every metric
      tb/                        TensorBoard events (with the "tensorboard" logger)
      plots/learning_curve.png   return vs frames, evaluation points marked (at the end)
      checkpoints/               periodic checkpoints (:mod:`steersman.recipes.checkpoint`)
      export/policy.pt2          the exported policy (`export_format` chooses the format)
      summary.json               final evaluation return, wall time, frames/s, paths

and provides: metrics logging and the progress bar (:meth:`log`, :meth:`log_eval`), the
schedule of evaluations and checkpoints (:meth:`eval_due`, :meth:`checkpoint_due`),
checkpoint save/restore (:meth:`save`, :meth:`restore`), stop requests from SIGINT
(Ctrl-C) and SIGTERM (:attr:`stop_requested`: the recipe breaks out of its loop at the
end of the iteration and saves a final checkpoint), and the end of the run
(:meth:`finish`: export, plot, summary).

A recipe uses it like this (the whole protocol)::

    run = Run("ppo", cfg, run_dir, resume=resume)
    ...build env, networks, loss, optimizer, collector...
    if (ckpt := run.restore()) is not None:
        ...load ckpt.state into them...
    for batch in collector:
        ...learn...
        run.log(frames, {"train/loss": ...})
        if run.eval_due(frames): run.log_eval(frames, evaluate(eval_env, policy))
        if run.checkpoint_due(frames) or run.stop_requested: run.save(state())
        if run.stop_requested: break
    return run.finish(policy, example_obs, final_eval_return)
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from steersman import record
from steersman.tensordict.files import write_json_atomic

from .checkpoint import Checkpoint, latest_checkpoint, load_checkpoint, rng_state, save_checkpoint
from .config import config_to_dict, diff_configs

__all__ = ["Run", "RunDirError", "RUN_FILE", "RESUMABLE_KEYS", "default_run_dir", "read_run_config"]

RUN_FILE = "config.yaml"

#: Config keys (dotted prefixes) that may change between a run and its resume.
RESUMABLE_KEYS = ("total_frames", "num_updates", "quiet", "logger", "eval", "checkpoint", "export_format")


class RunDirError(ValueError):
    """A path is not a run directory, or a run directory cannot be used as asked."""


def read_run_config(run_dir: str | os.PathLike) -> tuple[str, dict[str, Any]]:
    """``(algo, config dict)`` stored in a run directory; :class:`RunDirError` if it is not one.

    Example:
        >>> read_run_config("/nonexistent")
        Traceback (most recent call last):
        ...
        steersman.recipes.run.RunDirError: /nonexistent is not a run directory (it does not exist); run directories are made by `steersman train`
    """
    import yaml

    run_dir = Path(run_dir)
    path = run_dir / RUN_FILE
    if not path.is_file():
        why = "it does not exist" if not run_dir.exists() else f"no {RUN_FILE} in it"
        raise RunDirError(f"{run_dir} is not a run directory ({why}); run directories are made by `steersman train`")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise RunDirError(f"{path} is not valid YAML ({err})") from None
    if not isinstance(data, dict) or not isinstance(data.get("algo"), str):
        raise RunDirError(f"{path} is not a steersman run config (no 'algo' entry)")
    data = dict(data)
    return data.pop("algo"), data


def default_run_dir(algo: str) -> Path:
    """``runs/<algo>_<date>_<time>`` (what ``steersman train`` uses too)."""
    return Path("runs") / f"{algo}_{time.strftime('%Y-%m-%d_%H-%M-%S')}"


def _resumable(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") for k in RESUMABLE_KEYS)


class Run:
    """The run directory of one training run, and the bookkeeping around the loop.

    Args:
        algo: the recipe's name (``"ppo"``...), stored so that ``steersman resume`` and
            ``steersman eval`` know which recipe to rebuild.
        cfg: the recipe's config dataclass; needs ``total_frames``, ``quiet``, ``logger``,
            ``eval`` and ``checkpoint`` fields (see :mod:`steersman.recipes.config`).
        run_dir: the folder (created if needed).
        resume: continue the run in ``run_dir`` from its latest checkpoint. Its config
            must match ``cfg`` except for :data:`RESUMABLE_KEYS` (``total_frames``...).
        handle_signals: turn SIGINT/SIGTERM into :attr:`stop_requested` while the run
            lives (main thread only; a second SIGINT interrupts at once).
        total: the length of the run for the progress bar (default ``cfg.total_frames``;
            offline recipes count gradient steps instead of frames).
    """

    def __init__(self, algo: str, cfg: Any, run_dir: str | os.PathLike, *, resume: bool = False,
                 handle_signals: bool = True, total: int | None = None) -> None:
        self.algo = algo
        self.cfg = cfg
        self.paths = record.RunDir(run_dir)
        self.dir = self.paths.path
        self.checkpoint_dir = self.paths.checkpoints_dir
        self.config = config_to_dict(cfg)
        self._check_dir(resume)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._write_config()
        self.frames = 0
        self.iteration = 0
        self.train_time = 0.0  # seconds of training over every session of this run
        self.evals: list[tuple[int, float]] = []
        self._saved_frames = -1  # frames of the last checkpoint this process wrote
        self._ckpt: Checkpoint | None = None
        if resume:
            self._ckpt = load_checkpoint(self.checkpoint_dir)
            m = self._ckpt.meta
            self.frames, self.iteration, self.train_time = m["frames"], m["iteration"], m["train_time"]
            self.evals = [(int(f), float(r)) for f, r in m.get("evals", [])]
        self._session_frames0 = self._shown = self.frames
        self._next_eval = self._next_multiple(cfg.eval.interval)
        self._next_ckpt = self._next_multiple(cfg.checkpoint.interval)
        self._session_start = time.perf_counter()
        self._last_return = math.nan
        self.stop_signal: int | None = None
        self._old_handlers: dict[int, Any] = {}
        self.logger = self._make_logger(cfg.logger.backends, start_step=self.frames if resume else None)
        self.progress = record.ProgressBar(total if total is not None else cfg.total_frames, quiet=cfg.quiet,
                                           initial=self.frames, description=algo)
        if resume:
            self.message(f"resuming {self.dir} at {self.frames} frames from {self._ckpt.path.name}")
        if handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)

    def _next_multiple(self, interval: int) -> float:
        """The first multiple of ``interval`` after the current frame count (inf if 0)."""
        return (self.frames // interval + 1) * interval if interval > 0 else math.inf

    def message(self, text: str) -> None:
        """Prints a line (above the progress bar) unless the run is quiet."""
        if not self.cfg.quiet:
            print(text, file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ setup
    def _check_dir(self, resume: bool) -> None:
        has_ckpt = latest_checkpoint(self.checkpoint_dir) is not None
        if not resume:
            if (self.dir / RUN_FILE).exists():
                raise RunDirError(
                    f"{self.dir} already holds a run; continue it with `steersman resume {self.dir}` "
                    "or choose another directory"
                )
            return
        algo, old = read_run_config(self.dir)
        if algo != self.algo:
            raise RunDirError(f"{self.dir} is a {algo} run; it cannot be resumed as {self.algo}")
        if not has_ckpt:
            raise RunDirError(f"{self.dir} has no checkpoint to resume from (under {self.checkpoint_dir})")
        changed = [(k, a, b) for k, a, b in diff_configs(old, self.config) if not _resumable(k)]
        if changed:
            desc = ", ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in changed)
            raise RunDirError(
                f"cannot resume {self.dir}: its config changed incompatibly ({desc}); only "
                f"{', '.join(RESUMABLE_KEYS)} may change on resume"
            )

    def _make_logger(self, backends: list[str], start_step: int | None) -> Any:
        backends = list(backends) if "csv" in backends else ["csv", *backends]  # metrics.csv always
        return self.paths.make_logger(backends, start_step=start_step, project=self.cfg.logger.project)

    def _write_config(self) -> None:
        import yaml

        text = yaml.safe_dump({"algo": self.algo, **self.config}, sort_keys=False)
        tmp = self.dir / f".{RUN_FILE}.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.dir / RUN_FILE)

    def _write_json(self, name: str, obj: Any) -> None:
        write_json_atomic(self.dir / name, obj, indent=1, default=str)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT and self.stop_signal == signal.SIGINT:
            raise KeyboardInterrupt  # second Ctrl-C: stop now
        self.stop_signal = signum
        print(f"{signal.Signals(signum).name}: finishing the iteration and saving a checkpoint "
              "(Ctrl-C again to stop at once)", file=sys.stderr, flush=True)

    def _restore_signals(self) -> None:
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers.clear()

    # ------------------------------------------------------------------ loop API
    @property
    def stop_requested(self) -> bool:
        """True once SIGINT or SIGTERM arrived: save a checkpoint and leave the loop."""
        return self.stop_signal is not None

    def restore(self) -> Checkpoint | None:
        """The checkpoint being resumed (None for a fresh run).

        The run's own counters (frames, iteration, training time, evaluations) are
        already restored; the recipe loads ``checkpoint.state`` into its objects and
        calls :func:`~steersman.recipes.checkpoint.set_rng_state` last.
        """
        return self._ckpt

    def log(self, frames: int, metrics: Mapping[str, float | torch.Tensor]) -> None:
        """Records training metrics at ``frames`` (every ``logger.log_interval`` calls) and
        moves the progress bar. Values may be 0-dim tensors (NaNs are left out)."""
        self.frames = frames
        self.iteration += 1
        ret = metrics.get("train/return")
        if ret is not None:
            self._last_return = _float(ret)
        if self.iteration % self.cfg.logger.log_interval == 0:
            values = {k: f for k, v in metrics.items() if not math.isnan(f := _float(v))}
            values["time/fps"] = self.fps
            self.logger.log_metrics(values, step=frames)
        self._advance(frames, **({"return": self._last_return} if ret is not None else {}))

    def _advance(self, frames: int, **metrics: float) -> None:
        self.progress.update(frames - self._shown, **{k: v for k, v in metrics.items() if not math.isnan(v)})
        self._shown = frames

    def eval_due(self, frames: int) -> bool:
        """Whether an evaluation is due at ``frames`` (every ``eval.interval`` frames)."""
        return frames >= self._next_eval

    def log_eval(self, frames: int, returns: torch.Tensor) -> float:
        """Records an evaluation (``returns``: one per episode); returns their mean."""
        mean = float(returns.float().mean())
        self.evals.append((frames, mean))
        self._next_eval = self._next_multiple(self.cfg.eval.interval)
        self.logger.log_metrics({"eval/return": mean, "eval/return_std": float(returns.float().std())
                                 if returns.numel() > 1 else 0.0}, step=frames)
        self._advance(frames, eval=mean)
        return mean

    def final_eval_due(self, frames: int) -> bool:
        """Whether the run still needs its final evaluation at ``frames`` (no evaluation was
        logged there yet, e.g. by the periodic schedule on the last batch)."""
        return not self.evals or self.evals[-1][0] != frames

    def final_save_due(self) -> bool:
        """Whether the run still needs its final checkpoint (none saved at these frames)."""
        return self._saved_frames != self.frames

    def checkpoint_due(self, frames: int) -> bool:
        """Whether a periodic checkpoint is due at ``frames``."""
        return frames >= self._next_ckpt

    @property
    def fps(self) -> float:
        """Training frames per second in this session (evaluation and checkpoints included)."""
        dt = time.perf_counter() - self._session_start
        return (self.frames - self._session_frames0) / dt if dt > 0 else 0.0

    def elapsed(self) -> float:
        """Wall-clock seconds of training over every session of this run."""
        return self.train_time + time.perf_counter() - self._session_start

    def save(self, state: dict[str, Any], replay_buffer: Any = None) -> Path:
        """Saves a checkpoint of ``state`` (plus the RNG states, counters and config).

        The RNG states are taken here, so call it where the loop would continue from.
        """
        state = {**state, "rng": rng_state()}
        meta = {
            "algo": self.algo, "frames": self.frames, "iteration": self.iteration,
            "train_time": self.elapsed(), "evals": self.evals, "config": self.config,
        }
        keep_rb = replay_buffer if self.cfg.checkpoint.replay_buffer else None
        path = save_checkpoint(self.checkpoint_dir, state, meta=meta, replay_buffer=keep_rb,
                               keep=self.cfg.checkpoint.keep)
        self._next_ckpt = self._next_multiple(self.cfg.checkpoint.interval)
        self._saved_frames = self.frames
        return path

    # ------------------------------------------------------------------ the end
    def finish(self, policy: Callable | None = None, example_obs: torch.Tensor | None = None,
               final_return: float | None = None) -> dict[str, Any]:
        """Ends the run: exports the policy, plots the curve, writes and prints the summary.

        After a stop request only the summary is written (the run is to be resumed).
        Returns the summary dict.
        """
        wall = self.elapsed()
        fps = self.fps
        self.progress.close()
        self._restore_signals()
        self.logger.close()
        written: dict[str, str] = {"run_dir": str(self.dir), "metrics": str(self.dir / "metrics.csv")}
        latest = latest_checkpoint(self.checkpoint_dir)
        if latest is not None:
            written["checkpoint"] = str(latest)
        fmt = self.cfg.export_format
        if not self.stop_requested and policy is not None and example_obs is not None and fmt != "none":
            path = self.paths.export_dir / export_filename(fmt)
            record.export_policy(policy, example_obs, path, format=fmt, verify=False)
            if fmt == "torch-export":  # quick in-process check (`steersman export` checks without steersman)
                _check_program(path, policy, example_obs)
            written["policy"] = str(path)
        if not self.stop_requested:
            curve = self.paths.learning_curve_png
            try:
                record.plot_learning_curves([self.dir], curve)
                written["plot"] = str(curve)
            except Exception as err:  # a missing plot must not lose the run
                print(f"warning: could not plot the learning curve: {err}", file=sys.stderr)
        if (final_return is None or math.isnan(final_return)) and self.evals and not self.stop_requested:
            final_return = self.evals[-1][1]  # e.g. a finished run resumed: its last evaluation
        summary = {
            "algo": self.algo, "env": self.cfg.env.name, "frames": self.frames,
            "final_eval_return": None if final_return is None or math.isnan(final_return) else final_return,
            "wall_time_s": round(wall, 2),
            "frames_per_s": round(fps, 1), "interrupted": self.stop_requested,
            "stop_signal": self.stop_signal,
            "train_return": None if math.isnan(self._last_return) else self._last_return, "written": written,
        }
        self._write_json("summary.json", summary)
        print(format_summary(summary), flush=True)
        return summary


def _float(v: float | torch.Tensor) -> float:
    return float(v.detach()) if isinstance(v, torch.Tensor) else float(v)


def _check_program(path: Path, policy: Callable, obs: torch.Tensor) -> None:
    """The exported program gives the live policy's deterministic actions on ``obs``."""
    from steersman.tensordict import TensorDict
    from steersman.tensordict.nn import ExplorationType, set_exploration_type

    program = torch.export.load(path).module()
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        want = policy(TensorDict({"observation": obs}, obs.shape[:1]))["action"]
        got = program(obs)
    if got.shape != want.shape or not torch.allclose(got.double(), want.double(), atol=1e-5):
        raise RuntimeError(f"the exported policy {path} does not reproduce the live policy's actions")


def export_filename(fmt: str) -> str:
    """The file name of an exported policy in a run directory, per format."""
    names = {"torch-export": "policy.pt2", "onnx": "policy.onnx"}
    if fmt not in names:
        raise ValueError(f"unknown export format {fmt!r}; valid: {sorted(names)} (or 'none')")
    return names[fmt]


def format_summary(s: Mapping[str, Any]) -> str:
    """The summary printed at the end of a run."""
    ret = s.get("final_eval_return")
    ret_s = "n/a" if ret is None else f"{ret:.1f}"
    head = "interrupted" if s.get("interrupted") else "done"
    lines = [
        f"{head}: {s['algo']} on {s['env']}: {s['frames']} frames in {s['wall_time_s']:.1f} s "
        f"({s['frames_per_s']:.0f} frames/s), final eval return {ret_s}",
    ]
    for what, path in s["written"].items():
        lines.append(f"  {what:<11} {path}")
    if s.get("interrupted"):
        lines.append(f"  continue with: steersman resume {s['written']['run_dir']}")
    return "\n".join(lines)
