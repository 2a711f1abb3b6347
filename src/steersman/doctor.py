"""``steersman doctor``: where the time of a training loop goes, and what to change.

Profiles a recipe (``steersman doctor ppo env.num_envs=16``), a run folder's config
(``steersman doctor runs/ppo_...``) or a user's own script (``steersman doctor train.py
--seconds 10``) for a few seconds, then prints a table of phases and a list of findings,
each with its fix::

    phase                       time   share     calls
    env step                 1.920 s   38.4%     2,048
    policy forward           0.810 s   16.2%     2,048
    ...

How it measures, without editing the code it profiles: it wraps, from outside, the calls
that make up a training loop and times each one *exclusively* (a call's time minus the
time of the timed calls inside it, so nothing is counted twice):

* env step: ``EnvBase.step`` / ``reset`` / ``step_and_maybe_reset`` (every env class);
* policy forward: the outermost ``nn.Module`` call outside a loss (a global forward hook);
* loss forward: a ``LossModule`` call; loss backward: ``torch.autograd.backward`` / ``grad``;
* optimizer: ``Optimizer.step`` (torch's global step hooks), ``zero_grad``,
  ``nn.utils.clip_grad_norm_``; compiled update: steersman's ``FunctionalUpdate`` /
  ``CompiledUpdate`` (loss, backward and optimizer in one graph);
* replay buffer: ``ReplayBuffer.extend`` / ``add`` / ``sample``; data movement:
  ``TensorDict.to`` and hand-made ``pin_memory()``; collector bookkeeping: the collector's
  own work between env steps and policy calls (buffers, stacking, copies);
* logging: the loggers' ``log_*`` methods and the progress bar;
* Python & other: everything else (the loop's own Python, schedules, checkpoints).

It also counts ``module.train()`` / ``module.eval()`` calls (with where they come from),
``pin_memory()`` calls, dynamo's graph breaks (``torch._dynamo.utils.counters``) and
recompiles (dynamo's ``recompiles`` log records), and reads the thread settings.

The wrappers cost a few microseconds per call: tiny calls look slower than they are; the
shares are what to read. The profile stops after ``seconds`` (``SIGALRM``: Unix only).

Example:
    >>> report = profile_callable(lambda: sum(range(1000)), seconds=1.0)
    >>> report.phases["Python & other"] > 0, report.stopped_early
    (True, False)
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
import runpy
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

__all__ = ["DoctorReport", "profile_callable", "profile_recipe", "profile_script", "PHASES"]

#: the phases of the table, in order
PHASES = ("env step", "policy forward", "loss forward", "loss backward", "optimizer", "compiled update",
          "replay buffer", "data movement", "collector bookkeeping", "logging", "compiling", "Python & other")

#: what to do when a phase takes most of the time
PHASE_FIXES = {
    "env step": "a torch-native env (`steersman envs`) or more envs per batch (env.num_envs=16); "
                "for Gymnasium envs, vectorization_mode='async' or ParallelEnv",
    "policy forward": "compile=true; larger batches of envs (env.num_envs) so each call does more work",
    "loss forward": "compile=true (one compiled graph for loss, backward and optimizer)",
    "loss backward": "compile=true (the functional update compiles backward with the loss)",
    "optimizer": "compile=true; a fused/foreach optimizer (torch.optim.Adam(fused=True))",
    "compiled update": "fewer, larger minibatches (minibatch_size) to amortise each call",
    "replay buffer": "sample larger batches less often; a LazyTensorStorage on the training device",
    "data movement": "keep data on one device; let the collector/replay buffer move it once per batch",
    "collector bookkeeping": "fewer, longer rollouts per batch (frames_per_batch) amortise the copies",
    "logging": "log less often (a larger log interval) or fewer loggers (logger=csv)",
    "compiling": "a one-off cost: the on-disk caches make the next run's compile faster; compile the "
                 "per-step function, not an unrolled loop",
    "Python & other": "per-step Python in the loop: compile=true, or move work out of the inner loop",
}


class _TimeUp(BaseException):
    """Raised in the profiled code when the time is up (a BaseException: ``except Exception``
    in the profiled code does not swallow it)."""


@dataclass
class DoctorReport:
    """What a profile measured.

    ``phases``: exclusive seconds per phase; ``calls``: calls per phase; ``wall``: the
    profiled seconds (from the first timed call);
    ``startup``: seconds before that (imports, building envs and networks); ``findings``: ``(problem, fix)`` pairs.
    """

    target: str
    wall: float = 0.0
    startup: float = 0.0
    stopped_early: bool = False
    phases: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    calls: Counter = field(default_factory=Counter)
    toggles: Counter = field(default_factory=Counter)
    pins: Counter = field(default_factory=Counter)
    graph_breaks: Counter = field(default_factory=Counter)
    recompiles: list[str] = field(default_factory=list)
    threads: dict[str, Any] = field(default_factory=dict)
    largest_model: int = 0
    error: str | None = None
    findings: list[tuple[str, str]] = field(default_factory=list)

    @property
    def work(self) -> float:
        """The profiled seconds without compiling (what the shares are of)."""
        return sum(v for k, v in self.phases.items() if k != "compiling")

    def table(self) -> str:
        """The phase table, largest first (phases that took no time left out); compiling, a
        one-off cost, on its own line below."""
        total = self.work or 1.0
        lines = [f"{'phase':<24}{'time':>10}{'share':>8}{'calls':>10}"]
        for name, secs in sorted(self.phases.items(), key=lambda kv: -kv[1]):
            if secs == 0.0 or name == "compiling":
                continue
            calls = f"{self.calls[name]:,}" if name != "Python & other" else ""
            lines.append(f"{name:<24}{secs:>8.3f} s{100 * secs / total:>7.1f}%{calls:>10}")
        if self.phases["compiling"]:
            lines.append(f"(and {self.phases['compiling']:.2f} s compiling: torch.compile, "
                         f"{self.calls['compiling']} frame(s), not in the shares)")
        return "\n".join(lines)

    def __str__(self) -> str:
        how = "stopped after the time limit" if self.stopped_early else "ran to the end"
        head = (f"steersman doctor: {self.target}: {self.work:.1f} s profiled ({how}; "
                f"{self.startup:.1f} s of startup before the first timed call not counted)")
        out = [head, "", self.table(), ""]
        if self.error:
            out += [f"the profiled code raised: {self.error}", ""]
        out.append("findings:" if self.findings else "findings: none")
        for problem, fix in self.findings:
            out.append(f"  - {problem}\n    fix: {fix}")
        return "\n".join(out)


class _Clock:
    """Exclusive timing: a stack of open phases; a phase's time excludes its timed children."""

    def __init__(self, report: DoctorReport) -> None:
        self.report = report
        self.stack: list[list[Any]] = []  # [phase, start, children's time]
        self.t0 = time.perf_counter()
        self.started = False  # on the first timed call (imports and setup before it are startup)
        self.start = self.t0

    def enter(self, phase: str) -> None:
        now = time.perf_counter()
        if not self.started and phase != "compiling":
            self.started, self.start = True, now
            self.report.startup = now - self.t0
        self.stack.append([phase, now, 0.0])

    def exit(self) -> None:
        if not self.stack:
            return
        phase, start, children = self.stack.pop()
        elapsed = time.perf_counter() - start
        if self.started:
            self.report.phases[phase] += max(elapsed - children, 0.0)
            self.report.calls[phase] += 1
        if self.stack:
            self.stack[-1][2] += elapsed

    def current(self) -> str | None:
        return self.stack[-1][0] if self.stack else None

    def timed(self, phase: str, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if torch.compiler.is_compiling():  # traced by dynamo: no timing, no graph break
                return fn(*args, **kwargs)
            self.enter(phase)
            try:
                return fn(*args, **kwargs)
            finally:
                self.exit()

        wrapper.__doctor_original__ = fn  # type: ignore[attr-defined]
        return wrapper


def _where(skip: Sequence[str]) -> str:
    """``file:line`` of the first caller frame whose file is not under one of ``skip``."""
    frame = sys._getframe(2)
    while frame is not None and any(s in frame.f_code.co_filename for s in skip):
        frame = frame.f_back
    if frame is None:
        return "?"
    path = frame.f_code.co_filename
    rel = os.path.relpath(path) if os.path.isabs(path) else path
    return f"{path if rel.startswith('..') else rel}:{frame.f_lineno}"


_TORCH_DIR = os.path.dirname(torch.__file__)
_OWN_FILE = __file__


def _subclasses(cls: type) -> list[type]:
    out, todo = [cls], [cls]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in out:
                out.append(sub)
                todo.append(sub)
    return out


class _Patches:
    """Installs the wrappers and counters; ``undo()`` restores everything."""

    def __init__(self, clock: _Clock, report: DoctorReport) -> None:
        self.clock, self.report = clock, report
        self.saved: list[tuple[Any, str, Any]] = []
        self.handles: list[Any] = []
        self.module_pushed: list[bool] = []
        self.toggle_depth = 0

    def wrap(self, owner: Any, name: str, phase: str) -> None:
        fn = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
        if fn is None or hasattr(fn, "__doctor_original__") or isinstance(fn, (staticmethod, classmethod)):
            return
        self.saved.append((owner, name, fn))
        setattr(owner, name, self.clock.timed(phase, fn))

    def replace(self, owner: Any, name: str, new: Callable) -> None:
        self.saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, new)

    def install(self) -> None:
        from steersman.collectors import collector as collector_mod
        from steersman.collectors import multi
        from steersman.data.replay_buffers.replay_buffers import ReplayBuffer
        from steersman.envs import EnvBase
        from steersman.objectives import LossModule
        from steersman.objectives import functional_update as fu
        from steersman.record import progress
        from steersman.record.loggers.common import Logger
        from steersman.tensordict import TensorDictBase

        for cls in _subclasses(EnvBase):
            for name in ("step", "reset", "step_and_maybe_reset"):
                self.wrap(cls, name, "env step")
        for cls in _subclasses(ReplayBuffer):
            for name in ("extend", "add", "sample"):
                self.wrap(cls, name, "replay buffer")
        for cls in _subclasses(Logger):
            for name in ("log_scalar", "log_metrics", "log_hparams", "log_video", "log_str"):
                self.wrap(cls, name, "logging")
        for name in ("update", "close"):
            self.wrap(progress.ProgressBar, name, "logging")
        for cls in (fu.FunctionalUpdate, fu.CompiledUpdate):
            self.wrap(cls, "__call__", "compiled update")
        for cls in _subclasses(TensorDictBase):
            self.wrap(cls, "to", "data movement")
        for cls in (collector_mod.Collector, multi._MultiCollector, *_subclasses(multi._MultiCollector)):
            if "iterator" in cls.__dict__:
                self.replace(cls, "iterator", self._timed_iterator(cls.__dict__["iterator"]))
        import torch._dynamo.convert_frame as convert_frame

        self.wrap(convert_frame, "_compile", "compiling")
        self.wrap(torch.autograd, "backward", "loss backward")
        self.wrap(torch.autograd, "grad", "loss backward")
        self.wrap(torch.optim.Optimizer, "zero_grad", "optimizer")
        self.wrap(nn.utils, "clip_grad_norm_", "optimizer")
        clock = self.clock
        self.handles.append(register_optimizer_step_pre_hook(
            lambda *_: None if torch.compiler.is_compiling() else clock.enter("optimizer")))
        self.handles.append(register_optimizer_step_post_hook(
            lambda *_: None if torch.compiler.is_compiling() else clock.exit()))
        self.handles.append(nn.modules.module.register_module_forward_pre_hook(self._module_pre(LossModule)))
        self.handles.append(nn.modules.module.register_module_forward_hook(self._module_post, always_call=True))
        self.replace(nn.Module, "train", self._counting_train(nn.Module.train))
        self.replace(torch.Tensor, "pin_memory", self._counting_pin(torch.Tensor.pin_memory))

    def _timed_iterator(self, iterator: Callable) -> Callable:
        clock = self.clock

        @functools.wraps(iterator)
        def timed_iterator(collector: Any) -> Iterator[Any]:
            it = iterator(collector)
            while True:
                clock.enter("collector bookkeeping")
                try:
                    batch = next(it)
                except StopIteration:
                    return
                finally:
                    clock.exit()
                yield batch

        return timed_iterator

    def _module_pre(self, loss_cls: type) -> Callable:
        clock, pushed, report = self.clock, self.module_pushed, self.report

        def pre(module: nn.Module, args: Any) -> None:
            if torch.compiler.is_compiling():
                return
            if isinstance(module, loss_cls):
                clock.enter("loss forward")
                pushed.append(True)
            elif not any(pushed) and clock.current() not in ("loss forward", "compiled update"):
                clock.enter("policy forward")
                pushed.append(True)
                report.largest_model = max(report.largest_model, sum(p.numel() for p in module.parameters()))
            else:
                pushed.append(False)

        return pre

    def _module_post(self, module: nn.Module, args: Any, output: Any) -> None:
        if torch.compiler.is_compiling() or not self.module_pushed:
            return
        if self.module_pushed.pop():
            self.clock.exit()

    def _counting_train(self, train: Callable) -> Callable:
        patches = self

        @functools.wraps(train)
        def counting_train(module: nn.Module, mode: bool = True) -> nn.Module:
            if patches.toggle_depth == 0 and patches.clock.started:  # the outermost call only
                what = "train()" if mode else "eval()"
                patches.report.toggles[f"{type(module).__name__}.{what} at "
                                       f"{_where([_TORCH_DIR + os.sep + 'nn', _OWN_FILE])}"] += 1
            patches.toggle_depth += 1
            try:
                return train(module, mode)
            finally:
                patches.toggle_depth -= 1

        return counting_train

    def _counting_pin(self, pin: Callable) -> Callable:
        report = self.report
        timed = self.clock.timed("data movement", pin)

        @functools.wraps(pin)
        def counting_pin(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            report.pins[_where([_OWN_FILE, _TORCH_DIR])] += 1
            return timed(tensor, *args, **kwargs)

        return counting_pin

    def undo(self) -> None:
        for handle in self.handles:
            handle.remove()
        for owner, name, fn in reversed(self.saved):
            setattr(owner, name, fn)


class _RecompileLog(logging.Handler):
    """Collects dynamo's ``recompiles`` records (and keeps them off stderr meanwhile)."""

    def __init__(self, report: DoctorReport) -> None:
        super().__init__()
        self.report = report

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if msg.startswith("Recompiling"):
            self.report.recompiles.append(msg.splitlines()[0])


def _quiet_recompiles(record: logging.LogRecord) -> bool:
    return "__recompiles" not in record.name


def _break_reason(reason: str) -> str:
    """dynamo's graph-break message in one line: the title and its explanation."""
    lines = [line.strip() for line in reason.strip().splitlines() if line.strip()]
    explanation = next((line for line in lines if line.startswith("Explanation:")), "")
    text = f"{lines[0]} ({explanation[len('Explanation:'):].strip()})" if explanation else lines[0]
    return text if len(text) <= 160 else text[:157] + "..."


@contextlib.contextmanager
def _dynamo_watch(report: DoctorReport) -> Iterator[None]:
    from torch._dynamo.utils import counters

    before = Counter(counters["graph_break"])
    handler = _RecompileLog(report)
    torch_handlers = logging.getLogger("torch").handlers
    torch._logging.set_logs(recompiles=True)
    logging.getLogger("torch._dynamo").addHandler(handler)
    for h in torch_handlers:
        h.addFilter(_quiet_recompiles)
    try:
        yield
    finally:
        for h in torch_handlers:
            h.removeFilter(_quiet_recompiles)
        logging.getLogger("torch._dynamo").removeHandler(handler)
        torch._logging.set_logs()
        for reason, n in Counter(counters["graph_break"]).items():
            if n - before.get(reason, 0) > 0:
                report.graph_breaks[_break_reason(reason)] += n - before.get(reason, 0)


@contextlib.contextmanager
def _deadline(clock: _Clock, seconds: float) -> Iterator[None]:
    """Raises :class:`_TimeUp` once ``seconds`` were profiled, not counting startup (before
    the clock starts) nor compiling, and never inside a compile (dynamo would be left
    half-done): the alarm re-arms itself until then."""
    def left() -> float:
        if not clock.started:
            return seconds
        now = time.perf_counter()
        compiling = clock.report.phases["compiling"] + sum(
            now - start - children for phase, start, children in clock.stack if phase == "compiling")
        return seconds - (now - clock.start - compiling)

    def alarm(signum: int, frame: Any) -> None:
        remaining = left()
        if remaining > 0.01 or any(entry[0] == "compiling" for entry in clock.stack):
            signal.setitimer(signal.ITIMER_REAL, max(remaining, 0.1))
            return
        # armed again first: code that swallows the exception (torch's own handlers catch
        # BaseException in places) must not leave the script running with no alarm left
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        raise _TimeUp

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _findings(report: DoctorReport) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    work = {k: v for k, v in report.phases.items() if k != "compiling"}
    total = report.work
    if total > 0:
        top, secs = max(work.items(), key=lambda kv: kv[1])
        out.append((f"the largest phase is {top} ({100 * secs / total:.0f}% of the time)", PHASE_FIXES[top]))
        for phase in ("logging", "data movement"):
            share = report.phases[phase] / total
            if phase != top and share > 0.10:
                out.append((f"{phase} takes {100 * share:.0f}% of the time", PHASE_FIXES[phase]))
    if report.phases["compiling"] > 0:
        out.append((f"torch.compile spent {report.phases['compiling']:.1f} s compiling "
                    f"({report.calls['compiling']} frames; not counted against --seconds)", PHASE_FIXES["compiling"]))
    for where, n in report.toggles.most_common():
        if n >= 3:
            out.append((f"{where} is called {n} times inside the loop: each call walks every submodule, "
                        "and a policy switched to train() mid-rollout samples differently",
                        "set the mode once before the loop; for acting use `with torch.no_grad(), "
                        "set_exploration_type(...)` instead of eval()/train() toggles"))
    for where, n in report.pins.most_common():
        out.append((f"pin_memory() called by hand {n} times at {where}: every call copies the tensor "
                    "into new page-locked memory",
                    "pin once (a preallocated pinned buffer you copy_ into), or let the collector / "
                    "replay buffer do it (pin_memory=True); on a CPU-only machine drop it"))
    if report.graph_breaks:
        n = sum(report.graph_breaks.values())
        reasons = "; ".join(f"{r} (x{c})" for r, c in report.graph_breaks.most_common(3))
        out.append((f"torch.compile: {n} graph break(s): {reasons}",
                    "remove the Python the compiler cannot trace from the compiled function (print, "
                    ".item(), data-dependent `if`), or move it outside; `torch._dynamo.explain(fn)(*args)` "
                    "lists each break with its line"))
    if report.recompiles:
        first = Counter(report.recompiles).most_common(1)[0][0]
        out.append((f"torch.compile recompiled {len(report.recompiles)} time(s) (e.g. {first})",
                    "pass changing Python numbers as tensors, keep shapes fixed (or mark them dynamic "
                    "with torch._dynamo.mark_dynamic); TORCH_LOGS=recompiles says which guard failed"))
    t = report.threads
    if t["torch threads"] > t["cores available"]:
        out.append((f"torch uses {t['torch threads']} threads on {t['cores available']} available cores "
                    "(oversubscribed)", f"torch.set_num_threads({t['cores available']}) or OMP_NUM_THREADS"))
    elif t["torch threads"] > 1 and 0 < report.largest_model < 100_000:
        out.append((f"torch uses {t['torch threads']} threads for networks of {report.largest_model:,} "
                    "parameters: at this size threads mostly wait on each other",
                    "try torch.set_num_threads(1) (measure: the recipes' small MLPs are faster on one thread)"))
    return out


def profile_callable(fn: Callable[[], Any], seconds: float = 10.0, *, target: str = "function") -> DoctorReport:
    """Runs ``fn()`` with the timers installed until it returns or ``seconds`` were profiled;
    returns the report.

    The clock starts at the first timed call (an env step, a module call, an optimizer
    step...): imports and setup before it are reported as startup. Compiling is timed as
    its own phase and does not count against ``seconds``.
    """
    if seconds <= 0:
        raise ValueError(f"seconds must be > 0, got {seconds}")
    report = DoctorReport(target=target)
    clock = _Clock(report)
    patches = _Patches(clock, report)
    report.threads = {"torch threads": torch.get_num_threads(),
                      "interop threads": torch.get_num_interop_threads(), "cores available": _cores(),
                      "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")}
    patches.install()
    try:
        with _dynamo_watch(report), _deadline(clock, seconds):
            fn()
    except _TimeUp:
        report.stopped_early = True
    except SystemExit as err:  # a script's sys.exit(): the profile is still reported
        if err.code not in (None, 0):
            report.error = f"SystemExit({err.code!r})"
    except Exception as err:  # noqa: BLE001 - reported with the profile
        report.error = f"{type(err).__name__}: {err}"
    finally:
        end = time.perf_counter()
        while clock.stack:  # calls cut by the time limit
            clock.exit()
        patches.undo()
    if not clock.started:  # no timed call: count from the start
        report.startup = 0.0
        clock.start = clock.t0
    report.wall = end - clock.start
    report.phases["Python & other"] += max(report.wall - sum(report.phases.values()), 0.0)
    report.findings = _findings(report)
    return report


def profile_recipe(algo: str, overrides: Sequence[str] = (), seconds: float = 10.0, *,
                   base: Any = None) -> DoctorReport:
    """Profiles ``steersman train ALGO overrides`` for at most ``seconds`` in a temporary run
    folder (deleted afterwards). ``base``: a saved config to start from (``doctor RUN_DIR``)."""
    from steersman.recipes import get_recipe
    from steersman.recipes.launch import make_config

    cfg = make_config(algo, [*overrides, "quiet=true"], base=base)

    def run() -> None:  # the run's own end-of-run summary (a temporary folder) is not the doctor's output
        with contextlib.redirect_stdout(io.StringIO()):
            get_recipe(algo).train(cfg, Path(tmp) / "run")

    with tempfile.TemporaryDirectory(prefix="steersman-doctor-") as tmp:
        return profile_callable(run, seconds, target=f"{algo} {' '.join(overrides)}".strip())


def profile_script(path: str | os.PathLike, args: Sequence[str] = (), seconds: float = 10.0) -> DoctorReport:
    """Profiles the Python script ``path`` (run as ``__main__`` with ``sys.argv = [path, *args]``,
    in this process) for at most ``seconds``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"steersman doctor: no script {str(path)!r}")
    argv, sys_path = list(sys.argv), list(sys.path)
    sys.argv = [str(path), *args]
    sys.path.insert(0, str(path.resolve().parent))
    try:
        return profile_callable(lambda: runpy.run_path(str(path), run_name="__main__"), seconds,
                                target=str(path))
    finally:
        sys.argv, sys.path[:] = argv, sys_path
