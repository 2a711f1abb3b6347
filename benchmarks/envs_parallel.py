"""Multi-process env stepping: steersman's ParallelEnv vs Gymnasium's AsyncVectorEnv.

Every row steps ``--workers`` (default 4) CartPole sub-envs, one per worker process,
with random actions drawn from a pre-made bank, finished sub-envs auto-reset:

  gym async          ``gymnasium.vector.AsyncVectorEnv([make CartPole-v1] * n)``,
                     ``env.step(actions)`` (numpy in, numpy out; shared-memory
                     observations, actions pickled through pipes).
  Parallel(GymEnv)   ``ParallelEnv(n, GymEnv("CartPole-v1"))``: the same Gymnasium env in
                     each worker, through steersman's wrapper; ``td["action"] = a;
                     _, td = env.step_and_maybe_reset(td)`` (TensorDicts in and out).
  Parallel(native)   ``ParallelEnv(n, CartPoleEnv)``: steersman's torch CartPole, one
                     unbatched env per worker (its per-call cost is made for big batches;
                     see ``benchmarks/envs.py``).
  Serial(GymEnv)     ``SerialEnv(n, GymEnv("CartPole-v1"))``: the in-process reference.
  torchrl Parallel   ``torchrl.envs.ParallelEnv(n, GymEnv("CartPole-v1"))`` (when torchrl
                     is importable), stepped with its ``step_and_maybe_reset``.

Reported: batched steps per second and frames (sub-env transitions) per second, median
over ``--repeats``, the rows taking turns within each repeat so that a slow spell on
the machine hits them all alike; wall-clock time (the work is spread over processes);
and each row's ratio to ``gym async`` (above 1: faster). Workers use one torch thread.

    python benchmarks/envs_parallel.py [--workers 4] [--time 2] [--repeats 5] [--rows 'Parallel*'] [--json out.json]

A row that cannot run prints ``n/a`` with the reason under the table.
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # the checkout's steersman

ACTION_BANK = 64


class Unavailable(Exception):
    """A row that cannot run here (missing package ...)."""


def make_gym_cartpole():
    import gymnasium

    return gymnasium.make("CartPole-v1")


def _td_loop(env, n: int) -> Callable[[int], None]:
    """A step loop over a steersman (or torchrl) batched env: step_and_maybe_reset."""
    bank = torch.randint(0, 2, (ACTION_BANK, *env.batch_size))
    td = env.reset()

    def run(k: int, td_box=[td]) -> None:  # noqa: B006 - the loop's carried state
        td = td_box[0]
        for i in range(k):
            td["action"] = bank[i % ACTION_BANK]
            _, td = env.step_and_maybe_reset(td)
        td_box[0] = td

    run(50)  # warm-up
    return run


def row_gym_async(n: int):
    try:
        import gymnasium
        import numpy as np
    except ImportError as exc:
        raise Unavailable(f"gymnasium: {exc}") from None
    env = gymnasium.vector.AsyncVectorEnv([make_gym_cartpole] * n)
    env.reset(seed=0)
    bank = np.random.default_rng(0).integers(0, 2, (ACTION_BANK, n))

    def run(k: int) -> None:
        for i in range(k):
            env.step(bank[i % ACTION_BANK])

    run(50)
    return run, env.close


def row_parallel_gym(n: int):
    try:
        from steersman.envs.libs import GymEnv, gymnasium_available
    except ImportError as exc:
        raise Unavailable(f"steersman.envs.libs.gym: {exc}") from None
    if not gymnasium_available():
        raise Unavailable("gymnasium is not installed")
    from steersman.envs.batched import ParallelEnv

    env = ParallelEnv(n, functools.partial(GymEnv, "CartPole-v1", categorical_action_encoding=True))
    env.set_seed(0)
    return _td_loop(env, n), env.close


def row_parallel_native(n: int):
    from steersman.envs import CartPoleEnv
    from steersman.envs.batched import ParallelEnv

    env = ParallelEnv(n, CartPoleEnv)
    env.set_seed(0)
    return _td_loop(env, n), env.close


def row_serial_gym(n: int):
    try:
        from steersman.envs.libs import GymEnv, gymnasium_available
    except ImportError as exc:
        raise Unavailable(f"steersman.envs.libs.gym: {exc}") from None
    if not gymnasium_available():
        raise Unavailable("gymnasium is not installed")
    from steersman.envs.batched import SerialEnv

    env = SerialEnv(n, functools.partial(GymEnv, "CartPole-v1", categorical_action_encoding=True))
    env.set_seed(0)
    return _td_loop(env, n), env.close


def _torchrl_cartpole():
    from torchrl.envs import GymEnv as TorchRLGymEnv

    return TorchRLGymEnv("CartPole-v1", categorical_action_encoding=True)


def row_torchrl_parallel(n: int):
    try:
        from torchrl.envs import ParallelEnv as TorchRLParallelEnv
    except Exception as exc:  # noqa: BLE001 - any import failure means "not here"
        raise Unavailable(f"torchrl: {type(exc).__name__}: {exc}") from None
    env = TorchRLParallelEnv(n, _torchrl_cartpole)
    env.set_seed(0)
    return _td_loop(env, n), env.close


ROWS: dict[str, Callable] = {
    "gym async": row_gym_async,
    "Parallel(GymEnv)": row_parallel_gym,
    "Parallel(native)": row_parallel_native,
    "Serial(GymEnv)": row_serial_gym,
    "torchrl Parallel": row_torchrl_parallel,
}


def calibrate(run: Callable[[int], None], seconds: float) -> int:
    k = 16
    while True:
        t = time.perf_counter()
        run(k)
        dt = time.perf_counter() - t
        if dt >= seconds / 4 or k >= 1 << 22:
            return max(1, int(k * seconds / max(dt, 1e-9)))
        k *= 4


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--time", type=float, default=2.0, help="seconds per measurement")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rows", default="*", help="comma-separated names or globs")
    ap.add_argument("--quick", action="store_true", help="0.3 s x 2 repeats")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.quick:
        args.time, args.repeats = 0.3, 2
    torch.set_num_threads(1)
    pats = [p.strip() for p in args.rows.split(",")]
    names = [n for n in ROWS if any(fnmatch.fnmatch(n, p) for p in pats)]
    n = args.workers
    runs: dict[str, tuple[Callable, int]] = {}
    closers = []
    reasons: dict[str, str] = {}
    for name in names:
        try:
            run, close = ROWS[name](n)
        except Unavailable as exc:
            reasons[name] = str(exc)
            continue
        except Exception as exc:  # noqa: BLE001 - report and keep the other rows
            reasons[name] = f"{type(exc).__name__}: {exc}"
            continue
        closers.append(close)
        runs[name] = (run, calibrate(run, args.time))
    samples: dict[str, list[float]] = {name: [] for name in runs}
    try:
        for _ in range(args.repeats):
            for name, (run, k) in runs.items():
                t = time.perf_counter()
                run(k)
                samples[name].append(k / (time.perf_counter() - t))
    finally:
        for close in closers:
            close()
    steps = {name: statistics.median(v) for name, v in samples.items()}
    ref = steps.get("gym async")
    print(f"\nCartPole, {n} workers (one sub-env each), wall clock, median of {args.repeats} x "
          f"{args.time:g} s; python {platform.python_version()}, torch {torch.__version__}\n")
    print(f"| {'row':<18} | {'steps/s':>10} | {'frames/s':>10} | {'vs gym async':>12} |")
    print(f"|{'-' * 20}|{'-' * 12}|{'-' * 12}|{'-' * 14}|")
    for name in names:
        if name in steps:
            s = steps[name]
            ratio = f"{s / ref:.2f}x" if ref else "n/a"
            print(f"| {name:<18} | {s:>10,.0f} | {s * n:>10,.0f} | {ratio:>12} |")
        else:
            print(f"| {name:<18} | {'n/a':>10} | {'n/a':>10} | {'n/a':>12} |")
    for name, why in reasons.items():
        print(f"  {name}: n/a ({why})")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "meta": {"workers": n, "time": args.time, "repeats": args.repeats,
                     "python": platform.python_version(), "torch": torch.__version__},
            "steps_per_s": steps, "unavailable": reasons,
        }, indent=2))


if __name__ == "__main__":
    main()
