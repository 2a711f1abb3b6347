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

and provides: checkpoint save/restore of the objects it tracks (:meth:`track`,
:meth:`save`), metrics logging and the progress bar (:meth:`log`, :meth:`log_eval`), the
schedule of evaluations and checkpoints (:meth:`eval_due`, :meth:`checkpoint_due`), stop
requests from SIGINT (Ctrl-C) and SIGTERM (:attr:`stop_requested`: the recipe saves and
leaves its loop at the end of the iteration), and the end of the run (:meth:`wrap_up`:
final evaluation and checkpoint, export, plot, summary).

A recipe uses it like this (the whole protocol)::

    run = Run("ppo", cfg, run_dir, resume=resume, frames_per_batch=n)  # checks; writes nothing yet
    ...build networks, loss, optimizer...
    collector = SyncDataCollector(env, policy, frames_per_batch=n, total_frames=run.total_frames)
    run.track(policy=actor, loss=loss_fn, optim=optim, collector=collector)  # restores, then starts
    frames = run.frames
    for batch in collector:
        frames += batch.numel()
        ...learn...
        run.log(frames, {"train/loss": ...})
        if run.eval_due(frames): run.log_eval(frames, evaluate(eval_env, policy))
        if run.checkpoint_due(frames): run.save()      # also due once a stop is requested
        if run.stop_requested: break
    return run.wrap_up(policy, eval_env)
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

from .checkpoint import (
    Checkpoint,
    CheckpointError,
    clean_dead_temps,
    latest_checkpoint,
    load_checkpoint,
    load_entry,
    rng_state,
    save_checkpoint,
    seed_everything,
)
from .config import ConfigError, config_to_dict, diff_configs, validate_config, with_defaults

__all__ = ["Run", "RunDirError", "RunFinished", "RUN_FILE", "RESUMABLE_KEYS", "default_run_dir", "read_run_config",
           "run_meta", "setup"]

RUN_FILE = "config.yaml"

#: The evaluation env's seed is the run's seed plus this.
EVAL_SEED_OFFSET = 10_000
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


def setup(cfg: Any) -> tuple[Any, Any]:
    """The start of every recipe: checks ``cfg`` (one-line ConfigError), seeds torch, numpy
    and random, sets torch's CPU threads, and builds the training env (``env.num_envs``
    sub-envs, seed ``cfg.seed``) and the evaluation env (``eval.episodes`` sub-envs)."""
    from .envs import BOARD_GAMES, make_env

    validate_config(cfg)
    if cfg.env.name in BOARD_GAMES:
        raise ConfigError(f"env.name={cfg.env.name} is a two-player board game: train it with alphazero or muzero")
    seed_everything(cfg.seed)
    if cfg.num_threads > 0:  # small networks: one thread avoids thread-pool overhead
        torch.set_num_threads(cfg.num_threads)
    env = make_env(cfg.env.name, cfg.env.num_envs, seed=cfg.seed, compile=cfg.env.compile,
                   max_episode_steps=cfg.env.max_episode_steps)
    eval_env = make_env(cfg.env.name, cfg.eval.episodes, seed=cfg.seed + EVAL_SEED_OFFSET,
                        max_episode_steps=cfg.env.max_episode_steps)
    return env, eval_env


def default_run_dir(algo: str) -> Path:
    """``runs/<algo>_<date>_<time>`` (what ``steersman train`` uses too)."""
    return Path("runs") / f"{algo}_{time.strftime('%Y-%m-%d_%H-%M-%S')}"


def _resumable(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") for k in RESUMABLE_KEYS)


class RunFinished(RunDirError):
    """``resume`` of a run that already reached its length: nothing to do (not an error)."""


class Run:
    """The run directory of one training run, and the bookkeeping around the loop.

    Creating it checks the folder (and, to resume, loads and checks the latest
    checkpoint) but writes nothing: :meth:`track` starts the run.

    Args:
        algo: the recipe's name (``"ppo"``...), stored so that ``steersman resume`` and
            ``steersman eval`` know which recipe to rebuild.
        cfg: the recipe's config dataclass; needs ``total_frames`` (or ``num_updates``),
            ``quiet``, ``logger``, ``eval``, ``checkpoint`` and ``export_format`` fields.
        run_dir: the folder (created by :meth:`track` if needed; None: :func:`default_run_dir`).
        resume: continue the run in ``run_dir`` from its latest checkpoint (from scratch,
            saying so, if it was stopped before its first one). Its config must match
            ``cfg`` except for :data:`RESUMABLE_KEYS` (``total_frames``...).
        handle_signals: turn SIGINT/SIGTERM into :attr:`stop_requested` while the run
            lives (main thread only; a second SIGINT interrupts at once).
        frames_per_batch: frames per collected batch: the run stops at the first whole
            batch at or after ``cfg.total_frames`` (:attr:`total_frames`; the summary says so).
        total: the length of the run in other units (offline recipes count gradient
            steps: ``cfg.num_updates``).
    """

    def __init__(self, algo: str, cfg: Any, run_dir: str | os.PathLike | None, *, resume: bool = False,
                 handle_signals: bool = True, frames_per_batch: int | None = None,
                 total: int | None = None) -> None:
        self.algo = algo
        self.cfg = cfg
        self.paths = record.RunDir(run_dir if run_dir is not None else default_run_dir(algo))
        self.dir = self.paths.path
        self.checkpoint_dir = self.paths.checkpoints_dir
        self.config = config_to_dict(cfg)
        self.requested = total if total is not None else cfg.total_frames
        self.total_frames = self.requested if not frames_per_batch else -(-self.requested // frames_per_batch) * frames_per_batch
        self.frames_per_batch = frames_per_batch
        self.frames = 0
        self.iteration = 0
        self.train_time = 0.0  # seconds of training over every session of this run
        self.evals: list[tuple[int, float]] = []
        self._ckpt: Checkpoint | None = None
        self._resume = resume
        self._handle_signals = handle_signals
        self._tracked: dict[str, Any] = {}
        self._buffer: Any = None
        self._saved_frames = -1  # frames of the last checkpoint this process wrote
        self._last_return = math.nan
        self.stop_signal: int | None = None
        self._old_handlers: dict[int, Any] = {}
        if self._check_dir(resume):
            self._ckpt = load_checkpoint(self.checkpoint_dir)
            self.frames, self.iteration, self.train_time, self.evals = run_meta(self._ckpt)
            if self.frames >= self.total_frames:
                key = "num_updates" if total is not None else "total_frames"
                raise RunFinished(f"{self.dir} already finished at {self.frames} frames; pass "
                                  f"{key}={2 * self.requested} (or any value above {self.frames}) to extend")

    def _check_dir(self, resume: bool) -> bool:
        """Whether there is a checkpoint to resume from (errors for a folder that cannot be used)."""
        if not resume:
            if (self.dir / RUN_FILE).exists():
                raise RunDirError(
                    f"{self.dir} already holds a run; continue it with `steersman resume {self.dir}` "
                    "or choose another directory"
                )
            return False
        algo, old = read_run_config(self.dir)
        if algo != self.algo:
            raise RunDirError(f"{self.dir} is a {algo} run; it cannot be resumed as {self.algo}")
        old = with_defaults(old, type(self.cfg))  # fields added since the run was made: their defaults
        changed = [(k, a, b) for k, a, b in diff_configs(old, self.config) if not _resumable(k)]
        if changed:
            desc = ", ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in changed)
            raise RunDirError(
                f"cannot resume {self.dir}: its config changed incompatibly ({desc}); only "
                f"{', '.join(RESUMABLE_KEYS)} may change on resume"
            )
        return latest_checkpoint(self.checkpoint_dir) is not None

    # ------------------------------------------------------------------ start
    def track(self, *, buffer: Any = None, **objects: Any) -> None:
        """Names what a checkpoint holds, restores it when resuming, and starts the run.

        ``objects``: modules, optimizers, collectors... (anything with ``state_dict`` /
        ``load_state_dict``) and 0-dim tensors (counters), saved under their keyword; the
        policy goes under ``policy`` (``steersman eval``/``export`` load it). ``buffer``:
        a replay buffer, saved with the checkpoint when ``checkpoint.replay_buffer``.
        The RNG states are restored last. Then the run starts: the folder, its
        ``config.yaml``, the loggers, the progress bar and the signal handlers.
        """
        self._tracked, self._buffer = objects, buffer
        if self._ckpt is not None:
            for name, obj in objects.items():
                load_entry(obj, self._ckpt, name)
            if buffer is not None and self._ckpt.replay_buffer_path is not None:
                buffer.loads(self._ckpt.replay_buffer_path)
            load_entry(None, self._ckpt, "rng")
        self._start()

    def _start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._write_config()
        clean_dead_temps(self.checkpoint_dir)
        self._session_frames0 = self._shown = self.frames
        self._next_eval = self._next_multiple(self.cfg.eval.interval)
        self._next_ckpt = self._next_multiple(self.cfg.checkpoint.interval)
        self._session_start = time.perf_counter()
        self.logger = self._make_logger(self.cfg.logger.backends, start_step=self.frames if self._resume else None)
        self.progress = record.ProgressBar(self.total_frames, quiet=self.cfg.quiet, initial=self.frames,
                                           description=self.algo)
        if self._ckpt is not None:
            self.message(f"resuming {self.dir} at {self.frames} frames from {self._ckpt.path.name}")
        elif self._resume:
            self.message(f"{self.dir} has no checkpoint yet (stopped before its first one): starting it from scratch")
        if self._handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)

    def _next_multiple(self, interval: int) -> float:
        """The first multiple of ``interval`` after the current frame count (inf if 0)."""
        return (self.frames // interval + 1) * interval if interval > 0 else math.inf

    def message(self, text: str) -> None:
        """Prints a line (above the progress bar) unless the run is quiet."""
        if not self.cfg.quiet:
            print(text, file=sys.stderr, flush=True)

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

    def checkpoint_due(self, frames: int) -> bool:
        """Whether a checkpoint is due at ``frames``: periodic, or a stop was requested."""
        return self.stop_requested or frames >= self._next_ckpt

    @property
    def fps(self) -> float:
        """Training frames per second in this session (evaluation and checkpoints included)."""
        dt = time.perf_counter() - self._session_start
        return (self.frames - self._session_frames0) / dt if dt > 0 else 0.0

    def elapsed(self) -> float:
        """Wall-clock seconds of training over every session of this run."""
        return self.train_time + time.perf_counter() - self._session_start

    def save(self) -> Path:
        """Saves a checkpoint of the tracked objects (plus the RNG states, counters, config
        and the replay buffer). The RNG states are taken here, so call it where the loop
        would continue from."""
        state = {name: obj.clone() if isinstance(obj, torch.Tensor) else obj.state_dict()
                 for name, obj in self._tracked.items()}
        state["rng"] = rng_state()
        meta = {
            "algo": self.algo, "frames": self.frames, "iteration": self.iteration,
            "train_time": self.elapsed(), "evals": self.evals, "config": self.config,
        }
        keep_rb = self._buffer if self.cfg.checkpoint.replay_buffer else None
        path = save_checkpoint(self.checkpoint_dir, state, meta=meta, replay_buffer=keep_rb,
                               keep=self.cfg.checkpoint.keep)
        self._next_ckpt = self._next_multiple(self.cfg.checkpoint.interval)
        self._saved_frames = self.frames
        return path

    # ------------------------------------------------------------------ the end
    def wrap_up(self, policy: Callable, eval_env: Any) -> dict[str, Any]:
        """Ends the loop: unless a stop was requested, a final evaluation of ``policy`` on
        ``eval_env`` and a final checkpoint (each only if none was made at these frames);
        then :meth:`finish`. Returns the summary dict."""
        from .evaluation import evaluate

        if not self.stop_requested:
            if not self.evals or self.evals[-1][0] != self.frames:
                self.log_eval(self.frames, evaluate(eval_env, policy, seed=self.cfg.seed + EVAL_SEED_OFFSET))
            if self._saved_frames != self.frames:
                self.save()
        return self.finish(policy, eval_env.reset()["observation"])

    def finish(self, policy: Callable | None = None, example_obs: torch.Tensor | None = None) -> dict[str, Any]:
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
        final_return = self.evals[-1][1] if self.evals else None
        summary = {
            "algo": self.algo, "env": self.cfg.env.name, "frames": self.frames,
            "final_eval_return": None if final_return is None or math.isnan(final_return) else final_return,
            "wall_time_s": round(wall, 2),
            "frames_per_s": round(fps, 1), "interrupted": self.stop_requested,
            "stop_signal": self.stop_signal,
            "train_return": None if math.isnan(self._last_return) else self._last_return, "written": written,
        }
        if self.total_frames != self.requested:
            summary["note"] = (f"total_frames={self.requested} rounded up to {self.total_frames}: whole batches "
                               f"of {self.frames_per_batch} frames")
        self._write_json("summary.json", summary)
        print(format_summary(summary), flush=True)
        return summary


def run_meta(ckpt: Checkpoint) -> tuple[int, int, float, list[tuple[int, float]]]:
    """``(frames, iteration, train_time, evals)`` of a run's checkpoint, checked: a one-line
    :class:`CheckpointError` naming the file and the field otherwise."""
    m, where = ckpt.meta, ckpt.path / "meta.json"
    for key, kind in (("frames", int), ("iteration", int), ("train_time", float)):
        value = m.get(key)
        ok = isinstance(value, (int, float) if kind is float else int) and not isinstance(value, bool)
        if not ok or not math.isfinite(value) or value < 0:
            what = "an integer" if kind is int else "a number"
            raise CheckpointError(f"{where}: {key!r} must be {what} >= 0, got {value!r}"
                                  if key in m else f"{where}: {key!r} is missing")
    evals = m.get("evals", [])
    if not isinstance(evals, list) or not all(isinstance(e, list) and len(e) == 2 and isinstance(e[0], int)
                                              and isinstance(e[1], (int, float)) for e in evals):
        raise CheckpointError(f"{where}: 'evals' must be a list of [frames, return] pairs")
    return m["frames"], m["iteration"], float(m["train_time"]), [(int(f), float(r)) for f, r in evals]


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
    if s.get("note"):
        lines.append(f"  ({s['note']})")
    for what, path in s["written"].items():
        lines.append(f"  {what:<11} {path}")
    if s.get("interrupted"):
        lines.append(f"  continue with: steersman resume {s['written']['run_dir']}")
    return "\n".join(lines)
