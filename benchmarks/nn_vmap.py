"""Ensembles: one ``torch.vmap`` call over stacked parameters vs a Python loop over N modules.

The model is a small MLP (in 16 -> 64 -> 64 -> out 4, Tanh), batch 32, N members.
Columns (µs per call, median):

  loop        ``torch.stack([m(x) for m in modules])``: the plain Python ensemble
  steersman   ``steersman.tensordict.ensemble_call`` on ``TensorDict.from_modules(...)``
              (``torch.vmap`` + ``to_module`` on a TensorDict pytree)
  torch.func  ``torch.func.stack_module_state`` + ``functional_call`` under ``torch.vmap``
              (the same vectorization without a container: the floor)
  tensordict  the anchor: ``tensordict.from_modules`` + ``to_module`` under ``torch.vmap``,
              when importable

Rows: forward under ``torch.no_grad()``, and forward + backward (``out.sum().backward()``
with gradients reaching the stacked parameters, or each module's in the loop), for
N in {8, 64}. Ratios: ``loop/steersman`` > 1 means the vmap ensemble beats the loop;
``tensordict/steersman`` > 1 means steersman beats the anchor.

    python benchmarks/nn_vmap.py [--quick] [--n 8,64] [--json out.json]
    $ANCHORS/bin/python benchmarks/nn_vmap.py     # with the tensordict column
"""

from __future__ import annotations

import argparse
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

IMPORT_ERRORS: dict[str, str] = {}
try:
    import steersman.tensordict as st
except Exception as err:  # pragma: no cover - a broken checkout still runs the others
    st = None
    IMPORT_ERRORS["steersman"] = f"{type(err).__name__}: {err}"
try:
    td_anchor = importlib.import_module("tensordict")
except Exception as err:
    td_anchor = None
    IMPORT_ERRORS["tensordict"] = f"{type(err).__name__}: {err}"

COLUMNS = ("loop", "steersman", "torch.func", "tensordict")
BATCH, D_IN, HIDDEN, D_OUT = 32, 16, 64, 4


def make_mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(D_IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, D_OUT)
    )


def build(column: str, n: int, backward: bool) -> Callable[[], object]:
    """A no-argument callable doing one ensemble forward (and backward) for ``column``."""
    torch.manual_seed(0)
    modules = [make_mlp() for _ in range(n)]
    x = torch.randn(BATCH, D_IN)
    base = make_mlp()

    if column == "loop":
        def fwd():
            return torch.stack([m(x) for m in modules])
        params = [p for m in modules for p in m.parameters()]
    elif column == "steersman":
        if st is None:
            raise RuntimeError(IMPORT_ERRORS["steersman"])
        stacked = st.TensorDict.from_modules(*modules)

        def fwd():
            return st.ensemble_call(base, stacked, x)
        params = list(stacked.values(True, True))
    elif column == "torch.func":
        weights, buffers = torch.func.stack_module_state(modules)

        def call(w, b, xx):
            return torch.func.functional_call(base, (w, b), (xx,))

        vcall = torch.vmap(call, (0, 0, None))

        def fwd():
            return vcall(weights, buffers, x)
        params = list(weights.values())
    elif column == "tensordict":
        if td_anchor is None:
            raise RuntimeError(IMPORT_ERRORS["tensordict"])
        stacked = td_anchor.TensorDict.from_modules(*modules)

        def call(p, xx):
            with p.to_module(base):
                return base(xx)

        vcall = torch.vmap(call, (0, None))

        def fwd():
            return vcall(stacked, x)
        params = list(stacked.values(True, True))
    else:
        raise ValueError(column)

    if not backward:
        def run():
            with torch.no_grad():
                return fwd()
        return run

    def run_bwd():
        for p in params:
            p.grad = None
        fwd().sum().backward()

    return run_bwd


def check(n: int = 3) -> None:
    """The vmap columns agree with the loop (forward and gradients) before anything is timed."""
    torch.manual_seed(0)
    modules = [make_mlp() for _ in range(n)]
    x = torch.randn(BATCH, D_IN)
    ref = torch.stack([m(x) for m in modules])
    ref.sum().backward()
    if st is not None:
        stacked = st.TensorDict.from_modules(*modules)
        out = st.ensemble_call(make_mlp(), stacked, x)
        out.sum().backward()
        assert torch.allclose(out, ref, atol=1e-5), "steersman vmap ensemble differs from the loop"
        for i, m in enumerate(modules):
            assert torch.allclose(stacked["0", "weight"].grad[i], m[0].weight.grad, atol=1e-5)


def measure(fn: Callable[[], object], target_s: float) -> tuple[int, float]:
    """(calls per measurement, seconds of one call) calibrated for ~target_s per measurement."""
    fn()
    fn()
    calls = 1
    while True:
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        dt = (time.perf_counter_ns() - t0) / 1e9
        if dt >= target_s or calls >= 1 << 16:
            return calls, dt / calls
        calls = max(calls * 2, int(calls * target_s / max(dt, 1e-9) * 1.1))


def bench(ns: list[int], repeats: int, target_s: float) -> list[dict]:
    rows = []
    for n in ns:
        for backward in (False, True):
            label = f"N={n} {'fwd+bwd' if backward else 'fwd'}"
            fns: dict[str, Callable] = {}
            errors: dict[str, str] = {}
            for col in COLUMNS:
                if col in IMPORT_ERRORS:
                    continue  # reported once under the table
                try:
                    fns[col] = build(col, n, backward)
                    fns[col]()
                except Exception as err:
                    errors[col] = f"{type(err).__name__}: {err}"
            calls = {c: measure(f, target_s)[0] for c, f in fns.items()}
            samples: dict[str, list[float]] = {c: [] for c in fns}
            gc.disable()
            try:
                for _ in range(repeats):  # columns take turns within each repeat
                    for c, f in fns.items():
                        t0 = time.perf_counter_ns()
                        for _ in range(calls[c]):
                            f()
                        samples[c].append((time.perf_counter_ns() - t0) / 1e3 / calls[c])
            finally:
                gc.enable()
            rows.append({
                "op": label,
                "n": n,
                "backward": backward,
                "us": {c: (statistics.median(s) if s else None) for c, s in samples.items()},
                "errors": errors,
            })
    return rows


def ratio(a: float | None, b: float | None) -> str:
    return "n/a" if not a or not b else f"{a / b:.2f}"


def print_table(rows: list[dict]) -> None:
    head = f"{'case':<14}" + "".join(f"{c:>12}" for c in COLUMNS) + f"{'loop/steer':>12}{'td/steer':>10}{'func/steer':>12}"
    print(head)
    print("-" * len(head))
    for r in rows:
        us = r["us"]
        cells = "".join(f"{us[c]:>12.1f}" if us.get(c) else f"{'n/a':>12}" for c in COLUMNS)
        print(f"{r['op']:<14}{cells}{ratio(us.get('loop'), us.get('steersman')):>12}"
              f"{ratio(us.get('tensordict'), us.get('steersman')):>10}"
              f"{ratio(us.get('torch.func'), us.get('steersman')):>12}")
    notes = {f"{c}: {e}" for r in rows for c, e in r["errors"].items()}
    for c, e in IMPORT_ERRORS.items():
        notes.add(f"{c}: {e}")
    for note in sorted(notes):
        print("  n/a", note)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", default="8,64", help="ensemble sizes, comma separated")
    parser.add_argument("--quick", action="store_true", help="3 repeats of ~5 ms")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args()
    torch.set_num_threads(1)
    check()
    repeats, target = (3, 0.005) if args.quick else (7, 0.02)
    rows = bench([int(v) for v in args.n.split(",")], repeats, target)
    print(f"torch {torch.__version__}, python {platform.python_version()}, 1 thread, "
          f"MLP {D_IN}-{HIDDEN}-{HIDDEN}-{D_OUT}, batch {BATCH}; µs per call (median of {repeats})")
    print_table(rows)
    if args.json:
        meta = {"torch": torch.__version__, "python": platform.python_version(),
                "tensordict": getattr(td_anchor, "__version__", None)}
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
