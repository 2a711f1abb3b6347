"""Environment stepping speed: steersman's envs vs hand-written floors vs Gymnasium.

Each row is one function ``row_fn(n) -> run`` registered with ``@row(...)``: it builds
its env(s) for a batch of ``n`` sub-envs (warm-up and compilation happen here, untimed)
and returns ``run(k)``, which takes ``k`` steps of all ``n`` sub-envs. A row that cannot
run here raises ``Unavailable(reason)`` (printed under the table); the others still
run. Add rows (Gymnasium wrapper, ParallelEnv, TorchRL ...) by writing more functions.

Native rows (CartPole, random actions drawn from a pre-made bank, auto-reset of
finished sub-envs in every row):

  floor           the bare tensor math in an eager loop: a component-major state
                  ``[4, n]``, Gymnasium's update, ``done = terminated | truncated`` (time
                  limit 500), resets of the finished sub-envs with ``torch.rand``; no
                  TensorDict, no spec, no check. What a user writes by hand.
  env             ``CartPoleEnv`` through its full API: ``td["action"] = a;
                  _, td = env.step_and_maybe_reset(td)`` (TensorDicts in and out).
  env step+mdp    ``td = step_mdp(env.step(td))`` (no resets: finished sub-envs go on).
  env compiled    ``CartPoleEnv(compile=True)``: the same API, the step and the
                  in-graph auto-reset fused by ``torch.compile``.
  gym vector      ``gymnasium.make_vec("CartPole-v1", n, vectorization_mode=
                  "vector_entry_point")``: Gymnasium's numpy-vectorized CartPole.

Timing: the CPU time of the process (``time.process_time``: time the process spends
descheduled on a busy machine does not count; every row is single-threaded, so CPU
time is its cost; ``--wall`` uses wall-clock time instead). For each batch size the
rows take turns within each repeat (so a slow spell hits them all alike); each
measurement runs about ``--time`` seconds; the median over repeats is reported (``--best``:
the best repeat; with short measurements and many repeats, e.g. ``--time 0.02 --repeats 150``,
what the code costs when other jobs leave the caches alone), in env steps (transitions)
per second. torch runs on 1 thread unless ``--threads``.

    python benchmarks/envs.py [--quick] [--sizes 1,256,4096,65536] [--rows 'env*'] [--best] [--json out.json]
"""

from __future__ import annotations

import argparse
import fnmatch
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

SIZES = (1, 256, 4096, 65536)
ACTION_BANK = 64


class Unavailable(Exception):
    """Raised by a row function that cannot run here (missing package, ...)."""


@dataclass
class Row:
    name: str
    fn: Callable[[int], Callable[[int], None]]
    group: str
    note: str


ROWS: list[Row] = []


def row(name: str, group: str = "native", note: str = "") -> Callable:
    """Registers ``fn(n) -> run(k)`` as a benchmark row."""

    def deco(fn: Callable[[int], Callable[[int], None]]) -> Callable:
        ROWS.append(Row(name, fn, group, note))
        return fn

    return deco


def _action_bank(n: int, high: int = 2) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, high, (n,), generator=g) for _ in range(ACTION_BANK)]


# ----------------------------------------------------------------------------- native rows
def _floor_cartpole_step(state: torch.Tensor, steps: torch.Tensor, action: torch.Tensor,
                         gen: torch.Generator) -> tuple:
    """Plain eager CartPole with auto-reset: Gymnasium's update on ``[4, n]`` tensors."""
    x, x_dot, theta, theta_dot = state
    force = action.to(state.dtype) * 20.0 - 10.0
    costheta = torch.cos(theta)
    sintheta = torch.sin(theta)
    temp = (force + 0.05 * theta_dot.square() * sintheta) / 1.1
    thetaacc = (9.8 * sintheta - costheta * temp) / (0.5 * (4.0 / 3.0 - 0.1 * costheta.square() / 1.1))
    xacc = temp - 0.05 * thetaacc * costheta / 1.1
    x = x + 0.02 * x_dot
    x_dot = x_dot + 0.02 * xacc
    theta = theta + 0.02 * theta_dot
    theta_dot = theta_dot + 0.02 * thetaacc
    state = torch.stack([x, x_dot, theta, theta_dot])
    obs = state.T
    terminated = (x < -2.4) | (x > 2.4) | (theta < -0.2094395) | (theta > 0.2094395)
    steps = steps + 1
    truncated = steps >= 500
    done = terminated | truncated
    reward = torch.ones_like(x)
    idx = done.nonzero().squeeze(-1)
    if idx.numel():
        state = state.clone()  # obs (the next observation) must keep its values
        state[:, idx] = torch.rand(4, idx.numel(), generator=gen) * 0.1 - 0.05
        steps[idx] = 0
    return state, steps, obs, reward, terminated, truncated, done


@row("floor", note="hand-written eager torch loop (no TensorDict)")
def floor_cartpole(n: int) -> Callable[[int], None]:
    gen = torch.Generator().manual_seed(0)
    acts = _action_bank(n)
    st = {"state": torch.rand(4, n, generator=gen) * 0.1 - 0.05, "steps": torch.zeros(n, dtype=torch.int32)}

    def run(k: int) -> None:
        state, steps = st["state"], st["steps"]
        for i in range(k):
            state, steps, *_ = _floor_cartpole_step(state, steps, acts[i % ACTION_BANK], gen)
        st["state"], st["steps"] = state, steps

    run(3)
    return run


def _native_env(n: int, **kwargs):
    from steersman.envs import CartPoleEnv

    return CartPoleEnv(batch_size=[n], seed=0, **kwargs)


@row("env", note="CartPoleEnv.step_and_maybe_reset, eager")
def env_cartpole(n: int) -> Callable[[int], None]:
    env = _native_env(n)
    acts = _action_bank(n)
    st = {"td": env.reset()}

    def run(k: int) -> None:
        td = st["td"]
        for i in range(k):
            td["action"] = acts[i % ACTION_BANK]
            _, td = env.step_and_maybe_reset(td)
        st["td"] = td

    run(3)
    return run


@row("env step+mdp", note="step_mdp(env.step(td)), eager, no resets")
def env_cartpole_step_mdp(n: int) -> Callable[[int], None]:
    from steersman.envs import step_mdp

    env = _native_env(n, max_episode_steps=None)
    acts = _action_bank(n)
    st = {"td": env.reset()}

    def run(k: int) -> None:
        td = st["td"]
        for i in range(k):
            td["action"] = acts[i % ACTION_BANK]
            td = step_mdp(env.step(td))
        st["td"] = td

    run(3)
    return run


@row("env compiled", note="CartPoleEnv(compile=True).step_and_maybe_reset")
def env_cartpole_compiled(n: int) -> Callable[[int], None]:
    env = _native_env(n, compile=True)
    acts = _action_bank(n)
    st = {"td": env.reset()}

    def run(k: int) -> None:
        td = st["td"]
        for i in range(k):
            td["action"] = acts[i % ACTION_BANK]
            _, td = env.step_and_maybe_reset(td)
        st["td"] = td

    run(3)  # compiles (untimed)
    return run


@row("gym vector", group="gym", note='gymnasium.make_vec(..., "vector_entry_point") (numpy)')
def gym_vector_cartpole(n: int) -> Callable[[int], None]:
    try:
        import gymnasium as gym
        import numpy as np
    except ImportError as err:
        raise Unavailable(f"gymnasium is not installed ({err})") from None
    try:
        env = gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="vector_entry_point")
        note = ""
    except Exception as err:  # older Gymnasium: fall back to the per-env loop
        env = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * n)
        note = f"SyncVectorEnv fallback ({err})"
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    acts = [rng.integers(0, 2, size=n) for _ in range(ACTION_BANK)]

    def run(k: int) -> None:
        for i in range(k):
            env.step(acts[i % ACTION_BANK])

    run(3)
    run.note = note  # type: ignore[attr-defined]
    return run


# ----------------------------------------------------------------------------- harness
CLOCK = time.process_time  # CPU time of this process: other load on the machine does not count


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
        if dt >= target / 4 or k >= 1 << 20:
            return max(1, int(k * target / max(dt, 1e-9)))
        k *= 4


def bench(rows: list[Row], sizes: list[int], repeats: int, target: float,
          stat: Callable = statistics.median) -> tuple[dict, dict]:
    """``{(row, n): steps/s}`` (``stat`` over repeats: the median, or ``max`` for the best
    run) and ``{(row, n): reason}`` for failures."""
    results: dict = {}
    errors: dict = {}
    for n in sizes:
        runs: dict[str, tuple[Callable, int]] = {}
        for r in rows:
            try:
                t0 = time.perf_counter()
                run = r.fn(n)
                setup = time.perf_counter() - t0
                runs[r.name] = (run, _calibrate(run, target))
                if setup > 2:
                    print(f"  [{r.name} n={n}: setup {setup:.1f}s]", file=sys.stderr)
            except Unavailable as err:
                errors[(r.name, n)] = str(err)
            except Exception as err:  # a broken row must not stop the others
                errors[(r.name, n)] = f"{type(err).__name__}: {err}"
        samples: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(repeats):
            for name, (run, k) in runs.items():
                samples[name].append(k * n / _measure(run, k))
        for name, vals in samples.items():
            results[(name, n)] = stat(vals)
        print(f"  n={n}: done", file=sys.stderr)
    return results, errors


RATIOS = (
    ("env / floor", "env", "floor", "target >= 0.8 at n=4096"),
    ("env compiled / gym vector", "env compiled", "gym vector", "target >= 3 at n=65536"),
    ("env compiled / floor", "env compiled", "floor", ""),
    ("env / gym vector", "env", "gym vector", ""),
)


def fmt_rate(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v / 1e6:.2f}M" if v >= 1e5 else f"{v / 1e3:.1f}k"


def report(rows: list[Row], sizes: list[int], results: dict, errors: dict, stat: str = "median") -> str:
    clock = "wall clock" if CLOCK is time.perf_counter else "process CPU time"
    lines = [f"steps/s ({stat}, {clock}); columns: sub-envs per env", ""]
    head = "| row | " + " | ".join(f"n={n}" for n in sizes) + " |"
    lines += [head, "|" + " --- |" * (len(sizes) + 1)]
    for r in rows:
        cells = [fmt_rate(results.get((r.name, n))) for n in sizes]
        lines.append(f"| {r.name} | " + " | ".join(cells) + " |")
    lines += ["", "| ratio | " + " | ".join(f"n={n}" for n in sizes) + " | note |",
              "|" + " --- |" * (len(sizes) + 2)]
    for label, a, b, note in RATIOS:
        cells = []
        for n in sizes:
            x, y = results.get((a, n)), results.get((b, n))
            cells.append(f"{x / y:.2f}" if x and y else "n/a")
        if any(c != "n/a" for c in cells):
            lines.append(f"| {label} | " + " | ".join(cells) + f" | {note} |")
    if errors:
        lines += ["", "not run:"]
        lines += [f"  {name} (n={n}): {why}" for (name, n), why in sorted(errors.items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="comma-separated batch sizes")
    parser.add_argument("--rows", help="comma-separated row names or globs (default: all)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--time", type=float, default=0.25, help="seconds per measurement")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--quick", action="store_true", help="smoke run: short, 3 repeats")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--wall", action="store_true", help="time with the wall clock, not CPU time")
    parser.add_argument("--best", action="store_true",
                        help="report the best repeat, not the median (with short --time and many "
                             "--repeats: the cost without other jobs' interference)")
    parser.add_argument("--list", action="store_true", help="list the rows and exit")
    args = parser.parse_args(argv)
    if args.list:
        for r in ROWS:
            print(f"{r.name:16s} [{r.group}] {r.note}")
        return 0
    torch.set_num_threads(args.threads)
    global CLOCK
    if args.wall:
        CLOCK = time.perf_counter
    sizes = [int(s) for s in args.sizes.split(",") if s]
    rows = ROWS
    if args.rows:
        pats = [p.strip() for p in args.rows.split(",")]
        rows = [r for r in ROWS if any(fnmatch.fnmatch(r.name, p) for p in pats)]
    repeats, target = (3, 0.03) if args.quick else (args.repeats, args.time)
    results, errors = bench(rows, sizes, repeats, target, max if args.best else statistics.median)
    print(report(rows, sizes, results, errors, "best" if args.best else "median"))
    if args.json:
        payload = {
            "meta": {
                "torch": torch.__version__,
                "python": platform.python_version(),
                "machine": platform.machine(),
                "threads": args.threads,
                "repeats": repeats,
                "statistic": "best" if args.best else "median",
                "seconds_per_measurement": target,
                "clock": "wall" if args.wall else "process CPU time",
            },
            "results": [
                {"row": name, "n": n, "steps_per_s": v} for (name, n), v in sorted(results.items())
            ],
            "ratios": {
                label: {str(n): results[(a, n)] / results[(b, n)]
                        for n in sizes if (a, n) in results and (b, n) in results}
                for label, a, b, _ in RATIOS
            },
            "not_run": {f"{name} n={n}": why for (name, n), why in errors.items()},
        }
        Path(args.json).write_text(json.dumps(payload, indent=2))
    return 0


# ----------------------------------------------------------------------------- Gymnasium rows
# The Gymnasium wrapper (steersman.envs.libs.gym) against a raw Gymnasium loop on the same
# env. n=1: one env (gymnasium.make); n>1: a Gymnasium SyncVectorEnv of n sub-envs, raw
# (its own next-step autoreset) vs GymEnv(num_envs=n) through step_and_maybe_reset (its
# partial resets). Every row plays the same bank of actions (at n=1: the same episodes,
# resets included). Sizes above 256 are not run (a Python loop over sub-envs). Target:
# "GymEnv / gym raw" >= 0.5 at n=1 (the wrapper costs at most as much as the env step).
GYM_MAX_N = 256


def _gym_or_unavailable():
    try:
        import gymnasium as gym
    except ImportError as err:
        raise Unavailable(f"gymnasium is not installed ({err})") from None
    return gym


@row("gym raw", group="gym", note="gymnasium loop: make (n=1) / make_vec sync (n>1)")
def gym_raw_cartpole(n: int) -> Callable[[int], None]:
    gym = _gym_or_unavailable()
    if n > GYM_MAX_N:
        raise Unavailable(f"n={n} > {GYM_MAX_N}: a Python loop over sub-envs")
    draws = _gym_draws(n)
    if n == 1:
        env = gym.make("CartPole-v1")
        env.reset(seed=0)
        acts = [int(d[0]) for d in draws]

        def run(k: int) -> None:
            step, reset = env.step, env.reset
            for i in range(k):
                _, _, term, trunc, _ = step(acts[i % ACTION_BANK])
                if term or trunc:
                    reset()
    else:
        env = gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="sync")
        env.reset(seed=0)
        acts = draws

        def run(k: int) -> None:
            for i in range(k):
                env.step(acts[i % ACTION_BANK])

    run(3)
    return run


def _gym_draws(n: int) -> list:
    """The bank of actions of every Gymnasium row: ``ACTION_BANK`` int arrays of size ``n``
    (same draws in every row, so that every row plays the same episodes)."""
    import numpy as np

    rng = np.random.default_rng(0)
    return [rng.integers(0, 2, size=n) for _ in range(ACTION_BANK)]


def _gym_action(draw, n: int, one_hot: bool) -> torch.Tensor:
    """A draw as the wrappers take it: indices (``[]`` for one env), or one-hot bool vectors."""
    index = torch.as_tensor(draw[0] if n == 1 else draw)
    return torch.nn.functional.one_hot(index, 2).bool() if one_hot else index


def _gym_env_row(n: int, **kwargs) -> Callable[[int], None]:
    _gym_or_unavailable()
    from steersman.envs.libs import GymEnv

    if n > GYM_MAX_N:
        raise Unavailable(f"n={n} > {GYM_MAX_N}: a Python loop over sub-envs")
    env = GymEnv("CartPole-v1", num_envs=0 if n == 1 else n, **kwargs)
    env.set_seed(0)
    one_hot = not kwargs.get("categorical_action_encoding", False)
    acts = [_gym_action(d, n, one_hot) for d in _gym_draws(n)]
    st = {"td": env.reset()}

    def run(k: int) -> None:
        td = st["td"]
        for i in range(k):
            td["action"] = acts[i % ACTION_BANK]
            _, td = env.step_and_maybe_reset(td)
        st["td"] = td

    run(3)
    return run


@row("GymEnv", group="gym", note="GymEnv(...).step_and_maybe_reset, one-hot actions (default)")
def gym_env_cartpole(n: int) -> Callable[[int], None]:
    return _gym_env_row(n)


@row("GymEnv categorical", group="gym", note="GymEnv(..., categorical_action_encoding=True)")
def gym_env_cartpole_categorical(n: int) -> Callable[[int], None]:
    return _gym_env_row(n, categorical_action_encoding=True)


def _td_floor_row(n: int, fresh: bool) -> Callable[[int], None]:
    """The least any TensorDict wrapper of a Gymnasium env does per step (n=1 only): read
    the action from the input TensorDict, step, write observation and reward into a row
    of preallocated tensors, build ``"next"`` and the next input (two TensorDicts). With
    ``fresh``, every step hands out a new row (``unbind`` of 256-row blocks: what GymEnv
    does, so no step's tensors are shared or rewritten); otherwise one row is reused."""
    gym = _gym_or_unavailable()
    from steersman.tensordict import TensorDict

    if n != 1:
        raise Unavailable("a floor for the single-env wrapper (n=1)")
    import numpy as np

    env = gym.make("CartPole-v1")
    env.reset(seed=0)
    new_td, bs, k = TensorDict._new_unsafe, torch.Size([]), 256 if fresh else 1
    acts = [torch.as_tensor(d[0]) for d in _gym_draws(1)]
    values = [np.int64(0), np.int64(1)]
    st: dict = {"i": k}  # the first step allocates the first block

    def refill() -> None:
        blocks = [torch.zeros(k, 4), torch.zeros(k, 1)] + [torch.zeros(k, 1, dtype=torch.bool) for _ in range(3)]
        st["np"] = [b.numpy() for b in blocks]
        st["rows"] = list(zip(*[b.unbind(0) for b in blocks]))
        st["i"] = 0

    st["td"] = new_td({"observation": torch.zeros(4)}, bs, None)

    def run(steps: int) -> None:
        td = st["td"]
        for j in range(steps):
            root = td._tensordict
            root["action"] = acts[j % ACTION_BANK]
            obs, rew, term, trunc, _ = env.step(values[root["action"].item()])
            i = st["i"]
            if i == k:
                refill()
                i = 0
            st["i"] = i + 1 if fresh else 0
            npr = st["np"]
            npr[0][i] = obs
            npr[1][i] = rew
            o, r, d, te, tr = st["rows"][i]
            npr[2][i], npr[3][i], npr[4][i] = term or trunc, term, trunc
            root["next"] = new_td({"observation": o, "reward": r, "done": d, "terminated": te, "truncated": tr}, bs, None)
            if term or trunc:
                env.reset()
            td = new_td({"observation": o, "done": d, "terminated": te, "truncated": tr}, bs, None)
        st["td"] = td

    run(3)
    return run


@row("gym + TD floor", group="gym", note="raw loop + 5 newly allocated output tensors + 2 TensorDicts per step (n=1)")
def gym_td_floor(n: int) -> Callable[[int], None]:
    return _td_floor_row(n, fresh=True)


@row("gym + TD floor, shared", group="gym", note="the same, one output row rewritten every step: unsafe, a bound (n=1)")
def gym_td_floor_shared(n: int) -> Callable[[int], None]:
    return _td_floor_row(n, fresh=False)


@row("torchrl GymEnv", group="gym", note="torchrl.envs.GymEnv step_and_maybe_reset (anchor)")
def torchrl_gym_env_cartpole(n: int) -> Callable[[int], None]:
    _gym_or_unavailable()
    try:
        from torchrl.envs import GymEnv as TorchRLGymEnv
    except ImportError as err:
        raise Unavailable(f"torchrl is not installed ({err})") from None
    if n > GYM_MAX_N:
        raise Unavailable(f"n={n} > {GYM_MAX_N}: a Python loop over sub-envs")
    env = TorchRLGymEnv("CartPole-v1") if n == 1 else TorchRLGymEnv("CartPole-v1", num_envs=n)
    env.set_seed(0)
    acts = [_gym_action(d, n, one_hot=True) for d in _gym_draws(n)]
    st = {"td": env.reset()}

    def run(k: int) -> None:
        td = st["td"]
        for i in range(k):
            td["action"] = acts[i % ACTION_BANK]
            _, td = env.step_and_maybe_reset(td)
        st["td"] = td

    run(3)
    return run


RATIOS = RATIOS + (
    ("GymEnv / gym raw", "GymEnv", "gym raw", "target >= 0.5 at n=1 (wrapper at most 2x)"),
    ("GymEnv categorical / gym raw", "GymEnv categorical", "gym raw", ""),
    ("gym + TD floor / gym raw", "gym + TD floor", "gym raw", "a wrapper allocating its 5 outputs every step"),
    ("gym + TD floor, shared / gym raw", "gym + TD floor, shared", "gym raw", "the same reusing one output row (unsafe)"),
    ("GymEnv categorical / gym + TD floor", "GymEnv categorical", "gym + TD floor", "GymEnv against that floor (1: at it)"),
    ("GymEnv / torchrl GymEnv", "GymEnv", "torchrl GymEnv", "> 1: steersman faster"),
)


if __name__ == "__main__":
    sys.exit(main())
