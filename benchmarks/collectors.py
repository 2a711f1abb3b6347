"""Collector throughput: steersman's ``Collector`` vs the bare env loop vs TorchRL vs SB3.

Each row is one function ``row_fn(case) -> run`` registered with ``@row(...)``: it builds
its env and policy for the case (warm-up untimed) and returns ``run(k)``, which collects
``k`` batches of the case's ``frames_per_batch`` transitions. A row that cannot run here
raises ``Unavailable(reason)`` (printed under the table); the others still run.

Cases (CartPole, one process, torch on 1 thread):

  native   ``CartPoleEnv(batch_size=[256])``, batches of 256 x 64 frames.
  gym x8   ``GymEnv("CartPole-v1", num_envs=8)`` (a Gymnasium sync vector env),
           batches of 8 x 64 frames.

Rows (the policy is the same tiny module in every steersman/TorchRL row:
``argmax(Linear(4, 2)(observation))`` as a TensorDictModule, under ``no_grad``):

  bare loop        ``td = policy(td); _, td = env.step_and_maybe_reset(td)``, nothing
                   stored: the floor of any collector on this env.
  bare + stack     the bare loop keeping every transition, ``torch.stack``-ed per batch
                   (what ``env.rollout(..., break_when_any_done=False)`` does).
  Collector        ``steersman.collectors.Collector``: each batch preallocated, written
                   step by step, trajectory ids, yielded as a fresh ``[*env_batch, T]``
                   TensorDict.
  torchrl bare     TorchRL's env (its ``GymEnv`` with the same ``num_envs``) stepped the
                   same way with ``tensordict.nn.TensorDictModule`` (gym case only:
                   TorchRL has no batched torch CartPole).
  torchrl          ``torchrl.collectors.Collector`` (``SyncDataCollector`` before 0.14) on
                   that env, same batches.
  sb3              Stable-Baselines3 ``PPO.collect_rollouts`` on a ``DummyVecEnv`` of 8
                   CartPoles (``n_steps=64``, a linear policy/value net: ``net_arch=[]``).
                   Not the same policy (SB3 also computes values and log-probs) nor the
                   same env wrapper: an anchor for the order of magnitude (gym case only).

Timing: process CPU time (``--wall`` for wall clock), rows interleaved within each
repeat, median of repeats, in frames (transitions) per second. Target (issue): Collector
/ bare loop >= 0.8 (overhead <= 20%) on the native case.

    python benchmarks/collectors.py [--quick] [--cases native,gym] [--json out.json]
    $ANCHORS/bin/python benchmarks/collectors.py      # + TorchRL and SB3 rows
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # the checkout's steersman


class Unavailable(Exception):
    """Raised by a row function that cannot run here (missing package, ...)."""


@dataclass(frozen=True)
class Case:
    name: str
    n_envs: int
    steps: int  # steps per batch: frames_per_batch = n_envs * steps

    @property
    def frames_per_batch(self) -> int:
        return self.n_envs * self.steps


CASES = {"native": Case("native", 256, 64), "gym": Case("gym x8", 8, 64)}


@dataclass
class Row:
    name: str
    fn: Callable[[Case], Callable[[int], None]]
    cases: tuple[str, ...]


ROWS: list[Row] = []


def row(name: str, cases: tuple[str, ...] = ("native", "gym")) -> Callable:
    def deco(fn: Callable) -> Callable:
        ROWS.append(Row(name, fn, cases))
        return fn

    return deco


class ArgmaxNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.lin(obs).argmax(-1)


def _steersman_env(case: Case):
    if case.name == "native":
        from steersman.envs import CartPoleEnv

        return CartPoleEnv(batch_size=[case.n_envs], seed=0)
    try:
        import gymnasium  # noqa: F401
    except ImportError as err:
        raise Unavailable(f"gymnasium is not installed ({err})") from None
    from steersman.envs import GymEnv

    env = GymEnv("CartPole-v1", num_envs=case.n_envs, categorical_action_encoding=True)
    env.set_seed(0)
    return env


def _steersman_policy():
    from steersman.tensordict.nn import TensorDictModule

    torch.manual_seed(0)
    return TensorDictModule(ArgmaxNet(), ["observation"], ["action"])


# ----------------------------------------------------------------------------- steersman rows
@row("bare loop")
def bare_loop(case: Case) -> Callable[[int], None]:
    env, policy = _steersman_env(case), _steersman_policy()
    st = {"td": env.reset()}

    def run(k: int) -> None:
        td = st["td"]
        with torch.no_grad():
            for _ in range(k * case.steps):
                td = policy(td)
                _, td = env.step_and_maybe_reset(td)
        st["td"] = td

    run(1)
    return run


@row("bare + stack")
def bare_stack(case: Case) -> Callable[[int], None]:
    env, policy = _steersman_env(case), _steersman_policy()
    st = {"td": env.reset()}

    def run(k: int) -> None:
        td = st["td"]
        with torch.no_grad():
            for _ in range(k):
                steps = []
                for _ in range(case.steps):
                    td = policy(td)
                    cur, td = env.step_and_maybe_reset(td)
                    steps.append(cur)
                torch.stack(steps, -1)
        st["td"] = td

    run(1)
    return run


@row("Collector")
def steersman_collector(case: Case) -> Callable[[int], None]:
    from steersman.collectors import Collector

    env, policy = _steersman_env(case), _steersman_policy()
    it = iter(Collector(env, policy, frames_per_batch=case.frames_per_batch))

    def run(k: int) -> None:
        for _ in range(k):
            next(it)

    run(1)
    return run


# ----------------------------------------------------------------------------- anchors
def _torchrl_env_policy(case: Case):
    if case.name == "native":
        raise Unavailable("TorchRL has no batched torch CartPole")
    try:
        from tensordict.nn import TensorDictModule
        from torchrl.envs import GymEnv
    except Exception as err:  # noqa: BLE001 - any import failure: the row is n/a
        raise Unavailable(f"torchrl is not importable ({type(err).__name__}: {err})") from None
    env = GymEnv("CartPole-v1", num_envs=case.n_envs, categorical_action_encoding=True)
    env.set_seed(0)
    torch.manual_seed(0)
    return env, TensorDictModule(ArgmaxNet(), ["observation"], ["action"])


@row("torchrl bare", cases=("gym",))
def torchrl_bare(case: Case) -> Callable[[int], None]:
    env, policy = _torchrl_env_policy(case)
    st = {"td": env.reset()}

    def run(k: int) -> None:
        td = st["td"]
        with torch.no_grad():
            for _ in range(k * case.steps):
                td = policy(td)
                _, td = env.step_and_maybe_reset(td)
        st["td"] = td

    run(1)
    return run


@row("torchrl", cases=("gym",))
def torchrl_collector(case: Case) -> Callable[[int], None]:
    env, policy = _torchrl_env_policy(case)
    try:
        from torchrl.collectors import Collector
    except ImportError:  # TorchRL < 0.14
        from torchrl.collectors import SyncDataCollector as Collector
    it = iter(Collector(env, policy, frames_per_batch=case.frames_per_batch, total_frames=-1))

    def run(k: int) -> None:
        for _ in range(k):
            next(it)

    run(1)
    return run


@row("sb3", cases=("gym",))
def sb3_rollouts(case: Case) -> Callable[[int], None]:
    try:
        from stable_baselines3 import PPO
        from stable_baselines3.common.callbacks import BaseCallback
        from stable_baselines3.common.env_util import make_vec_env
    except Exception as err:  # noqa: BLE001
        raise Unavailable(f"stable_baselines3 is not importable ({type(err).__name__}: {err})") from None
    venv = make_vec_env("CartPole-v1", n_envs=case.n_envs, seed=0)
    model = PPO("MlpPolicy", venv, n_steps=case.steps, batch_size=case.frames_per_batch,
                policy_kwargs={"net_arch": []}, device="cpu", seed=0)

    class Nothing(BaseCallback):
        def _on_step(self) -> bool:
            return True

    cb = Nothing()
    model._setup_learn(total_timesteps=10**9, callback=cb)
    cb.init_callback(model)

    def run(k: int) -> None:
        for _ in range(k):
            model.collect_rollouts(model.env, cb, model.rollout_buffer, n_rollout_steps=case.steps)

    run(1)
    return run


# ----------------------------------------------------------------------------- harness
CLOCK = time.process_time


def _measure(run: Callable[[int], None], k: int) -> float:
    gc.disable()
    try:
        t = CLOCK()
        run(k)
        return CLOCK() - t
    finally:
        gc.enable()


def _calibrate(run: Callable[[int], None], target: float) -> int:
    k = 1
    while True:
        dt = _measure(run, k)
        if dt >= target / 4 or k >= 1 << 16:
            return max(1, int(k * target / max(dt, 1e-9)))
        k *= 4


def bench(cases: list[str], repeats: int, target: float) -> tuple[dict, dict]:
    """``{(row, case): frames/s}`` (median over repeats) and ``{(row, case): reason}``."""
    results: dict = {}
    errors: dict = {}
    for cname in cases:
        case = CASES[cname]
        runs: dict[str, tuple[Callable, int]] = {}
        for r in ROWS:
            if cname not in r.cases:
                continue
            try:
                run = r.fn(case)
                runs[r.name] = (run, _calibrate(run, target))
            except Unavailable as err:
                errors[(r.name, cname)] = str(err)
            except Exception as err:  # noqa: BLE001 - a broken row must not stop the others
                errors[(r.name, cname)] = f"{type(err).__name__}: {err}"
        samples: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(repeats):
            for name, (run, k) in runs.items():
                samples[name].append(k * case.frames_per_batch / _measure(run, k))
        for name, vals in samples.items():
            results[(name, cname)] = statistics.median(vals)
        print(f"  {case.name}: done", file=sys.stderr)
    return results, errors


RATIOS = (
    ("Collector / bare loop", "Collector", "bare loop", "target >= 0.8 on native"),
    ("Collector / bare + stack", "Collector", "bare + stack", ""),
    ("Collector / torchrl", "Collector", "torchrl", "> 1: steersman faster"),
    ("torchrl / torchrl bare", "torchrl", "torchrl bare", "TorchRL's own overhead"),
    ("Collector / sb3", "Collector", "sb3", "different policy: order of magnitude only"),
)


def _rate(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v / 1e6:.2f}M" if v >= 1e5 else f"{v / 1e3:.1f}k"


def report(cases: list[str], results: dict, errors: dict) -> str:
    clock = "wall clock" if CLOCK is time.perf_counter else "process CPU time"
    names = [CASES[c].name for c in cases]
    lines = [f"frames/s (median, {clock})", "",
             "| row | " + " | ".join(names) + " |", "|" + " --- |" * (len(cases) + 1)]
    for r in ROWS:
        cells = [_rate(results.get((r.name, c))) if c in r.cases else "" for c in cases]
        lines.append(f"| {r.name} | " + " | ".join(cells) + " |")
    lines += ["", "| ratio | " + " | ".join(names) + " | note |", "|" + " --- |" * (len(cases) + 2)]
    for label, a, b, note in RATIOS:
        cells = []
        for c in cases:
            x, y = results.get((a, c)), results.get((b, c))
            cells.append(f"{x / y:.2f}" if x and y else "n/a")
        if any(cell != "n/a" for cell in cells):
            lines.append(f"| {label} | " + " | ".join(cells) + f" | {note} |")
    if errors:
        lines += ["", "not run:"] + [f"  {n} ({c}): {why}" for (n, c), why in sorted(errors.items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated: native,gym")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--time", type=float, default=0.5, help="seconds per measurement")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--quick", action="store_true", help="smoke run: short, 3 repeats")
    parser.add_argument("--wall", action="store_true", help="time with the wall clock, not CPU time")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    global CLOCK
    if args.wall:
        CLOCK = time.perf_counter
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"unknown cases {unknown}; choose from {list(CASES)}")
    repeats, target = (3, 0.05) if args.quick else (args.repeats, args.time)
    results, errors = bench(cases, repeats, target)
    print(report(cases, results, errors))
    if args.json:
        payload = {
            "meta": {"torch": torch.__version__, "python": platform.python_version(),
                     "threads": args.threads, "repeats": repeats, "seconds_per_measurement": target,
                     "clock": "wall" if args.wall else "process CPU time"},
            "results": [{"row": n, "case": c, "frames_per_s": v} for (n, c), v in sorted(results.items())],
            "not_run": {f"{n} ({c})": why for (n, c), why in errors.items()},
        }
        Path(args.json).write_text(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
