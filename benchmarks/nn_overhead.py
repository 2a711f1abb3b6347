"""Per-call overhead of TensorDict modules on tiny RL models, three ways in one process.

Columns:
  bare        the same computation on plain tensors (``net(obs)``; for the probabilistic
              rows ``Normal(*net(obs))`` then ``rsample``/``mode`` and ``log_prob``)
  steersman   ``steersman.tensordict.nn`` (this checkout, put first on ``sys.path``)
  tensordict  ``tensordict.nn`` when it is importable (the anchor)

Rows (MLP = Linear-Tanh-Linear-Tanh-Linear, 2 hidden layers of 64, batch 1, obs dim 8):
  module          TensorDictModule(MLP)
  sequential      TensorDictSequential of two TensorDictModule(MLP)
  prob_random     ProbabilisticTensorDictSequential(MLP + NormalParamExtractor, Normal),
                  return_log_prob=True, under set_interaction_type(RANDOM)
  prob_mode       the same under MODE

Timing: the columns of a row are measured in interleaved rounds (so background load hits
them alike); each round times a short burst of calls (many short rounds: on a busy
machine some of them run undisturbed); the table shows the best round in microseconds per call, and the ratios steersman/bare and
steersman/tensordict. Targets: ``module`` below 2x bare; steersman faster than
tensordict on every row.

    python benchmarks/nn_overhead.py [--quick] [--rows module,prob*] [--json out.json]
"""

from __future__ import annotations

import argparse
import fnmatch
import gc
import importlib
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # the checkout's steersman

LIBS: dict[str, tuple] = {}
IMPORT_ERRORS: dict[str, str] = {}
for _col, _pkg in (("steersman", "steersman.tensordict"), ("tensordict", "tensordict")):
    try:
        LIBS[_col] = (importlib.import_module(_pkg), importlib.import_module(_pkg + ".nn"))
    except Exception as err:  # an incomplete package still lets the other columns run
        IMPORT_ERRORS[_col] = f"{type(err).__name__}: {err}"

COLUMNS = ("bare", "steersman", "tensordict")
OBS, ACT, HIDDEN = 8, 2, 64


def mlp(i: int, o: int) -> nn.Module:
    return nn.Sequential(nn.Linear(i, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
                         nn.Linear(HIDDEN, o))


class Nets:
    """One set of weights shared by every column, so all columns do the same math."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.net = mlp(OBS, ACT)
        self.net_a = mlp(OBS, OBS)
        self.net_b = mlp(OBS, ACT)
        self.obs = torch.randn(1, OBS)


# --- rows: each returns {column: (callable, context-manager factory or None)} -----------------


def _td(lib, nets: Nets):
    return lib[0].TensorDict(obs=nets.obs, batch_size=[1])


def row_module(nets: Nets) -> dict:
    net, x = nets.net, nets.obs
    out = {"bare": lambda: net(x)}
    for col, lib in LIBS.items():
        m = lib[1].TensorDictModule(net, in_keys=["obs"], out_keys=["action"])
        td = _td(lib, nets)
        out[col] = lambda m=m, td=td: m(td)
    return out


def row_sequential(nets: Nets) -> dict:
    a, b, x = nets.net_a, nets.net_b, nets.obs
    out = {"bare": lambda: b(a(x))}
    for col, lib in LIBS.items():
        n = lib[1]
        seq = n.TensorDictSequential(
            n.TensorDictModule(a, in_keys=["obs"], out_keys=["hidden"]),
            n.TensorDictModule(b, in_keys=["hidden"], out_keys=["action"]),
        )
        td = _td(lib, nets)
        out[col] = lambda seq=seq, td=td: seq(td)
    return out


def _prob_row(nets: Nets, mode: str) -> dict:
    body = nn.Sequential(nets.net_a, nn.Linear(OBS, 2 * ACT))
    x = nets.obs
    ext = LIBS["steersman"][1].NormalParamExtractor() if "steersman" in LIBS else None
    if ext is None:
        from torch.nn.functional import softplus

        def ext(t):
            loc, s = t.chunk(2, -1)
            return loc, softplus(s + 0.5413) + 0.01

    def bare():
        loc, scale = ext(body(x))
        d = torch.distributions.Normal(loc, scale)
        a = d.rsample() if mode == "RANDOM" else d.mode
        return a, d.log_prob(a)

    out = {"bare": bare}
    for col, lib in LIBS.items():
        n = lib[1]
        policy = n.ProbabilisticTensorDictSequential(
            n.TensorDictModule(nn.Sequential(body, n.NormalParamExtractor()), in_keys=["obs"],
                               out_keys=["loc", "scale"]),
            n.ProbabilisticTensorDictModule(
                in_keys=["loc", "scale"], out_keys=["action"],
                distribution_class=torch.distributions.Normal, return_log_prob=True,
                log_prob_key="sample_log_prob",
            ),
        )
        td = _td(lib, nets)
        itype = getattr(n.InteractionType, mode)

        def call(policy=policy, td=td, ctx=n.set_interaction_type, itype=itype):
            with ctx(itype):
                return policy(td)

        out[col] = call
    # the context manager is part of the call for both libraries; the bare column has none
    return out


ROWS: dict[str, Callable[[Nets], dict]] = {
    "module": row_module,
    "sequential": row_sequential,
    "prob_random": lambda nets: _prob_row(nets, "RANDOM"),
    "prob_mode": lambda nets: _prob_row(nets, "MODE"),
}


# --- timing ----------------------------------------------------------------------------------


def measure(fns: dict[str, Callable], rounds: int, burst: int) -> dict[str, dict]:
    """Interleaved rounds; per column the best and the median time per call (seconds)."""
    samples: dict[str, list[float]] = {c: [] for c in fns}
    for fn in fns.values():  # warm-up (and a check that every column runs)
        for _ in range(max(burst // 4, 10)):
            fn()
    gc.collect()
    gc.disable()
    try:
        with torch.no_grad():
            for _ in range(rounds):
                for col, fn in fns.items():
                    t0 = time.perf_counter()
                    for _ in range(burst):
                        fn()
                    samples[col].append((time.perf_counter() - t0) / burst)
    finally:
        gc.enable()
    return {c: {"best": min(s), "median": statistics.median(s)} for c, s in samples.items()}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    p.add_argument("--rows", default="*", help="comma-separated glob patterns of row names")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--burst", type=int, default=None)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    p.add_argument("--json", default=None, help="also write the results to this file")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    rounds = args.rounds or (10 if args.quick else 150)
    burst = args.burst or (20 if args.quick else 50)
    patterns = args.rows.split(",")
    names = [r for r in ROWS if any(fnmatch.fnmatch(r, pat) for pat in patterns)]

    for col, err in IMPORT_ERRORS.items():
        print(f"[{col}] not importable: {err}", file=sys.stderr)
    nets = Nets()
    results: dict[str, dict] = {}
    for name in names:
        try:
            fns = ROWS[name](nets)
        except Exception as err:  # a column that can't build this row: report and go on
            print(f"[{name}] could not be built: {type(err).__name__}: {err}", file=sys.stderr)
            continue
        results[name] = measure(fns, rounds, burst)

    header = f"{'row':<12}" + "".join(f"{c + ' us':>15}" for c in COLUMNS) + \
        f"{'st/bare':>10}{'st/td':>9}"
    print(f"torch {torch.__version__}, python {platform.python_version()}, "
          f"threads {args.threads}, {rounds} rounds x {burst} calls, best round per call")
    print(header)
    print("-" * len(header))
    table = {}
    for name, res in results.items():
        best = {c: res[c]["best"] * 1e6 for c in res}
        cells = "".join(f"{best[c]:>15.2f}" if c in best else f"{'n/a':>15}" for c in COLUMNS)
        r_bare = best["steersman"] / best["bare"] if "steersman" in best else float("nan")
        r_td = best["steersman"] / best["tensordict"] if {"steersman", "tensordict"} <= best.keys() \
            else float("nan")
        print(f"{name:<12}{cells}{r_bare:>10.2f}{r_td:>9.2f}")
        table[name] = {
            "us_best": best,
            "us_median": {c: res[c]["median"] * 1e6 for c in res},
            "steersman_over_bare": r_bare,
            "steersman_over_tensordict": r_td,
        }
    out = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "tensordict": getattr(LIBS.get("tensordict", (None,))[0], "__version__", None),
        "threads": args.threads,
        "rounds": rounds,
        "burst": burst,
        "rows": table,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
